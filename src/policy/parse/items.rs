//! The items of a policy file: profiles (with readiness), grants and deny rules.

use super::*;

impl Ctx<'_> {
    pub(super) fn profile(
        &mut self,
        name: &Spanned<std::borrow::Cow<'_, str>>,
        body: &Value<'_>,
    ) -> Option<Profile> {
        let what = format!("profile.{}", name.get_ref());
        let table = self.table(body, &what)?;
        let mut ok = self.required(table, schema::PROFILE, name.span(), &what);
        if name.get_ref() == MAILBOX {
            self.error(
                "invalid-value",
                name.span(),
                format!("`{MAILBOX}` is reserved: it names the primary's mailboxes in `[[message]]` rules"),
            );
            ok = false;
        }
        if !names::valid_id(name.get_ref()) {
            self.error(
                "invalid-value",
                name.span(),
                format!(
                    "`{}` is not a valid profile name (lowercase letters, digits, `-`, `_`)",
                    name.get_ref()
                ),
            );
            ok = false;
        }
        let argv: Vec<String> = self
            .strings(table, "argv", &what)
            .unwrap_or_default()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        if let Some(value) = table.get("argv").filter(|v| v.get_ref().is_array()) {
            if argv.is_empty() {
                self.error(
                    "invalid-value",
                    value.span(),
                    format!("`{what}.argv` is empty"),
                );
                ok = false;
            } else if !argv.first().is_some_and(|a| a.starts_with('/')) {
                self.error(
                    "invalid-value",
                    value.span(),
                    format!("`{what}.argv[0]` must be an absolute path (no PATH lookup)"),
                );
                ok = false;
            }
        }
        let mut roots = Vec::new();
        for (root, span) in self.strings(table, "roots", &what).unwrap_or_default() {
            let path = PathBuf::from(&root);
            if !path.is_absolute()
                || path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                self.error(
                    "invalid-value",
                    span.clone(),
                    format!("root `{root}` of `{what}` must be an absolute path without `..`"),
                );
                ok = false;
            } else {
                // Roots are writable in the agent's sandbox.
                ok &= self.outside_fleetd_places(&path, span.clone(), &format!("root of `{what}`"));
            }
            if path == std::path::Path::new("/") {
                self.push(
                    self.diag(
                        Severity::Warning,
                        "broad-root",
                        span,
                        format!("`{what}` has the root `/`: a request may pick any directory of this host as its working directory"),
                    )
                    .with_help("name the directories its work belongs in"),
                );
            }
            roots.push(path);
        }
        if table.get("roots").is_some() && roots.is_empty() {
            self.error(
                "invalid-value",
                name.span(),
                format!("`{what}.roots` is empty"),
            );
            ok = false;
        }
        let mut env = BTreeMap::new();
        for (var, span, value, _) in self.string_map(table, "env", &what) {
            if !names::valid_env_name(&var) {
                self.error(
                    "invalid-value",
                    span,
                    format!("`{var}` in `{what}.env` is not a valid variable name"),
                );
                ok = false;
            }
            env.insert(var, value);
        }
        let mut secrets = BTreeMap::new();
        for (var, span, reference, value_span) in self.string_map(table, "secrets", &what) {
            if !names::valid_env_name(&var) {
                self.error(
                    "invalid-value",
                    span.clone(),
                    format!("`{var}` in `{what}.secrets` is not a valid variable name"),
                );
                ok = false;
            }
            if env.contains_key(&var) {
                self.error(
                    "invalid-value",
                    span,
                    format!("`{var}` is both a fixed variable and a secret in `{what}`"),
                );
                ok = false;
            }
            match secret_ref(&reference) {
                Some(parsed) => {
                    if let Some(own) = names::fleetd_secret(&parsed) {
                        self.push(self.diag(
                            Severity::Warning,
                            "fleetd-secret",
                            value_span,
                            format!("`{what}.secrets.{var}` hands fleetd's own `{own}` to the agent: whoever runs in the pane then holds this host's broker or signing credential"),
                        ));
                    }
                    secrets.insert(var, parsed);
                }
                None => {
                    let d = self
                        .diag(
                            Severity::Error,
                            "invalid-value",
                            value_span,
                            format!("`{what}.secrets.{var}` is not a secret reference"),
                        )
                        .with_help("write `credential:NAME`, `keyring:NAME` or `env:NAME`");
                    self.push(d);
                    ok = false;
                }
            }
        }
        let max_instances = self
            .integer(table, "max_instances", &what, schema::PROFILE)
            .unwrap_or(1);
        let ready = match table.get("ready") {
            Some(value) => self.readiness(value, &what)?,
            None => Readiness {
                pattern: None,
                input: None,
                timeout: Duration::from_secs(60),
                settle: Duration::ZERO,
                accept_dialogs: false,
            },
        };
        let may_spawn = self
            .strings(table, "may_spawn", &what)
            .unwrap_or_default()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        let shell = names::interactive_shell(&argv);
        let remote_messages = self.boolean(table, "remote_messages", &what);
        if shell
            && remote_messages == Some(true)
            && let Some(value) = table.get("remote_messages")
        {
            let d = self
                .diag(
                    Severity::Error,
                    "shell-remote-text",
                    value.span(),
                    format!("`{what}` runs an interactive shell: text from another host typed into it would run as commands, so it never receives any"),
                )
                .with_help("remove `remote_messages = true`; give the agent a program that reads tasks, not a shell");
            self.push(d);
            ok = false;
        }
        let sandbox = match table.get("sandbox") {
            Some(value) => self.sandbox(value, &what),
            None => Some(Sandbox::default()),
        };
        let sandbox = sandbox?;
        ok.then(|| Profile {
            name: name.get_ref().to_string(),
            argv,
            roots,
            env,
            secrets,
            max_instances: u32::try_from(max_instances).unwrap_or(1),
            ready,
            may_spawn,
            remote_messages: !shell && remote_messages.unwrap_or(true),
            sandbox,
            location: self.location(&name.span()),
        })
    }

    /// `[profile.P.sandbox]`; `None` when it has errors.
    fn sandbox(&mut self, value: &Value<'_>, what: &str) -> Option<Sandbox> {
        let what = format!("{what}.sandbox");
        let table = self.table(value, &what)?;
        let mut ok = true;
        let off = match self.string(table, "mode", &what) {
            None => false,
            Some((mode, _)) if mode == "on" => false,
            Some((mode, span)) if mode == "off" => {
                let d = self
                    .diag(
                        Severity::Warning,
                        "sandbox-off",
                        span,
                        format!("`{what}.mode` is \"off\": its agents run unconfined, as their user — they can read every sibling's environment, type into its pane and reach fleetd's files that user can reach"),
                    )
                    .with_help("remove `mode = \"off\"` and name what the agent needs (`network`, `writable`, `readable`)");
                self.push(d);
                true
            }
            Some((mode, span)) => {
                self.error(
                    "invalid-value",
                    span,
                    format!("`{what}.mode` is `{mode}`: write \"on\" or \"off\""),
                );
                return None;
            }
        };
        let network = match self.string(table, "network", &what) {
            None => Network::None,
            Some((word, span)) => {
                match [Network::None, Network::Loopback, Network::Host]
                    .into_iter()
                    .find(|n| n.as_str() == word)
                {
                    Some(network) => network,
                    None => {
                        self.error(
                        "invalid-value",
                        span,
                        format!("`{what}.network` is `{word}`: write \"none\", \"loopback\" or \"host\""),
                    );
                        ok = false;
                        Network::None
                    }
                }
            }
        };
        let tcp_connect = self
            .integers(table, "tcp_connect", &what, schema::SANDBOX)
            .map(|ports| {
                ports
                    .into_iter()
                    .filter_map(|p| u16::try_from(p).ok())
                    .collect::<Vec<_>>()
            });
        if tcp_connect.is_some()
            && network != Network::Host
            && let Some(value) = table.get("tcp_connect")
        {
            self.error(
                "invalid-value",
                value.span(),
                format!(
                    "`{what}.tcp_connect` limits the host's network: it needs `network = \"host\"`"
                ),
            );
            ok = false;
        }
        let paths = |key: &str, this: &mut Self, ok: &mut bool| -> Vec<PathBuf> {
            let mut out = Vec::new();
            for (path, span) in this.strings(table, key, &what).unwrap_or_default() {
                let path = PathBuf::from(path);
                *ok &= this.sandbox_path(&path, span, &format!("`{what}.{key}`"));
                out.push(path);
            }
            out
        };
        let writable = paths("writable", self, &mut ok);
        let readable = paths("readable", self, &mut ok);
        if !ok {
            return None;
        }
        Some(if off {
            Sandbox::Off
        } else {
            Sandbox::On(Confinement {
                network,
                tcp_connect,
                writable,
                readable,
            })
        })
    }

    /// Whether `path` may be shown to a sandboxed agent: absolute (or `~/…`), no `..`, not `/`,
    /// not in one of fleetd's places.
    fn sandbox_path(&mut self, path: &Path, span: Range<usize>, what: &str) -> bool {
        // `~/…`: in the agents' home, resolved on the host when the agent starts.
        if let Ok(rest) = path.strip_prefix("~/") {
            let plain = !rest.as_os_str().is_empty()
                && rest
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain {
                self.error(
                    "invalid-value",
                    span,
                    format!(
                        "`{}` in {what} must name a path in the home without `..`",
                        path.display()
                    ),
                );
            }
            return plain;
        }
        if !path.is_absolute()
            || path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            self.error(
                "invalid-value",
                span,
                format!(
                    "`{}` in {what} must be an absolute path without `..`",
                    path.display()
                ),
            );
            return false;
        }
        if path == Path::new("/") {
            let d = self
                .diag(
                    Severity::Error,
                    "sandbox-exposes",
                    span,
                    format!("{what} names `/`: the whole filesystem"),
                )
                .with_help("name the directories the agent needs");
            self.push(d);
            return false;
        }
        self.outside_fleetd_places(path, span, what)
    }

    /// Whether `path` (a root or a sandbox path) lies outside fleetd's places; an error if not.
    fn outside_fleetd_places(&mut self, path: &Path, span: Range<usize>, what: &str) -> bool {
        let Some(place) = names::fleetd_place(path) else {
            return true;
        };
        let d = self
            .diag(
                Severity::Error,
                "sandbox-exposes",
                span,
                format!(
                    "{what} names `{}`, inside `{place}`: no agent may see fleetd's config, credentials, state, runtime, policy or the multiplexers' sockets",
                    path.display()
                ),
            )
            .with_help("give the agent its own directory outside fleetd's places");
        self.push(d);
        false
    }

    fn readiness(&mut self, value: &Value<'_>, what: &str) -> Option<Readiness> {
        let what = format!("{what}.ready");
        let table = self.table(value, &what)?;
        let pattern = match self.string(table, "pattern", &what) {
            Some((source, span)) => Some(self.regex(&source, span, false, &what)?),
            None => None,
        };
        let input = match self.string(table, "input", &what) {
            Some((source, span)) => Some(self.regex(&source, span, false, &what)?),
            None => None,
        };
        let timeout = self
            .integer(table, "timeout_secs", &what, schema::READY)
            .unwrap_or(60);
        let settle = self
            .integer(table, "settle_secs", &what, schema::READY)
            .unwrap_or(0);
        Some(Readiness {
            pattern,
            input,
            timeout: Duration::from_secs(u64::try_from(timeout).unwrap_or(60)),
            settle: Duration::from_secs(u64::try_from(settle).unwrap_or(0)),
            accept_dialogs: self
                .boolean(table, "accept_dialogs", &what)
                .unwrap_or(false),
        })
    }

    fn regex(
        &mut self,
        source: &str,
        span: Range<usize>,
        anchored: bool,
        what: &str,
    ) -> Option<Regex> {
        let full = if anchored {
            format!("^(?:{source})$")
        } else {
            source.to_owned()
        };
        match regex::RegexBuilder::new(&full).size_limit(1 << 20).build() {
            Ok(regex) => Some(regex),
            Err(error) => {
                let reason = match &error {
                    regex::Error::Syntax(text) => text
                        .lines()
                        .last()
                        .unwrap_or("invalid syntax")
                        .trim()
                        .trim_start_matches("error: ")
                        .to_owned(),
                    regex::Error::CompiledTooBig(_) => "the compiled pattern is too big".to_owned(),
                    _ => "invalid pattern".to_owned(),
                };
                self.error(
                    "invalid-regex",
                    span,
                    format!("`{what}` is not a valid regular expression: {reason}"),
                );
                None
            }
        }
    }

    pub(super) fn grant(
        &mut self,
        body: &Value<'_>,
        profile_refs: &mut Vec<Named>,
    ) -> Option<(Grant, GrantSpans)> {
        let table = self.table(body, "grant")?;
        let (id, id_span) = self.id(table, "grant").or_else(|| {
            self.required(table, schema::GRANT, body.span(), "[[grant]]");
            None
        })?;
        let what = format!("grant.{id}");
        let mut ok = self.required(table, schema::GRANT, id_span.clone(), &what);
        let (fleets, hosts, profiles) = self.scope(table, &what);
        if let Some((_, spans)) = &profiles {
            profile_refs.extend(spans.iter().cloned());
        }
        let dangerous = self.name_set(
            table,
            "allow_dangerous",
            &what,
            names::valid_env_name,
            "a variable name",
        );
        let allow_dangerous = dangerous.map(|(set, spans)| {
            for (name, span) in spans {
                let d = match names::dangerous(&name) {
                    Some(pattern) => self.diag(
                        Severity::Warning,
                        "dangerous-opt-in",
                        span,
                        format!("`{what}` lets requests set the dangerous variable `{name}` (matches `{pattern}`)"),
                    ),
                    None => self.diag(Severity::Warning, "never-matches", span, format!("`{name}` in `{what}.allow_dangerous` is not a dangerous name; the opt-in does nothing")),
                };
                self.push(d.with_help("make sure its value pattern cannot inject code or redirect the agent"));
            }
            set
        });
        let allow_dangerous = allow_dangerous.unwrap_or_default();
        let mut env = BTreeMap::new();
        if let Some(value) = table.get("env")
            && let Some(map) = self.table(value, &format!("{what}.env"))
        {
            for (var, rule) in map {
                let var_name = var.get_ref().to_string();
                if !names::valid_env_name(&var_name) {
                    self.error(
                        "invalid-value",
                        var.span(),
                        format!("`{var_name}` in `{what}.env` is not a valid variable name"),
                    );
                    ok = false;
                    continue;
                }
                if let Some(pattern) = names::dangerous(&var_name)
                    && !allow_dangerous.contains(&var_name)
                {
                    let d = self
                                .diag(Severity::Error, "dangerous-opt-in", var.span(), format!("`{var_name}` is a dangerous variable (matches `{pattern}`) and `{what}` does not opt in"))
                                .with_help(format!("add `allow_dangerous = [\"{var_name}\"]` to the grant if this is really intended"));
                    self.push(d);
                    ok = false;
                }
                let rule_what = format!("{what}.env.{var_name}");
                let Some(rule_table) = self.table(rule, &rule_what) else {
                    ok = false;
                    continue;
                };
                if !self.required(rule_table, schema::ENV_RULE, var.span(), &rule_what) {
                    ok = false;
                    continue;
                }
                let pattern = self.string(rule_table, "pattern", &rule_what);
                let max_len = self.integer(rule_table, "max_len", &rule_what, schema::ENV_RULE);
                let compiled = pattern.as_ref().and_then(|(source, span)| {
                    self.regex(source, span.clone(), true, &format!("{rule_what}.pattern"))
                });
                match (compiled, pattern, max_len) {
                    (Some(regex), Some((source, span)), Some(max_len)) => {
                        let location = self.location(&span);
                        if names::matches_anything(&regex) {
                            self.push(
                                self.diag(
                                    Severity::Warning,
                                    "matches-anything",
                                    span,
                                    format!("`{rule_what}.pattern` accepts any value, shell syntax included: the variable is effectively free"),
                                )
                                .with_help("describe the values it may take (e.g. `[A-Z]{2,5}-[0-9]{1,6}`)"),
                            );
                        }
                        env.insert(
                            var_name,
                            EnvRule {
                                pattern: regex,
                                source,
                                max_len: usize::try_from(max_len).unwrap_or(0),
                                location,
                            },
                        );
                    }
                    _ => ok = false,
                }
            }
        }
        let rate = match table.get("rate") {
            Some(value) => {
                let rate_what = format!("{what}.rate");
                let rate_table = self.table(value, &rate_what)?;
                if !self.required(rate_table, schema::RATE, value.span(), &rate_what) {
                    return None;
                }
                let count = self.integer(rate_table, "count", &rate_what, schema::RATE)?;
                let per = self.integer(rate_table, "per_secs", &rate_what, schema::RATE)?;
                Some(Rate {
                    count: u32::try_from(count).unwrap_or(u32::MAX),
                    per: Duration::from_secs(u64::try_from(per).unwrap_or(1)),
                })
            }
            None => None,
        };
        let max_concurrent = self
            .integer(table, "max_concurrent", &what, schema::GRANT)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        let cwd = self.boolean(table, "cwd", &what).unwrap_or(false);
        let (Some((fleets, _)), Some((profile_set, _))) = (fleets, profiles) else {
            return None;
        };
        ok.then(|| {
            (
                Grant {
                    id,
                    fleets,
                    hosts: hosts.map(|(set, _)| set),
                    profiles: profile_set,
                    env,
                    allow_dangerous,
                    cwd,
                    max_concurrent,
                    rate,
                    location: self.location(&id_span),
                },
                GrantSpans {
                    id: id_span.clone(),
                },
            )
        })
    }

    pub(super) fn deny(&mut self, body: &Value<'_>) -> Option<(Deny, Range<usize>)> {
        let table = self.table(body, "deny")?;
        let (id, id_span) = self.id(table, "deny").or_else(|| {
            self.required(table, schema::DENY, body.span(), "[[deny]]");
            None
        })?;
        let what = format!("deny.{id}");
        let (fleets, hosts, profiles) = self.scope(table, &what);
        let env = self.name_set(
            table,
            "env",
            &what,
            names::valid_env_name,
            "a variable name",
        );
        let description = self.string(table, "description", &what).map(|(s, _)| s);
        let deny = Deny {
            id,
            description,
            fleets: fleets.map(|(s, _)| s),
            hosts: hosts.map(|(s, _)| s),
            profiles: profiles.map(|(s, _)| s),
            env: env.map(|(s, _)| s),
            location: self.location(&id_span),
        };
        for (field, set) in [
            ("fleets", &deny.fleets),
            ("hosts", &deny.hosts),
            ("profiles", &deny.profiles),
            ("env", &deny.env),
        ] {
            if set.as_ref().is_some_and(BTreeSet::is_empty) {
                let span = table.get(field).map_or(id_span.clone(), Spanned::span);
                self.push(self.diag(
                    Severity::Warning,
                    "never-matches",
                    span,
                    format!("`{what}` can never match: `{field}` is empty"),
                ));
            }
        }
        Some((deny, id_span))
    }

    /// A `[[message]]` rule: who on other hosts may message the agents of which profiles.
    pub(super) fn message(
        &mut self,
        body: &Value<'_>,
        profile_refs: &mut Vec<Named>,
    ) -> Option<(MessageGrant, Range<usize>)> {
        let table = self.table(body, "message")?;
        let (id, id_span) = self.id(table, "message").or_else(|| {
            self.required(table, schema::MESSAGE, body.span(), "[[message]]");
            None
        })?;
        let what = format!("message.{id}");
        let ok = self.required(table, schema::MESSAGE, id_span.clone(), &what);
        let (fleets, hosts, profiles) = self.scope(table, &what);
        if let Some((_, spans)) = &profiles {
            profile_refs.extend(spans.iter().filter(|(n, _)| n != MAILBOX).cloned());
        }
        let (Some((fleets, _)), Some((profiles, _))) = (fleets, profiles) else {
            return None;
        };
        ok.then(|| {
            (
                MessageGrant {
                    id,
                    fleets,
                    hosts: hosts.map(|(set, _)| set),
                    profiles,
                    location: self.location(&id_span),
                },
                id_span,
            )
        })
    }

    /// The `fleets`, `hosts` and `profiles` lists a grant or deny rule is scoped by.
    fn scope(
        &mut self,
        table: &DeTable<'_>,
        what: &str,
    ) -> (Option<NamedSet>, Option<NamedSet>, Option<NamedSet>) {
        let fleets = self.name_set(
            table,
            "fleets",
            what,
            names::valid_fleet,
            "lowercase letters, digits, `-`, `_`",
        );
        let hosts = self.name_set(
            table,
            "hosts",
            what,
            names::valid_host,
            "letters, digits, `.`, `-`, `_`",
        );
        let profiles = self.name_set(table, "profiles", what, names::valid_id, "a profile name");
        (fleets, hosts, profiles)
    }
}

/// `credential:NAME`, `keyring:NAME` or `env:NAME`.
fn secret_ref(text: &str) -> Option<SecretRef> {
    let (kind, name) = text.split_once(':')?;
    let secret_name = |n: &str| {
        !n.is_empty()
            && n.len() <= 64
            && n.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
            && !n.contains("..")
    };
    match kind {
        "credential" if secret_name(name) => Some(SecretRef::Credential(name.to_owned())),
        "keyring" if secret_name(name) => Some(SecretRef::Keyring(name.to_owned())),
        "env" if names::valid_env_name(name) => Some(SecretRef::Env(name.to_owned())),
        _ => None,
    }
}
