//! The TOML configuration. Every field is documented where it is declared; unknown keys are
//! errors. `config/silpgate.toml` is the annotated default.

mod agents;

pub use agents::{
    A2aReach, AgentConfig, AmqpReach, BodyEncoding, FrameEncoding, HttpReach, McpReach, Outbound, Reach,
    WsReach,
};

use crate::silp::Frontend;
use crate::silp::tokens::Tokenizer;
use serde::Deserialize;
use std::path::Path;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This gateway's identity on the bus.
    pub gateway: GatewayConfig,
    /// SILP codec settings applied on every route.
    pub silp: SilpConfig,
    /// NLIP envelope limits.
    pub nlip: NlipConfig,
    /// Conversation sessions.
    pub sessions: SessionConfig,
    /// The durable state store.
    pub store: StoreConfig,
    /// The HTTP and WebSocket listener.
    pub http: HttpConfig,
    /// The RabbitMQ connection (AMQP 0-9-1). Absent: no broker, HTTP and WebSocket only.
    pub amqp: Option<AmqpConfig>,
    /// Cluster mode: several instances share the work through partitions on the broker
    /// (docs/cluster.md). Needs `[amqp]`. Absent: one instance.
    pub cluster: Option<ClusterConfig>,
    /// Logs and traces.
    pub telemetry: TelemetryConfig,
    /// Downstream agents and the frontends they accept.
    pub agents: Vec<AgentConfig>,
    /// Upstream WebSocket streams silpgate connects to and takes NLIP messages from.
    pub streams: Vec<StreamConfig>,
    /// Routing rules, tried in order; the first match wins.
    pub routes: Vec<RouteConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Name of this gateway; `//ping` answers and own tokens carry it. Default `silpgate`.
    pub name: String,
    /// Frontend used when nothing else decides (route, profile, `meta.out`). Default `code`.
    #[serde(deserialize_with = "frontend")]
    pub default_frontend: Frontend,
    /// How long a request waits for its agent's answer, in milliseconds. Past it an HTTP
    /// caller gets 504 with the SILP `timeout` code, a socket an NLIP `timeout` error, and the
    /// late answer goes to the dead-letter queue. Default 30000.
    pub reply_timeout_ms: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig { name: "silpgate".into(), default_frontend: Frontend::Code, reply_timeout_ms: 30_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SilpConfig {
    /// Refuse verbs outside the draft's 13-verb whitelist. Default true.
    pub whitelist: bool,
    /// Strip zero-width characters and map look-alike identifiers (reported). Default true.
    pub sanitize: bool,
    /// Hex length of a `meta.req_id` silpgate assigns, 4..=8. Default 8 (the draft's MUST).
    pub req_id_len: usize,
    /// Largest SILP payload, in bytes. Default 1 MiB.
    pub max_payload_bytes: usize,
}

impl Default for SilpConfig {
    fn default() -> Self {
        SilpConfig { whitelist: true, sanitize: true, req_id_len: 8, max_payload_bytes: 1 << 20 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NlipConfig {
    /// Largest encoded NLIP message, in bytes. Default 1 MiB.
    pub max_message_bytes: usize,
    /// Deepest nesting of arrays and objects in a message. Default 32.
    pub max_depth: usize,
    /// Most submessages in one message. Default 256.
    pub max_submessages: usize,
    /// Most values (strings, numbers, booleans, nulls, arrays, maps; map keys included) in one
    /// message, counted before it is decoded: a decoded value costs far more memory than the
    /// byte that can encode it. Default 100000.
    pub max_items: usize,
    /// Longest conversation token, in bytes (it is kept in session state and headers).
    /// Default 256.
    pub max_conversation_token_bytes: usize,
}

impl Default for NlipConfig {
    fn default() -> Self {
        let limits = crate::nlip::Limits::default();
        NlipConfig {
            max_message_bytes: limits.max_bytes,
            max_depth: limits.max_depth,
            max_submessages: limits.max_submessages,
            max_items: limits.max_items,
            max_conversation_token_bytes: limits.max_conversation_token_bytes,
        }
    }
}

impl NlipConfig {
    /// The decoder's limits.
    pub(crate) fn limits(&self) -> crate::nlip::Limits {
        crate::nlip::Limits {
            max_bytes: self.max_message_bytes,
            max_depth: self.max_depth,
            max_submessages: self.max_submessages,
            max_items: self.max_items,
            max_conversation_token_bytes: self.max_conversation_token_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Renew (reset the context of) a session every N turns: 1, 5, 10, 15, 20 or 9999
    /// (9999: never). Default 10.
    pub heartbeat: u32,
    /// A session idle this long expires; its conversation then answers `session_expired`.
    /// Default 1800 seconds.
    pub idle_timeout_secs: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig { heartbeat: 10, idle_timeout_secs: 1800 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Directory of the sled store. Default `target/silpgate-store` (a local run).
    pub path: std::path::PathBuf,
    /// Environment variable holding the compile.lock HMAC key; unset: an unkeyed chain.
    /// The key itself never appears in the configuration or the logs.
    pub hmac_key_env: Option<String>,
    /// Ledger entries older than this are dropped. Default 86400 seconds.
    pub ledger_ttl_secs: u64,
    /// At most this many ledger entries are kept. Default 1,000,000.
    pub ledger_max_entries: usize,
    /// An expired session is forgotten (its id freed) this long after expiring. Default 3600.
    pub tombstone_secs: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: "target/silpgate-store".into(),
            hmac_key_env: None,
            ledger_ttl_secs: 86_400,
            ledger_max_entries: 1_000_000,
            tombstone_secs: 3600,
        }
    }
}

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
    /// Browser origins allowed to open a WebSocket (`Origin` header, e.g.
    /// `https://app.example.com`). An upgrade carrying any other `Origin` is refused with 403,
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

/// The broker silpgate connects to when none is configured.
pub(crate) const DEFAULT_BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Where silpgate meets RabbitMQ, and how it delivers. docs/protocol.md describes the
/// topology these names build.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AmqpConfig {
    /// Broker URI, for one broker address. Default `amqp://guest:guest@127.0.0.1:5672/%2f` (a
    /// local broker). Set this or `urls`, not both.
    pub url: Option<String>,
    /// Broker URIs, one per node of a RabbitMQ cluster (or load balancer): silpgate connects to
    /// one of them, starting at a random one, and on a lost connection goes on to the next at
    /// once; it backs off only once every address has failed.
    pub urls: Vec<String>,
    /// Environment variable holding the broker URI, or several separated by commas, which
    /// carry passwords; when set and present it replaces `url` and `urls`.
    pub url_env: Option<String>,
    /// PEM file of the certificate authorities an `amqps://` broker is verified against, in
    /// addition to the system's. Verification is never off. Default: none (the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate (and `key_file`, its PKCS#8 key) presented on `amqps://`, for
    /// RabbitMQ's EXTERNAL mechanism (`?auth_mechanism=external` on the URI). Default: none.
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// Environment variable holding the broker password: when set and present, every address
    /// uses it, so that `urls` can name the nodes in plain configuration and keep the secret
    /// out of it.
    pub password_env: Option<String>,
    /// Members of each quorum queue silpgate declares (`x-quorum-initial-group-size`). Default:
    /// the broker's own (every cluster node, up to its limit). Changing it for an existing
    /// queue makes its declaration fail: RabbitMQ does not resize a queue by redeclaring it.
    pub quorum_initial_group_size: Option<u32>,
    /// Replicas of each stream cluster mode declares (`x-initial-cluster-size`). Default: the
    /// broker's own.
    pub stream_initial_cluster_size: Option<u32>,
    /// Inbound quorum queues, each bound to `inbound_exchange` with its own name as routing
    /// key. Routes match a queue's name as the message's `source`. Default `["silpgate.in"]`.
    pub inbound: Vec<String>,
    /// Durable direct exchange producers publish NLIP messages to. Default `silpgate.in`.
    pub inbound_exchange: String,
    /// Durable direct exchange for downstream agents; the routing key is the agent's
    /// `routing_key`, else its name. Default `silpgate.agents`.
    pub agents_exchange: String,
    /// Durable fanout exchange for messages silpgate gives up on. Default `silpgate.dlx`.
    pub dead_letter_exchange: String,
    /// Quorum queue bound to the dead-letter exchange. Default `silpgate.dead`.
    pub dead_letter_queue: String,
    /// Deliveries the broker sends before any is acknowledged (basic.qos). Default 1000, as
    /// RabbitMQ's Shovel.
    pub prefetch: u16,
    /// Workers handling deliveries. A conversation always goes to the same worker, and its
    /// messages one after another; different conversations spread over the workers. Default 8.
    pub workers: usize,
    /// Most deliveries a worker takes at once: their state is made durable with one flush,
    /// their publishes go out without waiting for each other's confirms, and their
    /// acknowledgements go back together. Default 64.
    pub window: usize,
    /// How long a worker waits for a window to fill once it has a delivery, in microseconds.
    /// 0 (the default): it takes what is waiting, so a busy worker's windows fill by
    /// themselves while it works on the last one, and a lone message waits for nothing.
    pub window_wait_us: u64,
    /// Attempts at a message whose failure is transient (store, unroutable or refused
    /// publish) before it is dead-lettered with the reason; broker redeliveries count.
    /// Default 20.
    pub max_attempts: u32,
    /// First and longest wait between two attempts at a message, in milliseconds (doubling,
    /// with jitter). Defaults 100 and 5000.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// First and longest wait between two connection attempts, in milliseconds (doubling, with
    /// jitter). Defaults 200 and 10000.
    pub reconnect_initial_ms: u64,
    pub reconnect_max_ms: u64,
    /// A publish not confirmed by the broker within this many milliseconds failed. Default 10000.
    pub confirm_timeout_ms: u64,
    /// On SIGTERM, how long in-flight messages may take to finish; what is unfinished then is
    /// left to the broker to redeliver. Default 30 seconds.
    pub drain_secs: u64,
    /// The broker's own limit on deliveries of one message (`x-delivery-limit` on the inbound
    /// quorum queues), past which it dead-letters the message itself: a safety net above
    /// `max_attempts`. Default 100.
    pub delivery_limit: u32,
    /// The (durable) queue agents answer to (the `reply_to` of everything silpgate forwards to
    /// an AMQP agent). Each instance needs its own: in cluster mode the instance name is
    /// appended. Default `silpgate.replies`.
    pub reply_queue: String,
    /// `quorum` (default): the reply queue survives the loss of a broker node. `classic`: an
    /// answer's round trip is about a millisecond shorter (no consensus write), but while the
    /// queue's node is down this instance cannot connect at all; for a single broker node.
    pub reply_queue_type: ReplyQueueType,
}

/// The queue type of an instance's reply queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplyQueueType {
    Quorum,
    Classic,
}

impl ReplyQueueType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReplyQueueType::Quorum => "quorum",
            ReplyQueueType::Classic => "classic",
        }
    }
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            url: None,
            urls: Vec::new(),
            url_env: None,
            password_env: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            quorum_initial_group_size: None,
            stream_initial_cluster_size: None,
            inbound: vec!["silpgate.in".into()],
            inbound_exchange: "silpgate.in".into(),
            agents_exchange: "silpgate.agents".into(),
            dead_letter_exchange: "silpgate.dlx".into(),
            dead_letter_queue: "silpgate.dead".into(),
            prefetch: 1000,
            workers: 8,
            window: 64,
            window_wait_us: 0,
            max_attempts: 20,
            retry_initial_ms: 100,
            retry_max_ms: 5000,
            reconnect_initial_ms: 200,
            reconnect_max_ms: 10_000,
            confirm_timeout_ms: 10_000,
            drain_secs: 30,
            delivery_limit: 100,
            reply_queue: "silpgate.replies".into(),
            reply_queue_type: ReplyQueueType::Quorum,
        }
    }
}

