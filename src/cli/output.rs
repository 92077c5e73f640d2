//! The only place fleetd prints: every line goes through the scrubber first.

use std::io::{self, Write};

use crate::scrub::Scrubber;

/// Scrubbed printing to stdout and stderr.
#[derive(Clone, Debug, Default)]
pub struct Output {
    scrubber: Scrubber,
}

impl Output {
    /// Printing through `scrubber`.
    pub fn new(scrubber: Scrubber) -> Self {
        Self { scrubber }
    }

    /// The scrubber in use.
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    /// One line to stdout.
    pub fn line(&self, text: &str) {
        let clean = self.scrubber.scrub(text);
        // A closed stdout (e.g. `| head`) is not an error worth reporting.
        let _ = writeln!(io::stdout().lock(), "{clean}");
    }

    /// An error and its cause chain to stderr: `error: …` then `caused by: …`.
    pub fn error(&self, error: &dyn std::error::Error) {
        let mut text = format!("error: {error}");
        let mut cause = error.source();
        while let Some(inner) = cause {
            text.push_str(&format!("\n  caused by: {inner}"));
            cause = inner.source();
        }
        self.note(&text);
    }

    /// A line to stderr.
    pub fn note(&self, text: &str) {
        let clean = self.scrubber.scrub(text);
        let _ = writeln!(io::stderr().lock(), "{clean}");
    }
}
