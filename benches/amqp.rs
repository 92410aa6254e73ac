//! silpgate against a bare relay on the same broker, in one run: throughput over N queued
//! envelopes, and end-to-end latency at a paced rate. The bare relay is lapin alone: consume,
//! republish with confirms, ack after the confirm, nothing else. silpgate runs as its release
//! binary on a transcoding route with the sled store.
//!
//! Both relays run as processes of their own (the bare one is this program, started again with
//! `relay IN OUT`), so that each one's CPU time can be read from /proc: CPU per message is the
//! process's user + system time during the throughput run divided by the envelopes relayed.
//!
//! `SILPGATE_BENCH_AMQP="workers = 4; window = 128"` adds `[amqp]` settings to silpgate's
//! (its defaults otherwise), for choosing them by measurement; `SILPGATE_BENCH_TELEMETRY` does the
//! same for `[telemetry]` (span export and its sampling: `OTLP_SAMPLE=0.1 bash
//! benches/bench-amqp.sh` sets it, with a local OTLP receiver). `SILPGATE_BENCH_BIN=PATH` runs
//! another silpgate binary (an earlier build, for a before/after in one sitting).
//!
//! Beside each relay's throughput run it reads what every RabbitMQ node on the machine and this
//! program (the counter of arrivals) spent in the same time, and prints the CPU a message may
//! cost silpgate at 0.8 of the bare relay's rate on this machine's cores: on a machine the
//! broker shares, that budget is what the ratio target means.
//!
//! `bash benches/bench-amqp.sh [N] [RATE] [SECONDS]`; the last line printed is
//! `throughput ratio silpgate/bare: X, p99 at 1000/s silpgate Y ms bare Z ms, cpu per message
//! silpgate A us bare B us`.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/cpu.rs"]
mod cpu;

const BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const CONVERSATIONS: usize = 200;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("relay") {
        let (input, output) = (args.next().expect("relay IN OUT"), args.next().expect("relay IN OUT"));
        let connection = connect().await;
        return bare_relay(connection.create_channel().await.unwrap(), input, output).await;
    }
    // `cargo test --all-targets` runs this without `--bench`: a small smoke run then.
    let measuring = std::env::args().any(|a| a == "--bench");
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(if measuring { 50_000 } else { 300 });
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(if measuring { 1000 } else { 100 });
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(if measuring { 15 } else { 1 });
    let run = format!("sgbench.{}", std::process::id());
    println!("AMQP relay benchmark: N = {n}, paced {rate}/s for {seconds} s, broker {BROKER}");

    let bare = Relay::Bare { input: format!("{run}.bare.in"), output: format!("{run}.bare.out") };
    let silpgate = Relay::Silpgate { prefix: format!("{run}.sg") };
    let mut results = Vec::new();
    for relay in [&bare, &silpgate] {
        let run = relay.throughput(n).await;
        let latency = relay.latency(rate, seconds).await;
        println!(
            "{:<9} throughput {:>7.0} msg/s, cpu {:.0} us/msg, {:.2} context switches/msg | at {rate}/s: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            relay.name(),
            run.per_second,
            run.cpu_us,
            run.switches,
            latency.p(0.50),
            latency.p(0.90),
            latency.p(0.99),
            latency.p(1.0),
        );
        println!(
            "{:<9} beside it: broker cpu {:.0} us/msg, the benchmark's counter {:.0} us/msg",
            "", run.broker_us, run.client_us
        );
        results.push((run, latency.p(0.99)));
        relay.clean_up().await;
    }
    let ((bare, bare_p99), (sg, sg_p99)) = (&results[0], &results[1]);
    println!("{}", budget(bare, sg));
    println!(
        "throughput ratio silpgate/bare: {:.2}, p99 at {rate}/s silpgate {sg_p99:.2} ms bare {bare_p99:.2} ms, cpu per message silpgate {:.0} us bare {:.0} us",
        sg.per_second / bare.per_second,
        sg.cpu_us,
        bare.cpu_us
    );
}

