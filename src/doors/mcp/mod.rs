//! `POST /mcp`: silpgate's SILP codec as an MCP server (streamable HTTP transport, MCP
//! 2025-06-18), so that any MCP-capable model client can compile, decode, validate and hash
//! SILP with it. The server is stateless: it assigns no session, answers every request with
//! one JSON body (`application/json`, which the transport allows instead of an SSE stream),
//! and offers no server-initiated stream (`GET` is 405). Notifications are accepted with 202.
//! Bearer tokens and the per-client rate limit apply as on `/nlip`; a request carrying an
//! `Origin` not in `http.allowed_origins` is refused with 403.
//!
//! Methods: `initialize`, `ping`, `tools/list`, `tools/call` ([`tools`]); any other is JSON-RPC
//! -32601. A body that is not a JSON-RPC request is -32700 or -32600; an unknown tool -32602.
//!
//! The server is written here rather than taken from `rmcp` (which silpgate uses as its MCP
//! client): rmcp's server side brings its `server` feature (schemars and derive macros) and
//! its own session manager and tower service, while this endpoint must sit in the door's router
//! behind its token, rate-limit and origin checks, and four stateless tools need no session.

pub(crate) mod tools;

use super::Front;
use super::jsonrpc::{error, reply};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};
use std::net::SocketAddr;
use std::sync::Arc;

/// The protocol versions whose tool calls this server answers; a client asking for another
/// gets the first, 2025-06-18.
const VERSIONS: [&str; 4] = ["2025-06-18", "2025-11-25", "2025-03-26", "2024-11-05"];

/// The `/mcp` route.
pub(crate) fn router() -> Router<Arc<Front>> {
    Router::new().route(
        "/mcp",
        post(post_mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }).delete(|| async { StatusCode::OK }),
    )
}

async fn post_mcp(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes = match super::jsonrpc::admit(&front, peer, &headers, body).await {
        Ok(admitted) => admitted.body,
        Err(refused) => return refused,
    };
    match respond(&bytes) {
        Some(body) => reply(StatusCode::OK, &body),
        // A notification or a response: nothing to answer.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// The JSON-RPC response to one body, or `None` when it asks for none.
pub(crate) fn respond(body: &[u8]) -> Option<Value> {
    let request: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(e) => return Some(error(Value::Null, -32700, &format!("the body is not JSON: {e}"))),
    };
    let Some(request) = request.as_object() else {
        return Some(error(Value::Null, -32600, "a request is one JSON-RPC object (batches are not taken)"));
    };
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        // A response to nothing silpgate asked, or not JSON-RPC at all.
        return (!request.contains_key("result") && !request.contains_key("error"))
            .then(|| error(Value::Null, -32600, "a request needs a method"));
    };
    let id = request.get("id")?.clone();
    let params = request.get("params").and_then(Value::as_object).cloned().unwrap_or_default();
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools::list()})),
        "tools/call" => call(&params),
        _ => Err((-32601, format!("method '{method}' is not served here"))),
    };
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => error(id, code, &message),
    })
}

fn initialize(params: &Map<String, Value>) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
    let version = VERSIONS.iter().find(|v| **v == asked).unwrap_or(&VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "silpgate", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "SILP codec: silp_decode reads SILP text into the IR, silp_compile writes an IR as text, silp_validate checks an IR, silp_hash names it.",
    })
}

fn call(params: &Map<String, Value>) -> Result<Value, (i64, String)> {
    let name =
        params.get("name").and_then(Value::as_str).ok_or((-32602, "tools/call needs a name".to_owned()))?;
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments.clone(),
        Some(_) => return Err((-32602, "tools/call arguments must be an object".to_owned())),
    };
    let Some(outcome) = tools::call(name, &arguments) else {
        return Err((-32602, format!("unknown tool '{name}'")));
    };
    Ok(match outcome {
        Ok(structured) => {
            json!({"content": [{"type": "text", "text": structured.to_string()}], "structuredContent": structured, "isError": false})
        }
        Err(e) => {
            json!({"content": [{"type": "text", "text": e.to_string()}], "structuredContent": e.to_value(), "isError": true})
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_get_results_and_bad_bodies_get_json_rpc_errors() {
        let init = respond(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#,
        );
        assert_eq!(init.unwrap()["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(respond(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), None);
        assert_eq!(respond(b"{").unwrap()["error"]["code"], -32700);
        assert_eq!(respond(b"[]").unwrap()["error"]["code"], -32600);
        assert_eq!(respond(br#"{"jsonrpc":"2.0","id":2,"method":"x"}"#).unwrap()["error"]["code"], -32601);
        let unknown = respond(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}"#);
        assert_eq!(unknown.unwrap()["error"]["code"], -32602);
        let failed = respond(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"silp_decode","arguments":{"text":"("}}}"#);
        let failed = failed.unwrap();
        assert_eq!(failed["result"]["isError"], true);
        assert_eq!(failed["result"]["structuredContent"]["code"], "invalid_syntax");
    }
}
