//! fleetd under the unit's restrictions without systemd as PID 1 (CI): a harness reproduces
//! what it can of deploy/fleetd@.service and runs fleetd (and a probe) inside it.
//!
//! Reproduced (docs/hardening.md says what is not): a private mount namespace in which every
//! mount is read-only except the state and runtime directories (`ProtectSystem=strict`,
//! `ReadWritePaths`), `/home`, `/root` and `/tmp` hidden by empty tmpfs when fleetd's own
//! files are not under them (`ProtectHome=tmpfs`, `PrivateTmp`), the credential directory as a
//! read-only tmpfs of 0400 files (`LoadCredential=`), an empty capability bounding set
//! (`CapabilityBoundingSet=`), `NoNewPrivileges`, and seccomp filters built from the unit's own
//! `SystemCallFilter=` lines, expanded by the real `systemd-analyze syscall-filter`, with
//! `SystemCallErrorNumber=EPERM`, plus `RestrictAddressFamilies`, `RestrictNamespaces` and
//! `MemoryDenyWriteExecute` as systemd builds them.
//!
//! This binary is its own launcher (`harness = false`): run under `unshare --mount` with
//! `FLEETD_CONFINE=1`, its single thread confines itself and executes the target.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: a failed step is a failed test; the harness prints its results"
)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rustix::mount::{
    MountFlags, MountPropagationFlags, mount, mount_bind, mount_change, mount_remount,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

const UNIT: &str = include_str!("../deploy/fleetd@.service");

fn main() {
    if std::env::var_os("FLEETD_CONFINE").is_some() {
        launcher();
    }
    if std::env::var_os("FLEETD_NO_LANDLOCK").is_some() {
        without_landlock();
    }
    let tests: [(&str, fn()); 3] = [
        ("the_harness_refuses_what_the_unit_refuses", probe_test),
        (
            "confined_fleetd_connects_serves_and_is_refused",
            fleetd_test,
        ),
        (
            "required_sandbox_without_landlock_says_why",
            no_landlock_test,
        ),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    println!("\nrunning {} tests", tests.len());
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n"
    );
    std::process::exit(i32::from(failed > 0));
}

// ---- the launcher: runs alone in its mount namespace, one thread --------------------------

fn env_paths(name: &str) -> Vec<PathBuf> {
    std::env::var_os(name)
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default()
}

fn launcher() -> ! {
    let writable = env_paths("FLEETD_CONFINE_WRITABLE");
    let credentials = env_paths("FLEETD_CONFINE_CREDENTIALS").pop();
    let keep = env_paths("FLEETD_CONFINE_KEEP"); // must stay visible (binary, test files)
    let report = confine(&writable, credentials.as_deref(), &keep);
    eprintln!("confined: {report}");
    if std::env::var_os("FLEETD_CONFINE_PROBE").is_some() {
        std::process::exit(probe(&writable[0], credentials.as_deref().unwrap()));
    }
    let args: Vec<String> = std::env::args().skip_while(|a| a != "--").skip(1).collect();
    let mut command = Command::new(&args[0]);
    command.args(&args[1..]);
    for name in [
        "FLEETD_CONFINE",
        "FLEETD_CONFINE_WRITABLE",
        "FLEETD_CONFINE_CREDENTIALS",
        "FLEETD_CONFINE_KEEP",
    ] {
        command.env_remove(name);
    }
    if let Some(dir) = &credentials {
        command.env("CREDENTIALS_DIRECTORY", dir);
    }
    let error = command.exec();
    eprintln!("confined: cannot execute {}: {error}", args[0]);
    std::process::exit(127);
}

/// Applies every reproduced restriction to this process; returns what was done.
fn confine(writable: &[PathBuf], credentials: Option<&Path>, keep: &[PathBuf]) -> String {
    let mut done = Vec::new();
    // Nothing done here may reach the parent namespace.
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .expect("mount namespace is not private (run under `unshare --mount`)");
    // ReadWritePaths: each writable directory becomes its own mount before the rest turns
    // read-only.
    for dir in writable {
        mount_bind(dir, dir).unwrap_or_else(|e| panic!("bind {}: {e}", dir.display()));
    }
    // LoadCredential=: the files copied into a read-only tmpfs, 0400.
    if let Some(dir) = credentials {
        let files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
            .collect();
        mount(
            "tmpfs",
            dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            c"mode=0700",
        )
        .unwrap();
        for (path, bytes) in &files {
            std::fs::write(path, bytes).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o400)).unwrap();
        }
        mount_remount(
            dir,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            "",
        )
        .unwrap();
        done.push(format!("credentials read-only ({} files)", files.len()));
    }
    // ProtectSystem=strict: every other mount read-only (the API file systems aside).
    let mut refused = Vec::new();
    let mut count = 0;
    for (point, options) in mounts() {
        let special = ["/proc", "/sys", "/dev"]
            .iter()
            .any(|p| point == Path::new(p) || point.starts_with(p));
        if special || writable.contains(&point) || credentials == Some(point.as_path()) {
            continue;
        }
        let mut flags = MountFlags::BIND | MountFlags::RDONLY;
        for (option, flag) in [
            ("nosuid", MountFlags::NOSUID),
            ("nodev", MountFlags::NODEV),
            ("noexec", MountFlags::NOEXEC),
            ("relatime", MountFlags::RELATIME),
            ("noatime", MountFlags::NOATIME),
        ] {
            if options.split(',').any(|o| o == option) {
                flags |= flag;
            }
        }
        match mount_remount(&point, flags, "") {
            Ok(()) => count += 1,
            Err(e) => refused.push(format!("{} ({e})", point.display())),
        }
    }
    done.push(format!("{count} mounts read-only"));
    if !refused.is_empty() {
        done.push(format!("could not remount {}", refused.join(", ")));
    }
    // ProtectHome=tmpfs, PrivateTmp: only where fleetd's own files are not.
    for (dir, what) in [
        ("/home", "ProtectHome"),
        ("/root", "ProtectHome"),
        ("/tmp", "PrivateTmp"),
    ] {
        if keep.iter().any(|k| k.starts_with(dir)) {
            done.push(format!(
                "{what} not reproduced for {dir} (the test files live there)"
            ));
            continue;
        }
        if Path::new(dir).is_dir() {
            let flags = MountFlags::NOSUID | MountFlags::NODEV;
            mount("tmpfs", dir, "tmpfs", flags, c"mode=0755").unwrap();
            done.push(format!("{dir} hidden"));
        }
    }
    // CapabilityBoundingSet= (empty): root keeps uid 0 but no capability survives exec.
    for bit in 0..64u32 {
        let Some(cap) = rustix::thread::CapabilitySet::from_bits(1u64 << bit) else {
            continue;
        };
        if rustix::thread::capability_is_in_bounding_set(cap).unwrap_or(false) {
            rustix::thread::remove_capability_from_bounding_set(cap).unwrap();
        }
    }
    done.push("empty capability bounding set".to_owned());
    rustix::thread::set_no_new_privs(true).unwrap();
    done.push("no new privileges".to_owned());
    for program in filters() {
        seccompiler::apply_filter(&program).unwrap();
    }
    done.push("seccomp filters from the unit".to_owned());
    done.join("; ")
}

