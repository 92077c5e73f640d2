//! A stand-in tmux server (a test double: a real tmux server sends `MSG_SHELL` only to a client
//! started with `-c`, and asks a command client to open a path only through a hook) that answers
//! every client the way someone who moved the real socket aside could: once the client sent
//! its command, it asks the client to open a path for reading, then one for writing, then to
//! exec a shell — speaking tmux's client protocol (version 8, imsg frames).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMMAND: u32 = 200;
const SHELL: u32 = 209;
const READ_OPEN: u32 = 300;
const READ_DONE: u32 = 302;
const WRITE_OPEN: u32 = 303;
const WRITE_READY: u32 = 305;

/// One imsg frame of tmux's protocol (version 8 in the peer id).
pub fn frame(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut out = kind.to_ne_bytes().to_vec();
    out.extend_from_slice(&u16::try_from(16 + body.len()).unwrap().to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&8u32.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads frames until one of type `kind`; its body (`None` when the client hung up).
fn until(stream: &mut UnixStream, kind: u32) -> Option<Vec<u8>> {
    loop {
        let mut header = [0u8; 16];
        stream.read_exact(&mut header).ok()?;
        let len = usize::from(u16::from_ne_bytes([header[4], header[5]]));
        let mut body = vec![0u8; len.checked_sub(16)?];
        stream.read_exact(&mut body).ok()?;
        if u32::from_ne_bytes(header[..4].try_into().unwrap()) == kind {
            return Some(body);
        }
    }
}

/// `MSG_READ_OPEN {stream, fd}` / `MSG_WRITE_OPEN {stream, fd, flags}` for `path`.
fn open(kind: u32, stream: i32, path: &Path) -> Vec<u8> {
    let mut body = stream.to_ne_bytes().to_vec();
    body.extend_from_slice(&(-1i32).to_ne_bytes());
    if kind == WRITE_OPEN {
        body.extend_from_slice(&0i32.to_ne_bytes());
    }
    body.extend_from_slice(path.as_os_str().as_encoded_bytes());
    body.push(0);
    frame(kind, &body)
}

/// What a client answered: the `MSG_READ_DONE` and `MSG_WRITE_READY` bodies, per connection.
pub type Answers = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// The stand-in server at `socket`, serving every client until dropped.
pub struct FakeTmux {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Each served client's answers to the read and the write open.
    pub answers: Answers,
    pub socket: PathBuf,
}

impl FakeTmux {
    /// Listens at `socket` (which must not exist); asks each client to read `read`, write
    /// `write`, then exec `shell`.
    pub fn serve(socket: &Path, read: &Path, write: &Path, shell: &Path) -> FakeTmux {
        let listener = UnixListener::bind(socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let answers: Answers = Arc::default();
        let (read, write) = (read.to_owned(), write.to_owned());
        let mut shell = shell.as_os_str().as_encoded_bytes().to_vec();
        shell.push(0);
        let thread = {
            let (stop, answers) = (Arc::clone(&stop), Arc::clone(&answers));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((mut client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    client
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .unwrap();
                    let served = (|| {
                        until(&mut client, COMMAND)?;
                        client.write_all(&open(READ_OPEN, 5, &read)).ok()?;
                        let read_done = until(&mut client, READ_DONE)?;
                        client.write_all(&open(WRITE_OPEN, 6, &write)).ok()?;
                        let write_ready = until(&mut client, WRITE_READY)?;
                        client.write_all(&frame(SHELL, &shell)).ok()?;
                        let mut rest = Vec::new();
                        let _ = client.read_to_end(&mut rest);
                        Some((read_done, write_ready))
                    })();
                    if let Some(answer) = served {
                        answers.lock().unwrap().push(answer);
                    }
                }
            })
        };
        FakeTmux {
            stop,
            thread: Some(thread),
            answers,
            socket: socket.to_owned(),
        }
    }

    /// The answers of the first `n` clients served, once they are in (10 s at most).
    pub fn wait_answers(&self, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        super::eventually("the fake server's answers", Duration::from_secs(10), || {
            let answers = self.answers.lock().unwrap().clone();
            (answers.len() >= n).then_some(answers)
        })
    }

    /// Whether a served client answered both opens `EACCES` (13) for their streams.
    pub fn refused_both(answer: &(Vec<u8>, Vec<u8>)) -> bool {
        answer.0[..8] == [5i32.to_ne_bytes(), 13i32.to_ne_bytes()].concat()
            && answer.1[..8] == [6i32.to_ne_bytes(), 13i32.to_ne_bytes()].concat()
    }
}

impl Drop for FakeTmux {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
