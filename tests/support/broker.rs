//! Test support for the AMQP side: a real RabbitMQ on 127.0.0.1:5672 (the tests fail, loudly,
//! when it is not there), a virtual host for each test binary, randomly named topology per
//! test, silpgate run as a child process, and helpers that publish with confirms and read
//! queues back.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// This test binary's own virtual host on the local broker, made on first use, so that test
/// binaries run side by side: what one closes (`close_all_connections`), sets (policies) or
/// counts (`list_queues`) is its own. Named after the binary: `silpgate-test-amqp`; the
/// three-node tests keep to `/`.
pub fn vhost() -> &'static str {
    static VHOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VHOST.get_or_init(|| {
        let binary = std::env::current_exe().expect("the test binary has a path");
        let stem = binary.file_stem().and_then(|s| s.to_str()).unwrap_or("tests");
        // Cargo names a test binary `<target>-<hash>`.
        let target = stem.rsplit_once('-').map_or(stem, |(target, _)| target);
        // The three-node tests run alone (tests/run.sh) and restart the broker's nodes under
        // load: they keep to the default virtual host, which every node starts first, as
        // they did before virtual hosts were given out (with one of their own, three of their
        // four tests found silpgate not ready after the first had restarted the nodes).
        if target == "broker_cluster" {
            return "/".to_owned();
        }
        let vhost = format!("silpgate-test-{target}");
        let made = Command::new("timeout")
            .args([RABBITMQCTL_LIMIT, "rabbitmqctl", "add_vhost", &vhost])
            .output()
            .expect("rabbitmqctl runs");
        let said = String::from_utf8_lossy(&made.stderr);
        assert!(
            made.status.success() || said.contains("already exists"),
            "RabbitMQ is required at 127.0.0.1:5672; start it with `rabbitmq-server -detached`. \
             `rabbitmqctl add_vhost {vhost}` said: {said}"
        );
        run_rabbitmqctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]);
        vhost
    })
}

/// The URL of the local broker, in this binary's virtual host, as guest.
pub fn url() -> &'static str {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| format!("amqp://guest:guest@127.0.0.1:5672/{}", url_path(vhost())))
}

/// A virtual host as the path of an AMQP URL.
pub fn url_path(vhost: &str) -> String {
    vhost.replace('/', "%2f")
}

/// Connects to the broker, or fails the test saying how to start one.
pub async fn connect() -> Connection {
    Connection::connect(url(), ConnectionProperties::default()).await.unwrap_or_else(|e| {
        panic!("RabbitMQ is required at 127.0.0.1:5672 (guest/guest); start it with `rabbitmq-server -detached`: {e}")
    })
}

/// A confirm-mode channel on a fresh connection.
pub async fn channel() -> (Connection, Channel) {
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    (connection, channel)
}

/// The names of one test's topology, unique per run.
#[derive(Debug, Clone)]
pub struct Names {
    pub prefix: String,
    /// Shared by every clone: the last one dropped deletes the test's queues and exchanges.
    _clean_up: std::sync::Arc<CleanUp>,
}

