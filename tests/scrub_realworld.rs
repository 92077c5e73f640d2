//! The scrubber on real-world shapes it was not tuned on line by line: a labelled, generated
//! corpus of Kubernetes and Helm files (indented PEM), service-account JSON (escaped PEM),
//! docker `config.json`, env dumps and `.env` files, shell history (passwords on command lines),
//! CI and tracing logs (escaped, encoded and protocol-relative URLs, cookies), the AWS console's
//! credentials CSV, PuTTY keys, GitLab routable tokens and held secrets in other encodings —
//! each family beside its harmless look-alikes (placeholders, documentation, paths, types,
//! already-redacted text).
//!
//! Scored: recall of secret bytes (a byte leaks when any 8-byte window of its secret that covers
//! it survives) must be 100 %, the share of harmless lines changed at most 1 %, and the output
//! the same one-shot and in 1- and 7-byte writes.

#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::print_stderr,
    reason = "test code: a failed check is a failed test; the score is shown"
)]

mod corpus;

use std::collections::HashSet;

use corpus::{Rng, b64};
use fleetd::scrub::Scrubber;
use secrecy::SecretString;

/// A held secret with a space and symbols (a passphrase), as fleetd would hold a broker password.
const HELD: &str = "blue Harbor-42/quiet+lamp";

/// Labelled text: what was planted and what must stay.
struct Labelled {
    text: String,
    secrets: Vec<String>,
    harmless: Vec<String>,
}

impl Labelled {
    fn secret(&mut self, text: String, secrets: &[&str]) {
        self.secrets.extend(secrets.iter().map(|s| (*s).to_owned()));
        self.text.push_str(&text);
        self.text.push('\n');
    }

    fn harmless(&mut self, line: &str) {
        self.harmless.extend(line.lines().map(str::to_owned));
        self.text.push_str(line);
        self.text.push('\n');
    }
}

fn pem_body(rng: &mut Rng, lines: usize) -> Vec<String> {
    (0..lines).map(|_| rng.b64(64)).collect()
}

fn hex(value: &str) -> String {
    value.bytes().map(|b| format!("{b:02x}")).collect()
}

