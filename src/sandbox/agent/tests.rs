#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

use super::*;

fn plan() -> Plan {
    Plan {
        bwrap: "/usr/bin/bwrap".into(),
        network: Network::None,
        tcp_connect: None,
        cwd: "/home/alice/work/repo".into(),
        writable: vec!["/home/alice/work".into()],
        readable: vec!["/home/alice/.gitconfig".into()],
        hidden: vec!["/var/lib/fleetd".into(), "/home/alice/work/.fleetd".into()],
        socket: Some("/run/fleetd/fleetd.sock".into()),
        env: vec!["FLEETD_SOCKET".into()],
    }
}

fn words(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn position(words: &[String], seq: &[&str]) -> usize {
    words
        .windows(seq.len())
        .position(|w| w.iter().zip(seq).all(|(a, b)| a == b))
        .unwrap_or_else(|| panic!("{seq:?} not in {words:?}"))
}

#[test]
fn deeper_places_are_mounted_after_the_places_that_hold_them() {
    let all_dirs = |_: &Path| Some(Kind::Dir);
    let args = words(&plan().bwrap_args(1000, Some(3), &all_dirs));
    // `/` read-only first, then the fresh /dev and /proc over it.
    assert!(position(&args, &["--ro-bind", "/", "/"]) < position(&args, &["--proc", "/proc"]));
    // The home is hidden, then the root in it bound back, then fleetd's place in the root hidden.
    let home = position(&args, &["--tmpfs", "/home"]);
    let root = position(
        &args,
        &["--bind-try", "/home/alice/work", "/home/alice/work"],
    );
    let inner = position(&args, &["--tmpfs", "/home/alice/work/.fleetd"]);
    assert!(home < root && root < inner, "{args:?}");
    assert!(home < position(&args, &["--ro-bind-try", "/home/alice/.gitconfig"]));
    // The socket comes back last, over its hidden directory.
    let socket = position(
        &args,
        &[
            "--bind-try",
            "/run/fleetd/fleetd.sock",
            "/run/fleetd/fleetd.sock",
        ],
    );
    assert!(socket > position(&args, &["--tmpfs", "/run/user"]));
    assert!(args.contains(&"--unshare-net".to_owned()));
    assert!(!args.contains(&"--uid".to_owned()), "a user keeps its uid");
    assert_eq!(args[args.len() - 2..], ["--seccomp", "3"]);
}

#[test]
fn a_file_is_hidden_under_dev_null_and_a_missing_place_is_skipped() {
    let mut plan = plan();
    plan.hidden = vec!["/etc/fleetd/fleetd.toml".into(), "/nowhere".into()];
    let kind = |p: &Path| match p.to_str() {
        Some("/etc/fleetd/fleetd.toml") => Some(Kind::File),
        Some("/nowhere") => None,
        _ => Some(Kind::Dir),
    };
    let args = words(&plan.bwrap_args(1000, None, &kind));
    position(
        &args,
        &["--ro-bind", "/dev/null", "/etc/fleetd/fleetd.toml"],
    );
    assert!(!args.iter().any(|a| a == "/nowhere"));
    assert!(!args.contains(&"--seccomp".to_owned()));
}

#[test]
fn root_runs_as_an_unprivileged_uid_and_host_network_is_shared() {
    let mut plan = plan();
    plan.network = Network::Host;
    plan.tcp_connect = Some(vec![443, 22]);
    let args = words(&plan.bwrap_args(0, None, &|_| Some(Kind::Dir)));
    position(&args, &["--uid", "1000", "--gid", "1000"]);
    assert!(!args.contains(&"--unshare-net".to_owned()));
}

#[test]
fn a_plan_that_would_bind_into_fleetds_places_is_refused() {
    let mut inside = plan();
    inside.writable.push("/var/lib/fleetd/state".into());
    let arg = inside.to_arg();
    assert!(matches!(
        Plan::from_arg(&arg),
        Err(EnterError::InsideHidden { .. })
    ));
    // A parent is bound first and the place hidden again after it (deeper).
    let mut above = plan();
    above.readable.push("/var/lib".into());
    let args = words(&above.bwrap_args(1000, None, &|_| Some(Kind::Dir)));
    assert!(
        position(&args, &["--ro-bind-try", "/var/lib"])
            < position(&args, &["--tmpfs", "/var/lib/fleetd"])
    );
    assert!(Plan::from_arg(&above.to_arg()).is_ok());
    let mut relative = plan();
    relative.writable.push("work/../../etc".into());
    assert!(matches!(
        Plan::from_arg(&relative.to_arg()),
        Err(EnterError::Path(_))
    ));
    assert!(matches!(
        Plan::from_arg("{\"bwrap\": 1}"),
        Err(EnterError::Plan(_))
    ));
    assert_eq!(Plan::from_arg(&plan().to_arg()).unwrap(), plan());
}

#[test]
fn the_seccomp_program_is_whole_instructions_and_grows_with_the_socket_rules() {
    let open = seccomp_program(Network::Host).unwrap();
    let closed = seccomp_program(Network::None).unwrap();
    assert_eq!(open.len() % 8, 0);
    assert_eq!(closed.len() % 8, 0);
    assert!(closed.len() > open.len());
}

#[test]
fn a_place_already_under_an_empty_tmpfs_gets_no_mount_of_its_own() {
    let mut plan = plan();
    plan.hidden = vec![
        "/tmp/t/state".into(),
        "/home/alice/work/.fleetd".into(),
        "/var/lib/fleetd".into(),
    ];
    plan.writable = vec!["/home/alice/work".into()];
    let args = words(&plan.bwrap_args(1000, None, &|_| Some(Kind::Dir)));
    // Under the private /tmp, with nothing bound back around it: nothing to hide.
    assert!(!args.iter().any(|a| a == "/tmp/t/state"), "{args:?}");
    // Under a home, but inside a root bound back over it: hidden again.
    position(&args, &["--tmpfs", "/home/alice/work/.fleetd"]);
    position(&args, &["--tmpfs", "/var/lib/fleetd"]);
    // A root of `/tmp` binds the host's /tmp back: the place in it is hidden again.
    plan.writable = vec!["/tmp".into()];
    let args = words(&plan.bwrap_args(1000, None, &|_| Some(Kind::Dir)));
    assert!(
        position(&args, &["--bind-try", "/tmp", "/tmp"])
            < position(&args, &["--tmpfs", "/tmp/t/state"]),
        "{args:?}"
    );
}

/// The kernel's settings, as files in a directory laid out like `/proc/sys`: a test double for
/// a kernel that denies user namespaces — this machine's cannot be switched off without
/// breaking every other test running beside this one.
fn sysctl(settings: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, value) in settings {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, value).unwrap();
    }
    dir
}

