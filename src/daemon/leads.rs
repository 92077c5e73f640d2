//! The lead supervisor: keeps the host's `[[lead]]` agents alive. Each lead is launched through
//! the spawn pipeline with this host as the origin (so the policy must grant it), keeps its
//! global id across relaunches, and is checked every second: a lead whose process exited or whose
//! pane is gone is logged and audited with why, marked `down` in the roster, and relaunched with
//! jittered exponential backoff. Its roster status is `ready` only once the readiness gate passed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use super::gateway::{Gateway, agent_gone};
use super::spawning::checked_request;
use crate::agent::{Owner, Status};
use crate::broker::link::backoff;
use crate::config::Lead;
use crate::pane::PaneId;
use crate::wire::{SpawnOutcome, SpawnRequest};

/// Longest wait between relaunch attempts.
const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// Where one lead stands.
#[derive(Default)]
struct Watch {
    failures: u32,
    retry_at: Option<Instant>,
    down_reported: bool,
}

/// Supervises `leads` until `stop` turns true.
pub async fn supervise(gateway: Arc<Gateway>, leads: Vec<Lead>, mut stop: watch::Receiver<bool>) {
    if leads.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut watches: HashMap<String, Watch> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (gateway, leads_now) = (Arc::clone(&gateway), leads.clone());
        let mut state = std::mem::take(&mut watches);
        let checked = tokio::task::spawn_blocking(move || {
            for lead in &leads_now {
                check(&gateway, lead, state.entry(lead.name.clone()).or_default());
            }
            state
        })
        .await;
        if let Ok(state) = checked {
            watches = state;
        }
    }
}

/// One check of one lead: healthy, newly down, or due for a (re)launch.
fn check(gateway: &Gateway, lead: &Lead, watch: &mut Watch) {
    let Some(spawner) = &gateway.spawner else {
        return;
    };
    let courier = &gateway.courier;
    let registered = courier.agents().named(&lead.name);
    let pane = registered
        .as_ref()
        .and_then(|(_, agent)| agent.pane.clone())
        .map(PaneId);
    // The same judgement as the token sweep's: the kernel's watch on the lead's process
    // first, so that a respawned or replaced lead pane is relaunched, not kept.
    let why_down = match (&pane, &registered) {
        (None, _) | (_, None) => Some("not running".to_owned()),
        (Some(pane), Some((id, agent))) => {
            match agent_gone(spawner.mux().as_ref(), &gateway.processes, *id, agent, pane) {
                Ok(why) => why,
                Err(error) => {
                    warn!(lead = %lead.name, %error, "cannot check a lead");
                    return;
                }
            }
        }
    };
    let Some(reason) = why_down else {
        watch.failures = 0;
        watch.down_reported = false;
        return;
    };
    if let Some((id, _)) = &registered
        && !watch.down_reported
    {
        watch.down_reported = true;
        warn!(lead = %lead.name, agent.id = %id, %reason, "lead down; restoring it");
        (gateway.record)(vec![(
            "lead.down",
            json!({"lead": lead.name, "agent": id.to_string(), "reason": reason}),
        )]);
        courier
            .agents()
            .set_status(*id, Status::Down, Some(reason.clone()));
        watch.retry_at = Some(Instant::now() + backoff(watch.failures.max(1), BACKOFF_CAP));
    }
    if watch.retry_at.is_some_and(|at| Instant::now() < at) {
        return;
    }
    if let Some(pane) = &pane {
        let _ = spawner.mux().close(pane);
    }
    let body = SpawnRequest {
        v: crate::wire::VERSION,
        profile: lead.profile.clone(),
        env: lead.env.clone(),
        cwd: lead.cwd.clone(),
        label: Some(lead.name.clone()),
        by: None,
    };
    let outcome = checked_request(&courier.me(), &body)
        .map_err(|e| e.to_string())
        .and_then(|request| {
            gateway
                .run_spawn(&request, None, Owner::Lead)
                .map_err(|e| e.to_string())
        });
    match outcome {
        Ok((reply, _)) if reply.outcome == SpawnOutcome::Started => {
            info!(lead = %lead.name, agent.id = ?reply.agent, restored = registered.is_some(), "lead running and ready");
            watch.failures = 0;
            watch.down_reported = false;
            watch.retry_at = None;
        }
        Ok((reply, _)) => {
            watch.failures = watch.failures.saturating_add(1);
            let wait = backoff(watch.failures, BACKOFF_CAP);
            warn!(lead = %lead.name, reasons = %reply.reasons.join("; "), retry_in = ?wait, "lead could not be started");
            watch.retry_at = Some(Instant::now() + wait);
        }
        Err(reason) => {
            watch.failures = watch.failures.saturating_add(1);
            let wait = backoff(watch.failures, BACKOFF_CAP);
            warn!(lead = %lead.name, %reason, retry_in = ?wait, "lead could not be started");
            watch.retry_at = Some(Instant::now() + wait);
        }
    }
}
