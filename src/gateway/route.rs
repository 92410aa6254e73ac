//! Routing: the first configured route whose conditions all hold decides where a message goes
//! and what happens to its SILP payloads.

use crate::config::{RouteConfig, RouteMatch};

/// What a route is matched against.
pub(crate) struct RouteFacts<'a> {
    pub source: &'a str,
    pub messagetype: Option<&'a str>,
    /// Labels of the SILP submessages.
    pub labels: Vec<&'a str>,
    /// Intent of the first SILP payload.
    pub intent: Option<&'a str>,
    /// `meta.next_agent` of the first SILP payload.
    pub next_agent: Option<&'a str>,
}

/// The first route that matches.
pub(crate) fn select<'r>(routes: &'r [RouteConfig], facts: &RouteFacts<'_>) -> Option<&'r RouteConfig> {
    routes.iter().find(|r| matches(&r.matcher, facts))
}

fn matches(m: &RouteMatch, facts: &RouteFacts<'_>) -> bool {
    let source = m.source.as_deref().is_none_or(|s| s == facts.source);
    let messagetype =
        m.messagetype.as_deref().is_none_or(|t| facts.messagetype.is_some_and(|f| f.eq_ignore_ascii_case(t)));
    let label = m.label.as_deref().is_none_or(|l| facts.labels.contains(&l));
    let intent = m.intent.as_deref().is_none_or(|i| facts.intent == Some(i));
    let next_agent = m.next_agent.as_deref().is_none_or(|a| facts.next_agent == Some(a));
    source && messagetype && label && intent && next_agent
}
