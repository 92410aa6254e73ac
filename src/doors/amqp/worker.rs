//! Inbound deliveries, from bytes to acknowledgement, a window at a time: hand each to the
//! gateway core, make the window's state durable with one flush, publish what each produced
//! and wait for the broker's confirms, and only then acknowledge. Poison goes to the
//! dead-letter exchange with the reason; transient failures are retried with backoff, then
//! dead-lettered once the attempts run out.
//!
//! Why this order: an acknowledged message is gone from the broker, so everything it caused
//! must already be safe elsewhere (sled flushed, downstream confirmed). A crash anywhere before
//! the ack leaves the message unacknowledged; the broker redelivers it, and the ledger makes
//! the redelivery publish again (same `message_id`s) without counting anything twice.

use super::acks::AckBook;
use crate::broker::addresses::Node;
use crate::broker::ending::Endings;
use crate::broker::health::BrokerHealth;
use crate::broker::link::BrokerLink;
use crate::broker::properties::{self, Envelope};
use crate::broker::publish::{Publication, PublishError, Publisher};
use crate::cluster::Cluster;
use crate::config::AmqpConfig;
use crate::gateway::session::Partition;
use crate::gateway::{Disposition, GatewayError, Origin, Transport};
use crate::intake::{self, Arrival, Intake, NotTaken, Planned, ReturnPath, Returned};
use crate::nlip::{self, Encoding, Message, NlipError};
use crate::telemetry;
use crate::util::backoff::Backoff;
use crate::util::shutdown::Shutdown;
use futures_util::future::BoxFuture;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing::{Instrument, debug, error, info_span, warn};

/// The span of one inbound delivery, named and attributed after the OpenTelemetry messaging
/// conventions, with silpgate's own fields left to fill in as the message goes.
pub(crate) fn delivery_span(
    queue: &str,
    envelope: &Envelope,
    delivery: &Delivery,
    broker: &Node,
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
        silpgate.source = queue,
        enduser.id = ::tracing::field::Empty
    );
    telemetry::adopt(&span, telemetry::extract(delivery.properties.headers().as_ref()));
    span
}

/// The source a delivery's routes match on: the queue it was delivered from, or, for a
/// delivery from a partition queue, the inbound queue silpgate's ingress took it from
/// (`x-silpgate-source`, which ingress always overwrites). The header is believed only there,
/// and only when it names a configured inbound queue: a producer publishing to the partition
/// exchange itself can claim no more than it could by publishing to that inbound queue.
///
/// A front-door message another instance forwarded ([`crate::intake::forward`]) names its door
/// there instead, and is believed when the broker vouches that silpgate's own broker user
/// published it.
fn route_source(job: &Job, inbound: &[String], own_user: &str) -> String {
    let front_door = job.envelope.forwarded_by_silpgate(own_user);
    believed_source(job.partition.is_some(), job.envelope.source.as_deref(), inbound, &job.queue, front_door)
}

fn believed_source(
    from_partition: bool,
    header: Option<&str>,
    inbound: &[String],
    queue: &str,
    front_door: bool,
) -> String {
    match header {
        Some(source) if from_partition && (front_door || inbound.iter().any(|q| q == source)) => {
            source.to_owned()
        }
        _ => queue.to_owned(),
    }
}

/// Said once per process: a producer sends as silpgate's own broker user, whose messages
/// silpgate believes as another instance's word (forwarded principals, partition senders).
fn shared_user_warning(user: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        warn!(user, "A producer publishes as silpgate's own broker user: it can pose as a silpgate instance; give producers broker users of their own (docs/security.md).");
    });
}

/// The id a message's outbound envelopes are numbered from: its own, else its content's.
fn base_id(job: &Job) -> String {
    job.envelope.message_id.clone().unwrap_or_else(|| properties::content_id(&job.delivery.data))
}

/// A window's messages by conversation, each conversation's in the order they came; the
/// conversations in the order their first message came.
fn chains_of(jobs: &[Job]) -> Vec<Vec<usize>> {
    let mut chains: Vec<(u64, Vec<usize>)> = Vec::new();
    for (index, job) in jobs.iter().enumerate() {
        let key = conversation_key(&job.decoded, &job.envelope, job.delivery.delivery_tag);
        match chains.iter_mut().find(|(k, _)| *k == key) {
            Some((_, chain)) => chain.push(index),
            None => chains.push((key, vec![index])),
        }
    }
    chains.into_iter().map(|(_, chain)| chain).collect()
}

/// What keeps a delivery in order with others: its conversation; else its message id (a
/// message with neither is in order with nothing).
pub(crate) fn conversation_key(decoded: &Result<Message, NlipError>, envelope: &Envelope, tag: u64) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    match (decoded.as_ref().ok().and_then(|m| m.conversation_token()), &envelope.message_id) {
        (Some(token), _) => token.hash(&mut hasher),
        (None, Some(id)) => id.hash(&mut hasher),
        (None, None) => tag.hash(&mut hasher),
    }
    hasher.finish()
}

