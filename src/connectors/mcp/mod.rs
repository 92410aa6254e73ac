//! Tools that speak MCP (streamable HTTP), reached with the official Rust SDK (`rmcp`) as the
//! client. The first call meets the server: `server/discover` at MCP 2026-07-28, after which
//! every request is self-contained and there is no session; a server of the handshake era
//! answers the probe with an error, and is met with `initialize` instead (one session per
//! agent). Either way the meeting is repeated after a connection broke, and no standing event
//! stream is kept ([`posts_only`]). Each parcel is one `tools/call` of the agent's `tool`; its arguments are the
//! agent's fixed `arguments` plus the SILP wrapper of draft -02 §7.2:
//! - `silp_encoding`: `code`, `json` or `ir` for the envelope's SILP part (the first, in the
//!   message's own content or a submessage), `natural` when it carries none;
//! - `silp_payload`: that part as text: the code, the JSON frontend's text, the IR's JSON
//!   text, or the natural-language text.
//!
//! A session renewal notice travels in the call's `_meta`, as `silp/renewal`; the tool is never
//! called for a notice alone.
//!
//! The result is the answer: `structuredContent` that is itself a SILP wrapper becomes that
//! SILP part (`silp-code`, `silp-json`, `silp-ir`, or English text); other structured content
//! becomes `structured`/`json`; otherwise the content blocks become the parts, in order (text
//! as English text, anything else as its JSON). `isError` makes it an NLIP error
//! `mcp_tool_error` carrying the tool's text. A connection failure, a timeout or the JSON-RPC
//! internal error is transient (the session is opened again next time); another JSON-RPC error
//! (an unknown tool, arguments the tool's schema refuses) is the tool refusing the message
//! (`mcp_refused`).

mod posts_only;

use super::{Connector, Delivered, DeliveryError, Parcel, SetupError};
use crate::code::Code;
use crate::config::McpReach;
use crate::gateway::session::is_renewal_notice;
use crate::nlip::reply::{Location, error_message};
use crate::nlip::{Content, Format, Message, Submessage};
use futures_util::future::BoxFuture;
use posts_only::PostsOnly;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::{Map, Value};
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore};

/// The `_meta` key of a session renewal notice.
const RENEWAL_META: &str = "silp/renewal";

/// The JSON-RPC internal error: the server failed, not the message.
const INTERNAL_ERROR: i32 = -32603;

/// One MCP tool server, and the tool each envelope calls.
pub(crate) struct McpAgent {
    name: String,
    url: String,
    tool: String,
    arguments: Map<String, Value>,
    client: reqwest::Client,
    timeout: Duration,
    session: Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    slots: Semaphore,
    /// Answers are held to these, as any inbound message.
    limits: crate::nlip::Limits,
}

impl McpAgent {
    pub(crate) fn new(name: &str, reach: &McpReach, limits: crate::nlip::Limits) -> Result<Self, SetupError> {
        let agent = &reach.outbound;
        reqwest::Url::parse(&agent.url)
            .map_err(|e| SetupError::Client { agent: name.to_owned(), detail: format!("url: {e}") })?;
        Ok(McpAgent {
            name: name.to_owned(),
            url: agent.url.clone(),
            tool: reach.tool.clone(),
            arguments: reach.arguments.clone(),
            // Every call is bounded by `timeout` here, and the client keeps no other stream.
            client: super::http::streaming_client(name, agent)?,
            timeout: Duration::from_millis(agent.timeout_ms.max(1)),
            session: Mutex::new(None),
            slots: Semaphore::new(agent.max_in_flight.max(1)),
            limits,
        })
    }

    fn unavailable(&self, code: &'static str, detail: String) -> DeliveryError {
        DeliveryError::Unavailable { agent: self.name.clone(), code, detail }
    }

