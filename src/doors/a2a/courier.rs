//! The courier: carries the A2A door's push notifications from the kept tasks' records to
//! the broker, and from the broker to their webhooks.
//!
//! - **To the broker.** A notification the task book wrote ([`super::tasks`]) is published,
//!   persistent and confirmed, to `a2a.push_queue`, a quorum queue dead-lettering to
//!   `amqp.dead_letter_exchange`; once confirmed it leaves the task's record. Until then the
//!   record holds it, so that neither a broker away for an hour nor a restart loses it.
//! - **To the webhook.** The queue has a single active consumer: in a cluster one instance
//!   delivers at a time, and the others take over when it goes. Deliveries are sorted into
//!   lanes, one per config of a task: a lane delivers in order, retrying its first
//!   notification with backoff (`a2a.push_retry_*`) while later ones wait, unacknowledged;
//!   other lanes go on meanwhile. A notification is acknowledged once its webhook took it
//!   (2xx). It is dead-lettered when the webhook refuses it for good (a 4xx other than 408 and
//!   429, or a redirect, which is never followed), when its URL is no longer at an allowed
//!   origin, or when it is still not taken `a2a.push_give_up_secs` after its change.
//!
//! The courier keeps a broker connection of its own, so that webhooks that are slow or down
//! never hold up the AMQP door, and the AMQP door's reconnects never stall a webhook.

use super::push::Notification;
use super::tasks::TaskBook;
use crate::broker::addresses::Addresses;
use crate::broker::publish::{Publication, Publisher};
use crate::broker::supervise::{Client, Ended, Reached, supervise};
use crate::broker::topology::Topology;
use crate::config::{A2aConfig, AmqpConfig};
use crate::util::backoff::Backoff;
use crate::util::shutdown::Shutdown;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Notifications a lane may hold unacknowledged, all lanes together: the broker sends no
/// more until some are taken. Lanes whose webhook is down hold theirs; at the bound, new
/// lanes wait too.
const PREFETCH: u16 = 1000;

/// Notifications published at once, confirmed together.
const BATCH: usize = 64;

/// Why one connection's work ended: it is always lost (the courier stops only on shutdown).
type Lost = String;

/// The courier, ready to run.
pub(crate) struct Courier {
    outgoing: Outgoing,
    delivery: Arc<Webhooks>,
    amqp: AmqpConfig,
}

/// Notifications on their way to the broker.
struct Outgoing {
    book: Arc<TaskBook>,
    written: mpsc::UnboundedReceiver<Notification>,
    /// Taken from `written`, not yet confirmed by the broker.
    unconfirmed: Vec<Notification>,
    queue: String,
    confirm_timeout: Duration,
}

/// What reaching webhooks needs.
struct Webhooks {
    client: reqwest::Client,
    config: A2aConfig,
    /// Says where webhooks may be now (a reload may change it).
    book: Arc<TaskBook>,
    /// The last notification each lane delivered. A crash between the broker's confirm and
    /// the record's trim puts a notification on the queue twice; the copy comes after the
    /// original, and is acknowledged without a second POST.
    delivered: std::sync::Mutex<HashMap<String, u64>>,
}

/// Lanes remembered in `Webhooks::delivered`; past this many the memory starts over, and a
/// copy may then reach its webhook twice (each carries its id, for the webhook to tell).
const REMEMBERED_LANES: usize = 100_000;

/// What a webhook made of one attempt.
enum Attempt {
    Taken,
    /// Worth another attempt later.
    Failed(String),
    /// Not worth another attempt.
    Refused(String),
}

