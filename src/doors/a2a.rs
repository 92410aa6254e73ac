//! silpgate's own A2A front door (A2A 1.0, JSON-RPC binding): `GET
//! /.well-known/agent-card.json` and `POST /a2a`. An A2A client's `SendMessage` enters the
//! intake like an NLIP message from source `a2a` (its parts mapped as
//! [`crate::a2a::map`] says; `contextId` is the conversation token), goes wherever
//! the routes send it, and the answer comes back as the A2A response: a Message when the
//! answer is one, a Task that was `REJECTED` (the message was refused for what it is: bad
//! input, no route, an agent that rejected it) or `FAILED` (any other error) when it is an
//! NLIP error, its status message carrying the error. `SendStreamingMessage` is answered with
//! one server-sent event holding that same response. silpgate keeps no tasks: `GetTask` and
//! `CancelTask` answer TaskNotFound. Bearer tokens, the per-client rate limit and the `Origin`
//! check apply as on `/mcp`; the card is public, as discovery needs.

use super::jsonrpc::{error, reply};
use super::{Front, ToSender};
use crate::a2a::{VERSION, map, v0_3};
use crate::gateway::Transport;
use crate::nlip::{Content, Format, Message, Submessage};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A2A 1.0's own media type.
const A2A_MEDIA_TYPE: &str = "application/a2a+json";

/// JSON-RPC error codes of A2A 1.0.
const TASK_NOT_FOUND: i64 = -32001;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// Ids of the tasks and messages this door writes: unique within the process.
static IDS: AtomicU64 = AtomicU64::new(1);

/// The card and the JSON-RPC route.
pub(crate) fn router() -> Router<Arc<Front>> {
    Router::new().route("/.well-known/agent-card.json", get(card)).route("/a2a", post(post_a2a))
}

/// The card: the gateway's name, the JSON-RPC interface at `/a2a` under `http.public_url`
/// (never the request's `Host`, which would let a client write the card others read), the
/// routes that take A2A messages as skills, SILP as an extension. One card for both
/// generations: 1.0 reads `supportedInterfaces`, which names the interface for 1.0 and for
/// 0.3, and the security schemes' `httpAuthSecurityScheme`; 0.3 reads the top-level `url`,
/// `protocolVersion` and `preferredTransport`, `security`, and the schemes' `type`. Each
/// generation's readers pass over the other's fields.
async fn card(State(front): State<Arc<Front>>) -> Response {
    let config = front.gateway().config();
    let skills: Vec<Value> = config
        .routes
        .iter()
        .filter(|r| r.matcher.source.as_deref().is_none_or(|s| s == "a2a"))
        .map(|r| {
            let mode = format!("{:?}", r.mode).to_ascii_lowercase();
            json!({"id": r.name, "name": r.name, "tags": [mode, r.destination],
                   "description": format!("messages to {} ({mode} SILP payloads)", r.destination)})
        })
        .collect();
    let url = format!("{}/a2a", front.public_url);
    let mut card = json!({
        "name": config.gateway.name,
        "description": "silpgate: an NLIP gateway that carries SILP payloads between agents",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": VERSION},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": v0_3::VERSION},
        ],
        "url": url,
        "protocolVersion": v0_3::VERSION,
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": true, "pushNotifications": false, "extensions": [{
            "uri": "https://datatracker.ietf.org/doc/draft-hwang-silp-protocol/",
            "description": "SILP payloads: a text part with metadata.silp_encoding = code, or a data part holding the IR; metadata.nlip names a part's NLIP format and subformat",
            "required": false,
            "params": {"frontends": ["code", "json", "natural", "nl_json"], "envelope": "NLIP (ECMA-430)"},
        }]},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    });
    if !front.auth.is_open() {
        card["securitySchemes"] = json!({"bearer": {
            "httpAuthSecurityScheme": {"scheme": "Bearer"},
            "type": "http", "scheme": "bearer",
        }});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
        card["security"] = json!([{"bearer": []}]);
    }
    reply(StatusCode::OK, &card)
}

