//! `[[streams]]`: upstream WebSocket servers silpgate connects to and takes messages from.

use super::{ConfigError, FrameEncoding, is_loopback};
use serde::Deserialize;

/// An upstream WebSocket stream (ECMA-432) silpgate connects to as a client: every NLIP
/// message the server sends is taken through the intake like any other, and its reply (the
/// route's reply, the agent's answer, a delivery confirmation or an error) is written back on
/// the same socket, in the order the messages came. A stream has no acknowledgement:
/// docs/protocol.md says what is delivered and what a broken connection may lose.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// The stream's name: the `source` routes match its messages on.
    pub name: String,
    /// The server: `ws://` (loopback, or with `plain = true`) or `wss://`.
    pub url: String,
    /// Frames: `cbor` (binary, the default) or `json` (text).
    #[serde(default)]
    pub encoding: FrameEncoding,
    /// Environment variable holding the bearer token presented on the upgrade request. The
    /// variable must be set when named. Default: none.
    pub token_env: Option<String>,
    /// PEM file of extra certificate authorities a `wss://` server is verified against.
    pub ca_file: Option<std::path::PathBuf>,
    /// Allow `ws://` to a host other than loopback. Default false.
    #[serde(default)]
    pub plain: bool,
    /// First and longest wait between two connection attempts, in milliseconds (doubling,
    /// with jitter). Defaults 200 and 10000.
    #[serde(default = "stream_reconnect_initial_ms")]
    pub reconnect_initial_ms: u64,
    #[serde(default = "stream_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// Messages taken from the stream and not yet answered; at the bound silpgate stops
    /// reading (the server feels back-pressure). Default 256.
    #[serde(default = "stream_in_flight")]
    pub max_in_flight: usize,
}

fn stream_reconnect_initial_ms() -> u64 {
    200
}

fn stream_reconnect_max_ms() -> u64 {
    10_000
}

fn stream_in_flight() -> usize {
    256
}

impl StreamConfig {
    /// The URL must be ws(s), and plain WebSocket may not leave the machine unless asked for.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let invalid = |why: &str| ConfigError::Invalid(format!("stream '{}': url: {why}", self.name));
        let parsed: axum::http::Uri = self.url.parse().map_err(|_| invalid("not a URL"))?;
        let host = parsed.host().ok_or_else(|| invalid("no host"))?;
        match parsed.scheme_str() {
            Some("wss") => Ok(()),
            Some("ws") if self.plain || is_loopback(host) => Ok(()),
            Some("ws") => Err(invalid(
                "plain ws:// to a host other than loopback; use wss://, or set plain = true for this stream",
            )),
            _ => Err(invalid("the scheme must be ws:// or wss://")),
        }
    }
}
