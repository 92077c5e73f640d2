//! Sealing (signing) and verifying envelopes.
//!
//! Verification, in order: version, body size (before parsing), the key pinned for the claimed
//! origin host, the key id, the signature (`verify_strict`: no weak keys, no malleable
//! signatures), the time window, the body, and last the replay cache — only an authentic,
//! well-formed envelope may occupy a replay slot.
//!
//! The time window: `created` no further ahead of now than the skew (a sender's clock), `expires`
//! still ahead, and a lifetime (`expires - created`) of at most [`MAX_LIFETIME_MS`]. How long ago
//! an envelope was created is not checked: a message that waited out a broker outage in its
//! sender's outbox, or a host's downtime in its queue, is as valid as a fresh one, and a replay
//! of it is caught by the replay cache, which keeps every accepted id until it has expired. The broker-level checks (exchange ↔
//! `user_id` ↔ claimed fleet) run before this, in `broker`.

use std::collections::{BTreeMap, HashMap};

use ed25519_dalek::Signature;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::key::{HostKey, PinnedKeys};
use super::{MAX_BODY, MAX_LIFETIME_MS, Meta, PROTOCOL, Payload, VERSION};

/// An envelope ready for the wire: metadata, body bytes, signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// Metadata (AMQP properties and headers on the wire).
    pub meta: Meta,
    /// The JSON body.
    pub body: Vec<u8>,
    /// Ed25519 signature over [`canonical`] bytes.
    pub signature: [u8; 64],
}

/// Why an envelope was refused. Reasons name fields and hosts, never body content.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The envelope version is not this build's.
    #[error("unknown envelope version {0}")]
    Version(u32),
    /// The body exceeds the limit (checked before parsing).
    #[error("body of {0} bytes exceeds the {MAX_BODY}-byte limit")]
    TooLarge(usize),
    /// No key is pinned for the claimed origin host.
    #[error("no key is pinned for host `{host}` of fleet `{fleet}`")]
    UnpinnedHost {
        /// Claimed fleet.
        fleet: String,
        /// Claimed host.
        host: String,
    },
    /// The key id is not that of the pinned key.
    #[error("key id `{0}` is not the key pinned for the origin host")]
    WrongKey(String),
    /// The signature does not verify.
    #[error("the signature does not verify")]
    BadSignature,
    /// `created` is further ahead of now than the skew allows (the sender's clock is ahead).
    #[error("created {0} ms ahead of this host's clock, beyond the allowed skew")]
    Skew(i64),
    /// `expires` has passed (or precedes `created`).
    #[error("the envelope has expired")]
    Expired,
    /// `expires - created` is longer than [`MAX_LIFETIME_MS`].
    #[error("valid for {0} ms, beyond the {MAX_LIFETIME_MS} ms limit")]
    Lifetime(i64),
    /// The body is malformed, of an unknown version, or has unknown fields.
    #[error("malformed body: {0}")]
    Malformed(super::body::BodyError),
    /// The (key id, message id) pair was seen before.
    #[error("replayed envelope")]
    Replayed,
}

impl Refusal {
    /// Whether the envelope's signature verified before it was refused: its origin and metadata
    /// are then authentic (a late or malformed envelope from a pinned host), and the origin may
    /// be told why.
    pub fn after_signature(&self) -> bool {
        matches!(
            self,
            Refusal::Skew(_) | Refusal::Expired | Refusal::Lifetime(_) | Refusal::Malformed(_)
        )
    }
}

/// The time window an envelope must fall in.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Now, Unix milliseconds.
    pub now_ms: i64,
    /// How far ahead of now `created` may be (the senders' clocks).
    pub skew_ms: i64,
}

/// Remembers (key id, message id) pairs until they expire. The daemon's implementation lives in
/// the state store so it survives restarts.
pub trait ReplayCache {
    /// Records the pair; `false` when it was already recorded.
    fn insert_new(&mut self, key_id: &str, id: Uuid, expires_ms: i64) -> bool;
}

/// An in-memory replay cache (tests, tools); entries are dropped once expired.
#[derive(Debug, Default)]
pub struct MemoryReplayCache {
    seen: HashMap<(String, Uuid), i64>,
    by_expiry: BTreeMap<i64, Vec<(String, Uuid)>>,
}

impl MemoryReplayCache {
    /// Forgets entries that expired before `now_ms`.
    pub fn prune(&mut self, now_ms: i64) {
        let keep = self.by_expiry.split_off(&now_ms);
        for entries in std::mem::replace(&mut self.by_expiry, keep).into_values() {
            for entry in entries {
                self.seen.remove(&entry);
            }
        }
    }
}

