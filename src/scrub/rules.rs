//! Credential shapes: the trigger strings the search looks for, and one validator per shape that
//! decides, from the text around a trigger, exactly which bytes are secret.
//!
//! Every validator stops at a newline (PEM blocks carry [`PemState`] across lines instead), looks
//! at a bounded window, and in open mode (the text may continue) asks for more input rather than
//! judge a candidate that touches the end.

/// A byte range of the view to replace by `[redacted:KIND]`; an empty kind deletes the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) kind: &'static str,
}

/// What a validator decided about one trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Spans were pushed (or none were needed); resume searching at this index.
    Consumed(usize),
    /// Not a credential: resume one byte after the trigger's start.
    Skip,
    /// The candidate starting here touches the end of open text: hold it back.
    NeedMore(usize),
}

/// Multi-line private-key state carried from one line (and one block) to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum PemState {
    /// Not inside a key block.
    #[default]
    Off,
    /// Inside an armoured block; `marked` once the marker was written.
    Armored { marked: bool },
    /// Inside base64-wrapped armour (`LS0tLS1CRUdJTi…` split over lines).
    Base64,
}

/// The text being scanned and where the scan collects its decisions.
pub(super) struct Scan<'a> {
    pub(super) text: &'a [u8],
    /// The text may continue past its end (idle flush, forced cut).
    pub(super) open: bool,
    pub(super) spans: Vec<Span>,
    pub(super) pem: PemState,
}

/// Which validator a trigger string calls.
#[derive(Clone, Copy, Debug)]
pub(super) enum Rule {
    Prefix(&'static Prefix),
    Jwt,
    Url,
    Authorization,
    Bearer,
    CurlUser,
    PemBegin,
    PemBase64,
    Assignment,
    QuerySignature,
    WebhookPath,
}

/// A provider token recognised by its prefix.
#[derive(Debug)]
pub(super) struct Prefix {
    pub(super) prefix: &'static str,
    kind: &'static str,
    charset: Charset,
    /// Fewest body bytes after the prefix.
    min: usize,
    /// The body must be exactly `min` bytes long (fixed-length ids).
    exact: bool,
}

#[derive(Clone, Copy, Debug)]
enum Charset {
    Alnum,
    Token,
    TokenDot,
    UpperDigit,
    LowerHex,
}

impl Charset {
    /// The class as a regular expression (for the benchmark's naive baseline).
    fn regex(self) -> &'static str {
        match self {
            Charset::Alnum => "[A-Za-z0-9]",
            Charset::Token => "[A-Za-z0-9_-]",
            Charset::TokenDot => "[A-Za-z0-9_.-]",
            Charset::UpperDigit => "[A-Z0-9]",
            Charset::LowerHex => "[0-9a-f]",
        }
    }

    fn contains(self, b: u8) -> bool {
        match self {
            Charset::Alnum => b.is_ascii_alphanumeric(),
            Charset::Token => is_token(b),
            Charset::TokenDot => is_token(b) || b == b'.',
            Charset::UpperDigit => b.is_ascii_uppercase() || b.is_ascii_digit(),
            Charset::LowerHex => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        }
    }
}

const fn p(prefix: &'static str, kind: &'static str, charset: Charset, min: usize) -> Prefix {
    Prefix {
        prefix,
        kind,
        charset,
        min,
        exact: false,
    }
}

const fn fixed(prefix: &'static str, kind: &'static str, charset: Charset, len: usize) -> Prefix {
    Prefix {
        prefix,
        kind,
        charset,
        min: len,
        exact: true,
    }
}

use Charset::{Alnum, LowerHex, Token, TokenDot, UpperDigit};

