//! Gateways on the real RabbitMQ see each other through signed presence beats: within one fleet
//! a join within one beat, a SIGKILLed peer suspect then reaped on time, a restarted peer back,
//! a gracefully stopped peer gone at once (`leaving`); across two fleets through their ingress
//! exchanges.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{BIN, Fleets, Host, grants, nonce, terminate};

/// Waits for a log line containing every needle; returns how long it took.
fn wait_for(lines: &mpsc::Receiver<String>, needles: &[&str], within: Duration) -> Duration {
    common::wait_for(lines, &mut String::new(), needles, within)
}

#[test]
fn peers_join_go_suspect_are_reaped_come_back_and_leave() {
    let nonce = nonce();
    let fleet = format!("ro{nonce}");
    let password = format!("PwR{nonce}x");
    let mut cleanup = Fleets::new(&[&fleet]);
    grants(&fleet, &[], &password);
    let root = tempfile::tempdir().unwrap();
    let (one, two) = (Host::new(root.path(), "one"), Host::new(root.path(), "two"));

    let (first, watch) = one.start(&fleet, &password, &[], &[(&two, &fleet)]);
    cleanup.children.push(first);
    let (second, _) = two.start(&fleet, &password, &[], &[(&one, &fleet)]);
    cleanup.children.push(second);
    wait_for(
        &watch,
        &["peer joined", "\"peer.host\":\"two\""],
        Duration::from_secs(15),
    );
    let roster = Command::new(BIN)
        .args([
            "--config",
            one.dir.join("fleetd.toml").to_str().unwrap(),
            "roster",
        ])
        .env("HOME", &one.dir)
        .env("XDG_RUNTIME_DIR", one.dir.join("run"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&roster.stdout);
    assert!(
        roster.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&roster.stderr)
    );
    assert!(
        table.contains("one") && table.contains("two") && table.contains("alive"),
        "{table}"
    );

    // SIGKILL: no `leaving`; the peer goes suspect after 3 s of silence and is reaped after 6 s.
    let killed = Instant::now();
    cleanup.children[1].kill().unwrap();
    cleanup.children[1].wait().unwrap();
    common::suspect_then_reaped(&watch, "two", killed);

    // Restarted: back with a new boot.
    let (again, _) = two.start(&fleet, &password, &[], &[(&one, &fleet)]);
    cleanup.children[1] = again;
    wait_for(
        &watch,
        &["peer joined", "\"peer.host\":\"two\""],
        Duration::from_secs(15),
    );

    // Graceful stop: `leaving` removes it at once.
    terminate(&cleanup.children[1]);
    let left = wait_for(
        &watch,
        &["peer left", "\"peer.host\":\"two\""],
        Duration::from_secs(10),
    );
    assert!(
        left < Duration::from_secs(3),
        "left after {left:?}, before any suspicion"
    );
}

#[test]
fn presence_crosses_fleets_through_ingress_exchanges() {
    let nonce = nonce();
    let (a, b) = (format!("xa{nonce}"), format!("xb{nonce}"));
    let (pa, pb) = (format!("PwXA{nonce}x"), format!("PwXB{nonce}x"));
    let mut cleanup = Fleets::new(&[&a, &b]);
    grants(&a, &[&b], &pa);
    grants(&b, &[&a], &pb);
    grants(&a, &[&b], &pa);
    let root = tempfile::tempdir().unwrap();
    let (alpha, beta) = (
        Host::new(root.path(), "alpha"),
        Host::new(root.path(), "beta"),
    );
    let (first, watch_alpha) = alpha.start(&a, &pa, &[&b], &[(&beta, &b)]);
    cleanup.children.push(first);
    let (second, watch_beta) = beta.start(&b, &pb, &[&a], &[(&alpha, &a)]);
    cleanup.children.push(second);
    let fleet_b = format!("\"peer.fleet\":\"{b}\"");
    let fleet_a = format!("\"peer.fleet\":\"{a}\"");
    wait_for(
        &watch_alpha,
        &["peer joined", "\"peer.host\":\"beta\"", &fleet_b],
        Duration::from_secs(20),
    );
    wait_for(
        &watch_beta,
        &["peer joined", "\"peer.host\":\"alpha\"", &fleet_a],
        Duration::from_secs(20),
    );
    terminate(&cleanup.children[1]);
    wait_for(
        &watch_alpha,
        &["peer left", "\"peer.host\":\"beta\""],
        Duration::from_secs(10),
    );
}
