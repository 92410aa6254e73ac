//! Traces, end to end: silpgate exports over OTLP/HTTP to a real receiver (the official
//! OpenTelemetry protos, tests/interop/otlp_sink.py), honours the `traceparent` a message
//! arrives with, and injects its own into what it publishes.

mod support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::Value;
use std::collections::HashSet;
use std::time::Duration;
use support::broker::{self, Daemon, Names};

/// POSTs a JSON envelope with a `traceparent` header; the status code.
fn post(addr: &str, body: &[u8], traceparent: &str) -> u16 {
    support::raw_http::post_nlip(addr, &[format!("traceparent: {traceparent}")], body)
}

fn hex(n: usize, seed: u64) -> String {
    (0..n).map(|i| format!("{:x}", (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) + 1) % 16)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_over_otlp_and_trace_context_crosses_the_bus() {
    let dir = broker::temp_dir("telemetry");
    let spans_file = dir.join("spans.jsonl");
    let (_sink, port) = support::otlp::start_sink(&spans_file);
    let names = Names::new("trace");
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}/v1/traces\"\notlp_metrics_endpoint = \"http://127.0.0.1:{port}/v1/metrics\"\nmetrics_interval_secs = 1\nservice_name = \"silpgate-test\"\n",
        names.config(&dir.join("store"), "", true)
    );
    let daemon = Daemon::start(&config, &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;

    // Three messages come with a trace context, three without.
    let seed = u64::from(std::process::id());
    let upstream: Vec<(String, String)> =
        (0..3).map(|i| (hex(32, seed + i), hex(16, seed + 100 + i))).collect();
    let messages = (0..6)
        .map(|i| {
            let mut properties = BasicProperties::default()
                .with_message_id(format!("m-{i}").into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            // Every other one names its sender, which the broker checks.
            if i % 2 == 0 {
                properties = properties.with_user_id("guest".into());
            }
            if let Some((trace, span)) = upstream.get(i) {
                let mut headers = FieldTable::default();
                let traceparent = format!("00-{trace}-{span}-01");
                headers.insert(
                    "traceparent".into(),
                    AMQPValue::LongString(LongString::from(traceparent.into_bytes())),
                );
                properties = properties.with_headers(headers);
            }
            (names.inbound(), broker::envelope(i, i, None), properties)
        })
        .collect();
    broker::publish_all(&channel, &names.inbound_exchange(), messages).await;
    let forwarded =
        broker::collect(&channel, &names.sink(), Duration::from_secs(60), |got| got.len() == 6).await;
    assert_eq!(forwarded.len(), 6);

    // HTTP and WebSocket: the request's, and the upgrade request's, traceparent is honoured.
    let (http_trace, http_span) = (hex(32, seed + 50), hex(16, seed + 150));
    let status = post(
        &daemon.http,
        &broker::envelope(50, 50, Some("decode")),
        &format!("00-{http_trace}-{http_span}-01"),
    );
    assert_eq!(status, 200);
    let (ws_trace, ws_span) = (hex(32, seed + 60), hex(16, seed + 160));
    {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
        let mut request = format!("ws://{}/nlip/ws/text", daemon.http).into_client_request().unwrap();
        request.headers_mut().insert("traceparent", format!("00-{ws_trace}-{ws_span}-01").parse().unwrap());
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let text = String::from_utf8(broker::envelope(60, 60, Some("decode"))).unwrap();
        socket.send(Message::Text(text.into())).await.unwrap();
        let reply = tokio::time::timeout(std::time::Duration::from_secs(30), socket.next())
            .await
            .expect("a WebSocket reply within 30 s")
            .unwrap()
            .unwrap();
        assert!(reply.is_text(), "{reply:?}");
        socket.close(None).await.unwrap();
    }

    // Stopping flushes the exporter.
    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let (points, spans) = support::otlp::received(&spans_file);
    // Metrics were pushed over OTLP too, with their labels as attributes.
    let amqp_in = points
        .iter()
        .filter(|p| p["metric"] == "silpgate_messages_in_total" && p["attributes"]["transport"] == "amqp")
        .filter_map(|p| p["value"].as_f64())
        .fold(0.0, f64::max);
    assert!(amqp_in >= 6.0, "silpgate_messages_in_total{{transport=amqp}} pushed over OTLP: {amqp_in}");
    assert!(
        points.iter().any(|p| p["metric"] == "silpgate_message_seconds_count"),
        "histograms as count and sum"
    );
    assert!(spans.iter().all(|s| s["service"] == "silpgate-test"));
    let process_of = |message_id: &str| -> &Value {
        spans
            .iter()
            .find(|s| {
                s["name"].as_str().is_some_and(|n| n.starts_with("process "))
                    && s["attributes"]["messaging.message.id"] == message_id
            })
            .unwrap_or_else(|| panic!("no process span for {message_id}"))
    };
    let children_of =
        |span: &Value| -> Vec<&Value> { spans.iter().filter(|s| s["parent"] == span["span_id"]).collect() };

    let mut traces = HashSet::new();
    for i in 0..6 {
        let id = format!("m-{i}");
        let process = process_of(&id);
        assert_eq!(process["attributes"]["messaging.system"], "rabbitmq");
        assert_eq!(process["attributes"]["network.protocol.name"], "amqp");
        assert_eq!(process["attributes"]["server.address"], "127.0.0.1");
        assert_eq!(process["attributes"]["messaging.destination.name"], names.inbound());
        assert_eq!(process["attributes"]["silpgate.route"], "to-sink");
        assert_eq!(process["attributes"]["silp.intent"], "!CANCEL");
        assert_eq!(process["kind"], 5, "a consumer span");
        let sender = if i % 2 == 0 { Value::from("amqp:guest") } else { Value::Null };
        assert_eq!(process["attributes"]["enduser.id"], sender, "{id}: the principal on its span");
        traces.insert(process["trace_id"].as_str().unwrap().to_owned());
        match upstream.get(i) {
            Some((trace, span)) => {
                assert_eq!(process["trace_id"], trace.as_str(), "{id} continues its sender's trace");
                assert_eq!(process["parent"], span.as_str());
            }
            None => assert_eq!(process["parent"], "", "{id} starts a trace"),
        }
        let children = children_of(process);
        let names_of: HashSet<&str> = children.iter().map(|s| s["name"].as_str().unwrap()).collect();
        for stage in ["nlip decode", "gateway handle", "store flush", "amqp ack"] {
            assert!(names_of.contains(stage), "{id}: no {stage} span under process: {names_of:?}");
        }
        let publish = children
            .iter()
            .find(|s| s["name"].as_str().unwrap().starts_with("publish "))
            .unwrap_or_else(|| panic!("{id}: no publish span"));
        // What went downstream carries the publish span's context.
        let out = forwarded.iter().find(|r| r.message_id.starts_with(&format!("{id}:"))).unwrap();
        let traceparent = out.headers.get("traceparent").expect("traceparent injected");
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts[1], process["trace_id"].as_str().unwrap());
        assert_eq!(parts[2], publish["span_id"].as_str().unwrap());
    }
    assert_eq!(traces.len(), 6, "one trace per message");
    for (source, trace, parent) in [("http", &http_trace, &http_span), ("ws", &ws_trace, &ws_span)] {
        let request = spans
            .iter()
            .find(|s| s["name"] == format!("process {source}").as_str())
            .unwrap_or_else(|| panic!("no span for the {source} request"));
        assert_eq!(request["trace_id"], trace.as_str(), "{source}");
        assert_eq!(request["parent"], parent.as_str(), "{source}");
        assert_eq!(request["kind"], 2, "a server span");
        assert_eq!(request["attributes"]["silpgate.route"], "decode-for-sender");
        let stages: HashSet<&str> =
            children_of(request).iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert!(stages.contains("gateway handle"), "{source}: {stages:?}");
    }
    let _ = connection.close(200, "done".into()).await;
}

