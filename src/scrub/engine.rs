//! The compiled engine: one multi-pattern automaton over every trigger, and the scan that turns
//! its hits into redaction spans.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, Input, MatchKind};

use super::ansi;
use super::known::{self, Encoding, HeldPattern};
use super::rules::{self, Outcome, PemState, Rule, Scan, Span};

/// What a pattern of the automaton stands for.
#[derive(Clone, Copy)]
enum Trigger {
    Rule(Rule),
    /// Index into [`Engine::held`].
    Held(usize),
}

/// How the text being scanned ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// For good: end of stream, or a text scrubbed whole.
    Hard,
    /// At a newline, with more lines to come: a last line that may go on in a held value's
    /// wrapped base64 on the next line waits for it (see [`Engine::wrap_from`]).
    Line,
    /// Anywhere (an idle flush, a forced cut of an over-long line): a candidate touching the end
    /// is held back, and so is a wrapped-base64 last line as for [`End::Line`].
    Open,
}

/// One automaton over at most [`GROUP_SIZE`] patterns, so its search gets a SIMD prefilter
/// (Teddy handles up to 64 literals; one automaton over every trigger would get none).
#[derive(Clone)]
struct Group {
    automaton: AhoCorasick,
    triggers: Vec<Trigger>,
}

/// Teddy takes up to 64 literals. With 100 shapes, 50 measured best (benches/scrub.rs); with the
/// 113 of issue 22, two full groups (64 and 49) beat three.
const GROUP_SIZE: usize = 64;

/// Immutable once built; [`super::Scrubber`] swaps in a new one when a secret is registered.
pub(super) struct Engine {
    /// Held-value groups first, then the shape groups: on a tie the earlier group wins.
    groups: Vec<Group>,
    held: Vec<HeldPattern>,
    held_count: usize,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            groups: shape_groups().to_vec(),
            held: Vec::new(),
            held_count: 0,
        }
    }
}

/// The groups for the credential shapes: built once, shared by every engine.
fn shape_groups() -> &'static [Group] {
    static SHAPES: OnceLock<Vec<Group>> = OnceLock::new();
    SHAPES.get_or_init(|| {
        let mut patterns: Vec<(Vec<u8>, Trigger)> = Vec::new();
        for spec in rules::PREFIXES {
            patterns.push((
                spec.prefix.as_bytes().to_vec(),
                Trigger::Rule(Rule::Prefix(spec)),
            ));
        }
        for (text, rule) in rules::OTHER_TRIGGERS {
            patterns.push((text.as_bytes().to_vec(), Trigger::Rule(*rule)));
        }
        // Short literals together: a group whose shortest literal has 4 bytes gets 4-byte masks
        // and far fewer false candidates. (No two shape triggers start at the same place, so the
        // order between groups decides nothing here.)
        patterns.sort_by_key(|(bytes, _)| bytes.len());
        groups(patterns)
    })
}

/// Splits `patterns` into groups of at most [`GROUP_SIZE`], keeping their order.
fn groups(patterns: Vec<(Vec<u8>, Trigger)>) -> Vec<Group> {
    let mut out = Vec::new();
    let mut rest = patterns;
    while !rest.is_empty() {
        let tail = rest.split_off(GROUP_SIZE.min(rest.len()));
        let (mut bytes, triggers): (Vec<Vec<u8>>, Vec<Trigger>) = rest.into_iter().unzip();
        #[expect(
            clippy::expect_used,
            reason = "literal patterns and held values are few and short; building cannot fail"
        )]
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostFirst)
            .kind(Some(AhoCorasickKind::DFA))
            .build(&bytes)
            .expect("a trigger automaton builds");
        for pattern in &mut bytes {
            zeroize::Zeroize::zeroize(pattern);
        }
        out.push(Group {
            automaton,
            triggers,
        });
        rest = tail;
    }
    out
}

/// The result of redacting one block.
pub(super) struct Redacted {
    /// Bytes of the block that were decided and written; the rest is held back.
    pub(super) consumed: usize,
    /// The last redaction reached the end of the block (a forced cut continues it).
    pub(super) touches_end: bool,
}

impl Engine {
    fn build(held: Vec<HeldPattern>, held_count: usize) -> Engine {
        // INVARIANT: held groups come first, so at a shared start position an exact held value
        // wins over a shape trigger.
        let patterns = held
            .iter()
            .enumerate()
            .map(|(i, p)| (p.bytes.to_vec(), Trigger::Held(i)))
            .collect();
        let mut groups = groups(patterns);
        groups.extend_from_slice(shape_groups());
        Engine {
            groups,
            held,
            held_count,
        }
    }