impl Courier {
    /// A courier for `book`'s notifications, which `book` hands to `written`.
    pub(crate) fn new(
        amqp: AmqpConfig,
        config: A2aConfig,
        book: Arc<TaskBook>,
        written: mpsc::UnboundedReceiver<Notification>,
    ) -> Result<Courier, String> {
        // A webhook that redirects would take the notification, and its token, elsewhere: none
        // is followed.
        let connect = Duration::from_millis(config.push_timeout_ms.clamp(1, 5_000));
        let ca = config.push_ca_file.as_deref().map(|file| ("a2a.push_ca_file", file));
        let client = crate::connectors::http::outbound(connect, ca)?
            .timeout(Duration::from_millis(config.push_timeout_ms.max(1)))
            .build()
            .map_err(|e| format!("the webhooks' HTTP client: {e}"))?;
        let outgoing = Outgoing {
            book: book.clone(),
            written,
            unconfirmed: Vec::new(),
            queue: config.push_queue.clone(),
            confirm_timeout: Duration::from_millis(amqp.confirm_timeout_ms),
        };
        let delivery = Arc::new(Webhooks { client, config, book, delivered: std::sync::Mutex::default() });
        Ok(Courier { outgoing, delivery, amqp })
    }

    /// Runs until `shutdown`, reconnecting to the broker whenever it goes away ([`supervise`]).
    /// What is unfinished then stays in the records (not yet published) or in the queue (not
    /// yet taken), for the next start.
    pub(crate) async fn run(mut self, shutdown: Shutdown) {
        let addresses = match Addresses::of(&self.amqp) {
            Ok(addresses) => addresses,
            Err(e) => return warn!(error = %e, "Push notifications cannot reach the broker."),
        };
        let backoff = Backoff::new(
            Duration::from_millis(self.amqp.reconnect_initial_ms),
            Duration::from_millis(self.amqp.reconnect_max_ms),
        );
        // The courier never ends fatally: its state is the queue and the task records.
        let _ = supervise("push notifications", &mut self, addresses, backoff, shutdown).await;
    }
}

impl Client for Courier {
    type Opened = (Channel, lapin::Consumer);

