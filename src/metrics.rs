//! The metrics silpgate exports: one registry, filled from every transport, served as
//! Prometheus text at `GET /metrics` and, when configured, pushed over OTLP (each family
//! becomes an observable OpenTelemetry instrument read from the registry at export time).
//! Names follow Prometheus conventions (`_total` counters, `_seconds` histograms);
//! deploy/grafana/silpgate.json charts them.

use crate::gateway::Note;
use crate::silp::Notice;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::sync::OnceLock;

/// Every metric, registered once.
pub struct Metrics {
    registry: Registry,
    names: Vec<String>,
    /// Messages received, by transport and source (queue or listener).
    pub messages_in: IntCounterVec,
    /// Messages published or answered, by transport and destination.
    pub messages_out: IntCounterVec,
    /// Messages not delivered, by transport, disposition and error code.
    pub failures: IntCounterVec,
    /// Receipt to acknowledgement (or reply), by transport.
    pub message_seconds: HistogramVec,
    /// Publish to broker confirm.
    pub confirm_seconds: Histogram,
    /// Messages being handled now.
    pub in_flight: IntGauge,
    /// Envelopes delivered to agents (or not), by agent, transport and result (`delivered`,
    /// `transient`, `poison`).
    pub agent_deliveries: IntCounterVec,
    /// Time from delivering a request to its agent's answer, by agent.
    pub reply_wait_seconds: HistogramVec,
    /// Agents' answers nobody waited for any more, by reason (`timeout`, `requester_gone`).
    pub replies_orphaned: IntCounterVec,
    /// HTTP and WebSocket connections open now.
    pub connections_open: IntGauge,
    /// Connections turned away at the connection cap.
    pub connections_refused: IntCounter,
    /// Live conversation sessions.
    pub sessions: IntGauge,
    /// compile.lock records.
    pub lock_records: IntGauge,
    /// Compiles whose text differed from the frozen one (the frozen text was sent).
    pub lock_drift: IntCounter,
    /// Sanitiser changes, by kind: `invisible_stripped`, `homoglyph_mapped`. A security signal.
    pub sanitizer: IntCounterVec,
    /// Bytes received and sent, by transport and direction.
    pub bytes: IntCounterVec,
    /// Payload bytes written, by frontend.
    pub surface_bytes: IntCounterVec,
    /// Bytes the same payloads take in the natural-language baseline, by frontend: what a
    /// frontend saves is this minus `surface_bytes`.
    pub natural_bytes: IntCounterVec,
    /// Payload tokens written, in the receiving agent's tokenizer, by agent, frontend and
    /// tokenizer (agents with a known tokenizer only).
    pub surface_tokens: IntCounterVec,
    /// Tokens the same payloads take in the natural-language baseline: what a frontend saves
    /// an agent, in what it pays for, is this minus `surface_tokens`.
    pub natural_tokens: IntCounterVec,
    /// Tokens the sanitiser's changes removed from payloads, by the receiver's tokenizer
    /// (draft §8.1: invisible characters and look-alikes change tokenization).
    pub sanitizer_tokens: IntCounterVec,
    /// 1 while the broker is connected and consumed from.
    pub broker_connected: IntGauge,
    /// 1 for the broker node connected to (`host:port`).
    pub broker_node: IntGaugeVec,
    /// 1 while silpgate holds because the broker cannot commit quorum-queue writes.
    pub broker_holding: IntGauge,
    /// Broker connections lost.
    pub broker_reconnects: IntCounter,
    /// Configuration reloads, by result (`applied`, `refused`).
    pub config_reloads: IntCounterVec,
    /// 1, labelled with the SHA-256 of the configuration file in use: drift across a cluster
    /// shows as more than one digest.
    pub config_info: IntGaugeVec,
    /// When the configuration in use was loaded (seconds since the epoch).
    pub config_loaded: IntGauge,
    /// Cluster: partitions this instance serves now.
    pub partitions_owned: IntGauge,
    /// Cluster: partitions this instance consumes as a standby behind their owner.
    pub partitions_standby: IntGauge,
    /// Cluster: live members this instance hears (itself included).
    pub cluster_members: IntGauge,
    /// Cluster: partitions taken over (replayed, then served), by partition.
    pub partition_takeovers: IntCounterVec,
    /// Cluster: front-door messages forwarded to their partition's owner, by transport and
    /// result (`forwarded`, `failed`).
    pub front_door_forwards: IntCounterVec,
    /// Cluster: changelog replay before serving a partition taken over.
    pub replay_seconds: Histogram,
    /// Cluster: changelog entries applied by replays.
    pub replayed_entries: IntCounter,
    /// Cluster: lock proposals this instance had confirmed that its chain has not applied yet
    /// (the lock stream follower's lag, in records).
    pub lock_follow_lag: IntGauge,
}

