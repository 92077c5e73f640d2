//! Exit codes, one place: 0 ok, 1 failed, 2 usage, 3 policy invalid.

use std::process::ExitCode;

/// Success.
pub const OK: u8 = 0;
/// The command failed.
pub const FAILED: u8 = 1;
/// Bad arguments or unreadable input.
pub const USAGE: u8 = 2;

/// `code` as an [`ExitCode`].
pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}
/// The policy is invalid (`policy check`, `explain`, `test`, `run`).
pub const POLICY_INVALID: u8 = 3;
