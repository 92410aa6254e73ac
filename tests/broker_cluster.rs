//! silpgate on a real three-node RabbitMQ cluster on this machine (the local broker and two
//! extra nodes started by `tests/broker-cluster.sh`): a broker node that dies under silpgate,
//! two of three nodes gone for 20 s (the quorum queues' majority lost), and a rolling restart
//! of all three nodes under a steady stream, and cluster mode (partitions, changelog and lock
//! streams) on the three nodes while instances and a node are killed. Every test counts by
//! message id what reaches the downstream queue, asserts each conversation's order, and reads
//! session state from the store: nothing lost, nothing applied twice. The tests share one
//! cluster (tests/run.sh brings it up before them and down after them); each brings back the
//! nodes it stopped, also when it fails.

mod support;

use lapin::BasicProperties;
use silpgate::nlip::{self, Encoding, Limits};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};
use support::broker::{self, Daemon, Names, Received};
use support::broker_cluster::{self, BrokerCluster, leader_of, move_leader, publish_paced, url, wait_count};
use support::cluster::{
    Instances, PARTITIONS, a_fresh_instance_takes_over_after_the_kills, publish_in_chunks,
};

/// One multi-node test at a time: each reshapes the broker cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CONVERSATIONS: usize = 40;

/// A silpgate configuration for `names` that connects to the broker nodes `nodes`.
fn config(names: &Names, store: &Path, nodes: &[u8]) -> String {
    let urls: Vec<String> = nodes.iter().map(|&n| format!("\"{}\"", url(n))).collect();
    names
        .config(store, "prefetch = 128\nworkers = 16\n", true)
        .replace(&format!("url = \"{}\"\n", broker::url()), &format!("urls = [{}]\n", urls.join(", ")))
}

