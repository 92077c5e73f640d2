//! Typing delivered messages into their agents' panes: each message held for a pane agent is
//! scrubbed, sanitised (by the multiplexer) and typed once, then leaves the held store with its
//! `delivered` receipt in one transaction. A pane whose agent is blocked (a startup dialog or a
//! permission prompt on screen) or whose process exited gets nothing typed: the message stays
//! held, and the block is logged and audited once.
//!
//! The pane is not transactional: a crash between typing and that transaction would leave a
//! typed message held. Every typed line carries its message id (`msg M`), so the first time
//! the injector serves an agent after a start — or after a failed record — it looks for the
//! marker of the agent's oldest held message in the pane's history and, if it is there, records
//! the message as delivered instead of typing it again. Exactly once, with the pane as witness.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

use crate::agent::Status;
use crate::broker::deliver::{Courier, Held};
use crate::broker::link::Recorder;
use crate::pane::{Multiplexer, PaneId, PaneState};
use crate::scrub::Scrubber;
use crate::spawn::dialog_line;

/// Lines of pane output checked for a blocking prompt before typing.
const CHECK_LINES: usize = 30;

/// Lines of pane history searched for an already-typed message after a start.
const HISTORY_LINES: usize = 5000;

/// Lines of typed text remembered per agent, so that their echo on screen is never taken for
/// the agent asking something.
const TYPED_LINES: usize = 200;

/// What every typed message line starts with.
const TYPED_PREFIX: &str = "[fleetd: from ";

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
    // Agents whose pane history was searched since this start (see the module comment).
    let mut checked: HashSet<Uuid> = HashSet::new();
    let mut typed: HashMap<Uuid, VecDeque<String>> = HashMap::new();
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
            let mut known = std::mem::take(&mut checked);
            let mut lines = std::mem::take(&mut typed);
            tokio::task::spawn_blocking(move || {
                let mut marks = Marks {
                    blocked: &mut seen,
                    checked: &mut known,
                    typed: &mut lines,
                };
                inject_round(&courier, mux.as_ref(), &scrubber, &record, &mut marks);
                (seen, known, lines)
            })
        };
        if let Ok((still, known, lines)) = round.await {
            blocked = still;
            checked = known;
            typed = lines;
        }
    }
}

/// What the injector remembers between rounds.
struct Marks<'a> {
    /// Messages whose block was already logged and audited.
    blocked: &'a mut HashSet<Uuid>,
    /// Agents whose pane history was searched for an already-typed message.
    checked: &'a mut HashSet<Uuid>,
    /// Per agent, the last lines typed into its pane (see [`asked`]).
    typed: &'a mut HashMap<Uuid, VecDeque<String>>,
}

/// One pass over the held messages for pane agents, oldest first.
fn inject_round(
    courier: &Courier,
    mux: &dyn Multiplexer,
    scrubber: &Scrubber,
    record: &Recorder,
    marks: &mut Marks<'_>,
) {
    let Ok(held) = courier.held(100, None) else {
        return;
    };
    let blocked = &mut *marks.blocked;
    let mut stuck: HashSet<Uuid> = HashSet::new();
    // Checked once per agent per round: the pane does not change between its messages.
    let mut clear: HashSet<Uuid> = HashSet::new();
    for message in held {
        let Some(agent) = message.to else { continue };
        let Some(pane) = courier.agents().pane_of(agent).map(PaneId) else {
            continue;
        };
        // Per agent, in order: once one message waits, the later ones wait behind it.
        if stuck.contains(&agent) {
            continue;
        }
        let reason = if clear.contains(&agent) {
            None
        } else {
            let typed = marks.typed.get(&agent).cloned().unwrap_or_default();
            block_reason(mux, &pane, &typed)
        };
        if let Some((status, reason)) = reason {
            stuck.insert(agent);
            // The roster says why its messages wait: an agent whose process ended is down (as
            // the token sweep says too), one that waits for an answer is blocked.
            courier.agents().set_status(agent, status);
            if blocked.insert(message.id) {
                warn!(msg.id = %message.id, agent.id = %agent, %reason, "message held: its pane agent is blocked");
                record(vec![(
                    "message.blocked",
                    json!({"msg_id": message.id.to_string(), "agent": agent.to_string(), "reason": reason}),
                )]);
            }
            continue;
        }
        clear.insert(agent);
        let already = marks.checked.insert(agent) && typed_before(mux, &pane, message.id);
        if already {
            info!(msg.id = %message.id, agent.id = %agent, "message found already typed (before a restart): not typed again");
        } else {
            let text = scrubber.scrub(&typed(&message));
            if let Err(error) = mux.send_text(&pane, &text) {
                stuck.insert(agent);
                warn!(msg.id = %message.id, %error, "cannot type a message into its pane; retrying");
                continue;
            }
            let lines = marks.typed.entry(agent).or_default();
            lines.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
            while lines.len() > TYPED_LINES {
                lines.pop_front();
            }
        }
        blocked.remove(&message.id);
        courier.agents().set_status(agent, Status::Ready);
        match courier.injected(message.id) {
            Ok(_) => {
                info!(msg.id = %message.id, agent.id = %agent, "message typed into its pane");
                record(vec![(
                    "message.injected",
                    json!({"msg_id": message.id.to_string(), "agent": agent.to_string(),
                           "origin": {"fleet": message.origin.fleet, "host": message.origin.host}}),
                )]);
            }
            Err(error) => {
                // Next time, the pane is asked before this message is typed again.
                marks.checked.remove(&agent);
                stuck.insert(agent);
                warn!(msg.id = %message.id, %error, "typed, but not recorded as delivered")
            }
        }
    }
}

