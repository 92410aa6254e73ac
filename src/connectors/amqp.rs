//! Agents on AMQP: a parcel is published to the agents exchange with the agent's routing key,
//! persistent and mandatory, and is delivered once the broker confirms it. The agent answers
//! to silpgate's reply queue with the parcel's `correlation_id`, an unguessable token drawn for
//! the wait (or, on a route with `replies = "direct"`, to the sender's own addresses).
//!
//! The connection belongs to the AMQP side, which reconnects on its own; this connector sees
//! it through a [`BrokerLink`] and reports an unavailable broker as transient.

use super::{AnswerTo, Connector, Delivered, DeliveryError, Parcel};
use crate::broker::link::BrokerLink;
use crate::broker::properties;
use crate::broker::publish::{Publication, PublishError};
use crate::code::Code;
use crate::config::AmqpReach;
use crate::nlip::{self, Encoding};
use futures_util::future::BoxFuture;
use tracing::Instrument;

/// One agent reached over AMQP.
pub(crate) struct AmqpAgent {
    name: String,
    routing_key: String,
    encoding: Encoding,
    broker: Option<BrokerLink>,
}

impl AmqpAgent {
    pub(crate) fn new(name: &str, reach: &AmqpReach, broker: Option<BrokerLink>) -> Self {
        AmqpAgent {
            name: name.to_owned(),
            routing_key: reach.routing_key(name).to_owned(),
            encoding: reach.content_type.nlip(),
            broker,
        }
    }

    fn unavailable(&self, code: &'static str, detail: String) -> DeliveryError {
        DeliveryError::Unavailable { agent: self.name.clone(), code, detail }
    }

    async fn publish(&self, parcels: Vec<Parcel>) -> Result<Delivered, DeliveryError> {
        let Some(broker) = &self.broker else {
            return Err(self.unavailable(
                "unavailable",
                "it is reached over AMQP and no [amqp] section is configured".into(),
            ));
        };
        let Some(link) = broker.current() else {
            return Err(
                self.unavailable(Code::BrokerUnavailable.as_str(), "the broker is not connected".into())
            );
        };
        let span = tracing::info_span!(
            "agent deliver",
            otel.name = %format!("publish {}", link.exchange),
            otel.kind = "producer",
            messaging.system = "rabbitmq",
            messaging.operation.type = "publish",
            messaging.destination.name = %link.exchange,
            messaging.rabbitmq.destination.routing_key = %self.routing_key,
            messaging.batch.message_count = parcels.len(),
            silpgate.agent = %self.name,
        );
        let publications: Vec<Publication<'_>> = parcels
            .iter()
            .map(|parcel| {
                let mut properties = parcel_properties(parcel, self.encoding, &link.reply_queue);
                let mut headers = properties.headers().clone().unwrap_or_default();
                crate::telemetry::inject(&span, &mut headers);
                properties = properties.with_headers(headers);
                Publication {
                    exchange: &link.exchange,
                    routing_key: &self.routing_key,
                    body: nlip::encode(&parcel.envelope, self.encoding),
                    properties,
                }
            })
            .collect();
        let published = link.publisher.publish_all(publications).instrument(span).await;
        published.map(|()| Delivered::default()).map_err(|error| {
            if matches!(error, PublishError::Channel(_)) {
                link.endings.broken(&error);
            }
            self.unavailable(error.code(), error.to_string())
        })
    }
}

impl Connector for AmqpAgent {
    fn transport(&self) -> crate::transport::Transport {
        crate::transport::Transport::Amqp
    }

    fn answers_in_call(&self) -> bool {
        false
    }

    fn deliver(&self, parcels: Vec<Parcel>) -> BoxFuture<'_, Result<Delivered, DeliveryError>> {
        Box::pin(self.publish(parcels))
    }
}

/// A parcel's AMQP properties: where and how its answer is to come back.
fn parcel_properties(parcel: &Parcel, encoding: Encoding, reply_queue: &str) -> lapin::BasicProperties {
    let (reply_to, correlation_id, replies) = match &parcel.answer_to {
        AnswerTo::Gateway { correlation_id } => (Some(reply_queue), Some(correlation_id.as_str()), &[][..]),
        AnswerTo::Direct { reply_to, replies, correlation_id } => {
            (reply_to.as_deref(), correlation_id.as_deref(), replies.as_slice())
        }
        AnswerTo::Caller | AnswerTo::Nobody => (None, None, &[][..]),
    };
    properties::published(properties::Published {
        encoding,
        message_id: &parcel.message_id,
        correlation_id,
        reply_to,
        replies,
        user_id: parcel.user_id.as_deref(),
    })
}
