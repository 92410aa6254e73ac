//! `meta.req_id` of a decoded IR: a prefix of the SHA-256 of the payload text.
//!
//! The draft says implementations MUST default to 8 hex characters; the reference uses 4 and
//! hashes slightly different text (see [`ReqIdMode::Reference`]).

use super::ir::Text;
use sha2::{Digest, Sha256};

/// How a decoded IR's request id is derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqIdMode {
    /// The first `len` (4..=8) hex characters of the SHA-256 of the whole payload, trimmed.
    Hash { len: usize },
    /// Exactly the reference's: 4 hex characters; the code frontend hashes the trimmed text
    /// without its else branch, the json frontend the raw text.
    Reference,
}

impl Default for ReqIdMode {
    fn default() -> Self {
        ReqIdMode::Hash { len: 8 }
    }
}

/// Accepted lengths for [`ReqIdMode::Hash`].
pub(crate) const LENGTHS: std::ops::RangeInclusive<usize> = 4..=8;

/// The first `len` (4..=8) hex characters of the SHA-256 of `text`.
pub(crate) fn req_id(text: &str, len: usize) -> Text {
    let digest = Sha256::digest(text.as_bytes());
    let len = len.clamp(*LENGTHS.start(), *LENGTHS.end());
    let mut hex = Text::with_capacity(len);
    for b in digest.iter().take(len.div_ceil(2)) {
        hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    hex.truncate(len);
    hex
}