/// Whether the pane's history shows message `id` typed already.
fn typed_before(mux: &dyn Multiplexer, pane: &PaneId, id: Uuid) -> bool {
    mux.read(pane, HISTORY_LINES)
        .is_ok_and(|history| history.contains(&marker(id)))
}

/// The part of a typed line that names its message.
fn marker(id: Uuid) -> String {
    format!("msg {id}]")
}

/// Why nothing may be typed into `pane` now, if anything. `typed`: the lines fleetd typed there
/// lately, whose echo does not count as the agent asking.
fn block_reason(
    mux: &dyn Multiplexer,
    pane: &PaneId,
    typed: &VecDeque<String>,
) -> Option<(Status, String)> {
    match mux.state(pane) {
        Ok(PaneState::Running) => {}
        Ok(PaneState::Exited(status)) => {
            return Some((Status::Down, format!("its process exited ({status})")));
        }
        Err(error) => return Some((Status::Blocked, error.to_string())),
    }
    if mux.blocked(pane) == Some(true) {
        return Some((
            Status::Blocked,
            "the multiplexer reports the agent blocked".to_owned(),
        ));
    }
    let shown = mux.read(pane, CHECK_LINES).ok()?;
    asked(&shown, typed).map(|line| {
        (
            Status::Blocked,
            format!("a prompt waits for an answer: {line}"),
        )
    })
}

/// The first line on screen where the agent asks for an answer — not fleetd's own typing: a
/// line starting a typed message is skipped, and the echo of any line typed lately is taken
/// out first when it is most of its screen line (a short prompt before it) or long enough not
/// to be a phrase the agent prints itself. A sender cannot block an agent by typing `(y/n)`;
/// an agent asking `Proceed? (y/n)` is still seen when someone typed `(y/n)`.
fn asked(shown: &str, typed: &VecDeque<String>) -> Option<String> {
    shown.lines().find_map(|line| {
        if line.contains(TYPED_PREFIX) {
            return None;
        }
        let mut rest = line.to_owned();
        for echo in typed {
            if let Some(at) = rest.find(echo.as_str()) {
                let without = format!("{}{}", &rest[..at], &rest[at + echo.len()..]);
                if echo.chars().count() >= 8 || without.trim().chars().count() <= 4 {
                    rest = without;
                }
            }
        }
        dialog_line(&rest)
    })
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
        "[fleetd: from {}/{}{from}, {} {text}",
        message.origin.fleet,
        message.origin.host,
        marker(message.id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(lines: &[&str]) -> VecDeque<String> {
        lines.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn typed_text_is_never_taken_for_the_agent_asking() {
        let none = VecDeque::new();
        // The first line of a typed message carries fleetd's prefix.
        let screen = "> [fleetd: from mac/laptop, msg 0190] continue? (y/n)\n";
        assert_eq!(asked(screen, &none), None);
        // A continuation line, or a short typed line behind a prompt.
        let lines = typed(&["second line: Press Enter to continue", "(y/n)"]);
        let screen = "  second line: Press Enter to continue\n> (y/n)\n";
        assert_eq!(asked(screen, &lines), None);
    }

    #[test]
    fn the_agent_asking_is_still_seen() {
        let none = VecDeque::new();
        assert_eq!(
            asked("Do you trust the files in this folder?\n", &none).as_deref(),
            Some("Do you trust the files in this folder?")
        );
        // Someone typed `(y/n)` before; the agent's own question ends the same way.
        let lines = typed(&["(y/n)"]);
        assert_eq!(
            asked("Proceed with the edit? (y/n)\n", &lines).as_deref(),
            Some("Proceed with the edit? (y/n)")
        );
    }
}
