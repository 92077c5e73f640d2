//! Reading values: separators, quoted and bare values, placeholders and benign values.

use super::*;

/// Text an example or template puts where a secret would go.
pub(super) fn placeholder(value: &[u8]) -> bool {
    let trimmed: &[u8] = value;
    if trimmed.is_empty() {
        return true;
    }
    // Already redacted or masked: `[redacted:…]`, `[REDACTED]`, `[hidden]`.
    if trimmed.starts_with(b"[")
        && trimmed.len() <= 40
        && trimmed
            .iter()
            .skip(1)
            .take_while(|&&b| b != b']')
            .all(|&b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'_' | b':' | b' '))
    {
        return true;
    }
    if trimmed.starts_with(b"${")
        || trimmed.starts_with(b"{{")
        || trimmed.starts_with(b"%(")
        || (trimmed.starts_with(b"<") && trimmed.ends_with(b">"))
    {
        return true;
    }
    // A shell variable: `$GITHUB_TOKEN`, `$token` — one case, as names are written. A mixed-case
    // value after `$` (`$ecretP4ss`) is a password that starts with a dollar sign.
    if let Some(name) = trimmed.strip_prefix(b"$")
        && name
            .first()
            .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        && (name
            .iter()
            .all(|&b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            || name
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
    {
        return true;
    }
    // Elided: `ghp_...`, `sk-proj-…`.
    if trimmed.ends_with("…".as_bytes())
        || (memchr::memchr(b'.', trimmed).is_some() && trimmed.windows(3).any(|w| w == b"..."))
    {
        return true;
    }
    let words = [
        &b"null"[..],
        b"none",
        b"nil",
        b"true",
        b"false",
        b"undefined",
        b"redacted",
        b"\"\"",
    ];
    if words.iter().any(|w| trimmed.eq_ignore_ascii_case(w)) {
        return true;
    }
    for reference in [&b"credential:"[..], b"keyring:", b"env:", b"file:"] {
        if trimmed
            .get(..reference.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(reference))
        {
            return true;
        }
    }
    template_words(trimmed) || low_variety(trimmed)
}

/// Words that mark a value as an example to fill in.
const TEMPLATE_WORDS: &[&[u8]] = &[
    b"your",
    b"my",
    b"here",
    b"example",
    b"placeholder",
    b"changeme",
    b"replace",
    b"insert",
    b"dummy",
    b"sample",
    b"fake",
    b"redacted",
    b"xxx",
    b"todo",
];

/// `your-api-key-here`, `xoxb-your-bot-token`'s body, `YOUR_TOKEN`, `changeme`: letters only, in
/// one case, words split by `-`, `_` or `.`, one of them a template word.
fn template_words(value: &[u8]) -> bool {
    let letters = || {
        value
            .iter()
            .all(|&b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'_' | b'.'))
    };
    let one_case =
        || !value.iter().any(u8::is_ascii_lowercase) || !value.iter().any(u8::is_ascii_uppercase);
    letters()
        && one_case()
        && value
            .split(|&b| matches!(b, b'-' | b'_' | b'.'))
            .any(|word| TEMPLATE_WORDS.iter().any(|t| word.eq_ignore_ascii_case(t)))
}

/// True for `xxxx…`, `****`, `0000…`: at most three distinct bytes, or mostly one run of a filler
/// (`x`, `*`, `0`, `#`, `.`, `-`, `_`) six or more long.
pub(super) fn low_variety(value: &[u8]) -> bool {
    let mut seen = [0u64; 4];
    let mut run = 0;
    let mut longest = 0;
    let mut last = None;
    for &b in value {
        if let Some(word) = seen.get_mut(usize::from(b >> 6)) {
            *word |= 1 << (b & 63);
        }
        run = if last == Some(b) { run + 1 } else { 1 };
        last = Some(b);
        if run >= 6 && matches!(b, b'x' | b'X' | b'*' | b'0' | b'#' | b'.' | b'-' | b'_') {
            longest = longest.max(run);
        }
    }
    seen.iter().map(|w| w.count_ones()).sum::<u32>() <= 3
        || (longest >= 6 && longest * 2 >= value.len())
}

