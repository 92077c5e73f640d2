//! The values a grant's variable admits, as a regular language: its pattern (anchored) and its
//! length limit. Two of them are compared on their DFAs, not on their text: whether one admits
//! a value the other refuses, with the shortest such value (readable bytes first) as an example.

use std::collections::{HashMap, VecDeque};

use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Largest DFA built for one pattern; a pattern over it cannot be compared (and is reported so).
const DFA_SIZE_LIMIT: usize = 8 << 20;

/// A variable's admitted values: anchored pattern, and at most `max_len` bytes.
pub(super) struct Language {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    max_len: usize,
}

/// Why a pattern could not be turned into a DFA (too large, or a feature DFAs lack such as a
/// Unicode word boundary).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pattern `{pattern}` cannot be compared: {reason}")]
pub(super) struct LanguageError {
    /// The pattern as written.
    pub(super) pattern: String,
    /// What failed.
    pub(super) reason: String,
}

impl Language {
    /// The language of `pattern` (as written in a grant: matched whole) up to `max_len` bytes.
    pub(super) fn new(pattern: &str, max_len: usize) -> Result<Language, LanguageError> {
        let error = |reason: String| LanguageError {
            pattern: pattern.to_owned(),
            reason,
        };
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                    .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
            )
            .build(&format!("^(?:{pattern})$"))
            .map_err(|e| error(e.to_string()))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| error(e.to_string()))?;
        Ok(Language {
            dfa,
            start,
            max_len,
        })
    }

    /// Whether the value read so far (leading to `state`) is admitted, length aside.
    fn accepts(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    fn next(&self, state: StateID, byte: u8) -> StateID {
        self.dfa.next_state(state, byte)
    }

    fn dead(&self, state: StateID) -> bool {
        self.dfa.is_dead_state(state)
    }

    /// Whether `value` is admitted (for tests).
    #[cfg(test)]
    pub(super) fn admits(&self, value: &str) -> bool {
        value.len() <= self.max_len
            && self.accepts(
                value
                    .bytes()
                    .fold(self.start, |state, byte| self.next(state, byte)),
            )
    }

    /// Some value this language admits, shortest first, if any.
    pub(super) fn example(&self) -> Option<String> {
        let nothing = Language::nothing();
        self.admits_beyond(&nothing)
    }

    /// The empty language (no value at all), for a variable a grant does not list.
    fn nothing() -> Language {
        #[expect(clippy::expect_used, reason = "a fixed pattern that always builds")]
        Language::new("[^\\x00-\\x{10FFFF}]", 0).expect("the empty language builds")
    }

    /// A value this language admits and `other` refuses — the shortest, readable bytes first —
    /// or `None` when every value admitted here is admitted there too.
    pub(super) fn admits_beyond(&self, other: &Language) -> Option<String> {
        // Refused by the other's pattern, within this length limit: one walk over state pairs.
        if let Some(value) = self.beyond_pattern(other) {
            return Some(value);
        }
        // Admitted by both patterns but longer than the other allows.
        if self.max_len > other.max_len {
            return self.longer_than(other.max_len);
        }
        None
    }

    fn beyond_pattern(&self, other: &Language) -> Option<String> {
        let bytes = joint_bytes(&[&self.dfa, &other.dfa]);
        let mut parent: Parents = HashMap::new();
        let mut queue = VecDeque::new();
        let first = (self.start, other.start);
        parent.insert(first, None);
        queue.push_back((first, 0usize));
        while let Some(((mine, theirs), len)) = queue.pop_front() {
            if self.accepts(mine) && !other.accepts(theirs) {
                return Some(path(&parent, (mine, theirs)));
            }
            if len == self.max_len {
                continue;
            }
            for &byte in &bytes {
                let next = (self.next(mine, byte), other.next(theirs, byte));
                if self.dead(next.0) || parent.contains_key(&next) {
                    continue;
                }
                parent.insert(next, Some(((mine, theirs), byte)));
                queue.push_back((next, len + 1));
            }
        }
        None
    }

    /// A value longer than `min` bytes (and within this limit) that this pattern admits.
    fn longer_than(&self, min: usize) -> Option<String> {
        let bytes = joint_bytes(&[&self.dfa]);
        // One map per length: the states reachable with exactly that many bytes, and how.
        let mut levels: Vec<HashMap<StateID, (StateID, u8)>> = Vec::new();
        let mut frontier: Vec<StateID> = vec![self.start];
        for len in 1..=self.max_len {
            let mut level: HashMap<StateID, (StateID, u8)> = HashMap::new();
            let mut next_frontier = Vec::new();
            for &state in &frontier {
                for &byte in &bytes {
                    let next = self.next(state, byte);
                    if self.dead(next) || level.contains_key(&next) {
                        continue;
                    }
                    level.insert(next, (state, byte));
                    next_frontier.push(next);
                }
            }
            levels.push(level);
            if len > min
                && let Some(&end) = next_frontier.iter().find(|&&s| self.accepts(s))
            {
                let mut out = Vec::with_capacity(len);
                let mut state = end;
                for level in levels.iter().rev() {
                    let Some(&(previous, byte)) = level.get(&state) else {
                        break;
                    };
                    out.push(byte);
                    state = previous;
                }
                out.reverse();
                return Some(String::from_utf8_lossy(&out).into_owned());
            }
            if next_frontier.is_empty() {
                return None;
            }
            next_frontier.sort_unstable();
            next_frontier.dedup();
            frontier = next_frontier;
        }
        None
    }
}

