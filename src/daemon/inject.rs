//! Typing delivered messages into their agents' panes: each message held for a pane agent is
//! scrubbed, sanitised (by the multiplexer) and typed once, then leaves the held store with its
//! `delivered` receipt in one transaction. A pane whose agent is blocked (a startup dialog or a
//! permission prompt on screen) or whose process exited gets nothing typed: the message stays
//! held, and the block is logged and audited once.
//!
//! A crash between typing and that transaction types the message again after restart (the pane
//! is not transactional); every other path is exactly once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

use crate::broker::deliver::{Courier, Held};
use crate::broker::link::Recorder;
use crate::pane::{Multiplexer, PaneId, PaneState};
use crate::scrub::Scrubber;
use crate::spawn::dialog_line;

/// Lines of pane output checked for a blocking prompt before typing.
const CHECK_LINES: usize = 30;

/// Types held messages into pane agents until `stop` turns true.
pub async fn run(
    courier: Arc<Courier>,
    mux: Arc<dyn Multiplexer>,
    scrubber: Scrubber,
    record: Recorder,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut blocked: HashSet<Uuid> = HashSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let round = {
            let (courier, mux, scrubber, record) = (
                Arc::clone(&courier),
                Arc::clone(&mux),
                scrubber.clone(),
                Arc::clone(&record),
            );
            let mut seen = std::mem::take(&mut blocked);
            tokio::task::spawn_blocking(move || {
                inject_round(&courier, mux.as_ref(), &scrubber, &record, &mut seen);
                seen
            })
        };
        if let Ok(still) = round.await {
            blocked = still;
        }
    }
}

/// One pass over the held messages for pane agents, oldest first.
fn inject_round(
    courier: &Courier,
    mux: &dyn Multiplexer,
    scrubber: &Scrubber,
    record: &Recorder,
    blocked: &mut HashSet<Uuid>,
) {
    let Ok(held) = courier.held(100, None) else {
        return;
    };
    let mut stuck: HashSet<Uuid> = HashSet::new();
    for message in held {
        let Some(agent) = message.to else { continue };
        let Some(pane) = courier.pane_of(agent).map(PaneId) else {
            continue;
        };
        // Per agent, in order: once one message waits, the later ones wait behind it.
        if stuck.contains(&agent) {
            continue;
        }
        if let Some(reason) = block_reason(mux, &pane) {
            stuck.insert(agent);
            // The roster says why its messages wait.
            courier.set_status(agent, "blocked");
            if blocked.insert(message.id) {
                warn!(msg.id = %message.id, agent.id = %agent, %reason, "message held: its pane agent is blocked");
                record(&[(
                    "message.blocked",
                    json!({"msg_id": message.id.to_string(), "agent": agent.to_string(), "reason": reason}),
                )]);
            }
            continue;
        }
        let text = scrubber.scrub(&typed(&message));
        if let Err(error) = mux.send_text(&pane, &text) {
            stuck.insert(agent);
            warn!(msg.id = %message.id, %error, "cannot type a message into its pane; retrying");
            continue;
        }
        blocked.remove(&message.id);
        courier.set_status(agent, "ready");
        match courier.injected(message.id) {
            Ok(_) => {
                info!(msg.id = %message.id, agent.id = %agent, "message typed into its pane");
                record(&[(
                    "message.injected",
                    json!({"msg_id": message.id.to_string(), "agent": agent.to_string(),
                           "origin": {"fleet": message.origin.fleet, "host": message.origin.host}}),
                )]);
            }
            Err(error) => {
                warn!(msg.id = %message.id, %error, "typed, but not recorded as delivered")
            }
        }
    }
}

/// Why nothing may be typed into `pane` now, if anything.
fn block_reason(mux: &dyn Multiplexer, pane: &PaneId) -> Option<String> {
    match mux.state(pane) {
        Ok(PaneState::Running) => {}
        Ok(PaneState::Exited(status)) => return Some(format!("its process exited ({status})")),
        Err(error) => return Some(error.to_string()),
    }
    if mux.blocked(pane) == Some(true) {
        return Some("the multiplexer reports the agent blocked".to_owned());
    }
    let shown = mux.read(pane, CHECK_LINES).ok()?;
    dialog_line(&shown).map(|line| format!("a prompt waits for an answer: {line}"))
}

/// The line typed for a held message: who it is from, then its text.
fn typed(message: &Held) -> String {
    let text = message
        .body
        .get("text")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let from = message
        .body
        .get("from")
        .and_then(serde_json::Value::as_str)
        .map_or(String::new(), |id| format!(" agent {id}"));
    format!(
        "[fleetd: from {}/{}{from}] {text}",
        message.origin.fleet, message.origin.host
    )
}
