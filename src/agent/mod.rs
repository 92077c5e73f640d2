//! The local agents of this host: each one's global id, name, pane, typed status and who
//! created it. The registry is their one owner: the API, the spawn path, the injector, the lead
//! supervisor and the broker's courier ask it; records are kept in the state store so ids
//! survive a restart.
//!
//! Identity rules (docs/threat-model.md, "Agents and fleetd"): a global id is minted when an
//! agent is registered and never moves to another agent; a name is unique on the host, and a
//! name held by one agent is never handed to another, whoever asks. The one re-pointing is the
//! lead supervisor relaunching a lead it registered itself (the lead keeps its id in its new
//! pane).
//!
//! Imports: `state` (the durable records). Never the broker, panes or the API.

pub mod token;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::state::{StateError, StateStore};
pub use token::{TokenError, TokenHash};

/// Longest agent name.
pub const MAX_NAME: usize = 64;
/// Revoked tokens remembered for their reason (beyond that, they are just unknown).
const MAX_REVOKED: usize = 4096;

/// What the roster says about a local agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Its messages are held for pulling (the primary).
    Mailbox,
    /// Its pane agent passed its readiness gate and takes messages.
    Ready,
    /// Its pane agent waits for an answer; messages wait behind it.
    Blocked,
    /// Its process ended (a lead, until the supervisor restores it).
    Down,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Mailbox => "mailbox",
            Status::Ready => "ready",
            Status::Blocked => "blocked",
            Status::Down => "down",
        })
    }
}

/// Who registered an agent, and so who may change it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "by")]
pub enum Owner {
    /// The operator, through the local API (`agent open`, a local spawn). Records written before
    /// owners were kept are the operator's: the most careful reading.
    Operator,
    /// The lead supervisor (`[[lead]]` in fleetd.toml).
    Lead,
    /// A local agent, with its capability token (its profile's `may_spawn`).
    Agent {
        /// The requesting agent.
        id: Uuid,
    },
    /// A spawn request from this gateway `host` of `fleet` (authenticated over the broker).
    Peer {
        /// Its fleet.
        fleet: String,
        /// Its host.
        host: String,
        /// The agent there that asked; `None`: that host's operator.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<Uuid>,
    },
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Operator => f.write_str("the operator"),
            Owner::Lead => f.write_str("the lead supervisor"),
            Owner::Agent { id } => write!(f, "agent {id}"),
            Owner::Peer {
                fleet,
                host,
                agent: Some(agent),
            } => write!(f, "agent {agent} of `{fleet}/{host}`"),
            Owner::Peer { fleet, host, .. } => write!(f, "`{fleet}/{host}`"),
        }
    }
}

/// One local agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalAgent {
    /// Its name on this host (unique here).
    pub name: String,
    /// What it runs (`mailbox` for the primary).
    pub profile: String,
    /// Registered at, Unix milliseconds.
    pub since_ms: i64,
    /// Its pane on this host's multiplexer, if it runs in one (host-local, never announced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pane: Option<String>,
    /// What the roster says, once something said it (see [`LocalAgent::status`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Who registered it.
    #[serde(default = "operator")]
    pub owner: Owner,
    /// The hash of its capability token, while it has one (a pane agent that runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<TokenHash>,
    /// The process fleetd launched for it, as the kernel showed it (a pane agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
    /// The grant that admitted its spawn (a pane agent): after a restart its instance counts
    /// against that grant's `max_concurrent` again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// Why it is `blocked` or `down`, for this host's operator (never announced, not stored).
    #[serde(skip)]
    pub why: Option<String>,
    /// The screen line it is blocked on, when a prompt blocks it (not stored).
    #[serde(skip)]
    pub prompt: Option<String>,
    /// A prompt line the operator said is not the agent's to answer: not a block while it
    /// stays on screen (not stored).
    #[serde(skip)]
    pub dismissed: Option<String>,
}

/// A pane agent's process: what its token is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its process id.
    pub pid: u32,
    /// Its start time in clock ticks after boot, when fleetd could see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    /// Its name (`comm`) when it became ready, when fleetd could see it: under fleetd's pane
    /// init, the agent's own process's (`program_pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Under fleetd's pane init, the agent's own process (the init's first child), when fleetd
    /// could see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_pid: Option<u32>,
    /// That process's start time in clock ticks after boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_start: Option<u64>,
}

