//! The daemon: what `fleetd run` does once config is loaded, secrets resolved and logging set up.
//!
//! The local side always runs: the state store, the audit log, the registry of local agents,
//! the spawn pipeline over the multiplexer, the injector, the lead supervisor and the local API.
//! With a broker secret the fabric joins it — the host key, the envelope checks and the link to
//! the broker (reconnecting with jittered backoff), the roster of peers and remote spawns;
//! without one the host runs single-host and nothing leaves it. The spawn policy is reloaded on
//! SIGHUP; SIGTERM or SIGINT stop the tasks within a grace period.
//!
//! Imports: everything below `cli`.

pub mod gateway;
pub mod inject;
pub mod leads;
pub mod log;
pub mod notify;
pub mod policy;
pub mod presence;
pub mod refusals;
pub mod spawning;

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use self::policy::PolicyHandle;

use crate::api::{self, ApiState};
use crate::audit::{Audit, AuditError, Background};
use crate::broker::deliver::Courier;
use crate::broker::inbound::Inbound;
use crate::broker::link::Recorder;
use crate::broker::link::{self, LinkSettings, LinkStatus, Presence};
use crate::config::Config;
use crate::config::HOST_KEY;
use crate::pane::tmux::{Socket, Tmux};
use crate::roster::{HostId, Roster};
use crate::sandbox::Enforced;
use crate::scrub::Scrubber;
use crate::secret::{BROKER_URI, BrokerUri, Resolved, hardening_state};
use crate::spawn::{HostPlaces, Spawner};
use crate::state::{Limits, StateStore};
use crate::wire::{HostKey, Party};

