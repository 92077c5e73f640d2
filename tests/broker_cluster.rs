//! Delivery across a real 3-node RabbitMQ cluster (`scripts/cluster`: c1..c3@localhost on
//! 5681..5683, started by `scripts/test`) with quorum queues. Two fleets, one host each; each
//! host's broker URI names all three nodes. Three numbered streams from fleet A's agent to fleet
//! B's agent, one per fault:
//!
//! (a) the node leading the worker's inbox stops (`stop_app`) mid-stream and starts again;
//! (b) the node the receiving host is connected to is killed (SIGKILL): the host is back on
//!     another node within 5 s (the acceptance bound), and the node restarts;
//! (c) the sending host's node stops for three times `skew_secs` and starts again.
//!
//! Each message arrives exactly once, in order, every delivery state ends `delivered`, nothing
//! is refused as late, and the audit chains verify. Before the streams, the contract passes 8/8
//! with quorum queues through each node (reject-publish's one-more on quorum accounted for).
//!
//! A second test kills, five times, the node both hosts are connected to, while both hosts
//! stream to each other (quorum queues answer publishes with bare nacks for seconds after such
//! a kill — the messages must wait, not fail), then restarts the sender and sends to the remote
//! agent at once (its placement must come from the state store, not the first beat).
//!
//! This binary stops and kills cluster nodes: its tests take turns (`exclusive`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{Fleets, Host, cluster, grants_on, nonce, start_pair, terminate, wait_for};

/// One test at a time: each stops and kills nodes.
static CLUSTER: Mutex<()> = Mutex::new(());

fn exclusive() -> MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(PoisonError::into_inner)
}

const N: usize = 600;
const SKEW_SECS: u64 = 2;
const NODES: &str = "127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683";
const ADMIN: &str = "amqp://guest:guest@127.0.0.1:5681/";

/// Brings every node back (started, its application running) when dropped, so a failed run
/// never leaves the cluster short for the next.
struct ClusterWhole;

impl Drop for ClusterWhole {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster");
        for n in ["1", "2", "3"] {
            let _ = Command::new(script).args(["up", n]).output();
            let _ = Command::new(script)
                .args(["ctl", n, "-q", "start_app"])
                .output();
        }
    }
}

/// `rabbitmqctl -n cN@localhost -q ARGS` on node `n`.
fn ctl(n: usize, args: &[&str]) -> String {
    cluster(&[&["ctl", &n.to_string(), "-q"], args].concat())
}

/// Which node (1..3) `host` is connected to, from `fleetd status`.
fn connected_node(host: &Host) -> Option<usize> {
    let status = host.cli(&["status"]);
    let at = status.find("connected to 127.0.0.1:568")? + "connected to 127.0.0.1:568".len();
    status[at..at + 1].parse().ok()
}

/// The node (1..3) leading the one agent inbox (a quorum queue) in `vhost`, asked of node `via`.
fn leader(via: usize, vhost: &str) -> usize {
    let table = ctl(
        via,
        &[
            "list_queues",
            "-p",
            vhost,
            "name",
            "leader",
            "--no-table-headers",
        ],
    );
    let line = table
        .lines()
        .find(|l| l.starts_with("agent.") && l.contains(".inbox\t"))
        .unwrap_or_else(|| panic!("no agent inbox in {vhost}: {table}"));
    let node = line.split('\t').nth(1).unwrap();
    node.trim_start_matches('c')
        .split('@')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("leader {node}"))
}

