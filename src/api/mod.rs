//! The local API: a Unix socket in the runtime directory (mode 0600, directory 0700). It
//! authorises by peer, then by capability: the kernel names every connection's peer
//! (SO_PEERCRED); root, fleetd's own user and members of the operator group get the operator's
//! API (`peer`), anyone else only what an agent token it presents allows (`scope`), and nothing
//! without one. One typed JSON request per connection ([`Request`]), one JSON reply; requests
//! are bounded in size and time, connections per peer and in all. Refusals are answered with
//! the reason and audited. No port is ever opened.
//!
//! Imports: `roster` (the view), `route` (the [`Router`] the daemon implements), `scrub` (every
//! reply passes through it). Never `broker`: the link's state reaches it as a line
//! ([`LinkLine`]).

pub mod mcp;
pub mod peer;
pub mod request;

pub use peer::{Operators, Peer, PeerClass, SocketAccess};
pub use request::{Call, Request, SpawnAsk};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::roster::Roster;
use crate::route::reply;
use crate::route::{Router, RouterError};

/// The socket's file name in the runtime directory.
pub const SOCKET: &str = "fleetd.sock";
/// Largest request accepted.
pub const MAX_REQUEST: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a request may take to answer: a spawn waits for its agent's readiness gate.
const LONGEST: Duration = Duration::from_secs(300);
/// Most connections open at once, all peers together.
const MAX_CLIENTS: usize = 64;

/// The broker link's state as one line (`broker: connected to … since …`), read when asked.
pub type LinkLine = Arc<dyn Fn() -> String + Send + Sync>;

/// What the API reads.
#[derive(Clone)]
pub struct ApiState {
    /// The host name.
    pub host: String,
    /// The roster (this host's agents, and with a broker its peers').
    pub roster: Arc<Mutex<Roster>>,
    /// The broker link's status (`None`: single-host mode).
    pub link: Option<LinkLine>,
    /// Agents, sending, held messages, delivery states, spawning, tokens.
    pub router: Arc<dyn Router>,
    /// Every reply passes through it (the daemon's scrubber, with its held secrets).
    pub scrubber: Option<crate::scrub::Scrubber>,
    /// What the self-sandbox enforces (`sandbox: …`).
    pub sandbox: String,
    /// Who the operator is.
    pub operators: Operators,
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

/// Binds the socket in `runtime_dir` (replacing a stale one), reachable as `access` says.
pub fn bind(runtime_dir: &Path, access: SocketAccess) -> Result<UnixListener, ApiError> {
    use std::os::unix::fs::PermissionsExt;
    let path = runtime_dir.join(SOCKET);
    let error = |source| ApiError::Listen {
        path: path.clone(),
        source,
    };
    let (dir_mode, socket_mode) = access.modes();
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(runtime_dir)
        .map_err(error)?;
    // Set whatever created it (systemd's RuntimeDirectory=, an earlier run): the mode is ours.
    std::fs::set_permissions(runtime_dir, std::fs::Permissions::from_mode(dir_mode))
        .map_err(error)?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    let listener = UnixListener::bind(&path).map_err(error)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(socket_mode)).map_err(error)?;
    Ok(listener)
}

/// Serves requests until `stop` turns true. Each peer (uid) has [`PER_PEER`] connection slots,
/// all peers together [`MAX_CLIENTS`]: one peer's idle connections cannot take another's.
pub async fn serve(listener: UnixListener, state: ApiState, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    let per_peer: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let peer = match rustix::net::sockopt::socket_peercred(&stream) {
                        Ok(cred) => Peer { uid: cred.uid.as_raw(), gid: cred.gid.as_raw() },
                        Err(error) => {
                            warn!(%error, "local api: peer credentials unavailable; refused");
                            continue;
                        }
                    };
                    let Some(slot) = Slot::take(&slots, &per_peer, peer.uid) else {
                        warn!(peer.uid = peer.uid, "local api busy for this peer; connection refused");
                        tokio::spawn(reply_only(stream, json!({"error": "busy: too many open connections from this user"})));
                        continue;
                    };
                    let class = state.operators.class(peer);
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(error) = tokio::time::timeout(LONGEST, handle(stream, &state, peer, class)).await {
                            debug!(%error, "local api request timed out");
                        }
                        drop(slot);
                    });
                }
                Err(error) => warn!(%error, "local api accept failed"),
            },
            _ = stop.changed() => return,
        }
    }
}