impl Names {
    pub fn new(test: &str) -> Names {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let prefix = format!("sgtest.{test}.{}.{nanos:x}", std::process::id());
        Names { _clean_up: std::sync::Arc::new(CleanUp(prefix.clone())), prefix }
    }
    pub fn inbound(&self) -> String {
        format!("{}.in", self.prefix)
    }
    pub fn inbound_exchange(&self) -> String {
        format!("{}.in-x", self.prefix)
    }
    pub fn agents_exchange(&self) -> String {
        format!("{}.agents", self.prefix)
    }
    pub fn dlx(&self) -> String {
        format!("{}.dlx", self.prefix)
    }
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }
    pub fn sink(&self) -> String {
        format!("{}.sink", self.prefix)
    }
    pub fn replies(&self) -> String {
        format!("{}.replies", self.prefix)
    }
    pub fn cbor_replies(&self) -> String {
        format!("{}.cbor-replies", self.prefix)
    }
    /// The queue agents answer silpgate on (with `.<instance>` in a cluster).
    pub fn answers(&self) -> String {
        format!("{}.answers", self.prefix)
    }

    pub fn partition_exchange(&self) -> String {
        format!("{}.parts", self.prefix)
    }
    pub fn partition(&self, index: u16) -> String {
        format!("{}.p.{index:02}", self.prefix)
    }
    pub fn changelog(&self, index: u16) -> String {
        format!("{}.log.{index:02}", self.prefix)
    }
    /// The cluster members' heartbeat exchange.
    pub fn members_exchange(&self) -> String {
        format!("{}.p.members", self.prefix)
    }
    pub fn lock_stream(&self) -> String {
        format!("{}.lock", self.prefix)
    }

    /// The `[cluster]` section for this topology: `partitions` partitions, instance `name`.
    pub fn cluster_section(&self, partitions: u16, name: &str, snapshot_every: u64) -> String {
        format!(
            "\n[cluster]\npartitions = {partitions}\nexchange = \"{}\"\nqueue_prefix = \"{}.p\"\nchangelog_prefix = \"{}.log\"\nlock_stream = \"{}\"\nsnapshot_every = {snapshot_every}\ninstance = \"{name}\"\n",
            self.partition_exchange(),
            self.prefix,
            self.prefix,
            self.lock_stream(),
        )
    }

    /// Deletes every queue and exchange of the test (`partitions`: of a cluster test). Dropping
    /// the names does it too, whatever the test's outcome.
    pub async fn clean_up(&self, channel: &Channel, partitions: u16) {
        let mut queues = vec![
            self.inbound(),
            self.dead(),
            self.sink(),
            self.replies(),
            self.cbor_replies(),
            self.answers(),
        ];
        queues.extend((0..partitions).flat_map(|i| [self.partition(i), self.changelog(i)]));
        if partitions > 0 {
            queues.push(self.lock_stream());
            // Each cluster instance has a reply queue of its own; the tests name them a to d.
            queues.extend(["a", "b", "c", "d"].map(|instance| format!("{}.{instance}", self.answers())));
        }
        let probes: Vec<String> = queues
            .iter()
            .filter(|q| q.starts_with(&self.answers()))
            .map(|q| format!("{q}.quorum-probe"))
            .collect();
        queues.extend(probes);
        for q in queues {
            let _ = channel.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
        }
        let mut exchanges =
            vec![self.inbound_exchange(), self.agents_exchange(), self.dlx(), self.partition_exchange()];
        if partitions > 0 {
            exchanges.push(self.members_exchange());
        }
        for x in exchanges {
            let _ = channel.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()).await;
        }
    }

    /// A silpgate configuration for this topology: a transcoding route to the agent `sink`
    /// (CBOR, silp-json), and `label = "decode"` payloads decoded back to the sender.
    /// `sink_queue`: whether silpgate declares the sink's queue itself.
    pub fn config(&self, store: &std::path::Path, amqp_extra: &str, sink_queue: bool) -> String {
        let queue = if sink_queue { format!("queue = \"{}\"\n", self.sink()) } else { String::new() };
        format!(
            r#"[gateway]
name = "silpgate-test"
[sessions]
heartbeat = 10
[store]
path = "{store}"
[http]
listen = "127.0.0.1:0"
plain = true
[amqp]
url = "{url}"
inbound = ["{inbound}"]
inbound_exchange = "{inbound_x}"
agents_exchange = "{agents}"
dead_letter_exchange = "{dlx}"
dead_letter_queue = "{dead}"
retry_initial_ms = 50
retry_max_ms = 400
reconnect_initial_ms = 100
reconnect_max_ms = 1000
reply_queue = "{answers}"
reply_prefixes = ["sgtest."]
{amqp_extra}
[[agents]]
name = "sink"
frontends = ["json"]
routing_key = "{sink}"
content_type = "application/cbor"
{queue}
[[routes]]
name = "decode-for-sender"
destination = "reply"
mode = "decode"
[routes.match]
label = "decode"

[[routes]]
name = "to-sink"
destination = "sink"
mode = "transcode"
"#,
            store = store.display(),
            url = url(),
            inbound = self.inbound(),
            inbound_x = self.inbound_exchange(),
            agents = self.agents_exchange(),
            dlx = self.dlx(),
            dead = self.dead(),
            sink = self.sink(),
            answers = self.answers(),
        )
    }
}

/// The prefix of a test's topology, deleted once no [`Names`] of it is left.
#[derive(Debug)]
struct CleanUp(String);

impl Drop for CleanUp {
    /// A failed test leaves nothing on the broker for the next run: its queues and exchanges
    /// (a cluster test's partitions too) are deleted here, on a connection of its own, since
    /// the test's runtime may be the one being dropped.
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        // Names without a clean-up of their own (an empty prefix): dropping them does nothing.
        let names = Names {
            prefix: std::mem::take(&mut self.0),
            _clean_up: std::sync::Arc::new(CleanUp(String::new())),
        };
        let names = &names;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                runtime.block_on(async {
                    let connect = Connection::connect(url(), ConnectionProperties::default());
                    let Ok(Ok(connection)) = tokio::time::timeout(Duration::from_secs(5), connect).await
                    else {
                        return;
                    };
                    if let Ok(channel) = connection.create_channel().await {
                        names.clean_up(&channel, crate::support::cluster::PARTITIONS).await;
                    }
                    let _ = connection.close(200, "cleaned up".into()).await;
                });
            });
        });
    }
}

