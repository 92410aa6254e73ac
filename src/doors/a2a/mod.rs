//! silpgate's own A2A front door: `GET /.well-known/agent-card.json` and the A2A endpoint at
//! `/a2a`, in two bindings that call the same operations ([`operation`]):
//! - JSON-RPC ([`jsonrpc`], `POST /a2a`), of A2A 1.0 and of 0.3;
//! - HTTP+JSON ([`rest`], `POST /a2a/message:send` and the like), of A2A 1.0.
//!
//! An A2A client's `SendMessage` enters the intake like an NLIP message from source `a2a` (its
//! parts mapped as [`crate::a2a::map`] says; `contextId` is the conversation token), goes
//! wherever the routes send it, and the answer comes back as the A2A response: a Message when
//! the answer is one, a Task that was `REJECTED` (the message was refused for what it is: bad
//! input, no route, an agent that rejected it) or `FAILED` (any other error) when it is an
//! NLIP error, its status message carrying the error. `SendStreamingMessage` streams the
//! agent's progress as it comes, when the agent reports any, as a task the door keeps, and
//! otherwise answers with one server-sent event holding that same response. A message sent
//! with `returnImmediately` is answered at once with a working task, kept too. The door keeps
//! its tasks ([`tasks`]) for `GetTask`, `ListTasks`, `CancelTask` and `SubscribeToTask`, which
//! streams a task live from where it stands. When `a2a.push_origins` allows webhooks,
//! a task may have push notification configs: each change of the task is then delivered to
//! them through a queue on the broker ([`courier`]). Bearer tokens, the per-client rate limit
//! and the `Origin` check apply as on `/mcp`; the card is public, as discovery needs, and
//! signed with `a2a.card_signing_key_file` when it is set ([`crate::a2a::signature`]).

pub(crate) mod courier;
mod failure;
mod jsonrpc;
mod operation;
mod push;
mod rest;
pub(crate) mod tasks;

use super::Front;
use super::jsonrpc::reply;
use crate::a2a::{VERSION, v0_3};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;

/// A2A 1.0's own media type.
const A2A_MEDIA_TYPE: &str = "application/a2a+json";

/// The card and both bindings' routes.
pub(crate) fn router() -> Router<Arc<Front>> {
    Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/a2a", post(jsonrpc::post_a2a))
        .merge(rest::router())
}

/// The card: the gateway's name, the interfaces at `/a2a` under `http.public_url` (never the
/// request's `Host`, which would let a client write the card others read), the routes that
/// take A2A messages as skills (those to agents with an `allow` rule left out: the card is
/// read by anyone), SILP as an extension. One card for both generations: 1.0
/// reads `supportedInterfaces`, which names the JSON-RPC and HTTP+JSON interfaces of 1.0 and
/// the JSON-RPC one of 0.3, and the security schemes' `httpAuthSecurityScheme`; 0.3 reads the top-level `url`,
/// `protocolVersion` and `preferredTransport`, `security`, and the schemes' `type`. Each
/// generation's readers pass over the other's fields.
async fn card(State(front): State<Arc<Front>>) -> Response {
    let core = front.core();
    let config = core.gateway.config();
    // The card is public: a route to an agent only some principals may reach is not shown.
    let open_to_anyone = |destination: &str| {
        config
            .agents
            .iter()
            .find(|a| a.name == destination)
            .is_none_or(|agent| crate::principal::allowed(&agent.allow, None))
    };
    let skills: Vec<Value> = config
        .routes
        .iter()
        .filter(|r| r.matcher.source.as_deref().is_none_or(|s| s == "a2a"))
        .filter(|r| open_to_anyone(&r.destination))
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
            {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": VERSION},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": v0_3::VERSION},
        ],
        "url": url,
        "protocolVersion": v0_3::VERSION,
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": true, "pushNotifications": front.a2a_tasks.pushes(), "extensions": [{
            "uri": "https://datatracker.ietf.org/doc/draft-hwang-silp-protocol/",
            "description": "SILP payloads: a text part with metadata.silp_encoding = code, or a data part holding the IR; metadata.nlip names a part's NLIP format and subformat",
            "required": false,
            "params": {"frontends": ["code", "json", "natural", "nl_json"], "envelope": "NLIP (ECMA-430)"},
        }]},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    });
    if !front.auth().is_open() {
        card["securitySchemes"] = json!({"bearer": {
            "httpAuthSecurityScheme": {"scheme": "Bearer"},
            "type": "http", "scheme": "bearer",
        }});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
        card["security"] = json!([{"bearer": []}]);
    }
    if let Some(signer) = &front.card_signer
        && let Err(e) = signer.sign(&mut card)
    {
        // Served unsigned rather than not at all: a client that requires a signature refuses it.
        tracing::warn!(error = %e, "The agent card could not be signed.");
    }
    reply(StatusCode::OK, &card)
}

/// A streamed answer whose events come as the work goes on: one server-sent event for each
/// value `events` yields, as `wrap` writes it, until it ends.
fn live_event_stream(
    events: tokio::sync::mpsc::UnboundedReceiver<Value>,
    wrap: impl Fn(Value) -> Value + Send + 'static,
) -> Response {
    let stream = futures_util::stream::unfold((events, wrap), |(mut events, wrap)| async move {
        let event = events.recv().await?;
        let data = format!("data: {}\n\n", wrap(event));
        Some((Ok::<_, std::convert::Infallible>(data), (events, wrap)))
    });
    let mut out = Response::new(Body::from_stream(stream));
    out.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    out.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out
}

/// A response of JSON `body` and media type `content_type`.
fn reply_as(status: StatusCode, body: &Value, content_type: &'static str) -> Response {
    let mut response = reply(status, body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
