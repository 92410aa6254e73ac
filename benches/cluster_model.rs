//! The scaling model of cluster mode for 10, 100 and 1,000 instances: channels per instance,
//! operations per second at the broker, throughput, and the time to take over after a crash.
//!
//! The partition shares are not estimated: they are computed with the ranking the instances use
//! (`silpgate::cluster::rendezvous`) over generated member names, and a crash and a join are
//! simulated on them (which partitions move, and how many the busiest instance takes). The
//! replay cost of a takeover is measured here, on a real sled store: `snapshot_every` changelog
//! entries decoded and applied (reading them from the stream is not included). The other costs
//! are inputs measured elsewhere (docs/performance.md says where); change them with `--cpu-us`,
//! `--cores`, `--broker-ops`, `--grace-ms`, `--new-ir` to see another deployment.
//!
//! `cargo bench --bench cluster_model` prints the table that docs/cluster.md carries;
//! `cargo test --all-targets` runs it as a smoke test.

use silpgate::cluster::rendezvous;
use silpgate::gateway::session::Partition;
use silpgate::gateway::store::{LedgerState, SessionRecord};
use silpgate::store::SledStore;
use silpgate::store::replica::PartitionChange;
use std::time::Instant;

/// What a message and a hand-over cost, measured; see the module header.
#[derive(Debug, Clone, Copy)]
struct Costs {
    /// CPU of an instance per message relayed (benches/amqp.rs, staged store).
    cpu_us: f64,
    /// Cores each instance has.
    cores: f64,
    /// Operations per second one broker node carries (benches/amqp.rs: the bare relay's
    /// messages per second times its 4 operations per message, on this machine).
    broker_ops: f64,
    /// Replaying one changelog entry in a takeover (measured: [`measure_replay_us`]).
    replay_us: f64,
    /// Grace a new owner gives the previous owner's deliveries to return (handover.rs).
    grace_ms: f64,
    /// Share of messages that freeze a new compile (a lock-stream proposal every instance reads).
    new_ir: f64,
    /// Changes between two snapshots of a partition (`cluster.snapshot_every`): a takeover
    /// replays at most this many entries.
    snapshot_every: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            cpu_us: 150.0,
            cores: 2.0,
            broker_ops: 75_000.0,
            replay_us: 0.0,
            grace_ms: 500.0,
            new_ir: 0.01,
            snapshot_every: 1_000.0,
        }
    }
}

/// Broker operations per message relayed through a partition, each publish and its confirm
/// counted apart: the partition's delivery and ack (2), the agent publish and confirm (2), the
/// changelog append and confirm (2), the ingress forward from an inbound queue (delivery,
/// publish, confirm, ack: 4).
const OPS_PER_MESSAGE: f64 = 10.0;
/// Channels an instance opens besides its partitions': consuming, publishing, members, lock
/// stream.
const FIXED_CHANNELS: usize = 4;

struct Row {
    instances: usize,
    partitions: u16,
    channels_max: usize,
    channels_mean: f64,
    owned_max: usize,
    idle: usize,
    ops_messages: f64,
    ops_heartbeats: f64,
    ops_lock: f64,
    throughput: f64,
    broker_nodes: f64,
    moved_on_join: usize,
    moved_on_crash: usize,
    takeover_ms: f64,
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("silpgate-{i}")).collect()
}

/// Partitions whose owner differs between two member lists.
fn moved(partitions: u16, before: &[String], after: &[String]) -> usize {
    (0..partitions).filter(|&p| rendezvous::owner(p, before) != rendezvous::owner(p, after)).count()
}

fn model(instances: usize, partitions: u16, standby: u16, costs: Costs) -> Row {
    let names = members(instances);
    let shares: Vec<_> = names.iter().map(|n| rendezvous::share(partitions, &names, standby, n)).collect();
    let channels: Vec<usize> = shares.iter().map(|s| s.subscribed().len() + FIXED_CHANNELS).collect();
    let owned: Vec<usize> = shares.iter().map(|s| s.owned.len()).collect();

    // A crash of the busiest owner: its partitions go to their standbys.
    let busiest = (0..instances).max_by_key(|&i| owned[i]).expect("instances");
    let survivors: Vec<String> = names.iter().filter(|n| **n != names[busiest]).cloned().collect();
    let moved_on_crash = moved(partitions, &names, &survivors);
    let mut joined = names.clone();
    joined.push(format!("silpgate-{instances}"));
    let moved_on_join = moved(partitions, &names, &joined);

    // Conversations spread evenly over partitions, and an instance relays only what its
    // partitions carry: the cluster saturates when the busiest instance (the most partitions)
    // does.
    let instance_capacity = costs.cores * 1e6 / costs.cpu_us;
    let throughput = instance_capacity * f64::from(partitions) / owned[busiest] as f64;

    let n = instances as f64;
    let ops_messages = throughput * OPS_PER_MESSAGE;
    // Each heartbeat is one publish and a delivery to every member's queue.
    let ops_heartbeats = n + n * n;
    // Every proposal is one publish and confirm, and every instance reads it.
    let ops_lock = throughput * costs.new_ir * (2.0 + n);
    // A takeover replays at most one snapshot interval per partition it takes; the partitions of
    // the crashed owner are taken by different standbys side by side, so the slowest is one.
    let takeover_ms = costs.grace_ms + costs.snapshot_every * costs.replay_us / 1_000.0;
    Row {
        instances,
        partitions,
        channels_max: *channels.iter().max().unwrap_or(&0),
        channels_mean: channels.iter().sum::<usize>() as f64 / n,
        owned_max: owned[busiest],
        idle: owned.iter().filter(|&&o| o == 0).count(),
        ops_messages,
        ops_heartbeats,
        ops_lock,
        throughput,
        broker_nodes: (ops_messages + ops_heartbeats + ops_lock) / costs.broker_ops,
        moved_on_join,
        moved_on_crash,
        takeover_ms,
    }
}

