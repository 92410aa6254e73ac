//! `//ping` frontend negotiation (draft §5.3, whose message format is left open; ours is in
//! docs/protocol.md).
//!
//! Request: a `control` message whose content is `//ping`, with a `structured`/`json`
//! submessage `{"silp": "v1", "frontends": [..], "agent"?: "..", "tokenizer"?: ".."}` listing
//! the sender's frontends, most preferred first, and the tokenizer of its model. Answer: a `control` message whose content is
//! `{"silp": "v1", "frontends": [..], "preferred": ".."}`: silpgate's frontends and the first of
//! the sender's that silpgate also speaks.

use super::error::GatewayError;
use crate::nlip::{Content, Format, Message};
use crate::silp::tokens::Tokenizer;
use crate::silp::{Frontend, ir::SILP_VERSION};
use serde_json::{Value, json};

pub(crate) const PING: &str = "//ping";

/// Longest agent name a `//ping` may store a profile under, in bytes.
pub(crate) const MAX_AGENT_NAME_BYTES: usize = 128;
/// Most agent profiles learnt from `//ping` kept at once; the sweep forgets idle ones.
pub(crate) const MAX_PROFILES: usize = 1024;
/// Characters of an unsupported `silp` version quoted back in the refusal.
const MAX_QUOTED_VERSION: usize = 16;

/// True for a `//ping` request.
pub(crate) fn is_ping(message: &Message) -> bool {
    message.is_control() && message.content.as_str().is_some_and(|c| c.trim() == PING)
}

/// What a `//ping` announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// The agent the profile belongs to, when the sender named one.
    pub agent: Option<String>,
    /// The announced frontends silpgate knows, in the sender's order.
    pub frontends: Vec<Frontend>,
    /// The tokenizer of the sender's model, when it named one.
    pub tokenizer: Option<Tokenizer>,
}

/// Reads the announcement of a `//ping` request.
pub(crate) fn announcement(message: &Message) -> Result<Announcement, GatewayError> {
    let body = message
        .submessages()
        .iter()
        .find(|s| s.format == Format::Structured && s.subformat.eq_ignore_ascii_case("json"))
        .and_then(|s| match &s.content {
            Content::Json(Value::Object(o)) => Some(o),
            _ => None,
        })
        .ok_or_else(|| {
            GatewayError::Ping(
                "expected a structured/json submessage {\"silp\": \"v1\", \"frontends\": [...]}".into(),
            )
        })?;
    match body.get("silp").and_then(Value::as_str) {
        Some(SILP_VERSION) => {}
        Some(other) => {
            let mut quoted: String = other.chars().take(MAX_QUOTED_VERSION).collect();
            if quoted.len() < other.len() {
                quoted.push('…');
            }
            return Err(GatewayError::Ping(format!(
                "silp version '{quoted}' is not supported; use '{SILP_VERSION}'"
            )));
        }
        None => return Err(GatewayError::Ping("missing \"silp\": \"v1\"".into())),
    }
    let names = body
        .get("frontends")
        .and_then(Value::as_array)
        .ok_or_else(|| GatewayError::Ping("\"frontends\" must be an array of frontend names".into()))?;
    let mut frontends: Vec<Frontend> = Vec::with_capacity(Frontend::ALL.len());
    for frontend in names.iter().filter_map(Value::as_str).filter_map(|n| n.parse::<Frontend>().ok()) {
        if !frontends.contains(&frontend) {
            frontends.push(frontend);
        }
    }
    let agent = body.get("agent").and_then(Value::as_str).map(str::to_owned);
    // A named tokenizer silpgate cannot count with is refused rather than ignored: the agent
    // would otherwise believe its payloads are chosen by its tokens.
    let tokenizer = match body.get("tokenizer") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => {
            Some(name.parse::<Tokenizer>().map_err(|e| GatewayError::Ping(format!("\"tokenizer\": {e}")))?)
        }
        Some(_) => return Err(GatewayError::Ping("\"tokenizer\" must be a tokenizer name".into())),
    };
    Ok(Announcement { agent, frontends, tokenizer })
}

/// Checks the name a profile is stored under: every ping stores one, so its size is bounded
/// (the name itself is not quoted back: it may be huge).
pub(crate) fn check_agent_name(agent: &str) -> Result<(), GatewayError> {
    if agent.is_empty() || agent.len() > MAX_AGENT_NAME_BYTES || agent.chars().any(char::is_control) {
        return Err(GatewayError::Ping(format!(
            "the agent name is {} bytes; it must be 1..={MAX_AGENT_NAME_BYTES} bytes without control characters",
            agent.len()
        )));
    }
    Ok(())
}

/// The answer to a `//ping`.
pub(crate) fn reply_to_ping(announced: &Announcement) -> Result<Message, GatewayError> {
    let preferred = announced.frontends.first().ok_or_else(|| {
        GatewayError::Ping(
            "none of the announced frontends is one silpgate speaks (code, json, natural, nl_json)".into(),
        )
    })?;
    let ours: Vec<&str> = Frontend::ALL.iter().map(|f| f.name()).collect();
    let content = json!({ "silp": SILP_VERSION, "frontends": ours, "preferred": preferred.name() });
    Ok(Message::new(Format::Structured, "json", Content::Json(content)).with_messagetype("control"))
}
