//! argv → [`Command`], and the exit codes. The only module that prints.
//!
//! Imports: `api` (its client), `audit`, `broker`, `daemon`, `config`, `policy`, `route`,
//! `sandbox`, `secret`, `scrub`, `wire`.

mod audit;
mod broker;
mod config_check;
pub mod exit;
mod key;
mod local;
mod output;
mod policy;
mod policy_diff;
mod policy_load;
mod run;
mod sandbox;
mod scrub;
mod secret;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::LogFormat;
pub use output::Output;

/// fleetd: a per-host gateway that lets AI coding agents on several hosts work together through
/// one AMQP broker, without any host learning another's terminals or credentials.
#[derive(Debug, Parser)]
#[command(name = "fleetd", version, about, long_about = None)]
pub struct Cli {
    /// Config file (default: $FLEETD_CONFIG, then the search order in docs/configuration.md).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Act for the unit instance fleetd@NAME: its config (/etc/fleetd/fleetd.toml), socket
    /// (/run/fleetd/NAME), state and audit log (/var/lib/fleetd/NAME) and credentials
    /// (/etc/fleetd/credentials/NAME), not the caller's own directories.
    #[arg(long, global = true, value_name = "NAME", env = "FLEETD_INSTANCE")]
    pub instance: Option<String>,

