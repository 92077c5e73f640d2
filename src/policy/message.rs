//! The message decision: whether text from another host may reach one local agent. Pure, deny
//! by default, a matching deny beats anything, and every decision names the rules that made it.
//!
//! In order:
//! 1. `no-remote-text`: the agent's profile never receives text from another host (an
//!    interactive shell, or `remote_messages = false`).
//! 2. A `[[deny]]` rule without `env` whose fleets, hosts and profiles match.
//! 3. `spawner`: the sender is who asked for the agent — the same host, and the same agent on it
//!    (or its operator, when no agent asked).
//! 4. `spawned`: the agent asked for the sender (the reply of its spawn request named it).
//! 5. A `[[message]]` rule admitting the sender's fleet and host for the agent's profile.
//! 6. Otherwise `default-deny`.
//!
//! Messages between agents of this host are not decided here: no host boundary is crossed.

use serde_json::Value;

use super::eval::{self, DEFAULT_DENY, Decision, Effect};
use super::model::{Deny, MAILBOX, MessageGrant, PolicySet, RuleId};
use super::names;
use super::request::{Origin, RequestError};

/// The built-in rule of a profile that never receives text from another host.
pub const NO_REMOTE_TEXT: &str = "no-remote-text";
/// The built-in rule that lets an agent's spawner message it.
pub const SPAWNER: &str = "spawner";
/// The built-in rule that lets an agent hear from the agents it spawned.
pub const SPAWNED: &str = "spawned";

/// How a message's sender relates to the local agent it is for, as this host recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sender {
    /// It asked for the agent: the spawn request's host, and the agent on it that asked (or its
    /// operator).
    Spawner,
    /// The agent asked for it: this host's spawn request was answered with the sender's id.
    Spawned,
    /// Neither.
    Other,
}

/// A message from another host for one local agent, as the policy sees it. Never its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageRequest {
    /// The sending host (authenticated: its signature, its exchange).
    pub origin: Origin,
    /// The profile of the agent it is for ([`MAILBOX`] for a mailbox).
    pub profile: String,
    /// How the sender relates to that agent.
    pub sender: Sender,
}

impl MessageRequest {
    /// Checks a parsed JSON message request, as `policy explain` and `policy test` take it:
    /// `{"kind": "message", "origin": {"fleet", "host"}, "profile": P, "sender": "spawner" |
    /// "spawned" | "other"}` (`sender` defaults to `other`).
    pub fn from_value(value: &Value) -> Result<MessageRequest, RequestError> {
        let object = value.as_object().ok_or_else(|| RequestError {
            field: "request".to_owned(),
            message: "must be a JSON object".to_owned(),
        })?;
        let refuse = |field: &str, message: &str| RequestError {
            field: field.to_owned(),
            message: message.to_owned(),
        };
        if let Some(unknown) = object
            .keys()
            .find(|k| !["kind", "origin", "profile", "sender"].contains(&k.as_str()))
        {
            let field = if unknown.len() <= 64 {
                unknown
            } else {
                "request"
            };
            return Err(refuse(field, "unknown field"));
        }
        let origin = object
            .get("origin")
            .ok_or_else(|| refuse("origin", "is required"))?;
        let text = |value: Option<&Value>, field: &str| match value {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(refuse(field, "must be a string")),
            None => Err(refuse(field, "is required")),
        };
        let fleet = text(origin.get("fleet"), "origin.fleet")?;
        let host = text(origin.get("host"), "origin.host")?;
        if origin.as_object().is_some_and(|o| o.len() != 2) {
            return Err(refuse("origin", "has fields other than `fleet` and `host`"));
        }
        if !names::valid_fleet(&fleet) {
            return Err(refuse("origin.fleet", "is not a valid fleet name"));
        }
        if !names::valid_host(&host) {
            return Err(refuse("origin.host", "is not a valid host name"));
        }
        let profile = text(object.get("profile"), "profile")?;
        if !names::valid_id(&profile) {
            return Err(refuse("profile", "is not a valid profile name"));
        }
        let sender = match object.get("sender").map(|v| v.as_str()) {
            None | Some(Some("other")) => Sender::Other,
            Some(Some("spawner")) => Sender::Spawner,
            Some(Some("spawned")) => Sender::Spawned,
            Some(_) => {
                return Err(refuse("sender", "must be `spawner`, `spawned` or `other`"));
            }
        };
        Ok(MessageRequest {
            origin: Origin { fleet, host },
            profile,
            sender,
        })
    }
}

