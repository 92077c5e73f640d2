//! `fleetd broker grants | contract`: set up a fleet's broker access, and prove it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use secrecy::SecretString;
use zeroize::Zeroizing;

use super::{Output, exit};
use crate::broker::topology::QueueType;
use crate::broker::{self, contract, grants};
use crate::config::Config;
use crate::secret::{self, BROKER_URI, BrokerUri, SecretName, SecretSpec};

/// `fleetd broker …`.
#[derive(Debug, Subcommand)]
pub enum BrokerCommand {
    /// Print (or, with --apply, run) the broker commands for a fleet's vhost, exchanges and
    /// admitted fleets, or (--host) for one host's user.
    Grants {
        /// The fleet (vhost `/FLEET`).
        #[arg(long)]
        fleet: String,
        /// An origin fleet this fleet's vhost admits (write on `x.in.ORIGIN` only); repeatable.
        #[arg(long = "admit", value_name = "ORIGIN", conflicts_with = "host")]
        admits: Vec<String>,
        /// A host of the fleet: its own user `FLEET.HOST`, which reaches only its own queues (run
        /// the fleet's grants, without --host, first: they make the vhost and its exchanges).
        #[arg(long)]
        host: Option<String>,
        /// With --host: a fleet that admits this one, whose `x.in.FLEET` the host may write to;
        /// repeatable.
        #[arg(long = "into", value_name = "FLEET", requires = "host")]
        into: Vec<String>,
        /// Also a user `FLEET` shared by every host of the fleet (password needed): it reaches
        /// every host's queues and traffic, so hosts sharing it are not isolated from each
        /// other. For fleets not yet moved to host users.
        #[arg(long, conflicts_with = "host")]
        shared_user: bool,
        /// The broker CLI the printed commands are for.
        #[arg(long, value_enum, default_value_t = ToolArg::Rabbitmqctl)]
        tool: ToolArg,
        /// Run them with rabbitmqctl (a user's password from --password-file or stdin).
        #[arg(long)]
        apply: bool,
        /// A file (e.g. a credential) holding the new user's password; default: stdin. Printed
        /// scripts (without --apply) read it from this file too (RabbitMQ).
        #[arg(long, value_name = "PATH")]
        password_file: Option<PathBuf>,
        /// The variable holding an admin AMQP URI (declares exchanges and binds them); also looked up as
        /// the credential or keyring entry `broker-admin-uri`.
        #[arg(long, value_name = "VAR", default_value = "FLEETD_ADMIN_URI")]
        admin_uri_env: String,
        /// With --apply: the node rabbitmqctl talks to (`rabbitmqctl -n NODE`, e.g.
        /// `rabbit@broker2`; any node of a cluster); default: the local node.
        #[arg(long, value_name = "NODE", requires = "apply")]
        node: Option<String>,
    },
    /// Run the 8-check AMQP contract suite for the broker credential against a vhost.
    Contract {
        /// The vhost to check (default: the one in the broker URI).
        #[arg(long)]
        vhost: Option<String>,
        /// The variable holding the broker URI (default: `broker.uriEnv` from the config).
        #[arg(long, value_name = "VAR")]
        uri_env: Option<String>,
        /// `capable`: every check must pass (own vhost). `isolated`: every check must fail.
        #[arg(long, value_enum, default_value_t = Expect::Capable)]
        expect: Expect,
        /// The queue type to check (default: `broker.queue_type` from the config, else classic).
        #[arg(long, value_enum)]
        queue_type: Option<QueueTypeArg>,
        /// Another host of the fleet: a ninth check requires the broker to refuse this
        /// credential that host's control queue (`gw.SIBLING.ctl`).
        #[arg(long, value_name = "HOST", conflicts_with = "expect")]
        sibling: Option<String>,
    },
}

/// `--tool` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ToolArg {
    /// RabbitMQ.
    Rabbitmqctl,
    /// LavinMQ.
    Lavinmqctl,
}

/// `--queue-type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueueTypeArg {
    /// Classic queues.
    Classic,
    /// Quorum queues.
    Quorum,
}

/// What the contract run must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Expect {
    /// All eight checks pass.
    Capable,
    /// All eight checks fail.
    Isolated,
}

