//! Each agent's own sandbox: bubblewrap (namespaces, mounts), a seccomp filter and Landlock,
//! built from the agent's profile when fleetd launches it.
//!
//! fleetd does not start agents itself: the multiplexer's server (the agents' user's) runs the
//! pane's command. For a sandboxed profile that command is `FLEETD pane-init --sandbox PLAN --
//! ARGV`; this module is what it runs, as the agents' user, before anything of the agent's:
//!
//! 1. [`enter`] (outside) keeps only the environment the plan names, writes the seccomp filter
//!    into a pipe and replaces itself with `bwrap` (the distribution's, at the plan's absolute
//!    path — never a PATH lookup in the user's environment): new user, PID, IPC and UTS
//!    namespaces (and a network namespace unless the profile says `host`), every capability
//!    dropped, `/` read-only, a fresh `/dev` (its own devpts: no other pane's pty), `/proc`
//!    (only its own processes), `/tmp` and `/dev/shm`; every home, `/run/user`, `/var/tmp` and
//!    fleetd's own directories hidden under empty tmpfs; then the profile's roots and writable
//!    paths bound read-write, its readable paths read-only, and fleetd's API socket bound back
//!    as the one way out.
//!    Before that it applies Landlock to itself ([`confine`]: TCP connect limited to the
//!    profile's ports, abstract Unix sockets and signals scoped to the sandbox), which bwrap
//!    and the agent inherit — it restricts no mount, so bwrap still builds its namespaces.
//! 2. bwrap's own init is PID 1 of the sandbox and the agent its child: when the agent ends,
//!    the PID namespace ends, and with it everything the agent started.
//!
//! The seccomp filter (applied by bwrap just before it executes the agent, inherited by every
//! process inside) refuses `TIOCSTI` and `TIOCLINUX` (typing into the terminal), the kernel
//! keyring calls (`keyctl`, `add_key`, `request_key`), io_uring, every x32-ABI call and, for
//! `network = "none"`, IPv4 and IPv6 sockets — each with `EPERM`, so a refused call fails
//! visibly.
//!
//! Imports: `policy` (the network a profile names), `pane` (the init's option); nothing that
//! needs a config (the pane's init runs it before any exists).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::policy::Network;

/// The option of `pane-init` that carries a plan.
pub use crate::pane::SANDBOX_OPTION;

/// A path the profile names in the agents' home (`~/.claude`), resolved where the pane's init
/// runs, as the agents' user, from its `HOME`.
pub const HOME_PREFIX: &str = "~/";

/// Hidden in every sandbox: the users' homes and private runtime and temporary files.
pub const ALWAYS_HIDDEN: &[&str] = &["/home", "/root", "/run/user", "/var/tmp"];

/// Each sandbox's own, empty at start: the host's are not there.
pub const PRIVATE: &[&str] = &["/tmp", "/dev/shm"];

/// Whether `path` lies where no sandbox sees the host's files unless they are bound back (a
/// home, its own /tmp).
pub fn hidden_by_default(path: &Path) -> bool {
    ALWAYS_HIDDEN
        .iter()
        .chain(PRIVATE)
        .any(|place| path.starts_with(place))
}

/// Where the kernel's settings are read (`sysctl`'s tree).
pub const PROC_SYS: &str = "/proc/sys";

/// A kernel that says outright that bubblewrap, run as the agents' user, can make no user
/// namespace — so no sandbox (read before launch: the spawn is refused, nothing started).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UsernsOff {
    /// `user.max_user_namespaces` is 0: nobody may make one.
    #[error(
        "this kernel allows no user namespace (`user.max_user_namespaces` is 0): set it above 0 \
         (`sysctl -w user.max_user_namespaces=15000`, and in /etc/sysctl.d/)"
    )]
    NoneAllowed,
    /// `kernel.unprivileged_userns_clone` is 0 (Debian's switch) and bubblewrap is not setuid.
    #[error(
        "this kernel allows no unprivileged user namespace (`kernel.unprivileged_userns_clone` \
         is 0): set it to 1 (`sysctl -w kernel.unprivileged_userns_clone=1`, and in \
         /etc/sysctl.d/)"
    )]
    UnprivilegedOff,
}

