//! The policy format, as data: every table and key the format defines. The parser checks files
//! against it (unknown keys, required keys) and `fleetd policy schema` renders it as a JSON
//! Schema, so the two cannot drift apart.

use serde_json::{Map, Value, json};

/// What a key holds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Str,
    StrArray,
    Int {
        min: i64,
        max: i64,
    },
    /// An array of integers, each within the bounds.
    IntArray {
        min: i64,
        max: i64,
    },
    Bool,
    /// A table of string values under arbitrary names.
    StrMap,
    /// A table with the given keys.
    Table(&'static [Field]),
    /// A table of tables under arbitrary names, each with the given keys.
    MapOf(&'static [Field]),
    /// An array of tables (`[[name]]`), each with the given keys.
    ArrayOf(&'static [Field]),
}

/// One key of a table.
#[derive(Debug)]
pub(super) struct Field {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) required: bool,
    pub(super) doc: &'static str,
}

const fn f(name: &'static str, kind: Kind, required: bool, doc: &'static str) -> Field {
    Field {
        name,
        kind,
        required,
        doc,
    }
}

pub(super) const READY: &[Field] = &[
    f(
        "pattern",
        Kind::Str,
        false,
        "regular expression on pane output that means the agent is ready (tmux)",
    ),
    f(
        "input",
        Kind::Str,
        false,
        "regular expression naming the agent's input line: a message is delivered once it left it",
    ),
    f(
        "timeout_secs",
        Kind::Int { min: 1, max: 600 },
        false,
        "how long the readiness gate waits (default 60)",
    ),
    f(
        "settle_secs",
        Kind::Int { min: 0, max: 30 },
        false,
        "how long the ready pattern must keep matching before the agent counts as ready (default 0)",
    ),
    f(
        "accept_dialogs",
        Kind::Bool,
        false,
        "accept startup dialogs automatically (default false: report them)",
    ),
];

pub(super) const SANDBOX: &[Field] = &[
    f(
        "mode",
        Kind::Str,
        false,
        "\"on\" (the default) or \"off\": an agent of a profile that says off runs unconfined, as its user (policy check warns)",
    ),
    f(
        "network",
        Kind::Str,
        false,
        "\"none\" (the default: no IPv4/IPv6 socket), \"loopback\" (its own loopback only) or \"host\"",
    ),
    f(
        "tcp_connect",
        Kind::IntArray { min: 1, max: 65535 },
        false,
        "with network = \"host\": the only TCP ports it may connect to (Landlock; default any)",
    ),
    f(
        "writable",
        Kind::StrArray,
        false,
        "absolute paths it may write beyond its roots (which are always writable)",
    ),
    f(
        "readable",
        Kind::StrArray,
        false,
        "absolute paths it may read that are hidden by default (every home, /run/user, /var/tmp)",
    ),
];

pub(super) const PROFILE: &[Field] = &[
    f("description", Kind::Str, false, "what the profile is for"),
    f(
        "argv",
        Kind::StrArray,
        true,
        "the command to launch; argv[0] is an absolute path",
    ),
    f(
        "roots",
        Kind::StrArray,
        true,
        "working-directory roots (absolute); a request's cwd is relative to the first and must resolve inside one",
    ),
    f(
        "env",
        Kind::StrMap,
        false,
        "fixed environment (names to values; never secrets)",
    ),
    f(
        "secrets",
        Kind::StrMap,
        false,
        "environment names to secret references: credential:NAME, keyring:NAME or env:NAME",
    ),
    f(
        "max_instances",
        Kind::Int { min: 1, max: 1000 },
        false,
        "most instances running at once (default 1)",
    ),
    f("ready", Kind::Table(READY), false, "the readiness gate"),
    f(
        "may_spawn",
        Kind::StrArray,
        false,
        "profiles this profile's agents may request with their own token (each request still goes through the policy)",
    ),
    f(
        "remote_messages",
        Kind::Bool,
        false,
        "may its agents receive text from another host at all (default true; an interactive shell never does: set false or leave it out)",
    ),
    f(
        "sandbox",
        Kind::Table(SANDBOX),
        false,
        "the sandbox its agents start in (default: on, no network, nothing writable but the roots)",
    ),
];

pub(super) const ENV_RULE: &[Field] = &[
    f(
        "pattern",
        Kind::Str,
        true,
        "regular expression the whole value must match (anchored for you)",
    ),
    f(
        "max_len",
        Kind::Int { min: 1, max: 4096 },
        true,
        "longest value in bytes",
    ),
];

pub(super) const RATE: &[Field] = &[
    f(
        "count",
        Kind::Int {
            min: 1,
            max: 100_000,
        },
        true,
        "requests allowed per window",
    ),
    f(
        "per_secs",
        Kind::Int {
            min: 1,
            max: 86_400,
        },
        true,
        "the window in seconds",
    ),
];

pub(super) const GRANT: &[Field] = &[
    f(
        "id",
        Kind::Str,
        true,
        "unique rule id: lowercase letters, digits, `-`",
    ),
    f("description", Kind::Str, false, "why the grant exists"),
    f(
        "fleets",
        Kind::StrArray,
        true,
        "origin fleets (broker vhosts) this grant admits",
    ),
    f(
        "hosts",
        Kind::StrArray,
        false,
        "origin hosts within those fleets (absent: any)",
    ),
    f(
        "profiles",
        Kind::StrArray,
        true,
        "profiles they may request",
    ),
    f(
        "env",
        Kind::MapOf(ENV_RULE),
        false,
        "request environment variables they may set, each with a value pattern and length",
    ),
    f(
        "allow_dangerous",
        Kind::StrArray,
        false,
        "dangerous variable names (LD_*, PATH, …) this grant deliberately allows; each is warned about",
    ),
    f(
        "cwd",
        Kind::Bool,
        false,
        "may a request choose its working directory under the profile's root (default false)",
    ),
    f(
        "max_concurrent",
        Kind::Int { min: 1, max: 1000 },
        false,
        "most instances one origin fleet may run through this grant",
    ),
    f(
        "rate",
        Kind::Table(RATE),
        false,
        "most requests one origin fleet may make through this grant per window",
    ),
];

pub(super) const DENY: &[Field] = &[
    f(
        "id",
        Kind::Str,
        true,
        "unique rule id: lowercase letters, digits, `-`",
    ),
    f(
        "description",
        Kind::Str,
        false,
        "why; shown as the refusal reason",
    ),
    f(
        "fleets",
        Kind::StrArray,
        false,
        "origin fleets it applies to (absent: all)",
    ),
    f(
        "hosts",
        Kind::StrArray,
        false,
        "origin hosts it applies to (absent: all)",
    ),
    f(
        "profiles",
        Kind::StrArray,
        false,
        "profiles it applies to (absent: all)",
    ),
    f(
        "env",
        Kind::StrArray,
        false,
        "applies when the request sets any of these variables (absent: always)",
    ),
];

pub(super) const MESSAGE: &[Field] = &[
    f(
        "id",
        Kind::Str,
        true,
        "unique rule id: lowercase letters, digits, `-`",
    ),
    f("description", Kind::Str, false, "why the rule exists"),
    f(
        "fleets",
        Kind::StrArray,
        true,
        "sender fleets this rule admits",
    ),
    f(
        "hosts",
        Kind::StrArray,
        false,
        "sender hosts within those fleets (absent: any)",
    ),
    f(
        "profiles",
        Kind::StrArray,
        true,
        "profiles whose local agents they may message (`mailbox`: the primary's mailboxes)",
    ),
];

pub(super) const FILE: &[Field] = &[
    f(
        "profile",
        Kind::MapOf(PROFILE),
        false,
        "what may be launched, by name",
    ),
    f(
        "grant",
        Kind::ArrayOf(GRANT),
        false,
        "who may ask for which profiles, with which environment",
    ),
    f(
        "deny",
        Kind::ArrayOf(DENY),
        false,
        "explicit refusals of spawn requests and messages; a matching deny beats any grant",
    ),
    f(
        "message",
        Kind::ArrayOf(MESSAGE),
        false,
        "who on other hosts may message the local agents of which profiles, beyond each agent's spawner",
    ),
];

/// The JSON Schema (draft 2020-12) of one policy file.
pub fn json_schema() -> Value {
    let mut schema = object(FILE);
    if let Value::Object(map) = &mut schema {
        map.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        map.insert(
            "$id".into(),
            json!("https://fleetd.invalid/schema/policy.json"),
        );
        map.insert("title".into(), json!("fleetd policy file"));
    }
    schema
}

fn object(fields: &[Field]) -> Value {
    let mut properties = Map::new();
    for field in fields {
        let mut value = kind(field.kind);
        if let Value::Object(map) = &mut value {
            map.insert("description".into(), json!(field.doc));
        }
        properties.insert(field.name.into(), value);
    }
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.name)
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn kind(kind: Kind) -> Value {
    match kind {
        Kind::Str => json!({"type": "string"}),
        Kind::StrArray => json!({"type": "array", "items": {"type": "string"}}),
        Kind::Int { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
        Kind::IntArray { min, max } => {
            json!({"type": "array", "items": {"type": "integer", "minimum": min, "maximum": max}})
        }
        Kind::Bool => json!({"type": "boolean"}),
        Kind::StrMap => json!({"type": "object", "additionalProperties": {"type": "string"}}),
        Kind::Table(fields) => object(fields),
        Kind::MapOf(fields) => json!({"type": "object", "additionalProperties": object(fields)}),
        Kind::ArrayOf(fields) => json!({"type": "array", "items": object(fields)}),
    }
}
