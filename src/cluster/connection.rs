//! The cluster's part of one broker connection: the members' heartbeats ([`membership`]), the
//! partition consumers of this instance's share ([`Ownership`]), takeovers, the [`Ingress`]
//! forwarding, and the lock stream follower. It lives and dies with the connection;
//! [`Cluster`] keeps what outlives it.
//!
//! A takeover runs beside the dispatcher, so that one partition's replay (which may wait for
//! another instance's hand-over) never holds up the others: the partition's deliveries wait,
//! in arrival order, until it is done.

use super::Wire;
use super::handover::{Handover, Parked, STRAY_GRACE};
use super::ingress::Ingress;
use super::membership::{self, Members};
use super::ownership::{Deliveries, Ownership};
use super::{Cluster, ClusterError, Moves, changelog, lock};
use crate::broker::ending::Endings;
use crate::broker::publish::Publisher;
use crate::gateway::session::Partition;
use crate::util::backoff::Backoff;
use lapin::{Channel, Connection};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// How often hand-overs are moved on and the share compared with the members.
pub(crate) const REBALANCE_TICK: Duration = Duration::from_millis(250);

/// A finished takeover: its partition, and how it went.
pub(crate) type TakenOver = (Partition, Result<(), ClusterError>);

/// The cluster side of a connection.
pub(crate) struct ClusterSide {
    cluster: Arc<Cluster>,
    /// What the cluster uses of the AMQP side's connection.
    wire: Wire,
    ownership: Ownership,
    ingress: Ingress,
    follower: JoinHandle<()>,
    members: Arc<Mutex<Members>>,
    heartbeats: JoinHandle<()>,
    /// Closed before the connection: the others' heartbeats keep arriving on it until then.
    heartbeat_channel: Channel,
    /// Wakes the heartbeats when the instance starts leaving.
    leaving_now: Arc<Notify>,
    takeovers: Vec<JoinHandle<()>>,
    /// The changelog followers of the partitions this instance waits on as a standby.
    followers: HashMap<u16, Follower>,
    /// When a partition's follower that ended may start again, and how its waits grow.
    follower_restarts: HashMap<u16, (Backoff, tokio::time::Instant)>,
    taken_over: mpsc::UnboundedSender<TakenOver>,
    /// Partitions being taken over.
    waiting: HashMap<u16, Handover>,
    /// The instance is shutting down: it hands every partition on and takes none.
    leaving: bool,
}

impl ClusterSide {
    /// Starts the heartbeats, forwarding and following the lock stream; the ticks subscribe
    /// to this instance's share once it has heard the members. Finished takeovers are reported
    /// on `taken_over`.
    ///
    /// # Errors
    /// The broker refused a channel.
    pub(crate) async fn start(
        connection: &Connection,
        cluster: &Arc<Cluster>,
        wire: Wire,
        taken_over: mpsc::UnboundedSender<TakenOver>,
    ) -> lapin::Result<ClusterSide> {
        let ownership = Ownership::new(wire.prefetch);
        if let Some(link) = wire.link.current() {
            cluster.set_broker_user(&link.user);
        }
        let members = Arc::new(Mutex::new(Members::new(&cluster.instance)));
        let leaving_now = Arc::new(Notify::new());
        let heartbeat_channel = connection.create_channel().await?;
        let (presence, heard) =
            membership::listen(&heartbeat_channel, &cluster.config.members_exchange()).await?;
        members.lock().expect("members").set_presence(&presence);
        cluster.set_presence(&presence);
        let heartbeats = tokio::spawn(beat(
            heartbeat_channel.clone(),
            heard,
            cluster.clone(),
            members.clone(),
            leaving_now.clone(),
            wire.endings.clone(),
        ));
        let ingress = Ingress::start(
            connection.create_channel().await?,
            &wire.inbound,
            cluster.config.exchange.clone(),
            &cluster.instance,
            wire.clone(),
        )
        .await?;
        let follower = tokio::spawn(follow_lock(
            connection.create_channel().await?,
            cluster.clone(),
            wire.endings.clone(),
        ));
        Ok(ClusterSide {
            cluster: cluster.clone(),
            wire,
            ownership,
            ingress,
            follower,
            members,
            heartbeats,
            heartbeat_channel,
            leaving_now,
            takeovers: Vec::new(),
            followers: HashMap::new(),
            follower_restarts: HashMap::new(),
            taken_over,
            waiting: HashMap::new(),
            leaving: false,
        })
    }

