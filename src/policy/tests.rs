//! Decision tables: requests against one policy, with the effect and the deciding rule.

use std::path::PathBuf;

use serde_json::json;

use super::*;

const POLICY: &str = r#"
[profile.worker]
argv = ["/usr/bin/agent", "--task"]
roots = ["/srv/work"]
env = { FIXED = "1" }
secrets = { API_TOKEN = "credential:api-token" }
max_instances = 3

[profile.reviewer]
argv = ["/usr/bin/agent", "--review"]
roots = ["/srv/review"]

[profile.admin]
argv = ["/usr/bin/bash"]
roots = ["/srv"]

[[grant]]
id = "mac-laptop-workers"
fleets = ["mac"]
hosts = ["laptop"]
profiles = ["worker"]
cwd = true
max_concurrent = 2
rate = { count = 5, per_secs = 60 }
allow_dangerous = ["HTTPS_PROXY"]
[grant.env.TASK_ID]
pattern = "[A-Z]+-[0-9]{1,6}"
max_len = 16
[grant.env.HTTPS_PROXY]
pattern = "http://proxy\\.internal:3128"
max_len = 40

[[grant]]
id = "mac-reviewers"
fleets = ["mac", "ci"]
profiles = ["reviewer"]

[[grant]]
id = "ci-workers-no-env"
fleets = ["ci"]
profiles = ["worker"]

[[deny]]
id = "no-admin"
description = "admin is local only"
profiles = ["admin"]

[[grant]]
id = "admin-grant-shadowed"
fleets = ["mac"]
hosts = ["laptop"]
profiles = ["admin"]

[[deny]]
id = "quarantine-bad-host"
fleets = ["mac"]
hosts = ["stolen-laptop"]

[[deny]]
id = "no-debug"
env = ["DEBUG"]
"#;

fn policy() -> PolicySet {
    let (set, diagnostics) = load_sources(&[(PathBuf::from("p.toml"), POLICY.to_owned())]);
    let errors: Vec<String> = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(Diagnostic::render)
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    set.unwrap()
}

fn request(fleet: &str, host: &str, profile: &str, env: serde_json::Value) -> serde_json::Value {
    json!({"origin": {"fleet": fleet, "host": host}, "profile": profile, "env": env})
}