    /// The session's peer, opening the session when there is none (or it closed).
    async fn peer(&self) -> Result<Peer<RoleClient>, DeliveryError> {
        let mut session = self.session.lock().await;
        if let Some(open) = session.as_ref().filter(|s| !s.is_closed()) {
            return Ok(open.peer().clone());
        }
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str());
        let transport = StreamableHttpClientTransport::with_client(PostsOnly(self.client.clone()), config);
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("silpgate", env!("CARGO_PKG_VERSION")),
        );
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        let opened = tokio::time::timeout(self.timeout, info.serve_with_lifecycle(transport, lifecycle))
            .await
            .map_err(|_| {
                self.unavailable(
                    Code::Timeout.as_str(),
                    "meeting the MCP server (server/discover, else initialize) did not finish within timeout_ms".into(),
                )
            })?
            .map_err(|e| self.unavailable(Code::AgentUnavailable.as_str(), format!("meeting the MCP server: {e}")))?;
        let peer = opened.peer().clone();
        *session = Some(opened);
        Ok(peer)
    }

    /// Forgets a session that failed, so that the next call opens a new one.
    async fn drop_session(&self) {
        if let Some(old) = self.session.lock().await.take() {
            // Closing tells the server the session is over; a broken one may not hear it.
            let _ = tokio::time::timeout(Duration::from_secs(1), old.cancel()).await;
        }
    }

    /// The span of one `tools/call`, as the OpenTelemetry GenAI conventions for MCP clients
    /// name it (docs/operations.md says which version): `tools/call {tool}`, with the method,
    /// the tool, the protocol version the server met us at and the conversation.
    fn span(&self, peer: &Peer<RoleClient>, envelope: &Message) -> tracing::Span {
        let url = reqwest::Url::parse(&self.url).ok();
        let version = peer.peer_info().map(|info| info.protocol_version.to_string());
        tracing::info_span!(
            "agent deliver",
            otel.name = %format!("tools/call {}", self.tool),
            otel.kind = "client",
            mcp.method.name = "tools/call",
            mcp.protocol.version = version.as_deref(),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %self.tool,
            gen_ai.conversation.id = envelope.conversation_token(),
            network.transport = "tcp",
            network.protocol.name = "http",
            server.address = url.as_ref().and_then(|u| u.host_str()).unwrap_or_default(),
            server.port = url.as_ref().and_then(reqwest::Url::port_or_known_default),
            silpgate.agent = %self.name,
            error.type = tracing::field::Empty,
        )
    }

    /// The tools the server lists (`silpgate agents check`).
    pub(crate) async fn tools(&self) -> Result<Vec<Value>, DeliveryError> {
        let peer = self.peer().await?;
        let listed = tokio::time::timeout(self.timeout, peer.list_all_tools())
            .await
            .map_err(|_| {
                self.unavailable(Code::Timeout.as_str(), "tools/list did not finish within timeout_ms".into())
            })?
            .map_err(|e| self.unavailable(Code::AgentUnavailable.as_str(), format!("tools/list: {e}")))?;
        Ok(listed.iter().filter_map(|t| serde_json::to_value(t).ok()).collect())
    }

    /// One `tools/call` for one parcel; its result as the NLIP answer.
    async fn call(&self, parcel: &Parcel) -> Result<Message, DeliveryError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let mut arguments = self.arguments.clone();
        let (encoding, payload) = wrapper(&parcel.envelope);
        arguments.insert("silp_encoding".into(), Value::String(encoding.into()));
        arguments.insert("silp_payload".into(), Value::String(payload));
        let mut params = CallToolRequestParams::new(self.tool.clone()).with_arguments(arguments);
        if let Some(notice) = parcel.envelope.submessages().iter().find(|s| is_renewal_notice(s)) {
            let mut meta = Map::new();
            meta.insert(
                RENEWAL_META.into(),
                notice.content.json().map(|v| v.into_owned()).unwrap_or_default(),
            );
            params.meta = Some(meta.into());
        }
        let peer = self.peer().await?;
        let span = self.span(&peer, &parcel.envelope);
        let called = tokio::time::timeout(
            self.timeout,
            tracing::Instrument::instrument(peer.call_tool(params), span.clone()),
        )
        .await
        .map_err(|_| {
            self.unavailable(Code::Timeout.as_str(), "tools/call did not finish within timeout_ms".into())
        });
        if called.is_err() {
            span.record("error.type", Code::Timeout.as_str());
        }
        let result = match called? {
            Ok(result) => result,
            Err(ServiceError::McpError(error)) if error.code.0 != INTERNAL_ERROR => {
                span.record("error.type", error.code.0.to_string());
                let detail =
                    format!("tools/call {}: JSON-RPC error {}: {}", self.tool, error.code.0, error.message);
                let mut answer = error_message(
                    Code::McpRefused.as_str(),
                    &format!("agent {}: {detail}", self.name),
                    &Location::None,
                );
                echo_tokens(&mut answer, &parcel.envelope);
                return Err(DeliveryError::Refused {
                    agent: self.name.clone(),
                    code: Code::McpRefused.as_str().into(),
                    detail,
                    answer: Some(Box::new(answer)),
                });
            }
            Err(e) => {
                span.record("error.type", Code::AgentUnavailable.as_str());
                self.drop_session().await;
                return Err(self
                    .unavailable(Code::AgentUnavailable.as_str(), format!("tools/call {}: {e}", self.tool)));
            }
        };
        if result.is_error == Some(true) {
            span.record("error.type", "tool_error");
        }
        let result = serde_json::to_value(&result).unwrap_or(Value::Null);
        let answer = answer_of(&result, &self.name, &self.tool);
        let mut answer = super::held_to_limits(answer, &self.limits, &self.name);
        echo_tokens(&mut answer, &parcel.envelope);
        Ok(answer)
    }

    async fn call_all(&self, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let mut delivered = Delivered::default();
        for parcel in parcels {
            let answer = self.call(&parcel).await?;
            delivered.answers.push((parcel.message_id, answer));
        }
        Ok(delivered)
    }
}

impl Connector for McpAgent {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::Mcp
    }

    fn answers_in_call(&self) -> bool {
        true
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(self.call_all(parcels))
    }
}

