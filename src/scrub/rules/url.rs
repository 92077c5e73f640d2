//! Credentials in URL userinfo, for every scheme.

use super::value::*;
use super::*;

/// Longest userinfo examined after `://`.
const MAX_AUTHORITY: usize = 512;

/// How the authority is introduced.
#[derive(Clone, Copy, Debug)]
pub(in super::super) enum Form {
    /// `scheme://`
    Plain,
    /// `scheme:\/\/`, as JSON escapes it.
    JsonEscaped,
    /// ` //user:pw@host`, protocol-relative after a space: no scheme.
    Relative,
}

pub(super) fn url_userinfo(scan: &mut Scan<'_>, start: usize, form: Form) -> Outcome {
    let mut scheme = start;
    while scheme > 0
        && scan
            .before(scheme)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
        && start - scheme < 32
    {
        scheme -= 1;
    }
    let from = match form {
        Form::Plain | Form::JsonEscaped if scheme == start => return Outcome::Skip,
        Form::Plain => start + 3,
        Form::JsonEscaped => start + 5,
        // The trigger is ` //`.
        Form::Relative => start + 3,
    };
    let limit = (from + MAX_AUTHORITY).min(scan.text.len());
    let stop = (from..limit)
        .find(|&i| {
            scan.at(i)
                .is_some_and(|b| is_space(b) || matches!(b, b'"' | b'\'' | b'<' | b'>' | b'`'))
        })
        .unwrap_or(limit);
    let window = scan.bytes(from, stop);
    let Some(at) = memchr::memrchr(b'@', window).map(|n| from + n) else {
        let pathless = !window.contains(&b'/');
        if scan.cut(stop) && pathless {
            return Outcome::NeedMore(scheme);
        }
        return Outcome::Skip;
    };
    if scan.cut(stop) && !scan.bytes(at, stop).contains(&b'/') {
        // The host part is still arriving; an `@` later on would move the split.
        return Outcome::NeedMore(scheme);
    }
    let userinfo = scan.bytes(from, at);
    let Some(colon) = memchr::memchr(b':', userinfo).map(|n| from + n) else {
        if token_like(userinfo) && !userinfo.contains(&b'/') {
            scan.push(from, at, "url-credential");
            return Outcome::Consumed(at);
        }
        return Outcome::Skip;
    };
    if scan.bytes(from, colon).contains(&b'/') {
        return Outcome::Skip;
    }
    let password = scan.bytes(colon + 1, at);
    if let Some(slash) = memchr::memchr(b'/', password) {
        // `host:8080/path/@x` is a port and a path, not a password.
        let port = password.get(..slash).unwrap_or_default();
        if !port.is_empty() && port.iter().all(u8::is_ascii_digit) {
            return Outcome::Skip;
        }
    }
    if placeholder(password) || documented(password) {
        return Outcome::Consumed(at);
    }
    scan.push(colon + 1, at, "password");
    Outcome::Consumed(at)
}

/// A value that looks generated rather than chosen: long, and not a plain word.
pub(super) fn token_like(value: &[u8]) -> bool {
    value.len() >= 20
        && value.iter().all(|&b| is_token(b) || b == b'.')
        && value.iter().any(u8::is_ascii_digit)
        && value.iter().any(u8::is_ascii_alphabetic)
}

/// A password slot in documentation: `USER:PASSWORD@HOST`, `user:password@host`, `:pass@`.
fn documented(password: &[u8]) -> bool {
    const WORDS: &[&[u8]] = &[
        b"password",
        b"passwd",
        b"pass",
        b"pw",
        b"pwd",
        b"secret",
        b"token",
        b"changeme",
    ];
    WORDS.iter().any(|w| password.eq_ignore_ascii_case(w))
        || (password.len() >= 2
            && password
                .iter()
                .all(|&b| b.is_ascii_uppercase() || b == b'_'))
}

/// A URL percent-encoded whole (`https%3A%2F%2Fuser%3Apw%40host`, a redirect parameter): the
/// password between the encoded `:` and `@` of its userinfo.
pub(super) fn encoded_userinfo(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    let limit = (end + MAX_AUTHORITY).min(scan.text.len());
    let stop = (end..limit)
        .find(|&i| {
            scan.at(i).is_some_and(|b| {
                is_space(b) || matches!(b, b'"' | b'\'' | b'<' | b'>' | b'&' | b'`')
            })
        })
        .unwrap_or(limit);
    if scan.cut(stop) {
        return Outcome::NeedMore(start);
    }
    let window = scan.bytes(end, stop).to_ascii_uppercase();
    let authority =
        find(&window, b"%2F").map_or(window.as_slice(), |n| window.get(..n).unwrap_or_default());
    let Some(at) = find(authority, b"%40") else {
        return Outcome::Skip;
    };
    let Some(colon) = find(authority.get(..at).unwrap_or_default(), b"%3A") else {
        return Outcome::Skip;
    };
    let (from, to) = (end + colon + 3, end + at);
    let password = scan.bytes(from, to);
    if placeholder(password) || documented(password) {
        return Outcome::Consumed(to);
    }
    scan.push(from, to, "password");
    Outcome::Consumed(to)
}