#[test]
fn decision_table() {
    let policy = policy();
    let none = Counts::default();
    let busy = |running, origin_running, recent| Counts {
        running,
        origin_running,
        recent,
    };
    let cases: Vec<(&str, serde_json::Value, Counts, Effect, &str)> = vec![
        (
            "granted fleet and host",
            request("mac", "laptop", "worker", json!({})),
            none,
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "granted env value",
            request("mac", "laptop", "worker", json!({"TASK_ID": "FLEET-42"})),
            none,
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "other host of the granted fleet",
            request("mac", "desktop", "worker", json!({})),
            none,
            Effect::Deny,
            "default-deny",
        ),
        (
            "ungranted fleet",
            request("fleet02", "laptop", "worker", json!({})),
            none,
            Effect::Deny,
            "default-deny",
        ),
        (
            "unknown fleet",
            request("zz", "h", "reviewer", json!({})),
            none,
            Effect::Deny,
            "default-deny",
        ),
        (
            "grant without host list admits any host",
            request("ci", "runner-7", "reviewer", json!({})),
            none,
            Effect::Allow,
            "mac-reviewers",
        ),
        (
            "second fleet of a grant",
            request("mac", "anything", "reviewer", json!({})),
            none,
            Effect::Allow,
            "mac-reviewers",
        ),
        (
            "unknown profile",
            request("mac", "laptop", "deployer", json!({})),
            none,
            Effect::Deny,
            "default-deny",
        ),
        (
            "profile not in the grant",
            request("ci", "runner", "admin", json!({})),
            none,
            Effect::Deny,
            "no-admin",
        ),
        (
            "env name not granted",
            request("mac", "laptop", "worker", json!({"OTHER": "x"})),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "env value outside pattern",
            request("mac", "laptop", "worker", json!({"TASK_ID": "42"})),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "env value pattern is anchored at the end",
            request(
                "mac",
                "laptop",
                "worker",
                json!({"TASK_ID": "AB-1; rm -rf /"}),
            ),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "env value pattern is anchored at the start",
            request("mac", "laptop", "worker", json!({"TASK_ID": "x AB-1"})),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "env value too long",
            request(
                "mac",
                "laptop",
                "worker",
                json!({"TASK_ID": "ABCDEFGHIJKL-123456"}),
            ),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "dangerous name with opt-in and matching value",
            request(
                "mac",
                "laptop",
                "worker",
                json!({"HTTPS_PROXY": "http://proxy.internal:3128"}),
            ),
            none,
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "dangerous name with opt-in, wrong value",
            request(
                "mac",
                "laptop",
                "worker",
                json!({"HTTPS_PROXY": "http://evil:3128"}),
            ),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "request overrides a fixed variable",
            request("mac", "laptop", "worker", json!({"FIXED": "2"})),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "request overrides a secret variable",
            request("mac", "laptop", "worker", json!({"API_TOKEN": "mine"})),
            none,
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "grant without env allows none",
            request("ci", "runner", "worker", json!({"TASK_ID": "AB-1"})),
            none,
            Effect::Deny,
            "ci-workers-no-env",
        ),
        (
            "profile at max instances",
            request("mac", "laptop", "worker", json!({})),
            busy(3, 0, 0),
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "profile below max instances",
            request("mac", "laptop", "worker", json!({})),
            busy(2, 1, 0),
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "origin at max concurrent",
            request("mac", "laptop", "worker", json!({})),
            busy(2, 2, 0),
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "rate limit reached",
            request("mac", "laptop", "worker", json!({})),
            busy(0, 0, 5),
            Effect::Deny,
            "mac-laptop-workers",
        ),
        (
            "rate limit not reached",
            request("mac", "laptop", "worker", json!({})),
            busy(0, 0, 4),
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "deny beats allow",
            request("mac", "laptop", "admin", json!({})),
            none,
            Effect::Deny,
            "no-admin",
        ),
        (
            "deny by host",
            request("mac", "stolen-laptop", "reviewer", json!({})),
            none,
            Effect::Deny,
            "quarantine-bad-host",
        ),
        (
            "deny by env name",
            request("mac", "laptop", "worker", json!({"DEBUG": "1"})),
            none,
            Effect::Deny,
            "no-debug",
        ),
        (
            "cwd where the grant allows it",
            json!({"origin": {"fleet": "mac", "host": "laptop"}, "profile": "worker", "cwd": "repo/sub"}),
            none,
            Effect::Allow,
            "mac-laptop-workers",
        ),
        (
            "cwd where the grant does not",
            json!({"origin": {"fleet": "ci", "host": "r"}, "profile": "reviewer", "cwd": "repo"}),
            none,
            Effect::Deny,
            "mac-reviewers",
        ),
        (
            "label is carried",
            json!({"origin": {"fleet": "mac", "host": "laptop"}, "profile": "worker", "label": "task 42: fix"}),
            none,
            Effect::Allow,
            "mac-laptop-workers",
        ),
    ];
    for (name, json, counts, effect, rule) in &cases {
        let request = Request::from_value(json).unwrap_or_else(|e| panic!("{name}: {e}"));
        let decision = evaluate(&policy, &request, counts);
        assert_eq!(decision.effect, *effect, "{name}: {decision:?}");
        assert!(
            decision.rules.iter().any(|r| r.as_str() == *rule),
            "{name}: decided by {:?}",
            decision.rules
        );
        assert!(
            !decision.reasons.is_empty(),
            "{name}: a decision has reasons"
        );
    }
}

#[test]
fn every_dangerous_name_needs_an_opt_in_in_requests() {
    let policy = policy();
    for name in [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "DYLD_INSERT_LIBRARIES",
        "PATH",
        "HOME",
        "SHELL",
        "BASH_ENV",
        "ENV",
        "BASH_FUNC_x",
        "SHELLOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "IFS",
        "PYTHONPATH",
        "NODE_OPTIONS",
        "PERL5OPT",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
        "GIT_CONFIG_GLOBAL",
        "GIT_SSH_COMMAND",
        "GIT_ASKPASS",
        "SSH_AUTH_SOCK",
        "HTTP_PROXY",
        "no_proxy",
    ] {
        let json = request("mac", "laptop", "worker", json!({ name: "x" }));
        let request = Request::from_value(&json).unwrap();
        let decision = evaluate(&policy, &request, &Counts::default());
        assert_eq!(decision.effect, Effect::Deny, "{name}");
        assert!(
            decision.reasons.iter().any(|r| r.contains("dangerous")),
            "{name}: {:?}",
            decision.reasons
        );
    }
}

