//! `fleetd sandbox probe`: applies exactly the sandbox `fleetd run` would (same config, same
//! secrets, same plan), then tries the reads, writes, connects and executions it is given and
//! says which the kernel allowed. Operators run it after a kernel or config change; the tests
//! use it to prove that forbidden accesses fail. It first says whether this host can build each
//! agent's own sandbox (bubblewrap, user namespaces).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::{Output, exit};
use crate::config::Config;
use crate::sandbox::{self, Plan};
use crate::secret;

/// `fleetd sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Apply the daemon's sandbox, then try each access and report allowed or refused.
    Probe {
        /// Read this file or list this directory (repeatable).
        #[arg(long, value_name = "PATH")]
        read: Vec<PathBuf>,
        /// Create and write this file, then remove it (repeatable).
        #[arg(long, value_name = "PATH")]
        write: Vec<PathBuf>,
        /// Open a TCP connection to this address, `IP:PORT` (repeatable).
        #[arg(long, value_name = "ADDR")]
        connect: Vec<std::net::SocketAddr>,
        /// Run this program with no arguments (repeatable).
        #[arg(long, value_name = "PATH")]
        exec: Vec<PathBuf>,
    },
}

pub(super) fn run(command: &SandboxCommand, config_path: Option<&Path>, out: &Output) -> ExitCode {
    let SandboxCommand::Probe {
        read,
        write,
        connect,
        exec,
    } = command;
    let config = match Config::load(config_path) {
        Ok(config) => config,
        Err(error) => return super::config_check::report(&error, out),
    };
    let secrets = match secret::resolve_all(&config.secrets) {
        Ok(secrets) => secrets,
        Err(error) => {
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    };
    let plan = Plan::for_daemon(&config, &super::run::broker_ports(&secrets));
    drop(secrets);
    // What agents would get, tried before fleetd's own sandbox (which runs no program).
    out.line(&agents_line());
    match sandbox::apply(&plan, config.sandbox) {
        Ok(enforced) => out.line(&enforced.to_string()),
        Err(error) => {
            out.error(&error);
            return exit::code(exit::FAILED);
        }
    }
    for path in read {
        let result = if path.is_dir() {
            std::fs::read_dir(path).map(drop)
        } else {
            std::fs::read(path).map(drop)
        };
        out.line(&verdict("read", &path.display().to_string(), result));
    }
    for path in write {
        let result = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .and_then(|mut file| file.write_all(b"probe\n"))
            .and_then(|()| std::fs::remove_file(path));
        out.line(&verdict("write", &path.display().to_string(), result));
    }
    for addr in connect {
        let result =
            std::net::TcpStream::connect_timeout(addr, std::time::Duration::from_secs(2)).map(drop);
        out.line(&verdict("connect", &addr.to_string(), result));
    }
    for path in exec {
        let result = std::process::Command::new(path)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(drop);
        out.line(&verdict("exec", &path.display().to_string(), result));
    }
    exit::code(exit::OK)
}

/// Whether this host can build an agent's sandbox: bubblewrap where fleetd looks for it, and
/// able to make the namespaces every sandbox gets (as the user running the probe).
fn agents_line() -> String {
    let Some(bwrap) = crate::spawn::find_bwrap() else {
        return format!(
            "agents: no sandbox: no bubblewrap at {} (install Debian's package `bubblewrap`); \
             spawns of sandboxed profiles are refused",
            crate::spawn::BWRAP.join(" or ")
        );
    };
    let sys = std::path::Path::new(crate::sandbox::agent::PROC_SYS);
    if let Some(off) = crate::sandbox::agent::userns_off(sys, &bwrap) {
        return format!("agents: no sandbox: {off}; spawns of sandboxed profiles are refused");
    }
    // The sandbox an agent of a default profile gets, around /bin/true.
    let plan = crate::sandbox::agent::Plan {
        bwrap: bwrap.clone(),
        network: crate::policy::Network::None,
        tcp_connect: None,
        cwd: "/".into(),
        writable: Vec::new(),
        readable: Vec::new(),
        hidden: Vec::new(),
        socket: None,
        env: Vec::new(),
    };
    let uid = rustix::process::getuid().as_raw();
    let tried = std::process::Command::new(&bwrap)
        .args(plan.bwrap_args(uid, None, &crate::sandbox::agent::host_kind))
        .args(["--", "/bin/true"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output();
    match tried {
        Ok(out) if out.status.success() => format!(
            "agents: sandboxed by {} (user, PID, IPC, UTS and network namespaces, private /tmp; \
             seccomp and Landlock inside)",
            bwrap.display()
        ),
        Ok(out) => format!(
            "agents: no sandbox: {} cannot build one here: {} (unprivileged user namespaces \
             off? Ubuntu restricts them through AppArmor); spawns of sandboxed profiles fail",
            bwrap.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(error) => format!(
            "agents: no sandbox: cannot run {}: {error}",
            bwrap.display()
        ),
    }
}

fn verdict(what: &str, target: &str, result: std::io::Result<()>) -> String {
    match result {
        Ok(()) => format!("allowed {what} {target}"),
        Err(error) => format!("refused {what} {target} ({error})"),
    }
}
