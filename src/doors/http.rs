//! NLIP over HTTP (ECMA-431): `POST /nlip` and `POST /nlip/`, JSON or CBOR in, the reply in the
//! same encoding; `GET /healthz` and `GET /readyz`; the WebSocket upgrades of [`super::ws`].
//!
//! Status codes (docs/protocol.md): 200 with the reply; 400 for bad input, 404 when no route
//! takes the message, 410 for an expired session, 413 too large, 415 unknown content type,
//! 401/403 for a missing/refused token, 503 when state or the agent is unavailable, 500 when
//! silpgate itself is broken. Every non-2xx body is an NLIP error message, never a framework's.

use super::admission::{
    FOREIGN_ORIGIN, authenticate, error_response, message_response, origin_allowed, rate_limited_response,
};
use super::{Front, ToSender};
use crate::broker::health::Readiness;
use crate::gateway::Transport;
use crate::intake::NotTaken;
use crate::nlip::{self, Encoding};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The router of the front door.
pub(crate) fn router(front: Arc<Front>) -> Router {
    Router::new()
        .route("/nlip", post(post_nlip))
        .route("/nlip/", post(post_nlip))
        .route("/nlip/ws", get(super::ws::upgrade_cbor))
        .route("/nlip/ws/text", get(super::ws::upgrade_text))
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .merge(super::mcp::router())
        .merge(super::a2a::router())
        .merge(super::admin::router())
        .merge(observability(front.clone()))
        .fallback(not_found)
        .with_state(front)
}

/// `/metrics` and `/cluster`, behind one check: a token when `http.observability_tokens` asks.
fn observability(front: Arc<Front>) -> Router<Arc<Front>> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/cluster", get(cluster))
        .route_layer(axum::middleware::from_fn_with_state(front, observability_guard))
}

async fn observability_guard(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if front.observability_tokens
        && let Err(denied) = authenticate(&front, request.headers(), peer).await
    {
        return denied.into_response();
    }
    next.run(request).await
}

async fn readyz(State(front): State<Arc<Front>>) -> Response {
    // The store is open (it was opened at start) and answers a read, and the broker, when
    // there is one, is connected and consumed from.
    if let Err(e) = front.core().gateway.store().ledger("readiness-probe") {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response();
    }
    let Some(broker) = &front.broker else {
        return (StatusCode::OK, "ready\n").into_response();
    };
    match broker.readiness() {
        Readiness::Ready(node) => match front.cluster.as_ref().map(|c| c.readiness()) {
            Some(Err(why)) => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response()
            }
            _ => (StatusCode::OK, format!("ready (broker {node})\n")).into_response(),
        },
        Readiness::NotConnected => {
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: the broker is not connected\n").into_response()
        }
        Readiness::Holding(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: holding: {why}\n")).into_response()
        }
    }
}

/// What this instance serves of the cluster (`silpgate cluster status` reads it).
async fn cluster(State(front): State<Arc<Front>>) -> Response {
    match &front.cluster {
        Some(cluster) => {
            let mut status = cluster.status();
            let loaded = front.reloader.loaded();
            status["config"] = serde_json::json!({ "digest": loaded.digest, "loaded_at": loaded.at });
            let broker = front.broker.as_ref().and_then(|b| b.node()).map(|node| node.to_string());
            status["broker"] = broker.map_or(serde_json::Value::Null, serde_json::Value::String);
            ([(header::CONTENT_TYPE, "application/json")], status.to_string()).into_response()
        }
        None => error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "this instance is not in cluster mode (no [cluster] section)",
            Encoding::Json,
        ),
    }
}

