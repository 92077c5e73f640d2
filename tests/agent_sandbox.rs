//! Each agent in its own sandbox (issue 36), tried as a hostile agent would: a probe agent,
//! spawned by fleetd with a default profile (`network = "none"`, nothing writable but its root),
//! attacks a sibling agent, the multiplexer and fleetd's own files from inside its pane, and
//! writes down how each attempt failed — by its errno, or checked by its effect from outside:
//!
//! - a sibling's `/proc/PID/environ` (its token), the processes it can list, `ptrace` of the
//!   sibling: not in its PID namespace (`ENOENT`, `ESRCH`; its `/proc` holds its own tree only);
//! - the tmux server's socket and a socket in the agents' home (where herdr keeps its own): not
//!   there (`ENOENT`); `tmux send-keys` into the sibling fails and the sibling shows nothing;
//! - fleetd's host key, broker credential, state database, audit log and config: not there;
//! - the kernel keyring (`keyctl`, also by its x32 number), io_uring, `TIOCSTI` into its own
//!   terminal: `EPERM` (seccomp);
//! - a write outside its root: `EROFS`, and nothing written on the host;
//! - a TCP socket with `network = "none"`: `EPERM`;
//! - its environment: the profile's and fleetd's variables, no `TMUX`/`TMUX_PANE`; fleetd's API
//!   socket is the one thing it reaches (connects).
//!
//! Run twice: on a one-identity host (fleetd, its tmux server and the agents all root — the
//! README's single-host walkthrough as root) and on the two-identity host (fleetd's own user,
//! agents as the login user; `tests/common/identities.rs`). Needs root and bubblewrap.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};

/// The probe: reads `target.json` beside it, attacks, writes `result.json`, then waits.
const PROBE: &str = r#"
import ctypes, errno, fcntl, json, os, socket, subprocess, sys, termios
here = os.path.dirname(os.path.abspath(__file__))
t = json.load(open(os.path.join(here, "target.json")))
r = {}
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    if libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]) >= 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "?")
def connect(path, family=socket.AF_UNIX):
    s = socket.socket(family)
    try:
        s.connect(path)
    finally:
        s.close()
