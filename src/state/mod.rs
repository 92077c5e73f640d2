//! The state store: one crash-safe embedded database (redb) in the state directory holding the
//! replay cache, the dedupe window, the outbox and held messages. Every change is one committed
//! transaction, so a `kill -9` loses at most the change in flight, never a committed one.
//!
//! Imports: nothing from the crate (a leaf).

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use uuid::Uuid;

const REPLAY: TableDefinition<'_, &[u8], i64> = TableDefinition::new("replay");
const DEDUPE: TableDefinition<'_, &[u8], i64> = TableDefinition::new("dedupe");
const OUTBOX: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("outbox");
const HELD: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("held");
const AGENTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("agents");
const DELIVERY: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("delivery");
const SPAWNED: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("spawned");
const PLACEMENT: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("placement");
/// The held messages by shelf: key shelf (17 bytes) + message id, no value.
const SHELVES: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("held_shelves");
/// Which shelf each held message is on: message id → shelf.
const SHELF_OF: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("held_shelf_of");

/// Where a held message waits. Each shelf is read on its own, oldest first: no recipient's
/// backlog stands in the way of another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shelf {
    /// For a local agent (a pane agent's, typed by the injector; a mailbox's, pulled).
    Agent(Uuid),
    /// For the host itself: replies to its spawn requests.
    Host,
    /// Spawn requests from other hosts, for the spawn worker.
    Spawn,
}

impl Shelf {
    /// The shelf's key prefix: a tag, then the agent's id (zero for the others).
    fn key(self) -> [u8; 17] {
        let (tag, id) = match self {
            Shelf::Agent(id) => (0, id),
            Shelf::Host => (1, Uuid::nil()),
            Shelf::Spawn => (2, Uuid::nil()),
        };
        let mut key = [tag; 17];
        for (byte, from) in key.iter_mut().skip(1).zip(id.as_bytes()) {
            *byte = *from;
        }
        key
    }

    /// The key of message `id` on this shelf.
    fn entry(self, id: Uuid) -> Vec<u8> {
        let mut key = self.key().to_vec();
        key.extend_from_slice(id.as_bytes());
        key
    }
}

/// Most placements of agents on other hosts remembered (the lowest ids go first).
pub const MAX_PLACEMENTS: u64 = 4096;

/// Most agents remembered as spawned on other hosts at this host's request (the oldest go
/// first).
pub const MAX_SPAWNED: u64 = 65_536;

/// The database file inside the state directory.
pub const FILE: &str = "state.redb";

/// Retention and size limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a delivered message id is remembered for dedupe.
    pub dedupe_retention_ms: i64,
    /// Most messages held for the primary.
    pub max_held: u64,
    /// Most unconfirmed messages in the outbox.
    pub max_outbox: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            dedupe_retention_ms: 7 * 24 * 3600 * 1000,
            max_held: 10_000,
            max_outbox: 100_000,
        }
    }
}

/// Errors from the state store. They name the operation; records are never included.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The directory or database could not be created or opened.
    #[error("cannot open the state database `{}`: {detail}", .path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// What happened.
        detail: String,
    },
    /// A transaction failed.
    #[error("state database {op} failed: {detail}")]
    Transaction {
        /// Which operation.
        op: &'static str,
        /// What happened.
        detail: String,
    },
    /// A size limit is reached.
    #[error("the {what} is full ({limit} entries)")]
    Full {
        /// Which store.
        what: &'static str,
        /// Its limit.
        limit: u64,
    },
}

