use uuid::Uuid;

use super::*;

fn store(dir: &Path) -> StateStore {
    StateStore::open(
        dir,
        Limits {
            max_held: 3,
            ..Limits::default()
        },
    )
    .unwrap()
}

#[test]
fn replay_and_dedupe_remember_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = Uuid::now_v7();
    {
        let s = store(dir.path());
        assert!(s.replay_insert_new("k1", id, 1_000).unwrap());
        assert!(!s.replay_insert_new("k1", id, 1_000).unwrap());
        assert!(
            s.replay_insert_new("k2", id, 1_000).unwrap(),
            "the key id is part of the entry"
        );
        assert!(s.dedupe_insert_new(id, 500).unwrap());
    }
    let s = store(dir.path());
    assert!(
        !s.replay_insert_new("k1", id, 1_000).unwrap(),
        "survives a restart"
    );
    assert!(!s.dedupe_insert_new(id, 600).unwrap(), "survives a restart");
}

#[test]
fn prune_drops_only_what_expired() {
    let dir = tempfile::tempdir().unwrap();
    let s = StateStore::open(
        dir.path(),
        Limits {
            dedupe_retention_ms: 100,
            ..Limits::default()
        },
    )
    .unwrap();
    let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
    s.replay_insert_new("k", old, 1_000).unwrap();
    s.replay_insert_new("k", new, 3_000).unwrap();
    s.dedupe_insert_new(old, 1_000).unwrap();
    s.dedupe_insert_new(new, 1_950).unwrap();
    assert_eq!(
        s.prune(2_000).unwrap(),
        Pruned {
            replay: 1,
            dedupe: 1
        }
    );
    assert!(s.replay_insert_new("k", old, 4_000).unwrap());
    assert!(!s.replay_insert_new("k", new, 4_000).unwrap());
    assert!(!s.dedupe_insert_new(new, 2_000).unwrap());
}

#[test]
fn held_messages_stay_until_acknowledged_and_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    for (i, id) in ids.iter().enumerate() {
        s.held_put(*id, format!("m{i}").as_bytes()).unwrap();
    }
    assert!(matches!(
        s.held_put(Uuid::now_v7(), b"x"),
        Err(StateError::Full { .. })
    ));
    let listed = s.held_list(10).unwrap();
    assert_eq!(
        listed.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        ids,
        "oldest first"
    );
    assert_eq!(s.held_list(10).unwrap().len(), 3, "listing does not remove");
    assert!(s.held_ack(ids[0]).unwrap());
    assert!(!s.held_ack(ids[0]).unwrap());
    assert_eq!(s.held_list(10).unwrap().len(), 2);
}

#[test]
fn outbox_keeps_records_until_removed() {
    let dir = tempfile::tempdir().unwrap();
    let id = Uuid::now_v7();
    store(dir.path()).outbox_put(id, b"payload").unwrap();
    let s = store(dir.path());
    assert_eq!(s.outbox_list().unwrap(), vec![(id, b"payload".to_vec())]);
    assert!(s.outbox_remove(id).unwrap());
    assert!(s.outbox_list().unwrap().is_empty());
}
