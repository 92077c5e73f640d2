//! The gateway behind the local API: the routing fork over the roster, carried out by the
//! broker's courier (local hold, or the outbox and the broker).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agent::{Owner, Registration, RegistryError};
use crate::api::{ENV_AGENT_ID, ENV_AGENT_TOKEN, ENV_SOCKET};
use crate::broker::deliver::{Courier, CourierError};
use crate::broker::link::Recorder;
use crate::daemon::policy::PolicyHandle;
use crate::pane::{PaneError, PaneId, PaneState};
use crate::policy::{Request, SecretRef};
use crate::roster::Roster;
use crate::route::{self, Route, Router, RouterError, SpawnAsk};
use crate::secret::{SecretName, lookup};
use crate::spawn::{Outcome, Spawner};
use crate::wire::{MAX_TEXT, Party};
use crate::wire::{SpawnOutcome, SpawnReply, SpawnRequest};
use secrecy::SecretString;

/// The gateway of one host.
pub struct Gateway {
    /// Delivery.
    pub courier: Arc<Courier>,
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
}

impl Router for Gateway {
    fn open_agent(&self, name: &str) -> Result<Uuid, RouterError> {
        let id = self
            .courier
            .agents()
            .open_mailbox(name)
            .map_err(registry_error)?;
        crate::broker::link::announce(&self.courier, &self.roster);
        Ok(id)
    }

    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<Value, RouterError> {
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
            None => self.courier.placed_at(to).map(|p| crate::roster::HostId {
                fleet: p.fleet,
                host: p.host,
            }),
        };
        let (id, route) = match route::decide(local, located, &me.fleet) {
            Route::Local => (self.courier.send_local(to, from, text), "local"),
            Route::Fleet { host } => {
                let dest = Party {
                    fleet: me.fleet,
                    host: host.unwrap_or_default(),
                };
                (self.courier.send(dest, to, from, text), "fleet")
            }
            Route::Foreign(host) => {
                let dest = Party {
                    fleet: host.fleet,
                    host: host.host,
                };
                (self.courier.send(dest, to, from, text), "foreign")
            }
        };
        let id = id.map_err(|error| match error {
            CourierError::NoBroker => RouterError::NoBroker {
                what: format!("agent {to} is not on this host"),
            },
            other => courier_error(other),
        })?;
        Ok(json!({"id": id.to_string(), "route": route}))
    }

    fn held(&self, limit: usize, to: Option<Uuid>) -> Result<Value, RouterError> {
        let held = self
            .courier
            .held(limit, to)
            .map_err(|e| RouterError::Failed(e.to_string()))?;
        Ok(json!(held))
    }

    fn ack(&self, id: Uuid, only_for: Option<Uuid>) -> Result<bool, RouterError> {
        self.courier.ack(id, only_for).map_err(courier_error)
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
        (self.record)(vec![(
            "api.refused",
            json!({"agent": agent.map(|a| a.to_string()), "uid": uid, "op": op, "reason": reason}),
        )]);
    }

    fn spawn(&self, ask: &SpawnAsk, by: Option<Uuid>) -> Result<Value, RouterError> {
        let owner = match by {
            Some(agent) => self.may_spawn(agent, &ask.profile)?,
            None => Owner::Operator,
        };
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
            _ => {
                let request = local_request(&me, ask)?;
                let (reply, name) = self.run_spawn(&request, None, owner)?;
                let mut answer = serde_json::to_value(&reply).unwrap_or(Value::Null);
                if let Some(object) = answer.as_object_mut() {
                    object.remove("v");
                    object.remove("request");
                    if let Some(name) = name {
                        object.insert("name".to_owned(), json!(name));
                    }
                }
                Ok(answer)
            }
        }
    }

    fn delivery(&self, id: Uuid, sent_by: Option<Uuid>) -> Result<Option<Value>, RouterError> {
        let tracked = self
            .courier
            .delivery(id)
            .map_err(|e| RouterError::Failed(e.to_string()))?
            .filter(|t| sent_by.is_none() || t.from == sent_by);
        Ok(tracked.map(|t| json!(t)))
    }
}

