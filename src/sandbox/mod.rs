//! The Landlock self-sandbox: what `fleetd run` may touch once its secrets are read.
//!
//! Applied from the synchronous start-up path, before the tokio runtime (or any other thread)
//! exists: Landlock restricts the calling thread and its future children only (before ABI 8),
//! so a worker thread started earlier would stay unconfined.
//!
//! - files: the config file, the policy directory, the CA bundle and the credential directory
//!   read-only; the state and runtime directories read-write; `/dev/null`; the name-resolution
//!   files in `/etc`, the system libraries (NSS modules load lazily) and `/proc` (agents'
//!   processes are watched there) read-only; nothing executable: fleetd runs no program (it
//!   speaks tmux's client protocol and herdr's socket API itself);
//! - network (ABI ≥ 4): TCP connect to the broker's port and 53 (DNS over TCP), no TCP bind;
//! - scopes (ABI ≥ 6): no connect to abstract Unix sockets made outside the sandbox (unless
//!   `$NOTIFY_SOCKET` is one), no signals to processes outside it.
//!
//! fleetd has no children; the agents are not in the domain (the multiplexer's server, started
//! outside fleetd, launches them). Best effort by default, the level reached is logged
//! and shown by `fleetd status`; `sandbox = "required"` refuses to start below full enforcement.
//!
//! Imports: `config` (the paths to allow), `secret` (the credentials directory).

#[cfg(target_os = "linux")]
pub mod agent;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::{Config, SandboxMode};

/// The name-resolution and time files glibc reads at run time.
const ETC_FILES: &[&str] = &[
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ssl",
];

/// Where shared libraries (and NSS modules) live.
const LIBRARY_DIRS: &[&str] = &["/lib", "/lib64", "/usr/lib", "/usr/lib64"];

/// What the daemon may reach once sandboxed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Readable files and directories.
    pub read: Vec<PathBuf>,
    /// Readable and executable (none in the daemon's plan: it runs no program).
    pub exec: Vec<PathBuf>,
    /// Readable and writable directories (and files such as `/dev/null`).
    pub write: Vec<PathBuf>,
    /// TCP ports fleetd may connect to.
    pub connect: Vec<u16>,
    /// Whether connecting to abstract Unix sockets made outside the sandbox is refused.
    pub scope_abstract_sockets: bool,
}

impl Plan {
    /// The daemon's plan: `config`'s files and directories, the broker nodes' ports if a broker
    /// is configured, and the multiplexer's needs.
    pub fn for_daemon(config: &Config, broker_ports: &[u16]) -> Plan {
        let mut plan = Plan::default();
        plan.read.extend(config.file.iter().cloned());
        plan.read.push(config.paths.policy.clone());
        plan.read.extend(config.broker.ca_file.iter().cloned());
        if let Some(dir) = crate::secret::credentials_dir() {
            plan.read.push(dir); // profiles' `credential:NAME` secrets, at spawn
        }
        if let Some(file) = std::env::var_os("SSL_CERT_FILE") {
            plan.read.push(PathBuf::from(file));
        }
        plan.read.extend(ETC_FILES.iter().map(PathBuf::from));
        if config.operator_group.is_some() {
            // The local API looks the operator group's members up on each connection.
            plan.read
                .extend(["/etc/group", "/etc/passwd"].map(PathBuf::from));
        }
        plan.read.extend(LIBRARY_DIRS.iter().map(PathBuf::from));
        // Agents' processes are watched through `/proc/PID/stat` (start time, name): read-only.
        // Another user's process shows no more there than to anyone (its environment needs
        // ptrace rights fleetd's user does not have).
        plan.read.push(PathBuf::from("/proc"));
        plan.write.push(config.paths.state.clone());
        plan.write.push(config.paths.runtime.clone());
        plan.write.push(PathBuf::from("/dev/null"));
        if !broker_ports.is_empty() {
            plan.connect.extend(broker_ports);
            plan.connect.push(53);
        }
        plan.scope_abstract_sockets =
            !std::env::var("NOTIFY_SOCKET").is_ok_and(|s| s.starts_with('@'));
        plan
    }
}

/// How much of the plan the kernel enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Every restriction of the plan.
    Full,
    /// Some (an older kernel: e.g. files but not TCP ports).
    Partial,
    /// None: Landlock is missing or disabled.
    None,
    /// `sandbox = "off"`.
    Off,
}

/// What [`apply`] achieved, for the log and `fleetd status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enforced {
    /// The level.
    pub level: Level,
    /// The kernel's Landlock ABI, when it has one.
    pub abi: Option<i32>,
    /// The TCP ports allowed, when ports are enforced.
    pub ports: Vec<u16>,
}

impl fmt::Display for Enforced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abi = self
            .abi
            .map_or("no landlock".to_owned(), |a| format!("abi {a}"));
        match self.level {
            Level::Full => {
                let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
                let ports = if ports.is_empty() {
                    "none".to_owned()
                } else {
                    ports.join(",")
                };
                write!(
                    f,
                    "sandbox: landlock fully enforced ({abi}; files, tcp connect {ports}, no tcp bind, scoped signals and abstract sockets)"
                )
            }
            Level::Partial => write!(
                f,
                "sandbox: landlock partially enforced ({abi}; kernel lacks some restrictions)"
            ),
            Level::None => write!(f, "sandbox: not enforced ({abi})"),
            Level::Off => write!(f, "sandbox: off (sandbox = \"off\" in the config)"),
        }
    }
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Landlock refused the ruleset (or a rule).
    #[error("cannot build the landlock sandbox: {0}")]
    Landlock(String),
    /// `sandbox = "required"` on a system where Landlock cannot be used at all.
    #[error(
        "sandbox = \"required\" but Landlock is unavailable to fleetd: {0}; nothing can be \
         confined. Enable Landlock (boot with `lsm=…,landlock`; allow landlock_* in the container's \
         seccomp profile) or set sandbox = \"best-effort\" to run unconfined, logged"
    )]
    Unavailable(String),
    /// A directory the plan needs could not be created.
    #[error("cannot create `{}`", .path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `sandbox = "required"` and the kernel enforces less than everything.
    #[error(
        "sandbox = \"required\" but the kernel enforces less than the whole sandbox ({0}): upgrade the kernel (Landlock ABI 6, Linux 6.12) or set sandbox = \"best-effort\""
    )]
    NotFullyEnforced(String),
}

