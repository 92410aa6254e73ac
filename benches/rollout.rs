//! A rolling restart under paced traffic, the way a StatefulSet rolling update does it: three
//! instances (release binaries, 16 partitions, one sink agent), traffic at RATE msg/s over 20
//! conversations; each instance in turn is sent SIGTERM, started again once it has exited, and
//! waited for until `/readyz` answers 200, then the next. Then a fourth instance joins and
//! leaves. Reported, measured and never asserted: what was lost, published twice and out of
//! order within its conversation, the wait from publish to arrival downstream (worst, p99,
//! how many over 1 s), SIGTERM to exit, start to ready, and how long the partitions took to
//! settle after the join.
//!
//! `bash benches/bench-rollout.sh [RATE=40]`; the last line printed sums it up.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::cluster::Cluster;

mod support {
    pub mod cluster;
    #[allow(dead_code)] // the cluster harness reads CPU time; this benchmark does not
    pub mod cpu;
}

const CONVERSATIONS: usize = 20;

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs this without `--bench`: a small smoke run then.
    let measuring = std::env::args().any(|a| a == "--bench");
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let rate: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(40);
    let settle = Duration::from_secs(if measuring { 5 } else { 2 });
    println!("rollout benchmark: 3 instances, {CONVERSATIONS} conversations at {rate} msg/s");

    let mut cluster = Cluster::start(&format!("sgbench.{}.rollout", std::process::id()), 3).await;
    let instances = cluster.instances.len();
    for index in 0..instances {
        cluster.ready(index).await;
    }
    // Every instance serves its share before the restarts begin.
    cluster.publish(0..200, CONVERSATIONS).await;
    cluster.arrivals(0..200).await;

    let traffic = Traffic::start(&cluster.prefix, 200, rate);
    tokio::time::sleep(settle).await;
    let mut exits = Vec::new();
    let mut readies = Vec::new();
    for index in 0..instances {
        exits.push(cluster.terminate(index).await);
        cluster.spawn(index);
        readies.push(cluster.ready(index).await);
    }
    tokio::time::sleep(settle).await;
    let report = traffic.stop().await;

    println!(
        "sent {}, lost {}, published twice {}, out of order {}",
        report.sent, report.lost, report.twice, report.out_of_order
    );
    println!(
        "wait publish to arrival: worst {:.0} ms, p99 {:.0} ms, p50 {:.1} ms; over 1 s: {}",
        report.worst_ms, report.p99_ms, report.p50_ms, report.over_a_second
    );
    let seconds =
        |d: &[Duration]| d.iter().map(|d| format!("{:.1}", d.as_secs_f64())).collect::<Vec<_>>().join(", ");
    println!("SIGTERM to exit: {} s; start to ready: {} s", seconds(&exits), seconds(&readies));
    cluster.stop().await;
    println!(
        "rollout at {rate} msg/s: lost {}, twice {}, out of order {}, worst wait {:.0} ms, p99 {:.0} ms; SIGTERM to exit max {:.1} s; start to ready max {:.1} s",
        report.lost,
        report.twice,
        report.out_of_order,
        report.worst_ms,
        report.p99_ms,
        exits.iter().max().unwrap().as_secs_f64(),
        readies.iter().max().unwrap().as_secs_f64(),
    );
}

/// Paced traffic and what arrived of it downstream.
struct Traffic {
    stop: Arc<AtomicBool>,
    publisher: tokio::task::JoinHandle<(std::ops::Range<usize>, HashMap<usize, Instant>)>,
    reader: tokio::task::JoinHandle<HashMap<usize, Vec<Instant>>>,
    /// One past the last envelope published, once publishing has stopped.
    end: Arc<AtomicUsize>,
    prefix: String,
}

struct Report {
    sent: usize,
    lost: usize,
    twice: usize,
    out_of_order: usize,
    worst_ms: f64,
    p99_ms: f64,
    p50_ms: f64,
    over_a_second: usize,
}