/// Every test vhost's queues with their counts, consumers and leaders (for a failure message),
/// asked of whichever node answers.
fn queue_states() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster");
    for n in ["1", "2", "3"] {
        let vhosts = Command::new(script)
            .args(["ctl", n, "-q", "list_vhosts", "--no-table-headers"])
            .output()
            .unwrap();
        if !vhosts.status.success() {
            continue;
        }
        let mut out = String::new();
        for vhost in String::from_utf8_lossy(&vhosts.stdout).lines() {
            let queues = Command::new(script)
                .args(["ctl", n, "-q", "list_queues", "-p", vhost])
                .args([
                    "name",
                    "messages_ready",
                    "messages_unacknowledged",
                    "consumers",
                ])
                .args(["leader", "online", "--no-table-headers"])
                .output()
                .unwrap();
            out.push_str(&format!(
                "{vhost}:\n{}",
                String::from_utf8_lossy(&queues.stdout)
            ));
        }
        return out;
    }
    "no node answers".to_owned()
}

/// Stops node `n`'s application.
fn stop_app(n: usize) {
    ctl(n, &["stop_app"]);
}

/// Starts node `n`'s application again and waits until the cluster has all three nodes.
fn start_app(n: usize) {
    ctl(n, &["start_app"]);
    ctl(n, &["await_startup", "--timeout", "60"]);
    cluster(&["await"]);
}

