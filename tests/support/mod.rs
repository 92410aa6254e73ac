//! Shared test support.

pub mod agents;
pub mod broker;
pub mod gateway;
pub mod process;
