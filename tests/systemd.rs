//! fleetd under a real systemd. systemd 252 boots as PID 1 of a container (`systemd-nspawn`
//! over an overlay of this machine's root, sharing its network and so its RabbitMQ; the recipe
//! is in docs/hardening.md), and a host is stood up inside by following docs/operations.md: the
//! shell blocks of steps 2, 3, 5, 7 and 9 run as the document types them (only the binary's
//! path differs), the config and policy are written as steps 6 and 7 describe, and the broker
//! side (step 4) runs on this machine, the broker operator's. Then, against the running unit:
//! READY and `active (running)`, `systemd-analyze security` ≤ 1.0, `status`, `roster`, `audit
//! verify` and `sandbox probe` as the docs type them, a scripted agent that builds in its root,
//! reaches a service on loopback and runs git under the hardened tmux unit, a spawn to a host
//! the roster lacks answered at once and never retried, a watchdog kill and a crash each
//! restarted, a reload that keeps the PID, a clean stop without an ERROR line, and neither the
//! broker password nor the agent's secret anywhere in the journal.
//!
//! Needs root and `systemd-nspawn` (package `systemd-container`, which scripts/test installs);
//! a machine where the container cannot boot fails the test saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stderr,
    reason = "test code: a failed step is a failed test"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Fleets, eventually, fleet_grants, host_grants, nonce};

const OPERATIONS: &str = include_str!("../docs/operations.md");
/// Where the repository and the binary appear inside the container (read-only binds).
const SRC: &str = "/src";
const BUILD: &str = "/build/fleetd";

/// A systemd booted in a container; powered off, unmounted and its cgroups removed on drop.
struct Container {
    base: PathBuf,
    root: PathBuf,
    cgroups: Vec<PathBuf>,
    nspawn: Option<Child>,
    log: PathBuf,
    leader: u32,
}