fn messages(names: &Names, count: usize) -> Vec<(String, Vec<u8>, BasicProperties)> {
    (0..count)
        .map(|i| {
            let properties = BasicProperties::default()
                .with_message_id(format!("m-{i}").into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            (names.inbound(), broker::envelope(i, i % CONVERSATIONS, None), properties)
        })
        .collect()
}

/// The node silpgate says (in `/readyz`) it is connected to, when it is ready.
fn connected_node(daemon: &Daemon) -> Option<u8> {
    let (status, body) = daemon.get("/readyz");
    let port = body.split("ready (broker 127.0.0.1:").nth(1)?.split(')').next()?.parse().ok()?;
    (status == 200).then(|| broker_cluster::node_of_port(port))
}

/// The inbound id (`m-<i>`) of a message forwarded to the sink, or `None` for a notice.
fn forwarded_id(r: &Received) -> Option<String> {
    let encoding = Encoding::from_content_type(r.content_type.as_deref().unwrap_or_default())?;
    let message = nlip::decode(&r.body, encoding, &Limits::default()).expect("silpgate publishes valid NLIP");
    if message.is_control() {
        return None;
    }
    Some(r.message_id.rsplit_once(':').expect("outbound ids are <inbound id>:<n>").0.to_owned())
}

/// Reads the sink (from node 1) until all `count` messages arrived; asserts each arrived and
/// every conversation's first arrivals are in publishing order, except that a message numbered
/// below `reorder_below` may come late (0: none may).
async fn assert_delivered_in_order(names: &Names, count: usize, reorder_below: usize) {
    let (connection, channel) = broker::channel().await;
    // Counted as they come: recounting everything read on every arrival would be quadratic.
    let (mut arrived, mut counted) = (HashSet::new(), 0);
    let got = broker::collect(&channel, &names.sink(), Duration::from_secs(180), |got| {
        arrived.extend(got[counted..].iter().filter_map(forwarded_id));
        counted = got.len();
        arrived.len() == count
    })
    .await;
    let distinct = got.iter().filter_map(forwarded_id).collect::<HashSet<_>>().len();
    assert_eq!(distinct, count, "every message reached the sink");
    let mut seen = HashSet::new();
    let mut last: HashMap<usize, usize> = HashMap::new();
    for id in got.iter().filter_map(forwarded_id) {
        if !seen.insert(id.clone()) {
            continue;
        }
        let i: usize = id[2..].parse().expect("m-<i>");
        let previous = last.get(&(i % CONVERSATIONS)).copied();
        if let Some(previous) = previous
            && previous > i
        {
            assert!(
                i < reorder_below,
                "conversation {}: m-{i} arrived after m-{previous}",
                i % CONVERSATIONS
            );
            eprintln!(
                "conversation {}: m-{i} (in flight at the crash) arrived after m-{previous}",
                i % CONVERSATIONS
            );
            continue;
        }
        last.insert(i % CONVERSATIONS, i);
    }
    let _ = connection.close(200, "done".into()).await;
}

/// Stops the daemon and asserts every conversation counted each of its messages once; then
/// deletes the test's queues.
async fn assert_applied_once(daemon: Daemon, names: &Names, store: &Path, count: usize) {
    let (status, _) = daemon.terminate(Duration::from_secs(60));
    assert!(status.success(), "silpgate exits 0 on SIGTERM: {status}");
    let turns = broker::session_turns(store);
    for c in 0..CONVERSATIONS {
        let expected = (0..count).filter(|i| i % CONVERSATIONS == c).count() as u64;
        assert_eq!(turns.get(&format!("conv-{c}")), Some(&expected), "turns of conv-{c}");
    }
    let (connection, channel) = broker::channel().await;
    names.clean_up(&channel, 0).await;
    let _ = connection.close(200, "done".into()).await;
}

async fn within(limit: Duration, test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(limit, test).await.unwrap_or_else(|_| panic!("the test took longer than {limit:?}"));
}

/// One test's run: silpgate on the broker nodes `nodes`, and a producer publishing `count`
/// envelopes at `per_second` through `producer_nodes` in the background.
struct Run {
    names: Names,
    store: std::path::PathBuf,
    daemon: Daemon,
    confirmed: Arc<AtomicUsize>,
    producer: tokio::task::JoinHandle<()>,
}

impl Run {
    fn start(test: &str, nodes: &[u8], producer_nodes: &[u8], count: usize, per_second: u32) -> Run {
        let names = Names::new(test);
        let dir = broker::temp_dir(test);
        let store = dir.join("store");
        let daemon = Daemon::start(&config(&names, &store, nodes), &dir);
        daemon.wait_ready(Duration::from_secs(60));
        let confirmed = Arc::new(AtomicUsize::new(0));
        let producer = tokio::spawn(publish_paced(
            producer_nodes.to_vec(),
            names.inbound_exchange(),
            messages(&names, count),
            per_second,
            confirmed.clone(),
        ));
        Run { names, store, daemon, confirmed, producer }
    }

    /// Waits until `at_least` envelopes are confirmed by the broker.
    async fn published(&self, at_least: usize, what: &str) {
        wait_count(&self.confirmed, at_least, Duration::from_secs(60), what).await;
    }

    /// Once the producer is done: every envelope delivered in order (but for messages numbered
    /// below `reorder_below`) and applied once.
    async fn assert_settled(self, count: usize, reorder_below: usize) {
        let producer = tokio::time::timeout(Duration::from_secs(300), self.producer).await;
        let confirmed = self.confirmed.load(std::sync::atomic::Ordering::SeqCst);
        producer
            .unwrap_or_else(|_| panic!("the producer did not finish in 300 s: {confirmed} confirmed"))
            .expect("the producer finishes");
        assert_delivered_in_order(&self.names, count, reorder_below).await;
        assert_applied_once(self.daemon, &self.names, &self.store, count).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_silpgate_is_on_is_killed_and_it_consumes_from_another_within_5_s() {
    let _serial = SERIAL.lock().await;
    let cluster = BrokerCluster::up();
    within(Duration::from_secs(420), async {
        const COUNT: usize = 2000;
        let run = Run::start("bc-kill", &[2, 3], &[1], COUNT, 400);
        let on = connected_node(&run.daemon).expect("connected to node 2 or 3");
        // The agent's queue is led from the node that dies: silpgate's first publishes to it
        // after the move come while the broker still names the dead leader, the case that
        // made RabbitMQ refuse a channel's publishes for minutes.
        move_leader(&run.names.sink(), on);
        run.published(800, "published before the kill").await;
        cluster.kill(on);
        // A queue whose leader died returns the dead consumer's unacknowledged messages only once
        // its new leader has handled the node's loss, which can be after silpgate consumes again
        // from another node: those messages (published before the kill, at most the prefetch)
        // may then reach the agent after later ones of their conversation. Nothing published
        // after the kill may.
        let in_flight_below = run.confirmed.load(std::sync::atomic::Ordering::SeqCst) + 20;
        let killed = Instant::now();
        let moved = loop {
            if let Some(node) = connected_node(&run.daemon)
                && node != on
            {
                break killed.elapsed();
            }
            // Ten times the documented figure (5 s): the figure itself is measured, not asserted.
            assert!(
                killed.elapsed() < Duration::from_secs(50),
                "silpgate did not move to another node in 50 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!("node {on} killed: silpgate consuming from another node after {} ms", moved.as_millis());
        assert_ne!(leader_of(&run.names.sink()), on, "the agent's queue has a new leader");
        run.assert_settled(COUNT, in_flight_below).await;
        // Back to three nodes, so that the cluster is taken down cleanly.
        cluster.start(on);
    })
    .await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_nodes_gone_for_20_s_make_it_hold_not_ready_then_resume_losing_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = BrokerCluster::up();
    within(Duration::from_secs(420), async {
        const COUNT: usize = 1000;
        // On node 1, the one that stays: what silpgate sees is the majority's loss, not its node's.
        let run = Run::start("bc-majority", &[1], &[1], COUNT, 100);
        run.published(300, "published before the nodes stop").await;
        let stopping = Instant::now();
        cluster.stop(2);
        cluster.stop(3);
        let held = loop {
            let (status, body) = run.daemon.get("/readyz");
            if status == 503 && body.contains("holding") {
                break stopping.elapsed();
            }
            assert!(stopping.elapsed() < Duration::from_secs(40), "no hold reported: {status} {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        eprintln!("two nodes stopped: holding (not ready) after {} ms", held.as_millis());
        let log = run.daemon.log_text();
        assert!(
            log.contains("Holding") && log.contains(&run.names.inbound()),
            "the hold is logged, naming the queues:\n{log}"
        );
        // Not ready for as long as the majority is gone (20 s from the stop).
        while stopping.elapsed() < Duration::from_secs(20) {
            assert_ne!(run.daemon.readyz(), 200, "ready while the majority is lost");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        cluster.start(2);
        cluster.start(3);
        run.daemon.wait_ready(Duration::from_secs(60));
        eprintln!("majority back: ready again {} ms after the stop", stopping.elapsed().as_millis());
        run.assert_settled(COUNT, 0).await;
    })
    .await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_the_three_brokers_under_200_per_second_loses_nothing_and_keeps_order() {
    let _serial = SERIAL.lock().await;
    let cluster = BrokerCluster::up();
    within(Duration::from_secs(600), async {
        // Published for as long as the restarts take (about 25 s), then the rest.
        const COUNT: usize = 6_000;
        let run = Run::start("bc-rolling", &[1, 2, 3], &[1, 2, 3], COUNT, 200);
        run.published(400, "published before the restarts").await;
        let started = Instant::now();
        for node in [2, 3, 1] {
            cluster.restart(node);
            eprintln!(
                "node {node} restarted at {} ms; {} published",
                started.elapsed().as_millis(),
                run.confirmed.load(std::sync::atomic::Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        run.daemon.wait_ready(Duration::from_secs(60));
        assert!(connected_node(&run.daemon).is_some(), "/readyz names the node silpgate is on");
        run.assert_settled(COUNT, 0).await;
        eprintln!("all delivered at {} ms", started.elapsed().as_millis());
    })
    .await;
    drop(cluster);
}

/// Cluster mode's SIGKILL test on the three-node broker, with broker node 2 SIGKILLed between
/// the two instance kills: every instance reaches the broker through all three addresses, and
/// the partition queues, changelog streams and lock stream are replicated on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_on_three_brokers_loses_nothing_when_instances_and_a_broker_node_are_killed() {
    let _serial = SERIAL.lock().await;
    // Its bound on what a broker node's death holds back (below) was measured on a cluster of
    // its own, where the queues' leaders are placed as on a new deployment.
    let brokers = BrokerCluster::fresh();
    within(Duration::from_secs(480), async {
        let mut cluster = Instances::new("bc-cluster");
        let every_node = |config: String| {
            let urls: Vec<String> = [1, 2, 3].iter().map(|&n| format!("\"{}\"", url(n))).collect();
            config.replace(
                &format!("url = \"{}\"\n", broker::url()),
                &format!("urls = [{}]\n", urls.join(", ")),
            )
        };
        for name in ["a", "b", "c"] {
            cluster.start_with(name, every_node);
        }
        let names = cluster.names.clone();
        // The producer and the reader stay on node 1, which is never killed.
        let (_connection, channel) = broker::channel().await;
        let killed_node = 2;
        publish_in_chunks(&channel, &names, 0..3000, |published| match published {
            1000 => {
                cluster.wait_serving("b");
                cluster.kill("b");
            }
            1500 => {
                // The node dies once the instance kill's takeovers are over: a node's death in
                // the middle of a takeover is another fault (docs/cluster.md, not guaranteed).
                for survivor in ["a", "c"] {
                    cluster.wait_serving(survivor);
                }
                brokers.kill(killed_node);
            }
            2000 => {
                cluster.wait_serving("c");
                cluster.kill("c");
            }
            _ => {}
        })
        .await;
        // A broker node's death may hold back the messages the broker had handed to consumers
        // on that node before it noticed (docs/cluster.md, "Not guaranteed"): at most each
        // partition's prefetch (32) before the kill at 1,500, and one message per conversation
        // after it. They come once the broker has dealt with the loss; every other message
        // keeps its order.
        let around_the_node_kill =
            1500 - usize::from(PARTITIONS) * 32..1500 + support::cluster::CONVERSATIONS;
        a_fresh_instance_takes_over_after_the_kills(
            &mut cluster,
            &channel,
            |cluster| cluster.start_with("d", every_node),
            around_the_node_kill,
        )
        .await;
        // Back to three nodes, so that the cluster is taken down cleanly.
        brokers.start(killed_node);
    })
    .await;
    drop(brokers);
}
