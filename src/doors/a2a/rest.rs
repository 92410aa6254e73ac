//! The HTTP+JSON binding of the A2A door (A2A 1.0), at the same base URL as JSON-RPC:
//! `POST /a2a/message:send` and `POST /a2a/message:stream` take a `SendMessageRequest` as the
//! body and answer a `SendMessageResponse` (the stream: `StreamResponse` events, as over
//! JSON-RPC);
//! `GET /a2a/tasks/{id}` (`?historyLength=`), `POST /a2a/tasks/{id}:cancel`,
//! `GET`/`POST /a2a/tasks/{id}:subscribe` and `GET /a2a/tasks` (`?contextId=&pageSize=&pageToken=`) reach
//! the kept tasks; `POST`/`GET /a2a/tasks/{id}/pushNotificationConfigs` and
//! `GET`/`DELETE /a2a/tasks/{id}/pushNotificationConfigs/{config}` their push notification
//! configs. A failure is its HTTP status with a `google.rpc.Status`-shaped body. The checks of the JSON-RPC binding apply in the same
//! order; an `A2A-Version` header, when sent, must be 1.x (0.3's HTTP binding is not served).

use super::operation::{self, Failure};
use super::{A2A_MEDIA_TYPE, live_event_stream, reply_as};
use crate::a2a::VERSION;
use crate::doors::Front;
use crate::doors::jsonrpc::{Admitted, admit};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// The binding's routes. A task's operations are one segment, `{id}` or `{id}:verb`.
pub(super) fn router() -> Router<Arc<Front>> {
    Router::new()
        .route("/a2a/message:send", post(|f, p, h, b| send(f, p, h, b, false)))
        .route("/a2a/message:stream", post(|f, p, h, b| send(f, p, h, b, true)))
        .route("/a2a/tasks", get(list))
        .route("/a2a/tasks/{task}", get(task).post(task))
        .route("/a2a/tasks/{task}/{*rest}", get(push_configs).post(push_configs).delete(push_configs))
}

async fn send(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
    streaming: bool,
) -> Response {
    let admitted = match admitted(&front, peer, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let request: Value = match serde_json::from_slice(&admitted.body) {
        Ok(request) => request,
        Err(e) => return failed(&Failure::Parse(format!("the body is not JSON: {e}"))),
    };
    let caller = operation::Caller { client: &admitted.client, principal: admitted.principal.as_ref() };
    if streaming {
        return match operation::send_streaming(&front, &headers, &caller, &request).await {
            Ok(events) => live_event_stream(events, |event| event),
            Err(failure) => failed(&failure),
        };
    }
    match operation::send_message(&front, &headers, &caller, &request).await {
        Ok(result) => reply_as(StatusCode::OK, &result, A2A_MEDIA_TYPE),
        Err(failure) => failed(&failure),
    }
}

/// `GET /a2a/tasks/{id}`, `POST /a2a/tasks/{id}:cancel`, `/a2a/tasks/{id}:subscribe`.
async fn task(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(task): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let client = match admitted(&front, peer, &headers, body).await {
        Ok(admitted) => admitted.client,
        Err(refused) => return refused,
    };
    let (id, verb) = match task.rsplit_once(':') {
        Some((id, verb)) => (id, Some(verb)),
        None => (task.as_str(), None),
    };
    let mut params = json!({"id": id});
    if let Some(history) = query.get("historyLength").and_then(|n| n.parse::<u64>().ok()) {
        params["historyLength"] = json!(history);
    }
    let answered = match verb {
        None => operation::get_task(&front, &client, &params)
            .map(|task| reply_as(StatusCode::OK, &task, A2A_MEDIA_TYPE)),
        Some("cancel") => operation::cancel_task(&front, &client, &params)
            .map(|task| reply_as(StatusCode::OK, &task, A2A_MEDIA_TYPE)),
        Some("subscribe") => operation::subscribe(&front, &client, &params)
            .map(|events| live_event_stream(events, |event| event)),
        Some(verb) => Err(Failure::MethodNotFound(format!("tasks have no operation '{verb}'"))),
    };
    answered.unwrap_or_else(|failure| failed(&failure))
}

/// `GET /a2a/tasks`: the client's tasks, the latest first.
async fn list(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let client = match admitted(&front, peer, &headers, body).await {
        Ok(admitted) => admitted.client,
        Err(refused) => return refused,
    };
    let mut params = json!({});
    if let Some(context) = query.get("contextId") {
        params["contextId"] = json!(context);
    }
    if let Some(size) = query.get("pageSize").and_then(|n| n.parse::<u64>().ok()) {
        params["pageSize"] = json!(size);
    }
    if let Some(token) = query.get("pageToken") {
        params["pageToken"] = json!(token);
    }
    match operation::list_tasks(&front, &client, &params) {
        Ok(list) => reply_as(StatusCode::OK, &list, A2A_MEDIA_TYPE),
        Err(failure) => failed(&failure),
    }
}

/// `/a2a/tasks/{id}/pushNotificationConfigs`: `POST` a config, `GET` them all; and
/// `…/pushNotificationConfigs/{config}`: `GET` or `DELETE` one.
async fn push_configs(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((task, rest)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let admitted = match admitted(&front, peer, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let client = &admitted.client;
    let config = match rest.split_once('/') {
        Some(("pushNotificationConfigs", config)) if !config.is_empty() && !config.contains('/') => {
            Some(config)
        }
        None if rest == "pushNotificationConfigs" => None,
        _ => return failed(&Failure::MethodNotFound(format!("tasks have no resource '{rest}'"))),
    };
    let answered = match (method, config) {
        (Method::POST, None) => match serde_json::from_slice::<Value>(&admitted.body) {
            Ok(mut params) if params.is_object() => {
                params["taskId"] = json!(task);
                operation::create_push_config(&front, client, &params)
            }
            Ok(_) => {
                Err(Failure::InvalidParams("the body is not a TaskPushNotificationConfig object".into()))
            }
            Err(e) => Err(Failure::Parse(format!("the body is not JSON: {e}"))),
        },
        (Method::GET, None) => operation::list_push_configs(&front, client, &json!({"taskId": task})),
        (Method::GET, Some(id)) => {
            operation::get_push_config(&front, client, &json!({"taskId": task, "id": id}))
        }
        (Method::DELETE, Some(id)) => {
            operation::delete_push_config(&front, client, &json!({"taskId": task, "id": id}))
        }
        (method, _) => Err(Failure::MethodNotFound(format!("{method} is not served on {rest}"))),
    };
    match answered {
        Ok(result) => reply_as(StatusCode::OK, &result, A2A_MEDIA_TYPE),
        Err(failure) => failed(&failure),
    }
}

/// A request past the door's checks (as on JSON-RPC) and of a version this binding serves.
async fn admitted(
    front: &Front,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<Admitted, Response> {
    let admitted = admit(front, peer, headers, body).await?;
    match version_refused(headers) {
        Some(failure) => Err(failed(&failure)),
        None => Ok(admitted),
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
