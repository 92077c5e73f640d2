//! `fleetd key init | show`: the private key is written only to its credential file (0600),
//! never printed; `show` prints the public key and the `[[peer]]` pin.

#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

#[test]
fn key_init_writes_a_private_credential_and_show_prints_only_the_public_half() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let file = credentials.join("host-key");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env_remove("FLEETD_CONFIG")
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("CREDENTIALS_DIRECTORY", &credentials)
            .output()
            .unwrap()
    };
    let init = run(&["key", "init", "--credential-file", file.to_str().unwrap()]);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let seed = std::fs::read_to_string(&file).unwrap();
    let seed = seed.trim().trim_start_matches("ed25519-seed:");
    let show = run(&["key", "show"]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&init.stdout),
        String::from_utf8_lossy(&show.stdout)
    );
    assert!(!text.contains(seed), "the private key was printed");
    assert!(
        text.contains("[[peer]]") && text.contains("pubkey = \"ed25519:"),
        "{text}"
    );
    let again = run(&["key", "init", "--credential-file", file.to_str().unwrap()]);
    assert!(
        !again.status.success(),
        "an existing key file is not overwritten without --force"
    );
}
