//! Cluster mode on the local RabbitMQ, in one run: throughput of 1, 2 and 3 silpgate instances
//! (release binaries, 16 partitions, each with its own sled store) over N queued envelopes,
//! and the hand-over time when the instance serving partitions is killed (SIGKILL) under a
//! paced load: from the kill to the first message of each stalled conversation arriving
//! downstream, processed by the new owner.
//!
//! `bash benches/bench-cluster.sh [N] [RATE]`; the last line printed is
//! `cluster throughput msg/s: 1 instance X, 2 instances Y, 3 instances Z; handover after SIGKILL W ms;
//! cpu per message over all instances: A / B / C us` (user + system time of every instance over the
//! measured run, divided by N).

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cpu.rs"]
mod cpu;

const BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PARTITIONS: u16 = 16;
const CONVERSATIONS: usize = 300;
/// Conversations of the hand-over run: few, so that each gets a message every few ms.
const PACED_CONVERSATIONS: usize = 32;

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs this without `--bench`: a small smoke run then.
    let measuring = std::env::args().any(|a| a == "--bench");
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(if measuring { 20_000 } else { 300 });
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(if measuring { 320 } else { 100 });
    println!(
        "cluster benchmark: N = {n}, {PARTITIONS} partitions, hand-over under {rate}/s, broker {BROKER}"
    );

    let mut throughput = Vec::new();
    for instances in 1..=3 {
        let cluster =
            Cluster::start(&format!("sgbench.{}.c{instances}", std::process::id()), instances).await;
        // Warm up: every instance takes its share before the measured run.
        let warm = (n / 10).max(CONVERSATIONS);
        cluster.publish(0..warm, CONVERSATIONS).await;
        cluster.arrivals(0..warm).await;
        tokio::time::sleep(Duration::from_secs(if measuring { 6 } else { 3 })).await;
        let cpu_before = cluster.cpu();
        cluster.publish(warm..warm + n, CONVERSATIONS).await;
        let arrived = cluster.arrivals(warm..warm + n).await;
        let cpu_us = (cluster.cpu() - cpu_before).as_secs_f64() * 1e6 / n as f64;
        let first = arrived.values().min().unwrap();
        let last = arrived.values().max().unwrap();
        let per_second = (n - 1) as f64 / last.duration_since(*first).as_secs_f64();
        println!(
            "{instances} instance(s): {per_second:>7.0} msg/s, cpu {cpu_us:.0} us/msg over all instances"
        );
        throughput.push((per_second, cpu_us));
        cluster.stop().await;
    }

    let cluster = Cluster::start(&format!("sgbench.{}.handover", std::process::id()), 3).await;
    let warm = CONVERSATIONS;
    cluster.publish(0..warm, PACED_CONVERSATIONS).await;
    cluster.arrivals(0..warm).await;
    tokio::time::sleep(Duration::from_secs(if measuring { 6 } else { 3 })).await;
    let handover = cluster.handover(warm, rate, if measuring { 10 } else { 3 }).await;
    cluster.stop().await;
    println!(
        "cluster throughput msg/s: 1 instance {:.0}, 2 instances {:.0}, 3 instances {:.0}; handover after SIGKILL {handover:.0} ms; cpu per message over all instances: {:.0} / {:.0} / {:.0} us",
        throughput[0].0, throughput[1].0, throughput[2].0, throughput[0].1, throughput[1].1, throughput[2].1
    );
}

/// silpgate instances sharing one topology.
struct Cluster {
    prefix: String,
    instances: Vec<(Child, String)>,
    dir: std::path::PathBuf,
    connection: Connection,
    channel: Channel,
}

impl Cluster {
    async fn start(prefix: &str, count: usize) -> Cluster {
        let dir = std::env::temp_dir().join(prefix);
        std::fs::create_dir_all(&dir).unwrap();
        let instances = (0..count)
            .map(|i| {
                let name = format!("n{i}");
                let config = dir.join(format!("{name}.toml"));
                std::fs::write(&config, config_text(prefix, &dir.join(&name), &name)).unwrap();
                // SILPGATE_BENCH_BIN runs another build (an earlier one, for a before/after).
                let binary = std::env::var("SILPGATE_BENCH_BIN")
                    .unwrap_or_else(|_| env!("CARGO_BIN_EXE_silpgate").to_owned());
                let child = Command::new(binary)
                    .args(["run", "--config"])
                    .arg(&config)
                    .env("SILPGATE_LOG", "error")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("silpgate starts");
                (child, name)
            })
            .collect();
        let connection = Connection::connect(BROKER, ConnectionProperties::default())
            .await
            .expect("RabbitMQ at 127.0.0.1:5672 (start it with `rabbitmq-server -detached`)");
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let cluster = Cluster { prefix: prefix.to_owned(), instances, dir, connection, channel };
        // Ready once every instance is heard as a member.
        cluster.wait_members(count).await;
        cluster
    }