/// Longest destination named in a publish span's name.
const MAX_SPAN_DESTINATION: usize = 64;

/// `publish <first destination>`, with `(+N)` for the others: span names are low-cardinality
/// by convention and some destinations are reply addresses the producer chose.
fn publish_span_name(destinations: &[&str]) -> String {
    let first = destinations.first().copied().unwrap_or_default();
    let mut name = format!("publish {}", first.chars().take(MAX_SPAN_DESTINATION).collect::<String>());
    if destinations.len() > 1 {
        name.push_str(&format!(" (+{})", destinations.len() - 1));
    }
    name
}

/// A delivery on its way to a worker, decoded by the dispatcher (which needed its conversation
/// to pick the worker).
pub(crate) struct Job {
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
    /// Counts it in flight for its partition until the job is dropped (settled, or abandoned
    /// with a lost connection).
    #[expect(dead_code, reason = "held for its Drop, which ends the count")]
    pub in_flight: Option<crate::cluster::InFlight>,
}

/// An amount added to a gauge for as long as it lives.
struct Gauged<'a>(&'a prometheus::IntGauge, i64);

impl<'a> Gauged<'a> {
    fn add(gauge: &'a prometheus::IntGauge, amount: i64) -> Self {
        gauge.add(amount);
        Gauged(gauge, amount)
    }
}

impl Drop for Gauged<'_> {
    fn drop(&mut self) {
        self.0.sub(self.1);
    }
}

/// Why an attempt at a message failed.
#[derive(Debug, thiserror::Error)]
enum AttemptFailure {
    #[error(transparent)]
    Intake(#[from] intake::Failure),
    #[error("publishing to {destination}: {error}")]
    Publish { destination: String, error: PublishError },
    /// A reply address silpgate does not publish to for a producer (`amqp.reply_prefixes`).
    #[error("{0}")]
    ReplyRefused(String),
}

impl AttemptFailure {
    fn disposition(&self) -> Disposition {
        match self {
            AttemptFailure::Intake(e) => e.disposition(),
            AttemptFailure::Publish { .. } => Disposition::Transient,
            AttemptFailure::ReplyRefused(_) => Disposition::Poison,
        }
    }

    fn code(&self) -> &str {
        match self {
            AttemptFailure::Intake(e) => e.code(),
            AttemptFailure::Publish { error, .. } => error.code(),
            AttemptFailure::ReplyRefused(_) => crate::code::Code::Forbidden.as_str(),
        }
    }
}

impl From<GatewayError> for AttemptFailure {
    fn from(error: GatewayError) -> Self {
        AttemptFailure::Intake(error.into())
    }
}

/// What the workers of one connection share.
pub(crate) struct Pipeline {
    pub intake: Arc<Intake>,
    /// The connection as agents' connectors and answers' return paths see it.
    pub link: BrokerLink,
    pub amqp: Arc<AmqpConfig>,
    pub limits: nlip::Limits,
    pub publisher: Publisher,
    /// Set when silpgate is shutting down: stop retrying, leave the message to the broker.
    pub shutdown: Shutdown,
    /// While the broker cannot commit quorum-queue writes, no attempt is made and none counts.
    pub health: Arc<BrokerHealth>,
    /// Where workers say why the connection must end (reconnect, or stop on a damaged store).
    pub endings: Endings,
    /// Ledger marks of messages whose publishes are confirmed.
    pub marks: super::marks::Marks,
    /// Acknowledgements on the consuming channel (inbound and reply queues); a cluster's
    /// partition channels acknowledge one delivery at a time.
    pub acks: Arc<AckBook>,
    /// Cluster mode: session changes and lock proposals go to the streams before the ack.
    pub cluster: Option<Arc<Cluster>>,
    /// The conversations (by [`conversation_key`]) with a message left to the broker while
    /// silpgate stops: their later messages are left too, so that the next start takes them
    /// all, in order.
    pub left: Left,
    /// Which reply addresses silpgate publishes to for a producer.
    pub reply_rule: crate::broker::reply_rule::ReplyRule,
}

/// Conversations left to the broker while silpgate stops. Empty but during a stop, so that the
/// check every message makes takes no lock until something is left.
#[derive(Default)]
pub(crate) struct Left {
    any: std::sync::atomic::AtomicBool,
    keys: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl Left {
    fn insert(&self, key: u64) {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key);
        // After the key: whoever sees the flag finds the key.
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    fn contains(&self, key: impl FnOnce() -> u64) -> bool {
        self.any.load(std::sync::atomic::Ordering::Acquire)
            && self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&key())
    }
}

impl Pipeline {
    /// What cluster mode uses of this connection.
    pub(crate) fn cluster_wire(&self) -> crate::cluster::Wire {
        crate::cluster::Wire {
            link: self.link.clone(),
            publisher: self.publisher.clone(),
            endings: self.endings.clone(),
            prefetch: self.amqp.prefetch,
            inbound: self.amqp.inbound.clone(),
            limits: self.limits,
        }
    }