/// Whether the kernel settings under `sys` (normally [`PROC_SYS`]) deny the user namespace every
/// sandbox starts with, for `bwrap`. Only what they say outright counts: a setting that is
/// absent or unreadable decides nothing, and Ubuntu's AppArmor restriction
/// (`kernel.apparmor_restrict_unprivileged_userns`) depends on the profile loaded for bwrap,
/// which fleetd cannot read — such a host fails at launch, with bwrap's line and the fix.
pub fn userns_off(sys: &Path, bwrap: &Path) -> Option<UsernsOff> {
    let setting = |name: &str| -> Option<u64> {
        std::fs::read_to_string(sys.join(name))
            .ok()
            .and_then(|value| value.trim().parse().ok())
    };
    if setting("user/max_user_namespaces") == Some(0) {
        return Some(UsernsOff::NoneAllowed);
    }
    // A setuid bubblewrap makes its namespaces with its privilege, whatever this switch says.
    let setuid = std::fs::metadata(bwrap).is_ok_and(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o4000 != 0
    });
    if !setuid && setting("kernel/unprivileged_userns_clone") == Some(0) {
        return Some(UsernsOff::UnprivilegedOff);
    }
    None
}

/// The uid and gid a sandbox of root runs as: without capabilities, root inside a user
/// namespace would still look privileged to programs that check the uid (a nested bubblewrap
/// would not make its own user namespace and fail).
pub const ROOT_MAPPED_TO: u32 = 1000;

/// What one agent's sandbox holds: decided by fleetd from the profile and this host's paths,
/// carried to the pane's init as JSON (no secret in it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The `bwrap` to run (absolute).
    pub bwrap: PathBuf,
    /// The network.
    pub network: Network,
    /// TCP ports the agent may connect to (`None`: any; only with [`Network::Host`]).
    pub tcp_connect: Option<Vec<u16>>,
    /// The working directory (inside a writable path).
    pub cwd: PathBuf,
    /// Bound read-write: the profile's roots and writable paths.
    pub writable: Vec<PathBuf>,
    /// Bound read-only over hidden places: the profile's readable paths and its program.
    pub readable: Vec<PathBuf>,
    /// fleetd's own places (config, credentials, state, runtime, policy, the multiplexer's
    /// socket directory): hidden, and never bound back into.
    pub hidden: Vec<PathBuf>,
    /// fleetd's API socket, bound back (the one way out).
    pub socket: Option<PathBuf>,
    /// The environment names kept (the profile's, its secrets, fleetd's own); all else is
    /// dropped.
    pub env: Vec<String>,
}

