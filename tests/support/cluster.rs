//! Cluster mode under test: several silpgate instances over the partitions of one test's
//! topology, the envelopes they are fed, and the checks every cluster test makes of what
//! reaches the downstream queue and of the stores.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use super::broker::{self, Daemon, Names, Received};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use silpgate::cluster::rendezvous;
use silpgate::nlip::{self, Encoding, Limits};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const PARTITIONS: u16 = 16;
pub const CONVERSATIONS: usize = 300;
/// `[sessions] heartbeat` in the test configuration.
pub const HEARTBEAT: u64 = 10;
/// How long the downstream queue is read for a test's messages.
pub const LONG: Duration = Duration::from_secs(120);
/// How long a whole test may take.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// Instances of one test: their names, store directories and running processes.
pub struct Instances {
    pub names: Names,
    pub dir: PathBuf,
    pub running: BTreeMap<String, Daemon>,
}

impl Instances {
    pub fn new(test: &str) -> Instances {
        Instances { names: Names::new(test), dir: broker::temp_dir(test), running: BTreeMap::new() }
    }

    pub fn store(&self, instance: &str) -> PathBuf {
        self.dir.join(instance).join("store")
    }

    /// Starts (or restarts, on its store) the instance `name`, and waits until it is ready.
    pub fn start(&mut self, name: &str) {
        self.start_with(name, |config| config);
    }

    /// [`Instances::start`] with the configuration as `edit` makes it.
    pub fn start_with(&mut self, name: &str, edit: impl Fn(String) -> String) {
        self.launch_with(name, edit);
        self.running[name].wait_ready(Duration::from_secs(60));
    }

    /// Starts the instance `name` with the configuration as `edit` makes it, and returns once
    /// it listens: not ready yet, its share's hand-overs to come (`/readyz` waits for them).
    pub fn launch_with(&mut self, name: &str, edit: impl Fn(String) -> String) {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let amqp = "prefetch = 256\nworkers = 32\n";
        let config = edit(self.names.config(&self.store(name), amqp, true))
            + &self.names.cluster_section(PARTITIONS, name, 100);
        let daemon = Daemon::start(&config, &dir);
        self.running.insert(name.to_owned(), daemon);
    }

    pub fn kill(&mut self, name: &str) {
        self.running.remove(name).expect("running").kill();
    }

