//! Publishing that is safe by construction: every message is mandatory, and a publish
//! succeeds only when the broker confirms it. A message the broker returns as unroutable is
//! confirmed too (RabbitMQ confirms guide), so a return is a failure here.
//!
//! One exception: a reply to a [direct reply-to](DIRECT_REPLY_TO) address goes to a waiting
//! client's channel, not to a queue, and RabbitMQ returns a mandatory publish to it as
//! unroutable even when it delivers it. It is published without `mandatory`: when the client
//! has gone the reply is worth nothing, and its absence is not a failure to retry.

use lapin::Confirmation;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel};
use std::time::Duration;

/// Why a publish did not make it into a queue.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("unroutable: no queue is bound to exchange '{exchange}' with routing key '{routing_key}'")]
    Unroutable { exchange: String, routing_key: String },
    #[error(
        "refused by the broker (nack) on exchange '{exchange}', routing key '{routing_key}': a target queue may be full"
    )]
    Refused { exchange: String, routing_key: String },
    #[error("not confirmed within {0:?}")]
    Timeout(Duration),
    #[error("channel failed: {0}")]
    Channel(#[from] lapin::Error),
}

impl PublishError {
    /// The error code carried in dead-letter headers and logs.
    pub fn code(&self) -> &'static str {
        match self {
            PublishError::Unroutable { .. } => "unroutable",
            PublishError::Refused { .. } => "publish_refused",
            PublishError::Timeout(_) => "publish_timeout",
            PublishError::Channel(_) => "broker_unavailable",
        }
    }
}

/// RabbitMQ's direct reply-to pseudo-queue: a client consuming it (without acknowledgements,
/// on the channel it publishes requests from) gets replies sent to the address the broker puts
/// in its requests' `reply_to`, which starts with this name, without a queue in between.
pub const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// One message to publish.
pub struct Publication<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

/// A confirm-mode channel.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
    confirm_timeout: Duration,
}

impl Publisher {
    /// `channel` must be in confirm mode (`confirm_select`).
    pub fn new(channel: Channel, confirm_timeout: Duration) -> Self {
        Publisher { channel, confirm_timeout }
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `publications` in order on the one channel (so that their order holds) and
    /// waits until the broker has confirmed every one of them.
    ///
    /// # Errors
    /// The first failure; messages before it may have been delivered (receivers dedupe on
    /// `message_id`).
    pub async fn publish_all(&self, publications: Vec<Publication<'_>>) -> Result<(), PublishError> {
        let mut pending = Vec::with_capacity(publications.len());
        for p in &publications {
            pending.push(self.send(p).await?);
        }
        for confirm in pending {
            confirm.confirmed().await?;
        }
        Ok(())
    }

    /// Hands one message to the broker without waiting for its confirm: messages sent one
    /// after another on this channel keep their order.
    ///
    /// # Errors
    /// The channel failed.
    pub async fn send(&self, p: &Publication<'_>) -> Result<Pending, PublishError> {
        let direct_reply = p.exchange.is_empty() && p.routing_key.starts_with(DIRECT_REPLY_TO);
        let options = BasicPublishOptions { mandatory: !direct_reply, immediate: false };
        let confirm = self
            .channel
            .basic_publish(p.exchange.into(), p.routing_key.into(), options, &p.body, p.properties.clone())
            .await?;
        Ok(Pending {
            confirm,
            timeout: self.confirm_timeout,
            exchange: p.exchange.to_owned(),
            routing_key: p.routing_key.to_owned(),
        })
    }
}

/// A message sent and not yet confirmed.
pub struct Pending {
    confirm: lapin::PublisherConfirm,
    timeout: Duration,
    exchange: String,
    routing_key: String,
}

impl Pending {
    /// Waits for the broker's confirm.
    ///
    /// # Errors
    /// Returned as unroutable, refused (nack), not confirmed in time, or the channel failed.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        let confirmation = tokio::time::timeout(self.timeout, self.confirm)
            .await
            .map_err(|_| PublishError::Timeout(self.timeout))??;
        let Pending { exchange, routing_key, .. } = self;
        match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable { exchange, routing_key }),
            Confirmation::Nack(_) => Err(PublishError::Refused { exchange, routing_key }),
        }
    }
}
