//! The federated roster: this host's agents plus the union of peers' latest presence beats, as
//! soft state. A peer is `suspect` after a silence, reaped after a longer one, and gone at once
//! when it says `leaving`. A host may only announce itself: beats are keyed by their verified
//! signer, which the caller passes in; nothing in a beat's body names its host.
//!
//! Pure and clock-driven (the caller passes `now`), owned by one task. Imports: `wire` (the beat
//! body types). Never `broker`, `route` or `api`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::wire::{AgentEntry, PresenceBeat, VERSION};

/// Timing of the roster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RosterSettings {
    /// Mean interval between this host's beats (each drawn ±20 %).
    pub beat: Duration,
    /// Silence after which a peer is suspect.
    pub suspect_after: Duration,
    /// Silence after which a peer is removed.
    pub reap_after: Duration,
}

impl Default for RosterSettings {
    fn default() -> Self {
        RosterSettings {
            beat: Duration::from_secs(5),
            suspect_after: Duration::from_secs(15),
            reap_after: Duration::from_secs(30),
        }
    }
}

/// A peer host, identified by (fleet, host) of the key that signed its beats.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId {
    /// Fleet.
    pub fleet: String,
    /// Host.
    pub host: String,
}

/// How a peer looks from here.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PeerState {
    /// Beating.
    Alive,
    /// Silent for longer than `suspect_after`.
    Suspect,
}

impl PeerState {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Alive => "alive",
            PeerState::Suspect => "suspect",
        }
    }
}

/// What a beat changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new host (or a new boot of one).
    Joined(HostId),
    /// A known host's beat, possibly with other agents.
    Updated(HostId),
    /// An older or repeated beat of the current boot: ignored.
    Stale(HostId),
    /// The host said it is leaving.
    Left(HostId),
    /// Silent too long: now suspect.
    Suspected(HostId),
    /// Silent longer still: removed.
    Reaped(HostId),
}

#[derive(Clone, Debug)]
struct Peer {
    boot: Uuid,
    seq: u64,
    agents: Vec<AgentEntry>,
    last_seen: Instant,
    state: PeerState,
}

/// One row of the union view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    /// Fleet.
    pub fleet: String,
    /// Host.
    pub host: String,
    /// `alive`, `suspect` (peers) — this host is always alive.
    pub state: PeerState,
    /// Its agents as last announced.
    pub agents: Vec<AgentEntry>,
}

/// The roster of one gateway.
#[derive(Debug)]
pub struct Roster {
    me: HostId,
    boot: Uuid,
    seq: u64,
    local: Vec<AgentEntry>,
    peers: HashMap<HostId, Peer>,
    settings: RosterSettings,
    /// When this roster was made (the daemon's start).
    born: Instant,
    /// When the link first consumed beats (see [`Roster::first_round_left`]).
    listening_since: Option<Instant>,
}

/// How long after its start a roster waits for the link to begin listening before it stops
/// counting on a first round of beats.
const LINK_GRACE: Duration = Duration::from_secs(10);

impl Roster {
    /// An empty roster for this host; a new boot id per process start.
    pub fn new(me: HostId, settings: RosterSettings) -> Roster {
        Roster {
            me,
            boot: Uuid::now_v7(),
            seq: 0,
            local: Vec::new(),
            peers: HashMap::new(),
            settings,
            born: Instant::now(),
            listening_since: None,
        }
    }

    /// The link consumes beats from now on (the first call counts).
    pub fn listening(&mut self, now: Instant) {
        self.listening_since.get_or_insert(now);
    }

    /// How much longer the first round of beats may still bring hosts this roster has not heard
    /// of: after listening for the longest beat interval (the mean +25 %) every live host has
    /// beaten once. While the link has not begun listening (the daemon just started), a little
    /// longer each time, up to [`LINK_GRACE`] after the start. `None`: the roster is as complete
    /// as it gets — an agent it does not list is not there.
    pub fn first_round_left(&self, now: Instant) -> Option<Duration> {
        let round = self.settings.beat.saturating_mul(5) / 4;
        match self.listening_since {
            Some(since) => (since + round)
                .checked_duration_since(now)
                .filter(|left| !left.is_zero()),
            None => (now.saturating_duration_since(self.born) < LINK_GRACE)
                .then_some(Duration::from_millis(50)),
        }
    }

