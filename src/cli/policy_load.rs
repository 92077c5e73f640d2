//! Loading a policy directory for the commands that read one (`policy explain`, `test`, `diff`):
//! an invalid one shows its diagnostics and ends the command with the exit code that says why.

use std::path::Path;
use std::process::ExitCode;

use super::{Output, exit};
use crate::policy::{self, PolicySet, Severity};

/// Loads the policy for explain/test/diff: invalid → diagnostics on stderr and exit 3.
pub(super) fn load_valid(dir: &Path, out: &Output) -> Result<PolicySet, ExitCode> {
    match policy::load_dir(dir) {
        (Ok(set), _) => Ok(set),
        (Err(error @ policy::LoadError::Read { .. }), _) => {
            out.error(&error);
            Err(exit::code(exit::USAGE))
        }
        (Err(error), diagnostics) => {
            for diagnostic in diagnostics.iter().filter(|d| d.severity == Severity::Error) {
                out.note(&diagnostic.render());
            }
            out.error(&error);
            Err(exit::code(exit::POLICY_INVALID))
        }
    }
}