/// (mount point, options) of every mount, from `/proc/self/mountinfo`.
fn mounts() -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Some((
                PathBuf::from(unescape(fields.get(4)?)),
                (*fields.get(5)?).to_owned(),
            ))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(value)) => {
                out.push(value);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Syscall numbers of this machine, from the kernel headers.
fn syscall_numbers() -> BTreeMap<String, i64> {
    let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    let text = std::fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("{header} is missing ({e}): install linux-libc-dev"));
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("#define __NR_")?;
            let (name, number) = rest.split_once(' ')?;
            Some((name.to_owned(), number.trim().parse().ok()?))
        })
        .collect()
}

fn rule(conditions: &[(u8, SeccompCmpOp, u64)]) -> SeccompRule {
    SeccompRule::new(
        conditions
            .iter()
            .map(|(arg, op, value)| {
                SeccompCondition::new(*arg, SeccompCmpArgLen::Qword, op.clone(), *value).unwrap()
            })
            .collect(),
    )
    .unwrap()
}

fn filter(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    hit: SeccompAction,
) -> BpfProgram {
    SeccompFilter::new(rules, mismatch, hit, TargetArch::x86_64)
        .unwrap()
        .try_into()
        .unwrap()
}

/// The unit's syscall restrictions as seccomp programs (the kernel applies the strictest
/// verdict of all of them).
fn filters() -> Vec<BpfProgram> {
    const EPERM: u32 = 1;
    const ENOSYS: u32 = 38;
    const EAFNOSUPPORT: u32 = 97;
    let numbers = syscall_numbers();
    let nr = |name: &str| numbers[name];
    // SystemCallFilter= allow-list, SystemCallErrorNumber=EPERM.
    let allowed: BTreeMap<i64, Vec<SeccompRule>> = common::syscalls::unit_allow_list(UNIT)
        .iter()
        .filter_map(|name| numbers.get(name).map(|n| (*n, Vec::new())))
        .collect();
    let allow_list = filter(allowed, SeccompAction::Errno(EPERM), SeccompAction::Allow);
    // RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6.
    let families = BTreeMap::from([(
        nr("socket"),
        vec![rule(&[
            (0, SeccompCmpOp::Ne, 1),
            (0, SeccompCmpOp::Ne, 2),
            (0, SeccompCmpOp::Ne, 10),
        ])],
    )]);
    let families = filter(
        families,
        SeccompAction::Allow,
        SeccompAction::Errno(EAFNOSUPPORT),
    );
    // RestrictNamespaces=yes: clone3's flags cannot be inspected, so systemd answers ENOSYS
    // (glibc falls back to clone); clone with a namespace flag, unshare and setns are refused.
    let clone3 = filter(
        BTreeMap::from([(nr("clone3"), Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS),
    );
    let namespace_flags = [
        0x0002_0000u64, // CLONE_NEWNS
        0x0200_0000,    // CLONE_NEWCGROUP
        0x0400_0000,    // CLONE_NEWUTS
        0x0800_0000,    // CLONE_NEWIPC
        0x1000_0000,    // CLONE_NEWUSER
        0x2000_0000,    // CLONE_NEWPID
        0x4000_0000,    // CLONE_NEWNET
        0x0000_0080,    // CLONE_NEWTIME
    ];
    let clone_rules = namespace_flags
        .iter()
        .map(|flag| rule(&[(0, SeccompCmpOp::MaskedEq(*flag), *flag)]))
        .collect();
    // MemoryDenyWriteExecute=yes: no writable+executable mapping, no mprotect to executable.
    const PROT_WRITE: u64 = 2;
    const PROT_EXEC: u64 = 4;
    let denied = BTreeMap::from([
        (nr("clone"), clone_rules),
        (nr("unshare"), Vec::new()),
        (nr("setns"), Vec::new()),
        (
            nr("mmap"),
            vec![rule(&[(
                2,
                SeccompCmpOp::MaskedEq(PROT_WRITE | PROT_EXEC),
                PROT_WRITE | PROT_EXEC,
            )])],
        ),
        (
            nr("mprotect"),
            vec![rule(&[(2, SeccompCmpOp::MaskedEq(PROT_EXEC), PROT_EXEC)])],
        ),
        (
            nr("pkey_mprotect"),
            vec![rule(&[(2, SeccompCmpOp::MaskedEq(PROT_EXEC), PROT_EXEC)])],
        ),
    ]);
    let denied = filter(denied, SeccompAction::Allow, SeccompAction::Errno(EPERM));
    // The allow-list last: it refuses `seccomp` itself.
    vec![families, clone3, denied, allow_list]
}

/// Checks, inside the harness, that what the unit forbids fails and what fleetd needs works.
/// Prints one line per check; returns the exit code (0: every check as expected).
fn probe(writable: &Path, credentials: &Path) -> i32 {
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    let mut checks: Vec<(&str, bool, String)> = Vec::new();
    let mut check = |name: &'static str, ok: bool, detail: String| checks.push((name, ok, detail));

    let usr = errno(std::fs::write("/usr/fleetd-confined-probe", b"x"));
    check(
        "write /usr refused (EROFS)",
        usr == Some(30),
        format!("{usr:?}"),
    );
    let outside = writable.parent().unwrap().join("outside-probe");
    let o = errno(std::fs::write(&outside, b"x"));
    check(
        "write beside the state dir refused (EROFS)",
        o == Some(30),
        format!("{o:?}"),
    );
    let inside = writable.join("probe");
    let i = std::fs::write(&inside, b"x").and_then(|()| std::fs::remove_file(&inside));
    check(
        "write in the state dir allowed",
        i.is_ok(),
        format!("{i:?}"),
    );
    let credential = std::fs::read_dir(credentials)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mode = std::fs::metadata(&credential).unwrap().permissions().mode() & 0o777;
    let readable = std::fs::read(&credential).is_ok();
    check(
        "credential readable, mode 0400",
        readable && mode == 0o400,
        format!("{mode:o}"),
    );
    let c = errno(std::fs::write(credentials.join("planted"), b"x"));
    check(
        "write into the credential dir refused (EROFS)",
        c == Some(30),
        format!("{c:?}"),
    );
    use rustix::net::{AddressFamily, SocketType, socket};
    let netlink = socket(AddressFamily::NETLINK, SocketType::DGRAM, None).err();
    check(
        "AF_NETLINK socket refused (EAFNOSUPPORT)",
        netlink == Some(rustix::io::Errno::AFNOSUPPORT),
        format!("{netlink:?}"),
    );
    let packet = socket(AddressFamily::PACKET, SocketType::DGRAM, None).err();
    check(
        "AF_PACKET socket refused (EAFNOSUPPORT)",
        packet == Some(rustix::io::Errno::AFNOSUPPORT),
        format!("{packet:?}"),
    );
    let inet = socket(AddressFamily::INET, SocketType::STREAM, None).map(drop);
    check("AF_INET socket allowed", inet.is_ok(), format!("{inet:?}"));
    let m = mount_bind(writable, writable).err();
    check(
        "mount refused (EPERM)",
        m == Some(rustix::io::Errno::PERM),
        format!("{m:?}"),
    );
    let p = rustix::process::setpriority_process(None, 5).err();
    check(
        "setpriority refused (EPERM)",
        p == Some(rustix::io::Errno::PERM),
        format!("{p:?}"),
    );
    let nnp = rustix::thread::no_new_privs().unwrap_or(false);
    check("no_new_privs set", nnp, String::new());
    let admin =
        rustix::thread::capability_is_in_bounding_set(rustix::thread::CapabilitySet::SYS_ADMIN);
    check(
        "CAP_SYS_ADMIN not in the bounding set",
        admin.ok() == Some(false),
        format!("{admin:?}"),
    );
    let quiet = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    let t = quiet("/usr/bin/true", &[]);
    check(
        "exec allowed",
        t.as_ref().is_ok_and(|s| s.success()),
        format!("{t:?}"),
    );
    let u = quiet("/usr/bin/unshare", &["--user", "/usr/bin/true"]);
    check(
        "unshare --user refused",
        u.as_ref().is_ok_and(|s| !s.success()),
        format!("{u:?}"),
    );
    let wx = quiet(
        "/usr/bin/python3",
        &[
            "-c",
            "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC)",
        ],
    );
    check(
        "writable+executable mapping refused (python3 mmap)",
        wx.as_ref().is_ok_and(|s| !s.success()),
        format!("{wx:?} (needs /usr/bin/python3)"),
    );
    let w = quiet(
        "/usr/bin/python3",
        &["-c", "import mmap; mmap.mmap(-1, 4096)"],
    );
    check(
        "an ordinary mapping works",
        w.as_ref().is_ok_and(|s| s.success()),
        format!("{w:?}"),
    );

    let mut failed = 0;
    for (name, ok, detail) in &checks {
        println!("{} {name} {detail}", if *ok { "PASS" } else { "FAIL" });
        failed += usize::from(!ok);
    }
    i32::from(failed > 0)
}

// ---- the tests ---------------------------------------------------------------------------

/// `unshare --mount` running this binary as the launcher of `target`.
fn confined(writable: &[&Path], credentials: &Path, keep: &[&Path]) -> Command {
    assert!(
        rustix::process::geteuid().is_root(),
        "the confinement harness needs root (a mount namespace): run the suite as root"
    );
    let join = |paths: &[&Path]| std::env::join_paths(paths).unwrap();
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().unwrap())
        .env("FLEETD_CONFINE", "1")
        .env("FLEETD_CONFINE_WRITABLE", join(writable))
        .env("FLEETD_CONFINE_CREDENTIALS", credentials)
        .env("FLEETD_CONFINE_KEEP", join(keep));
    command
}

fn scratch() -> tempfile::TempDir {
    // Not under /tmp, so PrivateTmp can be reproduced.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn probe_test() {
    let root = scratch();
    let state = root.path().join("state");
    let credentials = root.path().join("credentials");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::write(credentials.join("broker-uri"), "amqp://x:canary@127.0.0.1/").unwrap();
    let exe = std::env::current_exe().unwrap();
    let output = confined(&[&state], &credentials, &[&exe, root.path()])
        .env("FLEETD_CONFINE_PROBE", "1")
        .output()
        .expect("unshare (util-linux) is missing: scripts/test installs it");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stderr}{stdout}");
    assert!(output.status.success(), "a check failed:\n{stderr}{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("PASS")).count(),
        16,
        "{stdout}"
    );
}

