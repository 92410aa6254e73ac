//! Shared test support.

pub mod agents;
pub mod broker;
pub mod process;
