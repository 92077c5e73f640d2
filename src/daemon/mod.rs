//! The daemon: what `fleetd run` does once config is loaded, secrets resolved and logging set up.
//!
//! Today the host runs in single-host mode: it validates its broker secret (when configured),
//! loads its spawn policy (reloaded on SIGHUP), reports what it runs and waits for SIGTERM/SIGINT. The broker fabric, panes and the local API
//! join this wiring in their own issues.
//!
//! Imports: everything below `cli`.

pub mod log;
pub mod policy;

use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use self::policy::PolicyHandle;
use crate::config::Config;
use crate::secret::{BROKER_URI, BrokerUri, Resolved, hardening_state};

/// Errors that stop the daemon.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A signal handler could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The broker URI secret does not parse.
    #[error("the broker uri secret is not a valid amqp uri")]
    BrokerUri(#[source] crate::secret::UriError),
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(
    config: Config,
    secrets: Vec<Resolved>,
    policy: PolicyHandle,
) -> Result<(), RunError> {
    let broker = secrets.iter().find(|s| s.name.as_str() == BROKER_URI);
    match broker {
        Some(secret) => {
            let uri = BrokerUri::parse(&secret.value).map_err(RunError::BrokerUri)?;
            warn!(
                broker.host = %uri.host,
                broker.port = uri.port,
                broker.vhost = %uri.vhost,
                "not yet supported: the broker connection; running in single-host mode"
            );
        }
        None => info!("no broker configured: single-host mode"),
    }
    let (dumpable, core_limit) = hardening_state();
    info!(
        process.dumpable = dumpable,
        process.core_limit = core_limit.map_or("unlimited".to_owned(), |l| l.to_string()),
        "process hardening"
    );
    for secret in &secrets {
        info!(secret.name = %secret.name, secret.source = %secret.source, "secret loaded");
    }
    policy.log_loaded();
    let mut terminate = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(RunError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;
    info!(
        host = %config.host,
        fleet = config.fleet.as_deref().unwrap_or("-"),
        config = %config.file.as_ref().map_or("embedded defaults".to_owned(), |p| p.display().to_string()),
        "fleetd ready"
    );
    loop {
        tokio::select! {
            _ = terminate.recv() => {
                info!("received SIGTERM");
                break;
            }
            _ = interrupt.recv() => {
                info!("received SIGINT");
                break;
            }
            _ = hangup.recv() => {
                info!("received SIGHUP: reloading the policy");
                let handle = policy.clone();
                // Reading and compiling policy files is blocking work.
                let _ = tokio::task::spawn_blocking(move || handle.reload()).await;
            }
        }
    }
    info!("fleetd stopped");
    Ok(())
}
