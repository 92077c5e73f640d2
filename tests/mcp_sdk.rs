//! `fleetd mcp` driven by the **official MCP Python SDK** (`mcp` on PyPI; `scripts/test` installs
//! it), as a primary agent's client would: the script `tests/mcp_sdk/session.py` initialises,
//! lists the tools and calls them; this test checks what the SDK saw — fleetd's name and version,
//! an output schema on every tool, structured answers, a refused spawn as a tool error with its
//! reason, `limit = 0` refused, `limit = "5"` taken.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;

#[test]
fn the_official_python_sdk_sees_fleetd_its_schemas_and_its_refusals() {
    let probe = Command::new("python3")
        .args(["-c", "import mcp"])
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed ({e})"));
    assert!(
        probe.status.success(),
        "the official MCP Python SDK is missing: `python3 -m pip install mcp` (scripts/test installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = common::solo_config(dir.path(), "sdk", "");
    let (mut daemon, _log) = common::start_solo(&config, dir.path());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_sdk/session.py");
    let output = Command::new("python3")
        .args([script, common::BIN, config.to_str().unwrap()])
        .env("HOME", dir.path())
        .output()
        .unwrap();
    common::terminate(&daemon);
    let _ = daemon.wait();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the SDK session failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["server"]["name"], "fleetd", "{seen}");
    assert_eq!(
        seen["server"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{seen}"
    );
    let schemas = seen["output_schemas"].as_object().unwrap();
    assert_eq!(schemas.len(), 6, "{seen}");
    assert!(schemas.values().all(|t| t == "object"), "{seen}");
    assert_eq!(seen["roster"]["is_error"], false, "{seen}");
    assert_eq!(
        seen["roster"]["structured"]["hosts"][0]["host"], "sdk",
        "{seen}"
    );
    assert_eq!(seen["spawn"]["is_error"], true, "{seen}");
    assert!(
        seen["spawn"]["text"]
            .as_str()
            .unwrap()
            .contains("this host has no profile `worker`"),
        "{seen}"
    );
    assert_eq!(seen["limit_zero"]["is_error"], true, "{seen}");
    assert!(
        seen["limit_zero"]["text"]
            .as_str()
            .unwrap()
            .contains("1-100"),
        "{seen}"
    );
    assert_eq!(seen["limit_string"]["is_error"], false, "{seen}");
    assert_eq!(
        seen["limit_string"]["structured"]["messages"],
        serde_json::json!([]),
        "{seen}"
    );
}
