//! The gateway behind the local API: the routing fork over the roster, carried out by the
//! broker's courier (local hold, or the outbox and the broker); agent tokens checked against
//! their panes (and swept). Spawning is `spawning.rs`.

use std::sync::{Arc, Mutex};

use serde_json::json;
use uuid::Uuid;

use crate::agent::{Owner, Process, RegistryError};
use crate::broker::deliver::{Courier, CourierError};
use crate::broker::link::Recorder;
use crate::daemon::policy::PolicyHandle;
use crate::mailbox::{Held, LocalSend, Mailbox, MailboxError};
use crate::pane::process::{Liveness, Watched};
use crate::pane::{Multiplexer, PaneError, PaneId, PaneState};
use crate::roster::Roster;
use crate::route::reply::{Routed, Sent, Spawned, Unblocked};
use crate::route::{self, Route, Router, RouterError, SpawnAsk};
use crate::spawn::Spawner;
use crate::state::StateError;
use crate::wire::Tracked;
use crate::wire::{MAX_TEXT, Party};
use secrecy::SecretString;

/// The gateway of one host.
pub struct Gateway {
    /// Delivery to and from other hosts.
    pub courier: Arc<Courier>,
    /// This host's mailbox: local sends, held messages, delivery records.
    pub mailbox: Arc<Mailbox>,
    /// Where agents are.
    pub roster: Arc<Mutex<Roster>>,
    /// The spawn pipeline (`None`: the configured multiplexer is not supported yet).
    pub spawner: Option<Arc<Spawner>>,
    /// The policy in force.
    pub policy: PolicyHandle,
    /// Where decisions are recorded.
    pub record: Recorder,
    /// Every output path's redactor: secrets resolved for panes are registered with it.
    pub scrubber: crate::scrub::Scrubber,
    /// The local API socket (agents are told where it is).
    pub socket: std::path::PathBuf,
    /// Secrets this daemon read from its environment at start (variable name → value), for
    /// profiles' `env:NAME` references.
    pub env_secrets: std::collections::BTreeMap<String, SecretString>,
    /// The kernel's watch on each pane agent's process.
    pub processes: Arc<Processes>,
    /// Why the multiplexer failed the last sweep's call, while it does.
    pub failing: Mutex<Option<String>>,
    /// Refused API requests, counted per kind and interval for the audit log.
    pub refusals: super::refusals::Refusals,
}

/// The kernel's watch on each pane agent's process: a pid descriptor opened at launch or, after
/// a restart, again from the registry's record. A token is bound to its agent's process, not to
/// what the multiplexer — the agents' own server — says of its pane.
#[derive(Debug, Default)]
pub struct Processes(Mutex<std::collections::HashMap<Uuid, Watched>>);

impl Processes {
    /// Watches agent `id`'s process from now on (a relaunched lead's replaces its old one).
    pub fn watch(&self, id: Uuid, process: Watched) {
        if let Ok(mut watched) = self.0.lock() {
            watched.insert(id, process);
        }
    }

    /// Whether agent `id`'s process is still `process`, the one launched for it.
    pub fn check(&self, id: Uuid, process: &Process) -> Liveness {
        let Ok(mut watched) = self.0.lock() else {
            return Liveness::Running;
        };
        let current = watched.get(&id).filter(|w| w.pid() == process.pid);
        let liveness = match current {
            Some(w) => w.check(),
            None => match Watched::reopen(
                process.pid,
                process.start,
                process.comm.clone(),
                process
                    .program_pid
                    .zip(process.program_start)
                    .map(|(pid, start)| crate::pane::process::Program { pid, start }),
            ) {
                Ok(Some(w)) => {
                    let liveness = w.check();
                    watched.insert(id, w);
                    liveness
                }
                Ok(None) => Liveness::Ended,
                Err(error) => {
                    tracing::warn!(agent.id = %id, %error, "cannot watch an agent's process; its token holds");
                    Liveness::Running
                }
            },
        };
        if liveness != Liveness::Running {
            watched.remove(&id);
        }
        liveness
    }
}

