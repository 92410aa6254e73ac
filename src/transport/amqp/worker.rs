//! One inbound delivery, from bytes to acknowledgement: decode, hand to the gateway core,
//! make its state durable, publish what it produced and wait for the broker's confirms, and
//! only then acknowledge. Poison goes to the dead-letter exchange with the reason; transient
//! failures are retried with backoff, then dead-lettered once the attempts run out.
//!
//! Why this order: an acknowledged message is gone from the broker, so everything it caused
//! must already be safe elsewhere (sled flushed, downstream confirmed). A crash anywhere before
//! the ack leaves the message unacknowledged; the broker redelivers it, and the ledger makes
//! the redelivery publish again (same `message_id`s) without counting anything twice.

use super::backoff::Backoff;
use super::cluster::Cluster;
use super::properties::{self, Envelope};
use super::publish::{Publication, PublishError, Publisher};
use super::stopped;
use crate::config::AmqpConfig;
use crate::gateway::session::Partition;
use crate::gateway::store::StoreError;
use crate::gateway::{
    Destination, Disposition, Gateway, GatewayError, Inbound, Origin, Outbound, Status, Transport,
};
use crate::nlip::{self, Encoding, Message, NlipError};
use crate::telemetry;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tracing::{Instrument, debug, error, info_span, warn};

/// The span of one inbound delivery, named and attributed after the OpenTelemetry messaging
/// conventions, with silpgate's own fields left to fill in as the message goes.
pub fn delivery_span(
    queue: &str,
    envelope: &Envelope,
    delivery: &Delivery,
    broker: &Broker,
) -> tracing::Span {
    let span = telemetry::message_span!(
        "amqp process",
        otel.name = %format!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = queue,
        messaging.message.id = envelope.message_id.as_deref().unwrap_or_default(),
        messaging.message.conversation_id = envelope.correlation_id.as_deref().unwrap_or_default(),
        messaging.message.body.size = delivery.data.len(),
        messaging.rabbitmq.message.delivery_tag = delivery.delivery_tag,
        network.transport = "tcp",
        network.protocol.name = "amqp",
        network.protocol.version = "0.9.1",
        server.address = broker.host.as_str(),
        server.port = broker.port,
        silpgate.transport = "amqp",
        silpgate.source = queue
    );
    telemetry::adopt(&span, telemetry::extract(delivery.properties.headers().as_ref()));
    span
}

/// Where the broker is, for span attributes (never the URI: it carries the password).
#[derive(Debug, Clone, Default)]
pub struct Broker {
    pub host: String,
    pub port: u16,
}

impl Broker {
    pub fn from_uri(uri: &str) -> Broker {
        uri.parse::<lapin::uri::AMQPUri>()
            .map(|u| Broker { host: u.authority.host, port: u.authority.port })
            .unwrap_or_default()
    }
}

/// Conflicting updates retried at once before they count as a failed attempt.
const MAX_RACES: u32 = 8;

/// A delivery on its way to a worker, decoded by the dispatcher (which needed its conversation
/// to pick the worker).
pub struct Job {
    /// The message's span: its parent is the trace context the message came with.
    pub span: tracing::Span,
    /// When the delivery arrived, for the end-to-end latency.
    pub received: std::time::Instant,
    pub delivery: Delivery,
    pub queue: Arc<str>,
    pub envelope: Envelope,
    pub decoded: Result<Message, NlipError>,
    /// The cluster partition it was delivered from.
    pub partition: Option<Partition>,
}

/// Why an attempt at a message failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("publishing to {destination}: {error}")]
    Publish { destination: String, error: PublishError },
}

impl Failure {
    fn disposition(&self) -> Disposition {
        match self {
            Failure::Gateway(e) => e.disposition(),
            Failure::Publish { .. } => Disposition::Transient,
        }
    }

    fn is_race(&self) -> bool {
        matches!(self, Failure::Gateway(GatewayError::Store(StoreError::Conflict(_))))
    }

