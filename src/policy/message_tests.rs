//! The message policy: which shells never receive remote text, how `[[message]]` rules parse and
//! are checked, and the decision table of [`evaluate_message`].

use std::path::PathBuf;

use serde_json::json;

use super::*;

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

#[test]
fn an_interactive_shell_is_recognised_and_a_script_or_command_is_not() {
    for shell in [
        &["/bin/bash"][..],
        &["/usr/bin/bash", "--noprofile", "--norc"],
        &["/bin/sh", "-i"],
        &["/usr/bin/zsh", "-l"],
        &["/usr/bin/env", "bash"],
        &["/usr/bin/env", "-i", "PS1=x", "/bin/dash"],
        &["/bin/busybox", "sh"],
        &["/bin/bash", "--rcfile", "/etc/x", "-o", "vi"],
        &["/bin/bash", "-s", "arg"],
        &["/usr/bin/fish"],
        &["/bin/bash", "--"],
    ] {
        assert!(names::interactive_shell(&argv(shell)), "{shell:?}");
    }
    for program in [
        &["/bin/sh", "-c", "read line; echo $line"][..],
        &["/bin/bash", "-lc", "exec agent"],
        &["/bin/bash", "/opt/worker.sh"],
        &["/bin/bash", "--", "/opt/worker.sh"],
        &["/usr/local/bin/claude", "--permission-mode", "plan"],
        &["/usr/bin/env", "python3", "-i"],
        &["/usr/bin/bashful"],
        &["/usr/bin/env"],
    ] {
        assert!(!names::interactive_shell(&argv(program)), "{program:?}");
    }
}

const POLICY: &str = r#"
[profile.worker]
argv = ["/usr/bin/agent"]
roots = ["/srv/work"]

[profile.quiet]
argv = ["/usr/bin/agent", "--alone"]
roots = ["/srv/work"]
remote_messages = false

[profile.maintenance]
argv = ["/usr/bin/bash", "--noprofile", "--norc"]
roots = ["/srv"]

[[message]]
id = "laptop-to-workers"
fleets = ["mac"]
hosts = ["laptop"]
profiles = ["worker", "mailbox"]

[[message]]
id = "ci-to-workers"
fleets = ["ci"]
profiles = ["worker"]

[[deny]]
id = "quarantine"
fleets = ["mac"]
hosts = ["stolen"]

[[deny]]
id = "no-debug"
env = ["DEBUG"]
"#;

fn policy() -> PolicySet {
    let (set, diagnostics) = load_sources(&[(PathBuf::from("m.toml"), POLICY.to_owned())]);
    set.unwrap_or_else(|e| panic!("{e}: {diagnostics:?}"))
}

#[test]
fn message_decision_table() {
    let policy = policy();
    assert!(policy.profiles["worker"].remote_messages);
    assert!(!policy.profiles["quiet"].remote_messages);
    assert!(
        !policy.profiles["maintenance"].remote_messages,
        "a shell, by default"
    );
    // (fleet, host, profile, sender, effect, deciding rule)
    let table = [
        (
            "mac",
            "laptop",
            "worker",
            "other",
            Effect::Allow,
            "laptop-to-workers",
        ),
        (
            "mac",
            "laptop",
            "mailbox",
            "other",
            Effect::Allow,
            "laptop-to-workers",
        ),
        ("mac", "desk", "worker", "other", Effect::Deny, DEFAULT_DENY),
        (
            "ci",
            "runner-7",
            "worker",
            "other",
            Effect::Allow,
            "ci-to-workers",
        ),
        (
            "ci",
            "runner-7",
            "mailbox",
            "other",
            Effect::Deny,
            DEFAULT_DENY,
        ),
        ("other", "box", "worker", "spawner", Effect::Allow, SPAWNER),
        ("other", "box", "mailbox", "spawned", Effect::Allow, SPAWNED),
        ("other", "box", "gone", "other", Effect::Deny, DEFAULT_DENY),
        // Never remote text into a shell or an opted-out profile, not even from the spawner.
        (
            "mac",
            "laptop",
            "maintenance",
            "spawner",
            Effect::Deny,
            NO_REMOTE_TEXT,
        ),
        (
            "mac",
            "laptop",
            "quiet",
            "spawner",
            Effect::Deny,
            NO_REMOTE_TEXT,
        ),
        // A deny beats everything; one about variables does not apply to messages.
        (
            "mac",
            "stolen",
            "worker",
            "spawner",
            Effect::Deny,
            "quarantine",
        ),
    ];
    for (fleet, host, profile, sender, effect, rule) in table {
        let value = json!({"kind": "message", "origin": {"fleet": fleet, "host": host}, "profile": profile, "sender": sender});
        let Ok(Ask::Message(request)) = Ask::from_value(&value) else {
            panic!("{value} is a message request");
        };
        let decision = evaluate_message(&policy, &request);
        assert_eq!(decision.effect, effect, "{value}: {decision:?}");
        assert_eq!(
            decision
                .rules
                .iter()
                .map(RuleId::as_str)
                .collect::<Vec<_>>(),
            [rule],
            "{value}: {decision:?}"
        );
        assert!(!decision.reasons.is_empty());
    }
}

