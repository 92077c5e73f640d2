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
];

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