impl AmqpConfig {
    /// The broker URIs, and the key they come from (for errors that must not show them):
    /// the variable `url_env` names when it is set, else `urls`, else `url`, else the local
    /// broker.
    pub(crate) fn addresses(&self) -> (Vec<String>, String) {
        if let Some(name) = &self.url_env
            && let Ok(value) = std::env::var(name)
        {
            let uris = value.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect();
            return (uris, format!("the variable {name} (amqp.url_env)"));
        }
        if !self.urls.is_empty() {
            return (self.urls.clone(), "amqp.urls".to_owned());
        }
        let url = self.url.clone().unwrap_or_else(|| DEFAULT_BROKER.to_owned());
        (vec![url], "amqp.url".to_owned())
    }
}

/// Cluster mode: conversations are spread over `partitions` quorum queues behind a
/// consistent-hash exchange; the broker gives each partition to one live instance (single
/// active consumer); each partition's session changes go to its changelog stream, the
/// compile.lock to one lock stream. docs/cluster.md explains the design and how to size it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Number of partitions P, 1..=1296. Every
    /// instance of a cluster must use the same P. Default 16.
    pub partitions: u16,
    /// The consistent-hash exchange in front of the partition queues; it hashes the header
    /// `nlip-conversation`. Default `silpgate.partitions`.
    pub exchange: String,
    /// Partition queues are named `<queue_prefix>.<index>` (index zero-padded to 2 digits or
    /// more). Default `silpgate.partition`.
    pub queue_prefix: String,
    /// Changelog streams are named `<changelog_prefix>.<index>`. Default `silpgate.changelog`.
    pub changelog_prefix: String,
    /// The stream the whole cluster's compile.lock is decided in. Default `silpgate.lock`.
    pub lock_stream: String,
    /// A snapshot of a partition's sessions is appended to its changelog after this many
    /// changes, so that a stream cut by retention still holds a complete state. Default 1000.
    pub snapshot_every: u64,
    /// Retention of each changelog stream in bytes (`x-max-length-bytes`); keep it above a few
    /// snapshot intervals. Default 256 MiB.
    pub changelog_max_bytes: u64,
    /// This instance's name in partition claims, heartbeats, logs and `cluster status`; it also
    /// decides which partitions the instance owns (rendezvous hashing over the members' names),
    /// so it must be unique and should stay the same across restarts. Default: the `HOSTNAME`
    /// environment variable, else `silpgate-<pid>`.
    pub instance: Option<String>,
    /// Instances waiting behind each partition's owner, ready to take it over the moment the
    /// owner dies, 0..=8; the same on every instance (an owner hands a partition on only once
    /// no member beyond the owner and its standbys waits on it). Each instance consumes about
    /// P × (1 + standby) / instances partitions. With 0, a crashed owner's partitions wait
    /// until the members miss its heartbeats (5 s). Default 1.
    pub standby: u16,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            partitions: 16,
            exchange: "silpgate.partitions".into(),
            queue_prefix: "silpgate.partition".into(),
            changelog_prefix: "silpgate.changelog".into(),
            lock_stream: "silpgate.lock".into(),
            snapshot_every: 1000,
            changelog_max_bytes: 256 * 1024 * 1024,
            instance: None,
            standby: 1,
        }
    }
}

