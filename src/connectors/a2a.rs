//! Agents that speak A2A 1.0 or 0.3 (JSON-RPC binding). silpgate reads the agent card at
//! `<url>/.well-known/agent-card.json` once (again after a failure) for the JSON-RPC interface,
//! then sends each parcel as a `SendMessage` with the header `A2A-Version: 1.0`, the envelope
//! mapped as [`crate::a2a::map`] says, and `returnImmediately` so that no HTTP request is held open for a
//! long task.
//!
//! A card that names no 1.x JSON-RPC interface but a 0.3 one (in `supportedInterfaces`, or
//! 0.3's top-level `url` with `preferredTransport` JSONRPC) is an agent of 0.3: it gets the
//! same calls in 0.3's names and shapes (`message/send` with `blocking: false`, `tasks/get`;
//! [`crate::a2a::v0_3`]) with `A2A-Version: 0.3`, and its answers are read back as 1.0's.
//!
//! With `card_keys_file`, the card must be signed (A2A's signed agent cards): one of its
//! signatures must verify against those keys ([`crate::a2a::signature`]), or the card is
//! refused (`a2a_card_invalid`) and nothing is sent.
//!
//! When the card offers streaming (`capabilities.streaming`) and someone waits for the answer,
//! the parcel goes as a `SendStreamingMessage` instead, and silpgate reads the agent's events
//! as they come (each held to the answer limit): a Message ends the exchange; a Task, its
//! status updates and its artifact updates (appended or replaced, by artifact id) build the
//! task until its state is final. A stream that ends or breaks before that leaves the task to
//! be polled, as below. A working task's status messages are passed on as they come, as
//! interim events, to an asker that takes them ([`super::Progress`]).
//!
//! The answer is a Message, or a Task. A task that is not finished is polled with `GetTask`
//! (20 ms, doubling to 500 ms) until it ends or `gateway.reply_timeout_ms` passes since the
//! delivery began (then the asker hears `timeout`); a notice (nobody waits) is delivered once
//! the agent accepted it. A completed task's artifacts are the answer; a failed, rejected or
//! canceled task is answered with an NLIP error whose code names the state
//! (`a2a_task_failed`, ...) and whose text carries the agent's status message.
//!
//! A task that wants input or authentication asks a question: in a conversation, its status
//! message is the answer, of `messagetype` `input-required` or `auth-required`, and the
//! agent's task is remembered for the conversation, so that its next message goes to that
//! task (`taskId`, with the task's `contextId`) and the agent goes on where it stopped. The
//! question is forgotten once the agent answers the conversation otherwise. Without a
//! conversation nothing could answer it: the asker hears an NLIP error
//! (`a2a_input_required`, `a2a_auth_required`). Once the agent accepted a message, nothing about it is retried: a poll that
//! cannot reach the agent is tried again until the deadline.
//!
//! Reaching the agent follows the HTTP agents' rules: a connection failure, a timeout, a 5xx,
//! 408 or 429, or the JSON-RPC internal error is transient; another JSON-RPC error or 4xx is
//! the agent refusing the message (`a2a_refused`), and the asker is told its words.

use super::events::{EventError, Events};
use super::{AnswerTo, Connector, Delivered, DeliveryError, Parcel, SetupError};
use crate::a2a::map::{self, TaskState};
use crate::a2a::signature::CardKeys;
use crate::a2a::{VERSION, v0_3};
use crate::code::Code;
use crate::config::A2aReach;
use crate::nlip::Message;
use crate::nlip::reply::{Location, error_message};
use futures_util::future::BoxFuture;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OnceCell, Semaphore};
use tracing::Instrument;

/// Where an agent card is, relative to the agent's base URL.
pub(crate) const CARD_PATH: &str = ".well-known/agent-card.json";
/// The JSON-RPC internal error: the agent failed, not the message.
const INTERNAL_ERROR: i64 = -32603;
const FIRST_POLL: Duration = Duration::from_millis(20);
const LONGEST_POLL: Duration = Duration::from_millis(500);

/// The agent's task a delivery waits on. When the delivery is dropped before the task ended,
/// because its asker gave the work up ([`super::Progress::abandoned`]), the agent is told to
/// cancel it: `CancelTask` (0.3: `tasks/cancel`), sent on its own, answered or not.
struct TaskAtAgent<'a> {
    agent: &'a A2aAgent,
    parcel: &'a Parcel,
    endpoint: Endpoint,
    /// The task, while it works.
    working: Option<String>,
}

impl TaskAtAgent<'_> {
    /// The task `task` names, working, or none once it ended.
    fn track(&mut self, task: &Value) {
        self.working = (TaskState::of(task) == TaskState::Pending)
            .then(|| task.get("id").and_then(Value::as_str).map(str::to_owned))
            .flatten();
    }
}

