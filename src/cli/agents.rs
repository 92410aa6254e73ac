//! `silpgate agents check`: whether each configured agent can be reached over its transport,
//! and which frontends it negotiates when it answers `//ping`.
//!
//! - AMQP: the broker connection, then the agent's queue (a passive declare) when silpgate
//!   declares one for it, else the agents exchange.
//! - HTTP: a `//ping` control message POSTed to the agent; any answer short of a connection
//!   failure, a timeout or a 5xx means reachable.
//! - WebSocket: the upgrade, then a `//ping` frame; the agent's answer, if it gives one
//!   within `timeout_ms`, names its frontends.
//! - A2A: the agent card, which must name an A2A 1.0 JSON-RPC interface; the line shows the
//!   card's name, that interface and the skills.
//! - MCP: `initialize` and `tools/list`, which must list the agent's `tool`; the line says
//!   whether the tool's input schema names the SILP wrapper (`silp_encoding`, `silp_payload`).
//!
//! One line per agent; exit 1 when any agent is unreachable.

use super::EXIT_INVALID;
use crate::config::{A2aReach, AgentConfig, AmqpReach, Config, HttpReach, McpReach, Reach, WsReach};
use crate::connectors::DeliveryError;
use crate::connectors::a2a::A2aAgent;
use crate::connectors::http::HttpAgent;
use crate::connectors::mcp::McpAgent;
use crate::nlip::{self, Encoding, Message};
use crate::websocket::{Dialer, frame_of, message_of};
use clap::Subcommand;
use futures_util::{SinkExt, StreamExt};
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub(super) enum AgentsCommand {
    /// Check that every configured agent is reachable and show the frontends it negotiates;
    /// exit 1 when one is not.
    Check {
        /// The configuration whose `[[agents]]` are checked.
        #[arg(long)]
        config: PathBuf,
    },
}

/// What a check found.
struct Checked {
    reachable: bool,
    transport: &'static str,
    detail: String,
}

pub(super) fn run(command: AgentsCommand) -> ExitCode {
    let AgentsCommand::Check { config } = command;
    let config = match Config::load(&config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let reaches =
        runtime.block_on(futures_util::future::join_all(config.agents.iter().map(|a| check(&config, a))));
    let width = config.agents.iter().map(|a| a.name.len()).max().unwrap_or(0);
    let mut unreachable = 0;
    for (agent, reach) in config.agents.iter().zip(reaches) {
        let status = if reach.reachable { "ok" } else { "unreachable" };
        unreachable += usize::from(!reach.reachable);
        println!("{status:<11}  {:<width$}  {:<9}  {}", agent.name, reach.transport, reach.detail);
    }
    if config.agents.is_empty() {
        println!("no agents are configured");
    }
    if unreachable > 0 { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS }
}

async fn check(config: &Config, agent: &AgentConfig) -> Checked {
    let name = agent.name.as_str();
    let result = match &agent.reach {
        Reach::Amqp(reach) => check_amqp(config, name, reach).await,
        Reach::Http(reach) => check_http(config, name, reach).await,
        Reach::WebSocket(reach) => check_ws(config, name, reach).await,
        Reach::A2a(reach) => check_a2a(config, name, reach).await,
        Reach::Mcp(reach) => check_mcp(name, reach).await,
    };
    let transport = agent.reach.transport().as_str();
    match result {
        Ok(detail) => Checked { reachable: true, transport, detail },
        Err(detail) => Checked { reachable: false, transport, detail },
    }
}

/// The `//ping` silpgate sends: its frontends, most preferred first.
fn ping(config: &Config) -> Message {
    let frontends: Vec<&str> = crate::silp::Frontend::ALL.iter().map(|f| f.name()).collect();
    let text = serde_json::json!({
        "messagetype": "control", "format": "text", "subformat": "english", "content": "//ping",
        "submessages": [{"format": "structured", "subformat": "json",
            "content": {"silp": "v1", "frontends": frontends, "agent": config.gateway.name}}]
    });
    nlip::decode(text.to_string().as_bytes(), Encoding::Json, &nlip::Limits::default())
        .expect("the ping is a valid NLIP message")
}

/// What an answer to `//ping` says about the agent's frontends.
fn negotiated(answer: Option<&Message>) -> String {
    let body = answer.and_then(|a| match &a.content {
        nlip::Content::Json(Value::Object(o)) if o.contains_key("frontends") => Some(o.clone()),
        _ => None,
    });
    match body {
        Some(body) => {
            let names: Vec<&str> = body
                .get("frontends")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let preferred = body.get("preferred").and_then(Value::as_str).unwrap_or("-");
            format!("frontends {}; preferred {preferred}", names.join(","))
        }
        None => "no //ping answer (frontends from the configuration)".to_owned(),
    }
}

async fn check_amqp(config: &Config, name: &str, agent: &AmqpReach) -> Result<String, String> {
    let timeout = Duration::from_millis(agent.timeout_ms.max(1));
    let amqp = config.amqp.as_ref().ok_or("it is reached over AMQP and no [amqp] section is configured")?;
    let addresses = crate::broker::addresses::Addresses::of(amqp)?;
    // Any node of the list will do: the first that answers is asked.
    let connection = crate::broker::supervise::connect_any(&addresses, timeout)
        .await
        .map_err(|e| format!("broker: {e}"))?;
    let channel = connection.create_channel().await.map_err(|e| format!("broker: {e}"))?;
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    let found = match &agent.queue {
        Some(queue) => channel
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .map(|q| {
                format!(
                    "queue {queue}: {} messages, {} consumers (routing key {})",
                    q.message_count(),
                    q.consumer_count(),
                    agent.routing_key(name)
                )
            })
            .map_err(|e| format!("queue {queue}: {e}")),
        None => {
            let passive = ExchangeDeclareOptions { passive: true, ..ExchangeDeclareOptions::default() };
            let exchange = amqp.agents_exchange.as_str();
            channel
                .exchange_declare(exchange.into(), ExchangeKind::Direct, passive, FieldTable::default())
                .await
                .map(|()| format!("exchange {exchange} (routing key {})", agent.routing_key(name)))
                .map_err(|e| format!("exchange {exchange}: {e}"))
        }
    };
    let _ = connection.close(200, "checked".into()).await;
    found
}

async fn check_http(config: &Config, name: &str, agent: &HttpReach) -> Result<String, String> {
    let client = HttpAgent::new(name, agent, config.nlip.limits()).map_err(|e| e.to_string())?;
    // Shown without credentials.
    let shown = reqwest::Url::parse(&agent.outbound.url).map_or_else(
        |_| "(unparsable url)".to_owned(),
        |mut url| {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        },
    );
    match client.probe(ping(config)).await {
        Ok(answer) => Ok(format!("{shown}: {}", negotiated(answer.as_ref()))),
        Err(DeliveryError::Refused { code, detail, .. }) => {
            Ok(format!("{shown}: answered {detail} ({code}) to //ping"))
        }
        Err(DeliveryError::Unavailable { code, detail, .. }) => Err(format!("{shown}: {code}: {detail}")),
    }
}

async fn check_a2a(config: &Config, name: &str, agent: &A2aReach) -> Result<String, String> {
    let reply_timeout = Duration::from_millis(config.gateway.reply_timeout_ms.max(1));
    let client =
        A2aAgent::new(name, agent, reply_timeout, config.nlip.limits()).map_err(|e| e.to_string())?;
    let card = client.card().await.map_err(|e| e.to_string())?;
    let endpoint = A2aAgent::jsonrpc_endpoint(&card).map_err(|why| format!("agent card: {why}"))?;
    let generation = if endpoint.speaks_0_3 { "A2A 0.3" } else { "A2A 1.0" };
    let name = card.get("name").and_then(Value::as_str).unwrap_or("(unnamed)");
    let skills: Vec<&str> = card
        .get("skills")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(|s| s.get("id").and_then(Value::as_str)).collect())
        .unwrap_or_default();
    let streaming = card.pointer("/capabilities/streaming").and_then(Value::as_bool).unwrap_or(false);
    let mut endpoint = endpoint.url;
    let _ = endpoint.set_username("");
    let _ = endpoint.set_password(None);
    Ok(format!(
        "card '{name}', {generation} JSON-RPC {endpoint}, skills {}; streaming {}",
        if skills.is_empty() { "-".to_owned() } else { skills.join(",") },
        if streaming { "yes" } else { "no" }
    ))
}