impl ClusterConfig {
    /// Zero-padded partition index, so that queue names sort in partition order.
    fn suffix(&self, index: u16) -> String {
        let width = self.partitions.saturating_sub(1).to_string().len().max(2);
        format!("{index:0width$}")
    }

    /// The queue of partition `index`.
    pub(crate) fn partition_queue(&self, index: u16) -> String {
        format!("{}.{}", self.queue_prefix, self.suffix(index))
    }

    /// The fanout exchange the instances' heartbeats go through: `<queue_prefix>.members`.
    pub(crate) fn members_exchange(&self) -> String {
        format!("{}.members", self.queue_prefix)
    }

    /// The changelog stream of partition `index`.
    pub(crate) fn changelog_stream(&self, index: u16) -> String {
        format!("{}.{}", self.changelog_prefix, self.suffix(index))
    }

    /// This instance's name.
    pub(crate) fn instance_name(&self) -> String {
        self.instance
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| format!("silpgate-{}", std::process::id()))
    }
}

/// Logs on stderr and traces over OTLP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `pretty` (default) or `json` (one object per event).
    pub log_format: LogFormat,
    /// Which events are logged, in tracing's `EnvFilter` syntax; the environment variable
    /// `SILPGATE_LOG` replaces it. Default `info,lapin=off` (silpgate logs connection losses
    /// itself, with the reason).
    pub log_filter: String,
    /// OTLP/HTTP endpoint spans are exported to, e.g. `http://127.0.0.1:4318/v1/traces`.
    /// Unset (the default): no export.
    pub otlp_endpoint: Option<String>,
    /// OTLP/HTTP endpoint metrics are pushed to, e.g. `http://127.0.0.1:4318/v1/metrics`.
    /// Unset (the default): metrics are only served at `GET /metrics`.
    pub otlp_metrics_endpoint: Option<String>,
    /// Seconds between two metric pushes. Default 30.
    pub metrics_interval_secs: u64,
    /// `service.name` of the exported spans and metrics. Default `silpgate`.
    pub service_name: String,
    /// Fraction of new traces recorded, 0.0..=1.0; a message that arrives with a trace context
    /// follows its sender's decision. Default 1.0.
    pub sample_ratio: f64,
}

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            log_format: LogFormat::Pretty,
            log_filter: "info,lapin=off".into(),
            otlp_endpoint: None,
            otlp_metrics_endpoint: None,
            metrics_interval_secs: 30,
            service_name: "silpgate".into(),
            sample_ratio: 1.0,
        }
    }
}