/// Provider tokens with distinctive prefixes. `sk-` covers OpenAI and Anthropic (`sk-ant-`).
pub(super) static PREFIXES: &[Prefix] = &[
    p("ghp_", "github-token", Alnum, 30),
    p("gho_", "github-token", Alnum, 30),
    p("ghu_", "github-token", Alnum, 30),
    p("ghs_", "github-token", Alnum, 30),
    p("ghr_", "github-token", Alnum, 30),
    p("github_pat_", "github-token", Token, 40),
    p("glpat-", "gitlab-token", Token, 20),
    p("glptt-", "gitlab-token", Token, 20),
    p("gldt-", "gitlab-token", Token, 20),
    p("glrt-", "gitlab-token", Token, 20),
    p("glcbt-", "gitlab-token", Token, 20),
    p("glft-", "gitlab-token", Token, 20),
    p("glsoat-", "gitlab-token", Token, 20),
    p("glagent-", "gitlab-token", Token, 20),
    p("gloas-", "gitlab-token", Token, 20),
    p("sk-", "openai-key", Token, 20),
    fixed("AKIA", "aws-access-key-id", UpperDigit, 16),
    fixed("ASIA", "aws-access-key-id", UpperDigit, 16),
    fixed("ABIA", "aws-access-key-id", UpperDigit, 16),
    fixed("ACCA", "aws-access-key-id", UpperDigit, 16),
    p("xoxb-", "slack-token", Token, 10),
    p("xoxp-", "slack-token", Token, 10),
    p("xoxa-", "slack-token", Token, 10),
    p("xoxr-", "slack-token", Token, 10),
    p("xoxs-", "slack-token", Token, 10),
    p("xoxe-", "slack-token", Token, 10),
    p("xapp-", "slack-token", Token, 10),
    p("sk_live_", "stripe-key", Alnum, 16),
    p("sk_test_", "stripe-key", Alnum, 16),
    p("rk_live_", "stripe-key", Alnum, 16),
    p("rk_test_", "stripe-key", Alnum, 16),
    p("whsec_", "stripe-key", Alnum, 24),
    p("AIza", "google-api-key", Token, 30),
    p("ya29.", "google-oauth-token", TokenDot, 20),
    p("GOCSPX-", "google-client-secret", Token, 20),
    p("npm_", "npm-token", Alnum, 36),
    p("pypi-AgE", "pypi-token", Token, 50),
    p("dckr_pat_", "docker-token", Token, 20),
    p("dckr_oat_", "docker-token", Token, 20),
    fixed("cio", "crates-io-token", Alnum, 32),
    p("hf_", "huggingface-token", Alnum, 30),
    p("api_org_", "huggingface-token", Alnum, 30),
    p("hvs.", "vault-token", Token, 24),
    p("hvb.", "vault-token", Token, 24),
    p("hvr.", "vault-token", Token, 24),
    p("SG.", "sendgrid-key", TokenDot, 60),
    p("shpat_", "shopify-token", LowerHex, 32),
    p("shpss_", "shopify-token", LowerHex, 32),
    p("shpca_", "shopify-token", LowerHex, 32),
    p("shppa_", "shopify-token", LowerHex, 32),
    p("AGE-SECRET-KEY-1", "age-secret-key", UpperDigit, 50),
    p("xai-", "xai-key", Alnum, 40),
    p("gsk_", "groq-key", Alnum, 40),
    p("r8_", "replicate-token", Alnum, 30),
    p("lin_api_", "linear-key", Alnum, 30),
    p("dop_v1_", "digitalocean-token", LowerHex, 64),
    p("doo_v1_", "digitalocean-token", LowerHex, 64),
    p("tskey-", "tailscale-key", Token, 20),
    p("sq0atp-", "square-token", Token, 20),
    p("sq0csp-", "square-token", Token, 20),
    p("glc_", "grafana-token", Token, 30),
    p("ATATT3", "atlassian-token", Token, 50),
];

/// Trigger strings that are not provider prefixes, and the rule each calls.
pub(super) static OTHER_TRIGGERS: &[(&str, Rule)] = &[
    ("eyJ", Rule::Jwt),
    ("://", Rule::Url),
    ("authorization", Rule::Authorization),
    ("Authorization", Rule::Authorization),
    ("AUTHORIZATION", Rule::Authorization),
    ("Bearer ", Rule::Bearer),
    ("bearer ", Rule::Bearer),
    ("-u ", Rule::CurlUser),
    ("--user", Rule::CurlUser),
    ("-----BEGIN ", Rule::PemBegin),
    // `-----BEGIN ` in base64 at its three alignments (k8s secrets, `base64 key.pem`).
    ("LS0tLS1CRUdJ", Rule::PemBase64),
    ("0tLS0tQkVHSU4g", Rule::PemBase64),
    ("tLS0tLUJFR0lO", Rule::PemBase64),
    ("sig=", Rule::QuerySignature),
    ("Signature=", Rule::QuerySignature),
    ("signature=", Rule::QuerySignature),
    ("hooks.slack.com/services/", Rule::WebhookPath),
    ("discord.com/api/webhooks/", Rule::WebhookPath),
    // Secret-sounding names in three casings (camelCase names end in the Title form).
    ("token", Rule::Assignment),
    ("TOKEN", Rule::Assignment),
    ("Token", Rule::Assignment),
    ("secret", Rule::Assignment),
    ("SECRET", Rule::Assignment),
    ("Secret", Rule::Assignment),
    ("pass", Rule::Assignment),
    ("PASS", Rule::Assignment),
    ("Pass", Rule::Assignment),
    ("pwd", Rule::Assignment),
    ("PWD", Rule::Assignment),
    ("Pwd", Rule::Assignment),
    ("key", Rule::Assignment),
    ("KEY", Rule::Assignment),
    ("Key", Rule::Assignment),
    ("credential", Rule::Assignment),
    ("CREDENTIAL", Rule::Assignment),
    ("Credential", Rule::Assignment),
];

