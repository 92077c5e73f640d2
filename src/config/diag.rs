//! Diagnostics with file:line:column. They carry messages and positions, never source text: a
//! config line may hold the very credential being refused.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One problem in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file.
    pub path: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong; never contains a value from the file.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at byte offset `span.start` of `text`.
    pub(super) fn at(path: &Path, text: &str, span: Option<Range<usize>>, message: String) -> Self {
        let offset = span.map_or(0, |s| s.start).min(text.len());
        let before = text.get(..offset).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
        Diagnostic {
            path: path.to_owned(),
            line,
            column,
            message,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: error: {}",
            self.path.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// Strips the value out of a serde message (`invalid type: string "x", expected …` →
/// `invalid type, expected …`), so no diagnostic repeats what the file held.
pub(super) fn without_values(message: &str) -> String {
    for head in [
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ] {
        if message.starts_with(head) {
            return match message.find(", expected") {
                Some(i) => format!("{head}{}", message.get(i..).unwrap_or_default()),
                None => head.to_owned(),
            };
        }
    }
    message.to_owned()
}
