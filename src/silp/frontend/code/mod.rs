//! The code frontend: the IR as Python-like calls, e.g.
//! `if !rain(t+1): start(hike) else: start(cards@indoor)` (draft §4.1). Lossless.

pub mod lexical;
pub mod read;
pub mod write;
