//! Reading the configuration again while running, through every way an operator has (SIGHUP,
//! `silpgate config reload`, `POST /admin/reload`), on the real broker under steady traffic: a
//! new agent and a new route are used from the next message on, nothing is lost, refused or
//! dead-lettered meanwhile; a file that fails the check and one that changes a setting read
//! only at start are refused by name, and the configuration in use stays.

mod support;

use lapin::BasicProperties;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::broker::{self, Daemon, Names};
use support::process::run_bounded;

const ADMIN_TOKEN: &str = "reload-admin-secret";
const READER_TOKEN: &str = "reload-reader-secret";

/// The test's configuration: the usual sink route, two principals (an admin and one without
/// the role), and `routed` ahead of the catch-all route (the first route that matches wins).
fn config(names: &Names, store: &Path, routed: &str) -> String {
    let tokens = r#"
[[auth.tokens]]
subject = "ops"
roles = ["admin"]
token_env = "RELOAD_TEST_ADMIN"

[[auth.tokens]]
subject = "reader"
token_env = "RELOAD_TEST_READER"
"#;
    let catch_all = "[[routes]]\nname = \"to-sink\"";
    let base = names.config(store, "", true).replace(catch_all, &format!("{routed}\n{catch_all}"));
    assert!(base.contains(routed));
    format!("{base}{tokens}")
}

/// A second agent, and a route to it for `label = "two"`; and the log filter at `warn`.
fn second_agent(names: &Names) -> String {
    let queue = format!("{}2", names.sink());
    format!(
        r#"
[telemetry]
log_filter = "warn"

[[agents]]
name = "sink2"
frontends = ["json"]
routing_key = "{queue}"
queue = "{queue}"

[[routes]]
name = "two-to-sink2"
destination = "sink2"
mode = "transcode"
[routes.match]
label = "two"
"#
    )
}

/// POSTs to `/admin/reload` with `token`; the status and the body.
fn post_reload(addr: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        stream,
        "POST /admin/reload HTTP/1.1\r\nHost: x\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// `silpgate config reload --url` as an operator runs it; its exit status and output.
fn cli_reload(daemon: &Daemon, token: &str) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["config", "reload", "--url", &format!("http://{}", daemon.http)]);
    command.env("SILPGATE_ADMIN_TOKEN", token);
    let out = run_bounded(command, Duration::from_secs(60));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The inbound ids (`m-<i>`) read from `queue` until `enough` says so (or a minute passes).
async fn ids_until(
    channel: &lapin::Channel,
    queue: &str,
    enough: impl Fn(&BTreeSet<String>) -> bool,
) -> BTreeSet<String> {
    let ids = |got: &[broker::Received]| -> BTreeSet<String> {
        got.iter().map(|r| r.message_id.split(':').next().unwrap_or_default().to_owned()).collect()
    };
    ids(&broker::collect(channel, queue, Duration::from_secs(60), |got| enough(&ids(got))).await)
}

/// The inbound ids that reached `queue`, read until `count` have come.
async fn ids_in(channel: &lapin::Channel, queue: &str, count: usize) -> BTreeSet<String> {
    ids_until(channel, queue, |ids| ids.len() >= count).await
}