    /// Waits until `name` hears every running instance, takes nothing over and hands nothing
    /// on, and serves at least one partition, or is due to: it ranks itself first for
    /// partitions it consumes, and no other instance serves those any more (their hand-overs
    /// are done). A kill before that would test nothing, and one in the middle of a takeover
    /// or a hand-over tests something else (docs/cluster.md, what is not guaranteed). An idle partition is taken over
    /// on its first delivery, and this is called between two chunks of a stream, when no
    /// delivery comes. Blocking.
    pub fn wait_serving(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let running: Vec<&str> = self.running.keys().map(String::as_str).collect();
        let owned = |status: &serde_json::Value| -> Vec<u64> {
            status["owned"]
                .as_array()
                .map(|o| o.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default()
        };
        loop {
            let status = self.status(name);
            let hears_all = status["members"] == serde_json::json!(running);
            let due: Vec<u64> = status["partitions"]
                .as_array()
                .map(|partitions| {
                    partitions
                        .iter()
                        .filter(|p| p["owner"] == name && p["subscribed"] == true)
                        .filter_map(|p| p["partition"].as_u64())
                        .collect()
                })
                .unwrap_or_default();
            let let_go = || {
                running.iter().filter(|other| **other != name).all(|other| {
                    let theirs = owned(&self.status(other));
                    due.iter().all(|p| !theirs.contains(p))
                })
            };
            // Nothing in flux here: no takeover under way, nothing served that is to be handed on.
            let settled = status["taking_over"].as_array().is_some_and(Vec::is_empty)
                && owned(&status).iter().all(|p| due.contains(p));
            if hears_all && settled && (!owned(&status).is_empty() || (!due.is_empty() && let_go())) {
                return;
            }
            assert!(Instant::now() < deadline, "{name} serves no partition: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `name` serves every partition (the only instance, under traffic).
    pub async fn wait_serving_all(&self, name: &str) {
        let deadline = Instant::now() + LONG;
        while self.status(name)["owned"].as_array().map_or(0, Vec::len) < usize::from(PARTITIONS) {
            assert!(Instant::now() < deadline, "{name} did not take every partition over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn terminate(&mut self, name: &str) {
        let (status, _) = self.running.remove(name).expect("running").terminate(Duration::from_secs(40));
        assert!(status.success(), "{name} exits 0 on SIGTERM: {status}");
    }

    pub fn status(&self, name: &str) -> serde_json::Value {
        let (code, body) = self.running[name].get("/cluster");
        assert_eq!(code, 200, "GET /cluster: {body}");
        serde_json::from_str(&body).expect("the cluster status is JSON")
    }

    /// Waits until the running instances agree on the members and each owns and waits on
    /// exactly its rendezvous share (owner plus one standby per partition), and that has held,
    /// takeover counts unchanged, for 3 s. Returns each instance's takeovers since its start.
    pub async fn wait_stable(&self) -> BTreeMap<String, u64> {
        let members: Vec<String> = self.running.keys().cloned().collect();
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut stable_since: Option<(Instant, BTreeMap<String, u64>)> = None;
        loop {
            let mut takeovers = BTreeMap::new();
            let mut off = Vec::new();
            for name in &members {
                let status = self.status(name);
                let share = rendezvous::share(PARTITIONS, &members, 1, name);
                let numbers = |v: &serde_json::Value| -> Vec<u16> {
                    v.as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as u16).collect()
                };
                let heard: Vec<String> = status["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_str().unwrap().to_owned())
                    .collect();
                if numbers(&status["owned"]) != share.owned
                    || numbers(&status["subscribed"]) != share.subscribed()
                    || heard != members
                {
                    off.push(format!("{name}: expected {share:?} among {members:?}, status {status}"));
                }
                takeovers.insert(name.clone(), status["takeovers"].as_u64().unwrap());
            }
            if !off.is_empty() {
                stable_since = None;
            } else if stable_since.as_ref().is_none_or(|(_, seen)| *seen != takeovers) {
                stable_since = Some((Instant::now(), takeovers));
            } else if let Some((since, seen)) = &stable_since
                && since.elapsed() >= Duration::from_secs(3)
            {
                return seen.clone();
            }
            assert!(Instant::now() < deadline, "the shares did not settle:\n{}", off.join("\n"));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every running instance hears all the others.
    pub async fn wait_members(&self) {
        let members: Vec<String> = self.running.keys().cloned().collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let heard: Vec<serde_json::Value> =
                members.iter().map(|n| self.status(n)["members"].clone()).collect();
            if heard.iter().all(|h| *h == serde_json::json!(members)) {
                return;
            }
            assert!(Instant::now() < deadline, "the members did not hear each other: {heard:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until every running instance has applied the lock stream to the same offset.
    pub async fn wait_lock_followed(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let offsets: BTreeSet<String> =
                self.running.keys().map(|n| self.status(n)["lock"]["applied_offset"].to_string()).collect();
            if offsets.len() == 1 {
                return;
            }
            assert!(Instant::now() < deadline, "lock stream offsets differ: {offsets:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Makes the downstream agent's queue refuse every publish (a policy of length 0 that rejects
/// what does not fit), as a full queue does; returns the policy's name, for `clear_policy`.
pub fn refuse_publishes_to_the_agent(names: &Names) -> String {
    let policy = format!("{}-full", names.prefix);
    let sink = format!("^{}$", names.sink().replace('.', "\\."));
    broker::rabbitmqctl(&[
        "set_policy",
        "--apply-to",
        "queues",
        &policy,
        &sink,
        r#"{"max-length": 0, "overflow": "reject-publish"}"#,
    ]);
    // The broker applies a policy to the queues it has a moment after it stores it (a queue
    // declared later takes it at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queues = broker::rabbitmqctl(&["list_queues", "--quiet", "--no-table-headers", "name", "policy"]);
        let sink = queues.lines().find_map(|line| {
            let mut columns = line.split_whitespace();
            (columns.next() == Some(names.sink().as_str()))
                .then(|| columns.next().unwrap_or_default().to_owned())
        });
        if sink.is_none_or(|applied| applied == policy) {
            return policy;
        }
        assert!(
            Instant::now() < deadline,
            "the policy {policy} never applied to the agent's queue: {queues}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a test's body, failing it if it takes longer than [`TEST_LIMIT`].
pub async fn within_limit(test: &str, body: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(TEST_LIMIT, body).await.is_err() {
        panic!("{test} did not finish within {TEST_LIMIT:?}");
    }
}

pub fn header(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// Envelopes `range` over the 300 conversations (message `i` belongs to conversation
/// `i % 300`). Two conversations in three go through silpgate's ingress (the inbound queue);
/// every third is published straight to the partition exchange with its conversation header.
pub fn batch(
    names: &Names,
    range: std::ops::Range<usize>,
) -> Vec<(String, String, Vec<u8>, BasicProperties)> {
    range
        .map(|i| {
            let conversation = i % CONVERSATIONS;
            let properties = BasicProperties::default()
                .with_message_id(format!("m-{i}").into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let body = broker::envelope(i, conversation, None);
            if conversation.is_multiple_of(3) {
                let mut headers = FieldTable::default();
                headers.insert("nlip-conversation".into(), header(&format!("conv-{conversation}")));
                (names.partition_exchange(), String::new(), body, properties.with_headers(headers))
            } else {
                (names.inbound_exchange(), names.inbound(), body, properties)
            }
        })
        .collect()
}

pub async fn publish(channel: &lapin::Channel, messages: Vec<(String, String, Vec<u8>, BasicProperties)>) {
    let mut by_exchange: BTreeMap<String, Vec<(String, Vec<u8>, BasicProperties)>> = BTreeMap::new();
    for (exchange, key, body, properties) in messages {
        by_exchange.entry(exchange).or_default().push((key, body, properties));
    }
    for (exchange, messages) in by_exchange {
        broker::publish_all(channel, &exchange, messages).await;
    }
}

/// Publishes `range` in chunks of 500, calling `between` after each chunk.
pub async fn publish_in_chunks(
    channel: &lapin::Channel,
    names: &Names,
    range: std::ops::Range<usize>,
    mut between: impl FnMut(usize),
) {
    let mut at = range.start;
    while at < range.end {
        let end = (at + 500).min(range.end);
        publish(channel, batch(names, at..end)).await;
        between(end);
        at = end;
    }
}

/// What reached the downstream queue, per conversation.
#[derive(Default)]
pub struct Delivered {
    /// Inbound message numbers in arrival order (duplicates included).
    pub forwarded: BTreeMap<usize, Vec<usize>>,
    /// (session id, turn) of every renewal notice.
    pub notices: BTreeMap<usize, Vec<(String, u64)>>,
}

pub fn conversation_of(message: &nlip::Message) -> usize {
    let token = message.conversation_token().expect("every envelope carries its conversation");
    token.strip_prefix("conv-").and_then(|n| n.parse().ok()).expect("conv-<n>")
}

pub fn read_delivered(got: &[Received]) -> Delivered {
    let mut delivered = Delivered::default();
    for r in got {
        let encoding = Encoding::from_content_type(r.content_type.as_deref().unwrap_or_default()).unwrap();
        let message = nlip::decode(&r.body, encoding, &Limits::default()).expect("valid NLIP downstream");
        let conversation = conversation_of(&message);
        // A renewal notice travels inside the message it comes with.
        for notice in
            message.submessages().iter().filter(|s| silpgate::gateway::session::is_renewal_notice(s))
        {
            let nlip::Content::Json(content) = &notice.content else { panic!("a notice is JSON") };
            let session = content["session"].as_str().expect("a notice names its session").to_owned();
            delivered
                .notices
                .entry(conversation)
                .or_default()
                .push((session, content["turn"].as_u64().unwrap()));
        }
        let inbound = r.message_id.rsplit_once(':').expect("<inbound id>:<n>").0;
        let number = inbound.strip_prefix("m-").and_then(|n| n.parse().ok()).expect("m-<i>");
        delivered.forwarded.entry(conversation).or_default().push(number);
    }
    delivered
}

/// Reads the downstream queue until every one of `count` messages has arrived.
pub async fn collect_all(channel: &lapin::Channel, names: &Names, count: usize) -> Delivered {
    let mut seen = BTreeSet::new();
    let got = broker::collect(channel, &names.sink(), LONG, |got| {
        if let Some(last) = got.last() {
            let delivered = read_delivered(std::slice::from_ref(last));
            seen.extend(delivered.forwarded.into_values().flatten());
        }
        seen.len() >= count
    })
    .await;
    // A last look for duplicates still on their way.
    let mut rest = broker::collect(channel, &names.sink(), Duration::from_secs(2), |_| false).await;
    let mut all = got;
    all.append(&mut rest);
    read_delivered(&all)
}

/// Every message arrived, in order per conversation; renewal notices exactly after every 10th
/// turn, all naming one session.
pub fn assert_delivered(delivered: &Delivered, count: usize) {
    assert_delivered_but_late(delivered, count, 0..0);
}

/// [`assert_delivered`], except that the messages numbered in `may_be_late` may come after
/// later ones of their conversation (each still once): those a broker node's death caught on
/// their way to a consumer on that node, which the broker returns only once it has dealt with
/// the node's loss (docs/cluster.md, "Not guaranteed"). Every other message keeps its order.
pub fn assert_delivered_but_late(delivered: &Delivered, count: usize, may_be_late: std::ops::Range<usize>) {
    let mut out_of_order = Vec::new();
    let mut distinct = 0;
    for conversation in 0..CONVERSATIONS.min(count) {
        let expected: Vec<usize> = (conversation..count).step_by(CONVERSATIONS).collect();
        let arrived = delivered.forwarded.get(&conversation).cloned().unwrap_or_default();
        let mut first_seen = Vec::new();
        for n in arrived {
            if !first_seen.contains(&n) {
                first_seen.push(n);
            }
        }
        let mut sorted = first_seen.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, expected, "conv-{conversation}: every message");
        let on_time = |order: &[usize]| -> Vec<usize> {
            order.iter().copied().filter(|n| !may_be_late.contains(n)).collect()
        };
        if on_time(&first_seen) != on_time(&expected) {
            out_of_order.push(format!("conv-{conversation}: {first_seen:?}"));
        }
        distinct += first_seen.len();

        let notices = delivered.notices.get(&conversation).cloned().unwrap_or_default();
        let turns: BTreeSet<u64> = notices.iter().map(|&(_, t)| t).collect();
        let due: BTreeSet<u64> = (1..=expected.len() as u64)
            .filter(|t| *t > HEARTBEAT && (t - 1).is_multiple_of(HEARTBEAT))
            .collect();
        assert_eq!(turns, due, "conv-{conversation}: a renewal notice after exactly every {HEARTBEAT} turns");
    }
    assert_eq!(distinct, count);
    assert!(
        out_of_order.is_empty(),
        "{} of {CONVERSATIONS} conversations out of order:\n{}",
        out_of_order.len(),
        out_of_order.join("\n")
    );
}

/// The sessions in the stores: per conversation, the highest turn count any instance's store
/// holds equals its messages (a partition's last owner holds its latest state; an earlier
/// owner's copy can only be behind), and every store that holds the conversation, and every
/// renewal notice, names the same session id (a session lost and started again would take a
/// new one).
pub fn assert_sessions(stores: &[PathBuf], delivered: &Delivered, count: usize) {
    let mut turns: HashMap<String, u64> = HashMap::new();
    let mut ids: HashMap<String, BTreeSet<String>> = HashMap::new();
    for store in stores {
        for (token, (id, t)) in broker::sessions(store) {
            let entry = turns.entry(token.clone()).or_default();
            *entry = (*entry).max(t);
            ids.entry(token).or_default().insert(id);
        }
    }
    for conversation in 0..CONVERSATIONS.min(count) {
        let token = format!("conv-{conversation}");
        let expected = (conversation..count).step_by(CONVERSATIONS).count() as u64;
        let arrived = delivered.forwarded.get(&conversation);
        assert_eq!(
            turns.get(&token),
            Some(&expected),
            "turns of {token}; arrived (with copies): {arrived:?}"
        );
        let mut named = ids.remove(&token).unwrap_or_default();
        let notices = delivered.notices.get(&conversation).into_iter().flatten();
        named.extend(notices.map(|(session, _)| session.clone()));
        assert_eq!(named.len(), 1, "{token} keeps one session id, in every store and notice: {named:?}");
    }
}

/// Runs the command line with `args`, bounded: a command that hangs fails the test.
pub fn silpgate(args: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(args);
    super::process::run_bounded(command, Duration::from_secs(60))
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("the tests' paths are UTF-8")
}

pub fn lock_export(store: &Path) -> String {
    let out = silpgate(&["lock", "export", "--store", path(store)]);
    assert!(out.status.success(), "lock export: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

pub fn lock_verifies(store: &Path) -> bool {
    silpgate(&["lock", "verify", "--store", path(store)]).status.success()
}

/// The second half of the SIGKILL tests, after b and c were killed among a, b and c with 3,000
/// envelopes published: a fresh instance d on an empty store (started by `start_fresh`) joins
/// and 3,000 more are published; every one of the 6,000 is delivered in order and counted once,
/// d rebuilt its partitions from the changelogs, and its compile.lock equals a's.
pub async fn a_fresh_instance_takes_over_after_the_kills(
    cluster: &mut Instances,
    channel: &lapin::Channel,
    start_fresh: impl FnOnce(&mut Instances),
    may_be_late: std::ops::Range<usize>,
) {
    let names = cluster.names.clone();
    // The survivor hands the fresh instance half the partitions, which it rebuilds from their
    // changelogs.
    start_fresh(cluster);
    publish_in_chunks(channel, &names, 3000..6000, |_| {}).await;
    let count = 6000;
    let delivered = collect_all(channel, &names, count).await;
    assert_delivered_but_late(&delivered, count, may_be_late);

    // Started on an empty store, it has read each partition it serves from its changelog: as
    // a standby following it while the hand-over came (its readiness waits for that), or in
    // the replay of its takeover.
    let fresh = cluster.status("d");
    let owned: Vec<&serde_json::Value> =
        fresh["partitions"].as_array().unwrap().iter().filter(|p| p["owned"] == true).collect();
    assert!(!owned.is_empty(), "the fresh instance serves partitions: {fresh}");
    assert!(
        owned.iter().all(|p| p["changelog_applied_offset"].as_u64().is_some_and(|o| o > 0)),
        "the fresh instance rebuilt its partitions from the changelogs: {fresh}"
    );

    cluster.wait_lock_followed().await;
    for name in ["a", "d"] {
        cluster.terminate(name);
    }
    let stores: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(|n| cluster.store(n)).collect();
    assert_sessions(&stores, &delivered, count);
    let (a, d) = (lock_export(&stores[0]), lock_export(&stores[3]));
    assert_eq!(a, d, "the fresh instance holds the same compile.lock, from the lock stream");
    assert!(lock_verifies(&stores[3]));
}
