//! Tables of scrub results: what is redacted, to which marker, and what stays intact.

use secrecy::SecretString;

use super::Scrubber;

// Synthetic tokens, built at run time so no credential-shaped literal sits in the source.
fn tok(prefix: &str, body_len: usize) -> String {
    let alphabet = b"Q7mZ2kR9xW4pL8vN3cT6yB1hJ5sD0fGa";
    let body: String = (0..body_len)
        .map(|i| char::from(alphabet[(i * 7 + body_len) % alphabet.len()]))
        .collect();
    format!("{prefix}{body}")
}

/// A scrubber holding `value` under `name`.
fn holding(name: &str, value: &str) -> Scrubber {
    let scrubber = Scrubber::new();
    scrubber.register(name, &SecretString::from(value)).unwrap();
    scrubber
}

fn scrubbed(input: &str) -> String {
    Scrubber::new().scrub(input)
}

#[track_caller]
fn assert_redacts(input: &str, secret: &str, marker: &str) {
    let out = scrubbed(input);
    assert!(
        !out.contains(secret),
        "secret survived in {out:?} (input {input:?})"
    );
    assert!(
        out.contains(marker),
        "no {marker} in {out:?} (input {input:?})"
    );
}

#[track_caller]
fn assert_intact(input: &str) {
    assert_eq!(scrubbed(input), input, "negative was changed");
}

#[test]
fn provider_tokens_are_redacted_to_their_kind() {
    let cases = [
        (tok("ghp_", 36), "[redacted:github-token]"),
        (tok("gho_", 36), "[redacted:github-token]"),
        (tok("github_pat_", 82), "[redacted:github-token]"),
        (tok("glpat-", 20), "[redacted:gitlab-token]"),
        (tok("sk-ant-api03-", 93), "[redacted:anthropic-key]"),
        (tok("sk-ant-oat01-", 93), "[redacted:anthropic-key]"),
        (tok("sk-proj-", 120), "[redacted:openai-key]"),
        (
            "AKIA".to_owned() + "Q7MZ2KR9XW4PL8VN",
            "[redacted:aws-access-key-id]",
        ),
        (tok("xoxb-", 50), "[redacted:slack-token]"),
        (tok("sk_live_", 24), "[redacted:stripe-key]"),
        (tok("AIza", 35), "[redacted:google-api-key]"),
        (tok("npm_", 36), "[redacted:npm-token]"),
        (tok("pypi-AgEIcHlwaS5vcmc", 60), "[redacted:pypi-token]"),
        (tok("dckr_pat_", 27), "[redacted:docker-token]"),
        (tok("cio", 32), "[redacted:crates-io-token]"),
        (tok("hf_", 34), "[redacted:huggingface-token]"),
        (tok("hvs.", 90), "[redacted:vault-token]"),
    ];
    for (secret, marker) in cases {
        assert_redacts(&format!("token is {secret} here"), &secret, marker);
        assert_redacts(&secret.clone(), &secret, marker);
    }
}

#[test]
fn jwt_is_redacted() {
    let jwt = format!(
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.{}",
        tok("", 43)
    );
    assert_redacts(&format!("cookie: session={jwt};"), &jwt, "[redacted:");
    assert_redacts(&format!("got {jwt}"), &jwt, "[redacted:jwt]");
}

#[test]
fn url_userinfo_passwords_are_redacted_for_every_scheme() {
    for scheme in [
        "https",
        "http",
        "ssh",
        "amqp",
        "amqps",
        "postgres",
        "mysql",
        "mongodb+srv",
        "git+ssh",
    ] {
        let input = format!("origin\t{scheme}://alice:Zx9pQ2rT7vLm@db.example.net/repo (fetch)");
        let out = scrubbed(&input);
        assert_eq!(
            out,
            format!("origin\t{scheme}://alice:[redacted:password]@db.example.net/repo (fetch)")
        );
    }
    assert_eq!(
        scrubbed("redis://:Zx9pQ2rT7vLm@cache:6379/0"),
        "redis://:[redacted:password]@cache:6379/0"
    );
    let github = tok("ghp_", 36);
    assert_redacts(
        &format!("url = https://{github}@github.com/o/r.git"),
        &github,
        "[redacted:",
    );
    assert_redacts(
        "fatal: unable to access 'https://x-access-token:Zx9pQ2rT7vLm@github.com/o/r.git/': 403",
        "Zx9pQ2rT7vLm",
        "[redacted:password]",
    );
}

