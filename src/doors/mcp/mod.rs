//! `POST /mcp`: silpgate's SILP codec as an MCP server (streamable HTTP transport), so that
//! any MCP-capable model client can compile, decode, validate and hash SILP with it. It serves
//! both eras of MCP from the one endpoint, deciding per request:
//! - **2026-07-28** ([`stateless`]): `server/discover`, `tools/list` and `tools/call`, each
//!   request carrying its own version and capabilities; results carry `resultType`, and the
//!   cacheable ones `ttlMs` and `cacheScope`. Envelope errors answer with the HTTP status the
//!   revision gives them (400; an unknown method 404).
//! - **the handshake era** (2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05): `initialize`,
//!   `ping`, `tools/list`, `tools/call`, as JSON-RPC over 200 responses.
//!
//! Either way the server keeps no state: it assigns no session, answers every request with one
//! JSON body (`application/json`, which the transport allows instead of an SSE stream), and
//! offers no server-initiated stream (`GET` is 405). Notifications are accepted with 202.
//! Bearer tokens, the per-client rate limit and the `Origin` check apply as on `/nlip`.
//! A body that is not a JSON-RPC request is -32700 or -32600; an unknown tool -32602.
//!
//! The server is written here rather than taken from `rmcp` (which silpgate uses as its MCP
//! client): rmcp's server side brings its `server` feature (schemars and derive macros) and
//! its own session manager and tower service, while this endpoint must sit in the door's router
//! behind its token, rate-limit and origin checks, and four stateless tools need neither.

pub(crate) mod stateless;
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

/// The handshake-era versions whose tool calls this server answers; a client asking for
/// another gets the first, 2025-06-18.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2025-06-18", "2025-11-25", "2025-03-26", "2024-11-05"];

/// How long a client may keep the tool list: the tools change only with silpgate's version.
/// The scope is private, as the list is answered to an authenticated client.
const TOOLS_TTL_MS: u64 = 3_600_000;

const INSTRUCTIONS: &str = "SILP codec: silp_decode reads SILP text into the IR, silp_compile writes an IR as text, silp_validate checks an IR, silp_hash names it.";

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
    let admitted = match super::jsonrpc::admit(&front, peer, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let core = front.core();
    let config = core.gateway.config();
    let access = ToolAccess {
        rules: &config.auth.mcp_tools,
        principal: admitted.principal.as_ref(),
        req_id_len: config.silp.req_id_len,
    };
    match respond(&headers, &admitted.body, &access) {
        Some((status, body)) => reply(status, &body),
        // A notification or a response: nothing to answer.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// A JSON-RPC failure: its code and message, and the data some codes carry.
type Failure = (i64, String, Option<Value>);

/// Which tools the caller may use (`[auth.mcp_tools]`: a tool without rules is everyone's).
/// A tool it may not use is neither listed nor called: it is answered as an unknown tool,
/// which says nothing of it.
pub(crate) struct ToolAccess<'a> {
    pub rules: &'a std::collections::BTreeMap<String, Vec<String>>,
    pub principal: Option<&'a crate::principal::Principal>,
    /// The length of the `req_id` an IR without one is given (`silp.req_id_len`), as on the
    /// NLIP door.
    pub req_id_len: usize,
}

impl ToolAccess<'_> {
    fn may_use(&self, tool: &str) -> bool {
        self.rules.get(tool).is_none_or(|rules| crate::principal::allowed(rules, self.principal))
    }

    /// The tools this caller may use.
    fn list(&self) -> Value {
        let mut tools = tools::list();
        if let Some(all) = tools.as_array_mut() {
            all.retain(|tool| tool["name"].as_str().is_some_and(|name| self.may_use(name)));
        }
        tools
    }
}

/// The HTTP status and JSON-RPC response to one body, or `None` when it asks for none.
pub(crate) fn respond(
    headers: &HeaderMap,
    body: &[u8],
    access: &ToolAccess<'_>,
) -> Option<(StatusCode, Value)> {
    let bad = |message: &str, code| Some((StatusCode::BAD_REQUEST, error(Value::Null, code, message)));
    let request: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(e) => return bad(&format!("the body is not JSON: {e}"), -32700),
    };
    let Some(request) = request.as_object() else {
        return bad("a request is one JSON-RPC object (batches are not taken)", -32600);
    };
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        // A response to nothing silpgate asked, or not JSON-RPC at all.
        return (!request.contains_key("result") && !request.contains_key("error"))
            .then(|| (StatusCode::BAD_REQUEST, error(Value::Null, -32600, "a request needs a method")));
    };
    let id = request.get("id")?.clone();
    let params = request.get("params").and_then(Value::as_object);
    let is_stateless = stateless::speaks_stateless(headers, params, &HANDSHAKE_VERSIONS);
    let answered = if is_stateless {
        stateless::check(method, params, headers)
            .map_err(|r| (r.code, r.message, r.data))
            .and_then(|_| answer_stateless(method, params, access))
    } else {
        answer_handshake(method, params, access)
    };
    Some(match answered {
        Ok(result) => (StatusCode::OK, json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Err((code, message, data)) => {
            let mut body = error(id, code, &message);
            if let Some(data) = data {
                body["error"]["data"] = data;
            }
            // The stateless revision gives these errors HTTP statuses, so that a proxy sees
            // them; the handshake era answers every JSON-RPC error with 200.
            let status = match code {
                _ if !is_stateless => StatusCode::OK,
                -32601 => StatusCode::NOT_FOUND,
                -32602 | stateless::HEADER_MISMATCH | stateless::UNSUPPORTED_PROTOCOL_VERSION => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::OK,
            };
            (status, body)
        }
    })
}