/// Why a sandbox cannot be entered.
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    /// The plan is not valid JSON of a plan.
    #[error("the sandbox plan is malformed: {0}")]
    Plan(#[source] serde_json::Error),
    /// A path of the plan is relative or climbs with `..`.
    #[error("the sandbox plan names `{0}`, which is not an absolute path without `..`")]
    Path(PathBuf),
    /// A `~/…` path, and no home to resolve it in.
    #[error("the sandbox plan names `{0}`, and the agents' HOME is not an absolute path")]
    NoHome(PathBuf),
    /// A path to bind lies in one of fleetd's hidden places.
    #[error("`{path}` lies inside `{hidden}`, which no sandbox may see")]
    InsideHidden {
        /// The path the plan would bind.
        path: PathBuf,
        /// The hidden place.
        hidden: PathBuf,
    },
    /// The seccomp filter could not be built or handed over.
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
    /// Landlock refused what the profile asked for.
    #[error(transparent)]
    Landlock(ConfineError),
    /// `bwrap` could not be executed.
    #[error(
        "cannot run `{bwrap}`: {source} (install bubblewrap — Debian's package `bubblewrap` —, \
         or set `sandbox.mode = \"off\"` on the profile by name)"
    )]
    Exec {
        /// The path tried.
        bwrap: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Plan {
    /// The plan as the one argv word the pane's init takes.
    pub fn to_arg(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses the word [`Plan::to_arg`] made and checks its paths.
    pub fn from_arg(arg: &str) -> Result<Plan, EnterError> {
        let plan: Plan = serde_json::from_str(arg).map_err(EnterError::Plan)?;
        plan.check()?;
        Ok(plan)
    }

    /// Checks the plan's paths: absolute (or, to bind, `~/…` in the agents' home), no `..`,
    /// nothing to bind inside a hidden place.
    pub fn check(&self) -> Result<(), EnterError> {
        let fixed = [&self.bwrap, &self.cwd]
            .into_iter()
            .chain(&self.hidden)
            .chain(&self.socket);
        for path in fixed {
            if !plain_absolute(path) {
                return Err(EnterError::Path(path.clone()));
            }
        }
        for path in self.writable.iter().chain(&self.readable) {
            let plain = path.strip_prefix(HOME_PREFIX).map_or_else(
                |_| plain_absolute(path),
                |rest| plain_absolute(&Path::new("/").join(rest)),
            );
            if !plain {
                return Err(EnterError::Path(path.clone()));
            }
        }
        for path in self.writable.iter().chain(&self.readable) {
            // A path that holds a hidden place is fine (the place is mounted after it, deeper);
            // one inside it would be bound over the hiding.
            if let Some(hidden) = self.hidden.iter().find(|h| path.starts_with(h)) {
                return Err(EnterError::InsideHidden {
                    path: path.clone(),
                    hidden: hidden.clone(),
                });
            }
        }
        Ok(())
    }

    /// The plan with every `~/…` path resolved in `home` (the agents' user's home, where the
    /// pane's init runs), then checked again.
    pub fn in_home(mut self, home: Option<&Path>) -> Result<Plan, EnterError> {
        for path in self.writable.iter_mut().chain(self.readable.iter_mut()) {
            if let Ok(rest) = path.strip_prefix(HOME_PREFIX) {
                let home = home
                    .filter(|h| plain_absolute(h))
                    .ok_or_else(|| EnterError::NoHome(path.clone()))?;
                *path = home.join(rest);
            }
        }
        self.check()?;
        Ok(self)
    }

    /// bwrap's arguments up to (not including) the command, for a process running as `uid`,
    /// with the seccomp program at `seccomp_fd`. `exists` says what a host path is (the
    /// sandbox is built from what exists when the agent starts).
    pub fn bwrap_args(
        &self,
        uid: u32,
        seccomp_fd: Option<i32>,
        kind: &dyn Fn(&Path) -> Option<Kind>,
    ) -> Vec<OsString> {
        // tmux's default socket directories (`/tmp/tmux-UID`): hidden too when a root or a
        // writable or readable path binds the host's /tmp back (else the sandbox's own /tmp is
        // empty and there is nothing to look for).
        let tmp_bound = self
            .writable
            .iter()
            .chain(&self.readable)
            .any(|p| Path::new("/tmp").starts_with(p));
        let tmux_dirs: Vec<PathBuf> = std::fs::read_dir("/tmp")
            .ok()
            .filter(|_| tmp_bound)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("tmux-"))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |words: &[&str]| args.extend(words.iter().map(OsString::from));
        push(&[
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]);
        if self.network != Network::Host {
            push(&["--unshare-net"]);
        }
        if uid == 0 {
            let id = ROOT_MAPPED_TO.to_string();
            push(&["--uid", &id, "--gid", &id]);
        }
        push(&[
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
        ]);
        for private in PRIVATE {
            push(&["--tmpfs", private]);
        }
        // Deeper paths are mounted later, so that they win: a root under a hidden home is
        // bound back over the empty home; fleetd's places under a root stay hidden.
        let mut mounts: Vec<(usize, Mount<'_>)> = Vec::new();
        for path in ALWAYS_HIDDEN
            .iter()
            .map(Path::new)
            .chain(self.hidden.iter().map(PathBuf::as_path))
            .chain(tmux_dirs.iter().map(PathBuf::as_path))
        {
            mounts.push((depth(path), Mount::Hide(path)));
        }
        for path in &self.writable {
            mounts.push((depth(path), Mount::Write(path)));
        }
        for path in &self.readable {
            mounts.push((depth(path), Mount::Read(path)));
        }
        if let Some(socket) = &self.socket {
            mounts.push((usize::MAX, Mount::Write(socket)));
        }
        mounts.sort_by_key(|(depth, _)| *depth);
        // A place already under an empty tmpfs (a home, /tmp) needs no mount of its own unless
        // something bound back over that tmpfs (there or deeper) holds it: fewer mounts, a
        // faster start.
        let covers: Vec<&Path> = mounts
            .iter()
            .filter_map(|(_, m)| match m {
                Mount::Hide(path) => Some(*path),
                _ => None,
            })
            .chain(PRIVATE.iter().map(Path::new))
            .collect();
        let bound: Vec<&Path> = mounts
            .iter()
            .filter_map(|(_, m)| match m {
                Mount::Write(path) | Mount::Read(path) => Some(*path),
                Mount::Hide(_) => None,
            })
            .collect();
        let covered = |path: &Path| {
            covers.iter().any(|cover| {
                *cover != path
                    && path.starts_with(cover)
                    && !bound
                        .iter()
                        .any(|b| path.starts_with(b) && depth(b) >= depth(cover))
            })
        };
        let mut hidden_once = std::collections::BTreeSet::new();
        mounts.retain(|(_, mount)| match mount {
            Mount::Hide(path) => !covered(path) && hidden_once.insert(*path),
            _ => true,
        });
        for (_, mount) in mounts {
            match mount {
                Mount::Hide(path) => match kind(path) {
                    Some(Kind::Dir) => push(&["--tmpfs", &path.to_string_lossy()]),
                    Some(Kind::File) => {
                        push(&["--ro-bind", "/dev/null", &path.to_string_lossy()]);
                    }
                    None => {}
                },
                Mount::Write(path) => {
                    let p = path.to_string_lossy();
                    push(&["--bind-try", &p, &p]);
                }
                Mount::Read(path) => {
                    let p = path.to_string_lossy();
                    push(&["--ro-bind-try", &p, &p]);
                }
            }
        }
        push(&["--chdir", &self.cwd.to_string_lossy()]);
        if let Some(fd) = seccomp_fd {
            push(&["--seccomp", &fd.to_string()]);
        }
        args
    }
}

/// What a path on the host is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// Anything else (hidden by binding `/dev/null` over it).
    File,
}

/// What a host path is, following no symlink at its end; `None` when it does not exist.
pub fn host_kind(path: &Path) -> Option<Kind> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(if meta.is_dir() { Kind::Dir } else { Kind::File })
}

