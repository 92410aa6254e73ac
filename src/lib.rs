//! silpgate: a gateway that carries SILP payloads inside NLIP envelopes between AI agents.
//!
//! Three layers, one direction (wire -> envelope -> payload), none reaching two layers down:
//! - [`silp`]: the payload codec (IR, schema, validator, sanitiser, frontends). Knows nothing
//!   about envelopes or transports.
//! - [`nlip`]: the envelope layer (message model, JSON and CBOR, tokens, error messages).
//! - [`gateway`]: the transport-free core that decides, for one envelope, what goes out where;
//!   with its storage interface.
//! - [`store`]: the durable implementation of the core's storage interface, in sled.
//! - [`transport`]: the HTTP and WebSocket front door; [`daemon`]: `silpgate run`.
//! - [`config`]: the TOML configuration; [`cli`]: the command line.

pub mod cli;
pub mod config;
pub mod connectors;
pub mod daemon;
pub mod gateway;
pub mod intake;
pub mod metrics;
pub mod nlip;
pub mod silp;
pub mod store;
pub mod telemetry;
pub mod transport;
