//! Scrubber throughput on the generated corpus, against a naive baseline measured in the same run.
//!
//! Run: `cargo bench --bench scrub`. Prints MB/s for clean and secret-dense text, single thread,
//! and the ratio to the baseline (every pattern's regex applied one after another over the whole
//! buffer). Targets (issue 22): ≥ 500 MB/s clean, ≥ 300 MB/s dense, ≥ 10× baseline on dense.
//! `scripts/bench` runs it and measures `fleetd scrub`'s peak RSS; figures in docs/benchmarks.md.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

#[path = "../tests/corpus/mod.rs"]
mod corpus;

use std::hint::black_box;
use std::time::{Duration, Instant};

use fleetd::scrub::Scrubber;
use regex::bytes::Regex;
use secrecy::SecretString;

/// The naive baseline: one regex per pattern the scrubber knows (every provider prefix, every
/// other trigger, the held value raw and in base64), applied in turn to the whole buffer.
fn naive_patterns() -> Vec<Regex> {
    let b64 = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        corpus::HELD_SECRET,
    );
    let mut sources = fleetd::scrub::naive_regexes();
    sources.push(regex::escape(corpus::HELD_SECRET));
    sources.push(regex::escape(&b64[4..b64.len() - 4]));
    sources.iter().map(|p| Regex::new(p).unwrap()).collect()
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

/// `cargo bench` passes `--bench`; run any other way (`cargo test --benches`, which the test
/// command runs) this bench takes its short mode — every step, small — so that it cannot rot.
fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    // `--write-corpus PATH`: write the dense corpus for the RSS measurement in scripts/bench;
    // `--write-clean-corpus PATH`: the clean one (for profiling the scan).
    let args: Vec<String> = std::env::args().collect();
    for (flag, seed, density) in [("--write-corpus", 2, 4), ("--write-clean-corpus", 1, 0)] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            let path = args.get(i + 1).expect("a path after the flag");
            std::fs::write(path, corpus::build(seed, 400_000, density).text).unwrap();
            return;
        }
    }
    let scrubber = Scrubber::new();
    scrubber
        .register("bench-held", &SecretString::from(corpus::HELD_SECRET))
        .unwrap();
    let (size, rounds) = if quick() { (4_000, 1) } else { (400_000, 5) };
    let clean = corpus::build(1, size, 0).text;
    let dense = corpus::build(2, size, 4).text;
    let patterns = naive_patterns();
    println!("scrub bench: single thread, best of {rounds} rounds");
    println!(
        "naive baseline: {} regexes; trigger hits per MB: clean {:.0}, dense {:.0}",
        patterns.len(),
        fleetd::scrub::trigger_hits(clean.as_bytes()) as f64 / (clean.len() as f64 / 1e6),
        fleetd::scrub::trigger_hits(dense.as_bytes()) as f64 / (dense.len() as f64 / 1e6),
    );
    for (name, text) in [("clean", &clean), ("dense", &dense)] {
        let bytes = text.len();
        let ours = throughput(bytes, rounds, || {
            black_box(scrubber.scrub_bytes(black_box(text.as_bytes())));
        });
        let streamed = throughput(bytes, rounds, || {
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
        let baseline = throughput(bytes, rounds.min(2), || {
            black_box(naive(&patterns, black_box(text.as_bytes())));
        });
        println!(
            "{name:>5}: {:>6.1} MiB corpus | fleetd {ours:>7.1} MB/s | streamed 64 KiB writes {streamed:>7.1} MB/s | naive baseline {baseline:>6.1} MB/s | ratio {:>5.1}x",
            bytes as f64 / (1024.0 * 1024.0),
            ours / baseline
        );
    }
}
