//! Whether the broker can commit writes to quorum queues right now.
//!
//! A quorum queue that has lost the majority of its members keeps its declaration and its
//! consumers, and answers a (passive) declare as usual: it only stops confirming publishes and
//! settling acknowledgements. Nothing on the AMQP wire says so, so silpgate asks the way it
//! would be hurt: once a second it publishes one small message to a quorum queue of its own
//! (holding at most one message) and waits for the confirm. A confirm that does not come
//! within [`PROBE_TIMEOUT`] puts the connection's [`BrokerHealth`] on hold (not ready, and no
//! message attempted, so none spends its attempts on a broker that cannot keep anything);
//! the confirm arriving later lifts it.
//!
//! The probe queue's members are placed like every other quorum queue silpgate declares, so
//! on a cluster where every queue spans every node (the default) its majority is theirs. With
//! `quorum_initial_group_size` below the cluster size the placement differs per queue, and a
//! queue that loses its majority alone shows as publish timeouts, retried like any other.

use super::health::BrokerHealth;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// How often the probe asks.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe not confirmed within this long means the majority is lost. Well above a healthy
/// quorum commit (milliseconds) and below a leader election after a node crash (seconds), so
/// that a crash that elects a new leader does not look like a lost majority.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(6);

/// The probe queue of the instance whose reply queue is `reply_queue`.
pub(crate) fn probe_queue(reply_queue: &str) -> String {
    format!("{reply_queue}.quorum-probe")
}

/// Declares the probe queue and probes until the connection goes.
///
/// `queues` names the quorum queues silpgate depends on, for the warning.
///
/// # Errors
/// The probe queue could not be declared, or its channel not opened.
pub(crate) async fn watch(
    connection: &Connection,
    probe_queue: String,
    group_size: Option<u32>,
    queues: Vec<String>,
    health: Arc<BrokerHealth>,
) -> lapin::Result<tokio::task::JoinHandle<()>> {
    let channel = connection.create_channel().await?;
    super::topology::Queue::quorum(&probe_queue, group_size)
        .with("x-max-length", super::topology::Argument::Int(1))
        .declare(&channel)
        .await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(tokio::spawn(async move {
        let named = name_queues(&queues);
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let properties = BasicProperties::default().with_delivery_mode(2);
            let Ok(confirm) = channel
                .basic_publish(
                    "".into(),
                    probe_queue.as_str().into(),
                    BasicPublishOptions::default(),
                    b"probe",
                    properties,
                )
                .await
            else {
                return; // The channel is gone with its connection, which the supervisor sees.
            };
            let mut confirm = std::pin::pin!(confirm);
            if tokio::time::timeout(PROBE_TIMEOUT, &mut confirm).await.is_ok() {
                continue;
            }
            let why = format!(
                "the broker has not confirmed a write to the quorum queue '{probe_queue}' within {} s: quorum queues have lost their majority ({named})",
                PROBE_TIMEOUT.as_secs()
            );
            warn!(queues = %named, "Holding: the broker cannot commit writes to quorum queues (their majority is lost). Nothing is acknowledged or attempted until it can.");
            health.hold(why);
            let held = std::time::Instant::now();
            if confirm.await.is_err() {
                return;
            }
            health.resume();
            info!(
                held_ms = held.elapsed().as_millis() as u64,
                "Resuming: the broker commits quorum-queue writes again."
            );
        }
    }))
}

/// The queues, for a log line: every name up to ten, then how many more.
fn name_queues(queues: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut named = queues.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if queues.len() > SHOWN {
        named.push_str(&format!(" and {} more", queues.len() - SHOWN));
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_queue_list_is_cut_to_ten_names_and_a_count() {
        let queues: Vec<String> = (0..13).map(|i| format!("q{i}")).collect();
        let named = name_queues(&queues);
        assert!(named.starts_with("q0, q1") && named.ends_with("q9 and 3 more"), "{named}");
        assert_eq!(name_queues(&queues[..2]), "q0, q1");
    }
}