pub(super) fn run(command: &BrokerCommand, config: Option<&Path>, out: &Output) -> ExitCode {
    let runtime = match super::runtime(&mut tokio::runtime::Builder::new_current_thread(), out) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match command {
        BrokerCommand::Grants {
            fleet,
            admits,
            host,
            into,
            shared_user,
            tool,
            apply,
            password_file,
            admin_uri_env,
            node,
        } => {
            for name in std::iter::once(fleet).chain(admits).chain(into) {
                if !valid_fleet(name) {
                    out.note(&format!("error: `{name}` is not a valid fleet name (lowercase letters, digits, `-`, `_`)"));
                    return exit::code(exit::USAGE);
                }
            }
            if let Some(host) = host.as_deref().filter(|h| !valid_host(h)) {
                out.note(&format!("error: `{host}` is not a valid host name (1 to 64 of letters, digits, `.`, `-`, `_`)"));
                return exit::code(exit::USAGE);
            }
            if !apply {
                let tool = match tool {
                    ToolArg::Rabbitmqctl => grants::Tool::Rabbitmqctl,
                    ToolArg::Lavinmqctl => grants::Tool::Lavinmqctl,
                };
                // The printed script reads a new user's password from this file (never prints
                // it); without one, from a placeholder path to replace.
                let from = match password_file.as_deref().map(Path::to_str) {
                    None => None,
                    Some(Some(path)) => Some(path),
                    Some(None) => {
                        out.note("error: --password-file must be a UTF-8 path to print it");
                        return exit::code(exit::USAGE);
                    }
                };
                let script = match host {
                    Some(host) => grants::host_script((fleet, host), into, tool, from),
                    None => grants::script(fleet, admits, (*shared_user, from), tool),
                };
                out.line(script.trim_end());
                return exit::code(exit::OK);
            }
            if *tool != ToolArg::Rabbitmqctl {
                out.note("error: not yet supported: --apply with lavinmqctl (print the commands and run them)");
                return exit::code(exit::USAGE);
            }
            let ctl = match broker::Rabbitmqctl::new(node.as_deref()) {
                Ok(ctl) => ctl,
                Err(error) => {
                    out.note(&format!("error: {error}"));
                    return exit::code(exit::USAGE);
                }
            };
            if let Some(host) = host {
                return runtime.block_on(apply_host_grants(
                    (fleet, host),
                    into,
                    password_file.as_deref(),
                    (admin_uri_env, &ctl),
                    out,
                ));
            }
            runtime.block_on(apply_grants(
                (fleet, *shared_user),
                admits,
                password_file.as_deref(),
                (admin_uri_env, &ctl),
                out,
            ))
        }
        BrokerCommand::Contract {
            vhost,
            uri_env,
            expect,
            queue_type,
            sibling,
        } => runtime.block_on(run_contract(
            vhost.as_deref(),
            uri_env.as_deref(),
            (*expect, *queue_type, sibling.as_deref()),
            config,
            out,
        )),
    }
}

fn valid_fleet(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn valid_host(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

async fn apply_host_grants(
    fleet_host: (&str, &str),
    into: &[String],
    password_file: Option<&Path>,
    (admin_env, ctl): (&str, &broker::Rabbitmqctl),
    out: &Output,
) -> ExitCode {
    let password = match read_password(password_file) {
        Ok(password) => password,
        Err(message) => {
            out.note(&format!("error: {message}"));
            return exit::code(exit::USAGE);
        }
    };
    let admin = match resolve_uri("broker-admin-uri", Some(admin_env), out) {
        Some(uri) => uri,
        None => return exit::code(exit::FAILED),
    };
    report(
        broker::apply_host(fleet_host, into, &password, (&admin, ctl)).await,
        out,
    )
}

/// Prints what applying did, or why it failed.
fn report(result: Result<Vec<String>, broker::ApplyError>, out: &Output) -> ExitCode {
    match result {
        Ok(report) => {
            for line in report {
                out.line(&line);
            }
            exit::code(exit::OK)
        }
        Err(error) => {
            out.error(&error);
            exit::code(exit::FAILED)
        }
    }
}

async fn apply_grants(
    (fleet, shared_user): (&str, bool),
    admits: &[String],
    password_file: Option<&Path>,
    (admin_env, ctl): (&str, &broker::Rabbitmqctl),
    out: &Output,
) -> ExitCode {
    let password = if shared_user {
        match read_password(password_file) {
            Ok(password) => Some(password),
            Err(message) => {
                out.note(&format!("error: {message}"));
                return exit::code(exit::USAGE);
            }
        }
    } else {
        None
    };
    let admin = match resolve_uri("broker-admin-uri", Some(admin_env), out) {
        Some(uri) => uri,
        None => return exit::code(exit::FAILED),
    };
    report(
        broker::apply(fleet, admits, password.as_ref(), &admin, ctl).await,
        out,
    )
}

/// The password from a file (one trailing newline dropped) or one line of stdin.
fn read_password(file: Option<&Path>) -> Result<SecretString, PasswordError> {
    let mut text = Zeroizing::new(String::new());
    match file {
        Some(path) => {
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_string(&mut text))
                .map_err(|source| PasswordError::File {
                    path: path.to_path_buf(),
                    source,
                })?;
        }
        None => {
            std::io::stdin()
                .read_line(&mut text)
                .map_err(PasswordError::Stdin)?;
        }
    }
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(PasswordError::Empty);
    }
    Ok(SecretString::from(password))
}

