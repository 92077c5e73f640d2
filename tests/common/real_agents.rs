//! A host for the real agent CLIs (issue 34): Claude Code and Codex as pinned by
//! `scripts/agents`, in fleetd's tmux panes, single-host mode, offline — their API calls fail,
//! which says nothing about fleetd.
//!
//! The shipped policy directory (`policy/`) is used as shipped. Its profiles name
//! `/usr/local/bin/claude`, `/usr/local/bin/codex` and roots under `/srv/fleet`; the host's own
//! directories are left alone: fleetd, its tmux server and the agents run in a mount namespace
//! of their own (`unshare -m`), where `/usr/local/bin` is a tmpfs holding links to the pinned
//! binaries and `/srv` a tmpfs. The only file added to the policy is a grant for this host's
//! own operator (the shipped grants admit a remote fleet). The agents' home is prepared as
//! docs/panes.md ("Real agents") tells an operator to prepare it — or left unprepared, to see
//! the dialogs. Needs root (mount namespace, `nsenter`). Self-contained: benches include it too.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "shared test helpers; each includer uses part"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// The canary API keys the agents get through fleetd's credentials (never valid anywhere).
pub const ANTHROPIC_KEY: &str = "sk-ant-api03-fleetdCanaryKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA-Zq9Xw2AA";
pub const OPENAI_KEY: &str =
    "sk-proj-fleetdCanaryKeyBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
pub const GITHUB_TOKEN: &str = "ghp_fleetdCanaryCCCCCCCCCCCCCCCCCCCCCCCCCC";

/// The directory holding `claude` and `codex` (`scripts/agents` prints it; the test command
/// exports it as `REAL_AGENTS_BIN`). Panics naming what is missing.
pub fn agents_dir() -> PathBuf {
    let dir = std::env::var_os("REAL_AGENTS_BIN").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-agents/bin"),
        PathBuf::from,
    );
    for cli in ["claude", "codex"] {
        assert!(
            dir.join(cli).exists(),
            "the real agent CLIs are missing ({} has no `{cli}`): run scripts/agents (npm and \
             the npm registry), or set REAL_AGENTS_BIN",
            dir.display()
        );
    }
    dir
}

/// How the agents' home is prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// As docs/panes.md tells an operator: both CLIs start ready, without a dialog.
    Prepared,
    /// Claude Code onboarded but its folder trust not given; Codex with no trusted project.
    Untrusted,
    /// Claude Code trusting the folder but never asked about its API key.
    KeyUnapproved,
    /// Nothing at all: Codex shows its login menu.
    Fresh,
}

/// One host: a mount namespace with the shipped paths, a tmux server, a running fleetd.
pub struct World {
    pub dir: tempfile::TempDir,
    holder: Child,
    daemon: Option<Child>,
    log: Option<mpsc::Receiver<String>>,
}

