//! The broker topology silpgate declares at start and after every reconnect: durable
//! exchanges, quorum queues for inbound traffic and dead letters, and their bindings.
//! [`Topology::from_config`] is the one description; `declare` carries it out, and
//! `deploy/rabbitmq/definitions.json` holds the same for operators who pre-declare (a test
//! keeps the two in step). Declaring is idempotent as long as the arguments agree.

use crate::config::{AgentConfig, AmqpConfig};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

/// What silpgate needs on the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// (name, `direct` or `fanout`); all durable.
    pub exchanges: Vec<(String, &'static str)>,
    /// Quorum queues with their extra arguments.
    pub queues: Vec<Queue>,
    /// (queue, exchange, routing key).
    pub bindings: Vec<(String, String, String)>,
}

/// A durable quorum queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub name: String,
    /// `x-dead-letter-exchange`, for inbound queues.
    pub dead_letter_exchange: Option<String>,
    /// `x-delivery-limit`, for inbound queues.
    pub delivery_limit: Option<u32>,
}

impl Topology {
    pub fn from_config(amqp: &AmqpConfig, agents: &[AgentConfig]) -> Topology {
        let plain =
            |name: &str| Queue { name: name.to_owned(), dead_letter_exchange: None, delivery_limit: None };
        let mut queues = vec![plain(&amqp.dead_letter_queue)];
        let mut bindings =
            vec![(amqp.dead_letter_queue.clone(), amqp.dead_letter_exchange.clone(), String::new())];
        for queue in &amqp.inbound {
            // The broker's own dead-lettering is the safety net behind silpgate's: a message
            // that keeps failing its delivery (e.g. crashes every consumer) ends in the DLX too.
            queues.push(Queue {
                name: queue.clone(),
                dead_letter_exchange: Some(amqp.dead_letter_exchange.clone()),
                delivery_limit: Some(amqp.delivery_limit),
            });
            bindings.push((queue.clone(), amqp.inbound_exchange.clone(), queue.clone()));
        }
        for agent in agents {
            if let Some(queue) = &agent.queue {
                queues.push(plain(queue));
                bindings.push((queue.clone(), amqp.agents_exchange.clone(), agent.routing_key().to_owned()));
            }
        }
        Topology {
            exchanges: vec![
                (amqp.inbound_exchange.clone(), "direct"),
                (amqp.agents_exchange.clone(), "direct"),
                (amqp.dead_letter_exchange.clone(), "fanout"),
            ],
            queues,
            bindings,
        }
    }

    /// Declares every exchange, queue and binding.
    ///
    /// # Errors
    /// The broker's refusal, e.g. a queue that exists with other arguments
    /// (`PRECONDITION_FAILED`).
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
        for (name, kind) in &self.exchanges {
            let kind = if *kind == "fanout" { ExchangeKind::Fanout } else { ExchangeKind::Direct };
            channel.exchange_declare(name.as_str().into(), kind, durable, FieldTable::default()).await?;
        }
        for queue in &self.queues {
            let mut arguments = FieldTable::default();
            arguments.insert("x-queue-type".into(), text("quorum"));
            if let Some(dlx) = &queue.dead_letter_exchange {
                arguments.insert("x-dead-letter-exchange".into(), text(dlx));
            }
            if let Some(limit) = queue.delivery_limit {
                arguments.insert(
                    "x-delivery-limit".into(),
                    AMQPValue::LongInt(limit.try_into().unwrap_or(i32::MAX)),
                );
            }
            let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
            channel.queue_declare(queue.name.as_str().into(), options, arguments).await?;
        }
        for (queue, exchange, routing_key) in &self.bindings {
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}
