//! The transports silpgate speaks, in one vocabulary: the one a message arrived on, and the
//! one an agent is reached by. Metrics, spans, logs and `agents check` name them the same way.

/// A transport. The A2A and MCP doors take messages over HTTP; A2A and MCP name agents'
/// protocols, each over HTTP of its own kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Amqp,
    Http,
    WebSocket,
    A2a,
    Mcp,
    Cli,
}

impl Transport {
    /// The `transport` label of metrics and spans, and its name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Amqp => "amqp",
            Transport::Http => "http",
            Transport::WebSocket => "websocket",
            Transport::A2a => "a2a",
            Transport::Mcp => "mcp",
            Transport::Cli => "cli",
        }
    }
}