/// The bytes worth trying from any state: one per class of bytes that every DFA treats alike,
/// the most readable of each class (letters, digits, punctuation, then the rest).
fn joint_bytes(dfas: &[&dense::DFA<Vec<u32>>]) -> Vec<u8> {
    let rank = |b: u8| match b {
        b'a'..=b'z' => 0,
        b'A'..=b'Z' => 1,
        b'0'..=b'9' => 2,
        b'-' | b'_' | b'.' | b'/' => 3,
        0x21..=0x7e => 4,
        b' ' => 5,
        _ => 6,
    };
    let mut order: Vec<u8> = (0..=255).collect();
    order.sort_by_key(|&b| rank(b));
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut out = Vec::new();
    for byte in order {
        let key: Vec<u8> = dfas.iter().map(|d| d.byte_classes().get(byte)).collect();
        if !seen.contains(&key) {
            seen.push(key);
            out.push(byte);
        }
    }
    out
}

/// A state pair of the walk, and how it was first reached (`None`: the start).
type Parents = HashMap<Pair, Option<(Pair, u8)>>;
type Pair = (StateID, StateID);

fn path(parent: &Parents, mut at: (StateID, StateID)) -> String {
    let mut out = Vec::new();
    while let Some(Some((previous, byte))) = parent.get(&at) {
        out.push(*byte);
        at = *previous;
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// How a variable's admitted values changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// The same values (perhaps written differently).
    Same,
    /// More values: one the new admits and the old refused.
    Widened {
        /// A value admitted now and refused before.
        example: String,
    },
    /// Fewer values.
    Narrowed {
        /// A value refused now and admitted before.
        example: String,
    },
    /// Some more, some fewer.
    Changed {
        /// A value admitted now and refused before.
        admitted: String,
        /// A value refused now and admitted before.
        refused: String,
    },
}

/// Compares the values `old` and `new` admit.
pub(super) fn compare(old: &Language, new: &Language) -> Change {
    match (new.admits_beyond(old), old.admits_beyond(new)) {
        (None, None) => Change::Same,
        (Some(example), None) => Change::Widened { example },
        (None, Some(example)) => Change::Narrowed { example },
        (Some(admitted), Some(refused)) => Change::Changed { admitted, refused },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lang(pattern: &str, max_len: usize) -> Language {
        Language::new(pattern, max_len).unwrap()
    }

    #[test]
    fn equivalent_patterns_are_the_same_language() {
        for (a, b) in [
            ("[a-z]{1,9}", "[a-z][a-z]{0,8}"),
            ("(a|b)+", "[ab]+"),
            ("[0-9]+", "[0-9]*[0-9]"),
            ("x?y", "y|xy"),
        ] {
            assert_eq!(
                compare(&lang(a, 16), &lang(b, 16)),
                Change::Same,
                "{a} vs {b}"
            );
        }
        // Different patterns, the same values once the length limit applies.
        assert_eq!(
            compare(&lang("[a-z]{1,4}", 4), &lang("[a-z]+", 4)),
            Change::Same
        );
    }

    #[test]
    fn wider_narrower_and_changed_come_with_examples_the_patterns_decide() {
        let (old, new) = (lang("[a-z]{1,9}", 9), lang("[a-z0-9]{1,9}", 9));
        let Change::Widened { example } = compare(&old, &new) else {
            panic!("not widened");
        };
        assert!(new.admits(&example) && !old.admits(&example), "{example:?}");
        assert!(matches!(compare(&new, &old), Change::Narrowed { .. }));
        let (old, new) = (lang("[a-z]+", 8), lang("[0-9a-f]+", 8));
        let Change::Changed { admitted, refused } = compare(&old, &new) else {
            panic!("not changed");
        };
        assert!(new.admits(&admitted) && !old.admits(&admitted));
        assert!(old.admits(&refused) && !new.admits(&refused));
        // The length limit alone.
        let Change::Widened { example } = compare(&lang("[a-z]+", 4), &lang("[a-z]+", 6)) else {
            panic!("not widened by length");
        };
        assert_eq!(example.len(), 5, "{example:?}");
    }

    #[test]
    fn examples_are_readable_and_shortest() {
        let (old, new) = (lang("[A-Z]{2}-[0-9]{1,6}", 16), lang(".{1,16}", 16));
        let Change::Widened { example } = compare(&old, &new) else {
            panic!("not widened");
        };
        assert_eq!(example, "a");
        assert_eq!(
            lang("[A-Z]{2}-[0-9]+", 9).example().as_deref(),
            Some("AA-0")
        );
        assert_eq!(lang("[a-z]", 0).example(), None, "nothing fits in 0 bytes");
    }
}
