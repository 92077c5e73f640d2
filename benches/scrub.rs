//! Scrubber throughput on the generated corpus, against a naive baseline measured in the same run.
//!
//! Run: `cargo bench --bench scrub`. Prints MB/s for clean and secret-dense text, single thread,
//! and the ratio to the baseline (every pattern's regex applied one after another over the whole
//! buffer). Targets (issue 2): ≥ 500 MB/s clean, ≥ 150 MB/s dense, ≥ 10× baseline on dense.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout"
)]

#[path = "../tests/corpus/mod.rs"]
mod corpus;

use std::hint::black_box;
use std::time::{Duration, Instant};

use fleetd::scrub::Scrubber;
use regex::bytes::Regex;
use secrecy::SecretString;

/// The naive baseline: one regex per credential shape, applied in turn to the whole buffer.
fn naive_patterns() -> Vec<Regex> {
    let held = regex::escape(corpus::HELD_SECRET);
    [
        r"gh[pousr]_[A-Za-z0-9]{30,}",
        r"github_pat_[A-Za-z0-9_]{40,}",
        r"gl(pat|ptt|dt|rt|cbt|ft|soat)-[A-Za-z0-9_-]{20,}",
        r"sk-[A-Za-z0-9_-]{20,}",
        r"A(KIA|SIA|BIA|CCA)[A-Z0-9]{16}",
        r"xox[bpares]-[A-Za-z0-9-]{10,}",
        r"[sr]k_(live|test)_[A-Za-z0-9]{16,}",
        r"AIza[A-Za-z0-9_-]{30,}",
        r"npm_[A-Za-z0-9]{36,}",
        r"hf_[A-Za-z0-9]{30,}",
        r"hvs\.[A-Za-z0-9_-]{24,}",
        r"dckr_pat_[A-Za-z0-9_-]{20,}",
        r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*",
        r"[A-Za-z][A-Za-z0-9+.-]*://[^\s:@/]*:[^\s@]+@",
        r"(?i)(proxy-)?authorization\s*[:=]\s*\S+\s+\S+",
        r"(?i)bearer\s+[A-Za-z0-9._~+/=-]{16,}",
        r"-u\s+\S+:\S+",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
        r"(?i)[A-Za-z0-9_.-]*(token|secret|password|passwd|key|credential)\s*[:=]\s*\S+",
        r"[?&]sig=[^&\s]+",
        r"machine\s+\S+\s+login\s+\S+\s+password\s+\S+",
        &held,
    ]
    .iter()
    .map(|p| Regex::new(p).unwrap())
    .collect()
}

fn naive(patterns: &[Regex], input: &[u8]) -> Vec<u8> {
    let mut text = input.to_vec();
    for pattern in patterns {
        text = pattern.replace_all(&text, &b"[redacted]"[..]).into_owned();
    }
    text
}

/// Best of `rounds` timings of `f` over `bytes` bytes, in MB/s (10^6 bytes per second).
fn throughput(bytes: usize, rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        f();
        best = best.min(start.elapsed());
    }
    bytes as f64 / best.as_secs_f64() / 1e6
}

fn main() {
    let scrubber = Scrubber::new();
    scrubber
        .register("bench-held", &SecretString::from(corpus::HELD_SECRET))
        .unwrap();
    let clean = corpus::build(1, 400_000, 0).text;
    let dense = corpus::build(2, 400_000, 4).text;
    let patterns = naive_patterns();
    println!("scrub bench: single thread, best of 5 rounds");
    if std::env::var_os("SCRUB_BENCH_HITS").is_some() {
        let out = scrubber.scrub(&clean);
        println!("clean markers: {}", out.matches("[redacted:").count());
        let hits = fleetd::scrub::trigger_hits(clean.as_bytes());
        println!(
            "clean hits per MB: {:.0}",
            hits as f64 / (clean.len() as f64 / 1e6)
        );
        let search = throughput(clean.len(), 5, || {
            black_box(fleetd::scrub::trigger_hits(black_box(clean.as_bytes())));
        });
        println!("trigger search alone on clean: {search:.1} MB/s");
        let quiet = clean
            .replace("key", "kqy")
            .replace("pass", "pqss")
            .replace("token", "tqken");
        let search = throughput(quiet.len(), 5, || {
            black_box(fleetd::scrub::trigger_hits(black_box(quiet.as_bytes())));
        });
        let prose =
            "the quick brown fox jumps over the lazy dog 0123 ABCDEF lorem ipsum\n".repeat(300_000);
        let search = throughput(prose.len(), 5, || {
            black_box(fleetd::scrub::trigger_hits(black_box(prose.as_bytes())));
        });
        println!("trigger search alone on hit-free prose: {search:.1} MB/s");
        println!(
            "trigger search alone on clean without key/pass/token words: {search:.1} MB/s ({} hits)",
            fleetd::scrub::trigger_hits(quiet.as_bytes())
        );
    }
    for (name, text) in [("clean", &clean), ("dense", &dense)] {
        let bytes = text.len();
        let ours = throughput(bytes, 5, || {
            black_box(scrubber.scrub_bytes(black_box(text.as_bytes())));
        });
        let streamed = throughput(bytes, 5, || {
            let mut stream = scrubber.stream();
            let mut out = Vec::with_capacity(64 * 1024);
            for chunk in text.as_bytes().chunks(64 * 1024) {
                stream.write(chunk, &mut out);
                black_box(&out);
                out.clear();
            }
            stream.finish(&mut out);
        });
        if std::env::var_os("SCRUB_BENCH_NO_BASELINE").is_some() {
            println!("{name:>5}: fleetd {ours:>7.1} MB/s | streamed {streamed:>7.1} MB/s");
            continue;
        }
        let baseline = throughput(bytes, 2, || {
            black_box(naive(&patterns, black_box(text.as_bytes())));
        });
        println!(
            "{name:>5}: {:>6.1} MiB corpus | fleetd {ours:>7.1} MB/s | streamed 64 KiB writes {streamed:>7.1} MB/s | naive baseline {baseline:>6.1} MB/s | ratio {:>5.1}x",
            bytes as f64 / (1024.0 * 1024.0),
            ours / baseline
        );
    }
}
