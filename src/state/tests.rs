use uuid::Uuid;

use super::*;

fn store(dir: &Path) -> StateStore {
    store_with(
        dir,
        Limits {
            max_held: 3,
            ..Limits::default()
        },
    )
}

fn store_with(dir: &Path, limits: Limits) -> StateStore {
    StateStore::open(dir, limits).unwrap()
}

/// An inbound message with key id `k` and nothing to do but `hold` (an empty default).
fn incoming(id: Uuid, hold: Option<&[u8]>) -> Incoming<'_> {
    Incoming {
        key_id: "k",
        id,
        expires_ms: 10_000,
        hold: hold.map(|record| (Shelf::Host, record)),
        outbox: None,
        receipt: false,
        delivery: &[],
    }
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
    let s = store_with(
        dir.path(),
        Limits {
            dedupe_retention_ms: 100,
            ..Limits::default()
        },
    );
    let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
    s.replay_insert_new("k", old, 1_000).unwrap();
    s.replay_insert_new("k", new, 3_000).unwrap();
    s.dedupe_insert_new(old, 1_000).unwrap();
    s.dedupe_insert_new(new, 1_950).unwrap();
    assert_eq!(
        s.prune(2_000).unwrap(),
        Pruned {
            replay: 1,
            dedupe: 1,
            delivery: 0
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
        s.held_put(*id, Shelf::Host, format!("m{i}").as_bytes())
            .unwrap();
    }
    assert!(matches!(
        s.held_put(Uuid::now_v7(), Shelf::Host, b"x"),
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
fn pending_outbox_entries_skip_those_in_flight_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for (n, id) in ids.iter().enumerate() {
        s.outbox_put(*id, format!("entry {n}").as_bytes()).unwrap();
    }
    let in_flight = [ids[0], ids[2]];
    let pending = s.outbox_pending(&|id| in_flight.contains(&id), 2).unwrap();
    assert_eq!(
        pending,
        vec![(ids[1], b"entry 1".to_vec()), (ids[3], b"entry 3".to_vec())]
    );
    assert_eq!(s.outbox_pending(&|_| false, 10).unwrap().len(), 5);
    assert!(s.outbox_pending(&|_| true, 10).unwrap().is_empty());
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

#[test]
fn a_batch_commits_new_messages_with_their_effects_and_skips_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let (a, b, receipt, sent) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    s.outbox_put_tracked(sent, b"out", &[1, b'q'], &|| ())
        .unwrap();
    let advanced = [(sent, vec![2, b'd'])];
    let items = [
        Incoming {
            outbox: Some((receipt, b"receipt".as_slice())),
            ..incoming(a, Some(b"a".as_slice()))
        },
        incoming(a, Some(b"again".as_slice())),
        Incoming {
            delivery: &advanced,
            ..incoming(b, None)
        },
    ];
    assert_eq!(
        s.accept_batch(&items, 1, &|_| Vec::new()).unwrap(),
        vec![Taken::New, Taken::Duplicate, Taken::New]
    );
    assert_eq!(s.held_get(a).unwrap().unwrap(), b"a");
    assert!(s.held_get(b).unwrap().is_none(), "b had nothing to hold");
    let mut outbox: Vec<Uuid> = s
        .outbox_list()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    outbox.sort();
    let mut expected = vec![receipt, sent];
    expected.sort();
    assert_eq!(outbox, expected);
    assert_eq!(s.delivery_get(sent).unwrap().unwrap(), vec![2, b'd']);
    assert_eq!(
        s.accept_batch(&[incoming(b, None)], 2, &|_| Vec::new())
            .unwrap(),
        vec![Taken::Duplicate],
        "a message id is taken once"
    );
}

#[test]
fn a_batch_leaves_a_message_for_redelivery_when_the_held_store_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    let items: Vec<Incoming<'_>> = ids
        .iter()
        .map(|id| incoming(*id, Some(b"m".as_slice())))
        .collect();
    let taken = s.accept_batch(&items, 1, &|_| Vec::new()).unwrap();
    assert_eq!(taken, vec![Taken::New, Taken::New, Taken::New, Taken::Full]);
    assert!(s.held_ack(ids[0]).unwrap());
    assert_eq!(
        s.accept_batch(&items[3..], 1, &|_| Vec::new()).unwrap(),
        vec![Taken::New],
        "a full store recorded nothing: the redelivery is taken"
    );
}

#[test]
fn a_batch_queues_its_receipts_for_exactly_the_messages_it_took_in() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(
        dir.path(),
        Limits {
            max_outbox: 3,
            ..Limits::default()
        },
    );
    let seen = Uuid::now_v7();
    assert!(s.dedupe_insert_new(seen, 1).unwrap());
    // One outbox entry already queued: room for two more.
    s.outbox_put(Uuid::now_v7(), b"earlier").unwrap();
    let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    let item = |id, receipt| Incoming {
        receipt,
        ..incoming(id, Some(b"m".as_slice()))
    };
    let items = [
        item(ids[0], true),
        item(seen, true),
        item(ids[1], false),
        item(ids[2], true),
        item(ids[3], true),
    ];
    let asked = std::sync::Mutex::new(Vec::new());
    let receipt = Uuid::now_v7();
    let taken = s
        .accept_batch(&items, 2, &|positions| {
            asked.lock().unwrap().extend_from_slice(positions);
            vec![(receipt, b"one receipt for all".to_vec())]
        })
        .unwrap();
    assert_eq!(
        taken,
        vec![
            Taken::New,
            Taken::Duplicate,
            Taken::New,
            Taken::New,
            Taken::Full
        ],
        "the fourth receipt would not fit the outbox: that message is left for redelivery"
    );
    assert_eq!(
        *asked.lock().unwrap(),
        vec![0, 3],
        "only new messages that asked for a receipt are reported"
    );
    assert_eq!(
        s.outbox_list()
            .unwrap()
            .into_iter()
            .filter(|(id, _)| *id == receipt)
            .count(),
        1,
        "the receipt was queued in the same transaction"
    );
    assert!(s.held_get(ids[3]).unwrap().is_none());
}