async fn post_a2a(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (bytes, client) = match super::jsonrpc::admit(&front, peer, &headers, body).await {
        Ok(admitted) => (admitted.body, admitted.client),
        Err(refused) => return refused,
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(e) => {
            return reply(StatusCode::OK, &error(Value::Null, -32700, &format!("the body is not JSON: {e}")));
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(asked) = request.get("method").and_then(Value::as_str) else {
        return reply(StatusCode::OK, &error(id, -32600, "a request is one JSON-RPC object with a method"));
    };
    // The method's name says the generation: 0.3's are `message/send` and the like.
    let (generation, method) = match v0_3::method_as_1_0(asked) {
        Some(method) => (Generation::V0_3, method),
        None => (Generation::V1_0, asked),
    };
    // Without the header a client may mean either; with it, it must match the method's.
    if let Some(version) = headers.get("a2a-version").and_then(|v| v.to_str().ok()).map(str::trim)
        && !generation.accepts(version)
    {
        let why = match generation {
            Generation::V1_0 => format!(
                "A2A version '{version}' is not supported with method '{asked}'; this agent speaks {VERSION} (and 0.3's method names)"
            ),
            Generation::V0_3 => format!("method '{asked}' is A2A 0.3's; A2A {version} names it {method}"),
        };
        let code = if generation == Generation::V1_0 { VERSION_NOT_SUPPORTED } else { -32601 };
        return reply(StatusCode::OK, &error(id, code, &why));
    }
    let content_type = generation.content_type(&headers);
    let body = match method {
        "SendMessage" | "SendStreamingMessage" => {
            let params = request.get("params");
            let message = params.and_then(|p| p.get("message"));
            let message = message
                .map(|m| if generation == Generation::V0_3 { v0_3::message_from(m) } else { m.clone() });
            match send_message(&front, &headers, &client, message.as_ref()).await {
                Ok(result) => {
                    let result =
                        if generation == Generation::V0_3 { v0_3::result_to(&result) } else { result };
                    let response = json!({"jsonrpc": "2.0", "id": id, "result": result});
                    // The stream is the one final answer: silpgate sends no interim task events.
                    if method == "SendStreamingMessage" {
                        return event_stream(&response);
                    }
                    response
                }
                Err(Refusal::Params(why)) => error(id, -32602, &why),
                Err(Refusal::Quota(limit)) => {
                    let why = format!(
                        "too_many_conversations: this client has {limit} live conversations, the most it may have"
                    );
                    return reply(StatusCode::TOO_MANY_REQUESTS, &error(id, -32600, &why));
                }
            }
        }
        "GetTask" | "CancelTask" | "SubscribeToTask" => {
            error(id, TASK_NOT_FOUND, "silpgate keeps no tasks: every answer comes with SendMessage")
        }
        _ => error(id, -32601, &format!("method '{asked}' is not served here")),
    };
    reply_as(StatusCode::OK, &body, content_type)
}

/// Which generation of A2A a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generation {
    V1_0,
    V0_3,
}

impl Generation {
    /// True when an `A2A-Version` header of `version` may come with this generation's methods.
    fn accepts(self, version: &str) -> bool {
        match self {
            Generation::V1_0 => version == "1" || version.starts_with("1."),
            Generation::V0_3 => version == "0.3" || version.starts_with("0.3."),
        }
    }

    /// The media type of the answer: A2A 1.0's own when the client named it, else plain JSON,
    /// which every client of either generation reads.
    fn content_type(self, headers: &HeaderMap) -> &'static str {
        let names_a2a = [header::CONTENT_TYPE, header::ACCEPT].iter().any(|name| {
            headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains(A2A_MEDIA_TYPE))
        });
        if self == Generation::V1_0 && names_a2a { A2A_MEDIA_TYPE } else { "application/json" }
    }
}

