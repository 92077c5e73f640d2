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

/// How much a secret-sounding name says about its value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Strength {
    /// The value is secret (unless a placeholder or otherwise benign).
    Strong,
    /// Alone as the whole name (`KEY=`, `pass:`), the value must look generated.
    WeakAlone,
    /// Wherever it stands (`auth`, `REDISCLI_AUTH`), the value must look generated.
    Generated,
}

/// Name segments that make an assignment's value secret, by the kind they report.
fn secret_word(segment: &[u8]) -> Option<(&'static str, Strength)> {
    let mut lower = [0u8; 24];
    let word = lower.get_mut(..segment.len())?;
    word.copy_from_slice(segment);
    word.make_ascii_lowercase();
    let word: &[u8] = word;
    Some(match word {
        b"token" | b"authtoken" | b"accesstoken" | b"refreshtoken" | b"sessiontoken"
        | b"idtoken" | b"apitoken" | b"pat" => ("token", Strength::Strong),
        b"secret" | b"clientsecret" | b"secretkey" | b"secretaccesskey" => {
            ("secret", Strength::Strong)
        }
        b"password" | b"passwd" | b"passphrase" => ("password", Strength::Strong),
        b"pass" | b"pwd" => ("password", Strength::WeakAlone),
        b"key" => ("key", Strength::WeakAlone),
        b"apikey" | b"accesskey" | b"privatekey" | b"accountkey" | b"sharedaccesskey"
        | b"masterkey" | b"signingkey" | b"encryptionkey" => ("key", Strength::Strong),
        b"credential" | b"credentials" | b"creds" => ("credential", Strength::WeakAlone),
        b"auth" => ("credential", Strength::Generated),
        _ => {
            // Joined names: `PGPASSWORD`, `identitytoken`, `clientsecret`.
            for (suffix, kind, strength) in [
                (&b"password"[..], "password", Strength::Strong),
                (b"passwd", "password", Strength::Strong),
                (b"token", "token", Strength::Generated),
                (b"secret", "secret", Strength::Generated),
            ] {
                if word.len() > suffix.len() && word.ends_with(suffix) {
                    return Some((kind, strength));
                }
            }
            return None;
        }
    })
}

/// Last name segments that say the value is about a secret, not the secret itself
/// (`TOKEN_URL`, `PASSWORD_FILE`, `token_type`, `SECRET_NAME`, `PASSWORD_MIN_LENGTH`).
const DESCRIPTORS: &[&[u8]] = &[
    b"url",
    b"uri",
    b"urls",
    b"endpoint",
    b"file",
    b"files",
    b"path",
    b"dir",
    b"name",
    b"names",
    b"id",
    b"ids",
    b"type",
    b"kind",
    b"len",
    b"length",
    b"size",
    b"enabled",
    b"disabled",
    b"required",
    b"count",
    b"env",
    b"ttl",
    b"timeout",
    b"expiry",
    b"expires",
    b"expiration",
    b"at",
    b"version",
    b"format",
    b"alg",
    b"algorithm",
    b"field",
    b"header",
    b"param",
    b"prefix",
    b"suffix",
    b"hint",
    b"policy",
    b"mode",
    b"min",
    b"max",
    b"limit",
    b"limits",
    b"budget",
    b"cost",
    b"rotation",
    b"ref",
    b"source",
    b"store",
    b"provider",
    b"backend",
    b"method",
    b"scope",
    b"scopes",
    b"location",
    b"host",
    b"port",
    b"user",
    b"username",
    b"login",
    b"email",
    b"set",
    b"check",
    b"command",
    b"cmd",
    b"helper",
    b"program",
    b"pattern",
    b"regex",
    b"label",
    b"description",
    b"usage",
    b"help",
];

/// Segments that, before `key`, make it a routing name (AMQP `routing_key`, `binding_key`).
const NAME_KEYS: &[&[u8]] = &[b"routing", b"binding"];

/// Most segments of a name looked at.
const MAX_SEGMENTS: usize = 16;

