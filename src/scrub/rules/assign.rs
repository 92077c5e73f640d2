//! Values of secret-sounding names (`*_TOKEN=`, `"apiKey":`, `.netrc`), query signatures, webhook paths.

use super::value::*;
use super::*;

pub(super) fn query_signature(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if !matches!(scan.before(start), Some(b'?' | b'&' | b';')) {
        return Outcome::Skip;
    }
    let to = scan.run(end, |b| {
        !is_space(b) && !matches!(b, b'&' | b'#' | b'"' | b'\'' | b'<' | b'>')
    });
    if scan.cut(to) {
        return Outcome::NeedMore(start);
    }
    if to == end {
        return Outcome::Skip;
    }
    scan.push(end, to, "signature");
    Outcome::Consumed(to)
}

pub(super) fn webhook_path(scan: &mut Scan<'_>, end: usize) -> Outcome {
    let to = scan.run(end, |b| is_token(b) || b == b'/');
    if scan.cut(to) {
        return Outcome::NeedMore(end);
    }
    if to - end < 8 {
        return Outcome::Skip;
    }
    scan.push(end, to, "webhook");
    Outcome::Consumed(to)
}

/// Name segments that make an assignment's value secret, by the kind they report.
fn secret_word(segment: &[u8]) -> Option<(&'static str, bool)> {
    // (kind, weak): a weak word alone as the whole name needs a generated-looking value.
    let mut lower = [0u8; 24];
    let word = lower.get_mut(..segment.len())?;
    word.copy_from_slice(segment);
    word.make_ascii_lowercase();
    let word: &[u8] = word;
    Some(match word {
        b"token" | b"authtoken" | b"accesstoken" | b"refreshtoken" | b"sessiontoken"
        | b"idtoken" | b"apitoken" | b"pat" => ("token", false),
        b"secret" | b"clientsecret" | b"secretkey" | b"secretaccesskey" => ("secret", false),
        b"password" | b"passwd" | b"passphrase" => ("password", false),
        b"pass" | b"pwd" => ("password", true),
        b"key" | b"apikey" | b"accesskey" | b"privatekey" | b"accountkey" | b"sharedaccesskey"
        | b"masterkey" | b"signingkey" | b"encryptionkey" => ("key", word == b"key"),
        b"credential" | b"credentials" | b"creds" => ("credential", true),
        _ => return None,
    })
}

/// The last segment of a name split at `_`, `.`, `-` and lower-to-upper camelCase steps.
fn last_segment(name: &[u8]) -> (&[u8], usize) {
    let mut start = 0;
    let mut segments = 1;
    for (i, pair) in name.windows(2).enumerate() {
        if let [a, b] = *pair {
            if matches!(b, b'_' | b'.' | b'-') {
                start = i + 2;
                segments += 1;
            } else if a.is_ascii_lowercase() && b.is_ascii_uppercase() {
                start = i + 1;
                segments += 1;
            }
        }
    }
    (name.get(start..).unwrap_or_default(), segments)
}

/// Longest variable name examined around a trigger.
const MAX_NAME: usize = 128;

pub(super) fn assignment(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    let mut name_start = start;
    while scan.before(name_start).is_some_and(is_name) && start - name_start < MAX_NAME {
        name_start -= 1;
    }
    let name_end = scan.run(end, is_name);
    if scan.cut(name_end) {
        return Outcome::NeedMore(name_start);
    }
    if name_end - end > MAX_NAME {
        return Outcome::Skip;
    }
    // Fast reject: most hits are words (`passed`, `keyring`, `tokens`) with no separator after.
    let after = scan.run(name_end, |b| matches!(b, b'"' | b'\'' | b'\\'));
    if !matches!(scan.at(after), Some(b'=' | b':' | b' ' | b'\t')) {
        return if scan.cut(after) {
            Outcome::NeedMore(name_start)
        } else {
            Outcome::Skip
        };
    }
    let name = scan.bytes(name_start, name_end);
    let name = name.strip_prefix(b"--").unwrap_or(name);
    let (last, segments) = last_segment(name.trim_ascii_end());
    let Some((kind, weak)) = secret_word(last) else {
        return Outcome::Skip;
    };
    if segments == 1 && last.eq_ignore_ascii_case(b"pwd") {
        return Outcome::Skip; // `PWD`: the working directory
    }
    if segments == 1 && kind == "credential" && scan.at(name_end) == Some(b':') {
        return Outcome::Skip; // `credential:NAME`: a reference to a secret, not a secret
    }
    let netrc = last.eq_ignore_ascii_case(b"password") && netrc_line(scan, name_start);
    let Some(value_at) = separator(scan, name_end, netrc) else {
        if scan.cut(scan.run(name_end, |b| matches!(b, b' ' | b'\t' | b'"' | b'\''))) {
            return Outcome::NeedMore(name_start);
        }
        return Outcome::Skip;
    };
    let Some((from, to, resume)) = value(scan, value_at) else {
        return Outcome::NeedMore(name_start);
    };
    let secret = scan.bytes(from, to);
    if benign_value(secret) || (weak && segments == 1 && !generated(secret)) {
        return Outcome::Consumed(resume);
    }
    scan.push(from, to, kind);
    Outcome::Consumed(resume)
}

/// `.netrc` lines put `password` and its value apart with a space: `machine h login u password p`.
fn netrc_line(scan: &Scan<'_>, name_start: usize) -> bool {
    let mut line_start = name_start;
    while line_start > 0 && scan.before(line_start) != Some(b'\n') {
        line_start -= 1;
    }
    let before = scan.bytes(line_start, name_start);
    let before = before.trim_ascii();
    before.is_empty() || find(before, b"login ").is_some() || find(before, b"machine ").is_some()
}
