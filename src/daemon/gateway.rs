//! The gateway behind the local API: the routing fork over the roster, carried out by the
//! broker's courier (local hold, or the outbox and the broker).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::broker::deliver::Courier;
use crate::roster::Roster;
use crate::route::{self, Route, Router};
use crate::wire::{MAX_TEXT, Party};

/// The gateway of one host.
pub struct Gateway {
    /// Delivery.
    pub courier: Arc<Courier>,
    /// Where agents are.
    pub roster: Arc<Mutex<Roster>>,
}

impl Router for Gateway {
    fn open_agent(&self, name: &str) -> Result<Uuid, String> {
        let id = self
            .courier
            .open_agent(name, "mailbox")
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

    fn delivery(&self, id: Uuid) -> Result<Option<Value>, String> {
        let tracked = self.courier.delivery(id).map_err(|e| e.to_string())?;
        Ok(tracked.map(|t| json!(t)))
    }
}