/// One record of a family, secret or harmless.
fn record(rng: &mut Rng, out: &mut Labelled) {
    let pw = format!("{}{}!{}", rng.alnum(10), rng.below(1000), rng.alnum(4));
    match rng.below(24) {
        0 => {
            let body = pem_body(rng, 3);
            let refs: Vec<&str> = body.iter().map(String::as_str).collect();
            out.harmless("apiVersion: v1");
            out.harmless("kind: Secret");
            out.harmless("stringData:");
            out.secret(
                format!(
                    "  tls.key: |\n    -----BEGIN RSA PRIVATE KEY-----\n    {}\n    -----END RSA PRIVATE KEY-----",
                    body.join("\n    ")
                ),
                &refs,
            );
        }
        1 => {
            let body = pem_body(rng, 2);
            let id = rng.hex(40);
            out.secret(
                format!(
                    "{{\"type\":\"service_account\",\"private_key_id\":\"{id}\",\"private_key\":\"-----BEGIN PRIVATE KEY-----\\n{}\\n-----END PRIVATE KEY-----\\n\",\"client_email\":\"ci@p.iam.gserviceaccount.com\"}}",
                    body.join("\\n")
                ),
                &[&body[0], &body[1]],
            );
        }
        2 => {
            let auth = b64(format!("robot${}:{}", rng.alnum(6), rng.alnum(32)).as_bytes());
            out.secret(
                format!("{{\"auths\":{{\"registry.example.com\":{{\"auth\":\"{auth}\"}}}}}}"),
                &[&auth],
            );
        }
        3 => {
            let value = rng.hex(64);
            out.secret(format!("SECRET_KEY_BASE={value}"), &[&value]);
        }
        4 => {
            let name = *rng.pick(&[
                "DB_PASSWORD_PROD",
                "API_KEY_V2",
                "PGPASSWORD",
                "REDISCLI_AUTH",
                "export MYSQL_PWD",
                "SMTP_PASSWORD",
            ]);
            let value = rng.alnum(20);
            out.secret(format!("{name}={value}"), &[&value]);
        }
        5 => {
            let line = match rng.below(4) {
                0 => format!("  512  mysql -h db -u root -p{pw} shop"),
                1 => format!("  513  sshpass -p '{pw}' ssh deploy@10.0.0.5"),
                2 => format!("  514  docker login -u ci -p {pw} registry.example.com"),
                _ => format!("  515  ./migrate --password {pw} --db shop"),
            };
            out.secret(line, &[&pw]);
        }
        6 => {
            out.secret(
                format!(
                    "{{\"level\":\"info\",\"repo\":\"https:\\/\\/ci:{pw}@git.example.com\\/g\\/r.git\"}}"
                ),
                &[&pw],
            );
        }
        7 => {
            let user = rng.alnum(6);
            let secret = rng.alnum(18);
            out.secret(
                format!(
                    "GET /login?next=https%3A%2F%2F{user}%3A{secret}%40app.example.com%2Fhome 302"
                ),
                &[&secret],
            );
        }
        8 => {
            out.secret(
                format!("fetching //deploy:{pw}@mirror.example.com/pkg"),
                &[&pw],
            );
        }
        9 => {
            let id = format!("AKIA{}", rng.upper(16));
            let key = rng.b64(40).replace('+', "/");
            out.harmless("User name,Password,Access key ID,Secret access key,Console login link");
            out.secret(
                format!(
                    "ci-user,{pw},{id},{key},https://123456789012.signin.aws.amazon.com/console"
                ),
                &[&pw, &id, &key],
            );
        }
        10 => {
            let session = rng.hex(32);
            out.secret(
                format!(
                    "2026-12-06T10:00:00Z DEBUG http: request headers: Cookie: sessionid={session}; theme=dark"
                ),
                &[&session],
            );
        }
        11 => {
            let token = format!("glpat-{}.01.{}", rng.alnum(27), rng.alnum(9));
            out.secret(format!("remote: using {token}"), &[&token]);
        }
        12 => {
            let body = pem_body(rng, 2);
            out.harmless("PuTTY-User-Key-File-3: ssh-ed25519");
            out.harmless("Encryption: none");
            out.secret(
                format!("Private-Lines: 2\n{}\n{}", body[0], body[1]),
                &[&body[0], &body[1]],
            );
            out.harmless("Private-MAC: 4c3d2e1f0a9b8c7d");
        }
        13 => {
            let body = rng.b64(64);
            let (open, close) = if rng.below(2) == 0 {
                (
                    "-----begin rsa private key-----",
                    "-----end rsa private key-----",
                )
            } else {
                (
                    "----BEGIN RSA PRIVATE KEY----",
                    "----END RSA PRIVATE KEY----",
                )
            };
            out.secret(format!("{open}\n{body}\n{close}"), &[&body]);
        }
        14 if rng.below(5) == 0 => {
            // `base64 creds.json`: the held value inside, the encoding wrapped at 76 columns.
            let user_len = 1 + rng.below(60);
            let payload = format!(
                "{{\"user\":\"{}\",\"password\":\"{HELD}\",\"vhost\":\"/fleet\"}}",
                rng.alnum(user_len)
            );
            let at = payload.find(HELD).unwrap();
            let encoded = b64(payload.as_bytes());
            let lines: Vec<&str> = encoded
                .as_bytes()
                .chunks(76)
                .map(|l| std::str::from_utf8(l).unwrap())
                .collect();
            // The characters that encode the value alone, cut at the line breaks.
            let (from, to) = ((at * 4).div_ceil(3), (at + HELD.len()) * 4 / 3);
            let pieces: Vec<&str> = (from / 76..=(to - 1) / 76)
                .map(|i| &encoded[from.max(i * 76)..to.min((i + 1) * 76)])
                .collect();
            out.harmless("$ base64 creds.json");
            out.secret(lines.join("\n"), &pieces);
        }
        14 => {
            let encoded = match rng.below(4) {
                0 => hex(HELD),
                1 => HELD
                    .replace(' ', "%20")
                    .replace('/', "%2f")
                    .replace('+', "%2b"),
                // Form encoding: `+` is the space, `%2B` the plus sign.
                2 => "blue+Harbor-42%2Fquiet%2Blamp".to_owned(),
                _ => HELD
                    .replace(' ', "\\u0020")
                    .replace('/', "\\u002f")
                    .replace('-', "\\u002d"),
            };
            out.secret(
                format!("amqp debug: credential={encoded} (sent)"),
                &[&encoded],
            );
        }
        15 => {
            let cookie = rng.alnum(24);
            out.secret(
                format!("< Set-Cookie: sid={cookie}; Path=/; HttpOnly"),
                &[&cookie],
            );
        }
        // Harmless look-alikes, several per family.
        16 => out.harmless(one_of(
            rng,
            &[
                "export GITHUB_TOKEN=ghp_...",
                "OPENAI_API_KEY=sk-proj-...",
                "SLACK_BOT_TOKEN=xoxb-your-bot-token",
                "API_KEY=your-api-key-here",
                "password: [REDACTED]",
                "token=[redacted:token]",
                "API_KEY=YOUR_API_KEY",
            ],
        )),
        17 => out.harmless(one_of(
            rng,
            &[
                "broker = amqp://USER:PASSWORD@HOST:PORT/VHOST",
                "Password: must be at least 12 characters",
                "  --password PASSWORD   the database password (prompted when absent)",
                "Use `docker login --password-stdin` rather than -p.",
                "psql postgres://user:password@localhost/db",
            ],
        )),
        18 => out.harmless(one_of(
            rng,
            &[
                "PASSWORD_FILE=/run/secrets/db-password",
                "TOKEN_URL=https://auth.example.com/oauth/token",
                "SECRET_NAME=broker-uri",
                "PASSWORD_MIN_LENGTH=12",
                "KEY_ID=ed25519:4f2a",
            ],
        )),
        19 => out.harmless(one_of(
            rng,
            &[
                "    pub token: SecretString,",
                "    token: Option<String>,",
                "    let password: &str = \"\";",
                "password = getpass()",
                "api_key = os.environ[\"API_KEY\"]",
                "    secret_key: String,",
            ],
        )),
        20 => out.harmless(one_of(
            rng,
            &[
                "mkdir -p /tmp/build",
                "ssh -p 2222 deploy@host",
                "gh auth login -p ssh",
                "Author: Alice <alice@example.com>",
                "the cookie: chocolate chip",
                "  -----BEGIN CERTIFICATE-----",
            ],
        )),
        _ => out.harmless(&corpus::negative_line(rng)),
    }
}