/// The throughput the ratio target asks of silpgate (0.8 of the bare relay's), and the CPU
/// a message may cost silpgate at that rate: what the machine's cores give per message, less
/// what the broker and the benchmark's counter spent per message beside silpgate.
fn budget(bare: &Throughput, silpgate: &Throughput) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let target = 0.8 * bare.per_second;
    let per_message = cores * 1e6 / target;
    let left = per_message - silpgate.broker_us - silpgate.client_us;
    format!(
        "cpu budget at 0.8 of bare ({target:.0} msg/s on {cores} cores): {per_message:.0} us/msg in all, {left:.0} us/msg for silpgate after the broker and the counter (silpgate spent {:.0})",
        silpgate.cpu_us
    )
}

/// One throughput run: the rate, and CPU per message of the relay, the broker and this
/// process (which counts the arrivals), in microseconds.
struct Throughput {
    per_second: f64,
    cpu_us: f64,
    switches: f64,
    broker_us: f64,
    client_us: f64,
}

enum Relay {
    Bare { input: String, output: String },
    Silpgate { prefix: String },
}

/// A relay running under test: its process.
struct Running(Child);

impl Running {
    /// SIGTERM, then SIGKILL if the relay has not exited within 60 s.
    async fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.0.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                eprintln!("the relay did not stop within 60 s after SIGTERM; killing it");
                let _ = self.0.kill();
                let _ = self.0.wait();
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's user + system CPU time so far.
    fn cpu(&self) -> Duration {
        cpu::cpu_time(self.0.id())
    }

    /// The process's context switches so far, over its live threads.
    fn switches(&self) -> u64 {
        cpu::context_switches(self.0.id())
    }
}