impl Router for Gateway {
    fn open_agent(&self, name: &str) -> Result<Uuid, RouterError> {
        let id = self
            .courier
            .agents()
            .open_mailbox(name)
            .map_err(registry_error)?;
        super::presence::announce(&self.courier, &self.roster);
        Ok(id)
    }

    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<Sent, RouterError> {
        if text.len() > MAX_TEXT {
            return Err(RouterError::Invalid(format!(
                "message text longer than {MAX_TEXT} bytes"
            )));
        }
        // An agent may paste anything (a `git remote -v`, an env dump): what this host knows
        // or recognises as a secret never reaches the state store, the broker or another host.
        let text = self.scrubber.scrub(&text);
        let me = self.courier.me();
        let local = self.courier.agents().contains(to);
        // The roster first; else where the agent was last placed (see `Courier::placed_at`).
        let located = match self.roster.lock().ok().and_then(|r| r.locate(to)) {
            Some(host) => {
                let party = Party {
                    fleet: host.fleet.clone(),
                    host: host.host.clone(),
                };
                self.courier.remember_placement(to, &party);
                Some(host)
            }
            None => self
                .courier
                .placed_at(to)
                .map(|p| crate::roster::HostId {
                    fleet: p.fleet,
                    host: p.host,
                })
                .or_else(|| {
                    (!local && self.courier.has_broker())
                        .then(|| self.first_round(to))
                        .flatten()
                }),
        };
        let (id, route) = match route::decide(local, located, &me.fleet) {
            Route::Local => {
                let sent = self.mailbox.send(LocalSend {
                    to,
                    from,
                    text,
                    typed_later: self.courier.agents().pane_of(to).is_some(),
                });
                (sent.map_err(local_error), Routed::Local)
            }
            Route::Fleet { host } => {
                let dest = Party {
                    fleet: me.fleet,
                    host: host.unwrap_or_default(),
                };
                (
                    self.courier
                        .send(dest, to, from, text)
                        .map_err(not_here(to)),
                    Routed::Fleet,
                )
            }
            Route::Foreign(host) => {
                let dest = Party {
                    fleet: host.fleet,
                    host: host.host,
                };
                (
                    self.courier
                        .send(dest, to, from, text)
                        .map_err(not_here(to)),
                    Routed::Foreign,
                )
            }
        };
        Ok(Sent { id: id?, route })
    }

    fn held(
        &self,
        limit: usize,
        to: Option<Uuid>,
        wait: std::time::Duration,
    ) -> Result<Vec<Held>, RouterError> {
        let deadline = std::time::Instant::now() + wait;
        let arrivals = self.mailbox.arrivals();
        let shelf = to.map(crate::mailbox::Shelf::Agent);
        loop {
            // Taken before the look: an arrival between the look and the wait still wakes it.
            let ticket = arrivals.ticket();
            let held = self.mailbox.held(limit, to).map_err(state_error)?;
            let waited = match shelf {
                Some(shelf) if held.is_empty() => arrivals.wait(shelf, &ticket, deadline),
                _ => false,
            };
            if !waited {
                return Ok(held);
            }
        }
    }

    fn ack(&self, id: Uuid, only_for: Option<Uuid>) -> Result<bool, RouterError> {
        self.mailbox.ack(id, only_for).map_err(state_error)
    }

    fn authenticate(&self, token: &SecretString) -> Result<Uuid, RouterError> {
        let agents = self.courier.agents();
        let (id, agent) = agents
            .authenticate(token)
            .map_err(|e| RouterError::Refused(e.to_string()))?;
        // A token dies with its agent: its pane is asked now, not at the next sweep.
        if let Some(why) = self.retire_if_gone(id, &agent)? {
            return Err(RouterError::Refused(format!(
                "the agent token of {id} was revoked: {why}"
            )));
        }
        Ok(id)
    }

    fn refused(&self, agent: Option<Uuid>, uid: u32, op: &str, reason: &str) {
        let now = std::time::Instant::now();
        let records = self.refusals.refused(agent, uid, op, reason, now);
        if !records.is_empty() {
            (self.record)(records);
        }
    }

    fn spawn(&self, ask: &SpawnAsk, by: Option<Uuid>) -> Result<Spawned, RouterError> {
        let owner = match by {
            Some(agent) => self.may_spawn(agent, &ask.profile)?,
            None => Owner::Operator,
        };
        if let Some(agent) = ask
            .for_agent
            .filter(|a| !self.courier.agents().contains(*a))
        {
            return Err(RouterError::Invalid(format!(
                "`for`: no local agent {agent} (the new agent answers to an agent of this host)"
            )));
        }
        let me = self.courier.me();
        match &ask.host {
            Some(host)
                if *host != me.host || ask.fleet.as_ref().is_some_and(|f| *f != me.fleet) =>
            {
                if !self.courier.has_broker() {
                    return Err(RouterError::NoBroker {
                        what: format!("`{host}` is another host"),
                    });
                }
                self.spawn_remote(host, ask.fleet.clone(), ask)
            }
            _ => self.spawn_here(ask, owner),
        }
    }