/// Skips `"`/`'` (or their backslash-escaped forms), spaces, one separator and more spaces;
/// returns the index after them, or `None` when no separator follows.
pub(super) fn separator(scan: &Scan<'_>, mut i: usize, allow_space_only: bool) -> Option<usize> {
    let mut quoted = false;
    loop {
        match scan.at(i) {
            Some(b'"' | b'\'') if !quoted => {
                quoted = true;
                i += 1;
            }
            Some(b'\\') if !quoted && matches!(scan.at(i + 1), Some(b'"' | b'\'')) => {
                quoted = true;
                i += 2;
            }
            _ => break,
        }
    }
    let spaced = scan.run(i, |b| b == b' ' || b == b'\t');
    let had_space = spaced > i;
    i = spaced;
    match scan.at(i) {
        Some(b'=') if scan.at(i + 1) != Some(b'=') => {
            i += if scan.at(i + 1) == Some(b'>') { 2 } else { 1 }
        }
        Some(b':') if scan.at(i + 1) == Some(b'=') => i += 2,
        Some(b':') if scan.at(i + 1) != Some(b':') => i += 1,
        _ if allow_space_only && had_space && !quoted => return Some(i),
        _ => return None,
    }
    Some(scan.run(i, |b| b == b' ' || b == b'\t'))
}

/// The value starting at `i`: quoted (to the matching quote) or bare (to a delimiter).
/// Returns `(value_start, value_end, resume)`, or `None` when the value runs into open text.
pub(super) fn value(scan: &Scan<'_>, i: usize) -> Option<(usize, usize, usize)> {
    let line_end = scan.line_end(i);
    let (quote, start) = match (scan.at(i), scan.at(i + 1)) {
        (Some(b'\\'), Some(q @ (b'"' | b'\''))) => (Some((true, q)), i + 2),
        (Some(q @ (b'"' | b'\'' | b'`')), _) => (Some((false, q)), i + 1),
        _ => (None, i),
    };
    let Some((escaped, q)) = quote else {
        let end = scan.run(start, |b| {
            !is_space(b)
                && !matches!(
                    b,
                    b'&' | b'"' | b'\'' | b';' | b',' | b'}' | b']' | b')' | b'<' | b'>' | b'`'
                )
        });
        if scan.cut(end) {
            return None;
        }
        return Some((start, end, end));
    };
    let mut j = start;
    while j < line_end {
        match scan.at(j) {
            Some(b'\\') if escaped && scan.at(j + 1) == Some(q) => return Some((start, j, j + 2)),
            Some(b'\\') if !escaped && q == b'"' => j += 2,
            Some(b) if b == q && !escaped => return Some((start, j, j + 1)),
            _ => j += 1,
        }
    }
    if scan.cut(line_end) {
        return None;
    }
    // No closing quote on this line: everything to the line end is the value (fail closed).
    let end = if scan.at(line_end.wrapping_sub(1)) == Some(b'\r') {
        line_end - 1
    } else {
        line_end
    };
    Some((start, end.max(start), line_end))
}

pub(super) fn trim_end(scan: &Scan<'_>, from: usize, mut to: usize) -> usize {
    while to > from && scan.before(to).is_some_and(is_space) {
        to -= 1;
    }
    to
}

/// Values that are not secrets even under a secret-sounding name of `kind`.
pub(super) fn benign_value(value: &[u8], kind: &str) -> bool {
    if placeholder(value) {
        return true;
    }
    // Public keys are not secrets: fleetd's pins (`ed25519:`) and OpenSSH public keys.
    if [
        &b"ed25519:"[..],
        b"ssh-ed25519 ",
        b"ssh-rsa ",
        b"ecdsa-sha2-",
        b"sk-ssh-",
    ]
    .iter()
    .any(|p| value.starts_with(p))
    {
        return true;
    }
    if path_like(value) && (kind == "key" || value.starts_with(b"/")) {
        // A path, e.g. `SSH_KEY=/home/u/.ssh/id_ed25519`; under a password, token or secret
        // only an absolute one (`PASSWORD=~/x` is a password that starts with a tilde).
        return true;
    }
    value.len() <= 4 && value.iter().all(u8::is_ascii_digit)
}

/// A file path under a well-known root, or relative to home or here. Base64 can start with `/`,
/// so a bare leading slash is not enough.
pub(super) fn path_like(value: &[u8]) -> bool {
    const ROOTS: &[&[u8]] = &[
        b"home", b"run", b"etc", b"var", b"tmp", b"usr", b"opt", b"srv", b"mnt", b"root", b"Users",
        b"nix", b"proc", b"dev",
    ];
    if value.starts_with(b"~/") || value.starts_with(b"./") {
        return true;
    }
    let Some(rest) = value.strip_prefix(b"/") else {
        return false;
    };
    let first = rest.split(|&b| b == b'/').next().unwrap_or_default();
    rest.contains(&b'/') && ROOTS.contains(&first)
}

/// A value that looks generated: eight or more bytes, not a plain lowercase word.
pub(super) fn generated(value: &[u8]) -> bool {
    value.len() >= 8 && value.iter().any(|&b| !b.is_ascii_lowercase())
}
