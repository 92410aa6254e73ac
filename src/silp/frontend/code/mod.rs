//! The code frontend: the IR as Python-like calls, e.g.
//! `if !rain(t+1): start(hike) else: start(cards@indoor)` (draft §4.1). Lossless.

pub(crate) mod lexical;
pub(crate) mod read;
pub(crate) mod write;
