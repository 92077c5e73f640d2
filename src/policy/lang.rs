//! The values a grant's variable admits, as a regular language: its pattern (anchored) and its
//! length limit. Two of them are compared on their DFAs, not on their text: whether one admits
//! a value the other refuses, with the shortest such value (readable bytes first) as an example.
//!
//! The DFAs are lazy (`regex_automata::hybrid`): only the states a walk reaches are built, so a
//! pattern such as `\w{1,64}` (Unicode), whose whole DFA is large, costs what the comparison
//! visits. The cache is bounded and never cleared mid-walk (state ids would go stale): a walk
//! that needs more states fails, and the caller reports the pattern as uncomparable.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use regex_automata::hybrid::LazyStateID;
use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Most memory one pattern's lazy DFA may use; a walk that needs more fails.
const CACHE_CAPACITY: usize = 32 << 20;

/// A variable's admitted values: anchored pattern, and at most `max_len` bytes.
pub(super) struct Language {
    dfa: DFA,
    cache: RefCell<Cache>,
    start: LazyStateID,
    max_len: usize,
    pattern: String,
}

/// Why a pattern could not be compared: no DFA (a feature DFAs lack, such as a Unicode word
/// boundary) or one too large for the bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pattern `{pattern}` cannot be compared: {reason}")]
pub(super) struct LanguageError {
    /// The pattern as written.
    pub(super) pattern: String,
    /// What failed.
    pub(super) reason: String,
}

type Step<T> = Result<T, LanguageError>;

impl Language {
    /// The language of `pattern` (as written in a grant: matched whole) up to `max_len` bytes.
    pub(super) fn new(pattern: &str, max_len: usize) -> Result<Language, LanguageError> {
        let error = |reason: String| LanguageError {
            pattern: pattern.to_owned(),
            reason,
        };
        let dfa = DFA::builder()
            .configure(
                DFA::config()
                    .match_kind(MatchKind::All)
                    .cache_capacity(CACHE_CAPACITY)
                    .minimum_cache_clear_count(Some(0)),
            )
            .build(&format!("^(?:{pattern})$"))
            .map_err(|e| error(e.to_string()))?;
        let mut cache = dfa.create_cache();
        let start = dfa
            .start_state(&mut cache, &start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| error(e.to_string()))?;
        Ok(Language {
            dfa,
            cache: RefCell::new(cache),
            start,
            max_len,
            pattern: pattern.to_owned(),
        })
    }

    fn too_large(&self) -> LanguageError {
        LanguageError {
            pattern: self.pattern.clone(),
            reason: format!("its DFA needs more than {} MiB", CACHE_CAPACITY >> 20),
        }
    }

    /// Whether the value read so far (leading to `state`) is admitted, length aside.
    fn accepts(&self, state: LazyStateID) -> Step<bool> {
        let mut cache = self.cache.borrow_mut();
        self.dfa
            .next_eoi_state(&mut cache, state)
            .map(|s| s.is_match())
            .map_err(|_| self.too_large())
    }

    fn next(&self, state: LazyStateID, byte: u8) -> Step<LazyStateID> {
        let mut cache = self.cache.borrow_mut();
        self.dfa
            .next_state(&mut cache, state, byte)
            .map_err(|_| self.too_large())
    }

    /// Whether `value` is admitted (for tests).
    #[cfg(test)]
    pub(super) fn admits(&self, value: &str) -> bool {
        let mut state = self.start;
        for byte in value.bytes() {
            state = self.next(state, byte).unwrap();
        }
        value.len() <= self.max_len && self.accepts(state).unwrap()
    }

    /// Some value this language admits, shortest first, if any.
    pub(super) fn example(&self) -> Step<Option<String>> {
        self.longer_than(None)
    }

    /// A value this language admits and `other` refuses — the shortest, readable bytes first —
    /// or `None` when every value admitted here is admitted there too.
    pub(super) fn admits_beyond(&self, other: &Language) -> Step<Option<String>> {
        // Refused by the other's pattern, within this length limit: one walk over state pairs.
        if let Some(value) = self.beyond_pattern(other)? {
            return Ok(Some(value));
        }
        // Admitted by both patterns but longer than the other allows.
        if self.max_len > other.max_len {
            return self.longer_than(Some(other.max_len));
        }
        Ok(None)
    }

    fn beyond_pattern(&self, other: &Language) -> Step<Option<String>> {
        let bytes = joint_bytes(&[&self.dfa, &other.dfa]);
        let mut parent: Parents = HashMap::new();
        let mut queue = VecDeque::new();
        let first = (self.start, other.start);
        parent.insert(first, None);
        queue.push_back((first, 0usize));
        while let Some(((mine, theirs), len)) = queue.pop_front() {
            if self.accepts(mine)? && !other.accepts(theirs)? {
                return Ok(Some(path(&parent, (mine, theirs))));
            }
            if len == self.max_len {
                continue;
            }
            for &byte in &bytes {
                let next = (self.next(mine, byte)?, other.next(theirs, byte)?);
                if next.0.is_dead() || parent.contains_key(&next) {
                    continue;
                }
                parent.insert(next, Some(((mine, theirs), byte)));
                queue.push_back((next, len + 1));
            }
        }
        Ok(None)
    }

