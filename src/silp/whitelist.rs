//! The verb whitelist of draft §3.8: the 13 approved single-token verbs and the two excluded
//! multi-token verbs with the replacement the reference suggests.

/// Approved verbs, in the reference registry's order.
pub const APPROVED: [&str; 13] = [
    "CANCEL",
    "START",
    "EMAIL",
    "FETCH",
    "PROCESS",
    "TRANSLATE",
    "BOOK",
    "ROUTE",
    "SEARCH",
    "UPDATE",
    "SUGGEST",
    "SWITCH",
    "NOTIFY",
];

/// Excluded verbs and the replacement named in the validator's hint. `RAISE` is itself not
/// approved; the reference says so too.
pub const EXCLUDED: [(&str, &str); 2] = [("SWITCH_TOOL", "SWITCH"), ("ESCALATE", "RAISE")];

/// True when `verb` (without `!`) is approved.
pub(crate) fn is_approved(verb: &str) -> bool {
    APPROVED.contains(&verb)
}

/// The replacement for an excluded verb.
pub(crate) fn replacement(verb: &str) -> Option<&'static str> {
    EXCLUDED.iter().find(|(v, _)| *v == verb).map(|(_, r)| *r)
}