    fn code(&self) -> &'static str {
        match self {
            Failure::Gateway(e) => e.code(),
            Failure::Publish { error, .. } => error.code(),
        }
    }
}

/// What the workers of one connection share.
pub struct Pipeline {
    pub gateway: Gateway,
    pub amqp: Arc<AmqpConfig>,
    pub limits: nlip::Limits,
    pub publisher: Publisher,
    /// Set when silpgate is shutting down: stop retrying, leave the message to the broker.
    pub shutdown: watch::Receiver<bool>,
    /// Told when the connection is unusable, so that the supervisor reconnects.
    pub broken: Arc<Notify>,
    /// Told when the store is damaged: silpgate must stop.
    pub fatal: Arc<Notify>,
    /// Ledger marks of messages whose publishes are confirmed.
    pub marks: super::marks::Marks,
    /// Cluster mode: session changes and lock proposals go to the streams before the ack.
    pub cluster: Option<Arc<Cluster>>,
}

impl Pipeline {
    /// Decodes a delivery's body by its content type.
    pub fn decode(&self, body: &[u8], envelope: &Envelope) -> Result<Message, NlipError> {
        match &envelope.encoding {
            Ok(encoding) => nlip::decode(body, *encoding, &self.limits),
            Err(content_type) => Err(NlipError::new(
                nlip::NlipErrorKind::InvalidEncoding,
                format!("content type '{content_type}' is neither application/json nor application/cbor"),
            )),
        }
    }

    /// Takes one delivery to its end: acknowledged, dead-lettered, or left to the broker.
    pub async fn process(&self, job: Job) {
        let span = job.span.clone();
        let metrics = crate::metrics::get();
        let received = job.received;
        let partition = job.partition;
        metrics.in_flight.inc();
        self.settle(job).instrument(span).await;
        metrics.in_flight.dec();
        if let (Some(cluster), Some(partition)) = (&self.cluster, partition) {
            cluster.settled(partition);
        }
        metrics.message_seconds.with_label_values(&["amqp"]).observe(received.elapsed().as_secs_f64());
    }