r["environ"] = err(lambda: open("/proc/%d/environ" % t["victim_pid"], "rb").read())
r["ptrace"] = call(101, 16, t["victim_pid"], 0, 0)
pids = [p for p in os.listdir("/proc") if p.isdigit()]
r["processes"] = [open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ").decode(errors="replace") for p in pids]
r["tmux_socket"] = err(lambda: connect(t["tmux_socket"]))
r["home_socket"] = err(lambda: connect(t["home_socket"]))
send = subprocess.run(["tmux", "-S", t["tmux_socket"], "send-keys", "-t", t["victim_pane"], "INJECTED", "Enter"], capture_output=True)
r["tmux_send_keys"] = [send.returncode, send.stderr.decode(errors="replace")]
for name, path in t["files"].items():
    r["read " + name] = err(lambda: open(path, "rb").read())
r["keyctl"] = call(250, 0, -4, 0)
r["keyctl_x32"] = call(0x40000000 + 250, 0, -4, 0)
r["io_uring"] = call(425, 8, 0)
r["write_outside"] = err(lambda: open(os.path.join(t["outside"], "written"), "w").write("x"))
r["write_etc"] = err(lambda: open("/etc/fleetd-probe", "w").write("x"))
r["tiocsti"] = err(lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x"))
r["tcp"] = err(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
r["tcp6"] = err(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close())
r["env"] = sorted(os.environ)
r["fleetd_socket"] = err(lambda: connect(os.environ["FLEETD_SOCKET"]))
r["write_root"] = err(lambda: open(os.path.join(here, "mine"), "w").write("x"))
nested = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-net", "--", "/bin/true"], capture_output=True)
r["nested_bwrap"] = [nested.returncode, nested.stderr.decode(errors="replace")]
json.dump(r, open(os.path.join(here, "result.json.tmp"), "w"))
os.rename(os.path.join(here, "result.json.tmp"), os.path.join(here, "result.json"))
print("agent> ready", flush=True)
sys.stdin.read()
"#;

/// The victim: a scripted agent that echoes what it is given.
const VICTIM: &str = "echo 'agent> ready'; while read -r line; do echo \"got: $line\"; done";

/// Both profiles, sandboxed by default; `work` holds their roots.
fn policy(work: &Path) -> String {
    format!(
        r#"[profile.victim]
description = "A scripted agent with a token worth stealing."
argv = ["/bin/sh", "-c", '''{VICTIM}''']
roots = ["{work}/victim"]
max_instances = 1
[profile.victim.ready]
pattern = "^agent> ready"
timeout_secs = 20

[profile.probe]
description = "A hostile agent: attacks its sibling, the multiplexer and fleetd."
argv = ["/usr/bin/python3", "-I", "{work}/probe/probe.py"]
roots = ["{work}/probe"]
max_instances = 1
[profile.probe.ready]
pattern = "^agent> ready"
timeout_secs = 30

[[grant]]
id = "local"
description = "The operator runs both."
fleets = ["local"]
profiles = ["victim", "probe"]
"#,
        work = work.display()
    )
}

/// What the attack needs to know, and where fleetd's files are on this host.
struct Scene<'a> {
    /// `fleetd ARGS` as the operator, parsed.
    operator: &'a dyn Fn(&[&str]) -> Value,
    /// `tmux ARGS` on the agents' server, as its owner: stdout.
    tmux: &'a dyn Fn(&[&str]) -> String,
    tmux_socket: PathBuf,
    work: PathBuf,
    /// The agents' home.
    home: PathBuf,
    /// fleetd's files, by name.
    files: Vec<(&'static str, PathBuf)>,
    /// A directory outside every root, writable on the host.
    outside: PathBuf,
}

/// The pane and pane process of `agent` (read as root).
fn pane_of(scene: &Scene<'_>, agent: &str) -> (String, u32) {
    let panes = (scene.tmux)(&["list-panes", "-a", "-F", "#{pane_id} #{pane_pid}"]);
    for line in panes.lines() {
        let Some((pane, pid)) = line.split_once(' ') else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if String::from_utf8_lossy(&environ).contains(&format!("FLEETD_AGENT_ID={agent}")) {
            return (pane.to_owned(), pid.parse().unwrap());
        }
    }
    panic!("no pane runs agent {agent}: {panes}");
}

fn attack(scene: &Scene<'_>) {
    for needed in ["/usr/bin/python3", "/usr/bin/bwrap"] {
        assert!(
            Path::new(needed).exists(),
            "{needed} is needed (Debian's python3 and bubblewrap; scripts/test installs them)"
        );
    }
    let victim = (scene.operator)(&["spawn", "--profile", "victim", "--label", "v", "--json"]);
    assert_eq!(victim["outcome"], "started", "{victim}");
    let victim = victim["agent"].as_str().unwrap().to_owned();
    let (victim_pane, victim_pid) = pane_of(scene, &victim);
    let token = {
        let environ = std::fs::read(format!("/proc/{victim_pid}/environ")).unwrap();
        String::from_utf8_lossy(&environ)
            .split('\0')
            .find_map(|kv| kv.strip_prefix("FLEETD_AGENT_TOKEN=").map(str::to_owned))
            .expect("the victim holds a token")
    };

    // A real socket listening in the agents' home, where herdr keeps its own.
    let herdr_dir = scene.home.join(".config/herdr");
    std::fs::create_dir_all(&herdr_dir).unwrap();
    let home_socket = herdr_dir.join("herdr.sock");
    let _ = std::fs::remove_file(&home_socket);
    let _listener = std::os::unix::net::UnixListener::bind(&home_socket).unwrap();
    std::fs::set_permissions(&home_socket, std::fs::Permissions::from_mode(0o777)).unwrap();

    let files: serde_json::Map<String, Value> = scene
        .files
        .iter()
        .map(|(name, path)| {
            assert!(
                path.exists(),
                "fleetd's {name} exists at {}",
                path.display()
            );
            ((*name).to_owned(), json!(path))
        })
        .collect();
    let probe_dir = scene.work.join("probe");
    std::fs::write(
        probe_dir.join("target.json"),
        json!({
            "victim_pid": victim_pid,
            "victim_pane": victim_pane,
            "tmux_socket": scene.tmux_socket,
            "home_socket": home_socket,
            "files": files,
            "outside": scene.outside,
        })
        .to_string(),
    )
    .unwrap();
    let probe = (scene.operator)(&["spawn", "--profile", "probe", "--label", "p", "--json"]);
    assert_eq!(probe["outcome"], "started", "{probe}");
    let result: Value = serde_json::from_str(
        &std::fs::read_to_string(probe_dir.join("result.json")).expect("the probe's results"),
    )
    .unwrap();
    let at = |key: &str| result[key].as_str().unwrap_or_default().to_owned();

    // The sibling: not in its PID namespace.
    assert_eq!(at("environ"), "ENOENT", "{result}");
    assert_eq!(at("ptrace"), "ESRCH", "{result}");
    let processes: Vec<&str> = result["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        processes.len() <= 4
            && processes
                .iter()
                .all(|p| p.contains("bwrap") || p.contains("pane-init") || p.contains("python3")),
        "only its own tree: {processes:?}"
    );
    assert!(!result.to_string().contains(&token), "the sibling's token");

    // The multiplexer: its socket and the home's are not there.
    assert_eq!(at("tmux_socket"), "ENOENT", "{result}");
    assert_eq!(at("home_socket"), "ENOENT", "{result}");
    let send = &result["tmux_send_keys"];
    assert_ne!(send[0], 0, "tmux send-keys into the sibling: {send}");
    std::thread::sleep(Duration::from_millis(300));
    let shown = (scene.tmux)(&["capture-pane", "-p", "-t", &victim_pane]);
    assert!(
        !shown.contains("INJECTED"),
        "the sibling was typed into: {shown}"
    );

    // fleetd's files.
    // In a directory hidden under an empty tmpfs: ENOENT; the config file, hidden under
    // `/dev/null` on a `nodev` mount: EACCES (ENOENT where it lies under the private /tmp, which
    // the agents' user could not even look into to hide it).
    for (name, _) in &scene.files {
        let got = at(&format!("read {name}"));
        if *name == "fleetd.toml" {
            assert!(
                matches!(got.as_str(), "EACCES" | "ENOENT"),
                "{name}: {result}"
            );
        } else {
            assert_eq!(got, "ENOENT", "{name}: {result}");
        }
    }

    // Seccomp: the keyring, typing into its terminal, and (network none) IP sockets.
    assert_eq!(at("keyctl"), "EPERM", "{result}");
    // The same call by its x32 number (unfiltered: ENOSYS where the kernel has no x32, a
    // keyring where it has), and io_uring (unfiltered: EFAULT for this null argument).
    assert_eq!(at("keyctl_x32"), "EPERM", "{result}");
    assert_eq!(at("io_uring"), "EPERM", "{result}");
    assert_eq!(at("tiocsti"), "EPERM", "{result}");
    assert_eq!(at("tcp"), "EPERM", "{result}");
    assert_eq!(at("tcp6"), "EPERM", "{result}");

    // The filesystem: read-only outside its root, its root writable.
    assert_eq!(at("write_outside"), "EROFS", "{result}");
    assert!(!scene.outside.join("written").exists());
    assert_eq!(at("write_etc"), "EROFS", "{result}");
    assert_eq!(at("write_root"), "ok", "{result}");
    assert!(probe_dir.join("mine").exists(), "its root is the host's");

    // Its environment, and the one way out.
    let env: Vec<&str> = result["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in ["FLEETD_SOCKET", "FLEETD_AGENT_TOKEN", "FLEETD_AGENT_ID"] {
        assert!(env.contains(&name), "{name} in {env:?}");
    }
    for name in ["TMUX", "TMUX_PANE", "HERDR_SOCKET_PATH", "HERDR_PANE_ID"] {
        assert!(!env.contains(&name), "{name} in {env:?}");
    }
    assert_eq!(at("fleetd_socket"), "ok", "{result}");

    // An agent that sandboxes its own commands with bubblewrap (Codex, Claude Code) can. (A
    // fresh /proc inside it the kernel refuses: the sandbox's /proc has bwrap's read-only
    // covers on /proc/sys and the like; Codex retries without one, as here.)
    assert_eq!(result["nested_bwrap"][0], 0, "a nested bwrap: {result}");
}

/// A one-identity host: fleetd, its tmux server and the agents all root, in a directory of
/// its own; `policy` (a function of the work directory) is its policy.
struct Solo {
    dir: tempfile::TempDir,
    config: PathBuf,
    tmux_socket: PathBuf,
    _stop: Stop,
}

impl Solo {
    fn start(subdirs: &[&str], policy: impl Fn(&Path) -> String) -> Solo {
        assert!(
            rustix::process::geteuid().is_root(),
            "the one-identity host runs everything as root"
        );
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        for sub in subdirs {
            std::fs::create_dir_all(top.join("work").join(sub)).unwrap();
        }
        let cred = top.join("credentials");
        std::fs::create_dir_all(&cred).unwrap();
        let keyed = Command::new(common::BIN)
            .args(["key", "init", "--credential-file"])
            .arg(cred.join("host-key"))
            .env("HOME", top)
            .output()
            .unwrap();
        assert!(keyed.status.success(), "{keyed:?}");
        std::fs::write(
            cred.join("broker-uri"),
            "amqp://f:canary-password@127.0.0.1/%2Ff",
        )
        .unwrap();
        std::fs::create_dir_all(top.join("tmux")).unwrap();
        std::fs::create_dir_all(top.join("home")).unwrap();
        let tmux_socket = top.join("tmux/sock");
        let config = common::solo_config(
            top,
            "h1",
            &format!("tmux_socket = \"{}\"\n", tmux_socket.display()),
        );
        std::fs::write(top.join("policy/00-policy.toml"), policy(&top.join("work"))).unwrap();
        // The agents' server: its HOME and PATH (with fleetd on it) are what panes inherit.
        let bin_dir = Path::new(common::BIN).parent().unwrap();
        let started = Command::new("tmux")
            .arg("-S")
            .arg(&tmux_socket)
            .args(["new-session", "-d", "-s", "keep", "sleep 600"])
            .env("HOME", top.join("home"))
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir.display()),
            )
            .status()
            .unwrap();
        assert!(started.success(), "the agents' tmux server");
        let mut run = Command::new(common::BIN);
        run.args(["--config", config.to_str().unwrap(), "run"])
            .env("HOME", top)
            // tmux gives a window the PATH of the client that opened it: fleetd's.
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir.display()),
            )
            .env("CREDENTIALS_DIRECTORY", &cred);
        let (daemon, log) = common::spawn_logged(run);
        let stop = Stop(daemon, tmux_socket.clone());
        let mut seen = String::new();
        common::wait_for(&log, &mut seen, &["fleetd ready"], Duration::from_secs(20));
        Solo {
            dir,
            config,
            tmux_socket,
            _stop: stop,
        }
    }

    fn top(&self) -> &Path {
        self.dir.path()
    }

    fn operator(&self, args: &[&str]) -> Value {
        let (ok, stdout, stderr) = common::fleetd_at(&self.config, self.top(), args);
        assert!(ok, "fleetd {args:?}: {stdout}{stderr}");
        serde_json::from_str(&stdout).unwrap_or(Value::String(stdout))
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.tmux_socket)
            .args(args)
            .env("HOME", self.top().join("home"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// One identity: fleetd, the tmux server and the agents all root.
#[test]
fn a_hostile_agent_on_a_one_identity_host_reaches_nothing_but_its_root_and_fleetds_socket() {
    let host = Solo::start(&["victim", "probe"], policy);
    let top = host.top();
    std::fs::write(top.join("work/probe/probe.py"), PROBE).unwrap();
    let operator = |args: &[&str]| host.operator(args);
    let tmux = |args: &[&str]| host.tmux(args);
    // Outside /tmp (which every sandbox has of its own): a directory the host can write.
    let outside = visible_outside();
    attack(&Scene {
        operator: &operator,
        tmux: &tmux,
        tmux_socket: host.tmux_socket.clone(),
        work: top.join("work"),
        home: top.join("home"),
        files: vec![
            ("host-key", top.join("credentials/host-key")),
            ("broker-uri", top.join("credentials/broker-uri")),
            ("state.redb", top.join("state/state.redb")),
            ("audit.jsonl", top.join("state/audit.jsonl")),
            ("fleetd.toml", host.config.clone()),
        ],
        outside: outside.path().to_owned(),
    });
}

/// The network a profile names: `host` with `tcp_connect` reaches those ports only (Landlock);
/// `loopback` has a loopback of its own, none of the host's.
#[test]
fn the_network_is_what_the_profile_names_and_no_more() {
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, b) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let script = "import errno, json, os, socket, sys\n\
        def tcp(port):\n\
        \x20   s = socket.socket()\n\
        \x20   try:\n\
        \x20       s.connect(('127.0.0.1', port)); return 'ok'\n\
        \x20   except OSError as e:\n\
        \x20       return errno.errorcode.get(e.errno, str(e.errno))\n\
        \x20   finally:\n\
        \x20       s.close()\n\
        here = os.path.dirname(os.path.abspath(__file__))\n\
        ports = [int(p) for p in sys.argv[1:]]\n\
        json.dump({str(p): tcp(p) for p in ports}, open(os.path.join(here, 'net.json'), 'w'))\n\
        print('agent> ready', flush=True)\n\
        sys.stdin.read()\n";
    let profile = |name: &str, sandbox: &str, work: &Path| {
        format!(
            "[profile.{name}]\ndescription = \"Connects and says how it went.\"\n\
             argv = [\"/usr/bin/python3\", \"-I\", \"{work}/{name}/net.py\", \"{a}\", \"{b}\"]\n\
             roots = [\"{work}/{name}\"]\n[profile.{name}.ready]\npattern = \"^agent> ready\"\n\
             timeout_secs = 20\n[profile.{name}.sandbox]\n{sandbox}\n",
            work = work.display()
        )
    };
    let host = Solo::start(&["ported", "loop"], |work| {
        format!(
            "{}{}[[grant]]\nid = \"local\"\ndescription = \"The operator.\"\nfleets = [\"local\"]\n\
             profiles = [\"ported\", \"loop\"]\n",
            profile(
                "ported",
                &format!("network = \"host\"\ntcp_connect = [{a}]"),
                work
            ),
            profile("loop", "network = \"loopback\"", work),
        )
    });
    let mut found = Vec::new();
    for name in ["ported", "loop"] {
        let dir = host.top().join("work").join(name);
        std::fs::write(dir.join("net.py"), script).unwrap();
        let started = host.operator(&["spawn", "--profile", name, "--label", name, "--json"]);
        assert_eq!(started["outcome"], "started", "{started}");
        let result: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("net.json")).unwrap()).unwrap();
        found.push((
            name,
            result[a.to_string()].clone(),
            result[b.to_string()].clone(),
        ));
    }
    assert_eq!(
        found,
        [
            // The named port; the other refused by Landlock.
            ("ported", json!("ok"), json!("EACCES")),
            // Its own loopback: nothing listens there.
            ("loop", json!("ECONNREFUSED"), json!("ECONNREFUSED")),
        ]
    );
}

