//! The broker topology silpgate declares at start and after every reconnect: durable
//! exchanges, quorum queues for inbound traffic and dead letters, and their bindings; in a
//! cluster also the consistent-hash exchange, the partition queues and the streams.
//! [`Topology::from_config`] is the one description; `declare` carries it out, and
//! [`Topology::definitions`] renders it in RabbitMQ's definitions format, which
//! `deploy/rabbitmq/` holds for operators who pre-declare (a test keeps the two in step).
//! Declaring is idempotent as long as the arguments agree.

use crate::config::{AgentConfig, AmqpConfig, ClusterConfig};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The header the consistent-hash exchange hashes: a message's NLIP conversation.
pub(crate) const CONVERSATION_HEADER: &str = "nlip-conversation";

/// What silpgate needs on the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub exchanges: Vec<Exchange>,
    pub queues: Vec<Queue>,
    /// (queue, exchange, routing key).
    pub bindings: Vec<(String, String, String)>,
}

/// A durable exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub name: String,
    /// `direct`, `fanout` or `x-consistent-hash`.
    pub kind: &'static str,
    pub arguments: Arguments,
}

/// A durable queue (`x-queue-type` is among its arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub name: String,
    pub arguments: Arguments,
}

/// Declaration arguments, by name.
pub(crate) type Arguments = BTreeMap<&'static str, Argument>;

/// One argument value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Argument {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl Argument {
    fn amqp(&self) -> AMQPValue {
        match self {
            Argument::Text(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
            // RabbitMQ compares a redeclared queue's arguments with their types: a number
            // goes as the narrowest type that holds it, as the management tools send it.
            Argument::Int(i) => i32::try_from(*i).map_or(AMQPValue::LongLongInt(*i), AMQPValue::LongInt),
            Argument::Bool(b) => AMQPValue::Boolean(*b),
        }
    }

    fn json(&self) -> Value {
        match self {
            Argument::Text(s) => json!(s),
            Argument::Int(i) => json!(i),
            Argument::Bool(b) => json!(b),
        }
    }
}

fn text(s: &str) -> Argument {
    Argument::Text(s.to_owned())
}

fn quorum(name: &str, amqp: &AmqpConfig) -> Queue {
    Queue::quorum(name, amqp.quorum_initial_group_size)
}

impl Queue {
    /// A quorum queue, over `initial_group_size` nodes when it is set (else all of them).
    pub(crate) fn quorum(name: &str, initial_group_size: Option<u32>) -> Queue {
        let mut arguments = Arguments::from([("x-queue-type", text("quorum"))]);
        if let Some(size) = initial_group_size {
            arguments.insert("x-quorum-initial-group-size", Argument::Int(size.into()));
        }
        Queue { name: name.to_owned(), arguments }
    }

    /// A classic queue: it lives on one node.
    pub(crate) fn classic(name: &str) -> Queue {
        Queue { name: name.to_owned(), arguments: Arguments::from([("x-queue-type", text("classic"))]) }
    }

    /// This queue with one more argument.
    pub(crate) fn with(mut self, name: &'static str, value: Argument) -> Queue {
        self.arguments.insert(name, value);
        self
    }

    /// Declares this queue alone, durable, with its arguments as `declare` sends them for the
    /// whole topology.
    ///
    /// # Errors
    /// The broker's refusal, e.g. the queue exists with other arguments.
    pub(crate) async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        channel.queue_declare(self.name.as_str().into(), options, table(&self.arguments)).await.map(drop)
    }
}

/// The A2A door's push queue: a quorum queue with a single active consumer (one lane order
/// for the whole cluster), dead-lettering to silpgate's dead-letter exchange.
fn push_queue(name: &str, amqp: &AmqpConfig) -> Queue {
    let mut queue = quorum(name, amqp);
    queue.arguments.insert("x-single-active-consumer", Argument::Bool(true));
    queue.arguments.insert("x-dead-letter-exchange", text(&amqp.dead_letter_exchange));
    queue
}

