//! A policy directory is read as a reviewer reads it: every entry is loaded or reported. Each
//! hostile directory below makes `fleetd policy check` exit 3 naming the entry, a daemon refuse
//! to start on it, and a running daemon keep its last good policy on SIGHUP (logged).

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{BIN, solo_config, start_solo, wait_for};

/// A valid policy: the single-host example.
fn good(dir: &Path) {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/examples/single-host/00-echo.toml"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(example, dir.join("00-echo.toml")).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Makes `dir` hostile in way `case`; returns the entry a report must name.
fn make_hostile(dir: &Path, outside: &Path, case: &str) -> PathBuf {
    match case {
        "dangling link" => {
            let p = dir.join("90-deny.toml");
            symlink(outside.join("gone.toml"), &p).unwrap();
            p
        }
        "link to outside" => {
            std::fs::write(outside.join("grants.toml"), "").unwrap();
            let p = dir.join("10-grants.toml");
            symlink(outside.join("grants.toml"), &p).unwrap();
            p
        }
        "link loop" => {
            let p = dir.join("loop.toml");
            symlink(&p, &p).unwrap();
            p
        }
        "upper-case extension" => {
            let p = dir.join("90-deny.TOML");
            std::fs::write(&p, "").unwrap();
            p
        }
        "other extension" => {
            let p = dir.join("90-deny.toml.bak");
            std::fs::write(&p, "").unwrap();
            p
        }
        "fifo" => {
            let p = dir.join("pipe.toml");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &p,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
            p
        }
        "another user's file" => {
            let p = dir.join("20-more.toml");
            std::fs::write(&p, "").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            rustix::fs::chown(&p, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            p
        }
        "world-writable directory" => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            dir.to_owned()
        }
        "group-writable file" => {
            let p = dir.join("00-echo.toml");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o664)).unwrap();
            p
        }
        other => panic!("no case {other}"),
    }
}

const CASES: [&str; 9] = [
    "dangling link",
    "link to outside",
    "link loop",
    "upper-case extension",
    "other extension",
    "fifo",
    "another user's file",
    "world-writable directory",
    "group-writable file",
];

#[test]
fn policy_check_reports_every_entry_it_would_not_load_or_that_others_may_change() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test gives a policy file to another user (uid 65534) and needs root"
    );
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for case in CASES {
        let dir = root.path().join(case.replace(' ', "-"));
        good(&dir);
        let clean = Command::new(BIN)
            .args(["policy", "check", dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(clean.status.success(), "{case}: the clean directory fails");
        let entry = make_hostile(&dir, &outside, case);
        let checked = Command::new(BIN)
            .args(["policy", "check", dir.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&checked.stdout);
        assert_eq!(checked.status.code(), Some(3), "{case}: {text}");
        assert!(
            text.contains(&format!("`{}`", entry.display())) && text.contains("policy invalid"),
            "{case}: the report names `{}`: {text}",
            entry.display()
        );
    }
}

#[test]
fn the_daemon_refuses_a_hostile_directory_at_start_and_keeps_its_policy_on_sighup() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let home = root.path().join("home");
    let config = solo_config(&home, "strict", "");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let policy = home.join("policy");
    good(&policy);

    // At start: refused, naming the entry.
    let entry = make_hostile(&policy, &outside, "dangling link");
    let started = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("HOME", &home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert!(
        !started.status.success(),
        "fleetd started on a hostile policy"
    );
    assert!(
        stderr.contains(&format!("`{}`", entry.display())) && stderr.contains("will not start"),
        "{stderr}"
    );

    // On SIGHUP: the last good policy stays, and the log says why.
    std::fs::remove_file(&entry).unwrap();
    let (mut child, log) = start_solo(&config, &home);
    let entry = make_hostile(&policy, &outside, "upper-case extension");
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let mut seen = String::new();
    wait_for(
        &log,
        &mut seen,
        &["keeping the last good policy"],
        Duration::from_secs(20),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains(&entry.display().to_string()),
        "the reload failure names the entry: {seen}"
    );
}
