//! `policy diff` on pairs of policies: each change class with its exact findings, and a property
//! test that no decision changes without a finding that accounts for it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::policy::{
    Counts, MessageRequest, PolicySet, Request, evaluate, evaluate_message, load_sources,
};

const PROFILES: &str = r#"
[profile.worker]
argv = ["/usr/local/bin/agent", "--work"]
roots = ["/srv/work"]
env = { GIT_AUTHOR_NAME = "worker" }
secrets = { API_KEY = "credential:api-key" }
max_instances = 4

[profile.reviewer]
argv = ["/usr/local/bin/agent", "--review"]
roots = ["/srv/review"]
max_instances = 2
"#;

const GRANT: &str = r#"
[[grant]]
id = "mac-workers"
fleets = ["mac"]
hosts = ["laptop"]
profiles = ["worker"]
max_concurrent = 2
rate = { count = 10, per_secs = 60 }

[grant.env.TASK_ID]
pattern = "[a-z]{1,9}"
max_len = 9
"#;

fn policy(files: &[&str]) -> PolicySet {
    let sources: Vec<(PathBuf, String)> = files
        .iter()
        .enumerate()
        .map(|(i, text)| (PathBuf::from(format!("{i:02}.toml")), (*text).to_owned()))
        .collect();
    let (result, diagnostics) = load_sources(&sources);
    match result {
        Ok(set) => set,
        Err(error) => panic!("{error}: {diagnostics:?}"),
    }
}

/// The findings as `direction scope subject` lines, and the examples.
fn lines(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .map(|f| {
            let subject = match &f.subject {
                Subject::Variable(n) => format!("variable {n}"),
                Subject::FixedEnv(n) => format!("fixed-env {n}"),
                Subject::Secret(n) => format!("secret {n}"),
                Subject::Message(s) => format!("message {s}"),
                other => format!("{other:?}").to_lowercase(),
            };
            format!("{} {} {subject}", f.direction.as_str(), f.scope)
        })
        .collect()
}

fn diff_of(old: &[&str], new: &[&str]) -> Report {
    diff(&policy(old), &policy(new))
}

#[test]
fn identical_and_equivalent_policies_have_no_findings() {
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, GRANT]);
    assert!(report.findings.is_empty(), "{:?}", lines(&report));
    assert!(!report.widens());
    // Rewritten patterns that admit the same values, a length limit that cuts both the same.
    let rewritten = GRANT.replace("[a-z]{1,9}", "[a-z][a-z]{0,8}");
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &rewritten]);
    assert!(report.findings.is_empty(), "{:?}", lines(&report));
    let unbounded = GRANT.replace("[a-z]{1,9}", "[a-z]+");
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &unbounded]);
    assert!(
        report.findings.is_empty(),
        "`[a-z]+` within 9 bytes is `[a-z]{{1,9}}`: {:?}",
        lines(&report)
    );
}

#[test]
fn a_new_grant_newly_allows_its_pairs_with_what_it_lets_requests_set() {
    let report = diff_of(&[PROFILES], &[PROFILES, GRANT]);
    assert_eq!(
        lines(&report),
        [
            "widened mac/laptop → worker access",
            "widened mac/laptop → worker variable TASK_ID",
            "widened mac/laptop → worker maxconcurrent",
            "widened mac/laptop → worker rate",
        ]
    );
    let access = &report.findings[0];
    assert_eq!(access.rules, [RuleId("mac-workers".to_owned())]);
    assert_eq!(
        access.location.as_ref().map(|l| l.line),
        Some(3),
        "the grant's id"
    );
    assert_eq!(report.findings[1].example.as_deref(), Some("a"));
    assert_eq!(
        report.findings[1].location.as_ref().map(|l| l.line),
        Some(11),
        "a variable's finding points at its pattern"
    );
    assert!(report.widens());
    // And taking it away again narrows the same pairs.
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES]);
    assert_eq!(lines(&report)[0], "narrowed mac/laptop → worker access");
    assert!(report.findings.iter().all(|f| !f.direction.widens()));
    assert!(!report.widens());
}

