//! The real agents (issue 34): Claude Code and Codex, pinned and installed by `scripts/agents`,
//! driven offline in fleetd's tmux panes with the shipped profiles as shipped
//! (`tests/common/real_agents.rs` builds the host). Their API calls fail — expected, and
//! nothing about fleetd. Proven here:
//!
//! - spawn → ready with the shipped `worker` (Claude Code) and `codex` profiles, the agents'
//!   home prepared as docs/panes.md says;
//! - folder trust, the API-key question and Codex's login menu reported as dialogs with their
//!   line: not ready, not answered;
//! - three messages in a row each typed once, framed, and submitted as a turn of its own (its
//!   own prompt line on the agent's screen, never two in one), `delivered` only then; the
//!   later ones arrive while the agent is busy with the first.
//!
//! Every test is under `real_agent::`: `scripts/test` skips them (and says so) only where the
//! CLIs cannot be installed and it is not CI.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

#[path = "common/real_agents.rs"]
mod host;

/// The single-host example's Claude Code and Codex profiles get the readiness the shipped ones
/// are proven with.
#[test]
fn the_examples_agents_are_ready_as_the_shipped_profiles_are() {
    let read = |path: &str| -> toml::Table {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
                .unwrap();
        text.parse().unwrap()
    };
    let shipped = read("policy/00-profiles.toml");
    let example = read("docs/examples/single-host/10-agents.toml");
    let ready = |table: &toml::Table, profile: &str| {
        let mut ready = table["profile"][profile]["ready"]
            .as_table()
            .unwrap()
            .clone();
        ready.remove("accept_dialogs");
        ready
    };
    assert_eq!(ready(&shipped, "worker"), ready(&example, "claude"));
    assert_eq!(ready(&shipped, "codex"), ready(&example, "codex"));
}

mod real_agent {
    use std::time::Duration;

    use super::host::{Home, World, eventually, processes_of};

