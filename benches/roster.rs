//! Roster upkeep at scale: 200 hosts × 50 agents beating every 5 s into one gateway's roster.
//!
//! Run: `cargo bench --bench roster`. Measures, in one run, the CPU one gateway spends per beat
//! interval observing 200 beats, ticking and building its view, as a share of one core; and the
//! roster's memory (RSS growth while it holds every host). Baseline in the same run: the same
//! upkeep for 1 host × 50 agents. Targets (issue 4): CPU ≤ 5 % of a core, memory ≤ 64 MiB.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use fleetd::roster::{HostId, Roster, RosterSettings};
use fleetd::wire::{
    self, AgentEntry, HostKey, Kind, MemoryReplayCache, Meta, Party, Payload, PinnedKeys, Window,
};
use uuid::Uuid;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

fn peers(hosts: usize, agents: usize) -> Vec<Roster> {
    (0..hosts)
        .map(|h| {
            let mut r = Roster::new(
                HostId {
                    fleet: format!("fleet{}", h % 10),
                    host: format!("host{h}"),
                },
                RosterSettings::default(),
            );
            r.set_local(
                (0..agents)
                    .map(|a| AgentEntry {
                        id: Uuid::now_v7(),
                        name: format!("agent-{h}-{a}"),
                        profile: "worker".to_owned(),
                        status: "ready".to_owned(),
                        since: 1_800_000_000_000,
                    })
                    .collect(),
            );
            r
        })
        .collect()
}

/// CPU time per beat interval to keep `hosts` × `agents` current — verifying each signed beat
/// (Ed25519 `verify_strict`, replay cache) and observing it — over `rounds` intervals.
fn upkeep(hosts: usize, agents: usize, rounds: u32) -> (Duration, u64) {
    let mut senders = peers(hosts, agents);
    let keys: Vec<HostKey> = (0..hosts).map(|_| HostKey::generate().unwrap().0).collect();
    let mut pins = PinnedKeys::default();
    for (h, key) in keys.iter().enumerate() {
        pins.pin(
            &format!("fleet{}", h % 10),
            &format!("host{h}"),
            *key.public(),
        );
    }
    let mut replay = MemoryReplayCache::default();
    let now_ms = 1_800_000_000_000_i64;
    let before = rss_kib();
    let mut roster = Roster::new(
        HostId {
            fleet: "mac".to_owned(),
            host: "laptop".to_owned(),
        },
        RosterSettings::default(),
    );
    let start_clock = Instant::now();
    let mut spent = Duration::ZERO;
    for round in 0..rounds {
        let now = start_clock + Duration::from_secs(5) * round;
        let sealed: Vec<(HostId, wire::Sealed)> = senders
            .iter_mut()
            .enumerate()
            .map(|(h, s)| {
                let id = HostId {
                    fleet: format!("fleet{}", h % 10),
                    host: format!("host{h}"),
                };
                let meta = Meta {
                    version: wire::VERSION,
                    id: Uuid::now_v7(),
                    kind: Kind::PresenceBeat,
                    origin: Party {
                        fleet: id.fleet.clone(),
                        host: id.host.clone(),
                    },
                    dest: Party {
                        fleet: "mac".to_owned(),
                        host: String::new(),
                    },
                    key_id: String::new(),
                    created_ms: now_ms,
                    expires_ms: now_ms + 15_000,
                };
                (
                    id,
                    wire::seal(meta, &Payload::PresenceBeat(s.next_beat(false)), &keys[h]),
                )
            })
            .collect();
        let t = Instant::now();
        for (signer, envelope) in sealed {
            let window = Window {
                now_ms,
                skew_ms: 120_000,
            };
            let Ok(Payload::PresenceBeat(beat)) =
                wire::verify(&envelope, &pins, window, &mut replay)
            else {
                panic!("a genuine beat was refused");
            };
            black_box(roster.observe(signer, beat, now));
        }
        black_box(roster.tick(now));
        black_box(roster.view());
        spent += t.elapsed();
    }
    let grown = rss_kib().saturating_sub(before);
    (spent / rounds, grown)
}

/// `cargo bench` passes `--bench`; run any other way (`cargo test --benches`, which the test
/// command runs) this bench takes its short mode — every step, small — so that it cannot rot.
fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    let (rounds, hosts) = if quick() { (2, 20) } else { (50, 200) };
    let (big, big_mem) = upkeep(hosts, 50, rounds);
    let (small, _) = upkeep(1, 50, rounds);
    let interval = Duration::from_secs(5);
    println!("roster bench: {rounds} beat intervals of 5 s, one gateway observing every beat");
    println!(
        "{hosts} hosts x 50 agents: {:.3} ms per interval = {:.3} % of a core (target <= 5 %); RSS growth {:.1} MiB (target <= 64 MiB)",
        big.as_secs_f64() * 1e3,
        big.as_secs_f64() / interval.as_secs_f64() * 100.0,
        big_mem as f64 / 1024.0
    );
    println!(
        "1 host x 50 agents (baseline): {:.4} ms per interval; ratio {:.0}x for {hosts}x the hosts",
        small.as_secs_f64() * 1e3,
        big.as_secs_f64() / small.as_secs_f64().max(1e-9)
    );
}
