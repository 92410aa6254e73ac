//! Who the cluster's members are, as this instance hears them. Every instance binds an
//! exclusive, auto-deleted queue of its own to the members fanout exchange
//! (`<queue_prefix>.members`) and publishes a heartbeat there every [`HEARTBEAT`]: its name,
//! the partitions it consumes, and whether it is leaving. A member not heard for [`GONE_AFTER`]
//! is gone; one that says it is leaving is gone at once. Nothing is stored on the broker: the
//! queue goes with the connection, and a heartbeat expires unread after [`GONE_AFTER`].
//!
//! The partitions a heartbeat lists let an owner hand a partition on only once the next owner
//! is waiting on it and the member it replaces is not ([`Members::ready_for`]), so that the
//! broker gives the partition straight to the right instance.
//!
//! A heartbeat also names the member's heartbeat queue, its *presence*: the queue is exclusive
//! to the member's connection, so the broker deletes it the moment that connection ends. A
//! member whose presence is gone ([`is_gone`]) is not waited for until its heartbeats stop: a
//! crashed owner is not handed partitions back, nor waited on to finish a hand-over.

use super::ClusterError;
use crate::broker::publish::{Publication, PublishError, Publisher};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::info;
use tracing::warn;

/// How often an instance says it is alive.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);
/// A member not heard for this long is gone (five heartbeats: a busy broker or a stalled
/// instance does not move partitions). A crash is taken over by the standby at once anyway;
/// this decides when a new standby steps in, and when the partitions of an owner that died
/// with its standby get a new owner.
pub(crate) const GONE_AFTER: Duration = Duration::from_secs(5);
/// A member not heard for this long (a heartbeat and a half) is asked after: the broker says
/// at once whether its connection is gone ([`is_gone`]).
pub(crate) const LATE: Duration = Duration::from_millis(1500);
/// How long a starting instance listens before it consumes any partition: long enough to have
/// heard every member once, so that it does not take partitions that are not its own.
pub(crate) const WARM_UP: Duration = Duration::from_secs(2);

/// What an instance publishes every [`HEARTBEAT`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Heartbeat {
    pub instance: String,
    /// Its heartbeat queue, which lives exactly as long as its broker connection.
    #[serde(default)]
    pub presence: String,
    /// The partitions it consumes (owned and standby).
    #[serde(default)]
    pub subscribed: Vec<u16>,
    /// The partitions it serves: those it ranks first for, not yet handed on to it, show that
    /// a hand-over is still open ([`super::Cluster::readiness`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned: Vec<u16>,
    /// The upstream streams connected there ([`super::streams`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<String>,
    /// It is shutting down and hands its partitions on: count it out now.
    #[serde(default)]
    pub leaving: bool,
}

#[derive(Clone)]
struct Heard {
    first: Instant,
    last: Instant,
    heartbeat: Heartbeat,
}

/// The members as heard on one connection, and what this instance says of itself.
#[derive(Clone)]
pub(crate) struct Members {
    instance: String,
    listening_since: Instant,
    heard: HashMap<String, Heard>,
    /// Presences the broker no longer has: their members are gone, whatever their last
    /// heartbeat says.
    dead: HashSet<String>,
    /// This instance's next heartbeat.
    own: Heartbeat,
}

impl Members {
    pub(crate) fn new(instance: &str) -> Members {
        Members {
            instance: instance.to_owned(),
            listening_since: Instant::now(),
            heard: HashMap::new(),
            dead: HashSet::new(),
            own: Heartbeat {
                instance: instance.to_owned(),
                presence: String::new(),
                subscribed: Vec::new(),
                owned: Vec::new(),
                streams: Vec::new(),
                leaving: false,
            },
        }
    }

