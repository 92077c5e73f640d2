//! The spawn side of the gateway: a spawn asked on this host (by the operator, by an agent its
//! profile's `may_spawn` allows, by the lead supervisor) or by another host, through the
//! policy and the pipeline; the registration of a started agent under its name, with its
//! identity minted before its pane; remote spawns and the worker that serves them.

use secrecy::SecretString;
use serde_json::json;
use uuid::Uuid;

use super::gateway::{Gateway, courier_error, state_error};
use crate::agent::{Owner, Process, Registration};
use crate::api::{ENV_AGENT_ID, ENV_AGENT_TOKEN, ENV_SOCKET};
use crate::policy::{Origin, Request, SecretRef};
use crate::route::reply::Spawned;
use crate::route::{RouterError, SpawnAsk};
use crate::secret::{SecretName, lookup};
use crate::spawn::Outcome;
use crate::wire::Party;
use crate::wire::{SpawnOutcome, SpawnReply, SpawnRequest};

impl Gateway {
    /// A spawn asked over the local API for this host, by `owner`: checked as any request is,
    /// decided and run here; the reply names the agent and its name.
    pub(super) fn spawn_here(&self, ask: &SpawnAsk, owner: Owner) -> Result<Spawned, RouterError> {
        let me = self.courier.me();
        let request = Request::checked(
            Origin {
                fleet: me.fleet,
                host: me.host,
            },
            ask.profile.clone(),
            ask.env.clone(),
            ask.cwd.as_deref(),
            ask.label.as_deref(),
        )
        .map_err(|e| RouterError::Invalid(e.to_string()))?;
        let (reply, name) = self.run_spawn(&request, None, owner)?;
        Ok(Spawned {
            outcome: reply.outcome,
            agent: reply.agent,
            name,
            host: None,
            fleet: None,
            request: None,
            reasons: reply.reasons,
        })
    }