    /// A new engine holding everything this one does plus `value`.
    pub(super) fn with_held(&self, value: &[u8]) -> Engine {
        let mut held = self.held.clone();
        for pattern in known::patterns(value) {
            if !held.iter().any(|h| *h.bytes == *pattern.bytes) {
                held.push(pattern);
            }
        }
        // Longer patterns first: where one held value contains another, the longer wins.
        held.sort_by_key(|p| std::cmp::Reverse(p.bytes.len()));
        Engine::build(held, self.held_count + 1)
    }

    pub(super) fn hits(&self, text: &[u8]) -> usize {
        self.groups
            .iter()
            .map(|g| g.automaton.find_iter(text).count())
            .sum()
    }

    pub(super) fn held_count(&self) -> usize {
        self.held_count
    }

    /// Redacts `block` into `out`. With [`End::Hard`] the whole block is consumed; otherwise
    /// what may go on past the end is held back (see [`End`] and [`Redacted::consumed`]).
    pub(super) fn redact(
        &self,
        block: &[u8],
        end: End,
        pem: &mut PemState,
        out: &mut Vec<u8>,
    ) -> Redacted {
        if memchr::memchr(0x1b, block).is_none() {
            let (spans, hold) = self.scan(block, end, pem);
            let consumed = hold.unwrap_or(block.len());
            let touches_end = spans.last().is_some_and(|s| s.end >= block.len());
            write_spans(block, &spans, consumed, out);
            return Redacted {
                consumed,
                touches_end,
            };
        }
        let view = ansi::strip(block);
        let (spans, hold) = self.scan(&view.text, end, pem);
        let to_origin = |i: usize| view.origin(i);
        let consumed = hold.map_or(block.len(), to_origin);
        let touches_end = spans.last().is_some_and(|s| s.end >= view.text.len());
        let mapped: Vec<Span> = spans
            .iter()
            .map(|s| Span {
                start: to_origin(s.start),
                end: s.end.checked_sub(1).map_or(0, |last| view.origin(last) + 1),
                kind: s.kind,
            })
            .collect();
        write_spans(block, &mapped, consumed, out);
        Redacted {
            consumed,
            touches_end,
        }
    }

    /// Finds the spans to redact in `text`; in open mode also where to hold back from.
    fn scan(&self, text: &[u8], end: End, pem: &mut PemState) -> (Vec<Span>, Option<usize>) {
        let mut scan = Scan {
            text,
            open: end == End::Open,
            spans: Vec::new(),
            pem: *pem,
        };
        let mut pos = rules::pem_lines(&mut scan, 0);
        let mut wrap_hold = match end {
            End::Hard => None,
            End::Line | End::Open => self.wrap_from(text),
        };
        let mut hold = None;
        let mut next: Vec<Option<aho_corasick::Match>> = vec![None; self.groups.len()];
        let mut done = vec![false; self.groups.len()];
        while pos < text.len() {
            // The leftmost next hit over all groups; an earlier group wins a tie.
            let mut best: Option<(usize, aho_corasick::Match)> = None;
            for (i, group) in self.groups.iter().enumerate() {
                let (Some(slot), Some(finished)) = (next.get_mut(i), done.get_mut(i)) else {
                    continue;
                };
                if *finished {
                    continue;
                }
                if slot.is_none_or(|m| m.start() < pos) {
                    *slot = group.automaton.find(Input::new(text).range(pos..));
                    *finished = slot.is_none();
                }
                if let Some(hit) = *slot
                    && best.is_none_or(|(_, b)| hit.start() < b.start())
                {
                    best = Some((i, hit));
                }
            }
            let Some((group, hit)) = best else {
                break;
            };
            let trigger = self
                .groups
                .get(group)
                .and_then(|g| g.triggers.get(hit.pattern().as_usize()));
            let outcome = match trigger {
                Some(Trigger::Rule(rule)) => {
                    rules::validate(*rule, &mut scan, hit.start(), hit.end())
                }
                Some(Trigger::Held(i)) => match self.held.get(*i).map(|p| &p.encoding) {
                    Some(Encoding::Base64Half { core, offset }) => {
                        wrapped(&mut scan, core, *offset, hit.start(), &mut wrap_hold)
                    }
                    Some(encoding) => held(&mut scan, encoding, hit.start(), hit.end()),
                    None => Outcome::Skip,
                },
                None => Outcome::Skip,
            };
            match outcome {
                Outcome::Consumed(resume) => pos = resume.max(hit.start() + 1),
                Outcome::Skip => pos = hit.start() + 1,
                Outcome::NeedMore(from) => {
                    hold = Some(from);
                    break;
                }
            }
        }
        // Lines held back for wrapping that a key block took (its lines are redacted whole, and
        // its state must not be carried past them) are decided now.
        let wrap_hold = wrap_hold.filter(|&from| {
            scan.pem == PemState::Off
                && !scan
                    .spans
                    .iter()
                    .any(|s| s.end > from && (s.kind.is_empty() || s.kind == "private-key"))
        });
        let hold = match (hold, wrap_hold) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(from) = hold {
            scan.spans.retain(|s| s.end <= from);
        }
        // A rule may find a secret before its trigger (the AWS console CSV's password field):
        // spans are written in text order, and one inside an earlier one is dropped.
        scan.spans.sort_by_key(|s| s.start);
        *pem = scan.pem;
        (scan.spans, hold)
    }

