//! What SILP draft -02 makes normative beyond the -00 text the validator follows. The
//! validator's own warnings are the reference implementation's, by -00, and stay as they are;
//! this module adds -02's, each prefixed with the revision and section it comes from
//! ([`revision_of`] tells them apart).
//!
//! §3.6 `seq` semantics: `meta.seq` is strict, unconditional serial order. `parallel`,
//! `sequential`, `reason_first` and `reason_last` are recognised tokens with no defined
//! behaviour; a payload that names `parallel`, `reason_first` or `reason_last` relies on
//! behaviour -02 does not give, so it is warned about, and nothing is ever reordered or run in
//! parallel because of it. `sequential` says what `seq` means anyway (the code frontend writes
//! it for `a -> b` chains), so it is not.

use super::ir::Ir;

/// The revision these warnings come from.
pub(crate) const REVISION: &str = "draft-02";
/// The revision of every other warning.
pub(crate) const BASE_REVISION: &str = "draft-00";

/// The keywords whose named behaviour -02 leaves undefined.
const UNDEFINED: [&str; 3] = ["parallel", "reason_first", "reason_last"];

/// -02's warnings about an IR.
pub(crate) fn warnings(ir: &Ir) -> Vec<String> {
    ir.meta
        .seq
        .iter()
        .filter(|item| UNDEFINED.contains(&item.as_str()))
        .map(|item| {
            format!(
                "{REVISION} §3.6: meta.seq names '{}', a keyword with no defined behaviour; seq is strict serial order, so the steps keep the order written and nothing runs in parallel or is reordered",
                item.as_str()
            )
        })
        .collect()
}

/// The draft revision a validator warning comes from.
pub(crate) fn revision_of(warning: &str) -> &'static str {
    if warning.starts_with(REVISION) { REVISION } else { BASE_REVISION }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::silp::{DecodeOptions, Frontend, decode};

    #[test]
    fn undefined_seq_keywords_are_warned_about_and_sequential_is_not() {
        let mut ir =
            decode("fetch(data) -> process(data)", Frontend::Code, &DecodeOptions::default()).unwrap().ir;
        assert_eq!(ir.meta.seq.len(), 1, "the code frontend writes 'sequential'");
        assert!(warnings(&ir).is_empty());
        ir.meta.seq.push("parallel".into());
        ir.meta.seq.push("reason_last".into());
        let found = warnings(&ir);
        assert_eq!(found.len(), 2);
        assert!(found[0].starts_with("draft-02 §3.6: meta.seq names 'parallel'"), "{found:?}");
        assert_eq!(revision_of(&found[1]), "draft-02");
        assert_eq!(revision_of("IR has no entities"), "draft-00");
    }
}