#[test]
fn pattern_changes_are_decided_on_the_languages() {
    let cases = [
        // Wider: digits too.
        ("[a-z0-9]{1,9}", 9, Some(("widened", "0"))),
        // Looks wider (an alternative), is not: every `[a-c]` value was admitted.
        ("[a-z]{1,9}|[a-c]{2}", 9, None),
        // Looks narrower (no `+`), is the same under the 9-byte limit.
        ("[a-z]{1,12}", 9, None),
        // Narrower: no `z`.
        ("[a-y]{1,9}", 9, Some(("narrowed", "z"))),
        // Some more, some fewer.
        ("[0-9a-f]{1,9}", 9, Some(("changed", "0"))),
        // The limit alone.
        ("[a-z]{1,12}", 12, Some(("widened", "aaaaaaaaaa"))),
    ];
    for (pattern, max_len, expected) in cases {
        let new = GRANT
            .replace("[a-z]{1,9}", pattern)
            .replace("max_len = 9", &format!("max_len = {max_len}"));
        let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &new]);
        let found: Vec<(&str, Option<&str>)> = report
            .findings
            .iter()
            .map(|f| (f.direction.as_str(), f.example.as_deref()))
            .collect();
        match expected {
            None => assert!(found.is_empty(), "{pattern}: {found:?}"),
            Some((direction, example)) => {
                assert_eq!(found, [(direction, Some(example))], "{pattern}");
                assert_eq!(
                    report.findings[0].subject,
                    Subject::Variable("TASK_ID".to_owned())
                );
                assert_eq!(report.widens(), direction != "narrowed", "{pattern}");
            }
        }
    }
}

#[test]
fn variables_cwd_and_limits() {
    let new = GRANT
        .replace("max_concurrent = 2", "max_concurrent = 3\ncwd = true")
        .replace("count = 10", "count = 20")
        + "\n[grant.env.REPO]\npattern = \"[a-z]{1,20}\"\nmax_len = 20\n";
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &new]);
    assert_eq!(
        lines(&report),
        [
            "widened mac/laptop → worker variable REPO",
            "widened mac/laptop → worker cwd",
            "widened mac/laptop → worker maxconcurrent",
            "widened mac/laptop → worker rate",
        ]
    );
    let messages: Vec<&str> = report.findings.iter().map(|f| f.message.as_str()).collect();
    assert!(
        messages[2].starts_with("max_concurrent 2 → 3"),
        "{messages:?}"
    );
    assert!(
        messages[3].starts_with("rate 10 per 60 s → 20 per 60 s"),
        "{messages:?}"
    );
    // Lowered: narrowed, nothing widens.
    let lower = GRANT.replace("max_concurrent = 2", "max_concurrent = 1");
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &lower]);
    assert_eq!(
        lines(&report),
        ["narrowed mac/laptop → worker maxconcurrent"]
    );
    assert!(!report.widens());
}

