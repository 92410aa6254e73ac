//! The json frontend: the IR as one flat JSON object of semantic slots (draft §4.2),
//! `{"intent":..,<id>:<value>..,"action_<verb>":[values..],"constraints":[..],"alternatives":[..]}`.

pub mod read;
pub mod write;

pub use read::read;
pub use write::compile;

/// Slot names that an entity id must not take in the flat form.
pub const RESERVED_SLOTS: [&str; 4] = ["intent", "constraints", "alternatives", "entities"];
/// Keys of secondary actions: `action_email` holds the values of `!EMAIL`.
pub const ACTION_PREFIX: &str = "action_";
