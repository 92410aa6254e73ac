//! Cluster mode against the real RabbitMQ on 127.0.0.1:5672: several silpgate processes over
//! 16 partitions. Every test checks, from what reaches the downstream queue and from the
//! stores: every message delivered, each conversation's messages in order, one session id per
//! conversation (the same in every store that holds it, and in its renewal notices) with a
//! renewal notice at exactly every 10th turn, and a turn count equal to the conversation's
//! messages (nothing lost, reset or applied twice). Every wait is bounded: a test fails with
//! a message rather than hang.

mod support;

use futures_util::{SinkExt, StreamExt};
use lapin::BasicProperties;
use lapin::types::FieldTable;
use silpgate::cluster::rendezvous;
use silpgate::nlip::{self, Encoding, Limits};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::broker::{self, Names};
use support::cluster::*;

/// The tests share one broker on two cores: three instances each are load enough; one test at a
/// time keeps their timing honest.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_16_partitions_and_deliver_3600_envelopes_in_order() {
    let _serial = SERIAL.lock().await;
    within_limit("three_instances_share_16_partitions_and_deliver_3600_envelopes_in_order", async {
        let mut cluster = Instances::new("cluster-three");
        let (_connection, channel) = broker::channel().await;
        for name in ["a", "b", "c"] {
            cluster.start(name);
        }
        // 12 turns for each of the 300 conversations: every session renews once on the way.
        let count = 3_600;
        publish_in_chunks(&channel, &cluster.names, 0..count, |_| {}).await;
        let delivered = collect_all(&channel, &cluster.names, count).await;
        assert_delivered(&delivered, count);

        // The partitions are shared: each owned by exactly one instance, and no instance idle.
        let statuses: Vec<serde_json::Value> = ["a", "b", "c"].iter().map(|n| cluster.status(n)).collect();
        let mut owners: BTreeMap<u64, usize> = BTreeMap::new();
        for status in &statuses {
            for p in status["owned"].as_array().unwrap() {
                *owners.entry(p.as_u64().unwrap()).or_default() += 1;
            }
        }
        assert!(owners.values().all(|&n| n == 1), "no partition has two owners: {owners:?}");
        for (name, status) in ["a", "b", "c"].iter().zip(&statuses) {
            assert!(!status["owned"].as_array().unwrap().is_empty(), "{name} serves partitions: {status}");
        }
        // The operator's view of the same: `silpgate cluster status`.
        let url = format!("http://{}", cluster.running["a"].http);
        let out = silpgate(&["cluster", "status", "--url", &url]);
        assert!(out.status.success(), "cluster status: {}", String::from_utf8_lossy(&out.stderr));
        let table = String::from_utf8(out.stdout).unwrap();
        let owned = statuses[0]["owned"].as_array().unwrap().len();
        assert!(
            table.starts_with(&format!("instance a: owns {owned} of {PARTITIONS} partitions")),
            "{table}"
        );
        assert_eq!(table.lines().filter(|l| l.contains(" yes ")).count(), owned, "{table}");
        assert!(table.contains("lock stream"), "{table}");

        // One compile.lock for the cluster: every instance's chain is the same, and verifies.
        cluster.wait_lock_followed().await;
        for name in ["a", "b", "c"] {
            cluster.terminate(name);
        }
        let stores: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| cluster.store(n)).collect();
        assert_sessions(&stores, &delivered, count);
        let exports: Vec<String> = stores.iter().map(|s| lock_export(s)).collect();
        assert!(exports[0].lines().count() > 1, "the chain holds records");
        assert!(exports.iter().all(|e| *e == exports[0]), "every instance exports the same compile.lock");
        assert!(stores.iter().all(|s| lock_verifies(s)), "every chain verifies");
        cluster.names.clean_up(&channel, PARTITIONS).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sigkills_and_a_fresh_instance_lose_no_message_and_no_session_state() {
    let _serial = SERIAL.lock().await;
    within_limit("two_sigkills_and_a_fresh_instance_lose_no_message_and_no_session_state", async {
        let mut cluster = Instances::new("cluster-kill");
        let (_connection, channel) = broker::channel().await;
        for name in ["a", "b", "c"] {
            cluster.start(name);
        }
        let names = cluster.names.clone();
        // SIGKILL one instance mid-stream, then a second one, each while it serves partitions.
        publish_in_chunks(&channel, &names, 0..3000, |published| {
            let victim = match published {
                1000 => "b",
                2000 => "c",
                _ => return,
            };
            cluster.wait_serving(victim);
            cluster.kill(victim);
        })
        .await;
        a_fresh_instance_takes_over_after_the_kills(
            &mut cluster,
            &channel,
            |cluster| cluster.start("d"),
            0..0,
        )
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    within_limit("a_rolling_restart_under_load_loses_nothing", async {
        let mut cluster = Instances::new("cluster-rolling");
        let (_connection, channel) = broker::channel().await;
        for name in ["a", "b", "c"] {
            cluster.start(name);
        }
        let names = cluster.names.clone();
        let count = 3_600;
        publish_in_chunks(&channel, &names, 0..count, |published| {
            let name = match published {
                600 => "a",
                1500 => "b",
                2400 => "c",
                _ => return,
            };
            cluster.terminate(name);
            cluster.start(name);
        })
        .await;
        let delivered = collect_all(&channel, &names, count).await;
        // Nothing lost, in order, sessions and heartbeats intact, across three graceful hand-overs.
        assert_delivered(&delivered, count);
        for name in ["a", "b", "c"] {
            cluster.terminate(name);
        }
        let stores: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| cluster.store(n)).collect();
        assert_sessions(&stores, &delivered, count);
    })
    .await;
}

/// Takeovers between two readings, summed over the instances of the first.
fn takeovers_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after.iter().map(|(name, &n)| n - before.get(name).copied().unwrap_or(0)).sum()
}

/// Publishes 50 envelopes every 250 ms, in order from number `from`, until told to stop;
/// returns the number after the last it published. An instance learns it owns a partition
/// from the partition's first delivery, so steady traffic is what makes ownership (and every
/// takeover) visible.
fn steady_traffic(names: &Names, from: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let names = names.clone();
    tokio::spawn(async move {
        let (_connection, channel) = broker::channel().await;
        let mut published = from;
        while !stop.load(Ordering::Relaxed) {
            publish(&channel, batch(&names, published..published + 50)).await;
            published += 50;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        published
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_instance_joining_and_leaving_moves_only_the_partitions_whose_owner_changes() {
    let _serial = SERIAL.lock().await;
    within_limit(
        "a_fourth_instance_joining_and_leaving_moves_only_the_partitions_whose_owner_changes",
        async {
            let mut cluster = Instances::new("cluster-join");
            let (_connection, channel) = broker::channel().await;
            let (three, four) = (["a", "b", "c"], ["a", "b", "c", "d"]);
            for name in three {
                cluster.start(name);
            }
            let names = cluster.names.clone();
            let stop = Arc::new(AtomicBool::new(false));
            let traffic = steady_traffic(&names, 0, stop.clone());
            let settled = cluster.wait_stable().await;

            // d joins under traffic: only the partitions d ranks first for move, each once, to d.
            cluster.start("d");
            let joined = cluster.wait_stable().await;
            let moved = takeovers_between(&settled, &joined);
            let expected = rendezvous::moved(PARTITIONS, &three, &four) as u64;
            eprintln!("3 -> 4 instances: {moved} takeovers, {expected} partitions change owner");
            assert_eq!(moved, expected, "takeovers on the join: {settled:?} -> {joined:?}");
            assert_eq!(joined["d"], expected, "every partition that moved went to d");
            assert!(expected > 0 && expected <= u64::from(PARTITIONS) / 2, "{expected} of {PARTITIONS} move");

            // Each instance consumes its owned and standby partitions, each on a channel, not all P.
            for name in four {
                let status = cluster.status(name);
                let share = rendezvous::share(PARTITIONS, &four, 1, name);
                let channels = status["channels"]["partitions"].as_u64().unwrap();
                eprintln!(
                    "{name}: owns {:?}, standby for {:?}, {channels} partition channels",
                    share.owned, share.standby
                );
                assert_eq!(channels as usize, share.owned.len() + share.standby.len(), "{name}: {status}");
                assert!(
                    channels < u64::from(PARTITIONS),
                    "{name} does not consume every partition: {status}"
                );
            }
            let url = format!("http://{}", cluster.running["d"].http);
            let out = silpgate(&["cluster", "status", "--url", &url]);
            let table = String::from_utf8(out.stdout).unwrap();
            let json = silpgate(&["cluster", "status", "--json", "--url", &url]);
            let json: serde_json::Value =
                serde_json::from_slice(&json.stdout).expect("cluster status --json");
            let share = rendezvous::share(PARTITIONS, &four, 1, "d");
            assert_eq!(json["owned"], serde_json::json!(share.owned), "{json}");
            assert_eq!(json["standby"], serde_json::json!(share.standby), "{json}");
            assert_eq!(
                json["channels"]["total"],
                serde_json::json!(share.subscribed().len() + share.standby.len() + 4),
                "{json}"
            );
            let standby = share.standby.len();
            assert!(table.contains(&format!("standby for {standby}: ")), "{table}");
            assert!(table.contains("members: a b c d"), "{table}");

            // d leaves (SIGTERM) under traffic: only its partitions move, each once, to its standby.
            cluster.terminate("d");
            let left = cluster.wait_stable().await;
            let moved = takeovers_between(&joined, &left);
            let expected = rendezvous::moved(PARTITIONS, &four, &three) as u64;
            eprintln!("4 -> 3 instances: {moved} takeovers, {expected} partitions change owner");
            let after_leave: BTreeMap<String, u64> = joined.into_iter().filter(|(n, _)| n != "d").collect();
            assert_eq!(moved, expected, "takeovers on the leave: {after_leave:?} -> {left:?}");
            assert_eq!(expected, rendezvous::share(PARTITIONS, &four, 1, "d").owned.len() as u64);

            stop.store(true, Ordering::Relaxed);
            let count = traffic.await.expect("the traffic ran");
            eprintln!("{count} envelopes published during the test");
            let delivered = collect_all(&channel, &names, count).await;
            assert_delivered(&delivered, count);
            for name in three {
                cluster.terminate(name);
            }
            let stores: Vec<PathBuf> = four.iter().map(|n| cluster.store(n)).collect();
            assert_sessions(&stores, &delivered, count);
        },
    )
    .await;
}

/// The front-door agent of [`front_door_compiles_and_pinged_profiles_reach_every_instance`]: the
/// agent a plain HTTP client speaks for (its messages come from the source `http`, and only an
/// agent's own `//ping` changes a configured agent's profile). It is configured to take JSON and
/// its messages land in the sink queue; the route before the catch-all sends `label =
/// "pinged"` to it without waiting for an answer.
fn with_front_door_agent(names: &broker::Names, config: String) -> String {
    let agent = format!(
        "[[agents]]\nname = \"http\"\nfrontends = [\"json\"]\nrouting_key = \"{}\"\ncontent_type = \"application/cbor\"\n\n[[routes]]\nname = \"to-pinged\"\ndestination = \"http\"\nmode = \"transcode\"\nawait = \"none\"\n[routes.match]\nlabel = \"pinged\"\n\n",
        names.sink()
    );
    let first_route = "[[routes]]\nname = \"decode-for-sender\"";
    assert!(config.contains(first_route), "the test configuration has its routes");
    config.replacen(first_route, &format!("{agent}{first_route}"), 1)
}

/// A SILP IR request to the front-door agent: `cancel(order<i>)` in conversation `conv`.
fn pinged_request(i: usize, conv: &str) -> Vec<u8> {
    let mut request = support::gateway::ir_request(i, conv);
    request["label"] = serde_json::json!("pinged");
    serde_json::to_vec(&request).unwrap()
}

/// The compile.lock records an instance's status counts.
fn lock_records(cluster: &Instances, name: &str) -> u64 {
    cluster.status(name)["lock"]["records"].as_u64().expect("lock records in the status")
}

/// Waits until every running instance has applied the lock stream up to `offset`.
async fn wait_lock_applied(cluster: &Instances, offset: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let applied: BTreeMap<String, Option<u64>> = cluster
            .running
            .keys()
            .map(|n| (n.clone(), cluster.status(n)["lock"]["applied_offset"].as_u64()))
            .collect();
        if applied.values().all(|a| a.is_some_and(|a| a >= offset)) {
            return;
        }
        assert!(Instant::now() < deadline, "the lock stream not applied up to {offset}: {applied:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every running instance holds `records` compile.lock records.
async fn wait_lock_records(cluster: &Instances, records: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held: BTreeMap<String, u64> =
            cluster.running.keys().map(|n| (n.clone(), lock_records(cluster, n))).collect();
        if held.values().all(|&r| r == records) {
            return;
        }
        assert!(Instant::now() < deadline, "expected {records} compile.lock records everywhere: {held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_door_compiles_and_pinged_profiles_reach_every_instance() {
    let _serial = SERIAL.lock().await;
    within_limit("front_door_compiles_and_pinged_profiles_reach_every_instance", async {
        let mut cluster = Instances::new("cluster-doors");
        let (_connection, channel) = broker::channel().await;
        for name in ["a", "b"] {
            let names = cluster.names.clone();
            cluster.start_with(name, |config| with_front_door_agent(&names, config));
        }
        assert_eq!((lock_records(&cluster, "a"), lock_records(&cluster, "b")), (0, 0));

        // The agent pings instance a: it takes SILP code now.
        let ping = serde_json::json!({"messagetype":"control","format":"text","subformat":"english",
            "content":"//ping","submessages":[{"format":"structured","subformat":"json",
            "content":{"silp":"v1","frontends":["code"]}}]});
        let (code, reply) =
            support::gateway::post(&cluster.running["a"].http, "/nlip", &serde_json::to_vec(&ping).unwrap())
                .await;
        assert_eq!((code, &reply["content"]["preferred"]), (200, &serde_json::json!("code")), "{reply}");
        // The profile is the lock stream's first entry; b knows it once it has read that far.
        wait_lock_applied(&cluster, 0).await;

        // A request through instance b is written for the profile learnt on a, and the compile
        // it froze reaches both compile.locks; so does one through a, and one over a socket.
        for (i, name) in [(1, "b"), (2, "a")] {
            let request = pinged_request(i, &format!("doors-{i}"));
            let (code, reply) = support::gateway::post(&cluster.running[name].http, "/nlip", &request).await;
            assert_eq!(code, 202, "the agent's delivery is confirmed through {name}: {reply}");
            wait_lock_records(&cluster, i as u64).await;
        }
        // A WebSocket message's compile is the cluster's too.
        let url = format!("ws://{}/nlip/ws/text", cluster.running["b"].http);
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.expect("the socket opens");
        let request = String::from_utf8(pinged_request(3, "doors-3")).unwrap();
        socket.send(tokio_tungstenite::tungstenite::Message::Text(request.into())).await.unwrap();
        let frame = tokio::time::timeout(LONG, socket.next()).await.expect("an answer on the socket");
        let Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) = frame else {
            panic!("a text frame: {frame:?}")
        };
        assert!(text.contains("delivered"), "the agent's delivery is confirmed: {text}");
        wait_lock_records(&cluster, 3).await;
        drop(socket);

        let delivered = broker::collect(&channel, &cluster.names.sink(), LONG, |got| got.len() >= 3).await;
        assert_eq!(delivered.len(), 3, "every request reached the agent");
        for received in &delivered {
            let message = nlip::decode(&received.body, Encoding::Cbor, &Limits::default()).unwrap();
            let code = support::agents::silp_code_of(&message);
            assert!(code.is_some_and(|c| c.contains("cancel(order")), "SILP code, as pinged: {message:?}");
        }

        // The same chain on both instances, and it verifies.
        cluster.wait_lock_followed().await;
        for name in ["a", "b"] {
            cluster.terminate(name);
        }
        let stores: Vec<PathBuf> = ["a", "b"].iter().map(|n| cluster.store(n)).collect();
        let exports: Vec<String> = stores.iter().map(|s| lock_export(s)).collect();
        assert_eq!(exports[0], exports[1], "both instances export the same compile.lock");
        assert!(stores.iter().all(|s| lock_verifies(s)), "every chain verifies");
        cluster.names.clean_up(&channel, PARTITIONS).await;
    })
    .await;
}

/// Conversations of [`front_door_turns_are_counted_once_by_their_partition_owner`].
const DOOR_CONVERSATIONS: usize = 20;
/// Turns of each: past the renewal at turn 11.
const DOOR_TURNS: usize = 12;

/// Sends one turn over a text WebSocket and returns the answer and the notices it carries.
async fn socket_turn(
    socket: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    body: Vec<u8>,
) -> (serde_json::Value, Vec<serde_json::Value>) {
    use tokio_tungstenite::tungstenite::Message as Frame;
    socket.send(Frame::Text(String::from_utf8(body).unwrap().into())).await.expect("the socket takes a turn");
    let frame = tokio::time::timeout(LONG, socket.next()).await.expect("an answer on the socket");
    let Some(Ok(Frame::Text(text))) = frame else { panic!("a text frame: {frame:?}") };
    let message: serde_json::Value = serde_json::from_str(&text).expect("NLIP JSON on the socket");
    assert_ne!(message["messagetype"], "control", "an answer, never a notice in its place: {message}");
    let notices = renewal_notices(&message);
    (message, notices)
}

/// The renewal notices a message carries among its submessages.
fn renewal_notices(message: &serde_json::Value) -> Vec<serde_json::Value> {
    let subs = message["submessages"].as_array().cloned().unwrap_or_default();
    subs.into_iter().filter(|s| s["label"] == "silp-renewal").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_door_turns_are_counted_once_by_their_partition_owner() {
    let _serial = SERIAL.lock().await;
    within_limit("front_door_turns_are_counted_once_by_their_partition_owner", async {
        let mut cluster = Instances::new("cluster-front");
        let (_connection, channel) = broker::channel().await;
        for name in ["a", "b"] {
            cluster.start(name);
        }
        cluster.wait_members().await;
        let url = format!("ws://{}/nlip/ws/text", cluster.running["b"].http);
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.expect("the socket opens");

        // Every conversation's turns go round three doors: HTTP on a, HTTP on b, the socket on
        // b. Whichever instance owns a conversation's partition, two of its doors are not its.
        let mut renewals: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for turn in 0..DOOR_TURNS {
            for conversation in 0..DOOR_CONVERSATIONS {
                let i = turn * DOOR_CONVERSATIONS + conversation;
                let body = broker::envelope(i, conversation, Some("decode"));
                let (reply, notices) = match (turn + conversation) % 3 {
                    0 | 1 => {
                        let name = if (turn + conversation) % 3 == 0 { "a" } else { "b" };
                        let (code, reply) =
                            support::gateway::post(&cluster.running[name].http, "/nlip", &body).await;
                        assert_eq!(code, 200, "conv-{conversation} turn {turn} through {name}: {reply}");
                        let notices = renewal_notices(&reply);
                        (reply, notices)
                    }
                    _ => socket_turn(&mut socket, body).await,
                };
                assert_ne!(reply["messagetype"], "error", "conv-{conversation} turn {turn}: {reply}");
                assert!(
                    reply.to_string().contains(&format!("order{i}")),
                    "the reply decodes turn {turn}: {reply}"
                );
                for notice in notices {
                    let session = notice["content"]["session"].as_str().expect("a notice names its session");
                    renewals.entry(conversation).or_default().push(session.to_owned());
                }
            }
        }
        drop(socket);
        // Both instances forwarded their HTTP turns (each has conversations it does not own).
        for name in ["a", "b"] {
            let (_, metrics) = cluster.running[name].get("/metrics");
            let forwarded: u64 = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("silpgate_front_door_forwards_total") && l.contains(r#"transport="http""#)
                })
                .filter(|l| l.contains(r#"result="forwarded""#))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            assert!(forwarded > 0, "{name} forwarded its HTTP turns:\n{metrics}");
        }
        for name in ["a", "b"] {
            cluster.terminate(name);
        }

        // One session per conversation, in whichever store holds it, with every turn counted.
        let mut sessions: HashMap<String, (BTreeSet<String>, u64)> = HashMap::new();
        for name in ["a", "b"] {
            for (token, (id, turns)) in broker::sessions(&cluster.store(name)) {
                let entry = sessions.entry(token).or_default();
                entry.0.insert(id);
                entry.1 = entry.1.max(turns);
            }
        }
        for conversation in 0..DOOR_CONVERSATIONS {
            let token = format!("conv-{conversation}");
            let (ids, turns) = sessions.get(&token).cloned().unwrap_or_default();
            assert_eq!(turns, DOOR_TURNS as u64, "{token}: every turn counted by one session");
            assert_eq!(ids.len(), 1, "{token}: one session id in every store: {ids:?}");
            let renewed = renewals.remove(&conversation).unwrap_or_default();
            assert!(
                renewed.iter().all(|s| ids.contains(s)),
                "{token}: its renewal names its session: {renewed:?}"
            );
        }
        cluster.names.clean_up(&channel, PARTITIONS).await;
    })
    .await;
}

/// A forwarded turn's replies come back on RabbitMQ's direct reply-to: the reply reaches the
/// forwarding channel's consumer while it is there (RabbitMQ returns it as unroutable if it is
/// published as mandatory, so it is not), and once that client has gone a reply to it is
/// dropped by the broker but still confirmed, so the partition owner, which publishes it with
/// its turn, does not retry the turn for nobody. A reply to a queue that does not exist still
/// fails.
#[tokio::test]
async fn a_forwarded_reply_reaches_its_waiting_channel_and_one_for_a_gone_client_is_not_a_failure() {
    // Another test of this binary closes every broker connection: not while this one runs.
    let _serial = SERIAL.lock().await;
    use lapin::options::{BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
    use silpgate::broker::publish::{DIRECT_REPLY_TO, Publication, PublishError, Publisher};

    let (connection, channel) = broker::channel().await;
    let publisher = Publisher::new(channel, Duration::from_secs(10));
    let options =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let requests =
        publisher.channel().queue_declare("".into(), options, FieldTable::default()).await.unwrap();

    // The forwarding side: consumes direct reply-to on the channel it sends its request from.
    let forwarder = connection.create_channel().await.unwrap();
    let no_ack = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
    let mut replies = forwarder
        .basic_consume(DIRECT_REPLY_TO.into(), "forwarder".into(), no_ack, FieldTable::default())
        .await
        .unwrap();
    forwarder
        .basic_publish(
            "".into(),
            requests.name().as_str().into(),
            BasicPublishOptions::default(),
            b"request",
            BasicProperties::default().with_reply_to(DIRECT_REPLY_TO.into()),
        )
        .await
        .unwrap();

    // The owner's side: the address the broker wrote into the request.
    let request = tokio::time::timeout(LONG, async {
        loop {
            let got = publisher
                .channel()
                .basic_get(requests.name().as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap();
            if let Some(message) = got {
                return message;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the request arrives");
    let address =
        request.delivery.properties.reply_to().clone().expect("the request names its reply address");
    assert!(address.as_str().starts_with(DIRECT_REPLY_TO), "{address:?}");
    let reply = |routing_key| Publication {
        exchange: "",
        routing_key,
        body: b"reply".to_vec(),
        properties: BasicProperties::default(),
    };

    publisher.publish_all(vec![reply(address.as_str())]).await.expect("a reply to a waiting client");
    let delivered = tokio::time::timeout(LONG, replies.next()).await.expect("the reply comes back");
    assert_eq!(delivered.expect("a delivery").expect("not an error").data, b"reply");

    forwarder.close(200, "gone".into()).await.unwrap();
    publisher
        .publish_all(vec![reply(address.as_str())])
        .await
        .expect("a reply to a client that has gone is dropped, not failed");
    let missing = publisher.publish_all(vec![reply("sgtest.no-such-queue")]).await;
    assert!(matches!(missing, Err(PublishError::Unroutable { .. })), "{missing:?}");
}

/// The agent `planner` (reads SILP code) behind a queue of its own, for the HTTP door's turns.
fn with_planner(names: &Names, config: String) -> String {
    let planner = format!(
        "[[agents]]\nname = \"planner\"\nfrontends = [\"code\"]\nrouting_key = \"{queue}\"\nqueue = \"{queue}\"\n\n[[routes]]\nname = \"http-to-planner\"\ndestination = \"planner\"\nmode = \"encode\"\n[routes.match]\nsource = \"http\"\n\n",
        queue = planner_queue(names)
    );
    let first_route = "[[routes]]\nname = \"decode-for-sender\"";
    assert!(config.contains(first_route), "the test configuration has its routes");
    config.replacen(first_route, &format!("{planner}{first_route}"), 1)
}

fn planner_queue(names: &Names) -> String {
    format!("{}.planner", names.sink())
}

/// One HTTP turn of `conv` through `instance`'s front door, answered by the planner.
async fn planner_turn(cluster: &Instances, instance: &str, i: usize, conv: &str) {
    let body = serde_json::to_vec(&support::gateway::ir_request(i, conv)).unwrap();
    let (code, answer) = support::gateway::post(&cluster.running[instance].http, "/nlip", &body).await;
    assert_eq!(code, 200, "turn {i} through {instance}: {answer}");
    assert_eq!(
        support::gateway::order_in(&answer.to_string()),
        Some(i),
        "the planner's answer to turn {i}: {answer}"
    );
}

/// An agent's answer counts a turn of its conversation, on the partition's owner: that turn is
/// in the partition's changelog too, so the next owner counts on from it (without it, the last
/// answer before a crash was lost to the session, and every renewal after it came a turn late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_answer_turn_survives_its_owners_crash() {
    let _serial = SERIAL.lock().await;
    within_limit("an_agents_answer_turn_survives_its_owners_crash", async {
        let mut cluster = Instances::new("cluster-answers");
        let (connection, channel) = broker::channel().await;
        let names = cluster.names.clone();
        let queue = planner_queue(&names);
        let planner = |config: String| with_planner(&names, config);
        cluster.start_with("a", planner);
        // silpgate declares its agents' queues: the planner consumes once a has.
        let agent_channel = connection.create_channel().await.unwrap();
        let _planner = support::agents::amqp_agent(agent_channel, &queue, support::agents::echo_code()).await;
        // Three turns and their three answers on a, which owns every partition; then a dies.
        for i in 0..3 {
            planner_turn(&cluster, "a", i, "conv-answered").await;
        }
        cluster.kill("a");
        // A fresh instance takes the conversation's partition over from the changelog alone.
        cluster.start_with("b", planner);
        planner_turn(&cluster, "b", 3, "conv-answered").await;
        cluster.terminate("b");
        let sessions = broker::sessions(&cluster.store("b"));
        let (_, turns) = sessions.get("conv-answered").cloned().expect("b holds the conversation's session");
        assert_eq!(turns, 8, "four requests and four answers, each a turn");
        channel
            .queue_delete(queue.as_str().into(), lapin::options::QueueDeleteOptions::default())
            .await
            .unwrap();
    })
    .await;
}

/// What `ownership::let_go` relies on: a single-active consumer of a quorum queue whose channel
/// closes gives back what it held before the next consumer gets anything newer. Consumer `a`
/// holds the first 10 messages unacknowledged, `b` waits behind it, 10 more are queued, and `a`
/// lets go: `b` gets all 20 in the order they were published. (Cancelling `a` first would hand
/// `b` the newer 10 before the held ones.)
#[tokio::test]
async fn a_consumer_let_go_of_gives_back_what_it_held_before_the_next_one_gets_newer_messages() {
    // Another test of this binary closes every broker connection: not while this one runs.
    let _serial = SERIAL.lock().await;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::AMQPValue;
    use silpgate::cluster::ownership::let_go;

    let names = Names::new("let-go");
    let queue = names.inbound();
    let (connection, channel) = broker::channel().await;
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.as_str().into(), durable, arguments).await.unwrap();
    let message = |i: usize| (queue.clone(), format!("m-{i}").into_bytes(), BasicProperties::default());
    broker::publish_all(&channel, "", (0..10).map(message).collect()).await;

    let subscribe = |tag: &'static str| {
        let connection = &connection;
        let queue = queue.clone();
        async move {
            let channel = connection.create_channel().await.unwrap();
            channel.basic_qos(10, BasicQosOptions { global: false }).await.unwrap();
            let consumer = channel
                .basic_consume(
                    queue.as_str().into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            (channel, consumer)
        }
    };
    let (a, mut held_by_a) = subscribe("a").await;
    for i in 0..10 {
        let delivery =
            tokio::time::timeout(LONG, held_by_a.next()).await.expect("a is served").unwrap().unwrap();
        assert_eq!(delivery.data, format!("m-{i}").into_bytes());
    }
    let (_b, mut to_b) = subscribe("b").await;
    broker::publish_all(&channel, "", (10..20).map(message).collect()).await;

    let_go(&a).await.unwrap();
    let mut order = Vec::new();
    while order.len() < 20 {
        let delivery = tokio::time::timeout(LONG, to_b.next()).await.expect("b is served").unwrap().unwrap();
        order.push(String::from_utf8(delivery.data.clone()).unwrap());
        delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    let expected: Vec<String> = (0..20).map(|i| format!("m-{i}")).collect();
    assert_eq!(order, expected, "b gets a's held messages first, in order");
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}

/// A connection lost while the workers hold partition messages (each retrying against a full
/// agent queue, asleep in a long backoff) ends with those jobs dropped, unfinished: they must
/// stop counting as in flight then. A count that kept them held every later hand-over of their
/// partitions for good, since a hand-over waits until nothing of its partition is in flight:
/// here, the second instance would never be given its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_while_messages_wait_to_be_retried_holds_no_hand_over_back() {
    let _serial = SERIAL.lock().await;
    within_limit("lost mid-retry", async {
        let mut cluster = Instances::new("lost-mid-retry");
        let names = cluster.names.clone();
        let policy = refuse_publishes_to_the_agent(&names);
        cluster.start_with("a", |config| {
            config
                .replace("retry_initial_ms = 50\n", "retry_initial_ms = 20000\n")
                .replace("retry_max_ms = 400\n", "retry_max_ms = 20000\n")
        });
        let count = CONVERSATIONS;
        {
            let (connection, channel) = broker::channel().await;
            publish_in_chunks(&channel, &names, 0..count, |_| {}).await;
            let _ = connection.close(200, "published".into()).await;
        }
        // The full agent queue refuses the messages: they wait out their backoff.
        cluster.running["a"].wait_logged("Message failed; retrying", 16, Duration::from_secs(60));
        // Every message now waits out its backoff, longer than a lost connection's workers are
        // waited for; the agent queue takes messages again when they come back.
        broker::rabbitmqctl(&["clear_policy", &policy]);
        broker::rabbitmqctl(&["close_all_connections", "silpgate test: forced close"]);
        cluster.running["a"].wait_logged("Connected to the broker", 2, Duration::from_secs(60));
        // Serving again on its new connection (the messages came back), a hands half of the
        // partitions on to b; steady traffic makes b take them over.
        cluster.wait_serving("a");
        cluster.start("b");
        let stop = Arc::new(AtomicBool::new(false));
        let traffic = steady_traffic(&names, count, stop.clone());
        cluster.wait_stable().await;
        stop.store(true, Ordering::Relaxed);
        let count = traffic.await.unwrap();
        let (_connection, channel) = broker::channel().await;
        let delivered = collect_all(&channel, &names, count).await;
        assert_delivered(&delivered, count);
        for name in ["a", "b"] {
            cluster.terminate(name);
        }
    })
    .await;
}

/// A hand-over that cannot finish (the agent's queue refuses the messages it hands out after
/// its cancel) must be over before the next owner stops waiting for it and serves on the
/// changelog as it stands: a turn the previous owner counted after that point would be missing
/// there, and the next owner would count its conversation's next message as the same turn. So
/// the previous owner lets go of its connection in time, and its messages go back to the
/// partitions' queues, for the next owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_cannot_finish_lets_go_before_the_next_owner_stops_waiting() {
    let _serial = SERIAL.lock().await;
    within_limit("overdue hand-over", async {
        let mut cluster = Instances::new("overdue");
        let names = cluster.names.clone();
        // Refused messages are retried until the queue takes them again; the next owner waits
        // 6 s for a hand-over (`drain_secs`), so the previous one gives up after 3.
        let patient = |config: String| {
            config.replace(
                "retry_max_ms = 400\n",
                "retry_max_ms = 400\nmax_attempts = 100000\ndrain_secs = 6\n",
            )
        };
        cluster.start_with("a", patient);
        let stop = Arc::new(AtomicBool::new(false));
        let traffic = steady_traffic(&names, 0, stop.clone());
        cluster.wait_serving_all("a").await;
        // The agent's queue refuses everything from now on: what a has in its workers' hands,
        // and what it holds when it hands its partitions on, cannot be settled. a cancels
        // anyway (what is in its hands stays its own) and must let go of its connection before
        // b stops waiting for `Released`.
        let policy = refuse_publishes_to_the_agent(&names);
        // Not waited for until ready: that takes the hand-overs this test holds up.
        cluster.launch_with("b", patient);
        cluster.running["a"].wait_logged("Handing a partition on to its owner", 1, LONG);
        let members = ["a", "b"];
        let b_share = rendezvous::share(PARTITIONS, &members, 1, "b").owned.len();
        cluster.running["b"].wait_logged("Took over a partition", b_share, LONG);
        stop.store(true, Ordering::Relaxed);
        let count = traffic.await.unwrap();
        broker::rabbitmqctl(&["clear_policy", &policy]);
        let (_connection, channel) = broker::channel().await;
        let delivered = collect_all(&channel, &names, count).await;
        assert_delivered(&delivered, count);
        let gave_up = cluster.running["a"].log_text().contains("A hand-over did not finish in time");
        for name in members {
            cluster.terminate(name);
        }
        assert_sessions(&[cluster.store("a"), cluster.store("b")], &delivered, count);
        assert!(gave_up, "a let go of its connection when a hand-over could not finish");
    })
    .await;
}

/// Peer messages are believed only from silpgate's own broker user: a heartbeat claiming
/// every partition and a lock entry freezing a text, published without that `user_id` (as
/// anyone with publish rights on the vhost can), move nothing and freeze nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_heartbeats_and_lock_entries_are_not_believed() {
    let _serial = SERIAL.lock().await;
    within_limit("forged_heartbeats_and_lock_entries_are_not_believed", async {
        let mut cluster = Instances::new("cluster-forged");
        cluster.start("a");
        cluster.wait_members().await;
        let subscribed = cluster.status("a")["subscribed"].clone();
        assert_eq!(
            subscribed.as_array().map(Vec::len),
            Some(PARTITIONS as usize),
            "alone, a takes every partition"
        );
        let (_connection, channel) = broker::channel().await;
        let every: Vec<u16> = (0..PARTITIONS).collect();
        let heartbeat = serde_json::json!({"instance": "a-forger", "subscribed": every}).to_string();
        let proposal = serde_json::json!({"ir_hash": "sha256:forged", "frontend": "code",
            "output": "transfer(all_funds)", "at": 1, "by": "a-forger"})
        .to_string();
        let plain = BasicProperties::default().with_content_type("application/json".into());
        let forged = vec![
            (cluster.names.members_exchange(), String::new(), heartbeat.into_bytes(), plain.clone()),
            (String::new(), cluster.names.lock_stream(), proposal.into_bytes(), plain.with_delivery_mode(2)),
        ];
        publish(&channel, forged).await;
        let a = &cluster.running["a"];
        a.wait_logged("A heartbeat not from silpgate's broker user; ignored.", 1, LONG);
        a.wait_logged("A lock stream entry not from silpgate's broker user; skipped.", 1, LONG);
        let status = cluster.status("a");
        assert_eq!(status["members"], serde_json::json!(["a"]), "the forger is no member: {status}");
        // Had the heartbeat been believed, a would give the forger its rendezvous share.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(cluster.status("a")["subscribed"], subscribed, "a keeps its partitions");
        cluster.terminate("a");
        let store = cluster.store("a");
        assert!(!lock_export(&store).contains("all_funds"), "the forged text is not frozen");
        assert!(lock_verifies(&store));
        cluster.names.clean_up(&channel, PARTITIONS).await;
    })
    .await;
}
