//! Ingress: what producers publish to the inbound queues is forwarded, unchanged, to the
//! consistent-hash exchange with the partition key in the `nlip-conversation` header, so that
//! a conversation always lands in the same partition. Producers that set the header
//! themselves may publish to the exchange directly and skip this hop.
//!
//! The inbound queues have a single active consumer, and one task forwards in delivery order
//! on one channel, so a conversation keeps its order. A message is acknowledged once its
//! forwarded copy is confirmed; a failure resets the connection, which requeues every
//! unacknowledged message (a copy that did arrive is a duplicate the ledger drops).
//!
//! Leaving without breaking the order: RabbitMQ makes the next consumer active as soon as this
//! one cancels, so everything delivered here must be forwarded first. The task stops
//! acknowledging (the broker then stops sending once the prefetch is used up), forwards what
//! it has, and cancels only after a quiet moment; then it acknowledges and is done.

use super::ClusterError;
use super::Wire;
use super::ownership::{self, Deliveries};
use crate::broker::properties::{self, Envelope};
use crate::broker::publish::{Pending, Publication};
use crate::nlip::{Message, NlipError};
use futures_util::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicQosOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

/// Inbound deliveries held unacknowledged at most: forwarded and awaiting their confirm.
const PREFETCH: u16 = 256;
/// No delivery for this long while acknowledgements are held: the broker has nothing more on
/// its way here, and cancelling is safe.
const QUIET: Duration = Duration::from_millis(200);

/// The partition key of a message: its conversation token; without one, its message id (or
/// body hash), which spreads such messages over the partitions.
pub(crate) fn partition_key(
    decoded: &Result<Message, NlipError>,
    envelope: &Envelope,
    body: &[u8],
) -> String {
    match (decoded.as_ref().ok().and_then(Message::conversation_token), &envelope.message_id) {
        (Some(token), _) => token.to_owned(),
        (None, Some(id)) => id.clone(),
        (None, None) => properties::content_id(body),
    }
}

/// The forwarding task of one connection.
pub(crate) struct Ingress {
    task: JoinHandle<()>,
    leave: watch::Sender<bool>,
    left: watch::Receiver<bool>,
}

impl Ingress {
    /// Subscribes to the inbound `queues` on `channel` and forwards them to `exchange`.
    ///
    /// # Errors
    /// The broker refused the subscription.
    pub(crate) async fn start(
        channel: Channel,
        queues: &[String],
        exchange: String,
        instance: &str,
        wire: Wire,
    ) -> lapin::Result<Ingress> {
        channel.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
        let mut deliveries = Deliveries::default();
        let mut tags = Vec::with_capacity(queues.len());
        for queue in queues {
            let tag = format!("silpgate-{instance}-{queue}");
            deliveries.push(ownership::subscribe(&channel, queue, &tag).await?);
            tags.push(tag);
        }
        let (leave, leaving) = watch::channel(false);
        let (done, left) = watch::channel(false);
        let forwarding = Forwarding { channel, tags, exchange, wire };
        let task = tokio::spawn(async move {
            if let Err(e) = forwarding.run(deliveries, leaving).await {
                debug!(error = %e, "Forwarding to the partitions failed; resetting the connection.");
                forwarding.wire.endings.broken(&e);
                return;
            }
            let _ = done.send(true);
        });
        Ok(Ingress { task, leave, left })
    }

    /// Stops forwarding, without breaking the order (see the module's notes).
    pub(crate) fn leave(&self) {
        let _ = self.leave.send(true);
    }

    /// Whether forwarding has stopped after [`Ingress::leave`].
    pub(crate) fn left(&self) -> bool {
        *self.left.borrow()
    }