/// Why the broker user's password could not be read.
#[derive(Debug, thiserror::Error)]
enum PasswordError {
    /// The password file.
    #[error("cannot read `{}`: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Standard input.
    #[error("cannot read the password from stdin: {0}")]
    Stdin(std::io::Error),
    /// Nothing but a newline.
    #[error("the password is empty")]
    Empty,
}

/// Resolves and parses a broker URI secret; reports failures.
fn resolve_uri(name: &str, env: Option<&str>, out: &Output) -> Option<BrokerUri> {
    let name = SecretName::new(name).ok()?;
    let spec = SecretSpec {
        name,
        env: env.map(str::to_owned),
    };
    let resolved = match secret::resolve(&spec) {
        Ok(resolved) => resolved,
        Err(error) => {
            out.error(&error);
            return None;
        }
    };
    let _ = out
        .scrubber()
        .register(resolved.name.as_str(), &resolved.value);
    match BrokerUri::parse(&resolved.value) {
        Ok(uri) => {
            let _ = out.scrubber().register("broker-password", &uri.password);
            Some(uri)
        }
        Err(error) => {
            out.error(&error);
            None
        }
    }
}

async fn run_contract(
    vhost: Option<&str>,
    uri_env: Option<&str>,
    (expect, queue_type, sibling): (Expect, Option<QueueTypeArg>, Option<&str>),
    config: Option<&Path>,
    out: &Output,
) -> ExitCode {
    let loaded = Config::load(config);
    let configured = loaded
        .as_ref()
        .map_or(QueueType::Classic, |c| c.broker.queue_type);
    let queue_type = match queue_type {
        Some(QueueTypeArg::Classic) => QueueType::Classic,
        Some(QueueTypeArg::Quorum) => QueueType::Quorum,
        None => configured,
    };
    let (env, ca_file) = match (uri_env, loaded) {
        (Some(var), loaded) => (
            Some(var.to_owned()),
            loaded.ok().and_then(|c| c.broker.ca_file),
        ),
        (None, Ok(config)) => (config.broker.uri_env, config.broker.ca_file),
        (None, Err(error)) => {
            out.error(&error);
            return exit::code(exit::USAGE);
        }
    };
    let Some(mut uri) = resolve_uri(BROKER_URI, env.as_deref(), out) else {
        return exit::code(exit::FAILED);
    };
    if let Err(reason) = crate::broker::pin_ca(&mut uri, ca_file.as_deref()) {
        out.note(&format!("error: {reason}"));
        return exit::code(exit::USAGE);
    }
    let vhost = match vhost {
        // A fleet's vhost is `/FLEET`: `fleet01` is taken to mean `/fleet01`, and said so.
        Some(given) if !given.starts_with('/') => {
            out.note(&format!(
                "note: vhost `{given}` has no leading slash; fleet vhosts are `/FLEET`: checking `/{given}`"
            ));
            format!("/{given}")
        }
        Some(given) => given.to_owned(),
        None => uri.vhost.clone(),
    };
    out.line(&format!(
        "contract for user `{}` on vhost `{vhost}` at {} ({queue_type:?} queues)",
        uri.user,
        uri.node_list()
    ));
    if let Some(sibling) = sibling.filter(|s| !valid_host(s)) {
        out.note(&format!("error: `{sibling}` is not a valid host name"));
        return exit::code(exit::USAGE);
    }
    let results = match contract::run(&uri, &vhost, queue_type, sibling).await {
        Ok(results) => results,
        Err(error) => {
            out.note(&format!(
                "error: {error}: nothing to prove (a fleet's vhost is `/FLEET`; `rabbitmqctl list_vhosts` lists them)"
            ));
            return exit::code(exit::FAILED);
        }
    };
    let passed = results.iter().filter(|r| r.outcome.is_ok()).count();
    for result in &results {
        match &result.outcome {
            Ok(()) => out.line(&format!("PASS {}", result.name)),
            Err(reason) => out.line(&format!("FAIL {}: {reason}", result.name)),
        }
    }
    out.line(&format!("{passed}/{} checks passed", results.len()));
    let holds = match expect {
        Expect::Capable => passed == results.len(),
        Expect::Isolated => passed == 0,
    };
    exit::code(if holds { exit::OK } else { exit::FAILED })
}