#[test]
fn hosts_and_denies_change_who_may_ask() {
    // Any mac host, not only the laptop: the class of other hosts gains access.
    let any_host = GRANT.replace("hosts = [\"laptop\"]\n", "");
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, &any_host]);
    assert_eq!(
        lines(&report)[0],
        "widened mac/* → worker access",
        "{:?}",
        lines(&report)
    );
    // A deny of the variable narrows; taking it away widens it back, naming the deny.
    let deny = "[[deny]]\nid = \"no-task\"\nenv = [\"TASK_ID\"]\n";
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, GRANT, deny]);
    assert_eq!(
        lines(&report),
        ["narrowed mac/laptop → worker variable TASK_ID"]
    );
    assert!(
        report.findings[0]
            .message
            .contains("now refused by deny `no-task`")
    );
    let report = diff_of(&[PROFILES, GRANT, deny], &[PROFILES, GRANT]);
    assert_eq!(
        lines(&report),
        ["widened mac/laptop → worker variable TASK_ID"]
    );
    assert!(
        report.findings[0]
            .message
            .contains("no longer refused by deny `no-task`")
    );
    // A deny of the whole pair.
    let deny = "[[deny]]\nid = \"no-workers\"\nprofiles = [\"worker\"]\n";
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, GRANT, deny]);
    let found = lines(&report);
    let access = found
        .iter()
        .position(|l| l == "narrowed mac/laptop → worker access")
        .unwrap_or_else(|| panic!("{found:?}"));
    assert_eq!(
        report.findings[access].rules,
        [RuleId("no-workers".to_owned())]
    );
    // It refuses messages to workers from their spawners too, from every fleet.
    assert!(
        found.contains(&"narrowed */* → worker message spawner".to_owned()),
        "{found:?}"
    );
    assert!(!report.widens());
}

#[test]
fn profile_changes_reach_every_holder() {
    let new = PROFILES
        .replace(
            "secrets = { API_KEY = \"credential:api-key\" }",
            "secrets = { API_KEY = \"credential:api-key\", GH_TOKEN = \"keyring:gh\" }",
        )
        .replace(
            "roots = [\"/srv/work\"]",
            "roots = [\"/srv/work\", \"/home\"]",
        )
        .replace("\"--work\"", "\"--work\", \"--yolo\"")
        .replace(
            "max_instances = 4",
            "max_instances = 8\n[profile.worker.ready]\naccept_dialogs = true",
        );
    let report = diff_of(&[PROFILES, GRANT], &[&new, GRANT]);
    assert_eq!(
        lines(&report),
        [
            "widened profile worker maxinstances",
            "changed profile worker argv",
            "widened profile worker roots",
            "widened profile worker secret GH_TOKEN",
            "widened profile worker readiness",
        ]
    );
    for finding in &report.findings {
        assert_eq!(finding.holders, ["mac/laptop"], "{}", finding.message);
    }
    assert!(report.findings[3].message.contains("keyring:gh"));
    // A fixed variable no longer fixed: requests granted it may now set it.
    let unfixed = PROFILES.replace("env = { GIT_AUTHOR_NAME = \"worker\" }\n", "");
    let grant =
        GRANT.to_owned() + "\n[grant.env.GIT_AUTHOR_NAME]\npattern = \"[a-z]+\"\nmax_len = 8\n";
    let report = diff_of(&[PROFILES, &grant], &[&unfixed, &grant]);
    assert_eq!(
        lines(&report),
        [
            "widened mac/laptop → worker variable GIT_AUTHOR_NAME",
            "changed profile worker fixed-env GIT_AUTHOR_NAME",
        ],
        "origin classes first, then profile changes"
    );
}

#[test]
fn message_rules_are_compared_by_sender() {
    let message = "[[message]]\nid = \"laptop-to-reviewers\"\nfleets = [\"mac\"]\nhosts = [\"laptop\"]\nprofiles = [\"reviewer\"]\n";
    let report = diff_of(&[PROFILES, GRANT], &[PROFILES, GRANT, message]);
    assert_eq!(
        lines(&report),
        ["widened mac/laptop → reviewer message other"]
    );
    assert_eq!(
        report.findings[0].rules,
        [RuleId("laptop-to-reviewers".to_owned())]
    );
    assert_eq!(
        report.findings[0].location.as_ref().map(|l| l.line),
        Some(2)
    );
}

/// Deterministic xorshift, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn subset<'a>(&mut self, items: &[&'a str]) -> Vec<&'a str> {
        let out: Vec<&str> = items.iter().copied().filter(|_| self.chance(50)).collect();
        if out.is_empty() {
            vec![*self.pick(items)]
        } else {
            out
        }
    }
}

