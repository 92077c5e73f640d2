//! Credential shapes: the trigger strings the search looks for, and one validator per shape that
//! decides, from the text around a trigger, exactly which bytes are secret.
//!
//! Every validator stops at a newline (PEM blocks carry [`PemState`] across lines instead), looks
//! at a bounded window, and in open mode (the text may continue) asks for more input rather than
//! judge a candidate that touches the end.

mod assign;
mod cli;
mod header;
mod pem;
mod tokens;
mod url;
mod value;

pub(super) use pem::pem_lines;

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
    /// A counted run of key lines (PuTTY's `Private-Lines: N`); `marked` once the marker was
    /// written.
    Counted { left: u16, marked: bool },
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
    Url(url::Form),
    EncodedUrl,
    Bearer,
    CurlUser,
    PemBegin,
    PemBase64,
    PuttyPrivate,
    CliPassword,
    Cookie,
    AwsConsoleCsv,
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
    // GitLab's routable tokens carry a `.`-separated suffix (`glpat-….01.…`).
    p("glpat-", "gitlab-token", TokenDot, 20),
    p("glptt-", "gitlab-token", TokenDot, 20),
    p("gldt-", "gitlab-token", TokenDot, 20),
    p("glrt-", "gitlab-token", TokenDot, 20),
    p("glcbt-", "gitlab-token", TokenDot, 20),
    p("glft-", "gitlab-token", TokenDot, 20),
    p("glsoat-", "gitlab-token", TokenDot, 20),
    p("glagent-", "gitlab-token", TokenDot, 20),
    p("gloas-", "gitlab-token", TokenDot, 20),
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
    // fleetd's own agent capability tokens (`agent::token`), whoever's they are.
    fixed("fleetd-agent-", "fleetd-agent-token", LowerHex, 64),
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
    ("://", Rule::Url(url::Form::Plain)),
    (":\\/\\/", Rule::Url(url::Form::JsonEscaped)),
    // Protocol-relative (`//user:pw@host`) after a space (a bare `//` would fire on every URL
    // and comment and cost a fifth of the throughput; a quote before it would make every word
    // that ends in a quote look like the start of a trigger at a cut).
    (" //", Rule::Url(url::Form::Relative)),
    ("%3A%2F%2F", Rule::EncodedUrl),
    ("%3a%2f%2f", Rule::EncodedUrl),
    ("Cookie:", Rule::Cookie),
    ("cookie:", Rule::Cookie),
    ("COOKIE:", Rule::Cookie),
    // The AWS console's credentials CSV names its sign-in link on every data line.
    ("signin.aws.amazon.com", Rule::AwsConsoleCsv),
    ("Bearer ", Rule::Bearer),
    ("bearer ", Rule::Bearer),
    ("-u ", Rule::CurlUser),
    ("--user", Rule::CurlUser),
    // Four dashes or five, any case: `-----BEGIN `, `----BEGIN `, `-----begin `.
    ("----BEGIN ", Rule::PemBegin),
    ("----begin ", Rule::PemBegin),
    ("Private-Lines:", Rule::PuttyPrivate),
    // Commands that take a password flag (`mysql -pSECRET`, `sshpass -p SECRET`, `docker
    // login -p SECRET`).
    ("mysql", Rule::CliPassword),
    ("mariadb", Rule::CliPassword),
    ("sshpass", Rule::CliPassword),
    ("login", Rule::CliPassword),
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
    // `auth` (docker's `"auth":`, `.npmrc`'s `_auth=`, `REDISCLI_AUTH=`), and the
    // `Authorization` / `Proxy-Authorization` headers, which start with it: the assignment rule
    // hands those to the header rule (a trigger of their own would never win the tie with `auth`).
    ("auth", Rule::Assignment),
    ("AUTH", Rule::Assignment),
    ("Auth", Rule::Assignment),
    ("CREDENTIAL", Rule::Assignment),
    ("Credential", Rule::Assignment),
];