/// The heartbeat values of draft §5.2.
pub(crate) const HEARTBEATS: [u32; 6] = [1, 5, 10, 15, 20, 9999];

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// A name for logs and traces.
    pub name: String,
    /// What a message must look like to take this route; an empty match takes everything.
    #[serde(default, rename = "match")]
    pub matcher: RouteMatch,
    /// The agent to send to, or `reply` to answer the sender.
    pub destination: String,
    /// What to do with SILP payloads on this route.
    pub mode: RouteMode,
    /// Send this frontend, overriding the agent's profile and the IR's `meta.out`; or
    /// `fewest-tokens`, the accepted frontend that costs the agent the fewest tokens.
    #[serde(default, deserialize_with = "optional_frontend_rule")]
    pub frontend: Option<FrontendRule>,
    /// Let `fewest-tokens` pick the lossy baselines (`natural`, `nl_json`) too. Default false.
    #[serde(default)]
    pub allow_lossy: bool,
    /// Whether an HTTP or WebSocket caller waits for the agent's answer (`reply`, the
    /// default) or only for the delivery to be confirmed (`none`: HTTP 202 with a control
    /// message naming the outbound message id).
    #[serde(default, rename = "await")]
    pub wait: AwaitMode,
    /// Who answers the sender: `gateway` (the default: the agent answers silpgate, which
    /// counts, checks and transcodes the answer for the sender) or `direct` (the sender's
    /// reply addresses travel to the agent, which answers the sender itself; AMQP only).
    #[serde(default)]
    pub replies: RepliesMode,
}