const FLEETS: &[&str] = &["a", "b"];
const HOSTS: &[&str] = &["h1", "h2"];
const NAMES: &[&str] = &["V1", "V2", "V3"];
const PATTERNS: &[&str] = &[
    "[a-z]{1,4}",
    "[a-z0-9]{1,4}",
    "[a-z]+",
    "[0-9]+",
    "x|y",
    "[a-c]{2}",
    "[a-z][a-z]{0,3}",
];

fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A random small policy over two fleets, two named hosts, two profiles and three variables.
fn random_policy(rng: &mut Rng) -> String {
    let mut text = String::new();
    for profile in ["p1", "p2"] {
        text += &format!(
            "[profile.{profile}]\nargv = [\"/bin/agent\"]\nroots = [\"/srv\"]\nmax_instances = {}\n",
            1 + rng.below(3)
        );
        if rng.chance(30) {
            text += "env = { V3 = \"fixed\" }\n";
        }
        if rng.chance(20) {
            text += "remote_messages = false\n";
        }
    }
    for i in 0..rng.below(4) {
        text += &format!(
            "[[grant]]\nid = \"g{i}\"\nfleets = {}\nprofiles = {}\n",
            list(&rng.subset(FLEETS)),
            list(&rng.subset(&["p1", "p2"]))
        );
        if rng.chance(50) {
            text += &format!("hosts = {}\n", list(&rng.subset(HOSTS)));
        }
        if rng.chance(40) {
            text += "cwd = true\n";
        }
        if rng.chance(40) {
            text += &format!("max_concurrent = {}\n", 1 + rng.below(2));
        }
        if rng.chance(40) {
            text += &format!("rate = {{ count = {}, per_secs = 60 }}\n", 1 + rng.below(3));
        }
        for name in NAMES {
            if rng.chance(50) {
                text += &format!(
                    "[grant.env.{name}]\npattern = \"{}\"\nmax_len = {}\n",
                    rng.pick(PATTERNS),
                    rng.pick(&[2, 4, 8])
                );
            }
        }
    }
    if rng.chance(40) {
        text += &format!(
            "[[deny]]\nid = \"d1\"\nenv = {}\n",
            list(&rng.subset(NAMES))
        );
    }
    if rng.chance(25) {
        text += &format!(
            "[[deny]]\nid = \"d2\"\nfleets = {}\nprofiles = {}\n",
            list(&rng.subset(FLEETS)),
            list(&rng.subset(&["p1", "p2"]))
        );
    }
    if rng.chance(50) {
        text += &format!(
            "[[message]]\nid = \"m1\"\nfleets = {}\nprofiles = {}\n",
            list(&rng.subset(FLEETS)),
            list(&rng.subset(&["p1", "p2", "mailbox"]))
        );
        if rng.chance(50) {
            text += &format!("hosts = {}\n", list(&rng.subset(HOSTS)));
        }
    }
    text
}

