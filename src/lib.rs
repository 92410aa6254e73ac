//! silpgate: a gateway that carries SILP payloads inside NLIP envelopes between AI agents.
//!
//! Layout:
//! - [`silp`]: the payload codec (IR, schema, validator, sanitiser, frontends). Knows nothing
//!   about envelopes or transports.
//! - [`cli`]: the `silpgate` command line.

pub mod cli;
pub mod silp;