    fn unblock(&self, id: Uuid) -> Result<Unblocked, RouterError> {
        let line = self.courier.agents().unblock(id).map_err(registry_error)?;
        // The line is pane content: in the reply to the operator, not in the audit log.
        (self.record)(vec![(
            "agent.unblocked",
            json!({"agent": id.to_string(), "by": "the operator"}),
        )]);
        tracing::info!(agent.id = %id, "the operator cleared an agent's prompt");
        super::presence::announce(&self.courier, &self.roster);
        Ok(Unblocked {
            agent: id,
            dismissed: line,
        })
    }

    fn refresh_local(&self) {
        super::presence::announce(&self.courier, &self.roster);
    }

    fn notes(&self) -> Vec<(Uuid, String)> {
        self.courier
            .agents()
            .list()
            .into_iter()
            .filter_map(|(id, agent)| agent.why.map(|why| (id, why)))
            .collect()
    }

    fn delivery(&self, id: Uuid, sent_by: Option<Uuid>) -> Result<Option<Tracked>, RouterError> {
        Ok(self
            .mailbox
            .delivery(id)
            .map_err(state_error)?
            .filter(|t| sent_by.is_none() || t.from == sent_by))
    }
}

/// The longest a send waits for the first round of beats to place its target.
const FIRST_ROUND_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Gateway {
    /// Records the refusal counts of the intervals that ended (of all, with `all`: at stop).
    pub fn record_refusals(&self, all: bool) {
        let records = self.refusals.ended(std::time::Instant::now(), all);
        if !records.is_empty() {
            (self.record)(records);
        }
    }

    /// Where agent `to` is, once the roster has heard the first round of beats: an agent no
    /// beat has listed yet is waited for (until the link has listened one longest beat interval,
    /// at most [`FIRST_ROUND_WAIT`]) rather than failed as "no such agent" — that answer is
    /// final only when the roster is complete and the agent is not in it.
    fn first_round(&self, to: Uuid) -> Option<crate::roster::HostId> {
        // Well inside a client's wait for a reply (5 s, `api::call`): a send answered after its
        // client gave up would be sent again.
        let until = std::time::Instant::now() + FIRST_ROUND_WAIT;
        loop {
            let (found, left) = {
                let roster = self.roster.lock().ok()?;
                (
                    roster.locate(to),
                    roster.first_round_left(std::time::Instant::now()),
                )
            };
            if found.is_some() {
                return found;
            }
            let left = left?.min(until.checked_duration_since(std::time::Instant::now())?);
            std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
        }
    }

    /// Revokes agent `id`'s token when its process exited or its pane is gone (audited as
    /// `agent.revoked`, the agent `down` in the roster); returns why, or `None` while it runs.
    pub fn retire_if_gone(
        &self,
        id: Uuid,
        agent: &crate::agent::LocalAgent,
    ) -> Result<Option<String>, RouterError> {
        let gone = match (&self.spawner, &agent.pane) {
            (Some(spawner), Some(pane)) => agent_gone(
                spawner.mux().as_ref(),
                &self.processes,
                id,
                agent,
                &PaneId(pane.clone()),
            )
            .map_err(|error| {
                RouterError::Failed(format!("cannot check agent {id}'s pane: {error}"))
            })?,
            (None, Some(_)) => match &agent.process {
                Some(process) => self.processes.check(id, process).why_gone(process.pid),
                None => None,
            },
            _ => Some("it has no pane".to_owned()),
        };
        if let (Some(why), Some(hash)) = (&gone, agent.token) {
            self.courier
                .agents()
                .revoke(id, hash, why)
                .map_err(registry_error)?;
            (self.record)(vec![(
                "agent.revoked",
                json!({"agent": id.to_string(), "reason": why}),
            )]);
            super::presence::announce(&self.courier, &self.roster);
        }
        Ok(gone)
    }

    /// Revokes the token of every pane agent that is gone (one sweep; the daemon runs one every
    /// two seconds, and a token presented meanwhile is checked on the spot).
    pub(super) fn sweep_agents(&self) {
        self.check_multiplexer();
        for (id, agent) in self.courier.agents().list() {
            if agent.token.is_some()
                && let Err(error) = self.retire_if_gone(id, &agent)
            {
                tracing::warn!(agent.id = %id, %error, "cannot check an agent's pane; its token holds until it can be");
            }
        }
    }
}

