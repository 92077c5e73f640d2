//! The process fleetd launched in a pane, as the kernel knows it — not as the multiplexer says.
//!
//! The multiplexer's server is the agents' (their user owns it), so its word on a pane is
//! theirs: a pane can be respawned under a live agent's identity, and a fake or failing server
//! can claim a live agent is gone. What fleetd trusts instead is the kernel:
//!
//! - a **pid file descriptor** opened when the agent's pane is launched names exactly that
//!   process, never a later one with a reused pid; it turns readable when the process ends
//!   (`respawn-pane -k` kills it; a respawn of a dead pane makes a new one);
//! - where fleetd can see the agent's `/proc/PID/stat` (not under the unit's
//!   `ProtectProc=invisible`, which hides other users' processes), its **start time** (a pid
//!   reused while fleetd was down is not the agent) and its **name** (`comm`, which `execve`
//!   sets: a pane process that executed another program is no longer the agent). Under
//!   fleetd's pane init ([`super::init`]) the name watched is the agent's, the init's first
//!   child, found when the agent became ready; once that process is gone the agent has ended.
//!
//! Imports: nothing from the crate (a leaf).

use std::os::fd::OwnedFd;

/// Whether an agent's process is still the one fleetd launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It runs, as launched.
    Running,
    /// It ended (or its pid now names another process).
    Ended,
    /// It runs another program than the one that became ready (`execve`).
    Replaced {
        /// The name it had.
        was: String,
        /// The name it has.
        now: String,
    },
}

impl Liveness {
    /// Why the agent is gone, or `None` while it runs as launched.
    pub fn why_gone(&self, pid: u32) -> Option<String> {
        match self {
            Liveness::Running => None,
            Liveness::Ended => Some(format!("its process (pid {pid}) ended")),
            Liveness::Replaced { was, now } => Some(format!(
                "its process (pid {pid}) now runs `{now}`, not the `{was}` fleetd launched"
            )),
        }
    }
}

/// An agent's process, watched through a pid file descriptor.
#[derive(Debug)]
pub struct Watched {
    pid: u32,
    /// Its start time in clock ticks after boot, when `/proc` showed it.
    start: Option<u64>,
    /// Its name (`comm`) when it became ready, when `/proc` showed it.
    comm: Option<String>,
    /// `None` where the kernel has no pid file descriptors: `/proc` alone decides.
    pidfd: Option<OwnedFd>,
    /// Under fleetd's pane init, the agent's own process, whose name `comm` is.
    program: Option<Program>,
}

/// The agent's own process under fleetd's pane init: the init's first child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    /// Its process id.
    pub pid: u32,
    /// Its start time in clock ticks after boot.
    pub start: u64,
}

impl PartialEq for Watched {
    fn eq(&self, other: &Watched) -> bool {
        (self.pid, self.start, &self.comm, self.program)
            == (other.pid, other.start, &other.comm, other.program)
    }
}

impl Eq for Watched {}

impl Watched {
    /// Starts watching process `pid` now (at launch): its pid descriptor, and what `/proc`
    /// shows of it. `Ok(None)`: it has already ended.
    pub fn launched(pid: u32) -> std::io::Result<Option<Watched>> {
        let (start, comm) = stat(pid).map_or((None, None), |s| (Some(s.start), Some(s.comm)));
        // Opened as after a restart: a pid that ended and was reused in between is not it.
        Watched::reopen(pid, start, comm, None)
    }

    /// Watches process `pid` again (after a restart) as recorded: it must still exist, with
    /// the recorded start time where `/proc` shows it. `None`: it ended.
    pub fn reopen(
        pid: u32,
        start: Option<u64>,
        comm: Option<String>,
        program: Option<Program>,
    ) -> std::io::Result<Option<Watched>> {
        let pidfd = match open_pidfd(pid) {
            Ok(fd) => fd,
            Err(error) if error.raw_os_error() == Some(ESRCH) => return Ok(None),
            Err(error) => return Err(error),
        };
        if let (Some(start), Some(now)) = (start, stat(pid))
            && now.start != start
        {
            return Ok(None);
        }
        Ok(Some(Watched {
            pid,
            start,
            comm,
            pidfd,
            program,
        }))
    }

    /// Takes the agent's name as it is now as the one it must keep (when the agent became
    /// ready: a wrapper may have executed the agent before that): the pane process's, or under
    /// fleetd's pane init its first child's.
    pub fn settle(&mut self) {
        if let Some((program, comm)) = agent_under_init(self.pid) {
            self.program = Some(program);
            self.comm = Some(comm);
        } else if let Some(now) = stat(self.pid) {
            self.comm = Some(now.comm);
        }
    }

