//! The outbound pump: outbox entries published on confirm channels (own vhost, or a lazily
//! opened publish-only connection per foreign vhost) and settled on the broker's answer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::lanes::{Admit, Depth, DepthUnknown, Lane, Lanes};
use super::settle::{Answer, Outcome, Returns};
use super::{Courier, MAX_IN_FLIGHT, PUMP_ROUND, now_ms};
use crate::broker::AmqpError;
use crate::broker::connect::{self, ConnectError, WRITE_TIMEOUT, confirm_channel, connect};
use crate::broker::envelope::{OutboxRecord, properties};
use crate::broker::topology::{DEFAULT_MAX_LENGTH, queue_of_key};
use crate::secret::BrokerUri;
use crate::state::StateError;
use crate::wire::DeliveryState;

/// Publishes outbox entries and settles them on the broker's answer. One per connection:
/// whatever was in flight when a connection dies is published again (same id) on the next.
#[derive(Default)]
pub struct Pump {
    /// Each publish awaiting its confirm, and where it went.
    in_flight: HashMap<Uuid, Lane>,
    /// Foreign vhosts a publish to was confirmed since the last run.
    confirmed_foreign: HashSet<String>,
    /// Returns whose message's own confirm has not been read yet.
    returns: Returns,
    confirms: JoinSet<(Uuid, Result<Confirmation, AmqpError>)>,
    /// The last run stopped at its round or at [`MAX_IN_FLIGHT`]: entries may be waiting.
    behind: bool,
    /// Queues the broker refuses now (nacks without a return), and the entries behind them.
    lanes: Lanes,
    /// The longest rest of a refused queue (`broker.backoff_cap_secs`).
    cap: Duration,
}

