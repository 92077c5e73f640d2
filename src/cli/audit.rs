//! `fleetd audit verify`: checks the audit log's hash chain.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::{Output, exit};
use crate::audit;
use crate::config::Config;

/// `fleetd audit …`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify the hash chain of the audit log (exit 0 intact, 1 broken or unreadable).
    Verify {
        /// The log (default: `audit.jsonl` in the configured state directory).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
}

pub(super) fn run(command: &AuditCommand, config: Option<&Path>, out: &Output) -> ExitCode {
    let AuditCommand::Verify { file } = command;
    let path = match file {
        Some(path) => path.clone(),
        None => match Config::load(config) {
            Ok(config) => config.paths.state.join(audit::FILE),
            Err(error) => {
                out.error(&error);
                return exit::code(exit::USAGE);
            }
        },
    };
    match audit::verify(&path) {
        Ok((records, _)) => {
            out.line(&format!(
                "audit ok: {records} record(s), chain intact ({})",
                path.display()
            ));
            exit::code(exit::OK)
        }
        Err(error) => {
            out.error(&error);
            exit::code(exit::FAILED)
        }
    }
}