fn one_of(rng: &mut Rng, lines: &[&'static str]) -> &'static str {
    lines[rng.below(lines.len())]
}

fn build(seed: u64, records: usize) -> Labelled {
    let mut rng = Rng::new(seed);
    let mut out = Labelled {
        text: String::new(),
        secrets: Vec::new(),
        harmless: Vec::new(),
    };
    for _ in 0..records {
        record(&mut rng, &mut out);
    }
    out
}

fn scrubber() -> Scrubber {
    let scrubber = Scrubber::new();
    scrubber
        .register("broker-password", &SecretString::from(HELD))
        .unwrap();
    scrubber
}

fn by_writes(scrubber: &Scrubber, input: &[u8], size: usize) -> Vec<u8> {
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    for chunk in input.chunks(size) {
        stream.write(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

#[test]
fn real_world_shapes_lose_every_secret_byte_and_keep_harmless_lines() {
    let corpus = build(2026, 6000);
    let scrubber = scrubber();
    let out = scrubber.scrub(&corpus.text);
    let windows: HashSet<&[u8]> = out.as_bytes().windows(8).collect();
    let (mut total, mut leaked) = (0usize, 0usize);
    let mut leaks = Vec::new();
    for secret in &corpus.secrets {
        let bytes = secret.as_bytes();
        let mut exposed = vec![false; bytes.len()];
        for (at, window) in bytes.windows(8).enumerate() {
            if windows.contains(window) {
                exposed[at..at + 8].iter_mut().for_each(|e| *e = true);
            }
        }
        let n = exposed.iter().filter(|e| **e).count();
        total += bytes.len();
        leaked += n;
        if n > 0 && leaks.len() < 5 {
            leaks.push(secret.clone());
        }
    }
    let lines: HashSet<&str> = out.lines().collect();
    let changed: Vec<&String> = corpus
        .harmless
        .iter()
        .filter(|line| !lines.contains(line.as_str()))
        .collect();
    let recall = 100.0 * (total - leaked) as f64 / total as f64;
    let changed_share = 100.0 * changed.len() as f64 / corpus.harmless.len() as f64;
    eprintln!(
        "real-world corpus: {} secrets ({total} bytes), recall {recall:.3} % of secret bytes; \
         {} harmless lines, {} changed ({changed_share:.2} %)",
        corpus.secrets.len(),
        corpus.harmless.len(),
        changed.len()
    );
    assert!(corpus.secrets.len() > 2000, "the corpus plants secrets");
    assert_eq!(leaked, 0, "secret bytes survived, e.g. {leaks:?}");
    let mut distinct: Vec<&&String> = changed.iter().collect();
    distinct.dedup();
    assert!(
        changed_share <= 1.0,
        "{changed_share:.2} % of harmless lines changed, e.g. {:?}",
        distinct.iter().take(8).collect::<Vec<_>>()
    );
}

#[test]
fn real_world_output_is_the_same_in_one_write_and_in_1_and_7_byte_writes() {
    let corpus = build(7, 1500);
    let scrubber = scrubber();
    let one_shot = scrubber.scrub_bytes(corpus.text.as_bytes());
    for size in [1, 7] {
        let written = by_writes(&scrubber, corpus.text.as_bytes(), size);
        assert!(
            written == one_shot,
            "{size}-byte writes differ from one write"
        );
    }
}