#[test]
fn headers_and_curl_credentials_are_redacted() {
    assert_eq!(
        scrubbed("Authorization: Bearer abcDEF123456ghiJKL789"),
        "Authorization: Bearer [redacted:bearer-token]"
    );
    assert_eq!(
        scrubbed("\textraheader = AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46c2VjcmV0"),
        "\textraheader = AUTHORIZATION: basic [redacted:basic-auth]"
    );
    assert_eq!(
        scrubbed("curl -H \"Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA==\" https://x"),
        "curl -H \"Proxy-Authorization: Basic [redacted:basic-auth]\" https://x"
    );
    assert_eq!(
        scrubbed("curl -u deploy:Zx9pQ2rT7vLm https://x"),
        "curl -u deploy:[redacted:password] https://x"
    );
    assert_eq!(
        scrubbed("curl --user 'deploy:Zx9 pQ2' https://x"),
        "curl --user 'deploy:[redacted:password]' https://x"
    );
}

#[test]
fn secret_named_assignments_are_redacted() {
    let cases = [
        (
            "export GITHUB_TOKEN=Zx9pQ2rT7vLm",
            "export GITHUB_TOKEN=[redacted:token]",
        ),
        (
            "DB_PASSWORD='hunter2 hunter2'",
            "DB_PASSWORD='[redacted:password]'",
        ),
        (
            "{\"client_secret\": \"Zx9pQ2rT7vLm\"}",
            "{\"client_secret\": \"[redacted:secret]\"}",
        ),
        (
            "{\\\"apiKey\\\":\\\"Zx9pQ2rT7vLm\\\"}",
            "{\\\"apiKey\\\":\\\"[redacted:key]\\\"}",
        ),
        ("password: Zx9pQ2rT7vLm", "password: [redacted:password]"),
        (
            "aws_secret_access_key = Zx9pQ2rT7vLmZx9pQ2rT7vLm",
            "aws_secret_access_key = [redacted:key]",
        ),
        (
            "AWS_SESSION_TOKEN=FwoGZXIvYXdzE",
            "AWS_SESSION_TOKEN=[redacted:token]",
        ),
        (
            "GET /cb?access_token=Zx9pQ2rT7vLm&state=1",
            "GET /cb?access_token=[redacted:token]&state=1",
        ),
        (
            "https://a.blob.core.windows.net/c?sv=2020&sig=Zx9pQ2rT7vLm%3D",
            "https://a.blob.core.windows.net/c?sv=2020&sig=[redacted:signature]",
        ),
        (
            "machine github.com login alice password Zx9pQ2rT7vLm",
            "machine github.com login alice password [redacted:password]",
        ),
        (
            "AccountName=a;AccountKey=Zx9pQ2rT7vLm==;EndpointSuffix=x",
            "AccountName=a;AccountKey=[redacted:key];EndpointSuffix=x",
        ),
        // A routing key is a name; a token in one is still a token.
        (
            "routing_key=ghp_aaaaBBBBccccDDDDeeeeFFFFgggg0123456789",
            "routing_key=[redacted:github-token]",
        ),
        ("SIGNING_KEY=Zx9pQ2rT7vLm", "SIGNING_KEY=[redacted:key]"),
    ];
    for (input, expected) in cases {
        assert_eq!(scrubbed(input), expected, "input {input:?}");
    }
}

#[test]
fn private_key_blocks_are_redacted_in_every_layout() {
    let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7";
    let plain = format!(
        "before\n-----BEGIN PRIVATE KEY-----\n{body}\n{body}\n-----END PRIVATE KEY-----\nafter\n"
    );
    assert_eq!(
        scrubbed(&plain),
        "before\n-----BEGIN PRIVATE KEY-----\n[redacted:private-key]\n-----END PRIVATE KEY-----\nafter\n"
    );
    let json = format!(
        "{{\"key\":\"-----BEGIN RSA PRIVATE KEY-----\\n{body}\\n-----END RSA PRIVATE KEY-----\\n\"}}"
    );
    let out = scrubbed(&json);
    assert!(!out.contains(body), "{out}");
    let wrapped =
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, plain.as_bytes());
    let out = scrubbed(&format!("data: {wrapped}\n"));
    assert_eq!(out, "data: [redacted:private-key]\n");
    let public = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
    assert_intact(public);
}

