//! The pane's init: the first process of every pane fleetd launches (`fleetd pane-init -- ARGV`,
//! run by the multiplexer's server as the agents' user), so that stopping an agent ends
//! everything it started.
//!
//! An agent's processes do not all stay in its tree: Codex 0.171 starts `codex app-server`
//! daemons that leave its session (`setsid`) and, when Codex exits, would be reparented to
//! PID 1 and live on — closing the pane, a failed readiness gate or a killed tmux server left
//! 14 of them from 7 starts, still writing into the agent's home. The init is the **child
//! subreaper** of its pane (`PR_SET_CHILD_SUBREAPER`): the kernel reparents every orphan of the
//! tree to it, never past it. It starts the agent as its child (same process group: the
//! terminal's foreground, so the agent keeps its terminal), passes SIGHUP and SIGTERM on to it
//! (the terminal delivers SIGINT and SIGQUIT to the agent itself), and when the agent ends —
//! by itself, or because the pane closed or the server died (the terminal hangs up) — it ends
//! every process still under it: SIGTERM to each, SIGKILL after [`GRACE`] to whatever remains,
//! generation by generation (killing a parent hands its children to the init), until it has
//! no child left. Only its own unreaped children are ever signalled, so a pid is never reused
//! under it. Then it exits with the agent's status (128 + the signal's number when a signal
//! ended the agent).
//!
//! The agent runs as the same user as its init and could kill it (SIGKILL) before it does its
//! work; an agent that means to outlive its pane can also ask the multiplexer's server (its
//! user's) to run something. The per-agent sandbox (its own PID namespace) is what closes that.
//!
//! Imports: nothing from the crate (a leaf); `/proc` is read through [`super::process`].

use std::collections::HashSet;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::signal::unix::{SignalKind, signal};

/// How long the agent and what it left behind get after SIGTERM before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long the init waits for the last processes to die after SIGKILL (a process in
/// uninterruptible sleep cannot) before it exits regardless.
const GIVE_UP: Duration = Duration::from_secs(10);

pub use super::INIT_SUBCOMMAND as SUBCOMMAND;

/// The line the init prints when it cannot run its agent (or enter its sandbox): on the pane's
/// screen, where the readiness gate finds it.
pub fn failure(error: &dyn std::fmt::Display) -> String {
    format!("fleetd {SUBCOMMAND}: {error}")
}

/// Whether `line` is one [`failure`] printed.
pub fn is_failure(line: &str) -> bool {
    line.strip_prefix("fleetd ")
        .and_then(|rest| rest.strip_prefix(SUBCOMMAND))
        .is_some_and(|rest| rest.starts_with(':'))
}

/// Why the init could not run its agent.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// Nothing to run.
    #[error("no command to run")]
    Empty,
    /// The kernel refused to make it the pane's subreaper.
    #[error("cannot become the pane's child subreaper: {0}")]
    Subreaper(#[source] std::io::Error),
    /// Its runtime or signal handlers could not be set up.
    #[error("cannot set up signal handling: {0}")]
    Signals(#[source] std::io::Error),
    /// The agent's program could not be started.
    #[error("cannot run `{program}`: {source}")]
    Spawn {
        /// argv[0].
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Runs `argv` as the pane's agent (see the module comment); the exit status to end with.
pub fn run(argv: &[OsString]) -> Result<u8, InitError> {
    let (program, args) = argv.split_first().ok_or(InitError::Empty)?;
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| InitError::Subreaper(e.into()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(InitError::Signals)?;
    runtime.block_on(async {
        let mut hangup = signal(SignalKind::hangup()).map_err(InitError::Signals)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(InitError::Signals)?;
        // Installed so that the terminal's SIGINT and SIGQUIT, meant for the agent in the same
        // process group, do not end the init.
        let mut interrupt = signal(SignalKind::interrupt()).map_err(InitError::Signals)?;
        let mut quit = signal(SignalKind::quit()).map_err(InitError::Signals)?;
        let mut child = signal(SignalKind::child()).map_err(InitError::Signals)?;
        let agent = std::process::Command::new(program)
            .args(args)
            .spawn()
            .map_err(|source| InitError::Spawn {
                program: program.to_string_lossy().into_owned(),
                source,
            })?;
        let agent = i32::try_from(agent.id())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| InitError::Spawn {
                program: program.to_string_lossy().into_owned(),
                source: std::io::Error::other("no process id"),
            })?;
        let mut kill_at: Option<tokio::time::Instant> = None;
        let status = loop {
            if let Some(status) = reap(Some(agent)) {
                break status;
            }
            let pass = |sig: Signal| {
                let _ = rustix::process::kill_process(agent, sig);
            };
            tokio::select! {
                _ = hangup.recv() => {
                    pass(Signal::HUP);
                    kill_at.get_or_insert(tokio::time::Instant::now() + GRACE);
                }
                _ = terminate.recv() => {
                    pass(Signal::TERM);
                    kill_at.get_or_insert(tokio::time::Instant::now() + GRACE);
                }
                _ = interrupt.recv() => {}
                _ = quit.recv() => {}
                _ = child.recv() => {}
                () = sleep_until(kill_at) => pass(Signal::KILL),
                // A signal that arrived between the look and the wait is caught up with here.
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        };
        end_the_rest(&mut child).await;
        Ok(status)
    })
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Reaps every child that ended; the exit status of `agent`, when it was among them.
fn reap(agent: Option<Pid>) -> Option<u8> {
    let mut found = None;
    while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
        if Some(pid) == agent {
            found = Some(match (status.exit_status(), status.terminating_signal()) {
                (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
                (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(1),
                (None, None) => 1,
            });
        }
    }
    found
}

/// Ends every process left under the init (see the module comment).
async fn end_the_rest(child: &mut tokio::signal::unix::Signal) {
    let started = Instant::now();
    let mut asked: HashSet<Pid> = HashSet::new();
    loop {
        reap(None);
        let left = children();
        if left.is_empty() {
            return;
        }
        let late = started.elapsed() >= GRACE;
        if started.elapsed() >= GRACE + GIVE_UP {
            return;
        }
        for pid in left {
            if asked.insert(pid) {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
            if late {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
        }
        tokio::select! {
            _ = child.recv() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// The init's children that are not yet reaped zombies.
fn children() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    super::process::children(u32::try_from(me).unwrap_or_default())
        .into_iter()
        .filter_map(|pid| Pid::from_raw(i32::try_from(pid).ok()?))
        .collect()
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    #[test]
    fn the_inits_failure_line_is_recognised_and_nothing_else_is() {
        assert!(is_failure(&failure(&"no command to run")));
        assert!(!is_failure("fleetd pane-initx: no"));
        assert!(!is_failure("fleetd send: refused"));
        assert!(!is_failure("agent> ready"));
    }
}