/// Why publishing or settling stopped short. The entries concerned stay in the outbox and go
/// out again, same id.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    /// A broker call failed (a publish, a confirm, a channel).
    #[error(transparent)]
    Amqp(#[from] AmqpError),
    /// A foreign vhost could not be connected.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The outbox could not be read or settled.
    #[error("the outbox: {0}")]
    State(#[from] StateError),
    /// A publish frame was not written in time (the connection may be dying).
    #[error("publish not written within {0:?}")]
    NotWritten(Duration),
    /// Opening a foreign vhost's channels got no answer.
    #[error("no answer opening a channel in `{0}`")]
    ChannelTimeout(String),
    /// The task opening a foreign vhost's connection went away.
    #[error("the connection attempt was dropped")]
    Dropped,
    /// A confirm's task failed.
    #[error("a confirm task failed")]
    ConfirmTask,
    /// The channel answered a publish without confirm mode.
    #[error("confirm mode is off")]
    NoConfirms,
}

/// Why a message that expired before the broker took it failed.
const EXPIRED_HERE: &str = "expired in this host's outbox before the broker took it";

/// What a retrying message's record says of a bare nack.
const REFUSED_WHY: &str = "the broker did not take it (a nack: its queue may be changing leader, or its inbox at its limit)";

/// How long a queue's depth is waited for.
const DEPTH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a foreign vhost that could not be opened (or closed the channel on a publish) is
/// left alone before the next attempt: doubled after each failure of a spell, up to the link's
/// backoff cap (`broker.backoff_cap_secs`).
const FOREIGN_RETRY: Duration = Duration::from_secs(2);

/// Confirm channels to publish on: the own vhost's, and one publish-only connection per foreign
/// vhost, opened lazily (DESIGN.md "Connections and faults"). Foreign connections are opened in
/// their own task: the link's loop (intake, beats, settling) never waits for a handshake.
pub struct Outlets {
    own: Channel,
    /// A publish on the own channel failed: it is not used again until replaced.
    own_broken: bool,
    /// A channel without confirms in the own vhost for asking a queue's depth (a passive
    /// declare that fails closes it: the link replaces it).
    own_probe: Channel,
    own_vhost: String,
    uri: Arc<BrokerUri>,
    courier: Arc<Courier>,
    foreign: HashMap<String, Foreign>,
    /// Foreign vhosts failing now: how many attempts failed in this spell, and when the last
    /// did (logged once when a spell starts and once when a publish there is confirmed again).
    failing: HashMap<String, (u32, Instant)>,
    /// The longest rest between attempts at a failing foreign vhost.
    cap: Duration,
}

/// A foreign vhost's open connection: a confirm channel for messages, and a channel without
/// confirms for presence beats (a beat is fire-and-forget; on the confirm channel its confirm
/// would be dropped, and with it any return lapin handed to that confirm).
struct Opened {
    connection: Connection,
    confirm: Channel,
    beats: Channel,
    /// For a queue's depth (see [`Outlets::own_probe`]); closed by a refused declare, and then
    /// not replaced until the connection is.
    probe: Channel,
}

/// A foreign vhost's outlet.
enum Foreign {
    /// Being opened; the task wakes the pump (`outbox_ready`) when it is done.
    Opening(oneshot::Receiver<Result<Opened, PumpError>>),
    /// Open.
    Open(Box<Opened>),
    /// The last attempt failed; not tried again before this instant.
    Resting(Instant),
}

impl Outlets {
    /// Outlets with `own` (a confirm channel in `own_vhost`); foreign ones connect with `uri` and
    /// wake `courier`'s pump when they open.
    pub fn new(
        (own, own_probe): (Channel, Channel),
        own_vhost: &str,
        uri: Arc<BrokerUri>,
        courier: Arc<Courier>,
        cap: Duration,
    ) -> Outlets {
        Outlets {
            own,
            own_broken: false,
            own_probe,
            own_vhost: own_vhost.to_owned(),
            uri,
            courier,
            foreign: HashMap::new(),
            failing: HashMap::new(),
            cap: cap.max(FOREIGN_RETRY),
        }
    }

    /// The confirm channel for `vhost`; `None` while it is being opened or cannot be reached
    /// (logged once per failure spell). Never waits.
    pub fn channel(&mut self, vhost: &str) -> Option<Channel> {
        if vhost == self.own_vhost {
            return (!self.own_closed()).then(|| self.own.clone());
        }
        self.foreign(vhost).map(|opened| opened.confirm.clone())
    }

    /// Whether the own vhost's confirm channel is closed (the broker closed it — LavinMQ does
    /// on low disk — or a publish on it failed) and must be replaced before publishing there.
    pub fn own_closed(&self) -> bool {
        self.own_broken || !self.own.status().connected()
    }

    /// Whether the own vhost's depth channel is closed (a refused declare closed it).
    pub fn own_probe_closed(&self) -> bool {
        !self.own_probe.status().connected()
    }

    /// Depths in the own vhost are asked on `channel` from now on.
    pub fn replace_own_probe(&mut self, channel: Channel) {
        self.own_probe = channel;
    }

    /// The channel to ask a queue's depth on in `vhost`, if one is open. Never waits.
    fn probe_channel(&mut self, vhost: &str) -> Option<Channel> {
        if vhost == self.own_vhost {
            return (!self.own_probe_closed()).then(|| self.own_probe.clone());
        }
        let opened = self.foreign(vhost)?;
        opened
            .probe
            .status()
            .connected()
            .then(|| opened.probe.clone())
    }

    /// Publishes to the own vhost go on `channel` (a new confirm channel) from now on.
    pub fn replace_own(&mut self, channel: Channel) {
        self.own = channel;
        self.own_broken = false;
    }

    /// The channel without confirms for presence beats into foreign `vhost`, opened like
    /// [`Outlets::channel`]'s. Never waits.
    pub fn beat_channel(&mut self, vhost: &str) -> Option<Channel> {
        self.foreign(vhost).map(|opened| opened.beats.clone())
    }

    /// Foreign `vhost`'s open connection, or `None` while it opens (started here if needed) or
    /// rests after a failure.
    fn foreign(&mut self, vhost: &str) -> Option<&Opened> {
        let usable = match self.foreign.get_mut(vhost) {
            Some(Foreign::Open(opened)) => {
                let usable = opened.connection.status().connected()
                    && opened.confirm.status().connected()
                    && opened.beats.status().connected();
                if !usable {
                    // The broker closed it (a publish it refused: no such exchange, no right):
                    // rest before reopening, or every round would reopen and fail again.
                    self.fail_foreign(vhost, "the broker closed the channel");
                    return None;
                }
                true
            }
            Some(Foreign::Opening(pending)) => match pending.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => return None,
                Ok(Ok(opened)) => {
                    self.foreign
                        .insert(vhost.to_owned(), Foreign::Open(Box::new(opened)));
                    true
                }
                Ok(Err(reason)) => {
                    self.fail_foreign(vhost, &reason.to_string());
                    return None;
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.fail_foreign(vhost, &PumpError::Dropped.to_string());
                    return None;
                }
            },
            Some(Foreign::Resting(until)) if Instant::now() < *until => return None,
            Some(Foreign::Resting(_)) | None => false,
        };
        if usable {
            return match self.foreign.get(vhost) {
                Some(Foreign::Open(opened)) => Some(opened),
                _ => None,
            };
        }
        let (tx, rx) = oneshot::channel();
        let (uri, courier, target) = (
            Arc::clone(&self.uri),
            Arc::clone(&self.courier),
            vhost.to_owned(),
        );
        tokio::spawn(async move {
            if let Err(Ok(opened)) = tx.send(open(&uri, &target).await) {
                // Nobody waits any more (the link reconnected or stopped).
                let _ = opened.connection.close(200, "unused".into()).await;
            }
            courier.outbox_ready.notify_one();
        });
        self.foreign.insert(vhost.to_owned(), Foreign::Opening(rx));
        None
    }

    /// An attempt at foreign `vhost` failed: its connection (if open) is closed and it rests,
    /// longer after each failure in a row; the first failure of a spell is logged.
    pub fn fail_foreign(&mut self, vhost: &str, reason: &str) {
        let now = Instant::now();
        let quiet = self.cap.saturating_mul(4);
        let spell = self.failing.entry(vhost.to_owned()).or_insert((0, now));
        // A failure long after the last one starts a new spell (the vhost worked in between).
        if spell.0 > 0 && now.duration_since(spell.1) > quiet {
            spell.0 = 0;
        }
        spell.0 = spell.0.saturating_add(1);
        spell.1 = now;
        let failures = spell.0;
        if failures == 1 {
            tracing::warn!(%vhost, %reason, "cannot publish to a foreign vhost; retrying with backoff");
        }
        let rest = FOREIGN_RETRY
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(8)))
            .min(self.cap);
        if let Some(Foreign::Open(opened)) = self
            .foreign
            .insert(vhost.to_owned(), Foreign::Resting(Instant::now() + rest))
        {
            tokio::spawn(async move {
                let _ = opened.connection.close(200, "resting".into()).await;
            });
        }
    }

    /// How many attempts at foreign `vhost` failed in its current spell (0: none failing).
    pub fn failures(&self, vhost: &str) -> u32 {
        self.failing.get(vhost).map_or(0, |spell| spell.0)
    }

    /// A publish to foreign `vhost` was confirmed: a failure spell (if any) is over.
    pub fn foreign_ok(&mut self, vhost: &str) {
        if self.failing.remove(vhost).is_some() {
            tracing::info!(%vhost, "foreign vhost reachable again");
        }
    }

    /// Closes the foreign connections (one still opening closes itself when it finds nobody
    /// waiting).
    pub async fn close(&mut self) {
        for (_, foreign) in self.foreign.drain() {
            if let Foreign::Open(opened) = foreign {
                // Bounded: a connection to a node that just died would wait for its close-ok
                // until the heartbeat gives up, and the link reconnects only after this.
                let close = opened.connection.close(200, "fleetd stopping".into());
                let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
            }
        }
    }
}

