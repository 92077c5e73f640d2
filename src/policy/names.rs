//! Names: rule ids, fleets, hosts, profiles, environment variables — and the environment
//! variables that are dangerous to let a remote requester set.

/// Variables that change how a program, its loader, its shell or git behaves: a request may set
/// one only where its grant names it in `allow_dangerous`. `*` matches any run of characters.
pub const DANGEROUS: &[&str] = &[
    "LD_*",
    "DYLD_*",
    "PATH",
    "HOME",
    "SHELL",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "PYTHON*",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5*",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "GIT_CONFIG*",
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_ASKPASS",
    "GIT_EXEC_PATH",
    "GIT_PROXY_COMMAND",
    "GIT_TEMPLATE_DIR",
    "SSH_ASKPASS",
    "SSH_AUTH_SOCK",
    "GCONV_PATH",
    "*_PROXY",
    "*_proxy",
    // The loader and libc: tunables, allocator hooks, locale and resolver files.
    "GLIBC_TUNABLES",
    "MALLOC_*",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RES_OPTIONS",
    "LOCALDOMAIN",
    // Shell start-up and history.
    "ZDOTDIR",
    "INPUTRC",
    "HISTFILE",
    "TERMINFO",
    "TERMINFO_DIRS",
    // Git: programs it runs, where its repository and objects are, what it traces or trusts.
    "GIT_EXTERNAL_DIFF",
    "GIT_DIFF_OPTS",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_TRACE*",
    "GIT_CURL_VERBOSE",
    "GIT_SSL_*",
    "GIT_HTTP_*",
    // Programs other programs start.
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
    // Where programs read their configuration and keep their data.
    "XDG_*",
    "CLAUDE_*",
    "KUBECONFIG",
    "DOCKER_*",
    "KRB5_CONFIG",
    "OPENSSL_*",
    // TLS trust and key logging.
    "SSLKEYLOGFILE",
    "SSL_CERT_*",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_TLS_REJECT_UNAUTHORIZED",
    // API endpoints and credentials an agent talks to.
    "ANTHROPIC_*",
    "OPENAI_*",
    "*_BASE_URL",
    "*_API_BASE",
    // Package managers and build tools that run or fetch code.
    "PIP_*",
    "NPM_CONFIG_*",
    "npm_config_*",
    "CARGO_*",
    "RUSTC*",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "GOFLAGS",
    "GOPROXY",
    "GOPRIVATE",
    "GONOSUMDB",
    "GOINSECURE",
];

/// fleetd's own secrets (`broker-uri`, `host-key`, the admin's `broker-admin-uri`): a profile
/// that passes one to an agent gives the pane this host's broker or signing credential.
pub(crate) const FLEETD_SECRETS: &[&str] = &["broker-uri", "host-key", "broker-admin-uri"];

/// Which of fleetd's own secrets `reference` names, if any (`credential:` or `keyring:`).
pub(crate) fn fleetd_secret(reference: &super::model::SecretRef) -> Option<&'static str> {
    let name = match reference {
        super::model::SecretRef::Credential(name) | super::model::SecretRef::Keyring(name) => name,
        super::model::SecretRef::Env(_) => return None,
    };
    FLEETD_SECRETS.iter().copied().find(|own| *own == name)
}

/// Whether an (anchored) value pattern takes any value: probed with values no real pattern
/// should take — empty, shell syntax, a long run (`.*` takes them all; that it does not take a
/// line break is no comfort).
pub(crate) fn matches_anything(pattern: &regex::Regex) -> bool {
    let long = "x".repeat(4096);
    ["", "; id > /tmp/x #", "$(id)", "`id`", long.as_str()]
        .iter()
        .all(|probe| pattern.is_match(probe))
}

/// Shells: text typed into one that reads its commands from the terminal runs as commands.
const SHELLS: &[&str] = &[
    "sh", "bash", "rbash", "dash", "ash", "zsh", "ksh", "mksh", "oksh", "loksh", "pdksh", "yash",
    "fish", "csh", "tcsh", "nu", "elvish", "xonsh", "pwsh",
];

/// Options of those shells that take the next argument as their value.
const SHELL_OPTION_ARGS: &[&str] = &["-o", "+o", "-O", "+O", "--rcfile", "--init-file"];

/// Whether `argv` runs an interactive shell: argv[0] (or the program `env` or `busybox` runs)
/// is a shell, with no command (`-c`, alone or in a cluster such as `-lc`) and no script. Text
/// typed into its pane would run as commands; such a profile never receives remote text. A REPL
/// of another language is not recognised: its profile says `remote_messages = false`.
pub(crate) fn interactive_shell(argv: &[String]) -> bool {
    fn base(arg: &str) -> &str {
        arg.rsplit('/').next().unwrap_or(arg)
    }
    let mut args = argv.iter().map(String::as_str);
    let Some(mut program) = args.next().map(base) else {
        return false;
    };
    // `env [-i] [NAME=value…] PROGRAM …`, `busybox PROGRAM …`.
    while program == "env" || program == "busybox" {
        match args.find(|a| !a.starts_with('-') && !a.contains('=')) {
            Some(next) => program = base(next),
            None => return false,
        }
    }
    if !SHELLS.contains(&program) {
        return false;
    }
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        if SHELL_OPTION_ARGS.contains(&arg) {
            args.next();
        } else if arg == "--" || !arg.starts_with(['-', '+']) {
            // A script (or `--` before one): the shell runs it, not what is typed.
            return args.peek().is_none() && arg == "--";
        } else if !arg.starts_with("--") && arg.contains('c') {
            return false;
        } else if arg.starts_with('-') && !arg.starts_with("--") && arg.contains('s') {
            // `-s`: commands from standard input, whatever arguments follow.
            return true;
        }
    }
    true
}

