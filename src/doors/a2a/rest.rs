//! The HTTP+JSON binding of the A2A door (A2A 1.0), at the same base URL as JSON-RPC:
//! `POST /a2a/message:send` and `POST /a2a/message:stream` take a `SendMessageRequest` as the
//! body and answer a `SendMessageResponse` (the stream: one server-sent event holding it);
//! `GET /a2a/tasks/{id}`, `POST /a2a/tasks/{id}:cancel` and `/a2a/tasks/{id}:subscribe`
//! answer TaskNotFound, as silpgate keeps no tasks. A failure is its HTTP status with a
//! `google.rpc.Status`-shaped body. The checks of the JSON-RPC binding apply in the same
//! order; an `A2A-Version` header, when sent, must be 1.x (0.3's HTTP binding is not served).

use super::operation::{self, Failure};
use super::{A2A_MEDIA_TYPE, event_stream, reply_as};
use crate::a2a::VERSION;
use crate::doors::Front;
use crate::doors::jsonrpc::admit;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;

/// The binding's routes. A task's operations are one segment, `{id}` or `{id}:verb`.
pub(super) fn router() -> Router<Arc<Front>> {
    Router::new()
        .route("/a2a/message:send", post(|f, p, h, b| send(f, p, h, b, false)))
        .route("/a2a/message:stream", post(|f, p, h, b| send(f, p, h, b, true)))
        .route("/a2a/tasks/{task}", get(task).post(task))
}

async fn send(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
    streaming: bool,
) -> Response {
    let admitted = match admit(&front, peer, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    if let Some(failure) = version_refused(&headers) {
        return failed(&failure);
    }
    let request: Value = match serde_json::from_slice(&admitted.body) {
        Ok(request) => request,
        Err(e) => return failed(&Failure::Parse(format!("the body is not JSON: {e}"))),
    };
    match operation::send_message(&front, &headers, &admitted.client, request.get("message")).await {
        Ok(result) if streaming => event_stream(&result),
        Ok(result) => reply_as(StatusCode::OK, &result, A2A_MEDIA_TYPE),
        Err(failure) => failed(&failure),
    }
}

/// `GET /a2a/tasks/{id}`, `POST /a2a/tasks/{id}:cancel`, `/a2a/tasks/{id}:subscribe`.
async fn task(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(task): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refused) = admit(&front, peer, &headers, body).await {
        return refused;
    }
    if let Some(failure) = version_refused(&headers) {
        return failed(&failure);
    }
    match task.rsplit_once(':').map(|(_, verb)| verb) {
        None | Some("cancel" | "subscribe") => failed(&operation::no_such_task()),
        Some(verb) => failed(&Failure::MethodNotFound(format!("tasks have no operation '{verb}'"))),
    }
}

/// A version this binding does not serve, named in `A2A-Version`.
fn version_refused(headers: &HeaderMap) -> Option<Failure> {
    let version = headers.get("a2a-version").and_then(|v| v.to_str().ok()).map(str::trim)?;
    (version != "1" && !version.starts_with("1.")).then(|| {
        Failure::VersionNotSupported(format!(
            "A2A version '{version}' is not served over HTTP+JSON; this binding speaks {VERSION} (0.3 clients: the JSON-RPC binding at /a2a)"
        ))
    })
}

fn failed(failure: &Failure) -> Response {
    reply_as(failure.http_status(), &failure.rest_body(), "application/json")
}
