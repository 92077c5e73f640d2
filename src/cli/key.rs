//! `fleetd key init | show`: this host's Ed25519 signing key. The private key is a secret (the
//! keyring entry or systemd credential `host-key`); only the public key is ever printed.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use secrecy::ExposeSecret;

use super::{Output, exit};
use crate::config::{Config, HOST_KEY};
use crate::secret::{self, SecretName, SecretSpec};
use crate::wire::HostKey;

/// `fleetd key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create this host's signing key (in the OS keyring, or a 0600 file for `systemd-creds`).
    Init {
        /// Write the key to this new file (mode 0600) instead of the keyring; encrypt it with
        /// `systemd-creds encrypt --name=host-key FILE /etc/credstore.encrypted/host-key`.
        #[arg(long, value_name = "PATH")]
        credential_file: Option<PathBuf>,
        /// Replace an existing key (peers must pin the new public key).
        #[arg(long)]
        force: bool,
    },
    /// Print the public key and the `[[peer]]` entry other hosts pin.
    Show,
}

pub(super) fn run(command: &KeyCommand, config: Option<&Path>, out: &Output) -> ExitCode {
    match command {
        KeyCommand::Init {
            credential_file,
            force,
        } => init(credential_file.as_deref(), *force, config, out),
        KeyCommand::Show => show(config, out),
    }
}

fn spec() -> Option<SecretSpec> {
    SecretName::new(HOST_KEY)
        .ok()
        .map(|name| SecretSpec { name, env: None })
}

fn init(file: Option<&Path>, force: bool, config: Option<&Path>, out: &Output) -> ExitCode {
    let Some(spec) = spec() else {
        return exit::code(exit::FAILED);
    };
    if file.is_none() && !force && secret::resolve(&spec).is_ok() {
        out.note(
            "error: a host key exists already; `fleetd key show` prints it, `--force` replaces it",
        );
        return exit::code(exit::FAILED);
    }
    let (key, stored) = match HostKey::generate() {
        Ok(pair) => pair,
        Err(error) => {
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    let result = match file {
        Some(path) => write_new(path, force, &stored)
            .map_err(|e| format!("cannot write `{}`: {e}", path.display())),
        None => secret::keyring_store(&spec.name, &stored).map_err(|e| e.to_string()),
    };
    if let Err(message) = result {
        out.note(&format!("error: {message}"));
        return exit::code(exit::FAILED);
    }
    out.line(&format!("created host key {}", key.public().key_id()));
    print_pin(&key, config, out);
    exit::code(exit::OK)
}

/// Creates `path` with mode 0600 (refusing to overwrite unless `force`) holding the secret.
fn write_new(path: &Path, force: bool, stored: &secrecy::SecretString) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    if force {
        options.create(true).truncate(true)
    } else {
        options.create_new(true)
    };
    let mut file = options.open(path)?;
    #[expect(
        clippy::disallowed_methods,
        reason = "the credential file holds the key"
    )]
    let text = stored.expose_secret();
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

fn show(config: Option<&Path>, out: &Output) -> ExitCode {
    let Some(spec) = spec() else {
        return exit::code(exit::FAILED);
    };
    let key = match secret::resolve(&spec)
        .map_err(|e| e.to_string())
        .and_then(|r| HostKey::from_secret(&r.value).map_err(|e| e.to_string()))
    {
        Ok(key) => key,
        Err(message) => {
            // A key the unit holds is not the caller's to recreate: point at where it lives.
            out.note(&format!(
                "error: {message}\n  for the unit fleetd@NAME: `fleetd --instance NAME key show` \
                 (reads /etc/fleetd/credentials/NAME/host-key); only a host with no key yet \
                 needs `fleetd key init --credential-file …`"
            ));
            return exit::code(exit::FAILED);
        }
    };
    print_pin(&key, config, out);
    exit::code(exit::OK)
}

fn print_pin(key: &HostKey, config: Option<&Path>, out: &Output) {
    let (fleet, host) = match Config::load(config) {
        Ok(config) => (
            config.fleet.unwrap_or_else(|| "FLEET".to_owned()),
            config.host,
        ),
        Err(_) => ("FLEET".to_owned(), "HOST".to_owned()),
    };
    out.line(&format!("key id: {}", key.public().key_id()));
    out.line(&format!("public key: {}", key.public()));
    if fleet == "FLEET" {
        out.line(
            "(no config with this host's fleet was found: replace FLEET and HOST below, or run \
             again with --config or --instance once the config exists)",
        );
    }
    out.line("pin it on every peer (fleetd.toml):");
    out.line(&format!(
        "[[peer]]\nfleet = \"{fleet}\"\nhost = \"{host}\"\npubkey = \"{}\"",
        key.public()
    ));
}