/// Two identities: fleetd under its own user, agents as the login user.
#[test]
fn a_hostile_agent_on_a_two_identity_host_reaches_nothing_but_its_root_and_fleetds_socket() {
    let mut host = common::identities::Host::new(|paths| policy(&paths.work), "");
    for sub in ["victim", "probe"] {
        let dir = host.paths.work.join(sub);
        std::fs::create_dir_all(&dir).unwrap();
        common::identities::own(&dir, host.au, host.ag, 0o755);
    }
    std::fs::write(host.paths.work.join("probe/probe.py"), PROBE).unwrap();
    host.start();
    let operator = |args: &[&str]| host.operator(args);
    let tmux = |args: &[&str]| host.tmux_text(args);
    let outside = visible_outside();
    common::identities::own(outside.path(), host.au, host.ag, 0o755);
    attack(&Scene {
        operator: &operator,
        tmux: &tmux,
        tmux_socket: host.paths.socket.clone(),
        work: host.paths.work.clone(),
        home: host.paths.out.clone(),
        files: vec![
            ("host-key", host.paths.cred.join("host-key")),
            ("broker-uri", host.paths.cred.join("broker-uri")),
            ("state.redb", host.paths.state.join("state.redb")),
            ("audit.jsonl", host.paths.state.join("audit.jsonl")),
            ("fleetd.toml", host.paths.config.clone()),
        ],
        outside: outside.path().to_owned(),
    });
    host.stop();
}