    /// A delivery of `partition`; returns the deliveries now ready for the workers. On the
    /// partition's first delivery its takeover starts, and its deliveries wait for it; while
    /// the partition is being handed on, they wait for the cancel to go through.
    ///
    /// # Errors
    /// No channel for the replay.
    pub(crate) async fn admit(
        &mut self,
        connection: &Connection,
        partition: Partition,
        parked: Parked,
    ) -> Result<Vec<Parked>, ClusterError> {
        if !self.ownership.consumes(partition) {
            // A waiting consumer dropped from this instance's share that the broker made active
            // just before: its channel is closed, so the broker has this delivery back.
            debug!(partition = partition.index, message_id = ?parked.envelope.message_id, "A delivery of a partition let go of; the broker has it back.");
            return Ok(Vec::new());
        }
        if let Some(handover) = self.waiting.get_mut(&partition.index) {
            let passed = handover.receive(parked).await?;
            let settled = handover.settled();
            let mut ready = self.hand_out(partition, passed);
            ready.extend(self.complete(partition, settled));
            return Ok(ready);
        }
        if self.cluster.owns(partition) {
            return Ok(self
                .ownership
                .hold(partition, parked)
                .map(|p| self.hand_out(partition, vec![p]))
                .unwrap_or_default());
        }
        self.waiting.insert(partition.index, Handover::Parking(vec![parked]));
        self.cluster.begin_takeover(partition);
        self.unfollow(partition.index).await;
        let channel = connection.create_channel().await?;
        let (cluster, publisher, done) =
            (self.cluster.clone(), self.wire.publisher.clone(), self.taken_over.clone());
        self.takeovers.push(tokio::spawn(async move {
            let grace = tokio::time::Instant::now() + STRAY_GRACE;
            let result = cluster.take_over(channel, &publisher, partition).await;
            tokio::time::sleep_until(grace).await;
            let _ = done.send((partition, result));
        }));
        Ok(Vec::new())
    }

    /// Counts deliveries handed to the workers, each until its job is dropped.
    fn hand_out(&self, partition: Partition, mut ready: Vec<Parked>) -> Vec<Parked> {
        if tracing::enabled!(tracing::Level::DEBUG) && !ready.is_empty() {
            let ids: Vec<_> = ready.iter().map(|p| p.envelope.message_id.as_deref().unwrap_or("-")).collect();
            debug!(partition = partition.index, ?ids, "Handed to the workers.");
        }
        for parked in &mut ready {
            parked.in_flight = Some(self.cluster.dispatched(partition));
        }
        ready
    }

    /// Ends a hand-over that has `ready` its deliveries: the partition is served from now on,
    /// starting with them.
    fn complete(&mut self, partition: Partition, ready: Option<Vec<Parked>>) -> Vec<Parked> {
        match ready {
            Some(ready) => {
                self.waiting.remove(&partition.index);
                self.cluster.serve(partition);
                self.hand_out(partition, ready)
            }
            None => Vec::new(),
        }
    }

    /// The partition's changelog is replayed: hands out the previous owner's deliveries that
    /// waited for it and puts the rest back in order (see [`Handover`]); returns any ready for
    /// the workers.
    ///
    /// # Errors
    /// The channel failed.
    pub(crate) async fn taken_over(&mut self, partition: Partition) -> Result<Vec<Parked>, ClusterError> {
        let Some(handover) = self.waiting.get_mut(&partition.index) else { return Ok(Vec::new()) };
        let now = handover.requeue().await?;
        let settled = handover.settled();
        let mut ready = self.hand_out(partition, now);
        ready.extend(self.complete(partition, settled));
        Ok(ready)
    }

    /// One tick: moves the hand-overs to other instances on, and brings the partitions
    /// consumed here in line with the members. Returns deliveries now ready for the workers.
    ///
    /// A tick waits for the broker's answers (a changelog append, a cancel, a new channel),
    /// and nothing else of the connection moves meanwhile, so it may take no longer than a
    /// hand-over may: a broker that stops answering must not keep a partition from its next
    /// owner (seen when a broker node was killed under a hand-over: the instance stood still,
    /// the partitions it was handing on served by nobody).
    ///
    /// # Errors
    /// The broker failed, or did not answer in time
    /// ([`ClusterError::lets_go_of_the_connection`]).
    pub(crate) async fn tick(
        &mut self,
        connection: &Connection,
        deliveries: &mut Deliveries,
    ) -> Result<Vec<(Partition, Vec<Parked>)>, ClusterError> {
        let limit = self.cluster.finish_limit();
        match tokio::time::timeout(limit, self.step(connection, deliveries)).await {
            Ok(result) => result,
            Err(_) => {
                warn!(instance = %self.cluster.instance, ?limit, "A cluster step got no answer from the broker in time; letting go of the connection.");
                Err(ClusterError::Unanswered { limit })
            }
        }
    }