/// One inbound message to take in, with what taking it in changes (all in one transaction).
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    /// The signing key's id (replay entries are per key).
    pub key_id: &'a str,
    /// The message id.
    pub id: Uuid,
    /// Until when the replay entry is kept.
    pub expires_ms: i64,
    /// Held for local delivery, on its shelf.
    pub hold: Option<(Shelf, &'a [u8])>,
    /// Queued in the outbox (a failure receipt for the sender).
    pub outbox: Option<(Uuid, &'a [u8])>,
    /// To be answered by one of the batch's receipts (see [`StateStore::accept_batch`]); it
    /// needs room for one outbox entry.
    pub receipt: bool,
    /// Delivery records to advance (see [`StateStore::delivery_advance`]).
    pub delivery: &'a [(Uuid, Vec<u8>)],
}

/// Given the positions of a batch's new items that asked for a receipt, the outbox entries
/// (id, record) that answer them (see [`StateStore::accept_batch`]).
pub type Receipts<'a> = dyn Fn(&[usize]) -> Vec<(Uuid, Vec<u8>)> + 'a;

/// What became of one [`Incoming`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// New: recorded, and its effects applied.
    New,
    /// Seen before (a redelivery or a replay): nothing changed.
    Duplicate,
    /// The held store or the outbox is full: nothing recorded; leave it for redelivery.
    Full,
}

/// What a prune removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Expired replay entries.
    pub replay: u64,
    /// Dedupe entries past retention.
    pub dedupe: u64,
    /// Delivery records of messages created before the retention window.
    pub delivery: u64,
}

/// The open state database.
pub struct StateStore {
    db: Database,
    limits: Limits,
    /// Outbox entries waiting for the next group commit (see [`StateStore::outbox_put_tracked`]).
    queue: Mutex<Queue>,
    /// Signalled when a group commit ends.
    committed: Condvar,
}