/// A directory outside /tmp (each sandbox has a /tmp of its own, so a write there proves
/// nothing), which every sandbox sees read-only and every user can reach: under `/` (a checkout
/// may lie under a directory only root may enter).
fn visible_outside() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("fleetd-sandbox-test-")
        .tempdir_in("/")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Stops the daemon and the tmux server when the test ends.
struct Stop(Child, PathBuf);

impl Drop for Stop {
    fn drop(&mut self) {
        common::terminate(&self.0);
        let _ = self.0.wait();
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.1)
            .arg("kill-server")
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A realistic task inside the default sandbox of a profile with `network = "host"` and a
/// writable config directory: on a message, the agent clones a local repository into its root,
/// edits, commits, runs a test command, sandboxes a command of its own with bubblewrap (as
/// Codex does), and answers its sender with a bare `fleetd send`.
#[test]
fn a_realistic_agent_workflow_works_inside_its_sandbox() {
    // The repository it clones: outside its root, on a path every sandbox sees read-only.
    let upstream = visible_outside();
    let repo = upstream.path().join("repo");
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=upstream", "-c", "user.email=up@invalid"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("count.txt"), "1\n").unwrap();
    git(&repo, &["add", "count.txt"]);
    git(&repo, &["commit", "-qm", "start"]);
    let task = format!(
        "set -e; rm -rf clone; git clone -q {repo} clone; cd clone; echo 2 >> count.txt; \
         git -c user.name=agent -c user.email=agent@invalid commit -qam bump; \
         test \"$(wc -l < count.txt)\" -eq 2; git log --oneline | wc -l > ../commits; \
         bwrap --ro-bind / / --dev /dev --unshare-pid --unshare-net -- /bin/true; \
         echo ok > \"$HOME/.config/agent/last\"",
        repo = repo.display()
    );
    let host = Solo::start(&["worker"], |work| {
        format!(
            "[profile.worker]\ndescription = \"Does a task, then answers.\"\n\
             argv = [\"/bin/sh\", \"-c\", '''echo 'agent> ready'; while read -r line; do \
             from=$(printf '%s\\n' \"$line\" | sed -n 's/^\\[fleetd: from [^ ]* agent \\([0-9a-f-]*\\), msg .*/\\1/p'); \
             [ -n \"$from\" ] || continue; if sh -c '{task}' > task.log 2>&1; then r=done; else r=failed; fi; \
             fleetd send \"$from\" \"task $r\"; done''']\n\
             roots = [\"{work}/worker\"]\nmax_instances = 1\n\
             [profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 20\n\
             [profile.worker.sandbox]\nnetwork = \"host\"\nwritable = [\"~/.config/agent\"]\n\n\
             [[grant]]\nid = \"local\"\ndescription = \"The operator.\"\nfleets = [\"local\"]\n\
             profiles = [\"worker\"]\n",
            work = work.display(),
            task = task.replace('\'', "'\\''"),
        )
    });
    let config = host.top().join("home/.config/agent");
    std::fs::create_dir_all(&config).unwrap();
    let primary = host.operator(&["agent", "open", "primary", "--json"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = host.operator(&["spawn", "--profile", "worker", "--label", "w", "--json"]);
    assert_eq!(started["outcome"], "started", "{started}");
    let worker = started["agent"].as_str().unwrap().to_owned();
    host.operator(&["send", &worker, "bump the count", "--from", &primary]);
    let work = host.top().join("work/worker");
    let by = std::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let held = host.operator(&["inbox", "pull", "--agent", &primary, "--json"]);
        let text = held.to_string();
        if text.contains("task ") {
            break text;
        }
        assert!(
            std::time::Instant::now() < by,
            "no answer within 30 s; the worker's pane:\n{}\ntask.log: {}",
            host.tmux(&["capture-pane", "-p", "-t", "fleetd:"]),
            std::fs::read_to_string(work.join("task.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        answer.contains("task done"),
        "{answer}\n{}",
        std::fs::read_to_string(work.join("task.log")).unwrap_or_default()
    );
    assert_eq!(
        std::fs::read_to_string(work.join("commits"))
            .unwrap()
            .trim(),
        "2"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("clone/count.txt")).unwrap(),
        "1\n2\n"
    );
    assert_eq!(
        std::fs::read_to_string(config.join("last")).unwrap(),
        "ok\n"
    );
}

/// A sandbox that cannot be built fails the spawn with why and the fix, launching nothing that
/// stays: here the profile's `~/…` path lands in fleetd's state directory once the agents'
/// `HOME` points there — only the pane's init can see that, and it refuses.
#[test]
fn a_sandbox_that_cannot_be_built_fails_the_spawn_with_why_and_the_fix() {
    let host = Solo::start(&["worker"], |work| {
        format!(
            "[profile.worker]\ndescription = \"Its home is fleetd's state.\"\n\
             argv = [\"/bin/sh\", \"-c\", \"echo 'agent> ready'; exec sleep 600\"]\n\
             roots = [\"{work}/worker\"]\nenv = {{ HOME = \"{state}\" }}\n\
             [profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 20\n\
             [profile.worker.sandbox]\nwritable = [\"~/.cache\"]\n\n\
             [[grant]]\nid = \"local\"\ndescription = \"The operator.\"\nfleets = [\"local\"]\n\
             profiles = [\"worker\"]\n",
            work = work.display(),
            state = work.parent().unwrap().join("state").display(),
        )
    });
    let (ok, stdout, stderr) = common::fleetd_at(
        &host.config,
        host.top(),
        &["spawn", "--profile", "worker", "--json"],
    );
    let failed: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert!(!ok, "{stdout}{stderr}");
    assert_eq!(failed["outcome"], "failed", "{stdout}{stderr}");
    let reason = failed["reasons"].to_string();
    assert!(
        reason.contains("the agent's sandbox could not be built")
            && reason.contains("which no sandbox may see")
            && reason.contains("fleetd sandbox probe"),
        "{reason}"
    );
    assert_eq!(
        host.tmux(&["list-panes", "-a", "-F", "#{pane_id}"])
            .lines()
            .count(),
        1,
        "only the server's own pane is left"
    );
}