fn fleetd_test() {
    let (_, fleet, password, mut cleanup) = common::one_fleet("cnf");
    let root = scratch();
    let host = common::Host::new(root.path(), "confined");
    let daemon = host.command(&fleet, &password, &[], &[], ("", ""), &[]);
    let (state, run) = (host.dir.join("state"), host.dir.join("run"));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let bin = PathBuf::from(common::BIN);
    let mut launcher = confined(
        &[&state, &run],
        &host.dir.join("credentials"),
        &[&bin, root.path()],
    );
    launcher.arg("--");
    // The launcher points CREDENTIALS_DIRECTORY at its read-only copy itself.
    let mut command = common::run_through(launcher, &daemon);
    command.env_remove("CREDENTIALS_DIRECTORY");
    let (child, lines) = common::spawn_logged(command);
    cleanup.children.push(child);
    let mut seen = String::new();
    common::wait_for(&lines, &mut seen, &["confined: "], Duration::from_secs(10));
    common::wait_for(
        &lines,
        &mut seen,
        &["fleetd ready"],
        Duration::from_secs(20),
    );
    common::wait_for(
        &lines,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(30),
    );
    println!("{}", seen.lines().next().unwrap_or_default());
    let status = host.cli(&["status"]);
    assert!(
        status.contains("sandbox: landlock fully enforced"),
        "{status}"
    );
    assert!(
        status.contains("broker: up") || status.contains("connected"),
        "{status}"
    );
    // The local API routes: an agent opened and a message delivered to it on this host.
    let agent = host.open_agent("inbox");
    let (id, _) = host.send(&agent, &agent, "hello from inside the harness");
    host.wait_delivery(&id, "delivered");
    assert!(
        !seen.contains(&password),
        "the broker password reached the log"
    );
}