    /// Under fleetd's pane init, the agent's own process.
    pub fn program(&self) -> Option<Program> {
        self.program
    }

    /// Whether it started before `ticks` (see [`ticks_now`]), when `/proc` showed its start: a
    /// process that did was not made by the launch fleetd asked for at `ticks`.
    pub fn started_before(&self, ticks: u64) -> bool {
        self.start
            .is_some_and(|start| start.saturating_add(1) < ticks)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its start time (clock ticks after boot), when `/proc` showed it.
    pub fn start(&self) -> Option<u64> {
        self.start
    }

    /// Its name when it became ready, when `/proc` showed it.
    pub fn comm(&self) -> Option<&str> {
        self.comm.as_deref()
    }

    /// Whether the process is still the one launched.
    pub fn check(&self) -> Liveness {
        if self.pidfd.as_ref().is_some_and(ended) {
            return Liveness::Ended;
        }
        match stat(self.pid) {
            Some(now) if self.start.is_some_and(|start| start != now.start) => Liveness::Ended,
            Some(now) => {
                // Under the init, the agent's own process is the one whose name counts; once it
                // is gone (the init ends the rest), the agent has ended.
                let now = match self.program {
                    Some(program) => match stat(program.pid) {
                        Some(agent)
                            if agent.start == program.start && under(agent.ppid, self.pid) =>
                        {
                            agent
                        }
                        _ => return Liveness::Ended,
                    },
                    None => now,
                };
                match &self.comm {
                    Some(was) if *was != now.comm => Liveness::Replaced {
                        was: was.clone(),
                        now: now.comm,
                    },
                    _ => Liveness::Running,
                }
            }
            // Not shown: gone, or hidden from fleetd (`ProtectProc=invisible`) — the pid
            // descriptor decides; without one, a process that was shown and no longer is ended.
            None if self.pidfd.is_none() && self.start.is_some() => Liveness::Ended,
            None => Liveness::Running,
        }
    }
}

/// Now, in the clock ticks after boot that `/proc/PID/stat` counts start times in; `None`
/// where `/proc/uptime` cannot be read.
pub fn ticks_now() -> Option<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let (whole, hundredths) = uptime.split_whitespace().next()?.split_once('.')?;
    let centis = whole.parse::<u64>().ok()?.checked_mul(100)? + hundredths.parse::<u64>().ok()?;
    Some(centis.checked_mul(rustix::param::clock_ticks_per_second())? / 100)
}

const ESRCH: i32 = 3;

/// What `/proc/PID/stat` says of a process.
struct Stat {
    comm: String,
    state: char,
    ppid: u32,
    start: u64,
}

/// When process `pid` is fleetd's pane init (its command line `… pane-init -- …`, where `/proc`
/// shows it), its first child — the agent — and that child's name.
fn agent_under_init(pid: u32) -> Option<(Program, String)> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    let program = args.next()?;
    if args.next()? == super::INIT_SUBCOMMAND.as_bytes() && args.next()? == b"--" {
        return first_child(pid);
    }
    // In its sandbox the pane's process is bwrap (the init became it), its child bwrap's init
    // of the PID namespace, and that one's child the agent.
    if !is_bwrap(program) {
        return None;
    }
    let mut at = pid;
    for _ in 0..SANDBOX_DEPTH {
        let child = first_child(at)?;
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.0.pid)).ok()?;
        if !is_bwrap(cmdline.split(|b| *b == 0).next()?) {
            return Some(child);
        }
        at = child.0.pid;
    }
    None
}

fn is_bwrap(program: &[u8]) -> bool {
    program.ends_with(b"/bwrap") || program == b"bwrap"
}

/// Whether `parent` is `ancestor` or, in a sandbox, a bubblewrap process a few levels under it
/// ([`SANDBOX_DEPTH`]).
fn under(parent: u32, ancestor: u32) -> bool {
    let mut at = parent;
    for _ in 0..SANDBOX_DEPTH {
        if at == ancestor {
            return true;
        }
        match stat(at) {
            Some(stat) => at = stat.ppid,
            None => return false,
        }
    }
    at == ancestor
}

/// How many bubblewrap processes may stand between a pane and its agent.
const SANDBOX_DEPTH: usize = 3;

