//! The gateway behind the local API: the routing fork over the roster, carried out by the
//! broker's courier (local hold, or the outbox and the broker).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::broker::deliver::Courier;
use crate::broker::link::Recorder;
use crate::daemon::policy::PolicyHandle;
use crate::policy::{Request, SecretRef};
use crate::roster::Roster;
use crate::route::{self, Route, Router};
use crate::secret::{SecretName, lookup};
use crate::spawn::{Outcome, Spawner};
use crate::wire::{MAX_TEXT, Party};
use secrecy::SecretString;

/// The gateway of one host.
pub struct Gateway {
    /// Delivery.
    pub courier: Arc<Courier>,
    /// Where agents are.
    pub roster: Arc<Mutex<Roster>>,
    /// The spawn pipeline (`None`: the configured multiplexer is not supported yet).
    pub spawner: Option<Arc<Spawner>>,
    /// The policy in force.
    pub policy: PolicyHandle,
    /// Where decisions are recorded.
    pub record: Recorder,
    /// Every output path's redactor: secrets resolved for panes are registered with it.
    pub scrubber: crate::scrub::Scrubber,
}

impl Router for Gateway {
    fn open_agent(&self, name: &str) -> Result<Uuid, String> {
        let id = self
            .courier
            .open_agent(name, "mailbox", None)
            .map_err(|e| e.to_string())?;
        crate::broker::link::announce(&self.courier, &self.roster);
        Ok(id)
    }

    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<Value, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("message text longer than {MAX_TEXT} bytes"));
        }
        let me = self.courier.me();
        let local = self.courier.local_agents().iter().any(|(id, _)| *id == to);
        let located = self.roster.lock().ok().and_then(|r| r.locate(to));
        let (id, route) = match route::decide(local, located, &me.fleet) {
            Route::Local => (self.courier.send_local(to, from, text), "local"),
            Route::Fleet { host } => {
                let dest = Party {
                    fleet: me.fleet,
                    host: host.unwrap_or_default(),
                };
                (self.courier.send(dest, to, from, text), "fleet")
            }
            Route::Foreign(host) => {
                let dest = Party {
                    fleet: host.fleet,
                    host: host.host,
                };
                (self.courier.send(dest, to, from, text), "foreign")
            }
        };
        let id = id.map_err(|e| e.to_string())?;
        Ok(json!({"id": id.to_string(), "route": route}))
    }

    fn held(&self, limit: usize, to: Option<Uuid>) -> Result<Value, String> {
        let held = self.courier.held(limit, to).map_err(|e| e.to_string())?;
        Ok(json!(held))
    }

    fn ack(&self, id: Uuid) -> Result<bool, String> {
        self.courier.ack(id).map_err(|e| e.to_string())
    }

    fn spawn(&self, request: &Value) -> Result<Value, String> {
        let Some(spawner) = &self.spawner else {
            return Err(
                "not yet supported: spawning through herdr (use `multiplexer = \"tmux\"`)"
                    .to_owned(),
            );
        };
        let me = self.courier.me();
        let mut with_origin = request.clone();
        if let Some(fields) = with_origin.as_object_mut() {
            fields.insert(
                "origin".to_owned(),
                json!({"fleet": me.fleet, "host": me.host}),
            );
        }
        let request = Request::from_value(&with_origin).map_err(|e| e.to_string())?;
        let policy = self.policy.current();
        let resolve = |reference: &SecretRef| {
            let value = secret_value(reference)?;
            // From now on no log line, audit record or reply can carry it.
            let _ = self.scrubber.register(&reference.to_string(), &value);
            Ok(value)
        };
        let outcome = spawner.spawn(&policy, &request, &resolve);
        let detail = json!({
            "origin": {"fleet": request.origin.fleet, "host": request.origin.host},
            "profile": request.profile,
            "env": request.env.keys().collect::<Vec<_>>(),
        });
        let (event, reply) = match outcome {
            Outcome::Started {
                pane,
                profile,
                rules,
            } => {
                let name = request
                    .label
                    .clone()
                    .unwrap_or_else(|| format!("{profile}-{}", pane.0.trim_start_matches('%')));
                let id = self
                    .courier
                    .open_agent(&name, &profile, Some(&pane.0))
                    .map_err(|e| e.to_string())?;
                crate::broker::link::announce(&self.courier, &self.roster);
                (
                    "spawn.started",
                    json!({"outcome": "started", "agent": id.to_string(), "name": name, "rules": rules}),
                )
            }
            Outcome::Refused { rules, reasons } => (
                "spawn.refused",
                json!({"outcome": "refused", "rules": rules, "reasons": reasons}),
            ),
            Outcome::Failed { reason } => (
                "spawn.failed",
                json!({"outcome": "failed", "reasons": [reason]}),
            ),
        };
        let mut record = detail;
        if let (Some(fields), Some(result)) = (record.as_object_mut(), reply.as_object()) {
            fields.extend(result.clone());
        }
        (self.record)(&[(event, record)]);
        Ok(reply)
    }

    fn delivery(&self, id: Uuid) -> Result<Option<Value>, String> {
        let tracked = self.courier.delivery(id).map_err(|e| e.to_string())?;
        Ok(tracked.map(|t| json!(t)))
    }
}

/// A profile's secret reference resolved on this host.
fn secret_value(reference: &SecretRef) -> Result<SecretString, String> {
    let (keyring, name) = match reference {
        SecretRef::Credential(name) => (false, name),
        SecretRef::Keyring(name) => (true, name),
        SecretRef::Env(_) => {
            return Err("not yet supported: `env:` secret references in profiles".to_owned());
        }
    };
    let name = SecretName::new(name).map_err(|e| e.to_string())?;
    lookup(keyring, &name)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("`{reference}` is not on this host"))
}