/// Runs the validator of `rule` for a trigger found at `start..end`.
pub(super) fn validate(rule: Rule, scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    match rule {
        Rule::Prefix(spec) => tokens::prefix_token(scan, start, spec),
        Rule::Jwt => tokens::jwt(scan, start),
        Rule::Url(form) => url::url_userinfo(scan, start, form),
        Rule::EncodedUrl => url::encoded_userinfo(scan, start, end),
        Rule::Bearer => header::bearer(scan, start, end),
        Rule::CurlUser => header::curl_user(scan, start, end),
        Rule::PemBegin => pem::pem_begin(scan, start, end),
        Rule::PemBase64 => pem::pem_base64(scan, start),
        Rule::PuttyPrivate => pem::putty_private(scan, start, end),
        Rule::CliPassword => cli::cli_password(scan, start, end),
        Rule::Cookie => header::cookie(scan, start, end),
        Rule::AwsConsoleCsv => header::aws_console_csv(scan, start),
        Rule::Assignment => assign::assignment(scan, start, end),
        Rule::QuerySignature => assign::query_signature(scan, start, end),
        Rule::WebhookPath => assign::webhook_path(scan, end),
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
    pub(super) fn at(&self, i: usize) -> Option<u8> {
        self.text.get(i).copied()
    }

    pub(super) fn before(&self, i: usize) -> Option<u8> {
        i.checked_sub(1).and_then(|j| self.at(j))
    }

    /// Index of the first byte at or after `i` that does not satisfy `keep`.
    pub(super) fn run(&self, mut i: usize, keep: impl Fn(u8) -> bool) -> usize {
        while self.at(i).is_some_and(&keep) {
            i += 1;
        }
        i
    }

    /// Where the run of bytes satisfying `keep` that ends at `i` starts.
    pub(super) fn run_back(&self, mut i: usize, keep: impl Fn(u8) -> bool) -> usize {
        while self.before(i).is_some_and(&keep) {
            i -= 1;
        }
        i
    }

    /// Index of the start of the line containing `i` (after its preceding newline, or 0).
    pub(super) fn line_start(&self, i: usize) -> usize {
        let head = self.text.get(..i).unwrap_or_default();
        memchr::memrchr(b'\n', head).map_or(0, |n| n + 1)
    }

    /// Index of the end of the line containing `i` (its newline, or the end of text).
    pub(super) fn line_end(&self, i: usize) -> usize {
        let rest = self.text.get(i..).unwrap_or_default();
        memchr::memchr(b'\n', rest).map_or(self.text.len(), |n| i + n)
    }

    /// True when a run that stopped at `i` was cut by the end of open text.
    pub(super) fn cut(&self, i: usize) -> bool {
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
            Rule::Url(_) => format!("[A-Za-z][A-Za-z0-9+.-]*{literal}[^\\s:@/]*:[^\\s@]+@"),
            Rule::EncodedUrl => format!("{literal}[^\\s&]*%3[Aa][^\\s&]*%40"),
            Rule::Bearer => format!("{literal}[A-Za-z0-9._~+/=-]{{16,}}"),
            Rule::CurlUser => format!("{literal}\\s*['\"]?[^\\s:'\"]+:[^\\s'\"]+"),
            Rule::PemBegin => format!(
                "{literal}[A-Z ]*PRIVATE KEY-----[\\s\\S]*?-----END [A-Z ]*PRIVATE KEY-----"
            ),
            Rule::PemBase64 | Rule::Prefix(_) => format!("[A-Za-z0-9+/]*{literal}[A-Za-z0-9+/=]*"),
            Rule::Cookie => format!("{literal}.*"),
            Rule::AwsConsoleCsv => format!("^[^,]*,[^,]*,.*{literal}"),
            Rule::CliPassword => format!("{literal}[a-z]* .*-p ?[^\\s]+"),
            Rule::PuttyPrivate => format!("{literal} *[0-9]+\\n([A-Za-z0-9+/=]+\\n)+"),
            Rule::QuerySignature => format!("[?&]{literal}[^&\\s\"'#]+"),
            Rule::WebhookPath => format!("{literal}[A-Za-z0-9_/-]+"),
        });
    }
    out
}
