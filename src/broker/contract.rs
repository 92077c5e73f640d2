//! The AMQP contract suite: eight checks that a fleet credential can do exactly what a gateway
//! needs in its own vhost. Run with the credential against another fleet's vhost, all eight
//! must fail — the isolation proof operators run after every change.
//!
//! An admitted origin's credential *can* open a connection to the vhost (it must, to publish
//! into `x.in.ORIGIN`), so the first check also requires the credential to be the vhost's own
//! fleet user; every later check fails on the broker's own refusal. The forged-`user_id` check
//! first publishes the same message with the true `user_id`: a credential that cannot publish at
//! all proves nothing about `user_id` validation and fails the check.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueBindOptions,
    QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Consumer};

use super::grants::split_host_user;
use super::topology::{self, QueueType, SEND_EXCHANGE};
use super::{AmqpError, ConnectError, confirm_channel, connect};
use crate::secret::BrokerUri;

/// The checks, in order.
pub const CHECKS: [&str; 8] = [
    "connect",
    "declare own objects",
    "publish with confirm",
    "consume and ack",
    "mandatory return for a missing inbox",
    "reject-publish nack on a full inbox",
    "single-active-consumer failover",
    "forged user_id refused",
];

const STEP: Duration = Duration::from_secs(10);

/// The check run after the eight when a sibling host is named (`--sibling`).
pub const SIBLING_CHECK: &str = "a sibling host's queue and traffic refused";

/// One check's outcome.
#[derive(Debug)]
pub struct CheckResult {
    /// Which check.
    pub name: &'static str,
    /// `Ok` for PASS, what failed for FAIL.
    pub outcome: Result<(), Finding>,
}

/// Why a check failed (against another fleet's vhost, every check must).
#[derive(Debug, thiserror::Error)]
pub enum Finding {
    /// The connection could not be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A broker call failed.
    #[error(transparent)]
    Broker(#[from] AmqpError),
    /// The check got no answer in time.
    #[error("no answer within {} s", .0.as_secs())]
    NoAnswer(Duration),
    /// The first check did not connect.
    #[error("no connection to the vhost")]
    NoConnection,
    /// The connection opened, but for another fleet's user.
    #[error(
        "the connection opened, but `{user}` is not the fleet user of `{vhost}`: it may only publish into its ingress exchange"
    )]
    NotFleetUser {
        /// The credential's user.
        user: String,
        /// The vhost.
        vhost: String,
    },
    /// The broker answered a publish otherwise than the check requires.
    #[error("expected {expected}, got {got}")]
    Answer {
        /// What the check requires.
        expected: String,
        /// What came.
        got: &'static str,
    },
    /// A return came back for another message.
    #[error("a message came back, but not the one published (matched by message id)")]
    OtherReturn,
    /// A message did not arrive.
    #[error("message `{0}` did not arrive within 10 s")]
    NotDelivered(String),
    /// The consumer was cancelled while waiting.
    #[error("the consumer was cancelled")]
    Cancelled,
    /// The ack was not sent.
    #[error("the ack was not sent (channel closed or recovering)")]
    AckNotSent,
    /// The publish with the true `user_id` failed: the forged one proves nothing.
    #[error("the control publish with the true user_id failed, so nothing is proven: {0}")]
    ControlFailed(Box<Finding>),
    /// A forged `user_id` was taken.
    #[error("the broker accepted a message with a forged user_id")]
    ForgedAccepted,
    /// Refused, but not with `ACCESS_REFUSED`.
    #[error("failed, but not for want of permission: {0}")]
    NotForWantOfPermission(lapin::Error),
    /// The credential did what a sibling check requires the broker to refuse.
    #[error("{0}")]
    Permitted(String),
}