    /// The user + system CPU time the instances have used so far, summed.
    fn cpu(&self) -> Duration {
        self.instances.iter().map(|(child, _)| cpu::cpu_time(child.id())).sum()
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
    async fn publish(&self, range: std::ops::Range<usize>, conversations: usize) {
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

    async fn send(&self, i: usize, conversations: usize) -> lapin::PublisherConfirm {
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
        let exchange = format!("{}.parts", self.prefix);
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        self.channel
            .basic_publish(exchange.as_str().into(), "".into(), options, body.as_bytes(), properties)
            .await
            .unwrap()
    }

    /// Arrival time downstream of every envelope in `range` (first copy).
    async fn arrivals(&self, range: std::ops::Range<usize>) -> HashMap<usize, Instant> {
        let channel = self.connection.create_channel().await.unwrap();
        channel.basic_qos(1000, BasicQosOptions::default()).await.unwrap();
        let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
        let sink = format!("{}.sink", self.prefix);
        let mut consumer = channel
            .basic_consume(sink.as_str().into(), "".into(), options, FieldTable::default())
            .await
            .unwrap();
        let mut arrived = HashMap::with_capacity(range.len());
        while arrived.len() < range.len() {
            let delivery = tokio::time::timeout(Duration::from_secs(120), consumer.next())
                .await
                .expect("arrivals stopped for 2 minutes")
                .unwrap()
                .unwrap();
            let at = Instant::now();
            let id =
                delivery.properties.message_id().as_ref().map(|m| m.as_str().to_owned()).unwrap_or_default();
            let index = id.strip_prefix("m-").and_then(|r| r.split(':').next()).and_then(|i| i.parse().ok());
            if let Some(i) = index.filter(|i| range.contains(i)) {
                arrived.entry(i).or_insert(at);
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), channel.close(200, "counted".into())).await;
        arrived
    }

    /// Publishes at `rate` for `seconds`, SIGKILLs the first instance halfway, and returns the
    /// longest wait, over the conversations, from the kill to their first arrival after it.
    async fn handover(&self, start: usize, rate: u64, seconds: u64) -> f64 {
        let total = (rate * seconds) as usize;
        let range = start..start + total;
        let receiver = Cluster::arrival_task(self.prefix.clone(), range.clone());
        let began = Instant::now();
        let mut killed_at = None;
        let mut confirms = Vec::new();
        for (k, i) in range.clone().enumerate() {
            let due = began + Duration::from_micros(k as u64 * 1_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
            if killed_at.is_none() && k == total / 2 {
                let pid = self.instances[0].0.id().to_string();
                Command::new("kill").args(["-KILL", &pid]).status().unwrap();
                killed_at = Some(Instant::now());
            }
            confirms.push(self.send(i, PACED_CONVERSATIONS).await);
        }
        for c in confirms {
            c.await.unwrap();
        }
        let arrived = receiver.await.unwrap();
        let killed_at = killed_at.unwrap();
        let mut first_after: HashMap<usize, Instant> = HashMap::new();
        for (&i, &at) in &arrived {
            if at > killed_at {
                let entry = first_after.entry(i % PACED_CONVERSATIONS).or_insert(at);
                *entry = (*entry).min(at);
            }
        }
        first_after.values().map(|at| at.duration_since(killed_at).as_secs_f64() * 1000.0).fold(0.0, f64::max)
    }

    fn arrival_task(
        prefix: String,
        range: std::ops::Range<usize>,
    ) -> tokio::task::JoinHandle<HashMap<usize, Instant>> {
        tokio::spawn(async move {
            let connection = Connection::connect(BROKER, ConnectionProperties::default()).await.unwrap();
            let channel = connection.create_channel().await.unwrap();
            channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
            let cluster =
                Cluster { prefix, instances: Vec::new(), dir: std::env::temp_dir(), connection, channel };
            cluster.arrivals(range).await
        })
    }

    async fn stop(mut self) {
        for (child, _) in &mut self.instances {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
        // An instance still running a minute after SIGTERM is reported and killed: the
        // benchmark must end (a shutdown hang is for the cluster tests to catch, with its cause).
        for (child, name) in &mut self.instances {
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    eprintln!("warning: instance {name} did not exit within 60 s of SIGTERM; killed");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
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

fn config_text(prefix: &str, store: &std::path::Path, name: &str) -> String {
    format!(
        r#"[store]
path = "{store}"
[sessions]
heartbeat = 9999
[http]
listen = "127.0.0.1:0"
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