impl Relay {
    fn name(&self) -> &'static str {
        match self {
            Relay::Bare { .. } => "bare",
            Relay::Silpgate { .. } => "silpgate",
        }
    }

    fn input(&self) -> String {
        match self {
            Relay::Bare { input, .. } => input.clone(),
            Relay::Silpgate { prefix } => format!("{prefix}.in"),
        }
    }

    fn output(&self) -> String {
        match self {
            Relay::Bare { output, .. } => output.clone(),
            Relay::Silpgate { prefix } => format!("{prefix}.sink"),
        }
    }

    fn store(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{}.store", self.input()))
    }

    /// Starts the relay; returns once it consumes.
    async fn start(&self) -> Running {
        match self {
            Relay::Bare { input, output } => {
                let connection = connect().await;
                let channel = connection.create_channel().await.unwrap();
                for q in [input, output] {
                    declare_quorum(&channel, q).await;
                }
                let child = Command::new(std::env::current_exe().unwrap())
                    .args(["relay", input, output])
                    .spawn()
                    .expect("the bare relay starts");
                let running = Running(child);
                wait_consuming(&connection, input).await;
                close(&connection, "ready").await;
                running
            }
            Relay::Silpgate { prefix } => {
                let dir = self.store();
                let config_path = std::env::temp_dir().join(format!("{prefix}.toml"));
                std::fs::write(&config_path, silpgate_config(prefix, &dir)).unwrap();
                let binary = std::env::var_os("SILPGATE_BENCH_BIN")
                    .unwrap_or_else(|| env!("CARGO_BIN_EXE_silpgate").into());
                let child = Command::new(binary)
                    .args(["run", "--config"])
                    .arg(&config_path)
                    .env("SILPGATE_LOG", "warn")
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("silpgate starts");
                let running = Running(child);
                // Ready once its topology exists and it consumes.
                let connection = connect().await;
                wait_consuming(&connection, &self.input()).await;
                close(&connection, "ready").await;
                running
            }
        }
    }

    /// Envelopes per second moved from a pre-filled input queue to the output, and what each
    /// cost in CPU and context switches.
    async fn throughput(&self, n: usize) -> Throughput {
        // The topology first, then the backlog, then the relay on the backlog.
        self.start().await.stop().await;
        let connection = connect().await;
        let channel = confirm_channel(&connection).await;
        publish_backlog(&channel, &self.input(), n).await;
        let counter = connect().await;
        let counted = tokio::spawn(count_until(counter.create_channel().await.unwrap(), self.output(), n));
        let running = self.start().await;
        let (cpu_before, switches_before) = (running.cpu(), running.switches());
        let (broker_before, client_before) = (cpu::broker_cpu_time(), cpu::cpu_time(std::process::id()));
        let (first, last) = counted.await.unwrap();
        let cpu = running.cpu() - cpu_before;
        let switches = running.switches().saturating_sub(switches_before);
        let broker = cpu::broker_cpu_time().saturating_sub(broker_before);
        let client = cpu::cpu_time(std::process::id()).saturating_sub(client_before);
        running.stop().await;
        close(&counter, "done").await;
        close(&connection, "done").await;
        let per_message = |total: Duration| total.as_secs_f64() * 1e6 / n as f64;
        Throughput {
            per_second: (n - 1) as f64 / (last - first).as_secs_f64(),
            cpu_us: per_message(cpu),
            switches: switches as f64 / n as f64,
            broker_us: per_message(broker),
            client_us: per_message(client),
        }
    }

    /// End-to-end latency (publish to arrival) at `rate` messages per second.
    async fn latency(&self, rate: u64, seconds: u64) -> Latencies {
        let running = self.start().await;
        let total = (rate * seconds) as usize;
        let connection = connect().await;
        let channel = confirm_channel(&connection).await;
        let sent: Arc<Vec<std::sync::OnceLock<Instant>>> =
            Arc::new((0..total).map(|_| std::sync::OnceLock::new()).collect());
        let receiver = connect().await;
        let arrivals =
            tokio::spawn(arrival_times(receiver.create_channel().await.unwrap(), self.output(), total));
        let started = Instant::now();
        let mut confirms = Vec::with_capacity(total);
        for i in 0..total {
            let due = started + Duration::from_micros(i as u64 * 1_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
            sent[i].set(Instant::now()).unwrap();
            confirms.push(publish(&channel, &self.input(), 'l', i).await);
        }
        for c in confirms {
            c.await.unwrap();
        }
        let arrived = arrivals.await.unwrap();
        running.stop().await;
        close(&receiver, "done").await;
        close(&connection, "done").await;
        let mut ms: Vec<f64> = arrived
            .into_iter()
            .map(|(i, at)| at.duration_since(*sent[i].get().unwrap()).as_secs_f64() * 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        Latencies(ms)
    }

    async fn clean_up(&self) {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        let mut queues = vec![self.input(), self.output()];
        if let Relay::Silpgate { prefix } = self {
            let _ = std::fs::remove_file(std::env::temp_dir().join(format!("{prefix}.toml")));
            queues.push(format!("{prefix}.dead"));
            for x in ["in-x", "agents", "dlx"] {
                let _ = channel.exchange_delete(format!("{prefix}.{x}").into(), Default::default()).await;
            }
        }
        for q in queues {
            let _ = channel.queue_delete(q.into(), QueueDeleteOptions::default()).await;
        }
        let _ = std::fs::remove_dir_all(self.store());
        close(&connection, "done").await;
    }
}

/// Waits until `queue` has a consumer (the relay started), for at most 20 s.
async fn wait_consuming(connection: &Connection, queue: &str) {
    for _ in 0..200 {
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        if let Ok(q) = channel.queue_declare(queue.into(), passive, FieldTable::default()).await
            && q.consumer_count() > 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the relay did not start consuming {queue}");
}

struct Latencies(Vec<f64>);

impl Latencies {
    fn p(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0[((self.0.len() - 1) as f64 * q).round() as usize]
    }
}

/// Closes a connection, without waiting forever: lapin's close was seen to hang once the
/// relay task holding a consumer had been aborted.
async fn close(connection: &Connection, why: &str) {
    let _ = tokio::time::timeout(Duration::from_secs(5), connection.close(200, why.into())).await;
}

async fn connect() -> Connection {
    Connection::connect(BROKER, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (start it with `rabbitmq-server -detached`)")
}

async fn confirm_channel(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    channel
}

async fn declare_quorum(channel: &Channel, queue: &str) {
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from(b"quorum".to_vec())));
    let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.into(), options, arguments).await.unwrap();
}

/// A small SILP envelope in one of the conversations.
fn envelope(i: usize) -> Vec<u8> {
    format!(
        r#"{{"format":"structured","subformat":"silp-code","content":"cancel(order{i})","submessages":[{{"format":"token","subformat":"conversation","content":"bench-{}"}}]}}"#,
        i % CONVERSATIONS
    )
    .into_bytes()
}