/// `telemetry.sample_ratio` reloads: at 0 no trace that starts here is exported, and after a
/// SIGHUP with 1 every one is, from the next message on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_sample_ratio_holds_from_the_next_trace_on() {
    let dir = broker::temp_dir("telemetry-ratio");
    let spans_file = dir.join("spans.jsonl");
    let (_sink, port) = support::otlp::start_sink(&spans_file);
    let names = Names::new("trace-ratio");
    let config = |ratio: &str| {
        format!(
            "{}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}/v1/traces\"\nsample_ratio = {ratio}\n",
            names.config(&dir.join("store"), "", true)
        )
    };
    let daemon = Daemon::start(&config("0.0"), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    let batch = |label: &str| -> Vec<(String, Vec<u8>, BasicProperties)> {
        (0..5)
            .map(|i| {
                let properties = BasicProperties::default()
                    .with_message_id(format!("{label}-{i}").into())
                    .with_content_type("application/json".into());
                (names.inbound(), broker::envelope(i, i, None), properties)
            })
            .collect()
    };
    broker::publish_all(&channel, &names.inbound_exchange(), batch("unsampled")).await;
    let first = broker::collect(&channel, &names.sink(), Duration::from_secs(60), |got| got.len() == 5).await;
    assert_eq!(first.len(), 5);

    std::fs::write(dir.join("silpgate.toml"), config("1.0")).unwrap();
    let pid = daemon.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !daemon.get("/metrics").1.contains("silpgate_config_reloads_total{result=\"applied\"} 1") {
        assert!(std::time::Instant::now() < deadline, "the reload was not applied:\n{}", daemon.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    broker::publish_all(&channel, &names.inbound_exchange(), batch("sampled")).await;
    let second =
        broker::collect(&channel, &names.sink(), Duration::from_secs(60), |got| got.len() == 5).await;
    assert_eq!(second.len(), 5);

    let (status, _) = daemon.terminate(Duration::from_secs(40));
    assert!(status.success());
    let (_, spans) = support::otlp::received(&spans_file);
    let processed = |label: &str| -> HashSet<String> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("process ")))
            .filter_map(|s| s["attributes"]["messaging.message.id"].as_str())
            .filter(|id| id.starts_with(&format!("{label}-")))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(processed("unsampled"), HashSet::new(), "at 0, nothing exported");
    assert_eq!(processed("sampled").len(), 5, "at 1 after the reload, every message's trace");
    let _ = connection.close(200, "done".into()).await;
}