/// The process's metrics.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let mut names = Vec::new();
        let mut register = |c: Box<dyn prometheus::core::Collector>| {
            names.extend(c.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(c).expect("metric names are unique");
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let buckets = vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
        let m = Metrics {
            messages_in: counter_vec(
                "silpgate_messages_in_total",
                "Messages received",
                &["transport", "source"],
            ),
            messages_out: counter_vec(
                "silpgate_messages_out_total",
                "Messages published or answered",
                &["transport", "destination"],
            ),
            failures: counter_vec(
                "silpgate_message_failures_total",
                "Messages not delivered, by disposition and error code",
                &["transport", "disposition", "code"],
            ),
            message_seconds: HistogramVec::new(
                HistogramOpts::new("silpgate_message_seconds", "Receipt to acknowledgement or reply")
                    .buckets(buckets.clone()),
                &["transport"],
            )
            .expect("valid metric"),
            confirm_seconds: Histogram::with_opts(
                HistogramOpts::new("silpgate_publish_confirm_seconds", "Publish to broker confirm")
                    .buckets(buckets),
            )
            .expect("valid metric"),
            in_flight: IntGauge::new("silpgate_in_flight", "Messages being handled").expect("valid metric"),
            agent_deliveries: IntCounterVec::new(
                Opts::new("silpgate_agent_deliveries_total", "Envelopes delivered to agents, by result"),
                &["agent", "transport", "result"],
            )
            .expect("valid metric"),
            reply_wait_seconds: HistogramVec::new(
                HistogramOpts::new("silpgate_reply_wait_seconds", "Delivery to an agent's answer")
                    .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["agent"],
            )
            .expect("valid metric"),
            replies_orphaned: IntCounterVec::new(
                Opts::new("silpgate_replies_orphaned_total", "Agents' answers nobody waited for, by reason"),
                &["reason"],
            )
            .expect("valid metric"),
            connections_open: IntGauge::new(
                "silpgate_connections_open",
                "HTTP and WebSocket connections open",
            )
            .expect("valid metric"),
            connections_refused: IntCounter::new(
                "silpgate_connections_refused_total",
                "Connections turned away at the connection cap",
            )
            .expect("valid metric"),
            sessions: IntGauge::new("silpgate_sessions_active", "Live conversation sessions")
                .expect("valid metric"),
            lock_records: IntGauge::new("silpgate_lock_records", "compile.lock records")
                .expect("valid metric"),
            lock_drift: IntCounter::new(
                "silpgate_lock_drift_total",
                "Compiles that differed from the frozen text",
            )
            .expect("valid metric"),
            sanitizer: counter_vec("silpgate_sanitizer_hits_total", "Sanitiser changes, by kind", &["kind"]),
            bytes: counter_vec(
                "silpgate_bytes_total",
                "Bytes received and sent",
                &["transport", "direction"],
            ),
            surface_bytes: counter_vec(
                "silpgate_payload_bytes_total",
                "Payload bytes written",
                &["frontend"],
            ),
            natural_bytes: counter_vec(
                "silpgate_payload_natural_bytes_total",
                "The same payloads' bytes in natural language",
                &["frontend"],
            ),
            surface_tokens: counter_vec(
                "silpgate_payload_tokens_total",
                "Payload tokens written, in the receiving agent's tokenizer",
                &["agent", "frontend", "tokenizer"],
            ),
            natural_tokens: counter_vec(
                "silpgate_payload_natural_tokens_total",
                "The same payloads' tokens in natural language",
                &["agent", "frontend", "tokenizer"],
            ),
            sanitizer_tokens: counter_vec(
                "silpgate_sanitizer_tokens_removed_total",
                "Tokens the sanitiser's changes removed, in the receiving agent's tokenizer",
                &["tokenizer"],
            ),
            broker_connected: IntGauge::new("silpgate_broker_connected", "1 while the broker is connected")
                .expect("valid metric"),
            broker_node: IntGaugeVec::new(
                Opts::new("silpgate_broker_node", "1 for the broker node this instance is connected to"),
                &["node"],
            )
            .expect("valid metric"),
            broker_holding: IntGauge::new(
                "silpgate_broker_holding",
                "1 while the broker's quorum queues cannot commit writes and silpgate holds",
            )
            .expect("valid metric"),
            broker_reconnects: IntCounter::new(
                "silpgate_broker_connection_losses_total",
                "Broker connections lost",
            )
            .expect("valid metric"),
            config_reloads: IntCounterVec::new(
                Opts::new("silpgate_config_reloads_total", "Configuration reloads, by result"),
                &["result"],
            )
            .expect("valid metric"),
            config_info: IntGaugeVec::new(
                Opts::new(
                    "silpgate_config_info",
                    "1, labelled with the SHA-256 of the configuration file in use",
                ),
                &["digest"],
            )
            .expect("valid metric"),
            config_loaded: IntGauge::new(
                "silpgate_config_loaded_timestamp_seconds",
                "When the configuration in use was loaded",
            )
            .expect("valid metric"),
            partitions_owned: IntGauge::new("silpgate_partitions_owned", "Cluster partitions served here")
                .expect("valid metric"),
            partitions_standby: IntGauge::new(
                "silpgate_partitions_standby",
                "Cluster partitions consumed here as a standby behind their owner",
            )
            .expect("valid metric"),
            cluster_members: IntGauge::new(
                "silpgate_cluster_members",
                "Cluster members heard, this one included",
            )
            .expect("valid metric"),
            partition_takeovers: counter_vec(
                "silpgate_partition_takeovers_total",
                "Cluster partitions taken over, by partition",
                &["partition"],
            ),
            front_door_forwards: counter_vec(
                "silpgate_front_door_forwards_total",
                "Cluster front-door messages forwarded to their partition's owner, by transport and result",
                &["transport", "result"],
            ),
            replay_seconds: Histogram::with_opts(
                HistogramOpts::new("silpgate_changelog_replay_seconds", "Changelog replay before serving")
                    .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            )
            .expect("valid metric"),
            replayed_entries: IntCounter::new(
                "silpgate_changelog_replayed_entries_total",
                "Changelog entries applied by replays",
            )
            .expect("valid metric"),
            lock_follow_lag: IntGauge::new(
                "silpgate_lock_follow_lag",
                "Lock proposals confirmed here and not yet applied to the chain",
            )
            .expect("valid metric"),
            registry: Registry::new(),
            names: Vec::new(),
        };
        register(Box::new(m.messages_in.clone()));
        register(Box::new(m.messages_out.clone()));
        register(Box::new(m.failures.clone()));
        register(Box::new(m.message_seconds.clone()));
        register(Box::new(m.confirm_seconds.clone()));
        register(Box::new(m.in_flight.clone()));
        register(Box::new(m.agent_deliveries.clone()));
        register(Box::new(m.reply_wait_seconds.clone()));
        register(Box::new(m.replies_orphaned.clone()));
        register(Box::new(m.connections_open.clone()));
        register(Box::new(m.connections_refused.clone()));
        register(Box::new(m.sessions.clone()));
        register(Box::new(m.lock_records.clone()));
        register(Box::new(m.lock_drift.clone()));
        register(Box::new(m.sanitizer.clone()));
        register(Box::new(m.bytes.clone()));
        register(Box::new(m.surface_bytes.clone()));
        register(Box::new(m.natural_bytes.clone()));
        register(Box::new(m.surface_tokens.clone()));
        register(Box::new(m.natural_tokens.clone()));
        register(Box::new(m.sanitizer_tokens.clone()));
        register(Box::new(m.broker_connected.clone()));
        register(Box::new(m.broker_node.clone()));
        register(Box::new(m.broker_holding.clone()));
        register(Box::new(m.broker_reconnects.clone()));
        register(Box::new(m.config_reloads.clone()));
        register(Box::new(m.config_info.clone()));
        register(Box::new(m.config_loaded.clone()));
        register(Box::new(m.partitions_owned.clone()));
        register(Box::new(m.partitions_standby.clone()));
        register(Box::new(m.cluster_members.clone()));
        register(Box::new(m.partition_takeovers.clone()));
        register(Box::new(m.front_door_forwards.clone()));
        register(Box::new(m.replay_seconds.clone()));
        register(Box::new(m.replayed_entries.clone()));
        register(Box::new(m.lock_follow_lag.clone()));
        Metrics { registry, names, ..m }
    }

    /// Names of every metric family, whether or not it has samples yet.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        TextEncoder::new().encode_to_string(&self.registry.gather()).unwrap_or_default()
    }

    /// Counts what the core noticed: sanitiser changes and compile.lock drift.
    pub fn observe_notes(&self, notes: &[Note]) {
        for note in notes {
            match note {
                Note::Sanitized { notice: Notice::InvisibleStripped { .. }, .. } => {
                    self.sanitizer.with_label_values(&["invisible_stripped"]).inc();
                }
                Note::Sanitized { notice: Notice::HomoglyphMapped { .. }, .. } => {
                    self.sanitizer.with_label_values(&["homoglyph_mapped"]).inc();
                }
                Note::LockDrift { .. } => self.lock_drift.inc(),
                Note::Size { frontend, surface, natural } => {
                    self.surface_bytes.with_label_values(&[frontend.name()]).inc_by(*surface as u64);
                    self.natural_bytes.with_label_values(&[frontend.name()]).inc_by(*natural as u64);
                }
                Note::Tokens { agent, frontend, tokenizer, surface, natural } => {
                    let labels = [agent.as_str(), frontend.name(), tokenizer.name()];
                    self.surface_tokens.with_label_values(&labels).inc_by(*surface as u64);
                    self.natural_tokens.with_label_values(&labels).inc_by(*natural as u64);
                }
                Note::SanitizedTokens { tokenizer, before, after, .. } => {
                    // A change that added tokens (rare: a mapping to a longer spelling) counts 0.
                    let removed = before.saturating_sub(*after) as u64;
                    self.sanitizer_tokens.with_label_values(&[tokenizer.name()]).inc_by(removed);
                }
                _ => {}
            }
        }
    }
}

