//! The deployment files: the systemd unit is scored by the real `systemd-analyze security
//! --offline=true` (systemd 252 here) and must stay at or below 1.0; it carries the directives
//! the hardening issue requires, and it agrees with the tmux unit on the socket path.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stderr,
    reason = "test code: a failed step is a failed test; the score is shown"
)]

mod common;

use std::path::Path;
use std::process::Command;

const UNIT: &str = include_str!("../deploy/fleetd@.service");
const TMUX_UNIT: &str = include_str!("../deploy/fleetd-tmux@.service");

/// Scores `text` as the instance `fleetd@alice.service`; returns the overall exposure.
fn score(text: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("fleetd@alice.service");
    std::fs::write(&unit, text).unwrap();
    let output = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze is missing ({e}): install systemd (scripts/test does)")
        });
    common::overall_exposure(
        &String::from_utf8_lossy(&output.stdout),
        &String::from_utf8_lossy(&output.stderr),
    )
}

#[test]
fn the_unit_scores_at_most_one() {
    let shipped = score(UNIT);
    assert!(
        shipped <= 1.0,
        "deploy/fleetd@.service scores {shipped} (> 1.0)"
    );
    // An operator's drop-in adding a remote broker's address must keep it there too.
    let remote = score(&UNIT.replace(
        "IPAddressAllow=localhost",
        "IPAddressAllow=localhost\nIPAddressAllow=192.0.2.10/32 2001:db8::10/128",
    ));
    assert!(
        remote <= 1.0,
        "with a remote broker address the unit scores {remote} (> 1.0)"
    );
}

#[test]
fn an_unhardened_unit_scores_badly_so_the_score_means_something() {
    let bare = "[Service]\nExecStart=/usr/bin/fleetd run\n";
    let value = score(bare);
    assert!(
        value > 9.0,
        "an unhardened unit scored {value}: the scoring is not what we expect"
    );
}

#[test]
fn the_unit_carries_the_required_directives() {
    let lines: Vec<&str> = UNIT
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    for wanted in [
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30s",
        "Restart=on-failure",
        "StartLimitBurst=5",
        "User=fleetd-%i",
        "Group=fleetd-%i",
        "RuntimeDirectoryMode=0711",
        "LoadCredential=broker-uri:/etc/fleetd/credentials/%i/broker-uri",
        "LoadCredential=host-key:/etc/fleetd/credentials/%i/host-key",
        "StateDirectory=fleetd/%i",
        "RuntimeDirectory=fleetd/%i",
        "ConfigurationDirectory=fleetd",
        "LimitCORE=0",
        "MemorySwapMax=0",
        "UMask=0077",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "MemoryDenyWriteExecute=yes",
        "ProtectSystem=strict",
        "ProtectHome=tmpfs",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=landlock_create_ruleset landlock_add_rule landlock_restrict_self",
        "IPAddressDeny=any",
    ] {
        assert!(
            lines.contains(&wanted),
            "deploy/fleetd@.service lacks `{wanted}`"
        );
    }
    // No secret may be handed over in the environment.
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("Environment") || l.starts_with("SetCredential=")),
        "secrets belong in LoadCredential=, never Environment= or SetCredential="
    );
}

#[test]
fn the_landlock_syscalls_are_outside_systemd_252s_service_group() {
    // Why the unit lists them: if a future systemd adds them to @system-service, the explicit
    // line is harmless; if this test fails, the comment in the unit is out of date.
    let groups = common::syscalls::groups();
    let service = common::syscalls::expand(&groups, "@system-service");
    assert!(
        service.contains("openat"),
        "unexpected @system-service: {service:?}"
    );
    assert!(
        !service.contains("landlock_restrict_self"),
        "@system-service now holds landlock"
    );
    // The unit's whole filter: Landlock allowed, privileged calls and setpriority refused.
    let allowed = common::syscalls::unit_allow_list(UNIT);
    for call in [
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
    ] {
        assert!(allowed.contains(call), "the unit's filter refuses {call}");
    }
    for call in [
        "mount",
        "setpriority",
        "ptrace",
        "kexec_load",
        "bpf",
        "init_module",
    ] {
        assert!(!allowed.contains(call), "the unit's filter allows {call}");
    }
    for call in [
        "prlimit64",
        "prctl",
        "add_key",
        "keyctl",
        "execve",
        "connect",
        "openat",
    ] {
        assert!(
            allowed.contains(call),
            "the unit's filter refuses {call}, which fleetd needs"
        );
    }
}

#[test]
fn the_tmux_units_agree_on_the_socket() {
    let socket = "/run/fleetd-tmux/%i/tmux";
    assert!(TMUX_UNIT.contains(&format!("ExecStart=/usr/bin/tmux -S {socket} new-session")));
    assert!(TMUX_UNIT.contains("RuntimeDirectory=fleetd-tmux/%i"));
    // fleetd's own user, and no other, may open windows (which run as the login user).
    assert!(TMUX_UNIT.contains(&format!(
        "ExecStartPost=/usr/bin/tmux -S {socket} server-access -a fleetd-%i"
    )));
    assert!(TMUX_UNIT.contains("User=%i\n"));
    // fleetd's private /tmp hides tmux's default directory: the unit documents the path.
    assert!(UNIT.contains("/run/fleetd-tmux/%i/tmux"));
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/dev.fleetd.plist")
            .is_file()
    );
}

/// The agents' unit: hardened as far as coding agents can live with (target ≤ 5.0; it was 9.2
/// "deliberately not sandboxed"), each directive left out explained in the unit.
#[test]
fn the_agents_tmux_unit_scores_at_most_five_and_explains_what_it_leaves_out() {
    let shipped = score(TMUX_UNIT);
    assert!(
        shipped <= 5.0,
        "deploy/fleetd-tmux@.service scores {shipped} (> 5.0)"
    );
    for directive in [
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=\n",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=-/home/%i",
        "PrivateTmp=yes",
    ] {
        assert!(
            TMUX_UNIT.contains(directive),
            "the agents' unit lacks {directive}"
        );
    }
    for left_out in [
        "ProtectHome=",
        "MemoryDenyWriteExecute=",
        "RestrictNamespaces=",
        "PrivateNetwork=",
        "PrivateUsers=",
    ] {
        assert!(
            TMUX_UNIT.contains(&format!("# - {left_out}")),
            "the agents' unit does not say why it leaves out {left_out}"
        );
        assert!(
            !TMUX_UNIT.lines().any(|l| l.starts_with(left_out)),
            "{left_out} is said to be left out, but is set"
        );
    }
}
