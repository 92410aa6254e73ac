//! What a producer sets on the real RabbitMQ on 127.0.0.1:5672 decides nothing it should not:
//! a forward to a partition is published as silpgate's own user (the broker would refuse
//! another user's id and close the channel), its identity and source headers are the ones
//! silpgate vouches for, and a forged `x-silpgate-source` does not choose a delivery's route.

mod support;

use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use silpgate::broker::properties::{self, SOURCE_HEADER, USER_ID_HEADER};
use std::time::Duration;
use support::broker::{self, Daemon, Names};

fn text(headers: &FieldTable, name: &str) -> Option<String> {
    headers.inner().get(name).and_then(properties::value_text)
}

#[tokio::test]
async fn a_forward_of_another_users_message_is_accepted_and_keeps_the_channel_open() {
    let connection = broker::connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let options =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let queue = channel.queue_declare("".into(), options, FieldTable::default()).await.unwrap();
    // As a producer "alice" sent it, with headers of its own choosing.
    let mut forged = FieldTable::default();
    forged.insert(SOURCE_HEADER.into(), AMQPValue::LongString(LongString::from(b"admin.in".to_vec())));
    forged.insert(USER_ID_HEADER.into(), AMQPValue::LongString(LongString::from(b"root".to_vec())));
    let inbound = BasicProperties::default().with_user_id("alice".into()).with_headers(forged);
    let forward = properties::partitioned_properties(&inbound, "conv-1", "silpgate.in", "guest");
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.name().as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            forward,
        )
        .await
        .expect("the publish is sent")
        .await
        .expect("the broker confirms instead of closing the channel");
    assert!(confirm.is_ack(), "{confirm:?}");
    assert!(channel.status().connected(), "the shared channel stays open");
    let got = channel
        .basic_get(queue.name().as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the forward arrived");
    assert_eq!(
        got.properties.user_id().as_ref().map(|u| u.as_str()),
        Some("guest"),
        "the broker vouches for silpgate"
    );
    let headers = got.properties.headers().clone().unwrap();
    assert_eq!(text(&headers, SOURCE_HEADER).as_deref(), Some("silpgate.in"));
    assert_eq!(text(&headers, USER_ID_HEADER).as_deref(), Some("alice"));
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_cannot_choose_its_route_source_with_a_header() {
    let names = Names::new("source");
    let dir = broker::temp_dir("broker-trust-source");
    let privileged = format!("{}.privileged", names.prefix);
    // A route for the source "admin" to an agent of its own, before the catch-all to the sink.
    let config = names.config(&dir.join("store"), "", true).replace(
        "[[routes]]\nname = \"to-sink\"",
        &format!(
            "[[agents]]\nname = \"privileged\"\nfrontends = [\"json\"]\nrouting_key = \"{privileged}\"\nqueue = \"{privileged}\"\n\n[[routes]]\nname = \"admin-only\"\ndestination = \"privileged\"\nmode = \"transcode\"\n[routes.match]\nsource = \"admin\"\n\n[[routes]]\nname = \"to-sink\""
        ),
    );
    let daemon = Daemon::start(&config, &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    let mut forged = FieldTable::default();
    forged.insert(SOURCE_HEADER.into(), AMQPValue::LongString(LongString::from(b"admin".to_vec())));
    let properties = BasicProperties::default()
        .with_message_id("forged-source".into())
        .with_content_type("application/json".into())
        .with_headers(forged);
    broker::publish_all(&channel, "", vec![(names.inbound(), broker::envelope(0, 0, None), properties)])
        .await;
    let to_sink =
        broker::collect(&channel, &names.sink(), Duration::from_secs(20), |got| !got.is_empty()).await;
    let to_privileged =
        broker::collect(&channel, &privileged, Duration::from_secs(1), |got| !got.is_empty()).await;
    assert_eq!(to_privileged.len(), 0, "the forged source chose the admin route");
    assert_eq!(to_sink.len(), 1, "the message takes its queue's route");
    // The daemon goes first: deleting the queues it consumes would make it declare them again.
    daemon.kill();
    let _ = channel.queue_delete(privileged.as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// silpgate publishes replies with its own broker rights, so a reply address is a write it
/// makes for the producer: a queue outside `amqp.reply_prefixes` (and direct reply-to and
/// server-named queues), or one silpgate declares itself even under an allowed prefix, gets
/// nothing. The message is dead-lettered `forbidden`, saying why, before it reaches any
/// agent; a message with an allowed address is served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_cannot_make_silpgate_publish_into_a_queue_it_may_not_name() {
    let names = Names::new("reply-rule");
    let dir = broker::temp_dir("broker-trust-reply-rule");
    let daemon = Daemon::start(&names.config(&dir.join("store"), "", true), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    // A queue of someone else's, outside the prefixes the configuration allows.
    let victim = format!("victim.{}", names.prefix);
    channel
        .queue_declare(victim.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();
    support::gateway::declare(&channel, &names.replies()).await;
    let request = |id: &str, reply_to: &str| {
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_correlation_id(id.into())
            .with_content_type("application/json".into())
            .with_reply_to(reply_to.into());
        (names.inbound(), broker::envelope(0, 0, Some("decode")), properties)
    };
    broker::publish_all(
        &channel,
        "",
        vec![
            request("to-victim", &victim),
            request("to-own", &names.sink()),
            request("to-mine", &names.replies()),
        ],
    )
    .await;
    // One conversation, taken in order: the answer to the last message comes after the first
    // two were settled, so what the queues hold then is all they get.
    let answered =
        broker::collect(&channel, &names.replies(), Duration::from_secs(30), |got| !got.is_empty()).await;
    assert_eq!(answered[0].correlation_id.as_deref(), Some("to-mine"), "an allowed address is answered");
    assert_eq!(broker::live_ready(&victim).await, 0, "nothing reached the victim");
    assert_eq!(broker::live_ready(&names.sink()).await, 0, "nothing reached silpgate's own agent queue");
    assert_eq!(broker::live_ready(&names.dead()).await, 2, "the two refused messages are dead-lettered");
    let dead = broker::collect(&channel, &names.dead(), Duration::from_secs(30), |got| got.len() >= 2).await;
    let why = |id: &str| {
        let copy =
            dead.iter().find(|d| d.message_id == id).unwrap_or_else(|| panic!("{id} is dead-lettered"));
        assert_eq!(copy.headers.get("x-silpgate-error-code").map(String::as_str), Some("forbidden"), "{id}");
        copy.headers.get("x-silpgate-error").cloned().unwrap_or_default()
    };
    assert!(why("to-victim").contains("amqp.reply_prefixes"), "{}", why("to-victim"));
    assert!(why("to-own").contains("silpgate itself uses"), "{}", why("to-own"));
    daemon.kill();
    let _ = channel.queue_delete(victim.as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}