/// Opens a publish-only connection to `vhost` with its two channels (see [`Opened`]), within
/// the handshake bound.
async fn open(uri: &BrokerUri, vhost: &str) -> Result<Opened, PumpError> {
    // The connect is bounded by itself (per node); the channel RPCs after it must be too.
    let connection = connect(uri, Some(vhost)).await?;
    let channels = async {
        let confirm = confirm_channel(&connection).await?;
        let plain = || async {
            connection
                .create_channel()
                .await
                .map_err(AmqpError::failed("open a channel"))
        };
        Ok::<_, PumpError>((confirm, plain().await?, plain().await?))
    };
    let (confirm, beats, probe) = tokio::time::timeout(connect::HANDSHAKE_TIMEOUT, channels)
        .await
        .unwrap_or_else(|_| Err(PumpError::ChannelTimeout(vhost.to_owned())))?;
    Ok(Opened {
        connection,
        confirm,
        beats,
        probe,
    })
}

impl Pump {
    /// A pump for a new connection; a queue the broker refuses rests at most `cap` between
    /// tests.
    pub fn new(cap: Duration) -> Pump {
        Pump {
            cap,
            ..Pump::default()
        }
    }

    /// Publishes what is in the outbox and not in flight, oldest first: at most [`PUMP_ROUND`]
    /// entries (the link's loop stays responsive), and no more than [`MAX_IN_FLIGHT`] awaiting
    /// confirms. When a round was full and got somewhere with room left, the pump wakes itself
    /// (`outbox_ready`) for the next; at the in-flight bound, [`Pump::behind`] tells the link
    /// to run it again as confirms settle. `Err`: a publish on the own channel failed (the
    /// channel is marked closed; see [`Outlets::own_closed`]).
    pub async fn run(
        &mut self,
        courier: &Courier,
        user: &str,
        outlets: &mut Outlets,
    ) -> Result<(), PumpError> {
        for vhost in self.confirmed_foreign.drain() {
            outlets.foreign_ok(&vhost);
        }
        self.ask_depths(outlets);
        self.read_depths(courier);
        let round = PUMP_ROUND.min(MAX_IN_FLIGHT.saturating_sub(self.in_flight.len()));
        if round == 0 {
            self.behind = true;
            return Ok(());
        }
        self.lanes.wake(Instant::now());
        let pending = courier.state.outbox_pending(
            &|id| self.in_flight.contains_key(&id) || self.lanes.parked(id),
            round,
        )?;
        let full = pending.len() >= round;
        let now = now_ms();
        self.behind = full;
        let mut progressed = false;
        let mut blocked = HashSet::new();
        for (id, bytes) in pending {
            let Ok(record) = serde_json::from_slice::<OutboxRecord>(&bytes) else {
                tracing::warn!(msg.id = %id, "unreadable outbox entry dropped");
                let _ = courier.state.outbox_settle(&[id], &[]);
                progressed = true;
                continue;
            };
            let Some(sealed) = record.sealed() else {
                let _ = courier.state.outbox_settle(&[id], &[]);
                progressed = true;
                continue;
            };
            if sealed.meta.expires_ms <= now {
                // Waited out its whole life here (the broker unreachable for a day): no receiver
                // would take it, so its sender learns now rather than from a refusal.
                let moved = courier.mailbox().delivery(id).ok().flatten().map(|t| {
                    t.moved(DeliveryState::Failed, Some(EXPIRED_HERE.to_owned()), now)
                        .encode()
                });
                let moved: Vec<(Uuid, &[u8])> = moved.iter().map(|m| (id, m.as_slice())).collect();
                tracing::warn!(msg.id = %id, "message expired in the outbox; dropped");
                let _ = courier.state.outbox_settle(&[id], &moved);
                progressed = true;
                continue;
            }
            if blocked.contains(&record.vhost) {
                continue;
            }
            let lane = Lane {
                vhost: record.vhost.clone(),
                key: record.key.clone(),
            };
            let admit = self.lanes.admit(&lane, id, Instant::now());
            if admit == Admit::Park {
                continue;
            }
            let Some(channel) = outlets.channel(&record.vhost) else {
                blocked.insert(record.vhost.clone());
                continue;
            };
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let publish = channel.basic_publish(
                record.exchange.as_str().into(),
                record.key.as_str().into(),
                options,
                &sealed.body,
                properties(&sealed, user),
            );
            // Bounded: a frame queued as the connection dies may never be written (see
            // `connect::WRITE_TIMEOUT`); the entry stays in the outbox.
            let published = match tokio::time::timeout(WRITE_TIMEOUT, publish).await {
                Ok(published) => {
                    published.map_err(|e| PumpError::from(AmqpError::failed("publish")(e)))
                }
                Err(_) => Err(PumpError::NotWritten(WRITE_TIMEOUT)),
            };
            match published {
                Ok(confirm) => {
                    progressed = true;
                    if admit == Admit::Test {
                        self.lanes.testing(&lane, id);
                    }
                    self.in_flight.insert(id, lane);
                    self.confirms.spawn(async move {
                        (id, confirm.await.map_err(AmqpError::failed("confirm")))
                    });
                }
                Err(error) if record.vhost == courier.vhost => {
                    outlets.own_broken = true;
                    return Err(error);
                }
                Err(error) => {
                    outlets.fail_foreign(&record.vhost, &error.to_string());
                    blocked.insert(record.vhost.clone());
                }
            }
        }
        // More may be waiting behind this round. Without this, they waited for the next send,
        // or for the whole in-flight set to settle. A round that published nothing (every
        // vhost in it unreachable) is left to the link's retry tick instead of spinning.
        if full && progressed && self.in_flight.len() < MAX_IN_FLIGHT {
            courier.outbox_ready.notify_one();
        }
        Ok(())
    }

