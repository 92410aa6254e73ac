//! Shared test support.

pub mod broker;