    /// Log format, overriding the config.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormatArg>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host daemon (single-host mode on the embedded defaults when no config exists).
    Run,
    /// Filter stdin to stdout through the scrubber (flushes when input goes idle).
    Scrub {
        /// File of `NAME=VALUE` lines whose values are treated as held secrets.
        #[arg(long, value_name = "FILE")]
        known: Option<PathBuf>,
    },
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Secret commands (values are never printed).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Spawn policy: check, explain, test, diff, schema.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Broker: least-privilege grants and the contract suite.
    #[command(subcommand)]
    Broker(broker::BrokerCommand),
    /// The Landlock self-sandbox: probe what `fleetd run` may reach.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// This host's signing key: create it, show its public half.
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Ask the running daemon how it is (host, broker link).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The federated roster: this host and every peer heard from, with their agents.
    Roster {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The audit log.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Send a message to an agent by its global id (local, or through the broker).
    Send {
        /// The target agent's global id.
        to: String,
        /// The text (sanitised and scrubbed before it is typed into a pane).
        text: String,
        /// The sending agent's global id.
        #[arg(long)]
        from: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the primary agent's MCP tools on stdin/stdout (roster, send, spawn, inbox_pull,
    /// inbox_ack, delivery_status), bridged to the running daemon.
    Mcp {
        /// The primary's agent name on this host (its global id stays the same).
        #[arg(long, default_value = "primary")]
        agent: String,
    },
    /// Launch a profile through this host's spawn pipeline (policy, pane, readiness gate).
    Spawn {
        /// The profile.
        #[arg(long)]
        profile: String,
        /// The host to launch on (default: this one); another host gets a signed spawn request
        /// over the broker and its policy decides.
        #[arg(long)]
        host: Option<String>,
        /// That host's fleet (when the roster alone does not tell).
        #[arg(long)]
        fleet: Option<String>,
        /// A variable the grant lets requests set (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Working directory relative to the profile's first root.
        #[arg(long)]
        cwd: Option<String>,
        /// The agent's name on this host.
        #[arg(long)]
        label: Option<String>,
        /// The local agent (global id) the new agent answers to: its spawner, which may message
        /// it, and hear from it, with no `[[message]]` rule (default: none — the operator).
        #[arg(long = "for", value_name = "AGENT")]
        for_agent: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where a message sent from this host is: queued, delivered, acknowledged or failed.
    Delivery {
        /// The message id `fleetd send` printed.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Local agents whose messages are held for pulling (the primary).
    Agent {
        /// What to do.
        #[command(subcommand)]
        command: local::AgentCommand,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Messages held for the primary.
    Inbox {
        /// What to do.
        #[command(subcommand)]
        command: local::InboxCommand,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
    },
}

/// `fleetd config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load the config and report every problem with file:line:column.
    Check,
}

/// `fleetd secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Read a value from stdin (without echo on a terminal) into the OS keyring.
    Set {
        /// The secret's name (e.g. `broker-uri`).
        name: String,
    },
    /// Say, for each configured secret, which source it resolves from (never the value).
    Check,
    /// Delete a secret from the OS keyring.
    Delete {
        /// The secret's name.
        name: String,
    },
}

/// `pane-init`: `-- ARGV` runs the agent under the init; `--sandbox PLAN -- ARGV` runs it in
/// its sandbox (bubblewrap's init is then the agent's).
fn pane_init(args: Vec<std::ffi::OsString>) -> ExitCode {
    const USAGE: &str = "usage: pane-init [--sandbox PLAN] -- ARGV";
    let fail = |error: &dyn std::fmt::Display| {
        Output::default().note(&crate::pane::init::failure(error));
        exit::code(127)
    };
    let Some(split) = args.iter().position(|a| a == "--") else {
        return fail(&USAGE);
    };
    let (options, argv) = args.split_at(split);
    let argv = argv.get(1..).unwrap_or_default();
    let options: Vec<&str> = options.iter().filter_map(|o| o.to_str()).collect();
    match options.as_slice() {
        [] => match crate::pane::init::run(argv) {
            Ok(status) => ExitCode::from(status),
            Err(error) => fail(&error),
        },
        [crate::pane::SANDBOX_OPTION, plan] => fail(&crate::sandbox::agent::enter(plan, argv)),
        _ => fail(&USAGE),
    }
}

/// Parses argv and runs the command.
pub fn main() -> ExitCode {
    // The pane's init (`FLEETD pane-init [OPTIONS] -- ARGV`, docs/panes.md) is what the
    // multiplexer runs first in every pane fleetd launches: taken before the parser, so that no
    // option, config or environment of fleetd's applies to it and the agent's argv is passed on
    // verbatim.
    let mut args = std::env::args_os().skip(1);
    if args
        .next()
        .is_some_and(|a| a == crate::pane::init::SUBCOMMAND)
    {
        return pane_init(args.collect());
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            // clap's own rendering: help, version or a usage error; it holds no secret.
            let _ = error.print();
            return exit::code(code);
        }
    };
    let out = Output::default();
    if let Some(name) = &cli.instance {
        if let Err(reason) = crate::config::use_instance(name) {
            out.note(&format!("error: --instance: {reason}"));
            return exit::code(exit::USAGE);
        }
        crate::secret::use_credentials_dir(
            std::path::Path::new("/etc/fleetd/credentials").join(name),
        );
    }
    match cli.command {
        Command::Run => run::run(&cli.config, cli.log_format.map(Into::into), &out),
        Command::Scrub { ref known } => scrub::run(known.as_deref(), &out),
        Command::Config(ConfigCommand::Check) => config_check::run(cli.config.as_deref(), &out),
        Command::Secret(ref command) => secret::run(command, cli.config.as_deref(), &out),
        Command::Policy(ref command) => policy::run(command, cli.config.as_deref(), &out),
        Command::Broker(ref command) => broker::run(command, cli.config.as_deref(), &out),
        Command::Key(ref command) => key::run(command, cli.config.as_deref(), &out),
        Command::Sandbox(ref command) => sandbox::run(command, cli.config.as_deref(), &out),
        Command::Audit(ref command) => audit::run(command, cli.config.as_deref(), &out),
        Command::Status { json } => local::status(cli.config.as_deref(), json, &out),
        Command::Roster { json } => local::roster(cli.config.as_deref(), json, &out),
        Command::Send {
            ref to,
            ref text,
            ref from,
            json,
        } => local::send(
            cli.config.as_deref(),
            (to, text, from.as_deref()),
            json,
            &out,
        ),
        Command::Mcp { ref agent } => local::mcp(cli.config.as_deref(), agent, &out),
        Command::Spawn {
            ref profile,
            ref host,
            ref fleet,
            ref env,
            ref cwd,
            ref label,
            ref for_agent,
            json,
        } => local::spawn(
            cli.config.as_deref(),
            &local::SpawnArgs {
                profile,
                host: host.as_deref(),
                fleet: fleet.as_deref(),
                env,
                cwd: cwd.as_deref(),
                label: label.as_deref(),
                for_agent: for_agent.as_deref(),
            },
            json,
            &out,
        ),
        Command::Delivery { ref id, json } => {
            local::delivery(cli.config.as_deref(), id, json, &out)
        }
        Command::Agent { ref command, json } => {
            local::agent(command, cli.config.as_deref(), json, &out)
        }
        Command::Inbox { ref command, json } => {
            local::inbox(command, cli.config.as_deref(), json, &out)
        }
    }
}

/// Builds a tokio runtime from `builder`; on failure reports it and gives the exit code.
fn runtime(
    builder: &mut tokio::runtime::Builder,
    out: &Output,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|error| {
        out.error(&error);
        exit::code(exit::FAILED)
    })
}