/// A JSON-RPC response of media type `content_type`.
fn reply_as(status: StatusCode, body: &Value, content_type: &'static str) -> Response {
    let mut response = reply(status, body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A `SendStreamingMessage` answer: one server-sent event holding the JSON-RPC response.
fn event_stream(response: &Value) -> Response {
    let mut out = Response::new(Body::from(format!("data: {response}\n\n")));
    out.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    out.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out
}

/// Why a `SendMessage` is not taken.
enum Refusal {
    /// Its params are not a message silpgate takes (the NLIP limits included).
    Params(String),
    /// The client is at its conversation quota (`http.max_conversations_per_client`).
    Quota(usize),
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Self {
        Refusal::Params(why.to_owned())
    }
}

/// One `SendMessage`: the result (`{"message"}` or `{"task"}`), or why it is refused. The
/// envelope it makes meets the limits and the conversation quota of every door.
async fn send_message(
    front: &Front,
    headers: &HeaderMap,
    client: &str,
    message: Option<&Value>,
) -> Result<Value, Refusal> {
    let message = message.ok_or("SendMessage needs params.message")?;
    let parts =
        message.get("parts").and_then(Value::as_array).ok_or("params.message.parts must be an array")?;
    if parts.is_empty() {
        return Err("params.message.parts is empty".into());
    }
    let mut envelope =
        map::envelope(parts, "params.message.parts").map_err(|e| Refusal::Params(e.to_string()))?;
    let context = message.get("contextId").and_then(Value::as_str).filter(|c| !c.is_empty());
    if let Some(context) = context {
        envelope.push(Submessage::new(Format::Token, "conversation", Content::text(context)));
    }
    if let Some(messagetype) = message.pointer("/metadata/nlip/messagetype").and_then(Value::as_str) {
        envelope.messagetype = Some(messagetype.to_owned());
    }
    // Built from A2A parts, it meets the limits /nlip decodes with: bytes, depth, values,
    // submessages, the conversation token's length.
    let encoding = crate::nlip::Encoding::Json;
    if let Err(e) = crate::nlip::decode(&crate::nlip::encode(&envelope, encoding), encoding, &front.limits) {
        return Err(Refusal::Params(e.to_string()));
    }
    if let Err(limit) = front.conversations.admit(client, envelope.conversation_token(), Instant::now()) {
        return Err(Refusal::Quota(limit));
    }
    let parent = crate::telemetry::extract_http(headers);
    let answer = front.request(envelope, Transport::Http, "a2a", parent).await;
    let n = IDS.fetch_add(1, Ordering::Relaxed);
    let task = |state: &str, message: &Message| {
        let mut status_message = map::message(message, &format!("silpgate-m{n}"), map::ROLE_AGENT);
        set_context(&mut status_message, context);
        let mut task =
            json!({"id": format!("silpgate-t{n}"), "status": {"state": state, "message": status_message}});
        if let Some(context) = context.or(message.conversation_token()) {
            task["contextId"] = Value::String(context.to_owned());
        }
        json!({"task": task})
    };
    Ok(match answer {
        ToSender::Reply { reply, .. } if reply.is_error() => {
            task(state_for(crate::nlip::reply::error_code(&reply).as_deref()), &reply)
        }
        ToSender::Reply { reply, .. } => {
            let mut answer = map::message(&reply, &format!("silpgate-m{n}"), map::ROLE_AGENT);
            set_context(&mut answer, context);
            json!({"message": answer})
        }
        ToSender::Accepted(ids) => {
            let mut answer =
                map::message(&crate::nlip::reply::accepted(&ids), &format!("silpgate-m{n}"), map::ROLE_AGENT);
            set_context(&mut answer, context);
            json!({"message": answer})
        }
        ToSender::Refused { message, code, .. } => task(state_for(Some(&code)), &message),
    })
}

/// The state of the task an NLIP error ends.
fn state_for(code: Option<&str>) -> &'static str {
    if code.is_some_and(|c| REJECTIONS.contains(&c)) { "TASK_STATE_REJECTED" } else { "TASK_STATE_FAILED" }
}

/// The codes of a message refused for what it is (by silpgate or by the agent), as opposed to
/// one that could not be handled: an A2A task that was rejected rather than one that failed.
const REJECTIONS: [&str; 13] = [
    "invalid_encoding",
    "invalid_envelope",
    "too_large",
    "too_complex",
    "invalid_syntax",
    "unsupported_version",
    "unsupported_frontend",
    "decode_failed",
    "no_route",
    "invalid_ping",
    "a2a_task_rejected",
    "a2a_refused",
    "mcp_refused",
];

/// The asker's context on an answer that carries none of its own.
fn set_context(message: &mut Value, context: Option<&str>) {
    if let (Some(context), None) = (context, message.get("contextId")) {
        message["contextId"] = Value::String(context.to_owned());
    }
}