/// The dangerous pattern `name` falls under, if any.
pub fn dangerous(name: &str) -> Option<&'static str> {
    DANGEROUS
        .iter()
        .copied()
        .find(|pattern| glob(pattern, name))
}

fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 128 bytes.
pub(super) fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 128
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A rule id or profile name: `[a-z0-9][a-z0-9_-]*`, at most 64 bytes.
pub(super) fn valid_id(id: &str) -> bool {
    let mut bytes = id.bytes();
    id.len() <= 64
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A fleet (broker vhost) name: like an id.
pub(super) fn valid_fleet(fleet: &str) -> bool {
    valid_id(fleet)
}

/// A host name: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most 64 bytes.
pub(super) fn valid_host(host: &str) -> bool {
    let mut bytes = host.bytes();
    host.len() <= 64
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The closest of `candidates` to `word`, when it is a likely typo (edit distance ≤ 2).
pub(super) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance (names are short).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row.first().copied().unwrap_or(0);
        if let Some(first) = row.first_mut() {
            *first = i + 1;
        }
        for (j, cb) in b.iter().enumerate() {
            let above = row.get(j + 1).copied().unwrap_or(usize::MAX);
            let left = row.get(j).copied().unwrap_or(usize::MAX);
            let value = (previous + usize::from(ca != *cb))
                .min(above + 1)
                .min(left + 1);
            previous = above;
            if let Some(cell) = row.get_mut(j + 1) {
                *cell = value;
            }
        }
    }
    row.last().copied().unwrap_or(0)
}

/// fleetd's own places as docs/operations.md installs them, and the multiplexers' socket
/// directories: no agent's sandbox may show anything inside them (`policy check` refuses a
/// profile that names one; on the host, the daemon also hides its configured places).
pub const FLEETD_PLACES: &[&str] = &[
    "/etc/fleetd",
    "/var/lib/fleetd",
    "/run/fleetd",
    "/run/credentials",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/run/user",
];

/// The fleetd place (or multiplexer socket directory) `path` lies in, if any.
pub fn fleetd_place(path: &std::path::Path) -> Option<String> {
    if let Some(place) = FLEETD_PLACES.iter().find(|p| path.starts_with(p)) {
        return Some((*place).to_owned());
    }
    // tmux's default socket directories: /tmp/tmux-UID (or under $TMUX_TMPDIR).
    let mut components = path.components();
    match (components.next(), components.next(), components.next()) {
        (
            Some(std::path::Component::RootDir),
            Some(std::path::Component::Normal(tmp)),
            Some(std::path::Component::Normal(dir)),
        ) if tmp == "tmp" && dir.to_string_lossy().starts_with("tmux-") => {
            Some(format!("/tmp/{}", dir.to_string_lossy()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_names_match_their_patterns() {
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "DYLD_INSERT_LIBRARIES",
            "PATH",
            "HOME",
            "SHELL",
            "BASH_ENV",
            "ENV",
            "BASH_FUNC_x",
            "SHELLOPTS",
            "PS4",
            "PROMPT_COMMAND",
            "IFS",
            "PYTHONPATH",
            "PYTHONSTARTUP",
            "NODE_OPTIONS",
            "PERL5OPT",
            "PERL5LIB",
            "RUBYOPT",
            "JAVA_TOOL_OPTIONS",
            "GIT_CONFIG_GLOBAL",
            "GIT_CONFIG_COUNT",
            "GIT_CONFIG",
            "GIT_SSH_COMMAND",
            "GIT_ASKPASS",
            "SSH_AUTH_SOCK",
            "HTTPS_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "NO_PROXY",
            "GLIBC_TUNABLES",
            "ANTHROPIC_BASE_URL",
            "XDG_CONFIG_HOME",
            "GIT_EXTERNAL_DIFF",
            "SSLKEYLOGFILE",
            "OPENAI_API_BASE",
            "ZDOTDIR",
            "NPM_CONFIG_REGISTRY",
        ] {
            assert!(dangerous(name).is_some(), "{name} is dangerous");
        }
        for name in [
            "TASK_ID",
            "REPO",
            "PATHS_FILE",
            "HOMEPAGE",
            "GIT_AUTHOR_NAME",
            "PROXY",
        ] {
            assert_eq!(dangerous(name), None, "{name} is not dangerous");
        }
    }

    #[test]
    fn did_you_mean_finds_typos_only() {
        assert_eq!(
            did_you_mean("profles", ["profiles", "fleets"]),
            Some("profiles")
        );
        assert_eq!(
            did_you_mean("alow_dangerous", ["allow_dangerous"]),
            Some("allow_dangerous")
        );
        assert_eq!(did_you_mean("colour", ["profiles", "fleets"]), None);
    }
}
