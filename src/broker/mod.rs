//! The AMQP 0-9-1 wire that the AMQP door, the AMQP agent connector and cluster mode share:
//! the broker nodes and the order they are tried in ([`addresses`]), publishing with confirms
//! ([`publish`]), the NLIP AMQP binding on message properties ([`properties`]), the topology
//! silpgate declares ([`topology`]), and what the connection can do right now ([`health`],
//! [`majority`]).

pub mod addresses;
pub mod ending;
pub mod health;
pub mod majority;
pub mod properties;
pub mod publish;
pub mod topology;
