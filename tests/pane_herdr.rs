//! The herdr backend against a **test server written from herdr's documented socket protocol**
//! (herdr cannot be installed on this machine): newline-delimited JSON over a Unix socket, one
//! request per connection, `{"id","method","params"}` → `{"id","result":{"type",…}}` or
//! `{"id","error":{"code","message"}}`, with the methods fleetd uses — `ping`, `pane.split`,
//! `agent.start`, `agent.prompt`, `pane.send_input`, `pane.read`, `pane.get`, `pane.close`,
//! `pane.list` — as summarised, with sources, in the project's research notes
//! (shared/research/peers-herdr.md §1). The server is a stand-in, not herdr.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fleetd::pane::herdr::Herdr;
use fleetd::pane::{Launch, Multiplexer, PaneError, PaneId, PaneState};
use serde_json::{Value, json};

#[derive(Default)]
struct Pane {
    env: BTreeMap<String, String>,
    typed: String,
    agent: Option<String>,
    blocked: bool,
}

#[derive(Default)]
struct World {
    panes: BTreeMap<String, Pane>,
    next: u32,
    connections: u32,
    requests: u32,
    /// Held `events.subscribe` connections.
    subscribers: Vec<std::os::unix::net::UnixStream>,
    subscriptions: Vec<Value>,
    requests_for_get: u32,
}

impl World {
    /// Pushes `event` to every subscriber (herdr's stream framing: one JSON line each).
    fn emit(&mut self, event: &Value) {
        let mut line = event.to_string();
        line.push('\n');
        self.subscribers
            .retain_mut(|s| s.write_all(line.as_bytes()).is_ok());
    }

    /// Drops every subscription connection (as a herdr restart or live handoff would).
    fn drop_subscribers(&mut self) {
        for s in self.subscribers.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Serves herdr's protocol (one request per connection) on `path` with `protocol`.
fn serve(path: &Path, protocol: u64) -> Arc<Mutex<World>> {
    let world = Arc::new(Mutex::new(World::default()));
    let listener = UnixListener::bind(path).unwrap();
    let shared = Arc::clone(&world);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            let mut world = shared.lock().unwrap();
            world.connections += 1;
            let reply = match serde_json::from_str::<Value>(&line) {
                Ok(request) if request["method"] == "events.subscribe" => {
                    // A held connection: ack, then pushed events until either side closes.
                    world.requests += 1;
                    world
                        .subscriptions
                        .push(request["params"]["subscriptions"].clone());
                    let ack =
                        json!({"id": request["id"], "result": {"type": "subscription_started"}});
                    let _ = stream.write_all(format!("{ack}\n").as_bytes());
                    world.subscribers.push(stream);
                    continue;
                }
                Ok(request) => {
                    world.requests += 1;
                    answer(&mut world, &request, protocol)
                }
                Err(_) => {
                    json!({"id": "", "error": {"code": "invalid_request", "message": "not JSON"}})
                }
            };
            drop(world);
            let mut out = reply.to_string();
            out.push('\n');
            let _ = stream.write_all(out.as_bytes());
            // One request per connection: the server closes it.
        }
    });
    world
}