    /// The first kind of credential found in `text`, if any.
    pub(super) fn first_kind(&self, text: &[u8]) -> Option<&'static str> {
        let mut pem = PemState::Off;
        let (spans, _) = self.scan(text, End::Hard, &mut pem);
        spans.iter().map(|s| s.kind).find(|k| !k.is_empty())
    }

    /// Where a secret could be starting at the end of `text`, if anywhere: the last word, when
    /// some suffix of it is a proper prefix of a trigger or held value or it holds a trigger;
    /// or further back, where a held value with spaces in it (a passphrase) began.
    pub(super) fn live_from(&self, text: &[u8]) -> Option<usize> {
        let word_start = text
            .iter()
            .rposition(|&b| rules::is_space(b))
            .map_or(0, |i| i + 1);
        let held_from = self
            .held
            .iter()
            .filter_map(|h| ends_with_start_of(text, &h.bytes).map(|k| text.len() - k))
            .min();
        let word = text.get(word_start..).unwrap_or_default();
        let word_live = !word.is_empty()
            && (self.groups.iter().any(|g| g.automaton.find(word).is_some())
                || rules::PREFIXES
                    .iter()
                    .map(|p| p.prefix.as_bytes())
                    .chain(rules::OTHER_TRIGGERS.iter().map(|(t, _)| t.as_bytes()))
                    .any(|pattern| ends_with_start_of(word, pattern).is_some()));
        match (word_live.then_some(word_start), held_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Where the last line of `text` starts, when it must wait for the next line: a line of
    /// wrapped base64 (nothing else after its indentation, at least [`WRAP_MIN`] characters)
    /// that ends with the start of a held value's base64 core, which the next line may go on.
    pub(super) fn wrap_from(&self, text: &[u8]) -> Option<usize> {
        let body = text.strip_suffix(b"\n")?;
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let start = memchr::memrchr(b'\n', body).map_or(0, |i| i + 1);
        let content = body.get(start..)?.trim_ascii_start();
        if content.len() < WRAP_MIN || !content.iter().all(|&b| rules::is_base64(b)) {
            return None;
        }
        let continues = self.held.iter().any(|p| match &p.encoding {
            Encoding::Base64Half { core, offset: 0 } => ends_with_start_of(content, core).is_some(),
            _ => false,
        });
        continues.then_some(start)
    }
}

/// Shortest line of wrapped base64 that waits for the next line (`base64` wraps at 76 columns,
/// PEM-style tools at 64).
const WRAP_MIN: usize = 40;

/// The length of the longest proper prefix of `pattern` that `text` ends with, if any: where a
/// match of `pattern` could be starting at the end of `text`.
fn ends_with_start_of(text: &[u8], pattern: &[u8]) -> Option<usize> {
    (1..pattern.len().min(text.len() + 1))
        .rev()
        .find(|&k| pattern.get(..k).is_some_and(|head| text.ends_with(head)))
}

/// What the rest of a held value's base64 core does around a half of it.
enum Across {
    /// It continues across one line break: the core spans `from..to`.
    Found { from: usize, to: usize },
    /// It does not (or not across a single break).
    NotFound,
    /// The text ends before it could be decided.
    Cut,
}

/// Half of a held value's base64 core matched at `start` (`offset` bytes into `core`): its
/// base64 run is redacted, and when the rest of the core lies across one line break (an encoding
/// wrapped in the middle), the run on the other side of the break too, line by line. A core that
/// reaches into the last line held back for wrapping (`wrap_hold`) moves the hold back to its
/// start: the two lines are decided together.
fn wrapped(
    scan: &mut Scan<'_>,
    core: &[u8],
    offset: usize,
    start: usize,
    wrap_hold: &mut Option<usize>,
) -> Outcome {
    let (from, to) = match across(scan, core, offset, start) {
        Across::NotFound => return held(scan, &Encoding::Base64Core, start, start + 1),
        Across::Cut => return Outcome::NeedMore(scan.run_back(start, rules::is_base64)),
        Across::Found { from, to } => (
            scan.run_back(from, rules::is_base64),
            scan.run(to, rules::is_base64),
        ),
    };
    if scan.cut(to) {
        return Outcome::NeedMore(from);
    }
    if let Some(hold) = wrap_hold
        && from < *hold
        && to > *hold
    {
        *hold = from;
    }
    let mut piece = from;
    while piece < to {
        let piece_end = scan.run(piece, |b| !rules::is_space(b)).min(to);
        scan.spans.push(Span {
            start: piece,
            end: piece_end,
            kind: "held-secret",
        });
        piece = scan.run(piece_end, rules::is_space).min(to);
    }
    Outcome::Consumed(to)
}

/// Follows `core` backwards and forwards from its byte `offset` at `start`, letting one line
/// break (a newline, perhaps after a carriage return, perhaps followed by indentation) interrupt it.
fn across(scan: &Scan<'_>, core: &[u8], offset: usize, start: usize) -> Across {
    let mut broken = false;
    let mut i = start;
    for &want in core.get(..offset).unwrap_or_default().iter().rev() {
        if scan.before(i) != Some(want) {
            let Some(j) = (!broken).then(|| break_before(scan, i)).flatten() else {
                return Across::NotFound;
            };
            broken = true;
            i = j;
            if scan.before(i) != Some(want) {
                return Across::NotFound;
            }
        }
        i -= 1;
    }
    let mut j = start;
    for &want in core.get(offset..).unwrap_or_default() {
        if scan.at(j) != Some(want) {
            if scan.cut(j) {
                return Across::Cut;
            }
            let Some(k) = (!broken).then(|| break_after(scan, j)).flatten() else {
                return Across::NotFound;
            };
            broken = true;
            j = k;
            if scan.at(j) != Some(want) {
                return if scan.cut(j) {
                    Across::Cut
                } else {
                    Across::NotFound
                };
            }
        }
        j += 1;
    }
    if broken {
        Across::Found { from: i, to: j }
    } else {
        Across::NotFound
    }
}

/// The end of the line before a line break that ends at `i` (indentation, `\n`, `\r`).
fn break_before(scan: &Scan<'_>, i: usize) -> Option<usize> {
    let mut k = i;
    while matches!(scan.before(k), Some(b' ' | b'\t')) {
        k -= 1;
    }
    if scan.before(k) != Some(b'\n') {
        return None;
    }
    k -= 1;
    if scan.before(k) == Some(b'\r') {
        k -= 1;
    }
    Some(k)
}

/// Where the next line's text starts after a line break at `j`; at the end of open text, the
/// end (so the caller sees a cut).
fn break_after(scan: &Scan<'_>, j: usize) -> Option<usize> {
    let mut k = j;
    if scan.at(k) == Some(b'\r') {
        k += 1;
    }
    if scan.cut(k) {
        return Some(k);
    }
    if scan.at(k) != Some(b'\n') {
        return None;
    }
    Some(scan.run(k + 1, |b| b == b' ' || b == b'\t'))
}

/// A held value's pattern matched: redact it, and for a base64 core the whole base64 run.
fn held(scan: &mut Scan<'_>, encoding: &Encoding, start: usize, end: usize) -> Outcome {
    let (from, to) = match encoding {
        Encoding::Exact => (start, end),
        Encoding::Base64Core | Encoding::Base64Half { .. } => {
            let from = scan.run_back(start, rules::is_base64);
            let to = scan.run(end, rules::is_base64);
            if scan.open && to >= scan.text.len() {
                return Outcome::NeedMore(from);
            }
            (from, to)
        }
    };
    scan.spans.push(Span {
        start: from,
        end: to,
        kind: "held-secret",
    });
    Outcome::Consumed(to)
}

/// Copies `block[..upto]` to `out`, replacing each span by its marker.
fn write_spans(block: &[u8], spans: &[Span], upto: usize, out: &mut Vec<u8>) {
    let mut at = 0;
    for span in spans {
        let (start, end) = (span.start, span.end.min(upto));
        if start < at || start >= upto {
            continue;
        }
        out.extend_from_slice(block.get(at..start).unwrap_or_default());
        if !span.kind.is_empty() {
            out.extend_from_slice(super::MARKER_PREFIX.as_bytes());
            out.extend_from_slice(span.kind.as_bytes());
            out.push(b']');
        }
        at = end.max(start);
    }
    out.extend_from_slice(block.get(at..upto).unwrap_or_default());
}