impl Metrics {
    /// Registers an observable OpenTelemetry instrument for every family on `meter`: counters
    /// as counters, gauges as gauges, histograms as their `_count` and `_sum` counters.
    pub(crate) fn observe_with(&'static self, meter: &opentelemetry::metrics::Meter) {
        // Families are told apart by their names (`_total` counters, `_seconds` histograms,
        // gauges otherwise): a family without samples yet is not in `gather()`.
        for name in &self.names {
            let family = name.clone();
            if name.ends_with("_total") {
                meter
                    .f64_observable_counter(name.clone())
                    .with_callback(move |o| {
                        self.each(&family, |m, at| o.observe(m.get_counter().get_value(), at))
                    })
                    .build();
            } else if name.ends_with("_seconds") {
                meter
                    .u64_observable_counter(format!("{name}_count"))
                    .with_callback(move |o| {
                        self.each(&family, |m, at| o.observe(m.get_histogram().get_sample_count(), at))
                    })
                    .build();
                let family = name.clone();
                meter
                    .f64_observable_counter(format!("{name}_sum"))
                    .with_callback(move |o| {
                        self.each(&family, |m, at| o.observe(m.get_histogram().get_sample_sum(), at))
                    })
                    .build();
            } else {
                meter
                    .f64_observable_gauge(name.clone())
                    .with_callback(move |o| {
                        self.each(&family, |m, at| o.observe(m.get_gauge().get_value(), at))
                    })
                    .build();
            }
        }
    }

    /// Calls `f` with every sample of family `name` and its labels as attributes.
    fn each(&self, name: &str, mut f: impl FnMut(&prometheus::proto::Metric, &[opentelemetry::KeyValue])) {
        for family in self.registry.gather().iter().filter(|m| m.name() == name) {
            for metric in family.get_metric() {
                let labels: Vec<opentelemetry::KeyValue> = metric
                    .get_label()
                    .iter()
                    .map(|l| opentelemetry::KeyValue::new(l.name().to_owned(), l.value().to_owned()))
                    .collect();
                f(metric, &labels);
            }
        }
    }
}
