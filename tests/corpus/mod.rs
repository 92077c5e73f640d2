//! A generated corpus for the scrubber: terminal, build, git and JSON-log text with planted
//! synthetic secrets (never real ones) and the tricky negatives that must survive.
//!
//! Shared by `tests/scrub_corpus.rs` (correctness) and `benches/scrub.rs` (throughput).

#![allow(
    dead_code,
    unreachable_pub,
    clippy::indexing_slicing,
    reason = "shared test data: each includer uses part of it, and indices come from `below(len)`"
)]

/// The held secret the corpus plants in raw and encoded forms; register it before scrubbing.
pub const HELD_SECRET: &str = "Cn4ry-h3ld-S3cr3t-v4lue+/=";

/// A corpus: the text, every planted secret, and every line that must come out unchanged.
pub struct Corpus {
    pub text: String,
    pub secrets: Vec<String>,
    pub negatives: Vec<String>,
}

/// Deterministic xorshift generator: the corpus is the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chars(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len).map(|_| char::from(*self.pick(alphabet))).collect()
    }

    pub fn alnum(&mut self, len: usize) -> String {
        self.chars(
            b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789",
            len,
        )
    }

    pub fn upper(&mut self, len: usize) -> String {
        self.chars(b"ABCDEFGHJKLMNPQRSTUVWXYZ234567", len)
    }

    pub fn hex(&mut self, len: usize) -> String {
        self.chars(b"0123456789abcdef", len)
    }

    pub fn b64(&mut self, len: usize) -> String {
        self.chars(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
            len,
        )
    }
}

pub fn b64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

/// Lines with nothing secret in them: four in five ordinary terminal, build, git and JSON-log
/// lines, one in five a tricky negative (secret-sounding names, placeholders, hashes, keys that
/// are public, URLs without passwords).
pub fn negative_line(rng: &mut Rng) -> String {
    if rng.below(5) == 0 {
        tricky_line(rng)
    } else {
        ordinary_line(rng)
    }
}

fn uuid(rng: &mut Rng) -> String {
    format!(
        "{}-{}-4{}-a{}-{}",
        rng.hex(8),
        rng.hex(4),
        rng.hex(3),
        rng.hex(3),
        rng.hex(12)
    )
}

/// Ordinary output: no trigger of any kind, or rarely one (a URL).
pub fn ordinary_line(rng: &mut Rng) -> String {
    let n = rng.below(1000);
    match rng.below(14) {
        0 => format!("   Compiling fleetd-dep{n} v0.{n}.3 (/work/src/dep{n})"),
        1 => format!("warning: unused variable: `count_{n}` --> src/lib.rs:{n}:9"),
        2 => format!("test scrub::tests::case_{n} ... ok"),
        3 => format!("commit {}", rng.hex(40)),
        4 => format!("Author: Alice Example <alice{n}@example.com>"),
        5 => format!(
            "{{\"ts\":\"2026-12-02T13:{:02}:00Z\",\"level\":\"info\",\"msg\":\"delivered\",\"msg_id\":\"{}\",\"bytes\":{n}}}",
            n % 60,
            uuid(rng)
        ),
        6 => format!("\x1b[32m✓\x1b[0m {n} tests passed in \x1b[1m0.{n}s\x1b[0m"),
        7 => format!(
            "diff --git a/src/m{n}.rs b/src/m{n}.rs\nindex {}..{} 100644",
            rng.hex(7),
            rng.hex(7)
        ),
        8 => format!(
            "[{}] request completed status=200 duration_ms={n}",
            uuid(rng)
        ),
        9 => format!(
            "    Finished `release` profile [optimized] target(s) in {}.{:02}s",
            n / 10,
            n % 100
        ),
        10 => format!(
            "     Running unittests src/lib.rs (target/debug/deps/fleetd-{})",
            rng.hex(16)
        ),
        11 => format!("+    let total_{n} = items.iter().map(|i| i.len()).sum::<usize>();"),
        12 => format!(
            "Receiving objects: {}% ({n}/1000), 1.{} MiB | 3.{} MiB/s",
            n % 100,
            n % 10,
            n % 7
        ),
        _ => format!("Fetched https://static.example.com/pkg/{n}/index.json in {n}ms"),
    }
}

