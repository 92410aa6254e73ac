//! A three-node RabbitMQ cluster on this machine for the multi-node tests: the local broker
//! (rabbit@localhost, 5672) and two extra nodes on 5673 and 5674, run by
//! `tests/broker-cluster.sh`. A [`BrokerCluster`] starts and joins them when they are not up,
//! and brings every node back when dropped, also when a test panics; tests/run.sh brings the
//! cluster up once before these tests and down once after them. Also a producer that, like a careful client of a
//! cluster, moves to another node when its own goes and publishes again what was not
//! confirmed.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The nodes' AMQP addresses, by node number (1 is the local broker).
pub fn url(node: u8) -> String {
    format!(
        "amqp://guest:guest@127.0.0.1:{}/{}",
        5671 + u16::from(node),
        super::broker::url_path(super::broker::vhost())
    )
}

/// The node number that listens on `port`.
pub fn node_of_port(port: u16) -> u8 {
    u8::try_from(port - 5671).expect("a node's port")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/broker-cluster.sh")
}

/// Runs `tests/broker-cluster.sh` with `args`, failing loudly with its output.
pub fn run(args: &[&str]) -> String {
    let out = super::process::run_bounded(
        {
            let mut command = Command::new("bash");
            command.arg(script()).args(args);
            command
        },
        Duration::from_secs(180),
    );
    assert!(
        out.status.success(),
        "tests/broker-cluster.sh {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The running three-node cluster; dropping it brings back whatever node a test left stopped
/// or killed, so that the next test starts on three running nodes.
pub struct BrokerCluster;

impl BrokerCluster {
    /// Starts the extra nodes and joins them, unless they already run joined (`up` is
    /// idempotent): one cluster serves every test of a run.
    pub fn up() -> BrokerCluster {
        run(&["up"]);
        BrokerCluster
    }

    /// The extra nodes stopped, forgotten, started and joined again: a cluster no earlier test
    /// has reshaped (queue leaders, stream coordinator members).
    pub fn fresh() -> BrokerCluster {
        run(&["down"]);
        run(&["up"]);
        BrokerCluster
    }

    /// SIGKILLs extra node `n` (2 or 3): a node crash.
    pub fn kill(&self, n: u8) {
        run(&["kill", &n.to_string()]);
    }

    /// Stops node `n` gracefully. Node 1 (the machine's own broker) only stops its
    /// application: its Erlang VM stays, as in a rolling upgrade's first step.
    pub fn stop(&self, n: u8) {
        if n == 1 {
            super::broker::rabbitmqctl(&["stop_app"]);
        } else {
            run(&["stop", &n.to_string()]);
        }
    }

    /// Restarts RabbitMQ on node `n` (its application; the Erlang VM stays): every connection
    /// to it drops and its queue replicas go down and come back, as in a rolling upgrade.
    pub fn restart(&self, n: u8) {
        let node = node_name(n);
        super::broker::rabbitmqctl(&["-n", &node, "stop_app"]);
        super::broker::rabbitmqctl(&["-n", &node, "start_app"]);
        super::broker::rabbitmqctl(&["-n", &node, "await_startup"]);
    }

    /// Starts node `n` again; it rejoins the cluster.
    pub fn start(&self, n: u8) {
        if n == 1 {
            super::broker::rabbitmqctl(&["start_app"]);
            super::broker::rabbitmqctl(&["await_startup"]);
        } else {
            run(&["start", &n.to_string()]);
        }
    }
}

/// The node (1 to 3) that leads quorum queue `queue` (on the default virtual host).
pub fn leader_of(queue: &str) -> u8 {
    let out = super::broker::rabbitmqctl(&["list_queues", "--quiet", "--no-table-headers", "name", "leader"]);
    let leader = out
        .lines()
        .find_map(|line| line.strip_prefix(queue)?.strip_prefix('\t'))
        .unwrap_or_else(|| panic!("the broker lists queue {queue}"));
    node_number(leader.trim())
}

/// Moves the leadership of quorum queue `queue` to node `to`, and waits until the broker lists
/// it there.
pub fn move_leader(queue: &str, to: u8) {
    let target = node_name(to);
    let transfer = format!(
        "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, <<\"{queue}\">>)), \
         {{Name, _}} = Leader = amqqueue:get_pid(Q), ra:transfer_leadership(Leader, {{Name, '{target}'}})."
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader_of(queue) != to {
        assert!(Instant::now() < deadline, "the leadership of {queue} did not move to {target}");
        super::broker::rabbitmqctl(&["eval", &transfer]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn node_name(n: u8) -> String {
    if n == 1 { "rabbit@localhost".to_owned() } else { format!("rabbit{n}@localhost") }
}

fn node_number(name: &str) -> u8 {
    match name {
        "rabbit@localhost" => 1,
        _ => name
            .strip_prefix("rabbit")
            .and_then(|rest| rest.strip_suffix("@localhost"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} is no node of this cluster")),
    }
}

impl Drop for BrokerCluster {
    fn drop(&mut self) {
        // Node 1 may have been stopped by a failing test: bring it back, then the extra nodes.
        // A drop must not panic (it may run while unwinding), so `timeout` bounds both commands.
        let _ = Command::new("timeout").args(["90", "rabbitmqctl", "-q", "start_app"]).output();
        let status = Command::new("timeout").arg("300").arg("bash").arg(script()).arg("up").status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("tests/broker-cluster.sh up failed: the next multi-node test may find a node down");
        }
    }
}

/// Connects to the first node of `nodes` that answers, within `deadline`.
pub async fn connect_any(nodes: &[u8], deadline: Instant) -> (Connection, Channel) {
    loop {
        for &node in nodes {
            let Ok(Ok(connection)) = tokio::time::timeout(
                Duration::from_secs(3),
                Connection::connect(&url(node), ConnectionProperties::default()),
            )
            .await
            else {
                continue;
            };
            // A node that is still starting may take the connection and never answer on it.
            let step = Duration::from_secs(3);
            let Ok(Ok(channel)) = tokio::time::timeout(step, connection.create_channel()).await else {
                continue;
            };
            let selected =
                tokio::time::timeout(step, channel.confirm_select(ConfirmSelectOptions::default())).await;
            if matches!(selected, Ok(Ok(()))) {
                return (connection, channel);
            }
        }
        assert!(Instant::now() < deadline, "no broker node of {nodes:?} accepts a connection");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Publishes `messages` in order at about `per_second`, in windows of confirmed publishes.
/// A window that fails (its node went, or a confirm never came) is published again on a
/// connection to another node: the broker may then hold a message twice, which silpgate's
/// ledger drops. `confirmed` counts the messages confirmed so far, for the test to act on.
pub async fn publish_paced(
    nodes: Vec<u8>,
    exchange: String,
    messages: Vec<(String, Vec<u8>, BasicProperties)>,
    per_second: u32,
    confirmed: Arc<AtomicUsize>,
) {
    const WINDOW: usize = 20;
    let deadline = Instant::now() + Duration::from_secs(240);
    let (mut connection, mut channel) = connect_any(&nodes, deadline).await;
    let started = Instant::now();
    let mut next = 0;
    while next < messages.len() {
        let end = (next + WINDOW).min(messages.len());
        let mut window_ok = true;
        let mut confirms = Vec::with_capacity(WINDOW);
        for (routing_key, body, properties) in &messages[next..end] {
            let options = BasicPublishOptions { mandatory: true, immediate: false };
            let publish = channel.basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                options,
                body,
                properties.clone(),
            );
            match tokio::time::timeout(Duration::from_secs(5), publish).await {
                Ok(Ok(confirm)) => confirms.push(confirm),
                _ => {
                    window_ok = false;
                    break;
                }
            }
        }
        if window_ok {
            for confirm in confirms {
                // Long enough for a majority to come back; a dead node fails it at once.
                match tokio::time::timeout(Duration::from_secs(90), confirm).await {
                    Ok(Ok(lapin::Confirmation::Ack(None))) => {}
                    _ => {
                        window_ok = false;
                        break;
                    }
                }
            }
        }
        if !window_ok {
            assert!(Instant::now() < deadline, "publishing did not finish within 240 s");
            let _ =
                tokio::time::timeout(Duration::from_secs(3), connection.close(200, "moving".into())).await;
            (connection, channel) = connect_any(&nodes, deadline).await;
            continue;
        }
        next = end;
        confirmed.store(next, Ordering::SeqCst);
        let due = started + Duration::from_secs_f64(next as f64 / f64::from(per_second));
        tokio::time::sleep_until(due.into()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), connection.close(200, "published".into())).await;
}

/// Waits until `counter` reaches `at_least`, failing after `timeout`.
pub async fn wait_count(counter: &AtomicUsize, at_least: usize, timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    while counter.load(Ordering::SeqCst) < at_least {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {at_least} within {timeout:?}",
            counter.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
