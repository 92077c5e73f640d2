//! `fleetd mcp`: a stdio MCP server (rmcp) for the primary agent, bridging to the local API.
//! It registers the primary as a local agent (by name, so its global id is stable), sends as it,
//! and pulls what is held for it. Every tool result passes through the scrubber before it
//! reaches the primary.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use super::Client;
use super::request::{Request, SpawnAsk};
use crate::route::reply;
use crate::scrub::Scrubber;

/// Longest an `inbox_pull` waits for a message.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// The primary's tools.
#[derive(Clone)]
pub struct PrimaryTools {
    client: Client,
    agent: Uuid,
    scrubber: Scrubber,
    tool_router: ToolRouter<Self>,
}

/// `send`: a message to an agent.
#[derive(Deserialize, JsonSchema)]
pub struct SendParams {
    /// The target agent's global id (from `roster`).
    pub to: String,
    /// The text.
    pub text: String,
}

/// `spawn`: launch a profile on a host.
#[derive(Deserialize, JsonSchema)]
pub struct SpawnParams {
    /// The host (default: this one).
    pub host: Option<String>,
    /// The host's fleet, when the roster alone does not tell.
    pub fleet: Option<String>,
    /// The profile.
    pub profile: String,
    /// Variables the host's policy lets requests set.
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Working directory relative to the profile's root.
    pub cwd: Option<String>,
    /// The new agent's name.
    pub label: Option<String>,
}

/// `inbox_pull`: messages held for the primary.
#[derive(Deserialize, JsonSchema)]
pub struct PullParams {
    /// At most this many (1-100, default 10).
    #[serde(default, deserialize_with = "number_or_numeric_string")]
    #[schemars(range(min = 1, max = 100))]
    pub limit: Option<u64>,
    /// Wait up to this many seconds for a message when none is held (0-30, default 0).
    #[serde(default, deserialize_with = "number_or_numeric_string")]
    #[schemars(range(min = 0, max = 30))]
    pub wait_secs: Option<u64>,
}

/// A whole number given as a JSON number or as a string of digits (`5` or `"5"`: some clients
/// send every argument as a string); anything else is refused with a hint.
fn number_or_numeric_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            serde::de::Error::custom(format!("{n} is not a whole number of 0 or more"))
        }),
        Some(Value::String(text)) => text.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!(
                "\"{text}\" is not a number: give a whole number such as 5"
            ))
        }),
        Some(other) => Err(serde::de::Error::custom(format!(
            "{other} is not a number: give a whole number such as 5"
        ))),
    }
}

/// A message id.
#[derive(Deserialize, JsonSchema)]
pub struct IdParams {
    /// The message id.
    pub id: String,
}

#[tool_router(router = tool_router)]
impl PrimaryTools {
    /// Tools for agent `agent` (global id) through the local API `client` reaches.
    pub fn new(client: Client, agent: Uuid, scrubber: Scrubber) -> PrimaryTools {
        PrimaryTools {
            client,
            agent,
            scrubber,
            tool_router: Self::tool_router(),
        }
    }

    /// The federated roster: every host heard from and its agents (ids, names, status).
    #[tool(name = "roster")]
    async fn roster(&self) -> Result<Json<reply::Roster>, String> {
        self.ask(Request::Roster {}).await
    }

    /// Send a message to an agent by global id; returns the message id to follow with `delivery_status`.
    #[tool(name = "send")]
    async fn send(
        &self,
        Parameters(p): Parameters<SendParams>,
    ) -> Result<Json<reply::Sent>, String> {
        let to = self.id(&p.to, "to")?;
        self.ask(Request::Send {
            to,
            text: p.text,
            from: Some(self.agent),
        })
        .await
    }

    /// Launch a profile on a host (its policy decides); returns the started agent's id. A refused or failed spawn is a tool error with the reasons.
    #[tool(name = "spawn")]
    async fn spawn(
        &self,
        Parameters(p): Parameters<SpawnParams>,
    ) -> Result<Json<reply::Spawned>, String> {
        let spawned: reply::Spawned = self
            .reply(Request::Spawn(SpawnAsk {
                profile: p.profile,
                env: p.env.unwrap_or_default(),
                cwd: p.cwd,
                label: p.label,
                host: p.host,
                fleet: p.fleet,
                // The primary is the new agent's spawner: it may message it and hear back.
                for_agent: Some(self.agent),
            }))
            .await
            .map_err(|e| self.fail(e))?;
        if !spawned.started() {
            return Err(self.fail(ToolError::NotStarted(spawned)));
        }
        Ok(Json(spawned))
    }