#[test]
fn a_kernel_that_denies_user_namespaces_outright_is_named_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().unwrap();
    let plain = bin.path().join("bwrap");
    std::fs::write(&plain, "").unwrap();
    let setuid = bin.path().join("bwrap-setuid");
    std::fs::write(&setuid, "").unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();

    let none = sysctl(&[("user/max_user_namespaces", "0\n")]);
    let off = userns_off(none.path(), &setuid).unwrap();
    assert_eq!(off, UsernsOff::NoneAllowed);
    assert!(
        off.to_string()
            .contains("sysctl -w user.max_user_namespaces="),
        "{off}"
    );

    let debian = sysctl(&[
        ("user/max_user_namespaces", "63000\n"),
        ("kernel/unprivileged_userns_clone", "0\n"),
    ]);
    let off = userns_off(debian.path(), &plain).unwrap();
    assert_eq!(off, UsernsOff::UnprivilegedOff);
    assert!(
        off.to_string().contains("unprivileged_userns_clone=1"),
        "{off}"
    );
    // A setuid bubblewrap does not need unprivileged ones.
    assert_eq!(userns_off(debian.path(), &setuid), None);

    // Allowed, absent or unreadable: nothing said outright, nothing refused before launch.
    let open = sysctl(&[
        ("user/max_user_namespaces", "63000\n"),
        ("kernel/unprivileged_userns_clone", "1\n"),
        ("kernel/apparmor_restrict_unprivileged_userns", "1\n"),
    ]);
    assert_eq!(userns_off(open.path(), &plain), None);
    assert_eq!(userns_off(&bin.path().join("nothing"), &plain), None);
    let garbage = sysctl(&[("user/max_user_namespaces", "lots")]);
    assert_eq!(userns_off(garbage.path(), &plain), None);
    // This machine's own settings allow them (the sandbox tests run here).
    assert_eq!(
        userns_off(Path::new(PROC_SYS), Path::new("/usr/bin/bwrap")),
        None
    );
}
