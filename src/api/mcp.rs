//! `fleetd mcp`: a stdio MCP server (rmcp) for the primary agent, bridging to the local API.
//! It registers the primary as a local agent (by name, so its global id is stable), sends as it,
//! and pulls what is held for it. Every tool result passes through the scrubber before it
//! reaches the primary.

use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
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
    pub limit: Option<u64>,
    /// Wait up to this many seconds for a message when none is held (0-30, default 0).
    pub wait_secs: Option<u64>,
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
    async fn roster(&self) -> Result<String, String> {
        self.ask(Request::Roster {}).await
    }

    /// Send a message to an agent by global id; returns the message id to follow with `delivery_status`.
    #[tool(name = "send")]
    async fn send(&self, Parameters(p): Parameters<SendParams>) -> Result<String, String> {
        self.ask(Request::Send {
            to: message_or_agent_id(&p.to, "to")?,
            text: p.text,
            from: Some(self.agent),
        })
        .await
    }

    /// Launch a profile on a host (its policy decides); returns started with the agent id, or refused/failed with reasons.
    #[tool(name = "spawn")]
    async fn spawn(&self, Parameters(p): Parameters<SpawnParams>) -> Result<String, String> {
        self.ask(Request::Spawn(SpawnAsk {
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
    }

    /// Messages held for the primary, oldest first; they are offered again until `inbox_ack`.
    #[tool(name = "inbox_pull")]
    async fn inbox_pull(&self, Parameters(p): Parameters<PullParams>) -> Result<String, String> {
        // The daemon bounds it (1-100, 10 when absent).
        let limit = p.limit;
        let wait = Duration::from_secs(p.wait_secs.unwrap_or(0)).min(MAX_WAIT);
        let deadline = Instant::now() + wait;
        loop {
            let reply = self
                .request(Request::HeldPull {
                    limit,
                    agent: Some(self.agent),
                })
                .await?;
            let empty = reply
                .get("messages")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
            if !empty || Instant::now() >= deadline {
                return Ok(self.scrubbed(&reply));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Acknowledge a held message: it is not offered again, and its sender learns it.
    #[tool(name = "inbox_ack")]
    async fn inbox_ack(&self, Parameters(p): Parameters<IdParams>) -> Result<String, String> {
        self.ask(Request::HeldAck {
            id: message_or_agent_id(&p.id, "id")?,
        })
        .await
    }

    /// Where a sent message is: queued, delivered, acknowledged, or failed with the reason.
    #[tool(name = "delivery_status")]
    async fn delivery_status(&self, Parameters(p): Parameters<IdParams>) -> Result<String, String> {
        self.ask(Request::Delivery {
            id: message_or_agent_id(&p.id, "id")?,
        })
        .await
    }
}

impl PrimaryTools {
    /// One request to the daemon; its reply, or its error, scrubbed.
    async fn ask(&self, request: Request) -> Result<String, String> {
        let reply = self.request(request).await?;
        Ok(self.scrubbed(&reply))
    }

    async fn request(&self, request: Request) -> Result<Value, String> {
        let reply = self
            .client
            .ask(&request)
            .await
            .map_err(|e| self.scrubber.scrub(&format!("cannot reach fleetd: {e}")))?;
        match reply.get("error").and_then(Value::as_str) {
            Some(error) => Err(self.scrubber.scrub(error)),
            None => Ok(reply),
        }
    }

    fn scrubbed(&self, reply: &Value) -> String {
        self.scrubber.scrub(&reply.to_string())
    }
}

/// `text` as a global id (of an agent or a message), or the tool error saying which parameter.
fn message_or_agent_id(text: &str, param: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text.trim()).map_err(|_| format!("`{param}` must be an id (a UUID)"))
}

#[tool_handler(router = self.tool_router)]
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
            let reply = client
                .ask(&open)
                .await
                .map_err(|e| McpError::Register(e.to_string()))?;
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