/// Outbox entries waiting to be committed, and the group commit rounds.
#[derive(Default)]
struct Queue {
    items: Vec<(Uuid, Vec<u8>, Vec<u8>)>,
    /// The round the waiting items will be committed in.
    round: u64,
    /// Rounds finished, with the outcome of the last one.
    done: u64,
    failed: Option<String>,
    leading: bool,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn tx(op: &'static str) -> impl Fn(String) -> StateError {
    move |detail| StateError::Transaction { op, detail }
}

macro_rules! or_fail {
    ($op:expr, $e:expr) => {
        $e.map_err(|e| tx($op)(e.to_string()))?
    };
}

impl StateStore {
    /// Opens (creating if needed, mode 0700) the database in `dir`.
    pub fn open(dir: &Path, limits: Limits) -> Result<StateStore, StateError> {
        let path = dir.join(FILE);
        let open_error = |detail: String| StateError::Open {
            path: path.clone(),
            detail,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode_0700()
            .create(dir)
            .map_err(|e| open_error(e.to_string()))?;
        let db = Database::create(&path).map_err(|e| open_error(e.to_string()))?;
        let store = StateStore {
            db,
            limits,
            queue: Mutex::new(Queue::default()),
            committed: Condvar::new(),
        };
        store.write("create tables", |txn| {
            txn.open_table(REPLAY)?;
            txn.open_table(DEDUPE)?;
            txn.open_table(OUTBOX)?;
            txn.open_table(HELD)?;
            txn.open_table(AGENTS)?;
            txn.open_table(DELIVERY)?;
            txn.open_table(SPAWNED)?;
            txn.open_table(PLACEMENT)?;
            txn.open_table(SHELVES)?;
            txn.open_table(SHELF_OF)?;
            Ok(())
        })?;
        Ok(store)
    }

    /// Records (key id, message id) until `expires_ms`; `false` when already recorded.
    pub fn replay_insert_new(
        &self,
        key_id: &str,
        id: Uuid,
        expires_ms: i64,
    ) -> Result<bool, StateError> {
        let key = replay_key(key_id, id);
        self.write("replay insert", |txn| {
            let mut table = txn.open_table(REPLAY)?;
            if table.get(key.as_slice())?.is_some() {
                return Ok(false);
            }
            table.insert(key.as_slice(), expires_ms)?;
            Ok(true)
        })
    }

    /// Records message `id` as delivered at `now_ms`; `false` when it was already.
    /// Only the store's own tests use it: the runtime goes through the batch operations.
    #[cfg(test)]
    pub fn dedupe_insert_new(&self, id: Uuid, now_ms: i64) -> Result<bool, StateError> {
        self.write("dedupe insert", |txn| {
            let mut table = txn.open_table(DEDUPE)?;
            if table.get(id.as_bytes().as_slice())?.is_some() {
                return Ok(false);
            }
            table.insert(id.as_bytes().as_slice(), now_ms)?;
            Ok(true)
        })
    }

    /// Takes an inbound message in one transaction: unless (key id, message id) or the message id
    /// was seen before, records both and holds `record` for local delivery. `false`: a duplicate
    /// (a redelivery or a replay) — acknowledge it and drop it.
    pub fn accept_inbound(
        &self,
        key_id: &str,
        id: Uuid,
        expires_ms: i64,
        now_ms: i64,
        shelf: Shelf,
        record: &[u8],
    ) -> Result<bool, StateError> {
        let item = Incoming {
            key_id,
            id,
            expires_ms,
            hold: Some((shelf, record)),
            outbox: None,
            receipt: false,
            delivery: &[],
        };
        match self.accept_batch(&[item], now_ms, &|_| Vec::new())?.first() {
            Some(Taken::New) => Ok(true),
            Some(Taken::Duplicate) => Ok(false),
            _ => Err(StateError::Full {
                what: "held store",
                limit: self.limits.max_held,
            }),
        }
    }

    /// Takes a batch of inbound messages in **one** durable transaction (group commit: one disk
    /// sync for a whole prefetch window). For each: unless (key id, message id) or the message id
    /// was seen before, records both and applies its effects. Then, in the same transaction,
    /// `receipts` is given the positions of the new items that asked for a receipt and its
    /// entries are queued in the outbox: only what was really taken in is ever reported. A crash
    /// loses the whole batch or nothing; the broker redelivers what was not acknowledged.
    pub fn accept_batch(
        &self,
        items: &[Incoming<'_>],
        now_ms: i64,
        receipts: &Receipts<'_>,
    ) -> Result<Vec<Taken>, StateError> {
        let limits = self.limits;
        self.write("accept inbound", |txn| {
            let mut replay = txn.open_table(REPLAY)?;
            let mut dedupe = txn.open_table(DEDUPE)?;
            let mut held = txn.open_table(HELD)?;
            let mut shelves = txn.open_table(SHELVES)?;
            let mut shelf_of = txn.open_table(SHELF_OF)?;
            let mut outbox = txn.open_table(OUTBOX)?;
            let mut delivery = txn.open_table(DELIVERY)?;
            let mut taken = Vec::with_capacity(items.len());
            let mut answered = Vec::new();
            for (position, item) in items.iter().enumerate() {
                let replay_key = replay_key(item.key_id, item.id);
                if replay.get(replay_key.as_slice())?.is_some()
                    || dedupe.get(item.id.as_bytes().as_slice())?.is_some()
                {
                    taken.push(Taken::Duplicate);
                    continue;
                }
                // Room for its outbox entry, counting one per receipt still to be queued.
                let entries = u64::from(item.outbox.is_some()) + u64::from(item.receipt);
                if (item.hold.is_some() && held.len()? >= limits.max_held)
                    || (entries > 0
                        && outbox.len()? + answered.len() as u64 + entries > limits.max_outbox)
                {
                    taken.push(Taken::Full);
                    continue;
                }
                replay.insert(replay_key.as_slice(), item.expires_ms)?;
                dedupe.insert(item.id.as_bytes().as_slice(), now_ms)?;
                if let Some((shelf, record)) = item.hold {
                    held.insert(item.id.as_bytes().as_slice(), record)?;
                    shelve(&mut shelves, &mut shelf_of, shelf, item.id)?;
                }
                if let Some((id, record)) = item.outbox {
                    outbox.insert(id.as_bytes().as_slice(), record)?;
                }
                for (id, record) in item.delivery {
                    advance(&mut delivery, *id, record)?;
                }
                if item.receipt {
                    answered.push(position);
                }
                taken.push(Taken::New);
            }
            if !answered.is_empty() {
                for (id, record) in receipts(&answered) {
                    outbox.insert(id.as_bytes().as_slice(), record.as_slice())?;
                }
            }
            Ok(taken)
        })
    }

    /// Keeps `record` until [`StateStore::outbox_remove`] (its publish was confirmed).
    pub fn outbox_put(&self, id: Uuid, record: &[u8]) -> Result<(), StateError> {
        self.put(OUTBOX, "outbox", self.limits.max_outbox, id, record)
    }

    /// Keeps `record` in the outbox and starts its delivery record; returns once that is durable.
    ///
    /// Group commit: callers arriving together share one round. The round's leader commits
    /// every waiting entry in one transaction **without** waiting for the disk, calls `visible`
    /// (the publish may start at once), then syncs once for all of them; nobody returns before
    /// the sync. A crash before it loses entries nobody was told were kept (they may still
    /// arrive: the publish may have gone out).
    pub fn outbox_put_tracked(
        &self,
        id: Uuid,
        record: &[u8],
        delivery: &[u8],
        visible: &dyn Fn(),
    ) -> Result<(), StateError> {
        let lock = || {
            self.queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let mut queue = lock();
        queue.items.push((id, record.to_vec(), delivery.to_vec()));
        let mine = queue.round;
        while queue.leading {
            queue = self
                .committed
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if queue.done > mine {
                return match &queue.failed {
                    Some(detail) if queue.done == mine + 1 => Err(tx("outbox")(detail.clone())),
                    _ => Ok(()),
                };
            }
        }
        // Lead this round: take every waiting entry, commit, sync, wake the others.
        queue.leading = true;
        let items = std::mem::take(&mut queue.items);
        queue.round += 1;
        drop(queue);
        let outcome = self.commit_outbox(&items, visible);
        let mut queue = lock();
        queue.leading = false;
        queue.done = queue.round;
        queue.failed = outcome.as_ref().err().map(ToString::to_string);
        self.committed.notify_all();
        outcome
    }

    /// One group commit round of [`StateStore::outbox_put_tracked`].
    fn commit_outbox(
        &self,
        items: &[(Uuid, Vec<u8>, Vec<u8>)],
        visible: &dyn Fn(),
    ) -> Result<(), StateError> {
        let limit = self.limits.max_outbox;
        let fits = self.write_with("outbox", Durability::None, |txn| {
            let mut outbox = txn.open_table(OUTBOX)?;
            if outbox.len()? + items.len() as u64 > limit {
                return Ok(false);
            }
            let mut delivery = txn.open_table(DELIVERY)?;
            for (id, record, tracked) in items {
                outbox.insert(id.as_bytes().as_slice(), record.as_slice())?;
                advance(&mut delivery, *id, tracked)?;
            }
            Ok(true)
        })?;
        if !fits {
            return Err(StateError::Full {
                what: "outbox",
                limit,
            });
        }
        visible();
        // An empty durable commit persists the non-durable one before it.
        self.write("outbox sync", |_| Ok(()))
    }

    /// The broker answered for `ids`: drops them from the outbox and advances delivery records,
    /// in one transaction committed without waiting for the disk (a lost settlement only means a
    /// message is republished with the same id and deduplicated by the receiver).
    pub fn outbox_settle(
        &self,
        ids: &[Uuid],
        deliveries: &[(Uuid, &[u8])],
    ) -> Result<(), StateError> {
        self.write_with("outbox settle", Durability::None, |txn| {
            let mut outbox = txn.open_table(OUTBOX)?;
            for id in ids {
                outbox.remove(id.as_bytes().as_slice())?;
            }
            let mut delivery = txn.open_table(DELIVERY)?;
            for (id, record) in deliveries {
                advance(&mut delivery, *id, record)?;
            }
            Ok(())
        })
    }

    /// Drops a confirmed message; `false` when it was not there.
    ///
    /// Committed without waiting for the disk: if a crash loses the removal, the message is
    /// republished with its original id after restart and the receiver drops the duplicate.
    /// That saves one sync per message on the send path.
    pub fn outbox_remove(&self, id: Uuid) -> Result<bool, StateError> {
        self.write_with("outbox remove", Durability::None, |txn| {
            Ok(txn
                .open_table(OUTBOX)?
                .remove(id.as_bytes().as_slice())?
                .is_some())
        })
    }

    /// Every unconfirmed message, oldest first (UUIDv7 order).
    pub fn outbox_list(&self) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list(OUTBOX, "outbox list", usize::MAX)
    }

    /// Up to `limit` outbox entries, oldest first, skipping those `skip` names (the pump's
    /// in-flight set) without copying them: the pump asks after every answer it settles, while
    /// a window of entries is in flight.
    pub fn outbox_pending(
        &self,
        skip: &dyn Fn(Uuid) -> bool,
        limit: usize,
    ) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list_except(OUTBOX, "outbox list", skip, limit)
    }

    /// Holds a message for the primary until acknowledged.
    /// Only the store's own tests use it: the runtime goes through the batch operations.
    #[cfg(test)]
    pub fn held_put(&self, id: Uuid, shelf: Shelf, record: &[u8]) -> Result<(), StateError> {
        self.put(HELD, "held store", self.limits.max_held, id, record)?;
        self.held_shelve(id, shelf)
    }

    /// Holds a message on no shelf, as a fleetd before shelves kept it (its upgrade's tests).
    #[cfg(test)]
    pub fn held_put_unshelved(&self, id: Uuid, record: &[u8]) -> Result<(), StateError> {
        self.put(HELD, "held store", self.limits.max_held, id, record)
    }

    /// Up to `limit` messages held on `shelf`, oldest first; they stay until acknowledged.
    pub fn held_on(&self, shelf: Shelf, limit: usize) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        let op = "held on shelf";
        let txn = or_fail!(op, self.db.begin_read());
        let shelves = or_fail!(op, txn.open_table(SHELVES));
        let held = or_fail!(op, txn.open_table(HELD));
        let prefix = shelf.key();
        let mut out = Vec::new();
        for entry in or_fail!(op, shelves.range(prefix.as_slice()..)) {
            if out.len() >= limit {
                break;
            }
            let (key, _) = or_fail!(op, entry);
            let Some(id) = key.value().strip_prefix(prefix.as_slice()) else {
                break;
            };
            let id = Uuid::from_slice(id).map_err(|e| tx(op)(e.to_string()))?;
            // A shelf entry always has its message (they change together); none is skipped.
            if let Some(record) = or_fail!(op, held.get(id.as_bytes().as_slice())) {
                out.push((id, record.value().to_vec()));
            }
        }
        Ok(out)
    }