// ---- Landlock refused by seccomp (as some container runtimes do) ----------------------------

/// Launcher mode: refuses Landlock's three system calls with ENOSYS, then runs the command after
/// `--` (the kernel has Landlock; the filter makes it look absent, as a container's would).
fn without_landlock() -> ! {
    const ENOSYS: u32 = 38;
    let numbers = syscall_numbers();
    let landlock: BTreeMap<i64, Vec<SeccompRule>> = [
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
    ]
    .iter()
    .map(|name| (numbers[*name], Vec::new()))
    .collect();
    rustix::thread::set_no_new_privs(true).unwrap();
    seccompiler::apply_filter(&filter(
        landlock,
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS),
    ))
    .unwrap();
    let args: Vec<String> = std::env::args().skip_while(|a| a != "--").skip(1).collect();
    let error = Command::new(&args[0])
        .args(&args[1..])
        .env_remove("FLEETD_NO_LANDLOCK")
        .exec();
    eprintln!("cannot execute {}: {error}", args[0]);
    std::process::exit(127);
}

/// `sandbox = "required"` where Landlock's system calls are refused: fleetd does not start, and
/// says Landlock is unavailable and why — not the crate's access-right bit sets.
fn no_landlock_test() {
    let dir = scratch();
    let config = common::solo_config(dir.path(), "nolandlock", "sandbox = \"required\"\n");
    let output = Command::new(std::env::current_exe().unwrap())
        .env("FLEETD_NO_LANDLOCK", "1")
        .env("HOME", dir.path())
        .args([
            "--",
            common::BIN,
            "--config",
            config.to_str().unwrap(),
            "run",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "started without Landlock: {stderr}"
    );
    assert!(
        stderr.contains("Landlock is unavailable to fleetd") && stderr.contains("ENOSYS"),
        "{stderr}"
    );
    assert!(!stderr.contains("BitFlags"), "{stderr}");
}
