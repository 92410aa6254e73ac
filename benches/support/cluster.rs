//! silpgate instances in cluster mode on the local RabbitMQ, as the cluster benchmarks run
//! them: release binaries, 16 partitions, each instance with its own sled store and HTTP port,
//! one sink agent downstream. Instances can be stopped (SIGTERM or SIGKILL) and started again
//! on the same store, the way an orchestrator restarts a pod.
#![allow(dead_code)] // each benchmark uses its part

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const PARTITIONS: u16 = 16;

/// One instance: its name, config file, HTTP port and process while it runs.
pub struct Instance {
    pub name: String,
    config: PathBuf,
    pub http: u16,
    child: Option<Child>,
}

/// silpgate instances sharing one topology.
pub struct Cluster {
    pub prefix: String,
    pub instances: Vec<Instance>,
    dir: PathBuf,
    connection: Connection,
    channel: Channel,
}

impl Cluster {
    /// Starts `count` instances and waits until every one is heard as a member.
    pub async fn start(prefix: &str, count: usize) -> Cluster {
        let dir = std::env::temp_dir().join(prefix);
        std::fs::create_dir_all(&dir).unwrap();
        let instances = (0..count)
            .map(|i| {
                let name = format!("n{i}");
                let config = dir.join(format!("{name}.toml"));
                let http = free_port();
                std::fs::write(&config, config_text(prefix, &dir.join(&name), &name, http)).unwrap();
                Instance { name, config, http, child: None }
            })
            .collect();
        let connection = Connection::connect(BROKER, ConnectionProperties::default())
            .await
            .expect("RabbitMQ at 127.0.0.1:5672 (start it with `rabbitmq-server -detached`)");
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let mut cluster = Cluster { prefix: prefix.to_owned(), instances, dir, connection, channel };
        for index in 0..count {
            cluster.spawn(index);
        }
        cluster.wait_members(count).await;
        cluster
    }

    /// Starts instance `index` (again), on its store.
    pub fn spawn(&mut self, index: usize) {
        let instance = &mut self.instances[index];
        // SILPGATE_BENCH_BIN runs another build (an earlier one, for a before/after).
        let binary =
            std::env::var("SILPGATE_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_silpgate").to_owned());
        let child = Command::new(binary)
            .args(["run", "--config"])
            .arg(&instance.config)
            .env("SILPGATE_LOG", std::env::var("SILPGATE_BENCH_LOG").unwrap_or_else(|_| "error".into()))
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("SILPGATE_BENCH_LOG") {
                Some(_) => Stdio::inherit(),
                None => Stdio::null(),
            })
            .spawn()
            .expect("silpgate starts");
        instance.child = Some(child);
    }

    /// SIGTERMs instance `index` and waits for it to exit; returns how long that took.
    pub async fn terminate(&mut self, index: usize) -> Duration {
        let began = Instant::now();
        let mut child = self.instances[index].child.take().expect("the instance runs");
        signal(&child, "-TERM");
        wait_exit(&mut child, &self.instances[index].name).await;
        began.elapsed()
    }

    /// SIGKILLs instance `index`.
    pub fn kill(&mut self, index: usize) {
        let mut child = self.instances[index].child.take().expect("the instance runs");
        signal(&child, "-KILL");
        let _ = child.wait();
    }

    /// Waits until instance `index` answers `/readyz` with 200; returns how long that took.
    pub async fn ready(&self, index: usize) -> Duration {
        let began = Instant::now();
        let port = self.instances[index].http;
        while readyz(port).await != Some(200) {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "instance {index} not ready within 2 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        began.elapsed()
    }

    /// The user + system CPU time the running instances have used so far, summed.
    pub fn cpu(&self) -> Duration {
        self.instances
            .iter()
            .filter_map(|i| i.child.as_ref())
            .map(|child| super::cpu::cpu_time(child.id()))
            .sum()
    }

    /// Listens to the members' heartbeats (the fanout exchange `<prefix>.p.members`, declared
    /// here as the instances declare it) until `count` instances have been heard.
    async fn wait_members(&self, count: usize) {
        let channel = self.connection.create_channel().await.unwrap();
        let exchange = format!("{}.p.members", self.prefix);
        let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
        channel
            .exchange_declare(exchange.as_str().into(), ExchangeKind::Fanout, durable, FieldTable::default())
            .await
            .unwrap();
        let (_, mut heartbeats) = silpgate::cluster::membership::listen(&channel, &exchange).await.unwrap();
        let mut heard = std::collections::BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while heard.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(Ok(delivery))) = tokio::time::timeout(left, heartbeats.next()).await else {
                panic!("the instances did not all join: heard {heard:?}");
            };
            let heartbeat: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
            heard.insert(heartbeat["instance"].as_str().unwrap_or_default().to_owned());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), channel.close(200, "joined".into())).await;
    }

    /// Publishes envelopes `range` straight to the partition exchange, with confirms.
    pub async fn publish(&self, range: std::ops::Range<usize>, conversations: usize) {
        let mut confirms = Vec::with_capacity(range.len());
        for i in range {
            confirms.push(self.send(i, conversations).await);
            if confirms.len() == 1000 {
                for c in confirms.drain(..) {
                    c.await.unwrap();
                }
            }
        }
        for c in confirms {
            c.await.unwrap();
        }
    }

    /// Publishes envelope `i` of conversation `conv-{i % conversations}`.
    pub async fn send(&self, i: usize, conversations: usize) -> lapin::PublisherConfirm {
        send(&self.channel, &self.prefix, i, conversations).await
    }

    /// Arrival time downstream of every envelope in `range` (first copy).
    pub async fn arrivals(&self, range: std::ops::Range<usize>) -> HashMap<usize, Instant> {
        arrivals(&self.connection, &self.prefix, range).await
    }

    /// Stops every instance (SIGTERM) and deletes the topology and the stores.
    pub async fn stop(mut self) {
        for index in 0..self.instances.len() {
            if let Some(child) = &self.instances[index].child {
                signal(child, "-TERM");
            }
        }
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                wait_exit(&mut child, &instance.name).await;
            }
        }
        let channel = self.connection.create_channel().await.unwrap();
        let p = &self.prefix;
        let mut queues =
            vec![format!("{p}.in"), format!("{p}.sink"), format!("{p}.dead"), format!("{p}.lock")];
        for i in 0..PARTITIONS {
            queues.push(format!("{p}.p.{i:02}"));
            queues.push(format!("{p}.log.{i:02}"));
        }
        for q in queues {
            let _ = channel.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
        }
        for x in ["in-x", "agents", "dlx", "parts", "p.members"] {
            let _ = channel.exchange_delete(format!("{p}.{x}").as_str().into(), Default::default()).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.connection.close(200, "done".into())).await;
    }
}