impl Topology {
    pub fn from_config(
        amqp: &AmqpConfig,
        cluster: Option<&ClusterConfig>,
        agents: &[AgentConfig],
    ) -> Topology {
        // The broker's own dead-lettering is the safety net behind silpgate's: a message that
        // keeps failing its delivery (e.g. crashes every consumer) ends in the DLX too.
        let inbound = |name: &str| {
            let mut queue = quorum(name, amqp);
            queue.arguments.insert("x-dead-letter-exchange", text(&amqp.dead_letter_exchange));
            queue.arguments.insert("x-delivery-limit", Argument::Int(amqp.delivery_limit.into()));
            if cluster.is_some() {
                // One instance at a time reads a partition, or forwards from an inbound queue
                // (so that a conversation's order survives forwarding).
                queue.arguments.insert("x-single-active-consumer", Argument::Bool(true));
            }
            queue
        };
        let exchange =
            |name: &str, kind| Exchange { name: name.to_owned(), kind, arguments: Arguments::new() };
        let mut exchanges = vec![
            exchange(&amqp.inbound_exchange, "direct"),
            exchange(&amqp.agents_exchange, "direct"),
            exchange(&amqp.dead_letter_exchange, "fanout"),
        ];
        let mut queues = vec![quorum(&amqp.dead_letter_queue, amqp)];
        let mut bindings =
            vec![(amqp.dead_letter_queue.clone(), amqp.dead_letter_exchange.clone(), String::new())];
        for queue in &amqp.inbound {
            queues.push(inbound(queue));
            bindings.push((queue.clone(), amqp.inbound_exchange.clone(), queue.clone()));
        }
        if let Some(cluster) = cluster {
            exchanges.push(Exchange {
                name: cluster.exchange.clone(),
                kind: "x-consistent-hash",
                arguments: Arguments::from([("hash-header", text(CONVERSATION_HEADER))]),
            });
            let stream = |name: String, max_bytes: u64| {
                let mut arguments = Arguments::from([
                    ("x-queue-type", text("stream")),
                    ("x-max-length-bytes", Argument::Int(max_bytes.try_into().unwrap_or(i64::MAX))),
                ]);
                if let Some(size) = amqp.stream_initial_cluster_size {
                    arguments.insert("x-initial-cluster-size", Argument::Int(size.into()));
                }
                Queue { name, arguments }
            };
            for index in 0..cluster.partitions {
                let queue = cluster.partition_queue(index);
                queues.push(inbound(&queue));
                // Equal weights: every partition takes an equal share of the hash ring.
                bindings.push((queue, cluster.exchange.clone(), "1".to_owned()));
                queues.push(stream(cluster.changelog_stream(index), cluster.changelog_max_bytes));
            }
            queues.push(stream(cluster.lock_stream.clone(), cluster.changelog_max_bytes));
            // The members' heartbeats; each instance binds an exclusive queue of its own.
            exchanges.push(Exchange {
                name: cluster.members_exchange(),
                kind: "fanout",
                arguments: Arguments::new(),
            });
        }
        for agent in agents {
            if let crate::config::Reach::Amqp(reach) = &agent.reach
                && let Some(queue) = &reach.queue
            {
                queues.push(quorum(queue, amqp));
                bindings.push((
                    queue.clone(),
                    amqp.agents_exchange.clone(),
                    reach.routing_key(&agent.name).to_owned(),
                ));
            }
        }
        Topology { exchanges, queues, bindings }
    }

    /// With the A2A door's push queue (`a2a.push_queue`, when push notifications are offered):
    /// [`push_queue`]. Its notifications dead-letter to silpgate's dead-letter exchange.
    #[must_use]
    pub fn with_push_queue(mut self, name: &str, amqp: &AmqpConfig) -> Topology {
        self.queues.push(push_queue(name, amqp));
        self
    }

