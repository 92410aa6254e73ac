//! The accept loop of the HTTP/WebSocket door, plain or TLS, and the bounds that keep one
//! client from holding the door: a cap on open connections (WebSockets included, for as long
//! as their socket lives), a TLS handshake timeout, and hyper's header-read timeout, which also
//! closes a kept-alive connection that idles between requests.
//!
//! A connection over the cap goes to one of a few slots kept for probes, where only `/healthz`
//! and `/readyz` answer (one request, then closed), so that a full house still shows alive and
//! ready; when those are taken too it is refused at once (plain: a 503 with an NLIP error; TLS:
//! closed before the handshake, which would cost more than the refusal is worth) and counted.

/// Connections over the cap that may still ask `/healthz` or `/readyz`.
const PROBE_SLOTS: usize = 8;
/// The time such a connection has to send its request.
const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

use super::repoll::Repoll;
use crate::util::shutdown::Shutdown;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long connections may take and how many may be open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Open connections at most; one more is refused.
    pub max_connections: usize,
    /// Time to send a request's headers, and the longest idle time between two requests.
    pub header_timeout: Duration,
    /// Time to complete a TLS handshake.
    pub handshake_timeout: Duration,
    /// How long open connections get to finish after shutdown before they are dropped.
    pub drain: Duration,
}

/// Serves `app` until `shutdown` completes, then lets open connections finish their current
/// request (up to `bounds.drain`).
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    (app, probes): (Router, Router),
    bounds: Bounds,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    let probe_slots = Arc::new(Semaphore::new(PROBE_SLOTS));
    let saturated = AtomicBool::new(false);
    let (stop, stopping) = Shutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: the listener itself is fine; back off.
                Err(e) => {
                    tracing::warn!(error = %e, "Accepting a connection failed.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (slot, app, probing) = match slots.clone().try_acquire_owned() {
            Ok(slot) => (slot, app.clone(), false),
            Err(_) => match probe_slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    crate::metrics::get().connections_refused.inc();
                    (slot, probes.clone(), true)
                }
                Err(_) => {
                    refuse(tcp, tls.is_none(), bounds.max_connections, &saturated);
                    continue;
                }
            },
        };
        if probing {
            warn_saturated(bounds.max_connections, &saturated);
        } else {
            saturated.store(false, Ordering::Relaxed);
        }
        crate::metrics::get().connections_open.inc();
        let _ = tcp.set_nodelay(true);
        let connection = Connection { app, peer, bounds, stopping: stopping.clone(), one_request: probing };
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => connection.serve(Counted { io: tcp, _slot: slot }).await,
                Some(acceptor) => {
                    match tokio::time::timeout(bounds.handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => connection.serve(Counted { io: stream, _slot: slot }).await,
                        Ok(Err(_)) | Err(_) => crate::metrics::get().connections_open.dec(),
                    }
                }
            }
        });
    }
    stop.stop();
    // Every slot back means every connection has ended.
    let all = u32::try_from(bounds.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(bounds.drain, slots.acquire_many(all)).await;
    Ok(())
}

/// One accepted connection, before its bytes are known to be TLS or plain.
struct Connection {
    app: Router,
    peer: SocketAddr,
    bounds: Bounds,
    stopping: Shutdown,
    /// A probe slot's connection: one request, then closed.
    one_request: bool,
}

impl Connection {
    async fn serve<S>(mut self, io: Counted<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let app = self.app.layer(axum::Extension(ConnectInfo::<SocketAddr>(self.peer)));
        let mut http = hyper::server::conn::http1::Builder::new();
        let header_timeout = match self.one_request {
            // A probe sends its request at once; a slot held silent is a slot taken from one.
            true => self.bounds.header_timeout.min(PROBE_HEADER_TIMEOUT),
            false => self.bounds.header_timeout,
        };
        http.timer(TokioTimer::new()).header_read_timeout(header_timeout);
        if self.one_request {
            http.keep_alive(false);
        }
        let mut served = Repoll::new(
            http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app)).with_upgrades(),
        );
        tokio::select! {
            _ = &mut served => {}
            () = self.stopping.stopped() => {
                served.inner().graceful_shutdown();
                let _ = served.await;
            }
        }
    }
}

/// Turns away a connection over the cap, warning once per saturation.
fn refuse(tcp: TcpStream, plain: bool, cap: usize, saturated: &AtomicBool) {
    crate::metrics::get().connections_refused.inc();
    warn_saturated(cap, saturated);
    if plain {
        // A fresh socket's send buffer takes this whole: one non-blocking write, no task.
        let _ = tcp.try_write(&over_capacity_response(cap));
    }
}

/// Warns once per saturation that the cap is reached.
fn warn_saturated(cap: usize, saturated: &AtomicBool) {
    if !saturated.swap(true, Ordering::Relaxed) {
        tracing::warn!(max_connections = cap, "Connection cap reached; refusing new connections.");
    }
}

fn over_capacity_response(cap: usize) -> Vec<u8> {
    let detail = format!("the gateway serves {cap} connections at most; retry shortly");
    let body = crate::nlip::to_json(&crate::nlip::reply::error_message(
        "unavailable",
        &detail,
        &crate::nlip::reply::Location::None,
    ));
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection's stream holding its slot under the cap: the slot goes back when the stream
/// is dropped, which for a WebSocket is when the socket closes, not when HTTP hands it over.
struct Counted<S> {
    io: S,
    _slot: OwnedSemaphorePermit,
}

impl<S> Drop for Counted<S> {
    fn drop(&mut self) {
        crate::metrics::get().connections_open.dec();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
