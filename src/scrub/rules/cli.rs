//! Passwords given on command lines: `mysql -pSECRET`, `sshpass -p SECRET`, `docker login -p
//! SECRET` (`--password SECRET` and `--password=SECRET` are the assignment rule's).

use super::*;

/// Registry clients whose `login` takes `-p PASSWORD`.
const REGISTRY_CLIENTS: &[&[u8]] = &[
    b"docker", b"podman", b"buildah", b"nerdctl", b"skopeo", b"oras", b"helm", b"crane",
];

/// A trigger that names a command taking a password flag; `-p` is that flag only after it.
pub(super) fn cli_password(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if scan.before(start).is_some_and(|b| {
        !is_space(b) && !matches!(b, b'|' | b';' | b'&' | b'(' | b'`' | b'"' | b'\'' | b'/')
    }) {
        return Outcome::Skip;
    }
    let word_end = scan.run(end, |b| b.is_ascii_alphanumeric() || b == b'-');
    if !scan.at(word_end).is_some_and(|b| b == b' ' || b == b'\t') {
        return if scan.cut(word_end) {
            Outcome::NeedMore(start)
        } else {
            Outcome::Skip
        };
    }
    let trigger = scan.bytes(start, end);
    let (attached_only, space_ok) = match trigger {
        b"mysql" | b"mariadb" => (true, false),
        b"sshpass" => (false, true),
        _ => {
            // `login`: only a registry client's (`gh auth login -p` picks a protocol).
            let before = scan.bytes(scan.line_start(start), start);
            let client = before
                .split(|&b| is_space(b) || b == b'/')
                .any(|w| REGISTRY_CLIENTS.contains(&w));
            if !client {
                return Outcome::Skip;
            }
            (false, true)
        }
    };
    let line_end = scan.line_end(start);
    if scan.cut(line_end) {
        return Outcome::NeedMore(start);
    }
    let mut i = word_end;
    let mut resume = word_end;
    let mut take_next = false;
    while i < line_end {
        i = scan.run(i, |b| b == b' ' || b == b'\t');
        let token_end = scan.run(i, |b| !is_space(b));
        let token = scan.bytes(i, token_end);
        if token.is_empty() || matches!(token, b"|" | b"||" | b"&&" | b";" | b"&") {
            break;
        }
        let mut token_end = token_end;
        if take_next {
            take_next = false;
            if !token.starts_with(b"-") {
                let (from, to, end) = argument(scan, i, line_end);
                scan.push(from, to, "password");
                (resume, token_end) = (end, end);
            }
        } else if let Some(value) = token.strip_prefix(b"-p")
            && !value.is_empty()
            && !value.starts_with(b"-")
            && (attached_only || space_ok)
        {
            let value_start = i + 2 + usize::from(value.starts_with(b"="));
            let (from, to, end) = argument(scan, value_start, line_end);
            scan.push(from, to, "password");
            (resume, token_end) = (end, end);
        } else if token == b"-p" && space_ok {
            take_next = true;
        }
        i = token_end;
    }
    Outcome::Consumed(resume)
}

/// The shell argument starting at `from`: a quoted one to its closing quote (without the
/// quotes; spaces inside belong to it), else to the next space. `(value start, value end,
/// argument end)`.
fn argument(scan: &Scan<'_>, from: usize, line_end: usize) -> (usize, usize, usize) {
    if let Some(q @ (b'"' | b'\'')) = scan.at(from) {
        let close = (from + 1..line_end).find(|&k| scan.at(k) == Some(q));
        let to = close.unwrap_or(line_end);
        return (from + 1, to, close.map_or(line_end, |c| c + 1));
    }
    let end = scan.run(from, |b| !is_space(b));
    (from, end, end)
}
