//! fleetd's own tmux client: tmux's client protocol (version 8, as tmux 3.3 speaks it), spoken
//! in-process over the server's socket.
//!
//! The `tmux` binary is a client that does what its server asks: open a path for reading
//! (`MSG_READ_OPEN`) or writing (`MSG_WRITE_OPEN`) — `load-buffer PATH` and `save-buffer PATH`
//! from an unattached client are served by the *client* (tmux 3.3a `file.c`) — exec a shell
//! (`MSG_SHELL`), run a lock command (`MSG_LOCK`), signal its parent (`MSG_DETACHKILL`). On a host
//! where the agents own the server (its hooks fire in the queue of the client whose command set
//! them off) or its socket's directory (a fake server), that made fleetd's `tmux` calls a
//! confused deputy with fleetd's identity. This client has none of those powers: it passes no
//! file descriptor and no environment but `PATH`, opens nothing, runs nothing. It feeds its own
//! stdin bytes to a read of stream `-`, collects stdout and stderr writes into memory (bounded),
//! answers every request to open a path with `EACCES` and records it, and ends the call at once
//! on a request to exec, lock, suspend or attach. Every answer the server sends is bounded and
//! checked; whatever it says is data, never an instruction.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// tmux's client protocol version (tmux-protocol.h); a server of another version says so.
const PROTOCOL_VERSION: u32 = 8;
/// The imsg header: type, length (header included), flags, peer id (the version), pid.
const HEADER: usize = 16;
/// imsg's largest message, header included.
const MAX_MESSAGE: usize = 16384;
/// The most a call keeps of what the server writes to its stdout and stderr together.
const MAX_OUTPUT: usize = 8 << 20;

const EBADF: i32 = 9;
const EACCES: i32 = 13;

/// A client flag tmux sets for a UTF-8 locale (tmux.h `CLIENT_UTF8`).
const CLIENT_UTF8: u64 = 0x10000;

/// Message types (tmux-protocol.h `enum msgtype`).
mod msg {
    pub(super) const VERSION: u32 = 12;
    pub(super) const IDENTIFY_FLAGS: u32 = 100;
    pub(super) const IDENTIFY_TERM: u32 = 101;
    pub(super) const IDENTIFY_TTYNAME: u32 = 102;
    pub(super) const IDENTIFY_STDIN: u32 = 104;
    pub(super) const IDENTIFY_ENVIRON: u32 = 105;
    pub(super) const IDENTIFY_DONE: u32 = 106;
    pub(super) const IDENTIFY_CLIENTPID: u32 = 107;
    pub(super) const IDENTIFY_CWD: u32 = 108;
    pub(super) const IDENTIFY_FEATURES: u32 = 109;
    pub(super) const IDENTIFY_STDOUT: u32 = 110;
    pub(super) const IDENTIFY_LONGFLAGS: u32 = 111;
    pub(super) const COMMAND: u32 = 200;
    pub(super) const DETACH: u32 = 201;
    pub(super) const DETACHKILL: u32 = 202;
    pub(super) const EXIT: u32 = 203;
    pub(super) const EXITED: u32 = 204;
    pub(super) const LOCK: u32 = 206;
    pub(super) const READY: u32 = 207;
    pub(super) const SHELL: u32 = 209;
    pub(super) const SHUTDOWN: u32 = 210;
    pub(super) const OLDSTDERR: u32 = 211;
    pub(super) const OLDSTDOUT: u32 = 213;
    pub(super) const SUSPEND: u32 = 214;
    pub(super) const EXEC: u32 = 217;
    pub(super) const FLAGS: u32 = 218;
    pub(super) const READ_OPEN: u32 = 300;
    pub(super) const READ: u32 = 301;
    pub(super) const READ_DONE: u32 = 302;
    pub(super) const WRITE_OPEN: u32 = 303;
    pub(super) const WRITE: u32 = 304;
    pub(super) const WRITE_READY: u32 = 305;
    pub(super) const WRITE_CLOSE: u32 = 306;
}

