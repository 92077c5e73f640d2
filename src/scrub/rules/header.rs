//! `Authorization` headers, `Bearer` tokens and `curl -u`.

use super::value::*;
use super::*;

pub(super) fn authorization(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if scan.at(end).is_some_and(is_name) {
        return Outcome::Skip;
    }
    let Some(value_at) = separator(scan, end, false) else {
        return Outcome::Skip;
    };
    let Some((from, to, resume)) = value(scan, value_at).or_else(|| {
        // An unquoted header value runs to the end of the line, spaces included.
        let line_end = scan.line_end(value_at);
        (!scan.cut(line_end)).then_some((value_at, line_end, line_end))
    }) else {
        return Outcome::NeedMore(start);
    };
    let quoted = from != value_at;
    let to = if quoted {
        to
    } else {
        let line_end = scan.line_end(value_at);
        if scan.cut(line_end) {
            return Outcome::NeedMore(start);
        }
        let stop = (value_at..line_end)
            .find(|&k| matches!(scan.at(k), Some(b'"' | b'\'' | b'\r')))
            .unwrap_or(line_end);
        stop.max(to)
    };
    let scheme_end = scan.run(from, |b| b.is_ascii_alphanumeric() || b == b'-');
    let (cred, kind) = if scan.at(scheme_end) == Some(b' ') && scheme_end > from {
        let scheme = scan.bytes(from, scheme_end).to_ascii_lowercase();
        let kind = match scheme.as_slice() {
            b"bearer" => "bearer-token",
            b"basic" => "basic-auth",
            _ => "authorization",
        };
        (scan.run(scheme_end, |b| b == b' '), kind)
    } else {
        (from, "authorization")
    };
    let to = trim_end(scan, cred, to);
    if placeholder(scan.bytes(cred, to)) {
        return Outcome::Consumed(resume.max(to));
    }
    scan.push(cred, to, kind);
    Outcome::Consumed(resume.max(to))
}

pub(super) fn bearer(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if scan
        .before(start)
        .is_some_and(|b| b.is_ascii_alphanumeric())
    {
        return Outcome::Skip;
    }
    let from = scan.run(end, |b| b == b' ');
    let to = scan.run(from, |b| {
        is_token(b) || matches!(b, b'.' | b'~' | b'+' | b'/' | b'=')
    });
    if scan.cut(to) {
        return Outcome::NeedMore(start);
    }
    if to - from < 16 || placeholder(scan.bytes(from, to)) {
        return Outcome::Skip;
    }
    scan.push(from, to, "bearer-token");
    Outcome::Consumed(to)
}

pub(super) fn curl_user(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if scan.before(start).is_some_and(|b| !is_space(b)) {
        return Outcome::Skip;
    }
    let arg = match scan.at(end) {
        Some(b'=' | b' ') if scan.bytes(start, end) == b"--user" => end + 1,
        _ if scan.bytes(start, end) == b"--user" => return Outcome::Skip,
        _ => end,
    };
    let arg = scan.run(arg, |b| b == b' ');
    let Some((from, to, resume)) = value(scan, arg) else {
        return Outcome::NeedMore(start);
    };
    let Some(colon) = memchr::memchr(b':', scan.bytes(from, to)).map(|n| from + n) else {
        return Outcome::Skip;
    };
    if placeholder(scan.bytes(colon + 1, to)) {
        return Outcome::Skip;
    }
    scan.push(colon + 1, to, "password");
    Outcome::Consumed(resume)
}