#[test]
fn escape_sequences_do_not_hide_tokens() {
    let github = tok("ghp_", 36);
    let (head, tail) = github.split_at(10);
    let coloured = format!("\x1b[32m{github}\x1b[0m done");
    assert_eq!(
        scrubbed(&coloured),
        "\x1b[32m[redacted:github-token]\x1b[0m done"
    );
    let split = format!("x {head}\x1b[1m{tail} y");
    assert_eq!(scrubbed(&split), "x [redacted:github-token] y");
}

#[test]
fn held_secrets_are_redacted_with_their_encodings() {
    let value = "pl41n-Passphrase/with+symbols\"";
    let scrubber = holding("canary", value);
    let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s);
    let inputs = [
        format!("x {value} y"),
        format!("x {} y", b64(value)),
        format!("Authorization: Basic {}", b64(&format!("user:{value}"))),
        format!("{{\"auth\":\"{}\"}}", b64(&format!("ab:{value}"))),
        format!("q={}", "pl41n-Passphrase%2Fwith%2Bsymbols%22"),
        format!("{{\"v\":\"{}\"}}", "pl41n-Passphrase/with+symbols\\\""),
        // Either hex case, lowercase percent-encoding, JSON's `\u00XX`.
        format!("hex {}", hex(value, false)),
        format!("HEX {}", hex(value, true)),
        format!("q={}", "pl41n-Passphrase%2fwith%2bsymbols%22"),
        format!(
            "{{\"v\":\"{}\"}}",
            "pl41n\\u002dPassphrase\\u002fwith\\u002bsymbols\\u0022"
        ),
    ];
    for input in inputs {
        let out = scrubber.scrub(&input);
        assert!(out.contains("[redacted:"), "{input} -> {out}");
        assert!(!out.contains("Passphrase"), "{input} -> {out}");
        for encoded in [b64(value), b64(&format!("user:{value}"))] {
            assert!(
                !out.contains(&encoded[4..encoded.len() - 4]),
                "{input} -> {out}"
            );
        }
    }
}

fn hex(value: &str, upper: bool) -> String {
    value
        .bytes()
        .map(|b| {
            if upper {
                format!("{b:02X}")
            } else {
                format!("{b:02x}")
            }
        })
        .collect()
}

#[test]
fn a_held_secret_with_spaces_is_found_form_encoded() {
    let scrubber = holding("phrase", "correct horse battery");
    for input in [
        "q=correct+horse+battery&x=1",
        "q=correct%20horse%20battery",
        "say correct horse battery now",
    ] {
        let out = scrubber.scrub(input);
        assert!(!out.contains("horse"), "{input} -> {out}");
    }
}

#[test]
fn short_secrets_are_refused_for_exact_matching() {
    let scrubber = Scrubber::new();
    assert!(
        scrubber
            .register("tiny", &SecretString::from("abc"))
            .is_err()
    );
    assert_eq!(scrubber.held_count(), 0);
}

#[test]
fn negatives_stay_intact() {
    let negatives = [
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",
        "id 123e4567-e89b-12d3-a456-426614174000",
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "integrity=\"sha384-oqVuAfXRKap7fdgcCY5uykM6+R9GqQ8K/uxy9rx7HNQlGYl1kPzQho1wx4JwY8wC\"",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGQn7ZqW0Vj3bA alice@laptop",
        "origin\thttps://alice@github.com/o/r.git (fetch)",
        "origin\tgit@github.com:o/r.git (push)",
        "TOKEN_URL=https://auth.example.com/token",
        "PASSWORD_FILE=/run/secrets/db",
        "GITHUB_TOKEN=${GITHUB_TOKEN}",
        "API_KEY=<TOKEN>",
        "password: ****",
        "ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "PWD=/home/alice/src",
        "The password is stored in the keyring; pass the key name, not the token.",
        "max_tokens: 4096, input_tokens: 12",
        "Authorization is required for this endpoint.",
        "see https://docs.example.com:8443/a/b?x=1",
        "task-force and desk-lamp are words",
        "secret_ref = \"credential:broker-uri\"",
        "public key: ed25519:KvBwhG41KeHpZUEtXHykjZ4r28Bh+vpsy8CTO6a8IKE=",
        "pubkey = \"ed25519:KvBwhG41KeHpZUEtXHykjZ4r28Bh+vpsy8CTO6a8IKE=\"",
        "rabbitmqadmin --vhost=/f1 declare binding source=fleet.send destination=host.h1 destination_type=exchange routing_key='agent.h1.*'",
        "curl -X POST --data '{\"routing_key\":\"ctl.#\"}' http://localhost/api/bindings/%2Ff1/e/x.in.f2/e/fleet.send",
        "bindingKey: roster.h1",
    ];
    for negative in negatives {
        assert_intact(negative);
    }
}

