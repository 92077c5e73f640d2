//! Taking a secret out of the process environment for good.
//!
//! `unsetenv` only drops the pointer from `environ`: `/proc/<pid>/environ` reads the original
//! block on the initial stack and keeps showing the value to every same-user process. So after
//! reading the value we overwrite the whole `NAME=VALUE` entry in that block with NUL bytes,
//! through `/proc/self/mem` (safe Rust, no `unsafe`). The entry then reads as an empty string,
//! which `getenv`, `std::env::var` and child processes skip: the variable is gone, not emptied.
//! Call before any other thread exists (no one may read the environment concurrently) and
//! before the process makes itself non-dumpable (which makes `/proc/self/mem` root-owned).

use secrecy::SecretString;
use zeroize::Zeroize;

/// Why an environment secret could not be taken.
#[derive(Debug, thiserror::Error)]
pub(super) enum TakeError {
    /// The value is not UTF-8.
    #[error("value is not valid UTF-8")]
    NotUtf8,
    /// The value could not be erased.
    #[error("cannot erase the variable")]
    Erase(#[source] EraseError),
}

/// Why the environment block could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// Reading `/proc/self/stat` or the block, or writing it, failed.
    #[error("cannot access the process environment block through /proc/self")]
    Proc(#[source] std::io::Error),
    /// `/proc/self/stat` has no environment range.
    #[error("cannot locate the environment block in /proc/self/stat")]
    NoRange,
    /// The variable is still visible after the rewrite (it was changed after the process started).
    #[error("the variable is still set after erasing the environment block")]
    StillSet,
    /// This platform has no way to erase it without `unsafe`.
    #[error("not yet supported on this platform: erasing an environment secret (use the keyring)")]
    Unsupported,
}

/// Reads `var` if set, then erases it from the process environment.
pub(super) fn take(var: &str) -> Result<Option<SecretString>, TakeError> {
    let Some(value) = std::env::var_os(var) else {
        return Ok(None);
    };
    let value = match value.into_string() {
        Ok(text) => SecretString::from(text),
        Err(raw) => {
            raw.into_encoded_bytes().zeroize();
            erase(var).map_err(TakeError::Erase)?;
            return Err(TakeError::NotUtf8);
        }
    };
    erase(var).map_err(TakeError::Erase)?;
    Ok(Some(value))
}

#[cfg(target_os = "linux")]
fn erase(var: &str) -> Result<(), EraseError> {
    use std::os::unix::fs::FileExt;

    let stat = std::fs::read_to_string("/proc/self/stat").map_err(EraseError::Proc)?;
    // Fields after the command name (which may hold spaces) start at field 3; env_start and
    // env_end are fields 50 and 51 (proc(5)).
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or(EraseError::NoRange)?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, EraseError> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or(EraseError::NoRange)
    };
    let (start, end) = (field(50)?, field(51)?);
    if end <= start {
        return Err(EraseError::NoRange);
    }
    let len = usize::try_from(end - start).map_err(|_| EraseError::NoRange)?;
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .map_err(EraseError::Proc)?;
    let mut block = vec![0u8; len];
    let read = mem.read_exact_at(&mut block, start);
    let prefix = format!("{var}=");
    let mut offset = 0usize;
    let mut result = read.map_err(EraseError::Proc);
    if result.is_ok() {
        for entry in block.split(|&b| b == 0) {
            if entry.starts_with(prefix.as_bytes()) {
                let zeros = vec![0u8; entry.len()];
                if let Err(error) = mem.write_all_at(&zeros, start + offset as u64) {
                    result = Err(EraseError::Proc(error));
                    break;
                }
            }
            offset += entry.len() + 1;
        }
    }
    block.zeroize();
    result?;
    if std::env::var_os(var).is_some() {
        return Err(EraseError::StillSet);
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn erase(_var: &str) -> Result<(), EraseError> {
    Err(EraseError::Unsupported)
}