/// Decides whether `request`'s message may reach its agent under `policy`.
pub fn evaluate_message(policy: &PolicySet, request: &MessageRequest) -> Decision {
    let profile = policy.profiles.get(&request.profile);
    if let Some(profile) = profile.filter(|p| !p.remote_messages) {
        let why = if names::interactive_shell(&profile.argv) {
            "runs an interactive shell, which would run it as commands"
        } else {
            "says `remote_messages = false`"
        };
        return decision(
            Effect::Deny,
            NO_REMOTE_TEXT,
            format!(
                "profile `{}` never receives text from another host: it {why}",
                profile.name
            ),
        );
    }
    // A deny about request variables (`env`) does not apply: a message sets none.
    let denies = |d: &Deny| {
        d.env.is_none() && eval::deny_scope_matches(d, &request.origin, &request.profile)
    };
    if let Some(denied) = eval::denied(policy, "message", denies) {
        return denied;
    }
    match request.sender {
        Sender::Spawner => {
            return decision(
                Effect::Allow,
                SPAWNER,
                format!("`{}` asked for this agent", request.origin),
            );
        }
        Sender::Spawned => {
            return decision(
                Effect::Allow,
                SPAWNED,
                format!("this agent asked `{}` for the sender", request.origin),
            );
        }
        Sender::Other => {}
    }
    if profile.is_none() && request.profile != MAILBOX {
        return decision(
            Effect::Deny,
            DEFAULT_DENY,
            format!(
                "this host has no profile `{}` (the agent's profile is gone from the policy)",
                request.profile
            ),
        );
    }
    match policy.messages.iter().find(|m| admits(m, request)) {
        Some(rule) => Decision {
            effect: Effect::Allow,
            rules: vec![rule.id.clone()],
            reasons: vec![format!(
                "message rule `{}` admits `{}` for profile `{}`",
                rule.id, request.origin, request.profile
            )],
        },
        None => decision(
            Effect::Deny,
            DEFAULT_DENY,
            format!(
                "neither the agent's spawner nor an agent it spawned, and no message rule admits `{}` for profile `{}`",
                request.origin, request.profile
            ),
        ),
    }
}

fn decision(effect: Effect, rule: &str, reason: String) -> Decision {
    Decision {
        effect,
        rules: vec![RuleId(rule.to_owned())],
        reasons: vec![reason],
    }
}

fn admits(rule: &MessageGrant, request: &MessageRequest) -> bool {
    rule.fleets.contains(&request.origin.fleet)
        && rule
            .hosts
            .as_ref()
            .is_none_or(|h| h.contains(&request.origin.host))
        && rule.profiles.contains(&request.profile)
}

/// Whether `deny` refuses every message `rule` could admit.
pub(super) fn deny_covers(deny: &Deny, rule: &MessageGrant) -> bool {
    eval::deny_covers_scope(deny, &rule.fleets, rule.hosts.as_ref(), &rule.profiles)
}

/// What `policy explain` and `policy test` decide: a spawn request or a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// A spawn request (`"kind": "spawn"`, or no `kind`).
    Spawn(super::Request),
    /// A message (`"kind": "message"`).
    Message(MessageRequest),
}

impl Ask {
    /// Checks a parsed JSON request of either kind.
    pub fn from_value(value: &Value) -> Result<Ask, RequestError> {
        match value.get("kind") {
            None => super::Request::from_value(value).map(Ask::Spawn),
            Some(Value::String(kind)) if kind == "spawn" => {
                let mut spawn = value.clone();
                if let Some(fields) = spawn.as_object_mut() {
                    fields.remove("kind");
                }
                super::Request::from_value(&spawn).map(Ask::Spawn)
            }
            Some(Value::String(kind)) if kind == "message" => {
                MessageRequest::from_value(value).map(Ask::Message)
            }
            Some(_) => Err(RequestError {
                field: "kind".to_owned(),
                message: "must be `spawn` or `message`".to_owned(),
            }),
        }
    }
}
