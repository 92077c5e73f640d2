//! Process hygiene of a running daemon: files it creates are its own alone even when started
//! with umask 000; no core files (RLIMIT_CORE 0); no secret on its command line; config and
//! policy files other users may change are refused with a clear error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step is a failed test"
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{BIN, Host};

/// Every file and directory under `dir`, with its mode.
fn modes(dir: &Path, out: &mut Vec<(String, u32)>) {
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        out.push((
            entry.path().display().to_string(),
            meta.permissions().mode() & 0o777,
        ));
        if meta.is_dir() {
            modes(&entry.path(), out);
        }
    }
}

#[test]
fn started_with_umask_000_it_creates_private_files_and_shows_no_secret() {
    let (_, fleet, password, mut cleanup) = common::one_fleet("hyg");
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "hygiene");
    let daemon = host.command(&fleet, &password, &[], &[], ("", ""), &[]);
    // The same command, started by a shell whose umask lets everyone read and write.
    let mut shell = Command::new("sh");
    shell.args(["-c", "umask 000; exec \"$0\" \"$@\""]);
    let wrapped = common::run_through(shell, &daemon);
    let (child, lines) = common::spawn_logged(wrapped);
    let pid = child.id();
    cleanup.children.push(child);
    let mut seen = String::new();
    common::wait_for(
        &lines,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(30),
    );

    let mut found = Vec::new();
    modes(&host.state_dir(), &mut found);
    modes(&host.dir.join("run"), &mut found);
    assert!(
        found
            .iter()
            .any(|(p, _)| p.ends_with(".redb") || p.contains("state")),
        "no state files to check: {found:?}"
    );
    let open: Vec<_> = found.iter().filter(|(_, mode)| mode & 0o077 != 0).collect();
    assert!(open.is_empty(), "files others may access: {open:?}");

    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(cmdline.contains("run"), "not the daemon: {cmdline}");
    assert!(
        !cmdline.contains(&password),
        "the broker password is on the command line"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert!(
        core.split_whitespace().skip(4).take(2).all(|v| v == "0"),
        "core files are not disabled: {core}"
    );
}

/// `fleetd run` with `config` (single host, policy in `dir/policy`): (exit ok, stderr).
fn run_once(config: &Path, dir: &Path) -> (bool, String) {
    let output = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("HOME", dir)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn config_and_policy_others_may_change_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let config = common::solo_config(dir, "strict", "");
    let policy = dir.join("policy");
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for (path, mode, who) in [
        (config.clone(), 0o666, "world"),
        (config.clone(), 0o620, "group"),
        (policy.clone(), 0o777, "world"),
        (policy.join("grants.toml"), 0o664, "group"),
    ] {
        if path.extension().is_some_and(|e| e == "toml") && !path.exists() {
            std::fs::write(&path, "").unwrap();
        }
        chmod(&path, mode);
        let (ok, stderr) = run_once(&config, dir);
        assert!(!ok, "fleetd started with {} at {mode:o}", path.display());
        assert!(
            stderr.contains(&format!("`{}` is {who}-writable", path.display()))
                && stderr.contains("chmod go-w"),
            "{stderr}"
        );
        chmod(&path, if path.is_dir() { 0o700 } else { 0o600 });
    }
    assert!(
        !dir.join("run/fleetd.sock").exists(),
        "a refused start served its socket"
    );
}

