//! The WebSocket wire (ECMA-432) as a client: dialing a URL (TLS always verified, the
//! bearer token of a `token_env`, the trace context on the upgrade request, one time bound for
//! connect, handshake and upgrade) and NLIP messages as frames. The WebSocket connector dials
//! its agents with it, and the stream door its upstream feeds.

use crate::nlip::{self, Encoding, Message};
use axum::http::HeaderValue;
use axum::http::header::AUTHORIZATION;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Time between pings on a connection; a connection silent for three of them is dead.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(15);

/// Anything a WebSocket runs over: TCP, or TLS over TCP.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A client WebSocket.
pub(crate) type Socket = WebSocketStream<Box<dyn Io>>;

/// Why a client connection cannot be set up. Never carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the environment variable {0} named by token_env is not set")]
    TokenUnset(String),
    #[error("{0}")]
    Invalid(String),
}

/// How to open a client WebSocket to one URL: TLS, the bearer token, the limits.
#[derive(Clone)]
pub(crate) struct Dialer {
    /// Without credentials: it is shown in spans and logs, and requested.
    url: String,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    authorization: Option<HeaderValue>,
    max_bytes: usize,
    timeout: Duration,
}

impl Dialer {
    /// `timeout` bounds the TCP connect, TLS handshake and upgrade together.
    pub(crate) fn new(
        url: &str,
        token_env: Option<&str>,
        ca_file: Option<&Path>,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Dialer, DialError> {
        let parsed: axum::http::Uri = url.parse().map_err(|_| DialError::Invalid("url: not a URL".into()))?;
        let secure = match parsed.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("wss") => true,
            Some(s) if s.eq_ignore_ascii_case("ws") => false,
            _ => return Err(DialError::Invalid("url: the scheme must be ws:// or wss://".into())),
        };
        let host = parsed.host().ok_or_else(|| DialError::Invalid("url: no host".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = parsed.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let path = parsed.path_and_query().map_or("/", |p| p.as_str());
        let scheme = if secure { "wss" } else { "ws" };
        let shown_host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
        let url = format!("{scheme}://{shown_host}:{port}{path}");
        let authorization = match token_env {
            None => None,
            Some(variable) => {
                let token = std::env::var(variable)
                    .ok()
                    .filter(|t| !t.trim().is_empty())
                    .ok_or_else(|| DialError::TokenUnset(variable.to_owned()))?;
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                    DialError::Invalid(format!("{variable} holds characters a header cannot carry"))
                })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let tls = if secure { Some(tls_connector(ca_file)?) } else { None };
        Ok(Dialer { url, host, port, tls, authorization, max_bytes, timeout })
    }

    /// The URL without credentials, for spans and logs.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Opens a connection; `span`'s context travels as `traceparent` on the upgrade request.
    pub(crate) async fn connect(&self, span: &tracing::Span) -> Result<Socket, String> {
        let mut request = self.url.as_str().into_client_request().map_err(|e| format!("url: {e}"))?;
        if let Some(value) = &self.authorization {
            request.headers_mut().insert(AUTHORIZATION, value.clone());
        }
        crate::telemetry::inject_http(span, request.headers_mut());
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Io> = match &self.tls {
                None => Box::new(tcp),
                Some(tls) => {
                    let name = ServerName::try_from(self.host.clone())
                        .map_err(|e| format!("TLS: the host is not a server name: {e}"))?;
                    Box::new(tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?)
                }
            };
            let config = WebSocketConfig::default()
                .max_message_size(Some(self.max_bytes))
                .max_frame_size(Some(self.max_bytes));
            let (socket, _) = tokio_tungstenite::client_async_with_config(request, io, Some(config))
                .await
                .map_err(|e| format!("upgrade: {e}"))?;
            Ok(socket)
        };
        tokio::time::timeout(self.timeout, connecting)
            .await
            .map_err(|_| format!("no connection within {} ms", self.timeout.as_millis()))?
    }
}

/// TLS verified against the system's roots plus `ca_file`, with ring.
fn tls_connector(ca_file: Option<&Path>) -> Result<tokio_rustls::TlsConnector, DialError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let extra: Vec<CertificateDer<'static>> = match ca_file {
        None => Vec::new(),
        Some(file) => CertificateDer::pem_file_iter(file)
            .map_err(|e| DialError::Invalid(format!("cannot read ca_file {}: {e}", file.display())))?
            .collect::<Result<_, _>>()
            .map_err(|e| DialError::Invalid(format!("ca_file {} is not PEM: {e}", file.display())))?,
    };
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
        .map_err(|e| DialError::Invalid(format!("TLS roots: {e}")))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DialError::Invalid(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One NLIP message as a frame.
pub(crate) fn frame_of(message: &Message, encoding: Encoding) -> Frame {
    match encoding {
        Encoding::Cbor => Frame::Binary(nlip::encode(message, Encoding::Cbor).into()),
        Encoding::Json => Frame::Text(nlip::to_json(message).into()),
    }
}

/// The NLIP message in a data frame (binary: CBOR, text: JSON, whatever was configured);
/// `None` for control frames.
pub(crate) fn message_of(frame: &Frame, limits: &nlip::Limits) -> Option<Result<Message, String>> {
    let decoded = match frame {
        Frame::Binary(bytes) => nlip::decode(bytes, Encoding::Cbor, limits),
        Frame::Text(text) => nlip::decode(text.as_bytes(), Encoding::Json, limits),
        _ => return None,
    };
    Some(decoded.map_err(|e| e.to_string()))
}