    /// Sends `texts` from a mailbox agent to `agent`, one right after the other; their ids.
    fn send_all(world: &World, agent: &str, texts: &[&str]) -> Vec<String> {
        let primary = world.fleetd(&["agent", "open", "primary"])["id"]
            .as_str()
            .unwrap()
            .to_owned();
        texts
            .iter()
            .map(|text| {
                let sent = world.fleetd(&["send", agent, text, "--from", &primary]);
                sent["id"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{sent}"))
                    .to_owned()
            })
            .collect()
    }

    /// Waits until message `id` is `delivered`.
    fn delivered(world: &World, id: &str) {
        eventually(
            &format!("message {id} delivered"),
            Duration::from_secs(40),
            || (world.fleetd(&["delivery", id])["state"] == "delivered").then_some(()),
        );
    }

    /// Spawns `profile`, which must start; the agent's id and pane.
    fn started(world: &World, profile: &str, label: &str) -> (String, String) {
        let reply = world.spawn(profile, label);
        assert_eq!(
            reply["outcome"],
            "started",
            "{profile}: {reply}\n{}",
            world.log()
        );
        let agent = reply["agent"].as_str().unwrap().to_owned();
        let pane = world.pane_of(&agent);
        (agent, pane)
    }

    /// Each message of `ids` stands on the agent's screen exactly once, on a prompt line of its
    /// own (`prompt` starts it, no other message on it), and the input line — the last prompt
    /// line — holds none of them.
    fn each_its_own_turn(world: &World, pane: &str, prompt: char, ids: &[String]) {
        let screen = world.tmux(&["capture-pane", "-p", "-J", "-t", pane]);
        let lines: Vec<&str> = screen.lines().collect();
        let input = lines
            .iter()
            .rposition(|l| l.starts_with(prompt))
            .unwrap_or_else(|| panic!("no input line on screen:\n{screen}"));
        for id in ids {
            let marker = format!("msg {id}]");
            let on: Vec<&&str> = lines.iter().filter(|l| l.contains(&marker)).collect();
            assert_eq!(on.len(), 1, "message {id} shown once:\n{screen}");
            let line = on[0];
            // Codex lists messages it queued while busy behind `↳`.
            let start = line.trim_start();
            assert!(
                (start.starts_with(prompt) || start.starts_with('↳'))
                    && line.contains("[fleetd: from local/"),
                "message {id} framed, on a prompt line of its own:\n{screen}"
            );
            assert_eq!(
                line.matches("[fleetd: from ").count(),
                1,
                "one message per turn:\n{screen}"
            );
        }
        assert!(
            !lines[input].contains("[fleetd:"),
            "the input line is empty again:\n{screen}"
        );
        // Still busy with the first (its API calls fail and are retried): the later messages
        // were typed while it worked, and taken.
        assert!(
            screen.contains("esc to interrupt"),
            "the agent is still working on the first message:\n{screen}"
        );
    }

    #[test]
    fn claude_code_with_the_shipped_worker_profile_starts_ready_and_takes_each_message_as_its_own_turn()
     {
        let world = World::start(Home::Prepared);
        let (agent, pane) = started(&world, "worker", "claude-1");
        let ids = send_all(&world, &agent, &["first task", "second task", "third task"]);
        for id in &ids {
            delivered(&world, id);
        }
        each_its_own_turn(&world, &pane, '❯', &ids);
    }

    #[test]
    fn codex_with_the_shipped_profile_starts_ready_and_takes_each_message_as_its_own_turn() {
        let world = World::start(Home::Prepared);
        let (agent, pane) = started(&world, "codex", "codex-1");
        let ids = send_all(&world, &agent, &["first task", "second task", "third task"]);
        for id in &ids {
            delivered(&world, id);
        }
        each_its_own_turn(&world, &pane, '›', &ids);
    }

    /// Spawns `profile` (in `cwd`, when given) on `world`: it must fail on a dialog whose line
    /// contains `line`, with no pane left.
    fn dialog(world: &World, profile: &str, cwd: Option<&str>, line: &str) {
        let mut args = vec!["spawn", "--profile", profile];
        if let Some(cwd) = cwd {
            args.extend(["--cwd", cwd]);
        }
        let reply = world.fleetd(&args);
        assert_eq!(reply["outcome"], "failed", "{profile}: {reply}");
        let reason = reply["reasons"][0].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("blocked by a startup dialog") && reason.contains(line),
            "{profile}: the dialog and its line: {reply}"
        );
        let panes = world.tmux(&[
            "list-panes",
            "-a",
            "-F",
            "#{pane_id} #{pane_current_command}",
        ]);
        assert_eq!(
            panes.lines().count(),
            1,
            "only the keep pane is left: {panes}"
        );
        // Its pane closed, nothing the agent started is left (Codex's daemons included).
        let left = eventually(
            "the agent's processes gone",
            Duration::from_secs(15),
            || {
                let left = world.agent_processes();
                left.is_empty().then_some(left)
            },
        );
        assert!(left.is_empty());
    }

    #[test]
    fn startup_dialogs_are_reported_with_their_line_and_never_answered() {
        let untrusted = World::start(Home::Untrusted);
        dialog(&untrusted, "worker", None, "trust");
        // Codex asks about trust in a git checkout.
        let init = untrusted
            .command("git")
            .args(["init", "-q", "/srv/fleet/work/repo"])
            .status()
            .unwrap();
        assert!(init.success());
        dialog(&untrusted, "codex", Some("repo"), "Trust this folder?");
        let key = World::start(Home::KeyUnapproved);
        dialog(&key, "worker", None, "Do you want to use this API key?");
        let fresh = World::start(Home::Fresh);
        dialog(&fresh, "codex", None, "Sign in with ChatGPT");
        // Nothing was answered: the homes are as they were (Claude Code records an answer in
        // its `.claude.json`, Codex a trusted project in its config).
        let claude = std::fs::read_to_string(key.home().join(".claude.json")).unwrap();
        let suffix = &super::host::ANTHROPIC_KEY[super::host::ANTHROPIC_KEY.len() - 20..];
        assert!(
            !claude.contains(suffix),
            "the key neither approved nor rejected: {claude}"
        );
        let codex = std::fs::read_to_string(untrusted.home().join(".codex/config.toml")).unwrap();
        assert!(!codex.contains("trusted"), "{codex}");
    }

