//! The ground floor every layer may stand on, and that stands on nothing of silpgate's: hashing,
//! the clock, JSON text writing, and retry backoff.

pub mod backoff;
pub mod hash;
pub mod json_text;
pub mod time;