    /// Declares the queue and opens a confirm-mode channel and the queue's consumer.
    async fn open(&mut self, connection: &Connection) -> lapin::Result<(Channel, lapin::Consumer)> {
        let declare = connection.create_channel().await?;
        // As the topology (and definitions.json) describes them.
        Topology::push_courier(&self.outgoing.queue, &self.amqp).declare(&declare).await?;
        let _ = declare.close(200, "declared".into()).await;
        let publish = connection.create_channel().await?;
        publish.confirm_select(ConfirmSelectOptions::default()).await?;
        let consume = connection.create_channel().await?;
        consume.basic_qos(PREFETCH, BasicQosOptions { global: false }).await?;
        let tag = format!("silpgate-{}-a2a-push", std::process::id());
        let queue = self.outgoing.queue.as_str().into();
        let consumer = consume.basic_consume(
            queue,
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        Ok((publish, consumer.await?))
    }

    /// Publishes and delivers until the connection fails.
    async fn serve(
        &mut self,
        _connection: &Connection,
        (publish, consumer): (Channel, lapin::Consumer),
        _reached: &Reached,
        mut shutdown: Shutdown,
    ) -> Ended {
        info!(queue = %self.outgoing.queue, "Push notifications: connected to the broker.");
        let publisher = Publisher::new(publish, self.outgoing.confirm_timeout);
        tokio::select! {
            lost = self.outgoing.publish(&publisher) => Ended::Lost(lost),
            lost = deliver(self.delivery.clone(), consumer) => Ended::Lost(lost),
            () = shutdown.stopped() => Ended::Shutdown,
        }
    }
}

impl Outgoing {
    /// Publishes what the book writes, in its order, a batch at a time; each batch confirmed
    /// leaves the records. Returns when the channel fails, keeping the batch for the next
    /// connection.
    async fn publish(&mut self, publisher: &Publisher) -> Lost {
        loop {
            if self.unconfirmed.is_empty() {
                let Some(first) = self.written.recv().await else {
                    // The book is gone: the daemon is stopping.
                    return std::future::pending().await;
                };
                self.unconfirmed.push(first);
                while self.unconfirmed.len() < BATCH {
                    let Ok(next) = self.written.try_recv() else { break };
                    self.unconfirmed.push(next);
                }
            }
            let publications = self
                .unconfirmed
                .iter()
                .map(|notification| Publication {
                    exchange: "",
                    routing_key: &self.queue,
                    body: serde_json::to_vec(notification).expect("a notification is JSON"),
                    properties: BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_content_type("application/json".into())
                        .with_message_id(notification.id.as_str().into()),
                })
                .collect();
            if let Err(e) = publisher.publish_all(publications).await {
                return format!("publishing to {}: {e}", self.queue);
            }
            let mut by_task: HashMap<&str, Vec<String>> = HashMap::new();
            for notification in &self.unconfirmed {
                by_task.entry(&notification.task).or_default().push(notification.id.clone());
            }
            for (task, ids) in by_task {
                self.book.queued(task, &ids);
            }
            self.unconfirmed.clear();
        }
    }
}

/// One lane: its deliveries in order, and how many it holds.
struct Lane {
    deliveries: mpsc::UnboundedSender<(Notification, Delivery)>,
    holding: Arc<AtomicUsize>,
}

/// Sorts the queue's deliveries into lanes until the consumer ends. The lanes' tasks end
/// with it: what they held goes back to the queue with the channel.
async fn deliver(webhooks: Arc<Webhooks>, mut consumer: lapin::Consumer) -> Lost {
    let mut lanes: HashMap<String, Lane> = HashMap::new();
    let mut running = tokio::task::JoinSet::new();
    while let Some(delivery) = consumer.next().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(e) => return format!("consuming the push queue: {e}"),
        };
        let notification = match serde_json::from_slice::<Notification>(&delivery.data) {
            Ok(notification) => notification,
            Err(e) => {
                warn!(error = %e, "Push notifications: a message in the push queue is not a notification; dead-lettering it.");
                let _ = delivery
                    .acker
                    .nack(BasicNackOptions { requeue: false, ..BasicNackOptions::default() })
                    .await;
                continue;
            }
        };
        while running.try_join_next().is_some() {}
        // A lane holding nothing has ended its work: its task ends once its sender goes.
        lanes.retain(|_, lane| lane.holding.load(Ordering::Acquire) > 0);
        let lane = lanes.entry(notification.lane.clone()).or_insert_with(|| {
            let (deliveries, mut taken) = mpsc::unbounded_channel::<(Notification, Delivery)>();
            let holding = Arc::new(AtomicUsize::new(0));
            let (webhooks, held) = (webhooks.clone(), holding.clone());
            running.spawn(async move {
                while let Some((notification, delivery)) = taken.recv().await {
                    webhooks.hand_over(&notification, delivery).await;
                    held.fetch_sub(1, Ordering::AcqRel);
                }
            });
            Lane { deliveries, holding }
        });
        lane.holding.fetch_add(1, Ordering::AcqRel);
        let _ = lane.deliveries.send((notification, delivery));
    }
    "the push queue's consumer was cancelled".into()
}

impl Webhooks {
    /// Delivers one notification, retrying until its webhook takes it or it is given up, and
    /// settles it with the broker.
    async fn hand_over(&self, notification: &Notification, delivery: Delivery) {
        let mut backoff = Backoff::new(
            Duration::from_millis(self.config.push_retry_initial_ms),
            Duration::from_millis(self.config.push_retry_max_ms),
        );
        if self.already_delivered(notification) {
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            return;
        }
        let give_up_ms = self.config.push_give_up_secs.saturating_mul(1000);
        let target = shown(&notification.url);
        let mut attempts = 0u32;
        let refused = loop {
            attempts += 1;
            match self.attempt(notification).await {
                Attempt::Taken => {
                    if attempts > 1 {
                        info!(task = %notification.task, webhook = %target, attempts, "Push notifications: the webhook took a notification at last.");
                    }
                    self.remember(notification);
                    let _ = delivery.acker.ack(BasicAckOptions::default()).await;
                    return;
                }
                Attempt::Refused(why) => break why,
                Attempt::Failed(why) => {
                    let age = crate::util::time::now_millis().saturating_sub(notification.created);
                    if age > give_up_ms {
                        break format!(
                            "not taken within a2a.push_give_up_secs ({}s): {why}",
                            self.config.push_give_up_secs
                        );
                    }
                    let delay = backoff.next_delay();
                    warn!(task = %notification.task, webhook = %target, attempts, error = %why,
                        retry_in_ms = delay.as_millis() as u64, "Push notifications: the webhook did not take a notification; retrying.");
                    tokio::time::sleep(delay).await;
                }
            }
        };
        warn!(task = %notification.task, webhook = %target, notification = %notification.id, error = %refused,
            "Push notifications: giving a notification up; dead-lettering it.");
        let _ = delivery.acker.nack(BasicNackOptions { requeue: false, ..BasicNackOptions::default() }).await;
    }

