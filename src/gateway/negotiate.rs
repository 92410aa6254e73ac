//! `//ping` frontend negotiation (draft §5.3, whose message format is left open; ours is in
//! docs/protocol.md).
//!
//! Request: a `control` message whose content is `//ping`, with a `structured`/`json`
//! submessage `{"silp": "v1", "frontends": [..], "agent"?: ".."}` listing the sender's
//! frontends, most preferred first. Answer: a `control` message whose content is
//! `{"silp": "v1", "frontends": [..], "preferred": ".."}`: silpgate's frontends and the first of
//! the sender's that silpgate also speaks.

use super::error::GatewayError;
use crate::nlip::{Content, Format, Message};
use crate::silp::{Frontend, ir::SILP_VERSION};
use serde_json::{Value, json};

pub const PING: &str = "//ping";

/// True for a `//ping` request.
pub fn is_ping(message: &Message) -> bool {
    message.is_control() && message.content.as_str().is_some_and(|c| c.trim() == PING)
}

/// What a `//ping` announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// The agent the profile belongs to, when the sender named one.
    pub agent: Option<String>,
    /// The announced frontends silpgate knows, in the sender's order.
    pub frontends: Vec<Frontend>,
}

/// Reads the announcement of a `//ping` request.
pub fn announcement(message: &Message) -> Result<Announcement, GatewayError> {
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
            return Err(GatewayError::Ping(format!(
                "silp version '{other}' is not supported; use '{SILP_VERSION}'"
            )));
        }
        None => return Err(GatewayError::Ping("missing \"silp\": \"v1\"".into())),
    }
    let names = body
        .get("frontends")
        .and_then(Value::as_array)
        .ok_or_else(|| GatewayError::Ping("\"frontends\" must be an array of frontend names".into()))?;
    let frontends =
        names.iter().filter_map(Value::as_str).filter_map(|n| n.parse::<Frontend>().ok()).collect();
    let agent = body.get("agent").and_then(Value::as_str).map(str::to_owned);
    Ok(Announcement { agent, frontends })
}

/// The answer to a `//ping`.
pub fn answer(announced: &Announcement) -> Result<Message, GatewayError> {
    let preferred = announced.frontends.first().ok_or_else(|| {
        GatewayError::Ping(
            "none of the announced frontends is one silpgate speaks (code, json, natural, nl_json)".into(),
        )
    })?;
    let ours: Vec<&str> = Frontend::ALL.iter().map(|f| f.name()).collect();
    let content = json!({ "silp": SILP_VERSION, "frontends": ours, "preferred": preferred.name() });
    Ok(Message::new(Format::Structured, "json", Content::Json(content)).with_messagetype("control"))
}