/// Errors that stop the daemon.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A signal handler could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The broker URI secret does not parse.
    #[error("the broker uri secret is not a valid amqp uri")]
    BrokerUri(#[source] crate::secret::UriError),
    /// The pinned CA bundle is unusable.
    #[error(transparent)]
    CaFile(crate::broker::CaError),
    /// A broker is configured without `fleet`.
    #[error("a broker is configured but `fleet` is not: set the fleet (its vhost and user)")]
    NoFleet,
    /// A broker is configured without a host key.
    #[error("no host key: `fleetd key init` creates one")]
    NoHostKey,
    /// The host key secret is malformed.
    #[error("the host key is unusable")]
    HostKey(#[source] crate::wire::KeyError),
    /// The state store could not be opened.
    #[error("cannot open the state store")]
    State(#[source] crate::state::StateError),
    /// The audit log could not be opened (or its chain is broken).
    #[error("cannot open the audit log")]
    Audit(#[source] crate::audit::AuditError),
    /// The local API socket could not be bound.
    #[error("cannot serve the local api")]
    Api(#[source] crate::api::ApiError),
}

/// Runs until SIGTERM or SIGINT, step by step: the local side stands on its own (agents,
/// local sends, held messages, spawning, leads and the audit log work with or without a
/// broker); the fabric joins it when a broker is configured.
pub async fn run(
    config: Config,
    secrets: Vec<Resolved>,
    policy: PolicyHandle,
    scrubber: Scrubber,
    sandbox: Enforced,
) -> Result<(), RunError> {
    // First: a SIGHUP or SIGTERM from the moment fleetd says it is ready (or earlier) is
    // handled, never the default action that would end it.
    let signals = Signals::install()?;
    let listener = api::bind(&config.paths.runtime, config.socket_access).map_err(RunError::Api)?;
    let mut local = Local::open(&config, &secrets, &policy, &scrubber)?;
    let mut tasks = Tasks::new();
    keep_presence(&local, &mut tasks);
    let gateway = start_gateway(&config, &secrets, &local, &policy, &scrubber, &mut tasks);
    keep_house(&config, &local, &gateway, &mut tasks);
    let link = join_broker(&config, &mut local, &gateway, &mut tasks)?;
    let api_state = ApiState {
        host: config.host.clone(),
        roster: Arc::clone(&local.roster),
        link: link.line(),
        router: Arc::clone(&gateway) as Arc<dyn crate::route::Router>,
        scrubber: Some(scrubber.clone()),
        sandbox: sandbox.to_string(),
        operators: api::Operators {
            me: rustix::process::geteuid().as_raw(),
            group: config.operator_group.clone(),
        },
    };
    tasks.spawn(|stopped| api::serve(listener, api_state, stopped));
    log_started(&config, &secrets, &policy);
    let status = || service_status(link.status.as_ref(), &local.roster, &sandbox);
    serve_until_stopped(signals, &policy, &status).await;
    tasks.stop().await;
    gateway.record_refusals(true);
    link.close().await;
    info!("fleetd stopped");
    Ok(())
}

/// What every host has, broker or not: the state store, the audit log, the courier (with the
/// fabric's key and checks when a broker is configured) and the roster.
struct Local {
    state: Arc<StateStore>,
    audit: Arc<Audit>,
    courier: Arc<Courier>,
    roster: Arc<std::sync::Mutex<Roster>>,
    fabric: Option<Fabric>,
}

impl Local {
    /// Opens the state store and the audit log, and the fabric when a broker is configured.
    fn open(
        config: &Config,
        secrets: &[Resolved],
        policy: &PolicyHandle,
        scrubber: &Scrubber,
    ) -> Result<Local, RunError> {
        let state = Arc::new(
            StateStore::open(
                &config.paths.state,
                Limits {
                    max_held: config.broker.max_held,
                    ..Limits::default()
                },
            )
            .map_err(RunError::State)?,
        );
        let audit =
            Arc::new(Audit::open(&config.paths.state, scrubber.clone()).map_err(RunError::Audit)?);
        let fabric = match secrets.iter().find(|s| s.name.as_str() == BROKER_URI) {
            Some(secret) => Some(Fabric::new(config, secrets, secret, &state)?),
            None => {
                info!("no broker configured: single-host mode (local agents only)");
                None
            }
        };
        let courier = match &fabric {
            Some(fabric) => Arc::clone(&fabric.courier),
            None => Arc::new(
                Courier::single_host(
                    config.fleet.as_deref().unwrap_or(SINGLE_HOST_FLEET),
                    &config.host,
                    Arc::clone(&state),
                )
                .map_err(RunError::State)?,
            ),
        };
        courier.use_policy(policy.shared());
        let roster = Arc::new(std::sync::Mutex::new(Roster::new(
            HostId {
                fleet: courier.me().fleet,
                host: config.host.clone(),
            },
            config.roster,
        )));
        Ok(Local {
            state,
            audit,
            courier,
            roster,
            fabric,
        })
    }
}

/// The daemon's tasks and the signal that stops them.
struct Tasks {
    set: JoinSet<()>,
    stop: watch::Sender<bool>,
}

impl Tasks {
    fn new() -> Tasks {
        Tasks {
            set: JoinSet::new(),
            stop: watch::channel(false).0,
        }
    }

    /// Starts the task `start` makes from the stop signal.
    fn spawn<F>(&mut self, start: impl FnOnce(watch::Receiver<bool>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.set.spawn(start(self.stop.subscribe()));
    }

    /// Tells every task to stop and waits for them (5 s at most; the rest are aborted).
    async fn stop(mut self) {
        self.stop.send_replace(true);
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while self.set.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!("tasks did not stop within 5 s; aborting them");
            self.set.abort_all();
        }
    }
}

/// This host's agents in the roster from the start; without a broker link (which announces
/// on every change) the roster still shows them as they are: `blocked` or `down` as soon as
/// the injector says so.
fn keep_presence(local: &Local, tasks: &mut Tasks) {
    presence::announce(&local.courier, &local.roster);
    let roster = Arc::clone(&local.roster);
    tasks.spawn(|stopped| presence::keep_roster(roster, stopped));
    if !local.courier.has_broker() {
        let (courier, roster) = (Arc::clone(&local.courier), Arc::clone(&local.roster));
        tasks.spawn(|stopped| presence::announce_changes(courier, roster, stopped));
    }
}

/// The gateway the local API asks, with the injector typing held messages into panes (when a
/// multiplexer is reachable).
fn start_gateway(
    config: &Config,
    secrets: &[Resolved],
    local: &Local,
    policy: &PolicyHandle,
    scrubber: &Scrubber,
    tasks: &mut Tasks,
) -> Arc<gateway::Gateway> {
    let spawner = spawner(config);
    let processes = Arc::new(gateway::Processes::default());
    if let Some(spawner) = &spawner {
        spawner.adopt(still_running(&local.courier, policy));
        let injector = inject::Injector {
            mailbox: Arc::clone(local.courier.mailbox()),
            agents: Arc::clone(local.courier.agents()),
            mux: Arc::clone(spawner.mux()),
            processes: Arc::clone(&processes),
            policy: policy.clone(),
            scrubber: scrubber.clone(),
            record: recorder(Arc::clone(&local.audit)),
        };
        tasks.spawn(|stopped| inject::run(injector, stopped));
    }
    Arc::new(gateway::Gateway {
        courier: Arc::clone(&local.courier),
        mailbox: Arc::clone(local.courier.mailbox()),
        roster: Arc::clone(&local.roster),
        spawner,
        policy: policy.clone(),
        record: recorder(Arc::clone(&local.audit)),
        scrubber: scrubber.clone(),
        socket: config.paths.runtime.join(api::SOCKET),
        env_secrets: secrets
            .iter()
            .filter_map(|s| match &s.source {
                crate::secret::Source::Env(var) => Some((var.clone(), s.value.clone())),
                _ => None,
            })
            .collect(),
        processes,
        failing: std::sync::Mutex::new(None),
        refusals: refusals::Refusals::default(),
    })
}

/// The periodic work: gone agents' tokens revoked (every 2 s), expired state pruned, leads
/// kept running.
fn keep_house(config: &Config, local: &Local, gateway: &Arc<gateway::Gateway>, tasks: &mut Tasks) {
    let sweeping = Arc::clone(gateway);
    tasks.spawn(|stopped| {
        every(Duration::from_secs(2), stopped, move || {
            sweeping.sweep_agents();
        })
    });
    // The replay cache, the dedupe records and old delivery records are kept only as long as
    // they can matter (an envelope's life plus the skew; `dedupe_retention`): pruned at start and
    // every ten minutes, so the store does not grow with every message ever seen.
    let pruning = Arc::clone(&local.state);
    tasks.spawn(|stopped| every(PRUNE_EVERY, stopped, move || prune(&pruning)));
    // Refusals counted in an interval are recorded once it ends (and at stop).
    let counting = Arc::clone(gateway);
    tasks.spawn(|stopped| {
        every(refusals::INTERVAL, stopped, move || {
            counting.record_refusals(false);
        })
    });
    let (leading, leads) = (Arc::clone(gateway), config.leads.clone());
    tasks.spawn(|stopped| leads::supervise(leading, leads, stopped));
}

/// Prunes expired replay, dedupe and delivery records.
fn prune(state: &StateStore) {
    match state.prune(crate::wire::now_ms()) {
        Ok(pruned) if pruned.replay + pruned.dedupe + pruned.delivery > 0 => {
            info!(
                state.replay = pruned.replay,
                state.dedupe = pruned.dedupe,
                state.delivery = pruned.delivery,
                "expired state pruned"
            );
        }
        Ok(_) => {}
        Err(error) => warn!(%error, "cannot prune expired state; it is retried"),
    }
}

/// The broker side, when there is one: its link's status and the audit writer it records
/// through (finished — everything it was given on disk — before the exit).
struct Link {
    status: Option<watch::Receiver<LinkStatus>>,
    audit: Option<Arc<Background>>,
}

impl Link {
    /// The link's status line for the local API.
    fn line(&self) -> Option<api::LinkLine> {
        self.status
            .clone()
            .map(|status| Arc::new(move || status.borrow().to_string()) as api::LinkLine)
    }

    /// Waits for the audit writer to finish and logs how the link ended.
    async fn close(self) {
        if let Some(writer) = self.audit {
            let _ = tokio::task::spawn_blocking(move || writer.finish()).await;
        }
        if let Some(status) = self.status {
            info!(broker.status = %*status.borrow(), "broker link closed");
        }
    }
}

/// Joins the broker when one is configured: serves spawn requests from other hosts as soon
/// as one is held, and runs the link (reconnecting) with this host's presence.
fn join_broker(
    config: &Config,
    local: &mut Local,
    gateway: &Arc<gateway::Gateway>,
    tasks: &mut Tasks,
) -> Result<Link, RunError> {
    let Some(fabric) = local.fabric.take() else {
        return Ok(Link {
            status: None,
            audit: None,
        });
    };
    // Spawn requests from other hosts: served as soon as one is held; the tick is the safety
    // net.
    let serving = Arc::clone(gateway);
    let requests = local
        .courier
        .mailbox()
        .arrivals()
        .watch_shelf(crate::mailbox::Shelf::Spawn);
    tasks.spawn(|stopped| {
        on_arrival(Some(requests), Duration::from_secs(1), stopped, move || {
            serving.serve_spawn_requests();
        })
    });
    // The link records a window's decisions after acknowledging it; its next window does not
    // wait for the audit's disk sync.
    let writer = Background::start(Arc::clone(&local.audit), |error| {
        tracing::error!(%error, "cannot write the audit log");
    })
    .map_err(|source| {
        RunError::Audit(AuditError::Io {
            path: config.paths.state.join(crate::audit::FILE),
            source,
        })
    })?;
    let writer = Arc::new(writer);
    let presence = Arc::new(Presence {
        book: Arc::new(presence::Book {
            roster: Arc::clone(&local.roster),
            courier: Arc::clone(&local.courier),
        }),
        key: fabric.key,
        fleet: local.courier.me().fleet,
        beat_ttl: config.roster.suspect_after,
        last_beat: std::sync::Mutex::new(None),
        record: background_recorder(Arc::clone(&writer)),
    });
    let (status, receiver) = watch::channel(LinkStatus::Starting);
    let courier = Arc::clone(&local.courier);
    tasks.spawn(|stopped| {
        link::supervise(
            fabric.uri,
            fabric.settings,
            fabric.inbound,
            presence,
            courier,
            status,
            stopped,
        )
    });
    Ok(Link {
        status: Some(receiver),
        audit: Some(writer),
    })
}

/// What the journal says once everything runs: the process hardening, each secret's name and
/// source (never its value), the socket, the policy, and `fleetd ready`.
fn log_started(config: &Config, secrets: &[Resolved], policy: &PolicyHandle) {
    let (dumpable, core_limit) = hardening_state();
    info!(
        process.dumpable = dumpable,
        process.core_limit = core_limit.map_or("unlimited".to_owned(), |l| l.to_string()),
        "process hardening"
    );
    for secret in secrets {
        info!(secret.name = %secret.name, secret.source = %secret.source, "secret loaded");
    }
    info!(api.socket = %config.paths.runtime.join(api::SOCKET).display(), "local api listening");
    policy.log_loaded();
    info!(
        host = %config.host,
        fleet = config.fleet.as_deref().unwrap_or("-"),
        config = %config.file.as_ref().map_or("embedded defaults".to_owned(), |p| p.display().to_string()),
        "fleetd ready"
    );
}

/// The signals fleetd answers: SIGTERM and SIGINT stop it, SIGHUP reloads the policy.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, RunError> {
        let install = |kind| signal(kind).map_err(RunError::Signals);
        Ok(Signals {
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
            hangup: install(SignalKind::hangup())?,
        })
    }
}

/// Tells the service manager fleetd is ready, pings its watchdog with a status line, and
/// reloads the policy on SIGHUP, until SIGTERM or SIGINT; then says it is stopping.
async fn serve_until_stopped(
    mut signals: Signals,
    policy: &PolicyHandle,
    status: &dyn Fn() -> String,
) {
    let notifier = notify::Notifier::from_env();
    notifier.ready(&status());
    // The watchdog is pinged from this loop: if it stops turning, systemd restarts fleetd.
    let period = notifier
        .watchdog_interval()
        .unwrap_or(Duration::from_secs(5))
        .min(Duration::from_secs(5));
    let mut heartbeat = tokio::time::interval(period);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                notifier.watchdog();
                notifier.status(&status());
            }
            _ = signals.terminate.recv() => {
                info!("received SIGTERM");
                break;
            }
            _ = signals.interrupt.recv() => {
                info!("received SIGINT");
                break;
            }
            _ = signals.hangup.recv() => {
                info!("received SIGHUP: reloading the policy");
                let handle = policy.clone();
                // Reading and compiling policy files is blocking work.
                let _ = tokio::task::spawn_blocking(move || handle.reload()).await;
            }
        }
    }
    notifier.stopping();
}

