//! Policy benchmarks (criterion): the decision for a 200-grant policy, against the same request
//! on a 1-grant policy measured in the same run; loading + checking 1,000 generated files; and
//! `policy diff` between two 200-grant policies, against loading one of them in the same run.
//!
//! Run: `cargo bench --bench policy`. Targets (issue 3): decision median ≤ 5 µs for 200 grants;
//! `policy check` over 1,000 files ≤ 1 s; (issue 23) `policy diff` of two 200-grant policies
//! < 1 s. Figures in docs/benchmarks.md.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a benchmark fails loudly"
)]

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use fleetd::policy::{self, Counts, Effect, PolicySet, Request};

/// A policy with `grants` grants over 20 profiles and 50 fleets; each grant allows three
/// variables with patterns, and there are 10 deny rules.
fn policy_text(grants: usize) -> String {
    let mut text = String::new();
    for p in 0..20 {
        let _ = writeln!(
            text,
            "[profile.p{p}]\nargv = [\"/usr/bin/agent\", \"--p{p}\"]\nroots = [\"/srv/p{p}\"]\nmax_instances = 8\n"
        );
    }
    for g in 0..grants {
        let _ = writeln!(
            text,
            "[[grant]]\nid = \"g{g}\"\nfleets = [\"fleet{}\"]\nhosts = [\"host{}\", \"host{}\"]\nprofiles = [\"p{}\", \"p{}\"]\nmax_concurrent = 4\nrate = {{ count = 100, per_secs = 60 }}\n\
             [grant.env.TASK_ID]\npattern = \"[A-Z]{{2,8}}-[0-9]{{1,6}}\"\nmax_len = 16\n\
             [grant.env.REPO]\npattern = \"[a-z0-9][a-z0-9._-]{{0,62}}\"\nmax_len = 63\n\
             [grant.env.BRANCH]\npattern = \"[A-Za-z0-9][A-Za-z0-9._/-]{{0,99}}\"\nmax_len = 100\n",
            g % 50,
            g % 7,
            g % 11,
            g % 20,
            (g + 1) % 20,
        );
    }
    for d in 0..10 {
        let _ = writeln!(text, "[[deny]]\nid = \"d{d}\"\nfleets = [\"evil{d}\"]\n");
    }
    text
}

fn load(text: String) -> PolicySet {
    let (set, diagnostics) = policy::load_sources(&[(PathBuf::from("bench.toml"), text)]);
    set.unwrap_or_else(|_| {
        panic!(
            "{}",
            diagnostics.iter().map(|d| d.render()).collect::<String>()
        )
    })
}

fn decision(c: &mut Criterion) {
    let big = load(policy_text(200));
    let small = load(policy_text(1));
    // Admitted by the last grants only, with every variable checked against its pattern.
    let request = Request::from_json(
        br#"{"origin":{"fleet":"fleet49","host":"host3"},"profile":"p19","env":{"TASK_ID":"FLEET-4242","REPO":"fleetd","BRANCH":"feature/policy-bench"}}"#,
    )
    .unwrap();
    let small_request = Request::from_json(
        br#"{"origin":{"fleet":"fleet0","host":"host0"},"profile":"p0","env":{"TASK_ID":"FLEET-4242","REPO":"fleetd","BRANCH":"feature/policy-bench"}}"#,
    )
    .unwrap();
    let counts = Counts::default();
    assert_eq!(
        policy::evaluate(&big, &request, &counts).effect,
        Effect::Allow
    );
    assert_eq!(
        policy::evaluate(&small, &small_request, &counts).effect,
        Effect::Allow
    );
    let mut group = c.benchmark_group("decision");
    group.bench_function("200 grants", |b| {
        b.iter(|| policy::evaluate(black_box(&big), black_box(&request), &counts))
    });
    group.bench_function("1 grant (baseline)", |b| {
        b.iter(|| policy::evaluate(black_box(&small), black_box(&small_request), &counts))
    });
    group.finish();
}

fn check(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..1000 {
        let mut text = format!(
            "[profile.p{i}]\nargv = [\"/usr/bin/agent\"]\nroots = [\"/srv/p{i}\"]\nenv = {{ ROLE = \"worker\" }}\n\n"
        );
        let _ = writeln!(
            text,
            "[[grant]]\nid = \"g{i}\"\nfleets = [\"fleet{}\"]\nprofiles = [\"p{i}\"]\n[grant.env.TASK_ID]\npattern = \"[A-Z]{{2,8}}-[0-9]{{1,6}}\"\nmax_len = 16\n",
            i % 50
        );
        std::fs::write(dir.path().join(format!("{i:04}.toml")), text).unwrap();
    }
    let mut group = c.benchmark_group("check");
    group.sample_size(10);
    group.bench_function("1000 files", |b| {
        b.iter(|| {
            let (set, diagnostics) = policy::load_dir(black_box(dir.path()));
            assert!(set.is_ok());
            let _ = black_box(policy::to_json(&diagnostics));
        })
    });
    group.finish();
}

fn diff(c: &mut Criterion) {
    let text = policy_text(200);
    let old = load(text.clone());
    // Every grant's TASK_ID widened, its concurrency raised, one host more for half of them.
    let changed = text
        .replace("[A-Z]{2,8}-[0-9]{1,6}", "[A-Z0-9]{2,8}-[0-9]{1,6}")
        .replace("max_concurrent = 4", "max_concurrent = 5")
        .replace("hosts = [\"host1\",", "hosts = [\"host1\", \"host99\",");
    let new = load(changed);
    let report = policy::diff::diff(&old, &new);
    assert!(
        report.widens() && report.findings.len() >= 400,
        "{}",
        report.findings.len()
    );
    assert!(policy::diff::diff(&old, &old).findings.is_empty());
    let mut group = c.benchmark_group("diff");
    group.sample_size(10);
    group.bench_function("200 grants, every grant changed", |b| {
        b.iter(|| policy::diff::diff(black_box(&old), black_box(&new)))
    });
    group.bench_function("200 grants, identical", |b| {
        b.iter(|| policy::diff::diff(black_box(&old), black_box(&old)))
    });
    group.bench_function("load one 200-grant policy (baseline)", |b| {
        b.iter(|| load(black_box(text.clone())))
    });
    group.finish();
}

criterion_group!(benches, decision, check, diff);
criterion_main!(benches);
