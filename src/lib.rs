//! silpgate: a gateway that carries SILP payloads inside NLIP envelopes between AI agents.
//!
//! Three layers, one direction (wire -> envelope -> payload), none reaching two layers down:
//! - [`silp`]: the payload codec (IR, schema, validator, sanitiser, frontends). Knows nothing
//!   about envelopes or transports.
//! - [`nlip`]: the envelope layer (message model, JSON and CBOR, tokens, error messages).
//! - [`gateway`]: the transport-free core that decides, for one envelope, what goes out where;
//!   with its storage interface. [`store`]: that interface's durable implementation, in sled.
//!
//! Around the core, one path for every message:
//! - [`doors`]: where messages come in (the AMQP consumer, the HTTP and WebSocket server);
//! - [`intake`]: the one path every door hands its messages to: core, state, delivery,
//!   and agents' answers back to the asker;
//! - [`connectors`]: how envelopes reach agents (AMQP, HTTP, WebSocket, A2A, MCP), behind one
//!   trait;
//! - [`broker`]: the AMQP wire the door, the AMQP connector and cluster mode share;
//!   [`websocket`]: the WebSocket client wire the WebSocket connector and the stream door
//!   share; [`a2a`]: the A2A protocol, which the A2A connector and the A2A door both speak;
//! - [`cluster`]: cluster mode, state replication between instances through the broker.
//!
//! And: [`code`] (the error codes silpgate says, with their HTTP statuses, in one table),
//! [`transport`] (the transports silpgate speaks, in and out, by one name each),
//! [`principal`] (who sends a message, and who may reach which agent),
//! [`config`] (the TOML configuration), [`cli`] (the command line), [`daemon`]
//! (`silpgate run`), [`telemetry`] and [`metrics`], and [`util`], the ground floor.

#![warn(unreachable_pub)]

pub(crate) mod a2a;
pub mod broker;
pub mod cli;
pub mod cluster;
pub(crate) mod code;
pub mod config;
pub(crate) mod connectors;
pub mod daemon;
pub mod doors;
pub mod gateway;
pub(crate) mod intake;
pub mod metrics;
pub mod nlip;
pub mod principal;
pub(crate) mod reload;
pub mod silp;
pub mod store;
pub(crate) mod telemetry;
pub mod transport;
pub mod util;
pub(crate) mod websocket;
