//! One policy file → its profiles, grants and deny rules, plus every diagnostic in it.
//!
//! The file is parsed with spans (`toml::de::DeTable`) and walked against [`schema`]: every
//! unknown key, missing key, wrong type, bad name, invalid regex and literal credential is
//! reported, not just the first.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};

use super::diag::{Diagnostic, Severity};
use super::model::{Deny, EnvRule, Grant, Location, Profile, Rate, Readiness, RuleId, SecretRef};
use super::names;
use super::schema::{self, Field, Kind};
use crate::scrub;

/// A name as written, with its span.
pub(super) type Named = (String, Range<usize>);

/// What one file defines, with the spans the cross-file checks need.
#[derive(Default)]
pub(super) struct FileItems {
    /// Every profile name a grant refers to, valid grant or not, for the unknown-profile check.
    pub(super) profile_refs: Vec<Named>,
    /// Every profile the file defines, valid or not (an invalid one is not also "unknown").
    pub(super) profile_names: Vec<String>,
    pub(super) profiles: Vec<(Profile, Range<usize>)>,
    pub(super) grants: Vec<(Grant, GrantSpans)>,
    pub(super) denies: Vec<(Deny, Range<usize>)>,
}

/// Spans inside a grant, for cross-file diagnostics.
pub(super) struct GrantSpans {
    pub(super) id: Range<usize>,
}

/// Longest policy file read.
pub(super) const MAX_FILE: u64 = 1024 * 1024;

/// Reads one file's items; diagnostics go to `diags`.
pub(super) fn parse_file(path: &Path, text: &str, diags: &mut Vec<Diagnostic>) -> FileItems {
    let mut ctx = Ctx { path, text, diags };
    let (table, errors) = DeTable::parse_recoverable(text);
    for error in &errors {
        let span = error.span().unwrap_or(0..0);
        ctx.error("syntax", span, error.message().to_owned());
    }
    if !errors.is_empty() {
        return FileItems::default();
    }
    ctx.literal_secrets(table.get_ref(), "");
    ctx.keys(table.get_ref(), schema::FILE, "");
    let mut items = FileItems::default();
    if let Some(value) = table.get_ref().get("profile")
        && let Some(profiles) = ctx.table(value, "profile")
    {
        for (name, body) in profiles {
            items.profile_names.push(name.get_ref().to_string());
            if let Some(profile) = ctx.profile(name, body) {
                items.profiles.push((profile, name.span()));
            }
        }
    }
    if let Some(value) = table.get_ref().get("grant") {
        for body in ctx.tables(value, "grant") {
            if let Some(grant) = ctx.grant(body, &mut items.profile_refs) {
                items.grants.push(grant);
            }
        }
    }
    if let Some(value) = table.get_ref().get("deny") {
        for body in ctx.tables(value, "deny") {
            if let Some(deny) = ctx.deny(body) {
                items.denies.push(deny);
            }
        }
    }
    items
}

struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
    diags: &'a mut Vec<Diagnostic>,
}

type Value<'i> = Spanned<DeValue<'i>>;

