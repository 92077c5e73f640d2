//! The scrubber: redacts held secrets and credential-shaped text from every output path.
//!
//! One engine serves the log writer, audit records, pane injection, replies, errors and
//! `fleetd scrub`. It finds candidates with one multi-pattern search (triggers: token prefixes,
//! secret-sounding names, `://`, header names, PEM armour, and the exact values and encodings of
//! every held secret), then a small validator per trigger decides the exact span to redact. The
//! replacement is a constant marker naming the kind, `[redacted:KIND]`; context that is not secret
//! (a URL's scheme, user and host, a variable's name) stays.
//!
//! Text is processed line by line (a newline is a hard boundary for every shape except PEM
//! blocks, which carry state from line to line), so [`ScrubStream`] gives the same output however
//! its input was cut into writes.
//!
//! Imports: nothing from the crate (a leaf). Plaintext of held secrets lives here, zeroized on drop.

mod ansi;
mod engine;
mod known;
mod rules;
mod stream;

#[cfg(test)]
mod tests;

use std::sync::{Arc, RwLock};

use secrecy::{ExposeSecret, SecretString};

pub use stream::ScrubStream;

use engine::Engine;

/// The marker text that starts every redaction.
pub const MARKER_PREFIX: &str = "[redacted:";

/// Shortest held secret matched by exact value; shorter values would redact ordinary text.
pub const MIN_HELD_SECRET_LEN: usize = 6;

/// A shared, cheaply cloned handle to the redaction engine.
///
/// Registering a secret rebuilds the engine; scrubbing takes a snapshot, so a long stream keeps
/// the engine it started with plus nothing registered later (streams re-snapshot per block).
#[derive(Clone, Default)]
pub struct Scrubber {
    engine: Arc<RwLock<Arc<Engine>>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("held_secrets", &self.snapshot().held_count())
            .finish()
    }
}

/// Why a secret was not registered for exact-value redaction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// The value is too short to be matched without redacting ordinary text.
    #[error(
        "secret `{name}` is shorter than {MIN_HELD_SECRET_LEN} bytes and cannot be matched exactly"
    )]
    TooShort {
        /// The secret's name (never its value).
        name: String,
    },
}

impl Scrubber {
    /// An engine that knows the credential shapes and holds no secret yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `secret` so its exact value and common encodings are redacted from now on.
    ///
    /// Values shorter than [`MIN_HELD_SECRET_LEN`] are refused: the shapes still apply to them.
    pub fn register(&self, name: &str, secret: &SecretString) -> Result<(), RegisterError> {
        #[expect(
            clippy::disallowed_methods,
            reason = "the scrubber must know a held value to find it in output"
        )]
        let value = secret.expose_secret().as_bytes();
        if value.len() < MIN_HELD_SECRET_LEN {
            return Err(RegisterError::TooShort {
                name: name.to_owned(),
            });
        }
        let mut slot = self
            .engine
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = slot.with_held(value);
        *slot = Arc::new(next);
        Ok(())
    }

    /// Redacts a whole text at once (a log event, an error message, an audit record).
    ///
    /// ```
    /// use fleetd::scrub::Scrubber;
    /// use secrecy::SecretString;
    ///
    /// let scrubber = Scrubber::new();
    /// scrubber.register("db", &SecretString::from("hunter2-but-longer")).unwrap();
    /// assert_eq!(
    ///     scrubber.scrub("origin https://bot:s3cr3t@git.example/r.git and hunter2-but-longer"),
    ///     "origin https://bot:[redacted:password]@git.example/r.git and [redacted:held-secret]",
    /// );
    /// ```
    pub fn scrub(&self, text: &str) -> String {
        let bytes = self.scrub_bytes(text.as_bytes());
        // Markers are ASCII and spans are cut at byte positions validated as boundaries of ASCII
        // delimiters or of whole tokens, but arbitrary input may still put a cut inside a code
        // point; lossy conversion then substitutes U+FFFD rather than failing.
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
        }
    }

    /// Redacts a whole byte buffer at once.
    pub fn scrub_bytes(&self, input: &[u8]) -> Vec<u8> {
        let mut stream = self.stream();
        let mut out = Vec::with_capacity(input.len() + 64);
        stream.write(input, &mut out);
        stream.finish(&mut out);
        out
    }

    /// A streaming redactor: output does not depend on how input is cut into writes.
    pub fn stream(&self) -> ScrubStream {
        ScrubStream::new(self.clone())
    }

    /// How many secrets are held for exact-value redaction.
    pub fn held_count(&self) -> usize {
        self.snapshot().held_count()
    }

    fn snapshot(&self) -> Arc<Engine> {
        Arc::clone(
            &self
                .engine
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// Whether `text` contains anything the scrubber would redact (used to refuse literal secrets in
/// config and policy files).
pub fn looks_secret(text: &str) -> Option<&'static str> {
    // One shapes-only engine for every call: config and policy checks call this per value.
    static SHAPES: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    SHAPES
        .get_or_init(Engine::default)
        .first_kind(text.as_bytes())
}

/// One regular expression per trigger, for the benchmark's naive baseline.
#[doc(hidden)]
pub fn naive_regexes() -> Vec<String> {
    rules::naive_regexes()
}

#[doc(hidden)]
/// Number of trigger hits in `text` (benchmark diagnostics).
pub fn trigger_hits(text: &[u8]) -> usize {
    Engine::default().hits(text)
}