#[test]
fn delivery_records_only_move_forward() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let id = Uuid::now_v7();
    assert!(s.delivery_advance(id, &[1, b'q']).unwrap());
    assert!(s.delivery_advance(id, &[3, b'd']).unwrap());
    assert!(
        !s.delivery_advance(id, &[2, b'x']).unwrap(),
        "a late report is ignored"
    );
    assert!(
        !s.delivery_advance(id, &[3, b'y']).unwrap(),
        "a repeat is ignored"
    );
    assert_eq!(s.delivery_get(id).unwrap().unwrap(), vec![3, b'd']);
    s.outbox_put_tracked(id, b"r", &[0], &|| ()).unwrap();
    s.outbox_settle(&[id], &[(id, [4, b'f'].as_slice())])
        .unwrap();
    assert!(s.outbox_list().unwrap().is_empty());
    assert_eq!(s.delivery_get(id).unwrap().unwrap(), vec![4, b'f']);
}

#[test]
fn acking_a_held_message_queues_its_receipt_in_the_same_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let (id, receipt) = (Uuid::now_v7(), Uuid::now_v7());
    s.held_put(id, Shelf::Host, b"m").unwrap();
    assert!(
        s.held_ack_with(id, Some((receipt, b"r".as_slice())), None)
            .unwrap()
    );
    assert!(
        !s.held_ack_with(id, Some((Uuid::now_v7(), b"r".as_slice())), None)
            .unwrap()
    );
    assert_eq!(s.outbox_list().unwrap().len(), 1, "one receipt, not two");
}

#[test]
fn agents_are_kept_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = Uuid::now_v7();
    store(dir.path()).agent_put(id, b"primary").unwrap();
    let s = store(dir.path());
    assert_eq!(s.agents_list().unwrap(), vec![(id, b"primary".to_vec())]);
    assert!(s.agent_remove(id).unwrap());
    assert!(s.agents_list().unwrap().is_empty());
}

#[test]
fn concurrent_puts_share_group_commits_and_all_become_durable() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<Uuid> = (0..64).map(|_| Uuid::now_v7()).collect();
    {
        let s = std::sync::Arc::new(store(dir.path()));
        let visible = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for id in &ids {
                let (s, visible) = (&s, &visible);
                scope.spawn(move || {
                    s.outbox_put_tracked(*id, b"m", &[1], &|| {
                        visible.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    })
                    .unwrap();
                });
            }
        });
        let rounds = visible.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=64).contains(&rounds), "{rounds} rounds");
    }
    let s = store(dir.path());
    assert_eq!(
        s.outbox_list().unwrap().len(),
        64,
        "every entry survived a reopen"
    );
}

#[test]
fn each_shelf_is_read_on_its_own_oldest_first_and_an_ack_takes_a_message_off_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(
        dir.path(),
        Limits {
            max_held: 10_000,
            ..Limits::default()
        },
    );
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    // A backlog for `a` (a mailbox nobody pulls), then one message for `b` and a spawn request.
    let backlog: Vec<Uuid> = (0..1000).map(|_| Uuid::now_v7()).collect();
    let items: Vec<Incoming<'_>> = backlog
        .iter()
        .map(|id| Incoming {
            hold: Some((Shelf::Agent(a), b"for a".as_slice())),
            ..incoming(*id, None)
        })
        .collect();
    assert!(
        s.accept_batch(&items, 1_000, &|_| Vec::new())
            .unwrap()
            .iter()
            .all(|t| *t == Taken::New)
    );
    let for_b = Uuid::now_v7();
    assert!(
        s.accept_inbound("k", for_b, 10_000, 1_000, Shelf::Agent(b), b"for b")
            .unwrap()
    );
    let spawn = Uuid::now_v7();
    s.held_put(spawn, Shelf::Spawn, b"spawn").unwrap();

    // `b`'s shelf holds its one message, whatever waits for `a`.
    assert_eq!(
        s.held_on(Shelf::Agent(b), 10).unwrap(),
        vec![(for_b, b"for b".to_vec())]
    );
    let first: Vec<Uuid> = s
        .held_on(Shelf::Agent(a), 3)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(first, backlog[..3], "oldest first, at most the limit");
    assert_eq!(s.held_on(Shelf::Spawn, 10).unwrap().len(), 1);
    assert!(s.held_on(Shelf::Host, 10).unwrap().is_empty());

    // Acknowledged: off its shelf, and only that one.
    assert!(s.held_ack(backlog[0]).unwrap());
    assert_eq!(s.held_on(Shelf::Agent(a), 1).unwrap()[0].0, backlog[1]);
    assert!(s.held_ack_with(for_b, None, None).unwrap());
    assert!(s.held_on(Shelf::Agent(b), 10).unwrap().is_empty());
    assert_eq!(s.held_on(Shelf::Agent(a), 5000).unwrap().len(), 999);
    assert!(s.held_unshelved(10).unwrap().is_empty(), "all shelved");
}