    /// Takes a window of deliveries to their end: each acknowledged, dead-lettered, or left to
    /// the broker. The core decides each in order and commits
    /// its state; one flush makes the whole window durable; then each conversation's messages
    /// are delivered one after another while different conversations' deliveries and
    /// confirms overlap. A message that fails goes on alone (retries, dead-lettering), and the
    /// rest of its conversation in this window waits behind it, so order holds as it does for
    /// one message at a time. Acknowledgements go out together once the window is settled.
    pub(crate) async fn process_window(&self, jobs: Vec<Job>) {
        let metrics = crate::metrics::get();
        // Counted down on drop: a lost connection's worker may be aborted mid-window.
        let _gauged = Gauged::add(&metrics.in_flight, jobs.len() as i64);
        if self.held_until_released().await {
            let mut planned: Vec<_> = self.plan_window(&jobs).await.into_iter().map(Some).collect();
            let chains = chains_of(&jobs);
            let mut runs = Vec::with_capacity(chains.len());
            for chain in chains {
                let steps: Vec<_> = chain
                    .iter()
                    .map(|&i| (&jobs[i], planned[i].take().expect("each job is in one chain")))
                    .collect();
                runs.push(self.run_chain(steps));
            }
            futures_util::future::join_all(runs).await;
            if let Err(e) = self.acks.send().await {
                self.endings.broken(format!("an acknowledgement failed: {e}"));
            }
        } else {
            // Stopping while the broker side holds: the whole window stays with the broker.
            jobs.iter().for_each(|job| self.leave(job));
        }
        for job in &jobs {
            metrics
                .message_seconds
                .with_label_values(&["amqp"])
                .observe(job.received.elapsed().as_secs_f64());
        }
    }

    /// The core's decision for each message of a window, made durable with one flush
    /// ([`Intake::plan_window`]); one that could not be decoded is left to the one-at-a-time
    /// path (`Err(None)`).
    async fn plan_window(&self, jobs: &[Job]) -> Vec<Result<Planned, Option<NotTaken>>> {
        let arrivals = jobs
            .iter()
            .map(|job| {
                let message = job.decoded.as_ref().ok().filter(|_| self.refused_reply(job).is_none())?;
                Some(self.arrival(job, message.clone()))
            })
            .collect();
        self.intake.plan_window(arrivals).await
    }

    /// One conversation's messages of a window, in order: each planned one is delivered; from
    /// the first that is not, every message takes the one-at-a-time path.
    async fn run_chain(&self, steps: Vec<(&Job, Result<Planned, Option<NotTaken>>)>) {
        let mut fast = true;
        for (job, planned) in steps {
            if self.follows_a_left_message(job) {
                continue;
            }
            let failed = match planned {
                Ok(planned) if fast => {
                    let base_id = base_id(job);
                    match self.finish(job, &base_id, planned).instrument(job.span.clone()).await {
                        Ok(()) => {
                            self.ack(job).await;
                            continue;
                        }
                        Err(failure) => Some(failure),
                    }
                }
                Err(Some(refused)) if fast => Some(self.refused(job, &base_id(job), refused).await),
                _ => None,
            };
            fast = false;
            self.settle(job, failed).instrument(job.span.clone()).await;
        }
    }