impl ReplayCache for MemoryReplayCache {
    fn insert_new(&mut self, key_id: &str, id: Uuid, expires_ms: i64) -> bool {
        let entry = (key_id.to_owned(), id);
        if self.seen.contains_key(&entry) {
            return false;
        }
        self.seen.insert(entry.clone(), expires_ms);
        self.by_expiry.entry(expires_ms).or_default().push(entry);
        true
    }
}

/// Signs `payload` as `meta` (whose `key_id` and `kind` are set from the key and payload).
pub fn seal(mut meta: Meta, payload: &Payload, key: &HostKey) -> Sealed {
    meta.version = VERSION;
    meta.kind = payload.kind();
    meta.key_id = key.public().key_id();
    let body = payload.encode();
    let signature = key.sign(&canonical(&meta, &body));
    Sealed {
        meta,
        body,
        signature,
    }
}

/// Verifies `sealed` against pinned keys, the time window and the replay cache.
pub fn verify(
    sealed: &Sealed,
    pins: &PinnedKeys,
    window: Window,
    replay: &mut dyn ReplayCache,
) -> Result<Payload, Refusal> {
    let payload = verify_authentic(sealed, pins, window)?;
    let meta = &sealed.meta;
    if !replay.insert_new(
        &meta.key_id,
        meta.id,
        meta.expires_ms.saturating_add(window.skew_ms),
    ) {
        return Err(Refusal::Replayed);
    }
    Ok(payload)
}

/// Everything [`verify`] checks except the replay cache: for a receiver that records the replay
/// entry in the same durable transaction as the hand-off, so a crash between the two cannot lose
/// a message that was already marked seen.
pub fn verify_authentic(
    sealed: &Sealed,
    pins: &PinnedKeys,
    window: Window,
) -> Result<Payload, Refusal> {
    let meta = &sealed.meta;
    if meta.version != VERSION {
        return Err(Refusal::Version(meta.version));
    }
    if sealed.body.len() > MAX_BODY {
        return Err(Refusal::TooLarge(sealed.body.len()));
    }
    let key = pins
        .key(&meta.origin.fleet, &meta.origin.host)
        .ok_or_else(|| Refusal::UnpinnedHost {
            fleet: meta.origin.fleet.clone(),
            host: meta.origin.host.clone(),
        })?;
    if key.key_id() != meta.key_id {
        return Err(Refusal::WrongKey(meta.key_id.chars().take(32).collect()));
    }
    let signature = Signature::from_bytes(&sealed.signature);
    key.0
        .verify_strict(&canonical(meta, &sealed.body), &signature)
        .map_err(|_| Refusal::BadSignature)?;
    let ahead = meta.created_ms.saturating_sub(window.now_ms);
    if ahead > window.skew_ms {
        return Err(Refusal::Skew(ahead));
    }
    if meta.expires_ms <= window.now_ms || meta.expires_ms < meta.created_ms {
        return Err(Refusal::Expired);
    }
    let lifetime = meta.expires_ms.saturating_sub(meta.created_ms);
    if lifetime > MAX_LIFETIME_MS {
        return Err(Refusal::Lifetime(lifetime));
    }
    Payload::decode(meta.kind, &sealed.body).map_err(Refusal::Malformed)
}

/// The signed bytes: each field length-prefixed (no separator ambiguity), then SHA-256(body).
fn canonical(meta: &Meta, body: &[u8]) -> Vec<u8> {
    let id = meta.id.hyphenated().to_string();
    let created = meta.created_ms.to_string();
    let expires = meta.expires_ms.to_string();
    let fields: [&[u8]; 10] = [
        PROTOCOL.as_bytes(),
        meta.origin.fleet.as_bytes(),
        meta.origin.host.as_bytes(),
        meta.key_id.as_bytes(),
        meta.dest.fleet.as_bytes(),
        meta.dest.host.as_bytes(),
        meta.kind.as_str().as_bytes(),
        id.as_bytes(),
        created.as_bytes(),
        expires.as_bytes(),
    ];
    let mut out = Vec::with_capacity(256);
    for field in fields {
        let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(field);
    }
    out.extend_from_slice(&Sha256::digest(body));
    out
}

/// The signed bytes, for tests that forge bodies with a genuine key.
#[cfg(test)]
pub(super) fn canonical_for_tests(meta: &Meta, body: &[u8]) -> Vec<u8> {
    canonical(meta, body)
}
