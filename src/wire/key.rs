//! Host keys: this host's Ed25519 signing key (a secret: a systemd credential or keyring entry,
//! never config or the broker) and the public keys of peers, pinned per host in config.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{SigningKey, VerifyingKey};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

const SEED_PREFIX: &str = "ed25519-seed:";
const PUBLIC_PREFIX: &str = "ed25519:";

/// Why a key could not be made or read. Never contains key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The OS random source failed.
    #[error("the OS random source failed")]
    Random,
    /// The stored host key is not `ed25519-seed:` + base64 of 32 bytes.
    #[error("the host key secret is malformed (expected `ed25519-seed:` and 32 bytes of base64)")]
    MalformedSeed,
    /// A public key is not `ed25519:` + base64 of 32 bytes, or not a valid point.
    #[error("`{0}` is not an ed25519 public key (`ed25519:` and 32 bytes of base64)")]
    MalformedPublic(String),
}

/// This host's signing key. `Debug` shows the key id only; the key is zeroized on drop.
pub struct HostKey {
    signing: SigningKey,
    public: PublicKey,
}

impl fmt::Debug for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKey")
            .field("key_id", &self.public.key_id())
            .finish_non_exhaustive()
    }
}

impl HostKey {
    /// A new key from the OS random source, and its secret form to store.
    pub fn generate() -> Result<(HostKey, SecretString), KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut_slice()).map_err(|_| KeyError::Random)?;
        let stored =
            SecretString::from(format!("{SEED_PREFIX}{}", STANDARD.encode(seed.as_slice())));
        Ok((Self::from_seed(&seed), stored))
    }

    /// The key held in a secret (`ed25519-seed:BASE64`).
    pub fn from_secret(secret: &SecretString) -> Result<HostKey, KeyError> {
        #[expect(
            clippy::disallowed_methods,
            reason = "the seed is decoded into the signing key"
        )]
        let text = secret.expose_secret();
        let encoded = text
            .trim()
            .strip_prefix(SEED_PREFIX)
            .ok_or(KeyError::MalformedSeed)?;
        let bytes = Zeroizing::new(
            STANDARD
                .decode(encoded)
                .map_err(|_| KeyError::MalformedSeed)?,
        );
        let seed: Zeroizing<[u8; 32]> = Zeroizing::new(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyError::MalformedSeed)?,
        );
        Ok(Self::from_seed(&seed))
    }

    fn from_seed(seed: &[u8; 32]) -> HostKey {
        let signing = SigningKey::from_bytes(seed);
        let public = PublicKey(signing.verifying_key());
        HostKey { signing, public }
    }

    /// The public half, to pin on peers.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    pub(super) fn sign(&self, message: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer as _;
        self.signing.sign(message).to_bytes()
    }
}

/// A peer's public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublicKey(pub(super) VerifyingKey);

impl PublicKey {
    /// Parses `ed25519:BASE64`.
    pub fn parse(text: &str) -> Result<PublicKey, KeyError> {
        let bad = || KeyError::MalformedPublic(text.chars().take(80).collect());
        let encoded = text.trim().strip_prefix(PUBLIC_PREFIX).ok_or_else(bad)?;
        let bytes = STANDARD.decode(encoded).map_err(|_| bad())?;
        let array: [u8; 32] = bytes.as_slice().try_into().map_err(|_| bad())?;
        VerifyingKey::from_bytes(&array)
            .map(PublicKey)
            .map_err(|_| bad())
    }

    /// The key id: the first 8 bytes of its SHA-256, in hex.
    pub fn key_id(&self) -> String {
        let digest = Sha256::digest(self.0.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_PREFIX}{}", STANDARD.encode(self.0.as_bytes()))
    }
}

/// Public keys pinned per (fleet, host): the only keys whose signatures are accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinnedKeys {
    keys: BTreeMap<(String, String), PublicKey>,
}

impl PinnedKeys {
    /// Pins `key` for `host` in `fleet` (replacing an earlier pin).
    pub fn pin(&mut self, fleet: &str, host: &str, key: PublicKey) {
        self.keys.insert((fleet.to_owned(), host.to_owned()), key);
    }

    /// The fleets that have at least one pinned host.
    pub fn fleets(&self) -> std::collections::BTreeSet<&str> {
        self.keys.keys().map(|(fleet, _)| fleet.as_str()).collect()
    }

    /// The key pinned for `host` in `fleet`.
    pub fn key(&self, fleet: &str, host: &str) -> Option<&PublicKey> {
        self.keys.get(&(fleet.to_owned(), host.to_owned()))
    }
}