impl Container {
    /// Boots one: an overlay of `/` (upper layer on a tmpfs) with the services this machine
    /// already runs masked, the repository at [`SRC`] and the binary at [`BUILD`].
    fn boot(name: &str) -> Result<Container, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("booting a container needs root".to_owned());
        }
        let nspawn = which("systemd-nspawn").ok_or(
            "systemd-nspawn is missing: apt-get install systemd-container (scripts/test does)",
        )?;
        let base = std::env::temp_dir().join(name);
        let root = base.join("root");
        std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
        sh(&format!(
            "mount -t tmpfs tmpfs {b} && mkdir {b}/up {b}/work {b}/root && \
             mount -t overlay overlay -o lowerdir=/,upperdir={b}/up,workdir={b}/work {b}/root",
            b = base.display()
        ))?;
        let mut container = Container {
            base: base.clone(),
            root: root.clone(),
            cgroups: Vec::new(),
            nspawn: None,
            log: base.with_extension("log"),
            leader: 0,
        };
        // The services this machine runs on shared ports (RabbitMQ, databases, …), its gettys
        // and timers: masked, so the container does not fight the host over them.
        let system = root.join("etc/systemd/system");
        let mut masked = vec![
            "console-getty.service".to_owned(),
            "getty@.service".to_owned(),
        ];
        for wants in std::fs::read_dir("/etc/systemd/system").map_err(|e| e.to_string())? {
            let wants = wants.map_err(|e| e.to_string())?.path();
            if wants.extension().is_some_and(|e| e == "wants")
                && let Ok(units) = std::fs::read_dir(&wants)
            {
                masked.extend(
                    units
                        .flatten()
                        .map(|u| u.file_name().to_string_lossy().into()),
                );
            }
        }
        for unit in masked {
            let _ = std::fs::remove_file(system.join(&unit));
            std::os::unix::fs::symlink("/dev/null", system.join(&unit))
                .map_err(|e| format!("mask {unit}: {e}"))?;
        }
        // A hybrid cgroup layout (this machine kind's) needs nspawn started from a cgroup of
        // its own in both hierarchies.
        let mut enter = String::new();
        for tree in ["unified", "systemd"] {
            let tree = Path::new("/sys/fs/cgroup").join(tree);
            if tree.is_dir() {
                let group = tree.join(name);
                std::fs::create_dir_all(&group).map_err(|e| format!("cgroup: {e}"))?;
                enter.push_str(&format!("echo $$ > {}/cgroup.procs && ", group.display()));
                container.cgroups.push(group);
            }
        }
        let log = std::fs::File::create(&container.log).map_err(|e| e.to_string())?;
        let nspawn = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{enter}SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec {nspawn} -D {root} -M {name} -b \
                 --register=no --keep-unit --console=passive --link-journal=no \
                 --resolv-conf=off --timezone=off --capability=all \
                 --system-call-filter='landlock_create_ruleset landlock_add_rule \
                 landlock_restrict_self bpf' --bind-ro={src}:{SRC} --bind-ro={bin}:{BUILD}",
                nspawn = nspawn.display(),
                root = root.display(),
                src = env!("CARGO_MANIFEST_DIR"),
                bin = BIN,
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start systemd-nspawn: {e}"))?;
        let nspawn_pid = nspawn.id();
        container.nspawn = Some(nspawn);
        let started = Instant::now();
        loop {
            if let Some(Ok(Some(status))) = container.nspawn.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "systemd-nspawn ended ({status}): {}",
                    std::fs::read_to_string(&container.log).unwrap_or_default()
                ));
            }
            if container.leader == 0
                && let Ok(children) = std::fs::read_to_string(format!(
                    "/proc/{nspawn_pid}/task/{nspawn_pid}/children"
                ))
            {
                container.leader = children
                    .split_whitespace()
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
            }
            if container.leader != 0 {
                let state = container.run("systemctl is-system-running", "");
                let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
                if state == "running" || state == "degraded" {
                    eprintln!("container booted in {:?} ({state})", started.elapsed());
                    return Ok(container);
                }
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!(
                    "systemd did not reach `running` within 120 s: {}",
                    std::fs::read_to_string(&container.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Runs `script` with `sh -c` inside (every namespace of PID 1), `input` on stdin.
    fn run(&self, script: &str, input: &str) -> Output {
        let leader = self.leader.to_string();
        let mut child = Command::new("nsenter")
            .args(["-t", &leader, "-m", "-u", "-i", "-n", "-p", "-C", "--"])
            .args(["/bin/sh", "-c", script])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    }

    /// [`Container::run`] that must succeed; its stdout and stderr.
    fn ok(&self, script: &str, input: &str) -> String {
        let output = self.run(script, input);
        let text = text_of(&output);
        assert!(output.status.success(), "`{script}` failed: {text}");
        text
    }

    /// A property of `fleetd@alice.service` (`systemctl show -p NAME --value`).
    fn unit(&self, property: &str) -> String {
        self.ok(
            &format!("systemctl show -p {property} --value fleetd@alice.service"),
            "",
        )
        .trim()
        .to_owned()
    }

    /// The unit's journal, messages only.
    fn journal(&self, what: &str) -> String {
        self.ok(&format!("journalctl --no-pager -o cat {what}"), "")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if let Some(mut nspawn) = self.nspawn.take() {
            if self.leader != 0 {
                let _ = self.run("systemctl poweroff --no-block", "");
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline && matches!(nspawn.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
        let _ = sh(&format!(
            "umount {r} ; umount {b}",
            r = self.root.display(),
            b = self.base.display()
        ));
        let _ = std::fs::remove_dir(&self.base);
        let _ = std::fs::remove_file(&self.log);
        for group in &self.cgroups {
            remove_cgroup(group);
        }
    }
}

/// Removes cgroup `group` and those the container's systemd made below it (deepest first).
fn remove_cgroup(group: &Path) {
    if let Ok(entries) = std::fs::read_dir(group) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(group);
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/bin".into(), "/usr/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

fn sh(script: &str) -> Result<(), String> {
    let output = Command::new("sh").args(["-c", script]).output().unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("`{script}`: {}", text_of(&output)))
    }
}

fn text_of(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The shell block of step `number` of "Standing up a new host" in docs/operations.md.
fn step_block(number: u32) -> String {
    let marker = format!("\n{number}. **");
    let start = OPERATIONS
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/operations.md has no step {number}"));
    let rest = &OPERATIONS[start..];
    let next = rest[marker.len()..]
        .find(&format!("\n{}. **", number + 1))
        .map_or(rest.len(), |at| at + marker.len());
    let step = &rest[..next];
    let open = step
        .find("```sh\n")
        .unwrap_or_else(|| panic!("step {number} has no sh block"));
    let body = &step[open + 6..];
    let close = body.find("```").unwrap();
    body[..close]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The overall exposure `systemd-analyze security` gives the running unit.
fn exposure(container: &Container) -> f64 {
    let text = container.ok(
        "systemd-analyze security --no-pager fleetd@alice.service",
        "",
    );
    common::overall_exposure(&text, "")
}

/// Serves `body` over HTTP on a loopback port until the test ends; the port.
fn loopback_service(body: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// The scripted agent: builds in its root, fetches from a loopback service, commits with git,
/// records who it is and its privileges, then waits at its prompt.
fn agent_script(port: u16) -> String {
    format!(
        r#"exec > /home/alice/src/work/agent.log 2>&1
cd /home/alice/src/work || exit 1
echo "uid: $(id -un)"
grep NoNewPrivs /proc/self/status
printf 'int main(void){{return 0;}}\n' > hello.c
make hello && echo "built: $(test -x hello && echo yes)"
curl -fsS http://127.0.0.1:{port}/ && echo
git init -q . && git add hello.c && git -c user.name=agent -c user.email=agent@invalid commit -qm build && echo "git: $(git log --oneline | wc -l) commit"
echo "token-length: ${{#TOKEN}}"
echo 'agent> ready' > /dev/tty
exec sleep 3600
"#
    )
}

#[test]
fn a_host_set_up_by_the_operations_guide_runs_under_a_real_systemd() {
    let n = nonce();
    let fleet = format!("sd{n}");
    let password = format!("canary-broker-{n:x}-pw");
    let agent_secret = format!("canary-agent-{n:x}-tok");
    let _fleets = Fleets::new(&[&fleet]);
    let container = Container::boot(&format!("fleetd-sd{n}")).unwrap_or_else(|why| {
        panic!("a real systemd is needed for this test and did not boot: {why}")
    });

    // Step 1: the two identities.
    container.ok("useradd -m -U -s /bin/bash alice", "");
    container.ok(
        "useradd --system --user-group --no-create-home --shell /usr/sbin/nologin fleetd-alice",
        "",
    );
    // Step 2: the binary and units (the test's build stands in for target/release).
    let step2 = step_block(2).replace("target/release/fleetd", BUILD);
    container.ok(&format!("set -e; cd {SRC}\n{step2}"), "");
    // Step 3: the multiplexer; the access list names both users.
    let access = container.ok(&format!("set -e\n{}", step_block(3)), "");
    assert!(
        access.contains("fleetd-alice") && access.contains("alice (W)"),
        "tmux's access list: {access}"
    );
    // Step 4, on the broker operator's machine: the fleet's vhost and this host's own user.
    fleet_grants(&fleet, &[]);
    host_grants(&fleet, &fleet, &[], &password);
    // Step 5: credentials, the broker URI on stdin; plus the agent's secret for the policy.
    let uri = format!("amqp://{fleet}.{fleet}:{password}@127.0.0.1:5672/%2F{fleet}");
    let step5 = step_block(5);
    assert!(step5.contains("key init"), "step 5: {step5}");
    container.ok(&format!("set -e\n{step5}"), &format!("{uri}\n"));
    container.ok(
        "(umask 077; cat > /etc/fleetd/credentials/alice/worker-token)",
        &agent_secret,
    );
    // Step 6: the config as the guide shows it (no TLS on loopback, no peers on one host).
    container.ok(
        "mkdir -p /etc/fleetd/policy && cat > /etc/fleetd/fleetd.toml",
        &format!(
            r#"host = "{fleet}"
fleet = "{fleet}"
multiplexer = "tmux"
tmux_socket = "/run/fleetd-tmux/alice/tmux"
sandbox = "required"

[api]
socket_access = "all-users"

[broker]
uriEnv = "FLEETD_AMQP_URI"
"#
        ),
    );
    // Step 7: the policy (a scripted agent in alice's tree), checked as the guide types it,
    // and the drop-in that makes its root and its secret visible to the unit.
    container.ok(
        "cat > /etc/fleetd/policy/00-policy.toml",
        &format!(
            r#"[profile.builder]
description = "A scripted agent that builds in its root, reaches a loopback service and runs git."
argv = ["/bin/sh", "/home/alice/src/agent.sh"]
roots = ["/home/alice/src/work"]
secrets = {{ TOKEN = "credential:worker-token" }}
max_instances = 1

[profile.builder.ready]
pattern = "^agent> ready"
timeout_secs = 30

# In its sandbox: its script (in alice's hidden home) shown read-only, the host's network (the
# loopback service).
[profile.builder.sandbox]
network = "host"
readable = ["/home/alice/src/agent.sh"]

[[grant]]
id = "operator-builder"
description = "This host's operator starts the builder."
fleets = ["{fleet}"]
hosts = ["{fleet}"]
profiles = ["builder"]
"#
        ),
    );
    container.ok(&format!("set -e\n{}", step_block(7)), "");
    let port = loopback_service(format!("service-{n}"));
    container.ok(
        "mkdir -p /home/alice/src/work && cat > /home/alice/src/agent.sh && \
         chown -R alice:alice /home/alice/src",
        &agent_script(port),
    );
    container.ok(
        "mkdir -p /etc/systemd/system/fleetd@alice.service.d && \
         cat > /etc/systemd/system/fleetd@alice.service.d/local.conf",
        "[Service]\nBindReadOnlyPaths=-/home/alice/src\n\
         LoadCredential=worker-token:/etc/fleetd/credentials/alice/worker-token\n",
    );
    // Step 8: the host's [[peer]] block, as root from the credential's source.
    let peer = container.ok("fleetd --instance alice key show", "");
    assert!(
        peer.contains("[[peer]]") && peer.contains(&format!("fleet = \"{fleet}\"")),
        "key show: {peer}"
    );

    // Step 9: start and check, line by line as typed; a line the guide marks "refused" must
    // fail.
    for line in step_block(9).lines() {
        let (command, note) = line.split_once('#').unwrap_or((line, ""));
        let output = container.run(command, "");
        let text = text_of(&output);
        if note.contains("refused: not the operator") {
            assert!(
                !output.status.success(),
                "`{command}` was not refused: {text}"
            );
            assert!(text.contains("not the operator"), "`{command}`: {text}");
        } else {
            assert!(output.status.success(), "`{command}` failed: {text}");
        }
        if command.contains("sandbox probe") {
            assert!(
                text.contains("refused read /etc/shadow")
                    && text.contains("refused connect 192.0.2.99:443")
                    && text.contains("fully enforced"),
                "{text}"
            );
        }
        if command.contains(" status") && command.contains("sudo -u fleetd-alice") {
            assert!(text.contains(&format!("host: {fleet}")), "{text}");
        }
        if command.contains("audit verify") {
            assert!(text.contains("chain intact"), "{text}");
        }
    }
    assert_eq!(container.unit("ActiveState"), "active");
    assert_eq!(container.unit("SubState"), "running");
    let status = eventually(
        "the unit's status names the broker",
        Duration::from_secs(10),
        || {
            let status = container.unit("StatusText");
            status
                .starts_with("broker: connected to 127.0.0.1:5672 since")
                .then_some(status)
        },
    );
    assert!(status.contains("sandbox: full"), "{status}");
    let cli = eventually(
        "`fleetd status` names the broker",
        Duration::from_secs(10),
        || {
            let text = container.ok("sudo -u fleetd-alice fleetd --instance alice status", "");
            text.contains("broker: connected to 127.0.0.1:5672 since 20")
                .then_some(text)
        },
    );
    assert!(cli.contains("sandbox: landlock fully enforced"), "{cli}");
    let score = exposure(&container);
    assert!(score <= 1.0, "the running unit scores {score} (> 1.0)");
    let roster = container.ok("sudo -u fleetd-alice fleetd --instance alice roster", "");
    assert!(
        roster.contains(&fleet) && roster.contains("alive"),
        "{roster}"
    );

    // A spawn for a host the roster lacks is answered at once, with what the roster has.
    let asked = Instant::now();
    let unknown = container.run(
        "sudo -u fleetd-alice fleetd --instance alice spawn --host nowhere-host --profile builder",
        "",
    );
    let took = asked.elapsed();
    let answer = text_of(&unknown);
    assert!(!unknown.status.success(), "{answer}");
    assert!(
        took < Duration::from_secs(5),
        "answered after {took:?}: {answer}"
    );
    assert!(answer.contains(&format!("{fleet}/{fleet}")), "{answer}");

    // The agent's workflow under the hardened tmux unit.
    let started = container.ok(
        "sudo -u fleetd-alice fleetd --instance alice spawn --profile builder",
        "",
    );
    assert!(started.contains("started builder"), "{started}");
    let log = eventually("the agent's log", Duration::from_secs(20), || {
        let log = container.ok("cat /home/alice/src/work/agent.log 2>/dev/null || true", "");
        log.contains("token-length").then_some(log)
    });
    for expected in [
        "uid: alice".to_owned(),
        "NoNewPrivs:\t1".to_owned(),
        "built: yes".to_owned(),
        format!("service-{n}"),
        "git: 1 commit".to_owned(),
        format!("token-length: {}", agent_secret.len()),
    ] {
        assert!(
            log.contains(&expected),
            "no `{expected}` in the agent's log:\n{log}"
        );
    }

    // The watchdog (shortened to 6 s by a drop-in, so the test does not wait 30): a stopped
    // process is killed and restarted.
    container.ok(
        "printf '[Service]\\nWatchdogSec=6s\\n' > /etc/systemd/system/fleetd@alice.service.d/watchdog.conf \
         && systemctl daemon-reload && systemctl restart fleetd@alice.service",
        "",
    );
    let before = container.unit("MainPID");
    container.ok(&format!("kill -STOP {before}"), "");
    let after = eventually(
        "a restart after the watchdog fired",
        Duration::from_secs(30),
        || {
            let pid = container.unit("MainPID");
            (container.unit("NRestarts") == "1" && container.unit("SubState") == "running")
                .then_some(pid)
        },
    );
    assert_ne!(after, before);
    assert!(
        container
            .journal("-u fleetd@alice.service")
            .contains("Watchdog timeout"),
        "the journal does not say the watchdog fired"
    );
    // A crash.
    container.ok("systemctl kill -s SIGKILL fleetd@alice.service", "");
    let crashed = eventually("a restart after SIGKILL", Duration::from_secs(30), || {
        let pid = container.unit("MainPID");
        (container.unit("NRestarts") == "2" && container.unit("SubState") == "running")
            .then_some(pid)
    });
    assert_ne!(crashed, after);
    // A reload keeps the process.
    container.ok("systemctl reload fleetd@alice.service", "");
    assert_eq!(container.unit("MainPID"), crashed);
    assert_eq!(container.unit("SubState"), "running");

    // A minute after the refused spawn: it was never retried.
    if let Some(rest) = Duration::from_secs(61).checked_sub(asked.elapsed()) {
        std::thread::sleep(rest);
    }
    // A clean stop, and what the journal holds.
    container.ok("systemctl stop fleetd@alice.service", "");
    assert_eq!(container.unit("ActiveState"), "inactive");
    let everything = container.journal("");
    let fleetd = container.journal("-u fleetd@alice.service");
    let retried: Vec<&str> = fleetd
        .lines()
        .filter(|l| l.contains("nowhere-host"))
        .collect();
    assert!(
        retried.len() <= 2,
        "the refused spawn was retried: {retried:#?}"
    );
    assert!(fleetd.contains("fleetd stopped"), "{fleetd}");
    // Nothing fleetd logged at ERROR: not on its stops and starts, not around the kills.
    let errors: Vec<&str> = fleetd.lines().filter(|l| l.contains("\"ERROR\"")).collect();
    assert!(errors.is_empty(), "ERROR lines: {errors:#?}");
    for (secret, what) in [
        (&password, "the broker password"),
        (&agent_secret, "the agent's secret"),
    ] {
        assert!(
            !everything.contains(secret.as_str()),
            "{what} is in the journal"
        );
    }
    let audit = container.ok("cat /var/lib/fleetd/alice/audit.jsonl", "");
    assert!(audit.contains("spawn.started"), "{audit}");
    assert!(!audit.contains(&password) && !audit.contains(&agent_secret));
    drop(container);
}