/// Most connections one peer (uid) holds open at once.
pub const PER_PEER: usize = 8;

/// One connection's share: a global slot and one of its peer's.
struct Slot {
    _global: tokio::sync::OwnedSemaphorePermit,
    per_peer: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl Slot {
    fn take(
        global: &Arc<Semaphore>,
        per_peer: &Arc<Mutex<HashMap<u32, usize>>>,
        uid: u32,
    ) -> Option<Slot> {
        let mut counts = per_peer.lock().ok()?;
        let count = counts.entry(uid).or_insert(0);
        if *count >= PER_PEER {
            return None;
        }
        let permit = Arc::clone(global).try_acquire_owned().ok()?;
        *count += 1;
        Some(Slot {
            _global: permit,
            per_peer: Arc::clone(per_peer),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.per_peer.lock()
            && let Some(count) = counts.get_mut(&self.uid)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

/// Answers a connection that will not be served with `reply`, without reading its request.
async fn reply_only(mut stream: UnixStream, reply: Value) {
    let _ = tokio::time::timeout(TIMEOUT, write_reply(&mut stream, &reply)).await;
}

/// One reply line.
async fn write_reply(
    write: &mut (impl AsyncWriteExt + Unpin),
    reply: &Value,
) -> std::io::Result<()> {
    let mut bytes = reply.to_string().into_bytes();
    bytes.push(b'\n');
    write.write_all(&bytes).await
}

async fn handle(stream: UnixStream, state: &ApiState, peer: Peer, class: PeerClass) {
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
        Ok(_) => match Call::parse(&line) {
            // Answers may wait for the disk (a send is durable before it is acknowledged).
            Ok(call) => {
                let state = state.clone();
                tokio::task::spawn_blocking(move || answer(call, &state, peer, class))
                    .await
                    .unwrap_or_else(|_| json!({"error": "the request failed"}))
            }
            Err(error) => json!({"error": error.to_string()}),
        },
        Err(_) => return,
    };
    let reply = match &state.scrubber {
        Some(scrubber) => scrubbed(scrubber, reply),
        None => reply,
    };
    let _ = write_reply(&mut write, &reply).await;
}

/// Who is asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A peer of this uid without a token: the operator's API.
    Operator,
    /// The local agent whose capability token came with the request.
    Agent(Uuid),
}

impl Caller {
    /// The agent, when an agent's token came with the request.
    pub fn agent(self) -> Option<Uuid> {
        match self {
            Caller::Agent(agent) => Some(agent),
            Caller::Operator => None,
        }
    }
}

/// What `caller` may ask: the operator anything; an agent only to act as itself — send as
/// itself, pull and acknowledge its own held messages, follow the messages it sent, read the
/// roster. Returns the request as the agent may make it (its own id filled in), or why not.
pub fn scope(caller: Caller, request: Request) -> Result<Request, ScopeError> {
    let Caller::Agent(me) = caller else {
        return Ok(request);
    };
    match request {
        // A spawn goes on to the gateway, which checks the agent profile's `may_spawn`.
        Request::Roster {} | Request::HeldAck { .. } | Request::Delivery { .. } => Ok(request),
        Request::Spawn(ask) => match ask.for_agent {
            Some(other) if other != me => Err(ScopeError::SpawnFor { other, me }),
            _ => Ok(Request::Spawn(SpawnAsk {
                for_agent: Some(me),
                ..ask
            })),
        },
        Request::Send { to, text, from } => match from {
            Some(from) if from != me => Err(ScopeError::SendAs { from, me }),
            _ => Ok(Request::Send {
                to,
                text,
                from: Some(me),
            }),
        },
        Request::HeldPull {
            limit,
            agent,
            wait_ms,
        } => match agent {
            Some(agent) if agent != me => Err(ScopeError::PullFor(agent)),
            _ => Ok(Request::HeldPull {
                limit,
                agent: Some(me),
                wait_ms,
            }),
        },
        Request::Status {} | Request::AgentOpen { .. } | Request::AgentUnblock { .. } => {
            Err(ScopeError::OperatorsOnly)
        }
    }
}

/// Why an agent's token does not allow a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// A spawn for another agent.
    #[error("an agent spawns for itself: `for` {other} is not {me}")]
    SpawnFor {
        /// The agent named.
        other: Uuid,
        /// The token's agent.
        me: Uuid,
    },
    /// A send as another agent.
    #[error("an agent sends as itself: `from` {from} is not {me}")]
    SendAs {
        /// The agent named.
        from: Uuid,
        /// The token's agent.
        me: Uuid,
    },
    /// A pull of another agent's held messages.
    #[error("an agent pulls only its own held messages, not {0}'s")]
    PullFor(Uuid),
    /// An operation only the operator may ask.
    #[error(
        "this operation is the operator's: an agent token allows send, held.pull, held.ack, delivery, roster and the spawns its profile's `may_spawn` names"
    )]
    OperatorsOnly,
}

