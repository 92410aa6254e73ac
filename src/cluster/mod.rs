//! Cluster mode: several silpgate instances on one RabbitMQ behave as one. RabbitMQ is the
//! whole distributed engine (docs/cluster.md):
//!
//! - conversations are spread over P partition queues by a consistent-hash exchange
//!   ([`ingress`] forwards what arrives on the inbound queues there, keyed by conversation);
//! - the instances hear each other's heartbeats ([`membership`]) and rank themselves for every
//!   partition by rendezvous hashing ([`rendezvous`]): each consumes the partitions it owns and
//!   waits, as a standby, on a few more; single active consumer makes the broker deliver each
//!   partition to one live instance at a time and hand it on to the standby when that one goes;
//! - each partition's session changes are appended to its changelog stream before the message
//!   is acknowledged, and an instance replays the changelog before it serves a partition it
//!   took over ([`changelog`]);
//! - the compile.lock is decided in one lock stream that every instance follows ([`lock`]),
//!   which also carries the agent profiles learnt from `//ping`. Every door proposes there:
//!   the partition owners with their changelog entries, the front doors through the intake
//!   before they answer.
//!
//! [`Cluster`] is what outlives connections: the names, the store, and what this instance
//! owns now (for `silpgate cluster status` and the metrics).

pub(crate) mod changelog;
pub(crate) mod connection;
pub(crate) mod handover;
pub(crate) mod ingress;
pub(crate) mod lock;
pub mod membership;
pub mod ownership;
pub mod rendezvous;
pub(crate) mod streams;
pub(crate) mod wire;

use crate::broker::properties;
use crate::broker::publish::{Publication, PublishError, Publisher};
use crate::config::ClusterConfig;
use crate::gateway::session::Partition;
use crate::gateway::store::{Freeze, LedgerState, SessionChange, SessionRecord, Store, StoreError};
use crate::store::SledStore;
use crate::store::replica::{LockProposal, PartitionChange, ProfileShare};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use tracing::{info, warn};
pub(crate) use wire::Wire;

/// Why a cluster step failed: the broker (reconnect and try again) or the store.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error("publishing to a stream: {0}")]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Stream(String),
    #[error(
        "handing on partition {partition} did not finish within {limit:?} of its cancel; the connection is let go so that the next owner is given what it held"
    )]
    HandOverOverdue { partition: u16, limit: std::time::Duration },
    #[error(
        "the broker did not answer a cluster step within {limit:?}; the connection is let go so that the partitions it serves go to their next owners"
    )]
    Unanswered { limit: std::time::Duration },
}

impl ClusterError {
    /// A damaged store must stop the instance; anything else is retried after a reconnect.
    pub(crate) fn is_fatal(&self) -> bool {
        matches!(self, ClusterError::Store(StoreError::Corrupt(_)))
    }

    /// The connection must be closed at once, its deliveries given back to the broker.
    pub(crate) fn lets_go_of_the_connection(&self) -> bool {
        matches!(self, ClusterError::HandOverOverdue { .. } | ClusterError::Unanswered { .. })
    }
}

/// One delivery of a partition in a worker's hands, counted in [`Cluster::in_flight`] until it
/// is dropped. A guard, not a pair of calls: a connection that is lost drops the jobs its
/// workers still hold (aborted after a moment, their queues discarded), and a count that
/// missed them would hold every later hand-over of their partitions for good, waiting for
/// deliveries nobody handles any more.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a handled message appends to the streams.
pub(crate) struct Entries<'a> {
    pub publications: Vec<Publication<'a>>,
    /// Changelog entries among them (0 or 1), and lock proposals.
    pub changes: u64,
    pub proposals: u64,
}

/// One partition as this instance sees it.
#[derive(Debug, Default)]
struct PartitionState {
    /// Serving it now: its changelog was replayed on this connection and the deliveries that
    /// waited for the replay were put back in order ([`handover`]).
    owned: AtomicBool,
    /// Being taken over: its first delivery came, and it is not served yet (replaying, or
    /// waiting for what it put back to come again).
    taking_over: AtomicBool,
    /// When it was taken over (milliseconds since the epoch).
    since: AtomicU64,
    /// Entries applied by the last replay, and how long that took.
    replayed: AtomicU64,
    replay_ms: AtomicU64,
    /// Changes appended since the last snapshot.
    since_snapshot: AtomicU64,
    /// Deliveries handed to the workers and not yet settled: one [`InFlight`] each.
    in_flight: Arc<AtomicUsize>,
    /// Ledger entries of messages whose state is committed here and whose changelog entry is
    /// not yet confirmed, by message id: a snapshot carries their turns, so it carries them.
    unappended: Mutex<HashMap<String, LedgerState>>,
    /// Messages whose publishes were all confirmed, not yet marked so in the changelog.
    marks: Mutex<Vec<String>>,
}

