//! What an agent's sandbox costs at spawn: spawn → ready of the same scripted agent through
//! fleetd's spawn pipeline on a real tmux server, in its sandbox (bubblewrap, seccomp, Landlock)
//! and with `sandbox.mode = "off"` (the baseline, measured in the same run, the two taking
//! turns) — a Python agent (an interpreter starts first, as every real agent's runtime does)
//! and a shell one ready at once (all the time is fleetd's and the sandbox's: it shows
//! bubblewrap's fixed cost). Target (issue 36): sandboxed ≤ 1.5× unsandboxed.
//!
//! Run: `cargo bench --bench sandbox` (20 spawns each); as a test, 2 each.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetd::pane::Multiplexer;
use fleetd::pane::tmux::{Socket, Tmux};
use fleetd::spawn::{Outcome, Spawner};

fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// The shell agent: ready at once, then reads lines.
const AGENT: &str = "echo 'agent> ready'; while read -r line; do echo \"got: $line\"; done";

/// The Python agent: an interpreter starts first, as most agents' runtimes do.
const PY_AGENT: &str = "import sys; print('agent> ready', flush=True); sys.stdin.read()";

fn policy(dir: &std::path::Path) -> fleetd::policy::PolicySet {
    let policy_dir = dir.join("policy");
    std::fs::create_dir_all(&policy_dir).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let profile = |name: &str, argv: &str, sandbox: &str| {
        format!(
            "[profile.{name}]\ndescription = \"A scripted agent.\"\n\
             argv = {argv}\nroots = [\"{work}\"]\nmax_instances = 1\n\
             [profile.{name}.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 20\n{sandbox}\n",
            work = dir.join("work").display()
        )
    };
    let shell = format!("[\"/bin/sh\", \"-c\", '''{AGENT}''']");
    let python = format!("[\"/usr/bin/python3\", \"-I\", \"-c\", \"{PY_AGENT}\"]");
    let off = |name: &str| format!("[profile.{name}.sandbox]\nmode = \"off\"\n");
    std::fs::write(
        policy_dir.join("p.toml"),
        format!(
            "{}{}{}{}[[grant]]\nid = \"g\"\ndescription = \"bench\"\nfleets = [\"f\"]\n\
             profiles = [\"boxed\", \"plain\", \"py-boxed\", \"py-plain\"]\n",
            profile("boxed", &shell, ""),
            profile("plain", &shell, &off("plain")),
            profile("py-boxed", &python, ""),
            profile("py-plain", &python, &off("py-plain")),
        ),
    )
    .unwrap();
    let (policy, diagnostics) = fleetd::policy::load_dir(&policy_dir);
    policy.unwrap_or_else(|_| panic!("{diagnostics:?}"))
}

/// One spawn → ready of `profile`, then its pane closed.
fn once(spawner: &Spawner, policy: &fleetd::policy::PolicySet, profile: &str) -> Duration {
    let request = fleetd::policy::Request::from_value(
        &serde_json::json!({"origin": {"fleet": "f", "host": "h"}, "profile": profile}),
    )
    .unwrap();
    let started = Instant::now();
    let outcome = spawner.spawn(policy, &request, &|_| Err("no secrets here".into()), &[]);
    let took = started.elapsed();
    match outcome {
        Outcome::Started { pane, .. } => {
            spawner.mux().close(&pane).unwrap();
        }
        other => panic!("{profile} did not start: {other:?}"),
    }
    took
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let rounds = if quick() { 2 } else { 20 };
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path());
    let name = format!("fleetd-bench-sandbox-{}", std::process::id());
    let started = std::process::Command::new("tmux")
        .args(["-L", &name, "new-session", "-d", "-s", "keep", "sleep 600"])
        .status()
        .expect("tmux is needed (scripts/test installs it)");
    assert!(started.success(), "the bench's tmux server");
    let tmux = Tmux::new(Socket::Name(name.clone()), "fleetd");
    let spawner = Spawner::new(Arc::new(tmux) as Arc<dyn Multiplexer>)
        .with_init(env!("CARGO_BIN_EXE_fleetd").into());
    println!(
        "sandbox bench: spawn → ready of a scripted agent through the spawn pipeline on tmux, median of {rounds}"
    );
    for (what, boxed_profile, plain_profile, target) in [
        ("python agent", "py-boxed", "py-plain", "target <= 1.5x"),
        (
            "shell agent ",
            "boxed",
            "plain",
            "ready at once: bubblewrap's fixed cost, see docs/benchmarks.md",
        ),
    ] {
        let (mut boxed, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            boxed.push(once(&spawner, &policy, boxed_profile));
            plain.push(once(&spawner, &policy, plain_profile));
        }
        let (boxed, plain) = (median(boxed), median(plain));
        println!(
            "{what}: sandboxed {:.1} ms, unsandboxed {:.1} ms: {:.2}x ({target})",
            boxed.as_secs_f64() * 1e3,
            plain.as_secs_f64() * 1e3,
            boxed.as_secs_f64() / plain.as_secs_f64().max(1e-9)
        );
    }
    let _ = std::process::Command::new("tmux")
        .args(["-L", &name, "kill-server"])
        .status();
}
