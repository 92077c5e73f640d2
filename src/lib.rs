//! fleetd: a security-hardened per-host gateway that lets AI coding agents on several hosts work
//! together through one AMQP broker.
//!
//! Module map (see docs/architecture.md; arrows are the only allowed imports):
//!
//! ```text
//! cli ──▶ daemon ──▶ config ──▶ secret, scrub
//!   │        └────▶ secret, scrub, pane
//!   └──▶ config, secret, scrub
//! leaves (import nothing from the crate): scrub, secret, pane
//! ```
//!
//! Later issues add `policy`, `broker`, `wire`, `state`, `roster`, `route`, `spawn`, `api`,
//! `sandbox` and `audit` in the places STYLE.md gives them.
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod audit;
pub mod broker;
pub mod cli;
pub mod config;
pub mod daemon;
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