fn message(names: &Names, i: usize, label: Option<&str>) -> (String, Vec<u8>, BasicProperties) {
    let properties = BasicProperties::default()
        .with_message_id(format!("m-{i}").into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    (names.inbound(), broker::envelope(i, i % 10, label), properties)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_traffic_adds_an_agent_and_a_route_and_refuses_what_needs_a_restart() {
    let names = Names::new("reload");
    let dir = broker::temp_dir("reload");
    let store = dir.join("store");
    let path = dir.join("silpgate.toml");
    std::fs::write(&path, config(&names, &store, "")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["run", "--config"]).arg(&path);
    command.env("RELOAD_TEST_ADMIN", ADMIN_TOKEN).env("RELOAD_TEST_READER", READER_TOKEN);
    // The log filter is the file's (`info` by default), so that a reload can change it.
    let daemon = Daemon::spawn_as_configured(command);
    daemon.wait_ready(Duration::from_secs(30));
    let (connection, channel) = broker::channel().await;
    let digest_before = daemon.get("/metrics").1;

    // Steady traffic on the catch-all route, through every reload below.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let traffic = tokio::spawn({
        let (names, stop, sent) = (names.clone(), stop.clone(), sent.clone());
        async move {
            let (_connection, channel) = broker::channel().await;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let batch = (i..i + 10).map(|i| message(&names, i, None)).collect();
                broker::publish_all(&channel, &names.inbound_exchange(), batch).await;
                i += 10;
                sent.store(i, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    // Before the reload, a `two` message takes the catch-all route to sink; it has arrived
    // there before the file changes.
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(&names, 100_000, Some("two"))])
        .await;
    let mut in_sink = ids_until(&channel, &names.sink(), |ids| ids.contains("m-100000")).await;
    assert!(in_sink.contains("m-100000"), "the catch-all route before the reload");

    // Asked by nobody, by a principal without the role: refused, nothing read.
    assert_eq!(post_reload(&daemon.http, None).0, 401, "no token");
    let (status, body) = post_reload(&daemon.http, Some(READER_TOKEN));
    assert_eq!(status, 403, "a principal without the admin role: {body}");
    assert!(body.contains("token:reader does not have the admin role"), "{body}");

    // SIGHUP with the new agent and route in the file, and the log filter at `warn`: the
    // reload's own `info` line is no longer written.
    std::fs::write(&path, config(&names, &store, &second_agent(&names))).unwrap();
    let pid = daemon.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let applied = |n: usize| format!("silpgate_config_reloads_total{{result=\"applied\"}} {n}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !daemon.get("/metrics").1.contains(&applied(1)) {
        assert!(std::time::Instant::now() < deadline, "the SIGHUP reload was not applied");
        std::thread::sleep(Duration::from_millis(50));
    }
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(&names, 100_001, Some("two"))])
        .await;
    let sink2 = format!("{}2", names.sink());
    let in_sink2 = ids_in(&channel, &sink2, 1).await;
    assert_eq!(in_sink2, BTreeSet::from(["m-100001".to_owned()]), "the new route from the next message on");

    // A file that fails the check: refused, with the parse error's place; the old one stays.
    std::fs::write(&path, "[http\nlisten = ").unwrap();
    let (ok, said) = cli_reload(&daemon, ADMIN_TOKEN);
    assert!(!ok && said.contains("invalid_config") && said.contains("line 1"), "{said}");
    // One that changes a setting read only at start: refused, naming it.
    let moved = config(&names, &store, &second_agent(&names))
        .replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"");
    std::fs::write(&path, moved).unwrap();
    let (status, body) = post_reload(&daemon.http, Some(ADMIN_TOKEN));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("needs_restart") && body.contains("http.listen"), "{body}");
    // Webhook origins reload, but turning push notifications on starts a courier: a restart.
    let pushing =
        config(&names, &store, &second_agent(&names)) + "\n[a2a]\npush_origins = [\"http://127.0.0.1:9\"]\n";
    std::fs::write(&path, pushing).unwrap();
    let (status, body) = post_reload(&daemon.http, Some(ADMIN_TOKEN));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("a2a.push_origins (from none to some, or from some to none)"), "{body}");
    // Still the reloaded configuration: `two` goes to sink2.
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(&names, 100_002, Some("two"))])
        .await;
    assert!(ids_in(&channel, &sink2, 1).await.contains("m-100002"), "the configuration in use stayed");

    // Back to the first file through the command line: the route is gone again.
    std::fs::write(&path, config(&names, &store, "")).unwrap();
    let (ok, said) = cli_reload(&daemon, ADMIN_TOKEN);
    assert!(ok && said.contains("changed: agents, routes, telemetry.log_filter"), "{said}");
    broker::publish_all(&channel, &names.inbound_exchange(), vec![message(&names, 100_003, Some("two"))])
        .await;

    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();
    let sent = sent.load(Ordering::Relaxed);
    // Everything else reached sink: the steady traffic and the `two` messages sent before the
    // first reload and after the last.
    let mut expected: BTreeSet<String> = (0..sent).map(|i| format!("m-{i}")).collect();
    expected.extend(["m-100000".to_owned(), "m-100003".to_owned()]);
    let rest = ids_until(&channel, &names.sink(), |ids| ids.union(&in_sink).count() >= expected.len()).await;
    in_sink.extend(rest);
    assert_eq!(in_sink, expected, "nothing lost or misrouted across three reloads and three refusals");
    assert_eq!(broker::live_ready(&names.dead()).await, 0, "nothing dead-lettered");
    let metrics = daemon.get("/metrics").1;
    assert!(metrics.contains("silpgate_config_reloads_total{result=\"applied\"} 2"), "{metrics}");
    assert!(metrics.contains("silpgate_config_reloads_total{result=\"refused\"} 3"), "{metrics}");
    let digest = |text: &str| text.lines().find(|l| l.starts_with("silpgate_config_info")).map(str::to_owned);
    assert_eq!(digest(&metrics), digest(&digest_before), "the first file again, the first digest");
    // Under `warn`, neither the SIGHUP reload's line nor the three requests for a reload
    // (each logged before its reload is applied) were written; the three refusals (warnings)
    // were, and, back at `info`, the last reload's outcome.
    let log = daemon.log_text();
    assert_eq!(log.matches("Configuration reloaded.").count(), 1, "{log}");
    assert_eq!(log.matches("Configuration reload asked for.").count(), 0, "{log}");
    assert_eq!(log.matches("Configuration reload refused").count(), 3, "{log}");
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success());
    let _ = channel.queue_delete(sink2.as_str().into(), Default::default()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// The per-client limits reload (on a silpgate without a broker), with the A2A door's task
/// bounds beside them: a client past
/// `http.client_rate` is refused (429, `rate_limited`) until a reload lifts the rate, and is
/// served from the next request on; a `http.max_conversations_per_client` the reload lowers
/// refuses the next new conversation (`too_many_conversations`) and serves the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_sets_the_per_client_limits_from_the_next_request_on() {
    let names = Names::new("reload-limits");
    let dir = broker::temp_dir("reload-limits");
    std::fs::create_dir_all(&dir).unwrap();
    let store = dir.join("store");
    let limits = |rate: &str, conversations: usize| {
        support::gateway::config(&names, &store, false, 30_000, "").replace(
            "client_rate = 0.0\n",
            &format!(
                "client_rate = {rate}\nclient_burst = 1.0\nmax_conversations_per_client = {conversations}\n"
            ),
        )
    };
    let daemon = support::gateway::start(&limits("0.001", 0), &dir, false).await;
    let send = |conversation: &str| {
        let body = serde_json::json!({"format": "text", "subformat": "english", "content": "hello",
            "submessages": [{"format": "token", "subformat": "conversation", "content": conversation}]});
        let http = daemon.http.clone();
        async move {
            let (status, answer) = support::gateway::post(&http, "/nlip", body.to_string().as_bytes()).await;
            let code = answer["submessages"][0]["content"]["code"].as_str().unwrap_or_default().to_owned();
            (status, code)
        }
    };
    assert_ne!(send("c1").await.0, 429, "the burst's one request");
    assert_eq!(send("c1").await, (429, "rate_limited".to_owned()), "past the rate");

    // The A2A door's task bounds change in the same file: applied too, not refused.
    std::fs::write(dir.join("silpgate.toml"), limits("0.0", 1) + "[a2a]\nmax_tasks_per_client = 5\n")
        .unwrap();
    let pid = daemon.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let applied = "silpgate_config_reloads_total{result=\"applied\"} 1";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !daemon.get("/metrics").1.contains(applied) {
        assert!(std::time::Instant::now() < deadline, "the reload was not applied:\n{}", daemon.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3 {
        assert_ne!(send("c1").await.0, 429, "no rate limit after the reload");
    }
    assert_eq!(send("c2").await, (429, "too_many_conversations".to_owned()), "one conversation at most");
}
