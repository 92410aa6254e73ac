//! The AMQP door (NLIP over AMQP 0-9-1, RabbitMQ). A supervisor keeps one connection up
//! (reconnecting with capped, jittered backoff and re-declaring the topology each time),
//! consumes the inbound queues, and hands each delivery to a worker; the worker
//! ([`worker::Pipeline`]) takes it through the [intake](crate::intake) to its acknowledgement.
//! The same connection serves the AMQP agents' connectors (through a
//! [`BrokerLink`](crate::broker::link::BrokerLink)) and consumes this instance's reply
//! queue, where agents answer; each answer goes back through the intake to its asker.
//!
//! Ordering: a conversation's messages always go to the same worker, which handles one
//! message at a time, so they stay in order; different conversations run in parallel. In-flight
//! work is bounded by the prefetch count and the workers' bounded queues.
//!
//! Shutdown: stop consuming, let the workers finish within `amqp.drain_secs`, then close the
//! connection; the broker requeues whatever was not acknowledged.
//!
//! In cluster mode ([`crate::cluster`]) the inbound queues are only forwarded to the partitions, the
//! partition queues are what the workers handle, a partition's first delivery on a connection
//! waits until its changelog is replayed, and on SIGTERM the instance hands its partitions on
//! before it closes.

pub(crate) mod acks;
pub(crate) mod marks;
pub(crate) mod worker;

use crate::broker::addresses::{Addresses, Node};
use crate::broker::ending::Endings;
use crate::broker::health::BrokerHealth;
use crate::broker::link::{BrokerLink, Link};
use crate::broker::reply_rule::ReplyRule;
// A stopping connection's cancels, closes and helpers wait at most BROKER_GOODBYE each: nothing
// is acknowledged after the workers stop, and the broker requeues what is left.
use crate::broker::supervise::{BROKER_GOODBYE, Client, Ended, Reached, goodbye, supervise};
use crate::broker::{majority, properties, publish, topology};
use crate::cluster::Cluster;
use crate::cluster::connection::{ClusterSide, REBALANCE_TICK};
use crate::cluster::handover::Parked;
use crate::cluster::ownership::{self, Deliveries};
use crate::config::{AmqpConfig, Config, ReplyQueueType};
use crate::gateway::store::Store;
use crate::intake::Intake;
use crate::util::backoff::Backoff;
use crate::util::shutdown::Shutdown;
use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use worker::{Job, Pipeline};

/// How long the workers of a lost connection may take to finish: whatever they still do needs
/// the dead connection, and they find that out within milliseconds unless they wait on it.
const LOST_DRAIN: Duration = Duration::from_secs(1);

/// A request to declare the queues of the agents given (a reload adds agents): on a channel of
/// its own, so that a refusal closes nothing in use; answered with the broker's refusal, if any.
pub(crate) struct Declare {
    pub agents: Vec<crate::config::AgentConfig>,
    pub done: tokio::sync::oneshot::Sender<Result<(), String>>,
}

/// Why the AMQP side stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    #[error("the store is damaged ({0}); stopped consuming so that nothing more is acknowledged")]
    StoreDamaged(String),
    #[error("{0}")]
    BadAddress(String),
}

/// The AMQP service: what it needs, and whether it is connected.
pub(crate) struct Amqp {
    config: Arc<Config>,
    amqp: Arc<AmqpConfig>,
    store: Arc<dyn Store>,
    cluster: Option<Arc<Cluster>>,
    intake: Arc<Intake>,
    /// Tells agents' connectors and answers' return paths about the connection.
    link: watch::Sender<Option<Link>>,
    link_rx: BrokerLink,
    /// The node connected to and whether silpgate holds; `/readyz` reports it.
    health: Arc<BrokerHealth>,
    /// A reload's requests to declare the queues of the agents it adds.
    declares: tokio::sync::Mutex<Option<mpsc::Receiver<Declare>>>,
}

