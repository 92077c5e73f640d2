//! The link to the broker: fleetd rebuilds its connection itself, with jittered exponential
//! backoff and a configurable cap (lapin's own recovery retries auth errors in lockstep and fails
//! in-flight confirms). After every (re)connect the topology is declared again, idempotently. An
//! unreachable broker is a degraded state, never an exit; state changes are logged, not attempts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, Event};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::envelope;
use super::inbound::{Accepted, Inbound, InboundRefusal};
use super::topology::{self, CTL_EXCHANGE, QueueType, ROSTER_EXCHANGE};
use super::{ConnectError, connect};
use crate::roster::{Change, HostId, Roster};
use crate::secret::BrokerUri;
use crate::wire::{self, HostKey, Kind, Meta, Party, Payload};

/// Where the link stands; `since` is Unix milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkStatus {
    /// Not yet tried.
    Starting,
    /// Connected and topology declared.
    Up {
        /// Since when.
        since: i64,
    },
    /// The broker cannot be reached.
    Unreachable {
        /// Since when.
        since: i64,
        /// The last error.
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

impl std::fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkStatus::Starting => f.write_str("broker: starting"),
            LinkStatus::Up { since } => write!(f, "broker: connected since {since}"),
            LinkStatus::Unreachable { since, .. } => write!(f, "broker: unreachable since {since}"),
            LinkStatus::Refused { since, .. } => write!(f, "broker: refused since {since}"),
        }
    }
}

/// Deliveries in flight per consumer (set explicitly: LavinMQ would default to 65535).
const PREFETCH: u16 = 32;

/// This host's presence: its roster, and how it signs its beats.
pub struct Presence {
    /// The roster (short critical sections, never held across an await).
    pub roster: Arc<std::sync::Mutex<Roster>>,
    /// The host key that signs beats.
    pub key: HostKey,
    /// This host's fleet (also its broker user).
    pub fleet: String,
    /// Beats expire after this long.
    pub beat_ttl: Duration,
    /// The last beat body sent to the own fleet, repeated to other fleets.
    pub last_beat: std::sync::Mutex<Option<wire::PresenceBeat>>,
    /// Where decisions on inbound messages are recorded (the audit log).
    pub record: Recorder,
}

