//! NLIP over WebSocket (ECMA-432): `/nlip/ws` carries one CBOR-encoded NLIP message per binary
//! message, `/nlip/ws/text` one JSON message per text message. A socket's messages are taken
//! through the intake in the order they came (a conversation's turns keep it), and many may
//! wait for their agents at once: a reply route's envelope comes back at once, in order, an
//! agent's answer when the agent gives it, so answers follow the order in which agents answer. The server pings idle sockets and drops those that stop answering.
//!
//! Close codes: 1003 for the wrong frame type on an endpoint, 1007 for a text message that is
//! not UTF-8, 1009 for a message over the size limit, 1008 for a dead peer (no pong).

use super::admission::authenticate;
use super::limit::Bucket;
use super::{Front, Submitted, ToSender};
use crate::gateway::Transport;
use crate::nlip::reply::{self, Location};
use crate::nlip::{self, Encoding, Message};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use tokio::sync::Semaphore;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message as Frame};

pub(crate) async fn upgrade_cbor(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    upgrade(front, request, Encoding::Cbor, peer).await
}

pub(crate) async fn upgrade_text(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    upgrade(front, request, Encoding::Json, peer).await
}

/// Answers the WebSocket handshake (RFC 6455 §4.2) and hands the upgraded connection to a
/// socket task. Authentication happens here, before the upgrade.
async fn upgrade(front: Arc<Front>, mut request: Request, encoding: Encoding, peer: SocketAddr) -> Response {
    if let Some(refused) = foreign_origin(&front, request.headers()) {
        return refused;
    }
    let (client, principal) = match authenticate(&front, request.headers(), peer).await {
        Ok(identity) => (
            super::client_key(&identity, front.client_address(request.headers(), peer)),
            identity.principal().cloned(),
        ),
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
                serve_socket(front, socket, encoding, (client, principal), trace).await;
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

/// The refusal of an upgrade from a browser page of an origin not allowed: a page must not be
/// able to drive a gateway it reaches from the visitor's machine (programs send no `Origin`).
fn foreign_origin(front: &Front, headers: &axum::http::HeaderMap) -> Option<Response> {
    if super::admission::origin_allowed(&front.allowed_origins, headers) {
        return None;
    }
    let message = reply::error_message(
        "forbidden",
        "WebSocket upgrades from this origin are not allowed (http.allowed_origins)",
        &Location::None,
    );
    let mut response = Response::new(Body::from(nlip::to_json(&message)));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Some(response)
}

fn close(code: CloseCode, reason: &str) -> Frame {
    Frame::Close(Some(CloseFrame { code, reason: reason.to_owned().into() }))
}

fn frame(message: &Message, encoding: Encoding) -> Frame {
    match encoding {
        Encoding::Cbor => Frame::Binary(nlip::encode(message, Encoding::Cbor).into()),
        Encoding::Json => Frame::Text(nlip::to_json(message).into()),
    }
}

/// Ends when a credential good until `valid_until` (seconds since the Unix epoch) expires;
/// never without one.
async fn credential_expiry(valid_until: Option<u64>) {
    let Some(valid_until) = valid_until else { return std::future::pending().await };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(valid_until).saturating_sub(now)).await;
}

/// Requests one socket may have in flight; the next waits for one to finish, which in turn
/// stops reading from the socket (the peer feels back-pressure, memory stays bounded).
const IN_FLIGHT_PER_SOCKET: usize = 256;

/// A socket's sending half, shared by the task that reads the socket and the tasks that wait
/// for agents' answers. A reply known at once is written by the reader itself: handing it to
/// another task cost a cross-thread wake per message whenever the two ran on different worker
/// threads (a bimodal WebSocket round trip, about 21 or 70-90 µs on the 2-vCPU VM). A write
/// never takes longer than `ws_dead`, so a slow peer holds up only its own socket.
struct Writer<S> {
    sink: tokio::sync::Mutex<Option<SplitSink<WebSocketStream<S>, Frame>>>,
    dead: Duration,
}

impl<S> Writer<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    /// Writes one frame; false once the socket cannot be written (or was finished).
    async fn send(&self, frame: Frame) -> bool {
        let mut sink = self.sink.lock().await;
        let Some(open) = sink.as_mut() else { return false };
        let sent = matches!(tokio::time::timeout(self.dead, open.send(frame)).await, Ok(Ok(())));
        if !sent {
            *sink = None;
        }
        sent
    }

    /// Writes the last frame, if any, and lets the sending half go: later writes fail.
    async fn finish(&self, last: Option<Frame>) {
        if let Some(frame) = last {
            self.send(frame).await;
        }
        self.sink.lock().await.take();
    }
}

