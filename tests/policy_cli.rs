//! `fleetd policy check | explain | test | schema` as CI and reviewers run them: exit codes,
//! formats, and the shipped `policy/` directory.

#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

fn fleetd(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("FLEETD_CONFIG")
        .output()
        .unwrap()
}

fn fleetd_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A refused oversized request may close stdin early; that is the point.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_shipped_policy_checks_clean_and_its_tests_pass() {
    let check = fleetd(&["policy", "check", "policy", "--deny-warnings"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(stdout(&check).contains("policy ok"));
    let test = fleetd(&["policy", "test", "policy"]);
    assert_eq!(test.status.code(), Some(0), "{}", stdout(&test));
    assert!(stdout(&test).contains(" passed, 0 failed"));
}

#[test]
fn check_exit_codes_and_formats() {
    let invalid = fleetd(&["policy", "check", "tests/fixtures/policy/invalid"]);
    assert_eq!(invalid.status.code(), Some(3));
    assert!(stdout(&invalid).contains("error: unknown key `grant.profles`"));
    assert!(stdout(&invalid).contains("= help: did you mean `profiles`?"));

    let json = fleetd(&[
        "policy",
        "check",
        "tests/fixtures/policy/invalid",
        "--format",
        "json",
    ]);
    assert_eq!(json.status.code(), Some(3));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(parsed["valid"], false);
    assert!(parsed["errors"].as_u64().unwrap() >= 8);

    let sarif = fleetd(&[
        "policy",
        "check",
        "tests/fixtures/policy/invalid",
        "--format",
        "sarif",
    ]);
    let parsed: serde_json::Value = serde_json::from_slice(&sarif.stdout).unwrap();
    assert_eq!(parsed["version"], "2.1.0");
    assert!(!parsed["runs"][0]["results"].as_array().unwrap().is_empty());

    let warned = fleetd(&["policy", "check", "tests/fixtures/policy/valid"]);
    assert_eq!(warned.status.code(), Some(0), "{}", stdout(&warned));
    assert!(stdout(&warned).contains("warning: `grant.ci-builders-through-proxy` lets requests set the dangerous variable `HTTPS_PROXY`"));
    let strict = fleetd(&[
        "policy",
        "check",
        "tests/fixtures/policy/valid",
        "--deny-warnings",
    ]);
    assert_eq!(strict.status.code(), Some(3));

    let missing = fleetd(&["policy", "check", "/nonexistent/policy"]);
    assert_eq!(missing.status.code(), Some(2));
    let usage = fleetd(&["policy", "check", "--format", "yaml"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn explain_exit_codes_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("fleetd")).unwrap();
    let policy_dir = dir.path().join("policy");
    std::fs::create_dir(&policy_dir).unwrap();
    for file in ["00-profiles.toml", "10-grants.toml", "90-deny.toml"] {
        let text = std::fs::read_to_string(Path::new("policy").join(file)).unwrap();
        std::fs::write(
            policy_dir.join(file),
            text.replace("/srv/fleet/work", work.to_str().unwrap()),
        )
        .unwrap();
    }
    let policy = policy_dir.to_str().unwrap();
    let allow = fleetd_stdin(
        &["policy", "explain", "--policy", policy, "-"],
        br#"{"origin":{"fleet":"mac","host":"laptop"},"profile":"worker","env":{"TASK_ID":"FLEET-7"},"cwd":"fleetd"}"#,
    );
    assert_eq!(
        allow.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&allow.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&allow.stdout).unwrap();
    assert_eq!(json["effect"], "allow");
    assert_eq!(json["rules"][0], "mac-workers");
    assert_eq!(json["pane"]["argv"][0], "/usr/local/bin/claude");
    assert_eq!(json["pane"]["secrets"]["GH_TOKEN"], "keyring:github-worker");
    // The sandbox the agent would start in, as the shipped profile names it.
    let sandbox = &json["pane"]["sandbox"];
    assert_eq!(sandbox["mode"], "on", "{json}");
    assert_eq!(sandbox["network"], "host");
    assert_eq!(sandbox["tcp_connect"], serde_json::json!([443]));
    assert_eq!(
        sandbox["writable"],
        serde_json::json!(["~/.claude", "~/.claude.json"])
    );
    assert!(
        !stdout(&allow).contains("FLEET-7"),
        "env values are never shown"
    );

    let deny = fleetd_stdin(
        &["policy", "explain", "--policy", policy, "-"],
        br#"{"origin":{"fleet":"evil","host":"x"},"profile":"worker"}"#,
    );
    assert_eq!(deny.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&deny.stdout).unwrap();
    assert_eq!(json["effect"], "deny");
    assert_eq!(json["rules"][0], "default-deny");

    // Messages are explained as spawns are: the deciding rule and why, exit 0 or 1.
    for (sender, code, rule) in [("spawner", 0, "spawner"), ("other", 1, "default-deny")] {
        let message = fleetd_stdin(
            &["policy", "explain", "--policy", policy, "-"],
            format!(r#"{{"kind":"message","origin":{{"fleet":"mac","host":"laptop"}},"profile":"worker","sender":"{sender}"}}"#).as_bytes(),
        );
        assert_eq!(
            message.status.code(),
            Some(code),
            "{sender}: {}",
            stdout(&message)
        );
        let json: serde_json::Value = serde_json::from_slice(&message.stdout).unwrap();
        assert_eq!(json["rules"][0], rule, "{json}");
        assert!(json["pane"].is_null(), "a message has no pane: {json}");
    }
    let shell = fleetd_stdin(
        &["policy", "explain", "--policy", policy, "-"],
        br#"{"kind":"message","origin":{"fleet":"mac","host":"laptop"},"profile":"maintenance","sender":"spawner"}"#,
    );
    assert_eq!(shell.status.code(), Some(1));
    assert!(
        stdout(&shell).contains("no-remote-text"),
        "{}",
        stdout(&shell)
    );
    let bad = fleetd_stdin(
        &["policy", "explain", "--policy", policy, "-"],
        br#"{"kind":"message","origin":{"fleet":"mac","host":"laptop"},"profile":"worker","text":"rm -rf /"}"#,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`text`: unknown field"));

    let limited = fleetd_stdin(
        &[
            "policy",
            "explain",
            "--policy",
            policy,
            "--usage",
            r#"{"origin_running": 3}"#,
            "-",
        ],
        br#"{"origin":{"fleet":"mac","host":"laptop"},"profile":"worker"}"#,
    );
    assert_eq!(limited.status.code(), Some(1));

    let malformed = fleetd_stdin(
        &["policy", "explain", "--policy", policy, "-"],
        br#"{"origin":{"fleet":"mac","host":"laptop"},"profile":"worker","cwd":"../.."}"#,
    );
    assert_eq!(malformed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("`cwd`"));

    let oversized = vec![b' '; 70 * 1024];
    let big = fleetd_stdin(&["policy", "explain", "--policy", policy, "-"], &oversized);
    assert_eq!(big.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&big.stderr).contains("larger than"));

    let invalid_policy = fleetd_stdin(
        &[
            "policy",
            "explain",
            "--policy",
            "tests/fixtures/policy/invalid",
            "-",
        ],
        b"{}",
    );
    assert_eq!(invalid_policy.status.code(), Some(3));
}

#[test]
fn test_reports_failing_cases_with_their_location() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        "tests/fixtures/policy/valid/minimal.toml",
        dir.path().join("p.toml"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(
        dir.path().join("tests/cases.toml"),
        "[[case]]\nname = \"nothing is granted\"\nexpect = \"deny\"\nrequest = { origin = { fleet = \"a\", host = \"b\" }, profile = \"local\" }\n\n[[case]]\nname = \"wrongly expects allow\"\nexpect = \"allow\"\nrequest = { origin = { fleet = \"a\", host = \"b\" }, profile = \"local\" }\n",
    )
    .unwrap();
    let output = fleetd(&["policy", "test", dir.path().to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let text = stdout(&output);
    assert!(
        text.contains("cases.toml:6: case `wrongly expects allow`: expected allow, got deny"),
        "{text}"
    );
    assert!(text.contains("1 passed, 1 failed"), "{text}");
}

#[test]
fn schema_is_json_schema() {
    let output = fleetd(&["policy", "schema"]);
    assert!(output.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["additionalProperties"], false);
}
