//! Lead supervision with a real daemon and a real private tmux server: a `[[lead]]` is launched
//! through the spawn pipeline and shows `ready` in the roster only after its readiness gate; when
//! its process is killed, the supervisor notices within 5 s, logs and audits why (the exit
//! status), and restores it — with the same global id, in a new pane, ready again.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Host, TmuxServer, eventually, one_fleet, wait_for};

/// The lead's roster entry on `host`: (global id, status).
#[test]
fn a_killed_lead_is_noticed_logged_and_restored_with_its_global_id() {
    let (nonce, fleet, password, mut cleanup) = one_fleet("ld");
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "h1");
    let work = host.work_dir();
    host.policy(&[
        (
            "00-profiles.toml",
            format!(
            r#"[profile.reviewer]
description = "A scripted lead that takes a second to come up."
argv = ["/bin/sh", "-c", '''sleep 1; echo 'lead> ready'; while read -r line; do echo "got:[$line]"; done''']
roots = ["{work}"]
max_instances = 1

[profile.reviewer.ready]
pattern = "^lead> ready"
timeout_secs = 15
"#,
            work = work.display()
            ),
        ),
        (
            "10-grants.toml",
            format!(
            "[[grant]]\nid = \"own-leads\"\ndescription = \"This host's leads.\"\n\
             fleets = [\"{fleet}\"]\nhosts = [\"h1\"]\nprofiles = [\"reviewer\"]\n"
            ),
        ),
    ]);
    let tmux = TmuxServer::start(nonce);
    let (child, log) = host.start_with(
        &fleet,
        &password,
        &[],
        &[],
        &tmux.config_line(),
        "[[lead]]\nname = \"reviewer\"\nprofile = \"reviewer\"\n",
    );
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &log,
        &mut seen,
        &["lead running and ready"],
        Duration::from_secs(30),
    );
    let (id, status) = eventually("the lead in the roster", Duration::from_secs(10), || {
        host.agent_entry("reviewer")
    });
    assert_eq!(status, "ready");
    let first_pane = tmux.run(&["list-panes", "-a", "-F", "#{pane_id} #{pane_pid}"]);
    let (pane, pid) = first_pane
        .lines()
        .filter(|l| !l.starts_with("%0 "))
        .map(|l| l.split_once(' ').unwrap())
        .map(|(p, pid)| (p.to_owned(), pid.to_owned()))
        .next()
        .unwrap_or_else(|| panic!("no lead pane: {first_pane}"));

    let killed = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for(
        &log,
        &mut seen,
        // SIGKILL leaves no exit status: the kernel says the process ended.
        &["lead down", "its process (pid"],
        Duration::from_secs(10),
    );
    let noticed = killed.elapsed();
    assert!(
        noticed < Duration::from_secs(5),
        "noticed after {noticed:?}"
    );
    wait_for(
        &log,
        &mut seen,
        &["lead running and ready", "\"restored\":true"],
        Duration::from_secs(30),
    );
    let (again, status) = host.agent_entry("reviewer").unwrap();
    assert_eq!(again, id, "the lead keeps its global id");
    assert_eq!(status, "ready");
    let panes = tmux.run(&["list-panes", "-a", "-F", "#{pane_id}"]);
    assert!(
        !panes.lines().any(|p| p == pane),
        "the dead pane was closed: {panes}"
    );

    let audit = std::fs::read_to_string(host.state_dir().join("audit.jsonl")).unwrap();
    assert!(
        audit.contains("lead.down") && audit.contains("its process (pid"),
        "{audit}"
    );
}