/// A handshake-era request's result.
fn answer_handshake(
    method: &str,
    params: Option<&Map<String, Value>>,
    access: &ToolAccess<'_>,
) -> Result<Value, Failure> {
    match method {
        "initialize" => Ok(initialize(params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": access.list()})),
        "tools/call" => call(params, access),
        _ => Err(not_served(method)),
    }
}

/// A 2026-07-28 request's result: every result says it is complete, and lists say how long
/// they may be kept.
fn answer_stateless(
    method: &str,
    params: Option<&Map<String, Value>>,
    access: &ToolAccess<'_>,
) -> Result<Value, Failure> {
    let mut result = match method {
        "server/discover" => json!({
            "supportedVersions": stateless::VERSIONS,
            "capabilities": {"tools": {"listChanged": false}},
            "instructions": INSTRUCTIONS,
            "ttlMs": TOOLS_TTL_MS,
            "cacheScope": "private",
            "_meta": {stateless::SERVER_INFO_KEY: server_info()},
        }),
        "tools/list" => json!({"tools": access.list(), "ttlMs": TOOLS_TTL_MS, "cacheScope": "private"}),
        "tools/call" => call(params, access)?,
        _ => return Err(not_served(method)),
    };
    result["resultType"] = json!("complete");
    Ok(result)
}

fn not_served(method: &str) -> Failure {
    (-32601, format!("method '{method}' is not served here"), None)
}

fn server_info() -> Value {
    json!({"name": "silpgate", "version": env!("CARGO_PKG_VERSION")})
}

fn initialize(params: Option<&Map<String, Value>>) -> Value {
    let asked = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str).unwrap_or_default();
    let version = HANDSHAKE_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&HANDSHAKE_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
    })
}

