//! Which frontend a receiving agent gets: the first of the route's override, the agent's
//! profile, the IR's explicit `meta.out` and the configured default, degraded along
//! `code -> json -> natural` when the agent does not accept it.

use super::envelope::ChoiceReason;
use crate::silp::Frontend;

/// The degradation chain of draft §5.3 (without the undefined "math").
const CHAIN: [Frontend; 3] = [Frontend::Code, Frontend::Json, Frontend::Natural];

/// A frontend decision and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub frontend: Frontend,
    pub reason: ChoiceReason,
    pub degraded_from: Option<Frontend>,
}

/// Chooses the frontend for an agent that accepts `accepted` (most preferred first; `None`:
/// no profile, accepts anything).
pub fn choose(
    route_override: Option<Frontend>,
    accepted: Option<&[Frontend]>,
    meta_out: Option<Frontend>,
    default: Frontend,
) -> Choice {
    let (wanted, reason) = if let Some(f) = route_override {
        (f, ChoiceReason::RouteOverride)
    } else if let Some(&f) = accepted.and_then(|a| a.first()) {
        (f, ChoiceReason::AgentProfile)
    } else if let Some(f) = meta_out {
        (f, ChoiceReason::IrMetaOut)
    } else {
        (default, ChoiceReason::ConfiguredDefault)
    };
    let accepts = |f: Frontend| accepted.is_none_or(|a| a.contains(&f));
    if accepts(wanted) {
        return Choice { frontend: wanted, reason, degraded_from: None };
    }
    let start = CHAIN.iter().position(|f| *f == wanted).unwrap_or(CHAIN.len() - 1);
    // Natural language is plain NLIP text: every NLIP agent reads it, so it ends the chain.
    let frontend = CHAIN[start..].iter().copied().find(|f| accepts(*f)).unwrap_or(Frontend::Natural);
    Choice { frontend, reason, degraded_from: Some(wanted) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Frontend::*;

    #[test]
    fn the_first_decider_wins() {
        assert_eq!(
            choose(Some(Json), Some(&[Code, Json]), Some(Natural), Code).reason,
            ChoiceReason::RouteOverride
        );
        let c = choose(None, Some(&[Json, Code]), Some(Natural), Code);
        assert_eq!((c.frontend, c.reason), (Json, ChoiceReason::AgentProfile));
        let c = choose(None, None, Some(Natural), Code);
        assert_eq!((c.frontend, c.reason), (Natural, ChoiceReason::IrMetaOut));
        let c = choose(None, None, None, Json);
        assert_eq!((c.frontend, c.reason), (Json, ChoiceReason::ConfiguredDefault));
    }

    #[test]
    fn unaccepted_frontends_degrade_along_the_chain() {
        let c = choose(Some(Code), Some(&[Natural, Json]), None, Code);
        assert_eq!((c.frontend, c.degraded_from), (Json, Some(Code)));
        let c = choose(Some(Code), Some(&[Natural]), None, Code);
        assert_eq!((c.frontend, c.degraded_from), (Natural, Some(Code)));
        let c = choose(Some(NlJson), Some(&[Code]), None, Code);
        assert_eq!((c.frontend, c.degraded_from), (Natural, Some(NlJson)));
        let c = choose(Some(Json), Some(&[Code]), None, Code);
        assert_eq!((c.frontend, c.degraded_from), (Natural, Some(Json)));
    }
}
