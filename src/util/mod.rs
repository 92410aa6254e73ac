//! The ground floor every layer may stand on, and that stands on nothing of silpgate's: hashing,
//! the clock, JSON text writing, retry backoff, unguessable tokens, the stop signal and which
//! characters are invisible.

pub mod backoff;
pub mod hash;
pub mod json_text;
pub mod shutdown;
pub mod time;
pub mod token;
pub mod unicode;