/// What a server asked of this client that a client of fleetd's never does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Open a path for reading (`load-buffer PATH`, `source-file PATH`, …); answered `EACCES`.
    Read(String),
    /// Open a path for writing (`save-buffer PATH`, `pipe-pane`'s files, …); answered `EACCES`.
    Write(String),
    /// Exec a shell, run a lock command, suspend, attach or kill its parent: the call ended.
    Run(&'static str),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Read(path) => write!(f, "open `{path}` for reading"),
            Refusal::Write(path) => write!(f, "open `{path}` for writing"),
            Refusal::Run(what) => write!(f, "{what}"),
        }
    }
}

/// What a finished command left.
#[derive(Debug, Default)]
pub struct Reply {
    /// The command's exit status (0: success).
    pub status: i32,
    /// What it printed to stdout.
    pub stdout: Vec<u8>,
    /// What it printed to stderr.
    pub stderr: Vec<u8>,
    /// The server's closing message, if any (`access not allowed`, `server exited`, …).
    pub message: Option<String>,
    /// What the server asked for and was refused, in order.
    pub refused: Vec<Refusal>,
}

/// Why a call has no reply.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Nothing listens at the socket (or it cannot be reached).
    #[error("no server running on `{}`: {source}", .path.display())]
    NoServer {
        /// The socket.
        path: PathBuf,
        /// What connect said.
        source: std::io::Error,
    },
    /// The socket's directory is not this user's alone (tmux's own check for `-L`).
    #[error("unsafe socket directory `{}`: {why}", .path.display())]
    UnsafeDirectory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The connection failed mid-call, or the server closed it without an exit.
    #[error("connection to the tmux server failed: {0}")]
    Io(#[from] std::io::Error),
    /// No exit within the call's deadline.
    #[error("no answer in time")]
    Timeout,
    /// The server speaks another protocol version.
    #[error("the tmux server speaks protocol version {0}, fleetd speaks {PROTOCOL_VERSION}")]
    Version(u32),
    /// The server sent something malformed or out of bounds.
    #[error("the tmux server sent {0}")]
    Protocol(&'static str),
    /// The server asked for something only a compromised or fake server asks of this client;
    /// the call was ended (the refusals so far are in `refused`).
    #[error("the tmux server asked fleetd to {}: refused, call ended", .refused.last().map_or_else(String::new, ToString::to_string))]
    Hostile {
        /// Everything refused in this call, the request that ended it last.
        refused: Vec<Refusal>,
    },
}

/// Runs one tmux command (`args`, as the `tmux` binary takes them after its options) on the
/// server at `socket`, feeding `stdin` to a read of `-`, until it exits or `deadline` passes.
pub fn call(
    socket: &Path,
    args: &[&str],
    stdin: &[u8],
    deadline: Instant,
) -> Result<Reply, CallError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| CallError::NoServer {
        path: socket.to_owned(),
        source,
    })?;
    let mut session = Session {
        stream: &mut stream,
        deadline,
        stdin: Some(stdin),
        streams: BTreeMap::new(),
        reply: Reply::default(),
        inbox: Vec::new(),
    };
    session.send_identify()?;
    session.send(msg::COMMAND, &command(args)?)?;
    session.run()
}

/// The socket tmux would use for `-L name`: `$TMUX_TMPDIR` (else `/tmp`), `tmux-UID/NAME`,
/// after tmux's own check that the directory is this user's and closed to others.
pub fn named_socket(name: &str) -> Result<PathBuf, CallError> {
    let base = std::env::var_os("TMUX_TMPDIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let base = std::fs::canonicalize(&base).unwrap_or(base);
    let uid = rustix::process::getuid().as_raw();
    let dir = base.join(format!("tmux-{uid}"));
    use std::os::unix::fs::MetadataExt;
    let unsafe_dir = |why| CallError::UnsafeDirectory {
        path: dir.clone(),
        why,
    };
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if !meta.is_dir() => return Err(unsafe_dir("not a directory")),
        Ok(meta) if meta.uid() != uid => return Err(unsafe_dir("owned by another user")),
        Ok(meta) if meta.mode() & 0o077 != 0 => return Err(unsafe_dir("open to other users")),
        Ok(_) => {}
        Err(source) => {
            return Err(CallError::NoServer {
                path: dir.join(name),
                source,
            });
        }
    }
    Ok(dir.join(name))
}