/// The members and the partitions consumed here, as the last tick saw them.
#[derive(Debug, Default)]
struct View {
    members: Vec<String>,
    subscribed: Vec<u16>,
    moves: Moves,
}

/// The hand-overs open as the last tick saw them: to this instance or from it.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Moves {
    /// Partitions this instance is handing on (quiescing, cancelled or finishing).
    pub handing_on: Vec<u16>,
    /// Partitions the other live members say they serve.
    pub served_elsewhere: Vec<u16>,
}

/// Channels an instance opens besides its partitions' and its standby partitions' changelog
/// followers' (the connection's own, the heartbeats', the ingress's and the lock follower's).
pub(crate) const FIXED_CHANNELS: usize = 4;

/// The cluster side of one instance.
pub(crate) struct Cluster {
    pub config: ClusterConfig,
    pub instance: String,
    pub store: Arc<SledStore>,
    /// Partition queue name -> partition index.
    queues: HashMap<String, u16>,
    changelogs: Vec<String>,
    partitions: Vec<PartitionState>,
    /// Lock proposals this instance had confirmed, and how many of them its follower has
    /// applied since: the difference is the follower's lag.
    proposed: AtomicU64,
    followed: AtomicU64,
    /// Partitions taken over since the start.
    takeovers: AtomicU64,
    view: Mutex<View>,
    handover_wait: std::time::Duration,
    /// Shared from a partition message's commit until [`Cluster::committed`] has noted it,
    /// exclusive while a snapshot reads the store: a snapshot never holds a turn whose ledger
    /// entry it lacks.
    commits: RwLock<()>,
    /// The broker user silpgate's connection logged in as: heartbeats and lock stream entries
    /// go out with it as their `user_id` (which RabbitMQ checks), and only those that carry it
    /// are believed.
    broker_user: Mutex<String>,
    /// This instance's presence on the current connection (see [`membership`]): ownership
    /// entries name it, so that a takeover can tell when their writer is gone.
    presence: Mutex<String>,
    /// The `[[streams]]` sources, each held by one instance of the cluster at a time.
    pub streams: streams::StreamHolds,
}

impl Cluster {
    /// The store's compile.lock chain now follows the lock stream.
    /// `handover_wait`: how long a takeover waits for a running owner to finish handing over.
    pub(crate) fn new(
        config: ClusterConfig,
        store: Arc<SledStore>,
        handover_wait: std::time::Duration,
    ) -> Cluster {
        store.follow_cluster_lock();
        let queues = (0..config.partitions).map(|i| (config.partition_queue(i), i)).collect();
        let changelogs = (0..config.partitions).map(|i| config.changelog_stream(i)).collect();
        let partitions = (0..config.partitions).map(|_| PartitionState::default()).collect();
        Cluster {
            instance: config.instance_name(),
            config,
            store,
            queues,
            changelogs,
            partitions,
            proposed: AtomicU64::new(0),
            followed: AtomicU64::new(0),
            takeovers: AtomicU64::new(0),
            view: Mutex::new(View::default()),
            handover_wait,
            commits: RwLock::new(()),
            broker_user: Mutex::default(),
            presence: Mutex::default(),
            streams: streams::StreamHolds::new(Vec::new()),
        }
    }

    /// The `[[streams]]` sources of this instance's configuration, by name: connected only
    /// while this instance holds them ([`streams`]).
    #[must_use]
    pub(crate) fn with_streams(mut self, names: Vec<String>) -> Cluster {
        self.streams = streams::StreamHolds::new(names);
        self
    }

    /// How long a partition's hand-over to another instance may take from its cancel: half
    /// the time the next owner waits for it before it serves without it, which leaves the
    /// other half for the connection to close once this instance gives up.
    pub(crate) fn finish_limit(&self) -> std::time::Duration {
        self.handover_wait / 2
    }

    /// The changelog stream of `partition`.
    pub(crate) fn changelog(&self, partition: Partition) -> &str {
        &self.changelogs[usize::from(partition.index)]
    }

    /// The partition a queue is, if it is one.
    pub(crate) fn partition_of(&self, queue: &str) -> Option<Partition> {
        self.queues.get(queue).map(|&index| self.partition(index))
    }

