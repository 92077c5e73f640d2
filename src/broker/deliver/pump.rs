//! The outbound pump: outbox entries published on confirm channels (own vhost, or a lazily
//! opened publish-only connection per foreign vhost) and settled on the broker's answer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, Connection};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::settle::{Answer, Outcome, Returns};
use super::{Courier, MAX_IN_FLIGHT, PUMP_ROUND, now_ms};
use crate::broker::connect::{self, confirm_channel, connect};
use crate::broker::envelope::{OutboxRecord, properties};
use crate::secret::BrokerUri;
use crate::wire::{DeliveryState, Tracked};

/// Publishes outbox entries and settles them on the broker's answer. One per connection:
/// whatever was in flight when a connection dies is published again (same id) on the next.
#[derive(Default)]
pub struct Pump {
    in_flight: HashSet<Uuid>,
    /// The vhost of each in-flight publish to a foreign vhost.
    in_flight_foreign: HashMap<Uuid, String>,
    /// Foreign vhosts a publish to was confirmed since the last run.
    confirmed_foreign: HashSet<String>,
    /// Returns whose message's own confirm has not been read yet.
    returns: Returns,
    confirms: JoinSet<(Uuid, Result<Confirmation, String>)>,
    /// The last run stopped at its round or at [`MAX_IN_FLIGHT`]: entries may be waiting.
    behind: bool,
}

/// Why a message that expired before the broker took it failed.
const EXPIRED_HERE: &str = "expired in this host's outbox before the broker took it";

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
}

/// A foreign vhost's outlet.
enum Foreign {
    /// Being opened; the task wakes the pump (`outbox_ready`) when it is done.
    Opening(oneshot::Receiver<Result<Opened, String>>),
    /// Open.
    Open(Box<Opened>),
    /// The last attempt failed; not tried again before this instant.
    Resting(Instant),
}

impl Outlets {
    /// Outlets with `own` (a confirm channel in `own_vhost`); foreign ones connect with `uri` and
    /// wake `courier`'s pump when they open.
    pub fn new(
        own: Channel,
        own_vhost: &str,
        uri: Arc<BrokerUri>,
        courier: Arc<Courier>,
        cap: Duration,
    ) -> Outlets {
        Outlets {
            own,
            own_broken: false,
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
                    self.fail_foreign(vhost, &reason);
                    return None;
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.fail_foreign(vhost, "the connection attempt was dropped");
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
async fn open(uri: &BrokerUri, vhost: &str) -> Result<Opened, String> {
    // The connect is bounded by itself (per node); the channel RPCs after it must be too.
    let connection = connect(uri, Some(vhost)).await.map_err(|e| e.to_string())?;
    let channels = async {
        let confirm = confirm_channel(&connection).await?;
        let beats = connection
            .create_channel()
            .await
            .map_err(|e| format!("channel: {e}"))?;
        Ok::<_, String>((confirm, beats))
    };
    let (confirm, beats) = tokio::time::timeout(connect::HANDSHAKE_TIMEOUT, channels)
        .await
        .unwrap_or_else(|_| Err(format!("no answer opening a channel in `{vhost}`")))?;
    Ok(Opened {
        connection,
        confirm,
        beats,
    })
}

impl Pump {
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
    ) -> Result<(), String> {
        for vhost in self.confirmed_foreign.drain() {
            outlets.foreign_ok(&vhost);
        }
        let round = PUMP_ROUND.min(MAX_IN_FLIGHT.saturating_sub(self.in_flight.len()));
        if round == 0 {
            self.behind = true;
            return Ok(());
        }
        let pending = courier
            .state
            .outbox_pending(&|id| self.in_flight.contains(&id), round)
            .map_err(|e| e.to_string())?;
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
                let moved = courier.delivery(id).ok().flatten().map(|t| {
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
            let Some(channel) = outlets.channel(&record.vhost) else {
                blocked.insert(record.vhost.clone());
                continue;
            };
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let published = channel
                .basic_publish(
                    record.exchange.as_str().into(),
                    record.key.as_str().into(),
                    options,
                    &sealed.body,
                    properties(&sealed, user),
                )
                .await;
            match published {
                Ok(confirm) => {
                    progressed = true;
                    self.in_flight.insert(id);
                    if record.vhost != courier.vhost {
                        self.in_flight_foreign.insert(id, record.vhost.clone());
                    }
                    self.confirms
                        .spawn(async move { (id, confirm.await.map_err(|e| e.to_string())) });
                }
                Err(error) if record.vhost == courier.vhost => {
                    outlets.own_broken = true;
                    return Err(error.to_string());
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

    /// The next broker answers (one awaited, and every other already in), settled in one
    /// transaction. `None` when nothing is in flight; `Some(Err)` when a confirm was lost (the
    /// entry stays in the outbox).
    pub async fn settle_next(&mut self, courier: &Courier) -> Option<Result<(), String>> {
        let mut answers = vec![self.confirms.join_next().await?];
        while let Some(more) = self.confirms.try_join_next() {
            answers.push(more);
        }
        let now = now_ms();
        let mut confirms = Vec::with_capacity(answers.len());
        let mut returned = Vec::new();
        let mut lost = None;
        for joined in answers {
            let Ok((id, answer)) = joined else {
                lost = Some("a confirm task failed".to_owned());
                continue;
            };
            self.in_flight.remove(&id);
            let foreign = self.in_flight_foreign.remove(&id);
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
                Ok(Confirmation::NotRequested) => lost = Some("confirm mode is off".to_owned()),
                Err(reason) => lost = Some(reason),
            }
        }
        let read = self
            .returns
            .read(&confirms, &returned, |id| self.in_flight.contains(&id));
        let record = |id: Uuid| {
            courier
                .state
                .delivery_get(id)
                .ok()
                .flatten()
                .and_then(|b| Tracked::decode(&b))
        };
        let mut removed = Vec::with_capacity(read.settled.len());
        let mut moved: Vec<(Uuid, Vec<u8>)> = Vec::new();
        for (id, outcome) in read.settled {
            removed.push(id);
            let state = match outcome {
                Outcome::Queued => DeliveryState::Queued,
                Outcome::NoSuchAgent | Outcome::InboxFull => DeliveryState::Failed,
            };
            if let Some(t) = record(id) {
                let mut t = t.moved(state, outcome.reason().map(str::to_owned), now);
                t.in_broker = true;
                moved.push((id, t.encode()));
            }
        }
        // Returned after its ack was read: it was never routed, so `queued` becomes `no such
        // agent`; one that already failed (a nack: inbox full) stays as it is.
        for id in read.late {
            if let Some(t) = record(id).filter(|t| t.state == DeliveryState::Queued && t.in_broker)
            {
                let t = t.moved(
                    DeliveryState::Failed,
                    Outcome::NoSuchAgent.reason().map(str::to_owned),
                    now,
                );
                moved.push((id, t.encode()));
            }
        }
        let records: Vec<(Uuid, &[u8])> = moved.iter().map(|(id, r)| (*id, r.as_slice())).collect();
        if let Err(error) = courier.state.outbox_settle(&removed, &records) {
            return Some(Err(error.to_string()));
        }
        Some(lost.map_or(Ok(()), Err))
    }
}

/// The message id of a returned message (fleetd's ids are UUIDs; anything else is not ours).
fn returned_id(returned: Option<&lapin::message::Delivery>) -> Option<Uuid> {
    let id = returned?.properties.message_id().as_ref()?;
    Uuid::parse_str(id.as_str()).ok()
}
