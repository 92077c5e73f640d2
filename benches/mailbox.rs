//! The host-local mailbox, on a running daemon (single-host mode, a real tmux server), against
//! the floor measured in the same run (issue 37):
//!
//! - **send → typed**: a local `send` over the API until the scripted agent (Python, stamping
//!   each line it reads with the wall clock) has read the line, one message at a time; the
//!   floor: the same frame typed into the same pane by one `tmux set-buffer ; paste-buffer ;
//!   send-keys Enter` call. Target: p50 ≤ 10 ms, p99 ≤ 50 ms.
//! - **held → pulled**: a `held.pull` waiting on an empty mailbox answers after the send that
//!   holds a message for it has returned (the message is durable). Target ≤ 10 ms.
//!
//! - **idle CPU with a full mailbox**: the daemon's CPU time over an idle window with nothing
//!   held, then over the same window with 10,000 messages held for a mailbox nobody pulls.
//!   Target ≤ 1.5× the empty daemon. CPU time is the sum over the daemon's threads of
//!   `/proc/PID/task/TID/schedstat`'s first field (ns run on a CPU), taken per thread at both
//!   ends; `/proc/PID/stat`'s utime + stime (10 ms ticks, dead threads included) beside it.
//!
//! Run: `cargo bench --bench mailbox` (200 messages, 50 pulls, 10,000 held, 20 s windows); as a
//! test, 5 messages, 3 pulls, 300 held, 1 s windows.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// The agent: ready, then one line per line read — the wall clock in ns and the line's last
/// word — appended to the file its argument names.
const STAMP: &str = "import sys, time; out = open(sys.argv[1], 'a', buffering=1); \
print('agent> ready', flush=True); \
[out.write('%d %s\\n' % (time.time_ns(), (line.split() or ['-'])[-1])) for line in sys.stdin]";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

struct Home {
    dir: tempfile::TempDir,
    daemon: Option<Child>,
}

impl Home {
    fn start() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let policy = dir.path().join(".config/fleetd/policy");
        std::fs::create_dir_all(&policy).unwrap();
        std::fs::write(
            policy.join("00-stamp.toml"),
            format!(
                "[profile.stamp]\ndescription = \"Stamps each line it reads.\"\n\
                 argv = [\"/usr/bin/python3\", \"-I\", \"-c\", '''{STAMP}''', \"{stamps}\"]\n\
                 roots = [\"{work}\"]\nmax_instances = 1\n\
                 [profile.stamp.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 20\n\n\
                 [[grant]]\nid = \"local-stamp\"\ndescription = \"bench\"\n\
                 fleets = [\"local\"]\nprofiles = [\"stamp\"]\n",
                stamps = work.join("stamps").display(),
                work = work.display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("tmux")).unwrap();
        let mut home = Home { dir, daemon: None };
        let tmux = home
            .env(Command::new("tmux"))
            .args([
                "-L",
                "fleetd",
                "new-session",
                "-d",
                "-s",
                "keep",
                "sleep 600",
            ])
            .status()
            .expect("tmux is needed (scripts/test installs it)");
        assert!(tmux.success(), "the bench's tmux server");
        let daemon = home
            .env(Command::new(BIN))
            .arg("run")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        home.daemon = Some(daemon);
        let by = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(home.socket()).is_err() {
            assert!(Instant::now() < by, "the daemon's socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        home
    }

    fn env(&self, mut command: Command) -> Command {
        let path = self.dir.path();
        let bin_dir = Path::new(BIN).parent().unwrap();
        command
            .env_remove("FLEETD_CONFIG")
            .env("HOME", path)
            .env("XDG_STATE_HOME", path.join("state"))
            .env("XDG_RUNTIME_DIR", path.join("run"))
            // A directory of its own: every sandbox hides the tmux socket's directory.
            .env("TMUX_TMPDIR", path.join("tmux"))
            .env(
                "PATH",
                format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
            );
        command
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/fleetd/fleetd.sock")
    }

    fn stamps(&self) -> PathBuf {
        self.dir.path().join("work/stamps")
    }

    fn ask(&self, request: &Value) -> Value {
        ask(&self.socket(), request)
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = self
            .env(Command::new("tmux"))
            .args(["-L", "fleetd"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        let _ = self
            .env(Command::new("tmux"))
            .args(["-L", "fleetd", "kill-server"])
            .status();
    }
}

fn ask(socket: &Path, request: &Value) -> Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap()
}

/// Waits until the agent has read the line whose last word is `word` and returns when it did
/// (ns); a line read twice fails the bench.
fn stamp(home: &Home, word: &str) -> u128 {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(home.stamps()) {
            let mut read = text
                .lines()
                .filter_map(|line| line.split_once(' '))
                .filter(|(_, last)| *last == word);
            if let Some((at, _)) = read.next() {
                assert!(read.next().is_none(), "`{word}` was read twice:\n{text}");
                return at.parse().unwrap();
            }
        }
        assert!(Instant::now() < by, "`{word}` was not read within 20 s");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Each of `pid`'s threads: the ns it has run on a CPU (`schedstat`'s first field).
fn thread_cpu(pid: u32) -> HashMap<String, u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| {
            let task = task.ok()?;
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let ns = stat.split_whitespace().next()?.parse().ok()?;
            Some((task.file_name().to_string_lossy().into_owned(), ns))
        })
        .collect()
}

/// `pid`'s utime + stime in clock ticks (every thread, dead ones included).
fn process_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime are 14th and 15th.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The daemon's CPU over `window` of doing nothing: (ns summed over threads, ticks).
fn idle_cpu(pid: u32, window: Duration) -> (u64, u64) {
    let (before, ticks) = (thread_cpu(pid), process_ticks(pid));
    std::thread::sleep(window);
    let (after, ticks_after) = (thread_cpu(pid), process_ticks(pid));
    let ns = after
        .iter()
        .map(|(tid, ns)| ns - before.get(tid).copied().unwrap_or(0))
        .sum();
    (ns, ticks_after - ticks)
}

/// Holds `count` messages for `mailbox` (nobody pulls them), four senders at once.
fn hold(home: &Home, mailbox: &str, count: usize) {
    let senders = 4;
    std::thread::scope(|scope| {
        for s in 0..senders {
            let socket = home.socket();
            scope.spawn(move || {
                for i in (s..count).step_by(senders) {
                    let sent = ask(
                        &socket,
                        &json!({"op": "send", "to": mailbox, "text": format!("held {i}")}),
                    );
                    assert!(sent["id"].is_string(), "held {i}: {sent}");
                }
            });
        }
    });
}

fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let (messages, pulls, held, window) = if quick() {
        (5, 3, 300, Duration::from_secs(1))
    } else {
        (200, 50, 10_000, Duration::from_secs(20))
    };
    let home = Home::start();
    let started = home.ask(&json!({"op": "spawn", "profile": "stamp"}));
    assert_eq!(started["outcome"], "started", "{started}");
    let agent = started["agent"].as_str().unwrap().to_owned();
    let pane = home
        .tmux(&["list-panes", "-s", "-t", "fleetd", "-F", "#{pane_id}"])
        .lines()
        .next()
        .unwrap()
        .to_owned();