/// Confines the calling thread (and every thread and child it starts later) to `plan`.
/// Directories to write are created (mode 0700) first: Landlock rules need existing paths.
pub fn apply(plan: &Plan, mode: SandboxMode) -> Result<Enforced, SandboxError> {
    if mode == SandboxMode::Off {
        return Ok(Enforced {
            level: Level::Off,
            abi: None,
            ports: Vec::new(),
        });
    }
    for dir in plan.write.iter().filter(|d| !d.starts_with("/dev")) {
        create_private_dir(dir)?;
    }
    let enforced = match restrict(plan, mode == SandboxMode::Required) {
        Err(SandboxError::Landlock(reason)) if mode == SandboxMode::Required => {
            // The crate's message for a kernel without Landlock names access-right bit sets;
            // ask the kernel what is wrong instead.
            return Err(
                unavailable().map_or(SandboxError::Landlock(reason), SandboxError::Unavailable)
            );
        }
        other => other?,
    };
    if mode == SandboxMode::Required && enforced.level != Level::Full {
        return Err(SandboxError::NotFullyEnforced(enforced.to_string()));
    }
    Ok(enforced)
}

fn create_private_dir(dir: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| SandboxError::Directory {
            path: dir.to_owned(),
            source,
        })
}

/// Why Landlock cannot be used here at all, if that is so: asked on a throwaway thread (Landlock
/// confines only the calling thread and what it starts, so the probe confines nothing else).
#[cfg(target_os = "linux")]
fn unavailable() -> Option<String> {
    use landlock::{AccessFs, LandlockStatus, Ruleset, RulesetAttr};
    let probe = std::thread::spawn(|| {
        let status = Ruleset::default()
            .handle_access(AccessFs::Execute)
            .ok()?
            .create()
            .ok()?
            .restrict_self()
            .ok()?;
        Some(status.landlock)
    });
    match probe.join().ok().flatten() {
        Some(LandlockStatus::NotImplemented) => Some(
            "the kernel does not implement it, or a seccomp filter (a container runtime's) \
             refuses its system calls (ENOSYS)"
                .to_owned(),
        ),
        Some(LandlockStatus::NotEnabled) => Some(
            "the kernel has it but it is not enabled (EOPNOTSUPP: not in the `lsm=` list)"
                .to_owned(),
        ),
        Some(LandlockStatus::Available { .. }) => None,
        None => Some("its system calls fail (a seccomp filter may refuse them)".to_owned()),
    }
}

#[cfg(not(target_os = "linux"))]
fn unavailable() -> Option<String> {
    Some("it exists only on Linux".to_owned())
}

#[cfg(target_os = "linux")]
fn restrict(plan: &Plan, hard: bool) -> Result<Enforced, SandboxError> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort,
        Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
    };

    // The newest ABI whose restrictions fleetd has been tested under (ABI 7 adds only audit
    // flags; ABI 9's pathname-socket rule would need the multiplexer's and journald's sockets).
    let abi = ABI::V6;
    let level = if hard {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let error = |e: landlock::RulesetError| SandboxError::Landlock(e.to_string());
    let mut scopes = landlock::BitFlags::from(Scope::Signal);
    if plan.scope_abstract_sockets {
        scopes |= Scope::AbstractUnixSocket;
    }
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))
        .map_err(error)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(error)?
        .scope(scopes)
        .map_err(error)?
        .create()
        .map_err(error)?
        .add_rules(path_beneath_rules(&plan.read, read))
        .map_err(error)?
        .add_rules(path_beneath_rules(&plan.exec, AccessFs::from_read(abi)))
        .map_err(error)?
        .add_rules(path_beneath_rules(&plan.write, AccessFs::from_all(abi)))
        .map_err(error)?;
    for port in &plan.connect {
        ruleset = ruleset
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(error)?;
    }
    let status = ruleset.restrict_self().map_err(error)?;
    let abi = match status.landlock {
        LandlockStatus::Available {
            effective_abi,
            kernel_abi,
        } => Some(kernel_abi.unwrap_or(effective_abi as i32)),
        LandlockStatus::NotEnabled | LandlockStatus::NotImplemented => None,
    };
    let level = match status.ruleset {
        RulesetStatus::FullyEnforced => Level::Full,
        RulesetStatus::PartiallyEnforced => Level::Partial,
        RulesetStatus::NotEnforced => Level::None,
    };
    Ok(Enforced {
        level,
        abi,
        ports: plan.connect.clone(),
    })
}

#[cfg(not(target_os = "linux"))]
fn restrict(_plan: &Plan, _hard: bool) -> Result<Enforced, SandboxError> {
    Ok(Enforced {
        level: Level::None,
        abi: None,
        ports: Vec::new(),
    })
}