/// What an HTTP or WebSocket caller waits for on a route to an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AwaitMode {
    #[default]
    Reply,
    None,
}

/// Who an agent answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepliesMode {
    #[default]
    Gateway,
    Direct,
}

/// Conditions of a route; all given ones must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteMatch {
    /// The source (queue, listener) the message came from.
    pub source: Option<String>,
    /// The label of a SILP submessage.
    pub label: Option<String>,
    /// The message's `messagetype` (case-insensitive).
    pub messagetype: Option<String>,
    /// The SILP intent, e.g. `!BOOK`.
    pub intent: Option<String>,
    /// The IR's `meta.next_agent`.
    pub next_agent: Option<String>,
}

/// A configured frontend: a fixed one, or the one with the fewest tokens for the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendRule {
    Fixed(Frontend),
    FewestTokens,
}

impl std::str::FromStr for FrontendRule {
    type Err = crate::silp::SilpError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "fewest-tokens" {
            return Ok(FrontendRule::FewestTokens);
        }
        s.parse().map(FrontendRule::Fixed)
    }
}

/// What a route does to SILP payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteMode {
    /// IR -> the chosen surface frontend.
    Encode,
    /// Surface -> IR.
    Decode,
    /// Surface -> the chosen (other) surface frontend.
    Transcode,
    /// Check the payload and forward it unchanged.
    Validate,
}

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Loads a file, with `SILPGATE_<SECTION>_<KEY>` environment variables overriding it.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Config::parse_with_env(&text, std::env::vars()).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and checks a configuration; parse errors carry line and column.
    /// True when the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.http.tls_cert.is_some() && self.http.tls_key.is_some()
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, std::iter::empty())
    }

    /// Parses a configuration and applies overrides from `env`: a variable
    /// `SILPGATE_<SECTION>_<KEY>` (e.g. `SILPGATE_AMQP_URL`, `SILPGATE_HTTP_LISTEN`) sets `key`
    /// of `[section]`. The value is read as a TOML value when it is one (`true`, `8`,
    /// `["a", "b"]`), else as a string. Variables that name no section (`SILPGATE_LOG`) are
    /// not overrides; an override of an unknown key is an error naming the variable. Values
    /// are never echoed: they may be secrets.
    pub(crate) fn parse_with_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse(e.to_string());
        let mut config: Config = toml::from_str(text).map_err(parse_error)?;
        let overrides = env_overrides(env);
        if !overrides.is_empty() {
            let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
            config =
                with_overrides(table.clone(), &overrides).map_err(|_| blame_override(&table, &overrides))?;
        }
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if !HEARTBEATS.contains(&self.sessions.heartbeat) {
            return Err(ConfigError::Invalid(format!(
                "sessions.heartbeat = {} is not one of {HEARTBEATS:?}",
                self.sessions.heartbeat
            )));
        }
        if !crate::silp::req_id::LENGTHS.contains(&self.silp.req_id_len) {
            return Err(ConfigError::Invalid(format!(
                "silp.req_id_len = {} is not in 4..=8",
                self.silp.req_id_len
            )));
        }
        match (&self.http.tls_cert, &self.http.tls_key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError::Invalid(
                    "http.tls_cert and http.tls_key go together: set both, or neither".into(),
                ));
            }
            _ => {}
        }
        for agent in &self.agents {
            if let Some(outbound) = agent.reach.outbound() {
                check_agent_url(&agent.name, &outbound.url, outbound.plain)?;
            }
            if let Some(FrontendRule::Fixed(f)) = agent.frontend {
                return Err(ConfigError::Invalid(format!(
                    "agent '{}': frontend = '{f}': an agent may only set frontend = 'fewest-tokens'; list the frontends it accepts in frontends",
                    agent.name
                )));
            }
        }
        for stream in &self.streams {
            check_stream_url(&stream.name, &stream.url, stream.plain)?;
            if self.streams.iter().filter(|s| s.name == stream.name).count() > 1 {
                return Err(ConfigError::Invalid(format!("stream '{}' is configured twice", stream.name)));
            }
        }
        if let Some(amqp) = &self.amqp {
            if amqp.inbound.is_empty()
                || amqp.workers == 0
                || amqp.window == 0
                || amqp.prefetch == 0
                || amqp.max_attempts == 0
            {
                return Err(ConfigError::Invalid(
                    "amqp: inbound, workers, window, prefetch and max_attempts must not be empty or zero"
                        .into(),
                ));
            }
            if amqp.url.is_some() && !amqp.urls.is_empty() {
                return Err(ConfigError::Invalid(
                    "amqp: set url (one broker address) or urls (an address list), not both".into(),
                ));
            }
            if amqp.quorum_initial_group_size == Some(0) || amqp.stream_initial_cluster_size == Some(0) {
                return Err(ConfigError::Invalid(
                    "amqp: quorum_initial_group_size and stream_initial_cluster_size must be at least 1"
                        .into(),
                ));
            }
        }
        if let Some(cluster) = &self.cluster {
            if self.amqp.is_none() {
                return Err(ConfigError::Invalid(
                    "[cluster] needs [amqp]: partitions live on the broker".into(),
                ));
            }
            if !(1..=1296).contains(&cluster.partitions) || cluster.snapshot_every == 0 {
                return Err(ConfigError::Invalid(format!(
                    "cluster.partitions = {} must be in 1..=1296 and cluster.snapshot_every above 0",
                    cluster.partitions
                )));
            }
            if cluster.standby > 8 {
                return Err(ConfigError::Invalid(format!(
                    "cluster.standby = {} must be in 0..=8",
                    cluster.standby
                )));
            }
        }
        if !(0.0..=1.0).contains(&self.telemetry.sample_ratio) {
            return Err(ConfigError::Invalid(format!(
                "telemetry.sample_ratio = {} is not in 0.0..=1.0",
                self.telemetry.sample_ratio
            )));
        }
        for route in &self.routes {
            let known =
                route.destination == "reply" || self.agents.iter().any(|a| a.name == route.destination);
            if !known {
                return Err(ConfigError::Invalid(format!(
                    "route '{}': destination '{}' is neither 'reply' nor a configured agent",
                    route.name, route.destination
                )));
            }
        }
        Ok(())
    }
}

