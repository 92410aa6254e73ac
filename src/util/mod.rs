//! The ground floor every layer may stand on, and that stands on nothing of silpgate's: hashing,
//! the clock, JSON text writing, public keys of JWK sets, retry backoff, unguessable tokens, the stop signal and which
//! characters are invisible.

pub(crate) mod backoff;
pub mod hash;
pub mod json_text;
pub(crate) mod jwk;
pub(crate) mod shutdown;
pub(crate) mod time;
pub(crate) mod token;
pub(crate) mod unicode;
