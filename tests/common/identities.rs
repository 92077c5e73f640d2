//! The documented two-identity host, with real users created here: fleetd runs as its own user,
//! which alone owns its config, policy, credentials (a host key and a canary broker URI), state
//! and runtime directory; the agents run as the login user in that user's own tmux server
//! (`-S` socket in a directory the login user owns, `server-access -a` for fleetd's user).
//! Needs root (useradd, setpriv).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::{BIN, spawn_logged, terminate, wait_for};

/// Users created for one test, removed (with their processes) when dropped.
pub struct Users {
    names: Vec<String>,
}

impl Users {
    pub fn create(names: &[&str]) -> Users {
        let users = Users {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        for name in names {
            let ok = Command::new("useradd")
                .args(["-M", "-U", "-s", "/usr/sbin/nologin", name])
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "useradd {name} failed (needs root and the passwd package)"
            );
        }
        users
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("pkill").args(["-KILL", "-u", name]).status();
            let _ = Command::new("userdel").arg(name).status();
        }
    }
}

pub fn id_of(user: &str, flag: &str) -> u32 {
    let out = Command::new("id").args([flag, user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

pub fn own(path: &Path, uid: u32, gid: u32, mode: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `program` run as `uid`:`gid` with no supplementary groups (`setpriv`, util-linux).
pub fn as_user(uid: u32, gid: u32, program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(program);
    command
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walk(&path));
        } else {
            all.push(path);
        }
    }
    all
}

/// Where things are on the host (fleetd's and the login user's).
pub struct Paths {
    /// fleetd's home: config, credentials, state, policy under it.
    pub home: PathBuf,
    pub cred: PathBuf,
    pub state: PathBuf,
    pub policy: PathBuf,
    pub run: PathBuf,
    /// The login user's: the tmux socket's directory, a work tree, where agents write.
    pub tmux_dir: PathBuf,
    pub work: PathBuf,
    pub out: PathBuf,
    pub bin_dir: PathBuf,
    pub bin: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
}

/// A host with fleetd's user and the login user, the login user's tmux server running and,
/// once [`Host::start`] ran, fleetd under its own user.
pub struct Host {
    pub paths: Paths,
    pub fleetd_user: String,
    pub agent_user: String,
    pub fu: u32,
    pub fg: u32,
    pub au: u32,
    pub ag: u32,
    pub daemon: Option<Child>,
    pub log: Option<mpsc::Receiver<String>>,
    pub seen: std::cell::RefCell<String>,
    _root: tempfile::TempDir,
    _users: Users,
}

impl Host {
    /// Users, directories, `policy` (a function of the paths) as `00-policy.toml`, a host key,
    /// a canary broker URI, the login user's tmux server opened to fleetd's user. `extra`: more
    /// lines for fleetd.toml (e.g. `sandbox = "off"`).
    pub fn new(policy: impl Fn(&Paths) -> String, extra: &str) -> Host {
        assert!(
            rustix::process::geteuid().is_root(),
            "the two-identity tests create users and act as each: they need root"
        );
        let nonce = super::nonce() % 1_000_000_000;
        let (fleetd_user, agent_user) = (format!("fd{nonce}"), format!("ag{nonce}"));
        let users = Users::create(&[&fleetd_user, &agent_user]);
        let (fu, fg) = (id_of(&fleetd_user, "-u"), id_of(&fleetd_user, "-g"));
        let (au, ag) = (id_of(&agent_user, "-u"), id_of(&agent_user, "-g"));
        let root = tempfile::tempdir().unwrap();
        let top = root.path();
        std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
        let home = top.join("fleetd");
        let bin_dir = top.join("bin");
        let tmux_dir = top.join("tmux");
        let paths = Paths {
            cred: home.join("credentials"),
            state: home.join("state"),
            policy: home.join("policy"),
            config: home.join("fleetd.toml"),
            run: top.join("run"),
            socket: tmux_dir.join("tmux"),
            tmux_dir,
            work: top.join("work"),
            out: top.join("out"),
            bin: bin_dir.join("fleetd"),
            bin_dir,
            home,
        };
        for dir in [&paths.home, &paths.cred, &paths.state, &paths.policy] {
            std::fs::create_dir_all(dir).unwrap();
        }
        for dir in [&paths.tmux_dir, &paths.work, &paths.out] {
            std::fs::create_dir_all(dir).unwrap();
            own(dir, au, ag, 0o755);
        }
        std::fs::create_dir_all(&paths.bin_dir).unwrap();
        std::fs::copy(BIN, &paths.bin).unwrap();
        std::fs::set_permissions(&paths.bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(paths.policy.join("00-policy.toml"), policy(&paths)).unwrap();
        std::fs::write(
            &paths.config,
            format!(
                "host = \"h1\"\ntmux_socket = \"{}\"\n{extra}\n[paths]\npolicy = \"{}\"\nstate = \"{}\"\nruntime = \"{}\"\n\
                 [log]\nformat = \"json\"\n[api]\nsocket_access = \"all-users\"\n",
                paths.socket.display(),
                paths.policy.display(),
                paths.state.display(),
                paths.run.display()
            ),
        )
        .unwrap();
        std::fs::write(
            paths.cred.join("broker-uri"),
            "amqp://f:canary-password@127.0.0.1/%2Ff",
        )
        .unwrap();
        // The copy was written a moment ago: a process another test thread forked meanwhile
        // may still hold it open for writing until it executes (ETXTBSY), so try again.
        let keyed = (0..50)
            .find_map(|_| {
                match Command::new(&paths.bin)
                    .args(["key", "init", "--credential-file"])
                    .arg(paths.cred.join("host-key"))
                    .env("HOME", &paths.home)
                    .output()
                {
                    Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        None
                    }
                    other => Some(other.unwrap()),
                }
            })
            .expect("the copied fleetd stayed busy (ETXTBSY) for 1 s");
        assert!(keyed.status.success(), "{keyed:?}");
        for path in walk(&paths.home) {
            let mode = if path.is_dir() { 0o700 } else { 0o600 };
            own(&path, fu, fg, mode);
        }
        std::fs::create_dir_all(&paths.run).unwrap();
        own(&paths.run, fu, fg, 0o700);
        let host = Host {
            paths,
            fleetd_user,
            agent_user,
            fu,
            fg,
            au,
            ag,
            daemon: None,
            log: None,
            seen: std::cell::RefCell::new(String::new()),
            _root: root,
            _users: users,
        };
        // The login user's tmux server (its unit in production), opened to fleetd's user.
        let started = host.tmux(&["new-session", "-d", "-s", "keep", "sleep 600"]);
        assert!(started.status.success(), "{started:?}");
        let access = host.tmux(&["server-access", "-a", &host.fleetd_user]);
        assert!(access.status.success(), "server-access: {access:?}");
        std::fs::set_permissions(&host.paths.socket, std::fs::Permissions::from_mode(0o666))
            .unwrap();
        host
    }

    /// `tmux -S SOCKET ARGS` as the login user (what any of its panes can run).
    pub fn tmux(&self, args: &[&str]) -> Output {
        let mut command = as_user(self.au, self.ag, "tmux");
        command
            .arg("-S")
            .arg(&self.paths.socket)
            .args(args)
            .env_clear()
            .env("HOME", &self.paths.out)
            // The login user's shell (useradd gave it nologin here).
            .env("SHELL", "/bin/sh")
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.paths.bin_dir.display()),
            );
        command.output().unwrap()
    }

    /// The login user's tmux output as text.
    pub fn tmux_text(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.tmux(args).stdout).into_owned()
    }

    /// Starts fleetd under its own user and waits for it to be ready.
    pub fn start(&mut self) {
        let mut run = as_user(self.fu, self.fg, self.paths.bin.to_str().unwrap());
        run.arg("--config")
            .arg(&self.paths.config)
            .arg("run")
            .env_clear()
            .env("HOME", &self.paths.home)
            // tmux gives a window the PATH of the client that opened it: fleetd's.
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.paths.bin_dir.display()),
            )
            .env("CREDENTIALS_DIRECTORY", &self.paths.cred);
        let (daemon, log) = spawn_logged(run);
        self.daemon = Some(daemon);
        self.log = Some(log);
        self.wait_log(&["fleetd ready"], Duration::from_secs(20));
    }

    /// Waits for a line of fleetd's log holding every needle (one logged already counts).
    pub fn wait_log(&self, needles: &[&str], within: Duration) {
        let logged = self
            .seen
            .borrow()
            .lines()
            .any(|line| needles.iter().all(|n| line.contains(n)));
        if !logged {
            let log = self.log.as_ref().expect("fleetd was started");
            wait_for(log, &mut self.seen.borrow_mut(), needles, within);
        }
    }

    /// Stops fleetd (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            terminate(&daemon);
            let _ = daemon.wait();
        }
    }

    /// `fleetd ARGS` as the operator (root here), parsed as JSON when it is.
    pub fn operator(&self, args: &[&str]) -> Value {
        let out = self.operator_raw(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "fleetd {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
    }

    /// `fleetd ARGS` as the operator, whatever it answers.
    pub fn operator_raw(&self, args: &[&str]) -> Output {
        Command::new(&self.paths.bin)
            .arg("--config")
            .arg(&self.paths.config)
            .args(args)
            .env_remove("FLEETD_AGENT_TOKEN")
            .env_remove("FLEETD_SOCKET")
            .output()
            .unwrap()
    }

    /// Spawns `profile` labelled `label`; the agent's id and its pane (`%N`).
    pub fn spawn(&self, profile: &str, label: &str) -> (String, String) {
        let started = self.operator(&["spawn", "--profile", profile, "--label", label, "--json"]);
        assert_eq!(started["outcome"], "started", "{started}");
        let agent = started["agent"].as_str().unwrap().to_owned();
        (agent.clone(), self.pane_of(&agent))
    }

    /// The pane whose process carries `FLEETD_AGENT_ID=agent` (read as root).
    pub fn pane_of(&self, agent: &str) -> String {
        let panes = self.tmux_text(&["list-panes", "-a", "-F", "#{pane_id} #{pane_pid}"]);
        for line in panes.lines() {
            let Some((pane, pid)) = line.split_once(' ') else {
                continue;
            };
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if String::from_utf8_lossy(&environ).contains(&format!("FLEETD_AGENT_ID={agent}")) {
                return pane.to_owned();
            }
        }
        panic!("no pane runs agent {agent}: {panes}");
    }

    /// A variable of the process in `pane` (read as root).
    pub fn pane_var(&self, pane: &str, name: &str) -> String {
        let pid = self.tmux_text(&["display-message", "-p", "-t", pane, "#{pane_pid}"]);
        let environ = std::fs::read(format!("/proc/{}/environ", pid.trim())).unwrap();
        String::from_utf8_lossy(&environ)
            .split('\0')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {name} in pane {pane}"))
    }

    /// The audit log's text (read as root).
    pub fn audit(&self) -> String {
        std::fs::read_to_string(self.paths.state.join("audit.jsonl")).unwrap_or_default()
    }

    /// Asserts that `token` is refused as revoked.
    pub fn assert_revoked(&self, token: &str) {
        let refused = self.request(&serde_json::json!({"op": "roster", "token": token}));
        assert!(
            refused["error"]
                .as_str()
                .unwrap_or_default()
                .contains("revoked"),
            "{refused}"
        );
    }

    /// A local API request, raw.
    pub fn request(&self, line: &Value) -> Value {
        super::raw_request(&self.paths.run.join("fleetd.sock"), line)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(daemon) = &mut self.daemon {
            terminate(daemon);
            let _ = daemon.wait();
        }
        let _ = self.tmux(&["kill-server"]);
    }
}
