//! `fleetd mcp`: a stdio MCP server (rmcp) for the primary agent, bridging to the local API.
//! It registers the primary as a local agent (by name, so its global id is stable), sends as it,
//! and pulls what is held for it. Every tool result passes through the scrubber before it
//! reaches the primary.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::Client;
use super::request::{Request, SpawnAsk};
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

/// `roster`'s answer: every host heard from, this one first.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct RosterOut {
    /// The hosts.
    pub hosts: Vec<RosterHost>,
}

/// One host in the roster.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct RosterHost {
    /// Its fleet.
    pub fleet: String,
    /// Its name.
    pub host: String,
    /// `alive`, or `suspect` (silent for a while).
    pub state: String,
    /// Its agents, as it last announced them.
    pub agents: Vec<RosterAgent>,
}

/// One agent in the roster.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct RosterAgent {
    /// Its global id: the target of `send`.
    pub id: String,
    /// Its name on its host.
    pub name: String,
    /// The profile it runs.
    pub profile: String,
    /// `starting`, `ready`, `busy`, `blocked`, `exited` or `down`.
    pub status: String,
    /// Since when, Unix milliseconds.
    pub since: i64,
}

/// `send`'s answer.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct SendOut {
    /// The message id, for `delivery_status`.
    pub id: String,
    /// `local` (an agent of this host) or `broker`.
    pub route: String,
}

/// `spawn`'s answer when the agent started (a refusal or failure is a tool error with reasons).
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct SpawnOut {
    /// `started`.
    pub outcome: String,
    /// The new agent's global id.
    pub agent: Option<String>,
    /// Its name on its host.
    #[serde(default)]
    pub name: Option<String>,
    /// The host it runs on (another host's spawn).
    #[serde(default)]
    pub host: Option<String>,
    /// That host's fleet (another host's spawn).
    #[serde(default)]
    pub fleet: Option<String>,
    /// The request's message id (another host's spawn).
    #[serde(default)]
    pub request: Option<String>,
    /// Notes from the deciding host (empty when started).
    #[serde(default)]
    pub reasons: Vec<String>,
}

/// `inbox_pull`'s answer.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct PullOut {
    /// Held messages, oldest first: each with `id`, `kind`, `origin` (fleet, host), `to`,
    /// `created_ms` and `body` (a message's `text`, or a spawn reply).
    pub messages: Vec<Value>,
}

/// `inbox_ack`'s answer.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct AckOut {
    /// Whether the message was held (false: already acknowledged, or never held).
    pub acknowledged: bool,
}

