//! Which messages from other hosts reach a local agent: the message policy
//! ([`crate::policy::evaluate_message`]) applied to what this host recorded of the sender — the
//! agent's spawner (its registry record) or an agent it spawned on another host (the reply to its
//! spawn request).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Courier;
use crate::agent::Owner;
use crate::policy::{self, Decision, MAILBOX, MessageRequest, Origin, Sender};
use crate::wire::{AgentMessage, Party};

/// What this host remembers of an agent started on another host at its request.
#[derive(Debug, Serialize, Deserialize)]
struct Spawned {
    fleet: String,
    host: String,
    /// The local agent it was spawned for.
    requester: Uuid,
}

impl Courier {
    /// Decides messages from other hosts with `current` (shared: a reload reaches it). Until
    /// then, and in tests that do not set one, the policy is empty: only an agent's spawner and
    /// the agents it spawned reach it.
    pub fn use_policy(&self, current: policy::Current) {
        let _ = self.policy.set(current);
    }

    /// Remembers that agent `agent`, started on `at`, was spawned for local agent `requester`:
    /// its messages reach `requester` with no `[[message]]` rule.
    pub fn remember_spawned(&self, agent: Uuid, at: &Party, requester: Uuid) {
        let record = Spawned {
            fleet: at.fleet.clone(),
            host: at.host.clone(),
            requester,
        };
        let stored = serde_json::to_vec(&record)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                self.state
                    .spawned_put(agent, &bytes)
                    .map_err(|e| e.to_string())
            });
        if let Err(error) = stored {
            tracing::warn!(agent.id = %agent, %error, "cannot remember a remote agent's spawner; its messages need a [[message]] rule");
        }
    }

    /// The policy's decision on `message` from `origin` (another host) for its local agent.
    pub(super) fn admit_message(&self, origin: &Party, message: &AgentMessage) -> Decision {
        let agent = self.agents.agent(message.to);
        let profile = agent
            .as_ref()
            .map_or_else(|| MAILBOX.to_owned(), |a| a.profile.clone());
        let spawner = agent.as_ref().is_some_and(|a| match &a.owner {
            Owner::Peer { fleet, host, agent } => {
                *fleet == origin.fleet && *host == origin.host && *agent == message.from
            }
            _ => false,
        });
        let sender = if spawner {
            Sender::Spawner
        } else if message
            .from
            .is_some_and(|from| self.spawned_for(from, origin, message.to))
        {
            Sender::Spawned
        } else {
            Sender::Other
        };
        let request = MessageRequest {
            origin: Origin {
                fleet: origin.fleet.clone(),
                host: origin.host.clone(),
            },
            profile,
            sender,
        };
        let current = self
            .policy
            .get()
            .map(policy::Current::get)
            .unwrap_or_default();
        policy::evaluate_message(&current, &request)
    }

    /// Whether `agent`, of host `origin`, was spawned there for local agent `requester`.
    fn spawned_for(&self, agent: Uuid, origin: &Party, requester: Uuid) -> bool {
        let Ok(Some(bytes)) = self.state.spawned_get(agent) else {
            return false;
        };
        serde_json::from_slice::<Spawned>(&bytes).is_ok_and(|s| {
            s.fleet == origin.fleet && s.host == origin.host && s.requester == requester
        })
    }
}