impl Gateway {
    /// Revokes agent `id`'s token when its process exited or its pane is gone (audited as
    /// `agent.revoked`, the agent `down` in the roster); returns why, or `None` while it runs.
    pub fn retire_if_gone(
        &self,
        id: Uuid,
        agent: &crate::agent::LocalAgent,
    ) -> Result<Option<String>, RouterError> {
        let gone = match (&self.spawner, &agent.pane) {
            (Some(spawner), Some(pane)) => match spawner.mux().state(&PaneId(pane.clone())) {
                Ok(PaneState::Running) => None,
                Ok(PaneState::Exited(status)) => {
                    Some(format!("its process exited with status {status}"))
                }
                Err(PaneError::NoPane(_)) => Some("its pane is gone".to_owned()),
                Err(error) => {
                    return Err(RouterError::Failed(format!(
                        "cannot check agent {id}'s pane: {error}"
                    )));
                }
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
            crate::broker::link::announce(&self.courier, &self.roster);
        }
        Ok(gone)
    }

    /// Revokes the token of every pane agent that is gone (one sweep).
    fn sweep_agents(&self) {
        for (id, agent) in self.courier.agents().list() {
            if agent.token.is_some()
                && let Err(error) = self.retire_if_gone(id, &agent)
            {
                tracing::debug!(agent.id = %id, %error, "cannot check an agent's pane");
            }
        }
    }

    /// Whether local agent `agent` may request `profile` with its token: its own profile's
    /// `may_spawn` must name it. A refusal is audited (`spawn.refused`, nothing launched).
    fn may_spawn(&self, agent: Uuid, profile: &str) -> Result<Owner, RouterError> {
        let own = self
            .courier
            .agents()
            .agent(agent)
            .map(|a| a.profile)
            .unwrap_or_default();
        let policy = self.policy.current();
        let allowed = policy
            .profiles
            .get(&own)
            .is_some_and(|p| p.may_spawn.iter().any(|m| m == profile));
        if allowed {
            return Ok(Owner::Agent { id: agent });
        }
        let reason = format!(
            "agent {agent}'s profile `{own}` may not spawn `{profile}` (its `may_spawn` does not name it)"
        );
        (self.record)(vec![(
            "spawn.refused",
            json!({"requested_by": agent.to_string(), "profile": profile, "reasons": [reason]}),
        )]);
        Err(RouterError::Refused(reason))
    }

    /// Runs the spawn pipeline for `request` (its origin already authenticated) on behalf of
    /// `owner`, registers and announces a started agent, and audits the outcome. Returns the
    /// reply and, when started, the agent's name. `message` is the spawn request's message id,
    /// when it came over the broker.
    ///
    /// A label another agent holds is refused before anything is launched (and checked again
    /// when the agent is registered: a launch that lost the name meanwhile is closed); without
    /// a label the agent is named `PROFILE-N` (N from its pane), made unique.
    pub fn run_spawn(
        &self,
        request: &Request,
        message: Option<Uuid>,
        owner: Owner,
    ) -> Result<(SpawnReply, Option<String>), RouterError> {
        let Some(spawner) = &self.spawner else {
            return Err(RouterError::Failed(
                "no multiplexer: herdr was not reachable when fleetd started (see its log)"
                    .to_owned(),
            ));
        };
        let owner_text = owner.to_string();
        let policy = self.policy.current();
        let resolve = |reference: &SecretRef| {
            let value = match reference {
                SecretRef::Env(var) => self.env_secrets.get(var).cloned().ok_or_else(|| {
                    format!(
                        "`env:{var}` is not a secret this daemon read at start (declare it in \
                         fleetd.toml: [secrets.NAME] env = \"{var}\")"
                    )
                })?,
                other => secret_value(other)?,
            };
            // From now on no log line, audit record or reply can carry it.
            let _ = self.scrubber.register(&reference.to_string(), &value);
            Ok(value)
        };
        let agents = self.courier.agents();
        // The agent's identity exists before its pane: its id and token go into the pane's
        // environment, and are registered once it passed its gate.
        let identity = agents
            .reserve(request.label.as_deref(), &owner)
            .map_err(|error| error.to_string())
            .and_then(|id| {
                let (token, hash) = crate::agent::token::mint()
                    .map_err(|e| format!("cannot mint the agent's token: {e}"))?;
                // No log line, audit record, reply or typed text can carry it from now on.
                let _ = self.scrubber.register(ENV_AGENT_TOKEN, &token);
                Ok((id, token, hash))
            });
        let outcome = match &identity {
            Ok((id, token, _)) => {
                let id_text = SecretString::from(id.to_string());
                let socket = SecretString::from(self.socket.display().to_string());
                spawner.spawn(
                    &policy,
                    request,
                    &resolve,
                    &[
                        (ENV_AGENT_ID, &id_text),
                        (ENV_SOCKET, &socket),
                        (ENV_AGENT_TOKEN, token),
                    ],
                )
            }
            Err(reason) => Outcome::Refused {
                rules: Vec::new(),
                reasons: vec![reason.clone()],
            },
        };
        let outcome = match outcome {
            Outcome::Started {
                pane,
                profile,
                rules,
            } => {
                let name = request.label.clone().unwrap_or_else(|| {
                    agents.free_name(&format!("{profile}-{}", pane.0.trim_start_matches('%')))
                });
                let registered =
                    identity
                        .map_err(RegistryError::Refused)
                        .and_then(|(id, _, hash)| {
                            agents.register(Registration {
                                id,
                                name: name.clone(),
                                profile: profile.clone(),
                                pane: pane.0.clone(),
                                owner: owner.clone(),
                                token: Some(hash),
                            })
                        });
                match registered {
                    Ok(id) => Registered::Started { id, name, rules },
                    Err(error) => {
                        // Another spawn took the name while this one waited for its gate.
                        let _ = spawner.mux().close(&pane);
                        Registered::Refused {
                            rules,
                            reasons: vec![error.to_string()],
                        }
                    }
                }
            }
            Outcome::Refused { rules, reasons } => Registered::Refused { rules, reasons },
            Outcome::Failed { reason } => Registered::Failed { reason },
        };
        let mut reply = SpawnReply {
            v: crate::wire::VERSION,
            request: message.unwrap_or_default(),
            outcome: SpawnOutcome::Failed,
            agent: None,
            reasons: Vec::new(),
        };
        let mut name = None;
        let mut rules_decided = Vec::new();
        let event = match outcome {
            Registered::Started {
                id,
                name: agent_name,
                rules,
            } => {
                crate::broker::link::announce(&self.courier, &self.roster);
                reply.outcome = SpawnOutcome::Started;
                reply.agent = Some(id);
                name = Some(agent_name);
                rules_decided = rules;
                "spawn.started"
            }
            Registered::Refused { rules, reasons } => {
                reply.outcome = SpawnOutcome::Refused;
                reply.reasons = reasons;
                rules_decided = rules;
                "spawn.refused"
            }
            Registered::Failed { reason } => {
                reply.reasons = vec![reason];
                "spawn.failed"
            }
        };
        (self.record)(vec![(
            event,
            json!({
                "request": message.map(|m| m.to_string()),
                "origin": {"fleet": request.origin.fleet, "host": request.origin.host},
                "requested_by": owner_text,
                "profile": request.profile,
                "env": request.env.keys().collect::<Vec<_>>(),
                "outcome": reply.outcome,
                "agent": reply.agent.map(|a| a.to_string()),
                "rules": rules_decided,
                "reasons": reply.reasons,
            }),
        )]);
        Ok((reply, name))
    }

    /// Asks gateway `host` (of `fleet`, or the fleet the roster places it in) to spawn, and waits
    /// for its reply (up to the API's spawn limit).
    fn spawn_remote(
        &self,
        host: &str,
        fleet: Option<String>,
        ask: &SpawnAsk,
    ) -> Result<Value, RouterError> {
        let fleet = match fleet {
            Some(fleet) => fleet,
            None => {
                let rows = self.roster.lock().map(|r| r.view()).unwrap_or_default();
                let mut fleets: Vec<String> = rows
                    .into_iter()
                    .filter(|r| r.host == host)
                    .map(|r| r.fleet)
                    .collect();
                fleets.dedup();
                match fleets.as_slice() {
                    [one] => one.clone(),
                    [] => {
                        return Err(RouterError::Invalid(format!(
                            "host `{host}` is not in the roster (give `--fleet`)"
                        )));
                    }
                    _ => {
                        return Err(RouterError::Invalid(format!(
                            "host `{host}` is in several fleets: give `--fleet`"
                        )));
                    }
                }
            }
        };
        let request = SpawnRequest {
            v: crate::wire::VERSION,
            profile: ask.profile.clone(),
            env: ask.env.clone(),
            cwd: ask.cwd.clone(),
            label: ask.label.clone(),
        };
        let id = self
            .courier
            .request_spawn(
                Party {
                    fleet: fleet.clone(),
                    host: host.to_owned(),
                },
                request,
            )
            .map_err(courier_error)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(290);
        loop {
            if let Some((_, reply)) = self.courier.take_spawn_reply(id).map_err(courier_error)? {
                return Ok(json!({
                    "outcome": reply.outcome,
                    "agent": reply.agent.map(|a| a.to_string()),
                    "reasons": reply.reasons,
                    "host": host,
                    "fleet": fleet,
                    "request": id.to_string(),
                }));
            }
            if std::time::Instant::now() > deadline {
                return Err(RouterError::Failed(format!(
                    "no reply from `{host}` to spawn request {id}; it may still answer (`fleetd inbox pull`)"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Runs every spawn request from another host waiting in the held store, and replies.
    fn serve_spawn_requests(&self) {
        let Ok(waiting) = self.courier.spawn_requests() else {
            return;
        };
        for (held, body) in waiting {
            let request = checked_request(&held.origin, &body);
            let reply = match request {
                Ok(request) => match self.run_spawn(
                    &request,
                    Some(held.id),
                    Owner::Peer {
                        fleet: held.origin.fleet.clone(),
                        host: held.origin.host.clone(),
                    },
                ) {
                    Ok((reply, _)) => reply,
                    Err(reason) => failed_reply(held.id, reason.to_string()),
                },
                Err(error) => {
                    let reply = SpawnReply {
                        v: crate::wire::VERSION,
                        request: held.id,
                        outcome: SpawnOutcome::Refused,
                        agent: None,
                        reasons: vec![error.to_string()],
                    };
                    (self.record)(vec![(
                        "spawn.refused",
                        json!({"request": held.id.to_string(), "origin": {"fleet": held.origin.fleet, "host": held.origin.host}, "reasons": reply.reasons}),
                    )]);
                    reply
                }
            };
            if let Err(error) = self.courier.answer_spawn(&held, &reply) {
                tracing::warn!(%error, "cannot queue a spawn reply; the request stays held");
            }
        }
    }
}

/// The policy request for spawn request `body` from `origin`, checked as any request is (names,
/// values, cwd); the origin is the authenticated one, never a field of the body.
pub fn checked_request(
    origin: &Party,
    body: &SpawnRequest,
) -> Result<Request, crate::policy::RequestError> {
    let mut fields = serde_json::Map::new();
    fields.insert(
        "origin".to_owned(),
        json!({"fleet": origin.fleet, "host": origin.host}),
    );
    fields.insert("profile".to_owned(), json!(body.profile));
    fields.insert("env".to_owned(), json!(body.env));
    if let Some(cwd) = &body.cwd {
        fields.insert("cwd".to_owned(), json!(cwd));
    }
    if let Some(label) = &body.label {
        fields.insert("label".to_owned(), json!(label));
    }
    Request::from_value(&Value::Object(fields))
}

/// The policy request for a spawn asked on this host: its origin is this host.
fn local_request(me: &Party, ask: &SpawnAsk) -> Result<Request, RouterError> {
    let mut fields = serde_json::Map::new();
    fields.insert(
        "origin".to_owned(),
        json!({"fleet": me.fleet, "host": me.host}),
    );
    fields.insert("profile".to_owned(), json!(ask.profile));
    fields.insert("env".to_owned(), json!(ask.env));
    if let Some(cwd) = &ask.cwd {
        fields.insert("cwd".to_owned(), json!(cwd));
    }
    if let Some(label) = &ask.label {
        fields.insert("label".to_owned(), json!(label));
    }
    Request::from_value(&Value::Object(fields)).map_err(|e| RouterError::Invalid(e.to_string()))
}

fn courier_error(error: CourierError) -> RouterError {
    match error {
        CourierError::Invalid(reason) => RouterError::Invalid(reason),
        CourierError::NoBroker => RouterError::NoBroker {
            what: "this needs another host".to_owned(),
        },
        CourierError::State(error) => RouterError::Failed(error.to_string()),
    }
}

fn registry_error(error: RegistryError) -> RouterError {
    match error {
        RegistryError::State(error) => RouterError::Failed(error.to_string()),
        other => RouterError::Invalid(other.to_string()),
    }
}

/// A spawn's outcome once a started agent is registered under its name.
enum Registered {
    Started {
        id: Uuid,
        name: String,
        rules: Vec<crate::policy::RuleId>,
    },
    Refused {
        rules: Vec<crate::policy::RuleId>,
        reasons: Vec<String>,
    },
    Failed {
        reason: String,
    },
}

fn failed_reply(request: Uuid, reason: String) -> SpawnReply {
    SpawnReply {
        v: crate::wire::VERSION,
        request,
        outcome: SpawnOutcome::Failed,
        agent: None,
        reasons: vec![reason],
    }
}

/// Serves spawn requests from other hosts until `stop` turns true (one at a time: each waits
/// for its readiness gate).
pub async fn serve_spawns(gateway: Arc<Gateway>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let gateway = Arc::clone(&gateway);
        let _ = tokio::task::spawn_blocking(move || gateway.serve_spawn_requests()).await;
    }
}

/// Every two seconds, revokes the tokens of pane agents whose process exited or whose pane is
/// gone, until `stop` turns true (a token presented meanwhile is checked on the spot).
pub async fn sweep_agents(gateway: Arc<Gateway>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let gateway = Arc::clone(&gateway);
        let _ = tokio::task::spawn_blocking(move || gateway.sweep_agents()).await;
    }
}

/// A profile's secret reference resolved on this host.
fn secret_value(reference: &SecretRef) -> Result<SecretString, String> {
    let (keyring, name) = match reference {
        SecretRef::Credential(name) => (false, name),
        SecretRef::Keyring(name) => (true, name),
        SecretRef::Env(var) => {
            return Err(format!(
                "`env:{var}` is resolved from the daemon's start-up secrets"
            ));
        }
    };
    let name = SecretName::new(name).map_err(|e| e.to_string())?;
    lookup(keyring, &name)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("`{reference}` is not on this host"))
}