#[test]
fn markers_never_carry_length_prefix_or_suffix() {
    let github = tok("ghp_", 36);
    let out = scrubbed(&format!("a {github} b"));
    assert_eq!(out, "a [redacted:github-token] b");
}

// ---------------------------------------------------------------------------------------------
// Real-world shapes (one test per family, named after it), each with its harmless look-alikes.

#[track_caller]
fn assert_table(cases: &[(&str, &str)]) {
    for (input, expected) in cases {
        assert_eq!(&scrubbed(input), expected, "input {input:?}");
    }
}

#[test]
fn pem_keys_indented_lowercase_four_dash_and_putty() {
    let body = "MIIEowIBAAKCAQEAzQ8Hh3kZ1x0bRkF9PzYx2Lr7m9WqVn3cJ5d";
    assert_table(&[
        (
            &format!(
                "key: |\n  -----BEGIN RSA PRIVATE KEY-----\n  {body}\n  {body}\n  -----END RSA PRIVATE KEY-----\nnext: 1\n"
            ),
            "key: |\n  -----BEGIN RSA PRIVATE KEY-----\n  [redacted:private-key]\n  -----END RSA PRIVATE KEY-----\nnext: 1\n",
        ),
        (
            &format!("-----begin rsa private key-----\n{body}\n-----end rsa private key-----\n"),
            "-----begin rsa private key-----\n[redacted:private-key]\n-----end rsa private key-----\n",
        ),
        (
            &format!("----BEGIN RSA PRIVATE KEY----\n{body}\n----END RSA PRIVATE KEY----\n"),
            "----BEGIN RSA PRIVATE KEY----\n[redacted:private-key]\n----END RSA PRIVATE KEY----\n",
        ),
        (
            &format!(
                "{{\"k\":\"-----BEGIN OPENSSH PRIVATE KEY-----\\n{body}\\n-----END OPENSSH PRIVATE KEY-----\\n\"}}"
            ),
            "{\"k\":\"-----BEGIN OPENSSH PRIVATE KEY-----[redacted:private-key]-----END OPENSSH PRIVATE KEY-----\\n\"}",
        ),
        (
            &format!(
                "PuTTY-User-Key-File-3: ssh-rsa\nPublic-Lines: 1\nAAAAB3NzaC1yc2E\nPrivate-Lines: 2\n{body}\n{body}\nPrivate-MAC: 8f3b2a1c\n"
            ),
            "PuTTY-User-Key-File-3: ssh-rsa\nPublic-Lines: 1\nAAAAB3NzaC1yc2E\nPrivate-Lines: 2\n[redacted:private-key]\nPrivate-MAC: 8f3b2a1c\n",
        ),
        // Certificates and public keys are not secrets, indented or not.
        (
            "  -----BEGIN CERTIFICATE-----\n  MIIBszCCAVmgAwIBAgIU\n  -----END CERTIFICATE-----\n",
            "  -----BEGIN CERTIFICATE-----\n  MIIBszCCAVmgAwIBAgIU\n  -----END CERTIFICATE-----\n",
        ),
    ]);
}

#[test]
fn docker_auths_and_auth_values() {
    let basic = "Ym90OmRja3JfcGF0X2FiY2RlZmdoaWprbG1ub3BxcnN0dXY=";
    assert_table(&[
        (
            &format!("{{\"auths\":{{\"r.example\":{{\"auth\":\"{basic}\"}}}}}}"),
            "{\"auths\":{\"r.example\":{\"auth\":\"[redacted:credential]\"}}}",
        ),
        (&format!("_auth = {basic}"), "_auth = [redacted:credential]"),
        (
            "REDISCLI_AUTH=Zq8xVm3nKp2Lr7Ts",
            "REDISCLI_AUTH=[redacted:credential]",
        ),
        ("auth: enabled", "auth: enabled"),
        ("the author wrote auth code", "the author wrote auth code"),
        (
            "Proxy-Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
            "Proxy-Authorization: Basic [redacted:basic-auth]",
        ),
    ]);
}