    /// Held messages on no shelf (kept by a fleetd before shelves), at most `limit`.
    pub fn held_unshelved(&self, limit: usize) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        let op = "held unshelved";
        let txn = or_fail!(op, self.db.begin_read());
        let shelf_of = or_fail!(op, txn.open_table(SHELF_OF));
        // Every held message is on a shelf (the common case, at every start): nothing to scan.
        let held = or_fail!(op, or_fail!(op, txn.open_table(HELD)).len());
        if or_fail!(op, shelf_of.len()) >= held {
            return Ok(Vec::new());
        }
        self.list_except(
            HELD,
            op,
            &|id| matches!(shelf_of.get(id.as_bytes().as_slice()), Ok(Some(_))),
            limit,
        )
    }

    /// Puts held message `id` on `shelf` (see [`StateStore::held_unshelved`]).
    pub fn held_shelve(&self, id: Uuid, shelf: Shelf) -> Result<(), StateError> {
        self.write("held shelve", |txn| {
            if txn
                .open_table(HELD)?
                .get(id.as_bytes().as_slice())?
                .is_none()
            {
                return Ok(());
            }
            shelve(
                &mut txn.open_table(SHELVES)?,
                &mut txn.open_table(SHELF_OF)?,
                shelf,
                id,
            )
        })
    }

