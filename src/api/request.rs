//! The local API's one request type: what the server parses, and what the CLI and `fleetd mcp`
//! send. One JSON object per line, `op` naming the operation; unknown operations and unknown
//! fields are refused.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::route::SpawnAsk;

/// Most held messages one pull returns.
pub const MAX_PULL: u64 = 100;
/// Held messages a pull returns when it does not say.
pub const DEFAULT_PULL: u64 = 10;
/// Longest a pull waits for a message to arrive, milliseconds.
pub const MAX_PULL_WAIT_MS: u64 = 30_000;

/// One request on the local API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", deny_unknown_fields)]
pub enum Request {
    /// The host, the broker link and the sandbox level.
    #[serde(rename = "status")]
    Status {},
    /// The federated roster (this host's agents included).
    #[serde(rename = "roster")]
    Roster {},
    /// The local mailbox `name` (registered if needed): its global id.
    #[serde(rename = "agent.open")]
    AgentOpen {
        /// Its name on this host.
        name: String,
    },
    /// Sends `text` to agent `to`, as agent `from`.
    #[serde(rename = "send")]
    Send {
        /// The addressee's global id.
        to: Uuid,
        /// The text.
        text: String,
        /// The sender's global id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<Uuid>,
    },
    /// Held messages, oldest first (for one local agent if given).
    #[serde(rename = "held.pull")]
    HeldPull {
        /// At most this many (1–100; 10 when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u64>,
        /// Only those for this local agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<Uuid>,
        /// With an agent and nothing held for it: wait up to this long (at most
        /// [`MAX_PULL_WAIT_MS`]) and answer as soon as a message arrives.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Acknowledges held message `id`.
    #[serde(rename = "held.ack")]
    HeldAck {
        /// The message id.
        id: Uuid,
    },
    /// The delivery state of message `id`, sent from this host.
    #[serde(rename = "delivery")]
    Delivery {
        /// The message id.
        id: Uuid,
    },
    /// Launches a profile here, or asks another host to.
    #[serde(rename = "spawn")]
    Spawn(SpawnAsk),
    /// Clears the prompt local agent `id` is blocked on (the operator's).
    #[serde(rename = "agent.unblock")]
    AgentUnblock {
        /// The agent's global id.
        id: Uuid,
    },
}

/// A request with the capability token it was sent with (a worker's `FLEETD_AGENT_TOKEN`).
#[derive(Debug)]
pub struct Call {
    /// The token, if the caller presented one.
    pub token: Option<SecretString>,
    /// What it asks.
    pub request: Request,
}

/// The field of a request line that carries the token.
const TOKEN_FIELD: &str = "token";

impl Call {
    /// `request`, made with `token` if there is one.
    pub fn new(request: Request, token: Option<SecretString>) -> Call {
        Call { token, request }
    }

    /// Parses one request line: the operation and its fields, plus an optional `token`.
    pub fn parse(line: &[u8]) -> Result<Call, RequestError> {
        let mut fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(line).map_err(|e| malformed(&e))?;
        let token = match fields.remove(TOKEN_FIELD) {
            None => None,
            Some(serde_json::Value::String(text)) => Some(SecretString::from(text)),
            Some(_) => {
                return Err(RequestError::Malformed(
                    "`token` must be a string".to_owned(),
                ));
            }
        };
        let request =
            serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| malformed(&e))?;
        Ok(Call { token, request })
    }

    /// The wire form: one line of JSON.
    pub fn to_line(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(&self.request).unwrap_or_default();
        if let (Some(token), Some(fields)) = (&self.token, value.as_object_mut()) {
            #[expect(
                clippy::disallowed_methods,
                reason = "the token goes to fleetd's own socket, and nowhere else"
            )]
            let text = token.expose_secret().to_owned();
            fields.insert(TOKEN_FIELD.to_owned(), serde_json::Value::String(text));
        }
        let mut bytes = value.to_string().into_bytes();
        bytes.push(b'\n');
        bytes
    }
}