#[test]
fn gitlab_routable_tokens_lose_their_suffix_too() {
    let token = tok("glpat-", 27);
    assert_table(&[
        (&format!("{token}.01.0r03k8m2x"), "[redacted:gitlab-token]"),
        (&format!("use {token}."), "use [redacted:gitlab-token]."),
    ]);
}

#[test]
fn secret_named_variables_in_env_dumps() {
    assert_table(&[
        (
            "SECRET_KEY_BASE=9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928",
            "SECRET_KEY_BASE=[redacted:secret]",
        ),
        (
            "DB_PASSWORD_PROD=Xk9mPq2RtV7wYz",
            "DB_PASSWORD_PROD=[redacted:password]",
        ),
        (
            "API_KEY_V2=abcDEF123ghiJKL456mnoPQR",
            "API_KEY_V2=[redacted:key]",
        ),
        ("PGPASSWORD=Tr0ub4dor3xyz", "PGPASSWORD=[redacted:password]"),
        (
            "export MYSQL_PWD=Tr0ub4dor3xyz",
            "export MYSQL_PWD=[redacted:password]",
        ),
        // Values the placeholder rule used to spare.
        ("PASSWORD=$ecretP4ss", "PASSWORD=[redacted:password]"),
        (
            "PASSWORD=~/weird-but-secret9",
            "PASSWORD=[redacted:password]",
        ),
        ("PASSWORD=aaaaaaB9x!", "PASSWORD=[redacted:password]"),
        // Names about a secret, not holding one.
        (
            "PASSWORD_FILE=/run/secrets/x",
            "PASSWORD_FILE=/run/secrets/x",
        ),
        (
            "TOKEN_URL=https://auth.example/token",
            "TOKEN_URL=https://auth.example/token",
        ),
        ("SECRET_NAME=broker-uri", "SECRET_NAME=broker-uri"),
        ("PASSWORD_MIN_LENGTH=12", "PASSWORD_MIN_LENGTH=12"),
        ("TOKEN_LIMIT=100000000", "TOKEN_LIMIT=100000000"),
        ("\"token_type\": \"bearer\"", "\"token_type\": \"bearer\""),
        ("PASSWORD=$DB_PASSWORD", "PASSWORD=$DB_PASSWORD"),
    ]);
}

#[test]
fn placeholders_documentation_paths_and_code_stay() {
    for line in [
        "export GITHUB_TOKEN=ghp_...",
        "OPENAI_API_KEY=sk-proj-...",
        "SLACK_BOT_TOKEN=xoxb-your-bot-token",
        "API_KEY=your-api-key-here",
        "API_KEY=YOUR_API_KEY",
        "password: [REDACTED]",
        "token=[redacted:token]",
        "broker = amqp://USER:PASSWORD@HOST:PORT/VHOST",
        "psql postgres://user:password@localhost/db",
        "Password: must be at least 12 characters",
        "PASSWORD_FILE=/run/secrets/x",
        "    pub token: SecretString,",
        "    let password: &str = \"\";",
        "    token: Option<String>,",
        "    secret_key: String,",
        "password = getpass()",
        "api_key = os.environ[\"API_KEY\"]",
        "token = self.token",
        "password: ********",
    ] {
        assert_intact(line);
    }
}

#[test]
fn passwords_on_command_lines() {
    assert_table(&[
        (
            "mysql -uroot -pS3cretPw99 db",
            "mysql -uroot -p[redacted:password] db",
        ),
        (
            "mysqldump -u root -p'S3cret Pw' db",
            "mysqldump -u root -p'[redacted:password]' db",
        ),
        (
            "psql --password S3cretPw99",
            "psql --password [redacted:password]",
        ),
        (
            "app --password=S3cretPw99 --v",
            "app --password=[redacted:password] --v",
        ),
        (
            "sshpass -p S3cretPw99 ssh host",
            "sshpass -p [redacted:password] ssh host",
        ),
        (
            "docker login -u bot -p S3cretPw99 registry",
            "docker login -u bot -p [redacted:password] registry",
        ),
        (
            "helm registry login r.example -u a -p S3cretPw99",
            "helm registry login r.example -u a -p [redacted:password]",
        ),
        // `-p` that is not a password: a prompt, a directory flag, a protocol, a port.
        ("mysql -u root -p db", "mysql -u root -p db"),
        ("mkdir -p /tmp/x", "mkdir -p /tmp/x"),
        ("gh auth login -p ssh", "gh auth login -p ssh"),
        ("ssh -p 2222 host", "ssh -p 2222 host"),
        (
            "echo x | docker login --password-stdin",
            "echo x | docker login --password-stdin",
        ),
        ("psql --password -h db", "psql --password -h db"),
    ]);
}