    /// Whether local agent `agent` may request `profile` with its token: its own profile's
    /// `may_spawn` must name it. A refusal is audited (`spawn.refused`, nothing launched).
    pub(super) fn may_spawn(&self, agent: Uuid, profile: &str) -> Result<Owner, RouterError> {
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
                "spawning is off: herdr was not reachable when fleetd started, or fleetd could not name its own executable (see its log)"
                    .to_owned(),
            ));
        };
        let owner_text = owner.to_string();
        let policy = self.policy.current();
        let resolve = |reference: &SecretRef| -> Result<SecretString, Box<dyn std::error::Error + Send + Sync>> {
            let value = match reference {
                SecretRef::Env(var) => self
                    .env_secrets
                    .get(var)
                    .cloned()
                    .ok_or_else(|| SecretError::NotReadAtStart(var.clone()))?,
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
        let outcome = match identity {
            Err(reason) => Registered::Refused {
                rules: Vec::new(),
                reasons: vec![reason],
            },
            Ok((id, token, hash)) => {
                let id_text = SecretString::from(id.to_string());
                let socket = SecretString::from(self.socket.display().to_string());
                let identity = [
                    (ENV_AGENT_ID, &id_text),
                    (ENV_SOCKET, &socket),
                    (ENV_AGENT_TOKEN, &token),
                ];
                match spawner.spawn(&policy, request, &resolve, &identity) {
                    Outcome::Started {
                        pane,
                        process,
                        profile,
                        rules,
                    } => {
                        let name = request.label.clone().unwrap_or_else(|| {
                            agents
                                .free_name(&format!("{profile}-{}", pane.0.trim_start_matches('%')))
                        });
                        let registered = agents.register(Registration {
                            id,
                            name: name.clone(),
                            grant: rules.first().map(ToString::to_string),
                            profile,
                            pane: pane.0.clone(),
                            owner: owner.clone(),
                            token: Some(hash),
                            process: process.as_ref().map(|p| Process {
                                pid: p.pid(),
                                start: p.start(),
                                comm: p.comm().map(str::to_owned),
                                program_pid: p.program().map(|a| a.pid),
                                program_start: p.program().map(|a| a.start),
                            }),
                        });
                        match registered {
                            Ok(id) => {
                                if let Some(process) = process {
                                    self.processes.watch(id, process);
                                }
                                Registered::Started { id, name, rules }
                            }
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
                }
            }
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
                super::presence::announce(&self.courier, &self.roster);
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
    pub(super) fn spawn_remote(
        &self,
        host: &str,
        fleet: Option<String>,
        ask: &SpawnAsk,
    ) -> Result<Spawned, RouterError> {
        // Only a gateway the roster has heard from can answer: anything else is refused now,
        // naming what the roster knows, instead of a request retried until it expires.
        let rows = self.roster.lock().map(|r| r.view()).unwrap_or_default();
        let known = || {
            let all: Vec<String> = rows
                .iter()
                .map(|r| format!("{}/{}", r.fleet, r.host))
                .collect();
            if all.is_empty() {
                "the roster is empty".to_owned()
            } else {
                format!("the roster has {}", all.join(", "))
            }
        };
        let mut fleets: Vec<String> = rows
            .iter()
            .filter(|r| r.host == host)
            .map(|r| r.fleet.clone())
            .collect();
        fleets.dedup();
        let fleet = match (fleet, fleets.as_slice()) {
            (Some(fleet), _) if fleets.contains(&fleet) => fleet,
            (Some(fleet), _) => {
                return Err(RouterError::Invalid(format!(
                    "no host `{host}` of fleet `{fleet}` in the roster ({}): it has not been heard from, or this host cannot reach that fleet",
                    known()
                )));
            }
            (None, [one]) => one.clone(),
            (None, []) => {
                return Err(RouterError::Invalid(format!(
                    "host `{host}` is not in the roster ({}): it has not been heard from",
                    known()
                )));
            }
            (None, _) => {
                return Err(RouterError::Invalid(format!(
                    "host `{host}` is in several fleets ({}): give `--fleet`",
                    fleets.join(", ")
                )));
            }
        };
        let request = spawn_request(ask);
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
        let arrivals = self.mailbox.arrivals();
        loop {
            // Taken before the look: a reply held between the look and the wait wakes it.
            let ticket = arrivals.ticket();
            if let Some((held, reply)) = self.mailbox.take_spawn_reply(id).map_err(state_error)? {
                if let (Some(agent), Some(requester)) = (reply.agent, ask.for_agent) {
                    self.courier
                        .remember_spawned(agent, &held.origin, requester);
                }
                return Ok(Spawned {
                    outcome: reply.outcome,
                    agent: reply.agent,
                    name: None,
                    host: Some(host.to_owned()),
                    fleet: Some(fleet),
                    request: Some(id),
                    reasons: reply.reasons,
                });
            }
            if std::time::Instant::now() > deadline {
                return Err(RouterError::Failed(format!(
                    "no reply from `{host}` to spawn request {id}; it may still answer (`fleetd inbox pull`)"
                )));
            }
            // Woken when a reply is held for this host (another request's, too: then it looks
            // again); the deadline ends the wait.
            arrivals.wait(crate::mailbox::Shelf::Host, &ticket, deadline);
        }
    }

    /// Runs every spawn request from another host waiting in the held store, and replies (one
    /// at a time: each waits for its readiness gate).
    pub(super) fn serve_spawn_requests(&self) {
        let Ok(waiting) = self.mailbox.spawn_requests() else {
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
                        agent: body.by,
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
    Request::checked(
        Origin {
            fleet: origin.fleet.clone(),
            host: origin.host.clone(),
        },
        body.profile.clone(),
        body.env.clone(),
        body.cwd.as_deref(),
        body.label.as_deref(),
    )
}

/// The spawn request body a local API `spawn` asks for.
pub(super) fn spawn_request(ask: &SpawnAsk) -> SpawnRequest {
    SpawnRequest {
        v: crate::wire::VERSION,
        profile: ask.profile.clone(),
        env: ask.env.clone(),
        cwd: ask.cwd.clone(),
        label: ask.label.clone(),
        by: ask.for_agent,
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

/// Why a profile's secret reference has no value on this host. None carries a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// `env:VAR` names a variable the daemon did not read as a secret at start.
    #[error(
        "`env:{0}` is not a secret this daemon read at start (declare it in fleetd.toml: [secrets.NAME] env = \"{0}\")"
    )]
    NotReadAtStart(String),
    /// The reference's name is not a secret name.
    #[error(transparent)]
    Name(#[from] crate::secret::NameError),
    /// Its source could not be read.
    #[error(transparent)]
    Resolve(#[from] crate::secret::ResolveError),
    /// No credential or keyring entry of that name is on this host.
    #[error("`{0}` is not on this host")]
    Absent(String),
}

/// A profile's credential or keyring secret resolved on this host (an `env:` one is the
/// daemon's start-up secret, looked up by the caller).
fn secret_value(reference: &SecretRef) -> Result<SecretString, SecretError> {
    let (keyring, name) = match reference {
        SecretRef::Credential(name) => (false, name),
        SecretRef::Keyring(name) => (true, name),
        SecretRef::Env(var) => return Err(SecretError::NotReadAtStart(var.clone())),
    };
    let name = SecretName::new(name)?;
    lookup(keyring, &name)?.ok_or_else(|| SecretError::Absent(reference.to_string()))
}
