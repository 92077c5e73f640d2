//! A remote spawn through the real broker, on one machine (issue 37): the laptop (fleet A) asks
//! `w1` (fleet B) to spawn a scripted agent; the measure is how long after the agent showed its
//! ready line the laptop's `fleetd spawn --host w1` has returned `started` (the gate's look at
//! the pane, the reply's trip through the broker, the requester's wake-up, the CLI's exit).
//! Baseline in the same run: the same spawn asked on `w1` itself (no broker), same measure.
//! A third series: the agent is ready only after 1.5 s, when the readiness gate looks at the
//! pane least often. Target: ≤ 50 ms (p50 and p99).
//!
//! The agent (Python) takes the wall clock, appends it to a file, then prints its ready line;
//! spawns run one at a time, so the n-th stamp is the n-th spawn's.
//!
//! Run: `cargo bench --bench spawn_remote` (20 spawns of each series; as root, RabbitMQ at
//! 127.0.0.1:5672); as a test, 2 each.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a benchmark reports on stdout and fails loudly"
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Delegation, Host, TmuxServer, nonce};

/// Seconds the slow agent takes to be ready: long enough for the gate's pause between looks to
/// be at its longest.
const SLOW: &str = "1.5";

fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The agent: after the seconds its second argument names, the wall clock (ns) appended to its
/// first argument's file, then its ready line.
const READY: &str = "import sys, time; time.sleep(float(sys.argv[2])); \
open(sys.argv[1], 'a').write('%d\\n' % time.time_ns()); \
print('agent> ready', flush=True); sys.stdin.read()";

/// The `n`-th stamp in `file` (0-based), waiting for it.
fn nth_stamp(file: &Path, n: usize) -> u128 {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(line) = text.lines().nth(n) {
            return line.parse().unwrap();
        }
        assert!(Instant::now() < by, "no ready stamp {n} in 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Spawns one agent with `fleetd spawn ARGS` on `host`: ms from its ready line to `started`.
fn spawn_once(host: &Host, args: &[&str], stamps: &Path, n: usize) -> f64 {
    let (ok, text) = host.spawn_cli(args);
    let returned = now_ns();
    assert!(ok && text.contains("started"), "spawn {args:?}: {text}");
    let ready = nth_stamp(stamps, n);
    (returned.saturating_sub(ready)) as f64 / 1e6
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let spawns = if quick() { 2 } else { 20 };
    let nonce = nonce();
    let mut pair = Delegation::new("s", nonce);
    let (a, b) = (pair.a.clone(), pair.b.clone());
    let w1 = &pair.w1;
    let work = w1.work_dir();
    let stamps = work.join("ready");
    let profile = |name: &str, after: &str| {
        format!(
            "[profile.{name}]\ndescription = \"Stamps when it is ready.\"\n\
             argv = [\"/usr/bin/python3\", \"-I\", \"-c\", '''{READY}''', \"{stamps}\", \"{after}\"]\n\
             roots = [\"{work}\"]\nmax_instances = {spawns}\n\
             [profile.{name}.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 20\n\n",
            stamps = stamps.display(),
            work = work.display(),
        )
    };
    w1.policy(&[(
        "00-worker.toml",
        format!(
            "{}{}{}[[grant]]\nid = \"laptop-workers\"\ndescription = \"bench\"\n\
             fleets = [\"{a}\", \"{b}\"]\nprofiles = [\"worker\", \"local\", \"slow\"]\n",
            profile("worker", "0"),
            profile("local", "0"),
            profile("slow", SLOW),
        ),
    )]);
    let tmux = TmuxServer::start(nonce);
    pair.start(&tmux);
    let (laptop, w1) = (&pair.laptop, &pair.w1);

    let mut n = 0;
    let (mut remote, mut local, mut slow) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..spawns {
        for (host, args, into) in [
            (
                &laptop,
                &["--host", "w1", "--profile", "worker"][..],
                &mut remote,
            ),
            (&w1, &["--profile", "local"][..], &mut local),
            (
                &laptop,
                &["--host", "w1", "--profile", "slow"][..],
                &mut slow,
            ),
        ] {
            into.push(spawn_once(host, args, &stamps, n));
            n += 1;
        }
    }
    drop(tmux);
    println!(
        "spawn bench: {spawns} spawns each, one at a time, a scripted agent (Python) on w1; ms from its ready line to `started` at the asking CLI"
    );
    println!(
        "remote (laptop -> broker -> w1 -> broker -> laptop): p50 {:.1} ms, p99 {:.1} ms (target <= 50)",
        percentile(&remote, 0.5),
        percentile(&remote, 0.99)
    );
    println!(
        "remote, the agent ready after {SLOW} s (the gate's pause at its longest): p50 {:.1} ms, p99 {:.1} ms (target <= 50)",
        percentile(&slow, 0.5),
        percentile(&slow, 0.99)
    );
    println!(
        "local on w1 (baseline, no broker): p50 {:.1} ms, p99 {:.1} ms; remote p50 {:.2}x local",
        percentile(&local, 0.5),
        percentile(&local, 0.99),
        percentile(&remote, 0.5) / percentile(&local, 0.5).max(1e-9)
    );
}
