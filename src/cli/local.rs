//! Commands that ask the running daemon over its local socket: `status`, `roster`, `send`,
//! `delivery`, `agent`, `inbox`.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use super::{Output, exit};
use crate::api::{self, Request};
use crate::config::Config;
use crate::mailbox::HeldBody;
use crate::route::SpawnAsk;
use crate::route::reply;
use crate::wire::{DeliveryState, SpawnOutcome};

/// `fleetd inbox …`: messages held for the primary.
#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Show held messages, oldest first; they stay until acknowledged.
    Pull {
        /// At most this many (1–100).
        #[arg(long, default_value_t = 10)]
        limit: u64,
        /// Only those for this local agent (its global id).
        #[arg(long)]
        agent: Option<String>,
        /// With `--agent` and nothing held: wait up to this many seconds (0–30) and show
        /// what arrives as soon as it does.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=30))]
        wait: u64,
    },
    /// Acknowledge a held message: it is not offered again.
    Ack {
        /// The message id.
        id: String,
    },
}

/// `fleetd agent …`: local mailbox agents.
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Register a local agent by name (or find it) and print its global id.
    Open {
        /// Its name on this host.
        name: String,
    },
    /// Clear the prompt a pane agent is blocked on, when it is not the agent's (written onto
    /// its terminal by someone else): its held messages are typed again. `fleetd roster` shows
    /// the line.
    Unblock {
        /// The agent's global id.
        id: String,
    },
}

/// `text` (the argument `what`) as a global id, or exit 2 after saying so.
fn id_arg(text: &str, what: &str, out: &Output) -> Result<Uuid, ExitCode> {
    Uuid::parse_str(text.trim()).map_err(|_| {
        out.note(&format!(
            "error: {what} must be an id (a UUID), not `{text}`"
        ));
        exit::code(exit::USAGE)
    })
}

/// The config and a single-threaded runtime, or the exit code after reporting why not.
fn config_and_runtime(
    config: Option<&Path>,
    out: &Output,
) -> Result<(Config, tokio::runtime::Runtime), ExitCode> {
    let config = Config::load(config).map_err(|error| {
        out.error(&error);
        exit::code(exit::USAGE)
    })?;
    let runtime = super::runtime(&mut tokio::runtime::Builder::new_current_thread(), out)?;
    Ok((config, runtime))
}

/// Sends `request` and prints its reply, of type `T` (JSON, or through `render`); exit 1 on an
/// error reply.
pub(super) fn ask<T: DeserializeOwned>(
    config: Option<&Path>,
    request: Request,
    json_out: bool,
    out: &Output,
    render: fn(&T) -> Vec<String>,
) -> ExitCode {
    ask_with(config, request, json_out, out, render, |_| true)
}

/// [`ask`], exiting 1 also when `ok` says the reply reports a failure.
pub(super) fn ask_with<T: DeserializeOwned>(
    config: Option<&Path>,
    request: Request,
    json_out: bool,
    out: &Output,
    render: fn(&T) -> Vec<String>,
    ok: fn(&T) -> bool,
) -> ExitCode {
    let (config, runtime) = match config_and_runtime(config, out) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let client = api::Client::from_env(&config.paths.runtime);
    let reply = match runtime.block_on(client.ask(&request)) {
        Ok(reply) => reply,
        Err(error) => {
            let hint = match crate::config::instance() {
                Some(name) => {
                    format!("is fleetd@{name} running? (`systemctl status fleetd@{name}`)")
                }
                None => "is `fleetd run` running as this user? Under the unit, add \
                         `--instance NAME` (fleetd@NAME's socket is /run/fleetd/NAME)"
                    .to_owned(),
            };
            out.note(&format!(
                "error: cannot reach fleetd at `{}`: {error}\n  {hint}",
                client.socket().display()
            ));
            return exit::code(exit::FAILED);
        }
    };
    if let Some(error) = reply.get("error").and_then(Value::as_str) {
        out.note(&format!("error: {error}"));
        return exit::code(exit::FAILED);
    }
    let typed = match T::deserialize(&reply) {
        Ok(typed) => typed,
        Err(error) => {
            out.note(&format!(
                "error: fleetd answered in an unexpected shape ({error}): {reply}"
            ));
            return exit::code(exit::FAILED);
        }
    };
    if json_out {
        out.line(&serde_json::to_string_pretty(&reply).unwrap_or_else(|_| reply.to_string()));
    } else {
        for line in render(&typed) {
            out.line(&line);
        }
    }
    exit::code(if ok(&typed) { exit::OK } else { exit::FAILED })
}