fn answer(world: &mut World, request: &Value, protocol: u64) -> Value {
    let id = request["id"].clone();
    let p = &request["params"];
    let error = |code: &str| json!({"id": id, "error": {"code": code, "message": code}});
    let ok = |result: Value| json!({"id": id, "result": result});
    let pane_id = p["pane_id"].as_str().unwrap_or_default().to_owned();
    match request["method"].as_str().unwrap_or_default() {
        "ping" => ok(json!({"type": "pong", "version": "0.8.2", "protocol": protocol})),
        "pane.split" => {
            if !matches!(p["direction"].as_str(), Some("right" | "down")) {
                return error("invalid_params");
            }
            world.next += 1;
            let id = format!("w1:p{}", world.next);
            let env = serde_json::from_value(p["env"].clone()).unwrap_or_default();
            world.panes.insert(
                id.clone(),
                Pane {
                    env,
                    ..Pane::default()
                },
            );
            ok(json!({"type": "pane_info", "pane": {"pane_id": id, "workspace_id": "w1"}}))
        }
        "agent.start" => {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            let valid = name.len() <= 32
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c));
            if !valid {
                return error("invalid_agent_name");
            }
            let Some(pane) = world.panes.get_mut(&pane_id) else {
                return error("agent_pane_not_found");
            };
            pane.agent = Some(name.clone());
            let mut argv = vec![p["kind"].clone()];
            argv.extend(p["args"].as_array().cloned().unwrap_or_default());
            ok(
                json!({"type": "agent_started", "agent": {"name": name, "launch_pending": true}, "argv": argv}),
            )
        }
        "agent.prompt" => {
            let target = p["target"].as_str().unwrap_or_default();
            let Some(pane) = world
                .panes
                .values_mut()
                .find(|pane| pane.agent.as_deref() == Some(target))
            else {
                return error("agent_not_found");
            };
            if pane.blocked {
                return error("agent_blocked");
            }
            pane.typed.push_str(p["text"].as_str().unwrap_or_default());
            pane.typed.push('\n');
            ok(json!({"type": "agent_prompted", "agent": {"name": target}}))
        }
        "agent.get" => {
            // Launch pending for the first two looks, then interactive-ready (herdr's settle).
            world.requests_for_get += 1;
            let target = p["target"].as_str().unwrap_or_default();
            if !world
                .panes
                .values()
                .any(|pane| pane.agent.as_deref() == Some(target))
            {
                return error("agent_not_found");
            }
            let ready = world.requests_for_get > 2;
            ok(json!({"type": "agent_info", "agent": {"name": target,
                "interactive_ready": ready, "launch_pending": !ready, "agent_status": if ready { "idle" } else { "unknown" }}}))
        }
        "pane.send_input" => {
            let Some(pane) = world.panes.get_mut(&pane_id) else {
                return error("pane_not_found");
            };
            pane.typed.push_str(p["text"].as_str().unwrap_or_default());
            if p["keys"] == json!(["Enter"]) {
                pane.typed.push('\n');
            }
            ok(json!({"type": "ok"}))
        }
        "pane.read" => match world.panes.get(&pane_id) {
            Some(pane) => ok(json!({"type": "pane_read", "read": {
                "pane_id": pane_id, "workspace_id": "w1", "source": p["source"],
                "format": "text", "text": pane.typed, "revision": 1, "truncated": false}})),
            None => error("pane_not_found"),
        },
        "pane.get" => match world.panes.get(&pane_id) {
            Some(_) => ok(json!({"type": "pane_info", "pane": {"pane_id": pane_id}})),
            None => error("pane_not_found"),
        },
        "pane.close" => match world.panes.remove(&pane_id) {
            Some(_) => ok(json!({"type": "ok"})),
            None => error("pane_not_found"),
        },
        "pane.list" => ok(json!({"type": "pane_list",
            "panes": world.panes.keys().map(|id| json!({"pane_id": id})).collect::<Vec<_>>()})),
        _ => error("invalid_request"),
    }
}