    async fn step(
        &mut self,
        connection: &Connection,
        deliveries: &mut Deliveries,
    ) -> Result<Vec<(Partition, Vec<Parked>)>, ClusterError> {
        self.takeovers.retain(|t| !t.is_finished());
        let mut settled = Vec::new();
        for (&index, handover) in &mut self.waiting {
            if let Some(ready) = handover.settled() {
                settled.push((self.cluster.partition(index), ready));
            }
        }
        let settled: Vec<(Partition, Vec<Parked>)> =
            settled.into_iter().map(|(p, ready)| (p, self.complete(p, Some(ready)))).collect();
        if self.leaving {
            // A takeover that finished meanwhile is handed on as well.
            self.ownership.release_all(&self.cluster);
        }
        self.cluster.append_marks(&self.wire.publisher).await?;
        let ready =
            self.ownership.advance(&self.cluster, &self.wire.publisher, deliveries, !self.leaving).await?;
        let mut ready: Vec<(Partition, Vec<Parked>)> =
            ready.into_iter().map(|(p, parked)| (p, self.hand_out(p, parked))).collect();
        ready.extend(settled);
        let publisher = self.wire.publisher.clone();
        self.reconcile((connection, &publisher), deliveries).await?;
        Ok(ready)
    }

    /// Compares what is consumed here with the members' ranking (once they have been heard),
    /// and publishes the outcome: in the next heartbeat and in the cluster's status.
    async fn reconcile(
        &mut self,
        (connection, publisher): (&Connection, &Publisher),
        deliveries: &mut Deliveries,
    ) -> Result<(), ClusterError> {
        let (live, members) = {
            let members = self.members.lock().expect("members");
            if !members.warmed_up() {
                return Ok(());
            }
            // A copy: the lock is not held across the broker's answers.
            (members.live(), members.clone())
        };
        if !self.leaving {
            let taking_over: BTreeSet<u16> = self.waiting.keys().copied().collect();
            let mut gone = self
                .ownership
                .reconcile((connection, publisher), &self.cluster, &live, &members, &taking_over, deliveries)
                .await?;
            // Members a stream waits on, and members whose heartbeats are late: the broker
            // says whether their connections are gone.
            let decided = self.cluster.streams.decide(&self.cluster.instance, &live, &members);
            let mut suspects: BTreeSet<String> = members.late().into_iter().collect();
            suspects.extend(decided.waiting_on.into_iter().filter(|p| !p.is_empty()));
            for presence in suspects {
                if !gone.contains(&presence) && self.cluster.is_gone(publisher, &presence).await {
                    gone.push(presence);
                }
            }
            if !gone.is_empty() {
                // Counted out now; the next tick ranks without them.
                let mut members = self.members.lock().expect("members");
                for presence in &gone {
                    members.gone(presence);
                }
            }
        } else {
            self.cluster.streams.revoke_all();
        }
        self.follow_standbys(connection).await?;
        let subscribed = self.ownership.subscribed();
        let owned: Vec<u16> = self.cluster.owned().iter().map(|p| p.index).collect();
        let mut members = self.members.lock().expect("members");
        let moves = Moves {
            handing_on: self.ownership.handing_on(),
            served_elsewhere: members.served_elsewhere().into_iter().collect(),
        };
        self.cluster.observe(live, &subscribed, moves);
        members.subscribed(subscribed);
        members.owned(owned);
        members.streams(self.cluster.streams.holding());
        Ok(())
    }

