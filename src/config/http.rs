//! `[http]`: the listener of the HTTP, WebSocket, A2A and MCP doors, and how it holds its
//! clients to their share.

use super::ConfigError;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on. Default `127.0.0.1:8787`.
    pub listen: String,
    /// The base URL clients reach this gateway at (`https://gateway.example`), named in the
    /// A2A agent card. Default: `http://` or `https://` and the address it listens on; never
    /// the request's `Host` header, which the client chooses.
    pub public_url: Option<String>,
    /// Serve plain HTTP and WebSocket when no TLS certificate is configured. Only for local
    /// use: ECMA-434 asks for TLS on every production hop. Default false: without `tls_cert`
    /// and `tls_key`, the listener refuses to start unless this says plain is wanted.
    pub plain: bool,
    /// PEM certificate chain for https/wss.
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for https/wss.
    pub tls_key: Option<std::path::PathBuf>,
    /// The oldest TLS version the listener accepts: `"1.2"` (default) or `"1.3"`, for
    /// deployments that follow the NLIP security guidelines' TLS 1.3-only rule.
    pub min_tls: MinTls,
    /// Bearer tokens clients must present (`Authorization: Bearer <token>`). Empty, and
    /// `tokens_env` unset: no client authentication (local use).
    pub tokens: Vec<String>,
    /// Environment variable holding more bearer tokens, comma-separated (for secrets).
    pub tokens_env: Option<String>,
    /// Seconds between server pings on an idle WebSocket. Default 20.
    pub ws_ping_secs: u64,
    /// A socket that has not answered a ping for this many seconds is closed. Default 60.
    pub ws_dead_secs: u64,
    /// Messages per second one client (bearer token, else address) may send on average;
    /// 0: no limit. Default 500.
    pub client_rate: f64,
    /// Burst a client may send at once. Default 1000.
    pub client_burst: f64,
    /// Messages per second on one WebSocket; 0: no limit. Default 200.
    pub connection_rate: f64,
    /// Burst on one WebSocket. Default 1000.
    pub connection_burst: f64,
    /// HTTP and WebSocket connections open at once; one more is refused (plain: 503). Keep it
    /// below the process's open-file limit. Default 1024.
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers, and the longest a kept-alive
    /// connection may idle between requests. Default 10.
    pub header_timeout_secs: u64,
    /// Seconds a client has to complete the TLS handshake. Default 10.
    pub handshake_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body once its headers are in (1 MiB at
    /// 35 KB/s); a body still arriving then is answered 408 `timeout` and the connection
    /// closed, so that clients dribbling bodies cannot hold the connections. Default 30.
    pub body_timeout_secs: u64,
    /// Conversations one client (bearer token, else address) may keep live at once (each
    /// active within `sessions.idle_timeout_secs`); a message opening one more is refused
    /// with `too_many_conversations` (HTTP 429) and nothing of it is stored. 0: no limit.
    /// Default 256.
    pub max_conversations_per_client: usize,
    /// Ask for a bearer token on `GET /metrics` and `GET /cluster` too, as on `/nlip`.
    /// Default false (scrapers and probes usually come from inside the network).
    pub observability_tokens: bool,
    /// Browser origins allowed to open a WebSocket or POST to `/nlip`, `/mcp` and `/a2a`
    /// (`Origin` header, e.g. `https://app.example.com`), besides pages of this machine. A
    /// request carrying any other `Origin` is refused with 403,
    /// so that a web page cannot drive a gateway on the visitor's machine; clients that send
    /// no `Origin` (programs, not browsers) are not affected. Default: none.
    pub allowed_origins: Vec<String>,
    /// Addresses of proxies in front of silpgate (TLS terminators, load balancers) whose
    /// `X-Forwarded-For` header names the client, so that rate and conversation limits apply
    /// per client instead of to the proxy. Default: none (the peer's address is the client's).
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:8787".into(),
            public_url: None,
            plain: false,
            tls_cert: None,
            tls_key: None,
            min_tls: MinTls::V1_2,
            tokens: Vec::new(),
            tokens_env: None,
            ws_ping_secs: 20,
            ws_dead_secs: 60,
            client_rate: 500.0,
            client_burst: 1000.0,
            connection_rate: 200.0,
            connection_burst: 1000.0,
            max_connections: 1024,
            header_timeout_secs: 10,
            handshake_timeout_secs: 10,
            body_timeout_secs: 30,
            max_conversations_per_client: 256,
            observability_tokens: false,
            allowed_origins: Vec::new(),
            trusted_proxies: Vec::new(),
        }
    }
}

/// The oldest TLS version a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum MinTls {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl HttpConfig {
    /// True when the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "http.tls_cert and http.tls_key go together: set both, or neither".into(),
            ));
        }
        Ok(())
    }
}
