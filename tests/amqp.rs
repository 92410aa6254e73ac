//! The AMQP side against the real RabbitMQ on 127.0.0.1:5672, with silpgate as a child process:
//! delivery exactly once in the plain case, poison to the dead-letter queue, forced connection
//! closes, SIGKILL and SIGTERM mid-stream, and a blocked or unroutable downstream. Every test
//! counts by message id, and checks session state (turns per conversation) from the store.

mod support;

use lapin::BasicProperties;
use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use silpgate::nlip::{self, Encoding, Limits};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::broker::{self, Daemon, Names, Received};

/// The tests share one broker on two cores: one at a time keeps their timing honest.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LONG: Duration = Duration::from_secs(180);

fn props(i: usize) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(format!("m-{i}").into())
        .with_correlation_id(format!("c-{i}").into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

fn header(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// `count` envelopes over `conversations` conversations, all to the transcoding route.
fn plain_batch(names: &Names, count: usize, conversations: usize) -> Vec<(String, Vec<u8>, BasicProperties)> {
    (0..count).map(|i| (names.inbound(), broker::envelope(i, i % conversations, None), props(i))).collect()
}

fn decode(r: &Received) -> nlip::Message {
    let encoding =
        Encoding::from_content_type(r.content_type.as_deref().unwrap_or_default()).expect("content type");
    nlip::decode(&r.body, encoding, &Limits::default()).expect("silpgate publishes valid NLIP")
}

/// The inbound id of a forwarded message (`m-<i>:<n>`), or `None` for a control notice.
fn forwarded_id(r: &Received) -> Option<String> {
    if decode(r).is_control() {
        return None;
    }
    Some(r.message_id.rsplit_once(':').expect("outbound ids are <inbound id>:<n>").0.to_owned())
}

fn distinct_forwarded(got: &[Received]) -> usize {
    got.iter().filter_map(forwarded_id).collect::<HashSet<_>>().len()
}

/// Asserts that every conversation counted exactly its messages: nothing applied twice.
fn assert_turns(store: &std::path::Path, count: usize, conversations: usize) {
    let turns = broker::session_turns(store);
    for c in 0..conversations {
        let expected = (0..count).filter(|i| i % conversations == c).count() as u64;
        assert_eq!(turns.get(&format!("conv-{c}")), Some(&expected), "turns of conv-{c}");
    }
}

async fn declare_plain_queue(channel: &lapin::Channel, queue: &str, arguments: FieldTable) {
    let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.into(), options, arguments).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_envelopes_arrive_once_each_and_replies_reach_reply_to() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("thousand");
    let dir = broker::temp_dir("amqp-thousand");
    let (connection, channel) = broker::channel().await;
    declare_plain_queue(&channel, &names.replies(), FieldTable::default()).await;
    declare_plain_queue(&channel, &names.cbor_replies(), FieldTable::default()).await;
    let daemon = Daemon::start(&names.config(&dir.join("store"), "", true), &dir);
    daemon.wait_ready(Duration::from_secs(30));

    const N: usize = 1000;
    const CONVERSATIONS: usize = 25;
    let messages = (0..N)
        .map(|i| {
            let decode_back = i % 10 == 0;
            let body = broker::envelope(i, i % CONVERSATIONS, decode_back.then_some("decode"));
            let mut properties = props(i).with_reply_to(names.replies().into());
            let body = if i % 4 == 1 {
                // CBOR in, by content type.
                properties = properties.with_content_type("application/cbor".into());
                let message = nlip::decode(&body, Encoding::Json, &Limits::default()).unwrap();
                nlip::encode(&message, Encoding::Cbor)
            } else {
                body
            };
            if i % 20 == 0 {
                // Replies asked for in two encodings at two addresses.
                let mut h = FieldTable::default();
                h.insert("nlip-reply-application/json".into(), header(&names.replies()));
                h.insert("nlip-reply-application/cbor".into(), header(&names.cbor_replies()));
                properties = properties.with_headers(h);
            }
            (names.inbound(), body, properties)
        })
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), messages).await;

    let sink =
        broker::collect(&channel, &names.sink(), LONG, |got| distinct_forwarded(got) == N * 9 / 10).await;
    // Anything more would be a duplicate. Duplicates would come from redeliveries, and there are
    // none unless a delivery is left unacknowledged: wait until the inbound queue is settled,
    // then read what else arrived.
    broker::wait_counts(&names.inbound(), (0, 0), "every delivery acknowledged").await;
    let late = broker::collect(&channel, &names.sink(), Duration::from_millis(500), |_| false).await;
    // The decode-back tenth goes to the sender, not the sink: order is checked among the rest.
    assert_in_order(&sink, CONVERSATIONS);
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in sink.iter().chain(&late) {
        let Some(id) = forwarded_id(r) else { continue };
        *per_id.entry(id.clone()).or_default() += 1;
        assert!(id[2..].parse::<usize>().is_ok_and(|i| i < N), "an inbound id: {id}");
        assert_eq!(r.content_type.as_deref(), Some("application/cbor"), "the agent takes CBOR");
        assert_eq!(decode(r).subformat, "silp-json", "transcoded for the agent");
        // The agent answers silpgate, which passes the answer on to the requester.
        assert_eq!(r.reply_to.as_ref(), Some(&names.answers()), "answers come back through silpgate");
        // Answers correlate by a token drawn for the wait: 128 random bits, not the message id.
        let correlation = r.correlation_id.as_deref().expect("a correlation id to answer with");
        assert!(
            correlation.len() == 32 && correlation.bytes().all(|c| c.is_ascii_hexdigit()),
            "{correlation}"
        );
        assert_ne!(correlation, r.message_id, "answers do not correlate by the guessable id");
    }
    assert_eq!(per_id.len(), N * 9 / 10);
    assert!(
        per_id.values().all(|&n| n == 1),
        "exactly once each: {:?}",
        per_id.iter().find(|(_, n)| **n != 1)
    );

    let is_reply = |r: &Received| !decode(r).is_control();
    let replies = broker::collect(&channel, &names.replies(), LONG, |got| {
        got.iter().filter(|r| is_reply(r)).count() == N / 10
    })
    .await;
    let cbor_replies = broker::collect(&channel, &names.cbor_replies(), LONG, |got| {
        got.iter().filter(|r| is_reply(r)).count() == N / 20
    })
    .await;
    for (r, content_type) in replies
        .iter()
        .map(|r| (r, "application/json"))
        .chain(cbor_replies.iter().map(|r| (r, "application/cbor")))
    {
        if !is_reply(r) {
            continue;
        }
        let i: usize = r.message_id[2..].split(':').next().unwrap().parse().unwrap();
        assert_eq!(i % 10, 0, "only decode-route messages are answered");
        assert_eq!(r.correlation_id.as_deref(), Some(format!("c-{i}").as_str()));
        assert_eq!(r.content_type.as_deref(), Some(content_type));
        assert_eq!(decode(r).subformat, "silp-ir", "decoded back for the sender");
    }
    assert_eq!(replies.iter().filter(|r| is_reply(r)).count(), N / 10);
    assert_eq!(cbor_replies.iter().filter(|r| is_reply(r)).count(), N / 20);

    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    assert_turns(&dir.join("store"), N, CONVERSATIONS);
    broker::wait_counts(&names.inbound(), (0, 0), "everything acknowledged").await;
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_with_its_code_and_good_messages_pass_it() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("poison");
    let dir = broker::temp_dir("amqp-poison");
    let (connection, channel) = broker::channel().await;
    declare_plain_queue(&channel, &names.replies(), FieldTable::default()).await;
    // One worker: a poison message that blocked its worker would block everything behind it.
    let daemon =
        Daemon::start(&names.config(&dir.join("store"), "workers = 1\nmax_attempts = 1000", true), &dir);
    daemon.wait_ready(Duration::from_secs(30));

    const N: usize = 200;
    let mut expected_codes = HashMap::new();
    let messages = (0..N)
        .map(|i| {
            let mut properties = props(i).with_reply_to(names.replies().into());
            let body = match i % 16 {
                3 => b"{ not json".to_vec(),
                7 => br#"{"format":"nonsense","subformat":"x","content":"y"}"#.to_vec(),
                11 => br#"{"format":"structured","subformat":"silp-code","content":"cancel((","submessages":[{"format":"token","subformat":"conversation","content":"conv-0"}]}"#.to_vec(),
                15 => {
                    properties = properties.with_content_type("text/plain".into());
                    broker::envelope(i, 0, None)
                }
                _ => broker::envelope(i, i % 5, None),
            };
            let code = match i % 16 {
                3 | 15 => Some("invalid_encoding"),
                7 => Some("invalid_envelope"),
                11 => Some("invalid_syntax"),
                _ => None,
            };
            if let Some(code) = code {
                expected_codes.insert(format!("m-{i}"), code);
            }
            (names.inbound(), body, properties)
        })
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), messages).await;
    let good = N - expected_codes.len();

    let sink = broker::collect(&channel, &names.sink(), LONG, |got| distinct_forwarded(got) == good).await;
    assert_eq!(distinct_forwarded(&sink), good, "every good message arrives");
    let dead = broker::collect(&channel, &names.dead(), LONG, |got| got.len() == expected_codes.len()).await;
    assert_eq!(dead.len(), expected_codes.len());
    for d in &dead {
        let code =
            expected_codes.get(&d.message_id).unwrap_or_else(|| panic!("{} is not poison", d.message_id));
        assert_eq!(
            d.headers.get("x-silpgate-error-code").map(String::as_str),
            Some(*code),
            "{}",
            d.message_id
        );
        let reason = &d.headers["x-silpgate-error"];
        assert!(!reason.is_empty() && !reason.starts_with("gave up"), "dead-lettered at once: {reason}");
        assert_eq!(d.headers.get("x-silpgate-source-queue"), Some(&names.inbound()));
    }
    // Each poison message's sender hears why, correlated.
    let replies =
        broker::collect(&channel, &names.replies(), LONG, |got| got.len() == expected_codes.len()).await;
    let answered: HashSet<_> = replies
        .iter()
        .map(|r| {
            let message = decode(r);
            assert!(message.is_error(), "an NLIP error message");
            r.correlation_id.clone().unwrap().replacen('c', "m", 1)
        })
        .collect();
    assert_eq!(answered, expected_codes.keys().cloned().collect::<HashSet<_>>());

    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let _ = connection.close(200, "done".into()).await;
}