/// An agent URL must be http(s) or ws(s), and plain HTTP or WebSocket may not leave the
/// machine unless asked for.
fn check_agent_url(agent: &str, url: &str, plain: bool) -> Result<(), ConfigError> {
    let invalid = |why: &str| ConfigError::Invalid(format!("agent '{agent}': url: {why}"));
    let parsed: axum::http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    let host = parsed.host().ok_or_else(|| invalid("no host"))?;
    match parsed.scheme_str() {
        Some("https" | "wss") => Ok(()),
        Some("http" | "ws") if plain || is_loopback(host) => Ok(()),
        Some(scheme @ ("http" | "ws")) => Err(invalid(&format!(
            "plain {scheme}:// to a host other than loopback; use {scheme}s://, or set plain = true for this agent"
        ))),
        _ => Err(invalid("the scheme must be http://, https://, ws:// or wss://")),
    }
}

/// A stream URL must be ws(s), and plain WebSocket may not leave the machine unless asked for.
fn check_stream_url(stream: &str, url: &str, plain: bool) -> Result<(), ConfigError> {
    let invalid = |why: &str| ConfigError::Invalid(format!("stream '{stream}': url: {why}"));
    let parsed: axum::http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    let host = parsed.host().ok_or_else(|| invalid("no host"))?;
    match parsed.scheme_str() {
        Some("wss") => Ok(()),
        Some("ws") if plain || is_loopback(host) => Ok(()),
        Some("ws") => Err(invalid(
            "plain ws:// to a host other than loopback; use wss://, or set plain = true for this stream",
        )),
        _ => Err(invalid("the scheme must be ws:// or wss://")),
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Sections an environment variable may override.
const OVERRIDABLE: [&str; 9] =
    ["gateway", "silp", "nlip", "sessions", "store", "http", "amqp", "cluster", "telemetry"];

/// One environment override: (variable, section, key, value).
type Override = (String, String, String, toml::Value);

/// The configuration `table` with `overrides` applied.
fn with_overrides(mut table: toml::Table, overrides: &[Override]) -> Result<Config, toml::de::Error> {
    for (_, section, key, value) in overrides {
        let entry = table.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(section) = entry {
            section.insert(key.clone(), value.clone());
        }
    }
    toml::Value::Table(table).try_into()
}

/// The error for overrides that do not fit: each override is tried alone to name the
/// variables at fault. The deserialiser's own message quotes the value (`invalid type: string
/// "..."`), and values may be secrets, so only what was expected is kept from it.
fn blame_override(table: &toml::Table, overrides: &[Override]) -> ConfigError {
    let mut blamed: Vec<String> = overrides
        .iter()
        .filter_map(|o| {
            let e = with_overrides(table.clone(), std::slice::from_ref(o)).err()?;
            let (name, section, key, value) = o;
            Some(format!("{name} ({section}.{key}){}", expected(e.message(), value)))
        })
        .collect();
    if blamed.is_empty() {
        // Only their combination fails: name them all.
        blamed =
            overrides.iter().map(|(name, section, key, _)| format!("{name} ({section}.{key})")).collect();
    }
    ConfigError::Invalid(format!(
        "environment override {}: the value does not fit the key (values are not shown)",
        blamed.join(", ")
    ))
}

/// `: expected <what>` from a serde type or value error, when that part cannot hold the value.
fn expected(message: &str, value: &toml::Value) -> String {
    let typed = ["invalid type:", "invalid value:", "invalid length"].iter().any(|p| message.starts_with(p));
    let raw = match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match message.rsplit_once(", expected ") {
        Some((_, what)) if typed && !raw.is_empty() && !what.contains(raw.as_str()) => {
            format!(": expected {}", what.trim_end_matches('\n'))
        }
        _ => String::new(),
    }
}

/// (variable, section, key, value) of every `SILPGATE_<SECTION>_<KEY>` variable.
fn env_overrides(env: impl IntoIterator<Item = (String, String)>) -> Vec<Override> {
    env.into_iter()
        .filter_map(|(name, raw)| {
            let rest = name.strip_prefix("SILPGATE_")?.to_ascii_lowercase();
            let (section, key) = rest.split_once('_')?;
            if !OVERRIDABLE.contains(&section) || key.is_empty() {
                return None;
            }
            let value = format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(raw));
            Some((name, section.to_owned(), key.to_owned(), value))
        })
        .collect()
}

fn frontend<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Frontend, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(|e: crate::silp::SilpError| serde::de::Error::custom(e.message))
}

