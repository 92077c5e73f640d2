//! The link to the broker: fleetd rebuilds its connection itself, with jittered exponential
//! backoff and a configurable cap (lapin's own recovery retries auth errors in lockstep and fails
//! in-flight confirms). After every (re)connect the topology is declared again, idempotently. An
//! unreachable broker is a degraded state, never an exit; state changes are logged, not attempts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, Event};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use super::connect::WRITE_TIMEOUT;
use super::deliver::{Courier, Outlets, Pump, PumpError};
use super::envelope;
use super::inbound::{Inbound, InboundRefusal};
use super::topology::{self, QueueType, ROSTER_EXCHANGE};
use super::{AmqpError, ConnectError, confirm_channel, connect_node};
use crate::secret::BrokerUri;
use crate::wire::{self, HostKey, Kind, Meta, Party, Payload, now_ms, utc};

/// Where the link stands; `since` is Unix milliseconds: when the link came up, or the first
/// failure of the current run of failures (a retry does not move it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkStatus {
    /// Not yet tried.
    Starting,
    /// Connected and topology declared.
    Up {
        /// Since when.
        since: i64,
        /// The node (`host:port`).
        node: String,
    },
    /// The broker cannot be reached.
    Unreachable {
        /// Since when.
        since: i64,
        /// The last error (per node tried).
        reason: String,
    },
    /// The broker refuses the credential or a declaration: retried slowly.
    Refused {
        /// Since when.
        since: i64,
        /// The broker's reason.
        reason: String,
    },
}

impl LinkStatus {
    /// The same state with the earlier `since` of `previous` when both are the same kind of
    /// failure: the status says since when the broker has been unreachable, not the last retry.
    fn continuing(self, previous: &LinkStatus) -> LinkStatus {
        match (self, previous) {
            (LinkStatus::Unreachable { reason, .. }, LinkStatus::Unreachable { since, .. }) => {
                LinkStatus::Unreachable {
                    since: *since,
                    reason,
                }
            }
            (LinkStatus::Refused { reason, .. }, LinkStatus::Refused { since, .. }) => {
                LinkStatus::Refused {
                    since: *since,
                    reason,
                }
            }
            (next, _) => next,
        }
    }
}

impl std::fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkStatus::Starting => f.write_str("broker: starting"),
            LinkStatus::Up { since, node } => {
                write!(f, "broker: connected to {node} since {}", utc(*since))
            }
            LinkStatus::Unreachable { since, reason } => {
                write!(f, "broker: unreachable since {}: {reason}", utc(*since))
            }
            LinkStatus::Refused { since, reason } => {
                write!(f, "broker: refused since {}: {reason}", utc(*since))
            }
        }
    }
}

/// Deliveries in flight per consumer (set explicitly: LavinMQ would default to 65535).
const PREFETCH: u16 = 32;

/// This host's presence as the link needs it. The roster is the daemon's (its presence,
/// `daemon/presence.rs`); the link carries this host's beats out and verified beats in.
pub trait PresenceBook: Send + Sync {
    /// The link listens for beats again (its roster consumer is up after a connect).
    fn listening(&self);
    /// This host's next beat body (`leaving` as it goes).
    fn next_beat(&self, leaving: bool) -> wire::PresenceBeat;
    /// How long until the next beat.
    fn next_interval(&self) -> Duration;
    /// A beat from `origin`: its signature, the broker-attested origin and its window checked.
    fn observe(&self, origin: Party, beat: wire::PresenceBeat);
    /// This host's agents changed: its entry (and so its next beat) says so.
    fn agents_changed(&self);
}

/// This host's presence: its roster, and how it signs its beats.
pub struct Presence {
    /// The daemon's roster, as the link needs it.
    pub book: Arc<dyn PresenceBook>,
    /// The host key that signs beats.
    pub key: Arc<HostKey>,
    /// This host's fleet.
    pub fleet: String,
    /// Beats expire after this long.
    pub beat_ttl: Duration,
    /// The last beat body sent to the own fleet, repeated to other fleets.
    pub last_beat: std::sync::Mutex<Option<wire::PresenceBeat>>,
    /// Where decisions on inbound messages are recorded (the audit log).
    pub record: Recorder,
}