    pub(super) fn heard(&mut self, heartbeat: Heartbeat) {
        let now = Instant::now();
        match self.heard.get_mut(&heartbeat.instance) {
            Some(heard) => {
                heard.last = now;
                heard.heartbeat = heartbeat;
            }
            None => {
                if heartbeat.instance != self.instance {
                    info!(member = %heartbeat.instance, leaving = heartbeat.leaving, "A cluster member is heard.");
                }
                self.heard.insert(heartbeat.instance.clone(), Heard { first: now, last: now, heartbeat });
            }
        }
    }

    /// Whether this instance has listened long enough to know the members.
    pub(crate) fn warmed_up(&self) -> bool {
        self.listening_since.elapsed() >= WARM_UP
    }

    fn alive(&self, heard: &Heard) -> bool {
        !heard.heartbeat.leaving
            && heard.last.elapsed() < GONE_AFTER
            && !self.dead.contains(&heard.heartbeat.presence)
    }

    /// This instance's presence, which its heartbeats name.
    pub(crate) fn set_presence(&mut self, presence: &str) {
        presence.clone_into(&mut self.own.presence);
    }

    /// The presence `instance` last named, if it named one.
    pub(crate) fn presence_of(&self, instance: &str) -> Option<&str> {
        self.heard.get(instance).map(|h| h.heartbeat.presence.as_str()).filter(|p| !p.is_empty())
    }

    /// The broker no longer has `presence`: its member is out from now on, and stays out
    /// (its heartbeats still on their way name the same presence). The same instance started
    /// again has a new one.
    pub(crate) fn gone(&mut self, presence: &str) {
        if self.dead.insert(presence.to_owned())
            && let Some(heard) = self.heard.values().find(|h| h.heartbeat.presence == presence)
        {
            info!(member = %heard.heartbeat.instance, "A cluster member's connection is gone: it is out at once.");
        }
    }

    /// The live members, this instance among them unless it is leaving, sorted by name.
    pub(crate) fn live(&self) -> Vec<String> {
        let mut live: Vec<String> = self
            .heard
            .values()
            .filter(|h| h.heartbeat.instance != self.instance && self.alive(h))
            .map(|h| h.heartbeat.instance.clone())
            .collect();
        if !self.own.leaving {
            live.push(self.instance.clone());
        }
        live.sort_unstable();
        live
    }

    /// Whether `partition` can be handed on to `owner` now: it has said (in a heartbeat heard
    /// after it knew the members) that it waits on the partition, and no live member other
    /// than those `allowed` to (this one, the owner, the standbys) still says it does: the
    /// broker makes the first consumer in line active, which must be the owner.
    pub(crate) fn ready_for(&self, partition: u16, owner: &str, allowed: &[&str]) -> bool {
        let Some(heard) = self.heard.get(owner) else { return false };
        if !self.alive(heard) || heard.last.duration_since(heard.first) < WARM_UP {
            return false;
        }
        if !heard.heartbeat.subscribed.contains(&partition) {
            return false;
        }
        self.heard.values().all(|h| {
            allowed.contains(&h.heartbeat.instance.as_str())
                || !self.alive(h)
                || !h.heartbeat.subscribed.contains(&partition)
        })
    }

    /// The presences of the live members other than this one not heard for [`LATE`].
    pub(crate) fn late(&self) -> Vec<String> {
        self.heard
            .values()
            .filter(|h| h.heartbeat.instance != self.instance && self.alive(h) && h.last.elapsed() >= LATE)
            .map(|h| h.heartbeat.presence.clone())
            .filter(|presence| !presence.is_empty())
            .collect()
    }

    /// The presences of the live members other than this one whose heartbeats say they hold
    /// `stream`.
    pub(crate) fn holding_elsewhere(&self, stream: &str) -> Vec<String> {
        self.heard
            .values()
            .filter(|h| h.heartbeat.instance != self.instance && self.alive(h))
            .filter(|h| h.heartbeat.streams.iter().any(|s| s == stream))
            .map(|h| h.heartbeat.presence.clone())
            .collect()
    }