pub(super) fn status(config: Option<&Path>, json_out: bool, out: &Output) -> ExitCode {
    ask(
        config,
        Request::Status {},
        json_out,
        out,
        |reply: &reply::Status| {
            vec![
                format!("host: {}", reply.host),
                reply.broker.clone(),
                reply.sandbox.clone(),
            ]
        },
    )
}

pub(super) fn roster(config: Option<&Path>, json_out: bool, out: &Output) -> ExitCode {
    ask(
        config,
        Request::Roster {},
        json_out,
        out,
        |reply: &reply::Roster| {
            let mut lines = vec![format!(
                "{:<16} {:<20} {:<8} {}",
                "FLEET", "HOST", "STATE", "AGENTS"
            )];
            for host in &reply.hosts {
                let agents: Vec<String> = host
                    .agents
                    .iter()
                    .map(|a| {
                        let why = a
                            .why
                            .as_deref()
                            .map_or(String::new(), |why| format!(": {why}"));
                        format!("{} ({}, {}{why})", a.name, a.profile, a.status)
                    })
                    .collect();
                lines.push(format!(
                    "{:<16} {:<20} {:<8} {}",
                    host.fleet,
                    host.host,
                    host.state.as_str(),
                    if agents.is_empty() {
                        "-".to_owned()
                    } else {
                        agents.join(", ")
                    }
                ));
            }
            lines
        },
    )
}

pub(super) fn inbox(
    command: &InboxCommand,
    config: Option<&Path>,
    json_out: bool,
    out: &Output,
) -> ExitCode {
    match command {
        InboxCommand::Pull { limit, agent, wait } => ask(
            config,
            Request::HeldPull {
                limit: Some(*limit),
                wait_ms: Some(wait.saturating_mul(1000)),
                agent: match agent
                    .as_deref()
                    .map(|a| id_arg(a, "--agent", out))
                    .transpose()
                {
                    Ok(agent) => agent,
                    Err(code) => return code,
                },
            },
            json_out,
            out,
            |reply: &reply::Pulled| {
                if reply.messages.is_empty() {
                    return vec!["no held messages".to_owned()];
                }
                reply
                    .messages
                    .iter()
                    .map(|m| {
                        let text = match &m.body {
                            HeldBody::Message(message) => message.text.clone(),
                            HeldBody::SpawnReply(r) => format!(
                                "request {}: {}{}",
                                r.request,
                                r.outcome.as_str(),
                                r.agent.map_or(String::new(), |a| format!(" (agent {a})"))
                            ),
                            HeldBody::SpawnRequest(r) => format!("profile {}", r.profile),
                        };
                        format!(
                            "{}  {}/{}  {}: {}",
                            m.id,
                            m.origin.fleet,
                            m.origin.host,
                            m.kind().as_str(),
                            text
                        )
                    })
                    .collect()
            },
        ),
        InboxCommand::Ack { id } => ask(
            config,
            Request::HeldAck {
                id: match id_arg(id, "ID", out) {
                    Ok(id) => id,
                    Err(code) => return code,
                },
            },
            json_out,
            out,
            |reply: &reply::Acked| {
                vec![if reply.acknowledged {
                    "acknowledged".to_owned()
                } else {
                    "no such held message".to_owned()
                }]
            },
        ),
    }
}

pub(super) fn send(
    config: Option<&Path>,
    (to, text, from): (&str, &str, Option<&str>),
    json_out: bool,
    out: &Output,
) -> ExitCode {
    let ids = (
        id_arg(to, "AGENT", out),
        from.map(|f| id_arg(f, "--from", out)).transpose(),
    );
    let (Ok(to), Ok(from)) = ids else {
        return exit::code(exit::USAGE);
    };
    let request = Request::Send {
        to,
        text: text.to_owned(),
        from,
    };
    ask(config, request, json_out, out, |reply: &reply::Sent| {
        vec![format!(
            "{}  (route: {}; `fleetd delivery ID` follows it)",
            reply.id,
            reply.route.as_str()
        )]
    })
}