    /// Retries a message until it is acknowledged or dead-lettered, or left to the broker;
    /// `failed` is how its attempt in the window went, if it made one.
    async fn settle(&self, job: &Job, mut failed: Option<AttemptFailure>) {
        let mut backoff = Backoff::new(
            Duration::from_millis(self.amqp.retry_initial_ms),
            Duration::from_millis(self.amqp.retry_max_ms),
        );
        let mut attempts = job.envelope.earlier_deliveries;
        if self.follows_a_left_message(job) {
            return;
        }
        loop {
            let failure = match failed.take() {
                Some(failure) => failure,
                None => {
                    if !self.held_until_released().await {
                        // Shutting down: the broker redelivers what was not acknowledged.
                        return self.leave(job);
                    }
                    match self.attempt(job).await {
                        Ok(()) => return self.ack(job).await,
                        Err(failure) => failure,
                    }
                }
            };
            // An attempt that failed because the broker lost its majority says nothing about
            // the message: it must not spend the message's attempts.
            if !(self.health.is_holding() && failure.disposition() == Disposition::Transient) {
                attempts += 1;
            }
            let message_id = job.envelope.message_id.as_deref().unwrap_or("-");
            job.span.record("error.type", failure.code());
            job.span.record("silpgate.disposition", failure.disposition().as_str());
            job.span.record("silpgate.attempts", attempts);
            crate::metrics::get()
                .failures
                .with_label_values(&["amqp", failure.disposition().as_str(), failure.code()])
                .inc();
            match failure.disposition() {
                Disposition::Duplicate => return self.ack(job).await,
                Disposition::Poison => {
                    warn!(message_id, queue = %job.queue, code = failure.code(), error = %failure, "Message rejected to the dead-letter exchange.");
                    self.take_back(job).await;
                    if self.dead_letter(job, failure.code(), &failure.to_string()).await {
                        return;
                    }
                }
                Disposition::Transient if attempts >= self.amqp.max_attempts => {
                    let reason = format!("gave up after {attempts} attempts: {failure}");
                    warn!(message_id, queue = %job.queue, code = failure.code(), error = %reason, "Message dead-lettered.");
                    self.take_back(job).await;
                    // The sender (or the front door that forwarded it) hears why, once: not if
                    // it already heard this request's outcome (a `timeout`).
                    let base_id = base_id(job);
                    if self.intake.waiting().conclude(&base_id) {
                        let said =
                            nlip::reply::error_message(failure.code(), &reason, &nlip::reply::Location::None);
                        self.tell_sender(job, &base_id, vec![said]).await;
                    }
                    if self.dead_letter(job, failure.code(), &reason).await {
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
                    if job.partition.is_none() {
                        self.acks.returned(&job.delivery);
                    }
                    self.endings.store_damaged(&failure);
                    return;
                }
            }
            if !self.publisher.channel().status().connected() {
                // The broker has requeued the delivery already; acking it now would fail.
                self.endings.broken("the publishing channel is closed");
                return;
            }
            let mut shutdown = self.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = shutdown.stopped() => return self.leave(job),
            }
        }
    }

    /// Leaves `job` to the broker as silpgate stops, and with it the rest of its conversation.
    fn leave(&self, job: &Job) {
        self.left.insert(conversation_key(&job.decoded, &job.envelope, job.delivery.delivery_tag));
    }

    /// Whether an earlier message of `job`'s conversation was left to the broker: then so is
    /// this one (acknowledging it would put it before the earlier one).
    fn follows_a_left_message(&self, job: &Job) -> bool {
        self.left.contains(|| conversation_key(&job.decoded, &job.envelope, job.delivery.delivery_tag))
    }

    /// A message refused for good leaves no trace in the state: the turn it counted is taken
    /// back ([`crate::gateway::Gateway::take_back`]), durably and, in a cluster, in its
    /// partition's changelog, before its sender hears that it failed and sends it again.
    async fn take_back(&self, job: &Job) {
        let (Some(id), Ok(message)) = (job.envelope.message_id.as_deref(), &job.decoded) else { return };
        let Some(token) = message.conversation_token() else { return };
        let core = self.intake.core();
        let gateway = &core.gateway;
        let session = match gateway.take_back(id, token) {
            Ok(Some(session)) => session,
            Ok(None) => return,
            Err(e) => {
                return warn!(message_id = id, error = %e, "The refused message's turn could not be taken back.");
            }
        };
        if let Err(e) = gateway.store().flush_async().await {
            return warn!(message_id = id, error = %e, "The refused message's turn was taken back but could not be made durable.");
        }
        if let (Some(cluster), Some(partition)) = (self.cluster.as_deref(), job.partition)
            && let Err(e) = cluster.take_back(&self.publisher, partition, session, id).await
        {
            warn!(message_id = id, partition = partition.index, error = %e, "The refused message's turn was taken back here, not in its changelog.");
        }
    }

    /// Waits while the broker side holds. False when silpgate shuts down meanwhile.
    async fn held_until_released(&self) -> bool {
        if !self.health.is_holding() {
            return true;
        }
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = self.health.released() => true,
            () = shutdown.stopped() => false,
        }
    }

    /// The refusal of a message whose reply address silpgate would not publish to for its
    /// producer ([`crate::broker::reply_rule`]). A front-door message another instance
    /// forwarded names that instance's reply queue, and is silpgate's own.
    fn refused_reply(&self, job: &Job) -> Option<AttemptFailure> {
        if job.envelope.replies.is_empty() {
            return None;
        }
        let own_user = self.link.current().map(|link| link.user).unwrap_or_default();
        if job.envelope.forwarded_by_silpgate(&own_user) {
            return None;
        }
        let refusal = job.envelope.replies.iter().find_map(|(_, address)| self.reply_rule.refusal(address));
        refusal.map(AttemptFailure::ReplyRefused)
    }