    // send → typed, through fleetd.
    let mut fleetd = Vec::new();
    for i in 0..messages {
        let sent_at = now_ns();
        let sent = home.ask(&json!({"op": "send", "to": agent, "text": format!("message f{i}")}));
        assert!(sent["id"].is_string(), "{sent}");
        let at = stamp(&home, &format!("f{i}"));
        fleetd.push(Duration::from_nanos(u64::try_from(at - sent_at).unwrap()));
    }
    // The floor: the same frame typed by one tmux call.
    let mut floor = Vec::new();
    for i in 0..messages {
        let frame = format!("[fleetd: from local/h agent {agent}, msg {agent}] message t{i}");
        let typed_at = now_ns();
        home.tmux(&[
            "set-buffer",
            "-b",
            "bench",
            &frame,
            ";",
            "paste-buffer",
            "-d",
            "-p",
            "-b",
            "bench",
            "-t",
            &pane,
            ";",
            "send-keys",
            "-t",
            &pane,
            "Enter",
        ]);
        let at = stamp(&home, &format!("t{i}"));
        floor.push(Duration::from_nanos(u64::try_from(at - typed_at).unwrap()));
    }

    // held → pulled: a waiting pull on an empty mailbox.
    let mailbox = home.ask(&json!({"op": "agent.open", "name": "primary"}))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut pulled = Vec::new();
    for i in 0..pulls {
        let socket = home.socket();
        let to = mailbox.clone();
        let waiting = std::thread::spawn(move || {
            let reply = ask(
                &socket,
                &json!({"op": "held.pull", "agent": to, "wait_ms": 20_000}),
            );
            (Instant::now(), reply)
        });
        // The pull is waiting before the message is sent.
        std::thread::sleep(Duration::from_millis(20));
        let sent = home.ask(&json!({"op": "send", "to": mailbox, "text": format!("pull {i}")}));
        let held_at = Instant::now();
        let (answered_at, reply) = waiting.join().unwrap();
        let got = reply["messages"][0].clone();
        assert_eq!(got["body"]["text"], format!("pull {i}"), "{reply}");
        home.ask(&json!({"op": "held.ack", "id": sent["id"]}));
        pulled.push(answered_at.saturating_duration_since(held_at));
    }

    // Idle CPU: nothing held, then `held` messages for a mailbox nobody pulls.
    let pid = home.daemon.as_ref().unwrap().id();
    let silent = home.ask(&json!({"op": "agent.open", "name": "silent"}))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    std::thread::sleep(Duration::from_secs(1));
    let (empty_ns, empty_ticks) = idle_cpu(pid, window);
    let filling = Instant::now();
    hold(&home, &silent, held);
    let filled = filling.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let (full_ns, full_ticks) = idle_cpu(pid, window);

    let (p50, p99) = (percentile(&fleetd, 0.5), percentile(&fleetd, 0.99));
    let (f50, f99) = (percentile(&floor, 0.5), percentile(&floor, 0.99));
    println!(
        "mailbox bench: a running daemon, single-host mode, tmux; {messages} messages one at a time, {pulls} waiting pulls"
    );
    println!(
        "send -> typed: p50 {:.1} ms, p99 {:.1} ms (target p50 <= 10, p99 <= 50); floor (one tmux paste call): p50 {:.1} ms, p99 {:.1} ms; p50 {:.2}x the floor",
        ms(p50),
        ms(p99),
        ms(f50),
        ms(f99),
        ms(p50) / ms(f50).max(1e-9)
    );
    println!(
        "held -> pulled (a waiting pull, after the send returned): p50 {:.2} ms, max {:.2} ms (target <= 10)",
        ms(percentile(&pulled, 0.5)),
        ms(percentile(&pulled, 1.0))
    );
    println!(
        "idle CPU over {:.0} s: empty {:.2} ms ({empty_ticks} ticks); {held} held ({:.1} s to hold them) {:.2} ms ({full_ticks} ticks); {:.2}x the empty daemon (target <= 1.5x)",
        window.as_secs_f64(),
        empty_ns as f64 / 1e6,
        filled.as_secs_f64(),
        full_ns as f64 / 1e6,
        full_ns as f64 / (empty_ns as f64).max(1.0)
    );
}