    /// Follows the changelog of each partition this instance waits on as a standby (consumed
    /// here, neither served nor being taken over), and of no other. A follower that ended
    /// on its own (its channel or stream failed) starts again after a backoff that grows
    /// while followers die young, so that a broker that keeps refusing is not asked four
    /// times a second.
    async fn follow_standbys(&mut self, connection: &Connection) -> lapin::Result<()> {
        let standby: BTreeSet<u16> = if self.leaving {
            BTreeSet::new()
        } else {
            let cluster = &self.cluster;
            self.ownership
                .subscribed()
                .into_iter()
                .filter(|&index| {
                    !cluster.owns(cluster.partition(index)) && !self.waiting.contains_key(&index)
                })
                .collect()
        };
        let ended: Vec<u16> = self
            .followers
            .iter()
            .filter(|&(index, follower)| !standby.contains(index) || follower.task.is_finished())
            .map(|(&index, _)| index)
            .collect();
        let now = tokio::time::Instant::now();
        for index in ended {
            let lived = self.followers.get(&index).map(|f| f.started.elapsed());
            if let Some(lived) = lived.filter(|_| standby.contains(&index)) {
                let (backoff, at) = self
                    .follower_restarts
                    .entry(index)
                    .or_insert_with(|| (Backoff::new(FOLLOWER_RESTART_FIRST, FOLLOWER_RESTART_MAX), now));
                backoff.connection_ended(lived);
                *at = now + backoff.next_delay();
            }
            self.unfollow(index).await;
        }
        self.follower_restarts.retain(|index, _| standby.contains(index));
        for index in standby {
            let held_back = self.follower_restarts.get(&index).is_some_and(|&(_, at)| now < at);
            if self.followers.contains_key(&index) || held_back {
                continue;
            }
            let channel = connection.create_channel().await?;
            let cluster = self.cluster.clone();
            let partition = cluster.partition(index);
            let task = tokio::spawn(async move {
                let stream = cluster.changelog(partition);
                if let Err(e) = changelog::follow(channel, stream, &cluster.store, partition).await {
                    warn!(partition = index, error = %e, "Following a standby partition's changelog failed; a takeover replays what it missed.");
                }
            });
            self.followers.insert(index, Follower { task, started: std::time::Instant::now() });
        }
        Ok(())
    }

    /// Stops following `index`'s changelog, and waits until the follower applies nothing more.
    async fn unfollow(&mut self, index: u16) {
        if let Some(follower) = self.followers.remove(&index) {
            follower.task.abort();
            let _ = follower.task.await;
        }
    }

    /// Whether a consumer that ended was cancelled on purpose (a partition handed on, or any
    /// consumer of an instance that is leaving).
    pub(crate) fn expected_end(&mut self, queue: &str) -> bool {
        self.ownership.expected_end(&self.cluster, queue) || self.leaving
    }

    /// Starts leaving the cluster: says so in its heartbeats (the members count it out at
    /// once), stops forwarding and hands every partition it serves on, the way a change of
    /// members does, so that the standbys take over in order. [`ClusterSide::left`] says
    /// when it is done.
    pub(crate) fn leave(&mut self) {
        self.leaving = true;
        self.members.lock().expect("members").leave();
        self.leaving_now.notify_one();
        self.ingress.leave();
        self.ownership.release_all(&self.cluster);
    }

    /// Whether leaving is complete: nothing forwarded, no partition served or being taken over.
    pub(crate) fn left(&self) -> bool {
        self.leaving
            && self.ingress.left()
            && self.waiting.is_empty()
            && !self.ownership.releasing()
            && self.cluster.owned().is_empty()
    }

    /// Stops the heartbeats, following the lock stream and any takeover still running.
    pub(crate) async fn stop(self) {
        self.ingress.stop().await;
        let followers = self.followers.into_values().map(|f| f.task);
        for task in self.takeovers.into_iter().chain(followers).chain([self.follower, self.heartbeats]) {
            task.abort();
            let _ = task.await;
        }
        let _ = self.heartbeat_channel.close(200, "leaving".into()).await;
    }
}

/// The first and the longest wait before a standby's follower that ended starts again.
const FOLLOWER_RESTART_FIRST: Duration = Duration::from_millis(250);
const FOLLOWER_RESTART_MAX: Duration = Duration::from_secs(10);

/// A standby partition's changelog follower, and when it started (one that dies young makes
/// the next start wait longer).
struct Follower {
    task: JoinHandle<()>,
    started: std::time::Instant,
}

/// Publishes and hears heartbeats until the connection fails, then says so.
async fn beat(
    channel: Channel,
    heard: lapin::Consumer,
    cluster: Arc<Cluster>,
    members: Arc<Mutex<Members>>,
    leaving_now: Arc<Notify>,
    endings: Endings,
) {
    let Err(e) = membership::run(channel, heard, &cluster, members, leaving_now).await else { return };
    warn!(error = %e, "The cluster heartbeats failed.");
    endings.broken(&e);
}

/// Follows the cluster's lock stream until the connection fails, then says so.
async fn follow_lock(channel: Channel, cluster: Arc<Cluster>, endings: Endings) {
    let Err(e) = lock::follow(channel, &cluster).await else { return };
    warn!(error = %e, "Following the lock stream failed.");
    if e.is_fatal() {
        endings.store_damaged(&e);
    } else {
        endings.broken(&e);
    }
}