/// A pane agent to register once it passed its readiness gate.
#[derive(Clone, Debug)]
pub struct Registration {
    /// Its global id, from [`Registry::reserve`].
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Its profile.
    pub profile: String,
    /// Its pane.
    pub pane: String,
    /// Who asked for it.
    pub owner: Owner,
    /// The hash of the token its pane was given.
    pub token: Option<TokenHash>,
    /// Its process, when the multiplexer named one.
    pub process: Option<Process>,
    /// The grant that admitted its spawn.
    pub grant: Option<String>,
}

fn operator() -> Owner {
    Owner::Operator
}

impl LocalAgent {
    /// Its roster status: the last one set, else `ready` for a pane agent (registered only once
    /// past its readiness gate) and `mailbox` for the rest.
    pub fn status(&self) -> Status {
        self.status.unwrap_or(if self.pane.is_some() {
            Status::Ready
        } else {
            Status::Mailbox
        })
    }
}

/// Why an agent could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The name is not 1–64 of `[A-Za-z0-9._-]`.
    #[error("an agent name is 1-{MAX_NAME} of [A-Za-z0-9._-]")]
    BadName,
    /// Another agent holds the name.
    #[error("the name `{name}` is held by agent {id} on this host (registered by {owner})")]
    NameHeld {
        /// The name.
        name: String,
        /// The agent holding it.
        id: Uuid,
        /// Who registered that agent.
        owner: Owner,
    },
    /// The id is another agent's (a reservation that collided).
    #[error("agent id {0} is taken")]
    IdTaken(Uuid),
    /// No local agent has the id.
    #[error("no local agent {0}")]
    Unknown(Uuid),
    /// The agent waits on no prompt (nothing to clear).
    #[error("agent {0} is not blocked by a prompt")]
    NotBlocked(Uuid),
    /// The record could not be encoded.
    #[error("cannot encode the agent record")]
    Encode(#[source] serde_json::Error),
    /// The record could not be stored.
    #[error(transparent)]
    State(#[from] StateError),
}

/// The local agents of this host.
pub struct Registry {
    state: Arc<StateStore>,
    agents: RwLock<BTreeMap<Uuid, LocalAgent>>,
    /// Tokens revoked since start (hash → agent, why), to say why a refused token is refused.
    revoked: std::sync::Mutex<HashMap<TokenHash, (Uuid, String)>>,
    /// Woken when an agent was added or its roster entry changed (its inbox must be declared
    /// and consumed; the roster re-announced).
    pub changed: Notify,
}

impl Registry {
    /// The registry kept in `state`, with the agents registered before.
    pub fn load(state: Arc<StateStore>) -> Result<Registry, StateError> {
        let mut agents = BTreeMap::new();
        for (id, bytes) in state.agents_list()? {
            if let Ok(agent) = serde_json::from_slice::<LocalAgent>(&bytes) {
                agents.insert(id, agent);
            }
        }
        Ok(Registry {
            state,
            agents: RwLock::new(agents),
            revoked: std::sync::Mutex::new(HashMap::new()),
            changed: Notify::new(),
        })
    }

    /// The operator's mailbox named `name`: the agent already holding the name (its id is the
    /// operator's to know), or a new mailbox with a new global id.
    pub fn open_mailbox(&self, name: &str) -> Result<Uuid, RegistryError> {
        valid_name(name)?;
        let mut agents = self.write();
        if let Some((id, _)) = holder(&agents, name) {
            return Ok(id);
        }
        let id = Uuid::now_v7();
        let agent = LocalAgent {
            name: name.to_owned(),
            profile: "mailbox".to_owned(),
            since_ms: now_ms(),
            pane: None,
            status: None,
            owner: Owner::Operator,
            token: None,
            process: None,
            grant: None,
            why: None,
            prompt: None,
            dismissed: None,
        };
        self.store(&mut agents, id, agent)?;
        Ok(id)
    }

    /// `base`, or `base-2`, `base-3` … : the first name no agent holds. `base` is made a name
    /// first: a character a name may not hold becomes `-` (herdr's pane `w1:p2` → `w1-p2`), and
    /// it is cut to leave room for the count.
    pub fn free_name(&self, base: &str) -> String {
        let mut base: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(MAX_NAME - 8)
            .collect();
        if base.is_empty() {
            base.push_str("agent");
        }
        let agents = self.read();
        let taken = |name: &str| agents.values().any(|a| a.name == name);
        let mut name = base.clone();
        let mut n = 1u32;
        while taken(&name) {
            n = n.saturating_add(1);
            name = format!("{base}-{n}");
        }
        name
    }

    /// The global id a launch for `owner` named `label` (if it has one) will register under:
    /// a new one, or — for the lead supervisor relaunching its own lead — the lead's. A label
    /// another agent holds is refused. Nothing is stored: [`Registry::register`] checks again.
    pub fn reserve(&self, label: Option<&str>, owner: &Owner) -> Result<Uuid, RegistryError> {
        let Some(name) = label else {
            return Ok(Uuid::now_v7());
        };
        valid_name(name)?;
        match holder(&self.read(), name) {
            Some((id, held)) if relaunch(held, owner) => Ok(id),
            Some((id, held)) => Err(held_error(id, held)),
            None => Ok(Uuid::now_v7()),
        }
    }

    /// Registers a pane agent that passed its readiness gate. Its name must be free, or be the
    /// lead's own name under the lead's own id; a name another agent took meanwhile is refused.
    pub fn register(&self, agent: Registration) -> Result<Uuid, RegistryError> {
        valid_name(&agent.name)?;
        let mut agents = self.write();
        let since_ms = match holder(&agents, &agent.name) {
            Some((id, held)) if id == agent.id && relaunch(held, &agent.owner) => held.since_ms,
            Some((id, held)) => return Err(held_error(id, held)),
            None if agents.contains_key(&agent.id) => return Err(RegistryError::IdTaken(agent.id)),
            None => now_ms(),
        };
        let id = agent.id;
        let record = LocalAgent {
            name: agent.name,
            profile: agent.profile,
            since_ms,
            pane: Some(agent.pane),
            status: None,
            owner: agent.owner,
            token: agent.token,
            process: agent.process,
            grant: agent.grant,
            why: None,
            prompt: None,
            dismissed: None,
        };
        self.store(&mut agents, id, record)?;
        Ok(id)
    }

    /// The agent whose token `presented` is, while the token holds.
    pub fn authenticate(
        &self,
        presented: &secrecy::SecretString,
    ) -> Result<(Uuid, LocalAgent), TokenError> {
        let hash = token::hash_of(presented)?;
        if let Some((id, agent)) = self.read().iter().find(|(_, a)| a.token == Some(hash)) {
            return Ok((*id, agent.clone()));
        }
        let revoked = self
            .revoked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match revoked.get(&hash) {
            Some((agent, why)) => Err(TokenError::Revoked {
                agent: *agent,
                why: why.clone(),
            }),
            None => Err(TokenError::Unknown),
        }
    }

    /// Ends agent `id`'s token `hash` (its process ended, its pane closed): later requests with
    /// it are refused with `why`; the agent is `down` in the roster. A token the agent no longer
    /// holds (a relaunched lead has a new one) is left alone.
    pub fn revoke(&self, id: Uuid, hash: TokenHash, why: &str) -> Result<(), RegistryError> {
        let mut agents = self.write();
        let Some(mut agent) = agents.get(&id).cloned() else {
            return Ok(());
        };
        if agent.token != Some(hash) {
            return Ok(());
        }
        agent.token = None;
        agent.status = Some(Status::Down);
        agent.why = Some(why.to_owned());
        agent.prompt = None;
        self.store(&mut agents, id, agent)?;
        let mut revoked = self
            .revoked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if revoked.len() >= MAX_REVOKED {
            revoked.clear();
        }
        revoked.insert(hash, (id, why.to_owned()));
        Ok(())
    }

    /// Every local agent, in id order.
    pub fn list(&self) -> Vec<(Uuid, LocalAgent)> {
        self.read().iter().map(|(id, a)| (*id, a.clone())).collect()
    }

    /// Local agent `id`.
    pub fn agent(&self, id: Uuid) -> Option<LocalAgent> {
        self.read().get(&id).cloned()
    }

    /// Whether `id` is a local agent.
    pub fn contains(&self, id: Uuid) -> bool {
        self.read().contains_key(&id)
    }

    /// The local agent named `name`.
    pub fn named(&self, name: &str) -> Option<(Uuid, LocalAgent)> {
        holder(&self.read(), name).map(|(id, a)| (id, a.clone()))
    }

    /// The pane of local agent `id`, if it runs in one.
    pub fn pane_of(&self, id: Uuid) -> Option<String> {
        self.read().get(&id).and_then(|a| a.pane.clone())
    }

    /// Sets what the roster says about agent `id` and why (announced with the next beat, the
    /// reason to this host's operator only; not stored: a restarted daemon learns it again). A
    /// prompt blocking it is set with [`Registry::set_prompt`].
    pub fn set_status(&self, id: Uuid, status: Status, why: Option<String>) {
        let changed = self.write().get_mut(&id).is_some_and(|agent| {
            let changed = agent.status != Some(status) || agent.why != why;
            agent.status = Some(status);
            agent.why = why;
            if status != Status::Blocked {
                agent.prompt = None;
            }
            changed
        });
        if changed {
            self.changed.notify_one();
        }
    }

    /// Agent `id` waits on `line`, a prompt on its screen.
    pub fn set_prompt(&self, id: Uuid, line: &str) {
        if let Some(agent) = self.write().get_mut(&id) {
            agent.prompt = Some(line.to_owned());
        }
    }

    /// The operator says agent `id`'s prompt is not the agent's to answer (a sibling wrote it on
    /// its terminal): that line no longer blocks it while it stays on screen, and the agent is
    /// `ready` again. Returns the line.
    pub fn unblock(&self, id: Uuid) -> Result<String, RegistryError> {
        let line = {
            let mut agents = self.write();
            let agent = agents.get_mut(&id).ok_or(RegistryError::Unknown(id))?;
            let line = agent.prompt.take().ok_or(RegistryError::NotBlocked(id))?;
            agent.dismissed = Some(line.clone());
            agent.status = Some(Status::Ready);
            agent.why = None;
            line
        };
        self.changed.notify_one();
        Ok(line)
    }

    /// Forgets a dismissed prompt line once it left the screen (a later prompt with the same
    /// words blocks again).
    pub fn forget_dismissed(&self, id: Uuid) {
        if let Some(agent) = self.write().get_mut(&id) {
            agent.dismissed = None;
        }
    }

    fn store(
        &self,
        agents: &mut BTreeMap<Uuid, LocalAgent>,
        id: Uuid,
        agent: LocalAgent,
    ) -> Result<(), RegistryError> {
        let bytes = serde_json::to_vec(&agent).map_err(RegistryError::Encode)?;
        self.state.agent_put(id, &bytes)?;
        agents.insert(id, agent);
        self.changed.notify_one();
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Uuid, LocalAgent>> {
        // A panic while holding the lock cannot leave a half-written map: every write is one
        // insert or one field.
        self.agents
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Uuid, LocalAgent>> {
        self.agents
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The agent holding `name`, if one does.
fn holder<'a>(
    agents: &'a BTreeMap<Uuid, LocalAgent>,
    name: &str,
) -> Option<(Uuid, &'a LocalAgent)> {
    agents
        .iter()
        .find(|(_, a)| a.name == name)
        .map(|(id, a)| (*id, a))
}

/// Whether `owner` registering a pane agent under the name `held` has is the lead supervisor
/// relaunching its own lead.
fn relaunch(held: &LocalAgent, owner: &Owner) -> bool {
    *owner == Owner::Lead && held.owner == Owner::Lead
}

fn held_error(id: Uuid, held: &LocalAgent) -> RegistryError {
    RegistryError::NameHeld {
        name: held.name.clone(),
        id,
        owner: held.owner.clone(),
    }
}

fn valid_name(name: &str) -> Result<(), RegistryError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(RegistryError::BadName)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