/// The fleet name a host without `fleet` and without a broker shows in its roster and on its
/// held messages (nothing leaves the host, so it names no vhost).
pub const SINGLE_HOST_FLEET: &str = "local";

/// What a host with a broker adds to the local side: the courier with its key, the envelope
/// checks and the link's settings.
struct Fabric {
    courier: Arc<Courier>,
    key: Arc<HostKey>,
    uri: BrokerUri,
    settings: LinkSettings,
    inbound: Arc<Inbound>,
}

impl Fabric {
    fn new(
        config: &Config,
        secrets: &[Resolved],
        secret: &Resolved,
        state: &Arc<StateStore>,
    ) -> Result<Fabric, RunError> {
        let mut uri = BrokerUri::parse(&secret.value).map_err(RunError::BrokerUri)?;
        crate::broker::pin_ca(&mut uri, config.broker.ca_file.as_deref())
            .map_err(RunError::CaFile)?;
        info!(
            broker.nodes = %uri.node_list(),
            broker.vhost = %uri.vhost,
            "connecting to the broker"
        );
        let fleet = config.fleet.clone().ok_or(RunError::NoFleet)?;
        let key = secrets
            .iter()
            .find(|s| s.name.as_str() == HOST_KEY)
            .ok_or(RunError::NoHostKey)
            .and_then(|s| HostKey::from_secret(&s.value).map_err(RunError::HostKey))?;
        info!(key.id = %key.public().key_id(), "host key loaded");
        let skew_ms = i64::try_from(config.broker.skew.as_millis()).unwrap_or(i64::MAX);
        let key = Arc::new(key);
        let courier = Arc::new(
            Courier::new(
                &fleet,
                &config.host,
                &uri.vhost,
                Arc::clone(&key),
                Arc::clone(state),
            )
            .map_err(RunError::State)?,
        );
        // This host's own beats come back through the roster queue: its key is pinned too.
        let mut pins = config.peers.clone();
        pins.pin(&fleet, &config.host, *key.public());
        let me = Party {
            fleet: fleet.clone(),
            host: config.host.clone(),
        };
        let inbound = Arc::new(Inbound::new(&me, pins, skew_ms, Arc::clone(state)));
        if !config.broker.admit.is_empty() {
            warn!(
                "`broker.admit` is no longer read: the admin binds each admitted fleet's x.in.O to this fleet (`fleetd broker grants --fleet F --admit O --apply`); remove it from the config"
            );
        }
        let settings = LinkSettings {
            host: config.host.clone(),
            backoff_cap: config.broker.backoff_cap,
            queue_type: config.broker.queue_type,
            beat_to: config
                .peers
                .fleets()
                .into_iter()
                .filter(|f| *f != fleet)
                .map(str::to_owned)
                .collect(),
        };
        Ok(Fabric {
            courier,
            key,
            uri,
            settings,
            inbound,
        })
    }
}

