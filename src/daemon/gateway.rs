//! The gateway behind the local API: the routing fork over the roster, carried out by the
//! broker's courier (local hold, or the outbox and the broker).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agent::Owner;
use crate::broker::deliver::Courier;
use crate::broker::link::Recorder;
use crate::daemon::policy::PolicyHandle;
use crate::policy::{Request, SecretRef};
use crate::roster::Roster;
use crate::route::{self, Route, Router};
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
    /// Secrets this daemon read from its environment at start (variable name → value), for
    /// profiles' `env:NAME` references.
    pub env_secrets: std::collections::BTreeMap<String, SecretString>,
}

impl Router for Gateway {
    fn open_agent(&self, name: &str) -> Result<Uuid, String> {
        let id = self
            .courier
            .agents()
            .open_mailbox(name)
            .map_err(|e| e.to_string())?;
        crate::broker::link::announce(&self.courier, &self.roster);
        Ok(id)
    }

    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<Value, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("message text longer than {MAX_TEXT} bytes"));
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
        let id = id.map_err(|e| e.to_string())?;
        Ok(json!({"id": id.to_string(), "route": route}))
    }

    fn held(&self, limit: usize, to: Option<Uuid>) -> Result<Value, String> {
        let held = self.courier.held(limit, to).map_err(|e| e.to_string())?;
        Ok(json!(held))
    }

    fn ack(&self, id: Uuid) -> Result<bool, String> {
        self.courier.ack(id).map_err(|e| e.to_string())
    }

    fn spawn(&self, request: &Value) -> Result<Value, String> {
        let me = self.courier.me();
        let mut fields = request.as_object().cloned().unwrap_or_default();
        let host = fields
            .remove("host")
            .and_then(|h| h.as_str().map(str::to_owned));
        let fleet = fields
            .remove("fleet")
            .and_then(|f| f.as_str().map(str::to_owned));
        match host {
            Some(host) if host != me.host || fleet.as_ref().is_some_and(|f| *f != me.fleet) => {
                self.spawn_remote(&host, fleet, &Value::Object(fields))
            }
            _ => {
                fields.insert(
                    "origin".to_owned(),
                    json!({"fleet": me.fleet, "host": me.host}),
                );
                let request =
                    Request::from_value(&Value::Object(fields)).map_err(|e| e.to_string())?;
                let (reply, name) = self.run_spawn(&request, None, Owner::Operator)?;
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

    fn delivery(&self, id: Uuid) -> Result<Option<Value>, String> {
        let tracked = self.courier.delivery(id).map_err(|e| e.to_string())?;
        Ok(tracked.map(|t| json!(t)))
    }
}

impl Gateway {
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
    ) -> Result<(SpawnReply, Option<String>), String> {
        let Some(spawner) = &self.spawner else {
            return Err(
                "no multiplexer: herdr was not reachable when fleetd started (see its log)"
                    .to_owned(),
            );
        };
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
        let outcome = match &request.label {
            Some(label) => match agents.may_take(label, &owner) {
                Ok(()) => spawner.spawn(&policy, request, &resolve),
                Err(error) => Outcome::Refused {
                    rules: Vec::new(),
                    reasons: vec![error.to_string()],
                },
            },
            None => spawner.spawn(&policy, request, &resolve),
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
                match agents.register(&name, &profile, &pane.0, owner.clone()) {
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
        fields: &Value,
    ) -> Result<Value, String> {
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
                        return Err(format!(
                            "host `{host}` is not in the roster (give `--fleet`)"
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "host `{host}` is in several fleets: give `--fleet`"
                        ));
                    }
                }
            }
        };
        let request: SpawnRequest = serde_json::from_value(json!({
            "v": crate::wire::VERSION,
            "profile": fields.get("profile").cloned().unwrap_or(Value::Null),
            "env": fields.get("env").cloned().unwrap_or_else(|| json!({})),
            "cwd": fields.get("cwd").cloned(),
            "label": fields.get("label").cloned(),
        }))
        .map_err(|e| format!("spawn request: {e}"))?;
        let id = self
            .courier
            .request_spawn(
                Party {
                    fleet: fleet.clone(),
                    host: host.to_owned(),
                },
                request,
            )
            .map_err(|e| e.to_string())?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(290);
        loop {
            if let Some((_, reply)) = self
                .courier
                .take_spawn_reply(id)
                .map_err(|e| e.to_string())?
            {
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
                return Err(format!(
                    "no reply from `{host}` to spawn request {id}; it may still answer (`fleetd inbox pull`)"
                ));
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
                    Err(reason) => failed_reply(held.id, reason),
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
