//! Logs and traces. One tracing subscriber carries both: structured logs on stderr (pretty or
//! JSON) and, when an OTLP endpoint is configured, OpenTelemetry spans exported over OTLP/HTTP.
//! W3C trace context (`traceparent`, `tracestate`) travels in AMQP headers: extracted from what
//! comes in, injected into everything published, so that a trace follows a message across
//! agents.

use crate::config::{LogFormat, TelemetryConfig};
use crate::gateway::Note;
use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{self, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The log filter of the running process, which a reload may change ([`set_log_filter`]).
/// Unset when `SILPGATE_LOG` gave the filter: the environment's word stands until a restart.
static LOG_FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

/// The share of root spans exported (`telemetry.sample_ratio`), as `f64` bits: a reload may
/// change it ([`set_sample_ratio`]), and every span's sampler reads it.
static SAMPLE_RATIO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1.0f64.to_bits());

/// Exports `ratio` of the traces that start here from the next span on (a reload). Traces
/// that come in with a sampling decision keep it.
pub(crate) fn set_sample_ratio(ratio: f64) {
    SAMPLE_RATIO.store(ratio.to_bits(), std::sync::atomic::Ordering::Relaxed);
}

/// Samples by trace id at the ratio [`SAMPLE_RATIO`] holds now.
#[derive(Debug, Clone)]
struct RatioNow;

impl opentelemetry_sdk::trace::ShouldSample for RatioNow {
    fn should_sample(
        &self,
        parent: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        kind: &opentelemetry::trace::SpanKind,
        attributes: &[opentelemetry::KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        let ratio = f64::from_bits(SAMPLE_RATIO.load(std::sync::atomic::Ordering::Relaxed));
        Sampler::TraceIdRatioBased(ratio).should_sample(parent, trace_id, name, kind, attributes, links)
    }
}

/// Checks `directives` as a log filter (`telemetry.log_filter`).
///
/// # Errors
/// Why it is not one.
pub(crate) fn log_filter(directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(directives).map_err(|e| format!("telemetry.log_filter: {e}"))
}

/// Makes `filter` the log filter from the next event on; false when `SILPGATE_LOG` set the
/// filter (or no subscriber of silpgate's is installed) and nothing changed.
pub(crate) fn set_log_filter(filter: EnvFilter) -> bool {
    LOG_FILTER.get().is_some_and(|handle| handle.reload(filter).is_ok())
}

/// The exporters, kept to flush what is buffered at shutdown.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
    meters: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

/// Installs the subscriber. `SILPGATE_LOG` replaces the configured log filter.
///
/// # Errors
/// An OTLP endpoint the exporter cannot use.
pub(crate) fn init(config: &TelemetryConfig) -> Result<Telemetry, String> {
    let provider = match &config.otlp_endpoint {
        Some(endpoint) => {
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| format!("telemetry.otlp_endpoint {endpoint}: {e}"))?;
            let resource =
                opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
            set_sample_ratio(config.sample_ratio);
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_sampler(Sampler::ParentBased(Box::new(RatioNow)))
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    let _ = subscriber(config, provider.as_ref())?.try_init();
    let meters = match &config.otlp_metrics_endpoint {
        Some(endpoint) => {
            use opentelemetry::metrics::MeterProvider as _;
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| format!("telemetry.otlp_metrics_endpoint {endpoint}: {e}"))?;
            let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
                .with_interval(std::time::Duration::from_secs(config.metrics_interval_secs.max(1)))
                .build();
            let resource =
                opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
            let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
                .with_reader(reader)
                .with_resource(resource)
                .build();
            crate::metrics::get().observe_with(&meters.meter("silpgate"));
            Some(meters)
        }
        None => None,
    };
    Ok(Telemetry { provider, meters })
}

/// The subscriber: logs on stderr and, with a tracer provider, spans exported through it.
fn subscriber(
    config: &TelemetryConfig,
    provider: Option<&SdkTracerProvider>,
) -> Result<Box<dyn tracing::Subscriber + Send + Sync>, String> {
    let from_env = EnvFilter::try_from_env("SILPGATE_LOG").ok();
    let from_env_set = from_env.is_some();
    let filter = match from_env {
        Some(filter) => filter,
        None => log_filter(&config.log_filter)?,
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    if !from_env_set {
        let _ = LOG_FILTER.set(handle);
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The log layer takes events only. Every message opens a span and records half a dozen
    // fields on it; a log layer that took spans would format those fields into text for each
    // message (the HTTP echo profile showed the registry and field formatting as the largest
    // user-space cost per request), though logs print a span only as the context of an event,
    // and every event silpgate logs names its own fields. With no OTLP export no layer takes
    // spans, so they are never created: the span macros skip even their field expressions.
    let filter = filter.and(filter::filter_fn(|meta| meta.is_event()));
    let logs = match config.log_format {
        LogFormat::Pretty => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(logs);
    // Without export the subscriber has no trace layer at all: an absent layer written as
    // `Option::None` tells tracing it wants every span, and every span would be built, recorded
    // and dropped for no one (a tenth of an HTTP request's user-space time).
    Ok(match provider {
        // Only silpgate's own spans are exported; lapin's connection loop would drown them.
        Some(provider) => Box::new(registry.with(
            tracing_opentelemetry::layer().with_tracer(provider.tracer("silpgate")).with_filter(
                tracing_subscriber::filter::Targets::new().with_target("silpgate", tracing::Level::INFO),
            ),
        )),
        None => Box::new(registry),
    })
}

impl Telemetry {
    /// Exports what is buffered and stops the exporter. Blocks: call it off the runtime.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
        if let Some(meters) = self.meters {
            let _ = meters.force_flush();
            let _ = meters.shutdown();
        }
    }
}

/// The trace context an inbound message carries in its headers; empty when it carries none,
/// and then the message starts a new trace.
pub(crate) fn extract(headers: Option<&FieldTable>) -> opentelemetry::Context {
    match headers {
        Some(headers) => TraceContextPropagator::new().extract(&HeaderExtractor(headers)),
        None => opentelemetry::Context::new(),
    }
}

/// Puts `span`'s trace context into outbound headers.
pub(crate) fn inject(span: &tracing::Span, headers: &mut FieldTable) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

/// Puts `span`'s trace context into the headers of an outbound HTTP request.
pub(crate) fn inject_http(span: &tracing::Span, headers: &mut axum::http::HeaderMap) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut HttpInjector(headers));
}

struct HttpInjector<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HttpInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (axum::http::HeaderName::from_bytes(key.as_bytes()), axum::http::HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

/// Gives `span` the inbound context as its parent.
pub(crate) fn adopt(span: &tracing::Span, parent: opentelemetry::Context) {
    let _ = span.set_parent(parent);
}

/// The trace context of an HTTP request (or WebSocket upgrade request).
pub(crate) fn extract_http(headers: &axum::http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HttpExtractor(headers))
}

struct HttpExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HttpExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderExtractor<'a>(&'a FieldTable);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut FieldTable);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.into(), AMQPValue::LongString(LongString::from(value.into_bytes())));
    }
}

