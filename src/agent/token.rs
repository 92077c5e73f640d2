//! Agent capability tokens: 256 random bits from the OS, handed once to the agent's pane (its
//! environment, `FLEETD_AGENT_TOKEN`) and kept by fleetd only as their SHA-256. Whoever presents
//! one on the local API acts as that agent, within what an agent may do.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Every token starts with this, so the scrubber's shapes and a reader recognise one.
pub const PREFIX: &str = "fleetd-agent-";
/// Hex digits after the prefix (256 bits).
const DIGITS: usize = 64;

/// A token's SHA-256, the only form fleetd keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenHash(#[serde(with = "hex32")] [u8; 32]);

/// Why a presented token is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not `fleetd-agent-` and 64 hex digits (cut short, or not a token at all).
    #[error("malformed agent token (expected `{PREFIX}` and {DIGITS} hex digits; truncated?)")]
    Malformed,
    /// Well formed, but no agent holds it: forged, or of an agent that is gone.
    #[error("unknown agent token (forged, or its agent is gone)")]
    Unknown,
    /// It was agent `agent`'s, whose token was revoked.
    #[error("the agent token of {agent} was revoked: {why}")]
    Revoked {
        /// The agent it belonged to.
        agent: uuid::Uuid,
        /// Why.
        why: String,
    },
}

/// Mints a token: the value for the pane, and the hash to keep.
pub fn mint() -> Result<(SecretString, TokenHash), getrandom::Error> {
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(bytes.as_mut_slice())?;
    let mut text = String::with_capacity(PREFIX.len() + DIGITS);
    text.push_str(PREFIX);
    for byte in bytes.iter() {
        text.push_str(&format!("{byte:02x}"));
    }
    let hash = digest(&text);
    Ok((SecretString::from(text), hash))
}

/// The hash of a presented token, once its shape is checked.
pub fn hash_of(presented: &SecretString) -> Result<TokenHash, TokenError> {
    #[expect(
        clippy::disallowed_methods,
        reason = "a presented token is hashed to be looked up; the text goes nowhere else"
    )]
    let text = presented.expose_secret();
    let digits = text.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
    if digits.len() != DIGITS || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed);
    }
    Ok(digest(&text.to_ascii_lowercase()))
}

fn digest(text: &str) -> TokenHash {
    TokenHash(Sha256::digest(text.as_bytes()).into())
}

/// `[u8; 32]` as 64 hex digits in the agent records.
mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&text)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        let mut out = [0u8; 32];
        if text.len() != 64 {
            return Err(serde::de::Error::custom("a token hash is 64 hex digits"));
        }
        for (i, slot) in out.iter_mut().enumerate() {
            let pair = text
                .get(2 * i..2 * i + 2)
                .ok_or_else(|| serde::de::Error::custom("a token hash is 64 hex digits"))?;
            *slot = u8::from_str_radix(pair, 16).map_err(serde::de::Error::custom)?;
        }
        Ok(out)
    }
}