/// Runs every check with `uri`'s credential against `vhost`, declaring its queues as
/// `queue_type` ones (the type the fleet's config uses). A host user (`FLEET.HOST`) declares
/// its test inboxes as that host's (`agent.HOST.…`); with `sibling`, a ninth check requires the
/// broker to refuse it another host's control queue `gw.SIBLING.ctl` and any binding that would
/// copy another host's traffic into its own queue (from `host.SIBLING` or `fleet.send`).
/// `Err` when the vhost does not exist: every check would fail, which proves nothing (a
/// misspelt vhost must not pass for isolation).
pub async fn run(
    uri: &BrokerUri,
    vhost: &str,
    queue_type: QueueType,
    sibling: Option<&str>,
) -> Result<Vec<CheckResult>, ConnectError> {
    match connect(uri, Some(vhost)).await {
        Err(missing @ ConnectError::NoVhost { .. }) => return Err(missing),
        Ok(probe) => {
            let _ = probe.close(200, "contract probe".into()).await;
        }
        Err(_) => {}
    }
    let nonce = nonce();
    let host = split_host_user(&uri.user).map_or("contract", |(_, host)| host);
    let mut suite = Suite {
        uri,
        vhost: vhost.to_owned(),
        fleet: vhost.trim_start_matches('/').to_owned(),
        host: host.to_owned(),
        inbox: topology::inbox_queue(host, &format!("contract-{nonce}")),
        key: topology::agent_key(host, &format!("contract-{nonce}")),
        full: topology::inbox_queue(host, &format!("contract-full-{nonce}")),
        nonce,
        queue_type,
        connection: None,
    };
    let mut results = Vec::new();
    for (index, name) in CHECKS.iter().enumerate() {
        let outcome = match tokio::time::timeout(STEP * 3, suite.check(index)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Finding::NoAnswer(STEP * 3)),
        };
        results.push(CheckResult { name, outcome });
    }
    if let Some(sibling) = sibling {
        let outcome = match tokio::time::timeout(STEP, suite.sibling_refused(sibling)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Finding::NoAnswer(STEP)),
        };
        results.push(CheckResult {
            name: SIBLING_CHECK,
            outcome,
        });
    }
    suite.cleanup().await;
    Ok(results)
}

struct Suite<'a> {
    uri: &'a BrokerUri,
    vhost: String,
    fleet: String,
    host: String,
    inbox: String,
    key: String,
    full: String,
    nonce: String,
    queue_type: QueueType,
    connection: Option<Connection>,
}

