//! The host-local mailbox: messages held for this host's agents, each recipient on a shelf of
//! its own (the state store's [`Shelf`]), and who is woken when one arrives.
//!
//! An arrival is announced once it is durable: a thread waiting for that shelf (an
//! `inbox_pull` with a wait, a spawn requester waiting for its reply) wakes and reads its own
//! shelf, and so does a pane agent's injector (an async watch of its shelf). Nobody scans the
//! whole held store to find what is theirs.
//!
//! Imports: `state` (the shelves), `wire` (what a held message carries).

mod held;
mod store;

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use tokio::sync::watch;

pub use self::held::{Held, HeldBody, shelf_for};
pub use self::store::{LocalSend, Mailbox, MailboxError, ReceiptSealer};
pub use crate::state::Shelf;

/// Counts arrivals per shelf and wakes who waits for them.
#[derive(Debug)]
pub struct Arrivals {
    /// Arrivals so far, per shelf.
    counts: Mutex<HashMap<Shelf, u64>>,
    /// Signalled on every arrival (threads waiting for a shelf).
    changed: Condvar,
    /// Every arrival, for async consumers that serve every shelf.
    any: watch::Sender<u64>,
    /// Per shelf, for async consumers of one (an agent's injector): made on demand, dropped
    /// once nobody watches.
    shelves: Mutex<HashMap<Shelf, watch::Sender<u64>>>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals::new()
    }
}

impl Arrivals {
    /// No arrival yet.
    pub fn new() -> Arrivals {
        Arrivals {
            counts: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            any: watch::Sender::new(0),
            shelves: Mutex::new(HashMap::new()),
        }
    }

    /// A message is held (durably) on `shelf`.
    pub fn arrived(&self, shelf: Shelf) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(shelf).or_default() += 1;
        }
        self.changed.notify_all();
        self.any.send_modify(|n| *n = n.wrapping_add(1));
        if let Ok(mut shelves) = self.shelves.lock()
            && let Some(watched) = shelves.get(&shelf)
        {
            if watched.receiver_count() == 0 {
                shelves.remove(&shelf);
            } else {
                watched.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Arrivals on `shelf` so far (to wait for the next one with [`Arrivals::wait`]).
    pub fn count(&self, shelf: Shelf) -> u64 {
        self.counts
            .lock()
            .map(|counts| counts.get(&shelf).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Waits until `shelf` has seen more than `since` arrivals, or `deadline`; whether it has.
    pub fn wait(&self, shelf: Shelf, since: u64, deadline: Instant) -> bool {
        let Ok(mut counts) = self.counts.lock() else {
            return false;
        };
        loop {
            if counts.get(&shelf).copied().unwrap_or(0) > since {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            counts = match self.changed.wait_timeout(counts, left) {
                Ok((counts, _)) => counts,
                Err(_) => return false,
            };
        }
    }

    /// Every arrival, as a counter that changes (for async consumers).
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.any.subscribe()
    }

    /// The arrivals on `shelf` alone, as a counter that changes (for an async consumer of one
    /// shelf: another shelf's arrival does not wake it).
    pub fn watch_shelf(&self, shelf: Shelf) -> watch::Receiver<u64> {
        let Ok(mut shelves) = self.shelves.lock() else {
            // Poisoned: a receiver that never changes; its consumer's tick still turns.
            return watch::Sender::new(0).subscribe();
        };
        shelves.retain(|_, watched| watched.receiver_count() > 0);
        shelves
            .entry(shelf)
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code fails loudly")]

    use std::sync::Arc;
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;

    #[test]
    fn a_waiter_wakes_for_its_own_shelf_and_not_for_anothers() {
        let arrivals = Arc::new(Arrivals::new());
        let mine = Shelf::Agent(Uuid::now_v7());
        let since = arrivals.count(mine);
        let far = Instant::now() + Duration::from_secs(30);
        let waiter = {
            let arrivals = Arc::clone(&arrivals);
            std::thread::spawn(move || arrivals.wait(mine, since, far))
        };
        // Another shelf's arrival does not end the wait.
        arrivals.arrived(Shelf::Agent(Uuid::now_v7()));
        arrivals.arrived(Shelf::Spawn);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "woken by another shelf's arrival");
        arrivals.arrived(mine);
        assert!(waiter.join().unwrap(), "its own arrival ends the wait");
        assert_eq!(arrivals.count(mine), since + 1);
        // Nothing arrives: the wait ends at its deadline, saying so.
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!arrivals.wait(mine, since + 1, soon));
        // Async consumers hear of every arrival, or of their shelf's alone.
        let mut any = arrivals.watch();
        let mut own = arrivals.watch_shelf(mine);
        arrivals.arrived(Shelf::Host);
        assert!(any.has_changed().unwrap());
        assert_eq!(*any.borrow_and_update(), 4);
        assert!(!own.has_changed().unwrap(), "woken by another shelf");
        arrivals.arrived(mine);
        assert!(own.has_changed().unwrap());
        assert_eq!(*own.borrow_and_update(), 1);
        // Nobody watches any more: the shelf's watch goes at its next arrival.
        drop(own);
        arrivals.arrived(mine);
        assert!(arrivals.shelves.lock().unwrap().is_empty());
    }
}