/// Prometheus text exposition of every metric.
async fn metrics() -> Response {
    let text = crate::metrics::get().render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The answer to a body that did not arrive within `http.body_timeout_secs`; hyper closes the
/// connection after it, the rest of the body unread.
pub(crate) fn body_too_slow(timeout: std::time::Duration, encoding: Encoding) -> Response {
    let message = format!("the body did not arrive within {} s (http.body_timeout_secs)", timeout.as_secs());
    error_response(StatusCode::REQUEST_TIMEOUT, "timeout", &message, encoding)
}

/// The router of connections over `http.max_connections`, on the few slots kept for them:
/// the probes answer, so that an orchestrator still sees the gateway alive and ready; anything
/// else is refused as the cap refuses it.
pub(crate) fn probes(front: Arc<Front>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            let message = "the gateway is at its connection cap (http.max_connections); retry shortly";
            let mut response =
                error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message, Encoding::Json);
            response.headers_mut().insert(header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
            response
        })
        .with_state(front)
}

async fn not_found(request: Request) -> Response {
    let message =
        format!("no endpoint {} {}; NLIP is served at POST /nlip", request.method(), request.uri().path());
    error_response(StatusCode::NOT_FOUND, "not_found", &message, Encoding::Json)
}

/// The HTTP status for an error code sent back in an NLIP error message ([`crate::code`]).
pub(crate) fn status_for(code: &str) -> StatusCode {
    StatusCode::from_u16(crate::code::http_status(code)).unwrap_or(StatusCode::BAD_REQUEST)
}

async fn post_nlip(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // As on the WebSocket, `/a2a` and `/mcp`: a page elsewhere that rebinds its name to this
    // machine must not drive the agents behind it, with silpgate's own agent credentials.
    if !origin_allowed(&front.allowed_origins, &headers) {
        return error_response(StatusCode::FORBIDDEN, "forbidden", FOREIGN_ORIGIN, Encoding::Json);
    }
    let identity = match authenticate(&front, &headers, peer).await {
        Ok(identity) => identity,
        Err(denied) => return denied.into_response(),
    };
    let client = super::client_key(&identity, front.client_address(&headers, peer));
    if let Err(retry_after) = front.clients.admit(&client) {
        return rate_limited_response(retry_after);
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(encoding) = Encoding::from_content_type(content_type) else {
        let message =
            format!("content type '{content_type}' is not served; send application/json or application/cbor");
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            &message,
            Encoding::Json,
        );
    };
    let limit = front.limits.max_bytes;
    let bytes: Bytes = match tokio::time::timeout(front.body_timeout, axum::body::to_bytes(body, limit)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            let message = format!("the body is larger than the limit of {limit} bytes");
            return error_response(StatusCode::PAYLOAD_TOO_LARGE, "too_large", &message, encoding);
        }
        Err(_) => return body_too_slow(front.body_timeout, encoding),
    };
    let envelope = match nlip::decode(&bytes, encoding, &front.limits) {
        Ok(m) => m,
        Err(e) => {
            let NotTaken { failure, replies } = front.intake.unreadable(e, encoding);
            let reply = replies.into_iter().next().expect("an unreadable message is answered");
            return message_response(status_for(failure.code()), &reply, encoding);
        }
    };
    if let Err(limit) = front.conversations.admit(&client, envelope.conversation_token(), Instant::now()) {
        let message = super::limit::too_many_conversations(limit);
        return message_response(StatusCode::TOO_MANY_REQUESTS, &message, encoding);
    }
    let parent = crate::telemetry::extract_http(&headers);
    let asker = super::Asker::new(Transport::Http, "http", identity.principal().cloned());
    match front.request(envelope, asker, parent).await {
        ToSender::Reply { reply, .. } => message_response(StatusCode::OK, &reply, encoding),
        ToSender::Accepted(ids) => {
            message_response(StatusCode::ACCEPTED, &crate::nlip::reply::accepted(&ids), encoding)
        }
        ToSender::Refused { message, code, transient } => {
            let status = match status_for(&code) {
                StatusCode::BAD_REQUEST if transient => StatusCode::SERVICE_UNAVAILABLE,
                status => status,
            };
            message_response(status, &message, encoding)
        }
    }
}