#[test]
fn urls_escaped_encoded_and_protocol_relative() {
    assert_table(&[
        (
            "{\"url\":\"https:\\/\\/user:S3cretPw99@host.example\\/x\"}",
            "{\"url\":\"https:\\/\\/user:[redacted:password]@host.example\\/x\"}",
        ),
        (
            "next=https%3A%2F%2Fuser%3AS3cretPw99%40host.example%2Fx&y=1",
            "next=https%3A%2F%2Fuser%3A[redacted:password]%40host.example%2Fx&y=1",
        ),
        (
            "next=https%3a%2f%2fuser%3aS3cretPw99%40host.example",
            "next=https%3a%2f%2fuser%3a[redacted:password]%40host.example",
        ),
        (
            "curl //user:S3cretPw99@host.example/x",
            "curl //user:[redacted:password]@host.example/x",
        ),
        // Not credentials: an encoded path with an `@`, a comment, a path with `//`.
        (
            "redirect=https%3A%2F%2Fexample.com%2Fpath%40x",
            "redirect=https%3A%2F%2Fexample.com%2Fpath%40x",
        ),
        ("// note: see user:x@y", "// note: see user:x@y"),
        (
            "see https://example.com//a:b@c",
            "see https://example.com//a:b@c",
        ),
    ]);
}

#[test]
fn aws_console_credentials_csv_and_cookies() {
    let id = tok("AKIA", 16).to_uppercase();
    let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8KxPLmQ2";
    assert_table(&[
        (
            "User name,Password,Access key ID,Secret access key,Console login link",
            "User name,Password,Access key ID,Secret access key,Console login link",
        ),
        (
            &format!("alice,S3cretPw99,{id},{secret},https://x.signin.aws.amazon.com/console"),
            "alice,[redacted:password],[redacted:aws-access-key-id],[redacted:aws-secret-key],https://x.signin.aws.amazon.com/console",
        ),
        (
            "bob,Pw4Bob!x,https://123.signin.aws.amazon.com/console",
            "bob,[redacted:password],https://123.signin.aws.amazon.com/console",
        ),
        (
            &format!("{id},{secret}"),
            "[redacted:aws-access-key-id],[redacted:aws-secret-key]",
        ),
        (
            "Cookie: sessionid=a8f5f167f44f4964e6c998dee827110c; csrftoken=abc; theme=dark",
            "Cookie: sessionid=[redacted:cookie]; csrftoken=abc; theme=dark",
        ),
        (
            "Set-Cookie: sid=Zk29aLm38QpX; Path=/; Domain=example.com; HttpOnly",
            "Set-Cookie: sid=[redacted:cookie]; Path=/; Domain=example.com; HttpOnly",
        ),
        ("the cookie: chocolate chip", "the cookie: chocolate chip"),
    ]);
}

#[test]
fn a_pause_mid_passphrase_releases_nothing_of_it() {
    let scrubber = holding("phrase", "correct horse battery staple");
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    stream.write(b"say correct horse", &mut out);
    stream.flush_idle(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "say ",
        "released before the pause"
    );
    stream.write(b" battery staple now\n", &mut out);
    stream.finish(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "say [redacted:held-secret] now\n"
    );
}