    pub(crate) async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

struct Forwarding {
    channel: Channel,
    tags: Vec<String>,
    exchange: String,
    wire: Wire,
}

impl Forwarding {
    async fn run(
        &self,
        mut deliveries: Deliveries,
        mut leaving: watch::Receiver<bool>,
    ) -> Result<(), ClusterError> {
        let (confirms, pending) = mpsc::channel::<(Pending, Delivery)>(usize::from(PREFETCH));
        let (hold, held) = watch::channel(false);
        let unconfirmed = Arc::new(AtomicUsize::new(0));
        let acker = tokio::spawn(acknowledge(pending, held, unconfirmed.clone()));
        let mut quiet_since: Option<Instant> = None;
        let mut cancelled = false;
        let mut ended = 0;
        let outcome = loop {
            let quiet = quiet_since.map(|at| at + QUIET);
            tokio::select! {
                changed = leaving.changed(), if quiet_since.is_none() && !cancelled => {
                    if changed.is_err() || *leaving.borrow() {
                        let _ = hold.send(true);
                        quiet_since = Some(Instant::now());
                    }
                }
                () = sleep_until(quiet), if quiet.is_some() && !cancelled => {
                    if unconfirmed.load(Ordering::Acquire) > 0 {
                        // Not before every copy is in its partition.
                        quiet_since = Some(Instant::now());
                        continue;
                    }
                    for tag in &self.tags {
                        self.channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()).await?;
                    }
                    cancelled = true;
                }
                next = deliveries.next() => match next {
                    Some((queue, Some(Ok(delivery)))) => {
                        if quiet_since.is_some() {
                            quiet_since = Some(Instant::now());
                        }
                        unconfirmed.fetch_add(1, Ordering::AcqRel);
                        let pending = self.forward(&queue, &delivery).await?;
                        if confirms.send((pending, delivery)).await.is_err() {
                            break Err(ClusterError::Stream("forwarding stopped after a failed confirm".into()));
                        }
                    }
                    Some((_, Some(Err(e)))) => break Err(e.into()),
                    Some((queue, None)) if cancelled => {
                        debug!(queue = %queue, "Stopped forwarding.");
                        ended += 1;
                        if ended == self.tags.len() {
                            break Ok(());
                        }
                    }
                    Some((queue, None)) => {
                        break Err(ClusterError::Stream(format!("the broker cancelled the consumer of {queue}")));
                    }
                    None => break Ok(()),
                },
            }
        };
        drop(confirms);
        let held = acker.await.map_err(|e| ClusterError::Stream(e.to_string()))??;
        outcome?;
        for delivery in held {
            delivery.acker.ack(BasicAckOptions { multiple: false }).await?;
        }
        Ok(())
    }

    /// Sends one delivery on to the partition exchange.
    async fn forward(&self, queue: &str, delivery: &Delivery) -> Result<Pending, ClusterError> {
        let envelope = Envelope::read(&delivery.properties, delivery.redelivered);
        let decoded = envelope.decode(&delivery.data, &self.wire.limits);
        let key = partition_key(&decoded, &envelope, &delivery.data);
        debug!(
            message_id = envelope.message_id.as_deref().unwrap_or("-"),
            key = %key,
            redelivered = delivery.redelivered,
            "Forwarding to its partition."
        );
        // Published as silpgate's own broker user: the owner believes the sender it carries.
        let own_user = self.wire.link.current().map(|link| link.user).unwrap_or_default();
        let publication = Publication {
            exchange: &self.exchange,
            routing_key: "",
            body: delivery.data.clone(),
            properties: properties::partitioned_properties(&delivery.properties, &key, queue, &own_user),
        };
        Ok(self.wire.publisher.send(publication)?)
    }
}

/// Waits for the confirms in the order the messages went out and acknowledges each, or, once
/// `hold` says so, keeps them unacknowledged; returns those kept.
async fn acknowledge(
    mut pending: mpsc::Receiver<(Pending, Delivery)>,
    hold: watch::Receiver<bool>,
    unconfirmed: Arc<AtomicUsize>,
) -> Result<Vec<Delivery>, ClusterError> {
    let mut held = Vec::new();
    while let Some((confirm, delivery)) = pending.recv().await {
        confirm.confirmed().await?;
        unconfirmed.fetch_sub(1, Ordering::AcqRel);
        if *hold.borrow() {
            held.push(delivery);
        } else {
            delivery.acker.ack(BasicAckOptions { multiple: false }).await?;
        }
    }
    Ok(held)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
