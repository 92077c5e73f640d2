//! `--instance NAME` (or `FLEETD_INSTANCE`): the command line acts for the unit `fleetd@NAME`
//! — its socket, state and audit log, policy and credentials — instead of the caller's XDG
//! directories, so the commands in docs/operations.md work as typed next to the shipped unit.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;

fn fleetd(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(common::BIN)
        .args(args)
        .env_remove("FLEETD_CONFIG")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("STATE_DIRECTORY")
        .env_remove("RUNTIME_DIRECTORY")
        .env_remove("CONFIGURATION_DIRECTORY")
        .env("HOME", home.path())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn an_instance_means_the_units_paths() {
    let name = format!("t{}", std::process::id());
    assert!(
        !std::path::Path::new("/etc/fleetd/fleetd.toml").exists(),
        "this test reads the embedded defaults: /etc/fleetd/fleetd.toml must not exist here"
    );
    let (ok, text) = fleetd(&["--instance", &name, "config", "check"], &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!(
            "paths: policy /etc/fleetd/policy, state /var/lib/fleetd/{name}, runtime /run/fleetd/{name}"
        )),
        "{text}"
    );
    // The environment variable does the same.
    let (_, text) = fleetd(&["status"], &[("FLEETD_INSTANCE", &name)]);
    assert!(
        text.contains(&format!(
            "cannot reach fleetd at `/run/fleetd/{name}/fleetd.sock`"
        )) && text.contains(&format!("systemctl status fleetd@{name}")),
        "{text}"
    );
    // The audit log is the instance's.
    let (ok, text) = fleetd(&["--instance", &name, "audit", "verify"], &[]);
    assert!(
        !ok && text.contains(&format!("/var/lib/fleetd/{name}")),
        "{text}"
    );
    // Without one, the hint names the flag.
    let (_, text) = fleetd(&["status"], &[]);
    assert!(text.contains("--instance NAME"), "{text}");
    // A name systemd would not take is refused.
    let (ok, text) = fleetd(&["--instance", "../etc", "status"], &[]);
    assert!(!ok && text.contains("is not an instance name"), "{text}");
}