    /// Only what the A2A door's push courier declares for itself, on its own connection: the
    /// dead-letter exchange (in case it comes before the AMQP door) and the push queue.
    pub(crate) fn push_courier(name: &str, amqp: &AmqpConfig) -> Topology {
        let dead_letters =
            Exchange { name: amqp.dead_letter_exchange.clone(), kind: "fanout", arguments: Arguments::new() };
        Topology { exchanges: vec![dead_letters], queues: vec![push_queue(name, amqp)], bindings: Vec::new() }
    }

    /// The names of the quorum queues, for a warning about their majority.
    pub(crate) fn quorum_queues(&self) -> Vec<String> {
        self.queues
            .iter()
            .filter(|q| matches!(q.arguments.get("x-queue-type"), Some(Argument::Text(t)) if t == "quorum"))
            .map(|q| q.name.clone())
            .collect()
    }

    /// Declares every exchange, queue and binding.
    ///
    /// # Errors
    /// The broker's refusal, e.g. a queue that exists with other arguments
    /// (`PRECONDITION_FAILED`), or an exchange type whose plugin is not enabled.
    pub(crate) async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
        for x in &self.exchanges {
            let kind = match x.kind {
                "fanout" => ExchangeKind::Fanout,
                "direct" => ExchangeKind::Direct,
                other => ExchangeKind::Custom(other.to_owned()),
            };
            channel.exchange_declare(x.name.as_str().into(), kind, durable, table(&x.arguments)).await?;
        }
        for queue in &self.queues {
            queue.declare(channel).await?;
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

    /// The exchanges, queues and bindings in RabbitMQ's definitions format, in `vhost` (the
    /// one silpgate's broker URI names).
    pub fn definitions(&self, vhost: &str) -> Value {
        let arguments =
            |args: &Arguments| Value::Object(args.iter().map(|(k, v)| ((*k).to_owned(), v.json())).collect());
        json!({
            "exchanges": self.exchanges.iter().map(|x| json!({
                "name": x.name, "vhost": vhost, "type": x.kind, "durable": true,
                "auto_delete": false, "internal": false, "arguments": arguments(&x.arguments),
            })).collect::<Vec<_>>(),
            "queues": self.queues.iter().map(|q| json!({
                "name": q.name, "vhost": vhost, "durable": true, "auto_delete": false,
                "arguments": arguments(&q.arguments),
            })).collect::<Vec<_>>(),
            "bindings": self.bindings.iter().map(|(queue, exchange, key)| json!({
                "source": exchange, "vhost": vhost, "destination": queue, "destination_type": "queue",
                "routing_key": key, "arguments": {},
            })).collect::<Vec<_>>(),
        })
    }
}

fn table(arguments: &Arguments) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in arguments {
        table.insert((*name).into(), value.amqp());
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The push queue is declared by the courier and listed in the definitions with the
    /// same arguments, so that a broker user set up from definitions.json needs no configure
    /// rights for push notifications.
    #[test]
    fn the_push_queue_is_in_the_definitions_as_the_courier_declares_it() {
        let amqp = AmqpConfig { quorum_initial_group_size: Some(3), ..AmqpConfig::default() };
        let listed = Topology::from_config(&amqp, None, &[]).with_push_queue("silpgate.a2a.push", &amqp);
        let courier = Topology::push_courier("silpgate.a2a.push", &amqp);
        let queue = listed.queues.iter().find(|q| q.name == "silpgate.a2a.push").expect("listed");
        assert_eq!(Some(queue), courier.queues.first());
        let definitions = listed.definitions("/");
        let defined = definitions["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == "silpgate.a2a.push")
            .expect("in the definitions");
        assert_eq!(
            defined["arguments"],
            json!({"x-queue-type": "quorum", "x-single-active-consumer": true,
                   "x-dead-letter-exchange": amqp.dead_letter_exchange, "x-quorum-initial-group-size": 3})
        );
        assert!(listed.quorum_queues().contains(&"silpgate.a2a.push".to_owned()));
    }
}
