//! `[[agents]]`: who the downstream agents are, and how each is reached.
//!
//! An agent has what the core needs of every agent (its name, the frontends it accepts, its
//! tokenizer) and one [`Reach`]: the settings of the one connector that reaches it, and only
//! those. Which connector is decided here, once, from `protocol` and the `url`'s scheme, and a
//! key another connector would read is refused by name instead of being ignored.

use super::{ConfigError, FrontendRule, frontends, is_loopback, optional_frontend_rule, optional_tokenizer};
use crate::silp::Frontend;
use crate::silp::tokens::Tokenizer;
use crate::transport::Transport;
use serde::Deserialize;
use serde::de::Error as _;
use std::path::PathBuf;

/// One downstream agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The agent's name, as routes name it.
    pub name: String,
    /// Frontends the agent accepts, most preferred first. Empty: any (the route's, the IR's
    /// `meta.out` or `gateway.default_frontend` decides), until a `//ping` from the agent says
    /// otherwise.
    pub frontends: Vec<Frontend>,
    /// The tokenizer of the agent's model: payloads sent to it are counted in its tokens.
    /// None: bytes only, unless a `//ping` names one.
    pub tokenizer: Option<Tokenizer>,
    /// `fewest-tokens`: send the accepted frontend that costs the agent the fewest tokens,
    /// unless the route sets a frontend. None: the first accepted frontend.
    pub frontend: Option<FrontendRule>,
    /// Who may reach the agent: `*`, `sub:<subject>`, `role:<role>` ([`crate::principal`]).
    /// Default `["*"]`: every client the doors let in.
    pub allow: Vec<String>,
    /// How the agent is reached.
    pub reach: Reach,
}

impl AgentConfig {
    /// What the agent's keys cannot say alone: a URL that may leave the machine only over
    /// TLS, and an agent's `frontend` rule.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if let Some(outbound) = self.reach.outbound() {
            outbound.check(&self.name)?;
        }
        if let Some(why) = self.allow.iter().find_map(|rule| crate::principal::rule_error(rule)) {
            return Err(ConfigError::Invalid(format!("agent '{}': allow: {why}", self.name)));
        }
        if let Some(FrontendRule::Fixed(f)) = self.frontend {
            return Err(ConfigError::Invalid(format!(
                "agent '{}': frontend = '{f}': an agent may only set frontend = 'fewest-tokens'; list the frontends it accepts in frontends",
                self.name
            )));
        }
        Ok(())
    }
}

/// The connector that reaches an agent, with its settings.
#[derive(Debug, Clone)]
pub enum Reach {
    /// NLIP envelopes on the broker (no `url`).
    Amqp(AmqpReach),
    /// NLIP over HTTP, ECMA-431 (an `http://` or `https://` `url`).
    Http(HttpReach),
    /// NLIP over WebSocket, ECMA-432 (a `ws://` or `wss://` `url`).
    WebSocket(WsReach),
    /// An A2A 1.0 agent (`protocol = "a2a"`).
    A2a(A2aReach),
    /// An MCP server on streamable HTTP (`protocol = "mcp"`).
    Mcp(McpReach),
}

impl Reach {
    /// The transport the agent is reached by.
    pub fn transport(&self) -> Transport {
        match self {
            Reach::Amqp(_) => Transport::Amqp,
            Reach::Http(_) => Transport::Http,
            Reach::WebSocket(_) => Transport::WebSocket,
            Reach::A2a(_) => Transport::A2a,
            Reach::Mcp(_) => Transport::Mcp,
        }
    }

    /// The settings of a connector that leaves the machine over HTTP or WebSocket.
    pub fn outbound(&self) -> Option<&Outbound> {
        match self {
            Reach::Amqp(_) => None,
            Reach::Http(r) => Some(&r.outbound),
            Reach::WebSocket(r) => Some(&r.outbound),
            Reach::A2a(r) => Some(&r.outbound),
            Reach::Mcp(r) => Some(&r.outbound),
        }
    }
}

