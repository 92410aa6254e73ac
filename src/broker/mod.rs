//! The AMQP 0-9-1 wire that the AMQP door, the AMQP agent connector and cluster mode share:
//! publishing with confirms ([`publish`]), the NLIP AMQP binding on message properties
//! ([`properties`]), and the topology silpgate declares ([`topology`]).

pub mod ending;
pub mod properties;
pub mod publish;
pub mod topology;
