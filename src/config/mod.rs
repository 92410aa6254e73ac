//! The TOML configuration. Every field is documented where it is declared, its default stated
//! once, in code (tests hold docs/configuration.md and config/silpgate.toml to it); unknown keys
//! are errors. `config/silpgate.toml` is the annotated default.
//!
//! Here: the file as a whole, the small sections, loading with environment overrides, and the
//! checks that span sections. A component's section, with its own checks, has a file of its
//! own: `agents.rs` (`[[agents]]`, one kind of agent each), `http.rs`, `amqp.rs`, `cluster.rs`,
//! `streams.rs`, `routes.rs`.

mod a2a;
mod agents;
mod amqp;
mod auth;
mod cluster;
mod http;
mod routes;
mod streams;

pub use a2a::A2aConfig;
pub use agents::{
    A2aReach, AgentConfig, AmqpReach, BodyEncoding, FrameEncoding, HttpReach, McpReach, Outbound, Reach,
    WsReach,
};
pub use amqp::{AmqpConfig, ReplyQueueType};
pub use auth::{AuthConfig, StaticToken};
pub use cluster::ClusterConfig;
pub use http::{HttpConfig, MinTls};
pub use routes::{AwaitMode, FrontendRule, RepliesMode, RouteConfig, RouteMatch, RouteMode};
pub use streams::StreamConfig;

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
    /// silpgate's own A2A door (`/a2a`): the tasks it keeps and their push notifications.
    pub a2a: A2aConfig,
    /// Who clients are: static tokens naming principals, JWTs, broker users' roles.
    pub auth: AuthConfig,
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
        Config::from_file_text(path, &text)
    }

    /// [`Config::load`] of `text`, read from `path` already (which parse errors name).
    pub(crate) fn from_file_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, std::env::vars()).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// True when the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.http.tls()
    }

    /// Parses and checks a configuration; parse errors carry line and column.
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
        self.http.check()?;
        self.a2a.check(self.amqp.is_some())?;
        self.auth.check()?;
        for agent in &self.agents {
            agent.check()?;
        }
        for stream in &self.streams {
            stream.check()?;
            if self.streams.iter().filter(|s| s.name == stream.name).count() > 1 {
                return Err(ConfigError::Invalid(format!("stream '{}' is configured twice", stream.name)));
            }
        }
        if let Some(amqp) = &self.amqp {
            amqp.check()?;
        }
        if let Some(cluster) = &self.cluster {
            if self.amqp.is_none() {
                return Err(ConfigError::Invalid(
                    "[cluster] needs [amqp]: partitions live on the broker".into(),
                ));
            }
            cluster.check()?;
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

/// Whether `host` (a URL's) is this machine.
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
        assert_eq!(default, (vec![amqp::DEFAULT_BROKER.to_owned()], "amqp.url".to_owned()));
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