impl Drop for TaskAtAgent<'_> {
    fn drop(&mut self) {
        let Some(id) = self.working.take() else { return };
        if !self.parcel.progress.as_ref().is_some_and(|asker| asker.0.abandoned()) {
            return;
        }
        let (method, version) =
            if self.endpoint.speaks_0_3 { ("tasks/cancel", "0.3") } else { ("CancelTask", VERSION) };
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": method, "params": {"id": id}});
        let request = self
            .agent
            .client
            .post(self.endpoint.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("A2A-Version", version)
            .body(body.to_string());
        let agent = self.agent.name.clone();
        let sending = CancelSent::count();
        tokio::spawn(async move {
            let _sending = sending;
            match request.send().await {
                Ok(response) => {
                    tracing::info!(agent = %agent, task = %id, status = %response.status(), "The asker gave the work up; the agent's task is canceled.")
                }
                Err(e) => {
                    tracing::warn!(agent = %agent, task = %id, error = %super::http::described(e), "The asker gave the work up, and the agent could not be told to cancel its task.")
                }
            }
        });
    }
}

/// `CancelTask` requests on their way to agents, which a stopping daemon waits for
/// ([`cancels_sent`]).
static CANCELS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One `CancelTask` on its way, counted until dropped.
struct CancelSent;

impl CancelSent {
    fn count() -> CancelSent {
        CANCELS.fetch_add(1, Ordering::AcqRel);
        CancelSent
    }
}

