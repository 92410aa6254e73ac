//! What silpgate publishes on a producer's behalf is accepted by the real RabbitMQ on
//! 127.0.0.1:5672, whatever the producer set: a forward to a partition carries no `user_id`
//! (the broker refuses another user's id and closes the channel), and its identity and source
//! headers are the ones silpgate vouches for.

use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use silpgate::broker::properties::{self, SOURCE_HEADER, USER_ID_HEADER};

fn text(headers: &FieldTable, name: &str) -> Option<String> {
    headers.inner().get(name).and_then(properties::value_text)
}

#[tokio::test]
async fn a_forward_of_another_users_message_is_accepted_and_keeps_the_channel_open() {
    let connection =
        Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", ConnectionProperties::default())
            .await
            .expect("RabbitMQ runs on 127.0.0.1:5672");
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
    let forward = properties::partitioned_properties(&inbound, "conv-1", "silpgate.in");
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
    assert!(got.properties.user_id().is_none());
    let headers = got.properties.headers().clone().unwrap();
    assert_eq!(text(&headers, SOURCE_HEADER).as_deref(), Some("silpgate.in"));
    assert_eq!(text(&headers, USER_ID_HEADER).as_deref(), Some("alice"));
    let _ = connection.close(200, "done".into()).await;
}
