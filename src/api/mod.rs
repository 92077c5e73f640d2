//! The local API: a Unix socket in the runtime directory (mode 0600, directory 0700) that only
//! processes of this user may use — the peer's uid is checked on every connection. One JSON
//! request per connection, one JSON reply; requests are bounded in size and time. No port is
//! ever opened.
//!
//! Imports: `roster` (the view), `route` (the [`Router`] the daemon implements), `broker` (the
//! link status type).

pub mod mcp;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::broker::link::LinkStatus;
use crate::roster::Roster;
use crate::route::Router;

/// The socket's file name in the runtime directory.
pub const SOCKET: &str = "fleetd.sock";
/// Largest request accepted.
pub const MAX_REQUEST: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a request may take to answer: a spawn waits for its agent's readiness gate.
const LONGEST: Duration = Duration::from_secs(300);
const MAX_CLIENTS: usize = 16;

/// What the API reads; each part is absent in single-host mode.
#[derive(Clone, Default)]
pub struct ApiState {
    /// The host name.
    pub host: String,
    /// The roster.
    pub roster: Option<Arc<Mutex<Roster>>>,
    /// The broker link's status.
    pub link: Option<watch::Receiver<LinkStatus>>,
    /// Sending, held messages and delivery states.
    pub router: Option<Arc<dyn Router>>,
    /// Every reply passes through it (the daemon's scrubber, with its held secrets).
    pub scrubber: Option<crate::scrub::Scrubber>,
    /// What the self-sandbox enforces (`sandbox: …`).
    pub sandbox: String,
}

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The runtime directory or socket could not be set up.
    #[error("cannot listen on `{}`", .path.display())]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Binds the socket in `runtime_dir` (replacing a stale one).
pub fn bind(runtime_dir: &Path) -> Result<UnixListener, ApiError> {
    let path = runtime_dir.join(SOCKET);
    let error = |source| ApiError::Listen {
        path: path.clone(),
        source,
    };
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(runtime_dir)
        .map_err(error)?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    let listener = UnixListener::bind(&path).map_err(error)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(error)?;
    Ok(listener)
}

/// Serves requests until `stop` turns true.
pub async fn serve(listener: UnixListener, state: ApiState, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    let me = rustix::process::geteuid();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                        warn!("local api busy; connection dropped");
                        continue;
                    };
                    match rustix::net::sockopt::socket_peercred(&stream) {
                        Ok(peer) if peer.uid == me => {}
                        Ok(peer) => {
                            warn!(peer.uid = peer.uid.as_raw(), "local api: connection from another user refused");
                            continue;
                        }
                        Err(error) => {
                            warn!(%error, "local api: peer credentials unavailable; refused");
                            continue;
                        }
                    }
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(error) = tokio::time::timeout(LONGEST, handle(stream, &state)).await {
                            debug!(%error, "local api request timed out");
                        }
                        drop(permit);
                    });
                }
                Err(error) => warn!(%error, "local api accept failed"),
            },
            _ = stop.changed() => return,
        }
    }
}

