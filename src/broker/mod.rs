//! The AMQP 0-9-1 wire that the AMQP door, the AMQP agent connector and cluster mode share:
//! the broker nodes and the order they are tried in ([`addresses`]), publishing with confirms
//! ([`publish`]), the NLIP AMQP binding on message properties ([`properties`]), the topology
//! silpgate declares ([`topology`]), what the connection can do right now ([`health`],
//! [`majority`]), which connection is up, as the rest of silpgate sees it ([`link`]),
//! which reply addresses a producer may name ([`reply_rule`]), and the one loop that keeps a
//! connection up for whoever holds one of its own ([`supervise`]).

pub(crate) mod addresses;
pub(crate) mod ending;
pub(crate) mod health;
pub(crate) mod link;
pub(crate) mod majority;
pub mod properties;
pub mod publish;
pub(crate) mod reply_rule;
pub(crate) mod supervise;
pub mod topology;
