//! Routing: the one fork — the target agent is here ? deliver locally : publish to its owner —
//! and the interface the local API uses to send, pull, acknowledge and follow deliveries.
//!
//! Imports: `roster` (where agents are). Never the broker: the daemon implements [`Router`]
//! with it.

use serde_json::Value;
use uuid::Uuid;

use crate::roster::HostId;

/// Where a message for an agent goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The agent is on this host.
    Local,
    /// The agent is in this fleet: its inbox (the host, where the roster knows it).
    Fleet {
        /// The owning host, if known.
        host: Option<String>,
    },
    /// The agent is on a host of another fleet: through that fleet's ingress exchange.
    Foreign(HostId),
}

/// Decides the route of a message to agent `to`: `local` when it is a local agent, else where the
/// roster places it; an agent the roster does not know is tried in this fleet, where a missing
/// inbox comes back as "no such agent".
pub fn decide(local: bool, located: Option<HostId>, own_fleet: &str) -> Route {
    match located {
        _ if local => Route::Local,
        Some(host) if host.fleet != own_fleet => Route::Foreign(host),
        Some(host) => Route::Fleet {
            host: Some(host.host),
        },
        None => Route::Fleet { host: None },
    }
}

/// What the local API asks of the gateway. Replies are JSON for the API to pass on; errors are
/// one line for the caller.
pub trait Router: Send + Sync {
    /// The local agent named `name` (created, with a new global id, if needed).
    fn open_agent(&self, name: &str) -> Result<Uuid, String>;
    /// Sends `text` to agent `to`; returns the message id and how it was routed.
    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<Value, String>;
    /// Up to `limit` held messages, oldest first (for agent `to` if given).
    fn held(&self, limit: usize, to: Option<Uuid>) -> Result<Value, String>;
    /// Acknowledges a held message; `false` when none was held.
    fn ack(&self, id: Uuid) -> Result<bool, String>;
    /// The delivery state of a message this host sent.
    fn delivery(&self, id: Uuid) -> Result<Option<Value>, String>;
    /// Runs the spawn pipeline for a request made on this host (`profile`, `env`, `cwd`,
    /// `label`); the outcome with its reasons.
    fn spawn(&self, request: &Value) -> Result<Value, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(fleet: &str, host: &str) -> HostId {
        HostId {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        }
    }

    #[test]
    fn local_agents_win_then_the_roster_places_the_rest() {
        assert_eq!(decide(true, Some(host("b", "x")), "a"), Route::Local);
        assert_eq!(
            decide(false, Some(host("b", "x")), "a"),
            Route::Foreign(host("b", "x"))
        );
        assert_eq!(
            decide(false, Some(host("a", "y")), "a"),
            Route::Fleet {
                host: Some("y".to_owned())
            }
        );
        assert_eq!(decide(false, None, "a"), Route::Fleet { host: None });
    }
}