/// One socket: messages in, each taken through the intake in the order it came, agents'
/// answers awaited side by side (many in flight) and written as they come; pings while idle.
async fn serve_socket<S>(
    front: Arc<Front>,
    socket: WebSocketStream<S>,
    encoding: Encoding,
    (client, principal): (String, Option<crate::principal::Principal>),
    trace: opentelemetry::Context,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut stream) = socket.split();
    let writer = Arc::new(Writer { sink: tokio::sync::Mutex::new(Some(sink)), dead: front.ws_dead });
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT_PER_SOCKET));
    let mut ticker = tokio::time::interval(front.ws_ping);
    ticker.tick().await;
    let mut last_heard = Instant::now();
    let mut connection = Bucket::new(front.connection_rate.0, front.connection_rate.1);
    // One channel for the socket's interim events: its messages are submitted one at a time,
    // and each message only clones the sender.
    let (progress, mut reports) = tokio::sync::mpsc::unbounded_channel();
    // A socket opened with a JWT is that principal's only while the JWT is good.
    let expiry = credential_expiry(principal.as_ref().and_then(|p| p.valid_until));
    tokio::pin!(expiry);
    let closing = loop {
        let next = tokio::select! {
            next = stream.next() => next,
            () = &mut expiry => {
                break Some(close(
                    CloseCode::Policy,
                    "the token this socket was opened with has expired; connect again with a fresh one",
                ));
            }
            _ = ticker.tick() => {
                if last_heard.elapsed() > front.ws_dead {
                    break Some(close(CloseCode::Policy, "no answer to pings"));
                }
                if !writer.send(Frame::Ping(Vec::new().into())).await {
                    break None;
                }
                continue;
            }
        };
        last_heard = Instant::now();
        let bytes: Vec<u8> = match (next, encoding) {
            (None, _) => break None,
            (Some(Ok(Frame::Binary(b))), Encoding::Cbor) => b.to_vec(),
            (Some(Ok(Frame::Text(t))), Encoding::Json) => t.as_bytes().to_vec(),
            (Some(Ok(Frame::Text(_))), Encoding::Cbor) => {
                break Some(close(
                    CloseCode::Unsupported,
                    "/nlip/ws takes binary CBOR messages; JSON text goes to /nlip/ws/text",
                ));
            }
            (Some(Ok(Frame::Binary(_))), Encoding::Json) => {
                break Some(close(
                    CloseCode::Unsupported,
                    "/nlip/ws/text takes JSON text messages; CBOR goes to /nlip/ws",
                ));
            }
            (Some(Ok(Frame::Close(_))), _) => break None,
            (Some(Ok(_)), _) => continue, // ping, pong
            (Some(Err(tungstenite::Error::Capacity(e))), _) => {
                break Some(close(CloseCode::Size, &format!("message too big: {e}")));
            }
            (Some(Err(tungstenite::Error::Utf8(_))), _) => {
                break Some(close(CloseCode::Invalid, "a text message must be UTF-8"));
            }
            (Some(Err(_)), _) => break None,
        };
        let admitted = if !connection.take(Instant::now()) {
            Err(super::rate_limited("this connection", connection.retry_after().max(1)))
        } else {
            front.clients.admit(&client).map_err(|retry| super::rate_limited("this client", retry))
        };
        if let Err(refusal) = admitted {
            if !writer.send(frame(&refusal, encoding)).await {
                break None;
            }
            continue;
        }
        let Ok(slot) = in_flight.clone().acquire_owned().await else { break None };
        // Messages are taken in the order they came, so that a conversation's turns keep it;
        // the answers they wait for are awaited side by side.
        // An agent's interim events are written as they come, before the answer.
        let asker = super::Asker::new(Transport::WebSocket, "ws", principal.clone());
        let submitted = submit(&front, (&client, asker), &bytes, encoding, trace.clone(), progress.clone());
        tokio::pin!(submitted);
        let submitted = loop {
            tokio::select! {
                biased;
                Some(report) = reports.recv() => {
                    writer.send(frame(&report, encoding)).await;
                }
                submitted = &mut submitted => break submitted,
            }
        };
        while let Ok(report) = reports.try_recv() {
            writer.send(frame(&report, encoding)).await;
        }
        match submitted {
            Submitted::Ready(answer) => {
                for message in messages_of(answer) {
                    if !writer.send(frame(&message, encoding)).await {
                        break;
                    }
                }
            }
            Submitted::Awaiting(awaiting) => {
                let writer = writer.clone();
                tokio::spawn(async move {
                    for message in messages_of(awaiting.wait().await) {
                        writer.send(frame(&message, encoding)).await;
                    }
                    drop(slot);
                });
            }
        }
    };
    if closing.is_none() {
        // Answers still on their way are written first: each task holds its slot until then.
        let _ = in_flight.acquire_many(IN_FLIGHT_PER_SOCKET as u32).await;
    }
    writer.finish(closing).await;
}

/// Takes one message a socket sent through the intake.
async fn submit(
    front: &Front,
    (client, asker): (&str, super::Asker<'_>),
    bytes: &[u8],
    encoding: Encoding,
    trace: opentelemetry::Context,
    progress: tokio::sync::mpsc::UnboundedSender<Message>,
) -> Submitted {
    let refused = |message: Message| {
        Submitted::Ready(ToSender::Refused { message, code: String::new(), transient: false })
    };
    match nlip::decode(bytes, encoding, &front.limits) {
        Ok(envelope) => {
            match front.conversations.admit(client, envelope.conversation_token(), Instant::now()) {
                Err(limit) => refused(super::limit::too_many_conversations(limit)),
                Ok(()) => front.submit_streaming(envelope, asker, trace, progress).await,
            }
        }
        Err(e) => {
            let unreadable = front.intake.unreadable(e, encoding);
            refused(unreadable.replies.into_iter().next().expect("an unreadable message is answered"))
        }
    }
}

/// The envelopes a socket gets back for an answer, in order.
fn messages_of(answer: ToSender) -> Vec<Message> {
    match answer {
        ToSender::Reply { mut notices, reply } => {
            notices.push(reply);
            notices
        }
        ToSender::Refused { message, .. } => vec![message],
        ToSender::Accepted(ids) => vec![crate::nlip::reply::accepted(&ids)],
    }
}
