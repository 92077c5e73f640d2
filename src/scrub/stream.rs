//! Streaming redaction whose output does not depend on how the input was cut into writes.
//!
//! Input is decided in blocks that end at a newline. A line longer than [`BLOCK`] is cut every
//! [`BLOCK`] bytes from its start — positions that depend on the content only — and a candidate
//! touching such a cut is redacted together with the first word after it (fail closed). An idle
//! flush releases what is decided and holds back a live candidate instead of half of it. Memory
//! is bounded by about two blocks.

use super::Scrubber;
use super::engine::{End, Engine};
use super::rules::PemState;

/// Longest run of bytes decided at once when no newline arrives.
pub(super) const BLOCK: usize = 64 * 1024;

/// A streaming redactor; see the module documentation for its guarantees.
pub struct ScrubStream {
    scrubber: Scrubber,
    pending: Vec<u8>,
    pem: PemState,
    /// A forced cut redacted through its end: what follows continues that redaction.
    carry: Option<Carry>,
}

/// How far a redaction carried over a forced cut reaches into the next block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carry {
    /// To the end of the first word.
    Word,
    /// To this closing quote (a quoted value with spaces in it), or the line's end.
    Until(u8),
}

impl std::fmt::Debug for ScrubStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrubStream")
            .field("pending_bytes", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl ScrubStream {
    pub(super) fn new(scrubber: Scrubber) -> Self {
        Self {
            scrubber,
            pending: Vec::new(),
            pem: PemState::Off,
            carry: None,
        }
    }

    /// Bytes taken but not yet decided (bounded by one block plus the last write).
    pub fn held_back(&self) -> usize {
        self.pending.len()
    }

    /// Takes more input; appends to `out` whatever can be decided already.
    pub fn write(&mut self, input: &[u8], out: &mut Vec<u8>) {
        // Nothing new can be decided until a newline arrives or a block fills: small writes into
        // a long line cost their own length, not another look at everything pending.
        if !self.pending.is_empty()
            && self.pending.len() + input.len() < BLOCK
            && memchr::memchr(b'\n', input).is_none()
        {
            self.pending.extend_from_slice(input);
            return;
        }
        let engine = self.scrubber.snapshot();
        if self.pending.is_empty() {
            let used = self.drain(&engine, input, out);
            self.pending
                .extend_from_slice(input.get(used..).unwrap_or_default());
            return;
        }
        self.pending.extend_from_slice(input);
        let pending = std::mem::take(&mut self.pending);
        let used = self.drain(&engine, &pending, out);
        self.pending = pending;
        self.pending.drain(..used);
    }

    /// The input went quiet: release what is decided, holding back a candidate that the next
    /// bytes could complete. Holding never exceeds [`BLOCK`] bytes.
    pub fn flush_idle(&mut self, out: &mut Vec<u8>) {
        if self.pending.is_empty() {
            return;
        }
        let engine = self.scrubber.snapshot();
        let pending = std::mem::take(&mut self.pending);
        let start = self.leading_carry(&pending, out);
        let rest = pending.get(start..).unwrap_or_default();
        let tail_from = engine.live_from(rest).unwrap_or(rest.len());
        let mut pem = self.pem;
        let decided = rest.get(..tail_from).unwrap_or_default();
        let result = engine.redact(decided, End::Open, &mut pem, out);
        self.pem = pem;
        self.pending = rest.get(result.consumed..).unwrap_or_default().to_vec();
    }

    /// End of input: everything pending is decided as if followed by a newline.
    pub fn finish(mut self, out: &mut Vec<u8>) {
        let engine = self.scrubber.snapshot();
        let pending = std::mem::take(&mut self.pending);
        let start = self.leading_carry(&pending, out);
        let rest = pending.get(start..).unwrap_or_default();
        engine.redact(rest, End::Hard, &mut self.pem, out);
    }

    /// Decides whole blocks of `buf`; returns how many bytes were used.
    fn drain(&mut self, engine: &Engine, buf: &[u8], out: &mut Vec<u8>) -> usize {
        let mut pos = 0;
        loop {
            let rest = buf.get(pos..).unwrap_or_default();
            let window = rest.get(..BLOCK.min(rest.len())).unwrap_or_default();
            if let Some(newline) = memchr::memrchr(b'\n', window) {
                let block = window.get(..=newline).unwrap_or_default();
                let skip = self.leading_carry(block, out);
                let body = block.get(skip..).unwrap_or_default();
                // A last line of wrapped base64 may wait for the next line (`End::Line`).
                let mut pem = self.pem;
                let mut decided = Vec::new();
                let result = engine.redact(body, End::Line, &mut pem, &mut decided);
                if result.consumed > 0 {
                    out.extend_from_slice(&decided);
                    self.pem = pem;
                    pos += skip + result.consumed;
                    continue;
                }
                // All of the block waits: for more input, unless the next line is here already
                // and only the block's size kept it out (a pair of lines over [`BLOCK`]).
                let after = rest.get(newline + 1..).unwrap_or_default();
                if body.is_empty() || memchr::memchr(b'\n', after).is_none() {
                    return pos + skip;
                }
                engine.redact(body, End::Hard, &mut self.pem, out);
                pos += newline + 1;
            } else if rest.len() >= BLOCK {
                self.forced_cut(engine, window, out);
                pos += BLOCK;
            } else {
                return pos;
            }
        }
    }

    /// Decides a full block without a newline; a live candidate at its end is redacted through
    /// the cut, and the first word after the cut is redacted too.
    fn forced_cut(&mut self, engine: &Engine, window: &[u8], out: &mut Vec<u8>) {
        let skip = self.leading_carry(window, out);
        let body = window.get(skip..).unwrap_or_default();
        let mut scratch = Vec::with_capacity(body.len());
        let result = engine.redact(body, End::Open, &mut self.pem, &mut scratch);
        let undecided = body.get(result.consumed..).unwrap_or_default();
        let live_from = engine.live_from(body);
        let live = result.touches_end || !undecided.is_empty() || live_from.is_some();
        if live {
            // Redact from the held candidate (or the last word) to the cut.
            let word_start = body
                .iter()
                .rposition(|&b| b.is_ascii_whitespace())
                .map_or(0, |i| i + 1);
            let cut_from = result
                .consumed
                .min(word_start)
                .min(live_from.unwrap_or(body.len()));
            let mut pem = PemState::Off;
            let mut decided = Vec::new();
            engine.redact(
                body.get(..cut_from).unwrap_or_default(),
                End::Hard,
                &mut pem,
                &mut decided,
            );
            out.extend_from_slice(&decided);
            out.extend_from_slice(b"[redacted:truncated]");
            self.carry = Some(
                open_quote(body.get(cut_from..).unwrap_or_default())
                    .map_or(Carry::Word, Carry::Until),
            );
        } else {
            out.extend_from_slice(&scratch);
        }
    }

    /// After a forced cut that redacted through its end, the first word (or the rest of an open
    /// quoted value) continues the secret. Returns how many bytes of `buf` it takes.
    fn leading_carry(&mut self, buf: &[u8], out: &mut Vec<u8>) -> usize {
        let Some(carry) = self.carry.take() else {
            return 0;
        };
        let (end, goes_on) = match carry {
            Carry::Word => {
                let word_end = buf.iter().position(|&b| b.is_ascii_whitespace());
                let word = buf.get(..word_end.unwrap_or(buf.len())).unwrap_or_default();
                // A quote opened in that word (`="pass phrase"` right after the cut): to its end.
                match (open_quote(word), word_end) {
                    (Some(quote), from) => {
                        let from = from.unwrap_or(buf.len());
                        let end = buf
                            .iter()
                            .skip(from)
                            .position(|&b| b == quote || b == b'\n')
                            .map(|n| n + from);
                        (end, Carry::Until(quote))
                    }
                    (None, end) => (end, Carry::Word),
                }
            }
            Carry::Until(quote) => (buf.iter().position(|&b| b == quote || b == b'\n'), carry),
        };
        let taken = end.unwrap_or(buf.len());
        // Nothing ended it in this buffer: a quoted value goes on; a word goes on only when
        // the buffer is a whole block (more of the same line follows).
        if end.is_none() && (goes_on != Carry::Word || buf.len() >= BLOCK) {
            self.carry = Some(goes_on);
        }
        if taken > 0 {
            out.extend_from_slice(b"[redacted:truncated]");
        }
        taken
    }
}

/// The quote a redacted candidate left open at a cut: the last `"` or `'` (not backslash-escaped)
/// that has no partner after it.
fn open_quote(text: &[u8]) -> Option<u8> {
    let mut open: Option<u8> = None;
    let mut escaped = false;
    for &b in text {
        match (open, b) {
            (_, b'\\') if !escaped => {
                escaped = true;
                continue;
            }
            (None, b'"' | b'\'') if !escaped => open = Some(b),
            (Some(q), b) if b == q && !escaped => open = None,
            _ => {}
        }
        escaped = false;
    }
    open
}