/// Microseconds to decode and apply one changelog entry to a sled store, over `entries`.
fn measure_replay_us(entries: u64) -> f64 {
    let dir = std::env::temp_dir().join(format!("silpgate-cluster-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = SledStore::open(&dir, None).expect("store opens");
    let partition = Partition { index: 3, count: 64 };
    let encoded: Vec<Vec<u8>> = (0..entries)
        .map(|i| {
            let session = SessionRecord {
                id: "a7".into(),
                token: format!("conversation-{}", i % 200),
                turns: i / 200 + 1,
                heartbeat: 10,
                last_activity: 1_700_000_000_000 + i,
                started: 1_700_000_000_000,
                renewal_due: false,
                expired: false,
                partition: Some(partition.index),
                owner: None,
            };
            let message = Some((format!("message-{i}"), LedgerState::Published));
            serde_json::to_vec(&PartitionChange::Session { session, message }).unwrap()
        })
        .collect();
    let started = Instant::now();
    for (offset, bytes) in encoded.iter().enumerate() {
        let change: PartitionChange = serde_json::from_slice(bytes).unwrap();
        store.apply_change(partition, &change, Some(offset as u64), 0).unwrap();
    }
    silpgate::gateway::store::Store::flush(&store).unwrap();
    let per_entry = started.elapsed().as_secs_f64() * 1e6 / entries as f64;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    per_entry
}

fn flag(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}")))
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let d = Costs::default();
    let costs = Costs {
        cpu_us: flag(&args, "--cpu-us", d.cpu_us),
        cores: flag(&args, "--cores", d.cores),
        broker_ops: flag(&args, "--broker-ops", d.broker_ops),
        replay_us: measure_replay_us(d.snapshot_every as u64),
        grace_ms: flag(&args, "--grace-ms", d.grace_ms),
        new_ir: flag(&args, "--new-ir", d.new_ir),
        snapshot_every: d.snapshot_every,
    };
    // `cargo bench` passes --bench; the smoke run of `cargo test --all-targets` stops at 100.
    let sizes: &[(usize, u16)] = if args.iter().any(|a| a == "--bench") {
        &[(10, 64), (100, 512), (1_000, 1_296)]
    } else {
        &[(10, 64), (100, 512)]
    };
    println!("{costs:?}, standby 1, {OPS_PER_MESSAGE} broker operations per message");
    println!(
        "| instances | P | channels per instance (max / mean) | most partitions on one instance | instances owning none | throughput the instances carry | broker ops/s at that rate: messages + heartbeats + lock stream | broker nodes that takes | partitions moved by a join | by a crash | takeover after a crash |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &(instances, partitions) in sizes {
        let r = model(instances, partitions, 1, costs);
        // What the simulation must show, or the model is wrong: a crash moves exactly the
        // crashed owner's partitions, a join a share of them, and every partition is consumed
        // by its owner and one standby (so the channels average FIXED + 2P/N).
        assert_eq!(r.moved_on_crash, r.owned_max, "a crash moves the crashed owner's partitions");
        assert!(r.moved_on_join < usize::from(partitions), "a join moves a share, not everything");
        let expected_mean = FIXED_CHANNELS as f64 + 2.0 * f64::from(partitions) / instances as f64;
        assert!((r.channels_mean - expected_mean).abs() < 1e-9, "{} != {expected_mean}", r.channels_mean);
        println!(
            "| {} | {} | {} / {:.1} | {} | {} | {:.0} msg/s | {:.0} + {:.0} + {:.0} | {:.1} | {} | {} | {:.0} ms |",
            r.instances,
            r.partitions,
            r.channels_max,
            r.channels_mean,
            r.owned_max,
            r.idle,
            r.throughput,
            r.ops_messages,
            r.ops_heartbeats,
            r.ops_lock,
            r.broker_nodes,
            r.moved_on_join,
            r.moved_on_crash,
            r.takeover_ms,
        );
    }
}