    /// Up to `limit` held messages, oldest first; they stay until acknowledged.
    pub fn held_list(&self, limit: usize) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list(HELD, "held list", limit)
    }

    /// One held message.
    pub fn held_get(&self, id: Uuid) -> Result<Option<Vec<u8>>, StateError> {
        self.get(HELD, "held get", id)
    }

    /// Acknowledges a held message; `false` when there was none.
    /// Only the store's own tests use it: the runtime goes through the batch operations.
    #[cfg(test)]
    pub fn held_ack(&self, id: Uuid) -> Result<bool, StateError> {
        self.held_ack_with(id, None, None)
    }

    /// Acknowledges a held message and, in the same transaction, queues `outbox` (a receipt for
    /// its sender) and advances `delivery`; `false` (and nothing changed) when it was not held.
    pub fn held_ack_with(
        &self,
        id: Uuid,
        outbox: Option<(Uuid, &[u8])>,
        delivery: Option<(Uuid, &[u8])>,
    ) -> Result<bool, StateError> {
        self.write("held ack", |txn| {
            if txn
                .open_table(HELD)?
                .remove(id.as_bytes().as_slice())?
                .is_none()
            {
                return Ok(false);
            }
            unshelve(
                &mut txn.open_table(SHELVES)?,
                &mut txn.open_table(SHELF_OF)?,
                id,
            )?;
            if let Some((id, record)) = outbox {
                txn.open_table(OUTBOX)?
                    .insert(id.as_bytes().as_slice(), record)?;
            }
            if let Some((id, record)) = delivery {
                advance(&mut txn.open_table(DELIVERY)?, id, record)?;
            }
            Ok(true)
        })
    }

    /// Registers (or replaces) a local agent's record.
    pub fn agent_put(&self, id: Uuid, record: &[u8]) -> Result<(), StateError> {
        self.put(AGENTS, "agent store", u64::MAX, id, record)
    }

    /// Every local agent, in id order.
    pub fn agents_list(&self) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list(AGENTS, "agent list", usize::MAX)
    }

    /// Removes a local agent; `false` when there was none.
    /// Only the store's own tests use it: the runtime goes through the batch operations.
    #[cfg(test)]
    pub fn agent_remove(&self, id: Uuid) -> Result<bool, StateError> {
        self.remove(AGENTS, "agent remove", id)
    }

    /// Remembers agent `id`, started on another host at this host's request (`record` says
    /// where and for whom); past [`MAX_SPAWNED`] the entry with the lowest id (the oldest, for
    /// time-ordered ids) goes.
    pub fn spawned_put(&self, id: Uuid, record: &[u8]) -> Result<(), StateError> {
        self.write("spawned store", |txn| {
            let mut t = txn.open_table(SPAWNED)?;
            if t.len()? >= MAX_SPAWNED && t.get(id.as_bytes().as_slice())?.is_none() {
                t.pop_first()?;
            }
            t.insert(id.as_bytes().as_slice(), record)?;
            Ok(())
        })
    }

    /// What [`StateStore::spawned_put`] remembered of agent `id`.
    pub fn spawned_get(&self, id: Uuid) -> Result<Option<Vec<u8>>, StateError> {
        self.get(SPAWNED, "spawned get", id)
    }

    /// Remembers where agent `id` of another host was last seen (`record`, the caller's
    /// encoding); past [`MAX_PLACEMENTS`] the entry with the lowest id goes. Committed without
    /// waiting for the disk: a placement lost in a crash is learned again from the next beat.
    pub fn placement_put(&self, id: Uuid, record: &[u8]) -> Result<(), StateError> {
        self.write_with("placement store", Durability::None, |txn| {
            let mut t = txn.open_table(PLACEMENT)?;
            if t.len()? >= MAX_PLACEMENTS && t.get(id.as_bytes().as_slice())?.is_none() {
                t.pop_first()?;
            }
            t.insert(id.as_bytes().as_slice(), record)?;
            Ok(())
        })
    }

    /// Every remembered placement.
    pub fn placements(&self) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list(PLACEMENT, "placement list", usize::MAX)
    }

    /// A message's delivery record.
    pub fn delivery_get(&self, id: Uuid) -> Result<Option<Vec<u8>>, StateError> {
        self.get(DELIVERY, "delivery get", id)
    }

    /// Advances a delivery record. Records begin with a rank byte; `record` replaces the stored
    /// one only when its rank is higher, so late or repeated reports never move a message back.
    /// `false` when it did not replace anything.
    /// Only the store's own tests use it: the runtime goes through the batch operations.
    #[cfg(test)]
    pub fn delivery_advance(&self, id: Uuid, record: &[u8]) -> Result<bool, StateError> {
        self.write_with("delivery advance", Durability::None, |txn| {
            advance(&mut txn.open_table(DELIVERY)?, id, record)
        })
    }

    /// Drops expired replay entries and dedupe entries past retention.
    pub fn prune(&self, now_ms: i64) -> Result<Pruned, StateError> {
        let cutoff = now_ms.saturating_sub(self.limits.dedupe_retention_ms);
        self.write("prune", |txn| {
            let mut pruned = Pruned::default();
            txn.open_table(REPLAY)?.retain(|_, expires| {
                let keep = expires > now_ms;
                pruned.replay += u64::from(!keep);
                keep
            })?;
            txn.open_table(DEDUPE)?.retain(|_, seen| {
                let keep = seen > cutoff;
                pruned.dedupe += u64::from(!keep);
                keep
            })?;
            txn.open_table(DELIVERY)?.retain(|id, _| {
                let keep = created_ms(id).is_none_or(|created| created > cutoff);
                pruned.delivery += u64::from(!keep);
                keep
            })?;
            Ok(pruned)
        })
    }

    fn put(
        &self,
        table: TableDefinition<'_, &[u8], &[u8]>,
        what: &'static str,
        limit: u64,
        id: Uuid,
        record: &[u8],
    ) -> Result<(), StateError> {
        let full = self.write(what, |txn| {
            let mut t = txn.open_table(table)?;
            if t.len()? >= limit && t.get(id.as_bytes().as_slice())?.is_none() {
                return Ok(true);
            }
            t.insert(id.as_bytes().as_slice(), record)?;
            Ok(false)
        })?;
        if full {
            Err(StateError::Full { what, limit })
        } else {
            Ok(())
        }
    }

    fn get(
        &self,
        table: TableDefinition<'_, &[u8], &[u8]>,
        op: &'static str,
        id: Uuid,
    ) -> Result<Option<Vec<u8>>, StateError> {
        let txn = or_fail!(op, self.db.begin_read());
        let t = or_fail!(op, txn.open_table(table));
        let value = or_fail!(op, t.get(id.as_bytes().as_slice()));
        Ok(value.map(|v| v.value().to_vec()))
    }

    #[cfg(test)]
    fn remove(
        &self,
        table: TableDefinition<'_, &[u8], &[u8]>,
        op: &'static str,
        id: Uuid,
    ) -> Result<bool, StateError> {
        self.write(op, |txn| {
            Ok(txn
                .open_table(table)?
                .remove(id.as_bytes().as_slice())?
                .is_some())
        })
    }

    fn list(
        &self,
        table: TableDefinition<'_, &[u8], &[u8]>,
        op: &'static str,
        limit: usize,
    ) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        self.list_except(table, op, &|_| false, limit)
    }

    /// Up to `limit` entries of `table` in key order, leaving out (without copying their values)
    /// those whose id `skip` names.
    fn list_except(
        &self,
        table: TableDefinition<'_, &[u8], &[u8]>,
        op: &'static str,
        skip: &dyn Fn(Uuid) -> bool,
        limit: usize,
    ) -> Result<Vec<(Uuid, Vec<u8>)>, StateError> {
        let txn = or_fail!(op, self.db.begin_read());
        let t = or_fail!(op, txn.open_table(table));
        let mut out = Vec::new();
        for entry in or_fail!(op, t.iter()) {
            if out.len() >= limit {
                break;
            }
            let (key, value) = or_fail!(op, entry);
            let id = Uuid::from_slice(key.value()).map_err(|e| tx(op)(e.to_string()))?;
            if !skip(id) {
                out.push((id, value.value().to_vec()));
            }
        }
        Ok(out)
    }

    /// Runs `f` in one write transaction and commits it durably.
    fn write<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StateError> {
        self.write_with(op, Durability::Immediate, f)
    }

    /// Runs `f` in one write transaction committed with `durability`.
    fn write_with<T>(
        &self,
        op: &'static str,
        durability: Durability,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StateError> {
        let mut txn = or_fail!(op, self.db.begin_write());
        or_fail!(op, txn.set_durability(durability));
        let value = or_fail!(op, f(&txn));
        or_fail!(op, txn.commit());
        Ok(value)
    }
}

