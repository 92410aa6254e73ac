//! Which frontend a receiving agent gets: the first of the route's override, the agent's
//! profile, the IR's explicit `meta.out` and the configured default, degraded along
//! `code -> json -> natural` when the agent does not accept it; or, for `fewest-tokens`, the
//! accepted frontend that costs the receiving model the fewest tokens.

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
pub(crate) fn choose(
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

/// The frontends `fewest-tokens` weighs, in the order that breaks a tie: lossless first.
const BY_PREFERENCE: [Frontend; 4] = [Frontend::Code, Frontend::Json, Frontend::Natural, Frontend::NlJson];

/// Among the frontends the agent accepts (`None`: any), the lossless ones and, when
/// `allow_lossy`, the natural-language baselines, the one with the fewest `tokens`; a tie goes
/// to the earlier of code, json, natural, nl_json. `None` when no candidate is accepted.
pub fn fewest_tokens(
    accepted: Option<&[Frontend]>,
    allow_lossy: bool,
    mut tokens: impl FnMut(Frontend) -> usize,
) -> Option<Choice> {
    BY_PREFERENCE
        .into_iter()
        .filter(|f| allow_lossy || f.is_lossless())
        .filter(|f| accepted.is_none_or(|a| a.contains(f)))
        .map(|f| (tokens(f), f))
        .min_by_key(|(n, _)| *n)
        .map(|(_, frontend)| Choice { frontend, reason: ChoiceReason::FewestTokens, degraded_from: None })
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

    #[test]
    fn fewest_tokens_weighs_only_what_the_agent_accepts_and_breaks_ties_lossless_first() {
        let costs = |f: Frontend| match f {
            Code => 9,
            Json => 7,
            Natural => 5,
            NlJson => 7,
        };
        let pick =
            |accepted: Option<&[Frontend]>, lossy| fewest_tokens(accepted, lossy, costs).map(|c| c.frontend);
        assert_eq!(pick(None, false), Some(Json));
        assert_eq!(pick(None, true), Some(Natural));
        assert_eq!(pick(Some(&[Code, Natural]), false), Some(Code));
        assert_eq!(pick(Some(&[Natural, NlJson]), false), None);
        assert_eq!(pick(Some(&[NlJson, Json]), true), Some(Json), "a tie goes to the lossless frontend");
        assert_eq!(fewest_tokens(None, false, |_| 3).map(|c| c.frontend), Some(Code));
        assert_eq!(fewest_tokens(None, false, costs).unwrap().reason, ChoiceReason::FewestTokens);
    }
}
