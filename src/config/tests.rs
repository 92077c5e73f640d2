use std::path::Path;

use super::*;

const CANARY: &str = "Zq8c4n4ryPw0rd";

fn parse(text: &str) -> Result<Config, Vec<Diagnostic>> {
    raw::parse(text, Path::new("fleetd.toml"))
}

#[test]
fn full_config_loads() {
    let config = parse(
        r#"
host = "fleet01"
fleet = "fleet01"
multiplexer = "herdr"
[broker]
uriEnv = "FLEETD_AMQP_URI"
[paths]
policy = "/etc/fleetd/policy"
state = "/var/lib/fleetd"
runtime = "/run/fleetd"
[log]
format = "json"
level = "debug"
[secrets.github-token]
env = "GH_TOKEN"
"#,
    )
    .unwrap();
    assert_eq!(config.host, "fleet01");
    assert_eq!(config.fleet.as_deref(), Some("fleet01"));
    assert_eq!(config.multiplexer, Multiplexer::Herdr);
    assert_eq!(config.log_format, LogFormat::Json);
    assert_eq!(config.broker.uri_env.as_deref(), Some("FLEETD_AMQP_URI"));
    let names: Vec<&str> = config.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["broker-uri", "host-key", "github-token"]);
}

#[test]
fn snake_case_uri_env_is_accepted() {
    let config = parse("[broker]\nuri_env = \"AMQP_URI\"\n").unwrap();
    assert_eq!(config.broker.uri_env.as_deref(), Some("AMQP_URI"));
}

#[test]
fn unknown_keys_are_reported_with_line_and_column() {
    let errors = parse("host = \"a\"\n[broker]\n  uriEnvv = \"X\"\n").unwrap_err();
    assert_eq!(errors.len(), 1);
    let text = errors[0].to_string();
    assert!(
        text.starts_with("fleetd.toml:3:3: error: unknown field `uriEnvv`"),
        "{text}"
    );
}

#[test]
fn literal_credentials_are_refused_without_echoing_them() {
    let cases = [
        format!("[broker]\nuriEnv = \"amqp://fleet01:{CANARY}@broker:5672/fleet01\"\n"),
        format!("password = \"{CANARY}\"\n"),
        format!("[secrets.gh]\ntoken = \"ghp_{CANARY}{CANARY}{CANARY}\"\n"),
        format!("host = \"x\"\nbroker_password = \"{CANARY}\"\n"),
    ];
    for case in cases {
        let errors = parse(&case).unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let text = text.join("\n");
        assert!(text.contains("literal credential"), "{text}");
        assert!(!text.contains(CANARY), "value echoed: {text}");
    }
}

#[test]
fn type_errors_do_not_echo_values() {
    let errors = parse(&format!("multiplexer = \"{CANARY}\"\n")).unwrap_err();
    let text = errors[0].to_string();
    assert!(!text.contains(CANARY), "{text}");
    assert!(text.contains("fleetd.toml:1:15"), "{text}");
}

#[test]
fn defaults_are_single_host() {
    let config = Config::defaults();
    assert!(config.fleet.is_none() && config.broker.uri_env.is_none() && config.secrets.is_empty());
    assert!(!config.host.is_empty());
}

#[test]
fn broker_admits_skew_and_peer_pins_load() {
    let key = crate::wire::HostKey::generate().unwrap().0;
    let config = parse(&format!(
        "fleet = \"fleet01\"\n[broker]\nuriEnv = \"U\"\nadmit = [\"mac\"]\nskew_secs = 60\nqueue_type = \"quorum\"\n[[peer]]\nfleet = \"mac\"\nhost = \"laptop\"\npubkey = \"{}\"\n",
        key.public()
    ))
    .unwrap();
    assert_eq!(config.broker.admit, ["mac"]);
    assert_eq!(config.broker.skew, std::time::Duration::from_secs(60));
    assert_eq!(config.broker.max_held, 10_000, "the default");
    assert_eq!(config.peers.key("mac", "laptop"), Some(key.public()));
    assert_eq!(
        parse("[broker]\nmax_held = 3\n").unwrap().broker.max_held,
        3
    );
    let errors = parse("[broker]\nmax_held = 0\n").unwrap_err();
    assert!(
        errors[0]
            .to_string()
            .contains("`broker.max_held` must be from 1"),
        "{}",
        errors[0]
    );
    let errors = parse("[[peer]]\nfleet = \"mac\"\nhost = \"laptop\"\npubkey = \"ed25519:nope\"\n")
        .unwrap_err();
    assert!(
        errors[0]
            .to_string()
            .contains("is not an ed25519 public key"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_pinned_broker_ca_is_an_absolute_path() {
    let config = parse("[broker]\nca_file = \"/etc/fleetd/broker-ca.pem\"\n").unwrap();
    assert_eq!(
        config.broker.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/fleetd/broker-ca.pem"))
    );
    let errors = parse("[broker]\nca_file = \"ca.pem\"\n").unwrap_err();
    assert!(
        errors[0].to_string().contains("absolute path"),
        "{}",
        errors[0]
    );
}

#[test]
fn leads_load_and_their_names_are_unique() {
    let config =
        parse("[[lead]]\nname = \"reviewer\"\nprofile = \"worker\"\nenv = { MODE = \"fast\" }\n")
            .unwrap();
    assert_eq!(config.leads.len(), 1);
    assert_eq!(
        config.leads[0].env.get("MODE").map(String::as_str),
        Some("fast")
    );
    let errors = parse(
        "[[lead]]\nname = \"a\"\nprofile = \"worker\"\n[[lead]]\nname = \"a\"\nprofile = \"worker\"\n",
    )
    .unwrap_err();
    assert!(
        errors[0].to_string().contains("two leads share"),
        "{}",
        errors[0]
    );
}

#[test]
fn the_api_section_names_an_operator_group_and_who_reaches_the_socket() {
    let config =
        parse("[api]\noperator_group = \"fleetd-ops\"\nsocket_access = \"all-users\"\n").unwrap();
    assert_eq!(config.operator_group.as_deref(), Some("fleetd-ops"));
    assert_eq!(config.socket_access, crate::api::SocketAccess::AllUsers);
    let defaults = parse("").unwrap();
    assert_eq!(defaults.operator_group, None);
    assert_eq!(defaults.socket_access, crate::api::SocketAccess::Owner);
    for (text, says) in [
        (
            "[api]\nsocket_access = \"everyone\"\n",
            "\"owner\" or \"all-users\"",
        ),
        ("[api]\noperator_group = \"ops;rm\"\n", "must name a group"),
        ("[api]\noperator = \"ops\"\n", "unknown field `operator`"),
    ] {
        let diagnostics = parse(text).unwrap_err();
        assert!(
            diagnostics.iter().any(|d| d.message.contains(says)),
            "{text}: {diagnostics:?}"
        );
    }
}