impl Suite<'_> {
    async fn check(&mut self, index: usize) -> Result<(), Finding> {
        match index {
            0 => self.connect().await,
            1 => self.declare().await,
            2 => self.publish_confirmed().await,
            3 => self.consume_and_ack().await,
            4 => self.mandatory_return().await,
            5 => self.reject_publish().await,
            6 => self.single_active_consumer().await,
            _ => self.forged_user_id().await,
        }
    }

    async fn connect(&mut self) -> Result<(), Finding> {
        let connection = connect(self.uri, Some(&self.vhost)).await?;
        self.connection = Some(connection);
        let fleet_of_user =
            split_host_user(&self.uri.user).map_or(self.uri.user.as_str(), |(f, _)| f);
        if fleet_of_user != self.fleet {
            return Err(Finding::NotFleetUser {
                user: self.uri.user.clone(),
                vhost: self.vhost.clone(),
            });
        }
        Ok(())
    }

    async fn channel(&self) -> Result<Channel, Finding> {
        let connection = self.connection.as_ref().ok_or(Finding::NoConnection)?;
        let channel = confirm_channel(connection).await?;
        channel
            .basic_qos(16, BasicQosOptions::default())
            .await
            .map_err(AmqpError::failed("qos"))?;
        Ok(channel)
    }

    async fn declare(&self) -> Result<(), Finding> {
        let connection = self.connection.as_ref().ok_or(Finding::NoConnection)?;
        let exchanges = topology::ensure_exchanges(connection, &self.host).await?;
        let _ = exchanges.close(200, "exchanges there".into()).await;
        let channel = self.channel().await?;
        declare_inbox(
            &channel,
            (&self.host, &self.inbox, &self.key),
            self.queue_type,
            topology::DEFAULT_MAX_LENGTH,
        )
        .await
    }

    async fn publish_confirmed(&self) -> Result<(), Finding> {
        let channel = self.channel().await?;
        match publish(
            &channel,
            &self.key,
            &format!("m1-{}", self.nonce),
            &self.uri.user,
        )
        .await?
        {
            Confirmation::Ack(None) => Ok(()),
            other => Err(Finding::answer("a plain ack", &other)),
        }
    }

    async fn consume_and_ack(&self) -> Result<(), Finding> {
        let channel = self.channel().await?;
        let mut consumer = consume(&channel, &self.inbox, "contract-a").await?;
        let wanted = format!("m1-{}", self.nonce);
        let delivery = next_with_id(&mut consumer, &wanted).await?;
        match delivery.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Finding::AckNotSent),
            Err(e) => Err(AmqpError::failed("ack")(e).into()),
        }
    }

    async fn mandatory_return(&self) -> Result<(), Finding> {
        let channel = self.channel().await?;
        let id = format!("m2-{}", self.nonce);
        match publish(
            &channel,
            &topology::agent_key(&self.host, &format!("missing-{}", self.nonce)),
            &id,
            &self.uri.user,
        )
        .await?
        {
            Confirmation::Ack(Some(returned)) => {
                let got = returned
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(ToString::to_string);
                if got.as_deref() == Some(id.as_str()) {
                    Ok(())
                } else {
                    Err(Finding::OtherReturn)
                }
            }
            other => Err(Finding::answer("a return with an ack", &other)),
        }
    }

    async fn reject_publish(&self) -> Result<(), Finding> {
        let channel = self.channel().await?;
        let key = topology::agent_key(&self.host, &format!("contract-full-{}", self.nonce));
        declare_inbox(&channel, (&self.host, &self.full, &key), self.queue_type, 1).await?;
        // A quorum queue with `reject-publish` takes one message more than `x-max-length`
        // (RabbitMQ 3.10: limit 1 → ack, ack, nack): the contract expects exactly that.
        let fits = match self.queue_type {
            QueueType::Classic => 1,
            QueueType::Quorum => 2,
        };
        for n in 1..=fits {
            let answer = publish(
                &channel,
                &key,
                &format!("f{n}-{}", self.nonce),
                &self.uri.user,
            )
            .await?;
            if !matches!(answer, Confirmation::Ack(None)) {
                let expected = format!(
                    "message {n} of {fits} to fit a {:?} inbox of length 1",
                    self.queue_type
                );
                return Err(Finding::answer(&expected, &answer));
            }
        }
        match publish(
            &channel,
            &key,
            &format!("f{}-{}", fits + 1, self.nonce),
            &self.uri.user,
        )
        .await?
        {
            Confirmation::Nack(_) => Ok(()),
            other => Err(Finding::answer("a nack from the full inbox", &other)),
        }
    }

    async fn single_active_consumer(&self) -> Result<(), Finding> {
        let first = connect(self.uri, Some(&self.vhost)).await?;
        let second = connect(self.uri, Some(&self.vhost)).await?;
        let open = AmqpError::failed;
        let channel_a = first
            .create_channel()
            .await
            .map_err(open("open a channel"))?;
        let channel_b = second
            .create_channel()
            .await
            .map_err(open("open a channel"))?;
        let _active = consume(&channel_a, &self.inbox, "contract-sac-a").await?;
        let mut standby = consume(&channel_b, &self.inbox, "contract-sac-b").await?;
        // The active consumer's connection dies; the standby must take over.
        first
            .close(320, "contract: active consumer goes away".into())
            .await
            .map_err(open("close the active consumer's connection"))?;
        let publisher = self.channel().await?;
        let id = format!("m3-{}", self.nonce);
        publish(&publisher, &self.key, &id, &self.uri.user).await?;
        let delivery = next_with_id(&mut standby, &id).await?;
        delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(open("ack"))?;
        let _ = second.close(200, "contract done".into()).await;
        Ok(())
    }

    async fn forged_user_id(&self) -> Result<(), Finding> {
        let control = self.channel().await?;
        match publish(
            &control,
            &self.key,
            &format!("m4-{}", self.nonce),
            &self.uri.user,
        )
        .await
        {
            Ok(Confirmation::Ack(None)) => {}
            Ok(other) => {
                return Err(Finding::answer(
                    "an ack for the control publish with the true user_id",
                    &other,
                ));
            }
            Err(e) => return Err(Finding::ControlFailed(Box::new(e))),
        }
        let channel = self.channel().await?;
        match publish(
            &channel,
            &self.key,
            &format!("m5-{}", self.nonce),
            &format!("forged-{}", self.nonce),
        )
        .await
        {
            Ok(Confirmation::Ack(_)) => Err(Finding::ForgedAccepted),
            Ok(_) | Err(_) => Ok(()),
        }
    }

    /// The broker refuses this credential another host's control queue — consuming it would
    /// take that host's spawn requests and messages — and every binding that would put a copy
    /// of another host's traffic into a queue of its own: from `host.SIBLING` or from
    /// `fleet.send`, where all of the fleet's traffic passes. Each must be `ACCESS_REFUSED`.
    async fn sibling_refused(&self, sibling: &str) -> Result<(), Finding> {
        let connection = self.connection.as_ref().ok_or(Finding::NoConnection)?;
        // Each refusal closes its channel: one channel per attempt.
        let open = || async {
            connection
                .create_channel()
                .await
                .map_err(AmqpError::failed("open a channel"))
        };
        let queue = format!("gw.{sibling}.ctl");
        let consumed = open()
            .await?
            .basic_consume(
                queue.as_str().into(),
                "contract-sibling".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await;
        refused(consumed.map(drop), || {
            format!(
                "`{}` consumed `{queue}`, host `{sibling}`'s control queue",
                self.uri.user
            )
        })?;
        let sibling_exchange = topology::host_exchange(sibling);
        for (exchange, key) in [
            (sibling_exchange.as_str(), topology::control_key(sibling)),
            (SEND_EXCHANGE, "#".to_owned()),
        ] {
            let bound = open()
                .await?
                .queue_bind(
                    self.inbox.as_str().into(),
                    exchange.into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await;
            refused(bound, || {
                format!(
                    "`{}` bound its own queue `{}` to `{exchange}` with `{key}`: it would receive copies of another host's traffic",
                    self.uri.user, self.inbox
                )
            })?;
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        if let Some(connection) = self.connection.take() {
            if let Ok(channel) = connection.create_channel().await {
                for queue in [&self.inbox, &self.full] {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
            }
            let _ = connection.close(200, "contract done".into()).await;
        }
    }
}

/// Refused by the broker (`ACCESS_REFUSED`), as a sibling check requires; `done` says what the
/// credential did instead.
fn refused(attempt: lapin::Result<()>, done: impl FnOnce() -> String) -> Result<(), Finding> {
    match attempt {
        Err(e) if e.to_string().contains("ACCESS_REFUSED") => Ok(()),
        Err(e) => Err(Finding::NotForWantOfPermission(e)),
        Ok(()) => Err(Finding::Permitted(done())),
    }
}

impl Finding {
    /// The broker's answer `got` where the check requires `expected`.
    fn answer(expected: &str, got: &Confirmation) -> Finding {
        Finding::Answer {
            expected: expected.to_owned(),
            got: describe(got),
        }
    }
}

async fn declare_inbox(
    channel: &Channel,
    (host, queue, key): (&str, &str, &str),
    queue_type: QueueType,
    max_length: i64,
) -> Result<(), Finding> {
    let arguments = topology::inbox_arguments(queue_type, max_length);
    let exchange = topology::host_exchange(host);
    Ok(topology::declare_bound_queue(channel, queue, &exchange, key, arguments).await?)
}

async fn publish(
    channel: &Channel,
    key: &str,
    id: &str,
    user: &str,
) -> Result<Confirmation, Finding> {
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(id))
        .with_user_id(ShortString::from(user))
        .with_app_id(ShortString::from("fleetd-contract"));
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = channel
        .basic_publish(
            SEND_EXCHANGE.into(),
            key.into(),
            options,
            b"fleetd contract check",
            properties,
        )
        .await
        .map_err(AmqpError::failed("publish"))?;
    let confirmed = tokio::time::timeout(STEP, confirm)
        .await
        .map_err(|_| AmqpError::Timeout {
            what: "a publisher confirm".to_owned(),
            after: STEP,
        })?;
    Ok(confirmed.map_err(AmqpError::failed("publish (refused)"))?)
}

async fn consume(channel: &Channel, queue: &str, tag: &str) -> Result<Consumer, Finding> {
    channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::failed(format!("consume `{queue}`"))(e).into())
}

async fn next_with_id(
    consumer: &mut Consumer,
    id: &str,
) -> Result<lapin::message::Delivery, Finding> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let next = tokio::time::timeout_at(deadline, consumer.next())
            .await
            .map_err(|_| Finding::NotDelivered(id.to_owned()))?;
        let delivery = match next {
            Some(Ok(delivery)) => delivery,
            Some(Err(e)) => return Err(AmqpError::failed("consume")(e).into()),
            None => return Err(Finding::Cancelled),
        };
        let got = delivery
            .properties
            .message_id()
            .as_ref()
            .map(ToString::to_string);
        if got.as_deref() == Some(id) {
            return Ok(delivery);
        }
        // Not ours (e.g. an earlier check's message): settle it and keep waiting.
        let _ = delivery.ack(BasicAckOptions::default()).await;
    }
}

fn describe(confirmation: &Confirmation) -> &'static str {
    match confirmation {
        Confirmation::Ack(None) => "an ack",
        Confirmation::Ack(Some(_)) => "an ack with a returned message",
        Confirmation::Nack(_) => "a nack",
        Confirmation::NotRequested => "no confirmation",
    }
}

/// A name fragment unique to this run.
fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", nanos & 0xffff_ffff_ffff, std::process::id())
}