    /// The partitions the live members other than this one say they serve.
    pub(crate) fn served_elsewhere(&self) -> std::collections::BTreeSet<u16> {
        self.heard
            .values()
            .filter(|h| h.heartbeat.instance != self.instance && self.alive(h))
            .flat_map(|h| h.heartbeat.owned.iter().copied())
            .collect()
    }

    /// What the next heartbeat says: the partitions this instance serves.
    pub(crate) fn owned(&mut self, partitions: Vec<u16>) {
        self.own.owned = partitions;
    }

    /// What the next heartbeats say of the streams connected here.
    pub(crate) fn streams(&mut self, streams: Vec<String>) {
        self.own.streams = streams;
    }

    /// What the next heartbeat says: the partitions this instance consumes.
    pub(crate) fn subscribed(&mut self, partitions: Vec<u16>) {
        self.own.subscribed = partitions;
    }

    /// The next heartbeats say this instance is leaving.
    pub(crate) fn leave(&mut self) {
        self.own.leaving = true;
    }

    fn forget_the_gone(&mut self) {
        self.heard.retain(|_, h| h.last.elapsed() < GONE_AFTER * 4);
        let heard = &self.heard;
        self.dead.retain(|presence| heard.values().any(|h| h.heartbeat.presence == *presence));
    }
}

