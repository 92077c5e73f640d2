//! `amqps` with a pinned CA bundle (`broker.ca_file`), against a real TLS server (`openssl
//! s_server`, certificates made by the `openssl` CLI): the TLS handshake completes when the
//! server's chain leads to the pinned CA, and is refused — "unknown issuer" — when it leads to any
//! other CA. The platform's trust store plays no part once a bundle is pinned.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code fails loudly"
)]

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetd::broker::{ConnectError, connect, pin_ca};
use fleetd::secret::BrokerUri;
use secrecy::SecretString;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the `openssl` command is needed to make test certificates (package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA named `name` (`NAME.pem`, `NAME.key`).
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A server certificate for `localhost` signed by CA `issuer` (`server.pem`, `server.key`).
fn server_cert(dir: &Path, issuer: &str) {
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{issuer}.pem"),
            "-CAkey",
            &format!("{issuer}.key"),
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects to an `openssl s_server` with `pinned` as the CA bundle; returns the connect error
/// and what the server printed. The server is no AMQP broker, so the connection never succeeds:
/// what matters is whether TLS got through.
async fn attempt(dir: &Path, pinned: &str) -> (ConnectError, String) {
    let port = free_port();
    let mut server = Command::new("openssl")
        .args([
            "s_server",
            "-accept",
            &port.to_string(),
            "-cert",
            "server.pem",
            "-key",
            "server.key",
            "-naccept",
            "1",
        ])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut uri = BrokerUri::parse(&SecretString::from(format!(
        "amqps://u:p@localhost:{port}/%2Ff"
    )))
    .unwrap();
    pin_ca(&mut uri, Some(&dir.join(format!("{pinned}.pem")))).unwrap();
    // The server reads the AMQP header and never answers: stop it after a moment, which ends
    // the attempt either way.
    let killer = {
        let pid = server.id();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let _ = Command::new("kill").arg(pid.to_string()).status();
        })
    };
    let error = tokio::time::timeout(Duration::from_secs(20), connect(&uri, None))
        .await
        .expect("the attempt ends")
        .expect_err("an openssl s_server is not a broker");
    killer.join().unwrap();
    let _ = server.wait();
    let mut printed = String::new();
    server
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    (error, printed)
}

#[tokio::test]
async fn amqps_trusts_only_the_pinned_ca() {
    let dir = tempfile::tempdir().unwrap();
    ca(dir.path(), "fleet-ca");
    ca(dir.path(), "other-ca");
    server_cert(dir.path(), "fleet-ca");

    let (error, printed) = attempt(dir.path(), "fleet-ca").await;
    assert!(
        printed.contains("CIPHER is"),
        "the handshake completes with the pinned CA: server printed {printed:?}; error {error}"
    );
    assert!(
        !error.to_string().to_lowercase().contains("certificate"),
        "no certificate error with the pinned CA: {error}"
    );

    let (error, printed) = attempt(dir.path(), "other-ca").await;
    assert!(
        !printed.contains("CIPHER is"),
        "no handshake with another CA pinned: {printed:?}"
    );
    assert!(
        error.to_string().contains("UnknownIssuer"),
        "refused for its issuer: {error}"
    );
}

#[test]
fn a_pinned_bundle_must_hold_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("empty.pem");
    std::fs::write(&bundle, "not a certificate\n").unwrap();
    let mut uri = BrokerUri::parse(&SecretString::from("amqps://u:p@localhost/%2Ff")).unwrap();
    let error = pin_ca(&mut uri, Some(&bundle)).unwrap_err().to_string();
    assert!(error.contains("no certificate"), "{error}");
    let error = pin_ca(&mut uri, Some(&dir.path().join("missing.pem")))
        .unwrap_err()
        .to_string();
    assert!(error.contains("cannot read `broker.ca_file`"), "{error}");
    assert!(uri.ca_pem.is_none(), "nothing pinned after a failure");
}