/// Records decisions, each an event name and its detail, in order (the daemon writes them to the
/// audit log; the link's go through the log's writer thread, handed over without a copy).
pub type Recorder = Arc<dyn Fn(Vec<(&'static str, serde_json::Value)>) + Send + Sync>;

/// How the link behaves.
#[derive(Clone, Debug)]
pub struct LinkSettings {
    /// This host (names its control queue `gw.HOST.ctl`).
    pub host: String,
    /// Longest wait between attempts.
    pub backoff_cap: Duration,
    /// Classic or quorum queues.
    pub queue_type: QueueType,
    /// Other fleets this host beats its presence into (through their `x.in.OWN`).
    pub beat_to: Vec<String>,
}

/// Keeps a connection up until `stop` turns true; publishes its status on `status`.
pub async fn supervise(
    uri: BrokerUri,
    settings: LinkSettings,
    inbound: Arc<Inbound>,
    presence: Arc<Presence>,
    courier: Arc<Courier>,
    status: watch::Sender<LinkStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let uri = Arc::new(uri);
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        let outcome = match connect_node(&uri, None).await {
            Ok((connection, index, node)) => match declare(&connection, &settings).await {
                Ok(()) => {
                    let up_at = tokio::time::Instant::now();
                    set(
                        &status,
                        LinkStatus::Up {
                            since: now_ms(),
                            node: node.to_string(),
                        },
                    );
                    let link = Served {
                        connection: &connection,
                        uri: &uri,
                        settings: &settings,
                        inbound: &inbound,
                        presence: &presence,
                        courier: &courier,
                    };
                    // A stop closes the connection inside `serve`.
                    let Some(lost) = link.serve(&mut stop).await else {
                        return;
                    };
                    // Only a link that held counts as a success: one the broker drops again at
                    // once (LavinMQ closing the publishing channel on low disk, a node that
                    // accepts and then fails) backs off further each time instead of cycling.
                    if up_at.elapsed() >= STABLE {
                        failures = 0;
                    }
                    uri.lost(index);
                    LinkStatus::Unreachable {
                        since: now_ms(),
                        reason: format!("{node}: {lost}"),
                    }
                }
                Err(reason) => LinkStatus::Refused {
                    since: now_ms(),
                    reason: reason.to_string(),
                },
            },
            Err(ConnectError::Refused { reason, .. }) => LinkStatus::Refused {
                since: now_ms(),
                reason,
            },
            Err(error @ ConnectError::NoVhost { .. }) => LinkStatus::Refused {
                since: now_ms(),
                reason: error.to_string(),
            },
            Err(ConnectError::Unreachable { reason, .. }) => LinkStatus::Unreachable {
                since: now_ms(),
                reason,
            },
        };
        if let Some(parked) = queue_type_mismatch(&outcome, settings.queue_type) {
            // Retrying cannot help: the broker refuses the declaration until the operator
            // moves the queues. Said once, clearly, and kept as the status until fleetd stops.
            error!(reason = %parked, "broker link parked: queue type mismatch");
            set(
                &status,
                LinkStatus::Refused {
                    since: now_ms(),
                    reason: parked,
                },
            );
            let _ = stop.changed().await;
            return;
        }
        let refused = matches!(outcome, LinkStatus::Refused { .. });
        let outcome = outcome.continuing(&status.borrow());
        set(&status, outcome);
        failures = failures.saturating_add(1);
        let delay = if refused {
            settings.backoff_cap
        } else {
            backoff(failures, settings.backoff_cap)
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// How long deliveries the state store could not take wait before they are handed back.
const REQUEUE_AFTER: Duration = Duration::from_secs(2);

/// How long a link must stay up for the backoff to start again from its shortest wait.
const STABLE: Duration = Duration::from_secs(10);

/// What RabbitMQ says when a queue is declared with another `x-queue-type` than it has.
const QUEUE_TYPE_MISMATCH: &str = "inequivalent arg 'x-queue-type'";

/// The operator's message when `outcome` failed on a queue that exists with another queue type
/// than `configured` (the fleet's `broker.queue_type` changed): `None` for anything else.
fn queue_type_mismatch(outcome: &LinkStatus, configured: QueueType) -> Option<String> {
    let (LinkStatus::Refused { reason, .. } | LinkStatus::Unreachable { reason, .. }) = outcome
    else {
        return None;
    };
    if !reason.contains(QUEUE_TYPE_MISMATCH) {
        return None;
    }
    let configured = match configured {
        QueueType::Classic => "classic",
        QueueType::Quorum => "quorum",
    };
    Some(format!(
        "a queue of this fleet exists with another type than broker.queue_type = \"{configured}\" \
         ({reason}); fleetd does not retry: move the fleet's queues as docs/broker.md \
         \"Changing a fleet's queue type\" says, then restart fleetd"
    ))
}

/// Jittered exponential backoff: 0.5 s doubling up to `cap`, each wait drawn from [d/2, d].
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    let base =
        Duration::from_millis(500).saturating_mul(1u32 << failures.min(16).saturating_sub(1));
    let delay = base.min(cap);
    let mut byte = [0u8; 2];
    let jitter = if getrandom::fill(&mut byte).is_ok() {
        u32::from(u16::from_le_bytes(byte))
    } else {
        0
    };
    delay / 2 + delay.mul_f64(f64::from(jitter) / f64::from(u16::MAX) / 2.0)
}

/// Looks up the fleet's exchanges and this host's own exchange, and declares this host's control
/// and roster queues. The control queue is bound from `host.HOST` only: what other fleets send
/// reaches it through their ingress exchanges, which the admin binds to `fleet.send`
/// (`fleetd broker grants --admit`), so a host needs no right on any ingress exchange.
async fn declare(connection: &Connection, settings: &LinkSettings) -> Result<(), AmqpError> {
    let channel = topology::ensure_exchanges(connection, &settings.host).await?;
    let queue = topology::control_queue(&settings.host);
    let arguments = topology::inbox_arguments(settings.queue_type, topology::DEFAULT_MAX_LENGTH);
    topology::declare_bound_queue(
        &channel,
        &queue,
        &topology::host_exchange(&settings.host),
        &topology::control_key(&settings.host),
        arguments,
    )
    .await?;
    let bindings = vec![(ROSTER_EXCHANGE.to_owned(), "roster.#".to_owned())];
    let roster = format!("gw.{}.roster", settings.host);
    let declared =
        topology::declare_roster_queue(&channel, &roster, settings.queue_type, &bindings).await;
    let channel = match declared {
        Err(reason) if reason.is("PRECONDITION_FAILED") => {
            // Declared before with other arguments (`queue_type` changed): presence is soft
            // state, so the old roster queue goes and the new one takes its place. The failed
            // declare closed the channel.
            let channel = connection
                .create_channel()
                .await
                .map_err(AmqpError::failed("open a channel"))?;
            channel
                .queue_delete(roster.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(AmqpError::failed(format!(
                    "delete `{roster}` to redeclare it"
                )))?;
            topology::declare_roster_queue(&channel, &roster, settings.queue_type, &bindings)
                .await?;
            channel
        }
        declared => declared.map(|()| channel)?,
    };
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// What one connection serves.
struct Served<'a> {
    connection: &'a Connection,
    uri: &'a Arc<BrokerUri>,
    settings: &'a LinkSettings,
    inbound: &'a Inbound,
    presence: &'a Presence,
    courier: &'a Arc<Courier>,
}

/// A delivery from any consumer, or the end of one (a broker cancel).
type Forwarded = Result<Delivery, AmqpError>;

/// Why a served connection ended (the link reconnects with backoff).
#[derive(Debug, thiserror::Error)]
enum LinkLost {
    /// A consumer, channel or call on the connection failed.
    #[error(transparent)]
    Amqp(#[from] AmqpError),
    /// Publishing failed and the connection is gone.
    #[error(transparent)]
    Pump(#[from] PumpError),
    /// A publisher confirm was lost and the connection is gone.
    #[error("publisher confirm lost: {0}")]
    ConfirmLost(PumpError),
    /// The publishing channel closed and the connection is gone.
    #[error("the publishing channel closed")]
    PublishingClosed,
    /// The roster consumer failed.
    #[error("the roster consumer: {0}")]
    Roster(lapin::Error),
    /// The broker cancelled the roster consumer.
    #[error("the broker cancelled the roster consumer")]
    RosterCancelled,
    /// Every consumer's stream ended.
    #[error("every consumer ended")]
    ConsumersEnded,
    /// The connection reported an error.
    #[error(transparent)]
    Connection(lapin::Error),
    /// The connection's events ended.
    #[error("the connection ended")]
    Ended,
}

impl Served<'_> {
    /// Consumes the control queue and every local agent's inbox, publishes the outbox and this
    /// host's beats, until the connection fails or a consumer is cancelled (`Some(reason)`:
    /// reconnect, re-declare, re-consume) or the stop signal arrives (`None`).
    async fn serve(&self, stop: &mut watch::Receiver<bool>) -> Option<LinkLost> {
        let (tx, mut deliveries) = mpsc::channel::<Forwarded>(usize::from(PREFETCH) * 4);
        let mut forwarders = JoinSet::new();
        let mut consumed = HashSet::new();
        let parts = async {
            let consume = self.channel(true).await?;
            let control = topology::control_queue(&self.settings.host);
            self.consume(&consume, &control, &tx, &mut forwarders)
                .await?;
            let roster_queue = format!("gw.{}.roster", self.settings.host);
            let no_ack = BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            };
            let roster = self
                .channel(false)
                .await?
                .basic_consume(
                    roster_queue.as_str().into(),
                    "fleetd-roster".into(),
                    no_ack,
                    FieldTable::default(),
                )
                .await
                .map_err(AmqpError::failed(format!("consume `{roster_queue}`")))?;
            let beats_out = self.channel(false).await?;
            let publish = confirm_channel(self.connection).await?;
            let probe = self.channel(false).await?;
            Ok::<_, AmqpError>((consume, roster, beats_out, (publish, probe)))
        };
        let (consume, mut roster, beats_out, publish) = match parts.await {
            Ok(parts) => parts,
            Err(reason) => return Some(reason.into()),
        };
        self.presence.book.agents_changed();
        self.presence.book.listening();
        if let Err(reason) = self
            .consume_agents(&consume, &tx, &mut forwarders, &mut consumed)
            .await
        {
            return Some(reason.into());
        }
        let mut outlets = Outlets::new(
            publish,
            &self.uri.vhost,
            Arc::clone(self.uri),
            Arc::clone(self.courier),
            self.settings.backoff_cap,
        );
        let mut pump = Pump::new(self.settings.backoff_cap);
        // Set while the own publishing channel is closed and the connection lives: when to try a
        // new one, and how many tries failed.
        let mut reopen: Option<(tokio::time::Instant, u32)> = None;
        let mut events = self.connection.events_listener();
        let mut next_beat = tokio::time::Instant::now();
        let mut retry = tokio::time::interval(Duration::from_secs(2));
        // The broker user (`FLEET` or a host user `FLEET.HOST`): the `user_id` it validates.
        let user = self.uri.user.clone();
        let lost = loop {
            let wake_at = pump.wake_at();
            tokio::select! {
                first = deliveries.recv() => match first {
                    Some(Ok(first)) => {
                        let mut batch = vec![first];
                        let mut ended = None;
                        while batch.len() < usize::from(PREFETCH) {
                            match deliveries.try_recv() {
                                Ok(Ok(next)) => batch.push(next),
                                Ok(Err(reason)) => {
                                    ended = Some(LinkLost::Amqp(reason));
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        self.take_in(batch).await;
                        if ended.is_some() {
                            break ended;
                        }
                    }
                    Some(Err(reason)) => break Some(reason.into()),
                    None => break Some(LinkLost::ConsumersEnded),
                },
                beat = roster.next() => match beat {
                    Some(Ok(delivery)) => observe(self.inbound, self.presence, self.courier, &delivery),
                    Some(Err(error)) => break Some(LinkLost::Roster(error)),
                    None => break Some(LinkLost::RosterCancelled),
                },
                () = self.courier.outbox_ready.notified() => {
                    if let Err(reason) = pump.run(self.courier, &user, &mut outlets).await
                        && let Some(lost) = self.publish_fault(&outlets, reason.into(), &mut reopen)
                    {
                        break Some(lost);
                    }
                }
                settled = pump.settle_next(self.courier), if pump.busy() => match settled {
                    Some(Err(reason)) => {
                        if let Some(lost) = self.publish_fault(&outlets, LinkLost::ConfirmLost(reason), &mut reopen) {
                            break Some(lost);
                        }
                    }
                    Some(Ok(())) | None => {
                        if (!pump.busy() || pump.behind())
                            && let Err(reason) = pump.run(self.courier, &user, &mut outlets).await
                            && let Some(lost) = self.publish_fault(&outlets, reason.into(), &mut reopen)
                        {
                            break Some(lost);
                        }
                    }
                },
                () = sleep_until_some(wake_at) => {
                    // A queue the broker refused may be tested again.
                    if let Err(reason) = pump.run(self.courier, &user, &mut outlets).await
                        && let Some(lost) = self.publish_fault(&outlets, reason.into(), &mut reopen)
                    {
                        break Some(lost);
                    }
                }
                _ = retry.tick() => {
                    // Bounded: on a connection that died unnoticed a channel.open is never
                    // answered, and this loop is the one that must notice.
                    if outlets.own_probe_closed()
                        && let Ok(Ok(channel)) = tokio::time::timeout(CHANNEL_OPEN, self.channel(false)).await
                    {
                        outlets.replace_own_probe(channel);
                    }
                    // A channel the broker closed without a publish or confirm failing on it.
                    if reopen.is_none()
                        && outlets.own_closed()
                        && let Some(lost) = self.publish_fault(&outlets, LinkLost::PublishingClosed, &mut reopen)
                    {
                        break Some(lost);
                    }
                    if let Some((at, tries)) = reopen
                        && tokio::time::Instant::now() >= at
                    {
                        let opened = tokio::time::timeout(CHANNEL_OPEN, confirm_channel(self.connection))
                            .await
                            .unwrap_or_else(|_| Err(AmqpError::Timeout { what: "open a publishing channel".to_owned(), after: CHANNEL_OPEN }));
                        reopen = match opened {
                            Ok(channel) => {
                                outlets.replace_own(channel);
                                info!("publishing channel reopened; the outbox drains again");
                                None
                            }
                            Err(reason) => {
                                debug!(%reason, "publishing channel not reopened yet");
                                let tries = tries.saturating_add(1);
                                Some((tokio::time::Instant::now() + backoff(tries + 1, self.settings.backoff_cap), tries))
                            }
                        };
                    }
                    if let Err(reason) = pump.run(self.courier, &user, &mut outlets).await
                        && let Some(lost) = self.publish_fault(&outlets, reason.into(), &mut reopen)
                    {
                        break Some(lost);
                    }
                }
                () = self.courier.agents().changed.notified() => {
                    self.presence.book.agents_changed();
                    if let Err(reason) = self.consume_agents(&consume, &tx, &mut forwarders, &mut consumed).await {
                        break Some(reason.into());
                    }
                }
                () = tokio::time::sleep_until(next_beat) => {
                    if let Err(reason) = beat(&beats_out, (self.settings, &self.uri.user), self.presence, false).await {
                        break Some(reason.into());
                    }
                    self.beat_foreign(&mut outlets, false).await;
                    next_beat = tokio::time::Instant::now() + self.presence.book.next_interval();
                }
                event = events.next() => match event {
                    // A channel-level (soft) error closes one channel, not the connection: the
                    // publishing channel is reopened; a consumer's end shows in its own stream.
                    Some(Event::Error(error))
                        if error.is_amqp_soft_error() && self.connection.status().connected() =>
                    {
                        if outlets.own_closed()
                            && let Some(lost) = self.publish_fault(&outlets, LinkLost::Connection(error), &mut reopen)
                        {
                            break Some(lost);
                        }
                    }
                    Some(Event::Error(error)) => break Some(LinkLost::Connection(error)),
                    Some(_) => {}
                    None => break Some(LinkLost::Ended),
                },
                _ = stop.changed() => {
                    // A graceful stop tells peers at once instead of letting them wait for the reap.
                    let _ = beat(&beats_out, (self.settings, &self.uri.user), self.presence, true).await;
                    self.beat_foreign(&mut outlets, true).await;
                    // Give outstanding confirms a moment; what is left is republished next start.
                    let drain = async { while pump.settle_next(self.courier).await.is_some() {} };
                    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                    // Closed here, while every channel handle lives: a handle dropped first queues
                    // its own channel.close, which then meets the closing connection and lapin
                    // logs a connection ERROR on an orderly stop.
                    let _ = self.connection.close(200, "fleetd stopping".into()).await;
                    break None;
                }
            }
        };
        outlets.close().await;
        lost
    }

    /// What a publishing failure means for the link: `Some(reason)` when the connection is gone
    /// (rebuild it); `None` when only a channel closed — the own confirm channel (LavinMQ closes
    /// it with 406 on low disk, where RabbitMQ would block the connection), which is reopened
    /// with its own backoff while the consumers stay, or a foreign one, reopened on next use.
    /// Entries whose confirms were lost stay in the outbox and go out again, same id.
    fn publish_fault(
        &self,
        outlets: &Outlets,
        reason: LinkLost,
        reopen: &mut Option<(tokio::time::Instant, u32)>,
    ) -> Option<LinkLost> {
        if !self.connection.status().connected() {
            return Some(reason);
        }
        if outlets.own_closed() {
            if reopen.is_none() {
                warn!(%reason, "the broker closed the publishing channel; consumers stay, publishing resumes on a new channel");
                let at = tokio::time::Instant::now() + backoff(1, self.settings.backoff_cap);
                *reopen = Some((at, 0));
            }
        } else {
            debug!(%reason, "a publishing channel to another fleet failed; reopened on next use");
        }
        None
    }

    /// A channel on this connection; consuming channels get `basic.qos`.
    async fn channel(&self, consuming: bool) -> Result<lapin::Channel, AmqpError> {
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(AmqpError::failed("open a channel"))?;
        if consuming {
            channel
                .basic_qos(PREFETCH, BasicQosOptions::default())
                .await
                .map_err(AmqpError::failed("set the prefetch"))?;
        }
        Ok(channel)
    }

    /// Consumes `queue`, forwarding its deliveries (and its end) to `tx`.
    async fn consume(
        &self,
        channel: &lapin::Channel,
        queue: &str,
        tx: &mpsc::Sender<Forwarded>,
        forwarders: &mut JoinSet<()>,
    ) -> Result<(), AmqpError> {
        let mut consumer = channel
            .basic_consume(
                queue.into(),
                format!("fleetd-{queue}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(AmqpError::failed(format!("consume `{queue}`")))?;
        let tx = tx.clone();
        let queue = queue.to_owned();
        forwarders.spawn(async move {
            while let Some(next) = consumer.next().await {
                let failed = next.is_err();
                let next = next.map_err(AmqpError::failed(format!("consume `{queue}`")));
                if tx.send(next).await.is_err() || failed {
                    return;
                }
            }
            let _ = tx.send(Err(AmqpError::Cancelled { queue })).await;
        });
        Ok(())
    }

    /// Declares and consumes the inbox of every local agent not consumed yet.
    async fn consume_agents(
        &self,
        channel: &lapin::Channel,
        tx: &mpsc::Sender<Forwarded>,
        forwarders: &mut JoinSet<()>,
        consumed: &mut HashSet<uuid::Uuid>,
    ) -> Result<(), AmqpError> {
        let arguments =
            topology::inbox_arguments(self.settings.queue_type, topology::DEFAULT_MAX_LENGTH);
        for (id, _) in self.courier.agents().list() {
            if consumed.contains(&id) {
                continue;
            }
            let queue = topology::inbox_queue(&self.settings.host, &id.to_string());
            topology::declare_bound_queue(
                channel,
                &queue,
                &topology::host_exchange(&self.settings.host),
                &topology::agent_key(&self.settings.host, &id.to_string()),
                arguments.clone(),
            )
            .await?;
            self.consume(channel, &queue, tx, forwarders).await?;
            consumed.insert(id);
        }
        Ok(())
    }

    /// Takes a window of deliveries in (one durable transaction), acknowledges, then audits.
    async fn take_in(&self, batch: Vec<Delivery>) {
        let views: Vec<(&str, &lapin::BasicProperties, &[u8])> = batch
            .iter()
            .map(|d| (d.exchange.as_str(), &d.properties, d.data.as_slice()))
            .collect();
        let (acks, audit) = self.courier.intake(self.inbound, &views);
        // Acks go out together (each waits for its frame to be written, not for the broker).
        let mut pending = JoinSet::new();
        let mut refused_for_now = Vec::new();
        for (delivery, ack) in batch.iter().zip(acks) {
            let acker = delivery.acker.clone();
            if ack {
                pending.spawn(async move { acker.ack(BasicAckOptions::default()).await });
            } else {
                refused_for_now.push(acker);
            }
        }
        if !refused_for_now.is_empty() {
            // The state store could not take them (held store or outbox full). Left unacked
            // they would block the consumer's prefetch until the connection is rebuilt (LavinMQ
            // has no consumer timeout), so they go back to the queue after a pause: redelivered
            // (and deduplicated by id) once agents have taken some.
            tokio::spawn(async move {
                tokio::time::sleep(REQUEUE_AFTER).await;
                for acker in refused_for_now {
                    let requeue = BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    };
                    if let Err(error) = acker.nack(requeue).await {
                        debug!(%error, "requeue not sent; the broker requeues on channel close");
                    }
                }
            });
        }
        let acks = async {
            while let Some(sent) = pending.join_next().await {
                match sent {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => debug!(
                        "ack not sent (channel closing); the message will be redelivered and deduplicated"
                    ),
                    Ok(Err(error)) => {
                        warn!(%error, "ack failed; the message will be redelivered and deduplicated");
                    }
                    Err(error) => warn!(%error, "ack task failed; the message will be redelivered"),
                }
            }
        };
        if tokio::time::timeout(WRITE_TIMEOUT, acks).await.is_err() {
            warn!(
                "acks not written within {WRITE_TIMEOUT:?}; the messages will be redelivered and deduplicated"
            );
        }
        // After the acks: the hand-off is already durable; the audit's disk sync need not delay
        // the broker.
        (self.presence.record)(audit);
    }

    /// Sends the latest beat into each other fleet's `x.in.OWN`; a fleet that fails is retried
    /// on the next beat.
    async fn beat_foreign(&self, outlets: &mut Outlets, leaving: bool) {
        let Some(body) = self.presence.last_beat.lock().ok().and_then(|b| b.clone()) else {
            return;
        };
        let body = wire::PresenceBeat { leaving, ..body };
        let exchange = topology::ingress_exchange(&self.presence.fleet);
        for fleet in &self.settings.beat_to {
            let vhost = format!("/{fleet}");
            let Some(channel) = outlets.beat_channel(&vhost) else {
                continue;
            };
            let sent = publish_beat(
                &channel,
                &exchange,
                (self.settings, &self.uri.user),
                self.presence,
                fleet,
                body.clone(),
            )
            .await;
            if let Err(reason) = sent {
                debug!(peer.fleet = %fleet, %reason, "presence not sent; retried next beat");
                outlets.fail_foreign(&vhost, &reason.to_string());
            }
        }
    }
}

/// Seals and publishes this host's beat to the fleet's roster exchange.
async fn beat(
    channel: &lapin::Channel,
    (settings, user): (&LinkSettings, &str),
    presence: &Presence,
    leaving: bool,
) -> Result<(), AmqpError> {
    let body = presence.book.next_beat(leaving);
    if let Ok(mut last) = presence.last_beat.lock() {
        *last = Some(body.clone());
    }
    publish_beat(
        channel,
        ROSTER_EXCHANGE,
        (settings, user),
        presence,
        &presence.fleet,
        body,
    )
    .await
}

/// Seals `body` for `dest_fleet` and publishes it to `exchange` (transient: presence is soft
/// state), routing key `roster.HOST`.
async fn publish_beat(
    channel: &lapin::Channel,
    exchange: &str,
    (settings, user): (&LinkSettings, &str),
    presence: &Presence,
    dest_fleet: &str,
    body: wire::PresenceBeat,
) -> Result<(), AmqpError> {
    let now = now_ms();
    let ttl = i64::try_from(presence.beat_ttl.as_millis()).unwrap_or(15_000);
    let meta = Meta {
        version: wire::VERSION,
        id: uuid::Uuid::now_v7(),
        kind: Kind::PresenceBeat,
        origin: Party {
            fleet: presence.fleet.clone(),
            host: settings.host.clone(),
        },
        dest: Party {
            fleet: dest_fleet.to_owned(),
            host: String::new(),
        },
        key_id: String::new(),
        created_ms: now,
        expires_ms: now + ttl,
    };
    let sealed = wire::seal(meta, &Payload::PresenceBeat(body), &presence.key);
    let properties = envelope::properties(&sealed, user).with_delivery_mode(1);
    let publish = channel.basic_publish(
        exchange.into(),
        format!("roster.{}", settings.host).as_str().into(),
        BasicPublishOptions::default(),
        &sealed.body,
        properties,
    );
    tokio::time::timeout(WRITE_TIMEOUT, publish)
        .await
        .map_err(|_| AmqpError::Timeout {
            what: "publish beat".to_owned(),
            after: WRITE_TIMEOUT,
        })?
        .map_err(AmqpError::failed("publish beat"))?;
    Ok(())
}

/// Takes in a presence beat: the daemon's roster learns the host's agents, and the courier
/// where each of them lives (kept across restarts: a message sent before the first beat after one still
/// finds its host).
fn observe(
    inbound: &Inbound,
    presence: &Presence,
    courier: &Courier,
    delivery: &lapin::message::Delivery,
) {
    match inbound.beat(
        delivery.exchange.as_str(),
        &delivery.properties,
        &delivery.data,
        now_ms(),
    ) {
        Ok((meta, beat)) => {
            if meta.origin != courier.me() {
                for agent in &beat.agents {
                    courier.remember_placement(agent.id, &meta.origin);
                }
            }
            presence.book.observe(meta.origin, beat);
        }
        // A beat that waited out its life in the queue (after an outage) is expected, not news.
        Err(InboundRefusal::Signed {
            refusal: wire::Refusal::Expired,
            ..
        }) => {
            debug!("expired presence beat dropped");
        }
        Err(refusal) => warn!(reason = %refusal, "presence beat refused"),
    }
}

/// Publishes `next`, logging a change of state (not every attempt).
fn set(status: &watch::Sender<LinkStatus>, next: LinkStatus) {
    let changed = std::mem::discriminant(&*status.borrow()) != std::mem::discriminant(&next);
    if changed {
        match &next {
            LinkStatus::Up { node, .. } => {
                info!(broker.node = %node, "broker connected; topology declared")
            }
            LinkStatus::Unreachable { reason, .. } => {
                warn!(%reason, "broker unreachable; local routing continues, retrying with backoff")
            }
            LinkStatus::Refused { reason, .. } => {
                warn!(%reason, "broker refused the credential or a declaration; retrying slowly")
            }
            LinkStatus::Starting => {}
        }
    }
    status.send_replace(next);
}

/// How long the link's loop waits for a channel to open on a connection it already has.
const CHANNEL_OPEN: Duration = Duration::from_secs(2);

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_keeps_the_first_failure() {
        let first = LinkStatus::Unreachable {
            since: 1_000,
            reason: "a".into(),
        };
        let retry = LinkStatus::Unreachable {
            since: 9_000,
            reason: "b".into(),
        }
        .continuing(&first);
        assert_eq!(
            retry,
            LinkStatus::Unreachable {
                since: 1_000,
                reason: "b".into()
            }
        );
        let refused = LinkStatus::Refused {
            since: 9_000,
            reason: "c".into(),
        };
        assert_eq!(refused.clone().continuing(&retry), refused);
        assert_eq!(
            retry.to_string(),
            "broker: unreachable since 1970-01-01T00:00:01Z: b"
        );
    }

    #[test]
    fn backoff_grows_jittered_and_is_capped() {
        let cap = Duration::from_secs(30);
        for failures in 1..40 {
            let d = backoff(failures, cap);
            let ceiling = Duration::from_millis(500)
                .saturating_mul(1u32 << failures.min(16).saturating_sub(1))
                .min(cap);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "failures {failures}: {d:?} not in [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        let draws: std::collections::HashSet<Duration> =
            (0..20).map(|_| backoff(10, cap)).collect();
        assert!(draws.len() > 1, "jitter varies the wait");
    }
}
