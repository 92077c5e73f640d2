//! The daemon prunes its state store: replay entries past their envelope's life (and dedupe and
//! delivery records past retention) are dropped at start and every ten minutes, so the store
//! does not grow with every message ever seen. (Before 2026-12-06 nothing called the prune.)

#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleetd::state::{Limits, StateStore};
use uuid::Uuid;

#[test]
fn a_running_daemon_prunes_expired_replay_entries_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::solo_config(dir.path(), "pruner", "");
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let (expired, live) = (Uuid::now_v7(), Uuid::now_v7());
    {
        let store = StateStore::open(&dir.path().join("state"), Limits::default()).unwrap();
        assert!(store.replay_insert_new("k", expired, now - 1000).unwrap());
        assert!(store.replay_insert_new("k", live, now + 3_600_000).unwrap());
    }
    let (mut child, lines) = common::start_solo(&config, dir.path());
    let mut seen = String::new();
    common::wait_for(
        &lines,
        &mut seen,
        &["expired state pruned", "replay=1"],
        Duration::from_secs(10),
    );
    common::terminate(&child);
    let _ = child.wait();
    let store = StateStore::open(&dir.path().join("state"), Limits::default()).unwrap();
    assert!(
        store.replay_insert_new("k", expired, now + 1000).unwrap(),
        "the expired entry was pruned"
    );
    assert!(
        !store.replay_insert_new("k", live, now + 1000).unwrap(),
        "the live entry was kept"
    );
}