/// An agent on the broker.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpReach {
    /// Routing key of the agent on `amqp.agents_exchange`. None: the agent's name.
    pub routing_key: Option<String>,
    /// A queue silpgate declares (quorum, durable) and binds for the agent, for deployments
    /// where silpgate owns the topology. None: the agent declares its own.
    pub queue: Option<String>,
    /// Encoding of messages sent to the agent.
    #[serde(default, deserialize_with = "body_encoding")]
    pub content_type: BodyEncoding,
    /// The broker user the agent answers as. When set, an answer on the reply queue is
    /// believed only with this `user_id` (RabbitMQ checks it against the publisher's login);
    /// any other is dead-lettered as `forged_answer`. None: any publisher.
    pub user: Option<String>,
    /// How long `agents check` waits for the agent's answer to its `//ping`, in milliseconds.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u64,
}

impl AmqpReach {
    /// The agent's routing key on the agents exchange.
    pub fn routing_key<'a>(&'a self, agent: &'a str) -> &'a str {
        self.routing_key.as_deref().unwrap_or(agent)
    }
}

/// What every connector that reaches an agent over HTTP or WebSocket is configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outbound {
    /// Where the agent listens.
    pub url: String,
    /// A delivery not confirmed within this many milliseconds failed, as a transient failure.
    #[serde(default = "timeout_ms")]
    pub timeout_ms: u64,
    /// Deliveries to this agent at once; more wait their turn, within `timeout_ms`.
    #[serde(default = "max_in_flight")]
    pub max_in_flight: usize,
    /// Environment variable holding the bearer token silpgate presents to the agent; it must
    /// be set when named.
    pub token_env: Option<String>,
    /// PEM file of the certificate authorities an `https://` or `wss://` agent is verified
    /// against, in addition to the system's. Verification is never off.
    pub ca_file: Option<PathBuf>,
    /// Allow `http://` or `ws://` to a host other than loopback (ECMA-434 asks for TLS on
    /// every hop that leaves the machine).
    #[serde(default)]
    pub plain: bool,
}

impl Outbound {
    /// The keys of an `[[agents]]` entry that belong here.
    const KEYS: [&'static str; 6] = ["url", "timeout_ms", "max_in_flight", "token_env", "ca_file", "plain"];

    /// The URL must be http(s) or ws(s), and plain HTTP or WebSocket may not leave the machine
    /// unless asked for.
    fn check(&self, agent: &str) -> Result<(), ConfigError> {
        let invalid = |why: &str| ConfigError::Invalid(format!("agent '{agent}': url: {why}"));
        let parsed: axum::http::Uri = self.url.parse().map_err(|_| invalid("not a URL"))?;
        let host = parsed.host().ok_or_else(|| invalid("no host"))?;
        match parsed.scheme_str() {
            Some("https" | "wss") => Ok(()),
            Some("http" | "ws") if self.plain || is_loopback(host) => Ok(()),
            Some(scheme @ ("http" | "ws")) => Err(invalid(&format!(
                "plain {scheme}:// to a host other than loopback; use {scheme}s://, or set plain = true for this agent"
            ))),
            _ => Err(invalid("the scheme must be http://, https://, ws:// or wss://")),
        }
    }
}

/// An NLIP agent over HTTP.
#[derive(Debug, Clone)]
pub struct HttpReach {
    pub outbound: Outbound,
    /// Encoding of the envelopes POSTed to the agent.
    pub content_type: BodyEncoding,
}

/// An NLIP agent over WebSocket.
#[derive(Debug, Clone)]
pub struct WsReach {
    pub outbound: Outbound,
    /// How envelopes travel in frames.
    pub encoding: FrameEncoding,
}

/// An A2A 1.0 agent; `url` is its base URL, where its agent card is.
#[derive(Debug, Clone)]
pub struct A2aReach {
    pub outbound: Outbound,
    /// Origins (`scheme://host[:port]`) besides the `url`'s that the agent card may name as
    /// the agent's endpoint. A card naming any other origin, or `http://` where the `url` is
    /// `https://`, is refused (`a2a_card_invalid`): the card must not send silpgate, and the
    /// agent's token, anywhere.
    pub card_origins: Vec<String>,
    /// A JWK set the agent's card must be signed with (A2A's signed agent cards). Set, a card
    /// without a signature that verifies against one of these keys is refused
    /// (`a2a_card_invalid`); the card's own pointers to keys are never followed.
    pub card_keys_file: Option<std::path::PathBuf>,
}

/// An MCP server; `url` is its endpoint.
#[derive(Debug, Clone)]
pub struct McpReach {
    pub outbound: Outbound,
    /// The tool each envelope calls.
    pub tool: String,
    /// Fixed arguments of every call, next to the SILP wrapper (`silp_encoding`,
    /// `silp_payload`) that silpgate writes.
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// How an NLIP body is encoded (`content_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyEncoding {
    #[default]
    Json,
    Cbor,
}

impl BodyEncoding {
    pub fn nlip(self) -> crate::nlip::Encoding {
        match self {
            BodyEncoding::Json => crate::nlip::Encoding::Json,
            BodyEncoding::Cbor => crate::nlip::Encoding::Cbor,
        }
    }
}

/// How NLIP messages travel in WebSocket frames (ECMA-432).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameEncoding {
    /// One CBOR-encoded message per binary frame.
    #[default]
    Cbor,
    /// One JSON message per text frame.
    Json,
}