    pub(crate) fn partition(&self, index: u16) -> Partition {
        Partition { index, count: self.config.partitions }
    }

    fn state(&self, partition: Partition) -> &PartitionState {
        &self.partitions[usize::from(partition.index)]
    }

    /// Whether this instance serves `partition` on the current connection.
    pub(crate) fn owns(&self, partition: Partition) -> bool {
        self.state(partition).owned.load(Ordering::Acquire)
    }

    /// The partitions this instance serves now.
    pub(crate) fn owned(&self) -> Vec<Partition> {
        (0..self.config.partitions).map(|i| self.partition(i)).filter(|&p| self.owns(p)).collect()
    }

    /// A delivery of `partition` is handed to a worker: it counts as in flight until the
    /// returned guard is dropped, with the job that carries it.
    pub(crate) fn dispatched(&self, partition: Partition) -> InFlight {
        let count = &self.state(partition).in_flight;
        count.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(count))
    }

    /// Deliveries of `partition` handed out and not yet settled.
    pub(crate) fn in_flight(&self, partition: Partition) -> usize {
        self.state(partition).in_flight.load(Ordering::Acquire)
    }

    /// This instance no longer serves `partition`.
    pub(crate) fn release(&self, partition: Partition) {
        self.state(partition).taking_over.store(false, Ordering::Release);
        self.state(partition).unappended.lock().expect("unappended").clear();
        self.state(partition).marks.lock().expect("marks").clear();
        if self.state(partition).owned.swap(false, Ordering::AcqRel) {
            crate::metrics::get().partitions_owned.dec();
            self.note_served(partition, false);
        }
    }

    /// Takes `partition` over: replays its changelog into the store. Called on the first
    /// delivery from its queue on a connection (the broker delivers to the single active
    /// consumer only); the partition is served once its deliveries are in order
    /// ([`Cluster::serve`]).
    ///
    /// # Errors
    /// The broker or the store failed; the partition is not served.
    pub(crate) async fn take_over(
        &self,
        channel: lapin::Channel,
        publisher: &Publisher,
        partition: Partition,
    ) -> Result<(), ClusterError> {
        let started = std::time::Instant::now();
        let stream = self.changelog(partition);
        let replayed =
            changelog::replay(channel, publisher, stream, self, partition, self.handover_wait).await?;
        let elapsed = started.elapsed();
        let state = &self.partitions[usize::from(partition.index)];
        state.replayed.store(replayed, Ordering::Relaxed);
        state.replay_ms.store(elapsed.as_millis() as u64, Ordering::Relaxed);
        state.since.store(crate::util::time::now_millis(), Ordering::Relaxed);
        state.since_snapshot.store(0, Ordering::Relaxed);
        self.takeovers.fetch_add(1, Ordering::Relaxed);
        let metrics = crate::metrics::get();
        metrics.partition_takeovers.with_label_values(&[&partition.index.to_string()]).inc();
        metrics.replay_seconds.observe(elapsed.as_secs_f64());
        metrics.replayed_entries.inc_by(replayed);
        info!(
            instance = %self.instance,
            partition = partition.index,
            replayed,
            replay_ms = elapsed.as_millis() as u64,
            "Took over a partition."
        );
        Ok(())
    }

    /// Serves `partition`: its takeover is complete. Only a partition served can be handed on:
    /// one handed on halfway through its takeover would leave deliveries behind here that the
    /// next owner never sees.
    pub(crate) fn serve(&self, partition: Partition) {
        self.state(partition).taking_over.store(false, Ordering::Release);
        if !self.state(partition).owned.swap(true, Ordering::AcqRel) {
            crate::metrics::get().partitions_owned.inc();
            self.note_served(partition, true);
        }
    }

    /// `partition`'s takeover has begun: it shows in the status until it is served (or the
    /// connection is gone).
    pub(crate) fn begin_takeover(&self, partition: Partition) {
        self.state(partition).taking_over.store(true, Ordering::Release);
    }

    /// Tells the store whether `partition` is served here, for `silpgate sessions list`.
    fn note_served(&self, partition: Partition, served: bool) {
        if let Err(e) = self.store.set_served(partition.index, served) {
            warn!(partition = partition.index, error = %e, "Could not note in the store whether the partition is served here.");
        }
    }

    /// Forgets every partition: the connection that held them is gone, and the broker hands
    /// them to whichever consumer is active next.
    pub(crate) fn release_all(&self) {
        for index in 0..self.config.partitions {
            self.release(self.partition(index));
        }
        self.streams.revoke_all();
        self.observe(Vec::new(), &[], Moves::default());
    }

    /// Whether this instance can place a conversation and serves its share: it has heard the
    /// members (so it knows which instance owns what), consumes its own share of the
    /// partitions, and no hand-over to it or from it is open: every partition it ranks first
    /// for has been handed on to it (no other member serves it), it serves none that another
    /// member ranks first for, and none is being taken over or handed on here. A rollout that
    /// waits for `/readyz` 200 before stopping the next instance so never stops one in the
    /// middle of hand-overs. `/readyz` is 503 until then, and while the instance has lost its
    /// broker connection (once it leaves, its listener takes no new connection at all).
    ///
    /// # Errors
    /// What it still lacks.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        let view = self.view.lock().expect("view");
        if !view.members.contains(&self.instance) {
            return Err("the cluster's members are not known yet".into());
        }
        let share =
            rendezvous::share(self.config.partitions, &view.members, self.config.standby, &self.instance);
        let missing: Vec<u16> =
            share.subscribed().into_iter().filter(|p| !view.subscribed.contains(p)).collect();
        if !missing.is_empty() {
            return Err(format!("partitions of this instance's share not consumed yet: {missing:?}"));
        }
        let taking_over: Vec<u16> = (0..self.config.partitions)
            .filter(|&index| self.state(self.partition(index)).taking_over.load(Ordering::Acquire))
            .collect();
        if !taking_over.is_empty() {
            return Err(format!("partitions being taken over: {taking_over:?}"));
        }
        if !view.moves.handing_on.is_empty() {
            return Err(format!("partitions being handed on: {:?}", view.moves.handing_on));
        }
        let still_elsewhere: Vec<u16> =
            share.owned.iter().copied().filter(|p| view.moves.served_elsewhere.contains(p)).collect();
        if !still_elsewhere.is_empty() {
            return Err(format!(
                "partitions of this instance still served by another member: {still_elsewhere:?}"
            ));
        }
        let to_hand_on: Vec<u16> =
            self.owned().iter().map(|p| p.index).filter(|p| !share.owned.contains(p)).collect();
        if !to_hand_on.is_empty() {
            return Err(format!("partitions to hand on to their owners: {to_hand_on:?}"));
        }
        Ok(())
    }

    /// The live members and the partitions consumed here now, for the status and the metrics.
    pub(crate) fn observe(&self, members: Vec<String>, subscribed: &[u16], moves: Moves) {
        let standby = subscribed.iter().filter(|&&index| !self.owns(self.partition(index))).count();
        let metrics = crate::metrics::get();
        metrics.partitions_standby.set(i64::try_from(standby).unwrap_or(i64::MAX));
        metrics.cluster_members.set(i64::try_from(members.len()).unwrap_or(i64::MAX));
        let mut view = self.view.lock().expect("view");
        view.members = members;
        subscribed.clone_into(&mut view.subscribed);
        view.moves = moves;
    }

    /// The stream entries a handled message adds: to its partition's changelog, its
    /// conversation's session as the message left it, with the message's ledger entry; to the
    /// lock stream, its new compile.lock entries and learnt profiles.
    ///
    /// The session is the one the message committed, never the store's current one: the rest
    /// of a window is committed before its first entry goes out, and a replica given a later
    /// turn without that message's ledger entry would count the message again when it is
    /// redelivered. A redelivered message whose ledger entry came from the changelog adds no
    /// change: the replicas have it, with its session.
    ///
    /// # Errors
    /// The store could not be read.
    pub(crate) fn entries(
        &self,
        partition: Partition,
        change: &SessionChange,
        frozen: &[Freeze],
        learnt: &[String],
    ) -> Result<Entries<'_>, StoreError> {
        let mut entries = Vec::with_capacity(1 + frozen.len());
        if let Some(session) = &change.session {
            let change =
                PartitionChange::Session { session: session.clone(), message: change.message.clone() };
            entries.push(self.changelog_entry(partition, &changelog::Entry::Change(change)));
        }
        let changes = entries.len() as u64;
        entries.extend(self.shared(frozen, learnt)?);
        Ok(Entries { publications: entries, changes, proposals: frozen.len() as u64 })
    }

    /// The lock stream entries a handled message adds, whatever door it came through: its new
    /// compile.lock entries, and the profiles of the agents it taught (`learnt`, read back
    /// from the store as they now stand).
    ///
    /// # Errors
    /// The store could not be read.
    pub(crate) fn shared(
        &self,
        frozen: &[Freeze],
        learnt: &[String],
    ) -> Result<Vec<Publication<'_>>, StoreError> {
        let now = crate::util::time::now_millis();
        let mut entries = Vec::with_capacity(frozen.len() + learnt.len());
        for freeze in frozen {
            let body = lock::encode(&LockProposal::new(freeze, now, &self.instance));
            entries.push(self.lock_entry(body));
        }
        for agent in learnt {
            let Some(profile) = self.store.profile(agent)? else { continue };
            let share = ProfileShare { agent: agent.clone(), profile, by: self.instance.clone() };
            entries.push(self.lock_entry(lock::encode_profile(&share)));
        }
        Ok(entries)
    }

    fn lock_entry(&self, body: Vec<u8>) -> Publication<'_> {
        Publication {
            exchange: "",
            routing_key: &self.config.lock_stream,
            body,
            properties: properties::stream_properties().with_user_id(self.broker_user().into()),
        }
    }

    /// Notes the broker user of a new connection (see `broker_user`).
    pub(crate) fn set_broker_user(&self, user: &str) {
        user.clone_into(&mut self.broker_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    pub(crate) fn broker_user(&self) -> String {
        self.broker_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Notes this instance's presence on a new connection.
    pub(crate) fn set_presence(&self, presence: &str) {
        presence.clone_into(&mut self.presence.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// A marker for an ownership entry this instance writes now.
    pub(crate) fn marker(&self) -> changelog::Marker {
        let presence = self.presence.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        changelog::Marker::new(&self.instance, presence)
    }

    /// Whether the member whose presence is `presence` is gone ([`membership::is_gone`]).
    pub(crate) async fn is_gone(&self, publisher: &Publisher, presence: &str) -> bool {
        membership::is_gone(publisher, presence, &self.broker_user()).await
    }

    /// Whether a heartbeat or lock stream entry was published by silpgate's own broker user.
    pub(crate) fn is_own(&self, properties: &lapin::BasicProperties) -> bool {
        let own = self.broker_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        properties.user_id().as_ref().is_some_and(|u| u.as_str() == own.as_str())
    }

    /// A front-door message of conversation `key` that came through the door `source`, as it
    /// is published to the partition exchange for its partition's owner ([`crate::intake::forward`]):
    /// JSON, persistent, `id` as its message and correlation id, replies to RabbitMQ's direct
    /// reply-to, this instance and its broker `user` (which the broker checks, and which makes
    /// the owner believe `source`), and the trace context of `span`.
    pub(crate) fn forward_publication(
        &self,
        envelope: &crate::nlip::Message,
        (key, source, principal): (&str, &str, Option<&crate::principal::Principal>),
        id: &str,
        user: &str,
        span: &tracing::Span,
    ) -> Publication<'_> {
        let forwarded = properties::Forwarded {
            key,
            source,
            principal,
            message_id: id,
            reply_to: crate::broker::publish::DIRECT_REPLY_TO,
            correlation_id: id,
            instance: &self.instance,
            user,
        };
        let mut headers = lapin::types::FieldTable::default();
        crate::telemetry::inject(span, &mut headers);
        Publication {
            exchange: &self.config.exchange,
            routing_key: "",
            body: crate::nlip::encode(envelope, crate::nlip::Encoding::Json),
            properties: properties::forwarded_properties(&forwarded, headers),
        }
    }

    /// Appends what a message handled outside the partition queues adds to the streams (an
    /// agent's answer, a front-door message served here: see [`Cluster::entries`]) and waits
    /// for the broker's confirms: the door answers, and the answer goes on, only then, as a
    /// partition owner acknowledges only then.
    ///
    /// # Errors
    /// The store could not be read or the broker did not confirm.
    pub(crate) async fn propose(
        &self,
        publisher: &Publisher,
        change: &SessionChange,
        frozen: &[Freeze],
        learnt: &[String],
    ) -> Result<(), ClusterError> {
        let partition = self.partition_changed(change);
        let entries = match partition {
            Some(partition) => self.entries(partition, change, frozen, learnt)?,
            None => Entries {
                publications: self.shared(frozen, learnt)?,
                changes: 0,
                proposals: frozen.len() as u64,
            },
        };
        if entries.publications.is_empty() {
            return Ok(());
        }
        publisher.publish_all(entries.publications).await?;
        let Some(partition) = partition else {
            self.count_proposed(entries.proposals);
            return Ok(());
        };
        let id = change.message.as_ref().map(|(id, _)| id.as_str());
        if let Err(e) = self.appended(publisher, partition, id, entries.changes, entries.proposals).await {
            warn!(partition = partition.index, error = %e, "Snapshot not appended; the next change tries again.");
        }
        Ok(())
    }

    /// Counts lock-stream proposals this instance made, for the follower's lag.
    fn count_proposed(&self, proposals: u64) {
        if proposals > 0 {
            self.proposed.fetch_add(proposals, Ordering::Relaxed);
            self.observe_lock_lag();
        }
    }

    fn changelog_entry(&self, partition: Partition, entry: &changelog::Entry) -> Publication<'_> {
        changelog::publication(self.changelog(partition), entry)
    }

    /// To be held from committing partition messages until they are [noted](Cluster::committed).
    pub(crate) fn committing(&self) -> RwLockReadGuard<'_, ()> {
        self.commits.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a committed change of a partition's conversation until its changelog entry is
    /// confirmed ([`Cluster::appended`]). A change that appends nothing (a redelivery whose
    /// entry came from the changelog) is not noted.
    pub(crate) fn committed(&self, change: &SessionChange) {
        if let (Some(partition), Some((id, state))) = (self.partition_changed(change), &change.message) {
            self.state(partition).unappended.lock().expect("unappended").insert(id.clone(), state.clone());
        }
    }

    /// The partition whose changelog carries `change`, if any.
    fn partition_changed(&self, change: &SessionChange) -> Option<Partition> {
        let index = change.session.as_ref()?.partition?;
        (index < self.config.partitions).then(|| self.partition(index))
    }

    /// The changelog entry of `message_id` is confirmed: a snapshot need not carry its ledger
    /// entry any more.
    fn confirmed(&self, partition: Partition, message_id: &str) {
        self.state(partition).unappended.lock().expect("unappended").remove(message_id);
    }

    /// The publishes of `message_id`, a message of `partition`, are all confirmed. The mark
    /// follows its entry into the changelog with the next tick ([`Cluster::append_marks`]) or
    /// the partition's `Released`, so that whoever serves the partition next acknowledges the
    /// message, sent again, without publishing it again. A mark lost with its connection, or
    /// with a crash before that tick, costs at most one duplicate publish of a message that
    /// is sent again.
    pub(crate) fn published(&self, partition: Partition, message_id: &str) {
        self.state(partition).marks.lock().expect("marks").push(message_id.to_owned());
    }

    /// The changelog entry of `partition`'s marks not yet appended, taken out, if it has any.
    pub(crate) fn marks_entry(&self, partition: Partition) -> Option<Publication<'_>> {
        let ids = std::mem::take(&mut *self.state(partition).marks.lock().expect("marks"));
        (!ids.is_empty()).then(|| {
            self.changelog_entry(partition, &changelog::Entry::Change(PartitionChange::Published { ids }))
        })
    }

    /// Appends to `partition`'s changelog that a message refused for good took its turn back
    /// ([`crate::gateway::Gateway::take_back`]): `session` as it was put back.
    ///
    /// # Errors
    /// The broker did not confirm.
    pub(crate) async fn take_back(
        &self,
        publisher: &Publisher,
        partition: Partition,
        session: SessionRecord,
        message_id: &str,
    ) -> Result<(), ClusterError> {
        self.confirmed(partition, message_id);
        let change = PartitionChange::TakenBack { session, message_id: message_id.to_owned() };
        let entry = self.changelog_entry(partition, &changelog::Entry::Change(change));
        Ok(publisher.publish_all(vec![entry]).await?)
    }

    /// Appends the marks of every partition that has some ([`Cluster::published`]).
    ///
    /// # Errors
    /// The broker did not confirm; those marks are lost (see [`Cluster::published`]).
    pub(crate) async fn append_marks(&self, publisher: &Publisher) -> Result<(), ClusterError> {
        let entries: Vec<Publication<'_>> =
            (0..self.config.partitions).filter_map(|index| self.marks_entry(self.partition(index))).collect();
        if !entries.is_empty() {
            publisher.publish_all(entries).await?;
        }
        Ok(())
    }

    /// Counts what a message appended (`message_id`: its changelog entry is confirmed); every
    /// `snapshot_every` changes, appends a snapshot of the partition's sessions, so that a
    /// changelog cut by retention still starts whole.
    ///
    /// # Errors
    /// The snapshot could not be read or appended (the next change tries again).
    pub(crate) async fn appended(
        &self,
        publisher: &Publisher,
        partition: Partition,
        message_id: Option<&str>,
        changes: u64,
        proposals: u64,
    ) -> Result<(), ClusterError> {
        self.count_proposed(proposals);
        let state = &self.partitions[usize::from(partition.index)];
        if let Some(id) = message_id.filter(|_| changes > 0) {
            self.confirmed(partition, id);
        }
        let since = state.since_snapshot.fetch_add(changes, Ordering::AcqRel) + changes;
        if changes == 0 || since < self.config.snapshot_every {
            return Ok(());
        }
        state.since_snapshot.store(0, Ordering::Release);
        let entry = changelog::Entry::Change(self.snapshot(partition)?);
        publisher.publish_all(vec![self.changelog_entry(partition, &entry)]).await?;
        Ok(())
    }

    /// The partition's sessions as the store holds them now. The store holds turns of
    /// messages whose own entries are still on their way (a window commits all its messages
    /// first): their ledger entries go with the snapshot, read in the same pause of commits.
    ///
    /// # Errors
    /// The store could not be read.
    fn snapshot(&self, partition: Partition) -> Result<PartitionChange, StoreError> {
        let _quiet = self.commits.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sessions = self.store.partition_sessions(partition)?;
        let unappended = self.state(partition).unappended.lock().expect("unappended");
        let pending = unappended.iter().map(|(id, state)| (id.clone(), state.clone())).collect();
        Ok(PartitionChange::Snapshot { sessions, pending })
    }

    /// Notes that the lock follower applied an entry of the lock stream this instance proposed.
    pub(crate) fn followed_own(&self) {
        self.followed.fetch_add(1, Ordering::Relaxed);
        self.observe_lock_lag();
    }

    fn observe_lock_lag(&self) {
        let lag = self.proposed.load(Ordering::Relaxed).saturating_sub(self.followed.load(Ordering::Relaxed));
        crate::metrics::get().lock_follow_lag.set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// What `silpgate cluster status` shows: the members, which partitions this instance serves
    /// and waits on and how many channels that takes, what each replay took, and how far the
    /// local view has applied the streams.
    pub(crate) fn status(&self) -> serde_json::Value {
        let (members, subscribed) = {
            let view = self.view.lock().expect("view");
            (view.members.clone(), view.subscribed.clone())
        };
        let count = 1 + usize::from(self.config.standby);
        let partitions: Vec<serde_json::Value> = self
            .partitions
            .iter()
            .enumerate()
            .map(|(i, state)| {
                let index = i as u16;
                let owned = state.owned.load(Ordering::Acquire);
                // As the members rank it: an idle partition's owner shows before any delivery.
                let leaders = rendezvous::leaders(index, &members, count);
                let taken_over = state.since.load(Ordering::Relaxed);
                serde_json::json!({
                    "partition": index,
                    "queue": self.config.partition_queue(index),
                    "owner": leaders.first(),
                    "standbys": leaders.get(1..).unwrap_or_default(),
                    "owned": owned,
                    "taking_over": state.taking_over.load(Ordering::Acquire),
                    "subscribed": subscribed.contains(&index),
                    "since_ms": owned.then_some(taken_over),
                    "replayed_entries": owned.then(|| state.replayed.load(Ordering::Relaxed)),
                    "replay_ms": owned.then(|| state.replay_ms.load(Ordering::Relaxed)),
                    "changes_since_snapshot": owned.then(|| state.since_snapshot.load(Ordering::Relaxed)),
                    "last_takeover": (taken_over > 0).then(|| serde_json::json!({
                        "at_ms": taken_over,
                        "replay_ms": state.replay_ms.load(Ordering::Relaxed),
                        "replayed_entries": state.replayed.load(Ordering::Relaxed),
                    })),
                    "changelog_applied_offset": self.store.partition_offset(index).ok().flatten(),
                })
            })
            .collect();
        let owned: Vec<u16> = self.owned().iter().map(|p| p.index).collect();
        let standby: Vec<u16> = subscribed.iter().copied().filter(|p| !owned.contains(p)).collect();
        let taking_over: Vec<u16> = (0..self.config.partitions)
            .filter(|&i| self.state(self.partition(i)).taking_over.load(Ordering::Acquire))
            .collect();
        let lag = self.proposed.load(Ordering::Relaxed).saturating_sub(self.followed.load(Ordering::Relaxed));
        serde_json::json!({
            "instance": self.instance,
            "partitions_total": self.config.partitions,
            "owned": owned,
            "taking_over": taking_over,
            "standby": standby,
            "subscribed": subscribed,
            "channels": {
                "partitions": subscribed.len(),
                "changelog_followers": standby.len(),
                "total": subscribed.len() + standby.len() + FIXED_CHANNELS,
            },
            "members": members,
            "standby_per_partition": self.config.standby,
            "takeovers": self.takeovers.load(Ordering::Relaxed),
            "partitions": partitions,
            "lock": {
                "stream": self.config.lock_stream,
                "applied_offset": self.store.lock_offset().ok().flatten(),
                "records": self.store.lock_head().map(|h| h.records).ok(),
                "follow_lag": lag,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::store::{Changes, SessionRecord, Turn};

    fn session(turns: u64) -> SessionRecord {
        SessionRecord { turns, ..SessionRecord::begin("aa".into(), "conv", 10, 1, Some(0)) }
    }

    #[test]
    fn a_snapshot_carries_the_ledger_entries_of_turns_whose_own_entries_are_still_on_their_way() {
        let dir = std::env::temp_dir().join(format!("silpgate-cluster-snapshot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(SledStore::open(&dir, None).unwrap());
        let cluster =
            Cluster::new(ClusterConfig::default(), store.clone(), std::time::Duration::from_secs(1));
        let partition = cluster.partition(0);
        // Two messages of one window committed; neither entry is confirmed yet.
        for turns in [1, 2] {
            let id = format!("m-{turns}");
            let turn = Turn { id: "aa".into(), turn: turns, renewed: false };
            let state = LedgerState::Pending { turn: Some(turn), session: None };
            let commit = Changes { sessions: vec![session(turns)], ..Changes::default() };
            store.commit(&commit, 1).unwrap();
            let change = SessionChange { session: Some(session(turns)), message: Some((id, state)) };
            cluster.committed(&change);
        }
        let pending_ids = |change: PartitionChange| match change {
            PartitionChange::Snapshot { sessions, pending } => {
                assert_eq!(sessions.iter().map(|s| s.turns).collect::<Vec<_>>(), vec![2]);
                let mut ids: Vec<String> = pending.into_iter().map(|(id, _)| id).collect();
                ids.sort();
                ids
            }
            _ => panic!("a snapshot"),
        };
        assert_eq!(pending_ids(cluster.snapshot(partition).unwrap()), ["m-1", "m-2"]);
        // m-1's entry is confirmed: the snapshot no longer needs to carry it.
        cluster.confirmed(partition, "m-1");
        assert_eq!(pending_ids(cluster.snapshot(partition).unwrap()), ["m-2"]);
        cluster.release(partition);
        assert!(pending_ids(cluster.snapshot(partition).unwrap()).is_empty(), "forgotten with the partition");
        drop(cluster);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_instance_is_ready_only_once_no_hand_over_to_it_or_from_it_is_open() {
        let dir = std::env::temp_dir().join(format!("silpgate-cluster-readiness-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(SledStore::open(&dir, None).unwrap());
        let config = ClusterConfig { instance: Some("a".into()), ..ClusterConfig::default() };
        let cluster = Cluster::new(config, store.clone(), std::time::Duration::from_secs(1));
        let members = vec!["a".to_owned(), "b".to_owned()];
        let everything: Vec<u16> = (0..cluster.config.partitions).collect();
        let share = rendezvous::share(cluster.config.partitions, &members, cluster.config.standby, "a");
        let theirs = everything.iter().copied().find(|p| !share.owned.contains(p)).unwrap();
        let ours = share.owned[0];
        assert!(cluster.readiness().unwrap_err().contains("members are not known"));

        cluster.observe(members.clone(), &everything, Moves::default());
        assert_eq!(cluster.readiness(), Ok(()));

        let elsewhere = Moves { served_elsewhere: vec![ours, theirs], ..Moves::default() };
        cluster.observe(members.clone(), &everything, elsewhere);
        let why = cluster.readiness().unwrap_err();
        assert!(
            why.contains("still served by another member") && why.contains(&format!("[{ours}]")),
            "{why}"
        );

        let handing_on = Moves { handing_on: vec![theirs], ..Moves::default() };
        cluster.observe(members.clone(), &everything, handing_on);
        assert!(cluster.readiness().unwrap_err().contains("being handed on"));

        cluster.observe(members.clone(), &everything, Moves::default());
        cluster.serve(cluster.partition(theirs));
        assert!(cluster.readiness().unwrap_err().contains("to hand on to their owners"));
        cluster.release(cluster.partition(theirs));
        cluster.begin_takeover(cluster.partition(ours));
        assert!(cluster.readiness().unwrap_err().contains("being taken over"));
        cluster.serve(cluster.partition(ours));
        assert_eq!(cluster.readiness(), Ok(()));
        drop(cluster);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