/// Records a decision: an event name and its detail (the daemon writes it to the audit log).
pub type Recorder = Arc<dyn Fn(&'static str, serde_json::Value) + Send + Sync>;

/// How the link behaves.
#[derive(Clone, Debug)]
pub struct LinkSettings {
    /// This host (names its control queue `gw.HOST.ctl`).
    pub host: String,
    /// Longest wait between attempts.
    pub backoff_cap: Duration,
    /// Classic or quorum queues.
    pub queue_type: QueueType,
    /// Origin fleets whose ingress exchange the control queue is bound to (key `ctl.HOST`).
    pub admit: Vec<String>,
    /// Other fleets this host beats its presence into (through their `x.in.OWN`).
    pub beat_to: Vec<String>,
}

/// Keeps a connection up until `stop` turns true; publishes its status on `status`.
pub async fn supervise(
    uri: BrokerUri,
    settings: LinkSettings,
    inbound: Arc<Inbound>,
    presence: Arc<Presence>,
    status: watch::Sender<LinkStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        let outcome = match connect(&uri, None).await {
            Ok(connection) => match declare(&connection, &settings).await {
                Ok(()) => {
                    failures = 0;
                    set(&status, LinkStatus::Up { since: now_ms() });
                    let lost =
                        serve(&connection, &uri, &settings, &inbound, &presence, &mut stop).await;
                    if lost.is_none() {
                        let _ = connection.close(200, "fleetd stopping".into()).await;
                        return;
                    }
                    LinkStatus::Unreachable {
                        since: now_ms(),
                        reason: lost.unwrap_or_default(),
                    }
                }
                Err(reason) => LinkStatus::Refused {
                    since: now_ms(),
                    reason,
                },
            },
            Err(ConnectError::Refused { reason, .. }) => LinkStatus::Refused {
                since: now_ms(),
                reason,
            },
            Err(ConnectError::Unreachable { reason, .. }) => LinkStatus::Unreachable {
                since: now_ms(),
                reason,
            },
        };
        let refused = matches!(outcome, LinkStatus::Refused { .. });
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

/// Declares the fleet exchanges and this host's control queue (idempotent).
async fn declare(connection: &Connection, settings: &LinkSettings) -> Result<(), String> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    topology::declare_exchanges(&channel).await?;
    let queue = format!("gw.{}.ctl", settings.host);
    let arguments = topology::inbox_arguments(settings.queue_type, topology::DEFAULT_MAX_LENGTH);
    topology::declare_bound_queue(
        &channel,
        &queue,
        CTL_EXCHANGE,
        &settings.host,
        arguments.clone(),
    )
    .await?;
    let key = format!("ctl.{}", settings.host);
    for origin in &settings.admit {
        // The admin declares `x.in.ORIGIN` (`fleetd broker grants --admit`); binding needs read on
        // it and write on the queue, both in the own fleet's grant.
        let exchange = topology::ingress_exchange(origin);
        topology::declare_bound_queue(&channel, &queue, &exchange, &key, arguments.clone()).await?;
    }
    let mut bindings = vec![(ROSTER_EXCHANGE.to_owned(), "roster.#".to_owned())];
    bindings.extend(
        settings
            .admit
            .iter()
            .map(|o| (topology::ingress_exchange(o), "roster.#".to_owned())),
    );
    topology::declare_roster_queue(&channel, &format!("gw.{}.roster", settings.host), &bindings)
        .await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// Consumes the control queue, taking every delivery in through `inbound`, until the
/// connection fails or the consumer is cancelled (`Some(reason)`: reconnect, re-declare,
/// re-consume) or the stop signal arrives (`None`).
async fn serve(
    connection: &Connection,
    uri: &BrokerUri,
    settings: &LinkSettings,
    inbound: &Inbound,
    presence: &Presence,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let control = format!("gw.{}.ctl", settings.host);
    let roster_queue = format!("gw.{}.roster", settings.host);
    let channels = async {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let ctl = channel
            .basic_consume(
                control.as_str().into(),
                "fleetd-ctl".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consume `{control}`: {e}"))?;
        let beats_in = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let no_ack = BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        };
        let roster = beats_in
            .basic_consume(
                roster_queue.as_str().into(),
                "fleetd-roster".into(),
                no_ack,
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consume `{roster_queue}`: {e}"))?;
        let beats_out = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((ctl, roster, beats_out))
    };
    let (mut consumer, mut roster, beats_out) = match channels.await {
        Ok(parts) => parts,
        Err(reason) => return Some(reason),
    };
    let mut events = connection.events_listener();
    let mut next_beat = tokio::time::Instant::now();
    let mut foreign = Foreign::default();
    loop {
        tokio::select! {
            delivery = consumer.next() => match delivery {
                Some(Ok(delivery)) => take_in(inbound, delivery, &presence.record).await,
                Some(Err(error)) => return Some(error.to_string()),
                None => return Some("the broker cancelled the consumer".to_owned()),
            },
            beat = roster.next() => match beat {
                Some(Ok(delivery)) => observe(inbound, presence, &delivery),
                Some(Err(error)) => return Some(error.to_string()),
                None => return Some("the broker cancelled the roster consumer".to_owned()),
            },
            () = tokio::time::sleep_until(next_beat) => {
                if let Err(reason) = beat(&beats_out, settings, presence, false).await {
                    return Some(reason);
                }
                foreign.beat(uri, settings, presence, false).await;
                let interval = presence.roster.lock().map_or(Duration::from_secs(5), |r| r.next_interval());
                next_beat = tokio::time::Instant::now() + interval;
            }
            event = events.next() => match event {
                Some(Event::Error(error)) => return Some(error.to_string()),
                Some(_) => {}
                None => return Some("the connection ended".to_owned()),
            },
            _ = stop.changed() => {
                // A graceful stop tells peers at once instead of letting them wait for the reap.
                let _ = beat(&beats_out, settings, presence, true).await;
                foreign.beat(uri, settings, presence, true).await;
                return None;
            }
        }
    }
}

/// Seals and publishes this host's beat to the fleet's roster exchange.
async fn beat(
    channel: &lapin::Channel,
    settings: &LinkSettings,
    presence: &Presence,
    leaving: bool,
) -> Result<(), String> {
    let body = match presence.roster.lock() {
        Ok(mut roster) => roster.next_beat(leaving),
        Err(_) => return Err("the roster lock is poisoned".to_owned()),
    };
    if let Ok(mut last) = presence.last_beat.lock() {
        *last = Some(body.clone());
    }
    publish_beat(
        channel,
        ROSTER_EXCHANGE,
        settings,
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
    settings: &LinkSettings,
    presence: &Presence,
    dest_fleet: &str,
    body: wire::PresenceBeat,
) -> Result<(), String> {
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
    let properties = envelope::properties(&sealed, &presence.fleet).with_delivery_mode(1);
    channel
        .basic_publish(
            exchange.into(),
            format!("roster.{}", settings.host).as_str().into(),
            BasicPublishOptions::default(),
            &sealed.body,
            properties,
        )
        .await
        .map_err(|e| format!("publish beat: {e}"))?;
    Ok(())
}

/// Publish-only connections to other fleets' vhosts, opened lazily, for presence beats.
#[derive(Default)]
struct Foreign {
    open: HashMap<String, (Connection, lapin::Channel)>,
    failing: HashSet<String>,
}

impl Foreign {
    /// Sends the latest beat into each other fleet's `x.in.OWN`; a fleet that fails is retried
    /// on the next beat, and logged once per failure spell.
    async fn beat(
        &mut self,
        uri: &BrokerUri,
        settings: &LinkSettings,
        presence: &Presence,
        leaving: bool,
    ) {
        let Some(body) = presence.last_beat.lock().ok().and_then(|b| b.clone()) else {
            return;
        };
        let body = wire::PresenceBeat { leaving, ..body };
        for fleet in &settings.beat_to {
            if !self.open.contains_key(fleet) {
                match self.connect(uri, fleet).await {
                    Ok(pair) => {
                        self.open.insert(fleet.clone(), pair);
                    }
                    Err(reason) => {
                        self.failed(fleet, &reason);
                        continue;
                    }
                }
            }
            let Some((_, channel)) = self.open.get(fleet) else {
                continue;
            };
            let exchange = topology::ingress_exchange(&presence.fleet);
            match publish_beat(channel, &exchange, settings, presence, fleet, body.clone()).await {
                Ok(()) => {
                    if self.failing.remove(fleet) {
                        info!(peer.fleet = %fleet, "presence reaches fleet again");
                    }
                }
                Err(reason) => {
                    self.open.remove(fleet);
                    self.failed(fleet, &reason);
                }
            }
        }
    }

    async fn connect(
        &self,
        uri: &BrokerUri,
        fleet: &str,
    ) -> Result<(Connection, lapin::Channel), String> {
        let connection = connect(uri, Some(&format!("/{fleet}")))
            .await
            .map_err(|e| e.to_string())?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        Ok((connection, channel))
    }

    fn failed(&mut self, fleet: &str, reason: &str) {
        if self.failing.insert(fleet.to_owned()) {
            warn!(peer.fleet = %fleet, %reason, "cannot send presence to fleet; retrying every beat");
        }
    }
}

/// Checks a beat and records it in the roster, logging joins and departures.
fn observe(inbound: &Inbound, presence: &Presence, delivery: &lapin::message::Delivery) {
    match inbound.beat(
        delivery.exchange.as_str(),
        &delivery.properties,
        &delivery.data,
        now_ms(),
    ) {
        Ok((meta, beat)) => {
            let signer = HostId {
                fleet: meta.origin.fleet,
                host: meta.origin.host,
            };
            let change = match presence.roster.lock() {
                Ok(mut roster) => roster.observe(signer, beat, std::time::Instant::now()),
                Err(_) => return,
            };
            log_change(&change);
        }
        Err(refusal) => warn!(reason = %refusal, "presence beat refused"),
    }
}

/// Logs a roster change that an operator cares about.
pub fn log_change(change: &Change) {
    match change {
        Change::Joined(h) => info!(peer.fleet = %h.fleet, peer.host = %h.host, "peer joined"),
        Change::Left(h) => info!(peer.fleet = %h.fleet, peer.host = %h.host, "peer left"),
        Change::Suspected(h) => {
            warn!(peer.fleet = %h.fleet, peer.host = %h.host, "peer suspect (silent)")
        }
        Change::Reaped(h) => warn!(peer.fleet = %h.fleet, peer.host = %h.host, "peer reaped"),
        Change::Updated(_) | Change::Stale(_) => {}
    }
}

/// Checks one delivery and acknowledges it — unless it could not be recorded, in which case it
/// stays unacknowledged and is redelivered. Never rejected with `requeue=false`.
async fn take_in(inbound: &Inbound, delivery: lapin::message::Delivery, record: &Recorder) {
    let outcome = inbound.accept(
        delivery.exchange.as_str(),
        &delivery.properties,
        &delivery.data,
        now_ms(),
    );
    match &outcome {
        Ok(Accepted::New(accepted)) => {
            let (meta, _) = accepted.as_ref();
            record(
                "message.accepted",
                serde_json::json!({
                    "msg_id": meta.id.to_string(), "kind": meta.kind.as_str(),
                    "origin": {"fleet": meta.origin.fleet, "host": meta.origin.host},
                    "exchange": delivery.exchange.as_str(),
                }),
            );
            info!(msg.id = %meta.id, msg.kind = meta.kind.as_str(), origin.fleet = %meta.origin.fleet, origin.host = %meta.origin.host, "message taken in");
        }
        Ok(Accepted::Duplicate(id)) => debug!(msg.id = %id, "duplicate message dropped"),
        Err(InboundRefusal::State(error)) => {
            warn!(%error, "cannot record an inbound message; leaving it for redelivery");
            return;
        }
        Err(refusal) => {
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().chars().take(64).collect::<String>());
            record(
                "message.refused",
                serde_json::json!({
                    "msg_id": id, "reason": refusal.to_string(), "exchange": delivery.exchange.as_str(),
                    "user_id": delivery.properties.user_id().as_ref().map(|u| u.as_str().chars().take(64).collect::<String>()),
                }),
            );
            warn!(reason = %refusal, exchange = %delivery.exchange, "message refused and dropped");
        }
    }
    match delivery.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) => debug!(
            "ack not sent (channel closing); the message will be redelivered and deduplicated"
        ),
        Err(error) => warn!(%error, "ack failed; the message will be redelivered and deduplicated"),
    }
}

/// Publishes `next`, logging a change of state (not every attempt).
fn set(status: &watch::Sender<LinkStatus>, next: LinkStatus) {
    let changed = std::mem::discriminant(&*status.borrow()) != std::mem::discriminant(&next);
    if changed {
        match &next {
            LinkStatus::Up { .. } => info!("broker connected; topology declared"),
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

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
