//! Logging: tracing events formatted whole, scrubbed whole, then written.
//!
//! tracing asks the writer for one buffer per event; the buffer goes through the [`Scrubber`]
//! when it is dropped, so a secret in a message, a field, a span or an error chain is redacted
//! before any byte reaches stderr (journald under systemd).

use std::io::{self, Write};
use std::sync::Arc;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use zeroize::Zeroize;

use crate::config::LogFormat;
use crate::scrub::Scrubber;

/// Where scrubbed log text goes.
pub type Sink = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// A `MakeWriter` whose writers scrub each event before passing it to the sink.
#[derive(Clone)]
pub struct ScrubbingWriter {
    scrubber: Scrubber,
    sink: Sink,
}

impl ScrubbingWriter {
    /// Writes scrubbed events to stderr.
    pub fn stderr(scrubber: Scrubber) -> Self {
        Self::new(
            scrubber,
            Arc::new(|bytes: &[u8]| {
                // A log line that cannot be written is lost; there is nowhere better to report it.
                let _ = io::stderr().lock().write_all(bytes);
            }),
        )
    }

    /// Writes scrubbed events to `sink`.
    pub fn new(scrubber: Scrubber, sink: Sink) -> Self {
        Self { scrubber, sink }
    }
}

/// One event's bytes, scrubbed and written when dropped.
pub struct EventBuffer {
    scrubber: Scrubber,
    sink: Sink,
    bytes: Vec<u8>,
}

impl Write for EventBuffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        let clean = self.scrubber.scrub_bytes(&self.bytes);
        (self.sink)(&clean);
        self.bytes.zeroize();
    }
}

impl<'a> MakeWriter<'a> for ScrubbingWriter {
    type Writer = EventBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        EventBuffer {
            scrubber: self.scrubber.clone(),
            sink: Arc::clone(&self.sink),
            bytes: Vec::with_capacity(256),
        }
    }
}

/// Errors from setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The level filter does not parse.
    #[error("invalid log level filter `{filter}`")]
    Filter {
        /// The filter text.
        filter: String,
    },
    /// A global subscriber was already installed.
    #[error("logging was already initialised")]
    AlreadySet,
}

/// Builds the subscriber for `format` and `filter`, writing through `writer`.
pub fn subscriber(
    format: LogFormat,
    filter: &str,
    writer: ScrubbingWriter,
) -> Result<Box<dyn tracing::Subscriber + Send + Sync>, LogError> {
    let mut filter = EnvFilter::try_new(filter).map_err(|_| LogError::Filter {
        filter: filter.to_owned(),
    })?;
    // lapin logs a returned message at WARN with its whole body, and frames at lower levels:
    // message content must never reach a log, so lapin is held at ERROR whatever the filter says
    // (fleetd reports returns itself, as delivery states). Not lower: with lapin's events turned
    // off entirely, the three-node cluster run (tests/broker_cluster.rs) stalled reproducibly
    // after a node fault — cross-fleet beats and deliveries stopped — while it passes with them
    // at ERROR; the cause inside lapin 4.12 was not found (2026-12-06).
    for directive in ["lapin=error", "amq_protocol=error"] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(true);
    Ok(match format {
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .finish(),
        ),
        LogFormat::Text => Box::new(
            builder
                .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
                .finish(),
        ),
    })
}

/// Installs the global subscriber writing scrubbed events to stderr.
pub fn init(format: LogFormat, filter: &str, scrubber: Scrubber) -> Result<(), LogError> {
    let subscriber = subscriber(format, filter, ScrubbingWriter::stderr(scrubber))?;
    tracing::subscriber::set_global_default(subscriber).map_err(|_| LogError::AlreadySet)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use secrecy::SecretString;
    use tracing::{debug, error, info, info_span, trace, warn};

    use super::*;

    const CANARY: &str = "L0g-c4n4ry-9e1f7a";

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "connect failed")
        }
    }
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "server said: bad password {CANARY}")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    impl std::error::Error for Inner {}

    fn capture(format: LogFormat) -> String {
        let scrubber = Scrubber::new();
        scrubber
            .register("canary", &SecretString::from(CANARY))
            .unwrap();
        let captured = Arc::new(Mutex::new(Vec::new()));
        let sink_buf = Arc::clone(&captured);
        let sink: Sink =
            Arc::new(move |bytes: &[u8]| sink_buf.lock().unwrap().extend_from_slice(bytes));
        let subscriber = subscriber(format, "trace", ScrubbingWriter::new(scrubber, sink)).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let span = info_span!("session", token = CANARY, user = "alice");
            let _entered = span.enter();
            trace!("trace {CANARY}");
            debug!(value = CANARY, "debug field");
            info!("info {}", CANARY);
            warn!(uri = %format!("amqp://u:{CANARY}@h/"), "warn uri");
            let chained = Outer(Inner);
            error!(error = &chained as &dyn std::error::Error, "error chain");
            error!("error display {:#}", chained.0);
        });
        let bytes = captured.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_held_canary_never_reaches_log_output_at_any_level_or_format() {
        for format in [LogFormat::Text, LogFormat::Json] {
            let out = capture(format);
            assert!(
                !out.contains(CANARY),
                "{format:?} output leaked the canary:\n{out}"
            );
            for text in [
                "trace",
                "debug field",
                "info",
                "warn uri",
                "error chain",
                "error display",
            ] {
                assert!(
                    out.contains(text),
                    "{format:?} output lacks `{text}`:\n{out}"
                );
            }
            assert!(out.matches("[redacted:").count() >= 6, "{format:?}:\n{out}");
        }
    }
}
