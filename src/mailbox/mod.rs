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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use tokio::sync::watch;

pub use self::held::{Held, HeldBody, shelf_for};
pub use self::store::{LocalSend, Mailbox, MailboxError, ReceiptSealer};
pub use crate::state::Shelf;

/// Numbers arrivals and wakes who waits for them.
///
/// A waiting thread takes a [`Ticket`] (the arrival number so far) before it looks at its shelf,
/// then waits for an arrival on that shelf numbered above it: an arrival between the look and
/// the wait still wakes it. What is remembered per shelf is the number of its last arrival; a
/// shelf whose last arrival no ticket can be waiting for is forgotten once many are remembered,
/// so that a host that saw many agents come and go keeps no entry per agent for ever.
#[derive(Debug)]
pub struct Arrivals {
    seen: Mutex<Seen>,
    /// Signalled on every arrival (threads waiting for a shelf).
    changed: Condvar,
    /// Every arrival, for async consumers that serve every shelf.
    any: watch::Sender<u64>,
    /// Per shelf, for async consumers of one (an agent's injector): made on demand, dropped
    /// once nobody watches.
    shelves: Mutex<HashMap<Shelf, watch::Sender<u64>>>,
}

/// The arrivals numbered so far, and the tickets out.
#[derive(Debug, Default)]
struct Seen {
    /// Arrivals so far (the last one's number).
    total: u64,
    /// Per shelf, the number of its last arrival.
    last: HashMap<Shelf, u64>,
    /// The tickets out: how many at each number.
    tickets: BTreeMap<u64, usize>,
}

/// Shelves remembered before those no ticket needs are forgotten.
const REMEMBERED: usize = 1024;

/// A waiter's place: the arrivals before it do not count (see [`Arrivals::ticket`]).
#[derive(Debug)]
pub struct Ticket<'a> {
    arrivals: &'a Arrivals,
    since: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Ok(mut seen) = self.arrivals.seen.lock()
            && let Some(n) = seen.tickets.get_mut(&self.since)
        {
            *n -= 1;
            if *n == 0 {
                seen.tickets.remove(&self.since);
            }
        }
    }
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
            seen: Mutex::new(Seen::default()),
            changed: Condvar::new(),
            any: watch::Sender::new(0),
            shelves: Mutex::new(HashMap::new()),
        }
    }

    /// A message is held (durably) on `shelf`.
    pub fn arrived(&self, shelf: Shelf) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.total += 1;
            let now = seen.total;
            seen.last.insert(shelf, now);
            if seen.last.len() > REMEMBERED {
                // A ticket waits for an arrival numbered above its own: none is waiting for
                // one at or below the oldest ticket's (and a later ticket for none so far).
                let floor = seen.tickets.keys().next().copied().unwrap_or(now);
                seen.last.retain(|_, last| *last > floor);
            }
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

    /// A place in line, taken before looking at a shelf: [`Arrivals::wait`] then waits for an
    /// arrival after it.
    pub fn ticket(&self) -> Ticket<'_> {
        let since = match self.seen.lock() {
            Ok(mut seen) => {
                let since = seen.total;
                *seen.tickets.entry(since).or_default() += 1;
                since
            }
            // Poisoned: a ticket that waits for nothing (its wait ends at the deadline).
            Err(_) => u64::MAX,
        };
        Ticket {
            arrivals: self,
            since,
        }
    }

    /// Waits until `shelf` has an arrival after `ticket`, or `deadline`; whether it has.
    pub fn wait(&self, shelf: Shelf, ticket: &Ticket<'_>, deadline: Instant) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        loop {
            if seen
                .last
                .get(&shelf)
                .is_some_and(|last| *last > ticket.since)
            {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            seen = match self.changed.wait_timeout(seen, left) {
                Ok((seen, _)) => seen,
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
        let far = Instant::now() + Duration::from_secs(30);
        let waiter = {
            let arrivals = Arc::clone(&arrivals);
            std::thread::spawn(move || {
                let ticket = arrivals.ticket();
                arrivals.wait(mine, &ticket, far)
            })
        };
        // Another shelf's arrival does not end the wait.
        std::thread::sleep(Duration::from_millis(50));
        arrivals.arrived(Shelf::Agent(Uuid::now_v7()));
        arrivals.arrived(Shelf::Spawn);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "woken by another shelf's arrival");
        arrivals.arrived(mine);
        assert!(waiter.join().unwrap(), "its own arrival ends the wait");
        // An arrival between the ticket and the wait counts; one before the ticket does not.
        let ticket = arrivals.ticket();
        arrivals.arrived(mine);
        assert!(arrivals.wait(mine, &ticket, Instant::now()));
        let ticket = arrivals.ticket();
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(
            !arrivals.wait(mine, &ticket, soon),
            "nothing after the ticket"
        );
        drop(ticket);
        // Async consumers hear of every arrival, or of their shelf's alone.
        let mut any = arrivals.watch();
        let mut own = arrivals.watch_shelf(mine);
        arrivals.arrived(Shelf::Host);
        assert!(any.has_changed().unwrap());
        assert_eq!(*any.borrow_and_update(), 5);
        assert!(!own.has_changed().unwrap(), "woken by another shelf");
        arrivals.arrived(mine);
        assert!(own.has_changed().unwrap());
        assert_eq!(*own.borrow_and_update(), 1);
        // Nobody watches any more: the shelf's watch goes at its next arrival.
        drop(own);
        arrivals.arrived(mine);
        assert!(arrivals.shelves.lock().unwrap().is_empty());
    }

    #[test]
    fn many_agents_come_and_go_and_the_shelves_remembered_stay_bounded() {
        let arrivals = Arrivals::new();
        let mine = Shelf::Agent(Uuid::now_v7());
        // A waiter took its ticket; then its message and thousands of other agents' arrive.
        let ticket = arrivals.ticket();
        arrivals.arrived(mine);
        for _ in 0..10 * REMEMBERED {
            arrivals.arrived(Shelf::Agent(Uuid::now_v7()));
        }
        // Its arrival, after its ticket, is still remembered for it…
        assert!(arrivals.wait(mine, &ticket, Instant::now()));
        drop(ticket);
        // …and with no ticket out, what is remembered stays bounded.
        for _ in 0..10 * REMEMBERED {
            arrivals.arrived(Shelf::Agent(Uuid::now_v7()));
        }
        let seen = arrivals.seen.lock().unwrap();
        assert!(
            seen.last.len() <= REMEMBERED + 1,
            "{} remembered",
            seen.last.len()
        );
        assert!(seen.tickets.is_empty());
    }
}