/// The pane agents a fleetd before this one started, as the spawn limits count them: each
/// with its profile, the grant that admitted it (when the policy still has it) and the fleet
/// it runs for. The spawner keeps those whose pane still runs.
fn still_running(courier: &Courier, policy: &PolicyHandle) -> Vec<crate::spawn::Adopted> {
    use crate::agent::Owner;
    let policy = policy.current();
    let own = courier.me().fleet;
    courier
        .agents()
        .list()
        .into_iter()
        .filter_map(|(_, agent)| {
            let pane = crate::pane::PaneId(agent.pane.clone()?);
            let grant = agent.grant.as_deref().and_then(|stored| {
                policy
                    .grants
                    .iter()
                    .find(|g| g.id.as_str() == stored)
                    .map(|g| g.id.clone())
            });
            let fleet = match &agent.owner {
                Owner::Peer { fleet, .. } => fleet.clone(),
                Owner::Operator | Owner::Lead | Owner::Agent { .. } => own.clone(),
            };
            Some(crate::spawn::Adopted {
                pane,
                profile: agent.profile,
                grant,
                fleet,
            })
        })
        .collect()
}

/// The spawner over the configured multiplexer; `None` when herdr is not reachable (spawning
/// stays off until fleetd restarts, and says so).
fn spawner(config: &Config) -> Option<Arc<Spawner>> {
    let init = match own_executable() {
        Ok(path) => path,
        Err(error) => {
            warn!(%error, "cannot name fleetd's own executable, every pane's init: spawning is off until fleetd restarts");
            return None;
        }
    };
    // fleetd's own places, hidden from every agent's sandbox (docs/hardening.md).
    let mut hidden = vec![
        config.paths.policy.clone(),
        config.paths.state.clone(),
        config.paths.runtime.clone(),
    ];
    hidden.extend(config.file.iter().cloned());
    hidden.extend(crate::secret::credentials_dir());
    let places = |socket_dir: Option<&std::path::Path>| {
        let mut hidden = hidden.clone();
        hidden.extend(socket_dir.map(std::path::Path::to_path_buf));
        HostPlaces::new(hidden, Some(config.paths.runtime.join(api::SOCKET)))
    };
    match config.multiplexer {
        crate::config::Multiplexer::Tmux => {
            let socket = tmux_socket(&config.tmux_socket);
            let dir = match &socket {
                Socket::Path(path) => path.parent().map(std::path::Path::to_path_buf),
                // tmux's own directory, /tmp/tmux-UID or under $TMUX_TMPDIR: every sandbox has
                // a private /tmp; $TMUX_TMPDIR is hidden by name.
                Socket::Name(_) => std::env::var_os("TMUX_TMPDIR").map(std::path::PathBuf::from),
            };
            Some(Arc::new(
                Spawner::new(Arc::new(Tmux::new(socket, "fleetd")))
                    .with_init(init)
                    .with_places(places(dir.as_deref())),
            ))
        }
        crate::config::Multiplexer::Herdr => {
            let path = crate::pane::herdr::socket_path();
            let dir = path
                .as_deref()
                .and_then(std::path::Path::parent)
                .map(std::path::Path::to_path_buf);
            let opened = path
                .ok_or_else(|| "no herdr socket path (set HERDR_SOCKET_PATH or HOME)".to_owned())
                .and_then(|path| crate::pane::herdr::Herdr::open(&path).map_err(|e| e.to_string()));
            match opened {
                Ok(herdr) => Some(Arc::new(
                    Spawner::new(Arc::new(herdr))
                        .with_init(init)
                        .with_places(places(dir.as_deref())),
                )),
                Err(reason) => {
                    warn!(%reason, "herdr is not reachable: spawning is off until fleetd restarts");
                    None
                }
            }
        }
    }
}

