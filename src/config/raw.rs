//! The file as written: parsed with spans, checked for literal credentials, then converted into
//! [`Config`]. Every problem found is reported, none with the value that caused it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::IntoDeserializer;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::diag::{Diagnostic, without_values};
use super::{Config, Lead, LogFormat, Multiplexer, Paths, SandboxMode, secret_specs};
use crate::broker::topology::QueueType;
use crate::scrub;
use crate::secret::{SecretName, SecretSpec};
use crate::wire::PublicKey;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    host: Option<Spanned<String>>,
    fleet: Option<Spanned<String>>,
    broker: Option<RawBroker>,
    paths: Option<RawPaths>,
    multiplexer: Option<Multiplexer>,
    tmux_socket: Option<Spanned<String>>,
    sandbox: Option<SandboxMode>,
    log: Option<RawLog>,
    #[serde(default)]
    secrets: BTreeMap<Spanned<String>, RawSecret>,
    #[serde(default)]
    peer: Vec<RawPeer>,
    #[serde(default)]
    lead: Vec<RawLead>,
    roster: Option<RawRoster>,
    api: Option<RawApi>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    operator_group: Option<Spanned<String>>,
    socket_access: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoster {
    beat_secs: Option<Spanned<u64>>,
    suspect_secs: Option<Spanned<u64>>,
    reap_secs: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLead {
    name: Spanned<String>,
    profile: Spanned<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    fleet: Spanned<String>,
    host: Spanned<String>,
    pubkey: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBroker {
    #[serde(rename = "uriEnv", alias = "uri_env")]
    uri_env: Option<Spanned<String>>,
    backoff_cap_secs: Option<Spanned<u64>>,
    queue_type: Option<RawQueueType>,
    #[serde(default)]
    admit: Vec<Spanned<String>>,
    skew_secs: Option<Spanned<u64>>,
    max_held: Option<Spanned<u64>>,
    ca_file: Option<Spanned<std::path::PathBuf>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawQueueType {
    Classic,
    Quorum,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPaths {
    policy: Option<PathBuf>,
    state: Option<PathBuf>,
    runtime: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<LogFormat>,
    level: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    env: Option<Spanned<String>>,
}

/// Parses `text` (read from `path`) into a [`Config`], or every problem found.
pub(super) fn parse(text: &str, path: &Path) -> Result<Config, Vec<Diagnostic>> {
    let (table, errors) = DeTable::parse_recoverable(text);
    let mut diagnostics: Vec<Diagnostic> = errors
        .iter()
        .map(|e| Diagnostic::at(path, text, e.span(), without_values(e.message())))
        .collect();
    literal_credentials(table.get_ref(), "", path, text, &mut diagnostics);
    if !diagnostics.is_empty() {
        return Err(diagnostics);
    }
    let raw = match RawConfig::deserialize(table.into_deserializer()) {
        Ok(raw) => raw,
        Err(error) => {
            let message = without_values(error.message());
            return Err(vec![Diagnostic::at(path, text, error.span(), message)]);
        }
    };
    check(raw, path, text)
}

/// Refuses every string value that is, or is named like, a credential.
fn literal_credentials(
    table: &DeTable<'_>,
    prefix: &str,
    path: &Path,
    text: &str,
    out: &mut Vec<Diagnostic>,
) {
    for (key, value) in table {
        let dotted = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        match value.get_ref() {
            DeValue::String(s) => {
                let kind = scrub::looks_secret(s)
                    .or_else(|| scrub::looks_secret(&format!("{}={s}", key.get_ref())));
                if let Some(kind) = kind {
                    out.push(Diagnostic::at(
                        path,
                        text,
                        Some(value.span()),
                        format!(
                            "`{dotted}` holds a literal credential ({kind}); config files name secrets, they never hold them: use a systemd credential, the variable named by `broker.uriEnv`, or `fleetd secret set`"
                        ),
                    ));
                }
            }
            DeValue::Table(inner) => literal_credentials(inner, &dotted, path, text, out),
            DeValue::Array(items) => {
                for item in items {
                    if let DeValue::Table(inner) = item.get_ref() {
                        literal_credentials(inner, &dotted, path, text, out);
                    } else if let DeValue::String(s) = item.get_ref()
                        && let Some(kind) = scrub::looks_secret(s)
                    {
                        out.push(Diagnostic::at(
                            path,
                            text,
                            Some(item.span()),
                            format!("`{dotted}` holds a literal credential ({kind})"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

fn check(raw: RawConfig, path: &Path, text: &str) -> Result<Config, Vec<Diagnostic>> {
    let mut diagnostics = Vec::new();
    let mut config = Config::defaults();
    config.file = Some(path.to_owned());
    let mut bad = |span: std::ops::Range<usize>, message: String| {
        diagnostics.push(Diagnostic::at(path, text, Some(span), message));
    };
    if let Some(host) = raw.host {
        if !valid_label(host.get_ref(), true) {
            bad(
                host.span(),
                "`host` must be letters, digits, `.`, `_` or `-` (max 64)".to_owned(),
            );
        }
        config.host = host.into_inner();
    }
    if let Some(fleet) = raw.fleet {
        if !valid_label(fleet.get_ref(), false) {
            bad(
                fleet.span(),
                "`fleet` must be lowercase letters, digits, `_` or `-` (max 64)".to_owned(),
            );
        }
        config.fleet = Some(fleet.into_inner());
    }
    if let Some(broker) = raw.broker {
        if let Some(uri_env) = broker.uri_env {
            if !valid_env_name(uri_env.get_ref()) {
                bad(uri_env.span(), "`broker.uriEnv` must name an environment variable (`[A-Z_][A-Z0-9_]*`), not hold the uri".to_owned());
            }
            config.broker.uri_env = Some(uri_env.into_inner());
        }
        if let Some(cap) = broker.backoff_cap_secs {
            if !(1..=3600).contains(cap.get_ref()) {
                bad(
                    cap.span(),
                    "`broker.backoff_cap_secs` must be from 1 to 3600".to_owned(),
                );
            }
            config.broker.backoff_cap = std::time::Duration::from_secs(*cap.get_ref());
        }
        for origin in broker.admit {
            if !valid_label(origin.get_ref(), false) {
                bad(
                    origin.span(),
                    "`broker.admit` lists fleet names (lowercase letters, digits, `_`, `-`)"
                        .to_owned(),
                );
            }
            config.broker.admit.push(origin.into_inner());
        }
        if let Some(max) = broker.max_held {
            if !(1..=1_000_000).contains(max.get_ref()) {
                bad(
                    max.span(),
                    "`broker.max_held` must be from 1 to 1000000".to_owned(),
                );
            }
            config.broker.max_held = *max.get_ref();
        }
        if let Some(skew) = broker.skew_secs {
            if !(1..=3600).contains(skew.get_ref()) {
                bad(
                    skew.span(),
                    "`broker.skew_secs` must be from 1 to 3600".to_owned(),
                );
            }
            config.broker.skew = std::time::Duration::from_secs(*skew.get_ref());
        }
        if let Some(ca_file) = broker.ca_file {
            if !ca_file.get_ref().is_absolute() {
                bad(
                    ca_file.span(),
                    "`broker.ca_file` must be an absolute path to a PEM bundle".to_owned(),
                );
            }
            config.broker.ca_file = Some(ca_file.into_inner());
        }
        if let Some(queue_type) = broker.queue_type {
            config.broker.queue_type = match queue_type {
                RawQueueType::Classic => QueueType::Classic,
                RawQueueType::Quorum => QueueType::Quorum,
            };
        }
    }
    if let Some(paths) = raw.paths {
        let defaults = config.paths.clone();
        config.paths = Paths {
            policy: paths.policy.unwrap_or(defaults.policy),
            state: paths.state.unwrap_or(defaults.state),
            runtime: paths.runtime.unwrap_or(defaults.runtime),
        };
    }
    if let Some(socket) = raw.tmux_socket {
        let value = socket.get_ref();
        let path_ok = value.starts_with('/')
            && !value.split('/').any(|part| part == "..")
            && !value.chars().any(char::is_control);
        if !path_ok && !valid_label(value, false) {
            bad(
                socket.span(),
                "`tmux_socket` is a tmux socket name (`tmux -L NAME`: lowercase letters, digits, `_`, `-`) or an absolute socket path (`tmux -S PATH`)"
                    .to_owned(),
            );
        }
        config.tmux_socket = socket.into_inner();
    }
    if let Some(multiplexer) = raw.multiplexer {
        config.multiplexer = multiplexer;
    }
    if let Some(sandbox) = raw.sandbox {
        config.sandbox = sandbox;
    }
    if let Some(log) = raw.log {
        config.log_format = log.format.unwrap_or(config.log_format);
        config.log_level = log.level.unwrap_or(config.log_level);
    }
    let mut extra = Vec::new();
    for (name, secret) in raw.secrets {
        let span = name.span();
        let Ok(checked) = SecretName::new(name.get_ref()) else {
            bad(
                span,
                format!(
                    "`secrets.{}`: invalid secret name (lowercase letters, digits, `.`, `_`, `-`)",
                    name.get_ref()
                ),
            );
            continue;
        };
        let env = secret.env.map(|env| {
            if !valid_env_name(env.get_ref()) {
                bad(
                    env.span(),
                    format!("`secrets.{checked}.env` must name an environment variable"),
                );
            }
            env.into_inner()
        });
        extra.push(SecretSpec { name: checked, env });
    }
    config.secrets = secret_specs(config.broker.uri_env.as_ref(), extra);
    let (operator_group, socket_access) = raw
        .api
        .map_or((None, None), |api| (api.operator_group, api.socket_access));
    if let Some(access) = socket_access {
        match access.get_ref().as_str() {
            "owner" => config.socket_access = crate::api::SocketAccess::Owner,
            "all-users" => config.socket_access = crate::api::SocketAccess::AllUsers,
            _ => bad(
                access.span(),
                "`api.socket_access` is \"owner\" or \"all-users\"".to_owned(),
            ),
        }
    }
    if let Some(group) = operator_group {
        let name = group.get_ref();
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if valid {
            config.operator_group = Some(name.clone());
        } else {
            bad(
                group.span(),
                "`api.operator_group` must name a group (letters, digits, `.`, `_`, `-`)"
                    .to_owned(),
            );
        }
    }
    if let Some(roster) = raw.roster {
        let seconds = |value: Option<Spanned<u64>>,
                       default: std::time::Duration,
                       bad: &mut dyn FnMut(std::ops::Range<usize>, String),
                       name: &str| {
            match value {
                Some(v) if (1..=3600).contains(v.get_ref()) => {
                    std::time::Duration::from_secs(*v.get_ref())
                }
                Some(v) => {
                    bad(v.span(), format!("`roster.{name}` must be from 1 to 3600"));
                    default
                }
                None => default,
            }
        };
        let defaults = config.roster;
        config.roster.beat = seconds(roster.beat_secs, defaults.beat, &mut bad, "beat_secs");
        config.roster.suspect_after = seconds(
            roster.suspect_secs,
            defaults.suspect_after,
            &mut bad,
            "suspect_secs",
        );
        config.roster.reap_after =
            seconds(roster.reap_secs, defaults.reap_after, &mut bad, "reap_secs");
        if !(config.roster.beat < config.roster.suspect_after
            && config.roster.suspect_after < config.roster.reap_after)
        {
            bad(
                0..0,
                "`roster` needs beat_secs < suspect_secs < reap_secs".to_owned(),
            );
        }
    }
    for peer in raw.peer {
        match PublicKey::parse(peer.pubkey.get_ref()) {
            Ok(key) => config
                .peers
                .pin(peer.fleet.get_ref(), peer.host.get_ref(), key),
            Err(_) => bad(
                peer.pubkey.span(),
                format!(
                    "`peer.pubkey` of `{}/{}` is not an ed25519 public key (`ed25519:` and 32 bytes of base64; `fleetd key show` prints it)",
                    peer.fleet.get_ref(),
                    peer.host.get_ref()
                ),
            ),
        }
    }
    for lead in raw.lead {
        let valid = |text: &str| {
            !text.is_empty()
                && text.len() <= 64
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !valid(lead.name.get_ref()) {
            bad(
                lead.name.span(),
                "`lead.name` is 1-64 of [A-Za-z0-9._-] (the agent's name on this host)".to_owned(),
            );
        }
        if !valid(lead.profile.get_ref()) {
            bad(
                lead.profile.span(),
                "`lead.profile` names a profile of this host's policy".to_owned(),
            );
        }
        if config.leads.iter().any(|l| l.name == *lead.name.get_ref()) {
            bad(lead.name.span(), "two leads share this name".to_owned());
        }
        config.leads.push(Lead {
            name: lead.name.into_inner(),
            profile: lead.profile.into_inner(),
            env: lead.env,
            cwd: lead.cwd,
        });
    }
    if diagnostics.is_empty() {
        Ok(config)
    } else {
        Err(diagnostics)
    }
}

fn valid_label(text: &str, allow_upper: bool) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'_' | b'-')
                || (allow_upper && (b.is_ascii_uppercase() || b == b'.'))
        })
}

fn valid_env_name(text: &str) -> bool {
    let mut bytes = text.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}
