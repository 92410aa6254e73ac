//! The broker topology silpgate declares at start and after every reconnect: durable
//! exchanges, quorum queues for inbound traffic and dead letters, and their bindings.
//! `deploy/rabbitmq/definitions.json` holds the same topology for operators who pre-declare;
//! declaring is idempotent as long as the arguments agree.

use crate::config::{AgentConfig, AmqpConfig};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

/// Declares every exchange, queue and binding the configuration names.
///
/// # Errors
/// The broker's refusal, e.g. a queue that exists with other arguments (`PRECONDITION_FAILED`).
pub async fn declare(channel: &Channel, amqp: &AmqpConfig, agents: &[AgentConfig]) -> lapin::Result<()> {
    let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
    for (name, kind) in [
        (&amqp.inbound_exchange, ExchangeKind::Direct),
        (&amqp.agents_exchange, ExchangeKind::Direct),
        (&amqp.dead_letter_exchange, ExchangeKind::Fanout),
    ] {
        channel.exchange_declare(name.as_str().into(), kind, durable, FieldTable::default()).await?;
    }

    declare_quorum(channel, &amqp.dead_letter_queue, FieldTable::default()).await?;
    bind(channel, &amqp.dead_letter_queue, &amqp.dead_letter_exchange, "").await?;

    for queue in &amqp.inbound {
        let mut arguments = FieldTable::default();
        // The broker's own dead-lettering is the safety net behind silpgate's: a message that
        // keeps failing its delivery (e.g. crashes every consumer) ends in the DLX too.
        arguments.insert("x-dead-letter-exchange".into(), text(&amqp.dead_letter_exchange));
        arguments.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(amqp.delivery_limit.try_into().unwrap_or(i32::MAX)),
        );
        declare_quorum(channel, queue, arguments).await?;
        bind(channel, queue, &amqp.inbound_exchange, queue).await?;
    }
    for agent in agents {
        if let Some(queue) = &agent.queue {
            declare_quorum(channel, queue, FieldTable::default()).await?;
            bind(channel, queue, &amqp.agents_exchange, agent.routing_key()).await?;
        }
    }
    Ok(())
}

async fn declare_quorum(channel: &Channel, queue: &str, mut arguments: FieldTable) -> lapin::Result<()> {
    arguments.insert("x-queue-type".into(), text("quorum"));
    let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.into(), options, arguments).await.map(drop)
}

async fn bind(channel: &Channel, queue: &str, exchange: &str, routing_key: &str) -> lapin::Result<()> {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}
