//! `[[routes]]`: which messages go where, and what is done to their SILP payloads on the way.

use super::optional_frontend_rule;
use crate::silp::Frontend;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// A name for logs and traces.
    pub name: String,
    /// What a message must look like to take this route; an empty match takes everything.
    #[serde(default, rename = "match")]
    pub matcher: RouteMatch,
    /// The agent to send to, or `reply` to answer the sender.
    pub destination: String,
    /// What to do with SILP payloads on this route.
    pub mode: RouteMode,
    /// Send this frontend, overriding the agent's profile and the IR's `meta.out`; or
    /// `fewest-tokens`, the accepted frontend that costs the agent the fewest tokens.
    #[serde(default, deserialize_with = "optional_frontend_rule")]
    pub frontend: Option<FrontendRule>,
    /// Let `fewest-tokens` pick the lossy baselines (`natural`, `nl_json`) too. Default false.
    #[serde(default)]
    pub allow_lossy: bool,
    /// Whether an HTTP or WebSocket caller waits for the agent's answer (`reply`, the
    /// default) or only for the delivery to be confirmed (`none`: HTTP 202 with a control
    /// message naming the outbound message id).
    #[serde(default, rename = "await")]
    pub wait: AwaitMode,
    /// Who answers the sender: `gateway` (the default: the agent answers silpgate, which
    /// counts, checks and transcodes the answer for the sender) or `direct` (the sender's
    /// reply addresses travel to the agent, which answers the sender itself; AMQP only).
    #[serde(default)]
    pub replies: RepliesMode,
}

/// What an HTTP or WebSocket caller waits for on a route to an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AwaitMode {
    #[default]
    Reply,
    None,
}

/// Who an agent answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepliesMode {
    #[default]
    Gateway,
    Direct,
}

/// Conditions of a route; all given ones must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteMatch {
    /// The source (queue, listener) the message came from.
    pub source: Option<String>,
    /// The label of a SILP submessage.
    pub label: Option<String>,
    /// The message's `messagetype` (case-insensitive).
    pub messagetype: Option<String>,
    /// The SILP intent, e.g. `!BOOK`.
    pub intent: Option<String>,
    /// The IR's `meta.next_agent`.
    pub next_agent: Option<String>,
}

/// A configured frontend: a fixed one, or the one with the fewest tokens for the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendRule {
    Fixed(Frontend),
    FewestTokens,
}

impl std::str::FromStr for FrontendRule {
    type Err = crate::silp::SilpError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "fewest-tokens" {
            return Ok(FrontendRule::FewestTokens);
        }
        s.parse().map(FrontendRule::Fixed)
    }
}

/// What a route does to SILP payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteMode {
    /// IR -> the chosen surface frontend.
    Encode,
    /// Surface -> IR.
    Decode,
    /// Surface -> the chosen (other) surface frontend.
    Transcode,
    /// Check the payload and forward it unchanged.
    Validate,
}
