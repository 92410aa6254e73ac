//! A tiny NLIP agent on RabbitMQ, for trying silpgate out and for its round-trip benchmark: it
//! consumes one queue and answers every request to its `reply_to`, with its `correlation_id`,
//! in JSON. A text request is answered with the same text, marked as answered; a SILP request
//! with the same SILP payload; the conversation token is echoed (ECMA-430 §6.2).
//!
//!     cargo run --release --example echo_agent -- --queue agent.assistant

use clap::Parser;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use silpgate::nlip::{self, Content, Encoding, Limits, Message};

#[derive(Parser)]
#[command(about = "An NLIP agent that answers every request it consumes")]
struct Args {
    /// The queue to consume (silpgate declares an agent's `queue`).
    #[arg(long, default_value = "agent.assistant")]
    queue: String,
    /// The broker.
    #[arg(long, env = "SILPGATE_AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    url: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let connection = Connection::connect(&args.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(256, BasicQosOptions::default()).await?;
    let mut requests = channel
        .basic_consume(
            args.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    eprintln!("echo_agent: answering requests on {}", args.queue);
    while let Some(delivery) = requests.next().await {
        let delivery = delivery?;
        let encoding = delivery
            .properties
            .content_type()
            .as_ref()
            .and_then(|c| Encoding::from_content_type(c.as_str()))
            .unwrap_or(Encoding::Json);
        if let (Ok(request), Some(reply_to)) =
            (nlip::decode(&delivery.data, encoding, &Limits::default()), delivery.properties.reply_to())
        {
            let mut properties = BasicProperties::default().with_content_type("application/json".into());
            if let Some(id) = delivery.properties.correlation_id() {
                properties = properties.with_correlation_id(id.clone());
            }
            let body = nlip::encode(&answer(request), Encoding::Json);
            channel
                .basic_publish(
                    "".into(),
                    reply_to.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await?;
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// The request itself, its text marked as answered; tokens are kept, so they are echoed.
fn answer(mut request: Message) -> Message {
    if let Content::Json(serde_json::Value::String(text)) = &request.content
        && request.format == nlip::Format::Text
    {
        request.content = Content::text(format!("{text} (answered by echo_agent)"));
    }
    request.messagetype = None;
    request
}