    /// A value longer than `min` bytes (any length for `None`), within this limit, that this
    /// pattern admits: the shortest, readable bytes first.
    fn longer_than(&self, min: Option<usize>) -> Step<Option<String>> {
        let bytes = joint_bytes(&[&self.dfa]);
        let long_enough = |len: usize| min.is_none_or(|m| len > m);
        if long_enough(0) && self.accepts(self.start)? {
            return Ok(Some(String::new()));
        }
        // One map per length: the states reachable with exactly that many bytes, and how.
        let mut levels: Vec<HashMap<LazyStateID, (LazyStateID, u8)>> = Vec::new();
        let mut frontier: Vec<LazyStateID> = vec![self.start];
        for len in 1..=self.max_len {
            let mut level: HashMap<LazyStateID, (LazyStateID, u8)> = HashMap::new();
            let mut next_frontier = Vec::new();
            for &state in &frontier {
                for &byte in &bytes {
                    let next = self.next(state, byte)?;
                    if next.is_dead() || level.contains_key(&next) {
                        continue;
                    }
                    level.insert(next, (state, byte));
                    next_frontier.push(next);
                }
            }
            levels.push(level);
            if long_enough(len) {
                let mut end = None;
                for &state in &next_frontier {
                    if self.accepts(state)? {
                        end = Some(state);
                        break;
                    }
                }
                if let Some(end) = end {
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
                    return Ok(Some(String::from_utf8_lossy(&out).into_owned()));
                }
            }
            if next_frontier.is_empty() {
                return Ok(None);
            }
            next_frontier.sort_unstable();
            next_frontier.dedup();
            frontier = next_frontier;
        }
        Ok(None)
    }
}

/// The bytes worth trying from any state: one per class of bytes that every DFA treats alike,
/// the most readable of each class (letters, digits, punctuation, then the rest).
fn joint_bytes(dfas: &[&DFA]) -> Vec<u8> {
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
type Pair = (LazyStateID, LazyStateID);

fn path(parent: &Parents, mut at: Pair) -> String {
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
pub(super) fn compare(old: &Language, new: &Language) -> Result<Change, LanguageError> {
    Ok(match (new.admits_beyond(old)?, old.admits_beyond(new)?) {
        (None, None) => Change::Same,
        (Some(example), None) => Change::Widened { example },
        (None, Some(example)) => Change::Narrowed { example },
        (Some(admitted), Some(refused)) => Change::Changed { admitted, refused },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lang(pattern: &str, max_len: usize) -> Language {
        Language::new(pattern, max_len).unwrap()
    }

    fn cmp(old: &Language, new: &Language) -> Change {
        compare(old, new).unwrap()
    }

    #[test]
    fn equivalent_patterns_are_the_same_language() {
        for (a, b) in [
            ("[a-z]{1,9}", "[a-z][a-z]{0,8}"),
            ("(a|b)+", "[ab]+"),
            ("[0-9]+", "[0-9]*[0-9]"),
            ("x?y", "y|xy"),
        ] {
            assert_eq!(cmp(&lang(a, 16), &lang(b, 16)), Change::Same, "{a} vs {b}");
        }
        // Different patterns, the same values once the length limit applies.
        assert_eq!(
            cmp(&lang("[a-z]{1,4}", 4), &lang("[a-z]+", 4)),
            Change::Same
        );
    }

    #[test]
    fn wider_narrower_and_changed_come_with_examples_the_patterns_decide() {
        let (old, new) = (lang("[a-z]{1,9}", 9), lang("[a-z0-9]{1,9}", 9));
        let Change::Widened { example } = cmp(&old, &new) else {
            panic!("not widened");
        };
        assert!(new.admits(&example) && !old.admits(&example), "{example:?}");
        assert!(matches!(cmp(&new, &old), Change::Narrowed { .. }));
        let (old, new) = (lang("[a-z]+", 8), lang("[0-9a-f]+", 8));
        let Change::Changed { admitted, refused } = cmp(&old, &new) else {
            panic!("not changed");
        };
        assert!(new.admits(&admitted) && !old.admits(&admitted));
        assert!(old.admits(&refused) && !new.admits(&refused));
        // The length limit alone.
        let Change::Widened { example } = cmp(&lang("[a-z]+", 4), &lang("[a-z]+", 6)) else {
            panic!("not widened by length");
        };
        assert_eq!(example.len(), 5, "{example:?}");
    }

    #[test]
    fn unicode_classes_compare_and_a_pattern_without_a_dfa_is_an_error() {
        let (old, new) = (lang("[a-z]{1,64}", 64), lang("\\w{1,64}", 256));
        let Change::Widened { example } = cmp(&old, &new) else {
            panic!("not widened");
        };
        assert_eq!(example, "A");
        // A Unicode word boundary has no DFA: an error naming the pattern, not a guess.
        let error = Language::new("\\bx\\b", 8).err().expect("refused");
        assert_eq!(error.pattern, "\\bx\\b");
    }

    #[test]
    fn examples_are_readable_and_shortest() {
        let (old, new) = (lang("[A-Z]{2}-[0-9]{1,6}", 16), lang(".{1,16}", 16));
        let Change::Widened { example } = cmp(&old, &new) else {
            panic!("not widened");
        };
        assert_eq!(example, "a");
        assert_eq!(
            lang("[A-Z]{2}-[0-9]+", 9).example().unwrap().as_deref(),
            Some("AA-0")
        );
        assert_eq!(
            lang("[a-z]", 0).example().unwrap(),
            None,
            "nothing fits in 0 bytes"
        );
    }
}
