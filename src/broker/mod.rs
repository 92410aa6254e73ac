//! The AMQP 0-9-1 wire that the AMQP door, the AMQP agent connector and cluster mode share:
//! the broker nodes and the order they are tried in ([`addresses`]), publishing with confirms
//! ([`publish`]), the NLIP AMQP binding on message properties ([`properties`]), the topology
//! silpgate declares ([`topology`]), what the connection can do right now ([`health`],
//! [`majority`]), and which connection is up, as the rest of silpgate sees it ([`link`]).

pub mod addresses;
pub mod ending;
pub mod health;
pub mod link;
pub mod majority;
pub mod properties;
pub mod publish;
pub mod topology;
