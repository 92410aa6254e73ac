//! The A2A protocol (1.0, JSON-RPC binding) as silpgate speaks it both ways: as a client of
//! A2A agents ([`crate::connectors::a2a`]) and as an A2A agent itself ([`crate::doors::a2a`]).
//! Both send the same version and map NLIP messages the same way ([`map`]); both also speak
//! A2A 0.3 to those that do, translating its shapes at the edge ([`v0_3`]).

pub(crate) mod map;
pub(crate) mod signature;
pub(crate) mod v0_3;

/// The protocol version silpgate speaks, sent in the `A2A-Version` header.
pub(crate) const VERSION: &str = "1.0";