/// Publishes this instance's heartbeats and hears the others' on `heard` ([`listen`]) until
/// the channel fails. `leaving` is notified when the instance starts to leave: that heartbeat
/// goes at once.
///
/// # Errors
/// The broker failed.
pub(crate) async fn run(
    channel: Channel,
    mut heard: lapin::Consumer,
    cluster: &super::Cluster,
    members: Arc<Mutex<Members>>,
    leaving: Arc<Notify>,
) -> Result<(), ClusterError> {
    let exchange = cluster.config.members_exchange();
    let user = cluster.broker_user();
    let expiration = GONE_AFTER.as_millis().to_string();
    let mut every = tokio::time::interval(HEARTBEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => publish(&channel, &exchange, &members, (&expiration, &user)).await?,
            () = leaving.notified() => publish(&channel, &exchange, &members, (&expiration, &user)).await?,
            delivery = heard.next() => match delivery {
                // A heartbeat moves partitions: only silpgate's own broker user may send one.
                Some(Ok(delivery)) if !cluster.is_own(&delivery.properties) => {
                    warn!(user_id = ?delivery.properties.user_id(), "A heartbeat not from silpgate's broker user; ignored.");
                }
                Some(Ok(delivery)) => {
                    if let Ok(heartbeat) = serde_json::from_slice::<Heartbeat>(&delivery.data) {
                        members.lock().expect("members").heard(heartbeat);
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Err(ClusterError::Stream("the members consumer ended".into())),
            },
        }
    }
}

/// Hears every heartbeat published to the members `exchange` from now on, through a queue of
/// this connection's own that goes with it: its name is this instance's presence.
///
/// # Errors
/// The broker refused the queue, its binding or the consumer.
pub async fn listen(channel: &Channel, exchange: &str) -> lapin::Result<(String, lapin::Consumer)> {
    let own = QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() };
    let queue = channel.queue_declare("".into(), own, FieldTable::default()).await?;
    channel
        .queue_bind(
            queue.name().as_str().into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let options = BasicConsumeOptions { no_ack: true, exclusive: true, ..BasicConsumeOptions::default() };
    let consumer = channel
        .basic_consume(queue.name().as_str().into(), "".into(), options, FieldTable::default())
        .await?;
    Ok((queue.name().as_str().to_owned(), consumer))
}

/// Whether the broker no longer has `presence`, a member's heartbeat queue: a mandatory
/// publish to it comes back unroutable. The probe itself is empty and expires at once if its
/// member does not take it (a member ignores what is not a heartbeat). Any other outcome
/// (a live member, a broker that does not answer) counts as present: only the broker's word
/// takes a member out early.
pub(crate) async fn is_gone(publisher: &Publisher, presence: &str, user: &str) -> bool {
    let probe = Publication {
        exchange: "",
        routing_key: presence,
        body: Vec::new(),
        properties: BasicProperties::default().with_expiration("0".into()).with_user_id(user.into()),
    };
    matches!(publisher.publish_all(vec![probe]).await, Err(PublishError::Unroutable { .. }))
}

/// Publishes this instance's heartbeat as `members` has it now.
async fn publish(
    channel: &Channel,
    exchange: &str,
    members: &Mutex<Members>,
    (expiration, user): (&str, &str),
) -> Result<(), ClusterError> {
    let body = {
        let mut members = members.lock().expect("members");
        members.forget_the_gone();
        serde_json::to_vec(&members.own).expect("a heartbeat serializes")
    };
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_expiration(expiration.into())
        .with_user_id(user.into());
    channel
        .basic_publish(exchange.into(), "".into(), BasicPublishOptions::default(), &body, properties)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(instance: &str, subscribed: &[u16], leaving: bool) -> Heartbeat {
        Heartbeat {
            instance: instance.into(),
            presence: format!("q-{instance}"),
            subscribed: subscribed.to_vec(),
            owned: Vec::new(),
            streams: Vec::new(),
            leaving,
        }
    }

    /// Moves everything `members` heard `by` into the past.
    fn age(members: &mut Members, by: Duration) {
        for heard in members.heard.values_mut() {
            heard.first -= by;
            heard.last -= by;
        }
    }

    #[test]
    fn members_come_and_go_with_their_heartbeats() {
        let mut members = Members::new("a");
        assert_eq!(members.live(), ["a"]);
        members.heard(beat("b", &[], false));
        members.heard(beat("c", &[], false));
        assert_eq!(members.live(), ["a", "b", "c"]);
        members.heard(beat("c", &[], true));
        assert_eq!(members.live(), ["a", "b"], "a leaving member is out at once");
        age(&mut members, LATE);
        assert_eq!(members.late(), ["q-b"], "b is late: worth asking the broker about");
        age(&mut members, GONE_AFTER);
        assert_eq!(members.live(), ["a"], "a silent member is out after {GONE_AFTER:?}");
        assert!(members.late().is_empty(), "out, no longer late");
        members.leave();
        assert!(members.live().is_empty());
    }

    #[test]
    fn a_member_whose_presence_is_gone_is_out_at_once_and_stays_out() {
        let mut members = Members::new("a");
        members.heard(beat("b", &[3], false));
        age(&mut members, WARM_UP);
        members.heard(beat("b", &[3], false));
        assert!(members.ready_for(3, "b", &["a", "b"]));
        members.gone(members.presence_of("b").unwrap().to_owned().as_str());
        assert_eq!(members.live(), ["a"], "out before its heartbeats expire");
        assert!(!members.ready_for(3, "b", &["a", "b"]), "nothing is handed to a gone member");
        members.heard(beat("b", &[3], false));
        assert_eq!(members.live(), ["a"], "a heartbeat sent before it went does not bring it back");
        let mut restarted = beat("b", &[], false);
        restarted.presence = "q-b-again".into();
        members.heard(restarted);
        assert_eq!(members.live(), ["a", "b"], "started again, it has a new presence");
    }

    #[test]
    fn a_partition_is_handed_on_once_its_owner_waits_on_it_and_nobody_else_does() {
        let mut members = Members::new("a");
        members.heard(beat("b", &[3], false));
        assert!(!members.ready_for(3, "b", &["a", "b"]), "b has only just been heard");
        age(&mut members, WARM_UP);
        members.heard(beat("b", &[3], false));
        members.heard(beat("c", &[3], false));
        assert!(!members.ready_for(3, "b", &["a", "b"]), "c still waits on 3: it could get it");
        assert!(members.ready_for(3, "b", &["a", "b", "c"]), "unless c is a standby");
        members.heard(beat("c", &[], false));
        assert!(members.ready_for(3, "b", &["a", "b"]));
        assert!(!members.ready_for(4, "b", &["a", "b"]), "b does not wait on 4");
    }
}