    /// One attempt: everything up to, but not including, the acknowledgement.
    async fn attempt(&self, job: &Job) -> Result<(), AttemptFailure> {
        if let Some(refused) = self.refused_reply(job) {
            return Err(refused);
        }
        let base_id = base_id(job);
        let message = match &job.decoded {
            Ok(message) => message.clone(),
            Err(e) => {
                let encoding = job.envelope.encoding.as_ref().map_or(Encoding::Json, |e| *e);
                let NotTaken { failure, replies } = self.intake.unreadable(e.clone(), encoding);
                self.tell_sender(job, &base_id, replies).await;
                return Err(failure.into());
            }
        };
        let planned = match self.intake.plan(self.arrival(job, message)) {
            Ok(planned) => planned,
            Err(refused) => return Err(self.refused(job, &base_id, refused).await),
        };
        self.intake.make_durable(&[&planned]).await.map_err(GatewayError::Store)?;
        self.finish(job, &base_id, planned).await
    }

    /// The message as the intake takes it.
    fn arrival(&self, job: &Job, message: Message) -> Arrival {
        let envelope = &job.envelope;
        let own_user = self.link.current().map(|link| link.user).unwrap_or_default();
        // A forwarded front-door message's `user_id` is silpgate's own, not its sender's. On a
        // partition queue, the sender is the one the ingress vouches for, or the publisher.
        let front_door = envelope.forwarded_by_silpgate(&own_user);
        let sender = match (front_door, job.partition) {
            (true, _) => None,
            (false, Some(_)) => envelope.partition_sender(&own_user),
            (false, None) => envelope.user_id.as_ref(),
        };
        if sender == Some(&own_user) {
            shared_user_warning(&own_user);
        }
        let origin = Origin {
            transport: Transport::Amqp,
            source: route_source(job, &self.amqp.inbound, &own_user),
            reply_to: envelope.reply_to.clone(),
            replies: envelope.replies.clone(),
            correlation_id: envelope.correlation_id.clone(),
            user_id: sender.cloned(),
            message_id: envelope.message_id.clone(),
            partition: job.partition,
            // The broker verified the user: the principal. A front door's message forwarded by
            // silpgate carries the principal its door verified.
            principal: if front_door {
                envelope.forwarded_principal.clone()
            } else {
                self.broker_principal(sender)
            },
        };
        if let Some(principal) = &origin.principal {
            job.span.record("enduser.id", principal.subject.as_str());
        }
        // The agent's answer goes to the sender's reply addresses, written for the sender.
        let answers = (!envelope.replies.is_empty()).then(|| {
            Arc::new(ReplyAddresses {
                link: self.link.clone(),
                replies: envelope.replies.clone(),
                correlation_id: envelope.correlation_id.clone(),
                user_id: envelope.user_id.clone(),
                message_id: format!("{}:answer", base_id(job)),
                progress: envelope.wants_progress.then(AtomicU64::default),
            }) as Arc<dyn ReturnPath>
        });
        let content_id = Some(base_id(job));
        Arrival { envelope: message, origin, span: job.span.clone(), answers, content_id }
    }

    /// The principal of an AMQP sender: its broker user, with `[auth] broker_roles`' roles.
    fn broker_principal(&self, user: Option<&String>) -> Option<crate::principal::Principal> {
        let core = self.intake.core();
        let roles = |user: &String| core.gateway.config().auth.broker_roles.get(user).cloned();
        let amqp = crate::principal::Source::Amqp;
        user.map(|user| crate::principal::Principal::verified(amqp, user, roles(user).unwrap_or_default()))
    }

    /// A message the intake refused; a sender of poison hears why.
    async fn refused(&self, job: &Job, base_id: &str, refused: NotTaken) -> AttemptFailure {
        let NotTaken { failure, replies } = refused;
        if failure.disposition() == Disposition::Poison {
            // The sender hears why; if that fails, the dead-letter copy still says it.
            self.tell_sender(job, base_id, replies).await;
        }
        failure.into()
    }

