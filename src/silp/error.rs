//! The SILP error type: every failure of the payload layer, with the draft's error code, the
//! byte span of the offending input and a message that says what was expected.
//!
//! Spans are byte offsets into the text the caller passed in. Line and column are computed only
//! when an error is rendered for a person ([`SilpError::render`]), as the toml and serde_json
//! parsers do.

use std::fmt;
use std::ops::Range;

/// The payload-decode error codes of the SILP draft (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The payload does not conform to the frontend's syntax.
    InvalidSyntax,
    /// The `silp` version is not one this receiver speaks.
    UnsupportedVersion,
    /// The frontend is unknown, or cannot do what was asked (decode of a baseline).
    UnsupportedFrontend,
    /// The text parsed but does not describe a valid IR (bad action code, schema violation).
    DecodeFailed,
    /// A session or request exceeded its time limit.
    Timeout,
    /// The session id is no longer valid.
    SessionExpired,
}

impl ErrorCode {
    /// The wire spelling of the code, as in the draft's Table 10.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidSyntax => "invalid_syntax",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnsupportedFrontend => "unsupported_frontend",
            ErrorCode::DecodeFailed => "decode_failed",
            ErrorCode::Timeout => "timeout",
            ErrorCode::SessionExpired => "session_expired",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One SILP failure: code, where, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SilpError {
    pub code: ErrorCode,
    /// Byte range of the offending input, when the error is about a place in a text.
    pub span: Option<Range<usize>>,
    pub message: String,
}

impl SilpError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        SilpError { code, span: None, message: message.into() }
    }

    pub(crate) fn at(code: ErrorCode, span: Range<usize>, message: impl Into<String>) -> Self {
        SilpError { code, span: Some(span), message: message.into() }
    }

    pub(crate) fn syntax(span: Range<usize>, message: impl Into<String>) -> Self {
        Self::at(ErrorCode::InvalidSyntax, span, message)
    }

    /// Renders the error for a person: the message, then `line:column`, the offending line and
    /// a caret under the span.
    pub fn render(&self, source: &str) -> String {
        let mut out = format!("error[{}]: {}", self.code, self.message);
        let Some(span) = &self.span else { return out };
        let start = floor_char_boundary(source, span.start.min(source.len()));
        let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..].find('\n').map_or(source.len(), |i| start + i);
        let line_no = source[..start].matches('\n').count() + 1;
        let column = source[line_start..start].chars().count() + 1;
        let line = &source[line_start..line_end];
        let end = floor_char_boundary(source, span.end.clamp(start, line_end));
        let width = source[start..end].chars().count().max(1);
        let gutter = line_no.to_string().len();
        out.push_str(&format!(
            "\n{:gutter$}--> {line_no}:{column}\n{:gutter$} |\n{line_no} | {line}\n{:gutter$} | {}{}",
            "",
            "",
            "",
            " ".repeat(column - 1),
            "^".repeat(width),
        ));
        out
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_points_a_caret_at_the_span() {
        let err = SilpError::syntax(7..9, "expected '('");
        let text = "cancel(x)\nemail ab";
        let err = SilpError { span: Some(16..18), ..err };
        assert_eq!(
            err.render(text),
            "error[invalid_syntax]: expected '('\n --> 2:7\n  |\n2 | email ab\n  |       ^^"
        );
    }
}
