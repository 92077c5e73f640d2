//! The grants `fleetd broker grants` prints are the grants that work: two fleets, one host each,
//! set up on node c1 of the test cluster (`scripts/cluster`, with the management API that
//! `rabbitmqadmin` talks to) **only** by running the printed RabbitMQ scripts exactly as printed
//! (`sh -e`), as root, with `rabbitmqctl` pointed at the node by `RABBITMQ_NODENAME` and
//! `rabbitmqadmin` by its `~/.rabbitmqadmin.conf` — then a message each way between the hosts,
//! with its receipts. No printed line carries a scrubber marker; routing keys are verbatim.
//! (The LavinMQ scripts are checked line by line against LavinMQ's grammar in
//! `broker::grants::tests`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{BIN, Fleets, Host, cluster, nonce, start_pair};

/// `fleetd broker grants ARGS`, printed: the script text.
fn printed(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["broker", "grants"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "grants {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in text.lines() {
        assert!(!line.contains("[redacted"), "a scrubber marker: {line}");
    }
    text
}

/// Runs `script` as printed, with `sh -e`, against node c1 (`home` holds rabbitmqadmin's
/// config).
fn run_as_printed(script: &str, home: &Path, what: &str) {
    let file = home.join(format!("{what}.sh"));
    std::fs::write(&file, script).unwrap();
    let out = Command::new("sh")
        .arg("-e")
        .arg(&file)
        .env("HOME", home)
        .env("RABBITMQ_NODENAME", "c1@localhost")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the printed {what} script failed as printed:\n{script}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn two_fleets_set_up_only_by_the_printed_scripts_route_messages_both_ways() {
    cluster(&["await"]);
    assert!(
        std::net::TcpStream::connect_timeout(
            &"127.0.0.1:15681".parse().unwrap(),
            Duration::from_secs(2)
        )
        .is_ok(),
        "node c1's management API (127.0.0.1:15681, for rabbitmqadmin) is not listening: \
         restart the test cluster (`scripts/cluster stop; scripts/cluster start`)"
    );
    assert!(
        Command::new("rabbitmqadmin")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "rabbitmqadmin is missing (Debian's rabbitmq-server package ships it)"
    );
    let nonce = nonce();
    let (fa, fb) = (format!("ga{nonce}"), format!("gb{nonce}"));
    let mut cleanup = Fleets::new(&[&fa, &fb]);
    cleanup.node = Some("c1@localhost".to_owned());
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".rabbitmqadmin.conf"),
        "[default]\nhostname = 127.0.0.1\nport = 15681\nusername = guest\npassword = guest\n",
    )
    .unwrap();
    let (pa, pb) = (format!("PwGa{nonce}x"), format!("PwGb{nonce}x"));
    let (file_a, file_b) = (home.path().join("a1.pw"), home.path().join("b1.pw"));
    std::fs::write(&file_a, format!("{pa}\n")).unwrap();
    std::fs::write(&file_b, format!("{pb}\n")).unwrap();

    let scripts = [
        ("fleet-a", printed(&["--fleet", &fa, "--admit", &fb])),
        ("fleet-b", printed(&["--fleet", &fb, "--admit", &fa])),
        (
            "host-a1",
            printed(&[
                "--fleet",
                &fa,
                "--host",
                "a1",
                "--into",
                &fb,
                "--password-file",
                file_a.to_str().unwrap(),
            ]),
        ),
        (
            "host-b1",
            printed(&[
                "--fleet",
                &fb,
                "--host",
                "b1",
                "--into",
                &fa,
                "--password-file",
                file_b.to_str().unwrap(),
            ]),
        ),
    ];
    // The keys as they must be bound, verbatim.
    assert!(
        scripts[2].1.contains("routing_key='agent.a1.*'"),
        "{}",
        scripts[2].1
    );
    assert!(
        scripts[0].1.contains("routing_key='ctl.#'"),
        "{}",
        scripts[0].1
    );
    for (what, script) in &scripts {
        assert!(!script.contains(&pa) && !script.contains(&pb), "{script}");
        run_as_printed(script, home.path(), what);
    }

    let root = tempfile::tempdir().unwrap();
    let (mut a, mut b) = (Host::new(root.path(), "a1"), Host::new(root.path(), "b1"));
    a.broker_user = Some(format!("{fa}.a1"));
    b.broker_user = Some(format!("{fb}.b1"));
    for host in [&mut a, &mut b] {
        host.broker_nodes = "127.0.0.1:5681".to_owned();
    }
    let pair = start_pair((&a, &fa, &pa), (&b, &fb, &pb), &mut cleanup);
    let (primary, worker) = (&pair.primary, &pair.worker);
    for (from_host, to_host, from, to) in [(&a, &b, primary, worker), (&b, &a, worker, primary)] {
        let text = format!("from {} to {}", from_host.name, to_host.name);
        let (id, route) = from_host.send(to, from, &text);
        assert_eq!(route, "foreign");
        from_host.wait_delivery(&id, "delivered");
        let held = to_host.held(to);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0]["body"]["text"], text.as_str());
        to_host.cli(&["inbox", "ack", &id]);
        from_host.wait_delivery(&id, "acknowledged");
    }
}