fn answer(call: Call, state: &ApiState, peer: Peer, class: PeerClass) -> Value {
    let router = state.router.as_ref();
    let op = call.request.op();
    let caller = match call.token {
        None if class == PeerClass::Operator => Caller::Operator,
        None => {
            let reason = format!(
                "refused: uid {} is not the operator ({}): present an agent token",
                peer.uid,
                state.operators.describe()
            );
            warn!(
                peer.uid = peer.uid,
                "local api: a request without a token from a non-operator refused"
            );
            router.refused(None, peer.uid, op, &reason);
            return json!({"error": reason});
        }
        Some(token) => match router.authenticate(&token) {
            Ok(agent) => Caller::Agent(agent),
            Err(error) => {
                router.refused(None, peer.uid, op, &error.to_string());
                return json!({"error": error.to_string()});
            }
        },
    };
    let request = match scope(caller, call.request) {
        Ok(request) => request,
        Err(reason) => {
            router.refused(caller.agent(), peer.uid, op, &reason.to_string());
            return json!({"error": format!("refused: {reason}")});
        }
    };
    // An agent acknowledges and follows only its own messages.
    let only = caller.agent();
    let result = match request {
        Request::Status {} => Ok(line(reply::Status {
            host: state.host.clone(),
            broker: state.link.as_ref().map_or(
                "broker: not configured (single-host mode)".to_owned(),
                |line| line(),
            ),
            sandbox: state.sandbox.clone(),
        })),
        Request::Roster {} => {
            router.refresh_local();
            match state.roster.lock() {
                // Why this host's agents are blocked or down is the operator's to read (a
                // prompt line is pane content): never an agent's, never announced.
                Ok(roster) => Ok(line(reply::Roster::of(
                    roster.view(),
                    &if caller.agent().is_none() {
                        router.notes()
                    } else {
                        Vec::new()
                    },
                ))),
                Err(_) => Err(RouterError::Failed("roster unavailable".to_owned())),
            }
        }
        Request::AgentUnblock { id } => router.unblock(id).map(line),
        Request::AgentOpen { name } => router
            .open_agent(&name)
            .map(|id| line(reply::Opened { id })),
        Request::Send { to, text, from } => router.send(to, from, text).map(line),
        Request::HeldPull {
            limit,
            agent,
            wait_ms,
        } => router
            .held(
                Request::pull_limit(limit),
                agent,
                Request::pull_wait(wait_ms),
            )
            .map(|messages| line(reply::Pulled { messages })),
        Request::HeldAck { id } => router
            .ack(id, only)
            .map(|acknowledged| line(reply::Acked { acknowledged })),
        Request::Delivery { id } => router.delivery(id, only).map(|found| {
            found.map_or_else(
                || json!({"error": format!("no delivery record for {id} (not sent from this host, or pruned)")}),
                line,
            )
        }),
        Request::Spawn(ask) => router.spawn(&ask, only).map(line),
    };
    result.unwrap_or_else(|error| json!({"error": error.to_string()}))
}

