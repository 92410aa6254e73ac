//! The agent round trip, for benches/bench-roundtrip.sh: requests at a fixed rate (open loop)
//! to an AMQP echo agent (examples/echo_agent.rs), either through silpgate (HTTP POST ->
//! silpgate -> agent queue -> silpgate's reply queue -> HTTP response) or straight over AMQP
//! request/reply (publish with `reply_to` and `correlation_id`, wait for the answer). Prints
//! `median_us p99_us` of the measured requests.
//!
//! `cargo bench --bench roundtrip -- http URL RATE COUNT` or `... amqp AMQP_URI QUEUE RATE COUNT`.
//! Under `cargo test` (no arguments) it does nothing.

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BODY: &str = r#"{"format":"text","subformat":"english","content":"hello"}"#;
/// Requests not measured, first: connections, pools and caches settle.
const WARM_UP: usize = 500;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    // reqwest takes the process's rustls provider; ring is the one silpgate builds with.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let times = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["http", url, rate, count] => {
            runtime.block_on(http(url, rate.parse().unwrap(), count.parse().unwrap()))
        }
        ["amqp", uri, queue, rate, count] => {
            runtime.block_on(amqp(uri, queue, rate.parse().unwrap(), count.parse().unwrap()))
        }
        _ => return,
    };
    let mut micros: Vec<f64> = times.iter().skip(WARM_UP).map(|d| d.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    let median = micros[micros.len() / 2];
    let p99 = micros[micros.len() * 99 / 100];
    println!("{median:.1} {p99:.1}");
}

/// Sends `count` requests at `rate` per second, each on its own task, and returns each one's
/// round trip in sending order.
async fn open_loop<F, Fut>(rate: f64, count: usize, send: F) -> Vec<Duration>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Duration> + Send + 'static,
{
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        ticks.tick().await;
        tasks.push(tokio::spawn(send(i)));
    }
    let mut times = Vec::with_capacity(count);
    for task in tasks {
        let done = tokio::time::timeout(Duration::from_secs(60), task).await;
        times.push(done.expect("every request is answered within 60 s").unwrap());
    }
    times
}

async fn http(url: &str, rate: f64, count: usize) -> Vec<Duration> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
    let url = url.to_owned();
    open_loop(rate, count, move |_| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let started = Instant::now();
            let response = client
                .post(&url)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("silpgate answers");
            assert_eq!(response.status(), 200, "the agent's answer comes back");
            let _ = response.bytes().await.unwrap();
            started.elapsed()
        }
    })
    .await
}

async fn amqp(uri: &str, queue: &str, rate: f64, count: usize) -> Vec<Duration> {
    let connection = Connection::connect(uri, ConnectionProperties::default()).await.expect("the broker");
    let channel = connection.create_channel().await.unwrap();
    let options =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let replies = channel.queue_declare("".into(), options, FieldTable::default()).await.unwrap();
    let reply_to = replies.name().as_str().to_owned();
    let waiting: Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>> = Arc::default();
    let mut answers = channel
        .basic_consume(
            reply_to.as_str().into(),
            "".into(),
            BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let matcher = waiting.clone();
    tokio::spawn(async move {
        while let Some(Ok(answer)) = answers.next().await {
            let id = answer.properties.correlation_id().as_ref().map(|c| c.as_str().to_owned());
            if let Some(done) = id.and_then(|id| matcher.lock().unwrap().remove(&id)) {
                let _ = done.send(());
            }
        }
    });
    let queue = queue.to_owned();
    open_loop(rate, count, move |i| {
        let (channel, waiting, reply_to, queue) =
            (channel.clone(), waiting.clone(), reply_to.clone(), queue.clone());
        async move {
            let (done, answered) = tokio::sync::oneshot::channel();
            let id = format!("rt-{i}");
            waiting.lock().unwrap().insert(id.clone(), done);
            let started = Instant::now();
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_correlation_id(id.as_str().into())
                .with_reply_to(reply_to.as_str().into());
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    BODY.as_bytes(),
                    properties,
                )
                .await
                .unwrap();
            answered.await.expect("the agent answers");
            started.elapsed()
        }
    })
    .await
}
