//! The pane's init (`fleetd pane-init -- ARGV`, `src/pane/init.rs`), run as the multiplexer
//! runs it, on real processes: whatever the agent started — detached with `setsid`, double
//! forked, ignoring SIGTERM — ends when the agent ends or its pane hangs up, and the init exits
//! with the agent's status. The real CLIs under it: `tests/real_agents.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use fleetd::pane::process::{Liveness, Watched};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// An agent script that leaves three processes behind, their pids written to `pids`: one
/// detached into its own session that ignores SIGTERM, one double-forked (its parent gone at
/// once), one plain child. Then it does `then`.
fn leaver(pids: &Path, then: &str) -> String {
    format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ >> {p}; exec sleep 300 < /dev/null' & \
         sh -c '(echo $$ > /dev/null; sleep 300 & echo $! >> {p}) &' ; \
         sleep 300 & echo $! >> {p}; \
         while [ $(wc -l < {p}) -lt 3 ]; do sleep 0.05; done; {then}",
        p = pids.display()
    )
}

fn init(script: &str) -> Child {
    Command::new(BIN)
        .args(["pane-init", "--", "/bin/sh", "-c", script])
        .spawn()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn pids(file: &Path) -> Vec<u32> {
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() >= 3 {
            return pids;
        }
        assert!(
            Instant::now() < by,
            "the agent did not start its processes: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait(mut child: Child, within: Duration) -> ExitStatus {
    let by = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > by {
            let _ = child.kill();
            panic!("the init did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_agent_that_exits_leaves_nothing_behind_and_its_status_is_the_inits() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    let go = dir.path().join("go");
    let child = init(&leaver(
        &file,
        &format!(
            "while [ ! -e {} ]; do sleep 0.05; done; exit 7",
            go.display()
        ),
    ));
    let left = pids(&file);
    assert!(left.iter().all(|p| alive(*p)), "{left:?}");
    std::fs::write(&go, "").unwrap();
    // SIGTERM first, SIGKILL after the grace for the one that ignores it.
    let status = wait(child, Duration::from_secs(15));
    assert_eq!(status.code(), Some(7));
    for pid in left {
        assert!(!alive(pid), "process {pid} outlived its agent");
    }
}

#[test]
fn a_hangup_ends_the_agent_and_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    // The agent itself ignores SIGHUP and SIGTERM — from its first line, before the test can
    // signal — so the init kills it after the grace.
    let child = init(&format!(
        "trap '' HUP TERM; {}",
        leaver(&file, "while :; do sleep 1; done")
    ));
    let left = pids(&file);
    let kill = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = wait(child, Duration::from_secs(15));
    assert_eq!(status.code(), Some(128 + 9), "killed after the grace");
    for pid in left {
        assert!(!alive(pid), "process {pid} outlived its pane");
    }
}

#[test]
fn an_agent_that_executes_another_program_under_the_init_is_no_longer_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.05; done; exec sleep 300",
        go = go.display()
    );
    let mut child = init(&script);
    let mut watched = Watched::launched(child.id()).unwrap().unwrap();
    // The agent's own process is found under the init once it runs.
    let by = Instant::now() + Duration::from_secs(10);
    while watched.program().is_none() {
        assert!(Instant::now() < by, "no agent under the init");
        std::thread::sleep(Duration::from_millis(50));
        watched.settle();
    }
    assert_eq!(watched.comm(), Some("sh"));
    assert_eq!(watched.check(), Liveness::Running);
    std::fs::write(&go, "").unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        match watched.check() {
            Liveness::Replaced { was, now } => {
                assert_eq!((was.as_str(), now.as_str()), ("sh", "sleep"));
                break;
            }
            other => assert!(Instant::now() < by, "still {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The agent ends: so does the watch, though the init lives on a moment.
    let agent = watched.program().unwrap().pid;
    let killed = Command::new("kill")
        .args(["-KILL", &agent.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let by = Instant::now() + Duration::from_secs(10);
    while watched.check() != Liveness::Ended {
        assert!(
            Instant::now() < by,
            "the ended agent still counts as running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(wait_status(&mut child).code(), Some(128 + 9));
}

fn wait_status(child: &mut Child) -> ExitStatus {
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < by, "the init did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_command_that_cannot_run_is_said_and_the_init_fails() {
    let out = Command::new(BIN)
        .args(["pane-init", "--", "/nonexistent/agent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot run `/nonexistent/agent`"), "{said}");
}