#[test]
fn every_changed_decision_is_explained_by_a_finding() {
    const VALUES: &[&str] = &[
        "a", "ab", "abc", "abcd", "abcde", "x", "1", "12", "12345", "a1", "ac", "fixed",
    ];
    let (mut pairs, mut changed) = (0, 0);
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (old_text, new_text) = (random_policy(&mut rng), random_policy(&mut rng));
        let load = |text: &str| load_sources(&[(PathBuf::from("p.toml"), text.to_owned())]).0;
        let (Ok(old), Ok(new)) = (load(&old_text), load(&new_text)) else {
            continue;
        };
        pairs += 1;
        let report = diff(&old, &new);
        for _ in 0..200 {
            let origin = Origin {
                fleet: (*rng.pick(&["a", "b", "c"])).to_owned(),
                host: (*rng.pick(&["h1", "h2", "h3"])).to_owned(),
            };
            let profile = (*rng.pick(&["p1", "p2", "p3"])).to_owned();
            let mut env = BTreeMap::new();
            for name in NAMES {
                if rng.chance(30) {
                    env.insert((*name).to_owned(), (*rng.pick(VALUES)).to_owned());
                }
            }
            let request = Request {
                origin: origin.clone(),
                profile: profile.clone(),
                env,
                cwd: rng.chance(30).then(|| PathBuf::from("sub")),
                label: None,
            };
            let counts = Counts {
                running: rng.below(3) as u32,
                origin_running: rng.below(3) as u32,
                recent: rng.below(4) as u32,
            };
            let (before, after) = (
                evaluate(&old, &request, &counts),
                evaluate(&new, &request, &counts),
            );
            if before.effect != after.effect {
                changed += 1;
                assert!(
                    report.explains(&request),
                    "seed {seed}: {request:?} with {counts:?}: {:?} → {:?}, unexplained by {:#?}\n--- old\n{old_text}\n--- new\n{new_text}",
                    before.effect,
                    after.effect,
                    lines(&report)
                );
            }
            let message = MessageRequest {
                origin,
                profile: (*rng.pick(&["p1", "p2", "mailbox"])).to_owned(),
                sender: *rng.pick(&[Sender::Other, Sender::Spawner, Sender::Spawned]),
            };
            if evaluate_message(&old, &message).effect != evaluate_message(&new, &message).effect {
                changed += 1;
                assert!(
                    report.explains_message(&message),
                    "seed {seed}: message {message:?} unexplained by {:#?}",
                    lines(&report)
                );
            }
        }
    }
    assert!(pairs > 200, "only {pairs} random policy pairs loaded");
    assert!(
        changed > 1000,
        "only {changed} changed decisions were checked"
    );
}

#[test]
fn every_widening_of_a_sandbox_is_reported_as_widening() {
    let profile = |sandbox: &str| {
        format!(
            "[profile.w]\nargv = [\"/usr/bin/agent\"]\nroots = [\"/srv/work\"]\n{sandbox}\n\
             [[grant]]\nid = \"g\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n"
        )
    };
    let default = profile("");
    let found = |old: &str, new: &str| {
        diff_of(&[old], &[new])
            .findings
            .iter()
            .map(|f| format!("{} {}", f.direction.as_str(), f.message))
            .collect::<Vec<_>>()
    };
    let host = profile("[profile.w.sandbox]\nnetwork = \"host\"\ntcp_connect = [443]\n");
    assert_eq!(
        found(&default, &host),
        ["widened sandbox network none → host"]
    );
    let any_port = profile("[profile.w.sandbox]\nnetwork = \"host\"\n");
    assert_eq!(
        found(&host, &any_port),
        ["widened sandbox TCP connect ports [443] → any"]
    );
    let wider = profile(
        "[profile.w.sandbox]\nwritable = [\"/srv/cache\"]\nreadable = [\"~/.gitconfig\"]\n",
    );
    assert_eq!(
        found(&default, &wider),
        [
            "widened sandbox writable paths added: /srv/cache",
            "widened sandbox hidden paths exposed added: ~/.gitconfig"
        ]
    );
    let off = profile("[profile.w.sandbox]\nmode = \"off\"\n");
    let report = diff_of(&[&default], &[&off]);
    assert!(report.widens());
    assert_eq!(
        found(&default, &off),
        ["widened sandbox turned off: its agents now run unconfined, as their user"]
    );
    assert_eq!(
        found(&off, &default),
        ["narrowed sandbox turned on: its agents now start confined"]
    );
    assert!(!diff_of(&[&host], &[&default]).widens());
    // The same ports in another order change nothing.
    let two = profile("[profile.w.sandbox]\nnetwork = \"host\"\ntcp_connect = [443, 22]\n");
    let swapped = profile("[profile.w.sandbox]\nnetwork = \"host\"\ntcp_connect = [22, 443]\n");
    assert_eq!(found(&two, &swapped), Vec::<String>::new());
}
