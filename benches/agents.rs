//! The real agents through fleetd against typing by hand with tmux, in one run (issue 34):
//! Claude Code 2.1.197 and Codex 0.171.0 as `scripts/agents` installs them, offline, with the
//! shipped profiles (`tests/common/real_agents.rs` builds the host; needs root).
//!
//! - **spawn → ready**: `fleetd spawn` (policy, pane, the pane's init, the readiness gate with
//!   the profile's pattern and settle time) until it replies `started`, against the baseline: a
//!   window opened by hand (`tmux new-window CLI`) polled every 20 ms until its input line shows
//!   (`^❯`, `^›`), with no settle time;
//! - **send → submitted**: `fleetd send` until the message's state is `delivered` (typed, Enter,
//!   seen above the input line), against the baseline: the same frame pasted by hand
//!   (`load-buffer`, `paste-buffer -p`, 0.5 s, `send-keys Enter`, the gap a person needs for
//!   Claude Code to take its first message) polled until it stands above the input line.
//!
//! Run: `cargo bench --bench agents` (3 rounds each); the test command runs one round.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a benchmark reports on stdout and fails loudly"
)]

#[path = "../tests/common/real_agents.rs"]
mod host;

use std::time::{Duration, Instant};

use host::{Home, World};

fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// The agents: profile, the CLI's path inside the host, its input line's first character, the
/// profile's settle time.
const AGENTS: &[(&str, &str, char, Duration)] = &[
    ("worker", "/usr/local/bin/claude", '❯', Duration::ZERO),
    (
        "codex",
        "/usr/local/bin/codex --no-daemon",
        '›',
        Duration::from_secs(4),
    ),
];

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Polls `check` every 20 ms for up to 90 s.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let by = Instant::now() + Duration::from_secs(90);
    while !check() {
        assert!(Instant::now() < by, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `marker` stands above the last line of `screen` that starts with `prompt`.
fn above_input(screen: &str, prompt: char, marker: &str) -> bool {
    let lines: Vec<&str> = screen.lines().collect();
    let input = lines
        .iter()
        .rposition(|l| l.starts_with(prompt))
        .unwrap_or(lines.len());
    let compact = |ls: &[&str]| -> String {
        ls.iter()
            .flat_map(|l| l.chars())
            .filter(|c| !c.is_whitespace())
            .collect()
    };
    let wanted: String = marker.chars().filter(|c| !c.is_whitespace()).collect();
    compact(&lines[..input]).contains(&wanted)
}

/// By hand: a window running `cli` in the agents' session, polled until its input line shows,
/// and until it has stood for `settle`: both times, and the pane.
fn by_hand_ready(
    world: &World,
    cli: &str,
    prompt: char,
    settle: Duration,
) -> (Duration, Duration, String) {
    let started = Instant::now();
    let pane = world.tmux(&[
        "new-window",
        "-d",
        "-P",
        "-F",
        "#{pane_id}",
        "-t",
        "keep:",
        "-c",
        "/srv/fleet/work",
        "-e",
        &format!("ANTHROPIC_API_KEY={}", host::ANTHROPIC_KEY),
        "-e",
        &format!("OPENAI_API_KEY={}", host::OPENAI_KEY),
        "-e",
        "DISABLE_AUTOUPDATER=1",
        cli,
    ]);
    let pane = pane.trim().to_owned();
    let shows = || {
        world
            .tmux(&["capture-pane", "-p", "-t", &pane])
            .lines()
            .any(|l| l.starts_with(prompt))
    };
    until("the hand-started CLI's input line", shows);
    let first = started.elapsed();
    let mut since = Instant::now();
    while since.elapsed() < settle {
        std::thread::sleep(Duration::from_millis(20));
        if !shows() {
            since = Instant::now();
        }
    }
    (first, started.elapsed(), pane)
}

/// Ends what a CLI started by hand left behind in the host's home (no init did): Codex's
/// app-server daemons — SIGTERM, SIGKILL after 2 s — and waits until they are gone. Only
/// processes of this host's home, never another's.
fn end_leftovers(world: &World) {
    let home = format!("HOME={}\0", world.home().display());
    let left = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                host::environ(*pid).contains(&home)
                    && String::from_utf8_lossy(&cmdline).contains("app-server")
            })
            .collect()
    };
    let started = Instant::now();
    loop {
        let pids = left();
        if pids.is_empty() {
            return;
        }
        let signal = if started.elapsed() < Duration::from_secs(2) {
            "-TERM"
        } else {
            "-KILL"
        };
        for pid in pids {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "leftovers do not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// By hand: a framed message pasted, 0.5 s, Enter; until it stands above the input line.
fn by_hand_submitted(world: &World, pane: &str, prompt: char, n: usize) -> Duration {
    let id = format!("0190bench-0000-7000-8000-{n:012}");
    let text = format!("[fleetd: from local/bench, msg {id}] by hand {n}");
    let buffer = format!("bench{n}");
    let started = Instant::now();
    let mut load = world.command("tmux");
    load.args(["-L", "fleetd", "load-buffer", "-b", &buffer, "-"])
        .stdin(std::process::Stdio::piped());
    let mut child = load.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    world.tmux(&["paste-buffer", "-p", "-d", "-b", &buffer, "-t", pane]);
    std::thread::sleep(Duration::from_millis(500));
    world.tmux(&["send-keys", "-t", pane, "Enter"]);
    let marker = format!("msg {id}]");
    let by = Instant::now() + Duration::from_secs(30);
    loop {
        let screen = world.tmux(&["capture-pane", "-p", "-J", "-t", pane]);
        if above_input(&screen, prompt, &marker) {
            break;
        }
        assert!(
            Instant::now() < by,
            "the hand-typed message not submitted:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

fn main() {
    let rounds = if quick() { 1 } else { 3 };
    let world = World::start(Home::Prepared);
    let primary = world.fleetd(&["agent", "open", "primary"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for &(profile, cli, prompt, settle) in AGENTS {
        let (mut fleetd_ready, mut hand_ready) = (Vec::new(), Vec::new());
        let mut hand_settled = Vec::new();
        let (mut fleetd_sent, mut hand_sent) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Through fleetd.
            let started = Instant::now();
            let reply = world.spawn(profile, &format!("{profile}-bench-{round}"));
            assert_eq!(reply["outcome"], "started", "{reply}");
            fleetd_ready.push(started.elapsed());
            let agent = reply["agent"].as_str().unwrap().to_owned();
            let started = Instant::now();
            let sent = world.fleetd(&["send", &agent, "through fleetd", "--from", &primary]);
            let id = sent["id"].as_str().unwrap().to_owned();
            let by = Instant::now() + Duration::from_secs(90);
            while world.fleetd(&["delivery", &id])["state"] != "delivered" {
                assert!(
                    Instant::now() < by,
                    "{profile}: not delivered: {}\n{}\n{}",
                    world.fleetd(&["roster"]),
                    world.shown(&world.pane_of(&agent)),
                    world.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            fleetd_sent.push(started.elapsed());
            let pane = world.pane_of(&agent);
            world.tmux(&["kill-pane", "-t", &pane]);
            // Codex's daemons share its home: the next start waits until they are gone.
            until("the agent's processes gone", || {
                host::processes_of(&agent).is_empty()
            });
            // By hand.
            let (ready, settled, pane) = by_hand_ready(&world, cli, prompt, settle);
            hand_ready.push(ready);
            hand_settled.push(settled);
            hand_sent.push(by_hand_submitted(&world, &pane, prompt, round));
            world.tmux(&["kill-pane", "-t", &pane]);
            // Without fleetd's init, what the CLI started lives on: ended here by hand.
            end_leftovers(&world);
        }
        let (fr, hr) = (median(fleetd_ready), median(hand_ready));
        let hss = median(hand_settled);
        let (fs, hs) = (median(fleetd_sent), median(hand_sent));
        println!(
            "{profile} ({cli}): spawn → ready {:.2} s through fleetd vs {:.2} s by hand ({:.2}×; \
             {:.2} s by hand with the profile's {} s settle, {:.2}×); send → submitted {:.2} s vs \
             {:.2} s by hand ({:.2}×); median of {rounds}",
            fr.as_secs_f64(),
            hr.as_secs_f64(),
            fr.as_secs_f64() / hr.as_secs_f64(),
            hss.as_secs_f64(),
            settle.as_secs(),
            fr.as_secs_f64() / hss.as_secs_f64(),
            fs.as_secs_f64(),
            hs.as_secs_f64(),
            fs.as_secs_f64() / hs.as_secs_f64(),
        );
    }
}
