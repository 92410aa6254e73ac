//! Agents on HTTP (ECMA-431): each parcel is POSTed to the agent's URL in its encoding, and
//! is delivered when the agent answers 2xx; the response body, when there is one, is the
//! agent's answer. A 5xx, 408 or 429, a timeout or a connection failure is transient; any
//! other 4xx is the agent refusing the message, with the code of its NLIP error body.
//!
//! TLS is always verified (the system's roots, plus `ca_file`); the bearer token comes from
//! the environment and is never logged; `traceparent` carries the trace to the agent.

use super::{Connector, Delivered, DeliveryError, Parcel, SetupError};
use crate::code::Code;
use crate::config::{HttpReach, Outbound};
use crate::nlip::{self, Encoding, Message};
use futures_util::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use std::time::Duration;
use tokio::sync::Semaphore;
use tracing::Instrument;

/// One agent reached over HTTP.
pub(crate) struct HttpAgent {
    name: String,
    url: reqwest::Url,
    encoding: Encoding,
    client: reqwest::Client,
    slots: Semaphore,
    limits: nlip::Limits,
}

impl HttpAgent {
    /// `limits` bound the agent's answers as they bound any inbound message.
    pub(crate) fn new(name: &str, reach: &HttpReach, limits: nlip::Limits) -> Result<Self, SetupError> {
        let client_error = |detail: String| SetupError::Client { agent: name.to_owned(), detail };
        let url = reqwest::Url::parse(&reach.outbound.url).map_err(|e| client_error(format!("url: {e}")))?;
        let client = client(name, &reach.outbound)?;
        Ok(HttpAgent {
            name: name.to_owned(),
            url,
            encoding: reach.content_type.nlip(),
            client,
            slots: Semaphore::new(reach.outbound.max_in_flight.max(1)),
            limits,
        })
    }

    async fn post_all(&self, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let mut delivered = Delivered::default();
        for parcel in parcels {
            if let Some(answer) = self.post(&parcel).await? {
                delivered.answers.push((parcel.message_id, answer));
            }
        }
        Ok(delivered)
    }

    /// One POST: the agent's answer, if its 2xx response has a body.
    async fn post(&self, parcel: &Parcel) -> Result<Option<Message>, DeliveryError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let span = tracing::info_span!(
            "agent deliver",
            otel.name = "POST",
            otel.kind = "client",
            http.request.method = "POST",
            url.full = %redacted(&self.url),
            server.address = self.url.host_str().unwrap_or_default(),
            server.port = self.url.port_or_known_default().unwrap_or_default(),
            http.response.status_code = tracing::field::Empty,
            silpgate.agent = %self.name,
            error.type = tracing::field::Empty,
        );
        let mut trace = HeaderMap::new();
        crate::telemetry::inject_http(&span, &mut trace);
        let request = self
            .client
            .post(self.url.clone())
            .headers(trace)
            .header(CONTENT_TYPE, self.encoding.content_type())
            .header(ACCEPT, "application/json, application/cbor")
            .body(nlip::encode(&parcel.envelope, self.encoding));
        let result = async {
            let response = request.send().await.map_err(|e| self.unreachable(e))?;
            let status = response.status();
            tracing::Span::current().record("http.response.status_code", status.as_u16());
            let content_type = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json")
                .to_owned();
            if let Some(location) = redirect_of(&response) {
                return Err(redirected(&self.name, status, &location));
            }
            let body = read_bounded(response, self.limits.max_bytes, &self.name).await?;
            self.judge(status, &content_type, &body)
        }
        .instrument(span.clone())
        .await;
        if let Err(e) = &result {
            span.record("error.type", e.code());
        }
        result
    }

    /// POSTs one message outside any conversation (`silpgate agents check`): the agent's
    /// answer, if it gave one.
    pub(crate) async fn probe(&self, message: Message) -> Result<Option<Message>, DeliveryError> {
        let parcel = Parcel {
            envelope: message,
            message_id: "probe".into(),
            answer_to: super::AnswerTo::Caller,
            user_id: None,
            progress: None,
        };
        self.post(&parcel).await
    }

    fn unreachable(&self, error: reqwest::Error) -> DeliveryError {
        unreachable(&self.name, error)
    }

    /// What an HTTP answer means for the delivery.
    fn judge(
        &self,
        status: StatusCode,
        content_type: &str,
        body: &[u8],
    ) -> Result<Option<Message>, DeliveryError> {
        let answer = || -> Option<Result<Message, String>> {
            if body.is_empty() {
                return None;
            }
            let encoding = Encoding::from_content_type(content_type).unwrap_or(Encoding::Json);
            Some(nlip::decode(body, encoding, &self.limits).map_err(|e| e.to_string()))
        };
        if status.is_success() {
            return Ok(answer().map(|a| {
                a.unwrap_or_else(|why| {
                    let detail = format!("the answer of agent {} cannot be read: {why}", self.name);
                    nlip::reply::error_message(
                        Code::InvalidEnvelope.as_str(),
                        &detail,
                        &nlip::reply::Location::None,
                    )
                })
            }));
        }
        let transient = status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS;
        if transient {
            return Err(DeliveryError::Unavailable {
                agent: self.name.clone(),
                code: Code::AgentUnavailable.as_str(),
                detail: format!("HTTP {status}"),
            });
        }
        let answer = answer().and_then(Result::ok).map(Box::new);
        let code =
            answer.as_deref().and_then(nlip::reply::error_code).unwrap_or_else(|| "agent_refused".to_owned());
        Err(DeliveryError::Refused {
            agent: self.name.clone(),
            code,
            detail: format!("HTTP {status}"),
            answer,
        })
    }
}

