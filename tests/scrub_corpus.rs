//! The scrubber on the generated corpus: every planted secret gone, every negative intact, and
//! the same output whether the input arrives in one write, by lines, in random pieces or a byte
//! at a time.

#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "test helpers fail loudly"
)]

mod corpus;

use std::collections::HashSet;

use fleetd::scrub::Scrubber;
use secrecy::SecretString;

fn scrubber() -> Scrubber {
    let scrubber = Scrubber::new();
    scrubber
        .register("corpus-held", &SecretString::from(corpus::HELD_SECRET))
        .unwrap();
    scrubber
}

fn by_writes(scrubber: &Scrubber, input: &[u8], sizes: impl FnMut() -> usize) -> Vec<u8> {
    let mut sizes = sizes;
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let n = sizes().clamp(1, input.len() - at);
        stream.write(&input[at..at + n], &mut out);
        at += n;
    }
    stream.finish(&mut out);
    out
}

/// Every 12-byte window of the output: a partial redaction is a leak too.
fn windows(output: &str) -> HashSet<&[u8]> {
    output.as_bytes().windows(12).collect()
}

#[track_caller]
fn assert_secret_gone(windows: &HashSet<&[u8]>, secret: &str) {
    for window in secret.as_bytes().windows(12) {
        assert!(
            !windows.contains(window),
            "a piece of a planted secret survived: {:?}",
            String::from_utf8_lossy(window)
        );
    }
}

#[test]
fn dense_corpus_loses_every_secret_and_keeps_every_negative() {
    let scrubber = scrubber();
    for seed in [7, 8, 9, 10] {
        let corpus = corpus::build(seed, 3000, 3);
        let out = scrubber.scrub(&corpus.text);
        assert!(corpus.secrets.len() >= 950, "corpus plants secrets");
        let seen = windows(&out);
        for secret in &corpus.secrets {
            assert_secret_gone(&seen, secret);
        }
        let lines: HashSet<&str> = out.lines().collect();
        for negative in &corpus.negatives {
            for line in negative.lines() {
                assert!(
                    lines.contains(line),
                    "seed {seed}: negative line changed: {line:?}"
                );
            }
        }
    }
}

#[test]
fn clean_corpus_passes_through_unchanged() {
    let corpus = corpus::build(11, 5000, 0);
    assert_eq!(scrubber().scrub(&corpus.text), corpus.text);
}

#[test]
fn output_does_not_depend_on_how_input_was_written() {
    let mut corpus = corpus::build(23, 1500, 2);
    // One line longer than a block, with secrets in it, exercises forced cuts.
    let mut rng = corpus::Rng::new(5);
    let mut long = String::new();
    while long.len() < 200 * 1024 {
        long.push_str(&format!(
            "{{\"k{}\":\"v{}\"}},",
            rng.below(1000),
            rng.alnum(20)
        ));
        if rng.below(50) == 0 {
            let (line, secret) = corpus::secret_line(&mut rng);
            long.push_str(&line.replace('\n', " "));
            corpus.secrets.push(secret);
        }
    }
    corpus.text.push_str(&long);
    corpus.text.push('\n');
    let input = corpus.text.as_bytes();
    let scrubber = scrubber();
    let one_shot = scrubber.scrub_bytes(input);

    let mut lines = Vec::new();
    let mut stream = scrubber.stream();
    for line in input.split_inclusive(|&b| b == b'\n') {
        stream.write(line, &mut lines);
    }
    stream.finish(&mut lines);
    assert!(one_shot == lines, "line-sized writes differ from one-shot");

    let mut rng = corpus::Rng::new(99);
    let random = by_writes(&scrubber, input, || 1 + rng.below(4096));
    assert!(
        one_shot == random,
        "random 1-4096 byte writes differ from one-shot"
    );

    let bytewise = by_writes(&scrubber, input, || 1);
    assert!(
        one_shot == bytewise,
        "byte-at-a-time writes differ from one-shot"
    );

    let out = String::from_utf8_lossy(&one_shot);
    let seen = windows(&out);
    for secret in &corpus.secrets {
        assert_secret_gone(&seen, secret);
    }
}

#[test]
fn idle_flush_holds_a_live_candidate_instead_of_releasing_half() {
    let scrubber = scrubber();
    let token = format!("ghp_{}", corpus::Rng::new(3).alnum(36));
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    for byte in format!("typed: {token} done").as_bytes() {
        stream.write(std::slice::from_ref(byte), &mut out);
        stream.flush_idle(&mut out);
    }
    stream.finish(&mut out);
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out, "typed: [redacted:github-token] done");
}

#[test]
fn idle_flush_holds_a_held_secret_typed_byte_by_byte() {
    let scrubber = scrubber();
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    for byte in format!("pw {}", corpus::HELD_SECRET).as_bytes() {
        stream.write(std::slice::from_ref(byte), &mut out);
        stream.flush_idle(&mut out);
    }
    stream.finish(&mut out);
    let out = String::from_utf8(out).unwrap();
    assert!(!out.contains("S3cr3t"), "{out}");
}

#[test]
fn adversarial_input_is_handled_in_bounded_memory() {
    // Thousands of triggers without a newline: each forced cut decides one block.
    let input = "://a:b@://".repeat(40_000) + &"key=".repeat(40_000);
    let scrubber = scrubber();
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    for chunk in input.as_bytes().chunks(1000) {
        stream.write(chunk, &mut out);
        assert!(
            stream.held_back() <= 64 * 1024 + 1000,
            "hold-back is bounded"
        );
    }
    stream.finish(&mut out);
    assert!(!out.is_empty());
}
