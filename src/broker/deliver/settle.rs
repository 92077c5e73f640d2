//! Reading the broker's answers to mandatory, confirmed publishes.
//!
//! A publish is answered by an ack or a nack, and — when no queue was bound for it — by a
//! `basic.return` first. The brokers differ in what comes together and when:
//!
//! - RabbitMQ: an unroutable message is returned, then acked; a message a full `reject-publish`
//!   queue refuses is nacked (no return).
//! - LavinMQ 2.9: the same, except that a message a full queue refuses is returned **and**
//!   nacked, both at once, while acks come late and cumulatively, after the store syncs
//!   (`docs/broker.md`, LavinMQ column).
//!
//! lapin hands a return to whichever confirm of the channel completes next — with the ack or
//! the nack of another message — so a return is matched to its message by message id, never by
//! the confirm it came with, and may come in a batch before or after its own confirm. The rule:
//! a nack with a return is a full inbox (LavinMQ's answer: `inbox full`); a nack alone says
//! only that the broker did not take it — a full `reject-publish` inbox on RabbitMQ, but also a
//! quorum queue changing leader, which nacks for seconds while the queue is empty — so it is
//! `refused`, and the pump keeps the entry and learns which (`pump::Lanes`); an ack of a
//! returned message means no queue was bound (`no such agent`); an ack alone means the broker
//! has it.

use std::collections::HashSet;

use uuid::Uuid;

/// A publish's own confirm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// `basic.ack`.
    Ack,
    /// `basic.nack`.
    Nack,
}

/// What a confirmed publish came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The broker has it (queued in the broker).
    Queued,
    /// Returned and acked: no queue is bound for its key.
    NoSuchAgent,
    /// Nacked and returned: the queue refused it because it is full (LavinMQ).
    InboxFull,
    /// Nacked alone: the broker did not take it, and did not say why (RabbitMQ's full inbox, or
    /// a queue without a leader for the moment). Not final: the entry stays in the outbox.
    Refused,
}

impl Outcome {
    /// The failure reason shown to the sender; `None` for [`Outcome::Queued`] and
    /// [`Outcome::Refused`] (no failure yet).
    pub(super) fn reason(self) -> Option<&'static str> {
        match self {
            Outcome::Queued | Outcome::Refused => None,
            Outcome::NoSuchAgent => Some("no such agent (no inbox is bound)"),
            Outcome::InboxFull => Some("inbox full"),
        }
    }
}

/// Returns seen for publishes whose own confirm has not come yet (one per connection, like the
/// pump: a new connection publishes again and starts afresh).
#[derive(Debug, Default)]
pub(super) struct Returns {
    waiting: HashSet<Uuid>,
}

/// One batch read: each confirmed publish's outcome, and the ids returned after their own
/// confirm was read in an earlier batch (`late`: the caller turns such a message from `queued`
/// into `no such agent`, and leaves one that already failed — nacked — alone).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Read {
    /// `(id, outcome)` per confirm, in the batch's order.
    pub(super) settled: Vec<(Uuid, Outcome)>,
    /// Returned after their confirm was settled.
    pub(super) late: Vec<Uuid>,
}

impl Returns {
    /// Reads one batch: `confirms` (each publish's own answer) and `returned` (the message ids
    /// of every return that came with any of them). `in_flight(id)`: whether `id` still awaits
    /// its confirm after this batch.
    pub(super) fn read(
        &mut self,
        confirms: &[(Uuid, Answer)],
        returned: &[Uuid],
        in_flight: impl Fn(Uuid) -> bool,
    ) -> Read {
        self.waiting.extend(returned.iter().copied());
        let settled = confirms
            .iter()
            .map(|&(id, answer)| {
                let was_returned = self.waiting.remove(&id);
                let outcome = match answer {
                    Answer::Nack if was_returned => Outcome::InboxFull,
                    Answer::Nack => Outcome::Refused,
                    Answer::Ack if was_returned => Outcome::NoSuchAgent,
                    Answer::Ack => Outcome::Queued,
                };
                (id, outcome)
            })
            .collect();
        let late: Vec<Uuid> = self
            .waiting
            .iter()
            .copied()
            .filter(|id| !in_flight(*id))
            .collect();
        for id in &late {
            self.waiting.remove(id);
        }
        Read { settled, late }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (Uuid, Uuid, Uuid) {
        (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7())
    }

    #[test]
    fn lavinmq_order_return_a_then_return_and_nack_b_then_a_late_ack() {
        // A: no inbox bound. B: its inbox is full. LavinMQ sends return(A), return(B) and
        // nack(B) at once, ack(A) after the sync; lapin hands return(A) to nack(B)'s confirm
        // and return(B) to ack(A)'s.
        let (a, b, _) = ids();
        let mut returns = Returns::default();
        let first = returns.read(&[(b, Answer::Nack)], &[a], |id| id == a);
        assert_eq!(
            first.settled,
            vec![(b, Outcome::Refused)],
            "B's own return has not been read yet: refused, not yet known full"
        );
        assert!(first.late.is_empty(), "A still awaits its ack");
        let second = returns.read(&[(a, Answer::Ack)], &[b], |_| false);
        assert_eq!(second.settled, vec![(a, Outcome::NoSuchAgent)]);
        assert_eq!(
            second.late,
            vec![b],
            "B's return comes after its nack: the caller learns B's inbox is full"
        );
    }

    #[test]
    fn a_nack_with_its_return_is_a_full_inbox_and_a_nack_alone_is_only_refused() {
        let (a, b, c) = ids();
        let d = Uuid::now_v7();
        let mut returns = Returns::default();
        let read = returns.read(
            &[
                (a, Answer::Ack),
                (b, Answer::Nack),
                (c, Answer::Ack),
                (d, Answer::Nack),
            ],
            &[b, a],
            |_| false,
        );
        assert_eq!(
            read.settled,
            vec![
                (a, Outcome::NoSuchAgent),
                (b, Outcome::InboxFull),
                (c, Outcome::Queued),
                (d, Outcome::Refused)
            ]
        );
        assert!(read.late.is_empty());
        assert_eq!(Outcome::Refused.reason(), None, "not a failure");
    }

    #[test]
    fn rabbitmq_order_and_a_return_read_after_its_ack() {
        // RabbitMQ: return(A) then ack(A), nack(B) alone.
        let (a, b, c) = ids();
        let mut returns = Returns::default();
        let read = returns.read(&[(a, Answer::Ack), (b, Answer::Nack)], &[a], |_| false);
        assert_eq!(
            read.settled,
            vec![(a, Outcome::NoSuchAgent), (b, Outcome::Refused)]
        );
        // The confirm carrying A's return was joined a batch after A's own ack: A is late.
        let (a2, _, _) = ids();
        let first = returns.read(&[(a2, Answer::Ack)], &[], |_| false);
        assert_eq!(first.settled, vec![(a2, Outcome::Queued)]);
        let second = returns.read(&[(c, Answer::Ack)], &[a2], |_| false);
        assert_eq!(second.settled, vec![(c, Outcome::Queued)]);
        assert_eq!(second.late, vec![a2]);
    }
}