async fn handle(stream: UnixStream, state: &ApiState) {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(read).take(u64::try_from(MAX_REQUEST).unwrap_or(u64::MAX) + 1);
    let read = tokio::time::timeout(TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let Ok(read) = read else {
        debug!("local api request not received in time");
        return;
    };
    let reply = match read {
        Ok(_) if line.len() > MAX_REQUEST => {
            json!({"error": format!("request larger than {MAX_REQUEST} bytes")})
        }
        Ok(_) => match serde_json::from_slice::<Value>(&line) {
            // Answers may wait for the disk (a send is durable before it is acknowledged).
            Ok(request) => {
                let state = state.clone();
                tokio::task::spawn_blocking(move || answer(&request, &state))
                    .await
                    .unwrap_or_else(|_| json!({"error": "the request failed"}))
            }
            Err(_) => json!({"error": "request is not JSON"}),
        },
        Err(_) => return,
    };
    let reply = match &state.scrubber {
        Some(scrubber) => scrubbed(scrubber, reply),
        None => reply,
    };
    let mut bytes = reply.to_string().into_bytes();
    bytes.push(b'\n');
    let _ = write.write_all(&bytes).await;
}

fn answer(request: &Value, state: &ApiState) -> Value {
    match request.get("op").and_then(Value::as_str) {
        Some("status") => json!({
            "host": state.host,
            "broker": state.link.as_ref().map_or("broker: not configured (single-host mode)".to_owned(), |l| l.borrow().to_string()),
            "sandbox": state.sandbox,
        }),
        Some("roster") => match &state.roster {
            Some(roster) => match roster.lock() {
                Ok(roster) => json!({"hosts": roster.view()}),
                Err(_) => json!({"error": "roster unavailable"}),
            },
            None => json!({"error": "no roster in single-host mode"}),
        },
        Some(op @ ("agent.open" | "send" | "held.pull" | "held.ack" | "delivery" | "spawn")) => {
            match &state.router {
                Some(router) => routed(op, request, router.as_ref()),
                None => json!({"error": "no routing in single-host mode (configure a broker)"}),
            }
        }
        Some(other) if other.len() <= 32 => json!({"error": format!("unknown op `{other}`")}),
        _ => json!({"error": "missing or unknown `op`"}),
    }
}

/// `value` with every string (keys included) passed through the scrubber, so the reply stays JSON.
fn scrubbed(scrubber: &crate::scrub::Scrubber, value: Value) -> Value {
    match value {
        Value::String(text) => Value::String(scrubber.scrub(&text)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| scrubbed(scrubber, v)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (scrubber.scrub(&k), scrubbed(scrubber, v)))
                .collect(),
        ),
        other => other,
    }
}

/// The routing ops; each reply is JSON with the result or an `error`.
fn routed(op: &str, request: &Value, router: &dyn Router) -> Value {
    let id = |field: &str| {
        request
            .get(field)
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
    };
    let result = match op {
        "agent.open" => match request.get("name").and_then(Value::as_str) {
            Some(name) => router.open_agent(name).map(|id| json!({"id": id.to_string()})),
            None => Err("`name` is required".to_owned()),
        },
        "send" => match (id("to"), request.get("text").and_then(Value::as_str)) {
            (Some(to), Some(text)) => router.send(to, id("from"), text.to_owned()),
            _ => Err("`to` (an agent id) and `text` are required".to_owned()),
        },
        "held.pull" => {
            let limit = request
                .get("limit")
                .and_then(Value::as_u64)
                .map_or(10, |n| n.clamp(1, 100));
            router
                .held(usize::try_from(limit).unwrap_or(10), id("agent"))
                .map(|held| json!({"messages": held}))
        }
        "held.ack" => match id("id") {
            Some(message) => router.ack(message).map(|found| json!({"acknowledged": found})),
            None => Err("`id` must be a message id".to_owned()),
        },
        "delivery" => match id("id") {
            Some(message) => router.delivery(message).map(|found| match found {
                Some(tracked) => tracked,
                None => json!({"error": format!("no delivery record for {message} (not sent from this host, or pruned)")}),
            }),
            None => Err("`id` must be a message id".to_owned()),
        },
        "spawn" => {
            let mut fields = request.clone();
            if let Some(object) = fields.as_object_mut() {
                object.remove("op");
            }
            router.spawn(&fields)
        }
        _ => Err(format!("unknown op `{op}`")),
    };
    result.unwrap_or_else(|error| json!({"error": error}))
}

/// Sends one request to the daemon's socket in `runtime_dir` and returns its reply.
pub async fn request(runtime_dir: &Path, request: &Value) -> std::io::Result<Value> {
    let mut stream = UnixStream::connect(runtime_dir.join(SOCKET)).await?;
    let mut bytes = request.to_string().into_bytes();
    bytes.push(b'\n');
    stream.write_all(&bytes).await?;
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream).take(16 * 1024 * 1024);
    let wait = if request.get("op").and_then(Value::as_str) == Some("spawn") {
        LONGEST
    } else {
        TIMEOUT
    };
    tokio::time::timeout(wait, reader.read_until(b'\n', &mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply from fleetd"))??;
    serde_json::from_slice(&line)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
