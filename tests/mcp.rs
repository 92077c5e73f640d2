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

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{BIN, Host, one_fleet, wait_for};
use serde_json::{Value, json};

/// An MCP client speaking newline-delimited JSON-RPC to `fleetd mcp`.
struct Session {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
    next: u64,
    transcript: String,
}

impl Session {
    fn start(host: &Host) -> Session {
        let mut child = Command::new(BIN)
            .args([
                "--config",
                host.dir.join("fleetd.toml").to_str().unwrap(),
                "mcp",
            ])
            .env("HOME", &host.dir)
            .env("XDG_RUNTIME_DIR", host.dir.join("run"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Session {
            child,
            stdin,
            replies,
            next: 1,
            transcript: String::new(),
        }
    }

    fn notify(&mut self, method: &str) {
        let line = json!({"jsonrpc": "2.0", "method": method}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        loop {
            let reply = self
                .replies
                .recv_timeout(Duration::from_secs(40))
                .unwrap_or_else(|_| panic!("no reply to {method}; so far:\n{}", self.transcript));
            self.transcript.push_str(&reply);
            self.transcript.push('\n');
            let value: Value = serde_json::from_str(&reply).unwrap();
            if value["id"] == id {
                assert!(value["error"].is_null(), "{method}: {value}");
                return value["result"].clone();
            }
        }
    }

    /// Calls a tool; returns its text output parsed as JSON, and whether it is an error.
    fn tool(&mut self, name: &str, arguments: Value) -> (Value, bool) {
        let result = self.call("tools/call", json!({"name": name, "arguments": arguments}));
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let parsed = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (parsed, result["isError"] == true)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let init = mcp.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "fleetd-test", "version": "0"}}),
    );
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    mcp.notify("notifications/initialized");
    let listed = mcp.call("tools/list", json!({}));
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

    // No policy on this host: the spawn is refused, with the reason, as a result (not a crash).
    let (spawned, _) = mcp.tool("spawn", json!({"profile": "worker"}));
    assert_eq!(spawned["outcome"], "refused", "{spawned}");

    assert!(
        !mcp.transcript.contains(&password),
        "the password reached MCP output"
    );
}