async fn check_mcp(name: &str, agent: &McpReach) -> Result<String, String> {
    // Only the tool list is read: the limits of answers do not matter here.
    let client = McpAgent::new(name, agent, crate::nlip::Limits::default()).map_err(|e| e.to_string())?;
    let tools = client.tools().await.map_err(|e| e.to_string())?;
    let wanted = agent.tool.as_str();
    let names: Vec<&str> = tools.iter().filter_map(|t| t.get("name").and_then(Value::as_str)).collect();
    let Some(tool) = tools.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(wanted)) else {
        return Err(format!("tool '{wanted}' is not listed (the server lists {})", names.join(",")));
    };
    // silpgate sends the agent's fixed `arguments` and the SILP wrapper, nothing else: a tool
    // that requires another argument refuses every call.
    let required: Vec<&str> = tool
        .pointer("/inputSchema/required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let sent = |field: &str| {
        field == "silp_encoding" || field == "silp_payload" || agent.arguments.contains_key(field)
    };
    let unsent: Vec<&str> = required.into_iter().filter(|field| !sent(field)).collect();
    if !unsent.is_empty() {
        return Err(format!(
            "tool '{wanted}' requires {} that silpgate does not send: add it to the agent's arguments",
            unsent.join(", ")
        ));
    }
    let properties = tool.pointer("/inputSchema/properties");
    let takes = |field: &str| properties.and_then(|p| p.get(field)).is_some();
    let wrapper = if takes("silp_encoding") && takes("silp_payload") {
        "its input schema takes the SILP wrapper"
    } else {
        "its input schema names no silp_encoding/silp_payload (the tool may refuse them)"
    };
    Ok(format!("tool '{wanted}' listed among {} tools; {wrapper}", names.len()))
}

async fn check_ws(config: &Config, name: &str, reach: &WsReach) -> Result<String, String> {
    let (limits, agent) = (config.nlip.limits(), &reach.outbound);
    let timeout = Duration::from_millis(agent.timeout_ms.max(1));
    let dialer = Dialer::new(
        &agent.url,
        agent.token_env.as_deref(),
        agent.ca_file.as_deref(),
        limits.max_bytes,
        timeout,
    )
    .map_err(|e| e.to_string())?;
    let shown = dialer.url().to_owned();
    let span = tracing::info_span!("agent check", silpgate.agent = %name);
    let mut socket = dialer.connect(&span).await.map_err(|e| format!("{shown}: {e}"))?;
    socket.send(frame_of(&ping(config), reach.encoding.nlip())).await.map_err(|e| format!("{shown}: {e}"))?;
    let answer = tokio::time::timeout(timeout, async {
        while let Some(Ok(frame)) = socket.next().await {
            if let Some(decoded) = message_of(&frame, &limits) {
                return decoded.ok();
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let _ = socket.close(None).await;
    Ok(format!("{shown}: {}", negotiated(answer.as_ref())))
}