    /// Messages held for the primary, oldest first; they are offered again until `inbox_ack`.
    #[tool(name = "inbox_pull")]
    async fn inbox_pull(
        &self,
        Parameters(p): Parameters<PullParams>,
    ) -> Result<Json<reply::Pulled>, String> {
        let limit = p.limit;
        if limit.is_some_and(|l| !(1..=100).contains(&l)) {
            return Err(self.fail(ToolError::Limit));
        }
        let wait = Duration::from_secs(p.wait_secs.unwrap_or(0));
        if wait > MAX_WAIT {
            return Err(self.fail(ToolError::Wait));
        }
        // The daemon waits: the answer comes as soon as a message is held.
        self.ask(Request::HeldPull {
            limit,
            agent: Some(self.agent),
            wait_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
        })
        .await
    }

    /// Acknowledge a held message: it is not offered again, and its sender learns it.
    #[tool(name = "inbox_ack")]
    async fn inbox_ack(
        &self,
        Parameters(p): Parameters<IdParams>,
    ) -> Result<Json<reply::Acked>, String> {
        let id = self.id(&p.id, "id")?;
        self.ask(Request::HeldAck { id }).await
    }

    /// Where a sent message is: queued, delivered, acknowledged, or failed with the reason.
    #[tool(name = "delivery_status")]
    async fn delivery_status(
        &self,
        Parameters(p): Parameters<IdParams>,
    ) -> Result<Json<reply::Delivery>, String> {
        let id = self.id(&p.id, "id")?;
        self.ask(Request::Delivery { id }).await
    }
}

/// A tool's error is, for the MCP client, its text (rmcp's `String` error, marked `isError`):
/// each is made from a [`ToolError`], scrubbed.
impl PrimaryTools {
    /// One request to the daemon: its reply as the tool's typed answer, or its error, scrubbed.
    async fn ask<T: DeserializeOwned>(&self, request: Request) -> Result<Json<T>, String> {
        self.reply(request)
            .await
            .map(Json)
            .map_err(|e| self.fail(e))
    }

    /// One request to the daemon, its reply (every string scrubbed) read as `T`.
    async fn reply<T: DeserializeOwned>(&self, request: Request) -> Result<T, ToolError> {
        let reply = self
            .client
            .ask(&request)
            .await
            .map_err(|e| ToolError::Unreachable {
                socket: self.client.socket().display().to_string(),
                reason: e.to_string(),
            })?;
        if let Some(error) = reply.get("error").and_then(Value::as_str) {
            return Err(ToolError::Daemon(error.to_owned()));
        }
        let clean = super::scrubbed(&self.scrubber, reply);
        T::deserialize(&clean).map_err(|e| ToolError::Shape {
            error: e.to_string(),
            reply: clean.to_string(),
        })
    }

    /// `text` (parameter `param`) as a global id (of an agent or a message), or the tool's
    /// error text.
    fn id(&self, text: &str, param: &'static str) -> Result<Uuid, ToolText> {
        Uuid::parse_str(text.trim()).map_err(|_| self.fail(ToolError::NotAnId(param)))
    }

    /// The tool error's text, scrubbed.
    fn fail(&self, error: ToolError) -> ToolText {
        self.scrubber.scrub(&error.to_string())
    }
}

/// A tool error as the client sees it: rmcp shows a tool's error as its text, so each is made
/// from a [`ToolError`] and scrubbed ([`PrimaryTools::fail`]).
type ToolText = String;