fn call(params: Option<&Map<String, Value>>, access: &ToolAccess<'_>) -> Result<Value, Failure> {
    let invalid = |message: String| (-32602, message, None);
    let name = params
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("tools/call needs a name".to_owned()))?;
    let arguments = match params.and_then(|p| p.get("arguments")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments.clone(),
        Some(_) => return Err(invalid("tools/call arguments must be an object".to_owned())),
    };
    let outcome = access.may_use(name).then(|| tools::call(name, &arguments, access.req_id_len)).flatten();
    let Some(outcome) = outcome else {
        return Err(invalid(format!("unknown tool '{name}'")));
    };
    Ok(match outcome {
        Ok(structured) => {
            json!({"content": [{"type": "text", "text": structured.to_string()}], "structuredContent": structured, "isError": false})
        }
        // No `structuredContent`: a client may hold it to the tool's `outputSchema`, which
        // describes results (the TypeScript SDK does, and throws). The error's code, message
        // and span travel in the text, as JSON, and in `_meta`.
        Err(e) => {
            let error = e.to_value();
            json!({"content": [{"type": "text", "text": error.to_string()}], "isError": true,
                   "_meta": {tools::ERROR_META: error}})
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    static NO_RULES: std::sync::LazyLock<std::collections::BTreeMap<String, Vec<String>>> =
        std::sync::LazyLock::new(Default::default);

    fn everyone() -> ToolAccess<'static> {
        ToolAccess { rules: &NO_RULES, principal: None, req_id_len: 8 }
    }

    #[test]
    fn a_tool_the_caller_may_not_use_is_neither_listed_nor_called() {
        let rules =
            std::collections::BTreeMap::from([("silp_compile".to_owned(), vec!["role:authors".to_owned()])]);
        let author = crate::principal::Principal::new("ann", vec!["authors".into()]);
        let reader = crate::principal::Principal::new("rob", Vec::new());
        let listed = |principal| {
            let access = ToolAccess { rules: &rules, principal: Some(principal), req_id_len: 8 };
            let (_, body) =
                respond(&HeaderMap::new(), br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, &access)
                    .unwrap();
            body["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert!(listed(&author).contains(&"silp_compile".to_owned()));
        assert!(!listed(&reader).contains(&"silp_compile".to_owned()));
        assert!(listed(&reader).contains(&"silp_decode".to_owned()), "a tool without rules is everyone's");
        let call = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"silp_compile","arguments":{}}}"#;
        let access = ToolAccess { rules: &rules, principal: Some(&reader), req_id_len: 8 };
        let (_, refused) = respond(&HeaderMap::new(), call, &access).unwrap();
        assert_eq!(refused["error"]["message"], "unknown tool 'silp_compile'", "{refused}");
    }

    fn handshake(body: &[u8]) -> Option<(StatusCode, Value)> {
        respond(&HeaderMap::new(), body, &everyone())
    }

    /// A 2026-07-28 request: its `_meta` envelope and the headers that repeat it.
    fn stateless(method: &str, mut params: Value) -> (StatusCode, Value) {
        params["_meta"] = json!({stateless::PROTOCOL_VERSION_KEY: "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}});
        let mut headers = HeaderMap::new();
        headers.insert("mcp-protocol-version", HeaderValue::from_static("2026-07-28"));
        headers.insert("mcp-method", HeaderValue::from_str(method).unwrap());
        if let Some(name) = params["name"].as_str() {
            headers.insert("mcp-name", HeaderValue::from_str(name).unwrap());
        }
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        respond(&headers, body.to_string().as_bytes(), &everyone()).unwrap()
    }

    #[test]
    fn handshake_requests_get_results_and_bad_bodies_get_json_rpc_errors() {
        let init = handshake(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#,
        );
        assert_eq!(init.unwrap().1["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(handshake(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), None);
        let not_json = handshake(b"{").unwrap();
        assert_eq!(
            (not_json.0, not_json.1["error"]["code"].clone()),
            (StatusCode::BAD_REQUEST, json!(-32700))
        );
        assert_eq!(handshake(b"[]").unwrap().1["error"]["code"], -32600);
        let unknown_method = handshake(br#"{"jsonrpc":"2.0","id":2,"method":"x"}"#).unwrap();
        assert_eq!(
            (unknown_method.0, unknown_method.1["error"]["code"].clone()),
            (StatusCode::OK, json!(-32601))
        );
        let unknown = handshake(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}"#);
        assert_eq!(unknown.unwrap().1["error"]["code"], -32602);
        let failed = handshake(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"silp_decode","arguments":{"text":"("}}}"#);
        let failed = failed.unwrap().1;
        assert_eq!(failed["result"]["isError"], true);
        assert!(failed["result"].get("structuredContent").is_none(), "{failed}");
        assert_eq!(failed["result"]["_meta"][tools::ERROR_META]["code"], "invalid_syntax");
        let text: Value =
            serde_json::from_str(failed["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["code"], "invalid_syntax", "the text says it too");
        assert!(failed["result"].get("resultType").is_none(), "handshake results keep their old shape");
    }

    #[test]
    fn stateless_requests_get_2026_07_28_results() {
        let (status, discovered) = stateless("server/discover", json!({}));
        assert_eq!(status, StatusCode::OK);
        let result = &discovered["result"];
        assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(result["resultType"], "complete");
        assert_eq!(result["_meta"][stateless::SERVER_INFO_KEY]["name"], "silpgate");
        assert!(result["capabilities"]["tools"].is_object());

        let (_, listed) = stateless("tools/list", json!({}));
        assert_eq!(listed["result"]["tools"].as_array().unwrap().len(), 4);
        assert_eq!(listed["result"]["cacheScope"], "private");
        assert_eq!(listed["result"]["ttlMs"], TOOLS_TTL_MS);
        assert_eq!(listed["result"]["resultType"], "complete");

        let (_, called) =
            stateless("tools/call", json!({"name": "silp_decode", "arguments": {"text": "cancel(order1)"}}));
        assert_eq!(called["result"]["structuredContent"]["ir"]["intent"], "!CANCEL", "{called}");
        assert_eq!(called["result"]["resultType"], "complete");

        // The handshake and ping are gone from this revision.
        let (status, initialize) = stateless("initialize", json!({}));
        assert_eq!((status, initialize["error"]["code"].clone()), (StatusCode::NOT_FOUND, json!(-32601)));
    }

    #[test]
    fn a_stateless_request_for_a_version_not_served_is_told_which_are() {
        let mut headers = HeaderMap::new();
        headers.insert("mcp-protocol-version", HeaderValue::from_static("2031-01-01"));
        headers.insert("mcp-method", HeaderValue::from_static("server/discover"));
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
            stateless::PROTOCOL_VERSION_KEY: "2031-01-01", "io.modelcontextprotocol/clientCapabilities": {}}}});
        let (status, refused) = respond(&headers, body.to_string().as_bytes(), &everyone()).unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(refused["error"]["code"], stateless::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(refused["error"]["data"]["supported"], json!(["2026-07-28"]));
        assert_eq!(refused["error"]["data"]["requested"], "2031-01-01");
    }
}
