//! MCP 2026-07-28, the stateless revision: no handshake, no session. Each request carries its
//! protocol version and the client's capabilities in `params._meta`, and over HTTP repeats its
//! version and method (and, for `tools/call`, the tool's name) in headers, so that a proxy can
//! route it without reading the body. This module decides whether a request speaks this
//! revision and checks its envelope, in the order the revision gives: the `_meta` pair
//! (-32602), the headers against the body (-32020), then the version (-32022, naming the
//! versions served).

use axum::http::HeaderMap;
use serde_json::{Map, Value, json};

/// The stateless revisions served.
pub(crate) const VERSIONS: [&str; 1] = ["2026-07-28"];

/// The `_meta` keys of the per-request envelope.
pub(crate) const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
/// The `_meta` key under which a result names its server.
pub(crate) const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

const VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// The JSON-RPC codes the revision adds.
pub(crate) const HEADER_MISMATCH: i64 = -32020;
pub(crate) const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// Why a stateless request's envelope is refused: a JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// True when a request speaks the stateless revision: its `MCP-Protocol-Version` header names
/// a version the handshake cannot reach (an unknown one included, so that it is told which
/// versions are served), or its `_meta` carries the per-request protocol version.
pub(crate) fn speaks_stateless(
    headers: &HeaderMap,
    params: Option<&Map<String, Value>>,
    handshake: &[&str],
) -> bool {
    let by_header = headers
        .get(VERSION_HEADER)
        .is_some_and(|v| v.to_str().map_or(true, |version| !handshake.contains(&version)));
    let by_meta = params
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object)
        .is_some_and(|meta| meta.contains_key(PROTOCOL_VERSION_KEY));
    by_header || by_meta
}

/// Checks the envelope of a stateless request: `Ok` with the version it speaks, or why not.
pub(crate) fn check(
    method: &str,
    params: Option<&Map<String, Value>>,
    headers: &HeaderMap,
) -> Result<&'static str, Refusal> {
    let invalid = |message: String| Refusal { code: -32602, message, data: None };
    let Some(meta) = params.and_then(|p| p.get("_meta")).and_then(Value::as_object) else {
        return Err(invalid(format!(
            "params._meta must be an object carrying '{PROTOCOL_VERSION_KEY}' and '{CLIENT_CAPABILITIES_KEY}'"
        )));
    };
    let missing: Vec<&str> = [PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(invalid(format!("params._meta lacks {}", missing.join(" and "))));
    }
    let version = &meta[PROTOCOL_VERSION_KEY];
    let mismatch = |message: String| Refusal { code: HEADER_MISMATCH, message, data: None };
    if header(headers, VERSION_HEADER).is_none_or(|h| Some(h) != version.as_str()) {
        return Err(mismatch(format!(
            "the {VERSION_HEADER} header does not match params._meta's protocol version"
        )));
    }
    if header(headers, METHOD_HEADER) != Some(method) {
        return Err(mismatch(format!("the {METHOD_HEADER} header does not match the method '{method}'")));
    }
    if method == "tools/call"
        && let Some(name) = params.and_then(|p| p.get("name")).and_then(Value::as_str)
        && header(headers, NAME_HEADER).and_then(decode_header_value).as_deref() != Some(name)
    {
        return Err(mismatch(format!("the {NAME_HEADER} header does not match the tool name '{name}'")));
    }
    let Some(version) = version.as_str() else {
        return Err(invalid("the protocol version in params._meta must be a string".into()));
    };
    VERSIONS.iter().copied().find(|v| *v == version).ok_or_else(|| Refusal {
        code: UNSUPPORTED_PROTOCOL_VERSION,
        message: format!("protocol version '{version}' is not served here"),
        data: Some(json!({"supported": VERSIONS, "requested": version})),
    })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A header value as the client meant it: values that an HTTP field cannot carry verbatim
/// travel as `=?base64?…?=`. A malformed one is `None`, and so never matches.
fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine as _;
    let Some(encoded) = value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) else {
        return Some(value.to_owned());
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn params(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    fn meta(version: &str) -> Value {
        json!({PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: {}})
    }

    #[test]
    fn a_request_speaks_the_stateless_revision_by_its_header_or_its_meta() {
        let handshake = ["2025-06-18", "2025-11-25"];
        assert!(speaks_stateless(&headers(&[("mcp-protocol-version", "2026-07-28")]), None, &handshake));
        assert!(speaks_stateless(&headers(&[("mcp-protocol-version", "2031-01-01")]), None, &handshake));
        assert!(!speaks_stateless(&headers(&[("mcp-protocol-version", "2025-11-25")]), None, &handshake));
        let with_meta = params(json!({"_meta": meta("2026-07-28")}));
        assert!(speaks_stateless(&HeaderMap::new(), Some(&with_meta), &handshake));
        assert!(!speaks_stateless(&HeaderMap::new(), Some(&params(json!({"_meta": {}}))), &handshake));
    }

    #[test]
    fn the_envelope_is_checked_meta_first_then_headers_then_version() {
        let good = headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")]);
        let with_meta = params(json!({"_meta": meta("2026-07-28")}));
        assert_eq!(check("tools/list", Some(&with_meta), &good), Ok("2026-07-28"));

        let no_caps = params(json!({"_meta": {PROTOCOL_VERSION_KEY: "2026-07-28"}}));
        let refused = check("tools/list", Some(&no_caps), &good).unwrap_err();
        assert_eq!(refused.code, -32602);
        assert!(refused.message.contains(CLIENT_CAPABILITIES_KEY), "{}", refused.message);
        assert_eq!(check("tools/list", None, &good).unwrap_err().code, -32602);

        let other_method = headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call")]);
        assert_eq!(check("tools/list", Some(&with_meta), &other_method).unwrap_err().code, HEADER_MISMATCH);
        let no_version = headers(&[("mcp-method", "tools/list")]);
        assert_eq!(check("tools/list", Some(&with_meta), &no_version).unwrap_err().code, HEADER_MISMATCH);

        let future = params(json!({"_meta": meta("2031-01-01")}));
        let later = headers(&[("mcp-protocol-version", "2031-01-01"), ("mcp-method", "tools/list")]);
        let refused = check("tools/list", Some(&future), &later).unwrap_err();
        assert_eq!(refused.code, UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(refused.data.unwrap()["supported"], json!(["2026-07-28"]));
    }

    #[test]
    fn a_tool_call_names_its_tool_in_a_header_plain_or_base64() {
        let call = params(json!({"name": "silp_hash", "_meta": meta("2026-07-28")}));
        let named = |name: &str| {
            headers(&[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", name),
            ])
        };
        assert!(check("tools/call", Some(&call), &named("silp_hash")).is_ok());
        assert!(check("tools/call", Some(&call), &named("=?base64?c2lscF9oYXNo?=")).is_ok());
        assert_eq!(
            check("tools/call", Some(&call), &named("silp_decode")).unwrap_err().code,
            HEADER_MISMATCH
        );
        assert_eq!(
            check("tools/call", Some(&call), &named("=?base64?!!?=")).unwrap_err().code,
            HEADER_MISMATCH
        );
    }
}