    async fn settle(&self, job: Job) {
        let mut backoff = Backoff::new(
            Duration::from_millis(self.amqp.retry_initial_ms),
            Duration::from_millis(self.amqp.retry_max_ms),
        );
        let mut attempts = job.envelope.earlier_deliveries;
        let mut races = 0;
        loop {
            let failure = match self.attempt(&job).await {
                Ok(()) => return self.ack(&job).await,
                Err(failure) => failure,
            };
            // Two new conversations took the same free session id at once; the loser plans
            // again at once and finds the id taken. Not a failure of the message.
            if failure.is_race() && races < MAX_RACES {
                races += 1;
                continue;
            }
            attempts += 1;
            let message_id = job.envelope.message_id.as_deref().unwrap_or("-");
            job.span.record("error.type", failure.code());
            job.span.record("silpgate.disposition", failure.disposition().as_str());
            job.span.record("silpgate.attempts", attempts);
            crate::metrics::get()
                .failures
                .with_label_values(&["amqp", failure.disposition().as_str(), failure.code()])
                .inc();
            match failure.disposition() {
                Disposition::Duplicate => return self.ack(&job).await,
                Disposition::Poison => {
                    warn!(message_id, queue = %job.queue, code = failure.code(), error = %failure, "Message rejected to the dead-letter exchange.");
                    if self.dead_letter(&job, failure.code(), &failure.to_string()).await {
                        return;
                    }
                }
                Disposition::Transient if attempts >= self.amqp.max_attempts => {
                    let reason = format!("gave up after {attempts} attempts: {failure}");
                    warn!(message_id, queue = %job.queue, code = failure.code(), error = %reason, "Message dead-lettered.");
                    if self.dead_letter(&job, failure.code(), &reason).await {
                        return;
                    }
                }
                Disposition::Transient => {
                    warn!(message_id, queue = %job.queue, attempt = attempts, code = failure.code(), error = %failure, "Message failed; retrying.");
                }
                Disposition::Fatal => {
                    error!(message_id, code = failure.code(), error = %failure, "Stopping: the store is damaged.");
                    let _ =
                        job.delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true }).await;
                    self.fatal.notify_one();
                    return;
                }
            }
            if !self.publisher.channel().status().connected() {
                // The broker has requeued the delivery already; acking it now would fail.
                self.broken.notify_one();
                return;
            }
            let mut shutdown = self.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = stopped(&mut shutdown) => return,
            }
        }
    }

    /// One attempt: everything up to, but not including, the acknowledgement.
    async fn attempt(&self, job: &Job) -> Result<(), Failure> {
        let handle = info_span!("gateway handle");
        let outcome = handle.in_scope(|| match &job.decoded {
            Ok(message) => self.gateway.handle(Inbound {
                envelope: message.clone(),
                origin: Origin {
                    transport: Transport::Amqp,
                    source: job.envelope.source.clone().unwrap_or_else(|| job.queue.to_string()),
                    reply_to: job.envelope.reply_to.clone(),
                    correlation_id: job.envelope.correlation_id.clone(),
                    message_id: job.envelope.message_id.clone(),
                    partition: job.partition,
                },
                received_at: crate::store::time::now_millis(),
            }),
            Err(e) => self.gateway.reject_undecodable(e.clone()),
        });
        if let Ok(message) = &job.decoded {
            telemetry::record_format(&job.span, message);
        }
        telemetry::record_notes(&job.span, &outcome.notes);
        crate::metrics::get().observe_notes(&outcome.notes);
        let base_id =
            job.envelope.message_id.clone().unwrap_or_else(|| properties::content_id(&job.delivery.data));
        match outcome.status {
            Status::Duplicate => Ok(()),
            Status::Failed(error) => {
                if error.disposition() == Disposition::Poison {
                    // The sender hears why; if that fails, the dead-letter copy still says it.
                    if let Err(e) = self.publish(job, &base_id, outcome.outbound, Vec::new()).await {
                        debug!(error = %e, "Error reply not delivered.");
                    }
                }
                Err(error.into())
            }
            Status::Delivered => {
                self.gateway
                    .store()
                    .flush_async()
                    .instrument(info_span!("store flush"))
                    .await
                    .map_err(GatewayError::Store)?;
                let cluster = self.cluster.as_deref().zip(job.partition);
                let entries = match cluster {
                    Some((cluster, partition)) => {
                        let conversation = job.decoded.as_ref().ok().and_then(Message::conversation_token);
                        let message_id = job.envelope.message_id.as_deref();
                        let entries = cluster.entries(partition, conversation, message_id, &outcome.frozen);
                        Some(entries.map_err(GatewayError::Store)?)
                    }
                    None => None,
                };
                let (changes, proposals) = entries.as_ref().map_or((0, 0), |e| (e.changes, e.proposals));
                let appends = entries.map(|e| e.publications).unwrap_or_default();
                self.publish(job, &base_id, outcome.outbound, appends).await?;
                if let Some(id) = &job.envelope.message_id {
                    self.marks.published(id.clone());
                }
                if let Some((cluster, partition)) = cluster
                    && let Err(e) = cluster.appended(&self.publisher, partition, changes, proposals).await
                {
                    warn!(partition = partition.index, error = %e, "Snapshot not appended; the next change tries again.");
                }
                Ok(())
            }
        }
    }

    /// Publishes an outcome's envelopes: to agents on the agents exchange, replies to every
    /// reply address in its encoding; then `entries` (a cluster's stream entries), all under
    /// one wait for the broker's confirms.
    async fn publish<'a>(
        &'a self,
        job: &'a Job,
        base_id: &str,
        outbound: Vec<Outbound>,
        entries: Vec<Publication<'a>>,
    ) -> Result<(), Failure> {
        let config = self.gateway.config();
        let mut publications = Vec::with_capacity(outbound.len());
        for (index, out) in outbound.iter().enumerate() {
            let id = properties::outbound_id(base_id, index);
            match &out.destination {
                Destination::Agent(name) => {
                    let agent = config.agents.iter().find(|a| &a.name == name);
                    let encoding = agent
                        .and_then(|a| Encoding::from_content_type(&a.content_type))
                        .unwrap_or(Encoding::Json);
                    publications.push(Publication {
                        exchange: &self.amqp.agents_exchange,
                        routing_key: agent.map_or(name.as_str(), |a| a.routing_key()),
                        body: nlip::encode(&out.envelope, encoding),
                        properties: job.envelope.forward_properties(encoding, &id),
                    });
                }
                Destination::Reply if job.envelope.replies.is_empty() => {
                    debug!(message_id = %id, "No reply address; the reply is dropped.");
                }
                Destination::Reply => {
                    for (encoding, address) in &job.envelope.replies {
                        publications.push(Publication {
                            exchange: "",
                            routing_key: address,
                            body: nlip::encode(&out.envelope, *encoding),
                            properties: job.envelope.outbound_properties(*encoding, &id),
                        });
                    }
                }
            }
        }
        publications.extend(entries);
        let destinations: Vec<&str> = publications
            .iter()
            .map(|p| if p.exchange.is_empty() { p.routing_key } else { p.exchange })
            .collect();
        let destination = destinations.join(",");
        let span = info_span!(
            "amqp publish",
            otel.name = %format!("publish {destination}"),
            otel.kind = "producer",
            messaging.system = "rabbitmq",
            messaging.operation.type = "publish",
            messaging.destination.name = %destination,
            messaging.batch.message_count = publications.len(),
        );
        let bytes_out: usize = publications.iter().map(|p| p.body.len()).sum();
        job.span.record("silpgate.destination", destination.as_str());
        job.span.record("silpgate.bytes_out", bytes_out);
        // Every message published carries this publish's context: its receiver continues the trace.
        for p in &mut publications {
            let mut headers = p.properties.headers().clone().unwrap_or_default();
            telemetry::inject(&span, &mut headers);
            p.properties = std::mem::take(&mut p.properties).with_headers(headers);
        }
        let metrics = crate::metrics::get();
        for p in &publications {
            let destination = if p.exchange.is_empty() { "reply" } else { p.exchange };
            metrics.messages_out.with_label_values(&["amqp", destination]).inc();
        }
        metrics.bytes.with_label_values(&["amqp", "out"]).inc_by(bytes_out as u64);
        let started = std::time::Instant::now();
        let published = self.publisher.publish_all(publications).instrument(span).await;
        metrics.confirm_seconds.observe(started.elapsed().as_secs_f64());
        published.map_err(|error| {
            if matches!(error, PublishError::Channel(_)) {
                self.broken.notify_one();
            }
            Failure::Publish { destination, error }
        })
    }

    /// Publishes the message, as it came, to the dead-letter exchange with why, then
    /// acknowledges it. False when the dead-letter copy could not be made safe (retry).
    async fn dead_letter(&self, job: &Job, code: &str, reason: &str) -> bool {
        let publication = Publication {
            exchange: &self.amqp.dead_letter_exchange,
            routing_key: &job.queue,
            body: job.delivery.data.clone(),
            properties: properties::dead_letter_properties(
                &job.delivery.properties,
                code,
                reason,
                &job.queue,
            ),
        };
        match self.publisher.publish_all(vec![publication]).instrument(info_span!("amqp dead-letter")).await {
            Ok(()) => {
                self.ack(job).await;
                true
            }
            Err(e) => {
                warn!(error = %e, "Dead-lettering failed; retrying.");
                false
            }
        }
    }

    async fn ack(&self, job: &Job) {
        // Acks are individual: confirms, and so acks, complete out of order across workers.
        let acked = job
            .delivery
            .acker
            .ack(BasicAckOptions { multiple: false })
            .instrument(info_span!("amqp ack"))
            .await;
        if let Err(e) = acked {
            // The channel is gone and the broker will redeliver: the ledger handles that.
            debug!(error = %e, "Acknowledgement not sent.");
            self.broken.notify_one();
        }
    }
}
