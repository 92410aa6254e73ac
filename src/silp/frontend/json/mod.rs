//! The json frontend: the IR as one flat JSON object of semantic slots (draft §4.2),
//! `{"intent":..,<id>:<value>..,"action_<verb>":[values..],"constraints":[..],"alternatives":[..]}`.

pub(crate) mod read;
pub(crate) mod write;

pub(crate) use read::read;
pub(crate) use write::compile;

/// Slot names that an entity id must not take in the flat form.
pub(crate) const RESERVED_SLOTS: [&str; 4] = ["intent", "constraints", "alternatives", "entities"];
/// Keys of secondary actions: `action_email` holds the values of `!EMAIL`.
pub(crate) const ACTION_PREFIX: &str = "action_";