/// Waits until the sink queue holds at least `at_least` messages, counted live.
async fn wait_for_sink(names: &Names, at_least: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = broker::live_ready(&names.sink()).await;
        if ready >= at_least {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the sink stopped growing at {ready}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts, right after a fault, that it came mid-stream: the sink, counted live, does not
/// yet hold all `n` messages (it only grows until the test reads it).
async fn assert_mid_stream(names: &Names, n: usize, fault: &str) {
    let relayed = broker::live_ready(&names.sink()).await;
    assert!(relayed < n as u64, "{fault} came after everything was relayed ({relayed} of {n})");
}

/// Asserts that every conversation's messages first reached the sink in the order they were
/// published (message `m-<i>` belongs to conversation `i % conversations`). Copies of a
/// message already seen (redeliveries) do not count.
fn assert_in_order(sink: &[Received], conversations: usize) {
    let mut seen = HashSet::new();
    let mut last: HashMap<usize, usize> = HashMap::new();
    let mut out_of_order = Vec::new();
    for id in sink.iter().filter_map(forwarded_id) {
        if !seen.insert(id.clone()) {
            continue;
        }
        let i: usize = id[2..].parse().expect("m-<i>");
        let previous = last.insert(i % conversations, i);
        if previous.is_some_and(|p| p > i) {
            out_of_order.push(format!("m-{i} after m-{}", previous.unwrap_or_default()));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "out of order within a conversation: {:?}",
        &out_of_order[..out_of_order.len().min(10)]
    );
}

/// Collects the sink until every one of `n` messages has arrived at least once, in each
/// conversation's order, and checks that copies of one message are identical.
async fn assert_all_arrived(channel: &lapin::Channel, names: &Names, n: usize, conversations: usize) {
    // Each message is read once as it arrives; recounting the whole sink on every arrival
    // would be quadratic in a long run's redeliveries.
    let (mut seen, mut read) = (HashSet::new(), 0);
    let sink = broker::collect(channel, &names.sink(), LONG, |got| {
        seen.extend(got[read..].iter().filter_map(forwarded_id));
        read = got.len();
        seen.len() == n
    })
    .await;
    assert_eq!(distinct_forwarded(&sink), n, "nothing lost");
    assert_in_order(&sink, conversations);
    let mut bodies: HashMap<&str, &[u8]> = HashMap::new();
    for r in &sink {
        let first = bodies.entry(r.message_id.as_str()).or_insert(r.body.as_slice());
        assert_eq!(*first, r.body.as_slice(), "duplicates of {} are the same message", r.message_id);
    }
}

/// Declares the topology with a first start, then queues `n` envelopes before anything consumes
/// them; the test's connection and channel.
async fn queue_backlog(
    config: &str,
    dir: &std::path::Path,
    names: &Names,
    n: usize,
    conversations: usize,
) -> (lapin::Connection, lapin::Channel) {
    let first = Daemon::start(config, dir);
    first.wait_ready(Duration::from_secs(30));
    first.kill();
    let (connection, channel) = broker::channel().await;
    broker::publish_all(&channel, &names.inbound_exchange(), plain_batch(names, n, conversations)).await;
    (connection, channel)
}

/// With `daemon` running to the end: every message arrived, it stops cleanly, every
/// conversation counted each of its messages once; then cleans up.
async fn assert_settled(
    daemon: Daemon,
    connection: lapin::Connection,
    channel: &lapin::Channel,
    names: &Names,
    dir: &std::path::Path,
    n: usize,
    conversations: usize,
) {
    assert_all_arrived(channel, names, n, conversations).await;
    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    assert_turns(&dir.join("store"), n, conversations);
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_connection_closes_lose_nothing_and_apply_nothing_twice() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("closes");
    let dir = broker::temp_dir("amqp-closes");
    // Long enough that each close, which `rabbitmqctl` takes a second or two to make, lands
    // while messages are still to go (asserted after each).
    const N: usize = 9000;
    const CONVERSATIONS: usize = 30;
    let daemon = Daemon::start(&names.config(&dir.join("store"), "", true), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    {
        let (connection, channel) = broker::channel().await;
        broker::publish_all(&channel, &names.inbound_exchange(), plain_batch(&names, N, CONVERSATIONS)).await;
        // The test holds no connection while every connection is being closed.
        connection.close(200, "published".into()).await.unwrap();
    }
    for round in 1..=3u64 {
        wait_for_sink(&names, round * 1000).await;
        broker::rabbitmqctl(&["close_all_connections", "silpgate test: forced close"]);
        assert_mid_stream(&names, N, &format!("close {round}")).await;
    }
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    assert_settled(daemon, connection, &channel, &names, &dir, N, CONVERSATIONS).await;
}

/// SIGKILL at ten random points of a 6,000-message run. After each kill the store opens (the
/// journal a crash leaves is replayed), the compile.lock chain verifies, and every conversation
/// has counted exactly the messages its ledger holds: nothing acknowledged lost, nothing
/// counted twice. At the end every message arrived, each conversation in order, and counted
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_ten_random_points_of_six_thousand_loses_nothing_and_counts_each_once() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("sigkill");
    let dir = broker::temp_dir("amqp-sigkill");
    const N: usize = 6_000;
    const CONVERSATIONS: usize = 50;
    let config = names.config(&dir.join("store"), "", true);
    let (connection, channel) = queue_backlog(&config, &dir, &names, N, CONVERSATIONS).await;
    let mut random = support::random::Random::from_clock();
    eprintln!("kill points from seed {}", random.seed());
    let mut points: Vec<u64> = (0..10).map(|_| 200 + random.below(N as u64 * 8 / 10)).collect();
    points.sort_unstable();
    for (round, point) in points.into_iter().enumerate() {
        let daemon = Daemon::start(&config, &dir);
        wait_for_sink(&names, point).await;
        // Anywhere in a window: appending, syncing, publishing, acknowledging, checkpointing.
        tokio::time::sleep(Duration::from_millis(random.below(40))).await;
        daemon.kill();
        assert_counted_as_ledgered(&dir.join("store"), N, CONVERSATIONS, round + 1);
    }
    let daemon = Daemon::start(&config, &dir);
    assert_settled(daemon, connection, &channel, &names, &dir, N, CONVERSATIONS).await;
}

/// Reads a killed daemon's store: it opens, its chain verifies, and each conversation's turns
/// are the messages of it the ledger holds; the kill came before every message was counted.
fn assert_counted_as_ledgered(store: &std::path::Path, n: usize, conversations: usize, round: usize) {
    let store = silpgate::store::SledStore::open_to_read(store)
        .unwrap_or_else(|e| panic!("kill {round}: the store does not open: {e}"));
    store.verify_lock().unwrap_or_else(|e| panic!("kill {round}: the chain does not verify: {e}"));
    let turns: HashMap<String, u64> =
        store.sessions().expect("sessions").into_iter().map(|s| (s.token, s.turns)).collect();
    let mut ledgered = vec![0u64; conversations];
    for i in 0..n {
        if silpgate::gateway::store::Store::ledger(&store, &format!("m-{i}")).expect("ledger").is_some() {
            ledgered[i % conversations] += 1;
        }
    }
    for (c, ledgered) in ledgered.iter().enumerate() {
        let counted = turns.get(&format!("conv-{c}")).copied().unwrap_or(0);
        assert_eq!(counted, *ledgered, "kill {round}: turns of conv-{c} against its ledger entries");
    }
    let total: u64 = ledgered.iter().sum();
    assert!(total > 0 && total < n as u64, "kill {round} came mid-run: {total} of {n} counted");
}

/// Messages that come without a `message_id` are numbered from their content: a redelivery
/// after a crash reaches the agent under the ids it had the first time, so that the agent can
/// tell the copy from a new message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_redeliveries_of_messages_without_ids_reach_the_agent_under_the_same_ids() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("sigkill-noid");
    let dir = broker::temp_dir("amqp-sigkill-noid");
    const N: usize = 3000;
    let config = names.config(&dir.join("store"), "", true);
    let first = Daemon::start(&config, &dir);
    first.wait_ready(Duration::from_secs(30));
    first.kill();
    let (connection, channel) = broker::channel().await;
    let unnamed =
        BasicProperties::default().with_content_type("application/json".into()).with_delivery_mode(2);
    let backlog: Vec<_> =
        (0..N).map(|i| (names.inbound(), broker::envelope(i, i % 30, None), unnamed.clone())).collect();
    broker::publish_all(&channel, &names.inbound_exchange(), backlog).await;
    let order_of = |r: &Received| {
        support::gateway::order_in(&silpgate::nlip::to_json(&decode(r))).expect("an order number")
    };
    // The sink is read as it fills, so that each SIGKILL lands mid-stream, while a window's
    // publishes are confirmed and its acknowledgements not yet sent.
    let arrived = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let (arrived, channel, queue) = (arrived.clone(), channel.clone(), names.sink());
        tokio::spawn(async move {
            let mut orders = HashSet::new();
            broker::collect(&channel, &queue, LONG, |got| {
                arrived.store(got.len(), std::sync::atomic::Ordering::SeqCst);
                orders.extend(got.last().map(order_of));
                orders.len() == N
            })
            .await
        })
    };
    let seen = || arrived.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..6 {
        let daemon = Daemon::start(&config, &dir);
        let target = seen() + 200;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while seen() < target {
            assert!(std::time::Instant::now() < deadline, "the sink stopped growing at {}", seen());
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        daemon.kill();
    }
    let daemon = Daemon::start(&config, &dir);
    let sink = reader.await.unwrap();
    let mut ids: HashMap<usize, HashSet<String>> = HashMap::new();
    for r in &sink {
        ids.entry(order_of(r)).or_default().insert(r.message_id.clone());
    }
    assert_eq!(ids.len(), N, "nothing lost");
    let copies = sink.len() - N;
    assert!(copies > 0, "six SIGKILLs mid-stream redelivered something");
    let renamed: Vec<_> = ids.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(
        renamed.is_empty(),
        "{} of {copies} copies came under new ids: {:?}",
        renamed.len(),
        renamed.first()
    );
    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_500_in_flight_exits_0_in_time_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("sigterm");
    let dir = broker::temp_dir("amqp-sigterm");
    const N: usize = 2000;
    const CONVERSATIONS: usize = 40;
    let config = names.config(&dir.join("store"), "prefetch = 500\ndrain_secs = 10", true);
    let (connection, channel) = queue_backlog(&config, &dir, &names, N, CONVERSATIONS).await;
    let daemon = Daemon::start(&config, &dir);
    wait_for_sink(&names, 100).await;
    let (status, took) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status {status:?}");
    // The deadline is a hard one: past it silpgate leaves what is unfinished to the broker.
    // The margin covers the steps after the drain on a loaded machine.
    assert!(
        took < Duration::from_secs(22),
        "exited after {took:?}, past the 10 s drain deadline and its margin"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while broker::queue_counts(&names.inbound()).1 != 0 {
        assert!(std::time::Instant::now() < deadline, "deliveries still held after silpgate exited");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let daemon = Daemon::start(&config, &dir);
    assert_settled(daemon, connection, &channel, &names, &dir, N, CONVERSATIONS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_or_full_downstream_holds_the_message_until_it_clears() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("blocked");
    let dir = broker::temp_dir("amqp-blocked");
    let (connection, channel) = broker::channel().await;
    // silpgate does not declare the sink: nothing is bound to its routing key yet.
    const PREFETCH: usize = 50;
    let config =
        names.config(&dir.join("store"), &format!("max_attempts = 100000\nprefetch = {PREFETCH}"), false);
    let daemon = Daemon::start(&config, &dir);
    daemon.wait_ready(Duration::from_secs(30));

    let one = |i: usize| vec![(names.inbound(), broker::envelope(i, 0, None), props(i))];
    broker::publish_all(&channel, &names.inbound_exchange(), one(1)).await;
    broker::wait_counts(&names.inbound(), (0, 1), "unroutable: held, not acknowledged").await;
    let mut full = FieldTable::default();
    full.insert("x-max-length".into(), AMQPValue::LongInt(1));
    full.insert("x-overflow".into(), header("reject-publish"));
    declare_plain_queue(&channel, &names.sink(), full).await;
    let bind = QueueBindOptions::default();
    channel
        .queue_bind(
            names.sink().as_str().into(),
            names.agents_exchange().as_str().into(),
            names.sink().as_str().into(),
            bind,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let arrived =
        broker::collect(&channel, &names.sink(), Duration::from_secs(30), |got| !got.is_empty()).await;
    assert_eq!(arrived.first().and_then(forwarded_id).as_deref(), Some("m-1"), "through once routable");
    broker::wait_counts(&names.inbound(), (0, 0), "acknowledged once through").await;

    // Full: the sink holds one message and refuses more.
    broker::publish_all(&channel, "", vec![(names.sink(), b"filler".to_vec(), BasicProperties::default())])
        .await;
    broker::publish_all(&channel, &names.inbound_exchange(), one(2)).await;
    broker::wait_counts(&names.inbound(), (0, 1), "refused downstream: held, not acknowledged").await;
    broker::wait_counts(&names.sink(), (1, 0), "the full sink holds only its filler").await;
    channel.queue_purge(names.sink().as_str().into(), QueuePurgeOptions::default()).await.unwrap();
    let arrived =
        broker::collect(&channel, &names.sink(), Duration::from_secs(30), |got| !got.is_empty()).await;
    assert_eq!(arrived.first().and_then(forwarded_id).as_deref(), Some("m-2"), "through once there is room");
    broker::wait_counts(&names.inbound(), (0, 0), "acknowledged once through").await;
    // Full again: while downstream is blocked, what silpgate holds unacknowledged never passes
    // its prefetch, however much waits.
    broker::publish_all(&channel, "", vec![(names.sink(), b"filler".to_vec(), BasicProperties::default())])
        .await;
    let backlog: Vec<_> = (100..100 + 2 * PREFETCH)
        .map(|i| (names.inbound(), broker::envelope(i, 0, None), props(i)))
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), backlog).await;
    let mut most = 0;
    for _ in 0..20 {
        let (_, unacked) = broker::queue_counts(&names.inbound());
        assert!(unacked <= PREFETCH as u64, "{unacked} unacknowledged, above the prefetch of {PREFETCH}");
        most = most.max(unacked);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most, PREFETCH as u64, "the prefetch window filled while downstream was blocked");

    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let _ = connection.close(200, "done".into()).await;
}

#[test]
fn without_a_broker_http_still_serves_and_readyz_says_not_ready() {
    let dir = broker::temp_dir("amqp-away");
    let config = format!(
        "[store]\npath = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\nplain = true\n[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"\nreconnect_max_ms = 200\n",
        dir.join("store").display()
    );
    let daemon = Daemon::start(&config, &dir);
    // It serves from the start, and says it is not ready at every look while it retries.
    for _ in 0..10 {
        assert_eq!(daemon.readyz(), 503, "ready without a broker");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "shuts down cleanly while reconnecting");
}

/// A store damaged under a running daemon (a session record that no longer decodes, as after
/// bit rot): the message that meets it is not acknowledged, and the daemon stops with an error
/// naming the store instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_stops_the_daemon_and_leaves_the_message_with_the_broker() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("damaged");
    let dir = broker::temp_dir("amqp-damaged");
    let store = dir.join("store");
    let config = names.config(&store, "", true);
    // A first run makes the store and the topology; then one session record rots.
    let first = Daemon::start(&config, &dir);
    first.wait_ready(Duration::from_secs(30));
    let (status, _) = first.terminate(Duration::from_secs(40));
    assert!(status.success());
    {
        let db = sled::open(&store).expect("the store opens");
        db.insert(b"session:conv-1", &b"\x00 not a session record"[..]).unwrap();
        db.flush().unwrap();
    }
    let mut daemon = Daemon::start(&config, &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    let good = (names.inbound(), broker::envelope(0, 0, None), props(0));
    broker::publish_all(&channel, &names.inbound_exchange(), vec![good]).await;
    wait_for_sink(&names, 1).await;
    let rotten = (names.inbound(), broker::envelope(1, 1, None), props(1));
    broker::publish_all(&channel, &names.inbound_exchange(), vec![rotten]).await;
    let status = tokio::task::block_in_place(|| daemon.wait_exit(Duration::from_secs(60)));
    assert!(!status.success(), "a damaged store stops the daemon with an error: {status:?}");
    let log = daemon.log_text();
    assert!(log.contains("store is damaged"), "the error names the store: {log}");
    broker::wait_counts(&names.inbound(), (1, 0), "the message that met the damage stays with the broker")
        .await;
    let _ = connection.close(200, "done".into()).await;
}

/// The broker closes only the publishing channel (a publish to an exchange that was deleted
/// meanwhile): silpgate reconnects, declares its topology again, and finishes the stream with
/// nothing lost and nothing counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_channel_closed_by_the_broker_reconnects_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("chanclose");
    let dir = broker::temp_dir("amqp-chanclose");
    const N: usize = 1000;
    const CONVERSATIONS: usize = 20;
    let daemon = Daemon::start(&names.config(&dir.join("store"), "", true), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    broker::publish_all(&channel, &names.inbound_exchange(), plain_batch(&names, N, CONVERSATIONS)).await;
    wait_for_sink(&names, 200).await;
    channel
        .exchange_delete(
            names.agents_exchange().as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await
        .unwrap();
    // silpgate sees its publishing channel closed, and connects and consumes again.
    let deadline = std::time::Instant::now() + LONG;
    while daemon.log_text().matches("Connected to the broker; consuming.").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "silpgate did not reconnect after the channel closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.log_text().contains("NOT_FOUND"), "the broker closed the publishing channel");
    assert_mid_stream(&names, N, "the channel close").await;
    assert_settled(daemon, connection, &channel, &names, &dir, N, CONVERSATIONS).await;
}

/// A graceful stop is routine (every rolling restart makes one), so it must log nothing at
/// ERROR: an operator who sees errors on every restart learns to ignore the level. A channel
/// dropped while its connection closes used to race the close, and lapin logged the lost
/// channel close as a connection error, in about two stops of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_logs_no_error() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("quietstop");
    let dir = broker::temp_dir("amqp-quietstop");
    let config = names.config(&dir.join("store"), "", true);
    for stop in 1..=5 {
        let daemon = Daemon::start(&config, &dir);
        daemon.wait_ready(Duration::from_secs(30));
        let log = daemon.log.clone();
        let (status, _) = daemon.terminate(Duration::from_secs(30));
        assert!(status.success(), "stop {stop}: exit status {status:?}");
        // The log reader lets go of its handle once it has read the daemon's last line.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::sync::Arc::strong_count(&log) > 1 {
            assert!(std::time::Instant::now() < deadline, "the daemon's stderr was not closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let errors: Vec<String> =
            log.lock().unwrap().iter().filter(|l| l.contains(" ERROR ")).cloned().collect();
        assert!(errors.is_empty(), "stop {stop} logged errors: {errors:#?}");
    }
}

/// A failure that does not clear (nothing is bound downstream) is retried `max_attempts`
/// times, then dead-lettered with the last error and how many attempts were made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_past_max_attempts_is_dead_lettered_saying_so() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("attempts");
    let dir = broker::temp_dir("amqp-attempts");
    let (connection, channel) = broker::channel().await;
    let daemon = Daemon::start(&names.config(&dir.join("store"), "max_attempts = 3", false), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    declare_plain_queue(&channel, &names.replies(), FieldTable::default()).await;
    let one =
        vec![(names.inbound(), broker::envelope(1, 0, None), props(1).with_reply_to(names.replies().into()))];
    broker::publish_all(&channel, &names.inbound_exchange(), one).await;
    let dead = broker::collect(&channel, &names.dead(), LONG, |got| !got.is_empty()).await;
    assert_eq!(dead.len(), 1, "dead-lettered once the attempts ran out");
    assert_eq!(dead[0].message_id, "m-1");
    assert_eq!(dead[0].headers.get("x-silpgate-error-code").map(String::as_str), Some("unroutable"));
    let reason = dead[0].headers.get("x-silpgate-error").cloned().unwrap_or_default();
    assert!(reason.starts_with("gave up after 3 attempts"), "{reason}");
    // The sender hears it too, at its reply address, once.
    let told = broker::collect(&channel, &names.replies(), LONG, |got| !got.is_empty()).await;
    let more = broker::collect(&channel, &names.replies(), Duration::from_secs(1), |_| false).await;
    assert_eq!(told.len() + more.len(), 1, "one error reply");
    assert_eq!(told[0].correlation_id.as_deref(), Some("c-1"));
    let error = decode(&told[0]);
    assert_eq!(silpgate::nlip::reply::error_code(&error).as_deref(), Some("unroutable"), "{error:?}");
    assert!(silpgate::nlip::to_json(&error).contains("gave up after 3 attempts"), "{error:?}");
    broker::wait_counts(&names.inbound(), (0, 0), "acknowledged once dead-lettered").await;
    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let _ = connection.close(200, "done".into()).await;
}

/// Acknowledgements go out in runs (`basic.ack` with `multiple`), and a run stops below a
/// delivery still in work. An agent's answer that cannot be passed on (its asker's reply
/// address routes nowhere, so it is retried until the asker's wait ends) sits on the consuming
/// channel below everything that arrives after it: those must still be acknowledged, or the
/// prefetch window would fill behind one stuck answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_stuck_in_retries_does_not_hold_back_the_acknowledgements_behind_it() {
    let _serial = SERIAL.lock().await;
    let names = Names::new("stuck");
    let dir = broker::temp_dir("amqp-stuck");
    let (connection, channel) = broker::channel().await;
    let config = names
        .config(&dir.join("store"), "", true)
        .replace("[gateway]\n", "[gateway]\nreply_timeout_ms = 600000\n");
    let daemon = Daemon::start(&config, &dir);
    daemon.wait_ready(Duration::from_secs(30));

    let nowhere = props(0).with_reply_to(format!("{}.nowhere", names.inbound()).into());
    let request = vec![(names.inbound(), broker::envelope(0, 999, None), nowhere)];
    broker::publish_all(&channel, &names.inbound_exchange(), request).await;
    let forwarded = broker::collect(&channel, &names.sink(), LONG, |got| !got.is_empty()).await;
    let answer = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_correlation_id(forwarded[0].correlation_id.clone().expect("a correlation id").into());
    let body = br#"{"format":"structured","subformat":"silp-code","content":"cancel(order0)"}"#.to_vec();
    broker::publish_all(&channel, "", vec![(names.answers(), body, answer)]).await;
    broker::wait_counts(&names.answers(), (0, 1), "the answer is held, retried, not acknowledged").await;

    const N: usize = 300;
    let others: Vec<_> =
        (1..=N).map(|i| (names.inbound(), broker::envelope(i, i % 30, None), props(i))).collect();
    broker::publish_all(&channel, &names.inbound_exchange(), others).await;
    let sink = broker::collect(&channel, &names.sink(), LONG, |got| distinct_forwarded(got) == N).await;
    assert_eq!(distinct_forwarded(&sink), N, "everything behind the answer was relayed");
    // The broker's queue statistics lag by seconds; what a crash gives back does not. A SIGKILL
    // leaves no time for last acknowledgements: whatever was not acknowledged by now is
    // requeued, the stuck answer among it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    daemon.kill();
    let ready = async |queue: String| {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        channel
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap()
            .message_count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ready(names.answers()).await != 1 {
        assert!(std::time::Instant::now() < deadline, "the stuck answer was requeued when silpgate died");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready(names.inbound()).await, 0, "everything behind the answer had been acknowledged");
    let _ = connection.close(200, "done".into()).await;
}

/// An RPC client that names RabbitMQ's direct reply-to as its reply address (it consumes
/// `amq.rabbitmq.reply-to` on the channel it publishes from) gets its reply there. RabbitMQ
/// reports a mandatory publish to such an address as unroutable even when it delivers it, so
/// silpgate must publish it otherwise, and the request is acknowledged, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpc_client_on_direct_reply_to_gets_its_reply() {
    use futures_util::StreamExt;
    use lapin::options::BasicConsumeOptions;
    use silpgate::broker::publish::DIRECT_REPLY_TO;

    let _serial = SERIAL.lock().await;
    let names = Names::new("direct-reply");
    let dir = broker::temp_dir("amqp-direct-reply");
    let (connection, channel) = broker::channel().await;
    let daemon = Daemon::start(&names.config(&dir.join("store"), "", false), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let no_ack = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
    let mut replies = channel
        .basic_consume(DIRECT_REPLY_TO.into(), "rpc-client".into(), no_ack, FieldTable::default())
        .await
        .unwrap();
    let request = props(7).with_reply_to(DIRECT_REPLY_TO.into());
    let one = vec![(names.inbound(), broker::envelope(7, 0, Some("decode")), request)];
    broker::publish_all(&channel, &names.inbound_exchange(), one).await;

    let reply = tokio::time::timeout(LONG, async {
        loop {
            let delivery = replies.next().await.expect("the consumer stays open").expect("a delivery");
            let message = nlip::decode(&delivery.data, Encoding::Json, &Limits::default()).unwrap();
            if !message.is_control() {
                return (delivery, message);
            }
        }
    })
    .await
    .expect("the reply arrives on direct reply-to");
    assert_eq!(reply.0.properties.correlation_id().as_ref().map(|c| c.as_str()), Some("c-7"));
    assert_eq!(reply.1.subformat, "silp-ir", "decoded back for the sender");
    // A publish taken for a failure would be retried, and each retry sends the reply again.
    let again = tokio::time::timeout(Duration::from_secs(2), replies.next()).await;
    let again = again.ok().flatten().and_then(Result::ok).map(|d| d.properties.message_id().clone());
    assert_eq!(again, None, "one reply, not published again by a retry");
    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    // Whatever the daemon had not acknowledged is back in its queue now.
    for queue in [names.inbound(), names.dead()] {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let left =
            channel.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await.unwrap();
        assert_eq!(left.message_count(), 0, "{queue}: the request was acknowledged, not dead-lettered");
    }
    let _ = connection.close(200, "done".into()).await;
}

/// With many publishes in flight on one channel, RabbitMQ confirms them in batches
/// (`multiple`), and lapin hands a returned message to whichever confirm of the batch it
/// completes first, not to the publish that was returned. Every unroutable publish must still
/// fail as its own, and every routed one succeed: a returned answer taken for a delivered one
/// would be acknowledged upstream and lost.
#[tokio::test]
async fn among_many_publishes_in_flight_each_unroutable_one_fails_as_its_own() {
    use silpgate::broker::publish::{Publication, PublishError, Publisher};

    let _serial = SERIAL.lock().await;
    let (connection, channel) = broker::channel().await;
    let exclusive =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let sink = channel.queue_declare("".into(), exclusive, FieldTable::default()).await.unwrap();
    let sink = sink.name().as_str().to_owned();
    let publisher = Publisher::new(channel.clone(), Duration::from_secs(30));
    let nowhere = format!("sgtest.nowhere.{}", std::process::id());

    const MESSAGES: usize = 3_000;
    let unroutable = |i: usize| i % 7 == 3 || i.is_multiple_of(11);
    for round in 0..3 {
        let mut pending = Vec::with_capacity(MESSAGES);
        for i in 0..MESSAGES {
            let routing_key = if unroutable(i) { nowhere.as_str() } else { sink.as_str() };
            let publication = Publication {
                exchange: "",
                routing_key,
                body: format!("message {i}").into_bytes(),
                properties: BasicProperties::default().with_message_id(format!("r{round}-{i}").into()),
            };
            pending.push(publisher.send(publication).expect("sent"));
        }
        let mut wrong = Vec::new();
        for (i, confirm) in pending.into_iter().enumerate() {
            match (unroutable(i), confirm.confirmed().await) {
                (true, Err(PublishError::Unroutable { routing_key, .. })) => assert_eq!(routing_key, nowhere),
                (false, Ok(())) => {}
                (expected_unroutable, got) => {
                    wrong.push(format!("{i}: unroutable={expected_unroutable} got {got:?}"))
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "round {round}: {} of {MESSAGES} misreported: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(10)]
        );
    }
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    let routed = channel.queue_declare(sink.as_str().into(), passive, FieldTable::default()).await.unwrap();
    let expected = 3 * (0..MESSAGES).filter(|i| !unroutable(*i)).count();
    assert_eq!(routed.message_count() as usize, expected, "every routed publish is in the queue");
    let _ = connection.close(200, "done".into()).await;
}

/// A publish the broker refuses (here a full queue that rejects publishes) asks for a fresh
/// channel, naming the refusing one, at most once per pause; once replaced, publishes go out on
/// the fresh channel and the old one is closed when its publishes are decided.
#[tokio::test]
async fn a_refused_publish_asks_for_a_fresh_channel_once_and_the_old_one_is_closed() {
    use lapin::options::ConfirmSelectOptions;
    use silpgate::broker::publish::{Publication, PublishError, Publisher, RENEWAL_PAUSE};

    let _serial = SERIAL.lock().await;
    let (connection, channel) = broker::channel().await;
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    arguments.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    let exclusive =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let full = channel.queue_declare("".into(), exclusive, arguments).await.unwrap();
    let full = full.name().as_str().to_owned();
    let first = connection.create_channel().await.unwrap();
    first.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let (publisher, mut renewals) = Publisher::renewing(first.clone(), Duration::from_secs(30));
    let publish = |i: usize| Publication {
        exchange: "",
        routing_key: &full,
        body: format!("message {i}").into_bytes(),
        properties: BasicProperties::default().with_message_id(format!("m-{i}").into()),
    };

    publisher.send(publish(0)).unwrap().confirmed().await.expect("the first message fits");
    for i in 1..4 {
        let refused = publisher.send(publish(i)).unwrap().confirmed().await;
        assert!(matches!(refused, Err(PublishError::Refused { .. })), "message {i}: {refused:?}");
    }
    let asked = tokio::time::timeout(LONG, renewals.recv()).await.expect("a renewal is asked for");
    assert_eq!(asked, Some(first.id()), "the refusing channel is named");
    assert!(renewals.try_recv().is_err(), "a burst of refusals asks once");

    let fresh = connection.create_channel().await.unwrap();
    fresh.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let replaced = std::time::Instant::now();
    publisher.replace(fresh.clone(), Duration::ZERO);
    assert_eq!(publisher.channel().id(), fresh.id(), "publishes go out on the fresh channel");
    let closed = async {
        while first.status().connected() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(LONG, closed).await.expect("the replaced channel is closed");

    // Refused again within the pause after the renewal: no new ask. After it: one.
    let refused = publisher.send(publish(4)).unwrap().confirmed().await;
    assert!(matches!(refused, Err(PublishError::Refused { .. })), "{refused:?}");
    if replaced.elapsed() < RENEWAL_PAUSE {
        assert!(renewals.try_recv().is_err(), "no renewal within {RENEWAL_PAUSE:?} of the last");
    } else {
        // A machine slow enough to get here after the pause may rightly have been asked again.
        let _ = renewals.try_recv();
    }
    tokio::time::sleep(RENEWAL_PAUSE).await;
    let refused = publisher.send(publish(5)).unwrap().confirmed().await;
    assert!(matches!(refused, Err(PublishError::Refused { .. })), "{refused:?}");
    let asked = tokio::time::timeout(LONG, renewals.recv()).await.expect("asked again after the pause");
    assert_eq!(asked, Some(fresh.id()));
    let _ = connection.close(200, "done".into()).await;
}