    #[test]
    fn nothing_an_agent_started_outlives_its_pane_or_its_server() {
        // (Codex as it runs by default, sharing a daemon; the shipped profile runs
        // `--no-daemon`, see the next test.)
        let world = World::start(Home::Prepared);
        let (codex, pane) = started(&world, "codex-default", "codex-1");
        let (claude, _) = started(&world, "worker", "claude-1");
        // Codex's app-server daemons (its default) leave its session: they are what used to be
        // left behind.
        let running = eventually("Codex's detached daemons", Duration::from_secs(20), || {
            let all = processes_of(&codex);
            let first = world.tmux(&["display-message", "-p", "-t", &pane, "#{pane_pid}"]);
            let first: u32 = first.trim().parse().ok()?;
            let session = all.iter().find(|p| p.pid == first)?.session;
            all.iter().any(|p| p.session != session).then_some(all)
        });
        assert!(running.len() >= 3, "{running:?}");
        // The operator closes Codex's pane.
        world.tmux(&["kill-pane", "-t", &pane]);
        let gone = eventually("Codex's processes gone", Duration::from_secs(15), || {
            let left = processes_of(&codex);
            left.is_empty().then_some(left)
        });
        assert!(gone.is_empty());
        // The multiplexer's server stops (its unit stops, or it is killed): Claude Code and
        // everything it started end with it.
        assert!(!processes_of(&claude).is_empty());
        world.tmux(&["kill-server"]);
        let gone = eventually(
            "Claude Code's processes gone",
            Duration::from_secs(15),
            || {
                let left = processes_of(&claude);
                left.is_empty().then_some(left)
            },
        );
        assert!(gone.is_empty());
    }

    /// Someone at `pane`'s terminal opens the agent's model picker (`/model`, a dialog of the
    /// agent's own, reachable offline), whose footer says `footer`.
    fn open_picker(world: &World, pane: &str, footer: &str) {
        world.tmux(&["send-keys", "-t", pane, "-l", "/model"]);
        std::thread::sleep(Duration::from_millis(500));
        world.tmux(&["send-keys", "-t", pane, "Enter"]);
        eventually("the agent's picker", Duration::from_secs(10), || {
            world.shown(pane).contains(footer).then_some(())
        });
    }

    #[test]
    fn a_dialog_the_agent_shows_holds_its_messages_and_the_roster_says_blocked_at_once() {
        let world = World::start(Home::Prepared);
        for (profile, prompt, footer) in
            [("worker", '❯', "Esc to cancel"), ("codex", '›', "esc back")]
        {
            let (agent, pane) = started(&world, profile, &format!("{profile}-blocked"));
            open_picker(&world, &pane, footer);
            let id = send_all(&world, &agent, &["after the picker"]).remove(0);
            let record = eventually("message.blocked", Duration::from_secs(20), || {
                world
                    .audit()
                    .lines()
                    .find(|l| l.contains("\"message.blocked\"") && l.contains(&id))
                    .map(str::to_owned)
            });
            // Held now, and the roster says so now: not at the next announcement.
            let entry = world.roster_entry(&agent);
            assert_eq!(entry["status"], "blocked", "{profile}: {entry} ({record})");
            let why = entry["why"].as_str().unwrap_or_default();
            assert!(
                why.contains("a prompt waits for an answer"),
                "{profile}: {entry}"
            );
            assert_eq!(world.fleetd(&["delivery", &id])["state"], "queued");
            assert!(
                !world.shown(&pane).contains(&format!("msg {id}]")),
                "{profile}: nothing typed into the picker"
            );
            // The person closes the picker: the message is typed, taken, and the agent ready.
            world.tmux(&["send-keys", "-t", &pane, "Escape"]);
            delivered(&world, &id);
            each_its_own_turn(&world, &pane, prompt, &[id]);
            eventually("the roster at ready", Duration::from_secs(10), || {
                (world.roster_entry(&agent)["status"] == "ready").then_some(())
            });
        }
    }

    #[test]
    fn two_codex_agents_in_one_home_keep_working_when_one_is_closed() {
        let world = World::start(Home::Prepared);
        let (_, first) = started(&world, "codex", "codex-1");
        let (second, pane) = started(&world, "codex", "codex-2");
        world.tmux(&["kill-pane", "-t", &first]);
        std::thread::sleep(Duration::from_secs(3));
        let ids = send_all(&world, &second, &["still there?"]);
        delivered(&world, &ids[0]);
        each_its_own_turn(&world, &pane, '›', &ids);
        let screen = world.shown(&pane);
        assert!(
            !screen.contains("Reconnecting to server"),
            "the second agent kept its server:\n{screen}"
        );
    }
}