/// A SILP envelope of conversation `conv`; `label` picks the route.
pub fn envelope(i: usize, conv: usize, label: Option<&str>) -> Vec<u8> {
    let label = label.map(|l| format!(r#","label":"{l}""#)).unwrap_or_default();
    format!(
        r#"{{"format":"structured","subformat":"silp-code","content":"cancel(order{i})"{label},"submessages":[{{"format":"token","subformat":"conversation","content":"conv-{conv}"}}]}}"#
    )
    .into_bytes()
}

/// Publishes with confirms and waits for all of them.
pub async fn publish_all(
    channel: &Channel,
    exchange: &str,
    messages: Vec<(String, Vec<u8>, BasicProperties)>,
) {
    let mut confirms = Vec::with_capacity(messages.len());
    for (routing_key, body, properties) in messages {
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        confirms.push(
            channel
                .basic_publish(exchange.into(), routing_key.as_str().into(), options, &body, properties)
                .await
                .unwrap(),
        );
    }
    for c in confirms {
        assert_eq!(c.await.unwrap(), lapin::Confirmation::Ack(None), "the test's own publish is confirmed");
    }
}

/// A message read back from a queue.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub content_type: Option<String>,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// Reads messages from `queue` (acknowledging them) until `done` says so or `timeout` passes.
pub async fn collect(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
    mut done: impl FnMut(&[Received]) -> bool,
) -> Vec<Received> {
    use futures_util::StreamExt;
    let mut consumer = channel
        .basic_consume(queue.into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("consume {queue}: {e}"));
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while !done(&got) {
        let next = tokio::time::timeout_at(deadline, consumer.next()).await;
        let Ok(Some(Ok(d))) = next else { break };
        let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
        let headers = d
            .properties
            .headers()
            .as_ref()
            .map(|h| {
                h.inner()
                    .iter()
                    .filter_map(|(k, v)| match v {
                        lapin::types::AMQPValue::LongString(s) => {
                            Some((k.as_str().to_owned(), String::from_utf8_lossy(s.as_bytes()).into_owned()))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        got.push(Received {
            message_id: text(d.properties.message_id()).unwrap_or_default(),
            correlation_id: text(d.properties.correlation_id()),
            reply_to: text(d.properties.reply_to()),
            content_type: text(d.properties.content_type()),
            headers,
            body: d.data.clone(),
        });
        d.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    got
}

/// Everything that reaches `queue` up to and including the first message `is_end` picks: a
/// positive end instead of a quiet window, so that what comes before it, an extra message
/// included, is all seen. Fails the test when the end does not come within `timeout`.
pub async fn collect_until_end(
    channel: &Channel,
    queue: &str,
    timeout: Duration,
    is_end: impl Fn(&Received) -> bool,
) -> Vec<Received> {
    let got = collect(channel, queue, timeout, |got| got.last().is_some_and(&is_end)).await;
    assert!(
        got.last().is_some_and(&is_end),
        "the end marker did not reach {queue} within {timeout:?}; before it: {:?}",
        got.iter().map(|r| &r.message_id).collect::<Vec<_>>()
    );
    got
}

/// `rabbitmqctl` with arguments, in this binary's virtual host (`-p`, which every command
/// takes and only those about a virtual host use); its standard output.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let mut scoped = vec!["-p", vhost()];
    scoped.extend(args);
    run_rabbitmqctl(&scoped)
}

/// Seconds a `rabbitmqctl` call may take before `timeout` stops it and the test fails with its
/// exit status (124).
const RABBITMQCTL_LIMIT: &str = "60";

fn run_rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args([RABBITMQCTL_LIMIT, "rabbitmqctl"])
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The messages ready in `queue` now, as the queue itself answers a passive declare (the
/// counts `rabbitmqctl` lists lag by seconds). On a connection of its own, closed before it
/// returns: a test may close every connection right after.
pub async fn live_ready(queue: &str) -> u64 {
    let (connection, channel) = channel().await;
    let options = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    let declared = channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("{queue} exists: {e}"));
    let _ = connection.close(200, "counted".into()).await;
    u64::from(declared.message_count())
}

/// (ready, unacknowledged) messages of a queue, as the broker counts them.
pub fn queue_counts(queue: &str) -> (u64, u64) {
    let out = rabbitmqctl(&[
        "list_queues",
        "--quiet",
        "--no-table-headers",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    ]);
    for line in out.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&queue) && fields.len() == 3 {
            return (fields[1].parse().unwrap(), fields[2].parse().unwrap());
        }
    }
    panic!("queue {queue} not listed by rabbitmqctl:\n{out}")
}

/// Waits until the broker reports `counts` (ready, unacknowledged) for `queue`; its statistics
/// lag by a few seconds.
pub async fn wait_counts(queue: &str, counts: (u64, u64), message: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = queue_counts(queue);
        if now == counts {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{message}: {queue} has {now:?} (ready, unacknowledged), not {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A scratch directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// silpgate as a child process.
pub struct Daemon {
    pub child: Child,
    pub http: String,
    /// Everything it wrote to stderr so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `silpgate run` with the configuration text; waits until it listens.
    pub fn start(config_text: &str, dir: &std::path::Path) -> Daemon {
        let path = dir.join("silpgate.toml");
        std::fs::write(&path, config_text).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
        command.args(["run", "--config"]).arg(&path);
        Daemon::spawn(command)
    }

    /// Runs `command` (a `silpgate run`); waits until it listens. Its log (at `info` unless
    /// `SILPGATE_TEST_LOG` says otherwise) is shown only when the test fails: takeovers and
    /// hand-overs are logged at `info`, and a rare failure is worth nothing without them.
    pub fn spawn(mut command: Command) -> Daemon {
        command.env("SILPGATE_LOG", std::env::var("SILPGATE_TEST_LOG").unwrap_or_else(|_| "info".into()));
        Daemon::run(command)
    }

    /// [`Daemon::spawn`], logging as its configuration's `telemetry.log_filter` says.
    pub fn spawn_as_configured(mut command: Command) -> Daemon {
        command.env_remove("SILPGATE_LOG");
        Daemon::run(command)
    }

    fn run(mut command: Command) -> Daemon {
        let mut child =
            command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("silpgate starts");
        let stderr = child.stderr.take().unwrap();
        // The daemon's own pid: a test that runs several tells their lines apart by it.
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines_seen = log.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr).lines();
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                if !sent && let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                    sent = true;
                }
                eprintln!("[silpgate {pid}] {line}");
                lines_seen.lock().unwrap().push(line);
            }
        });
        let http = rx.recv_timeout(Duration::from_secs(30)).expect("silpgate reports its address");
        Daemon { child, http, log }
    }

    /// Waits until `/readyz` says ready (the broker is connected and consumed from).
    pub fn wait_ready(&self, timeout: Duration) {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if self.readyz() == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("silpgate not ready within {timeout:?}");
    }

    /// The status `/readyz` answers.
    pub fn readyz(&self) -> u16 {
        self.get("/readyz").0
    }

    /// GETs `path` from the daemon's listener: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(&self.http) else { return (0, String::new()) };
        // A daemon that accepts but never answers fails the caller's wait, not the test run.
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
        let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut response = String::new();
        let _ = s.read_to_string(&mut response);
        let status = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    }

    /// Waits for the daemon to exit on its own, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < timeout, "silpgate still runs after {timeout:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until at least `times` lines of its log contain `text`.
    pub fn wait_logged(&self, text: &str, times: usize, timeout: Duration) {
        let started = Instant::now();
        let seen = || self.log.lock().unwrap().iter().filter(|line| line.contains(text)).count();
        while seen() < times {
            assert!(
                started.elapsed() < timeout,
                "silpgate logged '{text}' fewer than {times} times in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its stderr so far, one string.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM and returns: the daemon begins to leave.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    }

    /// Sends SIGTERM and waits for the exit, up to `timeout`; the exit status and how long it took.
    pub fn terminate(mut self, timeout: Duration) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        self.sigterm();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, started.elapsed());
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("silpgate did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Session turns per conversation token, read from a stopped daemon's store with the CLI.
pub fn session_turns(store: &std::path::Path) -> HashMap<String, u64> {
    sessions(store).into_iter().map(|(token, (_, turns))| (token, turns)).collect()
}

/// Session id and turns per conversation token, read from a stopped daemon's store with the CLI.
pub fn sessions(store: &std::path::Path) -> HashMap<String, (String, u64)> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["sessions", "list", "--store"]).arg(store);
    let out = super::process::run_bounded(command, std::time::Duration::from_secs(60));
    assert!(out.status.success(), "sessions list: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = v["id"].as_str().unwrap().to_owned();
            (v["token"].as_str().unwrap().to_owned(), (id, v["turns"].as_u64().unwrap()))
        })
        .collect()
}