/// A message's span: `$name`, the transport's own fields, and the fields silpgate fills in as
/// the message goes ([`record_notes`], the transports). They are declared here, once, because a
/// tracing span only takes the fields it was created with.
macro_rules! message_span {
    ($name:literal, $($field:tt)+) => {
        ::tracing::info_span!(
            $name,
            $($field)+,
            nlip.format = ::tracing::field::Empty,
            nlip.subformat = ::tracing::field::Empty,
            silp.intent = ::tracing::field::Empty,
            silp.req_id = ::tracing::field::Empty,
            silpgate.route = ::tracing::field::Empty,
            silpgate.session_id = ::tracing::field::Empty,
            silpgate.turn = ::tracing::field::Empty,
            silpgate.frontend = ::tracing::field::Empty,
            silpgate.frontend_reason = ::tracing::field::Empty,
            silpgate.sanitized = ::tracing::field::Empty,
            silpgate.destination = ::tracing::field::Empty,
            silpgate.bytes_out = ::tracing::field::Empty,
            silpgate.attempts = ::tracing::field::Empty,
            silpgate.disposition = ::tracing::field::Empty,
            error.type = ::tracing::field::Empty,
        )
    };
}
pub(crate) use message_span;

/// Records an envelope's format on its span (made by [`message_span!`]).
pub(crate) fn record_format(span: &tracing::Span, message: &crate::nlip::Message) {
    span.record("nlip.format", message.format.as_str());
    span.record("nlip.subformat", message.subformat.as_str());
}

/// Records on a message's span (made by [`message_span!`]) what the core decided: route,
/// payload, session, frontend.
pub(crate) fn record_notes(span: &tracing::Span, notes: &[Note]) {
    for note in notes {
        match note {
            Note::Route(route) => {
                span.record("silpgate.route", route.as_str());
            }
            Note::Payload { intent, req_id, .. } => {
                span.record("silp.intent", intent.as_str());
                span.record("silp.req_id", req_id.as_str());
            }
            Note::Session { id, turn, .. } => {
                span.record("silpgate.session_id", id.as_str());
                span.record("silpgate.turn", *turn);
            }
            Note::Frontend { frontend, reason, .. } => {
                span.record("silpgate.frontend", frontend.name());
                span.record("silpgate.frontend_reason", reason.as_str());
            }
            Note::Sanitized { .. } => {
                span.record("silpgate.sanitized", true);
            }
            Note::LockDrift { .. }
            | Note::LockFrozen { .. }
            | Note::ProfileLearnt { .. }
            | Note::Size { .. }
            | Note::Tokens { .. }
            | Note::SanitizedTokens { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_export_a_message_span_is_never_built() {
        let subscriber = subscriber(&TelemetryConfig::default(), None).expect("the default filter parses");
        tracing::subscriber::with_default(subscriber, || {
            let span = message_span!("amqp process", silpgate.transport = "amqp");
            assert!(span.is_disabled(), "a span was built though no layer takes spans");
        });
    }

    #[test]
    fn with_export_a_message_span_is_built() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            subscriber(&TelemetryConfig::default(), Some(&provider)).expect("the default filter parses");
        tracing::subscriber::with_default(subscriber, || {
            let span = message_span!("amqp process", silpgate.transport = "amqp");
            assert!(!span.is_disabled(), "the exporter's layer was given no span");
        });
    }

    /// The sampler reads the ratio a reload sets, from the next span on.
    #[test]
    fn the_sampling_ratio_is_read_at_every_span() {
        use opentelemetry::trace::{SpanKind, TraceId};
        use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample};
        let decide = |id: u128| {
            RatioNow.should_sample(None, TraceId::from(id), "span", &SpanKind::Server, &[], &[]).decision
        };
        let ids = [1u128, 7, u128::MAX / 3, u128::MAX];
        set_sample_ratio(0.0);
        assert!(ids.iter().all(|&id| decide(id) == SamplingDecision::Drop));
        set_sample_ratio(1.0);
        assert!(ids.iter().all(|&id| decide(id) == SamplingDecision::RecordAndSample));
    }
}