    /// A planned message, its state durable: delivered to its agents, its replies published
    /// (with a cluster's stream entries) and confirmed, its ledger entry marked.
    async fn finish(&self, job: &Job, base_id: &str, planned: Planned) -> Result<(), AttemptFailure> {
        let envelope = &job.envelope;
        let taken = match self.intake.deliver_planned(planned).await {
            Ok(taken) => taken,
            Err(refused) => return Err(self.refused(job, base_id, refused).await),
        };
        if taken.duplicate {
            return Ok(());
        }
        let cluster = self.cluster.as_deref().zip(job.partition);
        let entries = match cluster {
            Some((cluster, partition)) => {
                let entries = cluster.entries(partition, &taken.change, &taken.frozen, &taken.learnt);
                Some(entries.map_err(GatewayError::Store)?)
            }
            None => None,
        };
        let (changes, proposals) = entries.as_ref().map_or((0, 0), |e| (e.changes, e.proposals));
        let appends = entries.map(|e| e.publications).unwrap_or_default();
        let mut replies = taken.replies;
        // An answer that came in the call goes out with the replies, under their one confirm wait.
        replies.extend(taken.answer);
        if envelope.forwarded_by.is_some() && replies.is_empty() && taken.awaiting.is_none() {
            // The forwarding instance's client hears that its agent has the message (a route
            // that waits for no answer), as it would from the instance itself.
            replies.push(crate::nlip::reply::accepted(&taken.delivered));
        }
        let last = taken.awaiting.is_none();
        self.publish(job, base_id, (replies, last), appends).await?;
        if let Some(id) = &envelope.message_id {
            if let Some((cluster, partition)) = cluster {
                cluster.published(partition, id);
            }
            self.marks.published(id.clone());
        }
        if let Some((cluster, partition)) = cluster
            && let Err(e) = cluster
                .appended(&self.publisher, partition, envelope.message_id.as_deref(), changes, proposals)
                .await
        {
            warn!(partition = partition.index, error = %e, "Snapshot not appended; the next change tries again.");
        }
        Ok(())
    }

    /// Sends error replies to the sender, best effort: the dead-letter copy says it too.
    async fn tell_sender(&self, job: &Job, base_id: &str, replies: Vec<Message>) {
        if let Err(e) = self.publish(job, base_id, (replies, true), Vec::new()).await {
            debug!(error = %e, "Error reply not delivered.");
        }
    }

