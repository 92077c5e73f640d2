//! `fleetd scrub [--known FILE]`: stdin → scrubber → stdout, flushing when input goes idle.

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use secrecy::SecretString;
use zeroize::Zeroizing;

use super::{Output, exit};
use crate::scrub::Scrubber;

/// Input quiet for this long is flushed (a held candidate stays held).
const IDLE: Duration = Duration::from_millis(150);
const CHUNK: usize = 64 * 1024;

pub(super) fn run(known: Option<&Path>, out: &Output) -> ExitCode {
    let scrubber = Scrubber::new();
    if let Some(path) = known
        && let Err(error) = load_known(&scrubber, path, out)
    {
        out.error(&error);
        return exit::code(exit::USAGE);
    }
    match filter(&scrubber) {
        Ok(()) => exit::code(exit::OK),
        Err(error) => {
            Output::new(scrubber).error(&error);
            exit::code(exit::FAILED)
        }
    }
}

/// Registers the values of `NAME=VALUE` lines.
fn load_known(scrubber: &Scrubber, path: &Path, out: &Output) -> io::Result<()> {
    let text = Zeroizing::new(std::fs::read_to_string(path)?);
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            out.note(&format!(
                "warning: {}:{}: not a NAME=VALUE line; ignored",
                path.display(),
                number + 1
            ));
            continue;
        };
        if let Err(error) = scrubber.register(name.trim(), &SecretString::from(value)) {
            out.note(&format!(
                "warning: {}:{}: {error}",
                path.display(),
                number + 1
            ));
        }
    }
    Ok(())
}

/// Reads stdin on a thread (so idleness can be noticed) and writes scrubbed text to stdout.
fn filter(scrubber: &Scrubber) -> io::Result<()> {
    let (send, receive) = mpsc::sync_channel::<io::Result<Vec<u8>>>(4);
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        loop {
            let mut buf = vec![0u8; CHUNK];
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    buf.truncate(n);
                    if send.send(Ok(buf)).is_err() {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    let _ = send.send(Err(error));
                    break;
                }
            }
        }
    });
    let mut stream = scrubber.stream();
    let mut stdout = io::stdout().lock();
    let mut out = Vec::with_capacity(CHUNK * 2);
    loop {
        match receive.recv_timeout(IDLE) {
            Ok(Ok(chunk)) => stream.write(&chunk, &mut out),
            Ok(Err(error)) => return Err(error),
            Err(mpsc::RecvTimeoutError::Timeout) => stream.flush_idle(&mut out),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if !out.is_empty() {
            stdout.write_all(&out)?;
            stdout.flush()?;
            out.clear();
        }
    }
    stream.finish(&mut out);
    stdout.write_all(&out)?;
    stdout.flush()
}
