//! PEM private-key blocks: multi-line (indented too, four or five dashes, any case), flattened or
//! escaped on one line, base64-wrapped; and PuTTY's private-key lines.

use super::value::*;
use super::*;

pub(super) fn pem_begin(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    let line_end = scan.line_end(start);
    let Some(close) = find(scan.bytes(end, line_end.min(end + 64)), b"----").map(|n| end + n)
    else {
        return if scan.cut(line_end) {
            Outcome::NeedMore(start)
        } else {
            Outcome::Skip
        };
    };
    let label = scan.bytes(end, close).to_ascii_uppercase();
    if !(label.ends_with(b"PRIVATE KEY") || label == b"PGP PRIVATE KEY BLOCK") {
        return Outcome::Skip;
    }
    let body = scan.run(close, |b| b == b'-');
    let rest = scan.bytes(body, line_end);
    if rest.iter().all(|&b| is_space(b)) {
        if scan.cut(line_end) {
            return Outcome::NeedMore(start);
        }
        scan.pem = PemState::Armored { marked: false };
        return Outcome::Consumed(pem_lines(scan, line_end + 1));
    }
    // Armour on one line: JSON-escaped (`\n`) or otherwise flattened.
    if let Some(end_marker) = end_line(rest).map(|n| body + n) {
        scan.push(body, end_marker, "private-key");
        return Outcome::Consumed(end_marker);
    }
    if scan.cut(line_end) {
        return Outcome::NeedMore(start);
    }
    let stop = (body..line_end)
        .find(|&k| scan.at(k) == Some(b'"') && scan.before(k) != Some(b'\\'))
        .unwrap_or(line_end);
    scan.push(body, trim_end(scan, body, stop), "private-key");
    Outcome::Consumed(stop)
}

/// Where the `----END` armour line starts in `text` (four or five dashes, any case).
fn end_line(text: &[u8]) -> Option<usize> {
    let at = find(text, b"----END ").or_else(|| find(text, b"----end "))?;
    Some(if at > 0 && text.get(at - 1) == Some(&b'-') {
        at - 1
    } else {
        at
    })
}

/// PuTTY's key files (`.ppk`): `Private-Lines: N` and then N lines of the private key.
pub(super) fn putty_private(scan: &mut Scan<'_>, start: usize, end: usize) -> Outcome {
    let line_end = scan.line_end(start);
    if scan.cut(line_end) {
        return Outcome::NeedMore(start);
    }
    let count = scan.bytes(end, line_end).trim_ascii();
    let Some(left) = std::str::from_utf8(count)
        .ok()
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|&n| n > 0)
    else {
        return Outcome::Skip;
    };
    scan.pem = PemState::Counted {
        left,
        marked: false,
    };
    Outcome::Consumed(pem_lines(scan, line_end + 1))
}

/// Redacts key-block lines from `from` while [`PemState`] is on; returns where scanning resumes.
///
/// The first body line becomes the marker and later body lines are deleted, so the output is the
/// same whether the block arrives in one write or line by line.
pub(in super::super) fn pem_lines(scan: &mut Scan<'_>, mut from: usize) -> usize {
    const MAX_LINE: usize = 4096;
    while from < scan.text.len() && scan.pem != PemState::Off {
        let line_end = scan.line_end(from);
        let line = scan.bytes(from, line_end);
        // Indented armour (YAML block scalars, Helm values) keeps its indentation.
        let indent = line
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        let body = line.get(indent..).unwrap_or_default();
        let ends_block = match scan.pem {
            PemState::Armored { .. } => {
                end_line(body).is_some() || !armour_body(body) || line.len() > MAX_LINE
            }
            PemState::Base64 => {
                line.is_empty() || !line.iter().all(|&b| is_base64(b) || b == b'\r')
            }
            PemState::Counted { .. } => {
                body.is_empty() || !body.iter().all(|&b| is_base64(b) || b == b'\r')
            }
            PemState::Off => true,
        };
        if ends_block {
            scan.pem = PemState::Off;
            return from;
        }
        let last_base64 = scan.pem == PemState::Base64 && line.contains(&b'=');
        match scan.pem {
            PemState::Armored { marked: false } | PemState::Counted { marked: false, .. } => {
                scan.push(from + indent, line_end, "private-key");
            }
            _ => {
                let with_newline = (line_end + 1).min(scan.text.len());
                scan.spans.push(Span {
                    start: from,
                    end: with_newline,
                    kind: "",
                });
            }
        }
        scan.pem = match scan.pem {
            PemState::Armored { .. } => PemState::Armored { marked: true },
            PemState::Counted { left, .. } if left > 1 => PemState::Counted {
                left: left - 1,
                marked: true,
            },
            PemState::Counted { .. } => PemState::Off,
            PemState::Base64 if last_base64 => PemState::Off,
            other => other,
        };
        from = line_end + 1;
    }
    from.min(scan.text.len())
}

/// A line that can sit inside PEM armour: base64, blank, or an RFC 1421 header.
pub(super) fn armour_body(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|&b| is_base64(b)) {
        return true;
    }
    let name_end = line.iter().position(|&b| b == b':').unwrap_or(0);
    name_end > 0
        && line
            .get(..name_end)
            .is_some_and(|n| n.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-'))
}

pub(super) fn pem_base64(scan: &mut Scan<'_>, start: usize) -> Outcome {
    const MAX_DECODE: usize = 16 * 1024;
    let from = scan.run_back(start, is_base64);
    let to = scan.run(start, is_base64);
    if scan.cut(to) {
        return Outcome::NeedMore(from);
    }
    let head: Vec<u8> = scan
        .bytes(from, to.min(from + MAX_DECODE))
        .iter()
        .copied()
        .filter(|&b| b != b'=')
        .collect();
    let usable = head.len() / 4 * 4;
    let decoded = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        head.get(..usable).unwrap_or_default(),
    )
    .unwrap_or_default();
    if find(&decoded, b"PRIVATE KEY").is_none() {
        return Outcome::Skip;
    }
    scan.push(from, to, "private-key");
    let line_end = scan.line_end(to);
    if to == line_end && line_end < scan.text.len() && to - from >= 60 {
        // Wrapped base64 (`base64` wraps at 76 columns): following base64 lines belong to it.
        scan.pem = PemState::Base64;
        return Outcome::Consumed(pem_lines(scan, line_end + 1));
    }
    Outcome::Consumed(to)
}
