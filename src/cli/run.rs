//! `fleetd run`: the startup checklist.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{Output, exit};
use crate::config::{Config, LogFormat};
use crate::daemon;
use crate::daemon::policy::{PolicyHandle, StartError};
use crate::policy::Severity;
use crate::sandbox::{self, Level, Plan};
use crate::scrub::Scrubber;
use crate::secret;

/// Loads config and secrets, hardens the process, starts logging and runs the daemon.
pub(super) fn run(
    config_path: &Option<PathBuf>,
    log_format: Option<LogFormat>,
    out: &Output,
) -> ExitCode {
    let config = match Config::load(config_path.as_deref()) {
        Ok(config) => config, // files only: no sockets, no threads
        Err(error) => return super::config_check::report(&error, out),
    };
    // Files only others may change would let them decide what this host runs.
    if let Some(Err(error)) = config.file.as_deref().map(crate::config::refuse_writable) {
        out.error(&error);
        return exit::code(exit::FAILED);
    }
    let policy = match PolicyHandle::load(&config.paths.policy) {
        Ok(policy) => policy, // an invalid policy: refuse to start
        Err(error) => {
            if let StartError::Invalid { diagnostics, .. } = &error {
                for diagnostic in diagnostics.iter().filter(|d| d.severity == Severity::Error) {
                    out.note(&diagnostic.render());
                }
                out.error(&error);
                return exit::code(exit::POLICY_INVALID);
            }
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    // Files fleetd creates are its own alone, whatever umask it was started with.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    // Environment secrets are erased from the process environment while no thread exists.
    let secrets = match secret::resolve_all(&config.secrets) {
        Ok(secrets) => secrets,
        Err(error) => {
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    if let Err(error) = secret::harden_process() {
        out.error(&error);
        return exit::code(exit::FAILED);
    }
    let scrubber = Scrubber::new();
    let out = Output::new(scrubber.clone());
    for resolved in &secrets {
        if let Err(error) = scrubber.register(resolved.name.as_str(), &resolved.value) {
            out.note(&format!("warning: {error}"));
        }
        // The broker password alone, too: it may turn up outside its URI.
        if resolved.name.as_str() == secret::BROKER_URI
            && let Ok(uri) = secret::BrokerUri::parse(&resolved.value)
            && let Err(error) = scrubber.register("broker-password", &uri.password)
        {
            out.note(&format!("warning: {error}"));
        }
    }
    let format = log_format.unwrap_or(config.log_format);
    if let Err(error) = daemon::log::init(format, &config.log_level, scrubber.clone()) {
        out.error(&error);
        return exit::code(exit::FAILED);
    }
    // Confine the process while it is still one thread: the runtime's workers inherit it.
    let plan = Plan::for_daemon(&config, &broker_ports(&secrets));
    let sandbox = match sandbox::apply(&plan, config.sandbox) {
        Ok(enforced) => enforced,
        Err(error) => {
            tracing::error!(%error, "fleetd refuses to start");
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    match sandbox.level {
        Level::Full => tracing::info!(%sandbox, "sandbox applied"),
        _ => tracing::warn!(%sandbox, "sandbox not fully enforced"),
    }
    let runtime = match super::runtime(&mut tokio::runtime::Builder::new_multi_thread(), &out) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let code = match runtime.block_on(daemon::run(config, secrets, policy, scrubber, sandbox)) {
        Ok(()) => exit::code(exit::OK),
        Err(error) => {
            tracing::error!(%error, "fleetd failed");
            out.error(&error);
            exit::code(exit::FAILED)
        }
    };
    // Everything that matters is done (the audit drained, the state committed). Dropping the
    // runtime would wait without end for any blocking call still running (a multiplexer client,
    // a state sweep); a stop must end, so what is left gets a few seconds.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    code
}

/// The broker nodes' TCP ports, from the resolved broker URI secret (the sandbox allows only
/// them); none without a broker.
pub(super) fn broker_ports(secrets: &[secret::Resolved]) -> Vec<u16> {
    secrets
        .iter()
        .find(|s| s.name.as_str() == secret::BROKER_URI)
        .and_then(|s| secret::BrokerUri::parse(&s.value).ok())
        .map(|uri| uri.ports())
        .unwrap_or_default()
}