pub(super) fn delivery(config: Option<&Path>, id: &str, json_out: bool, out: &Output) -> ExitCode {
    let id = match id_arg(id, "ID", out) {
        Ok(id) => id,
        Err(code) => return code,
    };
    ask(
        config,
        Request::Delivery { id },
        json_out,
        out,
        |reply: &reply::Delivery| {
            let mut line = reply.state.as_str().to_owned();
            if reply.state == DeliveryState::Queued {
                line.push_str(if reply.in_broker {
                    " (in the broker)"
                } else {
                    " (in the outbox, waiting for the broker)"
                });
            }
            if let Some(reason) = &reply.reason {
                line.push_str(&format!(": {reason}"));
            }
            vec![line]
        },
    )
}

pub(super) fn agent(
    command: &AgentCommand,
    config: Option<&Path>,
    json_out: bool,
    out: &Output,
) -> ExitCode {
    match command {
        AgentCommand::Open { name } => ask(
            config,
            Request::AgentOpen { name: name.clone() },
            json_out,
            out,
            |reply: &reply::Opened| vec![reply.id.to_string()],
        ),
        AgentCommand::Unblock { id } => {
            let id = match id_arg(id, "ID", out) {
                Ok(id) => id,
                Err(code) => return code,
            };
            ask(
                config,
                Request::AgentUnblock { id },
                json_out,
                out,
                |reply: &reply::Unblocked| vec![format!("cleared: `{}`", reply.dismissed)],
            )
        }
    }
}

/// What `fleetd spawn` asks for.
pub(super) struct SpawnArgs<'a> {
    pub(super) profile: &'a str,
    pub(super) host: Option<&'a str>,
    pub(super) fleet: Option<&'a str>,
    pub(super) env: &'a [String],
    pub(super) cwd: Option<&'a str>,
    pub(super) label: Option<&'a str>,
    pub(super) for_agent: Option<&'a str>,
}

pub(super) fn spawn(
    config: Option<&Path>,
    args: &SpawnArgs<'_>,
    json_out: bool,
    out: &Output,
) -> ExitCode {
    let mut env = std::collections::BTreeMap::new();
    for pair in args.env {
        let Some((name, value)) = pair.split_once('=') else {
            out.note(&format!(
                "error: `--env` takes NAME=VALUE, not `{name}`",
                name = pair.split('=').next().unwrap_or("")
            ));
            return exit::code(exit::USAGE);
        };
        env.insert(name.to_owned(), value.to_owned());
    }
    let for_agent = match args.for_agent.map(|a| id_arg(a, "--for", out)).transpose() {
        Ok(for_agent) => for_agent,
        Err(code) => return code,
    };
    let request = Request::Spawn(SpawnAsk {
        profile: args.profile.to_owned(),
        env,
        cwd: args.cwd.map(str::to_owned),
        label: args.label.map(str::to_owned),
        host: args.host.map(str::to_owned),
        fleet: args.fleet.map(str::to_owned),
        for_agent,
    });
    ask_with(
        config,
        request,
        json_out,
        out,
        |reply: &reply::Spawned| {
            let agent = reply
                .agent
                .map_or("?".to_owned(), |agent| agent.to_string());
            match (reply.outcome, &reply.name, &reply.host) {
                (SpawnOutcome::Started, Some(name), _) => {
                    vec![format!("started {name} (agent {agent})")]
                }
                (SpawnOutcome::Started, None, host) => vec![format!(
                    "started on {} (agent {agent})",
                    host.as_deref().unwrap_or("this host")
                )],
                (outcome, ..) => vec![format!(
                    "{}: {}",
                    outcome.as_str(),
                    reply.reasons.join("; ")
                )],
            }
        },
        |reply| reply.outcome == SpawnOutcome::Started,
    )
}

pub(super) fn mcp(config: Option<&Path>, agent: &str, out: &Output) -> ExitCode {
    let (config, runtime) = match config_and_runtime(config, out) {
        Ok(both) => both,
        Err(code) => return code,
    };
    // stdout carries the MCP session; diagnostics go to stderr.
    match runtime.block_on(api::mcp::serve(
        api::Client::from_env(&config.paths.runtime),
        agent,
        out.scrubber().clone(),
    )) {
        Ok(()) => exit::code(exit::OK),
        Err(error) => {
            out.error(&error);
            exit::code(exit::FAILED)
        }
    }
}
