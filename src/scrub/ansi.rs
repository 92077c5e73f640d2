//! A view of text with terminal escape sequences taken out, so a colour code before or inside a
//! token does not hide it. Positions in the view map back to the original bytes.

/// Text without escape sequences, and where each run of it came from in the original.
pub(super) struct View {
    pub(super) text: Vec<u8>,
    /// `(view_start, original_start)` of each copied run, in order.
    runs: Vec<(usize, usize)>,
    original_len: usize,
}

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;

impl View {
    /// The original index of view index `i`; the view's end maps to the original's end.
    pub(super) fn origin(&self, i: usize) -> usize {
        if i >= self.text.len() {
            return self.original_len;
        }
        let run = self.runs.partition_point(|&(view, _)| view <= i);
        self.runs
            .get(run.wrapping_sub(1))
            .map_or(self.original_len, |&(view, original)| original + (i - view))
    }
}

/// Builds the escape-free view of `input`.
///
/// Recognised: CSI (`ESC [` parameters, intermediates, final byte), OSC/DCS/SOS/PM/APC strings
/// (ended by BEL or `ESC \`, or by a newline so a broken sequence cannot swallow a block), and
/// two-byte `ESC x` sequences. An escape cut off by the end of input is dropped from the view.
pub(super) fn strip(input: &[u8]) -> View {
    let mut text = Vec::with_capacity(input.len());
    let mut runs = Vec::new();
    let mut i = 0;
    while i < input.len() {
        let rest = input.get(i..).unwrap_or_default();
        let run_end = memchr::memchr(ESC, rest).map_or(input.len(), |n| i + n);
        if run_end > i {
            runs.push((text.len(), i));
            text.extend_from_slice(input.get(i..run_end).unwrap_or_default());
        }
        i = if run_end < input.len() {
            skip_escape(input, run_end)
        } else {
            run_end
        };
    }
    View {
        text,
        runs,
        original_len: input.len(),
    }
}

/// Returns the index just past the escape sequence that starts at `start` (an ESC byte).
fn skip_escape(input: &[u8], start: usize) -> usize {
    let Some(&kind) = input.get(start + 1) else {
        return start + 1;
    };
    match kind {
        b'[' => {
            let mut i = start + 2;
            while let Some(&b) = input.get(i) {
                i += 1;
                if (0x40..=0x7e).contains(&b) {
                    return i;
                }
                if !(0x20..=0x3f).contains(&b) {
                    // Not a valid CSI byte: end the sequence before it.
                    return i - 1;
                }
            }
            i
        }
        b']' | b'P' | b'X' | b'^' | b'_' => {
            let mut i = start + 2;
            while let Some(&b) = input.get(i) {
                match b {
                    BEL => return i + 1,
                    b'\n' => return i,
                    ESC if input.get(i + 1) == Some(&b'\\') => return i + 2,
                    _ => i += 1,
                }
            }
            i
        }
        b'\n' => start + 1,
        _ => start + 2,
    }
}
