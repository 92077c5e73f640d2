//! The OS keyring: kernel keyutils on Linux (no D-Bus needed on a headless host; keys are linked
//! into the user's persistent keyring, so a service with a private session keyring finds them),
//! the Keychain on macOS. Entries are `service = "fleetd"`, `user = <secret name>`.

use std::sync::Arc;

use keyring_core::{CredentialStore, Entry, Error};
use secrecy::{ExposeSecret, SecretString};
use zeroize::Zeroize;

use super::SecretName;

/// The keyring service under which fleetd keeps its entries.
pub const SERVICE: &str = "fleetd";

/// Errors from the keyring. Platform messages are kept; stored bytes never are.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// No keyring is usable here (no store for this platform, or access denied).
    #[error("keyring unavailable: {0}")]
    Unavailable(String),
    /// The keyring answered with an error.
    #[error("keyring error: {0}")]
    Failed(String),
    /// The stored bytes are not UTF-8 text.
    #[error("the stored value is not valid UTF-8")]
    NotUtf8,
}

/// Reads the entry for `name`; `None` when there is no such entry.
pub(super) fn load(name: &str) -> Result<Option<SecretString>, KeyringError> {
    let entry = entry(name)?;
    match entry.get_password() {
        Ok(value) => Ok(Some(SecretString::from(value))),
        Err(Error::NoEntry) => Ok(None),
        Err(error) => Err(describe(error)),
    }
}

/// Stores `value` as the entry for `name`, replacing any earlier value.
pub fn store(name: &SecretName, value: &SecretString) -> Result<(), KeyringError> {
    let entry = entry(name.as_str())?;
    #[expect(
        clippy::disallowed_methods,
        reason = "the keyring stores the plaintext"
    )]
    let plain = value.expose_secret();
    entry.set_password(plain).map_err(describe)
}

/// Deletes the entry for `name`; `false` when there was none.
pub fn delete(name: &SecretName) -> Result<bool, KeyringError> {
    let entry = entry(name.as_str())?;
    match entry.delete_credential() {
        Ok(()) => Ok(true),
        Err(Error::NoEntry) => Ok(false),
        Err(error) => Err(describe(error)),
    }
}

fn entry(name: &str) -> Result<Entry, KeyringError> {
    let store = platform_store()?;
    Entry::new_in_store(&store, SERVICE, name).map_err(describe)
}

#[cfg(target_os = "linux")]
fn platform_store() -> Result<Arc<CredentialStore>, KeyringError> {
    let store = linux_keyutils_keyring_store::Store::new().map_err(describe)?;
    Ok(store)
}

#[cfg(target_os = "macos")]
fn platform_store() -> Result<Arc<CredentialStore>, KeyringError> {
    let store = apple_native_keyring_store::keychain::Store::new().map_err(describe)?;
    Ok(store)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn platform_store() -> Result<Arc<CredentialStore>, KeyringError> {
    Err(KeyringError::Unavailable(
        "not yet supported: a keyring store on this platform".to_owned(),
    ))
}

/// Turns a keyring error into ours without keeping any stored bytes.
fn describe(error: Error) -> KeyringError {
    match error {
        Error::BadEncoding(mut bytes) => {
            bytes.zeroize();
            KeyringError::NotUtf8
        }
        Error::BadDataFormat(mut bytes, _) => {
            bytes.zeroize();
            KeyringError::Failed("stored data is malformed".to_owned())
        }
        Error::NoStorageAccess(platform) => KeyringError::Unavailable(platform.to_string()),
        Error::NoDefaultStore => KeyringError::Unavailable("no keyring store".to_owned()),
        Error::Ambiguous(items) => KeyringError::Failed(format!("{} entries match", items.len())),
        other => KeyringError::Failed(other.to_string()),
    }
}