#[test]
fn message_requests_are_checked_field_by_field() {
    for (value, field) in [
        (json!({"kind": "message", "profile": "w"}), "origin"),
        (
            json!({"kind": "message", "origin": {"fleet": "F!", "host": "h"}, "profile": "w"}),
            "origin.fleet",
        ),
        (
            json!({"kind": "message", "origin": {"fleet": "f", "host": "h"}, "profile": "w", "sender": "boss"}),
            "sender",
        ),
        (
            json!({"kind": "message", "origin": {"fleet": "f", "host": "h"}, "profile": "w", "text": "x"}),
            "text",
        ),
        (
            json!({"kind": "mail", "origin": {"fleet": "f", "host": "h"}, "profile": "w"}),
            "kind",
        ),
    ] {
        let error = Ask::from_value(&value).unwrap_err();
        assert_eq!(error.field, field, "{value}: {error}");
    }
    let spawn = json!({"kind": "spawn", "origin": {"fleet": "f", "host": "h"}, "profile": "w"});
    assert!(matches!(Ask::from_value(&spawn), Ok(Ask::Spawn(_))));
}

#[test]
fn message_rules_are_checked_as_a_reviewer_would() {
    let cases = [
        // A shell cannot be opened to remote text.
        (
            "[profile.sh]\nargv = [\"/bin/sh\"]\nroots = [\"/srv\"]\nremote_messages = true\n",
            "shell-remote-text",
        ),
        // `mailbox` is the name of the primary's mailboxes.
        (
            "[profile.mailbox]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n",
            "invalid-value",
        ),
        // Built-in rule ids are not a policy's to take.
        (
            "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n[[message]]\nid = \"spawner\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n",
            "invalid-value",
        ),
        // A message rule names defined profiles.
        (
            "[[message]]\nid = \"m\"\nfleets = [\"f\"]\nprofiles = [\"wroker\"]\n",
            "unknown-profile",
        ),
        // Its id is unique among all rules.
        (
            "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n[[grant]]\nid = \"m\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n[[message]]\nid = \"m\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n",
            "duplicate-id",
        ),
        (
            "[[message]]\nid = \"m\"\nprofiles = [\"mailbox\"]\n",
            "missing-key",
        ),
    ];
    for (text, code) in cases {
        let (result, diagnostics) = load_sources(&[(PathBuf::from("m.toml"), text.to_owned())]);
        assert!(result.is_err(), "{text}");
        assert!(
            diagnostics
                .iter()
                .any(|d| d.code == code && d.severity == Severity::Error),
            "{text}: {diagnostics:?}"
        );
    }
    // Rules that can never admit anything are warned about.
    let text = "[profile.sh]\nargv = [\"/bin/bash\"]\nroots = [\"/srv\"]\n\
                [profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n\
                [[message]]\nid = \"into-a-shell\"\nfleets = [\"f\"]\nprofiles = [\"sh\"]\n\
                [[message]]\nid = \"denied\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n\
                [[deny]]\nid = \"no-f\"\nfleets = [\"f\"]\n";
    let (result, diagnostics) = load_sources(&[(PathBuf::from("m.toml"), text.to_owned())]);
    assert!(result.is_ok(), "{diagnostics:?}");
    let never: Vec<&str> = diagnostics
        .iter()
        .filter(|d| d.code == "never-matches")
        .map(|d| d.message.as_str())
        .collect();
    assert!(
        never
            .iter()
            .any(|m| m.contains("`into-a-shell` can never match: its profiles never receive")),
        "{never:?}"
    );
    assert!(
        never
            .iter()
            .any(|m| m.contains("`denied` can never match: deny `no-f`")),
        "{never:?}"
    );
}
