//! One policy file → its profiles, grants and deny rules, plus every diagnostic in it.
//!
//! The file is parsed with spans (`toml::de::DeTable`) and walked against [`schema`]: every
//! unknown key, missing key, wrong type, bad name, invalid regex and literal credential is
//! reported, not just the first.

mod items;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};

use super::diag::{Diagnostic, Severity};
use super::model::{
    Confinement, Deny, EnvRule, Grant, Location, MAILBOX, MessageGrant, Network, Profile, Rate,
    Readiness, RuleId, Sandbox, SecretRef,
};
use super::names;
use super::schema::{self, Field, Kind};
use crate::scrub;

/// A name as written, with its span.
pub(super) type Named = (String, Range<usize>);

/// A checked set of names and each as written.
type NamedSet = (BTreeSet<String>, Vec<Named>);

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
    pub(super) messages: Vec<(MessageGrant, Range<usize>)>,
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
    if let Some(value) = table.get_ref().get("message") {
        for body in ctx.tables(value, "message") {
            if let Some(rule) = ctx.message(body, &mut items.profile_refs) {
                items.messages.push(rule);
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
        let range = fields
            .iter()
            .find(|f| f.name == key)
            .and_then(|f| match f.kind {
                Kind::Int { min, max } => Some((min, max)),
                _ => None,
            });
        self.int_value(value, &format!("{what}.{key}"), range)
    }

    /// An integer array's values, each within its field's bounds (bad items are reported and
    /// left out).
    fn integers(
        &mut self,
        table: &DeTable<'_>,
        key: &str,
        what: &str,
        fields: &[Field],
    ) -> Option<Vec<i64>> {
        let value = table.get(key)?;
        let DeValue::Array(items) = value.get_ref() else {
            self.type_error(value, &format!("{what}.{key}"), "an array of integers");
            return None;
        };
        let range = fields
            .iter()
            .find(|f| f.name == key)
            .and_then(|f| match f.kind {
                Kind::IntArray { min, max } => Some((min, max)),
                _ => None,
            });
        Some(
            items
                .iter()
                .filter_map(|item| self.int_value(item, &format!("{what}.{key}"), range))
                .collect(),
        )
    }

    fn int_value(
        &mut self,
        value: &Value<'_>,
        what: &str,
        range: Option<(i64, i64)>,
    ) -> Option<i64> {
        let Some(int) = value.get_ref().as_integer() else {
            self.type_error(value, what, "an integer");
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
        match (parsed, range) {
            (Some(n), Some((min, max))) if n >= min && n <= max => Some(n),
            (_, Some((min, max))) => {
                self.error(
                    "invalid-value",
                    value.span(),
                    format!("`{what}` must be from {min} to {max}"),
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
    ) -> Option<NamedSet> {
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
        if super::BUILT_IN_RULES.contains(&id.as_str()) {
            self.error(
                "invalid-value",
                span,
                format!("`{id}` is the id of a built-in rule; decisions would be ambiguous"),
            );
            return None;
        }
        Some((RuleId(id), span))
    }
}

fn dotted(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}.")
    }
}