/// The replay cache key: key id, NUL, message id.
fn replay_key(key_id: &str, id: Uuid) -> Vec<u8> {
    let mut key = key_id.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// Puts held message `id` on `shelf`.
fn shelve(
    shelves: &mut redb::Table<'_, &[u8], &[u8]>,
    shelf_of: &mut redb::Table<'_, &[u8], &[u8]>,
    shelf: Shelf,
    id: Uuid,
) -> Result<(), redb::Error> {
    shelves.insert(shelf.entry(id).as_slice(), [].as_slice())?;
    shelf_of.insert(id.as_bytes().as_slice(), shelf.key().as_slice())?;
    Ok(())
}

/// Takes held message `id` off its shelf.
fn unshelve(
    shelves: &mut redb::Table<'_, &[u8], &[u8]>,
    shelf_of: &mut redb::Table<'_, &[u8], &[u8]>,
    id: Uuid,
) -> Result<(), redb::Error> {
    let shelf = shelf_of
        .remove(id.as_bytes().as_slice())?
        .map(|key| key.value().to_vec());
    if let Some(mut key) = shelf {
        key.extend_from_slice(id.as_bytes());
        shelves.remove(key.as_slice())?;
    }
    Ok(())
}

/// Stores `record` for `id` unless the stored record's rank (first byte) is as high or higher.
fn advance(
    table: &mut redb::Table<'_, &[u8], &[u8]>,
    id: Uuid,
    record: &[u8],
) -> Result<bool, redb::Error> {
    let rank = |r: &[u8]| r.first().copied().unwrap_or(0);
    let current = table
        .get(id.as_bytes().as_slice())?
        .map(|v| rank(v.value()));
    if current.is_some_and(|c| c >= rank(record)) {
        return Ok(false);
    }
    table.insert(id.as_bytes().as_slice(), record)?;
    Ok(true)
}

/// The creation time of a UUIDv7 key, Unix milliseconds.
fn created_ms(key: &[u8]) -> Option<i64> {
    let (seconds, nanos) = Uuid::from_slice(key).ok()?.get_timestamp()?.to_unix();
    i64::try_from(seconds.checked_mul(1000)? + u64::from(nanos / 1_000_000)).ok()
}

/// `DirBuilder::mode(0o700)` on Unix.
trait Private {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Private for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        std::os::unix::fs::DirBuilderExt::mode(self, 0o700)
    }
}

#[cfg(test)]
mod tests;
