//! `fleetd broker grants --apply` then `fleetd broker contract` against the machine's real
//! RabbitMQ: 8/8 PASS on a fleet's own vhost, 8/8 FAIL with its credential on another fleet's
//! vhost (admitted or not). Each run creates uniquely named vhosts and users and removes them.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;

use common::{BIN, Fleets, grants, nonce};

fn contract(user: &str, password: &str, own_vhost: &str, vhost: &str, expect: &str) -> String {
    let uri = format!("amqp://{user}:{password}@127.0.0.1:5672/%2F{own_vhost}");
    let output = Command::new(BIN)
        .args([
            "broker",
            "contract",
            "--uri-env",
            "FLEETD_TEST_BROKER_URI",
            "--vhost",
            vhost,
            "--expect",
            expect,
        ])
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
    assert!(
        output.status.success(),
        "contract of {user} on {vhost} did not show `{expect}`:\n{out}"
    );
    out
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
}