impl World {
    /// Starts the namespace, the agents' tmux server and fleetd on the shipped policy.
    pub fn start(home: Home) -> World {
        let agents = agents_dir();
        let dir = tempfile::tempdir().unwrap();
        // The namespace lives as long as this process: `sleep` inside it.
        let script = format!(
            "set -e; mount -t tmpfs -o mode=0755 fleetd-test /usr/local/bin; \
             ln -s {agents}/claude /usr/local/bin/claude; ln -s {agents}/codex /usr/local/bin/codex; \
             mount -t tmpfs -o mode=0755 fleetd-test /srv; mkdir -p /srv/fleet/work /srv/fleet/review; \
             echo up; exec sleep 100000",
            agents = agents.display()
        );
        let mut holder = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) is needed for the real-agent host");
        let mut up = String::new();
        let mut out = BufReader::new(holder.stdout.take().unwrap());
        out.read_line(&mut up).unwrap();
        if up.trim() != "up" {
            let mut err = String::new();
            let _ = holder.stderr.take().unwrap().read_to_string(&mut err);
            panic!("cannot build the real-agent host's mount namespace (needs root): {err}");
        }
        let mut world = World {
            dir,
            holder,
            daemon: None,
            log: None,
        };
        world.prepare(home);
        world.policy();
        std::fs::create_dir_all(world.path().join("credentials")).unwrap();
        std::fs::write(
            world.path().join("credentials/anthropic-api-key"),
            ANTHROPIC_KEY,
        )
        .unwrap();
        std::fs::write(world.path().join("credentials/openai-api-key"), OPENAI_KEY).unwrap();
        world.secret("github-worker", GITHUB_TOKEN);
        std::fs::create_dir_all(world.path().join("tmux")).unwrap();
        let mut tmux = world.command("tmux");
        tmux.args([
            "-L",
            "fleetd",
            "new-session",
            "-d",
            "-s",
            "keep",
            "-x",
            "160",
        ])
        .args(["-y", "50", "sleep 100000"]);
        assert!(tmux.status().unwrap().success(), "the agents' tmux server");
        // Windows fleetd opens are wide enough for a message's frame on one line.
        world.tmux(&["set-option", "-g", "default-size", "200x50"]);
        let mut run = world.command(BIN);
        run.arg("run").stdout(Stdio::null()).stderr(Stdio::piped());
        let mut daemon = run.spawn().unwrap();
        let (send, log) = mpsc::channel();
        let stderr = daemon.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let by = Instant::now() + Duration::from_secs(30);
        let mut seen = String::new();
        while !seen.contains("fleetd ready") {
            let left = by.saturating_duration_since(Instant::now());
            match log.recv_timeout(left) {
                Ok(line) => {
                    seen.push_str(&line);
                    seen.push('\n');
                }
                Err(_) => panic!("fleetd did not start: {seen}"),
            }
        }
        world.daemon = Some(daemon);
        world.log = Some(log);
        world
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The agents' home (the tmux server's `HOME`, which panes inherit).
    pub fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    /// `program` inside the namespace, in this host's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .arg("--")
            .arg(program)
            .env_clear()
            .env("HOME", self.home())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TERM", "xterm-256color")
            .env("LANG", "C.UTF-8")
            .env("XDG_STATE_HOME", self.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.path().join("run"))
            // A directory of its own: every agent's sandbox hides it (not the home beside it).
            .env("TMUX_TMPDIR", self.path().join("tmux"))
            .env("CREDENTIALS_DIRECTORY", self.path().join("credentials"));
        command
    }

    /// The agents' home, prepared as docs/panes.md says (or not, per `home`).
    fn prepare(&self, home: Home) {
        let dir = self.home();
        std::fs::create_dir_all(dir.join(".codex")).unwrap();
        // Claude Code: onboarding done (`hasCompletedOnboarding`, the version it was done
        // for, a theme), the key fleetd passes approved by its last 20 characters, the roots
        // trusted.
        let suffix = &ANTHROPIC_KEY[ANTHROPIC_KEY.len() - 20..];
        let mut claude = serde_json::json!({
            "hasCompletedOnboarding": true,
            "lastOnboardingVersion": "2.1.197",
            "theme": "dark",
            "customApiKeyResponses": {"approved": [suffix], "rejected": []},
            "projects": {
                "/srv/fleet/work": {"hasTrustDialogAccepted": true},
                "/srv/fleet/review": {"hasTrustDialogAccepted": true},
            },
        });
        // Codex: a model provider whose key is read from OPENAI_API_KEY (no login, no key on
        // disk), the roots trusted.
        let mut codex = String::from(
            "model_provider = \"openai-env\"\n\n\
             [model_providers.openai-env]\n\
             name = \"OpenAI (API key from the environment)\"\n\
             base_url = \"https://api.openai.com/v1\"\n\
             env_key = \"OPENAI_API_KEY\"\n\
             wire_api = \"responses\"\n",
        );
        let trust = "\n[projects.\"/srv/fleet/work\"]\ntrust_level = \"trusted\"\n";
        match home {
            Home::Prepared => codex.push_str(trust),
            Home::Untrusted => {
                claude["projects"] = serde_json::json!({});
            }
            Home::KeyUnapproved => {
                claude["customApiKeyResponses"] =
                    serde_json::json!({"approved": [], "rejected": []});
                codex.push_str(trust);
            }
            Home::Fresh => {
                codex.clear();
                claude = serde_json::json!({});
            }
        }
        if home != Home::Fresh {
            std::fs::write(dir.join(".claude.json"), claude.to_string()).unwrap();
        }
        std::fs::write(dir.join(".codex/config.toml"), codex).unwrap();
    }

    /// The shipped policy directory, plus a grant for this host's own operator.
    fn policy(&self) {
        let policy = self.home().join(".config/fleetd/policy");
        std::fs::create_dir_all(&policy).unwrap();
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
        for entry in std::fs::read_dir(&shipped).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                std::fs::copy(&path, policy.join(path.file_name().unwrap())).unwrap();
            }
        }
        // Codex as it runs by default (with its shared app-server daemon, which leaves the
        // agent's session): what used to outlive its pane.
        std::fs::write(
            policy.join("50-operator.toml"),
            "[profile.codex-default]\ndescription = \"Codex with its default shared daemon.\"\n\
             argv = [\"/usr/local/bin/codex\"]\nroots = [\"/srv/fleet/work\"]\n\
             secrets = { OPENAI_API_KEY = \"credential:openai-api-key\" }\nmax_instances = 2\n\
             [profile.codex-default.ready]\npattern = \"^›\"\ninput = \"^›\"\nsettle_secs = 4\n\
             [profile.codex-default.sandbox]\nnetwork = \"host\"\ntcp_connect = [443]\n\
             writable = [\"~/.codex\"]\n\n\
             [[grant]]\nid = \"operator\"\ndescription = \"This host's operator runs agents.\"\n\
             fleets = [\"local\"]\nprofiles = [\"worker\", \"reviewer\", \"codex\", \"codex-default\"]\n\
             cwd = true\n",
        )
        .unwrap();
    }

    /// Stores keyring secret `name` the way an operator does (`fleetd secret set`).
    fn secret(&self, name: &str, value: &str) {
        let mut set = self.command(BIN);
        set.args(["secret", "set", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = set.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(value.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "fleetd secret set {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `fleetd ARGS --json` as the operator.
    pub fn fleetd(&self, args: &[&str]) -> Value {
        let out = self.command(BIN).args(args).arg("--json").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&text).unwrap_or_else(|_| {
            panic!(
                "fleetd {args:?}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// `tmux -L fleetd ARGS` inside the namespace: its stdout.
    pub fn tmux(&self, args: &[&str]) -> String {
        let out = self
            .command("tmux")
            .arg("-L")
            .arg("fleetd")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Spawns `profile` as this host's operator: the reply.
    pub fn spawn(&self, profile: &str, label: &str) -> Value {
        self.fleetd(&["spawn", "--profile", profile, "--label", label])
    }

    /// The pane running agent `id` (`FLEETD_AGENT_ID` in its process's environment).
    pub fn pane_of(&self, id: &str) -> String {
        let panes = self.tmux(&["list-panes", "-a", "-F", "#{pane_id} #{pane_pid}"]);
        panes
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(_, pid)| {
                environ(pid.parse().unwrap_or(0)).contains(&format!("FLEETD_AGENT_ID={id}\0"))
            })
            .map(|(pane, _)| pane.to_owned())
            .unwrap_or_else(|| panic!("no pane runs agent {id}: {panes}"))
    }

    /// What pane `pane` shows, its history included (wrapped lines joined).
    pub fn shown(&self, pane: &str) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", pane, "-S", "-2000"])
    }

    /// The audit log so far.
    pub fn audit(&self) -> String {
        std::fs::read_to_string(self.path().join("state/fleetd/audit.jsonl")).unwrap_or_default()
    }

    /// The roster's entry for agent `id`, as this host's operator reads it.
    pub fn roster_entry(&self, id: &str) -> Value {
        let roster = self.fleetd(&["roster"]);
        roster["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|h| h["agents"].as_array().cloned().unwrap_or_default())
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("agent {id} is not in the roster: {roster}"))
    }

    /// Every process of any agent of this host (its home and a `FLEETD_AGENT_ID`).
    pub fn agent_processes(&self) -> Vec<Proc> {
        let home = format!("HOME={}\0", self.home().display());
        processes_with("FLEETD_AGENT_ID=")
            .into_iter()
            .filter(|p| environ(p.pid).contains(&home))
            .collect()
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        let mut all = String::new();
        if let Some(log) = &self.log {
            while let Ok(line) = log.try_recv() {
                all.push_str(&line);
                all.push('\n');
            }
        }
        all
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(daemon) = &mut self.daemon {
            let _ = Command::new("kill")
                .args(["-TERM", &daemon.id().to_string()])
                .status();
            let _ = daemon.wait();
        }
        let _ = self.tmux(&["kill-server"]);
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Process `pid`'s environment, NUL-separated (empty once it is gone).
pub fn environ(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Every process on this machine whose environment names agent `id` — everything the agent
/// started inherits it, detached or not.
pub fn processes_of(id: &str) -> Vec<Proc> {
    processes_with(&format!("FLEETD_AGENT_ID={id}\0"))
}

/// A process as `/proc` shows it.
#[derive(Debug)]
pub struct Proc {
    pub pid: u32,
    pub comm: String,
    /// Its session: a process that called `setsid` left its agent's.
    pub session: u32,
}

/// Every live process whose environment contains `wanted`.
fn processes_with(wanted: &str) -> Vec<Proc> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !environ(pid).contains(wanted) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after: Vec<&str> = stat
            .rfind(')')
            .map(|at| stat[at + 1..].split_whitespace().collect())
            .unwrap_or_default();
        if after.first() == Some(&"Z") {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        found.push(Proc {
            pid,
            comm: comm.trim().to_owned(),
            session: after.get(3).and_then(|s| s.parse().ok()).unwrap_or(0),
        });
    }
    found
}

/// Waits up to `within` for `check` to give a value.
pub fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let by = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < by, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
