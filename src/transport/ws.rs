//! NLIP over WebSocket (ECMA-432): `/nlip/ws` carries one CBOR-encoded NLIP message per binary
//! message, `/nlip/ws/text` one JSON message per text message. Replies come back on the same
//! socket in request order. The server pings idle sockets and drops those that stop answering.
//!
//! Close codes: 1003 for the wrong frame type on an endpoint, 1007 for a text message that is
//! not UTF-8, 1009 for a message over the size limit, 1008 for a dead peer (no pong).

use super::Front;
use super::http::authenticate;
use super::limit::Bucket;
use crate::gateway::Transport;
use crate::nlip::reply::{self, Location};
use crate::nlip::{self, Encoding, Message};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message as Frame};

pub async fn upgrade_cbor(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    upgrade(front, request, Encoding::Cbor, peer)
}

pub async fn upgrade_text(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    upgrade(front, request, Encoding::Json, peer)
}

/// Answers the WebSocket handshake (RFC 6455 §4.2) and hands the upgraded connection to a
/// socket task. Authentication happens here, before the upgrade.
fn upgrade(front: Arc<Front>, mut request: Request, encoding: Encoding, peer: SocketAddr) -> Response {
    let client = match authenticate(&front, request.headers(), peer) {
        Ok(identity) => super::client_key(identity, peer),
        Err(denied) => return denied.into_response(),
    };
    let headers = request.headers();
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let version_ok = headers.get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v == "13");
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return (StatusCode::BAD_REQUEST, "a WebSocket upgrade request is expected here\n").into_response();
    };
    if !is_upgrade || !version_ok {
        return (StatusCode::BAD_REQUEST, "a WebSocket upgrade (version 13) is expected here\n")
            .into_response();
    }
    // Every message on the socket continues the trace of the upgrade request, if it had one.
    let trace = crate::telemetry::extract_http(request.headers());
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(front.limits.max_bytes))
                    .max_frame_size(Some(front.limits.max_bytes));
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                        .await;
                serve_socket(front, socket, encoding, client, trace).await;
            }
            Err(e) => tracing::warn!(error = %e, "WebSocket upgrade failed."),
        }
    });
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    response
}

fn close(code: CloseCode, reason: &str) -> Frame {
    Frame::Close(Some(CloseFrame { code, reason: reason.to_owned().into() }))
}

/// Sends one frame; false when the socket is gone or the peer has not taken the frame within
/// `within` (a peer that stops reading would otherwise hold the task and its buffers forever).
async fn send<S>(socket: &mut WebSocketStream<S>, within: Duration, frame: Frame) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    matches!(tokio::time::timeout(within, socket.send(frame)).await, Ok(Ok(())))
}

fn frame(message: &Message, encoding: Encoding) -> Frame {
    match encoding {
        Encoding::Cbor => Frame::Binary(nlip::encode(message, Encoding::Cbor).into()),
        Encoding::Json => Frame::Text(nlip::to_json(message).into()),
    }
}

/// One socket: messages in, replies out in the same order, pings while idle.
async fn serve_socket<S>(
    front: Arc<Front>,
    socket: WebSocketStream<S>,
    encoding: Encoding,
    client: String,
    trace: opentelemetry::Context,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut socket = socket;
    let mut ticker = tokio::time::interval(front.ws_ping);
    ticker.tick().await;
    let mut last_heard = Instant::now();
    let mut connection = Bucket::new(front.connection_rate.0, front.connection_rate.1);
    loop {
        let next = tokio::select! {
            next = socket.next() => next,
            _ = ticker.tick() => {
                if last_heard.elapsed() > front.ws_dead {
                    send(&mut socket, front.ws_dead, close(CloseCode::Policy, "no answer to pings")).await;
                    return;
                }
                if !send(&mut socket, front.ws_dead, Frame::Ping(Vec::new().into())).await {
                    return;
                }
                continue;
            }
        };
        last_heard = Instant::now();
        let bytes: Vec<u8> = match (next, encoding) {
            (None, _) => return,
            (Some(Ok(Frame::Binary(b))), Encoding::Cbor) => b.to_vec(),
            (Some(Ok(Frame::Text(t))), Encoding::Json) => t.as_bytes().to_vec(),
            (Some(Ok(Frame::Text(_))), Encoding::Cbor) => {
                send(
                    &mut socket,
                    front.ws_dead,
                    close(
                        CloseCode::Unsupported,
                        "/nlip/ws takes binary CBOR messages; JSON text goes to /nlip/ws/text",
                    ),
                )
                .await;
                return;
            }
            (Some(Ok(Frame::Binary(_))), Encoding::Json) => {
                send(
                    &mut socket,
                    front.ws_dead,
                    close(
                        CloseCode::Unsupported,
                        "/nlip/ws/text takes JSON text messages; CBOR goes to /nlip/ws",
                    ),
                )
                .await;
                return;
            }
            (Some(Ok(Frame::Close(_))), _) => return,
            (Some(Ok(_)), _) => continue, // ping, pong
            (Some(Err(tungstenite::Error::Capacity(e))), _) => {
                let reason = format!("message too big: {e}");
                send(&mut socket, front.ws_dead, close(CloseCode::Size, &reason)).await;
                return;
            }
            (Some(Err(tungstenite::Error::Utf8(_))), _) => {
                send(&mut socket, front.ws_dead, close(CloseCode::Invalid, "a text message must be UTF-8"))
                    .await;
                return;
            }
            (Some(Err(_)), _) => return,
        };
        let admitted = if !connection.take(Instant::now()) {
            Err(super::rate_limited("this connection", connection.retry_after().max(1)))
        } else {
            front.clients.admit(&client).map_err(|retry| super::rate_limited("this client", retry))
        };
        if let Err(refusal) = admitted {
            if !send(&mut socket, front.ws_dead, frame(&refusal, encoding)).await {
                return;
            }
            continue;
        }
        let replies = match nlip::decode(&bytes, encoding, &front.limits) {
            Ok(envelope) => front.answer(envelope, Transport::WebSocket, "ws", trace.clone()).await.replies,
            Err(e) if encoding == Encoding::Cbor && e.kind == nlip::NlipErrorKind::InvalidEncoding => {
                // ECMA-432 §11: the CBOR decoding failure message, and the fallback hint.
                let message = format!("CBOR decoding failed. Fallback to text recommended. ({})", e.message);
                vec![reply::error_message(e.kind.code(), &message, &Location::None)]
            }
            Err(e) => front.gateway.reject_undecodable(e).outbound.into_iter().map(|o| o.envelope).collect(),
        };
        for reply in &replies {
            if !send(&mut socket, front.ws_dead, frame(reply, encoding)).await {
                return;
            }
        }
    }
}