/// Sends `N` numbered messages `label #i` from `a`'s `primary` to `b`'s `worker`, calling
/// `fault(i)` before each; then checks every one is delivered, exactly once, in order, and that
/// every delivery state ends `acknowledged` once the worker has taken them.
fn stream(
    a: &Host,
    b: &Host,
    (worker, primary): (&str, &str),
    label: &str,
    mut fault: impl FnMut(usize),
) {
    let mut ids = Vec::with_capacity(N);
    for i in 0..N {
        fault(i);
        let (id, _) = a.send(worker, primary, &format!("{label} #{i:04}"));
        ids.push(id);
    }
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(30);
        while a.delivery(id)["state"] != "delivered" {
            if Instant::now() > deadline {
                panic!(
                    "{label}: {id} not delivered within 30 s: {}\nqueues: {}\nsender: {}receiver: {}",
                    a.delivery(id),
                    queue_states(),
                    a.cli(&["status"]),
                    b.cli(&["status"])
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let texts = b.drain(worker);
    let expected: Vec<String> = (0..N).map(|i| format!("{label} #{i:04}")).collect();
    assert_eq!(texts.len(), N, "{label}: every message exactly once");
    assert_eq!(texts, expected, "{label}: in the sender's order");
    for id in &ids {
        a.wait_delivery(id, "acknowledged");
    }
}

/// Two fleets `{prefix}a…` and `{prefix}b…` with shared users on c1, each admitting the other:
/// their clean-up, and each one's (name, password).
fn two_fleets(prefix: &str) -> (Fleets, [(String, String); 2]) {
    let nonce = nonce();
    let (fa, fb) = (format!("{prefix}a{nonce}"), format!("{prefix}b{nonce}"));
    let (pa, pb) = (
        format!("Pw{prefix}a{nonce}x"),
        format!("Pw{prefix}b{nonce}x"),
    );
    let mut cleanup = Fleets::new(&[&fa, &fb]);
    cleanup.node = Some("c1@localhost".to_owned());
    let on = Some(("c1@localhost", ADMIN));
    grants_on(on, &fa, &[&fb], &pa);
    grants_on(on, &fb, &[&fa], &pb);
    // Again: fb's user exists now, and fa's grants give it write on fa's ingress.
    grants_on(on, &fa, &[&fb], &pa);
    (cleanup, [(fa, pa), (fb, pb)])
}

/// Hosts `a1` and `b1` under `root`, naming all three nodes, with quorum queues.
fn cluster_hosts(root: &std::path::Path) -> (Host, Host) {
    let (mut a, mut b) = (Host::new(root, "a1"), Host::new(root, "b1"));
    for host in [&mut a, &mut b] {
        host.broker_nodes = NODES.to_owned();
        host.broker_lines = format!("queue_type = \"quorum\"\nskew_secs = {SKEW_SECS}\n");
    }
    (a, b)
}

#[test]
fn numbered_streams_survive_a_leader_stop_a_killed_node_and_a_long_node_outage() {
    let _turn = exclusive();
    // A run cut short before may have left a node down: whole again first, and at the end.
    drop(ClusterWhole);
    cluster(&["await"]);
    let _whole = ClusterWhole;
    let (mut cleanup, [(fa, pa), (fb, pb)]) = two_fleets("q");
    for node in 1..=3 {
        let contract = Command::new(common::BIN)
            .args(["broker", "contract", "--uri-env", "FLEETD_T_URI"])
            .args(["--queue-type", "quorum"])
            .env(
                "FLEETD_T_URI",
                format!("amqp://{fa}:{pa}@127.0.0.1:568{node}/%2F{fa}"),
            )
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&contract.stdout);
        assert!(
            contract.status.success() && text.matches("PASS").count() == 8,
            "the quorum contract through c{node}: {text}{}",
            String::from_utf8_lossy(&contract.stderr)
        );
    }

    let root = tempfile::tempdir().unwrap();
    let (a, b) = cluster_hosts(root.path());
    let started = start_pair((&a, &fa, &pa), (&b, &fb, &pb), &mut cleanup);
    let (b_log, primary, worker) = (started.b_log, started.primary, started.worker);
    let pair = (worker.as_str(), primary.as_str());
    let vhost_b = format!("/{fb}");

    // (a) The inbox's leader stops a third in; it starts again two thirds in.
    let led_by = leader(1, &vhost_b);
    stream(&a, &b, pair, "leader-stop", |i| {
        if i == N / 3 {
            stop_app(led_by);
        }
        if i == 2 * N / 3 {
            start_app(led_by);
        }
    });

    // (b) The receiving host's node is killed a third in; the host must be on another node
    // within 5 s. The node restarts two thirds in.
    let mut killed = 0;
    stream(&a, &b, pair, "node-kill", |i| {
        if i == N / 3 {
            killed = connected_node(&b).expect("the receiver is connected");
            let at = Instant::now();
            cluster(&["kill", &killed.to_string()]);
            let now_on = loop {
                if let Some(n) = connected_node(&b).filter(|n| *n != killed) {
                    break n;
                }
                if at.elapsed() > Duration::from_secs(5) {
                    let mut log = String::new();
                    while let Ok(line) = b_log.try_recv() {
                        log.push_str(&line);
                        log.push('\n');
                    }
                    panic!(
                        "b1 not on another node than c{killed} within 5 s: {}\n{log}",
                        b.cli(&["status"])
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            eprintln!("b1 moved from c{killed} to c{now_on} in {:?}", at.elapsed());
        }
        if i == 2 * N / 3 {
            cluster(&["up", &killed.to_string()]);
            cluster(&["await"]);
        }
    });

    // (c) The sending host's node stops a third in and stays down for three skews.
    let mut stopped = (0, Instant::now());
    stream(&a, &b, pair, "sender-node-down", |i| {
        if i == N / 3 {
            stopped = (
                connected_node(&a).expect("the sender is connected"),
                Instant::now(),
            );
            stop_app(stopped.0);
        }
        if i == 2 * N / 3 {
            std::thread::sleep(
                Duration::from_secs(3 * SKEW_SECS).saturating_sub(stopped.1.elapsed()),
            );
            start_app(stopped.0);
        }
    });

    for host in [&a, &b] {
        let audit = host.state_dir().join("audit.jsonl");
        host.cli(&["audit", "verify", "--file", audit.to_str().unwrap()]);
        let refused = std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .filter(|line| line.contains("\"message.refused\""))
            .count();
        assert_eq!(refused, 0, "{}: nothing refused", host.name);
    }
}

/// Messages per direction in each round of [`five_kills_of_the_node_both_hosts_use_lose_nothing_and_fail_nothing`].
const PER_ROUND: usize = 150;

/// Sends `PER_ROUND` numbered messages `label #i` from `host`'s `from` to `to` through the
/// local API as fast as it takes them, counting them in `sent`; their ids.
fn burst(host: &Host, (to, from): (&str, &str), label: &str, sent: &AtomicUsize) -> Vec<String> {
    (0..PER_ROUND)
        .map(|i| {
            let (id, route) = host.send(to, from, &format!("{label} #{i:04}"));
            assert_eq!(route, "foreign", "{label}");
            sent.fetch_add(1, Ordering::SeqCst);
            id
        })
        .collect()
}

/// The cluster's queues, both hosts' status and what they logged since last asked, leaving out
/// debug lines (for a failure message).
fn states(a: &Host, b: &Host, logs: [&std::sync::mpsc::Receiver<String>; 2]) -> String {
    let mut logged = String::new();
    for (host, log) in [a, b].iter().zip(logs) {
        while let Ok(line) = log.try_recv() {
            if !line.contains("\"DEBUG\"") {
                logged.push_str(&format!("{}: {line}\n", host.name));
            }
        }
    }
    format!(
        "queues: {}\na1: {}b1: {}logged:\n{logged}",
        queue_states(),
        a.cli(&["status"]),
        b.cli(&["status"])
    )
}

/// Waits (`within`) until every message in `ids` sent from `host` is in state `wanted`; panics
/// at once on a failed one (every failure here would be false) and names what is left.
fn all_reach(
    host: &Host,
    ids: &[String],
    wanted: &str,
    within: Duration,
    context: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + within;
    let mut left: Vec<&String> = ids.iter().collect();
    while !left.is_empty() {
        let mut still = Vec::new();
        for id in left {
            let state = host.delivery(id);
            assert_ne!(
                state["state"],
                "failed",
                "{}: a false failure: {state}\n{}",
                host.name,
                context()
            );
            if state["state"] != wanted && state["state"] != "acknowledged" {
                still.push(id);
            }
        }
        left = still;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {} of {} messages not {wanted} within {within:?}; first: {}\n{}",
            host.name,
            left.len(),
            ids.len(),
            host.delivery(left[0]),
            context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn five_kills_of_the_node_both_hosts_use_lose_nothing_and_fail_nothing() {
    let _turn = exclusive();
    drop(ClusterWhole);
    cluster(&["await"]);
    let _whole = ClusterWhole;
    let (mut cleanup, [(fa, pa), (fb, pb)]) = two_fleets("k");
    let root = tempfile::tempdir().unwrap();
    let (a, b) = cluster_hosts(root.path());
    let started = start_pair((&a, &fa, &pa), (&b, &fb, &pb), &mut cleanup);
    let (a_log, mut b_log) = (started.a_log, started.b_log);
    let (primary, worker, mut seen) = (started.primary, started.worker, started.seen);

    for round in 0..5 {
        // A host's first node is drawn at random (hosts spread over the cluster); after a kill
        // each moves to the node after the lost one, so hosts that shared one share the next.
        // Until they share one, b1 is restarted (a fresh draw).
        let node = connected_node(&a).expect("a1 is connected");
        let mut draws = 0;
        while connected_node(&b) != Some(node) {
            draws += 1;
            assert!(draws <= 30, "round {round}: b1 never drew c{node}");
            terminate(&cleanup.children[1]);
            cleanup.children[1].wait().unwrap();
            let (child, log) = b.start(&fb, &pb, &[&fa], &[(&a, &fa)]);
            cleanup.children[1] = child;
            b_log = log;
            wait_for(
                &b_log,
                &mut seen,
                &["broker connected"],
                Duration::from_secs(30),
            );
        }
        let context = || states(&a, &b, [&a_log, &b_log]);
        let (a_sent, b_sent) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let (to_b, to_a) = std::thread::scope(|s| {
            let to_b =
                s.spawn(|| burst(&a, (&worker, &primary), &format!("r{round} a>b"), &a_sent));
            let to_a =
                s.spawn(|| burst(&b, (&primary, &worker), &format!("r{round} b>a"), &b_sent));
            // A third of the way in, the node both use dies.
            while a_sent.load(Ordering::SeqCst) + b_sent.load(Ordering::SeqCst) < 2 * PER_ROUND / 3
                && !to_b.is_finished()
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            cluster(&["kill", &node.to_string()]);
            eprintln!("round {round}: killed c{node}");
            (to_b.join().unwrap(), to_a.join().unwrap())
        });
        cluster(&["up", &node.to_string()]);
        cluster(&["await"]);
        // Whole again: every message delivered, none failed, each once, in order.
        all_reach(&a, &to_b, "delivered", Duration::from_secs(120), &context);
        all_reach(&b, &to_a, "delivered", Duration::from_secs(120), &context);
        for (host, agent, direction) in [(&b, &worker, "a>b"), (&a, &primary, "b>a")] {
            let texts = host.drain(agent);
            let expected: Vec<String> = (0..PER_ROUND)
                .map(|i| format!("r{round} {direction} #{i:04}"))
                .collect();
            assert_eq!(
                texts,
                expected,
                "round {round} {direction}: each once, in order\n{}",
                context()
            );
        }
        // The receipts of what was taken: none left behind by a nack.
        all_reach(
            &a,
            &to_b,
            "acknowledged",
            Duration::from_secs(120),
            &context,
        );
        all_reach(
            &b,
            &to_a,
            "acknowledged",
            Duration::from_secs(120),
            &context,
        );
    }

    // The sender restarts and sends to the remote agent at once, before any beat; and to an
    // agent opened while it was down, which it has never seen (it waits for the first round of
    // beats instead of failing as "no such agent").
    terminate(&cleanup.children[0]);
    cleanup.children[0].wait().unwrap();
    let newcomer = b.open_agent("newcomer");
    let (child, a_log) = a.start(&fa, &pa, &[&fb], &[(&b, &fb)]);
    cleanup.children[0] = child;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let ids: Vec<String> = (0..21)
        .map(|i| {
            let (to, text) = match i {
                20 => (&newcomer, "to the newcomer".to_owned()),
                i => (&worker, format!("after restart #{i:02}")),
            };
            let request =
                serde_json::json!({"op": "send", "to": to, "from": primary, "text": text});
            let request = fleetd::api::Request::parse(request.to_string().as_bytes()).unwrap();
            // The first as soon as the socket answers.
            let reply = loop {
                match runtime.block_on(fleetd::api::request(&a.dir.join("run/fleetd"), &request)) {
                    Ok(reply) => break reply,
                    Err(_) if started.elapsed() < Duration::from_secs(20) => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(error) => panic!("a1's api after its restart: {error}"),
                }
            };
            assert_eq!(
                reply["route"], "foreign",
                "the placement outlived the restart: {reply}"
            );
            reply["id"].as_str().unwrap().to_owned()
        })
        .collect();
    eprintln!("21 sent {:?} after the restart", started.elapsed());
    let context = || states(&a, &b, [&a_log, &b_log]);
    wait_for(
        &a_log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(30),
    );
    all_reach(&a, &ids, "delivered", Duration::from_secs(60), &context);
    let texts = b.drain(&worker);
    let expected: Vec<String> = (0..20).map(|i| format!("after restart #{i:02}")).collect();
    assert_eq!(texts, expected);
    assert_eq!(b.drain(&newcomer), ["to the newcomer"]);

    for host in [&a, &b] {
        let audit = host.state_dir().join("audit.jsonl");
        host.cli(&["audit", "verify", "--file", audit.to_str().unwrap()]);
    }
    // What the kills made the broker do (for the record: whether a run met bare nacks).
    let mut refused = 0;
    for log in [&a_log, &b_log] {
        while let Ok(line) = log.try_recv() {
            if line.contains("the broker refuses messages for a queue")
                || line.contains("not written within")
            {
                refused += 1;
                eprintln!("{line}");
            }
        }
    }
    eprintln!("refusal spells and unwritten frames logged: {refused}");
}