    /// Publishes replies to every reply address of the message, in each address's encoding;
    /// then `entries` (a cluster's stream entries), all under one wait for the broker's
    /// confirms. `last`: no answer comes after these, so that the last of them is marked
    /// `final` for a sender that takes interim replies (the others `reply`).
    async fn publish<'a>(
        &'a self,
        job: &'a Job,
        base_id: &str,
        (replies, last): (Vec<Message>, bool),
        entries: Vec<Publication<'a>>,
    ) -> Result<(), AttemptFailure> {
        let mut publications = Vec::with_capacity(replies.len() * job.envelope.replies.len() + entries.len());
        if !replies.is_empty() && job.envelope.replies.is_empty() {
            debug!(message_id = base_id, "No reply address; the reply is dropped.");
        }
        for (index, reply) in replies.iter().enumerate() {
            let id = format!("{base_id}:reply-{index}");
            for (encoding, address) in &job.envelope.replies {
                let mut properties = job.envelope.outbound_properties(*encoding, &id);
                if job.envelope.wants_progress {
                    let kind = if last && index + 1 == replies.len() { "final" } else { "reply" };
                    properties = properties::reply_kind(properties, kind);
                }
                publications.push(Publication {
                    exchange: "",
                    routing_key: address,
                    body: nlip::encode(reply, *encoding),
                    properties: properties::with_reply_place(properties, index, replies.len()),
                });
            }
        }
        publications.extend(entries);
        if publications.is_empty() {
            return Ok(());
        }
        let destinations: Vec<&str> = publications
            .iter()
            .map(|p| if p.exchange.is_empty() { p.routing_key } else { p.exchange })
            .collect();
        let destination = destinations.join(",");
        let span = info_span!(
            "amqp publish",
            otel.name = %publish_span_name(&destinations),
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
                self.endings.broken(&error);
            }
            AttemptFailure::Publish { destination, error }
        })
    }

    /// Publishes the message, as it came, to the dead-letter exchange with why, then
    /// acknowledges it. False when the dead-letter copy could not be made safe (retry).
    async fn dead_letter(&self, job: &Job, code: &str, reason: &str) -> bool {
        self.dead_letter_delivery(&job.delivery, job.partition.is_some(), &job.queue, code, reason).await
    }

    async fn dead_letter_delivery(
        &self,
        delivery: &Delivery,
        own_channel: bool,
        queue: &str,
        code: &str,
        reason: &str,
    ) -> bool {
        let publication = Publication {
            exchange: &self.amqp.dead_letter_exchange,
            routing_key: queue,
            body: delivery.data.clone(),
            properties: properties::dead_letter_properties(&delivery.properties, code, reason, queue),
        };
        match self.publisher.publish_all(vec![publication]).instrument(info_span!("amqp dead-letter")).await {
            Ok(()) => {
                self.ack_delivery(delivery, own_channel, info_span!("amqp ack")).await;
                true
            }
            Err(e) => {
                warn!(error = %e, "Dead-lettering failed; retrying.");
                false
            }
        }
    }

    async fn ack(&self, job: &Job) {
        // Each message's last step, for following one message across instances in a log.
        debug!(
            message_id = job.envelope.message_id.as_deref().unwrap_or("-"),
            queue = %job.queue,
            redelivered = job.delivery.redelivered,
            "Acknowledging."
        );
        let span = info_span!(parent: &job.span, "amqp ack");
        self.ack_delivery(&job.delivery, job.partition.is_some(), span).await;
    }

    /// A delivery of the consuming channel goes into its acknowledgement book (sent with the
    /// window; `span` ends then); one from a partition's own channel is acknowledged at once.
    async fn ack_delivery(&self, delivery: &Delivery, own_channel: bool, span: tracing::Span) {
        if !own_channel {
            self.acks.settled(delivery, span);
            return;
        }
        let acked = delivery.acker.ack(BasicAckOptions { multiple: false }).instrument(span).await;
        if let Err(e) = acked {
            // The channel is gone and the broker will redeliver: the ledger handles that.
            debug!(error = %e, "Acknowledgement not sent.");
            self.endings.broken(format!("an acknowledgement failed: {e}"));
        }
    }

    /// Sends the acknowledgements the book holds (for deliveries not handled in a window).
    async fn send_acks(&self) {
        if let Err(e) = self.acks.send().await {
            self.endings.broken(format!("an acknowledgement failed: {e}"));
        }
    }

    /// Partition owners' replies to the front-door messages this instance forwarded, from
    /// RabbitMQ's direct reply-to on the publishing channel (see [`crate::intake::forward`]),
    /// each to its waiting door as it is. Nothing is acknowledged: the broker keeps no copy,
    /// and a reply whose door has given up is dropped here. Returns when the consumer ends.
    pub(crate) async fn forwarded_replies(&self, mut replies: lapin::Consumer) {
        use futures_util::StreamExt;
        while let Some(Ok(delivery)) = replies.next().await {
            let envelope = Envelope::read(&delivery.properties, false);
            let Some(correlation) = envelope.correlation_id.as_deref() else {
                warn!("A reply on direct reply-to without a correlation id dropped.");
                continue;
            };
            let reply = envelope.decode(&delivery.data, &self.limits).unwrap_or_else(|e| {
                let detail = format!("the partition owner's reply cannot be read: {e}");
                nlip::reply::error_message(e.kind.code(), &detail, &nlip::reply::Location::None)
            });
            if self.intake.forwards().replied(correlation, reply, envelope.reply_place).is_some() {
                debug!(
                    correlation_id = correlation,
                    "A forwarded message's reply came after its door gave up; dropped."
                );
            }
        }
    }

    /// An agent's answer from this instance's reply queue, taken to its asker; acknowledged
    /// once the asker's door has it, dead-lettered with the reason when nobody waits for it.
    pub(crate) async fn take_answer(&self, delivery: Delivery, queue: Arc<str>) {
        let envelope = Envelope::read(&delivery.properties, delivery.redelivered);
        let from = Origin {
            message_id: envelope.message_id.clone(),
            user_id: envelope.user_id.clone(),
            ..Origin::new(Transport::Amqp, queue.as_ref())
        };
        let mut backoff = Backoff::new(
            Duration::from_millis(self.amqp.retry_initial_ms),
            Duration::from_millis(self.amqp.retry_max_ms),
        );
        loop {
            let Some(correlation) = envelope.correlation_id.as_deref() else {
                let reason = "an answer needs the correlation_id of the message it answers";
                warn!(queue = %queue, "Answer without a correlation id dead-lettered.");
                if self.dead_letter_delivery(&delivery, false, &queue, "no_correlation", reason).await {
                    return self.send_acks().await;
                }
                continue;
            };
            // An answer that cannot be read still ends its request's wait, with the reason.
            let (answer, unreadable) = match envelope.decode(&delivery.data, &self.limits) {
                Ok(message) => (message, None),
                Err(e) => {
                    let detail = format!("the agent's answer cannot be read: {e}");
                    (
                        nlip::reply::error_message(e.kind.code(), &detail, &nlip::reply::Location::None),
                        Some(e),
                    )
                }
            };
            // A partition owner's reply to a message this instance forwarded has been through
            // the owner's core: it goes to the waiting door as it is.
            let Some(answer) = self.intake.forwards().replied(correlation, answer, envelope.reply_place)
            else {
                self.ack_delivery(&delivery, false, info_span!("amqp ack")).await;
                return self.send_acks().await;
            };
            let result = self.intake.answer(correlation, answer, from.clone()).await;
            let (code, reason) = match (result, unreadable) {
                (Ok(()), None) => {
                    self.ack_delivery(&delivery, false, info_span!("amqp ack")).await;
                    return self.send_acks().await;
                }
                (Ok(()), Some(e)) => (e.kind.code().to_owned(), e.to_string()),
                (Err(e), _) if e.disposition() == Disposition::Transient => {
                    debug!(error = %e, "Answer not passed on yet; retrying.");
                    let mut shutdown = self.shutdown.clone();
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => continue,
                        // Left unacknowledged: the broker keeps it for the next start.
                        () = shutdown.stopped() => return,
                    }
                }
                (Err(e), _) => (e.code().to_owned(), e.to_string()),
            };
            warn!(correlation_id = correlation, code = code.as_str(), error = %reason, "Answer dead-lettered.");
            if self.dead_letter_delivery(&delivery, false, &queue, &code, &reason).await {
                return self.send_acks().await;
            }
        }
    }
}