    /// How many publishes await the broker's confirm.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether the last run may have left entries waiting (its round was full, or confirms were
    /// at the bound): run it again once some settle.
    pub fn behind(&self) -> bool {
        self.behind
    }

    /// Whether confirms are outstanding.
    pub fn busy(&self) -> bool {
        !self.confirms.is_empty()
    }

    /// When a queue the broker refused may be tried again (the link runs the pump then).
    pub fn wake_at(&self) -> Option<Instant> {
        self.lanes.wake_at()
    }

    /// Asks the depth of each refused queue not asked since its last refusal (a passive
    /// declare, in its own task: the link's loop never waits for it).
    fn ask_depths(&mut self, outlets: &mut Outlets) {
        if !self.lanes.any() {
            return;
        }
        for lane in self.lanes.due_for_depth() {
            let (tx, rx) = oneshot::channel::<Depth>();
            self.lanes.asking(&lane, rx);
            let (Some(queue), Some(channel)) =
                (queue_of_key(&lane.key), outlets.probe_channel(&lane.vhost))
            else {
                let _ = tx.send(Err(DepthUnknown::NoChannel));
                continue;
            };
            let wake = Arc::clone(&outlets.courier);
            tokio::spawn(async move {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                let asked =
                    channel.queue_declare(queue.as_str().into(), passive, FieldTable::default());
                let depth = match tokio::time::timeout(DEPTH_TIMEOUT, asked).await {
                    Ok(Ok(queue)) => Ok(queue.message_count()),
                    Ok(Err(error)) => Err(DepthUnknown::from(error)),
                    Err(_) => Err(DepthUnknown::Timeout(DEPTH_TIMEOUT)),
                };
                let _ = tx.send(depth);
                wake.outbox_ready.notify_one();
            });
        }
    }