enum Mount<'a> {
    Hide(&'a Path),
    Write(&'a Path),
    Read(&'a Path),
}

fn depth(path: &Path) -> usize {
    path.components().count()
}

fn plain_absolute(path: &Path) -> bool {
    path.is_absolute() && !path.components().any(|c| matches!(c, Component::ParentDir))
}

/// The seccomp program for `network`, as the bytes bwrap's `--seccomp` reads: every refused
/// call fails with `EPERM`; everything else is allowed. A call from another architecture's
/// table (32-bit calls on a 64-bit kernel) kills the process.
pub fn seccomp_program(network: Network) -> Result<Vec<u8>, EnterError> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };
    let error = |e: seccompiler::BackendError| EnterError::Seccomp(e.to_string());
    // The kernel reads `ioctl`'s request and `socket`'s domain as 32-bit ints: the low 32 bits
    // are what is compared, so no value can hide in the high half.
    let equal = |arg: u8, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value).map_err(error)
    };
    let arch = std::env::consts::ARCH.try_into().map_err(error)?;
    let mut refused = std::collections::BTreeMap::new();
    refused.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![equal(1, libc::TIOCSTI)?]).map_err(error)?,
            SeccompRule::new(vec![equal(1, libc::TIOCLINUX)?]).map_err(error)?,
        ],
    );
    // The kernel keyrings; io_uring (a second way to make sockets and open files, and a large
    // kernel surface: Docker's default profile refuses it too — programs fall back to plain
    // calls).
    for call in [
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        refused.insert(call, Vec::new());
    }
    if network == Network::None {
        let inet = u64::try_from(libc::AF_INET).unwrap_or_default();
        let inet6 = u64::try_from(libc::AF_INET6).unwrap_or_default();
        refused.insert(
            libc::SYS_socket,
            vec![
                SeccompRule::new(vec![equal(0, inet)?]).map_err(error)?,
                SeccompRule::new(vec![equal(0, inet6)?]).map_err(error)?,
            ],
        );
    }
    let filter = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(libc::EPERM).unwrap_or(1)),
        arch,
    )
    .map_err(error)?;
    let program: BpfProgram = filter.try_into().map_err(error)?;
    let mut bytes = x32_guard();
    bytes.extend(
        program
            .iter()
            .flat_map(|f| instruction(f.code, f.jt, f.jf, f.k)),
    );
    Ok(bytes)
}

/// One classic BPF instruction as the kernel reads it (`struct sock_filter`).
fn instruction(code: u16, jt: u8, jf: u8, k: u32) -> [u8; 8] {
    let [c0, c1] = code.to_ne_bytes();
    let [k0, k1, k2, k3] = k.to_ne_bytes();
    [c0, c1, jt, jf, k0, k1, k2, k3]
}

/// On x86-64, the x32 ABI's calls share the architecture and carry bit 30 in their number:
/// a filter that names calls by number would let x32's `keyctl` through where the kernel has
/// x32. Instructions put before the filter refuse every such call (`EPERM`); they only read
/// the number, which sits at the same offset for every architecture, so the filter's own
/// architecture check still follows for everything else.
fn x32_guard() -> Vec<u8> {
    if !cfg!(target_arch = "x86_64") {
        return Vec::new();
    }
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let eperm = u32::try_from(libc::EPERM).unwrap_or(1);
    // (code, jt, jf, k): load the number; if ≥ the x32 bit go on, else skip the return; return.
    let guard: [(u16, u8, u8, u32); 3] = [
        (0x20, 0, 0, 0),                         // BPF_LD | BPF_W | BPF_ABS, seccomp_data.nr
        (0x35, 0, 1, X32_SYSCALL_BIT),           // BPF_JMP | BPF_JGE | BPF_K
        (0x06, 0, 0, SECCOMP_RET_ERRNO | eperm), // BPF_RET | BPF_K
    ];
    guard
        .iter()
        .flat_map(|(code, jt, jf, k)| instruction(*code, *jt, *jf, *k))
        .collect()
}