impl Ctx<'_> {
    fn error(&mut self, code: &'static str, span: Range<usize>, message: String) {
        self.diags.push(Diagnostic::new(
            Severity::Error,
            code,
            self.path,
            self.text,
            span,
            message,
        ));
    }

    fn push(&mut self, diagnostic: Diagnostic) {
        self.diags.push(diagnostic);
    }

    fn diag(
        &self,
        severity: Severity,
        code: &'static str,
        span: Range<usize>,
        message: String,
    ) -> Diagnostic {
        Diagnostic::new(severity, code, self.path, self.text, span, message)
    }

    fn location(&self, span: &Range<usize>) -> Location {
        let line = self
            .text
            .get(..span.start)
            .map_or(1, |b| b.matches('\n').count() + 1);
        Location {
            file: self.path.to_owned(),
            line,
        }
    }

    /// Unknown and missing keys of `table` against `fields`, recursively for sub-tables.
    fn keys(&mut self, table: &DeTable<'_>, fields: &[Field], at: &str) {
        for (key, value) in table {
            let name = key.get_ref().as_ref();
            let Some(field) = fields.iter().find(|f| f.name == name) else {
                let expected: Vec<String> =
                    fields.iter().map(|f| format!("`{}`", f.name)).collect();
                let mut d = self.diag(
                    Severity::Error,
                    "unknown-key",
                    key.span(),
                    format!(
                        "unknown key `{}{name}`, expected one of {}",
                        dotted(at),
                        expected.join(", ")
                    ),
                );
                if let Some(close) = names::did_you_mean(name, fields.iter().map(|f| f.name)) {
                    d = d.with_help(format!("did you mean `{close}`?"));
                }
                self.push(d);
                continue;
            };
            let path = format!("{}{name}", dotted(at));
            match (field.kind, value.get_ref()) {
                (Kind::Table(inner), DeValue::Table(t)) => self.keys(t, inner, &path),
                (Kind::MapOf(inner), DeValue::Table(t)) => {
                    for (sub, body) in t {
                        if let DeValue::Table(body) = body.get_ref() {
                            self.keys(body, inner, &format!("{path}.{}", sub.get_ref()));
                        }
                    }
                }
                (Kind::ArrayOf(inner), DeValue::Array(items)) => {
                    for item in items.iter() {
                        if let DeValue::Table(body) = item.get_ref() {
                            self.keys(body, inner, &path);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Required keys of one table; `span` locates the table when a key is missing.
    fn required(
        &mut self,
        table: &DeTable<'_>,
        fields: &[Field],
        span: Range<usize>,
        what: &str,
    ) -> bool {
        let mut ok = true;
        for field in fields.iter().filter(|f| f.required) {
            if table.get(field.name).is_none() {
                self.error(
                    "missing-key",
                    span.clone(),
                    format!("`{what}` is missing the required key `{}`", field.name),
                );
                ok = false;
            }
        }
        ok
    }

    /// Every string value anywhere: a credential is an error, whatever key holds it.
    fn literal_secrets(&mut self, table: &DeTable<'_>, at: &str) {
        for (key, value) in table {
            let path = format!("{}{}", dotted(at), key.get_ref());
            self.literal_value(&path, key.get_ref(), value);
        }
    }

    fn literal_value(&mut self, path: &str, key: &str, value: &Value<'_>) {
        match value.get_ref() {
            DeValue::String(s) => {
                // Names under `secrets` always sound secret: there only the value's shape counts.
                let by_name = !path.contains(".secrets.");
                let kind = scrub::looks_secret(s).or_else(|| {
                    by_name
                        .then(|| scrub::looks_secret(&format!("{key}={s}")))
                        .flatten()
                });
                if let Some(kind) = kind {
                    let d = self
                        .diag(Severity::Error, "literal-secret", value.span(), format!("`{path}` holds a literal credential ({kind})"))
                        .with_help("policy holds references only: `credential:NAME`, `keyring:NAME` or `env:NAME`");
                    self.push(d);
                }
            }
            DeValue::Table(inner) => self.literal_secrets(inner, path),
            DeValue::Array(items) => {
                for item in items.iter() {
                    self.literal_value(path, key, item);
                }
            }
            _ => {}
        }
    }

    // --- typed readers: each reports a type error and returns None ---

    fn table<'v, 'i>(&mut self, value: &'v Value<'i>, what: &str) -> Option<&'v DeTable<'i>> {
        if let DeValue::Table(t) = value.get_ref() {
            return Some(t);
        }
        self.type_error(value, what, "a table");
        None
    }

    fn tables<'v, 'i>(&mut self, value: &'v Value<'i>, what: &str) -> Vec<&'v Value<'i>> {
        match value.get_ref() {
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for item in items.iter() {
                    if item.get_ref().is_table() {
                        out.push(item);
                    } else {
                        self.type_error(item, what, "a table (`[[{what}]]`)");
                    }
                }
                out
            }
            _ => {
                self.type_error(value, what, &format!("an array of tables (`[[{what}]]`)"));
                Vec::new()
            }
        }
    }

    fn type_error(&mut self, value: &Value<'_>, what: &str, expected: &str) {
        let found = value.get_ref().type_str();
        self.error(
            "type",
            value.span(),
            format!("`{what}` must be {expected}, found {found}"),
        );
    }

    fn string(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
    ) -> Option<(String, Range<usize>)> {
        let value = table.get(key)?;
        match value.get_ref() {
            DeValue::String(s) => Some((s.to_string(), value.span())),
            _ => {
                self.type_error(value, &format!("{what}.{key}"), "a string");
                None
            }
        }
    }

    fn strings(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
    ) -> Option<Vec<(String, Range<usize>)>> {
        let value = table.get(key)?;
        let DeValue::Array(items) = value.get_ref() else {
            self.type_error(value, &format!("{what}.{key}"), "an array of strings");
            return None;
        };
        Some(self.string_items(items, &format!("{what}.{key}")))
    }

    fn string_items(&mut self, items: &DeArray<'_>, what: &str) -> Vec<Named> {
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push((s.to_string(), item.span())),
                _ => self.type_error(item, what, "a string"),
            }
        }
        out
    }

    fn integer(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
        fields: &[Field],
    ) -> Option<i64> {
        let value = table.get(key)?;
        let Some(int) = value.get_ref().as_integer() else {
            self.type_error(value, &format!("{what}.{key}"), "an integer");
            return None;
        };
        let digits: String = int.as_str().chars().filter(|c| *c != '_').collect();
        let parsed = i64::from_str_radix(
            digits
                .trim_start_matches("0x")
                .trim_start_matches("0o")
                .trim_start_matches("0b"),
            int.radix(),
        )
        .ok();
        let range = fields
            .iter()
            .find(|f| f.name == key)
            .and_then(|f| match f.kind {
                Kind::Int { min, max } => Some((min, max)),
                _ => None,
            });
        match (parsed, range) {
            (Some(n), Some((min, max))) if n >= min && n <= max => Some(n),
            (_, Some((min, max))) => {
                self.error(
                    "invalid-value",
                    value.span(),
                    format!("`{what}.{key}` must be from {min} to {max}"),
                );
                None
            }
            (n, None) => n,
        }
    }

    fn boolean(&mut self, table: &DeTable<'_>, key: &str, what: &str) -> Option<bool> {
        let value = table.get(key)?;
        let b = value.get_ref().as_bool();
        if b.is_none() {
            self.type_error(value, &format!("{what}.{key}"), "a boolean");
        }
        b
    }

    fn string_map(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
    ) -> Vec<(String, Range<usize>, String, Range<usize>)> {
        let Some(value) = table.get(key) else {
            return Vec::new();
        };
        let Some(map) = self.table(value, &format!("{what}.{key}")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, v) in map {
            match v.get_ref() {
                DeValue::String(s) => out.push((
                    name.get_ref().to_string(),
                    name.span(),
                    s.to_string(),
                    v.span(),
                )),
                _ => self.type_error(v, &format!("{what}.{key}.{}", name.get_ref()), "a string"),
            }
        }
        out
    }

    /// A set of names, each checked by `valid`.
    fn name_set(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
        valid: fn(&str) -> bool,
        form: &str,
    ) -> Option<(BTreeSet<String>, Vec<Named>)> {
        let items = self.strings(table, key, what)?;
        let mut set = BTreeSet::new();
        for (name, span) in &items {
            if !valid(name) {
                self.error(
                    "invalid-value",
                    span.clone(),
                    format!("`{name}` in `{what}.{key}` is not a valid name ({form})"),
                );
            }
            set.insert(name.clone());
        }
        Some((set, items))
    }

    fn id(&mut self, table: &DeTable<'_>, what: &str) -> Option<(RuleId, Range<usize>)> {
        let (id, span) = self.string(table, "id", what)?;
        if !names::valid_id(&id) {
            self.error("invalid-value", span.clone(), format!("`{id}` is not a valid rule id (lowercase letters, digits, `-`, `_`; at most 64)"));
            return None;
        }
        Some((RuleId(id), span))
    }

    // --- items ---

    fn profile(
        &mut self,
        name: &Spanned<std::borrow::Cow<'_, str>>,
        body: &Value<'_>,
    ) -> Option<Profile> {
        let what = format!("profile.{}", name.get_ref());
        let table = self.table(body, &what)?;
        let mut ok = self.required(table, schema::PROFILE, name.span(), &what);
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
                    span,
                    format!("root `{root}` of `{what}` must be an absolute path without `..`"),
                );
                ok = false;
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
                timeout: Duration::from_secs(60),
                accept_dialogs: false,
            },
        };
        ok.then(|| Profile {
            name: name.get_ref().to_string(),
            argv,
            roots,
            env,
            secrets,
            max_instances: u32::try_from(max_instances).unwrap_or(1),
            ready,
            location: self.location(&name.span()),
        })
    }

    fn readiness(&mut self, value: &Value<'_>, what: &str) -> Option<Readiness> {
        let what = format!("{what}.ready");
        let table = self.table(value, &what)?;
        let pattern = match self.string(table, "pattern", &what) {
            Some((source, span)) => Some(self.regex(&source, span, false, &what)?),
            None => None,
        };
        let timeout = self
            .integer(table, "timeout_secs", &what, schema::READY)
            .unwrap_or(60);
        Some(Readiness {
            pattern,
            timeout: Duration::from_secs(u64::try_from(timeout).unwrap_or(60)),
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

    fn grant(
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
        let fleets = self.name_set(
            table,
            "fleets",
            &what,
            names::valid_fleet,
            "lowercase letters, digits, `-`, `_`",
        );
        let hosts = self.name_set(
            table,
            "hosts",
            &what,
            names::valid_host,
            "letters, digits, `.`, `-`, `_`",
        );
        let profiles = self.name_set(table, "profiles", &what, names::valid_id, "a profile name");
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
                    (Some(regex), Some((source, _)), Some(max_len)) => {
                        env.insert(
                            var_name,
                            EnvRule {
                                pattern: regex,
                                source,
                                max_len: usize::try_from(max_len).unwrap_or(0),
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

    fn deny(&mut self, body: &Value<'_>) -> Option<(Deny, Range<usize>)> {
        let table = self.table(body, "deny")?;
        let (id, id_span) = self.id(table, "deny").or_else(|| {
            self.required(table, schema::DENY, body.span(), "[[deny]]");
            None
        })?;
        let what = format!("deny.{id}");
        let fleets = self.name_set(
            table,
            "fleets",
            &what,
            names::valid_fleet,
            "lowercase letters, digits, `-`, `_`",
        );
        let hosts = self.name_set(
            table,
            "hosts",
            &what,
            names::valid_host,
            "letters, digits, `.`, `-`, `_`",
        );
        let profiles = self.name_set(table, "profiles", &what, names::valid_id, "a profile name");
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

fn dotted(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}.")
    }
}
