//! The broker: AMQP 0-9-1 over rustls (lapin). Connections built from the broker secret, the
//! fleet topology, the least-privilege grants an operator applies, and the contract suite that
//! proves a fleet credential's capabilities — and its isolation from other fleets' vhosts.
//!
//! Imports: `secret` (the broker URI), `wire` (envelopes), `state` (outbox, replay, dedupe),
//! `roster` (the link feeds beats into it), `agent` (whom a message may reach), `policy` (the
//! message policy). Never `pane` or routing.

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
pub use connect::{ConnectError, confirm_channel, connect, connect_node, pin_ca};