    /// Reads the depths answered: a queue at its limit fails the messages it refused (`inbox
    /// full`, for good); one below it, or one whose depth the broker will not give, keeps them
    /// retrying.
    fn read_depths(&mut self, courier: &Courier) {
        for (lane, depth, waiting) in self.lanes.answers() {
            let queue = queue_of_key(&lane.key).unwrap_or_default();
            match depth {
                Ok(depth) if i64::from(depth) >= DEFAULT_MAX_LENGTH && !waiting.is_empty() => {
                    let now = now_ms();
                    let reason = Outcome::InboxFull.reason().map(str::to_owned);
                    let moved: Vec<(Uuid, Vec<u8>)> = waiting
                        .iter()
                        .filter_map(|id| {
                            let t = courier.mailbox().delivery(*id).ok().flatten()?;
                            let mut t = t.moved(DeliveryState::Failed, reason.clone(), now);
                            t.in_broker = true;
                            Some((*id, t.encode()))
                        })
                        .collect();
                    let records: Vec<(Uuid, &[u8])> =
                        moved.iter().map(|(id, r)| (*id, r.as_slice())).collect();
                    match courier.state.outbox_settle(&waiting, &records) {
                        Ok(()) => {
                            self.lanes.failed(&lane, &waiting);
                            tracing::warn!(vhost = %lane.vhost, %queue, depth, failed = waiting.len(), "inbox full: the messages it refused failed");
                        }
                        Err(error) => {
                            tracing::warn!(%error, "cannot record messages an inbox refused");
                        }
                    }
                }
                Ok(depth) => {
                    tracing::debug!(vhost = %lane.vhost, %queue, depth, "a refused queue is below its limit: retrying");
                }
                Err(reason) => {
                    tracing::debug!(vhost = %lane.vhost, %queue, %reason, "a refused queue's depth is unknown: retrying");
                }
            }
        }
    }

