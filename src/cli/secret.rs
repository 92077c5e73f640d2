//! `fleetd secret set | check | delete`. Values are read, stored and resolved; never printed.

use std::io::{self, BufRead, IsTerminal};
use std::path::Path;
use std::process::ExitCode;

use secrecy::SecretString;
use zeroize::Zeroizing;

use super::{Output, SecretCommand, exit};
use crate::config::Config;
use crate::secret::{self, BROKER_URI, BrokerUri, SecretName};

pub(super) fn run(command: &SecretCommand, config: Option<&Path>, out: &Output) -> ExitCode {
    match command {
        SecretCommand::Set { name } => set(name, out),
        SecretCommand::Check => check(config, out),
        SecretCommand::Delete { name } => delete(name, out),
    }
}

fn name_or_report(name: &str, out: &Output) -> Option<SecretName> {
    match SecretName::new(name) {
        Ok(name) => Some(name),
        Err(error) => {
            out.error(&error);
            None
        }
    }
}

fn set(name: &str, out: &Output) -> ExitCode {
    let Some(name) = name_or_report(name, out) else {
        return exit::code(exit::USAGE);
    };
    let value = match read_value(&name, out) {
        Ok(Some(value)) => value,
        Ok(None) => {
            out.note("error: no value on stdin");
            return exit::code(exit::USAGE);
        }
        Err(error) => {
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    match secret::keyring_store(&name, &value) {
        Ok(()) => {
            out.line(&format!("stored secret `{name}` in the os keyring"));
            exit::code(exit::OK)
        }
        Err(error) => {
            out.error(&error);
            exit::code(exit::FAILED)
        }
    }
}

/// One line from stdin, without echo when stdin is a terminal.
fn read_value(name: &SecretName, out: &Output) -> io::Result<Option<SecretString>> {
    let stdin = io::stdin();
    let terminal = stdin.is_terminal();
    let saved = if terminal {
        out.note(&format!("value for `{name}` (not echoed): "));
        let saved = rustix::termios::tcgetattr(&stdin)?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(rustix::termios::LocalModes::ECHO);
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Flush, &quiet)?;
        Some(saved)
    } else {
        None
    };
    let mut line = Zeroizing::new(String::new());
    let read = stdin.lock().read_line(&mut line);
    if let Some(saved) = saved {
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Flush, &saved)?;
    }
    read?;
    let value = line.trim_end_matches(['\n', '\r']);
    Ok((!value.is_empty()).then(|| SecretString::from(value)))
}

fn check(config: Option<&Path>, out: &Output) -> ExitCode {
    let config = match Config::load(config) {
        Ok(config) => config,
        Err(error) => return super::config_check::report(&error, out),
    };
    if config.secrets.is_empty() {
        out.line("no secrets configured (single-host mode)");
        return exit::code(exit::OK);
    }
    let mut failed = false;
    for spec in &config.secrets {
        match secret::resolve(spec) {
            Ok(resolved) => {
                let mut note = String::new();
                if resolved.name.as_str() == BROKER_URI {
                    note = match BrokerUri::parse(&resolved.value) {
                        Ok(uri) => format!(
                            ", amqp uri for vhost `{}` at {}",
                            uri.vhost,
                            uri.node_list()
                        ),
                        Err(error) => {
                            failed = true;
                            format!(", but {error}")
                        }
                    };
                }
                // Names are not secrets, but `NAME: value` reads to the scrubber like a secret
                // assignment when NAME says `token` or `password`: no colon after a name.
                out.line(&format!(
                    "`{}` resolved from {}{note}",
                    resolved.name, resolved.source
                ));
            }
            Err(error) => {
                failed = true;
                out.line(&format!("`{}` unresolved — {error}", spec.name));
            }
        }
    }
    exit::code(if failed { exit::FAILED } else { exit::OK })
}

fn delete(name: &str, out: &Output) -> ExitCode {
    let Some(name) = name_or_report(name, out) else {
        return exit::code(exit::USAGE);
    };
    match secret::keyring_delete(&name) {
        Ok(true) => {
            out.line(&format!("deleted secret `{name}` from the os keyring"));
            exit::code(exit::OK)
        }
        Ok(false) => {
            out.line(&format!("no secret `{name}` in the os keyring"));
            exit::code(exit::FAILED)
        }
        Err(error) => {
            out.error(&error);
            exit::code(exit::FAILED)
        }
    }
}