    fn already_delivered(&self, notification: &Notification) -> bool {
        let delivered = self.delivered.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        delivered.get(&notification.lane).is_some_and(|last| notification.seq <= *last)
    }

    fn remember(&self, notification: &Notification) {
        let mut delivered = self.delivered.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if delivered.len() >= REMEMBERED_LANES && !delivered.contains_key(&notification.lane) {
            delivered.clear();
        }
        delivered.insert(notification.lane.clone(), notification.seq);
    }

    /// One POST of `notification` to its webhook, carrying its id
    /// (`Silpgate-Notification-Id`) for a webhook that wants to tell a copy.
    async fn attempt(&self, notification: &Notification) -> Attempt {
        let allowed = reqwest::Url::parse(&notification.url).is_ok_and(|url| self.book.allows_webhook(&url));
        if !allowed {
            return Attempt::Refused("its URL is no longer at one of a2a.push_origins".into());
        }
        let mut request = self
            .client
            .post(&notification.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Silpgate-Notification-Id", &notification.id)
            .body(notification.payload.to_string());
        if let Some(token) = &notification.token {
            request = request.header("X-A2A-Notification-Token", token);
        }
        if let Some(authorization) = &notification.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization);
        }
        // The answer's body is never read: a webhook has nothing to say but its status.
        match request.send().await {
            Ok(response) => {
                let status = response.status();
                if status.is_success() {
                    Attempt::Taken
                } else if status.is_redirection() {
                    Attempt::Refused(format!("HTTP {status}: silpgate follows no redirects"))
                } else if matches!(status.as_u16(), 408 | 425 | 429) || status.is_server_error() {
                    Attempt::Failed(format!("HTTP {status}"))
                } else {
                    Attempt::Refused(format!("HTTP {status}"))
                }
            }
            Err(e) => Attempt::Failed(crate::connectors::http::described(e)),
        }
    }
}

/// A webhook's URL as logs show it: its origin alone. The path and query are the client's
/// to choose (and may carry a secret); every retry logs this, so it stays short.
fn shown(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(|_| "(not a URL)".into(), |url| url.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private CA for webhooks: a file that cannot be read, or is no PEM, stops the start
    /// naming the setting and the file; a good one is taken.
    #[test]
    fn push_ca_file_is_read_at_start_and_a_bad_one_is_named() {
        let courier = |ca_file: &std::path::Path| {
            let config = A2aConfig { push_ca_file: Some(ca_file.to_owned()), ..A2aConfig::default() };
            let book = Arc::new(TaskBook::load(None, &config, None).unwrap());
            Courier::new(AmqpConfig::default(), config, book, mpsc::unbounded_channel().1).map(|_| ())
        };
        let dir = std::env::temp_dir().join(format!("silpgate-push-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = courier(&dir.join("missing.pem")).unwrap_err();
        assert!(missing.contains("a2a.push_ca_file") && missing.contains("missing.pem"), "{missing}");
        std::fs::write(
            dir.join("junk.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let junk = courier(&dir.join("junk.pem")).unwrap_err();
        assert!(junk.contains("is not PEM"), "{junk}");
        let authority = rcgen::generate_simple_self_signed(vec!["hooks.internal".to_owned()]).unwrap();
        std::fs::write(dir.join("ca.pem"), authority.cert.pem()).unwrap();
        courier(&dir.join("ca.pem")).expect("a PEM authority is taken");
        let _ = std::fs::remove_dir_all(dir);
    }
}