/// Runs the validator of `rule` for a trigger found at `start..end`.
pub(super) fn validate(rule: Rule, scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    match rule {
        Rule::Prefix(spec) => prefix_token(scan, start, spec),
        Rule::Jwt => jwt(scan, start),
        Rule::Url => url_userinfo(scan, start),
        Rule::Authorization => authorization(scan, start, end),
        Rule::Bearer => bearer(scan, start, end),
        Rule::CurlUser => curl_user(scan, start, end),
        Rule::PemBegin => pem_begin(scan, start, end),
        Rule::PemBase64 => pem_base64(scan, start),
        Rule::Assignment => assignment(scan, start, end),
        Rule::QuerySignature => query_signature(scan, start, end),
        Rule::WebhookPath => webhook_path(scan, end),
    }
}

// ---------------------------------------------------------------------------------------------
// Character classes and small scanners.

pub(super) fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

pub(super) fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_')
}

fn is_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

/// Whitespace that ends a value (space, tab, CR, LF, VT, FF).
pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c)
}

impl Scan<'_> {
    fn at(&self, i: usize) -> Option<u8> {
        self.text.get(i).copied()
    }

    fn before(&self, i: usize) -> Option<u8> {
        i.checked_sub(1).and_then(|j| self.at(j))
    }

    /// Index of the first byte at or after `i` that does not satisfy `keep`.
    fn run(&self, mut i: usize, keep: impl Fn(u8) -> bool) -> usize {
        while self.at(i).is_some_and(&keep) {
            i += 1;
        }
        i
    }

    /// Index of the end of the line containing `i` (its newline, or the end of text).
    pub(super) fn line_end(&self, i: usize) -> usize {
        let rest = self.text.get(i..).unwrap_or_default();
        memchr::memchr(b'\n', rest).map_or(self.text.len(), |n| i + n)
    }

    /// True when a run that stopped at `i` was cut by the end of open text.
    fn cut(&self, i: usize) -> bool {
        self.open && i >= self.text.len()
    }

    fn bytes(&self, start: usize, end: usize) -> &[u8] {
        self.text.get(start..end).unwrap_or_default()
    }

    fn push(&mut self, start: usize, end: usize, kind: &'static str) {
        if start < end {
            self.spans.push(Span { start, end, kind });
        }
    }
}

/// Text an example or template puts where a secret would go.
fn placeholder(value: &[u8]) -> bool {
    let trimmed: &[u8] = value;
    if trimmed.is_empty() || trimmed.starts_with(b"[redacted") {
        return true;
    }
    if trimmed.starts_with(b"${")
        || trimmed.starts_with(b"{{")
        || trimmed.starts_with(b"%(")
        || (trimmed.starts_with(b"<") && trimmed.ends_with(b">"))
    {
        return true;
    }
    if let Some(name) = trimmed.strip_prefix(b"$")
        && name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_')
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
    low_variety(trimmed)
}

/// True for `xxxx…`, `****`, `0000…` and values with a run of six identical bytes.
fn low_variety(value: &[u8]) -> bool {
    let mut seen = [0u64; 4];
    let mut run = 0;
    let mut last = None;
    for &b in value {
        if let Some(word) = seen.get_mut(usize::from(b >> 6)) {
            *word |= 1 << (b & 63);
        }
        run = if last == Some(b) { run + 1 } else { 1 };
        last = Some(b);
        if run >= 6 {
            return true;
        }
    }
    seen.iter().map(|w| w.count_ones()).sum::<u32>() <= 3
}

// ---------------------------------------------------------------------------------------------
// Validators.

