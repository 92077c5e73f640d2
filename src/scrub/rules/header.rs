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

/// Cookie attributes, not cookies.
const COOKIE_ATTRIBUTES: &[&[u8]] = &[
    b"path",
    b"domain",
    b"expires",
    b"max-age",
    b"samesite",
    b"secure",
    b"httponly",
    b"priority",
    b"partitioned",
    b"version",
    b"comment",
];

/// `Cookie:` / `Set-Cookie:` headers: every cookie value that looks generated (session ids,
/// CSRF tokens); attribute values and short flags stay.
pub(super) fn cookie(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    if scan
        .before(start)
        .is_some_and(|b| b.is_ascii_alphanumeric())
    {
        return Outcome::Skip;
    }
    let line_end = scan.line_end(start);
    if scan.cut(line_end) {
        return Outcome::NeedMore(start);
    }
    let mut i = end;
    while i < line_end {
        let pair_end = (i..line_end)
            .find(|&k| matches!(scan.at(k), Some(b';' | b'"' | b'\'' | b'\r')))
            .unwrap_or(line_end);
        let pair = scan.bytes(i, pair_end);
        if let Some(eq) = memchr::memchr(b'=', pair) {
            let name = pair.get(..eq).unwrap_or_default().trim_ascii();
            let from = i + eq + 1;
            let to = scan.run(from, |b| {
                !is_space(b) && !matches!(b, b';' | b',' | b'"' | b'\'')
            });
            let value = scan.bytes(from, to);
            let attribute = COOKIE_ATTRIBUTES
                .iter()
                .any(|a| name.eq_ignore_ascii_case(a));
            if !attribute && value.len() >= 8 && generated(value) && !placeholder(value) {
                scan.push(from, to, "cookie");
            }
        }
        if !matches!(scan.at(pair_end), Some(b';')) {
            return Outcome::Consumed(pair_end);
        }
        i = pair_end + 1;
    }
    Outcome::Consumed(line_end)
}

/// The AWS console's credentials CSV (`User name,Password,…,Console login link`): the password
/// field of a data line (its access keys are the key rules').
pub(super) fn aws_console_csv(scan: &mut Scan<'_>, start: usize) -> Outcome {
    let line_start = scan.line_start(start);
    let line = scan.bytes(line_start, start);
    let mut fields = line.split(|&b| b == b',');
    let (Some(user), Some(password), Some(_)) = (fields.next(), fields.next(), fields.next())
    else {
        return Outcome::Skip;
    };
    if user.eq_ignore_ascii_case(b"user name") || password.is_empty() || placeholder(password) {
        return Outcome::Skip;
    }
    let from = line_start + user.len() + 1;
    scan.push(from, from + password.len(), "password");
    Outcome::Skip
}
