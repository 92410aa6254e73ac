//! `[amqp]`: the broker connection, the topology's names, and how the AMQP door consumes,
//! retries and publishes.

use super::ConfigError;
use serde::Deserialize;

/// The broker silpgate connects to when none is configured.
pub(super) const DEFAULT_BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

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
    /// Queues, by name prefix, that a producer may name as its reply address (`reply_to`,
    /// `nlip-reply-*`), besides direct reply-to (`amq.rabbitmq.reply-to`) and server-named
    /// queues (`amq.gen-`), which are always allowed. silpgate publishes replies there with its
    /// own broker rights, so a message naming any other queue, or one silpgate declares
    /// itself, is refused (`forbidden`, dead-lettered). Default: none.
    pub reply_prefixes: Vec<String>,
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
            reply_prefixes: Vec::new(),
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

impl AmqpConfig {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.inbound.is_empty()
            || self.workers == 0
            || self.window == 0
            || self.prefetch == 0
            || self.max_attempts == 0
        {
            return Err(ConfigError::Invalid(
                "amqp: inbound, workers, window, prefetch and max_attempts must not be empty or zero".into(),
            ));
        }
        if self.url.is_some() && !self.urls.is_empty() {
            return Err(ConfigError::Invalid(
                "amqp: set url (one broker address) or urls (an address list), not both".into(),
            ));
        }
        if self.quorum_initial_group_size == Some(0) || self.stream_initial_cluster_size == Some(0) {
            return Err(ConfigError::Invalid(
                "amqp: quorum_initial_group_size and stream_initial_cluster_size must be at least 1".into(),
            ));
        }
        Ok(())
    }
}
