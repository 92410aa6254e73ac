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

use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::cluster::{BROKER, Cluster, PARTITIONS};

mod support {
    pub mod cluster;
    pub mod cpu;
}
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

    let mut cluster = Cluster::start(&format!("sgbench.{}.handover", std::process::id()), 3).await;
    let warm = CONVERSATIONS;
    cluster.publish(0..warm, PACED_CONVERSATIONS).await;
    cluster.arrivals(0..warm).await;
    tokio::time::sleep(Duration::from_secs(if measuring { 6 } else { 3 })).await;
    let handover = handover(&mut cluster, warm, rate, if measuring { 10 } else { 3 }).await;
    cluster.stop().await;
    println!(
        "cluster throughput msg/s: 1 instance {:.0}, 2 instances {:.0}, 3 instances {:.0}; handover after SIGKILL {handover:.0} ms; cpu per message over all instances: {:.0} / {:.0} / {:.0} us",
        throughput[0].0, throughput[1].0, throughput[2].0, throughput[0].1, throughput[1].1, throughput[2].1
    );
}

/// Publishes at `rate` for `seconds`, SIGKILLs the first instance halfway, and returns the
/// longest wait, over the conversations, from the kill to their first arrival after it.
async fn handover(cluster: &mut Cluster, start: usize, rate: u64, seconds: u64) -> f64 {
    let total = (rate * seconds) as usize;
    let range = start..start + total;
    let receiver = tokio::spawn({
        let (prefix, range) = (cluster.prefix.clone(), range.clone());
        async move {
            let (connection, _) = support::cluster::connect().await;
            support::cluster::arrivals(&connection, &prefix, range).await
        }
    });
    let began = Instant::now();
    let mut killed_at = None;
    let mut confirms = Vec::new();
    for (k, i) in range.clone().enumerate() {
        let due = began + Duration::from_micros(k as u64 * 1_000_000 / rate);
        tokio::time::sleep_until(due.into()).await;
        if killed_at.is_none() && k == total / 2 {
            cluster.kill(0);
            killed_at = Some(Instant::now());
        }
        confirms.push(cluster.send(i, PACED_CONVERSATIONS).await);
    }
    for c in confirms {
        c.await.unwrap();
    }
    let arrived: HashMap<usize, Instant> = receiver.await.unwrap();
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