/// fleetd's own executable, which every pane runs first as its init. A binary replaced on
/// disk since fleetd started (an upgrade) reads `PATH (deleted)`: the path is what is run.
fn own_executable() -> std::io::Result<std::path::PathBuf> {
    let path = std::env::current_exe()?;
    let text = path.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(live) => std::path::PathBuf::from(live),
        None => path,
    })
}

/// The service manager's status line: broker link, roster size, sandbox level.
fn service_status(
    link: Option<&watch::Receiver<LinkStatus>>,
    roster: &std::sync::Mutex<Roster>,
    sandbox: &Enforced,
) -> String {
    let broker = link.map_or("broker: not configured".to_owned(), |l| {
        l.borrow().to_string()
    });
    let hosts = roster.lock().map_or("roster: -".to_owned(), |r| {
        format!("roster: {} hosts", r.view().len())
    });
    let level = match sandbox.level {
        crate::sandbox::Level::Full => "sandbox: full",
        crate::sandbox::Level::Partial => "sandbox: partial",
        crate::sandbox::Level::None => "sandbox: none",
        crate::sandbox::Level::Off => "sandbox: off",
    };
    format!("{broker}; {hosts}; {level}")
}

/// `tmux_socket` from the config: an absolute path is `tmux -S`, anything else `tmux -L`.
fn tmux_socket(value: &str) -> Socket {
    if value.starts_with('/') {
        Socket::Path(value.into())
    } else {
        Socket::Name(value.to_owned())
    }
}

