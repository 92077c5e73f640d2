//! An MCP client for the tests: newline-delimited JSON-RPC to `fleetd mcp` over stdio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{BIN, Host};

/// An MCP client speaking newline-delimited JSON-RPC to `fleetd mcp`.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
    next: u64,
    pub transcript: String,
}

impl Session {
    pub fn start(host: &Host) -> Session {
        Session::start_with(Session::command(host))
    }

    /// `fleetd mcp` for `host`'s daemon, not yet started.
    pub fn command(host: &Host) -> Command {
        let mut command = Command::new(BIN);
        command
            .args([
                "--config",
                host.dir.join("fleetd.toml").to_str().unwrap(),
                "mcp",
            ])
            .env("HOME", &host.dir)
            .env("XDG_RUNTIME_DIR", host.dir.join("run"));
        command
    }

    /// Starts `command` (a `fleetd mcp`, possibly wrapped) as the session's server.
    pub fn start_with(mut command: Command) -> Session {
        let mut child = command
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

    pub fn notify(&mut self, method: &str) {
        let line = json!({"jsonrpc": "2.0", "method": method}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
    }

    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params);
        assert!(response["error"].is_null(), "{method}: {response}");
        response["result"].clone()
    }

    /// One request; the whole JSON-RPC response (an error included).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
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
                return value;
            }
        }
    }

    /// Calls a tool; returns its output (the structured content, else the text parsed as
    /// JSON, else the text), and whether it is an error.
    pub fn tool(&mut self, name: &str, arguments: Value) -> (Value, bool) {
        let result = self.call("tools/call", json!({"name": name, "arguments": arguments}));
        if !result["structuredContent"].is_null() {
            return (
                result["structuredContent"].clone(),
                result["isError"] == true,
            );
        }
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let parsed = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (parsed, result["isError"] == true)
    }

    /// Calls a tool; the whole JSON-RPC response (a protocol error included).
    pub fn tool_response(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
    }
}

impl Session {
    /// `initialize` then `notifications/initialized`; the server's capabilities.
    pub fn initialize(&mut self) -> Value {
        let init = self.call(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "fleetd-test", "version": "0"}}),
        );
        self.notify("notifications/initialized");
        init
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
