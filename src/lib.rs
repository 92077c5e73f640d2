//! fleetd: a security-hardened per-host gateway that lets AI coding agents on several hosts work
//! together through one AMQP broker.
//!
//! Module map (docs/architecture.md has what each module does). Each module imports only those
//! listed after it; `tests/layering.rs` holds the leaves to importing nothing from the crate.
//!
//! ```text
//! leaves:  scrub, secret, pane, state, wire
//! policy   → scrub                    audit   → scrub
//! roster   → wire                     route   → roster
//! agent    → state                    spawn   → pane, policy
//! sandbox  → config, secret
//! broker   → agent, policy, roster, secret, state, wire
//! api      → broker, roster, route, scrub
//! config   → api, broker, roster, scrub, secret, state, wire   (the settings types they own)
//! daemon   → everything above but cli
//! cli      → api, audit, broker, config, daemon, policy, route, sandbox, scrub, secret, wire
//! ```
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod audit;
pub mod broker;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod mailbox;
pub mod pane;
pub mod policy;
pub mod roster;
pub mod route;
pub mod sandbox;
pub mod scrub;
pub mod secret;
pub mod spawn;
pub mod state;
pub mod wire;
