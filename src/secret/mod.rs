//! Secrets: where each named secret comes from, and the types that hold its plaintext.
//!
//! Sources, first match wins: a systemd credential (`$CREDENTIALS_DIRECTORY/<name>`), the
//! environment variable the config names for it (read once, then erased from the process
//! environment), the OS keyring (kernel keyutils on Linux, the Keychain on macOS). Values live in
//! [`SecretString`]; `Debug` never shows them and they are zeroized on drop. Error messages name
//! secrets and sources, never values.
//!
//! Imports: nothing from the crate (a leaf).

mod env;
mod keyring;
mod process;
mod uri;

use std::fmt;
use std::path::{Path, PathBuf};

use secrecy::SecretString;
use zeroize::Zeroize;

pub use env::EraseError;
pub use keyring::{
    KeyringError, SERVICE as KEYRING_SERVICE, delete as keyring_delete, store as keyring_store,
};
pub use process::{HardenError, harden_process, hardening_state};
pub use uri::{BrokerUri, MAX_NODES, Node, UriError};

/// The environment variable systemd sets to the unit's credential directory.
pub const ENV_CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Where the command line reads credentials when systemd gave it none: a unit instance's
/// `LoadCredential=` sources (`/etc/fleetd/credentials/NAME`), set once by `--instance`.
static CREDENTIALS_FALLBACK: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Reads credentials from `dir` when `$CREDENTIALS_DIRECTORY` is unset (set once).
pub fn use_credentials_dir(dir: PathBuf) {
    let _ = CREDENTIALS_FALLBACK.set(dir);
}

/// The systemd credentials directory: `$CREDENTIALS_DIRECTORY`, else the instance's.
pub fn credentials_dir() -> Option<PathBuf> {
    std::env::var_os(ENV_CREDENTIALS_DIRECTORY)
        .map(PathBuf::from)
        .or_else(|| CREDENTIALS_FALLBACK.get().cloned())
}

/// The conventional name of the broker URI secret (a systemd credential id, a keyring entry).
pub const BROKER_URI: &str = "broker-uri";

/// A secret's name: `[a-z0-9][a-z0-9._-]*`, at most 64 bytes; safe as a file name and a key id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretName(String);