#[test]
fn every_dangerous_name_in_a_grant_needs_an_opt_in_and_warns_with_one() {
    for pattern in DANGEROUS {
        let name = pattern.replace('*', "X");
        let grant = |opt_in: bool| {
            format!(
                "[profile.p]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n[[grant]]\nid = \"g\"\nfleets = [\"f\"]\nprofiles = [\"p\"]\n{}[grant.env.{name}]\npattern = \"x\"\nmax_len = 1\n",
                if opt_in {
                    format!("allow_dangerous = [\"{name}\"]\n")
                } else {
                    String::new()
                }
            )
        };
        let (result, diagnostics) = load_sources(&[(PathBuf::from("g.toml"), grant(false))]);
        assert!(result.is_err(), "{name} without opt-in must be refused");
        assert!(
            diagnostics
                .iter()
                .any(|d| d.code == "dangerous-opt-in" && d.severity == Severity::Error),
            "{name}"
        );
        let (result, diagnostics) = load_sources(&[(PathBuf::from("g.toml"), grant(true))]);
        assert!(result.is_ok(), "{name} with opt-in loads: {diagnostics:?}");
        assert!(
            diagnostics
                .iter()
                .any(|d| d.code == "dangerous-opt-in" && d.severity == Severity::Warning),
            "{name} opt-in warns"
        );
    }
}

#[test]
fn a_root_of_slash_fleetds_own_secrets_and_a_pattern_taking_anything_are_warned_about() {
    let warned = |text: &str, code: &str| {
        let (result, diagnostics) = load_sources(&[(PathBuf::from("w.toml"), text.to_owned())]);
        assert!(result.is_ok(), "{diagnostics:?}");
        diagnostics
            .iter()
            .any(|d| d.code == code && d.severity == Severity::Warning)
    };
    let profile = |roots: &str, secrets: &str| {
        format!("[profile.p]\nargv = [\"/bin/x\"]\nroots = [{roots}]\n{secrets}")
    };
    assert!(warned(&profile("\"/\"", ""), "broad-root"));
    assert!(!warned(&profile("\"/srv\"", ""), "broad-root"));
    for own in [
        "credential:broker-uri",
        "keyring:host-key",
        "credential:broker-admin-uri",
    ] {
        let text = profile("\"/srv\"", &format!("secrets = {{ T = \"{own}\" }}\n"));
        assert!(warned(&text, "fleetd-secret"), "{own}");
    }
    let text = profile(
        "\"/srv\"",
        "secrets = { T = \"credential:github-token\" }\n",
    );
    assert!(!warned(&text, "fleetd-secret"));
    let grant = |pattern: &str| {
        format!(
            "{}[[grant]]\nid = \"g\"\nfleets = [\"f\"]\nprofiles = [\"p\"]\n[grant.env.TASK]\npattern = '{pattern}'\nmax_len = 8\n",
            profile("\"/srv\"", "")
        )
    };
    for anything in [".*", "(?s).*", "[\\s\\S]*"] {
        assert!(warned(&grant(anything), "matches-anything"), "{anything}");
    }
    assert!(!warned(&grant("[A-Z]{2,5}-[0-9]{1,6}"), "matches-anything"));
}

