//! Held secrets: the exact value of each, and the encodings it is likely to appear in — percent-
//! and form-encoded (either hex case), hex, JSON-escaped (short escapes or `\u00XX`), base64 at
//! every alignment.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

/// How a held secret's pattern relates to the value.
#[derive(Clone)]
pub(super) enum Encoding {
    /// The bytes themselves, percent-encoded or JSON-escaped: the match is the secret.
    Exact,
    /// The stable middle of its base64 encoding at one alignment: redact the whole base64 run.
    Base64Core,
    /// The first or the second half of a base64 core, `offset` bytes into `core`. A line wrap
    /// (`base64` wraps at 76 columns, PEM-style tools at 64) can split the core anywhere, and
    /// whichever side of one break is longer holds one half whole: the half finds the core, and
    /// the rest of it is looked for across the break.
    Base64Half {
        core: Zeroizing<Vec<u8>>,
        offset: usize,
    },
}

/// One pattern derived from a held secret.
#[derive(Clone)]
pub(super) struct HeldPattern {
    pub(super) bytes: Zeroizing<Vec<u8>>,
    pub(super) encoding: Encoding,
}

/// Shortest base64 core worth matching: shorter cores would hit unrelated base64 text.
const MIN_CORE: usize = 6;

/// Every pattern by which `value` can be recognised in output.
pub(super) fn patterns(value: &[u8]) -> Vec<HeldPattern> {
    let mut out: Vec<HeldPattern> = Vec::new();
    let mut push = |bytes: Zeroizing<Vec<u8>>, encoding: Encoding| {
        if !out.iter().any(|p| *p.bytes == *bytes) {
            out.push(HeldPattern { bytes, encoding });
        }
    };
    push(Zeroizing::new(value.to_vec()), Encoding::Exact);
    for alpha in [b'A', b'a'] {
        push(percent_encode(value, alpha, false), Encoding::Exact);
        push(percent_encode(value, alpha, true), Encoding::Exact);
        push(hex(value, alpha), Encoding::Exact);
        push(json_unicode(value, alpha), Encoding::Exact);
    }
    push(json_escape(value), Encoding::Exact);
    for align in 0..3 {
        for core in base64_cores(value, align) {
            if core.len() >= 2 * MIN_CORE {
                let half = core.len().div_ceil(2);
                for offset in [0, core.len() - half] {
                    let bytes = core.get(offset..offset + half).unwrap_or_default();
                    push(
                        Zeroizing::new(bytes.to_vec()),
                        Encoding::Base64Half {
                            core: core.clone(),
                            offset,
                        },
                    );
                }
            }
            if core.len() >= MIN_CORE {
                push(core, Encoding::Base64Core);
            }
        }
    }
    out
}

/// The base64 characters that encode `value` whatever precedes it, when `align` bytes of unknown
/// content precede it modulo 3 (as in `user:value` of HTTP Basic auth). Both the standard and the
/// URL-safe alphabet are returned.
fn base64_cores(value: &[u8], align: usize) -> Vec<Zeroizing<Vec<u8>>> {
    let mut padded = Zeroizing::new(vec![0u8; align]);
    padded.extend_from_slice(value);
    let encoded = Zeroizing::new(STANDARD.encode(&*padded).into_bytes());
    // Characters that mix filler bits with value bits are unstable: drop the first group's
    // leading characters when filler precedes, and the trailing partial group.
    let lead = match align {
        0 => 0,
        1 => 2,
        _ => 3,
    };
    let full_groups = padded.len() / 3;
    let stable_end = full_groups * 4;
    let Some(core) = encoded.get(lead..stable_end) else {
        return Vec::new();
    };
    let standard = Zeroizing::new(core.to_vec());
    let url_safe = Zeroizing::new(
        core.iter()
            .map(|&b| match b {
                b'+' => b'-',
                b'/' => b'_',
                other => other,
            })
            .collect::<Vec<u8>>(),
    );
    vec![standard, url_safe]
}

/// Percent-encoding with hex letters from `alpha`; `form` writes a space as `+`
/// (`application/x-www-form-urlencoded`).
fn percent_encode(value: &[u8], alpha: u8, form: bool) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * 3));
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else if form && b == b' ' {
            out.push(b'+');
        } else {
            out.push(b'%');
            out.push(hex_digit(b >> 4, alpha));
            out.push(hex_digit(b & 0xf, alpha));
        }
    }
    out
}

/// Every byte as two hex digits (`xxd -p`, `od`, hex dumps in logs).
fn hex(value: &[u8], alpha: u8) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * 2));
    for &b in value {
        out.push(hex_digit(b >> 4, alpha));
        out.push(hex_digit(b & 0xf, alpha));
    }
    out
}

/// JSON with every byte that is not a letter or digit written `\u00XX` (encoders that escape
/// HTML-sensitive or all punctuation).
fn json_unicode(value: &[u8], alpha: u8) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * 6));
    for &b in value {
        if b.is_ascii_alphanumeric() || b >= 0x80 {
            out.push(b);
        } else {
            out.extend_from_slice(b"\\u00");
            out.push(hex_digit(b >> 4, alpha));
            out.push(hex_digit(b & 0xf, alpha));
        }
    }
    out
}

fn json_escape(value: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() + 8));
    for &b in value {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(hex_digit(b >> 4, b'a'));
                out.push(hex_digit(b & 0xf, b'a'));
            }
            _ => out.push(b),
        }
    }
    out
}

/// One hex digit for a nibble, letters from `alpha` (`b'a'` or `b'A'`).
fn hex_digit(nibble: u8, alpha: u8) -> u8 {
    if nibble < 10 {
        b'0' + nibble
    } else {
        alpha + nibble - 10
    }
}
