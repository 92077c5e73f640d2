//! `fleetd mcp` answers a real MCP session over stdio — initialize, tools/list, and tools/call
//! for every tool — bridged to a running daemon on the real broker; a held message that carries
//! the broker password reaches the primary redacted.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::time::Duration;

use common::mcp::Session;
use common::{Host, one_fleet, wait_for};
use serde_json::json;

#[test]
fn an_mcp_session_lists_and_calls_every_tool() {
    let (_, fleet, password, mut cleanup) = one_fleet("mc");
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "h1");
    let (child, log) = host.start(&fleet, &password, &[], &[]);
    cleanup.children.push(child);
    wait_for(
        &log,
        &mut String::new(),
        &["broker connected"],
        Duration::from_secs(20),
    );

    let mut mcp = Session::start(&host);
    let init = mcp.initialize();
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert_eq!(init["serverInfo"]["name"], "fleetd", "{init}");
    assert_eq!(
        init["serverInfo"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{init}"
    );
    let listed = mcp.call("tools/list", json!({}));
    for tool in listed["tools"].as_array().unwrap() {
        assert_eq!(
            tool["outputSchema"]["type"], "object",
            "every tool has an output schema: {tool}"
        );
    }
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "delivery_status",
            "inbox_ack",
            "inbox_pull",
            "roster",
            "send",
            "spawn"
        ]
    );

    let primary = host.open_agent("primary");
    let notes = host.open_agent("notes");
    let (roster, error) = mcp.tool("roster", json!({}));
    assert!(!error && roster.to_string().contains(&primary), "{roster}");

    let (sent, error) = mcp.tool("send", json!({"to": notes, "text": "remember the milk"}));
    assert!(!error, "{sent}");
    let id = sent["id"].as_str().unwrap();
    let (state, _) = mcp.tool("delivery_status", json!({"id": id}));
    assert_eq!(state["state"], "delivered", "{state}");
    let held = host.held(&notes);
    assert_eq!(
        held[0]["body"]["from"],
        primary.as_str(),
        "sent as the primary"
    );

    let (empty, _) = mcp.tool("inbox_pull", json!({}));
    assert_eq!(empty["messages"], json!([]), "{empty}");
    let (_, _) = host.send(&primary, &notes, &format!("the password is {password}"));
    let (pulled, error) = mcp.tool("inbox_pull", json!({"wait_secs": 5}));
    assert!(!error, "{pulled}");
    let message = &pulled["messages"][0];
    let text = message["body"]["text"].as_str().unwrap();
    assert!(text.starts_with("the password is [redacted"), "{text}");
    let (again, _) = mcp.tool("inbox_pull", json!({}));
    assert_eq!(
        again["messages"][0]["id"], message["id"],
        "offered until acknowledged"
    );
    let (acked, _) = mcp.tool("inbox_ack", json!({"id": message["id"]}));
    assert_eq!(acked["acknowledged"], true, "{acked}");
    let (empty, _) = mcp.tool("inbox_pull", json!({}));
    assert_eq!(empty["messages"], json!([]));

    // No policy on this host: the spawn is refused — a tool error carrying the reason.
    let (spawned, error) = mcp.tool("spawn", json!({"profile": "worker"}));
    assert!(error, "a refusal is an error: {spawned}");
    assert!(spawned.to_string().contains("spawn refused"), "{spawned}");

    // Bounds as documented; a number given as a string is taken, anything else gets a hint.
    let (zero, error) = mcp.tool("inbox_pull", json!({"limit": 0}));
    assert!(error && zero.to_string().contains("1-100"), "{zero}");
    let (long, error) = mcp.tool("inbox_pull", json!({"wait_secs": 31}));
    assert!(error && long.to_string().contains("0-30"), "{long}");
    let (five, error) = mcp.tool("inbox_pull", json!({"limit": "5"}));
    assert!(!error && five["messages"] == json!([]), "{five}");
    let words = mcp.tool_response("inbox_pull", json!({"limit": "five"}));
    assert!(
        words.to_string().contains("give a whole number such as 5"),
        "{words}"
    );

    assert!(
        !mcp.transcript.contains(&password),
        "the password reached MCP output"
    );
}