/// A task that lives as long as the connection it serves.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Amqp {
    /// `link` is the pair [`BrokerLink::new`] made; the agents' connectors hold its receiver.
    pub(crate) fn new(
        config: Arc<Config>,
        amqp: AmqpConfig,
        store: Arc<dyn Store>,
        cluster: Option<Arc<Cluster>>,
        intake: Arc<Intake>,
        link: (watch::Sender<Option<Link>>, BrokerLink),
    ) -> Self {
        let (link, link_rx) = link;
        let health = Arc::new(BrokerHealth::default());
        let declares = tokio::sync::Mutex::new(None);
        Amqp { config, amqp: Arc::new(amqp), store, cluster, intake, link, link_rx, health, declares }
    }

    /// Takes a reload's requests to declare agents' queues, on the connection up when they come.
    #[must_use]
    pub(crate) fn with_declares(self, requests: Option<mpsc::Receiver<Declare>>) -> Self {
        Amqp { declares: tokio::sync::Mutex::new(requests), ..self }
    }

    /// Declares what `request` asks on a channel of its own, so that a refusal closes nothing
    /// in use, and answers it.
    async fn declare(&self, connection: &Connection, request: Declare) {
        let cluster = self.cluster.as_ref().map(|c| &c.config);
        let topology = topology::Topology::from_config(&self.amqp, cluster, &request.agents);
        let declared = async {
            let channel = connection.create_channel().await?;
            topology.declare(&channel).await?;
            channel.close(200, "declared".into()).await
        };
        let result = match tokio::time::timeout(BROKER_GOODBYE, declared).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("the broker did not answer within {BROKER_GOODBYE:?}")),
        };
        let _ = request.done.send(result);
    }

    /// The queue agents answer this instance on: one per instance.
    pub(crate) fn reply_queue(&self) -> String {
        reply_queue(&self.amqp, self.cluster.as_ref().map(|c| &c.config))
    }

    /// The broker side's health, for `/readyz` and `/cluster`.
    pub(crate) fn health(&self) -> Arc<BrokerHealth> {
        self.health.clone()
    }

    /// Runs until `shutdown` turns true (then drains and returns `Ok`), reconnecting whenever
    /// the broker goes away ([`supervise`]).
    ///
    /// # Errors
    /// [`AmqpError::StoreDamaged`] when a message hit a damaged store;
    /// [`AmqpError::BadAddress`] when a broker address (from the environment) is not a URI.
    pub(crate) async fn run(mut self, shutdown: Shutdown) -> Result<(), AmqpError> {
        let addresses = Addresses::of(&self.amqp).map_err(AmqpError::BadAddress)?;
        let backoff = Backoff::new(
            Duration::from_millis(self.amqp.reconnect_initial_ms),
            Duration::from_millis(self.amqp.reconnect_max_ms),
        );
        supervise("the AMQP door", &mut self, addresses, backoff, shutdown)
            .await
            .map_err(AmqpError::StoreDamaged)
    }

    /// Declares the topology on a new connection and opens a consuming and a confirm-mode
    /// channel.
    async fn ready(&self, connection: &Connection) -> lapin::Result<(Channel, Channel)> {
        let declare = connection.create_channel().await?;
        let cluster = self.cluster.as_ref().map(|c| &c.config);
        // The agents as the last reload left them.
        let core = self.intake.core();
        topology::Topology::from_config(&self.amqp, cluster, &core.gateway.config().agents)
            .declare(&declare)
            .await?;
        // This instance's own reply queue is no part of the shared topology. A quorum queue by
        // default: a classic queue lives on one node, and while that node is down it can be
        // neither declared nor consumed, which would keep this instance off every other node.
        let reply_queue = match self.amqp.reply_queue_type {
            ReplyQueueType::Quorum => {
                topology::Queue::quorum(&self.reply_queue(), self.amqp.quorum_initial_group_size)
            }
            ReplyQueueType::Classic => topology::Queue::classic(&self.reply_queue()),
        };
        reply_queue.declare(&declare).await?;
        let _ = declare.close(200, "declared".into()).await;
        let consume = connection.create_channel().await?;
        consume.basic_qos(self.amqp.prefetch, BasicQosOptions { global: false }).await?;
        let publish = connection.create_channel().await?;
        publish.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok((consume, publish))
    }

    /// A cluster's forwarded front-door messages are answered on direct reply-to, which is
    /// consumed on the channel that publishes them, before the first one goes out.
    async fn forwarded_replies_consumer(&self, publish: &Channel) -> lapin::Result<Option<lapin::Consumer>> {
        if self.cluster.is_none() {
            return Ok(None);
        }
        let tag = format!("silpgate-{}-forwarded-replies-{}", std::process::id(), publish.id());
        let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
        let consumer = publish.basic_consume(
            publish::DIRECT_REPLY_TO.into(),
            tag.as_str().into(),
            options,
            FieldTable::default(),
        );
        Ok(Some(consumer.await?))
    }

    /// A fresh confirm-mode channel to publish on, with its direct reply-to consumer in a cluster.
    async fn publishing_channel(
        &self,
        connection: &Connection,
    ) -> lapin::Result<(Channel, Option<lapin::Consumer>)> {
        let publish = connection.create_channel().await?;
        publish.confirm_select(ConfirmSelectOptions::default()).await?;
        let replies = self.forwarded_replies_consumer(&publish).await?;
        Ok((publish, replies))
    }

    /// How long a replaced publishing channel stays open once its publishes are decided: in a
    /// cluster, the replies to the forwards it carried come back on it for as long as their
    /// doors wait.
    fn retired_channel_linger(&self) -> Duration {
        match self.cluster {
            Some(_) => Duration::from_millis(self.config.gateway.reply_timeout_ms),
            None => Duration::ZERO,
        }
    }

    /// Consumes until shutdown, connection loss or a fatal error; returns once every worker
    /// has finished (or the drain deadline has passed).
    async fn consume(
        &self,
        connection: &Connection,
        channel: &Channel,
        publish: Channel,
        (broker, user): (&Node, String),
        mut shutdown: Shutdown,
    ) -> Ended {
        let cluster_config = self.cluster.as_ref().map(|c| &c.config);
        let core = self.intake.core();
        let topology =
            topology::Topology::from_config(&self.amqp, cluster_config, &core.gateway.config().agents);
        drop(core);
        let quorum_queues = topology.quorum_queues();
        let push_queue = self.config.a2a.pushes().then(|| self.config.a2a.push_queue.clone());
        let reply_rule = ReplyRule::new(
            &self.amqp.reply_prefixes,
            topology.queues.into_iter().map(|q| q.name).chain(push_queue),
            &self.amqp.reply_queue,
        );
        let _probe = match majority::watch(
            connection,
            majority::probe_queue(&self.reply_queue()),
            self.amqp.quorum_initial_group_size,
            quorum_queues,
            self.health.clone(),
        )
        .await
        {
            Ok(probe) => AbortOnDrop(probe),
            Err(e) => return Ended::Lost(e.to_string()),
        };
        let (marks, marks_writer) = marks::Marks::start(self.store.clone());
        let acks = Arc::new(acks::AckBook::new());
        let (endings, mut ending) = Endings::new();
        // The connection's own failure ends the intake, whatever else waits on it (a worker
        // blocked on this connection would otherwise hold the intake at a full queue).
        let _connection_watch = AbortOnDrop(tokio::spawn({
            let (endings, connection_status) = (endings.clone(), connection.status().clone());
            let mut events = connection.events_listener();
            async move {
                while let Some(event) = events.next().await {
                    // A channel's error comes here too; only the connection's ends the intake.
                    if let lapin::Event::Error(e) = event
                        && (connection_status.errored() || connection_status.closed())
                    {
                        endings.broken(format!("the connection failed: {e}"));
                        return;
                    }
                }
            }
        }));
        let forwarded_replies = match self.forwarded_replies_consumer(&publish).await {
            Ok(consumer) => consumer,
            Err(e) => return Ended::Lost(e.to_string()),
        };
        let (publisher, mut renewals) =
            publish::Publisher::renewing(publish, Duration::from_millis(self.amqp.confirm_timeout_ms));
        let reply_queue = self.reply_queue();
        self.link.send_replace(Some(Link {
            publisher: publisher.clone(),
            exchange: self.amqp.agents_exchange.clone(),
            reply_queue: reply_queue.clone(),
            user,
            endings: endings.clone(),
        }));
        let pipeline = Arc::new(Pipeline {
            intake: self.intake.clone(),
            link: self.link_rx.clone(),
            amqp: self.amqp.clone(),
            limits: self.config.nlip.limits(),
            publisher,
            shutdown: shutdown.clone(),
            health: self.health.clone(),
            endings: endings.clone(),
            marks,
            acks: acks.clone(),
            cluster: self.cluster.clone(),
            left: Default::default(),
            reply_rule,
        });
        // Each publishing channel's direct reply-to consumer; only the one of the channel in use
        // ending means the connection is lost.
        let mut reply_consumers = tokio::task::JoinSet::new();
        let follow_replies =
            |tasks: &mut tokio::task::JoinSet<()>, replies: Option<lapin::Consumer>, channel| {
                let Some(replies) = replies else { return };
                let pipeline = pipeline.clone();
                tasks.spawn(async move {
                    pipeline.forwarded_replies(replies).await;
                    if pipeline.publisher.channel().id() == channel {
                        pipeline.endings.broken("the direct reply-to consumer ended");
                    }
                });
            };
        follow_replies(&mut reply_consumers, forwarded_replies, pipeline.publisher.channel().id());
        // Acknowledges what waits above a delivery still in work (see `acks`).
        let _lingering = AbortOnDrop(tokio::spawn({
            let acks = acks.clone();
            let endings = endings.clone();
            async move {
                let mut every = tokio::time::interval(acks::LINGER);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    if let Err(e) = acks.send_lingering().await {
                        endings.broken(format!("an acknowledgement failed: {e}"));
                        return;
                    }
                }
            }
        }));

        let mut deliveries = Deliveries::default();
        // A cluster forwards the inbound queues on a channel of its own.
        let mut tags = Vec::with_capacity(self.amqp.inbound.len() + 1);
        let reply_tag = format!("silpgate-{}-replies", std::process::id());
        match ownership::subscribe(channel, &reply_queue, &reply_tag).await {
            Ok(consumer) => deliveries.push(consumer),
            Err(e) => return Ended::Lost(e.to_string()),
        }
        tags.push(reply_tag);
        let mut answers = tokio::task::JoinSet::new();
        if self.cluster.is_none() {
            for queue in &self.amqp.inbound {
                let tag = format!("silpgate-{}-{queue}", std::process::id());
                match ownership::subscribe(channel, queue, &tag).await {
                    Ok(consumer) => deliveries.push(consumer),
                    Err(e) => return Ended::Lost(e.to_string()),
                }
                tags.push(tag);
            }
        }
        let (taken_over, mut takeovers) = mpsc::unbounded_channel();
        let mut cluster_side = match &self.cluster {
            Some(cluster) => {
                match ClusterSide::start(connection, cluster, pipeline.cluster_wire(), taken_over).await {
                    Ok(side) => Some(side),
                    Err(e) => return Ended::Lost(e.to_string()),
                }
            }
            None => None,
        };

        // Hands a delivery to the worker of its conversation.
        let dispatch = async |senders: &[mpsc::Sender<Job>], parked: Parked, partition| {
            let Parked { queue, envelope, delivery, in_flight } = parked;
            let span = worker::delivery_span(&queue, &envelope, &delivery, broker);
            let decoded = tracing::info_span!(parent: &span, "nlip decode")
                .in_scope(|| envelope.decode(&delivery.data, &pipeline.limits));
            let key = worker::conversation_key(&decoded, &envelope, delivery.delivery_tag);
            let shard = (key % senders.len() as u64) as usize;
            let received = std::time::Instant::now();
            let job = Job { span, received, delivery, queue, envelope, decoded, partition, in_flight };
            senders[shard].send(job).await.is_ok()
        };
        let dispatch_all = async |senders: &[mpsc::Sender<Job>], ready: Vec<Parked>, partition| {
            for parked in ready {
                if !dispatch(senders, parked, partition).await {
                    return false;
                }
            }
            true
        };
        let window = self.amqp.window;
        let window_wait = Duration::from_micros(self.amqp.window_wait_us);
        let (senders, mut workers): (Vec<_>, Vec<_>) = (0..self.amqp.workers)
            .map(|_| {
                // Room for a window in hand and the next one filling.
                let (tx, mut rx) = mpsc::channel::<Job>(2 * window);
                let pipeline = pipeline.clone();
                let worker = tokio::spawn(async move {
                    let mut jobs = Vec::with_capacity(window);
                    while next_window(&mut rx, &mut jobs, window, window_wait).await {
                        pipeline.process_window(std::mem::take(&mut jobs)).await;
                    }
                });
                (tx, worker)
            })
            .unzip();

        // Ready only now: agents can be published to (the link is up) and every queue is
        // consumed from. Saying so at connect time let a door take a message that then found
        // no broker to deliver it through.
        self.health.connected(broker);
        let mut rebalance = tokio::time::interval(REBALANCE_TICK);
        // Held for the connection: a reload's declarations go to the connection that is up.
        let mut declares = self.declares.lock().await;
        // A cluster instance told to stop first hands its partitions on (until this deadline).
        let mut leaving: Option<tokio::time::Instant> = None;
        let ended = 'intake: loop {
            tokio::select! {
                biased;
                Some(why) = ending.recv() => break why.into(),
                Some(refusing) = renewals.recv() => {
                    if pipeline.publisher.channel().id() != refusing {
                        continue;
                    }
                    match tokio::time::timeout(BROKER_GOODBYE, self.publishing_channel(connection)).await {
                        Ok(Ok((fresh, replies))) => {
                            warn!(broker = %broker, refused_on = refusing, channel = fresh.id(), "The broker refused a publish; publishing on a fresh channel (a quorum queue's leader may have moved).");
                            let id = fresh.id();
                            pipeline.publisher.replace(fresh, self.retired_channel_linger());
                            follow_replies(&mut reply_consumers, replies, id);
                        }
                        Ok(Err(e)) => break Ended::Lost(format!("opening a fresh publishing channel failed: {e}")),
                        Err(_) => break Ended::Lost("opening a fresh publishing channel took too long".into()),
                    }
                }
                Some(request) = async { declares.as_mut()?.recv().await } => {
                    self.declare(connection, request).await;
                }
                () = shutdown.stopped(), if leaving.is_none() => {
                    let Some(side) = cluster_side.as_mut() else { break Ended::Shutdown };
                    leaving = Some(tokio::time::Instant::now() + Duration::from_secs(self.amqp.drain_secs));
                    side.leave();
                }
                _ = rebalance.tick(), if cluster_side.is_some() => {
                    let side = cluster_side.as_mut().expect("checked");
                    if side.left() || leaving.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
                        break Ended::Shutdown;
                    }
                    match side.tick(connection, &mut deliveries).await {
                        Ok(ready) => {
                            for (partition, parked) in ready {
                                let handed = tokio::select! {
                                    handed = dispatch_all(&senders, parked, Some(partition)) => handed,
                                    Some(why) = ending.recv() => break 'intake why.into(),
                                };
                                if !handed {
                                    break 'intake Ended::Lost("a worker stopped".into());
                                }
                            }
                        }
                        Err(e) => {
                            if e.lets_go_of_the_connection() {
                                // Now, not after the workers' drain: the next owner serves once
                                // its wait is over, and nothing of this connection may be
                                // acknowledged after that (see `cluster::ownership`).
                                let close = connection.close(200, "a cluster step is overdue".into());
                                let _ = tokio::time::timeout(BROKER_GOODBYE, close).await;
                            }
                            break Ended::Lost(e.to_string());
                        }
                    }
                }
                Some((partition, result)) = takeovers.recv() => {
                    if let Err(e) = result {
                        warn!(partition = partition.index, error = %e, "Taking over a partition failed.");
                        break if e.is_fatal() { Ended::Fatal(e.to_string()) } else { Ended::Lost(e.to_string()) };
                    }
                    let side = cluster_side.as_mut().expect("takeovers are a cluster's");
                    match side.taken_over(partition).await {
                        Ok(ready) => {
                            let handed = tokio::select! {
                                handed = dispatch_all(&senders, ready, Some(partition)) => handed,
                                Some(why) = ending.recv() => break why.into(),
                            };
                            if !handed {
                                break Ended::Lost("a worker stopped".into());
                            }
                        }
                        Err(e) => break Ended::Lost(e.to_string()),
                    }
                }
                // A leaving cluster instance's consumers end one by one; it finishes on the ticks.
                next = deliveries.next(), if !deliveries.is_empty() || leaving.is_none() => match next {
                    Some((queue, Some(Ok(delivery)))) if *queue == *reply_queue => {
                        let pipeline = pipeline.clone();
                        answers.spawn(async move { pipeline.take_answer(delivery, queue).await });
                        while answers.try_join_next().is_some() {}
                    }
                    Some((queue, Some(Ok(delivery)))) => {
                        let metrics = crate::metrics::get();
                        metrics.messages_in.with_label_values(&["amqp", &queue]).inc();
                        metrics.bytes.with_label_values(&["amqp", "in"]).inc_by(delivery.data.len() as u64);
                        let envelope = properties::Envelope::read(&delivery.properties, delivery.redelivered);
                        let parked = Parked { queue, envelope, delivery, in_flight: None };
                        let partition = self.cluster.as_ref().and_then(|c| c.partition_of(&parked.queue));
                        let ready = match (&mut cluster_side, partition) {
                            (Some(side), Some(partition)) => {
                                match side.admit(connection, partition, parked).await {
                                    Ok(ready) => ready,
                                    Err(e) => break Ended::Lost(e.to_string()),
                                }
                            }
                            _ => vec![parked],
                        };
                        // A full worker queue waits here; the connection's end does not.
                        let handed = tokio::select! {
                            handed = dispatch_all(&senders, ready, partition) => handed,
                            Some(why) = ending.recv() => break why.into(),
                        };
                        if !handed {
                            break Ended::Lost("a worker stopped".into());
                        }
                    }
                    Some((_, Some(Err(e)))) => break Ended::Lost(e.to_string()),
                    Some((queue, None)) => {
                        if !cluster_side.as_mut().is_some_and(|side| side.expected_end(&queue)) {
                            break Ended::Lost(format!("the broker cancelled the consumer of {queue}"));
                        }
                    }
                    None if leaving.is_some() => continue,
                    None => break Ended::Lost("no consumer left".into()),
                },
            }
        };

        // Stop intake first; deliveries prefetched but not yet handed out are requeued when the
        // connection closes. A cluster instance has handed its partitions on already (or ran
        // out of time doing so); its waiting consumers go with the connection.
        if matches!(ended, Ended::Shutdown) {
            let own = if self.cluster.is_none() { &tags[..] } else { &tags[..1] };
            for tag in own {
                let cancel = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
                let _ = tokio::time::timeout(BROKER_GOODBYE, cancel).await;
            }
            // What the broker sent before the cancel is taken, in order, rather than handed
            // back: RabbitMQ hands back more than 32 unacknowledged messages in an order of its
            // own, which would break conversations' order at the next start. The consumers
            // end once the broker confirms the cancel; workers finish within the drain below.
            if self.cluster.is_none() {
                let until = tokio::time::Instant::now() + Duration::from_secs(self.amqp.drain_secs);
                while let Ok(Some((queue, next))) = tokio::time::timeout_at(until, deliveries.next()).await {
                    let Some(Ok(delivery)) = next else { continue };
                    if *queue == *reply_queue {
                        let pipeline = pipeline.clone();
                        answers.spawn(async move { pipeline.take_answer(delivery, queue).await });
                        continue;
                    }
                    let envelope = properties::Envelope::read(&delivery.properties, delivery.redelivered);
                    let parked = Parked { queue, envelope, delivery, in_flight: None };
                    if !dispatch_all(&senders, vec![parked], None).await {
                        break;
                    }
                }
            }
        }
        drop(senders);
        drop(deliveries);
        // A lost connection's workers can acknowledge nothing more (the broker has put back
        // every delivery they hold), so they are not waited for beyond a moment: the next
        // connection must not wait for a worker stuck on the dead one.
        let drain = match ended {
            Ended::Lost(_) => LOST_DRAIN,
            _ => Duration::from_secs(self.amqp.drain_secs),
        };
        let all = async {
            futures_util::future::join_all(workers.iter_mut()).await;
            while answers.join_next().await.is_some() {}
        };
        if tokio::time::timeout(drain, all).await.is_err() {
            warn!(
                drain_ms = drain.as_millis() as u64,
                "In-flight messages did not finish in time; the broker will redeliver them."
            );
            for worker in &workers {
                worker.abort();
            }
        }
        answers.abort_all();
        // Whatever settled is acknowledged before the connection goes; the rest is redelivered.
        if let Ok(Err(e)) = tokio::time::timeout(BROKER_GOODBYE, acks.send_all()).await {
            debug!(error = %e, "Last acknowledgements not sent; the broker redelivers them.");
        }
        self.link.send_replace(None);
        if let Some(side) = cluster_side {
            let _ = tokio::time::timeout(BROKER_GOODBYE, side.stop()).await;
        }
        // The channel publishing now is held until the connection is closed (see `close`).
        let publishing = pipeline.publisher.channel();
        // The marks writer ends once the last holder of the pipeline has dropped its sender: the
        // workers, and the direct reply-to consumers, which would hold it until the connection
        // closes (every stop of a cluster instance waited out the writer's whole bound, 5 s).
        reply_consumers.shutdown().await;
        drop(pipeline);
        let _ = tokio::time::timeout(BROKER_GOODBYE, marks_writer).await;
        if let Err(e) = self.store.flush_async().await {
            warn!(error = %e, "Flushing the store failed.");
        }
        self.close(connection).await;
        drop(publishing);
        ended
    }

    /// Lets go of a connection: not ready, no partitions held, and closed, which requeues
    /// every delivery not acknowledged. Again on a closed connection it changes nothing.
    ///
    /// `consume` closes before its tasks and channels are dropped: a channel closes itself when
    /// its last handle goes, and one still closing when the connection closes is reported by
    /// lapin as a connection error, at ERROR, which a routine stop must not log.
    async fn close(&self, connection: &Connection) {
        self.health.disconnected();
        if let Some(cluster) = &self.cluster {
            cluster.release_all();
        }
        goodbye(connection, "silpgate closing").await;
    }
}