#[test]
fn another_local_user_is_refused_even_when_the_socket_is_opened_up() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test acts as a second user (nobody) and an operator-group member, and needs root"
    );
    let nonce = common::nonce() % 1_000_000_000;
    let (group, member) = (format!("fops{nonce}"), format!("fop{nonce}"));
    let _accounts = Accounts::create(&group, &member);
    let member_uid = uid_of(&member);
    let group_gid = gid_of(&group);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let config = common::solo_config(dir, "guarded", "");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[api]\noperator_group = \"{group}\"\n"));
    std::fs::write(&config, text).unwrap();
    let (mut child, lines) = common::start_solo(&config, dir);
    let mut seen = String::new();
    // A careless operator opens everything: the directories, the socket, a copy of the binary.
    let bin = dir.join("fleetd");
    std::fs::copy(BIN, &bin).unwrap();
    for (path, mode) in [
        (dir.to_path_buf(), 0o755),
        (dir.join("run"), 0o755),
        (dir.join("run/fleetd.sock"), 0o666),
        (config.clone(), 0o644),
        (bin.clone(), 0o755),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let status = |ids: Option<(u32, u32)>| {
        let mut client = Command::new(&bin);
        client
            .args(["--config", config.to_str().unwrap(), "status"])
            .env_clear()
            .env("HOME", "/nonexistent");
        if let Some((uid, gid)) = ids {
            std::os::unix::process::CommandExt::uid(&mut client, uid);
            std::os::unix::process::CommandExt::gid(&mut client, gid);
        }
        let out = client.output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, text) = status(None);
    assert!(
        ok && text.contains("host: guarded"),
        "the owner is served: {text}"
    );
    let (ok, text) = status(Some((member_uid, group_gid)));
    assert!(
        ok && text.contains("host: guarded"),
        "a member of the operator group is served: {text}"
    );
    let (ok, text) = status(Some((65534, 65534)));
    assert!(!ok, "nobody was served: {text}");
    assert!(!text.contains("guarded"), "nobody learnt something: {text}");
    assert!(
        text.contains("uid 65534 is not the operator") && text.contains("present an agent token"),
        "nobody is told why: {text}"
    );
    common::wait_for(
        &lines,
        &mut seen,
        &["without a token from a non-operator refused"],
        Duration::from_secs(5),
    );
    let audit = std::fs::read_to_string(dir.join("state/audit.jsonl")).unwrap();
    assert!(
        audit.contains("\"api.refused\"") && audit.contains("\"uid\":65534"),
        "the refusal is audited: {audit}"
    );

    // nobody holds 20 connections open and sends nothing: its own share (8) is taken, the
    // rest are answered "busy"; the operator's probes are all served meanwhile.
    let socket = dir.join("run/fleetd.sock");
    let (held_tx, held) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
        let streams: Vec<_> = (0..20)
            .filter_map(|_| std::os::unix::net::UnixStream::connect(&socket).ok())
            .collect();
        held_tx.send(streams.len()).unwrap();
        let _ = released.recv_timeout(Duration::from_secs(30));
        drop(streams);
    });
    assert_eq!(held.recv().unwrap(), 20, "nobody connected 20 times");
    for probe in 0..8 {
        let (ok, text) = status(None);
        assert!(ok, "operator probe {probe} was starved: {text}");
    }
    release.send(()).unwrap();
    holder.join().unwrap();
    common::terminate(&child);
    let _ = child.wait();
}

/// A group and a member of it (no home, no login), removed when dropped.
struct Accounts {
    group: String,
    user: String,
}

impl Accounts {
    fn create(group: &str, user: &str) -> Accounts {
        let ran = |args: &[&str]| {
            let status = Command::new(args[0]).args(&args[1..]).status();
            assert!(
                status.is_ok_and(|s| s.success()),
                "{args:?} failed (the test creates a group and a user: needs root and the passwd package)"
            );
        };
        ran(&["groupadd", group]);
        let accounts = Accounts {
            group: group.to_owned(),
            user: user.to_owned(),
        };
        ran(&[
            "useradd",
            "-M",
            "-N",
            "-g",
            group,
            "-s",
            "/usr/sbin/nologin",
            user,
        ]);
        accounts
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.user).status();
        let _ = Command::new("groupdel").arg(&self.group).status();
    }
}

fn uid_of(user: &str) -> u32 {
    let out = Command::new("id").args(["-u", user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn gid_of(group: &str) -> u32 {
    let out = Command::new("getent")
        .args(["group", group])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split(':')
        .nth(2)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
