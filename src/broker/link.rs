//! The link to the broker: fleetd rebuilds its connection itself, with jittered exponential
//! backoff and a configurable cap (lapin's own recovery retries auth errors in lockstep and fails
//! in-flight confirms). After every (re)connect the topology is declared again, idempotently. An
//! unreachable broker is a degraded state, never an exit; state changes are logged, not attempts.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, Event};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::inbound::{Accepted, Inbound, InboundRefusal};
use super::topology::{self, CTL_EXCHANGE, QueueType};
use super::{ConnectError, connect};
use crate::secret::BrokerUri;

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
}

/// Keeps a connection up until `stop` turns true; publishes its status on `status`.
pub async fn supervise(
    uri: BrokerUri,
    settings: LinkSettings,
    inbound: Arc<Inbound>,
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
                    let lost = serve(&connection, &settings, &inbound, &mut stop).await;
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
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// Consumes the control queue, taking every delivery in through `inbound`, until the
/// connection fails or the consumer is cancelled (`Some(reason)`: reconnect, re-declare,
/// re-consume) or the stop signal arrives (`None`).
async fn serve(
    connection: &Connection,
    settings: &LinkSettings,
    inbound: &Inbound,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let queue = format!("gw.{}.ctl", settings.host);
    let consumer = async {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        channel
            .basic_consume(
                queue.as_str().into(),
                "fleetd-ctl".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consume `{queue}`: {e}"))
    };
    let mut consumer = match consumer.await {
        Ok(consumer) => consumer,
        Err(reason) => return Some(reason),
    };
    let mut events = connection.events_listener();
    loop {
        tokio::select! {
            delivery = consumer.next() => match delivery {
                Some(Ok(delivery)) => take_in(inbound, delivery).await,
                Some(Err(error)) => return Some(error.to_string()),
                None => return Some("the broker cancelled the consumer".to_owned()),
            },
            event = events.next() => match event {
                Some(Event::Error(error)) => return Some(error.to_string()),
                Some(_) => {}
                None => return Some("the connection ended".to_owned()),
            },
            _ = stop.changed() => return None,
        }
    }
}

/// Checks one delivery and acknowledges it — unless it could not be recorded, in which case it
/// stays unacknowledged and is redelivered. Never rejected with `requeue=false`.
async fn take_in(inbound: &Inbound, delivery: lapin::message::Delivery) {
    let outcome = inbound.accept(
        delivery.exchange.as_str(),
        &delivery.properties,
        &delivery.data,
        now_ms(),
    );
    match &outcome {
        Ok(Accepted::New(accepted)) => {
            let (meta, _) = accepted.as_ref();
            info!(msg.id = %meta.id, msg.kind = meta.kind.as_str(), origin.fleet = %meta.origin.fleet, origin.host = %meta.origin.host, "message taken in");
        }
        Ok(Accepted::Duplicate(id)) => debug!(msg.id = %id, "duplicate message dropped"),
        Err(InboundRefusal::State(error)) => {
            warn!(%error, "cannot record an inbound message; leaving it for redelivery");
            return;
        }
        Err(refusal) => {
            warn!(reason = %refusal, exchange = %delivery.exchange, "message refused and dropped")
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
