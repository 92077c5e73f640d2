//! A spawn request, checked field by field: malformed or oversized input is refused with the
//! offending field named, never truncated or guessed at.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::names;

/// Largest request accepted, checked before parsing.
pub const MAX_REQUEST: usize = 64 * 1024;
const MAX_ENV: usize = 64;
const MAX_VALUE: usize = 4096;
const MAX_CWD: usize = 1024;
const MAX_LABEL: usize = 64;

/// Who asks. In the daemon this comes from the authenticated transport, never from the body.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Origin {
    /// The origin fleet (broker vhost).
    pub fleet: String,
    /// The origin host within it.
    pub host: String,
}

/// A checked spawn request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Who asks.
    pub origin: Origin,
    /// The profile asked for.
    pub profile: String,
    /// Environment the requester wants set.
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the profile's root (no `..`, not absolute).
    pub cwd: Option<PathBuf>,
    /// A display label.
    pub label: Option<String>,
}

/// What is wrong with a request: the field and why. Never echoes a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct RequestError {
    /// The offending field (`env.NAME`, `cwd`, …; `request` for the whole).
    pub field: String,
    /// Why it is refused.
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> RequestError {
    RequestError {
        field: field.to_owned(),
        message: message.into(),
    }
}

impl Request {
    /// Parses and checks a JSON request (size checked first).
    pub fn from_json(bytes: &[u8]) -> Result<Request, RequestError> {
        if bytes.len() > MAX_REQUEST {
            return Err(refuse(
                "request",
                format!("larger than {MAX_REQUEST} bytes"),
            ));
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            refuse(
                "request",
                format!("not valid JSON (line {}, column {})", e.line(), e.column()),
            )
        })?;
        Self::from_value(&value)
    }

    /// Parses and checks a request given as JSON (`fleetd policy explain`, policy test cases):
    /// unknown fields refused, every field's type checked, then [`Request::checked`].
    pub fn from_value(value: &Value) -> Result<Request, RequestError> {
        let object = value
            .as_object()
            .ok_or_else(|| refuse("request", "must be a JSON object"))?;
        known(object, "", &["origin", "profile", "env", "cwd", "label"])?;
        let origin = object
            .get("origin")
            .ok_or_else(|| refuse("origin", "is required"))?;
        let origin_object = origin
            .as_object()
            .ok_or_else(|| refuse("origin", "must be an object"))?;
        known(origin_object, "origin.", &["fleet", "host"])?;
        let fleet = string(origin_object.get("fleet"), "origin.fleet")?;
        let host = string(origin_object.get("host"), "origin.host")?;
        let origin = checked_origin(fleet, host)?;
        let profile = string(object.get("profile"), "profile")?;
        let env = match object.get("env") {
            None => BTreeMap::new(),
            Some(env) => env_map(env)?,
        };
        let cwd = match object.get("cwd") {
            None => None,
            Some(Value::String(cwd)) => Some(cwd.as_str()),
            Some(_) => return Err(refuse("cwd", "must be a string")),
        };
        let label = match object.get("label") {
            None => None,
            Some(Value::String(label)) => Some(label.as_str()),
            Some(_) => return Err(refuse("label", "must be a string")),
        };
        Request::checked(origin, profile, env, cwd, label)
    }

    /// Checks a request whose fields are already typed — a spawn asked over the local API or
    /// carried by the wire, with its origin from the authenticated transport: the same checks
    /// as a JSON request's (profile name, variables, cwd inside the root, label).
    pub fn checked(
        origin: Origin,
        profile: String,
        env: BTreeMap<String, String>,
        cwd: Option<&str>,
        label: Option<&str>,
    ) -> Result<Request, RequestError> {
        let origin = checked_origin(origin.fleet, origin.host)?;
        if !names::valid_id(&profile) {
            return Err(refuse("profile", "is not a valid profile name"));
        }
        if env.len() > MAX_ENV {
            return Err(refuse("env", format!("more than {MAX_ENV} variables")));
        }
        for (name, value) in &env {
            env_name(name)?;
            env_value(name, value)?;
        }
        Ok(Request {
            origin,
            profile,
            env,
            cwd: cwd.map(relative_cwd).transpose()?,
            label: label.map(checked_label).transpose()?,
        })
    }
}

/// `fleet`/`host` as an origin, when both are valid names.
fn checked_origin(fleet: String, host: String) -> Result<Origin, RequestError> {
    if !names::valid_fleet(&fleet) {
        return Err(refuse("origin.fleet", "is not a valid fleet name"));
    }
    if !names::valid_host(&host) {
        return Err(refuse("origin.host", "is not a valid host name"));
    }
    Ok(Origin { fleet, host })
}

fn known(object: &Map<String, Value>, prefix: &str, fields: &[&str]) -> Result<(), RequestError> {
    match object.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(unknown) if unknown.len() <= 64 => {
            Err(refuse(&format!("{prefix}{unknown}"), "unknown field"))
        }
        Some(_) => Err(refuse(
            prefix.trim_end_matches('.'),
            "has an unknown field with an over-long name",
        )),
        None => Ok(()),
    }
}

fn string(value: Option<&Value>, field: &str) -> Result<String, RequestError> {
    match value {
        None => Err(refuse(field, "is required")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(refuse(field, "must be a string")),
    }
}

/// A request's variables, name → value.
type EnvMap = BTreeMap<String, String>;

fn env_map(value: &Value) -> Result<EnvMap, RequestError> {
    let object = value
        .as_object()
        .ok_or_else(|| refuse("env", "must be an object of strings"))?;
    if object.len() > MAX_ENV {
        return Err(refuse("env", format!("more than {MAX_ENV} variables")));
    }
    let mut env = BTreeMap::new();
    for (name, value) in object {
        env_name(name)?;
        let Value::String(text) = value else {
            return Err(refuse(&format!("env.{name}"), "must be a string"));
        };
        env.insert(name.clone(), text.clone());
    }
    Ok(env)
}

/// A variable's name, checked (a long one is not echoed).
fn env_name(name: &str) -> Result<(), RequestError> {
    if names::valid_env_name(name) {
        return Ok(());
    }
    let shown = if name.len() <= 64 {
        format!("env.{name}")
    } else {
        "env".to_owned()
    };
    Err(refuse(&shown, "is not a valid variable name"))
}

/// Variable `name`'s value, checked.
fn env_value(name: &str, text: &str) -> Result<(), RequestError> {
    let field = format!("env.{name}");
    if text.len() > MAX_VALUE {
        return Err(refuse(
            &field,
            format!("value longer than {MAX_VALUE} bytes"),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(refuse(&field, "value contains control characters"));
    }
    Ok(())
}

fn relative_cwd(text: &str) -> Result<PathBuf, RequestError> {
    if text.is_empty() || text.len() > MAX_CWD {
        return Err(refuse("cwd", format!("must be 1 to {MAX_CWD} bytes")));
    }
    if text.chars().any(char::is_control) {
        return Err(refuse("cwd", "contains control characters"));
    }
    let path = Path::new(text);
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("cwd", "must not contain `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(
                    "cwd",
                    "must be relative to the profile's root, not absolute",
                ));
            }
        }
    }
    Ok(clean)
}

fn checked_label(text: &str) -> Result<String, RequestError> {
    let safe = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | '_' | ':' | '-'));
    if text.is_empty() || text.len() > MAX_LABEL || !safe {
        return Err(refuse(
            "label",
            format!("must be 1 to {MAX_LABEL} of letters, digits, space, `.`, `_`, `:`, `-`"),
        ));
    }
    Ok(text.to_owned())
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.fleet, self.host)
    }
}
