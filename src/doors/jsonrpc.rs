//! What silpgate's JSON-RPC endpoints (`/a2a`, `/mcp`) share before they read a request: the
//! `Origin` check, bearer authentication, the per-client rate limit and the body limit, in
//! that order; and JSON-RPC error bodies.

use super::Front;
use super::admission::{Denied, FOREIGN_ORIGIN, authenticate, origin_allowed};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::net::SocketAddr;

/// A request that passed every check: its body, and the client it counts against.
pub(crate) struct Admitted {
    pub body: Bytes,
    /// The key of the client's rate limit and conversation quota.
    pub client: String,
    /// Who it is, when clients authenticate.
    pub principal: Option<crate::principal::Principal>,
}

/// The body of a request that passed every check, or the response that refuses it.
pub(crate) async fn admit(
    front: &Front,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<Admitted, Response> {
    if !origin_allowed(&front.allowed_origins, headers) {
        return Err(reply(StatusCode::FORBIDDEN, &error(Value::Null, -32600, FOREIGN_ORIGIN)));
    }
    let identity = authenticate(front, headers, peer).await.map_err(Denied::into_response)?;
    let client = super::client_key(&identity, front.client_address(headers, peer));
    if let Err(retry_after) = front.clients.admit(&client) {
        return Err(Denied::RateLimited(retry_after).into_response());
    }
    let reading = axum::body::to_bytes(body, front.limits.max_bytes);
    let body = match tokio::time::timeout(front.body_timeout, reading).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            let why = format!("the body is larger than the limit of {} bytes", front.limits.max_bytes);
            return Err(reply(StatusCode::PAYLOAD_TOO_LARGE, &error(Value::Null, -32600, &why)));
        }
        Err(_) => {
            let why = format!(
                "the body did not arrive within {} s (http.body_timeout_secs)",
                front.body_timeout.as_secs()
            );
            return Err(reply(StatusCode::REQUEST_TIMEOUT, &error(Value::Null, -32600, &why)));
        }
    };
    Ok(Admitted { body, client, principal: identity.principal().cloned() })
}

/// A JSON response.
pub(crate) fn reply(status: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A JSON-RPC error object answering the request `id`.
pub(crate) fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}