/// Publishes envelope `i` of a phase; `phase` prefixes its message id, so that the ledger does
/// not take the next phase's envelopes for redeliveries of the last one's.
async fn publish(channel: &Channel, queue: &str, phase: char, i: usize) -> lapin::PublisherConfirm {
    let properties = BasicProperties::default()
        .with_message_id(format!("{phase}-{i}").into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let options = BasicPublishOptions { mandatory: true, immediate: false };
    channel.basic_publish("".into(), queue.into(), options, &envelope(i), properties).await.unwrap()
}

/// Publishes `n` envelopes with confirms, 1,024 unconfirmed at most.
async fn publish_backlog(channel: &Channel, queue: &str, n: usize) {
    let mut window = std::collections::VecDeque::with_capacity(1024);
    for i in 0..n {
        if window.len() == 1024 {
            let confirm: lapin::PublisherConfirm = window.pop_front().unwrap();
            confirm.await.unwrap();
        }
        window.push_back(publish(channel, queue, 't', i).await);
    }
    for c in window {
        c.await.unwrap();
    }
}

/// The index of an envelope from its (inbound or outbound) message id, `<phase>-<i>[:<n>]`.
fn index_of(message_id: Option<&lapin::types::ShortString>) -> Option<usize> {
    let id = message_id?.as_str();
    id.get(2..)?.split(':').next()?.parse().ok()
}

/// Times of the first and the `n`-th distinct arrival on `queue`.
async fn count_until(channel: Channel, queue: String, n: usize) -> (Instant, Instant) {
    let arrivals = arrival_times(channel, queue, n).await;
    (arrivals.first().unwrap().1, arrivals.last().unwrap().1)
}

/// Arrival time of each of `n` distinct envelopes on `queue` (control notices skipped).
async fn arrival_times(channel: Channel, queue: String, n: usize) -> Vec<(usize, Instant)> {
    channel.basic_qos(1000, BasicQosOptions::default()).await.unwrap();
    let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
    let mut consumer =
        channel.basic_consume(queue.into(), "".into(), options, FieldTable::default()).await.unwrap();
    let mut seen = vec![false; n];
    let mut arrivals = Vec::with_capacity(n);
    while arrivals.len() < n {
        let delivery = tokio::time::timeout(Duration::from_secs(120), consumer.next())
            .await
            .expect("arrivals stopped for 2 minutes")
            .unwrap()
            .unwrap();
        let at = Instant::now();
        // silpgate sends a session renewal notice before every 10th turn: `:0` then `:1`.
        let is_notice = delivery.data.windows(9).any(|w| w == b"\"control\"");
        if let Some(i) = index_of(delivery.properties.message_id().as_ref()).filter(|&i| i < n && !is_notice)
            && !seen[i]
        {
            seen[i] = true;
            arrivals.push((i, at));
        }
    }
    arrivals
}

/// The bare relay: consume, republish with a confirm, ack after the confirm. Nothing else.
async fn bare_relay(channel: Channel, input: String, output: String) {
    channel.basic_qos(256, BasicQosOptions::default()).await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let consumer = channel
        .basic_consume(input.into(), "bare".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap();
    let output: Arc<str> = output.into();
    consumer
        .for_each_concurrent(256, |delivery| {
            let channel = channel.clone();
            let output = output.clone();
            async move {
                let delivery = delivery.unwrap();
                let options = BasicPublishOptions { mandatory: true, immediate: false };
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        output.as_ref().into(),
                        options,
                        &delivery.data,
                        delivery.properties.clone(),
                    )
                    .await
                    .unwrap();
                confirm.await.unwrap();
                delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
            }
        })
        .await;
}

fn silpgate_config(prefix: &str, store: &std::path::Path) -> String {
    format!(
        r#"[store]
path = "{store}"
[sessions]
heartbeat = 10
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
{tuning}
[telemetry]
{telemetry}
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
        store = store.display(),
        tuning = std::env::var("SILPGATE_BENCH_AMQP").unwrap_or_default().replace(';', "\n"),
        telemetry = std::env::var("SILPGATE_BENCH_TELEMETRY").unwrap_or_default().replace(';', "\n"),
    )
}
