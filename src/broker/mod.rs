//! The broker: AMQP 0-9-1 over rustls (lapin). Connections built from the broker secret, the
//! fleet topology, the least-privilege grants an operator applies, and the contract suite that
//! proves a fleet credential's capabilities — and its isolation from other fleets' vhosts.
//!
//! Imports: `secret` (the broker URI), `wire` (envelopes), `state` (outbox, replay, dedupe),
//! `mailbox` (the shelves), `agent` (whom a message may reach), `policy` (the message policy),
//! `scrub`. Never `pane`, the roster (the daemon's presence, through `link::PresenceBook`) or
//! routing.

mod apply;
mod connect;
pub mod contract;
pub mod deliver;
pub mod envelope;
pub mod grants;
pub mod inbound;
pub mod link;
pub mod topology;

pub use apply::{ApplyError, BadNode, Rabbitmqctl, apply, apply_host};
pub use connect::{CaError, ConnectError, confirm_channel, connect, connect_node, pin_ca};

/// A broker operation that failed: what fleetd was doing, and the broker's or the connection's
/// answer (shown as `WHAT: ANSWER`).
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// The broker refused the operation, or the connection or channel broke under it.
    #[error("{what}: {source}")]
    Failed {
        /// What was being done (`declare queue `gw.h.ctl``, …).
        what: String,
        /// lapin's error (the broker's reply code and text, or the I/O error).
        source: lapin::Error,
    },
    /// No answer in time.
    #[error("{what}: no answer within {after:?}")]
    Timeout {
        /// What was being done.
        what: String,
        /// How long it was given.
        after: std::time::Duration,
    },
    /// The fleet's exchanges or the host's own are missing, and this credential may not declare
    /// them (a host user: the admin declares them).
    #[error(
        "{source} (the fleet's exchanges or this host's `host.{host}` are missing, and this credential may not declare them: run `fleetd broker grants --fleet FLEET --apply` and `fleetd broker grants --fleet FLEET --host {host} --apply`)"
    )]
    Undeclared {
        /// This host.
        host: String,
        /// The refused declaration.
        source: Box<AmqpError>,
    },
    /// The broker cancelled a consumer (its queue deleted, or a node lost).
    #[error("the broker cancelled the consumer of `{queue}`")]
    Cancelled {
        /// The queue.
        queue: String,
    },
}

impl AmqpError {
    /// Maps lapin's error for `what` (for `map_err`).
    pub fn failed(what: impl Into<String>) -> impl FnOnce(lapin::Error) -> AmqpError {
        let what = what.into();
        move |source| AmqpError::Failed { what, source }
    }

    /// Whether the broker answered with reply code `name` (`ACCESS_REFUSED`,
    /// `PRECONDITION_FAILED`, …).
    pub fn is(&self, name: &str) -> bool {
        match self {
            AmqpError::Failed { source, .. } => source.to_string().contains(name),
            AmqpError::Undeclared { source, .. } => source.is(name),
            AmqpError::Timeout { .. } | AmqpError::Cancelled { .. } => false,
        }
    }
}