impl Gateway {
    /// Asks the multiplexer once (a change between answering and failing is logged and audited,
    /// `multiplexer.failing` / `multiplexer.recovered`), then logs and audits
    /// (`multiplexer.refused`) what its server asked of fleetd and was refused since the last
    /// sweep: opening a path, running a command. A real server asks neither of fleetd's client
    /// unless someone set a hook or stands in for it.
    fn check_multiplexer(&self) {
        let Some(spawner) = &self.spawner else {
            return;
        };
        // The server is asked once per sweep; a change between answering and failing is
        // logged and audited once (a hook can make every call fail: fleetd goes on, the kernel
        // decides about agents' tokens, and the sweep asks again in 2 s).
        let failure = spawner.mux().list().err().map(|error| error.to_string());
        if let Ok(mut failing) = self.failing.lock()
            && *failing != failure
        {
            // Recorded first: once the log says it, the audit log holds it.
            match &failure {
                Some(reason) => {
                    (self.record)(vec![("multiplexer.failing", json!({ "reason": reason }))]);
                    tracing::warn!(%reason, "the multiplexer does not answer; retrying every sweep");
                }
                None => {
                    (self.record)(vec![("multiplexer.recovered", json!({}))]);
                    tracing::info!("the multiplexer answers again");
                }
            }
            *failing = failure;
        }
        let alarms = spawner.mux().alarms();
        if !alarms.is_empty() {
            (self.record)(
                alarms
                    .iter()
                    .map(|alarm| ("multiplexer.refused", json!({ "request": alarm })))
                    .collect(),
            );
        }
        for alarm in &alarms {
            tracing::warn!(%alarm, "the multiplexer's server asked fleetd for something it never does: refused");
        }
    }
}

/// Why pane agent `id` is gone, or `None` while it runs as launched.
///
/// For an agent whose process fleetd watches, the kernel decides first: the process ended, or
/// executed another program. Then the multiplexer — the agents' own server — may add what only
/// it knows: the pane now runs another process (respawned), or its agent exited under a shell
/// that still runs (herdr's agents). A pane the server no longer lists, or no answer at all,
/// never makes a live process gone: a failing or fake server revokes nothing.
pub(super) fn agent_gone(
    mux: &dyn Multiplexer,
    processes: &Processes,
    id: Uuid,
    agent: &crate::agent::LocalAgent,
    pane: &PaneId,
) -> Result<Option<String>, PaneError> {
    let Some(process) = &agent.process else {
        return why_gone(mux, pane);
    };
    let liveness = processes.check(id, process);
    if liveness == Liveness::Ended {
        // The kernel says it ended; the pane may know how (a detail, not the decision).
        return Ok(Some(match mux.state(pane) {
            Ok(PaneState::Exited(code)) if code >= 0 => format!(
                "its process (pid {}) exited with status {code}",
                process.pid
            ),
            _ => format!("its process (pid {}) ended", process.pid),
        }));
    }
    if let Some(why) = liveness.why_gone(process.pid) {
        return Ok(Some(why));
    }
    match mux.pid(pane) {
        Ok(Some(now)) if now != process.pid => {
            return Ok(Some(format!(
                "its pane now runs pid {now}, not the agent's pid {} (respawned)",
                process.pid
            )));
        }
        Ok(_) | Err(_) => {}
    }
    match mux.state(pane) {
        Ok(PaneState::Exited(status)) => {
            Ok(Some(format!("its process exited with status {status}")))
        }
        _ => Ok(None),
    }
}

/// Why the agent in `pane` is gone — its process exited, or its pane vanished — or `None` while
/// it runs; an error when the multiplexer cannot say (an agent fleetd has no process for).
pub fn why_gone(mux: &dyn Multiplexer, pane: &PaneId) -> Result<Option<String>, PaneError> {
    match mux.state(pane) {
        Ok(PaneState::Running) => Ok(None),
        Ok(PaneState::Exited(status)) => {
            Ok(Some(format!("its process exited with status {status}")))
        }
        Err(PaneError::NoPane(_)) => Ok(Some("its pane is gone".to_owned())),
        Err(error) => Err(error),
    }
}

/// A send to agent `to`, not on this host, that could not be queued.
fn not_here(to: Uuid) -> impl FnOnce(CourierError) -> RouterError {
    move |error| match error {
        CourierError::NoBroker => RouterError::NoBroker {
            what: format!("agent {to} is not on this host"),
        },
        other => courier_error(other),
    }
}

/// A local send that could not be held.
fn local_error(error: MailboxError) -> RouterError {
    RouterError::Failed(error.to_string())
}

/// The mailbox could not read or take what was asked.
pub(super) fn state_error(error: StateError) -> RouterError {
    RouterError::Failed(error.to_string())
}

pub(super) fn courier_error(error: CourierError) -> RouterError {
    match error {
        CourierError::Invalid(reason) => RouterError::Invalid(reason),
        CourierError::NoBroker => RouterError::NoBroker {
            what: "this needs another host".to_owned(),
        },
        CourierError::State(error) => state_error(error),
    }
}

pub(super) fn registry_error(error: RegistryError) -> RouterError {
    match error {
        RegistryError::State(_) | RegistryError::Encode(_) => {
            RouterError::Failed(error.to_string())
        }
        other => RouterError::Invalid(other.to_string()),
    }
}