impl Connector for HttpAgent {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::Http
    }

    fn answers_in_call(&self) -> bool {
        true
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(self.post_all(parcels))
    }
}

/// The HTTP client of an agent reached over HTTP (NLIP, A2A or MCP): its bearer token from
/// `token_env`, its timeouts, TLS verified against the system's roots plus `ca_file`.
pub(crate) fn client(name: &str, agent: &Outbound) -> Result<reqwest::Client, SetupError> {
    build(name, agent, Some(Duration::from_millis(agent.timeout_ms.max(1))))
}

/// [`client`] without a bound on a whole request, for a transport that keeps a stream open
/// between calls (MCP's event stream, which the bound would cut every `timeout_ms`, each cut
/// logged): its caller bounds each call instead.
pub(crate) fn streaming_client(name: &str, agent: &Outbound) -> Result<reqwest::Client, SetupError> {
    build(name, agent, None)
}

fn build(
    name: &str,
    agent: &Outbound,
    whole_request: Option<Duration>,
) -> Result<reqwest::Client, SetupError> {
    let client_error = |detail: String| SetupError::Client { agent: name.to_owned(), detail };
    let mut headers = HeaderMap::new();
    if let Some(variable) = &agent.token_env {
        let token = std::env::var(variable)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| SetupError::TokenUnset { agent: name.to_owned(), variable: variable.clone() })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| client_error(format!("{variable} holds characters a header cannot carry")))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    let connect = Duration::from_millis(agent.timeout_ms.clamp(1, 5_000));
    let mut builder = outbound(connect, agent.ca_file.as_deref().map(|file| ("ca_file", file)))
        .map_err(client_error)?
        .default_headers(headers)
        .pool_max_idle_per_host(agent.max_in_flight.max(1));
    if let Some(timeout) = whole_request {
        builder = builder.timeout(timeout);
    }
    builder.build().map_err(|e| client_error(format!("HTTP client: {e}")))
}

/// The start of every HTTP client silpgate makes (agents, webhooks, key sets): TLS with ring,
/// verified against the system's roots and, when given, the PEM certificate authorities in a
/// file (with the name of the setting that names it); redirects never followed, since they
/// would take the request, and its credentials, elsewhere; connecting bounded by `connect`.
///
/// # Errors
/// The CA file cannot be read or is not PEM, said with the setting and the path.
pub(crate) fn outbound(
    connect: Duration,
    ca: Option<(&str, &std::path::Path)>,
) -> Result<reqwest::ClientBuilder, String> {
    // reqwest takes the process's rustls provider; ring is the one silpgate builds with.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).connect_timeout(connect);
    let Some((setting, ca_file)) = ca else { return Ok(builder) };
    let pem =
        std::fs::read(ca_file).map_err(|e| format!("cannot read {setting} {}: {e}", ca_file.display()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{setting} {} is not PEM: {e}", ca_file.display()))?;
    Ok(builder.tls_certs_merge(roots))
}

/// The `Location` of a redirect answer (3xx), which silpgate never follows.
pub(crate) fn redirect_of(response: &reqwest::Response) -> Option<String> {
    response.status().is_redirection().then(|| {
        let location = response.headers().get(reqwest::header::LOCATION);
        location.and_then(|v| v.to_str().ok()).unwrap_or("(none)").to_owned()
    })
}

/// An agent that answered with a redirect: it refused the message, naming where it pointed.
pub(crate) fn redirected(agent: &str, status: StatusCode, location: &str) -> DeliveryError {
    DeliveryError::Refused {
        agent: agent.to_owned(),
        code: Code::AgentRedirected.as_str().into(),
        detail: format!(
            "HTTP {status} to {location}: silpgate follows no redirects (set the agent's url to where it points)"
        ),
        answer: None,
    }
}

/// Reads an answer's body, at most `limit` bytes: a larger answer (by its `Content-Length`,
/// or by what arrives) is not read further, and is the agent refusing the message with
/// `answer_too_large`, so that the asker hears it.
pub(crate) async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
    agent: &str,
) -> Result<Vec<u8>, DeliveryError> {
    let too_large = || DeliveryError::Refused {
        agent: agent.to_owned(),
        code: Code::AnswerTooLarge.as_str().into(),
        detail: format!("its answer is larger than {limit} bytes; the rest was not read"),
        answer: None,
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| unreachable(agent, e))? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest failure as a transient delivery failure of `agent`. reqwest's text names the
/// URL, which may carry credentials: it is left out. Its causes (connect, TLS, I/O) name none,
/// and say what went wrong.
pub(crate) fn unreachable(agent: &str, error: reqwest::Error) -> DeliveryError {
    let code = if error.is_timeout() { "timeout" } else { "agent_unavailable" };
    DeliveryError::Unavailable { agent: agent.to_owned(), code, detail: described(error) }
}

/// A reqwest failure told with its causes (connect, TLS, I/O), which say what went wrong,
/// and without its URL, which may carry credentials.
pub(crate) fn described(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut detail = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(c) = cause {
        detail.push_str(": ");
        detail.push_str(&c.to_string());
        cause = c.source();
    }
    detail
}

/// The URL without user name or password, for spans and logs.
pub(crate) fn redacted(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}
