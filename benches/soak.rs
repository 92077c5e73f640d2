//! The soak: two fleets on the 3-node test cluster, one host each, streaming to each other
//! without pause while a seeded schedule of faults runs — a node killed (SIGKILL) or stopped
//! (`stop_app`) and brought back, a daemon restarted, a host's broker connections partitioned
//! (a proxy between the host and the nodes stops forwarding: silence, not a reset) — then the
//! whole history is checked: every message accepted by a sender is delivered exactly once, in
//! the sender's order, and every delivery state ends final and true (`acknowledged`: each is
//! pulled and acknowledged on the receiver; any `failed` is false here).
//!
//! Run: `cargo bench --bench soak` (5 minutes; `FLEETD_SOAK_SECS=1800` for the 30-minute run
//! in docs/benchmarks.md, `FLEETD_SOAK_SEED=N` to replay a schedule). As root, with the test
//! cluster (`scripts/cluster start`); `FLEETD_CLUSTER_NAME`/`_PORT`/`_BASE` pick a second cluster
//! (scripts/cluster's header), so a long run need not stop the tests. Run as a test (`cargo test
//! --benches`, as scripts/test does) it soaks for a short schedule (about a minute, four faults).
//! Fails (exit status) when anything was lost, duplicated, reordered or left in a false state.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "a benchmark reports on stdout and fails loudly"
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Fleets, Host, grants_on, nonce, terminate};

fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// A seeded generator (xorshift64*): the schedule of a run is its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The cluster the soak runs on (scripts/cluster, by its environment).
struct Cluster {
    name: String,
    port: u16,
}

impl Cluster {
    fn from_env() -> Cluster {
        Cluster {
            name: std::env::var("FLEETD_CLUSTER_NAME").unwrap_or_else(|_| "c".to_owned()),
            port: std::env::var("FLEETD_CLUSTER_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(5680),
        }
    }

    /// `scripts/cluster ARGS` (it reads the same environment).
    fn run(&self, args: &[&str]) -> String {
        common::cluster(args)
    }

    fn node(&self, n: u64) -> String {
        format!("{}{n}@localhost", self.name)
    }

    fn amqp_port(&self, n: u64) -> u16 {
        self.port + u16::try_from(n).unwrap()
    }
}

/// A proxy between one host and the three nodes: a local port per node. While `cut` is set it
/// forwards nothing in either direction (a partition: the host's connections fall silent).
struct Proxy {
    cut: Arc<AtomicBool>,
    ports: Vec<u16>,
}

impl Proxy {
    fn start(targets: &[u16]) -> Proxy {
        let cut = Arc::new(AtomicBool::new(false));
        let ports = targets
            .iter()
            .map(|&target| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let port = listener.local_addr().unwrap().port();
                let cut = Arc::clone(&cut);
                std::thread::spawn(move || {
                    for client in listener.incoming().flatten() {
                        let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)) else {
                            continue; // the node is down: the client sees its connection end
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                            (upstream, client),
                        ] {
                            let cut = Arc::clone(&cut);
                            std::thread::spawn(move || pump(from, to, &cut));
                        }
                    }
                });
                port
            })
            .collect();
        Proxy { cut, ports }
    }

    fn nodes(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Copies `from` to `to` until either ends; holds everything while `cut` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if cut.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// One local API request to the daemon whose runtime directory is `run`; `Err` when it does not
/// answer (restarting).
fn api(
    runtime: &tokio::runtime::Runtime,
    run: &Path,
    request: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let request = fleetd::api::Request::parse(request.to_string().as_bytes()).unwrap();
    runtime
        .block_on(fleetd::api::request(run, &request))
        .map_err(|e| e.to_string())
}

/// A worker thread's switches: `stop`, and `paused` (acknowledged by `idle`) while its daemon
/// restarts.
#[derive(Default)]
struct Switch {
    stop: AtomicBool,
    paused: AtomicBool,
    idle: AtomicBool,
}

impl Switch {
    /// Whether to stop; parks (idle) while paused.
    fn check(&self) -> bool {
        while self.paused.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
            self.idle.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(10));
        }
        self.idle.store(false, Ordering::SeqCst);
        self.stop.load(Ordering::SeqCst)
    }

    fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        while !self.idle.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

