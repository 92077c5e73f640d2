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

/// Registers the values of an env file's `NAME=VALUE` lines.
fn load_known(scrubber: &Scrubber, path: &Path, out: &Output) -> io::Result<()> {
    let text = Zeroizing::new(std::fs::read_to_string(path)?);
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, value)) = env_line(line) else {
            out.note(&format!(
                "warning: {}:{}: not a NAME=VALUE line; ignored",
                path.display(),
                number + 1
            ));
            continue;
        };
        if let Err(error) = scrubber.register(name, &SecretString::from(value)) {
            out.note(&format!(
                "warning: {}:{}: {error}",
                path.display(),
                number + 1
            ));
        }
    }
    Ok(())
}

/// One line of an env file as shells and dotenv read it: `[export] NAME = VALUE`, the value
/// unquoted (`"…"` with `\"` and `\\` escapes, `'…'` literal) or bare with a trailing ` # comment`
/// dropped; spaces around the name and value are not part of them.
fn env_line(line: &str) -> Option<(&str, String)> {
    let line = line.trim();
    let line = line.strip_prefix("export ").map_or(line, str::trim_start);
    let (name, value) = line.split_once('=')?;
    let (name, value) = (name.trim(), value.trim());
    if name.is_empty() {
        return None;
    }
    let value = if let Some(inner) = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .filter(|_| value.len() >= 2)
    {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(next @ ('"' | '\\' | '$' | '`'))) => {
                    out.push(next);
                    chars.next();
                }
                _ => out.push(c),
            }
        }
        out
    } else if let Some(inner) = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .filter(|_| value.len() >= 2)
    {
        inner.to_owned()
    } else {
        value
            .split_once(" #")
            .map_or(value, |(bare, _)| bare.trim_end())
            .to_owned()
    };
    Some((name, value))
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

#[cfg(test)]
mod tests {
    use super::env_line;

    #[test]
    fn known_files_are_read_as_env_files() {
        for (line, name, value) in [
            ("TOKEN=abc123xyz", "TOKEN", "abc123xyz"),
            ("NAME=\"v a l\"", "NAME", "v a l"),
            ("NAME='v\\a'", "NAME", "v\\a"),
            ("NAME = spaced-value", "NAME", "spaced-value"),
            ("export PGPASSWORD=\"q\\\"uote\"", "PGPASSWORD", "q\"uote"),
            ("KEY=bare # comment", "KEY", "bare"),
        ] {
            let (n, v) = env_line(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!((n, v.as_str()), (name, value), "{line}");
        }
        assert!(env_line("no separator").is_none());
    }
}
