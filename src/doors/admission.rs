//! Who may come in through the HTTP server's doors (`/nlip`, its WebSocket upgrades, `/a2a`,
//! `/mcp`): the bearer token and the per-client rate limit, and the responses that refuse a
//! request for either, as NLIP error messages; and which browser origins may drive them.

use super::Front;
use super::auth::{Identity, Refusal};
use crate::nlip::reply::{self, Location};
use crate::nlip::{self, Encoding, Message};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

/// An NLIP message as an HTTP response.
pub(crate) fn message_response(status: StatusCode, message: &Message, encoding: Encoding) -> Response {
    let mut response = Response::new(Body::from(nlip::encode(message, encoding)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(encoding.content_type()));
    response
}

/// An NLIP error message as an HTTP response.
pub(crate) fn error_response(status: StatusCode, code: &str, message: &str, encoding: Encoding) -> Response {
    message_response(status, &reply::error_message(code, message, &Location::None), encoding)
}

/// Why a request from a browser page of another origin is refused.
pub(crate) const FOREIGN_ORIGIN: &str = "requests from this origin are not allowed (http.allowed_origins): a web page elsewhere may not drive this endpoint";

/// True when a request from a browser page may go on: it carries no `Origin` (programs send
/// none), or its origin is in `http.allowed_origins`, or it is a page this machine serves
/// (`localhost`, `127.0.0.1`, `[::1]`, any port). A page elsewhere must not drive a gateway it
/// reaches through the visitor's browser: that is DNS rebinding, where the page's origin stays
/// its own name however its address resolves.
pub(crate) fn origin_allowed(allowed_origins: &[String], headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(origin)) || is_loopback_origin(origin)
}

fn is_loopback_origin(origin: &str) -> bool {
    let Ok(uri) = origin.parse::<axum::http::Uri>() else {
        return false;
    };
    let web = matches!(uri.scheme_str(), Some("http" | "https"));
    let bare = uri.path_and_query().is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    web && bare
        && uri
            .host()
            .is_some_and(|h| matches!(h.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "[::1]"))
}

/// Why a request goes no further than authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    Unauthenticated(Refusal),
    /// Over the per-client limit; retry after this many seconds.
    RateLimited(u64),
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Denied::Unauthenticated(Refusal::Missing) => {
                let mut r = error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "a bearer token is required: send Authorization: Bearer <token>",
                    Encoding::Json,
                );
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            }
            Denied::Unauthenticated(Refusal::Wrong) => error_response(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the bearer token is not accepted",
                Encoding::Json,
            ),
            Denied::Unauthenticated(Refusal::Invalid(why)) => {
                let mut r = error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    &why.to_string(),
                    Encoding::Json,
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
                r
            }
            Denied::RateLimited(retry_after) => rate_limited_response(retry_after),
        }
    }
}

/// Who sent a request. A refused token is charged to the caller's address under the
/// per-client rate limit, so that guessing tokens is throttled too.
pub(crate) async fn authenticate(
    front: &Front,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Identity, Denied> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    front.auth().check(authorization).await.map_err(|refusal| {
        // For an operator finding out why a client is turned away; the reason never holds
        // the credential itself.
        tracing::debug!(peer = %peer, refusal = ?refusal, "A request's credentials were refused.");
        match front
            .clients
            .admit(&super::client_key(&Identity::Anonymous, front.client_address(headers, peer)))
        {
            Err(retry_after) => Denied::RateLimited(retry_after),
            Ok(()) => Denied::Unauthenticated(refusal),
        }
    })
}

/// The refusal of a client over its rate: NLIP `rate_limited`, with `Retry-After`.
pub(crate) fn rate_limited_response(retry_after: u64) -> Response {
    let mut response = message_response(
        StatusCode::TOO_MANY_REQUESTS,
        &super::rate_limited("this client", retry_after),
        Encoding::Json,
    );
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(origin: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        headers
    }

    #[test]
    fn pages_of_this_machine_and_listed_origins_pass_and_others_do_not() {
        let listed = vec!["https://app.example.com".to_owned()];
        assert!(origin_allowed(&listed, &HeaderMap::new()));
        for origin in [
            "https://app.example.com",
            "http://localhost:8080",
            "http://127.0.0.1",
            "http://[::1]:3000",
            "HTTP://LOCALHOST:1",
        ] {
            assert!(origin_allowed(&listed, &from(origin)), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "null",
            "file://localhost",
            "http://evil.example/?localhost",
        ] {
            assert!(!origin_allowed(&listed, &from(origin)), "{origin}");
        }
    }
}