/// The pane's init for a sandboxed agent: checks the plan, keeps only its environment, applies
/// Landlock, hands the seccomp filter over and replaces itself with bwrap running `argv`.
/// Returns only on failure.
pub fn enter(plan: &str, argv: &[OsString]) -> EnterError {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let plan = match Plan::from_arg(plan).and_then(|p| p.in_home(home.as_deref())) {
        Ok(plan) => plan,
        Err(error) => return error,
    };
    let program = match seccomp_program(plan.network) {
        Ok(program) => program,
        Err(error) => return error,
    };
    // The filter goes through a pipe that bwrap inherits (no close-on-exec) and reads whole.
    let fd = match filter_pipe(&program) {
        Ok(fd) => fd,
        Err(error) => return EnterError::Seccomp(error.to_string()),
    };
    // Landlock first: bwrap and the agent inherit it.
    if let Err(error) = confine(plan.tcp_connect.as_deref()) {
        return EnterError::Landlock(error);
    }
    let uid = rustix::process::getuid().as_raw();
    let mut command = std::process::Command::new(&plan.bwrap);
    command
        .args(plan.bwrap_args(uid, Some(fd), &host_kind))
        .arg("--")
        .args(argv)
        .env_clear();
    for name in &plan.env {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    // A terminal program needs to know its terminal and its locale, every program a PATH: the
    // pane's own (none of them a secret), unless the profile sets them.
    for name in PANE_ENV {
        if !plan.env.iter().any(|n| n == name)
            && let Some(value) = std::env::var_os(name)
        {
            command.env(name, value);
        }
    }
    if std::env::var_os("PATH").is_none() && !plan.env.iter().any(|n| n == "PATH") {
        command.env("PATH", DEFAULT_PATH);
    }
    // The agents' home stays their HOME (hidden but for what the profile names in it).
    if !plan.env.iter().any(|n| n == "HOME") {
        command.env("HOME", home.as_deref().unwrap_or(&plan.cwd));
    }
    let source = command.exec();
    EnterError::Exec {
        bwrap: plan.bwrap,
        source,
    }
}

/// What an agent keeps of its pane's environment besides what the profile and fleetd give it:
/// the terminal, the locale and the PATH.
pub const PANE_ENV: &[&str] = &["TERM", "COLORTERM", "LANG", "LC_ALL", "LC_CTYPE", "PATH"];

/// The PATH of an agent whose pane and profile set none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A pipe holding `program`, its read end left open across exec; the read end's number.
fn filter_pipe(program: &[u8]) -> std::io::Result<i32> {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::empty())?;
    let mut write = std::fs::File::from(write);
    std::io::Write::write_all(&mut write, program)?;
    drop(write);
    let fd = read.as_raw_fd();
    // Kept open for bwrap: it reads the program from this descriptor after the exec.
    let _ = read.into_raw_fd();
    Ok(fd)
}

/// What the pane's init applies to itself before it becomes bwrap: TCP connect limited to
/// `ports` (when given), abstract Unix sockets and signals scoped to the sandbox. Ports asked
/// for but not enforceable (Landlock below ABI 4) fail; the scopes are best effort (ABI 6), as
/// the PID and network namespaces already hold most of what they add. No file access is
/// handled: a domain that handles none restricts no mount, so bwrap can still build the
/// sandbox (and an agent its own nested one).
pub fn confine(ports: Option<&[u16]>) -> Result<(), ConfineError> {
    use landlock::{
        AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
        RulesetStatus, Scope,
    };
    let error = |e: landlock::RulesetError| ConfineError(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(error)?;
    if ports.is_some() {
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::ConnectTcp)
            .map_err(error)?;
    }
    let mut created = ruleset.create().map_err(error)?;
    for port in ports.unwrap_or_default() {
        created = created
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(error)?;
    }
    let status = created.restrict_self().map_err(error)?;
    if ports.is_some() && status.ruleset == RulesetStatus::NotEnforced {
        return Err(ConfineError(
            "Landlock is not enforced on this kernel: TCP ports cannot be limited".to_owned(),
        ));
    }
    Ok(())
}

/// Landlock refused what the profile asked for.
#[derive(Debug, thiserror::Error)]
#[error("cannot confine the agent with Landlock: {0}")]
pub struct ConfineError(String);

#[cfg(test)]
mod tests;