#[test]
fn a_long_line_cut_inside_a_quoted_password_redacts_all_of_it() {
    let value = "Zq8 xVm3 nKp2 Lr7Ts Wq9e";
    for shift in 0..value.len() + 12 {
        // The cut (every 64 KiB of a line) falls `shift` bytes before the value ends.
        let assignment = format!("password=\"{value}\" tail");
        let filler = super::stream::BLOCK - (assignment.len() - 5) + shift;
        let line = format!(
            "{}{assignment}\n",
            "w ".repeat(filler / 2) + &"w".repeat(filler % 2)
        );
        let mut stream = Scrubber::new().stream();
        let mut out = Vec::new();
        for chunk in line.as_bytes().chunks(997) {
            stream.write(chunk, &mut out);
        }
        stream.finish(&mut out);
        let out = String::from_utf8_lossy(&out);
        for word in value.split(' ') {
            assert!(
                !out.contains(word),
                "shift {shift}: `{word}` survived: {}",
                &out[out.len().saturating_sub(120)..]
            );
        }
        assert!(
            out.ends_with(" tail\n"),
            "shift {shift}: {}",
            &out[out.len().saturating_sub(120)..]
        );
    }
}

/// `payload` in base64, wrapped at `width` columns after `indent`, with `eol` line ends.
fn wrapped_base64(payload: &[u8], width: usize, indent: &str, eol: &str) -> Vec<String> {
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, payload);
    encoded
        .as_bytes()
        .chunks(width)
        .map(|line| format!("{indent}{}{eol}", String::from_utf8_lossy(line)))
        .collect()
}

#[test]
fn a_held_secret_in_wrapped_base64_is_redacted_on_both_lines() {
    let value = "Cn4ry-h3ld-S3cr3t-v4lue+/=";
    let scrubber = holding("canary", value);
    let filler: Vec<u8> = (0u32..200).map(|i| (i * 37 % 251) as u8).collect();
    for (width, indent, eol) in [(76, "", "\n"), (64, "    ", "\n"), (76, "", "\r\n")] {
        // Every offset of the value against the wrap, so the break falls at every place in it.
        for at in 0..width {
            let mut payload = filler[..at + 40].to_vec();
            payload.extend_from_slice(value.as_bytes());
            payload.extend_from_slice(&filler[..50]);
            let lines = wrapped_base64(&payload, width, indent, eol);
            let text = format!("$ base64 key\n{}$ done\n", lines.concat());
            // The base64 characters that encode the value alone (as `known::base64_cores`).
            let p = at + 40;
            let lead = [0, 2, 3][p % 3];
            let core = (p / 3 * 4 + lead)..(p / 3 * 4 + (p % 3 + value.len()) / 3 * 4);
            let expected: String = std::iter::once("$ base64 key\n".to_owned())
                .chain(lines.iter().enumerate().map(|(i, line)| {
                    let chars = (i * width)..((i + 1) * width);
                    if chars.start < core.end && core.start < chars.end {
                        format!("{indent}[redacted:held-secret]{eol}")
                    } else {
                        line.clone()
                    }
                }))
                .chain(std::iter::once("$ done\n".to_owned()))
                .collect();
            let case = format!("width {width}, indent {indent:?}, eol {eol:?}, offset {at}");
            assert_eq!(scrubber.scrub(&text), expected, "{case}, one write");
            for size in [1, 7, 80] {
                let mut stream = scrubber.stream();
                let mut out = Vec::new();
                for chunk in text.as_bytes().chunks(size) {
                    stream.write(chunk, &mut out);
                }
                stream.finish(&mut out);
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    expected,
                    "{case}, {size}-byte writes"
                );
            }
        }
    }
}

#[test]
fn a_pause_after_a_wrapped_line_releases_nothing_of_the_held_secret() {
    let value = "Cn4ry-h3ld-S3cr3t-v4lue+/=";
    let scrubber = holding("canary", value);
    // The value's encoding starts 10 characters before the end of the first 76-column line.
    let mut payload = vec![b'x'; 54];
    payload.extend_from_slice(value.as_bytes());
    payload.extend_from_slice(&[b'y'; 30]);
    let lines = wrapped_base64(&payload, 76, "", "\n");
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    stream.write(lines[0].as_bytes(), &mut out);
    stream.flush_idle(&mut out);
    assert!(out.is_empty(), "released before the next line: {out:?}");
    stream.write(lines[1].as_bytes(), &mut out);
    stream.finish(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "[redacted:held-secret]\n[redacted:held-secret]\n"
    );
    // Wrapped base64 that holds no held value goes out at the pause.
    let lines = wrapped_base64(&[b'z'; 200], 76, "", "\n");
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    stream.write(lines[0].as_bytes(), &mut out);
    stream.flush_idle(&mut out);
    assert_eq!(String::from_utf8_lossy(&out), lines[0]);
}
