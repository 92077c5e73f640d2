//! The audit log: an append-only, hash-chained JSON-lines file of every decision, scrubbed.
//!
//! Each line is `{"seq":N,"ts":MS,"event":"…","detail":{…},"prev":"HEX","hash":"HEX"}` where
//! `hash` = SHA-256 of `prev` followed by the line's bytes without its `hash` field. Changing,
//! removing or reordering a line breaks the chain from there on; `fleetd audit verify` finds it.
//!
//! Imports: `scrub` (every record passes through it).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SendError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::scrub::Scrubber;

/// The audit file inside the state directory.
pub const FILE: &str = "audit.jsonl";

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Errors from writing or reading the audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file could not be opened, read or written.
    #[error("audit log `{}`: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The chain is broken at a line.
    #[error("audit log broken at line {line}: {reason}")]
    Broken {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// An open audit log.
pub struct Audit {
    path: PathBuf,
    scrubber: Scrubber,
    inner: Mutex<Tail>,
}

struct Tail {
    file: File,
    seq: u64,
    hash: String,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Audit {
    /// Opens (creating, mode 0600) the log in `dir`, after verifying the chain so far.
    pub fn open(dir: &Path, scrubber: Scrubber) -> Result<Audit, AuditError> {
        let path = dir.join(FILE);
        let io = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        let (seq, hash) = if path.exists() {
            verify(&path)?
        } else {
            (0, GENESIS.to_owned())
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        Ok(Audit {
            path,
            scrubber,
            inner: Mutex::new(Tail { file, seq, hash }),
        })
    }

    /// Appends one record (scrubbed) and syncs it to disk.
    pub fn record(&self, event: &str, detail: Value) -> Result<(), AuditError> {
        self.record_all(&[(event, detail)])
    }

    /// Appends records in order (each scrubbed and chained) with one disk sync for all of them.
    pub fn record_all(&self, records: &[(&str, Value)]) -> Result<(), AuditError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut tail = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let (mut seq, mut hash) = (tail.seq, tail.hash.clone());
        let mut lines = String::new();
        for (event, detail) in records {
            seq += 1;
            // Scrub the detail as text, so a secret in any field is redacted before hashing.
            let detail: Value = serde_json::from_str(&self.scrubber.scrub(&detail.to_string()))
                .unwrap_or(Value::Null);
            let body =
                json!({"seq": seq, "ts": ts, "event": event, "detail": detail, "prev": hash});
            let text = body.to_string();
            hash = chain(&hash, &text);
            lines.push_str(text.strip_suffix('}').unwrap_or(&text)); // `hash` goes before the `}`
            lines.push_str(&format!(",\"hash\":\"{hash}\"}}\n"));
        }
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        tail.file.write_all(lines.as_bytes()).map_err(io)?;
        tail.file.sync_data().map_err(io)?;
        tail.seq = seq;
        tail.hash = hash;
        Ok(())
    }
}

/// Records for a [`Background`] writer, each an event name and its detail.
pub type Records = Vec<(&'static str, Value)>;

/// Most batches waiting for the background writer; a sender waits beyond that.
const BACKGROUND_QUEUE: usize = 1024;

/// An audit writer on a thread of its own, for a loop that must not wait for the disk: the
/// broker link records a window's decisions after acknowledging it and takes the next window at
/// once. Records are appended in the order sent; whatever waits when the writer wakes goes out
/// with one disk sync. [`Background::finish`] (or dropping it) waits until everything sent is
/// on disk.
pub struct Background {
    audit: Arc<Audit>,
    queue: Mutex<Option<SyncSender<Records>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background").finish_non_exhaustive()
    }
}

impl Background {
    /// Starts the writer thread for `audit`; `failed` hears of every write that fails (its
    /// records are lost: the log needs an operator).
    pub fn start(
        audit: Arc<Audit>,
        failed: impl Fn(AuditError) + Send + 'static,
    ) -> std::io::Result<Background> {
        let (queue, batches) = sync_channel::<Records>(BACKGROUND_QUEUE);
        let writer = Arc::clone(&audit);
        let thread = std::thread::Builder::new()
            .name("fleetd-audit".to_owned())
            .spawn(move || {
                while let Ok(mut records) = batches.recv() {
                    while let Ok(more) = batches.try_recv() {
                        records.extend(more);
                    }
                    if let Err(error) = writer.record_all(&records) {
                        failed(error);
                    }
                }
            })?;
        Ok(Background {
            audit,
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues records; returns at once unless the writer is [`BACKGROUND_QUEUE`] batches
    /// behind. After [`Background::finish`] they are written here and now, so none is lost.
    pub fn send(&self, records: Records) -> Result<(), AuditError> {
        if records.is_empty() {
            return Ok(());
        }
        let queue = lock(&self.queue).clone();
        let records = match queue {
            Some(queue) => match queue.send(records) {
                Ok(()) => return Ok(()),
                Err(SendError(records)) => records,
            },
            None => records,
        };
        self.audit.record_all(&records)
    }

    /// Stops taking records and waits until every record sent is on disk.
    pub fn finish(&self) {
        drop(lock(&self.queue).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.finish();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks the whole chain; returns the last sequence number and hash.
pub fn verify(path: &Path) -> Result<(u64, String), AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_owned(),
        source,
    };
    let reader = BufReader::new(File::open(path).map_err(io)?);
    let mut prev = GENESIS.to_owned();
    let mut seq = 0;
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(io)?;
        let broken = |reason: &str| AuditError::Broken {
            line: index + 1,
            reason: reason.to_owned(),
        };
        let mut record: Map<String, Value> =
            serde_json::from_str(&line).map_err(|_| broken("not a JSON object"))?;
        let hash = match record.remove("hash") {
            Some(Value::String(hash)) => hash,
            _ => return Err(broken("no hash")),
        };
        if record.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(broken("`prev` is not the hash of the line before"));
        }
        if record.get("seq").and_then(Value::as_u64) != Some(seq + 1) {
            return Err(broken("sequence number out of order"));
        }
        let text = Value::Object(record).to_string();
        if chain(&prev, &text) != hash {
            return Err(broken("the hash does not match the line"));
        }
        prev = hash;
        seq += 1;
    }
    Ok((seq, prev))
}

fn chain(prev: &str, text: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(text.as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::*;

    /// A scrubber holding the canary secret the records carry.
    fn canary_scrubber() -> Scrubber {
        let scrubber = Scrubber::new();
        scrubber
            .register("canary", &SecretString::from("Aud1tCanaryValue"))
            .unwrap();
        scrubber
    }

    #[test]
    fn records_chain_and_any_change_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let scrubber = canary_scrubber();
        {
            let audit = Audit::open(dir.path(), scrubber.clone()).unwrap();
            for i in 0..5 {
                audit
                    .record(
                        "message.refused",
                        json!({"n": i, "reason": "token Aud1tCanaryValue"}),
                    )
                    .unwrap();
            }
        }
        let path = dir.path().join(FILE);
        assert_eq!(verify(&path).unwrap().0, 5);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("Aud1tCanaryValue"), "records are scrubbed");
        // Reopening continues the chain.
        Audit::open(dir.path(), scrubber.clone())
            .unwrap()
            .record("x", json!({}))
            .unwrap();
        assert_eq!(verify(&path).unwrap().0, 6);

        let lines: Vec<&str> = text.lines().collect();
        let tampered = text.replacen("\"n\":2", "\"n\":7", 1);
        std::fs::write(&path, &tampered).unwrap();
        assert!(matches!(
            verify(&path),
            Err(AuditError::Broken { line: 3, .. })
        ));
        let removed: String = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        std::fs::write(&path, removed).unwrap();
        assert!(matches!(
            verify(&path),
            Err(AuditError::Broken { line: 2, .. })
        ));
        assert!(
            Audit::open(dir.path(), scrubber).is_err(),
            "a broken log is not appended to"
        );
    }

    #[test]
    fn the_background_writer_keeps_order_and_loses_nothing_at_finish() {
        let dir = tempfile::tempdir().unwrap();
        let scrubber = canary_scrubber();
        let audit = Arc::new(Audit::open(dir.path(), scrubber).unwrap());
        let writer = Background::start(Arc::clone(&audit), |error| panic!("{error}")).unwrap();
        for batch in 0..50 {
            let records = (0..3)
                .map(|i| ("x", json!({"n": batch * 3 + i, "t": "Aud1tCanaryValue"})))
                .collect();
            writer.send(records).unwrap();
        }
        // The synchronous path and the writer share one chain.
        audit.record("direct", json!({})).unwrap();
        writer.finish();
        writer.send(vec![("after", json!({}))]).unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(verify(&path).unwrap().0, 152, "every record, chained");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("Aud1tCanaryValue"), "records are scrubbed");
        let numbers: Vec<u64> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["event"] == "x")
            .map(|r| r["detail"]["n"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..150).collect::<Vec<_>>(), "in the order sent");
        assert!(
            text.lines().last().unwrap().contains("\"after\""),
            "sent after finish: written at once"
        );
    }
}