#[test]
fn malformed_requests_name_the_field() {
    let base = |extra: serde_json::Value| {
        let mut value = json!({"origin": {"fleet": "mac", "host": "laptop"}, "profile": "worker"});
        if let (Some(object), Some(more)) = (value.as_object_mut(), extra.as_object()) {
            object.extend(more.clone());
        }
        value
    };
    let cases = [
        (json!([]), "request"),
        (json!({"profile": "worker"}), "origin"),
        (
            json!({"origin": {"fleet": "mac"}, "profile": "worker"}),
            "origin.host",
        ),
        (
            json!({"origin": {"fleet": "Mac!", "host": "h"}, "profile": "worker"}),
            "origin.fleet",
        ),
        (
            json!({"origin": {"fleet": "mac", "host": "h", "user": "x"}, "profile": "worker"}),
            "origin.user",
        ),
        (json!({"origin": {"fleet": "mac", "host": "h"}}), "profile"),
        (base(json!({"extra": 1})), "extra"),
        (base(json!({"env": {"TASK_ID": 42}})), "env.TASK_ID"),
        (base(json!({"env": {"BAD NAME": "x"}})), "env.BAD NAME"),
        (base(json!({"env": {"X": "a\u{0}b"}})), "env.X"),
        (base(json!({"env": {"X": "y".repeat(5000)}})), "env.X"),
        (base(json!({"cwd": "../etc"})), "cwd"),
        (base(json!({"cwd": "a/../../etc"})), "cwd"),
        (base(json!({"cwd": "/etc"})), "cwd"),
        (base(json!({"cwd": ""})), "cwd"),
        (base(json!({"label": "x; rm -rf /"})), "label"),
        (base(json!({"label": "x".repeat(65)})), "label"),
    ];
    for (json, field) in cases {
        let error = Request::from_value(&json).unwrap_err();
        assert_eq!(error.field, field, "{json}");
    }
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_REQUEST));
    assert_eq!(
        Request::from_json(huge.as_bytes()).unwrap_err().field,
        "request"
    );
    assert_eq!(
        Request::from_json(b"{not json").unwrap_err().field,
        "request"
    );
}

#[test]
fn cwd_symlinks_escaping_the_root_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("repo")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
    std::os::unix::fs::symlink(root.path().join("repo"), root.path().join("inside")).unwrap();
    let text = format!(
        "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"{}\"]\n[[grant]]\nid = \"g\"\nfleets = [\"mac\"]\nprofiles = [\"w\"]\ncwd = true\n",
        root.path().display()
    );
    let (set, _) = load_sources(&[(PathBuf::from("w.toml"), text)]);
    let set = set.unwrap();
    let spec_for = |cwd: &str| {
        let request = Request::from_value(
            &json!({"origin": {"fleet": "mac", "host": "h"}, "profile": "w", "cwd": cwd}),
        )
        .unwrap();
        let decision = evaluate(&set, &request, &Counts::default());
        assert_eq!(decision.effect, Effect::Allow);
        pane_spec(&set, &request, &decision)
    };
    assert!(spec_for("repo").is_ok());
    assert!(
        spec_for("inside").is_ok(),
        "a symlink inside the root is fine"
    );
    assert!(matches!(spec_for("escape"), Err(SpecError::Escape(_))));
    assert!(matches!(spec_for("missing"), Err(SpecError::Missing(_))));
}

#[test]
fn pane_spec_carries_references_never_values() {
    let dir = tempfile::tempdir().unwrap();
    let text = POLICY.replace("/srv/work", &dir.path().display().to_string());
    let (set, _) = load_sources(&[(PathBuf::from("p.toml"), text)]);
    let set = set.unwrap();
    let request = Request::from_value(&request(
        "mac",
        "laptop",
        "worker",
        json!({"TASK_ID": "AB-1"}),
    ))
    .unwrap();
    let decision = evaluate(&set, &request, &Counts::default());
    let spec = pane_spec(&set, &request, &decision).unwrap();
    assert_eq!(spec.argv, ["/usr/bin/agent", "--task"]);
    assert_eq!(spec.env.get("TASK_ID").map(String::as_str), Some("AB-1"));
    let json = spec.to_json().to_string();
    assert!(
        json.contains("credential:api-token") && !json.contains("AB-1"),
        "{json}"
    );
}

#[test]
fn load_reports_every_problem_across_files() {
    let files = [
        (PathBuf::from("a.toml"), "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\nalow = 1\n[[grant]]\nid = \"g\"\nfleets = [\"f\"]\nprofiles = [\"wx\"]\n".to_owned()),
        (PathBuf::from("b.toml"), "[profile.w]\nargv = [\"/bin/y\"]\nroots = [\"/srv\"]\n[[deny]]\nid = \"g\"\n[[grant]]\nid = \"h\"\nfleets = []\nprofiles = [\"w\"]\n[grant.env.X]\npattern = \"(\"\nmax_len = 3\n".to_owned()),
    ];
    let (result, diagnostics) = load_sources(&files);
    assert!(result.is_err());
    let codes: Vec<&str> = diagnostics.iter().map(|d| d.code).collect();
    for code in [
        "unknown-key",
        "unknown-profile",
        "duplicate-id",
        "invalid-regex",
    ] {
        assert!(codes.contains(&code), "{code} in {codes:?}");
    }
    assert!(
        codes.iter().filter(|c| **c == "duplicate-id").count() >= 2,
        "profile and rule id: {codes:?}"
    );
    let help = diagnostics
        .iter()
        .find(|d| d.code == "unknown-profile")
        .and_then(|d| d.help.clone());
    assert_eq!(help.as_deref(), Some("did you mean `w`?"));
}