/// `MSG_COMMAND`'s body: argc, then each argument NUL-terminated.
fn command(args: &[&str]) -> Result<Vec<u8>, CallError> {
    let argc = i32::try_from(args.len()).map_err(|_| CallError::Protocol("too many arguments"))?;
    let mut body = argc.to_ne_bytes().to_vec();
    for arg in args {
        if arg.contains('\0') {
            return Err(CallError::Protocol("an argument with a NUL"));
        }
        body.extend_from_slice(arg.as_bytes());
        body.push(0);
    }
    if HEADER + body.len() > MAX_MESSAGE {
        return Err(CallError::Protocol("a command too long"));
    }
    Ok(body)
}

/// Where a stream the server opened for writing goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    Stdout,
    Stderr,
}

/// One call's connection and what it collected.
struct Session<'a> {
    stream: &'a mut UnixStream,
    deadline: Instant,
    /// The bytes a read of `-` gets (once).
    stdin: Option<&'a [u8]>,
    streams: BTreeMap<i32, Sink>,
    reply: Reply,
    /// Received bytes not yet parsed into messages.
    inbox: Vec<u8>,
}

impl Session<'_> {
    /// The identify sequence of an unattached client: no terminal, no file descriptors, no
    /// environment, `/` as its directory.
    fn send_identify(&mut self) -> Result<(), CallError> {
        let flags = CLIENT_UTF8;
        self.send(msg::IDENTIFY_FLAGS, &(flags as i32).to_ne_bytes())?;
        self.send(msg::IDENTIFY_LONGFLAGS, &flags.to_ne_bytes())?;
        self.send(msg::IDENTIFY_TERM, b"\0")?;
        self.send(msg::IDENTIFY_FEATURES, &0i32.to_ne_bytes())?;
        self.send(msg::IDENTIFY_TTYNAME, b"\0")?;
        self.send(msg::IDENTIFY_CWD, b"/\0")?;
        // No descriptor travels with these: the server has no stdin or stdout of fleetd's.
        self.send(msg::IDENTIFY_STDIN, b"")?;
        self.send(msg::IDENTIFY_STDOUT, b"")?;
        let pid = std::process::id() as i32;
        self.send(msg::IDENTIFY_CLIENTPID, &pid.to_ne_bytes())?;
        // tmux gives a pane opened by an unattached client that client's PATH (spawn.c): the
        // one variable of fleetd's that reaches an agent, as it did with the `tmux` binary.
        if let Some(path) = std::env::var_os("PATH") {
            let mut entry = b"PATH=".to_vec();
            entry.extend_from_slice(path.as_encoded_bytes());
            entry.push(0);
            if !path.as_encoded_bytes().contains(&0) && HEADER + entry.len() <= MAX_MESSAGE {
                self.send(msg::IDENTIFY_ENVIRON, &entry)?;
            }
        }
        self.send(msg::IDENTIFY_DONE, b"")
    }

    fn send(&mut self, kind: u32, body: &[u8]) -> Result<(), CallError> {
        let len = u16::try_from(HEADER + body.len())
            .ok()
            .filter(|len| usize::from(*len) <= MAX_MESSAGE)
            .ok_or(CallError::Protocol("a message too long"))?;
        let mut frame = Vec::with_capacity(usize::from(len));
        frame.extend_from_slice(&kind.to_ne_bytes());
        frame.extend_from_slice(&len.to_ne_bytes());
        frame.extend_from_slice(&0u16.to_ne_bytes());
        frame.extend_from_slice(&PROTOCOL_VERSION.to_ne_bytes());
        frame.extend_from_slice(&std::process::id().to_ne_bytes());
        frame.extend_from_slice(body);
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        self.stream.write_all(&frame).map_err(timeout)
    }

    fn remaining(&self) -> Result<std::time::Duration, CallError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CallError::Timeout);
        }
        Ok(left)
    }

    /// Reads and answers messages until the command's exit.
    fn run(mut self) -> Result<Reply, CallError> {
        loop {
            let (kind, peer, body) = self.next()?;
            if kind != msg::VERSION && peer & 0xff != PROTOCOL_VERSION {
                return Err(CallError::Version(peer & 0xff));
            }
            match kind {
                msg::VERSION => return Err(CallError::Version(peer & 0xff)),
                msg::EXIT | msg::SHUTDOWN => {
                    self.exit(&body)?;
                    return Ok(self.reply);
                }
                msg::EXITED => return Ok(self.reply),
                msg::FLAGS => {}
                msg::READ_OPEN => self.read_open(&body)?,
                msg::WRITE_OPEN => self.write_open(&body)?,
                msg::WRITE => self.write(&body)?,
                msg::WRITE_CLOSE => {
                    let stream = int(&body, 0).ok_or(CallError::Protocol("a short write close"))?;
                    self.streams.remove(&stream);
                }
                msg::SHELL => return Err(self.hostile("exec a shell (MSG_SHELL)")),
                msg::EXEC => return Err(self.hostile("exec a command (MSG_EXEC)")),
                msg::LOCK => return Err(self.hostile("run a lock command (MSG_LOCK)")),
                msg::SUSPEND => return Err(self.hostile("suspend itself (MSG_SUSPEND)")),
                msg::READY => return Err(self.hostile("attach to a terminal (MSG_READY)")),
                msg::DETACHKILL => return Err(self.hostile("signal its parent (MSG_DETACHKILL)")),
                msg::DETACH => return Err(self.hostile("detach (MSG_DETACH)")),
                msg::OLDSTDERR..=msg::OLDSTDOUT => {
                    return Err(CallError::Protocol("an old protocol's message"));
                }
                // Anything else (a newer server's notice) asks nothing of a client: ignored.
                _ => {}
            }
        }
    }

    /// The next message: (type, peer id, body). Descriptors a server passes are never
    /// received (a plain read discards them, and the kernel closes them).
    fn next(&mut self) -> Result<(u32, u32, Vec<u8>), CallError> {
        loop {
            if let Some(len) = self.inbox.get(4..6).map(|b| usize::from(u16_at(b))) {
                if !(HEADER..=MAX_MESSAGE).contains(&len) {
                    return Err(CallError::Protocol("a message with a bad length"));
                }
                if let Some(message) = self.inbox.get(..len) {
                    let kind = u32_at(message, 0);
                    let peer = u32_at(message, 8);
                    let body = message.get(HEADER..).unwrap_or_default().to_vec();
                    self.inbox.drain(..len);
                    return Ok((kind, peer, body));
                }
            }
            let mut chunk = [0u8; 16384];
            self.stream.set_read_timeout(Some(self.remaining()?))?;
            let read = self.stream.read(&mut chunk).map_err(timeout)?;
            if read == 0 {
                return Err(CallError::Io(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the server closed the connection before the command exited",
                )));
            }
            self.inbox
                .extend_from_slice(chunk.get(..read).unwrap_or_default());
        }
    }

    /// `MSG_EXIT`: the status, then an optional NUL-terminated message.
    fn exit(&mut self, body: &[u8]) -> Result<(), CallError> {
        if body.is_empty() {
            return Ok(());
        }
        self.reply.status = int(body, 0).ok_or(CallError::Protocol("a short exit"))?;
        let text = body.get(4..).unwrap_or_default();
        let text = text.split(|b| *b == 0).next().unwrap_or_default();
        if !text.is_empty() {
            self.reply.message = Some(String::from_utf8_lossy(text).into_owned());
        }
        Ok(())
    }

    /// `MSG_READ_OPEN {stream, fd} path`: stream `-` (fd 0) gets this call's stdin; a path is
    /// refused.
    fn read_open(&mut self, body: &[u8]) -> Result<(), CallError> {
        let (stream, fd) = match (int(body, 0), int(body, 4)) {
            (Some(stream), Some(fd)) => (stream, fd),
            _ => return Err(CallError::Protocol("a short read open")),
        };
        let error = match (fd, self.stdin.take()) {
            (0, Some(bytes)) => {
                let room = MAX_MESSAGE - HEADER - 4;
                for piece in bytes.chunks(room) {
                    let mut data = stream.to_ne_bytes().to_vec();
                    data.extend_from_slice(piece);
                    self.send(msg::READ, &data)?;
                }
                0
            }
            (0, None) => 0, // stdin was read already: nothing more to give
            (-1, stdin) => {
                self.stdin = stdin;
                self.reply.refused.push(Refusal::Read(path(body, 8)));
                EACCES
            }
            (_, stdin) => {
                self.stdin = stdin;
                EBADF
            }
        };
        let mut done = stream.to_ne_bytes().to_vec();
        done.extend_from_slice(&error.to_ne_bytes());
        self.send(msg::READ_DONE, &done)
    }

    /// `MSG_WRITE_OPEN {stream, fd, flags} path`: stdout and stderr are collected; a path is
    /// refused.
    fn write_open(&mut self, body: &[u8]) -> Result<(), CallError> {
        let (stream, fd) = match (int(body, 0), int(body, 4), int(body, 8)) {
            (Some(stream), Some(fd), Some(_flags)) => (stream, fd),
            _ => return Err(CallError::Protocol("a short write open")),
        };
        let error = match fd {
            _ if self.streams.contains_key(&stream) => EBADF,
            1 | 2 => {
                let sink = if fd == 1 { Sink::Stdout } else { Sink::Stderr };
                self.streams.insert(stream, sink);
                0
            }
            -1 => {
                self.reply.refused.push(Refusal::Write(path(body, 12)));
                EACCES
            }
            _ => EBADF,
        };
        let mut ready = stream.to_ne_bytes().to_vec();
        ready.extend_from_slice(&error.to_ne_bytes());
        self.send(msg::WRITE_READY, &ready)
    }

    /// `MSG_WRITE {stream} data`, kept when the stream is stdout or stderr.
    fn write(&mut self, body: &[u8]) -> Result<(), CallError> {
        let stream = int(body, 0).ok_or(CallError::Protocol("a short write"))?;
        let data = body.get(4..).unwrap_or_default();
        let sink = match self.streams.get(&stream) {
            Some(sink) => *sink,
            None => return Ok(()), // a stream refused or never opened: dropped
        };
        if self.reply.stdout.len() + self.reply.stderr.len() + data.len() > MAX_OUTPUT {
            return Err(CallError::Protocol("more output than a call may hold"));
        }
        match sink {
            Sink::Stdout => self.reply.stdout.extend_from_slice(data),
            Sink::Stderr => self.reply.stderr.extend_from_slice(data),
        }
        Ok(())
    }

    fn hostile(&mut self, what: &'static str) -> CallError {
        let mut refused = std::mem::take(&mut self.reply.refused);
        refused.push(Refusal::Run(what));
        CallError::Hostile { refused }
    }
}

/// The native-endian C `int` at `at`.
fn int(body: &[u8], at: usize) -> Option<i32> {
    let bytes: [u8; 4] = body.get(at..at + 4)?.try_into().ok()?;
    Some(i32::from_ne_bytes(bytes))
}

/// The native-endian `u32` at `at` of a message known to hold a whole header.
fn u32_at(message: &[u8], at: usize) -> u32 {
    int(message, at).map_or(0, |i| i.cast_unsigned())
}

/// The native-endian `u16` in two bytes.
fn u16_at(bytes: &[u8]) -> u16 {
    bytes.try_into().map(u16::from_ne_bytes).unwrap_or_default()
}

/// The NUL-terminated path after a request's fixed fields (`-` when there is none), shown
/// printable.
fn path(body: &[u8], at: usize) -> String {
    let raw = body.get(at..).unwrap_or_default();
    let raw = raw.split(|b| *b == 0).next().unwrap_or_default();
    if raw.is_empty() {
        return "-".to_owned();
    }
    String::from_utf8_lossy(raw)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A read or write that ran out of time is the call's timeout.
fn timeout(error: std::io::Error) -> CallError {
    match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => CallError::Timeout,
        _ => CallError::Io(error),
    }
}