impl FrameEncoding {
    pub fn nlip(self) -> crate::nlip::Encoding {
        match self {
            FrameEncoding::Cbor => crate::nlip::Encoding::Cbor,
            FrameEncoding::Json => crate::nlip::Encoding::Json,
        }
    }
}

/// True for a `ws://` or `wss://` URL.
pub(crate) fn is_websocket_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("ws") || scheme.eq_ignore_ascii_case("wss")
}

fn timeout_ms() -> u64 {
    10_000
}

fn max_in_flight() -> usize {
    64
}

/// What the core reads of every agent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Common {
    name: String,
    #[serde(default, deserialize_with = "frontends")]
    frontends: Vec<Frontend>,
    #[serde(default, deserialize_with = "optional_tokenizer")]
    tokenizer: Option<Tokenizer>,
    #[serde(default, deserialize_with = "optional_frontend_rule")]
    frontend: Option<FrontendRule>,
    #[serde(default = "anyone")]
    allow: Vec<String>,
}

impl Common {
    const KEYS: [&'static str; 5] = ["name", "frontends", "tokenizer", "frontend", "allow"];
}

fn anyone() -> Vec<String> {
    vec![crate::principal::ANYONE.to_owned()]
}

/// The keys one connector reads besides [`Outbound`]'s.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpKeys {
    #[serde(default, deserialize_with = "body_encoding")]
    content_type: BodyEncoding,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WsKeys {
    #[serde(default)]
    encoding: FrameEncoding,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct A2aKeys {
    #[serde(default)]
    card_origins: Vec<String>,
    card_keys_file: Option<std::path::PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct McpKeys {
    tool: Option<String>,
    #[serde(default)]
    arguments: serde_json::Map<String, serde_json::Value>,
}

/// The keys only one kind of agent reads, and that kind, for a refusal that says where a key
/// belongs rather than only that it is unknown here. The kinds are spelt as [`own`] is told.
const OWNED_KEYS: [(&str, &str); 8] = [
    ("tool", "protocol = 'mcp' agents"),
    ("arguments", "protocol = 'mcp' agents"),
    ("card_origins", "protocol = 'a2a' agents"),
    ("card_keys_file", "protocol = 'a2a' agents"),
    ("encoding", "ws:// and wss:// agents"),
    ("routing_key", "AMQP agents (no url)"),
    ("queue", "AMQP agents (no url)"),
    ("user", "AMQP agents (no url)"),
];

impl<'de> Deserialize<'de> for AgentConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut table = toml::Table::deserialize(d)?;
        let name = match table.get("name") {
            Some(toml::Value::String(name)) => name.clone(),
            _ => return Err(D::Error::custom("an agent needs a name (name = \"...\")")),
        };
        let refuse = |why: String| D::Error::custom(format!("agent '{name}': {why}"));
        let common: Common = parse(take(&mut table, &Common::KEYS)).map_err(&refuse)?;
        let protocol = match table.remove("protocol") {
            None => "nlip".to_owned(),
            Some(toml::Value::String(p)) => p,
            Some(other) => {
                return Err(refuse(format!("protocol = {other}: expected 'nlip', 'a2a' or 'mcp'")));
            }
        };
        let url = table.get("url").and_then(toml::Value::as_str).map(str::to_owned);
        let reach = match (protocol.as_str(), url) {
            ("nlip", None) => Reach::Amqp(own(table, "AMQP agents (no url)").map_err(&refuse)?),
            ("nlip", Some(url)) if is_websocket_url(&url) => {
                let (outbound, keys) =
                    outbound_and::<WsKeys>(table, "ws:// and wss:// agents").map_err(&refuse)?;
                Reach::WebSocket(WsReach { outbound, encoding: keys.encoding })
            }
            ("nlip", Some(_)) => {
                let (outbound, keys) =
                    outbound_and::<HttpKeys>(table, "http:// and https:// agents").map_err(&refuse)?;
                Reach::Http(HttpReach { outbound, content_type: keys.content_type })
            }
            ("a2a" | "mcp", url) if url.as_deref().is_none_or(is_websocket_url) => {
                return Err(refuse(format!("protocol = '{protocol}' needs an http:// or https:// url")));
            }
            ("a2a", Some(_)) => {
                let (outbound, keys) =
                    outbound_and::<A2aKeys>(table, "protocol = 'a2a' agents").map_err(&refuse)?;
                Reach::A2a(A2aReach {
                    outbound,
                    card_origins: keys.card_origins,
                    card_keys_file: keys.card_keys_file,
                })
            }
            ("mcp", Some(_)) => {
                let (outbound, keys) =
                    outbound_and::<McpKeys>(table, "protocol = 'mcp' agents").map_err(&refuse)?;
                let tool = keys.tool.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
                    refuse("protocol = 'mcp' needs tool, the name of the tool each envelope calls".into())
                })?;
                if keys.arguments.contains_key("silp_encoding") || keys.arguments.contains_key("silp_payload")
                {
                    return Err(refuse(
                        "arguments may not set silp_encoding or silp_payload: silpgate writes them".into(),
                    ));
                }
                Reach::Mcp(McpReach { outbound, tool, arguments: keys.arguments })
            }
            (other, _) => {
                return Err(refuse(format!("protocol = '{other}' is not one of 'nlip', 'a2a', 'mcp'")));
            }
        };
        Ok(AgentConfig {
            name: common.name,
            frontends: common.frontends,
            tokenizer: common.tokenizer,
            frontend: common.frontend,
            allow: common.allow,
            reach,
        })
    }
}