#[test]
fn literal_secrets_anywhere_in_a_policy_are_errors() {
    let token = format!("ghp_{}", "a1B2c3D4e5".repeat(4));
    for text in [
        format!("[profile.w]\nargv = [\"/bin/x\", \"--token\", \"{token}\"]\nroots = [\"/srv\"]\n"),
        "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\nenv = { DB_PASSWORD = \"hunter2hunter2\" }\n".to_owned(),
        "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\nenv = { URL = \"https://u:pw12345678@h/\" }\n".to_owned(),
    ] {
        let (result, diagnostics) = load_sources(&[(PathBuf::from("s.toml"), text)]);
        assert!(result.is_err());
        assert!(diagnostics.iter().any(|d| d.code == "literal-secret"), "{diagnostics:?}");
    }
}

#[test]
fn rules_that_can_never_match_are_warned_about() {
    let text = "[profile.w]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\n[[grant]]\nid = \"g\"\nfleets = [\"f\"]\nprofiles = [\"w\"]\n[[deny]]\nid = \"all-f\"\nfleets = [\"f\"]\n[[deny]]\nid = \"empty\"\nhosts = []\n";
    let (result, diagnostics) = load_sources(&[(PathBuf::from("n.toml"), text.to_owned())]);
    assert!(result.is_ok());
    let never: Vec<&str> = diagnostics
        .iter()
        .filter(|d| d.code == "never-matches")
        .map(|d| d.message.as_str())
        .collect();
    assert_eq!(never.len(), 2, "{never:?}");
    assert!(
        never
            .iter()
            .any(|m| m.contains("rule `g` can never match: deny `all-f`")),
        "{never:?}"
    );
}

#[test]
fn sarif_output_has_the_required_shape() {
    let (_, diagnostics) = load_sources(&[(
        PathBuf::from("dir/x.toml"),
        "[profile.w]\nalow = 1\n".to_owned(),
    )]);
    let sarif = to_sarif(&diagnostics);
    assert_eq!(sarif["version"], "2.1.0");
    let run = &sarif["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "fleetd");
    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), diagnostics.len());
    for result in results {
        assert!(result["message"]["text"].is_string());
        assert!(result["ruleId"].is_string());
        assert!(["error", "warning", "note", "none"].contains(&result["level"].as_str().unwrap()));
        let location = &result["locations"][0]["physicalLocation"];
        assert_eq!(location["artifactLocation"]["uri"], "dir/x.toml");
        assert!(location["region"]["startLine"].as_u64().unwrap() >= 1);
        assert!(location["region"]["startColumn"].as_u64().unwrap() >= 1);
    }
    let rule_ids: Vec<&str> = run["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    for result in results {
        assert!(rule_ids.contains(&result["ruleId"].as_str().unwrap()));
    }
}

#[test]
fn the_schema_lists_exactly_the_keys_the_parser_knows() {
    let schema = json_schema();
    let grant = &schema["properties"]["grant"]["items"];
    let keys: Vec<&str> = grant["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for key in [
        "id",
        "fleets",
        "hosts",
        "profiles",
        "env",
        "allow_dangerous",
        "cwd",
        "max_concurrent",
        "rate",
    ] {
        assert!(keys.contains(&key), "{key}");
    }
    assert_eq!(grant["additionalProperties"], false);
    assert_eq!(
        schema["properties"]["profile"]["additionalProperties"]["required"],
        json!(["argv", "roots"])
    );
}