/// A connection of its own to the broker, for a task that publishes or reads beside the rest.
pub async fn connect() -> (Connection, Channel) {
    let connection = Connection::connect(BROKER, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    (connection, channel)
}

/// Publishes envelope `i` of conversation `conv-{i % conversations}` to the partition exchange
/// of the cluster `prefix` on `channel` (in confirm mode).
pub async fn send(
    channel: &Channel,
    prefix: &str,
    i: usize,
    conversations: usize,
) -> lapin::PublisherConfirm {
    let conversation = format!("conv-{}", i % conversations);
    let mut headers = FieldTable::default();
    headers.insert(
        "nlip-conversation".into(),
        AMQPValue::LongString(LongString::from(conversation.as_bytes().to_vec())),
    );
    let body = format!(
        r#"{{"format":"structured","subformat":"silp-code","content":"cancel(order{i})","submessages":[{{"format":"token","subformat":"conversation","content":"{conversation}"}}]}}"#
    );
    let properties = BasicProperties::default()
        .with_message_id(format!("m-{i}").into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let exchange = format!("{prefix}.parts");
    let options = BasicPublishOptions { mandatory: true, immediate: false };
    channel
        .basic_publish(exchange.as_str().into(), "".into(), options, body.as_bytes(), properties)
        .await
        .unwrap()
}

/// Arrival time downstream of every envelope in `range` (first copy), read on `connection`.
pub async fn arrivals(
    connection: &Connection,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> HashMap<usize, Instant> {
    let mut arrived = HashMap::with_capacity(range.len());
    let complete = sink(connection, prefix, Duration::from_secs(120), |i, at| {
        if range.contains(&i) {
            arrived.entry(i).or_insert(at);
        }
        arrived.len() < range.len()
    })
    .await;
    assert!(complete, "arrivals stopped for 2 minutes");
    arrived
}

/// Reads the sink agent's queue, every copy, calling `arrived(i, when)` for envelope `i` until
/// it returns false (then true) or nothing arrives for `idle` (then false).
pub async fn sink(
    connection: &Connection,
    prefix: &str,
    idle: Duration,
    mut arrived: impl FnMut(usize, Instant) -> bool,
) -> bool {
    let channel = connection.create_channel().await.unwrap();
    channel.basic_qos(1000, BasicQosOptions::default()).await.unwrap();
    let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
    let sink = format!("{prefix}.sink");
    let mut consumer =
        channel.basic_consume(sink.as_str().into(), "".into(), options, FieldTable::default()).await.unwrap();
    let complete = loop {
        let Ok(delivery) = tokio::time::timeout(idle, consumer.next()).await else { break false };
        let delivery = delivery.unwrap().unwrap();
        let at = Instant::now();
        let id = delivery.properties.message_id().as_ref().map(|m| m.as_str().to_owned()).unwrap_or_default();
        let index = id.strip_prefix("m-").and_then(|r| r.split(':').next()).and_then(|i| i.parse().ok());
        if let Some(i) = index
            && !arrived(i, at)
        {
            break true;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), channel.close(200, "counted".into())).await;
    complete
}

fn signal(child: &Child, signal: &str) {
    Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
}

/// Waits for `child` to exit; one still running a minute after SIGTERM is reported and killed:
/// the benchmark must end (a shutdown hang is for the cluster tests to catch, with its cause).
async fn wait_exit(child: &mut Child, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            eprintln!("warning: instance {name} did not exit within 60 s of SIGTERM; killed");
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The status `/readyz` answers on `port`, if it answers.
async fn readyz(port: u16) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// A port free now (the instance binds it a moment later: good enough for a benchmark).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn config_text(prefix: &str, store: &std::path::Path, name: &str, http: u16) -> String {
    format!(
        r#"[store]
path = "{store}"
[sessions]
heartbeat = 9999
[http]
listen = "127.0.0.1:{http}"
plain = true
[amqp]
url = "{BROKER}"
inbound = ["{prefix}.in"]
inbound_exchange = "{prefix}.in-x"
agents_exchange = "{prefix}.agents"
dead_letter_exchange = "{prefix}.dlx"
dead_letter_queue = "{prefix}.dead"
drain_secs = 10
[cluster]
partitions = {PARTITIONS}
exchange = "{prefix}.parts"
queue_prefix = "{prefix}.p"
changelog_prefix = "{prefix}.log"
lock_stream = "{prefix}.lock"
instance = "{name}"
[[agents]]
name = "sink"
frontends = ["json"]
routing_key = "{prefix}.sink"
queue = "{prefix}.sink"
[[routes]]
name = "transcode-to-sink"
destination = "sink"
mode = "transcode"
"#,
        store = store.display()
    )
}
