//! `fleetd broker grants --apply` then `fleetd broker contract` against the machine's real
//! RabbitMQ: 8/8 PASS on a fleet's own vhost, 8/8 FAIL with its credential on another fleet's
//! vhost (admitted or not). Each run creates uniquely named vhosts and users and removes them.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;

use common::{BIN, Fleets, grants, host_grants, nonce};

fn contract(user: &str, password: &str, own_vhost: &str, vhost: &str, expect: &str) -> String {
    contract_with(user, password, own_vhost, vhost, &["--expect", expect])
}

fn contract_with(
    user: &str,
    password: &str,
    own_vhost: &str,
    vhost: &str,
    extra: &[&str],
) -> String {
    let (held, out) = run_contract(user, password, own_vhost, vhost, extra);
    assert!(
        held,
        "contract of {user} on {vhost} ({extra:?}) did not hold:\n{out}"
    );
    out
}

/// `fleetd broker contract`: whether it exited 0, and its output.
fn run_contract(
    user: &str,
    password: &str,
    own_vhost: &str,
    vhost: &str,
    extra: &[&str],
) -> (bool, String) {
    let uri = format!("amqp://{user}:{password}@127.0.0.1:5672/%2F{own_vhost}");
    let output = Command::new(BIN)
        .args([
            "broker",
            "contract",
            "--uri-env",
            "FLEETD_TEST_BROKER_URI",
            "--vhost",
            vhost,
        ])
        .args(extra)
        .env("FLEETD_TEST_BROKER_URI", uri)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !out.contains(password),
        "the password leaked into the contract output: {out}"
    );
    (output.status.success(), out)
}

#[test]
fn own_vhost_passes_all_eight_and_other_vhosts_fail_all_eight() {
    let nonce = nonce();
    let (a, b, c) = (
        format!("ct-a{nonce}"),
        format!("ct-b{nonce}"),
        format!("ct-c{nonce}"),
    );
    let _cleanup = Fleets::new(&[&a, &b, &c]);
    let (pa, pb, pc) = (
        format!("PwA{nonce}x"),
        format!("PwB{nonce}x"),
        format!("PwC{nonce}x"),
    );
    grants(&a, &[&b], &pa);
    grants(&b, &[&a], &pb);
    grants(&a, &[&b], &pa); // re-applied once b exists: b gets its write on x.in.b in /a
    grants(&c, &[&a], &pc);

    let own = contract(&a, &pa, &a, &format!("/{a}"), "capable");
    assert!(own.contains("8/8 checks passed"), "{own}");
    let own_b = contract(&b, &pb, &b, &format!("/{b}"), "capable");
    assert!(own_b.contains("8/8 checks passed"), "{own_b}");

    // b is admitted into /a: it connects, but every capability is refused by the broker.
    let admitted = contract(&b, &pb, &b, &format!("/{a}"), "isolated");
    assert!(admitted.contains("0/8 checks passed"), "{admitted}");
    assert!(
        admitted.contains("ACCESS_REFUSED"),
        "the refusals come from the broker: {admitted}"
    );
    // c is not admitted into /b: the connection itself is refused.
    let stranger = contract(&c, &pc, &c, &format!("/{b}"), "isolated");
    assert!(stranger.contains("0/8 checks passed"), "{stranger}");

    // A vhost that does not exist proves nothing: refused, named, and the missing leading slash
    // of a fleet's vhost is added and said so.
    let missing = format!("ct-missing{nonce}");
    let (held, out) = run_contract(&a, &pa, &a, &missing, &["--expect", "isolated"]);
    assert!(!held, "a missing vhost passed for isolation: {out}");
    assert!(
        out.contains(&format!("checking `/{missing}`"))
            && out.contains(&format!("the broker has no vhost `/{missing}`")),
        "{out}"
    );
    assert!(!out.contains("checks passed"), "no checks were run: {out}");
}

/// Host-scoped credentials: each host's user `FLEET.HOST` does a gateway's whole job in the
/// fleet's vhost, and the broker refuses it a sibling host's control queue and every binding
/// that would copy a sibling's traffic into its own queue (from `host.SIBLING`, from
/// `fleet.send`) — and its own credential's fleet user is not needed at all.
#[test]
fn each_host_user_passes_the_contract_and_gets_neither_a_siblings_queue_nor_copies_of_its_traffic()
{
    let nonce = nonce();
    let (f, g) = (format!("ch-f{nonce}"), format!("ch-g{nonce}"));
    let _cleanup = Fleets::new(&[&f, &g]);
    let (pf, pg, p1, p2) = (
        format!("PwF{nonce}x"),
        format!("PwG{nonce}x"),
        format!("PwH1{nonce}x"),
        format!("PwH2{nonce}x"),
    );
    grants(&f, &[], &pf);
    grants(&g, &[&f], &pg);
    host_grants(&f, "h1", &[&g], &p1);
    host_grants(&f, "h2.lab", &[], &p2);
    let (h1, h2) = (format!("{f}.h1"), format!("{f}.h2.lab"));
    for (user, password, sibling) in [(&h1, &p1, "h2.lab"), (&h2, &p2, "h1")] {
        let out = contract_with(
            user,
            password,
            &f,
            &format!("/{f}"),
            &["--sibling", sibling],
        );
        assert!(out.contains("9/9 checks passed"), "{out}");
        assert!(
            out.contains("PASS a sibling host's queue and traffic refused"),
            "{out}"
        );
    }
    // The check is not vacuous: the fleet user (which reaches every host's queues) fails it.
    let shared = Command::new(BIN)
        .args([
            "broker",
            "contract",
            "--uri-env",
            "FLEETD_TEST_BROKER_URI",
            "--sibling",
            "h1",
        ])
        .env(
            "FLEETD_TEST_BROKER_URI",
            format!("amqp://{f}:{pf}@127.0.0.1:5672/%2F{f}"),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shared.stdout);
    assert!(!shared.status.success(), "{text}");
    assert!(
        text.contains("FAIL a sibling host's queue and traffic refused"),
        "{text}"
    );
    // A host user is no fleet user anywhere else: in the fleet that admits its own, it may
    // only write the ingress exchange; a fleet that does not name it refuses it outright.
    let admitted = contract(&h1, &p1, &f, &format!("/{g}"), "isolated");
    assert!(admitted.contains("0/8 checks passed"), "{admitted}");
    let stranger = contract(&h2, &p2, &f, &format!("/{g}"), "isolated");
    assert!(stranger.contains("0/8 checks passed"), "{stranger}");
}