#[test]
fn may_spawn_names_defined_profiles_only() {
    let text = "[profile.lead]\nargv = [\"/bin/x\"]\nroots = [\"/srv\"]\nmay_spawn = [\"worker\"]\n\
                [profile.worker]\nargv = [\"/bin/y\"]\nroots = [\"/srv\"]\n";
    let (set, diagnostics) = load_sources(&[(PathBuf::from("m.toml"), text.to_owned())]);
    let set = set.unwrap_or_else(|_| panic!("{diagnostics:?}"));
    assert_eq!(set.profiles["lead"].may_spawn, ["worker"]);
    assert!(
        set.profiles["worker"].may_spawn.is_empty(),
        "none by default"
    );
    let typo = text.replace("may_spawn = [\"worker\"]", "may_spawn = [\"wroker\"]");
    let (result, diagnostics) = load_sources(&[(PathBuf::from("m.toml"), typo)]);
    assert!(result.is_err());
    assert!(
        diagnostics.iter().any(|d| d.code == "unknown-profile"
            && d.message.contains("may spawn `wroker`")
            && d.line == 1),
        "{diagnostics:?}"
    );
}

#[test]
fn a_profile_sandbox_is_on_by_default_and_checked() {
    let load = |sandbox: &str| {
        let text = format!(
            "[profile.w]\nargv = [\"/usr/bin/agent\"]\nroots = [\"/srv/work\"]\n{sandbox}\n"
        );
        load_sources(&[(PathBuf::from("p.toml"), text)])
    };
    let (set, diags) = load("");
    assert!(diags.is_empty(), "{diags:?}");
    assert_eq!(
        set.unwrap().profiles["w"].sandbox,
        Sandbox::On(Confinement::default())
    );
    let (set, _) = load(
        "[profile.w.sandbox]\nnetwork = \"host\"\ntcp_connect = [443, 22]\nwritable = [\"~/.claude\", \"/srv/cache\"]\n",
    );
    let Sandbox::On(c) = &set.unwrap().profiles["w"].sandbox else {
        panic!("on")
    };
    assert_eq!(c.network, Network::Host);
    assert_eq!(c.tcp_connect, Some(vec![443, 22]));
    assert_eq!(
        c.writable,
        [PathBuf::from("~/.claude"), PathBuf::from("/srv/cache")]
    );

    let codes = |sandbox: &str| -> Vec<String> {
        let (set, diags) = load(sandbox);
        assert!(set.is_err() || diags.iter().all(|d| d.severity == Severity::Warning));
        diags
            .iter()
            .map(|d| format!("{}: {}", d.code, d.message))
            .collect()
    };
    for (sandbox, wanted) in [
        (
            "[profile.w.sandbox]\nwritable = [\"/var/lib/fleetd/x\"]\n",
            "sandbox-exposes",
        ),
        (
            "[profile.w.sandbox]\nreadable = [\"/etc/fleetd\"]\n",
            "sandbox-exposes",
        ),
        (
            "[profile.w.sandbox]\nwritable = [\"/tmp/tmux-1000\"]\n",
            "sandbox-exposes",
        ),
        (
            "[profile.w.sandbox]\nwritable = [\"/\"]\n",
            "sandbox-exposes",
        ),
        (
            "[profile.w.sandbox]\nwritable = [\"srv\"]\n",
            "invalid-value",
        ),
        (
            "[profile.w.sandbox]\nwritable = [\"~/../x\"]\n",
            "invalid-value",
        ),
        (
            "[profile.w.sandbox]\ntcp_connect = [443]\n",
            "invalid-value",
        ),
        ("[profile.w.sandbox]\nnetwork = \"lan\"\n", "invalid-value"),
        ("[profile.w.sandbox]\nmode = \"maybe\"\n", "invalid-value"),
        (
            "[profile.w.sandbox]\nnetwork = \"host\"\ntcp_connect = [0]\n",
            "invalid-value",
        ),
        ("[profile.w.sandbox]\nmode = \"off\"\n", "sandbox-off"),
    ] {
        let found = codes(sandbox);
        assert!(
            found.iter().any(|c| c.starts_with(wanted)),
            "{sandbox}: {found:?}"
        );
    }
    // Off is a warning, and the profile loads.
    let (set, _) = load("[profile.w.sandbox]\nmode = \"off\"\n");
    assert_eq!(set.unwrap().profiles["w"].sandbox, Sandbox::Off);
    // A root in fleetd's places is refused too (roots are writable in the sandbox).
    let (set, diags) = load_sources(&[(
        PathBuf::from("p.toml"),
        "[profile.w]\nargv = [\"/usr/bin/agent\"]\nroots = [\"/var/lib/fleetd/work\"]\n".to_owned(),
    )]);
    assert!(set.is_err());
    assert!(
        diags.iter().any(|d| d.code == "sandbox-exposes"),
        "{diags:?}"
    );
}
