//! This host's presence: the roster it keeps (peers' beats, suspect and reaped as they fall
//! silent) and its own entry (the local agents as they are). The broker link only carries
//! beats: it reaches the roster through [`PresenceBook`], so `broker/` knows nothing of it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::broker::deliver::Courier;
use crate::broker::link::PresenceBook;
use crate::roster::{Change, HostId, Roster};
use crate::wire::{self, Party};

/// The roster and the agents it announces, as the link reads and feeds them.
pub struct Book {
    /// The roster (short critical sections, never held across an await).
    pub roster: Arc<Mutex<Roster>>,
    /// Where this host's agents are registered.
    pub courier: Arc<Courier>,
}

impl PresenceBook for Book {
    fn listening(&self) {
        if let Ok(mut roster) = self.roster.lock() {
            roster.listening(Instant::now());
        }
    }

    fn next_beat(&self, leaving: bool) -> wire::PresenceBeat {
        // A poisoned roster (a panic inside it) still beats what it holds: no reconnect of the
        // link could heal the lock, so failing the beat would only make the link flap.
        let mut roster = self
            .roster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        roster.next_beat(leaving)
    }

    fn next_interval(&self) -> Duration {
        self.roster
            .lock()
            .map_or(Duration::from_secs(5), |r| r.next_interval())
    }

    fn observe(&self, origin: Party, beat: wire::PresenceBeat) {
        let signer = HostId {
            fleet: origin.fleet,
            host: origin.host,
        };
        let change = match self.roster.lock() {
            Ok(mut roster) => roster.observe(signer, beat, Instant::now()),
            Err(_) => return,
        };
        log_change(&change);
    }

    fn agents_changed(&self) {
        announce(&self.courier, &self.roster);
    }
}

/// Puts `courier`'s local agents into this host's roster entry (announced with the next beat).
pub fn announce(courier: &Courier, roster: &Mutex<Roster>) {
    let agents = courier
        .agents()
        .list()
        .into_iter()
        .map(|(id, agent)| wire::AgentEntry {
            id,
            status: agent.status().to_string(),
            name: agent.name,
            profile: agent.profile,
            since: agent.since_ms,
        })
        .collect();
    if let Ok(mut roster) = roster.lock() {
        roster.set_local(agents);
    }
}

/// Puts this host's agents into the roster whenever one changes (single-host mode; with a
/// broker the link does, as it announces them).
pub async fn announce_changes(
    courier: Arc<Courier>,
    roster: Arc<Mutex<Roster>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = courier.agents().changed.notified() => announce(&courier, &roster),
            _ = stop.changed() => return,
        }
    }
}

/// Ticks the roster every second: silent peers become suspect, then are reaped.
pub async fn keep_roster(roster: Arc<Mutex<Roster>>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let changes = match roster.lock() {
                    Ok(mut roster) => roster.tick(Instant::now()),
                    Err(_) => return,
                };
                for change in &changes {
                    log_change(change);
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Logs a roster change that an operator cares about.
fn log_change(change: &Change) {
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
