//! Turns arbitrary bytes into text that is safe to type into a terminal pane.
//!
//! Typed text reaches a shell or an agent's input line, so anything a terminal interprets is
//! taken out. What is **removed** (never refused; the count is reported):
//!
//! - escape sequences whole: CSI (`ESC [ … final`, including the bracketed-paste markers
//!   `ESC[200~` / `ESC[201~` that would let text end a paste early), OSC/DCS/SOS/PM/APC strings
//!   up to their terminator, and two-byte `ESC x` sequences;
//! - C0 controls other than newline and tab (NUL, BEL, BS, VT, FF, a lone CR, …) and DEL;
//!   `CR LF` becomes `LF` (a lone CR would press Enter);
//! - C1 controls (U+0080–U+009F, including the 8-bit CSI U+009B);
//! - bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069) that reorder what a
//!   reader sees;
//! - bytes that are not valid UTF-8.

/// Sanitised text and how many units were taken out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sanitized {
    /// Text with only printable characters, newlines and tabs.
    pub text: String,
    /// Escape sequences, control characters and invalid bytes removed.
    pub removed: usize,
}

const ESC: char = '\u{1b}';

/// Sanitises `input` for typing into a pane.
pub fn sanitize(input: &[u8]) -> Sanitized {
    let mut removed = 0;
    let mut valid = String::with_capacity(input.len());
    for chunk in input.utf8_chunks() {
        valid.push_str(chunk.valid());
        if !chunk.invalid().is_empty() {
            removed += 1;
        }
    }
    let mut text = String::with_capacity(valid.len());
    let mut chars = valid.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => text.push(c),
            '\r' if chars.peek() == Some(&'\n') => {}
            ESC => {
                removed += 1;
                skip_escape(&mut chars);
            }
            c if c.is_control() || is_bidi_control(c) => removed += 1,
            c => text.push(c),
        }
    }
    Sanitized { text, removed }
}

fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Consumes the rest of an escape sequence whose ESC was just read.
fn skip_escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    match chars.next() {
        Some('[') => {
            // Parameters and intermediates (0x20–0x3F), then one final byte (0x40–0x7E).
            while let Some(&c) = chars.peek() {
                if ('\u{20}'..='\u{3f}').contains(&c) {
                    chars.next();
                } else {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        chars.next();
                    }
                    break;
                }
            }
        }
        Some(']' | 'P' | 'X' | '^' | '_') => {
            // A string: up to BEL or ST (`ESC \`).
            while let Some(c) = chars.next() {
                if c == '\u{7}' {
                    break;
                }
                if c == ESC {
                    if chars.peek() == Some(&'\\') {
                        chars.next();
                    }
                    break;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitiser_table() {
        let cases: &[(&[u8], &str, usize)] = &[
            (
                b"plain text\nsecond line\tcol",
                "plain text\nsecond line\tcol",
                0,
            ),
            (b"\x1b[31mred\x1b[0m", "red", 2),
            (b"paste\x1b[201~; rm -rf ~\x1b[200~", "paste; rm -rf ~", 2),
            (b"title\x1b]0;pwned\x07done", "titledone", 1),
            (b"osc\x1b]8;;http://x\x1b\\link", "osclink", 1),
            (b"dcs\x1bPq#0;2;0;0;0\x1b\\end", "dcsend", 1),
            (b"nul\x00bell\x07bs\x08", "nulbellbs", 3),
            (b"crlf\r\nlone\rcr", "crlf\nlonecr", 1),
            (b"del\x7f", "del", 1),
            ("c1\u{9b}31m".as_bytes(), "c131m", 1),
            ("bidi\u{202e}txt\u{2066}".as_bytes(), "biditxt", 2),
            (b"bad\xff\xfeutf8", "badutf8", 2),
            (b"\x1bcreset", "reset", 1),
            ("unicode ✓ ünïcødé".as_bytes(), "unicode ✓ ünïcødé", 0),
        ];
        for (input, text, removed) in cases {
            let out = sanitize(input);
            assert_eq!(out.text, *text, "input {input:?}");
            assert_eq!(out.removed, *removed, "input {input:?}");
        }
    }

    #[test]
    fn output_never_holds_controls_other_than_newline_and_tab() {
        let mut input = Vec::new();
        for b in 0u8..=255 {
            input.extend_from_slice(&[b, b'x', 0x1b, b, b'[', b]);
        }
        let out = sanitize(&input);
        assert!(
            out.text
                .chars()
                .all(|c| c == '\n' || c == '\t' || !c.is_control())
        );
        assert!(!out.text.contains('\u{1b}'));
    }
}