/// The tricky negatives: text that looks secret and is not.
pub fn tricky_line(rng: &mut Rng) -> String {
    let n = rng.below(1000);
    match rng.below(16) {
        0 => format!("origin\thttps://alice@github.com/org/repo{n}.git (fetch)"),
        1 => format!("origin\tgit@github.com:org/repo{n}.git (push)"),
        2 => format!("sha256:{}", rng.hex(64)),
        3 => format!("integrity=\"sha512-{}\"", rng.b64(86)),
        4 => format!(
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{} alice@laptop",
            rng.alnum(43)
        ),
        5 => "TOKEN_URL=https://auth.example.com/oauth/token".to_owned(),
        6 => "PASSWORD_FILE=/run/credentials/fleetd@alice.service/broker-uri".to_owned(),
        7 => "GITHUB_TOKEN=${GITHUB_TOKEN}".to_owned(),
        8 => "ANTHROPIC_API_KEY=<TOKEN>".to_owned(),
        9 => "ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx".to_owned(),
        10 => {
            "The password prompt was skipped; pass the key name, never the token itself.".to_owned()
        }
        11 => format!(
            "-----BEGIN CERTIFICATE-----\nMIIB{}\n-----END CERTIFICATE-----",
            rng.b64(60)
        ),
        12 => format!("Fetched https://static.example.com:8443/pkg/{n}/index.json in {n}ms"),
        13 => "password: ****".to_owned(),
        14 => format!("warning: unused variable: `key_{n}` --> src/lib.rs:{n}:9"),
        _ => format!("\"max_tokens\": {n}, \"input_tokens\": {}", n / 2),
    }
}

