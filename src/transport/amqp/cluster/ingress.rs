//! Ingress: what producers publish to the inbound queues is forwarded, unchanged, to the
//! consistent-hash exchange with the partition key in the `nlip-conversation` header, so that
//! a conversation always lands in the same partition. Producers that set the header
//! themselves may publish to the exchange directly and skip this hop.
//!
//! The inbound queues have a single active consumer, and one instance forwards in delivery
//! order on one channel, so a conversation keeps its order. Each message is acknowledged once
//! its forwarded copy is confirmed; a failure resets the connection, which requeues every
//! unacknowledged message in order (a copy that did arrive is a duplicate the ledger drops).

use crate::nlip::{Message, NlipError};
use crate::transport::amqp::properties::{self, Envelope};
use super::ClusterError;
use crate::transport::amqp::publish::{Pending, Publication, Publisher};
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};
use tracing::debug;

/// Forwarded messages awaiting their confirm; the prefetch count bounds them anyway.
const IN_FLIGHT: usize = 4096;

/// The partition key of a message: its conversation token; without one, its message id (or
/// body hash), which spreads such messages over the partitions.
pub fn partition_key(decoded: &Result<Message, NlipError>, envelope: &Envelope, body: &[u8]) -> String {
    match (decoded.as_ref().ok().and_then(Message::conversation_token), &envelope.message_id) {
        (Some(token), _) => token.to_owned(),
        (None, Some(id)) => id.clone(),
        (None, None) => properties::content_id(body),
    }
}

/// Forwards inbound deliveries to the partitions, acknowledging them in order.
pub struct Forwarder {
    publisher: Publisher,
    exchange: String,
    confirms: mpsc::Sender<(Pending, Delivery)>,
}

impl Forwarder {
    /// Starts the task that waits for the confirms, in the order the messages went out, and
    /// acknowledges each; at the first failure it tells `broken` and acknowledges nothing more.
    pub fn start(publisher: Publisher, exchange: String, broken: Arc<Notify>) -> Forwarder {
        let (confirms, mut pending) = mpsc::channel::<(Pending, Delivery)>(IN_FLIGHT);
        tokio::spawn(async move {
            while let Some((confirm, delivery)) = pending.recv().await {
                let acked = match confirm.confirmed().await {
                    Ok(()) => delivery.acker.ack(BasicAckOptions { multiple: false }).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = acked {
                    debug!(error = %e, "Forwarding to a partition failed; resetting the connection.");
                    broken.notify_one();
                    return;
                }
            }
        });
        Forwarder { publisher, exchange, confirms }
    }

    /// Sends `delivery`, which arrived on `queue`, on to the partition exchange under `key`.
    ///
    /// # Errors
    /// The channel failed, or the confirm task has stopped; the caller resets the connection.
    pub async fn forward(&self, queue: &str, key: &str, delivery: Delivery) -> Result<(), ClusterError> {
        let publication = Publication {
            exchange: &self.exchange,
            routing_key: "",
            body: delivery.data.clone(),
            properties: properties::partitioned_properties(&delivery.properties, key, queue),
        };
        let pending = self.publisher.send(&publication).await?;
        self.confirms
            .send((pending, delivery))
            .await
            .map_err(|_| ClusterError::Stream("forwarding stopped after a failed confirm".into()))
    }
}