fn prefix_token(scan: &mut Scan<'_>, start: usize, spec: &Prefix) -> Outcome {
    if scan
        .before(start)
        .is_some_and(|b| b.is_ascii_alphanumeric())
    {
        return Outcome::Skip;
    }
    let body = start + spec.prefix.len();
    let end = scan.run(body, |b| spec.charset.contains(b));
    if scan.cut(end) {
        return Outcome::NeedMore(start);
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
    Outcome::Consumed(end)
}

fn jwt(scan: &mut Scan<'_>, start: usize) -> Outcome {
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

/// Longest userinfo examined after `://`.
const MAX_AUTHORITY: usize = 512;

fn url_userinfo(scan: &mut Scan<'_>, start: usize) -> Outcome {
    let mut scheme = start;
    while scheme > 0
        && scan
            .before(scheme)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
        && start - scheme < 32
    {
        scheme -= 1;
    }
    if scheme == start {
        return Outcome::Skip;
    }
    let from = start + 3;
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
    if placeholder(password) {
        return Outcome::Consumed(at);
    }
    scan.push(colon + 1, at, "password");
    Outcome::Consumed(at)
}

/// A value that looks generated rather than chosen: long, and not a plain word.
fn token_like(value: &[u8]) -> bool {
    value.len() >= 20
        && value.iter().all(|&b| is_token(b) || b == b'.')
        && value.iter().any(u8::is_ascii_digit)
        && value.iter().any(u8::is_ascii_alphabetic)
}

/// Skips `"`/`'` (or their backslash-escaped forms), spaces, one separator and more spaces;
/// returns the index after them, or `None` when no separator follows.
fn separator(scan: &Scan<'_>, mut i: usize, allow_space_only: bool) -> Option<usize> {
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
fn value(scan: &Scan<'_>, i: usize) -> Option<(usize, usize, usize)> {
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

fn authorization(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
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

fn trim_end(scan: &Scan<'_>, from: usize, mut to: usize) -> usize {
    while to > from && scan.before(to).is_some_and(is_space) {
        to -= 1;
    }
    to
}

fn bearer(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
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

fn curl_user(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
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

fn pem_begin(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    let line_end = scan.line_end(start);
    let Some(close) = find(scan.bytes(end, line_end.min(end + 64)), b"-----").map(|n| end + n)
    else {
        return if scan.cut(line_end) {
            Outcome::NeedMore(start)
        } else {
            Outcome::Skip
        };
    };
    let label = scan.bytes(end, close);
    if !(label.ends_with(b"PRIVATE KEY") || label == b"PGP PRIVATE KEY BLOCK") {
        return Outcome::Skip;
    }
    let body = close + 5;
    let rest = scan.bytes(body, line_end);
    if rest.iter().all(|&b| is_space(b)) {
        if scan.cut(line_end) {
            return Outcome::NeedMore(start);
        }
        scan.pem = PemState::Armored { marked: false };
        return Outcome::Consumed(pem_lines(scan, line_end + 1));
    }
    // Armour on one line: JSON-escaped (`\n`) or otherwise flattened.
    if let Some(end_marker) = find(rest, b"-----END ").map(|n| body + n) {
        scan.push(body, end_marker, "private-key");
        return Outcome::Consumed(end_marker);
    }
    if scan.cut(line_end) {
        return Outcome::NeedMore(start);
    }
    let stop = (body..line_end)
        .find(|&k| scan.at(k) == Some(b'"') && scan.before(k) != Some(b'\\'))
        .unwrap_or(line_end);
    scan.push(body, trim_end(scan, body, stop), "private-key");
    Outcome::Consumed(stop)
}

/// Redacts key-block lines from `from` while [`PemState`] is on; returns where scanning resumes.
///
/// The first body line becomes the marker and later body lines are deleted, so the output is the
/// same whether the block arrives in one write or line by line.
pub(super) fn pem_lines(scan: &mut Scan<'_>, mut from: usize) -> usize {
    const MAX_LINE: usize = 4096;
    while from < scan.text.len() && scan.pem != PemState::Off {
        let line_end = scan.line_end(from);
        let line = scan.bytes(from, line_end);
        let ends_block = match scan.pem {
            PemState::Armored { .. } => {
                find(line, b"-----END ").is_some() || !armour_body(line) || line.len() > MAX_LINE
            }
            PemState::Base64 => {
                line.is_empty() || !line.iter().all(|&b| is_base64(b) || b == b'\r')
            }
            PemState::Off => true,
        };
        if ends_block {
            scan.pem = PemState::Off;
            return from;
        }
        let last_base64 = scan.pem == PemState::Base64 && line.contains(&b'=');
        match scan.pem {
            PemState::Armored { marked: false } => {
                scan.push(from, line_end, "private-key");
                scan.pem = PemState::Armored { marked: true };
            }
            _ => {
                let with_newline = (line_end + 1).min(scan.text.len());
                scan.spans.push(Span {
                    start: from,
                    end: with_newline,
                    kind: "",
                });
            }
        }
        if last_base64 {
            scan.pem = PemState::Off;
        }
        from = line_end + 1;
    }
    from.min(scan.text.len())
}

/// A line that can sit inside PEM armour: base64, blank, or an RFC 1421 header.
fn armour_body(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|&b| is_base64(b)) {
        return true;
    }
    let name_end = line.iter().position(|&b| b == b':').unwrap_or(0);
    name_end > 0
        && line
            .get(..name_end)
            .is_some_and(|n| n.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-'))
}

fn pem_base64(scan: &mut Scan<'_>, start: usize) -> Outcome {
    const MAX_DECODE: usize = 16 * 1024;
    let mut from = start;
    while scan.before(from).is_some_and(is_base64) {
        from -= 1;
    }
    let to = scan.run(start, is_base64);
    if scan.cut(to) {
        return Outcome::NeedMore(from);
    }
    let head: Vec<u8> = scan
        .bytes(from, to.min(from + MAX_DECODE))
        .iter()
        .copied()
        .filter(|&b| b != b'=')
        .collect();
    let usable = head.len() / 4 * 4;
    let decoded = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        head.get(..usable).unwrap_or_default(),
    )
    .unwrap_or_default();
    if find(&decoded, b"PRIVATE KEY").is_none() {
        return Outcome::Skip;
    }
    scan.push(from, to, "private-key");
    let line_end = scan.line_end(to);
    if to == line_end && line_end < scan.text.len() && to - from >= 60 {
        // Wrapped base64 (`base64` wraps at 76 columns): following base64 lines belong to it.
        scan.pem = PemState::Base64;
        return Outcome::Consumed(pem_lines(scan, line_end + 1));
    }
    Outcome::Consumed(to)
}

fn query_signature(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
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

fn webhook_path(scan: &mut Scan<'_>, end: usize) -> Outcome {
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

fn assignment(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
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

/// Values that are not secrets even under a secret-sounding name.
fn benign_value(value: &[u8]) -> bool {
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
    if path_like(value) {
        return true; // a path, e.g. `SSH_KEY=/home/u/.ssh/id_ed25519`
    }
    value.len() <= 4 && value.iter().all(u8::is_ascii_digit)
}

/// A file path under a well-known root, or relative to home or here. Base64 can start with `/`,
/// so a bare leading slash is not enough.
fn path_like(value: &[u8]) -> bool {
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
fn generated(value: &[u8]) -> bool {
    value.len() >= 8 && value.iter().any(|&b| !b.is_ascii_lowercase())
}

/// Position of `needle` in `haystack`.
pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// One regular expression per trigger, as a naive scrubber would write them; the benchmark
/// applies them one after another as its baseline.
pub(super) fn naive_regexes() -> Vec<String> {
    let escape = |text: &str| -> String {
        text.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c.to_string()
                } else {
                    format!("\\{c}")
                }
            })
            .collect()
    };
    let mut out: Vec<String> = PREFIXES
        .iter()
        .map(|spec| {
            format!(
                "{}{}{{{},}}",
                escape(spec.prefix),
                spec.charset.regex(),
                spec.min
            )
        })
        .collect();
    for (text, rule) in OTHER_TRIGGERS {
        let literal = escape(text);
        out.push(match rule {
            Rule::Assignment => format!(
                "[A-Za-z0-9_.-]*{literal}[A-Za-z0-9_.-]*[\"']?\\s*[:=]\\s*[\"']?[^\\s\"'&;,]+"
            ),
            Rule::Jwt => {
                format!("{literal}[A-Za-z0-9_-]{{10,}}\\.eyJ[A-Za-z0-9_-]{{10,}}\\.[A-Za-z0-9_-]*")
            }
            Rule::Url => format!("[A-Za-z][A-Za-z0-9+.-]*{literal}[^\\s:@/]*:[^\\s@]+@"),
            Rule::Authorization => format!("{literal}[\"']?\\s*[:=]\\s*[\"']?[A-Za-z]+ [^\\s\"']+"),
            Rule::Bearer => format!("{literal}[A-Za-z0-9._~+/=-]{{16,}}"),
            Rule::CurlUser => format!("{literal}\\s*['\"]?[^\\s:'\"]+:[^\\s'\"]+"),
            Rule::PemBegin => format!(
                "{literal}[A-Z ]*PRIVATE KEY-----[\\s\\S]*?-----END [A-Z ]*PRIVATE KEY-----"
            ),
            Rule::PemBase64 | Rule::Prefix(_) => format!("[A-Za-z0-9+/]*{literal}[A-Za-z0-9+/=]*"),
            Rule::QuerySignature => format!("[?&]{literal}[^&\\s\"'#]+"),
            Rule::WebhookPath => format!("{literal}[A-Za-z0-9_/-]+"),
        });
    }
    out
}
