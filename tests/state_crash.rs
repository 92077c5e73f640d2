//! The state store survives `kill -9`: a child process commits records as fast as it can and
//! reports each committed id; it is killed mid-stream; every reported record is there after
//! reopening, and the database opens cleanly.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleetd::state::{Limits, StateStore};
use uuid::Uuid;

const CHILD: &str = "FLEETD_STATE_CRASH_CHILD";

/// In the child: commit outbox records forever, printing each id once committed. Ignored in
/// normal runs; the test below re-executes this binary to run it.
#[test]
#[ignore = "the child side of committed_records_survive_kill_9"]
fn child_writer() {
    let dir = std::env::var_os(CHILD)
        .expect("run by committed_records_survive_kill_9, which sets the state dir");
    let store = StateStore::open(std::path::Path::new(&dir), Limits::default()).unwrap();
    let mut out = std::io::stdout().lock();
    loop {
        let id = Uuid::now_v7();
        store.outbox_put(id, id.as_bytes()).unwrap();
        writeln!(out, "{id}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn committed_records_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut committed = Vec::new();
    let start = Instant::now();
    let mut line = String::new();
    while committed.len() < 300 && start.elapsed() < Duration::from_secs(30) {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Ok(id) = Uuid::parse_str(line.trim()) {
            committed.push(id);
        }
    }
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.wait().unwrap();
    assert!(
        committed.len() >= 300,
        "the child committed {} records before the deadline",
        committed.len()
    );

    let store = StateStore::open(dir.path(), Limits::default()).unwrap();
    let stored: std::collections::HashSet<Uuid> = store
        .outbox_list()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for id in &committed {
        assert!(
            stored.contains(id),
            "committed record {id} lost after kill -9"
        );
    }
}
