//! Who may come in through the HTTP server's doors (`/nlip`, its WebSocket upgrades, `/a2a`,
//! `/mcp`): the bearer token and the per-client rate limit, and the responses that refuse a
//! request for either, as NLIP error messages.

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

/// Why a request goes no further than authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            Denied::RateLimited(retry_after) => rate_limited_response(retry_after),
        }
    }
}

/// Who sent a request. A refused token is charged to the caller's address under the
/// per-client rate limit, so that guessing tokens is throttled too.
pub(crate) fn authenticate(front: &Front, headers: &HeaderMap, peer: SocketAddr) -> Result<Identity, Denied> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    front.auth.check(authorization).map_err(|refusal| {
        match front
            .clients
            .admit(&super::client_key(Identity::Anonymous, front.client_address(headers, peer)))
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