fn launch(argv: &[&str], env: &[(&str, &str)]) -> Launch {
    Launch {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: std::env::temp_dir(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

#[test]
fn herdr_panes_are_split_with_their_environment_and_agents_prompted_with_safe_text() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let world = serve(&socket, 20);
    let herdr = Herdr::open(&socket).unwrap();

    // An agent kind herdr knows: split with env, then agent.start; text goes by agent.prompt.
    let agent = herdr
        .launch(&launch(
            &["/usr/local/bin/claude", "--permission-mode", "plan"],
            &[("TOKEN", "canary-7f3a")],
        ))
        .unwrap();
    {
        let world = world.lock().unwrap();
        let pane = &world.panes[&agent.0];
        assert_eq!(
            pane.env["TOKEN"], "canary-7f3a",
            "the environment travels with pane.split"
        );
        assert!(
            pane.agent
                .as_deref()
                .is_some_and(|n| n.starts_with("fleetd-"))
        );
    }
    herdr
        .send_text(&agent, "hello \u{1b}[201~\u{1b}[31mthere\0")
        .unwrap();
    assert_eq!(herdr.read(&agent, 10).unwrap(), "hello there\n");

    // A plain command: typed into the pane's shell, quoted.
    let shell = herdr.launch(&launch(&["/bin/echo", "it's"], &[])).unwrap();
    assert_eq!(herdr.read(&shell, 10).unwrap(), "'/bin/echo' 'it'\\''s'\n");
    assert_eq!(herdr.state(&shell).unwrap(), PaneState::Running);

    // A blocked agent refuses the prompt; herdr's error comes back as such.
    world
        .lock()
        .unwrap()
        .panes
        .get_mut(&agent.0)
        .unwrap()
        .blocked = true;
    let error = herdr.send_text(&agent, "more").unwrap_err();
    assert!(error.to_string().contains("agent_blocked"), "{error}");

    let listed = herdr.list().unwrap();
    assert!(listed.contains(&agent) && listed.contains(&shell));
    herdr.close(&shell).unwrap();
    assert!(matches!(herdr.state(&shell), Err(PaneError::NoPane(id)) if id == shell));
    assert!(matches!(
        herdr.read(&PaneId("w1:p99".to_owned()), 5),
        Err(PaneError::NoPane(_))
    ));

    let world = world.lock().unwrap();
    assert_eq!(
        world.connections, world.requests,
        "one request per connection"
    );
}

#[test]
fn an_unknown_protocol_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let _world = serve(&socket, 99);
    let error = Herdr::open(&socket).unwrap_err();
    assert!(error.to_string().contains("protocol 99"), "{error}");
    let missing = Herdr::open(&dir.path().join("absent.sock")).unwrap_err();
    assert!(missing.to_string().contains("cannot connect"), "{missing}");
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_event_subscription_follows_agents_and_survives_a_dropped_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let world = serve(&socket, 20);
    let herdr = Herdr::open(&socket).unwrap();
    eventually("subscribed at open", || herdr.subscriptions() >= 1);
    let agent = herdr
        .launch(&launch(&["/usr/local/bin/claude"], &[]))
        .unwrap();
    // A new agent pane renews the subscription to watch its status.
    eventually("renewed for the new agent", || {
        world
            .lock()
            .unwrap()
            .subscriptions
            .last()
            .is_some_and(|s| s.to_string().contains(&agent.0))
    });
    world
        .lock()
        .unwrap()
        .emit(&json!({"event": "pane.agent_status_changed",
        "data": {"pane_id": agent.0, "workspace_id": "w1", "agent_status": "blocked"}}));
    eventually("blocked is learnt", || herdr.blocked(&agent) == Some(true));

    // herdr drops the stream (restart, live handoff): fleetd reconnects and keeps learning.
    let before = herdr.subscriptions();
    world.lock().unwrap().drop_subscribers();
    eventually("reconnected", || herdr.subscriptions() > before);
    eventually("subscriber back", || {
        !world.lock().unwrap().subscribers.is_empty()
    });
    world.lock().unwrap().emit(&json!({"event": "pane_exited",
        "data": {"type": "pane_exited", "pane": {"pane_id": agent.0, "exit_code": 3}}}));
    eventually("the exit is learnt", || {
        herdr.state(&agent).ok() == Some(PaneState::Exited(3))
    });

    // Reconciliation forgets panes herdr no longer lists.
    world.lock().unwrap().panes.remove(&agent.0);
    let before = herdr.subscriptions();
    world.lock().unwrap().drop_subscribers();
    eventually("reconnected again", || herdr.subscriptions() > before);
    eventually("forgotten", || herdr.blocked(&agent).is_none());
}

#[test]
fn the_spawn_gate_waits_for_herdrs_interactive_ready() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let world = serve(&socket, 20);
    let herdr = std::sync::Arc::new(Herdr::open(&socket).unwrap());
    let policy_dir = dir.path().join("policy");
    std::fs::create_dir(&policy_dir).unwrap();
    std::fs::write(
        policy_dir.join("p.toml"),
        format!(
            "[profile.worker]\ndescription = \"An agent herdr knows.\"\nargv = [\"/usr/local/bin/claude\"]\n\
             roots = [\"{}\"]\nmax_instances = 1\n[profile.worker.ready]\ntimeout_secs = 10\n\
             [[grant]]\nid = \"g\"\ndescription = \"test\"\nfleets = [\"f\"]\nhosts = [\"h\"]\nprofiles = [\"worker\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let (policy, diagnostics) = fleetd::policy::load_dir(&policy_dir);
    let policy = policy.unwrap_or_else(|_| panic!("{diagnostics:?}"));
    let spawner = fleetd::spawn::Spawner::new(herdr);
    let request = fleetd::policy::Request::from_value(
        &json!({"origin": {"fleet": "f", "host": "h"}, "profile": "worker"}),
    )
    .unwrap();
    let outcome = spawner.spawn(
        &policy,
        &request,
        &|_| Err("no secrets here".to_owned()),
        &[],
    );
    assert!(
        matches!(outcome, fleetd::spawn::Outcome::Started { .. }),
        "{outcome:?}"
    );
    assert!(
        world.lock().unwrap().requests_for_get >= 3,
        "the gate asked herdr until the agent was interactive-ready"
    );
}