/// Why a request line is not a request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a JSON object with a known `op` and its fields.
    #[error("bad request: {0}")]
    Malformed(String),
}

impl Request {
    /// Parses one request line (without a token).
    pub fn parse(line: &[u8]) -> Result<Request, RequestError> {
        serde_json::from_slice(line).map_err(|e| malformed(&e))
    }

    /// The operation's name on the wire (`send`, `held.pull` …), for refusals and the audit.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Status {} => "status",
            Request::Roster {} => "roster",
            Request::AgentOpen { .. } => "agent.open",
            Request::Send { .. } => "send",
            Request::HeldPull { .. } => "held.pull",
            Request::HeldAck { .. } => "held.ack",
            Request::Delivery { .. } => "delivery",
            Request::Spawn(_) => "spawn",
            Request::AgentUnblock { .. } => "agent.unblock",
        }
    }

    /// How many held messages a pull asks for, within 1–100.
    pub fn pull_limit(limit: Option<u64>) -> usize {
        usize::try_from(limit.unwrap_or(DEFAULT_PULL).clamp(1, MAX_PULL)).unwrap_or(10)
    }

    /// How long a pull may wait for a message (none when absent; at most [`MAX_PULL_WAIT_MS`]).
    pub fn pull_wait(wait_ms: Option<u64>) -> std::time::Duration {
        std::time::Duration::from_millis(wait_ms.unwrap_or(0).min(MAX_PULL_WAIT_MS))
    }
}

/// serde's message (it names the field or variant); the line itself, which may hold anything, is
/// never echoed.
fn malformed(error: &serde_json::Error) -> RequestError {
    let text = error.to_string();
    let first = text.split(" at line ").next().unwrap_or("");
    RequestError::Malformed(first.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_what_clients_sent_before_still_parses() {
        let to = Uuid::now_v7();
        for request in [
            Request::Status {},
            Request::AgentOpen {
                name: "primary".to_owned(),
            },
            Request::Send {
                to,
                text: "hi".to_owned(),
                from: None,
            },
            Request::HeldPull {
                limit: Some(5),
                agent: Some(to),
                wait_ms: Some(1500),
            },
            Request::Spawn(SpawnAsk {
                profile: "worker".to_owned(),
                host: Some("w1".to_owned()),
                ..SpawnAsk::default()
            }),
        ] {
            let line = Call::new(request.clone(), None).to_line();
            assert_eq!(Request::parse(&line).unwrap(), request);
        }
        // Explicit nulls, as the CLI sent them.
        let line = format!(r#"{{"op":"send","to":"{to}","text":"x","from":null}}"#);
        assert!(matches!(
            Request::parse(line.as_bytes()).unwrap(),
            Request::Send { from: None, .. }
        ));
        let pull = br#"{"op":"held.pull","limit":10,"agent":null}"#;
        assert!(Request::parse(pull).is_ok());
    }

    #[test]
    fn unknown_ops_fields_and_malformed_ids_are_refused_without_echoing_the_line() {
        for (line, says) in [
            (r#"{"op":"format-disk"}"#, "unknown variant `format-disk`"),
            (r#"{"op":"status","as":"root"}"#, "unknown field `as`"),
            (r#"{"op":"send","to":"nope","text":"x"}"#, "UUID"),
            (r#"{"op":"send","text":"x"}"#, "missing field `to`"),
            (
                r#"{"op":"spawn","profile":"p","sudo":true}"#,
                "unknown field `sudo`",
            ),
            (r#"{"to":"x"}"#, "missing field `op`"),
            ("not json", "expected"),
        ] {
            let error = Request::parse(line.as_bytes()).unwrap_err().to_string();
            assert!(error.starts_with("bad request: "), "{line}: {error}");
            assert!(error.contains(says), "{line}: {error}");
        }
        let secret = r#"{"op":"send","to":"hunter2-canary","text":"x"}"#;
        let error = Request::parse(secret.as_bytes()).unwrap_err().to_string();
        assert!(!error.contains("hunter2-canary"), "{error}");
    }
}