/// Sends `label #N` from `from` to `to` at `rate` per second until stopped; each accepted
/// message's id, in order. A refused or unanswered request is tried again with the same number
/// (the daemon is restarted only while this thread is paused, so no accepted send goes
/// unrecorded).
fn sender(
    run: PathBuf,
    (to, from): (String, String),
    label: String,
    rate: u64,
    switch: Arc<Switch>,
) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut ids = Vec::new();
    let gap = Duration::from_millis(1000 / rate);
    while !switch.check() {
        let text = format!("{label} #{:06}", ids.len());
        let request = serde_json::json!({"op": "send", "to": to, "from": from, "text": text});
        match api(&runtime, &run, &request) {
            Ok(reply) if reply["id"].is_string() => {
                ids.push(reply["id"].as_str().unwrap().to_owned());
            }
            Ok(reply) => eprintln!("soak: {label}: send refused, tried again: {reply}"),
            Err(_) => {}
        }
        std::thread::sleep(gap);
    }
    ids
}

/// Pulls and acknowledges `agent`'s held messages until stopped; each message once, in the
/// order pulled: (id, text).
fn drainer(run: PathBuf, agent: String, switch: Arc<Switch>) -> Vec<(String, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut seen = HashSet::new();
    let mut got = Vec::new();
    while !switch.check() {
        let pulled = api(
            &runtime,
            &run,
            &serde_json::json!({"op": "held.pull", "agent": agent, "limit": 100}),
        );
        let messages = match pulled {
            Ok(reply) => reply["messages"].as_array().cloned().unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        if messages.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for message in messages {
            let id = message["id"].as_str().unwrap().to_owned();
            // Pulled again when an ack did not get through: the same message, kept once.
            if seen.insert(id.clone()) {
                let text = message["body"]["text"].as_str().unwrap().to_owned();
                got.push((id.clone(), text));
            }
            let _ = api(
                &runtime,
                &run,
                &serde_json::json!({"op": "held.ack", "id": id}),
            );
        }
    }
    got
}

/// Appends a daemon's log lines to `file` (the soak's record of what each host said).
fn keep_log(lines: std::sync::mpsc::Receiver<String>, file: PathBuf) {
    std::thread::spawn(move || {
        let mut out = std::fs::File::create(file).unwrap();
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    });
}

/// Waits until the daemon of runtime directory `run` answers.
fn answering(run: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while api(&runtime, run, &serde_json::json!({"op": "status"})).is_err() {
        assert!(Instant::now() < until, "a restarted daemon did not answer");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How the history came out for one direction.
#[derive(Debug, Default)]
struct Outcome {
    sent: usize,
    lost: usize,
    duplicated: usize,
    reordered: usize,
    false_failed: usize,
    not_final: usize,
}

/// Checks one direction: what `label`'s sender had accepted (`ids`, in order) against what the
/// receiver got (`got`), and the sender's final records.
fn check(
    label: &str,
    ids: &[String],
    got: &[(String, String)],
    states: &[serde_json::Value],
) -> Outcome {
    let numbers: Vec<usize> = got
        .iter()
        .filter_map(|(_, text)| text.strip_prefix(&format!("{label} #")))
        .map(|n| n.parse().unwrap())
        .collect();
    let distinct: HashSet<usize> = numbers.iter().copied().collect();
    let mut outcome = Outcome {
        sent: ids.len(),
        lost: (0..ids.len()).filter(|n| !distinct.contains(n)).count(),
        duplicated: numbers.len() - distinct.len(),
        reordered: numbers.windows(2).filter(|w| w[1] < w[0]).count(),
        ..Outcome::default()
    };
    for state in states {
        match state["state"].as_str() {
            Some("acknowledged") => {}
            Some("failed" | "refused") => {
                outcome.false_failed += 1;
                if outcome.false_failed <= 3 {
                    eprintln!("soak: {label}: a false final state: {state}");
                }
            }
            _ => {
                outcome.not_final += 1;
                if outcome.not_final <= 3 {
                    eprintln!("soak: {label}: not final: {state}");
                }
            }
        }
    }
    outcome
}

fn main() {
    let seed: u64 = std::env::var("FLEETD_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::try_from(nonce() % u128::from(u64::MAX)).unwrap() | 1);
    let secs: u64 = std::env::var("FLEETD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick() { 45 } else { 300 });
    let (gap, down) = if quick() {
        ((4, 6), (2, 4))
    } else {
        ((5, 20), (2, 12))
    };
    let rate = 20;
    let mut rng = Rng(seed);
    println!("soak: seed {seed}, {secs} s, {rate} messages/s each way");

    let cluster = Cluster::from_env();
    cluster.run(&["await"]);
    let nonce = nonce();
    let (fa, fb) = (format!("sa{nonce}"), format!("sb{nonce}"));
    let (pa, pb) = (format!("Pwsa{nonce}x"), format!("Pwsb{nonce}x"));
    let mut fleets = Fleets::new(&[&fa, &fb]);
    fleets.node = Some(cluster.node(1));
    let admin = format!("amqp://guest:guest@127.0.0.1:{}/", cluster.amqp_port(1));
    let on = Some((cluster.node(1), admin));
    let on = on.as_ref().map(|(n, a)| (n.as_str(), a.as_str()));
    grants_on(on, &fa, &[&fb], &pa);
    grants_on(on, &fb, &[&fa], &pb);
    grants_on(on, &fa, &[&fb], &pa);

    let root = tempfile::tempdir().unwrap();
    let nodes: Vec<u16> = (1..=3).map(|n| cluster.amqp_port(n)).collect();
    let proxies = [Proxy::start(&nodes), Proxy::start(&nodes)];
    let (mut a, mut b) = (Host::new(root.path(), "a1"), Host::new(root.path(), "b1"));
    for (host, proxy) in [&mut a, &mut b].into_iter().zip(&proxies) {
        host.broker_nodes = proxy.nodes();
        host.broker_lines = "queue_type = \"quorum\"\nskew_secs = 2\n".to_owned();
    }
    a.accept_mail_from(&[&fb]);
    b.accept_mail_from(&[&fa]);
    let hosts = [(&a, &fa, &pa, &fb, &b), (&b, &fb, &pb, &fa, &a)];
    for (i, (host, fleet, password, other_fleet, other)) in hosts.iter().enumerate() {
        let (child, log) = host.start(fleet, password, &[other_fleet], &[(other, other_fleet)]);
        fleets.children.push(child);
        keep_log(log, root.path().join(format!("{}-{i}.log", host.name)));
    }
    for host in [&a, &b] {
        answering(&host.dir.join("run/fleetd"));
    }
    let primary = a.open_agent("primary");
    let worker = b.open_agent("worker");
    a.wait_listed(&worker);
    b.wait_listed(&primary);

    let switches: [Arc<Switch>; 2] = Default::default();
    let drains: [Arc<Switch>; 2] = Default::default();
    let senders = [
        std::thread::spawn({
            let (run, to, from, s) = (
                a.dir.join("run/fleetd"),
                worker.clone(),
                primary.clone(),
                Arc::clone(&switches[0]),
            );
            move || sender(run, (to, from), "a>b".to_owned(), rate, s)
        }),
        std::thread::spawn({
            let (run, to, from, s) = (
                b.dir.join("run/fleetd"),
                primary.clone(),
                worker.clone(),
                Arc::clone(&switches[1]),
            );
            move || sender(run, (to, from), "b>a".to_owned(), rate, s)
        }),
    ];
    let drainers = [
        std::thread::spawn({
            let (run, agent, s) = (
                b.dir.join("run/fleetd"),
                worker.clone(),
                Arc::clone(&drains[1]),
            );
            move || drainer(run, agent, s)
        }),
        std::thread::spawn({
            let (run, agent, s) = (
                a.dir.join("run/fleetd"),
                primary.clone(),
                Arc::clone(&drains[0]),
            );
            move || drainer(run, agent, s)
        }),
    ];

    // The schedule.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let faults = Mutex::new(Vec::<String>::new());
    let mut restarts = [0usize; 2];
    loop {
        let wait = Duration::from_secs(rng.between(gap.0, gap.1));
        if Instant::now() + wait >= deadline {
            break;
        }
        std::thread::sleep(wait);
        let at = started.elapsed().as_secs();
        let hold = Duration::from_secs(rng.between(down.0, down.1));
        let fault = match rng.between(0, 3) {
            0 => {
                let n = rng.between(1, 3);
                cluster.run(&["kill", &n.to_string()]);
                std::thread::sleep(hold);
                cluster.run(&["up", &n.to_string()]);
                cluster.run(&["await"]);
                format!("{at} s: node {n} killed, back after {}s", hold.as_secs())
            }
            1 => {
                let n = rng.between(1, 3);
                cluster.run(&["ctl", &n.to_string(), "-q", "stop_app"]);
                std::thread::sleep(hold);
                cluster.run(&["ctl", &n.to_string(), "-q", "start_app"]);
                cluster.run(&["await"]);
                format!(
                    "{at} s: node {n} stopped, started after {}s",
                    hold.as_secs()
                )
            }
            2 => {
                let i = usize::try_from(rng.between(0, 1)).unwrap();
                let (host, fleet, password, other_fleet, other) = hosts[i];
                switches[i].pause();
                drains[i].pause();
                terminate(&fleets.children[i]);
                fleets.children[i].wait().unwrap();
                let (child, log) =
                    host.start(fleet, password, &[other_fleet], &[(other, other_fleet)]);
                fleets.children[i] = child;
                restarts[i] += 1;
                keep_log(
                    log,
                    root.path()
                        .join(format!("{}-{}.log", host.name, restarts[i])),
                );
                answering(&host.dir.join("run/fleetd"));
                switches[i].resume();
                drains[i].resume();
                format!("{at} s: daemon {} restarted", host.name)
            }
            _ => {
                let i = usize::try_from(rng.between(0, 1)).unwrap();
                proxies[i].cut.store(true, Ordering::SeqCst);
                std::thread::sleep(hold);
                proxies[i].cut.store(false, Ordering::SeqCst);
                format!(
                    "{at} s: {} partitioned for {}s",
                    hosts[i].0.name,
                    hold.as_secs()
                )
            }
        };
        eprintln!("soak: {fault}");
        faults.lock().unwrap().push(fault);
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    std::thread::sleep(remaining);

    // Whole again; the senders stop; everything settles.
    for s in &switches {
        s.stop.store(true, Ordering::SeqCst);
    }
    let [to_b, to_a] = senders.map(|t| t.join().unwrap());
    cluster.run(&["await"]);
    let settle = Instant::now() + Duration::from_secs(300);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let finals = |host: &Host, ids: &[String]| -> Vec<serde_json::Value> {
        ids.iter()
            .map(|id| {
                api(
                    &runtime,
                    &host.dir.join("run/fleetd"),
                    &serde_json::json!({"op": "delivery", "id": id}),
                )
                .unwrap()
            })
            .collect()
    };
    let settled = |states: &[serde_json::Value]| {
        states.iter().all(|s| {
            matches!(
                s["state"].as_str(),
                Some("acknowledged" | "failed" | "refused")
            )
        })
    };
    let (mut a_states, mut b_states);
    loop {
        a_states = finals(&a, &to_b);
        b_states = finals(&b, &to_a);
        if (settled(&a_states) && settled(&b_states)) || Instant::now() > settle {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    for d in &drains {
        d.stop.store(true, Ordering::SeqCst);
    }
    let [got_b, got_a] = drainers.map(|t| t.join().unwrap());
    let outcomes = [
        ("a>b", check("a>b", &to_b, &got_b, &a_states)),
        ("b>a", check("b>a", &to_a, &got_a, &b_states)),
    ];
    let faults = faults.into_inner().unwrap();
    let count = |what: &str| faults.iter().filter(|f| f.contains(what)).count();
    println!(
        "soak: seed {seed}: {} s, faults {} (node kills {}, node stops {}, daemon restarts {}, partitions {})",
        started.elapsed().as_secs(),
        faults.len(),
        count("killed"),
        count("stopped"),
        count("restarted"),
        count("partitioned")
    );
    let mut bad = 0;
    for (label, o) in &outcomes {
        println!(
            "soak: {label}: {} messages; lost {}, duplicated {}, reordered {}, false failed {}, not final {}",
            o.sent, o.lost, o.duplicated, o.reordered, o.false_failed, o.not_final
        );
        bad += o.lost + o.duplicated + o.reordered + o.false_failed + o.not_final;
    }
    if bad > 0 {
        for fault in &faults {
            eprintln!("soak: {fault}");
        }
        let keep = root.keep();
        panic!(
            "soak: seed {seed} broke a guarantee ({bad}); the hosts' logs are in {}",
            keep.display()
        );
    }
    drop(fleets);
}