    /// The next broker answers (one awaited, and every other already in), settled in one
    /// transaction. `None` when nothing is in flight; `Some(Err)` when a confirm was lost (the
    /// entry stays in the outbox).
    pub async fn settle_next(&mut self, courier: &Courier) -> Option<Result<(), PumpError>> {
        let mut answers = vec![self.confirms.join_next().await?];
        while let Some(more) = self.confirms.try_join_next() {
            answers.push(more);
        }
        let now = now_ms();
        let mut confirms = Vec::with_capacity(answers.len());
        let mut returned = Vec::new();
        let mut lost = None;
        let mut lanes: HashMap<Uuid, Lane> = HashMap::new();
        for joined in answers {
            let Ok((id, answer)) = joined else {
                lost = Some(PumpError::ConfirmTask);
                continue;
            };
            let lane = self.in_flight.remove(&id);
            let foreign = lane
                .as_ref()
                .filter(|lane| lane.vhost != courier.vhost)
                .map(|lane| lane.vhost.clone());
            lanes.extend(lane.map(|lane| (id, lane)));
            // lapin hands a return to whichever confirm completes next: kept by message id.
            match answer {
                Ok(Confirmation::Ack(r)) => {
                    self.confirmed_foreign.extend(foreign);
                    returned.extend(returned_id(r.as_deref()));
                    confirms.push((id, Answer::Ack));
                }
                Ok(Confirmation::Nack(r)) => {
                    returned.extend(returned_id(r.as_deref()));
                    confirms.push((id, Answer::Nack));
                }
                Ok(Confirmation::NotRequested) => lost = Some(PumpError::NoConfirms),
                Err(reason) => lost = Some(PumpError::Amqp(reason)),
            }
        }
        let read = self
            .returns
            .read(&confirms, &returned, |id| self.in_flight.contains_key(&id));
        let record = |id: Uuid| courier.mailbox().delivery(id).ok().flatten();
        let mut removed = Vec::with_capacity(read.settled.len());
        let mut moved: Vec<(Uuid, Vec<u8>)> = Vec::new();
        let at = Instant::now();
        // Failures for good, by reason: logged once per batch of answers, with their count.
        let mut failed: HashMap<&'static str, usize> = HashMap::new();
        for (id, outcome) in read.settled {
            let lane = lanes.get(&id);
            let state = match outcome {
                Outcome::Queued => DeliveryState::Queued,
                Outcome::NoSuchAgent | Outcome::InboxFull => DeliveryState::Failed,
                Outcome::Refused => {
                    // Kept in the outbox: its queue rests and is tested again.
                    if let Some(lane) = lane
                        && self.lanes.refused(lane, id, at, self.cap)
                    {
                        tracing::warn!(vhost = %lane.vhost, queue = %queue_of_key(&lane.key).unwrap_or_default(), "the broker refuses messages for a queue (a nack without a return): they stay in the outbox and go again with backoff");
                    }
                    if let Some(t) = record(id) {
                        moved.push((id, t.retrying(REFUSED_WHY, now).encode()));
                    }
                    courier.outbox_ready.notify_one();
                    continue;
                }
            };
            removed.push(id);
            if let Some(lane) = lane
                && let Some(ended) = self.lanes.answered(lane, at)
            {
                tracing::info!(vhost = %lane.vhost, queue = %queue_of_key(&lane.key).unwrap_or_default(), nacks = ended.nacks, secs = ended.lasted.as_secs(), "the broker takes messages for the queue again");
                courier.outbox_ready.notify_one();
            }
            if let Some(reason) = outcome.reason() {
                *failed.entry(reason).or_default() += 1;
            }
            if let Some(t) = record(id) {
                let mut t = t.moved(state, outcome.reason().map(str::to_owned), now);
                t.in_broker = true;
                moved.push((id, t.encode()));
            }
        }
        // Returned after its confirm was read. After a bare nack (the entry waits in a refused
        // queue): LavinMQ's full inbox, which returns and nacks at once — failed for good.
        // After an ack: it was never routed, so `queued` becomes `no such agent`; one that
        // already failed stays as it is.
        for id in read.late {
            if let Some(lane) = self.lanes.refused_on(id) {
                self.lanes.failed(&lane, &[id]);
                removed.push(id);
                *failed.entry("inbox full").or_default() += 1;
                if let Some(t) = record(id) {
                    let mut t = t.moved(
                        DeliveryState::Failed,
                        Outcome::InboxFull.reason().map(str::to_owned),
                        now,
                    );
                    t.in_broker = true;
                    moved.push((id, t.encode()));
                }
                continue;
            }
            if let Some(t) = record(id).filter(|t| t.state == DeliveryState::Queued && t.in_broker)
            {
                let t = t.moved(
                    DeliveryState::Failed,
                    Outcome::NoSuchAgent.reason().map(str::to_owned),
                    now,
                );
                moved.push((id, t.encode()));
                if let Some(reason) = Outcome::NoSuchAgent.reason() {
                    *failed.entry(reason).or_default() += 1;
                }
            }
        }
        for (reason, count) in failed {
            tracing::warn!(%reason, count, "messages failed for good on the broker's answer");
        }
        let records: Vec<(Uuid, &[u8])> = moved.iter().map(|(id, r)| (*id, r.as_slice())).collect();
        if let Err(error) = courier.state.outbox_settle(&removed, &records) {
            return Some(Err(PumpError::State(error)));
        }
        Some(lost.map_or(Ok(()), Err))
    }
}

/// The message id of a returned message (fleetd's ids are UUIDs; anything else is not ours).
fn returned_id(returned: Option<&lapin::message::Delivery>) -> Option<Uuid> {
    let id = returned?.properties.message_id().as_ref()?;
    Uuid::parse_str(id.as_str()).ok()
}