impl Client for Amqp {
    type Opened = (Channel, Channel);

    async fn open(&mut self, connection: &Connection) -> lapin::Result<(Channel, Channel)> {
        self.ready(connection).await
    }

    async fn serve(
        &mut self,
        connection: &Connection,
        (consume, publish): (Channel, Channel),
        reached: &Reached,
        shutdown: Shutdown,
    ) -> Ended {
        info!(broker = %reached.node, queues = ?self.amqp.inbound, "Connected to the broker; consuming.");
        if self.config.auth.broker_roles.contains_key(&reached.user) {
            // What silpgate's own user publishes is believed as another instance's word
            // (forwarded principals, reply places): a producer must not have it.
            warn!(user = %reached.user, "silpgate's own broker user is given producer roles ([auth.broker_roles]): producers that share it can pose as a silpgate instance; give silpgate a broker user of its own (docs/security.md).");
        }
        self.consume(connection, &consume, publish, (&reached.node, reached.user.clone()), shutdown).await
    }

    async fn close(&mut self, connection: &Connection) {
        Amqp::close(self, connection).await;
    }
}

/// The queue agents answer an instance on: `amqp.reply_queue`, with the instance's name in a
/// cluster (each instance waits for its own requests' answers).
pub(crate) fn reply_queue(amqp: &AmqpConfig, cluster: Option<&crate::config::ClusterConfig>) -> String {
    match cluster {
        Some(cluster) => format!("{}.{}", amqp.reply_queue, cluster.instance_name()),
        None => amqp.reply_queue.clone(),
    }
}

/// Waits for a worker's next window: the first delivery, whatever else is already queued,
/// and, with a `wait`, what arrives within it, up to `window` deliveries. False once the
/// queue is closed and empty.
async fn next_window(
    rx: &mut mpsc::Receiver<Job>,
    jobs: &mut Vec<Job>,
    window: usize,
    wait: Duration,
) -> bool {
    if rx.recv_many(jobs, window).await == 0 {
        return false;
    }
    if !wait.is_zero() && jobs.len() < window {
        let deadline = tokio::time::Instant::now() + wait;
        while jobs.len() < window {
            let more = window - jobs.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(jobs, more)).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
    }
    true
}