/// The eldest live child of `pid`, and its name.
fn first_child(pid: u32) -> Option<(Program, String)> {
    children(pid)
        .into_iter()
        .filter_map(|child| Some((child, stat(child)?)))
        .min_by_key(|(child, stat)| (stat.start, *child))
        .map(|(child, stat)| {
            (
                Program {
                    pid: child,
                    start: stat.start,
                },
                stat.comm,
            )
        })
}

/// The live children of process `pid`, zombies left out: from the kernel's list of each of its
/// threads' children (`/proc/PID/task/TID/children`) where it has one, else by a scan of `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    listed_children(pid).unwrap_or_else(|| scanned_children(pid))
}

/// `/proc/PID/task/*/children`, live ones only; `None` where the kernel has no such file.
fn listed_children(pid: u32) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).ok()?;
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .filter(|child| stat(*child).is_some_and(|s| s.ppid == pid && s.state != 'Z')),
        );
    }
    Some(out)
}

/// Every process `/proc` shows with `pid` as parent, zombies left out.
fn scanned_children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| stat(*child).is_some_and(|s| s.ppid == pid && s.state != 'Z'))
        .collect()
}

/// `/proc/PID/stat`'s name and start time (field 22), or `None` when fleetd cannot see it.
fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The name is between the first `(` and the last `)`: it may hold either, and spaces.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    // After the name: state (field 3), ppid (4) … starttime (field 22).
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(Stat {
        comm,
        state,
        ppid,
        start,
    })
}

#[cfg(target_os = "linux")]
fn open_pidfd(pid: u32) -> std::io::Result<Option<OwnedFd>> {
    let raw = i32::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(ESRCH))?;
    let pid = rustix::process::Pid::from_raw(raw)
        .ok_or_else(|| std::io::Error::from_raw_os_error(ESRCH))?;
    match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(fd)),
        // A kernel before 5.3: no pid descriptors; `/proc` decides.
        Err(rustix::io::Errno::NOSYS) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_pidfd(_pid: u32) -> std::io::Result<Option<OwnedFd>> {
    Ok(None)
}

/// A pid descriptor turns readable when its process has ended.
fn ended(fd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_running_until_it_ends_and_an_exec_replaces_it() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "read x; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut watched = Watched::launched(child.id()).unwrap().unwrap();
        watched.settle();
        assert_eq!(watched.comm(), Some("sh"));
        assert!(watched.start().is_some());
        assert_eq!(watched.check(), Liveness::Running);
        // The process executes another program: same pid, same start, another name.
        drop(child.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while watched.check() == Liveness::Running && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            watched.check(),
            Liveness::Replaced {
                was: "sh".to_owned(),
                now: "sleep".to_owned()
            }
        );
        let reopen =
            || Watched::reopen(watched.pid(), watched.start(), Some("sh".to_owned()), None);
        let again = reopen().unwrap().unwrap();
        assert!(matches!(again.check(), Liveness::Replaced { .. }));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(watched.check(), Liveness::Ended);
        assert!(reopen().unwrap().is_none());
    }

    #[test]
    fn a_process_started_earlier_is_told_from_one_started_now() {
        let asked = ticks_now().unwrap();
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fresh = Watched::launched(child.id()).unwrap().unwrap();
        assert!(
            !fresh.started_before(asked),
            "started after it was asked for"
        );
        let old = Watched::launched(1).unwrap().unwrap();
        assert!(old.started_before(asked), "pid 1 started at boot");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_reused_pid_is_not_the_agent() {
        let watched = Watched::reopen(std::process::id(), Some(1), None, None).unwrap();
        assert!(watched.is_none(), "this process did not start at tick 1");
    }

    #[test]
    fn a_name_with_spaces_and_parentheses_is_read_whole() {
        let fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        let text = format!("4242 (a) b (c) {}\n", fields.join(" "));
        let stat = parse_stat(&text).unwrap();
        assert_eq!(stat.comm, "a) b (c");
        assert_eq!(stat.start, 22);
        assert!(parse_stat("4242 (x) S 1").is_none());
    }

    #[test]
    fn a_killed_process_has_ended() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watched = Watched::launched(child.id()).unwrap().unwrap();
        assert_eq!(watched.comm(), Some("sleep"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(watched.check(), Liveness::Ended);
        assert_eq!(
            Liveness::Ended.why_gone(7).as_deref(),
            Some("its process (pid 7) ended")
        );
    }
}