fn optional_frontend_rule<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<FrontendRule>, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map(Some).map_err(|e: crate::silp::SilpError| {
        serde::de::Error::custom(format!("{}; or fewest-tokens", e.message))
    })
}

fn optional_tokenizer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Tokenizer>, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map(Some).map_err(serde::de::Error::custom)
}

fn frontends<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Frontend>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    names
        .iter()
        .map(|n| n.parse().map_err(|e: crate::silp::SilpError| serde::de::Error::custom(e.message)))
        .collect()
}

#[cfg(test)]
mod defaults_test;

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn environment_variables_override_the_file() {
        let text = "[http]\nlisten = \"127.0.0.1:1\"\n[amqp]\nprefetch = 10\n";
        let config = Config::parse_with_env(
            text,
            env(&[
                ("SILPGATE_HTTP_LISTEN", "0.0.0.0:8787"),
                ("SILPGATE_AMQP_URL", "amqp://user:secret@broker:5672/%2f"),
                ("SILPGATE_AMQP_PREFETCH", "500"),
                ("SILPGATE_HTTP_TOKENS", "[\"a\", \"b\"]"),
                ("SILPGATE_TELEMETRY_OTLP_ENDPOINT", "http://collector:4318/v1/traces"),
                ("SILPGATE_LOG", "debug"),
                ("OTHER", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(config.http.listen, "0.0.0.0:8787");
        let amqp = config.amqp.unwrap();
        assert_eq!(amqp.url.as_deref(), Some("amqp://user:secret@broker:5672/%2f"));
        assert_eq!(amqp.prefetch, 500);
        assert_eq!(config.http.tokens, ["a", "b"]);
        assert_eq!(config.telemetry.otlp_endpoint.as_deref(), Some("http://collector:4318/v1/traces"));
    }

    #[test]
    fn the_broker_is_one_url_or_an_address_list_never_both() {
        let list = Config::parse(
            "[amqp]\nurls = [\"amqp://guest:guest@127.0.0.1:5672/%2f\", \"amqp://guest:guest@127.0.0.1:5673/%2f\"]\n",
        )
        .unwrap();
        let (uris, key) = list.amqp.unwrap().addresses();
        assert_eq!((uris.len(), key.as_str()), (2, "amqp.urls"));
        let default = Config::parse("[amqp]\n").unwrap().amqp.unwrap().addresses();
        assert_eq!(default, (vec![DEFAULT_BROKER.to_owned()], "amqp.url".to_owned()));
        let both = Config::parse(
            "[amqp]\nurl = \"amqp://guest:guest@a:5672/%2f\"\nurls = [\"amqp://guest:guest@b:5672/%2f\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(both.contains("url") && both.contains("not both"), "{both}");
    }

    #[test]
    fn the_address_list_may_come_from_the_environment_separated_by_commas() {
        let config =
            Config::parse_with_env("[amqp]\nurl_env = \"SILPGATE_TEST_BROKERS_A\"\n", env(&[])).unwrap();
        // SAFETY: no other test reads or writes this variable.
        unsafe {
            std::env::set_var("SILPGATE_TEST_BROKERS_A", "amqp://u:p@a:5672/%2f, amqp://u:p@b:5673/%2f")
        };
        let (uris, key) = config.amqp.unwrap().addresses();
        assert_eq!(uris, ["amqp://u:p@a:5672/%2f", "amqp://u:p@b:5673/%2f"]);
        assert!(key.contains("SILPGATE_TEST_BROKERS_A"), "{key}");
    }

    #[test]
    fn an_override_of_an_unknown_key_names_the_variable_and_not_the_value() {
        let e = Config::parse_with_env("", env(&[("SILPGATE_AMQP_PASSWORD", "hunter2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SILPGATE_AMQP_PASSWORD") && e.contains("password"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = Config::parse_with_env("", env(&[("SILPGATE_HTTP_CLIENT_RATE", "s3cr3t-value")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SILPGATE_HTTP_CLIENT_RATE (http.client_rate): expected f64"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = Config::parse_with_env(
            "",
            env(&[("SILPGATE_HTTP_TOKENS", "tok-s3cr3t,tok-2"), ("SILPGATE_HTTP_LISTEN", "0.0.0.0:1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("SILPGATE_HTTP_TOKENS") && !e.contains("SILPGATE_HTTP_LISTEN"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = Config::parse_with_env("", env(&[("SILPGATE_SESSIONS_HEARTBEAT", "7")])).unwrap_err();
        assert!(e.to_string().contains("heartbeat"), "{e}");
    }

    #[test]
    fn a_cluster_keeps_one_standby_per_partition_unless_told_and_at_most_eight() {
        let base = "[amqp]\n[cluster]\n";
        assert_eq!(Config::parse(base).unwrap().cluster.unwrap().standby, 1);
        assert_eq!(Config::parse(&format!("{base}standby = 0\n")).unwrap().cluster.unwrap().standby, 0);
        let e = Config::parse(&format!("{base}standby = 9\n")).unwrap_err();
        assert!(e.to_string().contains("cluster.standby = 9"), "{e}");
    }
}