/// The segments of a name, split at `_`, `.`, `-` and lower-to-upper camelCase steps (at most
/// [`MAX_SEGMENTS`], the last ones kept): `(segments, count)`, without allocating.
fn segments<'a>(name: &'a [u8]) -> ([&'a [u8]; MAX_SEGMENTS], usize) {
    let mut out: [&'a [u8]; MAX_SEGMENTS] = [&[]; MAX_SEGMENTS];
    let mut count = 0;
    let mut push = |segment: &'a [u8]| {
        if !segment.is_empty() && !matches!(segment, [b'_' | b'.' | b'-']) {
            if count == MAX_SEGMENTS {
                out.rotate_left(1);
                count -= 1;
            }
            if let Some(slot) = out.get_mut(count) {
                *slot = segment;
            }
            count += 1;
        }
    };
    let mut start = 0;
    for (i, pair) in name.windows(2).enumerate() {
        if let [a, b] = *pair {
            if matches!(b, b'_' | b'.' | b'-') {
                push(name.get(start..=i).unwrap_or_default());
                start = i + 2;
            } else if a.is_ascii_lowercase() && b.is_ascii_uppercase() {
                push(name.get(start..=i).unwrap_or_default());
                start = i + 1;
            }
        }
    }
    push(name.get(start..).unwrap_or_default());
    (out, count)
}

/// What a name says about its value: the secret word of its last segment, or a strong secret
/// word (or pair: `API_KEY`) earlier on when the last segment is not a descriptor
/// (`SECRET_KEY_BASE`, `DB_PASSWORD_PROD`, `API_KEY_V2` — the value must then look generated).
fn name_kind(name: &[u8]) -> Option<(&'static str, Strength, usize)> {
    let separator = |b: &u8| matches!(b, b'_' | b'.' | b'-');
    let from = name
        .iter()
        .position(|b| !separator(b))
        .unwrap_or(name.len());
    let (all, count) = segments(name.get(from..).unwrap_or_default());
    let parts = all.get(..count).unwrap_or_default();
    let last = parts.last()?;
    // AMQP's routing and binding keys are names, not credentials (`routing_key='ctl.h1'` in a
    // broker script); a credential-shaped value in one is still found by its shape.
    if let [.., qualifier, last] = parts
        && last.eq_ignore_ascii_case(b"key")
        && NAME_KEYS.iter().any(|q| qualifier.eq_ignore_ascii_case(q))
    {
        return None;
    }
    if let Some((kind, strength)) = secret_word(last) {
        return Some((kind, strength, parts.len()));
    }
    if DESCRIPTORS.iter().any(|d| last.eq_ignore_ascii_case(d)) {
        return None;
    }
    let strong =
        |word: &[u8]| secret_word(word).filter(|(_, strength)| *strength == Strength::Strong);
    for (i, part) in parts.iter().enumerate().rev().skip(1) {
        if let Some((kind, _)) = strong(part) {
            return Some((kind, Strength::Generated, parts.len()));
        }
        if let Some(next) = parts.get(i + 1) {
            let mut pair = [0u8; 24];
            let joined = part.len() + next.len();
            if let Some(slot) = pair.get_mut(..joined) {
                let (head, tail) = slot.split_at_mut(part.len());
                head.copy_from_slice(part);
                tail.copy_from_slice(next);
                if let Some((kind, _)) = strong(slot) {
                    return Some((kind, Strength::Generated, parts.len()));
                }
            }
        }
    }
    None
}

/// Longest variable name examined around a trigger.
const MAX_NAME: usize = 128;

pub(super) fn assignment(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    // `auth` is also where `Authorization` starts: that header has its own rule.
    if scan
        .bytes(start, start + 13)
        .eq_ignore_ascii_case(b"authorization")
    {
        return super::header::authorization(scan, start, start + 13);
    }
    // `auth` in a longer word (`Author:`, `authenticate`) is not a name of its own; `authtoken`
    // is found by its `token`.
    if end - start == 4
        && scan.bytes(start, end).eq_ignore_ascii_case(b"auth")
        && scan.at(end).is_some_and(|b| b.is_ascii_lowercase())
    {
        return Outcome::Skip;
    }
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
    let flag = name.starts_with(b"--");
    let name = name.strip_prefix(b"--").unwrap_or(name);
    let name = name.trim_ascii_end();
    let Some((kind, strength, segments)) = name_kind(name) else {
        return Outcome::Skip;
    };
    if segments == 1 && name.eq_ignore_ascii_case(b"pwd") {
        return Outcome::Skip; // `PWD`: the working directory
    }
    if segments == 1 && kind == "credential" && scan.at(name_end) == Some(b':') {
        return Outcome::Skip; // `credential:NAME`: a reference to a secret, not a secret
    }
    let netrc = name.eq_ignore_ascii_case(b"password") && netrc_line(scan, name_start);
    // `--password VALUE`, `--token VALUE` on a command line.
    let spaced_flag = flag && strength == Strength::Strong;
    let Some(value_at) = separator(scan, name_end, netrc || spaced_flag) else {
        if scan.cut(scan.run(name_end, |b| matches!(b, b' ' | b'\t' | b'"' | b'\''))) {
            return Outcome::NeedMore(name_start);
        }
        return Outcome::Skip;
    };
    if spaced_flag && scan.at(value_at) == Some(b'-') {
        return Outcome::Skip; // another flag follows: the password is asked for
    }
    if spaced_flag
        && scan.at(value_at).is_some_and(|b| b.is_ascii_uppercase())
        && scan
            .bytes(value_at, scan.run(value_at, |b| !is_space(b)))
            .iter()
            .all(|b| b.is_ascii_uppercase() || *b == b'_')
    {
        return Outcome::Skip; // usage text: `--password PASSWORD`
    }
    let Some((from, to, resume)) = value(scan, value_at) else {
        return Outcome::NeedMore(name_start);
    };
    let secret = scan.bytes(from, to);
    let needs_generated = match strength {
        Strength::Strong => false,
        Strength::WeakAlone => segments == 1,
        Strength::Generated => true,
    };
    if benign_value(secret, kind)
        || (needs_generated && !generated(secret))
        || code_or_prose(scan, name_end, value_at, from, to)
    {
        return Outcome::Consumed(resume);
    }
    scan.push(from, to, kind);
    Outcome::Consumed(resume)
}

/// A bare value after `name: ` or `name = ` that is program text or a sentence, not a secret:
/// a type (`token: Option<String>,`, `pub token: SecretString,`), an expression
/// (`password = getpass()`, `key = os.environ["KEY"]`, `token = self.token`) or prose
/// (`Password: must be at least 12 characters`). The tight `NAME=value` of env files and quoted
/// values are never excused.
fn code_or_prose(
    scan: &Scan<'_>,
    name_end: usize,
    value_at: usize,
    from: usize,
    to: usize,
) -> bool {
    if from != value_at || to == from {
        return false; // quoted
    }
    let between = scan.bytes(name_end, value_at);
    let spaced = between.contains(&b' ') || between.contains(&b'\t');
    let colon = between.contains(&b':');
    if !spaced && !colon {
        return false; // NAME=value
    }
    let value = scan.bytes(from, to);
    let next = scan.at(to);
    let ident = |v: &[u8]| {
        v.first()
            .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
            && v.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
    };
    // A call or an index: `getpass(`, `os.environ[`.
    if matches!(next, Some(b'(' | b'[')) || value.ends_with(b"(") || value.ends_with(b"[") {
        let head = value
            .strip_suffix(b"(")
            .or_else(|| value.strip_suffix(b"["))
            .unwrap_or(value);
        if head.split(|&b| b == b'.').all(ident) {
            return true;
        }
    }
    // Member access: `self.token`, `args.password`, `cfg.api_key`.
    if value.contains(&b'.')
        && value.split(|&b| b == b'.').all(ident)
        && !value.iter().any(u8::is_ascii_digit)
    {
        return true;
    }
    // A type: `SecretString,`, `Option<String>`, `String;`, `str)`.
    const TYPES: &[&[u8]] = &[
        b"String",
        b"str",
        b"string",
        b"number",
        b"bool",
        b"boolean",
        b"Option",
        b"Vec",
        b"SecretString",
        b"SecretBox",
        b"Secret",
        b"bytes",
        b"Bytes",
        b"any",
        b"unknown",
        b"object",
        b"int",
        b"Uuid",
        b"PathBuf",
        b"Path",
    ];
    if colon && ident(value) && !value.iter().any(u8::is_ascii_digit) {
        let typed_next = matches!(
            next,
            Some(b'<' | b',' | b';' | b')' | b'>' | b'|' | b'&' | b'?')
        );
        let camel = value.first().is_some_and(u8::is_ascii_uppercase);
        if TYPES.contains(&value) || (camel && typed_next) {
            return true;
        }
    }
    // Prose: a lowercase word followed by more words.
    if value.iter().all(u8::is_ascii_lowercase)
        && next == Some(b' ')
        && scan.at(to + 1).is_some_and(|b| b.is_ascii_lowercase())
    {
        return true;
    }
    false
}

/// `.netrc` lines put `password` and its value apart with a space: `machine h login u password p`.
fn netrc_line(scan: &Scan<'_>, name_start: usize) -> bool {
    let before = scan.bytes(scan.line_start(name_start), name_start);
    let before = before.trim_ascii();
    before.is_empty() || find(before, b"login ").is_some() || find(before, b"machine ").is_some()
}