/// Removes `keys` from `table`, into a table of their own.
fn take(table: &mut toml::Table, keys: &[&str]) -> toml::Table {
    keys.iter().filter_map(|key| table.remove_entry(*key)).collect()
}

fn parse<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T, String> {
    toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| e.message().to_owned())
}

/// An agent with a `url`: its [`Outbound`] keys, and the rest as the connector `kind` names
/// reads them.
fn outbound_and<K: serde::de::DeserializeOwned>(
    mut table: toml::Table,
    kind: &str,
) -> Result<(Outbound, K), String> {
    let outbound = parse(take(&mut table, &Outbound::KEYS))?;
    Ok((outbound, own(table, kind)?))
}

/// The rest of an agent's keys, read by the connector `kind` names; a key that belongs to
/// another kind of agent is refused saying whose it is.
fn own<T: serde::de::DeserializeOwned>(table: toml::Table, kind: &str) -> Result<T, String> {
    let parsed = parse::<T>(table.clone());
    if parsed.is_err() {
        let misplaced = OWNED_KEYS.iter().find(|(key, owner)| table.contains_key(*key) && *owner != kind);
        if let Some((key, owner)) = misplaced {
            return Err(format!("{key} is for {owner}; this is one of the {kind}"));
        }
        if let Some(key) = Outbound::KEYS.iter().find(|key| table.contains_key(**key)) {
            return Err(format!("{key} is for agents with a url; this is one of the {kind}"));
        }
    }
    parsed
}

fn body_encoding<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BodyEncoding, D::Error> {
    let content_type = String::deserialize(d)?;
    match crate::nlip::Encoding::from_content_type(&content_type) {
        Some(crate::nlip::Encoding::Json) => Ok(BodyEncoding::Json),
        Some(crate::nlip::Encoding::Cbor) => Ok(BodyEncoding::Cbor),
        None => Err(D::Error::custom(format!(
            "content_type '{content_type}' is neither application/json nor application/cbor"
        ))),
    }
}