/// A typed reply as the JSON line the server writes.
fn line<T: serde::Serialize>(reply: T) -> Value {
    serde_json::to_value(reply).unwrap_or_else(|e| json!({"error": format!("reply: {e}")}))
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

/// An agent's global id, in its pane's environment.
pub const ENV_AGENT_ID: &str = "FLEETD_AGENT_ID";
/// The local API socket's path, in an agent's pane environment.
pub const ENV_SOCKET: &str = "FLEETD_SOCKET";
/// An agent's capability token, in its pane's environment.
pub const ENV_AGENT_TOKEN: &str = "FLEETD_AGENT_TOKEN";

/// How a client reaches the daemon, and as whom: inside an agent's pane, the socket and token
/// fleetd gave the agent (`FLEETD_SOCKET`, `FLEETD_AGENT_TOKEN`); elsewhere the socket in the
/// configured runtime directory, with the operator's authority.
#[derive(Clone, Debug)]
pub struct Client {
    socket: PathBuf,
    token: Option<secrecy::SecretString>,
    agent: Option<Uuid>,
}

impl Client {
    /// The client of the daemon whose runtime directory is `runtime_dir`, or of the one that
    /// launched this process's agent.
    pub fn from_env(runtime_dir: &Path) -> Client {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Client {
            socket: var(ENV_SOCKET).map_or_else(|| runtime_dir.join(SOCKET), PathBuf::from),
            token: var(ENV_AGENT_TOKEN).map(secrecy::SecretString::from),
            agent: var(ENV_AGENT_ID).and_then(|id| Uuid::parse_str(&id).ok()),
        }
    }

    /// The socket it talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The agent it acts as, when it runs in an agent's pane.
    pub fn agent(&self) -> Option<Uuid> {
        self.agent.filter(|_| self.token.is_some())
    }

    /// Sends `request` (with the agent's token, if any); the daemon's reply.
    pub async fn ask(&self, request: &Request) -> std::io::Result<Value> {
        call(
            &self.socket,
            &Call::new(request.clone(), self.token.clone()),
        )
        .await
    }
}

/// Sends one request to the daemon's socket in `runtime_dir` and returns its reply.
pub async fn request(runtime_dir: &Path, request: &Request) -> std::io::Result<Value> {
    call(&runtime_dir.join(SOCKET), &Call::new(request.clone(), None)).await
}

/// Sends one call to the daemon's socket `socket` and returns its reply.
pub async fn call(socket: &Path, call: &Call) -> std::io::Result<Value> {
    let request = &call.request;
    let mut stream = UnixStream::connect(socket).await?;
    stream.write_all(&call.to_line()).await?;
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream).take(16 * 1024 * 1024);
    let wait = match request {
        Request::Spawn(_) => LONGEST,
        // A pull may wait for a message before it answers.
        Request::HeldPull { wait_ms, .. } => TIMEOUT + Request::pull_wait(*wait_ms),
        _ => TIMEOUT,
    };
    tokio::time::timeout(wait, reader.read_until(b'\n', &mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply from fleetd"))??;
    serde_json::from_slice(&line)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_token_reaches_only_what_an_agent_may_do() {
        let (me, other) = (Uuid::now_v7(), Uuid::now_v7());
        let agent = Caller::Agent(me);
        let send = |from| Request::Send {
            to: other,
            text: "t".to_owned(),
            from,
        };
        let pull = |agent| Request::HeldPull {
            limit: None,
            agent,
            wait_ms: None,
        };
        // Filled in with its own id, or refused when it names another.
        assert_eq!(scope(agent, send(None)), Ok(send(Some(me))));
        assert_eq!(scope(agent, send(Some(me))), Ok(send(Some(me))));
        assert_eq!(
            scope(agent, send(Some(other))),
            Err(ScopeError::SendAs { from: other, me })
        );
        assert_eq!(scope(agent, pull(None)), Ok(pull(Some(me))));
        assert_eq!(
            scope(agent, pull(Some(other))),
            Err(ScopeError::PullFor(other))
        );
        // Passed through (the gateway scopes acknowledgements and deliveries to the agent, and
        // checks a spawn against its profile's `may_spawn`).
        for allowed in [
            Request::Roster {},
            Request::HeldAck { id: other },
            Request::Delivery { id: other },
        ] {
            assert_eq!(scope(agent, allowed.clone()), Ok(allowed));
        }
        // A spawn is for the agent itself: it is the new agent's spawner, never another.
        let spawn = |for_agent| {
            Request::Spawn(crate::route::SpawnAsk {
                for_agent,
                ..crate::route::SpawnAsk::default()
            })
        };
        assert_eq!(scope(agent, spawn(None)), Ok(spawn(Some(me))));
        assert_eq!(
            scope(agent, spawn(Some(other))),
            Err(ScopeError::SpawnFor { other, me })
        );
        for refused in [
            Request::Status {},
            Request::AgentOpen {
                name: "primary".to_owned(),
            },
        ] {
            assert_eq!(
                scope(agent, refused.clone()),
                Err(ScopeError::OperatorsOnly),
                "{refused:?}"
            );
        }
        // The operator's requests are unchanged.
        for request in [send(Some(other)), pull(Some(other)), Request::Status {}] {
            assert_eq!(scope(Caller::Operator, request.clone()), Ok(request));
        }
    }
}