/// An AMQP sender's reply addresses, as the return path of its request: an agent's answer is
/// published to each of them in its encoding, with the sender's correlation id, and counts as
/// passed on once the broker confirms. A sender that asked for interim replies
/// ([`properties::PROGRESS_HEADER`]) gets the agent's progress too, each report a reply marked
/// `progress`, and the answer marked `final`.
struct ReplyAddresses {
    link: BrokerLink,
    replies: Vec<(Encoding, String)>,
    correlation_id: Option<String>,
    user_id: Option<String>,
    /// The answer's own id: stable, so that a sender can drop a repeated answer.
    message_id: String,
    /// Interim replies sent so far, when the sender takes them.
    progress: Option<AtomicU64>,
}

impl ReplyAddresses {
    /// One reply per address, its id `message_id`, marked as `kind` when the sender takes
    /// interim replies.
    fn publications(&self, message: &Message, message_id: &str, kind: &str) -> Vec<Publication<'_>> {
        self.replies
            .iter()
            .map(|(encoding, address)| {
                let properties = properties::published(properties::Published {
                    encoding: *encoding,
                    message_id,
                    correlation_id: self.correlation_id.as_deref(),
                    reply_to: None,
                    replies: &[],
                    user_id: self.user_id.as_deref(),
                });
                Publication {
                    exchange: "",
                    routing_key: address,
                    body: nlip::encode(message, *encoding),
                    properties: match self.progress {
                        Some(_) => properties::reply_kind(properties, kind),
                        None => properties,
                    },
                }
            })
            .collect()
    }
}

/// Each report is published as it comes, on the channel the answer will take, so that the
/// answer comes after every report. Reports are interim: one the broker does not take is
/// logged, not retried. Their ids count from the request (`…:progress:<n>`), so that a
/// redelivered request's repeated reports are dropped like a repeated answer.
impl crate::connectors::Progress for ReplyAddresses {
    fn progress(&self, event: Message) {
        let (Some(sent), Some(link)) = (&self.progress, self.link.current()) else { return };
        let n = sent.fetch_add(1, Ordering::Relaxed);
        let message_id = format!("{}:progress:{n}", self.message_id.trim_end_matches(":answer"));
        let pending: Vec<_> = self
            .publications(&event, &message_id, "progress")
            .into_iter()
            .filter_map(|publication| link.publisher.send(publication).ok())
            .collect();
        tokio::spawn(async move {
            for confirm in pending {
                if let Err(e) = confirm.confirmed().await {
                    debug!(error = %e, "An interim reply was not taken by the broker.");
                }
            }
        });
    }
}

impl ReturnPath for ReplyAddresses {
    fn send(&self, answer: Message) -> BoxFuture<'_, Result<(), Returned>> {
        Box::pin(async move {
            let link =
                self.link.current().ok_or_else(|| Returned::Retry("the broker is not connected".into()))?;
            let publications = self.publications(&answer, &self.message_id, "final");
            let published =
                link.publisher.publish_all(publications).instrument(info_span!("amqp answer")).await;
            crate::metrics::get().messages_out.with_label_values(&["amqp", "reply"]).inc();
            published.map_err(|e| Returned::Retry(e.to_string()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_header_is_believed_only_from_a_partition_queue_naming_an_inbound_queue() {
        let inbound = ["silpgate.in".to_owned()];
        assert_eq!(believed_source(true, Some("silpgate.in"), &inbound, "p.03", false), "silpgate.in");
        assert_eq!(believed_source(false, Some("silpgate.in"), &inbound, "other.in", false), "other.in");
        assert_eq!(believed_source(true, Some("admin"), &inbound, "p.03", false), "p.03");
        assert_eq!(believed_source(true, None, &inbound, "p.03", false), "p.03");
        // A front door forwarded by silpgate itself, and only that, names its door.
        assert_eq!(believed_source(true, Some("http"), &inbound, "p.03", true), "http");
        assert_eq!(believed_source(false, Some("http"), &inbound, "other.in", true), "other.in");
    }

    #[test]
    fn publish_span_names_are_bounded_whatever_the_reply_addresses() {
        let long = "r".repeat(10_000);
        let name = publish_span_name(&[long.as_str(), "silpgate.agents", "x"]);
        assert_eq!(name, format!("publish {} (+2)", "r".repeat(MAX_SPAN_DESTINATION)));
        assert_eq!(publish_span_name(&["silpgate.agents"]), "publish silpgate.agents");
    }
}