/// A line with one planted secret; returns the line and the secret's bytes.
pub fn secret_line(rng: &mut Rng) -> (String, String) {
    let pw = format!("{}{}", rng.alnum(14), rng.below(1000));
    match rng.below(30) {
        0 => {
            let t = format!("ghp_{}", rng.alnum(36));
            (format!("\tremote: using {t}"), t)
        }
        1 => {
            let t = format!("github_pat_{}_{}", rng.alnum(22), rng.alnum(59));
            (format!("export GH_PAT={t}"), t)
        }
        2 => {
            let t = format!("glpat-{}", rng.alnum(20));
            (format!("{{\"level\":\"debug\",\"msg\":\"token {t}\"}}"), t)
        }
        3 => {
            let t = format!("sk-ant-api03-{}AA", rng.alnum(93));
            (format!("\x1b[33m{t}\x1b[0m"), t)
        }
        4 => {
            let t = format!("sk-proj-{}", rng.alnum(120));
            (format!("openai key {t} loaded"), t)
        }
        5 => {
            let t = format!("AKIA{}", rng.upper(16));
            (format!("aws_access_key_id = {t}"), t)
        }
        6 => {
            let t = rng.b64(40);
            (format!("AWS_SECRET_ACCESS_KEY={t}"), t)
        }
        7 => {
            let t = format!(
                "xoxb-{}-{}-{}",
                rng.below(1 << 30),
                rng.below(1 << 30),
                rng.alnum(24)
            );
            (format!("slack: {t}"), t)
        }
        8 => {
            let t = format!("sk_live_{}", rng.alnum(24));
            (format!("STRIPE={t}"), t)
        }
        9 => {
            let t = format!("AIza{}", rng.alnum(35));
            (format!("maps key={t}&x=1"), t)
        }
        10 => {
            let t = format!("npm_{}", rng.alnum(36));
            (format!("//registry.npmjs.org/:_authToken={t}"), t)
        }
        11 => {
            let t = format!("hf_{}", rng.alnum(34));
            (format!("huggingface-cli login --token {t}"), t)
        }
        12 => {
            let t = format!("hvs.{}", rng.alnum(90));
            (format!("vault token: {t}"), t)
        }
        13 => {
            let t = format!(
                "eyJhbGciOiJSUzI1NiJ9.eyJ{}.{}",
                rng.alnum(60),
                rng.alnum(43)
            );
            (format!("id_token={t}"), t)
        }
        14 => {
            let scheme = *rng.pick(&[
                "https",
                "ssh",
                "amqp",
                "amqps",
                "postgres",
                "mysql",
                "mongodb+srv",
            ]);
            (
                format!("origin\t{scheme}://deploy:{pw}@git.example.com/o/r.git (fetch)"),
                pw,
            )
        }
        15 => (format!("redis://:{pw}@cache.internal:6379/0"), pw),
        16 => (
            format!(
                "fatal: unable to access 'https://oauth2:{pw}@gitlab.example.com/g/p.git/': The requested URL returned error: 403"
            ),
            pw,
        ),
        17 => {
            let basic = b64(format!("x-access-token:{pw}").as_bytes());
            (
                format!("\textraheader = AUTHORIZATION: basic {basic}"),
                basic,
            )
        }
        18 => {
            let t = rng.alnum(40);
            (
                format!("curl -H 'Authorization: Bearer {t}' https://api.example.com"),
                t,
            )
        }
        19 => (format!("curl -u deploy:{pw} https://ci.example.com"), pw),
        20 => (
            format!("machine api.example.com login bot password {pw}"),
            pw,
        ),
        21 => (
            format!("{{\"client_secret\":\"{pw}\",\"grant_type\":\"client_credentials\"}}"),
            pw,
        ),
        22 => (format!("DB_PASSWORD='{pw}'"), pw),
        23 => (
            format!("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig={pw}%3D&se=2027"),
            pw,
        ),
        24 => {
            let body = rng.b64(64);
            (
                format!(
                    "-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n{}\n-----END OPENSSH PRIVATE KEY-----",
                    rng.b64(64)
                ),
                body,
            )
        }
        25 => {
            let body = rng.b64(64);
            (
                format!(
                    "{{\"private_key\":\"-----BEGIN RSA PRIVATE KEY-----\\n{body}\\n-----END RSA PRIVATE KEY-----\\n\"}}"
                ),
                body,
            )
        }
        26 => (format!("held: {HELD_SECRET} (raw)"), HELD_SECRET.to_owned()),
        27 => {
            let encoded = b64(HELD_SECRET.as_bytes());
            (format!("config: {encoded}"), encoded)
        }
        28 => {
            let encoded = b64(format!("fleet01:{HELD_SECRET}").as_bytes());
            (
                format!("{{\"auths\":{{\"r.example\":{{\"auth\":\"{encoded}\"}}}}}}"),
                encoded,
            )
        }
        _ => {
            let t = format!("dckr_pat_{}", rng.alnum(27));
            (
                format!("echo {t} | docker login -u bot --password-stdin"),
                t,
            )
        }
    }
}

/// `lines` lines; one in `every` carries a planted secret (0: none).
pub fn build(seed: u64, lines: usize, every: usize) -> Corpus {
    let mut rng = Rng::new(seed);
    let mut corpus = Corpus {
        text: String::new(),
        secrets: Vec::new(),
        negatives: Vec::new(),
    };
    for i in 0..lines {
        let line = if every > 0 && i % every == every - 1 {
            let (line, secret) = secret_line(&mut rng);
            corpus.secrets.push(secret);
            line
        } else {
            let line = negative_line(&mut rng);
            corpus.negatives.push(line.clone());
            line
        };
        corpus.text.push_str(&line);
        corpus.text.push('\n');
    }
    corpus
}