impl Traffic {
    /// Publishes envelope `from` and on at `rate` a second on a confirm channel of its own,
    /// and reads every copy that arrives downstream.
    fn start(prefix: &str, from: usize, rate: u64) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let end = Arc::new(AtomicUsize::new(usize::MAX));
        let publisher = tokio::spawn({
            let (prefix, stop) = (prefix.to_owned(), stop.clone());
            async move {
                let (_connection, channel) = support::cluster::connect().await;
                let began = Instant::now();
                let mut published = HashMap::new();
                let mut i = from;
                let mut confirms = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let due = began + Duration::from_micros((i - from) as u64 * 1_000_000 / rate);
                    tokio::time::sleep_until(due.into()).await;
                    published.insert(i, Instant::now());
                    confirms.push(support::cluster::send(&channel, &prefix, i, CONVERSATIONS).await);
                    i += 1;
                }
                for confirm in confirms {
                    confirm.await.unwrap();
                }
                (from..i, published)
            }
        });
        let reader = tokio::spawn({
            let (prefix, end) = (prefix.to_owned(), end.clone());
            async move {
                let (connection, _) = support::cluster::connect().await;
                let mut arrived: HashMap<usize, Vec<Instant>> = HashMap::new();
                let mut missing = 0..0;
                // Until every envelope published has come (or 30 s without any: lost ones).
                support::cluster::sink(&connection, &prefix, Duration::from_secs(30), |i, at| {
                    if i >= from {
                        arrived.entry(i).or_default().push(at);
                    }
                    let end = end.load(Ordering::Relaxed);
                    if end == usize::MAX {
                        return true;
                    }
                    if missing.is_empty() {
                        missing = from..end;
                    }
                    while missing.start < missing.end && arrived.contains_key(&missing.start) {
                        missing.start += 1;
                    }
                    !missing.is_empty()
                })
                .await;
                arrived
            }
        });
        Traffic { stop, publisher, reader, end, prefix: prefix.to_owned() }
    }

    /// Stops publishing, waits for every envelope to arrive (or 30 s without any), and sums up.
    async fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        let (range, published) = self.publisher.await.unwrap();
        self.end.store(range.end, Ordering::Relaxed);
        // One more, outside the range: its arrival has the reader look again.
        let (_connection, channel) = support::cluster::connect().await;
        support::cluster::send(&channel, &self.prefix, range.end, CONVERSATIONS).await.await.unwrap();
        let arrived = self.reader.await.unwrap();
        let mut waits: Vec<f64> = Vec::new();
        let (mut lost, mut twice) = (0, 0);
        for i in range.clone() {
            match arrived.get(&i) {
                None => lost += 1,
                Some(copies) => {
                    twice += usize::from(copies.len() > 1);
                    waits.push(copies[0].duration_since(published[&i]).as_secs_f64() * 1000.0);
                }
            }
        }
        // Within a conversation, first arrivals must come in publish order.
        let mut out_of_order = 0;
        let mut last: HashMap<usize, (usize, Instant)> = HashMap::new();
        for i in range.clone() {
            let Some(at) = arrived.get(&i).map(|c| c[0]) else { continue };
            let conversation = i % CONVERSATIONS;
            if let Some(&(_, before)) = last.get(&conversation)
                && at < before
            {
                out_of_order += 1;
            }
            last.insert(conversation, (i, at));
        }
        waits.sort_by(f64::total_cmp);
        let percentile = |p: f64| {
            waits
                .get(((waits.len() as f64 * p) as usize).min(waits.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        Report {
            sent: range.len(),
            lost,
            twice,
            out_of_order,
            worst_ms: waits.last().copied().unwrap_or(0.0),
            p99_ms: percentile(0.99),
            p50_ms: percentile(0.5),
            over_a_second: waits.iter().filter(|&&w| w > 1000.0).count(),
        }
    }
}
