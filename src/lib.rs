//! fleetd: a security-hardened per-host gateway for AI coding agents on several hosts.
#![forbid(unsafe_code)]

pub mod scrub;
pub mod config;
pub mod secret;