/// Why a tool call failed.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    /// The daemon's socket did not answer.
    #[error("cannot reach fleetd at `{socket}`: {reason}")]
    Unreachable {
        /// The socket.
        socket: String,
        /// Why.
        reason: String,
    },
    /// The daemon answered with an error.
    #[error("{0}")]
    Daemon(String),
    /// The reply is not the operation's reply type.
    #[error("fleetd answered in an unexpected shape ({error}): {reply}")]
    Shape {
        /// What did not fit.
        error: String,
        /// The reply.
        reply: String,
    },
    /// A parameter that must be an id is not.
    #[error("`{0}` must be an id (a UUID)")]
    NotAnId(&'static str),
    /// `limit` out of range.
    #[error("`limit` must be 1-100 (default 10)")]
    Limit,
    /// `wait_secs` out of range.
    #[error("`wait_secs` must be 0-{} (default 0)", MAX_WAIT.as_secs())]
    Wait,
    /// The spawn was refused or failed.
    #[error("spawn {}: {}", .0.outcome.as_str(), serde_json::to_string(.0).unwrap_or_default())]
    NotStarted(reply::Spawned),
}

#[tool_handler(router = self.tool_router, name = "fleetd")]
impl ServerHandler for PrimaryTools {}

/// Why `fleetd mcp` stopped.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The daemon could not register the primary.
    #[error("cannot register the primary agent with fleetd: {0}")]
    Register(String),
    /// The MCP session failed.
    #[error("mcp session: {0}")]
    Session(String),
}

/// Serves MCP on stdin/stdout until the client goes away: inside an agent's pane as that agent
/// (its token), elsewhere as the operator's mailbox `name` (registered if needed).
pub async fn serve(client: Client, name: &str, scrubber: Scrubber) -> Result<(), McpError> {
    let agent = match client.agent() {
        Some(agent) => agent,
        None => {
            let open = Request::AgentOpen {
                name: name.to_owned(),
            };
            let reply = client.ask(&open).await.map_err(|e| {
                McpError::Register(format!(
                    "cannot reach fleetd at `{}`: {e} (is `fleetd run` running? `--config` or \
                     FLEETD_SOCKET names its socket)",
                    client.socket().display()
                ))
            })?;
            match reply::Opened::deserialize(&reply) {
                Ok(opened) => opened.id,
                Err(_) => {
                    return Err(McpError::Register(
                        reply
                            .get("error")
                            .map_or_else(|| format!("no id in {reply}"), ToString::to_string),
                    ));
                }
            }
        }
    };
    let tools = PrimaryTools::new(client, agent, scrubber);
    let running = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Session(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| McpError::Session(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tool's output schema is its reply type's, so what the socket answers, what the
    /// CLI reads and what MCP declares cannot drift apart: the schema's properties are the
    /// reply type's fields, and the route of a send names the three routes there are.
    #[test]
    fn each_tools_output_schema_is_its_reply_types() {
        let tools = PrimaryTools::tool_router().list_all();
        // A JSON schema object's property names, sorted.
        let keys = |schema: &serde_json::Value| -> Vec<String> {
            let mut keys: Vec<String> = schema["properties"]
                .as_object()
                .expect("properties")
                .keys()
                .cloned()
                .collect();
            keys.sort();
            keys
        };
        let properties = |name: &str| {
            let tool = tools.iter().find(|t| t.name == name).expect(name);
            let schema = tool.output_schema.as_ref().expect("an output schema");
            keys(&serde_json::Value::Object((**schema).clone()))
        };
        let fields = |schema: schemars::Schema| keys(schema.as_value());
        for (tool, schema) in [
            ("roster", schemars::schema_for!(reply::Roster)),
            ("send", schemars::schema_for!(reply::Sent)),
            ("spawn", schemars::schema_for!(reply::Spawned)),
            ("inbox_pull", schemars::schema_for!(reply::Pulled)),
            ("inbox_ack", schemars::schema_for!(reply::Acked)),
            ("delivery_status", schemars::schema_for!(reply::Delivery)),
        ] {
            assert_eq!(properties(tool), fields(schema), "{tool}");
        }
        let send = tools.iter().find(|t| t.name == "send").unwrap();
        let text = serde_json::to_string(send.output_schema.as_ref().unwrap()).unwrap();
        for route in ["local", "fleet", "foreign"] {
            assert!(text.contains(&format!("\"{route}\"")), "{text}");
        }
    }
}