impl SecretName {
    /// Checks `name` against the allowed form.
    pub fn new(name: &str) -> Result<Self, NameError> {
        let mut bytes = name.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let rest_ok = bytes.all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
        if first_ok && rest_ok && name.len() <= 64 && !name.contains("..") {
            Ok(Self(name.to_owned()))
        } else {
            Err(NameError {
                name: name.to_owned(),
            })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret name that does not have the allowed form.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{name}` is not a valid secret name: use lowercase letters, digits, `.`, `_`, `-` (max 64)"
)]
pub struct NameError {
    name: String,
}

/// One configured secret: its name and, optionally, the environment variable that may hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretSpec {
    /// Name of the credential file and keyring entry.
    pub name: SecretName,
    /// Name (never value) of an environment variable that may hold the secret.
    pub env: Option<String>,
}

/// Where a secret was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `$CREDENTIALS_DIRECTORY/<name>`.
    Credential(PathBuf),
    /// The named environment variable (now erased from the process environment).
    Env(String),
    /// The OS keyring entry `fleetd/<name>`.
    Keyring,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Credential(path) => write!(f, "systemd credential `{}`", path.display()),
            Source::Env(var) => write!(f, "environment variable `{var}`"),
            Source::Keyring => f.write_str("os keyring"),
        }
    }
}

/// A secret and where it came from. `Debug` shows the name and source, never the value.
pub struct Resolved {
    /// The secret's name.
    pub name: SecretName,
    /// Where it was found.
    pub source: Source,
    /// The value.
    pub value: SecretString,
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("value", &self.value)
            .finish()
    }
}

/// Errors from resolving a secret. None carries a value.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No source holds the secret.
    #[error("secret `{name}` was found nowhere (tried: {tried})")]
    Missing {
        /// The secret's name.
        name: SecretName,
        /// The sources tried, in order.
        tried: String,
    },
    /// The credential file exists but cannot be read.
    #[error("cannot read credential `{}`", .path.display())]
    Credential {
        /// The credential file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A source holds bytes that are not UTF-8 text.
    #[error("secret `{name}` from {source_name} is not valid UTF-8")]
    NotUtf8 {
        /// The secret's name.
        name: SecretName,
        /// The source, described.
        source_name: String,
    },
    /// The environment variable could not be erased from the process environment.
    #[error("environment variable `{var}` could not be erased from the process environment")]
    EnvErase {
        /// The variable's name.
        var: String,
        /// Why.
        source: env::EraseError,
    },
    /// The keyring failed (not "no entry", which moves on to [`ResolveError::Missing`]).
    #[error("keyring lookup for secret `{name}` failed")]
    Keyring {
        /// The secret's name.
        name: SecretName,
        /// Why.
        source: KeyringError,
    },
}

/// Resolves every secret in `specs` in order, stopping at the first failure.
///
/// Must run before any other thread exists: reading an environment source erases it from the
/// process environment.
pub fn resolve_all(specs: &[SecretSpec]) -> Result<Vec<Resolved>, ResolveError> {
    specs.iter().map(resolve).collect()
}

/// One secret from one named source (a profile's `credential:NAME` or `keyring:NAME`), for a
/// pane's environment. `Ok(None)`: that source does not have it.
pub fn lookup(from_keyring: bool, name: &SecretName) -> Result<Option<SecretString>, ResolveError> {
    if from_keyring {
        return match keyring::load(name.as_str()) {
            Ok(value) => Ok(value),
            Err(KeyringError::Unavailable(_)) => Ok(None),
            Err(source) => Err(ResolveError::Keyring {
                name: name.clone(),
                source,
            }),
        };
    }
    match credentials_dir() {
        Some(dir) => read_credential(name, &dir.join(name.as_str())),
        None => Ok(None),
    }
}

/// Resolves one secret from the first source that has it.
pub fn resolve(spec: &SecretSpec) -> Result<Resolved, ResolveError> {
    let mut tried = Vec::new();
    if let Some(dir) = credentials_dir() {
        let path = dir.join(spec.name.as_str());
        if let Some(value) = read_credential(&spec.name, &path)? {
            return Ok(Resolved {
                name: spec.name.clone(),
                source: Source::Credential(path),
                value,
            });
        }
        tried.push(format!("systemd credential `{}`", path.display()));
    } else {
        tried.push(format!(
            "systemd credential (no ${ENV_CREDENTIALS_DIRECTORY})"
        ));
    }
    if let Some(var) = &spec.env {
        if let Some(value) = env::take(var).map_err(|source| match source {
            env::TakeError::NotUtf8 => ResolveError::NotUtf8 {
                name: spec.name.clone(),
                source_name: format!("environment variable `{var}`"),
            },
            env::TakeError::Erase(source) => ResolveError::EnvErase {
                var: var.clone(),
                source,
            },
        })? {
            return Ok(Resolved {
                name: spec.name.clone(),
                source: Source::Env(var.clone()),
                value,
            });
        }
        tried.push(format!("environment variable `{var}`"));
    }
    match keyring::load(spec.name.as_str()) {
        Ok(Some(value)) => {
            return Ok(Resolved {
                name: spec.name.clone(),
                source: Source::Keyring,
                value,
            });
        }
        Ok(None) => tried.push("os keyring".to_owned()),
        Err(KeyringError::Unavailable(reason)) => tried.push(format!("os keyring ({reason})")),
        Err(source) => {
            return Err(ResolveError::Keyring {
                name: spec.name.clone(),
                source,
            });
        }
    }
    Err(ResolveError::Missing {
        name: spec.name.clone(),
        tried: tried.join(", "),
    })
}

/// Reads a credential file; a missing file is `None`. One trailing newline is dropped.
fn read_credential(name: &SecretName, path: &Path) -> Result<Option<SecretString>, ResolveError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ResolveError::Credential {
                path: path.to_owned(),
                source,
            });
        }
    };
    match String::from_utf8(bytes) {
        Ok(mut text) => {
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            Ok(Some(SecretString::from(text)))
        }
        Err(error) => {
            error.into_bytes().zeroize();
            Err(ResolveError::NotUtf8 {
                name: name.clone(),
                source_name: format!("systemd credential `{}`", path.display()),
            })
        }
    }
}

#[cfg(test)]
mod tests;
