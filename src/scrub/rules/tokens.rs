//! Provider tokens by prefix, and JWTs.

use super::value::*;
use super::*;

pub(super) fn prefix_token(scan: &mut Scan<'_>, start: usize, spec: &Prefix) -> Outcome {
    if scan
        .before(start)
        .is_some_and(|b| b.is_ascii_alphanumeric())
    {
        return Outcome::Skip;
    }
    let body = start + spec.prefix.len();
    let mut end = scan.run(body, |b| spec.charset.contains(b));
    if scan.cut(end) {
        return Outcome::NeedMore(start);
    }
    // A dot ends a sentence, not a token.
    while end > body && scan.before(end) == Some(b'.') {
        end -= 1;
    }
    let len = end - body;
    if len < spec.min || (spec.exact && len != spec.min) {
        return Outcome::Skip;
    }
    if spec.exact && scan.at(end).is_some_and(is_token) {
        return Outcome::Skip;
    }
    if placeholder(scan.bytes(body, end)) {
        return Outcome::Skip;
    }
    let kind = if spec.prefix == "sk-" && scan.bytes(body, end).starts_with(b"ant-") {
        "anthropic-key"
    } else {
        spec.kind
    };
    scan.push(start, end, kind);
    if kind == "aws-access-key-id" {
        return aws_secret_after(scan, end);
    }
    Outcome::Consumed(end)
}

/// An access key id followed by its secret (`AKIA…,SECRET` in the credentials CSVs, `AKIA…
/// SECRET` or `AKIA…:SECRET` in pasted pairs): the 40-character secret goes too.
fn aws_secret_after(scan: &mut Scan<'_>, end: usize) -> Outcome {
    if !matches!(scan.at(end), Some(b',' | b' ' | b'\t' | b':')) {
        return Outcome::Consumed(end);
    }
    let from = end + 1;
    let to = scan.run(from, |b| {
        b.is_ascii_alphanumeric() || b == b'/' || b == b'+'
    });
    if scan.cut(to) {
        return Outcome::NeedMore(end);
    }
    if to - from == 40 && generated(scan.bytes(from, to)) {
        scan.push(from, to, "aws-secret-key");
        return Outcome::Consumed(to);
    }
    Outcome::Consumed(end)
}

pub(super) fn jwt(scan: &mut Scan<'_>, start: usize) -> Outcome {
    if scan.before(start).is_some_and(is_token) {
        return Outcome::Skip;
    }
    let header_end = scan.run(start, is_token);
    if scan.cut(header_end) {
        return Outcome::NeedMore(start);
    }
    if header_end - start < 10 || scan.at(header_end) != Some(b'.') {
        return Outcome::Skip;
    }
    let payload = header_end + 1;
    let payload_end = scan.run(payload, is_token);
    if scan.cut(payload_end) {
        return Outcome::NeedMore(start);
    }
    if payload_end - payload < 10 || !scan.bytes(payload, payload_end).starts_with(b"eyJ") {
        return Outcome::Skip;
    }
    let mut end = payload_end;
    if scan.at(end) == Some(b'.') {
        end = scan.run(end + 1, is_token);
        if scan.cut(end) {
            return Outcome::NeedMore(start);
        }
    }
    scan.push(start, end, "jwt");
    Outcome::Consumed(end)
}