/// `delivery_status`'s answer.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct DeliveryOut {
    /// The target agent.
    pub to: String,
    /// The local agent that sent it.
    #[serde(default)]
    pub from: Option<String>,
    /// The fleet and host it was sent to.
    pub dest: Value,
    /// `queued`, `delivered`, `acknowledged`, `failed` or `refused`.
    pub state: String,
    /// Whether the broker confirmed it (`false`: still in this host's outbox).
    pub in_broker: bool,
    /// Why it failed or was refused.
    #[serde(default)]
    pub reason: Option<String>,
    /// When this state was reached, Unix milliseconds.
    pub at_ms: i64,
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
    async fn roster(&self) -> Result<Json<RosterOut>, String> {
        self.ask(Request::Roster {}).await
    }

    /// Send a message to an agent by global id; returns the message id to follow with `delivery_status`.
    #[tool(name = "send")]
    async fn send(&self, Parameters(p): Parameters<SendParams>) -> Result<Json<SendOut>, String> {
        self.ask(Request::Send {
            to: message_or_agent_id(&p.to, "to")?,
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
    ) -> Result<Json<SpawnOut>, String> {
        let reply = self
            .request(Request::Spawn(SpawnAsk {
                profile: p.profile,
                env: p.env.unwrap_or_default(),
                cwd: p.cwd,
                label: p.label,
                host: p.host,
                fleet: p.fleet,
                // The primary is the new agent's spawner: it may message it and hear back.
                for_agent: Some(self.agent),
            }))
            .await?;
        if reply.get("outcome").and_then(Value::as_str) != Some("started") {
            return Err(self.scrubber.scrub(&format!(
                "spawn {}: {}",
                reply
                    .get("outcome")
                    .and_then(Value::as_str)
                    .unwrap_or("not started"),
                reply
            )));
        }
        self.typed(reply)
    }

    /// Messages held for the primary, oldest first; they are offered again until `inbox_ack`.
    #[tool(name = "inbox_pull")]
    async fn inbox_pull(
        &self,
        Parameters(p): Parameters<PullParams>,
    ) -> Result<Json<PullOut>, String> {
        let limit = p.limit;
        if limit.is_some_and(|l| !(1..=100).contains(&l)) {
            return Err("`limit` must be 1-100 (default 10)".to_owned());
        }
        let wait = Duration::from_secs(p.wait_secs.unwrap_or(0));
        if wait > MAX_WAIT {
            return Err(format!(
                "`wait_secs` must be 0-{} (default 0)",
                MAX_WAIT.as_secs()
            ));
        }
        // The daemon waits: the answer comes as soon as a message is held.
        let reply = self
            .request(Request::HeldPull {
                limit,
                agent: Some(self.agent),
                wait_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            })
            .await?;
        self.typed(reply)
    }

    /// Acknowledge a held message: it is not offered again, and its sender learns it.
    #[tool(name = "inbox_ack")]
    async fn inbox_ack(&self, Parameters(p): Parameters<IdParams>) -> Result<Json<AckOut>, String> {
        self.ask(Request::HeldAck {
            id: message_or_agent_id(&p.id, "id")?,
        })
        .await
    }

    /// Where a sent message is: queued, delivered, acknowledged, or failed with the reason.
    #[tool(name = "delivery_status")]
    async fn delivery_status(
        &self,
        Parameters(p): Parameters<IdParams>,
    ) -> Result<Json<DeliveryOut>, String> {
        self.ask(Request::Delivery {
            id: message_or_agent_id(&p.id, "id")?,
        })
        .await
    }
}

impl PrimaryTools {
    /// One request to the daemon; its reply as the tool's typed answer, or its error, scrubbed.
    async fn ask<T: DeserializeOwned>(&self, request: Request) -> Result<Json<T>, String> {
        let reply = self.request(request).await?;
        self.typed(reply)
    }

    /// `reply`, every string scrubbed, as the tool's typed answer.
    fn typed<T: DeserializeOwned>(&self, reply: Value) -> Result<Json<T>, String> {
        let clean = super::scrubbed(&self.scrubber, reply);
        serde_json::from_value(clean.clone())
            .map(Json)
            .map_err(|e| format!("fleetd answered in an unexpected shape ({e}): {clean}"))
    }

    async fn request(&self, request: Request) -> Result<Value, String> {
        let reply = self.client.ask(&request).await.map_err(|e| {
            self.scrubber.scrub(&format!(
                "cannot reach fleetd at `{}`: {e}",
                self.client.socket().display()
            ))
        })?;
        match reply.get("error").and_then(Value::as_str) {
            Some(error) => Err(self.scrubber.scrub(error)),
            None => Ok(reply),
        }
    }
}

/// `text` as a global id (of an agent or a message), or the tool error saying which parameter.
fn message_or_agent_id(text: &str, param: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text.trim()).map_err(|_| format!("`{param}` must be an id (a UUID)"))
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
            let id = reply
                .get("id")
                .and_then(Value::as_str)
                .and_then(|id| Uuid::parse_str(id).ok());
            match (id, reply.get("error")) {
                (Some(id), _) => id,
                (None, error) => {
                    return Err(McpError::Register(
                        error.map_or("no id".to_owned(), ToString::to_string),
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