/// How often expired replay, dedupe and delivery records are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Runs `work` on a blocking thread every `period` until `stop` turns true.
async fn every(
    period: Duration,
    stop: watch::Receiver<bool>,
    work: impl Fn() + Send + Sync + 'static,
) {
    on_arrival(None, period, stop, work).await;
}

/// Runs `work` on a blocking thread whenever `arrivals` changes (a message was held, on any
/// shelf: `work` reads its own), and every `period` as a safety net, until `stop` turns true.
async fn on_arrival(
    mut arrivals: Option<watch::Receiver<u64>>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
    work: impl Fn() + Send + Sync + 'static,
) {
    let work = Arc::new(work);
    let mut tick = tokio::time::interval(period);
    while woken(&mut tick, arrivals.as_mut(), &mut stop).await {
        let work = Arc::clone(&work);
        let _ = tokio::task::spawn_blocking(move || work()).await;
    }
}

/// Waits for the tick or an arrival (then marked seen); `false` once `stop` changes or the
/// arrivals end.
async fn woken(
    tick: &mut tokio::time::Interval,
    mut arrivals: Option<&mut watch::Receiver<u64>>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let arrived = async {
        match arrivals.as_deref_mut() {
            Some(arrivals) => arrivals.changed().await.is_ok(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tick.tick() => {}
        open = arrived => {
            if !open {
                return false;
            }
        }
        _ = stop.changed() => return false,
    }
    if let Some(arrivals) = arrivals {
        arrivals.borrow_and_update();
    }
    true
}

/// Records decisions in the audit log; a failed write is logged (it needs an operator).
pub fn recorder(audit: Arc<Audit>) -> Recorder {
    Arc::new(move |records| {
        if let Err(error) = audit.record_all(&records) {
            tracing::error!(%error, "cannot write the audit log");
        }
    })
}

/// Records decisions through the audit log's background writer: returns without waiting for
/// the disk; a failed write is logged.
pub fn background_recorder(writer: Arc<Background>) -> Recorder {
    Arc::new(move |records| {
        if let Err(error) = writer.send(records) {
            tracing::error!(%error, "cannot write the audit log");
        }
    })
}
