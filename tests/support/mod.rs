//! Shared test support.

pub mod agents;
pub mod broker;
pub mod broker_cluster;
pub mod cluster;
pub mod gateway;
pub mod otlp;
pub mod process;
pub mod random;
pub mod raw_http;