    /// Replaces this host's agents (announced with the next beat).
    pub fn set_local(&mut self, agents: Vec<AgentEntry>) {
        self.local = agents;
    }

    /// The next beat to send (sequence increases every call).
    pub fn next_beat(&mut self, leaving: bool) -> PresenceBeat {
        self.seq += 1;
        PresenceBeat {
            v: VERSION,
            boot: self.boot,
            seq: self.seq,
            leaving,
            agents: self.local.clone(),
        }
    }

    /// Records a verified beat signed by `signer`.
    pub fn observe(&mut self, signer: HostId, beat: PresenceBeat, now: Instant) -> Change {
        if signer == self.me {
            return Change::Stale(signer);
        }
        if beat.leaving {
            self.peers.remove(&signer);
            return Change::Left(signer);
        }
        match self.peers.get_mut(&signer) {
            Some(peer) if peer.boot == beat.boot && beat.seq <= peer.seq => Change::Stale(signer),
            Some(peer) if peer.boot == beat.boot => {
                peer.seq = beat.seq;
                peer.agents = beat.agents;
                peer.last_seen = now;
                peer.state = PeerState::Alive;
                Change::Updated(signer)
            }
            _ => {
                let peer = Peer {
                    boot: beat.boot,
                    seq: beat.seq,
                    agents: beat.agents,
                    last_seen: now,
                    state: PeerState::Alive,
                };
                self.peers.insert(signer.clone(), peer);
                Change::Joined(signer)
            }
        }
    }

    /// Marks silent peers suspect and removes those silent past `reap_after`.
    pub fn tick(&mut self, now: Instant) -> Vec<Change> {
        let mut changes = Vec::new();
        let (suspect, reap) = (self.settings.suspect_after, self.settings.reap_after);
        self.peers.retain(|id, peer| {
            let silent = now.saturating_duration_since(peer.last_seen);
            if silent >= reap {
                changes.push(Change::Reaped(id.clone()));
                return false;
            }
            if silent >= suspect && peer.state == PeerState::Alive {
                peer.state = PeerState::Suspect;
                changes.push(Change::Suspected(id.clone()));
            }
            true
        });
        changes
    }

    /// The union view: this host first, then peers by fleet and host.
    pub fn view(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .peers
            .iter()
            .map(|(id, peer)| Row {
                fleet: id.fleet.clone(),
                host: id.host.clone(),
                state: peer.state,
                agents: peer.agents.clone(),
            })
            .collect();
        rows.sort_by(|a, b| (&a.fleet, &a.host).cmp(&(&b.fleet, &b.host)));
        rows.insert(
            0,
            Row {
                fleet: self.me.fleet.clone(),
                host: self.me.host.clone(),
                state: PeerState::Alive,
                agents: self.local.clone(),
            },
        );
        rows
    }

    /// The host running agent `id`, if the roster knows it.
    pub fn locate(&self, id: Uuid) -> Option<HostId> {
        if self.local.iter().any(|a| a.id == id) {
            return Some(self.me.clone());
        }
        self.peers
            .iter()
            .find(|(_, p)| p.agents.iter().any(|a| a.id == id))
            .map(|(h, _)| h.clone())
    }

    /// How long to wait before the next beat: the interval ±20 %, drawn from the OS source.
    pub fn next_interval(&self) -> Duration {
        let mut byte = [0u8; 1];
        let draw = if getrandom::fill(&mut byte).is_ok() {
            f64::from(u8::from_le_bytes(byte)) / 255.0
        } else {
            0.5
        };
        self.settings.beat.mul_f64(0.8 + 0.4 * draw)
    }
}

#[cfg(test)]
mod tests;
