//! A daemon whose multiplexer is a **real herdr** (0.8.2, a private headless server per test):
//! a lead that herdr starts as its agent is killed from outside, noticed, reported and restored,
//! and later spawns still report their exits; a restart mid-typing into a 40-column pane types
//! nothing twice; no secret reaches herdr's log, a pane's screen or fleetd's log.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

/// The tests that need a real herdr (`scripts/test` skips `herdr::` where there is none, outside
/// CI, and says so).
mod herdr {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::common::herdr::{HerdrServer, fake_claude};
    use super::common::{Host, eventually, one_fleet, wait_for};

    /// The ids of the panes in fleetd's workspace.
    fn fleetd_panes(server: &HerdrServer) -> Vec<String> {
        let workspaces = server.call("workspace.list", json!({}));
        let Some(ours) = workspaces["workspaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["label"] == "fleetd")
        else {
            return Vec::new();
        };
        server.call("pane.list", json!({"workspace_id": ours["workspace_id"]}))["panes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pane_id"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_lead_herdr_starts_is_killed_from_outside_noticed_reported_and_restored() {
        let (nonce, fleet, password, mut cleanup) = one_fleet("hd");
        let root = tempfile::tempdir().unwrap();
        let host = Host::new(root.path(), "h1");
        let work = host.work_dir();
        let canary = format!("canary-herdr-{nonce:x}-zq");
        std::fs::write(host.dir.join("credentials/reviewer-token"), &canary).unwrap();
        // A fake `claude` outside every PATH: herdr starts it as its agent from this path.
        let claude = fake_claude(
            &root.path().join("agents"),
            "echo \"token-length:${#API_TOKEN}\"",
        );
        host.policy(&[(
            "00-policy.toml",
            format!(
                r#"[profile.reviewer]
description = "A lead herdr starts as its claude agent."
argv = ["{claude}"]
roots = ["{work}"]
secrets = {{ API_TOKEN = "credential:reviewer-token" }}
max_instances = 1
[profile.reviewer.ready]
timeout_secs = 30
# herdr starts it as its own agent (agent.start) only unsandboxed.
[profile.reviewer.sandbox]
mode = "off"

[profile.crashing]
description = "Exits with status 3 before it is ready."
argv = ["/bin/sh", "-c", "echo starting; exit 3"]
roots = ["{work}"]
max_instances = 1
[profile.crashing.ready]
pattern = "^never"
timeout_secs = 15

[[grant]]
id = "own"
description = "This host's leads and its primary."
fleets = ["{fleet}"]
hosts = ["h1"]
profiles = ["reviewer", "crashing"]
"#,
                work = work.display()
            ),
        )]);
        let server = HerdrServer::start();
        let socket = server.socket();
        let (child, log) = host.start_with_env(
            &fleet,
            &password,
            &[],
            &[],
            (
                "multiplexer = \"herdr\"\n",
                "[[lead]]\nname = \"reviewer\"\nprofile = \"reviewer\"\n",
            ),
            &[("HERDR_SOCKET_PATH", socket.to_str().unwrap())],
        );
        cleanup.children.push(child);
        let mut seen = String::new();
        wait_for(
            &log,
            &mut seen,
            &["lead running and ready"],
            Duration::from_secs(40),
        );
        let (id, status) = eventually("the lead in the roster", Duration::from_secs(10), || {
            host.agent_entry("reviewer")
        });
        assert_eq!(status, "ready");
        let panes = fleetd_panes(&server);
        assert_eq!(panes.len(), 1, "{panes:?}");
        let pane = panes[0].clone();
        let shown = server.text(&pane);
        assert!(
            shown.contains(&format!("token-length:{}", canary.len())),
            "the secret reaches the agent's environment: {shown}"
        );

        let pid = eventually("the agent's process", Duration::from_secs(10), || {
            server.foreground_pid(&pane)
        });
        let killed = Instant::now();
        assert!(
            Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        wait_for(
            &log,
            &mut seen,
            &["lead down", "exited with status"],
            Duration::from_secs(10),
        );
        let noticed = killed.elapsed();
        assert!(
            noticed < Duration::from_secs(5),
            "noticed after {noticed:?}"
        );
        wait_for(
            &log,
            &mut seen,
            &["lead running and ready", "\"restored\":true"],
            Duration::from_secs(40),
        );
        let (again, status) = host.agent_entry("reviewer").unwrap();
        assert_eq!(again, id, "the lead keeps its global id");
        assert_eq!(status, "ready");
        let now = fleetd_panes(&server);
        assert!(!now.contains(&pane), "the dead pane was closed: {now:?}");
        let audit = std::fs::read_to_string(host.state_dir().join("audit.jsonl")).unwrap();
        assert!(audit.contains("lead.down"), "{audit}");

        // After the death, a new spawn's exit still arrives, with its status.
        let (ok, reply) = host.spawn_cli(&["--profile", "crashing", "--json"]);
        let reply: serde_json::Value =
            serde_json::from_str(&reply).unwrap_or_else(|_| panic!("not JSON ({ok}): {reply}"));
        assert_eq!(reply["outcome"], "failed", "{reply}");
        assert!(reply.to_string().contains("status 3"), "{reply}");

        while let Ok(line) = log.try_recv() {
            seen.push_str(&line);
        }
        let screens: String = fleetd_panes(&server)
            .iter()
            .map(|p| server.text(p))
            .collect();
        for (place, text) in [
            ("herdr's log", server.log()),
            ("a pane's screen", screens),
            ("fleetd's log", seen),
            ("the audit", audit),
        ] {
            assert!(!text.contains(&canary), "the secret reached {place}");
        }
    }

    #[test]
    fn a_restart_mid_typing_into_a_40_column_pane_types_the_message_once() {
        let (_nonce, fleet, password, mut cleanup) = one_fleet("hw");
        let root = tempfile::tempdir().unwrap();
        let host = Host::new(root.path(), "h1");
        let work = host.work_dir();
        let agent = "echo 'agent> ready'; while read -r line; do echo \"got:[$line]\"; \
                     case \"$line\" in *please-ask*) echo 'Allow this command? (y/n)';; esac; done";
        // The same agent twice: `worker` (labelled below), `plain` (started without a label).
        let profile = |name: &str| {
            format!(
                r#"[profile.{name}]
description = "A scripted agent with a prompt."
argv = ["/bin/sh", "-c", '''{agent}''']
roots = ["{work}"]
max_instances = 1
[profile.{name}.ready]
pattern = "^agent> ready"
timeout_secs = 15
"#,
                work = work.display()
            )
        };
        host.policy(&[(
            "00-policy.toml",
            format!(
                r#"{worker}
{plain}
[[grant]]
id = "own"
description = "This host's primary."
fleets = ["{fleet}"]
hosts = ["h1"]
profiles = ["worker", "plain"]
"#,
                worker = profile("worker"),
                plain = profile("plain"),
            ),
        )]);
        let server = HerdrServer::start();
        let socket = server.socket();
        let start = || {
            host.start_with_env(
                &fleet,
                &password,
                &[],
                &[],
                ("multiplexer = \"herdr\"\n", ""),
                &[("HERDR_SOCKET_PATH", socket.to_str().unwrap())],
            )
        };
        let (child, log) = start();
        cleanup.children.push(child);
        let mut seen = String::new();
        wait_for(&log, &mut seen, &["fleetd ready"], Duration::from_secs(20));
        let (ok, reply) = host.spawn_cli(&["--profile", "worker", "--label", "w1", "--json"]);
        assert!(ok, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let worker = reply["agent"].as_str().unwrap().to_owned();
        let pane = fleetd_panes(&server)[0].clone();

        // The user splits the agent's pane: it is left 40 columns wide.
        let (_, _, width, _) = server.rect(&pane);
        let ratio = 40.0 / f64::from(u32::try_from(width).unwrap());
        server.call(
            "pane.split",
            json!({"target_pane_id": pane, "direction": "right", "ratio": ratio, "focus": false}),
        );
        let (_, _, narrow, _) = server.rect(&pane);
        assert!(
            (36..=44).contains(&narrow),
            "the agent's pane is {narrow} wide"
        );

        // The agent asks something: the next message is held, not typed.
        let primary = host.open_agent("primary");
        let (asking, _) = host.send(&worker, &primary, "please-ask");
        host.wait_delivery(&asking, "delivered");
        let text =
            "second task: a message long enough to wrap more than once in a pane this narrow";
        let (waiting, _) = host.send(&worker, &primary, text);
        wait_for(
            &log,
            &mut seen,
            &["message held for its pane agent"],
            Duration::from_secs(15),
        );

        // fleetd stops mid-typing: the pane shows the line typed (as the crashed daemon left
        // it), wrapped over several rows, and the prompt has scrolled out of view.
        super::common::terminate(&cleanup.children[0]);
        let _ = cleanup.children[0].wait();
        for _ in 0..32 {
            server.call(
                "pane.send_input",
                json!({"pane_id": pane, "text": "", "keys": ["Enter"]}),
            );
        }
        let line = format!("[fleetd: from {fleet}/h1 agent {primary}, msg {waiting}] {text}");
        assert!(line.len() > 2 * 40, "the line wraps");
        server.call(
            "pane.send_input",
            json!({"pane_id": pane, "text": line, "keys": ["Enter"]}),
        );
        let (child, log) = start();
        cleanup.children[0] = child;
        wait_for(
            &log,
            &mut seen,
            &["message found already typed"],
            Duration::from_secs(20),
        );
        host.wait_delivery(&waiting, "delivered");
        let shown = server.text(&pane);
        let typed = shown
            .lines()
            .filter(|l| l.contains("got:[") && l.contains("second task"))
            .count();
        assert_eq!(typed, 1, "typed again after the restart: {shown}");

        // Without a label, the agent is named after its profile and herdr's pane id (`w1:p2`
        // holds a character a name may not: it becomes `w1-p2`), and is typed into.
        let before = fleetd_panes(&server);
        let (ok, reply) = host.spawn_cli(&["--profile", "plain", "--json"]);
        assert!(ok, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let name = reply["name"].as_str().unwrap_or_default();
        assert!(name.starts_with("plain-") && !name.contains(':'), "{reply}");
        let plain = reply["agent"].as_str().unwrap().to_owned();
        let (hello, _) = host.send(&plain, &primary, "hello unlabelled");
        host.wait_delivery(&hello, "delivered");
        let other = fleetd_panes(&server)
            .into_iter()
            .find(|p| !before.contains(p))
            .unwrap();
        let shown = server.text(&other);
        assert!(
            shown.contains(&format!("msg {hello}] hello unlabelled]")),
            "{shown}"
        );
        // Over the real herdr, fleetd started nothing: no child process of its own (its
        // Landlock plan allows no exec either: tests/sandbox.rs).
        let daemon = cleanup.children[0].id();
        let children: String = std::fs::read_dir(format!("/proc/{daemon}/task"))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).ok())
            .collect();
        assert_eq!(children.trim(), "", "fleetd's children: {children}");
    }
}
