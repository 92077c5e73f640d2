//! `fleetd config check`.

use std::path::Path;
use std::process::ExitCode;

use super::{Output, exit};
use crate::config::{Config, LoadError};

/// Loads the config and prints a summary, or every problem.
pub(super) fn run(path: Option<&Path>, out: &Output) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            let source = config
                .file
                .as_ref()
                .map_or("embedded defaults (no config file found)".to_owned(), |p| {
                    p.display().to_string()
                });
            out.line(&format!("config ok: {source}"));
            out.line(&format!("  host: {}", config.host));
            out.line(&format!(
                "  fleet: {}",
                config.fleet.as_deref().unwrap_or("- (single-host mode)")
            ));
            out.line(&format!(
                "  broker.uriEnv: {}",
                config.broker.uri_env.as_deref().unwrap_or("-")
            ));
            out.line(&format!(
                "  paths: policy {}, state {}, runtime {}",
                config.paths.policy.display(),
                config.paths.state.display(),
                config.paths.runtime.display()
            ));
            out.line(&format!(
                "  multiplexer: {:?}, log: {:?} {}",
                config.multiplexer, config.log_format, config.log_level
            ));
            for spec in &config.secrets {
                out.line(&format!(
                    // No colon after `secret`: the scrubber would take the name for a value.
                    "  named secret `{}`{}",
                    spec.name,
                    spec.env
                        .as_ref()
                        .map_or(String::new(), |e| format!(" (env {e})"))
                ));
            }
            exit::code(exit::OK)
        }
        Err(error) => report(&error, out),
    }
}

/// Prints a load error with its diagnostics; returns the exit code.
pub(super) fn report(error: &LoadError, out: &Output) -> ExitCode {
    if let LoadError::Invalid { diagnostics, .. } = error {
        for diagnostic in diagnostics {
            out.note(&diagnostic.to_string());
        }
    }
    out.error(error);
    exit::code(exit::FAILED)
}