/// The SILP wrapper of an envelope: its encoding and its payload text.
pub(crate) fn wrapper(envelope: &Message) -> (&'static str, String) {
    let own = std::iter::once((envelope.subformat.as_str(), &envelope.content));
    let subs = envelope
        .submessages()
        .iter()
        .filter(|s| !s.is_token() && !is_renewal_notice(s))
        .map(|s| (s.subformat.as_str(), &s.content));
    let parts: Vec<(&str, &Content)> = own.chain(subs).collect();
    for (subformat, content) in &parts {
        if let Some(encoding) = crate::a2a::map::silp_encoding(subformat) {
            return (encoding, as_text(content));
        }
    }
    // No SILP: the end of the degradation chain, natural language, from the text there is.
    let text: Vec<String> =
        parts.iter().filter_map(|(_, c)| c.as_str().map(str::to_owned)).filter(|t| !t.is_empty()).collect();
    ("natural", text.join("\n"))
}

fn as_text(content: &Content) -> String {
    match content {
        Content::Json(Value::String(s)) => s.clone(),
        Content::Json(value) => value.to_string(),
        Content::Raw(raw) => raw.value().to_string(),
        Content::Binary(bytes) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// A `tools/call` result (its JSON) as the NLIP answer.
pub(crate) fn answer_of(result: &Value, agent: &str, tool: &str) -> Message {
    let blocks = result.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let texts: Vec<&str> = blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let said = if texts.is_empty() { "no reason given".to_owned() } else { texts.join(" ") };
        return error_message(
            "mcp_tool_error",
            &format!("agent {agent}: tool {tool} failed: {said}"),
            &Location::None,
        );
    }
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        return match unwrap_silp(structured) {
            Some(message) => message,
            None => Message::new(Format::Structured, "json", Content::Json(structured.clone())),
        };
    }
    let mut parts = blocks.iter().map(|block| match block.get("text").and_then(Value::as_str) {
        Some(text) if block.get("type").and_then(Value::as_str) == Some("text") => {
            Submessage::new(Format::Text, "english", Content::text(text))
        }
        _ => Submessage::new(Format::Structured, "json", Content::Json(block.clone())),
    });
    let Some(first) = parts.next() else {
        return Message::text("");
    };
    let mut message = Message::new(first.format, first.subformat, first.content);
    for part in parts {
        message.push(part);
    }
    message
}

/// Structured content that is a SILP wrapper, as the SILP part it carries.
fn unwrap_silp(structured: &Value) -> Option<Message> {
    let encoding = structured.get("silp_encoding")?.as_str()?;
    let payload = structured.get("silp_payload")?.as_str()?;
    let parsed = || serde_json::from_str::<Value>(payload).ok();
    Some(match encoding {
        "code" => Message::new(Format::Structured, "silp-code", Content::text(payload)),
        "json" => Message::new(Format::Structured, "silp-json", Content::Json(parsed()?)),
        "ir" => Message::new(Format::Structured, "silp-ir", Content::Json(parsed()?)),
        "natural" => Message::text(payload),
        _ => return None,
    })
}

/// The request's tokens on the answer (ECMA-430 §6.2): an MCP tool does not know them.
fn echo_tokens(answer: &mut Message, request: &Message) {
    for token in request.tokens() {
        answer.push(token.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_wrapper_carries_the_first_silp_part_or_the_natural_text() {
        let mut m = Message::text("");
        m.push(Submessage::new(Format::Structured, "silp-code", Content::text("cancel(order1)")));
        m.push(Submessage::new(Format::Token, "conversation", Content::text("c-1")));
        assert_eq!(wrapper(&m), ("code", "cancel(order1)".to_owned()));
        let ir = Message::new(Format::Structured, "silp-ir", Content::Json(json!({"intent": "x"})));
        assert_eq!(wrapper(&ir), ("ir", r#"{"intent":"x"}"#.to_owned()));
        assert_eq!(wrapper(&Message::text("hello")), ("natural", "hello".to_owned()));
    }

    #[test]
    fn results_become_silp_parts_structured_parts_text_or_errors() {
        let silp = json!({"content": [], "structuredContent": {"silp_encoding": "code", "silp_payload": "confirm(order1)"}});
        let m = answer_of(&silp, "a", "t");
        assert_eq!((m.subformat.as_str(), m.content.as_str()), ("silp-code", Some("confirm(order1)")));
        let data = answer_of(&json!({"structuredContent": {"n": 1}}), "a", "t");
        assert_eq!(data.content, Content::Json(json!({"n": 1})));
        let text = answer_of(
            &json!({"content": [{"type": "text", "text": "hi"}, {"type": "image", "data": "AA=="}]}),
            "a",
            "t",
        );
        assert_eq!(text.content.as_str(), Some("hi"));
        assert_eq!(text.submessages().len(), 1);
        let failed =
            answer_of(&json!({"content": [{"type": "text", "text": "boom"}], "isError": true}), "a", "t");
        assert_eq!(crate::nlip::reply::error_code(&failed).as_deref(), Some("mcp_tool_error"));
        let bad = json!({"structuredContent": {"silp_encoding": "ir", "silp_payload": "{not json"}});
        assert_eq!(answer_of(&bad, "a", "t").subformat, "json", "an unreadable wrapper stays data");
    }
}
