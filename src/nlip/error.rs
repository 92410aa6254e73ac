//! Why an NLIP message was refused: the encoding, the envelope's shape, or a limit. Every error
//! names the path of the offending field (`submessages[2].format`) when there is one.

use std::fmt;

/// The class of an envelope error; its [`code`](NlipErrorKind::code) goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NlipErrorKind {
    /// The bytes are not JSON (or not CBOR) at all.
    InvalidEncoding,
    /// The document is JSON/CBOR but not an NLIP message.
    InvalidEnvelope,
    /// Larger than the configured byte limit.
    TooLarge,
    /// Nested deeper, or with more submessages, than the configured limits.
    TooComplex,
}

impl NlipErrorKind {
    pub(crate) fn code(self) -> &'static str {
        match self {
            NlipErrorKind::InvalidEncoding => "invalid_encoding",
            NlipErrorKind::InvalidEnvelope => "invalid_envelope",
            NlipErrorKind::TooLarge => "too_large",
            NlipErrorKind::TooComplex => "too_complex",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct NlipError {
    pub kind: NlipErrorKind,
    /// Path of the offending field, e.g. `submessages[2].format`.
    pub path: Option<String>,
    pub message: String,
}

impl NlipError {
    pub(crate) fn new(kind: NlipErrorKind, message: impl Into<String>) -> Self {
        NlipError { kind, path: None, message: message.into() }
    }

    pub(crate) fn at(kind: NlipErrorKind, path: impl Into<String>, message: impl Into<String>) -> Self {
        NlipError { kind, path: Some(path.into()), message: message.into() }
    }

    pub(crate) fn envelope(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::at(NlipErrorKind::InvalidEnvelope, path, message)
    }
}

impl fmt::Display for NlipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: {path}: {}", self.kind.code(), self.message),
            None => write!(f, "{}: {}", self.kind.code(), self.message),
        }
    }
}