impl Drop for CancelSent {
    fn drop(&mut self) {
        CANCELS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits, at most `limit`, until every `CancelTask` sent to an agent has been answered (or
/// has failed): a task given up as silpgate stops is canceled at its agent before it exits.
pub(crate) async fn cancels_sent(limit: Duration) {
    let deadline = Instant::now() + limit;
    while CANCELS.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One agent reached over A2A.
pub(crate) struct A2aAgent {
    name: String,
    base: String,
    client: reqwest::Client,
    endpoint: OnceCell<Endpoint>,
    slots: Semaphore,
    reply_timeout: Duration,
    rpc_ids: AtomicU64,
    /// Origins the card may name besides the base URL's (`card_origins`).
    card_origins: Vec<String>,
    /// Answers are held to these, as any inbound message; a response body may be twice
    /// `max_bytes` (JSON-RPC framing, base64 parts) before its NLIP form is checked.
    limits: crate::nlip::Limits,
    /// The agent's tasks waiting for their conversation's next message, by conversation.
    asking: std::sync::Mutex<HashMap<String, Asking>>,
    /// The keys its card must be signed with (`card_keys_file`), when set.
    card_keys: Option<CardKeys>,
}

/// An agent's task that asked its conversation a question.
struct Asking {
    task: String,
    context: String,
    since: Instant,
}

/// Questions remembered at most per agent; past it, the oldest is forgotten (its
/// conversation's next message then starts a fresh task at the agent).
const MAX_ASKING: usize = 10_000;

/// Where the agent takes JSON-RPC calls, and in which generation of A2A.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub url: reqwest::Url,
    pub speaks_0_3: bool,
    /// The card offers `SendStreamingMessage`.
    pub streams: bool,
}

/// A JSON-RPC error the agent answered with.
struct Fault {
    code: i64,
    message: String,
}

impl A2aAgent {
    /// Tasks are waited for at most `reply_timeout`.
    pub(crate) fn new(
        name: &str,
        reach: &A2aReach,
        reply_timeout: Duration,
        limits: crate::nlip::Limits,
    ) -> Result<Self, SetupError> {
        let agent = &reach.outbound;
        reqwest::Url::parse(&agent.url)
            .map_err(|e| SetupError::Client { agent: name.to_owned(), detail: format!("url: {e}") })?;
        let card_keys = reach.card_keys_file.as_deref().map(CardKeys::read).transpose().map_err(|e| {
            SetupError::Client { agent: name.to_owned(), detail: format!("card_keys_file: {e}") }
        })?;
        Ok(A2aAgent {
            name: name.to_owned(),
            base: agent.url.trim_end_matches('/').to_owned(),
            client: super::http::client(name, agent)?,
            endpoint: OnceCell::new(),
            slots: Semaphore::new(agent.max_in_flight.max(1)),
            reply_timeout,
            rpc_ids: AtomicU64::new(1),
            card_origins: reach
                .card_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            limits,
            asking: std::sync::Mutex::default(),
            card_keys,
        })
    }

    fn asking(&self) -> std::sync::MutexGuard<'_, HashMap<String, Asking>> {
        self.asking.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The A2A message of a parcel: in the agent's task that asked its conversation a
    /// question, if one did.
    fn outgoing(&self, parcel: &Parcel) -> Value {
        let mut message = map::message(&parcel.envelope, &parcel.message_id, map::ROLE_USER);
        if let Some(conversation) = parcel.envelope.conversation_token()
            && let Some(asking) = self.asking().get(conversation)
        {
            message["taskId"] = json!(asking.task);
            message["contextId"] = json!(asking.context);
        }
        message
    }

    /// Remembers `task`'s question for the conversation of `request`, or, for any other
    /// outcome, forgets the question the conversation had.
    fn note_question(&self, request: &Message, task: Option<&Value>) {
        let Some(conversation) = request.conversation_token() else { return };
        let mut asking = self.asking();
        let Some(task) = task.filter(|t| TaskState::of(t).question().is_some()) else {
            asking.remove(conversation);
            return;
        };
        if asking.len() >= MAX_ASKING && !asking.contains_key(conversation) {
            let oldest = asking.iter().min_by_key(|(_, a)| a.since).map(|(c, _)| c.clone());
            oldest.map(|c| asking.remove(&c));
        }
        let text = |key: &str| task.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let context =
            Some(text("contextId")).filter(|c| !c.is_empty()).unwrap_or_else(|| conversation.to_owned());
        asking.insert(conversation.to_owned(), Asking { task: text("id"), context, since: Instant::now() });
    }

    fn unavailable(&self, code: &'static str, detail: String) -> DeliveryError {
        DeliveryError::Unavailable { agent: self.name.clone(), code, detail }
    }

    /// The agent card, as the agent serves it.
    pub(crate) async fn card(&self) -> Result<Value, DeliveryError> {
        let url = format!("{}/{CARD_PATH}", self.base);
        let response = self
            .client
            .get(&url)
            .header(ACCEPT, "application/json")
            .header("A2A-Version", VERSION)
            .send()
            .await
            .map_err(|e| super::http::unreachable(&self.name, e))?;
        let status = response.status();
        // Which URL answered so, without credentials: what an operator checks first.
        let tried = reqwest::Url::parse(&url).map_or_else(|_| url.clone(), |u| super::http::redacted(&u));
        if let Some(location) = super::http::redirect_of(&response) {
            return Err(self.unavailable(
                "a2a_card_invalid",
                format!("agent card at {tried}: HTTP {status} to {location}: silpgate follows no redirects"),
            ));
        }
        if !status.is_success() {
            return Err(self.unavailable(
                Code::AgentUnavailable.as_str(),
                format!("agent card at {tried}: HTTP {status}"),
            ));
        }
        let body = super::http::read_bounded(response, self.limits.max_bytes, &self.name).await?;
        let card: Value = serde_json::from_slice(&body).map_err(|e| {
            self.unavailable(Code::A2aCardInvalid.as_str(), format!("the agent card is not JSON: {e}"))
        })?;
        if let Some(keys) = &self.card_keys {
            keys.verify(&card).map_err(|e| {
                self.unavailable(Code::A2aCardInvalid.as_str(), format!("agent card at {tried}: {e}"))
            })?;
        }
        Ok(card)
    }

    /// The JSON-RPC endpoint of an agent card: its first A2A 1.x JSON-RPC interface, else its
    /// first 0.3 one (listed in `supportedInterfaces`, or 0.3's own `url` and
    /// `preferredTransport`).
    pub(crate) fn jsonrpc_endpoint(card: &Value) -> Result<Endpoint, String> {
        let interfaces = card.get("supportedInterfaces").and_then(Value::as_array);
        let jsonrpc = |generation: &str| {
            interfaces.into_iter().flatten().find(|i| {
                let binding = i.get("protocolBinding").and_then(Value::as_str).unwrap_or_default();
                let version = i.get("protocolVersion").and_then(Value::as_str).unwrap_or(VERSION);
                binding.eq_ignore_ascii_case("JSONRPC") && version.starts_with(generation)
            })
        };
        let (url, speaks_0_3) = if let Some(current) = jsonrpc("1.") {
            (current.get("url"), false)
        } else if let Some(old) = jsonrpc("0.3") {
            (old.get("url"), true)
        } else {
            let transport = card.get("preferredTransport").and_then(Value::as_str).unwrap_or("JSONRPC");
            let version = card.get("protocolVersion").and_then(Value::as_str).unwrap_or(v0_3::VERSION);
            let old_card = transport.eq_ignore_ascii_case("JSONRPC") && version.starts_with("0.3");
            (card.get("url").filter(|_| old_card), true)
        };
        let url = url.and_then(Value::as_str).ok_or(
            "the agent card names no A2A JSON-RPC interface of 1.0 (supportedInterfaces) or 0.3 (url, preferredTransport)",
        )?;
        let url = reqwest::Url::parse(url).map_err(|e| format!("the card's JSON-RPC url '{url}': {e}"))?;
        let streams = card.pointer("/capabilities/streaming").and_then(Value::as_bool).unwrap_or(false);
        Ok(Endpoint { url, speaks_0_3, streams })
    }

    /// The JSON-RPC endpoint, from the card (read once, again after a failure).
    async fn endpoint(&self) -> Result<&Endpoint, DeliveryError> {
        self.endpoint
            .get_or_try_init(|| async {
                let card = self.card().await?;
                let endpoint = Self::jsonrpc_endpoint(&card)
                    .map_err(|why| self.unavailable(Code::A2aCardInvalid.as_str(), why))?;
                Ok(Endpoint { url: self.trusted(endpoint.url)?, ..endpoint })
            })
            .await
    }

    /// The card's endpoint, if the card may name it: on the configured URL's origin (or one of
    /// `card_origins`), and never plain `http://` behind an `https://` URL.
    fn trusted(&self, url: reqwest::Url) -> Result<reqwest::Url, DeliveryError> {
        let origin = url.origin().ascii_serialization();
        let base =
            reqwest::Url::parse(&self.base).map(|b| b.origin().ascii_serialization()).unwrap_or_default();
        let downgraded = self.base.starts_with("https:") && url.scheme() != "https";
        if downgraded || (origin != base && !self.card_origins.contains(&origin)) {
            let why = format!(
                "the agent card names the endpoint {origin}, not the configured {base} (allow it with card_origins; https is never downgraded)"
            );
            return Err(self.unavailable(Code::A2aCardInvalid.as_str(), why));
        }
        Ok(url)
    }

    /// One JSON-RPC call of a 1.0 method: its result, or the agent's JSON-RPC error. An agent
    /// of 0.3 is called by the method's 0.3 name with 0.3's params, and its result is read
    /// back as 1.0's.
    async fn call(&self, method: &str, params: Value) -> Result<Result<Value, Fault>, DeliveryError> {
        let endpoint = self.endpoint().await?;
        if !endpoint.speaks_0_3 {
            return self.call_as(&endpoint.url, method, params, VERSION).await;
        }
        let old_method = v0_3::method_as_0_3(method).unwrap_or(method);
        let params = match method {
            "SendMessage" => {
                let message = params.get("message").map(v0_3::message_to).unwrap_or_default();
                let blocking = !params
                    .pointer("/configuration/returnImmediately")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                json!({"message": message, "configuration": {"blocking": blocking}})
            }
            _ => params,
        };
        let answered = self.call_as(&endpoint.url, old_method, params, "0.3").await?;
        Ok(answered.map(|result| match method {
            "SendMessage" => v0_3::result_from(&result),
            _ => v0_3::task_from(&result),
        }))
    }

    /// One JSON-RPC call as it goes on the wire.
    async fn call_as(
        &self,
        endpoint: &reqwest::Url,
        method: &str,
        params: Value,
        version: &str,
    ) -> Result<Result<Value, Fault>, DeliveryError> {
        let conversation = params.pointer("/message/contextId").and_then(Value::as_str);
        let span = self.span(method, endpoint, conversation);
        if let Some(task) = params.get("id").and_then(Value::as_str) {
            span.record("a2a.task.id", task);
        }
        let result = async {
            let response = self
                .post(endpoint, method, params, version, "application/json, application/a2a+json", &span)
                .await?;
            self.read_reply(method, response).await
        }
        .instrument(span.clone())
        .await;
        match &result {
            Ok(Ok(answer)) => {
                if let Some(task) =
                    answer.pointer("/task/id").or_else(|| answer.get("id")).and_then(Value::as_str)
                {
                    span.record("a2a.task.id", task);
                }
            }
            Ok(Err(fault)) => {
                span.record("error.type", fault.code.to_string());
            }
            Err(e) => {
                span.record("error.type", e.code());
            }
        }
        result
    }

    /// The span of one JSON-RPC call to the agent. A message sent (`SendMessage`,
    /// `SendStreamingMessage`, 0.3's `message/*`) is the OpenTelemetry GenAI conventions'
    /// `invoke_agent {agent}` span (docs/operations.md says which version); every call carries
    /// `a2a.method` and `a2a.protocol.version`, and the task it is about once known
    /// (`a2a.task.id`).
    fn span(&self, method: &str, endpoint: &reqwest::Url, conversation: Option<&str>) -> tracing::Span {
        let invokes = method.contains("Message") || method.starts_with("message/");
        let name = if invokes { format!("invoke_agent {}", self.name) } else { method.to_owned() };
        let version = if method.contains('/') { "0.3" } else { VERSION };
        tracing::info_span!(
            "agent deliver",
            otel.name = %name,
            otel.kind = "client",
            gen_ai.operation.name = invokes.then_some("invoke_agent"),
            gen_ai.agent.name = %self.name,
            gen_ai.conversation.id = conversation,
            a2a.method = method,
            a2a.protocol.version = version,
            a2a.task.id = tracing::field::Empty,
            network.transport = "tcp",
            network.protocol.name = "http",
            server.address = endpoint.host_str().unwrap_or_default(),
            server.port = endpoint.port_or_known_default(),
            error.type = tracing::field::Empty,
        )
    }

    /// Posts one JSON-RPC request: the response, unless it is a redirect or a status that is
    /// worth trying again.
    async fn post(
        &self,
        endpoint: &reqwest::Url,
        method: &str,
        params: Value,
        version: &str,
        accept: &'static str,
        span: &tracing::Span,
    ) -> Result<reqwest::Response, DeliveryError> {
        let id = self.rpc_ids.fetch_add(1, Ordering::Relaxed);
        let mut trace = HeaderMap::new();
        crate::telemetry::inject_http(span, &mut trace);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let request = self
            .client
            .post(endpoint.clone())
            .headers(trace)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .header("A2A-Version", version)
            .body(body.to_string());
        let response = request.send().await.map_err(|e| super::http::unreachable(&self.name, e))?;
        let status = response.status();
        if let Some(location) = super::http::redirect_of(&response) {
            return Err(super::http::redirected(&self.name, status, &location));
        }
        let transient = status.is_server_error()
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        if transient {
            return Err(self.unavailable(Code::AgentUnavailable.as_str(), format!("{method}: HTTP {status}")));
        }
        Ok(response)
    }

    /// A JSON-RPC response body: its result, or the agent's JSON-RPC error.
    async fn read_reply(
        &self,
        method: &str,
        response: reqwest::Response,
    ) -> Result<Result<Value, Fault>, DeliveryError> {
        let status = response.status();
        let bytes =
            super::http::read_bounded(response, self.limits.max_bytes.saturating_mul(2), &self.name).await?;
        match serde_json::from_slice::<Value>(&bytes).ok().as_ref().and_then(outcome_of) {
            Some(outcome) => Ok(outcome),
            None if !status.is_success() => Ok(Err(Fault { code: 0, message: format!("HTTP {status}") })),
            None => Err(self.unavailable(
                "a2a_invalid_answer",
                format!("{method}: the answer is not a JSON-RPC response"),
            )),
        }
    }

    /// A JSON-RPC error as a delivery failure: the agent's internal error is transient, any
    /// other is the agent refusing the message, with its words for the asker.
    fn refused(&self, method: &str, fault: Fault, request: &Message) -> DeliveryError {
        let detail = format!("{method}: JSON-RPC error {}: {}", fault.code, fault.message);
        if fault.code == INTERNAL_ERROR {
            return self.unavailable(Code::AgentUnavailable.as_str(), detail);
        }
        let answer =
            self.error_answer(Code::A2aRefused.as_str(), &format!("agent {}: {detail}", self.name), request);
        DeliveryError::Refused {
            agent: self.name.clone(),
            code: Code::A2aRefused.as_str().into(),
            detail,
            answer: Some(Box::new(answer)),
        }
    }

    /// An NLIP error for the asker, carrying the request's tokens like any answer.
    fn error_answer(&self, code: &str, text: &str, request: &Message) -> Message {
        let mut answer = error_message(code, text, &Location::None);
        echo_tokens(&mut answer, request);
        answer
    }

    /// Sends one parcel; its answer, when someone waits for one.
    async fn send(&self, parcel: &Parcel) -> Result<Option<Message>, DeliveryError> {
        let started = Instant::now();
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let endpoint = self.endpoint().await?.clone();
        let mut at_agent = TaskAtAgent { agent: self, parcel, endpoint: endpoint.clone(), working: None };
        if endpoint.streams && parcel.answer_to != AnswerTo::Nobody {
            let deadline = started + self.reply_timeout;
            return self.send_streaming(parcel, &endpoint, deadline, &mut at_agent).await.map(Some);
        }
        let message = self.outgoing(parcel);
        let params = json!({"message": message, "configuration": {"returnImmediately": true}});
        let result = match self.call("SendMessage", params).await? {
            Ok(result) => result,
            Err(fault) => return Err(self.refused("SendMessage", fault, &parcel.envelope)),
        };
        let request = &parcel.envelope;
        if let Some(message) = result.get("message") {
            return Ok(Some(self.answer_of_message(message, request)));
        }
        let Some(task) = result.get("task") else {
            let text = format!("agent {}: SendMessage answered neither a message nor a task", self.name);
            return Ok(Some(self.error_answer(Code::A2aInvalidAnswer.as_str(), &text, request)));
        };
        if TaskState::of(task) != TaskState::Pending {
            return Ok(Some(self.answer_of_task(task, request)));
        }
        if parcel.answer_to == AnswerTo::Nobody {
            return Ok(None);
        }
        at_agent.track(task);
        let answer = self.wait_for(task, started + self.reply_timeout, request).await;
        at_agent.working = None;
        Ok(Some(answer))
    }

    /// Sends one parcel as a `SendStreamingMessage` and reads the agent's events until the
    /// answer is final, or the deadline passes. Once the agent has taken the message (its
    /// response began), nothing is retried: a stream that breaks leaves the task to be polled.
    async fn send_streaming(
        &self,
        parcel: &Parcel,
        endpoint: &Endpoint,
        deadline: Instant,
        at_agent: &mut TaskAtAgent<'_>,
    ) -> Result<Message, DeliveryError> {
        let request = &parcel.envelope;
        let message = self.outgoing(parcel);
        let (method, params, version) = if endpoint.speaks_0_3 {
            ("message/stream", json!({"message": v0_3::message_to(&message)}), "0.3")
        } else {
            ("SendStreamingMessage", json!({"message": message}), VERSION)
        };
        let read =
            |result: Value| if endpoint.speaks_0_3 { v0_3::stream_event_from(&result) } else { result };
        let span = self.span(method, &endpoint.url, request.conversation_token());
        let answered = async {
            let response = self.post(&endpoint.url, method, params, version, "text/event-stream", &span).await?;
            let is_stream = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut progress = Progress::default();
            if !is_stream {
                // One JSON-RPC response instead of a stream: an error, or the answer at once.
                return match self.read_reply(method, response).await? {
                    Ok(result) => Ok(match progress.take(&read(result)) {
                        Some(done) => self.answer_of_final(done, request),
                        None => self.after_stream(&progress, deadline, request).await,
                    }),
                    Err(fault) => Err(self.refused(method, fault, request)),
                };
            }
            let mut events = Events::new(response, self.limits.max_bytes.saturating_mul(2));
            loop {
                let next = match tokio::time::timeout_at(deadline.into(), events.next()).await {
                    Ok(next) => next,
                    // The deadline: polling at once answers `timeout`, or the task's end.
                    Err(_) => break,
                };
                let data = match next {
                    Ok(Some(data)) => data,
                    Ok(None) => break,
                    Err(EventError::TooLarge(limit)) => {
                        let text = format!("agent {}: an event of its stream is larger than {limit} bytes", self.name);
                        return Ok(self.error_answer(Code::AnswerTooLarge.as_str(), &text, request));
                    }
                    Err(EventError::Read(e)) => {
                        tracing::debug!(agent = %self.name, error = %e, "the task's stream broke; polling it");
                        break;
                    }
                };
                match serde_json::from_str::<Value>(&data).ok().as_ref().and_then(outcome_of) {
                    Some(Ok(result)) => {
                        let event = read(result);
                        if let Some(done) = progress.take(&event) {
                            at_agent.working = None;
                            return Ok(self.answer_of_final(done, request));
                        }
                        if let Some(task) = &progress.task {
                            at_agent.track(task);
                            if let Some(id) = task.get("id").and_then(Value::as_str) {
                                span.record("a2a.task.id", id);
                            }
                        }
                        self.report(parcel, &event);
                    }
                    Some(Err(fault)) => return Err(self.refused(method, fault, request)),
                    None => {
                        let text = format!("agent {}: {method}: an event is not a JSON-RPC response", self.name);
                        return Ok(self.error_answer(Code::A2aInvalidAnswer.as_str(), &text, request));
                    }
                }
            }
            let answer = self.after_stream(&progress, deadline, request).await;
            at_agent.working = None;
            Ok(answer)
        }
        .instrument(span.clone())
        .await;
        if let Err(e) = &answered {
            span.record("error.type", e.code());
        }
        answered
    }

    /// Passes a working task's status message on to the asker, as an interim event, when the
    /// asker takes them. A task that says nothing yet is an empty event: the work has begun.
    fn report(&self, parcel: &Parcel, event: &Value) {
        let Some(to) = &parcel.progress else { return };
        let said =
            event.pointer("/statusUpdate/status/message").or_else(|| event.pointer("/task/status/message"));
        let no_parts = Vec::new();
        let parts = match said.and_then(|m| m.get("parts")).and_then(Value::as_array) {
            Some(parts) => parts,
            None if event.get("task").is_some() => &no_parts,
            None => return,
        };
        match map::envelope(parts, "statusUpdate.status.message.parts") {
            Ok(mut interim) => {
                interim.messagetype = Some(super::PROGRESS.to_owned());
                echo_tokens(&mut interim, &parcel.envelope);
                to.0.progress(super::held_to_limits(interim, &self.limits, &self.name));
            }
            Err(e) => {
                tracing::debug!(agent = %self.name, error = %e, "a status message could not be read; not passed on")
            }
        }
    }

    /// The answer once a stream ended without one: the task, polled to its end.
    async fn after_stream(&self, progress: &Progress, deadline: Instant, request: &Message) -> Message {
        match &progress.task {
            Some(task) => self.wait_for(task, deadline, request).await,
            None => {
                let text = format!("agent {}: its stream ended before a task or a message", self.name);
                self.error_answer(Code::A2aInvalidAnswer.as_str(), &text, request)
            }
        }
    }

    fn answer_of_final(&self, done: Final, request: &Message) -> Message {
        match done {
            Final::Message(message) => self.answer_of_message(&message, request),
            Final::Task(task) => self.answer_of_task(&task, request),
        }
    }

    /// Polls a task until it ends or the deadline passes.
    async fn wait_for(&self, task: &Value, deadline: Instant, request: &Message) -> Message {
        let id = task.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut pause = FIRST_POLL;
        loop {
            let now = Instant::now();
            if now >= deadline {
                let text =
                    format!("agent {}: task {id} did not end within gateway.reply_timeout_ms", self.name);
                return self.error_answer(Code::Timeout.as_str(), &text, request);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(LONGEST_POLL);
            match self.call("GetTask", json!({"id": id, "historyLength": 0})).await {
                Ok(Ok(task)) if TaskState::of(&task) != TaskState::Pending => {
                    return self.answer_of_task(&task, request);
                }
                Ok(Ok(_)) => {}
                Ok(Err(fault)) if fault.code == INTERNAL_ERROR => {}
                Ok(Err(fault)) => {
                    let text = format!(
                        "agent {}: GetTask {id}: JSON-RPC error {}: {}",
                        self.name, fault.code, fault.message
                    );
                    return self.error_answer(Code::A2aRefused.as_str(), &text, request);
                }
                // The agent has the task; a blip on the way to it does not lose it.
                Err(e) => {
                    tracing::debug!(agent = %self.name, error = %e, "polling a task failed; polling again")
                }
            }
        }
    }

    /// The answer a Message of the agent's gives: the conversation's question, if it had
    /// one, is answered.
    fn answer_of_message(&self, message: &Value, request: &Message) -> Message {
        self.note_question(request, None);
        self.answer_of_parts(message.get("parts"), "result.message.parts", request)
    }

    /// The answer a task that ended (or asks a question) gives.
    fn answer_of_task(&self, task: &Value, request: &Message) -> Message {
        let state = TaskState::of(task);
        self.note_question(request, Some(task));
        if let (Some(kind), Some(_)) = (state.question(), request.conversation_token())
            && let Some(parts) =
                task.pointer("/status/message/parts").filter(|p| p.as_array().is_some_and(|p| !p.is_empty()))
        {
            let mut question = self.answer_of_parts(Some(parts), "result.task.status.message.parts", request);
            if !question.is_error() {
                question.messagetype = Some(kind.to_owned());
            }
            return question;
        }
        match state.error_code() {
            None => self.answer_of_parts(
                Some(&Value::Array(map::task_parts(task))),
                "result.task.artifacts",
                request,
            ),
            Some(code) => {
                let id = task.get("id").and_then(Value::as_str).unwrap_or_default();
                let said = map::status_text(task);
                let state = task.pointer("/status/state").and_then(Value::as_str).unwrap_or_default();
                let text = if said.is_empty() {
                    format!("agent {}: task {id} ended {state}", self.name)
                } else {
                    format!("agent {}: task {id} ended {state}: {said}", self.name)
                };
                self.error_answer(code, &text, request)
            }
        }
    }

    /// An answer's parts as the NLIP answer, or an error saying why they cannot be read.
    fn answer_of_parts(&self, parts: Option<&Value>, path: &str, request: &Message) -> Message {
        let parts = parts.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        match map::envelope(parts, path) {
            Ok(answer) => {
                let mut answer = super::held_to_limits(answer, &self.limits, &self.name);
                echo_tokens(&mut answer, request);
                answer
            }
            Err(e) => {
                let text = format!("the answer of agent {} cannot be read: {e}", self.name);
                self.error_answer(Code::A2aInvalidAnswer.as_str(), &text, request)
            }
        }
    }

    async fn send_all(&self, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let mut delivered = Delivered::default();
        for parcel in parcels {
            if let Some(answer) = self.send(&parcel).await? {
                delivered.answers.push((parcel.message_id, answer));
            }
        }
        Ok(delivered)
    }
}

/// What a stream has said so far of the task it reports.
#[derive(Debug, Default)]
struct Progress {
    task: Option<Value>,
}

/// The end of a stream: the answer, or the task in its final state.
#[derive(Debug, PartialEq)]
enum Final {
    Message(Value),
    Task(Value),
}

impl Progress {
    /// Takes one event (a 1.0 `StreamResponse`): the end, once there is one.
    fn take(&mut self, event: &Value) -> Option<Final> {
        if let Some(message) = event.get("message") {
            return Some(Final::Message(message.clone()));
        }
        if let Some(task) = event.get("task") {
            self.task = Some(task.clone());
        } else if let Some(update) = event.get("statusUpdate") {
            self.task_of(update)["status"] = update.get("status").cloned().unwrap_or(Value::Null);
        } else if let Some(update) = event.get("artifactUpdate") {
            let artifact = update.get("artifact").cloned().unwrap_or(Value::Null);
            let append = update.get("append").and_then(Value::as_bool).unwrap_or(false);
            let task = self.task_of(update);
            if !task.get("artifacts").is_some_and(Value::is_array) {
                task["artifacts"] = json!([]);
            }
            let artifacts = task["artifacts"].as_array_mut().expect("made an array above");
            let id = artifact.get("artifactId");
            match artifacts.iter_mut().find(|a| id.is_some() && a.get("artifactId") == id) {
                Some(known) if append => {
                    let more = artifact.get("parts").and_then(Value::as_array).cloned().unwrap_or_default();
                    if let Some(parts) = known.get_mut("parts").and_then(Value::as_array_mut) {
                        parts.extend(more);
                    } else {
                        known["parts"] = Value::Array(more);
                    }
                }
                Some(known) => *known = artifact,
                None => artifacts.push(artifact),
            }
        }
        let task = self.task.as_ref()?;
        (TaskState::of(task) != TaskState::Pending).then(|| Final::Task(task.clone()))
    }

    /// The task an update is about, begun from the update when no Task came first.
    fn task_of(&mut self, update: &Value) -> &mut Value {
        self.task.get_or_insert_with(|| {
            json!({"id": update.get("taskId").cloned().unwrap_or_default(),
                   "contextId": update.get("contextId").cloned().unwrap_or_default()})
        })
    }
}

/// A JSON-RPC response's result or error; `None` when it is neither.
fn outcome_of(reply: &Value) -> Option<Result<Value, Fault>> {
    if let Some(result) = reply.get("result") {
        return Some(Ok(result.clone()));
    }
    reply.get("error").map(|_| {
        Err(Fault {
            code: reply.pointer("/error/code").and_then(Value::as_i64).unwrap_or_default(),
            message: reply.pointer("/error/message").and_then(Value::as_str).unwrap_or("").to_owned(),
        })
    })
}

/// The request's tokens on the answer: an A2A agent keeps the context, not NLIP's tokens, so
/// silpgate echoes them for it (ECMA-430 §6.2), once.
fn echo_tokens(answer: &mut Message, request: &Message) {
    for token in request.tokens() {
        if !answer.tokens().any(|t| t.subformat == token.subformat) {
            answer.push(token.clone());
        }
    }
}

impl Connector for A2aAgent {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::A2a
    }

    fn answers_in_call(&self) -> bool {
        true
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(self.send_all(parcels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jsonrpc_interface_of_a_card_is_found_1_0_first_and_a_card_without_one_is_refused() {
        let endpoint =
            |card: Value| A2aAgent::jsonrpc_endpoint(&card).map(|e| (e.url.to_string(), e.speaks_0_3));
        let both = json!({"url": "http://a/top", "protocolVersion": "0.3.0", "supportedInterfaces": [
            {"url": "http://a/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "http://a/old", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        assert_eq!(endpoint(both).unwrap(), ("http://a/rpc".into(), false));
        let listed_old = json!({"supportedInterfaces": [
            {"url": "http://a/old", "protocolBinding": "JSONRPC", "protocolVersion": "0.3.0"}]});
        assert_eq!(endpoint(listed_old).unwrap(), ("http://a/old".into(), true));
        let old = json!({"url": "http://a/", "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC"});
        assert_eq!(endpoint(old).unwrap(), ("http://a/".into(), true));
        let old_grpc = json!({"url": "http://a/", "protocolVersion": "0.3.0", "preferredTransport": "GRPC"});
        assert!(endpoint(old_grpc).unwrap_err().contains("no A2A JSON-RPC interface"));
        let bad = json!({"supportedInterfaces": [{"url": "::", "protocolBinding": "JSONRPC"}]});
        assert!(endpoint(bad).is_err());
    }

    #[test]
    fn a_stream_builds_the_task_from_its_events_until_its_state_is_final() {
        let mut progress = Progress::default();
        let submitted =
            json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_SUBMITTED"}}});
        assert_eq!(progress.take(&submitted), None);
        let working = json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_WORKING"}}});
        assert_eq!(progress.take(&working), None);
        let first = json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "one"}]}}});
        let more = json!({"artifactUpdate": {"taskId": "t", "append": true, "artifact": {"artifactId": "a", "parts": [{"text": "two"}]}}});
        let other = json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "b", "parts": [{"text": "three"}]}}});
        for event in [first, more, other] {
            assert_eq!(progress.take(&event), None);
        }
        let done = json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}});
        let Some(Final::Task(task)) = progress.take(&done) else {
            panic!("a completed task ends the stream")
        };
        let parts = map::task_parts(&task);
        let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
        assert_eq!(texts, ["one", "two", "three"]);
        assert_eq!(task["contextId"], "c");

        // Updates with no Task before them begin one; a message ends the stream at once.
        let mut progress = Progress::default();
        assert_eq!(
            progress
                .take(&json!({"statusUpdate": {"taskId": "u", "status": {"state": "TASK_STATE_WORKING"}}})),
            None
        );
        assert_eq!(progress.task.as_ref().unwrap()["id"], "u");
        let message = json!({"message": {"parts": [{"text": "hi"}]}});
        assert_eq!(progress.take(&message), Some(Final::Message(json!({"parts": [{"text": "hi"}]}))));
    }
}
