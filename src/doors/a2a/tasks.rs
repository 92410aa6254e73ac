//! The tasks the A2A door keeps: one for each request sent with `returnImmediately` (0.3:
//! `blocking: false`) or with a push notification config, answered at once with the task
//! still working (or, blocking, once it has ended), and finished when the answer comes; and
//! one for each `SendStreamingMessage` the agent reports progress on, which its stream
//! follows. Streams follow a task live ([`TaskBook::watch`]): the task as it stands, then each
//! change's events in the order of the changes, until it ends. A task
//! is seen only by the client that made it (another gets TaskNotFound, which reveals nothing),
//! kept in the store (its own tree: [`KeptRecords`]) so that it outlives a restart, and
//! bounded: `a2a.max_tasks` at most, each forgotten `a2a.task_ttl_secs` after it last changed.
//!
//! A task still working when silpgate stops cannot finish any more (the request that would
//! finish it is gone): it is failed as silpgate stops ([`TaskBook::interrupt`]), which gives
//! the work on it up and so cancels the agent's own task, and one a crash left working is
//! failed at the next start; either way it says so.
//!
//! Each change of a task with push notification configs makes a notification per config
//! ([`super::push`]), written into the task's record with the change, in the same write: the
//! record is the outbox. The courier ([`super::courier`]) puts them on the broker and then
//! trims them from the record ([`TaskBook::queued`]); what a crash left in a record goes out
//! again after the restart.
//!
//! Task ids are unguessable (128 random bits): an id is not a permission, but guessing one
//! should not even tell that a task exists.

use super::failure::Failure;
use super::push::{Notification, PushConfig};
use crate::a2a::map::TaskState;
use crate::store::KeptRecords;
use crate::util::time::now_millis as now_ms;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// One kept task, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    /// The client that made it (its client key).
    owner: String,
    /// The A2A 1.0 task.
    task: Value,
    /// When it last changed, in milliseconds since the Unix epoch.
    updated: u64,
    /// Its push notification configs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    push: Vec<PushConfig>,
    /// Notifications not yet on the broker, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    outbox: Vec<Notification>,
    /// Notifications made so far: the next one's sequence number.
    #[serde(default)]
    sent: u64,
    /// The streams following it live (a `SendStreamingMessage`, `SubscribeToTask`): each
    /// change's events go to them in order, and they close when it ends.
    #[serde(skip)]
    watchers: Vec<UnboundedSender<Value>>,
}

/// The kept tasks.
pub(crate) struct TaskBook {
    kept: Mutex<HashMap<String, Kept>>,
    records: Option<KeptRecords>,
    /// A reload may change them ([`TaskBook::set_bounds`]).
    bounds: std::sync::RwLock<Bounds>,
    /// Bumped on every change, so that a `SubscribeToTask` wakes to look again.
    changes: tokio::sync::watch::Sender<u64>,
    /// Where notifications go once written: the courier. None: push notifications are not
    /// offered.
    courier: Option<UnboundedSender<Notification>>,
    /// Where webhooks may be (`a2a.push_origins`); a reload may change them.
    push_origins: std::sync::RwLock<Vec<String>>,
    /// The works on tasks under way ([`TaskBook::working`]), which a stop waits for.
    works: tokio::sync::watch::Sender<usize>,
}

/// How many tasks the book keeps, and for how long.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    max: usize,
    max_per_client: usize,
    ttl_ms: u64,
    max_push: usize,
}

impl Bounds {
    fn of(config: &crate::config::A2aConfig) -> Bounds {
        Bounds {
            max: config.max_tasks.max(1),
            max_per_client: config.max_tasks_per_client.max(1),
            ttl_ms: config.task_ttl_secs.saturating_mul(1000),
            max_push: config.max_push_configs.max(1),
        }
    }
}

/// One work on a task under way, counted until dropped.
pub(super) struct Working<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

const INTERRUPTED: &str = "silpgate stopped before the agent answered; send the message again";

impl TaskBook {
    /// The tasks kept in `records` (none without a store), those still working marked
    /// failed, those expired forgotten. Notifications go to `courier` when given; those a
    /// record still holds go again now.
    pub(crate) fn load(
        records: Option<KeptRecords>,
        config: &crate::config::A2aConfig,
        courier: Option<UnboundedSender<Notification>>,
    ) -> Result<TaskBook, crate::gateway::store::StoreError> {
        let book = TaskBook {
            kept: Mutex::default(),
            records,
            bounds: std::sync::RwLock::new(Bounds::of(config)),
            changes: tokio::sync::watch::Sender::new(0),
            courier,
            push_origins: std::sync::RwLock::new(config.push_origins.clone()),
            works: tokio::sync::watch::Sender::new(0),
        };
        let stored = book.records.as_ref().map(KeptRecords::all).transpose()?.unwrap_or_default();
        let now = now_ms();
        let mut tasks = book.lock();
        for (id, bytes) in stored {
            let Ok(mut kept) = serde_json::from_slice::<Kept>(&bytes) else {
                tracing::warn!(task = %id, "a kept A2A task cannot be read; forgetting it");
                book.forget(&id);
                continue;
            };
            if now.saturating_sub(kept.updated) > book.bounds().ttl_ms {
                book.forget(&id);
                continue;
            }
            let waiting = std::mem::take(&mut kept.outbox);
            book.send(waiting.iter().cloned());
            kept.outbox = waiting;
            if TaskState::of(&kept.task) == TaskState::Pending {
                let events = interrupted(&id, &mut kept);
                book.record(&id, &mut kept, events);
            }
            tasks.insert(id, kept);
        }
        drop(tasks);
        Ok(book)
    }

    fn bounds(&self) -> Bounds {
        *self.bounds.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// New bounds (`a2a.max_tasks`, `max_tasks_per_client`, `task_ttl_secs`,
    /// `max_push_configs`) and webhook origins (`a2a.push_origins`), from the next request
    /// and the next notification on: a reload. Tasks kept past a lowered bound are forgotten
    /// as room is next made, the oldest finished first; a notification whose webhook is no
    /// longer at an allowed origin is dropped when its turn comes, with a warning.
    pub(crate) fn set_bounds(&self, config: &crate::config::A2aConfig) {
        *self.bounds.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Bounds::of(config);
        config
            .push_origins
            .clone_into(&mut self.push_origins.write().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// Whether a webhook at `url` is at one of the allowed origins now.
    pub(super) fn allows_webhook(&self, url: &reqwest::Url) -> bool {
        super::push::at_allowed_origin(
            url,
            &self.push_origins.read().unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// True when push notification configs are taken.
    pub(crate) fn pushes(&self) -> bool {
        self.courier.is_some()
    }

    /// `config` (A2A 1.0's shape) checked as a push notification config of this door.
    pub(super) fn push_config(&self, config: &Value) -> Result<PushConfig, Failure> {
        if !self.pushes() {
            return Err(Failure::PushNotSupported);
        }
        PushConfig::read(config, &self.push_origins.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A new task for `owner`, working on `message` (the client's 1.0 message), notifying
    /// `push` of its changes when given, and followed by `watcher` when given (from its
    /// opening `{"task"}` event on).
    pub(super) fn open(
        &self,
        owner: &str,
        message: &Value,
        push: Option<PushConfig>,
        watcher: Option<UnboundedSender<Value>>,
    ) -> Result<Value, Failure> {
        let id = format!("task-{}", crate::util::token::unguessable());
        // A2A's task events always name a context: the client's, or one of the task's own.
        let context = match message.get("contextId").and_then(Value::as_str).filter(|c| !c.is_empty()) {
            Some(context) => context.to_owned(),
            None => format!("context-{}", crate::util::token::unguessable()),
        };
        let task = json!({"id": id, "contextId": context, "status": status("TASK_STATE_WORKING", None),
            "history": [message]});
        let mut kept = Kept {
            owner: owner.to_owned(),
            task: task.clone(),
            updated: now_ms(),
            push: push.into_iter().map(|config| config.of_task(&id)).collect(),
            outbox: Vec::new(),
            sent: 0,
            watchers: watcher.into_iter().collect(),
        };
        let mut tasks = self.lock();
        self.make_room(&mut tasks, owner)?;
        self.record(&id, &mut kept, vec![json!({"task": task})]);
        tasks.insert(id, kept);
        Ok(task)
    }

    /// Whether `owner` may open a task now (see [`TaskBook::make_room`]).
    pub(super) fn room_for(&self, owner: &str) -> Result<(), Failure> {
        self.make_room(&mut self.lock(), owner)
    }

    /// Forgets expired tasks, then, at the bound, the oldest finished one. `owner` may not
    /// have more than its share still working.
    fn make_room(&self, tasks: &mut HashMap<String, Kept>, owner: &str) -> Result<(), Failure> {
        let now = now_ms();
        let bounds = self.bounds();
        let expired: Vec<String> = tasks
            .iter()
            .filter(|(_, k)| now.saturating_sub(k.updated) > bounds.ttl_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tasks.remove(&id);
            self.forget(&id);
        }
        let working = |k: &&Kept| TaskState::of(&k.task) == TaskState::Pending;
        if tasks.values().filter(working).filter(|k| k.owner == owner).count() >= bounds.max_per_client {
            return Err(Failure::TooManyTasksOfClient(bounds.max_per_client));
        }
        if tasks.len() < bounds.max {
            return Ok(());
        }
        let oldest_finished = tasks
            .iter()
            .filter(|(_, k)| TaskState::of(&k.task) != TaskState::Pending)
            .min_by_key(|(_, k)| k.updated)
            .map(|(id, _)| id.clone());
        let id = oldest_finished.ok_or(Failure::TooManyTasks(bounds.max))?;
        tasks.remove(&id);
        self.forget(&id);
        Ok(())
    }

    /// Changes task `id` (of `owner`, when given) as `edit` says, and records the change
    /// with the events it returns (`StreamResponse` values) for the push configs: the task as
    /// it now stands.
    fn change(
        &self,
        id: &str,
        owner: Option<&str>,
        edit: impl FnOnce(&mut Kept) -> Result<Vec<Value>, Failure>,
    ) -> Result<Value, Failure> {
        let mut tasks = self.lock();
        let kept =
            tasks.get_mut(id).filter(|k| owner.is_none_or(|o| k.owner == o)).ok_or_else(|| not_found(id))?;
        let events = edit(kept)?;
        kept.updated = now_ms();
        self.record(id, kept, events);
        Ok(kept.task.clone())
    }

    /// Writes `kept` with a notification of each of `events` for each of its push configs,
    /// then hands those to the courier. Called with the tasks locked, so that one task's
    /// notifications reach the courier in the order of its changes.
    fn record(&self, id: &str, kept: &mut Kept, events: Vec<Value>) {
        let mut fresh = Vec::new();
        if self.pushes() && !events.is_empty() {
            for config in &kept.push {
                let payloads = match config.v0_3 {
                    true => vec![crate::a2a::v0_3::task_to(&kept.task)],
                    false => events.clone(),
                };
                for payload in payloads {
                    fresh.push(config.notification(id, kept.sent, payload));
                    kept.sent += 1;
                }
            }
        }
        kept.outbox.extend(fresh.iter().cloned());
        self.store(id, kept);
        self.send(fresh);
        for event in &events {
            kept.watchers.retain(|watcher| watcher.send(event.clone()).is_ok());
        }
        if TaskState::of(&kept.task) != TaskState::Pending {
            kept.watchers.clear();
        }
    }

    fn send(&self, notifications: impl IntoIterator<Item = Notification>) {
        if let Some(courier) = &self.courier {
            for notification in notifications {
                // Only a courier that has stopped drops them; they stay in the record.
                let _ = courier.send(notification);
            }
        }
    }

    /// The broker has `notifications` of task `id`: they leave its record.
    pub(crate) fn queued(&self, id: &str, notifications: &[String]) {
        let mut tasks = self.lock();
        let Some(kept) = tasks.get_mut(id) else { return };
        let before = kept.outbox.len();
        kept.outbox.retain(|n| !notifications.contains(&n.id));
        if kept.outbox.len() != before {
            self.store(id, kept);
        }
    }

    /// An interim report of the agent's on task `id`: its status message while it works.
    pub(super) fn report(&self, id: &str, message: Value) {
        let _ = self.change(id, None, |kept| {
            if TaskState::of(&kept.task) != TaskState::Pending {
                return Err(not_found(id));
            }
            let mut working = status("TASK_STATE_WORKING", None);
            working["message"] = message;
            kept.task["status"] = working.clone();
            Ok(vec![status_event(id, &kept.task, working)])
        });
    }

    /// Finishes a task with the door's answer (`{"message"}` or `{"task"}`). A task canceled
    /// meanwhile stays canceled.
    pub(super) fn finish(&self, id: &str, answer: &Value) {
        let _ = self.change(id, None, |kept| {
            if TaskState::of(&kept.task) != TaskState::Pending {
                return Err(not_found(id));
            }
            let task = &mut kept.task;
            let mut events = Vec::new();
            if let Some(message) = answer.get("message") {
                let parts = message.get("parts").cloned().unwrap_or_else(|| json!([]));
                let artifact = json!({"artifactId": "answer", "parts": parts});
                task["artifacts"] = json!([artifact]);
                task["status"] = status("TASK_STATE_COMPLETED", None);
                push_history(task, message.clone());
                events.push(json!({"artifactUpdate": {"taskId": id, "contextId": task.get("contextId"),
                    "artifact": artifact}}));
            } else if let Some(ended) = answer.pointer("/task/status") {
                task["status"] = ended.clone();
                if let Some(said) = ended.get("message") {
                    push_history(task, said.clone());
                }
            }
            events.push(status_event(id, task, task["status"].clone()));
            Ok(events)
        });
    }

    /// `owner`'s task `id`, with at most `history_length` messages of its history.
    pub(super) fn get(&self, owner: &str, id: &str, history_length: Option<usize>) -> Result<Value, Failure> {
        let tasks = self.lock();
        let kept = tasks
            .get(id)
            .filter(|k| k.owner == owner && now_ms().saturating_sub(k.updated) <= self.bounds().ttl_ms)
            .ok_or_else(|| not_found(id))?;
        let mut task = kept.task.clone();
        if let (Some(keep), Some(history)) =
            (history_length, task.get_mut("history").and_then(Value::as_array_mut))
        {
            let drop = history.len().saturating_sub(keep);
            history.drain(..drop);
        }
        Ok(task)
    }

    /// A page of `owner`'s tasks, the latest changed first, of one context when `context` is
    /// given: `page_size` of them from where `page_token` (a page's `nextPageToken`) left off.
    /// The token names the last task of its page, so a page follows the one before it however
    /// tasks come and go meanwhile; `nextPageToken` is empty on the last page.
    ///
    /// # Errors
    /// A token no page gave.
    pub(super) fn list(
        &self,
        owner: &str,
        context: Option<&str>,
        page_size: usize,
        page_token: &str,
    ) -> Result<Value, Failure> {
        let after = match page_token {
            "" => None,
            token => Some(PageMark::read(token).ok_or_else(|| {
                Failure::InvalidParams(format!("pageToken {token:?} is not a nextPageToken of ListTasks"))
            })?),
        };
        let tasks = self.lock();
        let ttl = self.bounds().ttl_ms;
        let mut mine: Vec<(&String, &Kept)> = tasks
            .iter()
            .filter(|(_, k)| k.owner == owner && now_ms().saturating_sub(k.updated) <= ttl)
            .filter(|(_, k)| {
                context.is_none_or(|c| k.task.get("contextId").and_then(Value::as_str) == Some(c))
            })
            .collect();
        let order = |(id, kept): &(&String, &Kept)| PageMark { updated: kept.updated, id: (*id).clone() };
        mine.sort_by_key(|entry| std::cmp::Reverse(order(entry)));
        let total = mine.len();
        let rest: Vec<_> =
            mine.into_iter().filter(|entry| after.as_ref().is_none_or(|mark| order(entry) < *mark)).collect();
        let size = page_size.max(1);
        let next = if rest.len() > size { order(&rest[size - 1]).write() } else { String::new() };
        let page: Vec<Value> = rest.into_iter().take(size).map(|(_, k)| k.task.clone()).collect();
        Ok(json!({"tasks": page, "nextPageToken": next, "pageSize": size, "totalSize": total}))
    }

    /// Cancels `owner`'s task `id`, unless it has ended (one waiting for an answer to its
    /// question has not).
    pub(super) fn cancel(&self, owner: &str, id: &str) -> Result<Value, Failure> {
        self.change(id, Some(owner), |kept| {
            let state = TaskState::of(&kept.task);
            if state != TaskState::Pending && state.question().is_none() {
                return Err(Failure::TaskNotCancelable(format!(
                    "task {id} has ended; it cannot be canceled"
                )));
            }
            let canceled = status("TASK_STATE_CANCELED", None);
            kept.task["status"] = canceled.clone();
            Ok(vec![status_event(id, &kept.task, canceled)])
        })
    }

    /// Adds (or, with an id it has, replaces) a push notification config of `owner`'s task
    /// `id`: the config as A2A shows it.
    pub(super) fn set_push(&self, owner: &str, id: &str, config: PushConfig) -> Result<Value, Failure> {
        let shown = config.to_a2a(id);
        let max = self.bounds().max_push;
        self.change(id, Some(owner), |kept| {
            kept.push.retain(|c| c.id != config.id);
            if kept.push.len() >= max {
                return Err(Failure::InvalidParams(format!(
                    "task {id} has {max} push notification configs, the most it may have (a2a.max_push_configs)"
                )));
            }
            kept.push.push(config);
            Ok(Vec::new())
        })?;
        Ok(shown)
    }

    /// `owner`'s task `id`'s push notification configs, as A2A shows them.
    pub(super) fn push_configs(&self, owner: &str, id: &str) -> Result<Vec<Value>, Failure> {
        let tasks = self.lock();
        let kept = tasks.get(id).filter(|k| k.owner == owner).ok_or_else(|| not_found(id))?;
        Ok(kept.push.iter().map(|c| c.to_a2a(id)).collect())
    }

    /// Deletes push notification config `config` of `owner`'s task `id`. Its notifications
    /// already on the broker are still delivered.
    pub(super) fn delete_push(&self, owner: &str, id: &str, config: &str) -> Result<(), Failure> {
        self.change(id, Some(owner), |kept| {
            let before = kept.push.len();
            kept.push.retain(|c| c.id != config);
            if kept.push.len() == before {
                return Err(Failure::TaskNotFound(format!(
                    "task {id} has no push notification config {config}"
                )));
            }
            Ok(Vec::new())
        })
        .map(drop)
    }

    /// `message` (a client's 1.0 message) as the answer to the question `owner`'s task `id`
    /// asks: in the task's context. Refused when the task asks nothing, or the message names
    /// another context.
    pub(super) fn answering(&self, owner: &str, id: &str, message: &Value) -> Result<Value, Failure> {
        let task = self.get(owner, id, Some(0))?;
        let state = TaskState::of(&task);
        if state.question().is_none() {
            let why = match state {
                TaskState::Pending => "is still working; wait for it, or cancel it",
                _ => "has ended; send the message without taskId to begin another",
            };
            return Err(Failure::InvalidParams(format!("task {id} {why}")));
        }
        let context = task.get("contextId").cloned().unwrap_or(Value::Null);
        let mut message = message.clone();
        match message.get("contextId").filter(|c| !c.is_null() && c.as_str() != Some("")) {
            Some(named) if *named != context => Err(Failure::InvalidParams(format!(
                "params.message.contextId is not the context of task {id} ({context})"
            ))),
            _ => {
                message["contextId"] = context;
                Ok(message)
            }
        }
    }

    /// `owner`'s task `id`, which asked a question, working again on `message` (its answer),
    /// with `push` added to its configs and `watcher` following it, when given.
    pub(super) fn resume(
        &self,
        owner: &str,
        id: &str,
        message: &Value,
        push: Option<PushConfig>,
        watcher: Option<UnboundedSender<Value>>,
    ) -> Result<(), Failure> {
        self.change(id, Some(owner), |kept| {
            if TaskState::of(&kept.task).question().is_none() {
                return Err(Failure::InvalidParams(format!("task {id} asks no question")));
            }
            kept.task["status"] = status("TASK_STATE_WORKING", None);
            push_history(&mut kept.task, message.clone());
            if let Some(config) = push {
                kept.push.retain(|c| c.id != config.id);
                kept.push.push(config.of_task(id));
            }
            kept.watchers.extend(watcher);
            Ok(vec![json!({"task": kept.task})])
        })
        .map(drop)
    }

    /// `owner`'s task `id` followed live: the task as it stands (`{"task"}`), then the events
    /// of each later change, in order; the stream ends with the task (at once when it has
    /// ended already).
    pub(super) fn watch(&self, owner: &str, id: &str) -> Result<UnboundedReceiver<Value>, Failure> {
        let mut tasks = self.lock();
        let kept = tasks
            .get_mut(id)
            .filter(|k| k.owner == owner && now_ms().saturating_sub(k.updated) <= self.bounds().ttl_ms)
            .ok_or_else(|| not_found(id))?;
        let (watcher, stream) = tokio::sync::mpsc::unbounded_channel();
        let _ = watcher.send(json!({"task": kept.task}));
        if TaskState::of(&kept.task) == TaskState::Pending {
            kept.watchers.push(watcher);
        }
        Ok(stream)
    }

    /// Counts a work on a task as under way, until the guard is dropped.
    pub(super) fn working(&self) -> Working<'_> {
        self.works.send_modify(|n| *n += 1);
        Working(&self.works)
    }

    /// Returns once task `id` has ended while its work was under way (canceled, or failed by
    /// a stop), or was forgotten: the work is then given up.
    pub(super) async fn given_up(&self, id: &str) {
        let mut changes = self.changes.subscribe();
        loop {
            let working = self.lock().get(id).is_some_and(|k| TaskState::of(&k.task) == TaskState::Pending);
            if !working {
                return;
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Fails every task still working, as silpgate stops (their works give up, and cancel
    /// what their agents work on), then waits at most `limit` for those works to end.
    pub(crate) async fn interrupt(&self, limit: std::time::Duration) {
        let working: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, k)| TaskState::of(&k.task) == TaskState::Pending)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &working {
            let _ = self.change(id, None, |kept| {
                if TaskState::of(&kept.task) != TaskState::Pending {
                    return Err(not_found(id));
                }
                Ok(interrupted(id, kept))
            });
        }
        let mut works = self.works.subscribe();
        if tokio::time::timeout(limit, works.wait_for(|n| *n == 0)).await.is_err() {
            tracing::warn!(
                tasks = working.len(),
                "Works on A2A tasks did not end in time as silpgate stopped."
            );
        }
    }

    /// `owner`'s task `id` once it has ended, or as it stands at `deadline`.
    pub(super) async fn ended(
        &self,
        owner: &str,
        id: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Value, Failure> {
        let mut changes = self.changes.subscribe();
        loop {
            let task = self.get(owner, id, None)?;
            if TaskState::of(&task) != TaskState::Pending {
                return Ok(task);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return Ok(task),
            }
        }
    }

    /// Writes a task through to the store, and wakes those waiting on tasks. A store that
    /// fails is logged: the task stays correct in memory, and only a restart would lose it.
    fn store(&self, id: &str, kept: &Kept) {
        if let Some(records) = &self.records {
            let bytes = serde_json::to_vec(kept).expect("a task is JSON");
            if let Err(e) = records.put(id, &bytes) {
                tracing::error!(task = %id, error = %e, "an A2A task could not be stored");
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }

    fn forget(&self, id: &str) {
        if let Some(records) = &self.records
            && let Err(e) = records.remove(id)
        {
            tracing::warn!(task = %id, error = %e, "a forgotten A2A task could not be removed from the store");
        }
    }
}

/// Fails working task `id`, which a stop cut short; the events of that change.
fn interrupted(id: &str, kept: &mut Kept) -> Vec<Value> {
    let failed = status("TASK_STATE_FAILED", Some(INTERRUPTED));
    kept.task["status"] = failed.clone();
    vec![status_event(id, &kept.task, failed)]
}

/// A `TaskStatusUpdateEvent` of task `id` (`task` gives its context).
fn status_event(id: &str, task: &Value, status: Value) -> Value {
    json!({"statusUpdate": {"taskId": id, "contextId": task.get("contextId"), "status": status}})
}

fn not_found(id: &str) -> Failure {
    Failure::TaskNotFound(format!("no task {id} of this client"))
}

fn status(state: &str, said: Option<&str>) -> Value {
    let mut status = json!({"state": state, "timestamp": timestamp()});
    if let Some(said) = said {
        status["message"] = json!({"messageId": format!("status-{}", crate::util::token::unguessable()),
            "role": crate::a2a::map::ROLE_AGENT, "parts": [{"text": said}]});
    }
    status
}

fn push_history(task: &mut Value, message: Value) {
    match task.get_mut("history").and_then(Value::as_array_mut) {
        Some(history) => history.push(message),
        None => task["history"] = json!([message]),
    }
}

/// Now, as A2A's timestamps are written (RFC 3339, UTC).
fn timestamp() -> String {
    crate::util::time::iso8601(now_ms())
}

/// Where a page of `ListTasks` ends: its last task, in the list's order (latest change
/// first, then by id). Written into `nextPageToken` as `<updated>.<id>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PageMark {
    updated: u64,
    id: String,
}

impl PageMark {
    fn write(&self) -> String {
        format!("{}.{}", self.updated, self.id)
    }

    fn read(token: &str) -> Option<PageMark> {
        let (updated, id) = token.split_once('.')?;
        Some(PageMark { updated: updated.parse().ok()?, id: id.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::A2aConfig;

    fn book(max_tasks: usize) -> TaskBook {
        TaskBook::load(None, &A2aConfig { max_tasks, task_ttl_secs: 3600, ..A2aConfig::default() }, None)
            .unwrap()
    }

    fn message(context: &str) -> Value {
        json!({"messageId": "m", "role": "ROLE_USER", "contextId": context, "parts": [{"text": "hi"}]})
    }

    #[test]
    fn a_task_works_then_ends_with_the_answer_and_only_its_owner_sees_it() {
        let tasks = book(10);
        let task = tasks.open("alice", &message("c1"), None, None).unwrap();
        let id = task["id"].as_str().unwrap();
        assert_eq!(task["status"]["state"], "TASK_STATE_WORKING");
        assert_eq!(tasks.get("bob", id, None).unwrap_err().jsonrpc_code(), -32001);
        tasks.finish(id, &json!({"message": {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}}));
        let done = tasks.get("alice", id, None).unwrap();
        assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(done["artifacts"][0]["parts"][0]["text"], "done");
        assert_eq!(done["history"].as_array().unwrap().len(), 2);
        assert_eq!(tasks.get("alice", id, Some(1)).unwrap()["history"].as_array().unwrap().len(), 1);
        assert_eq!(tasks.cancel("alice", id).unwrap_err().jsonrpc_code(), -32002);
        assert_eq!(tasks.list("alice", Some("c1"), 50, "").unwrap()["totalSize"], 1);
        assert_eq!(tasks.list("alice", Some("c2"), 50, "").unwrap()["totalSize"], 0);
        assert_eq!(tasks.list("bob", None, 50, "").unwrap()["totalSize"], 0);
    }

    #[test]
    fn a_task_is_forgotten_once_its_ttl_has_passed_since_it_last_changed_and_makes_room() {
        let tasks =
            TaskBook::load(None, &A2aConfig { max_tasks: 1, task_ttl_secs: 0, ..A2aConfig::default() }, None)
                .unwrap();
        let first = tasks.open("alice", &message("c1"), None, None).unwrap();
        let id = first["id"].as_str().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(tasks.get("alice", id, None).unwrap_err().jsonrpc_code(), -32001, "expired");
        assert_eq!(tasks.list("alice", None, 50, "").unwrap()["totalSize"], 0, "not listed once expired");
        // Still working, but expired: it no longer holds the one place there is.
        let second = tasks.open("alice", &message("c1"), None, None);
        assert!(second.is_ok(), "{second:?}");
    }

    #[test]
    fn pages_of_tasks_follow_one_another_to_the_last_whatever_changes_meanwhile() {
        let tasks = book(100);
        let ids: Vec<String> = (0..7)
            .map(|_| {
                tasks.open("alice", &message("c1"), None, None).unwrap()["id"].as_str().unwrap().to_owned()
            })
            .collect();
        tasks.open("bob", &message("c1"), None, None).unwrap();
        let mut seen = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let page = tasks.list("alice", None, 3, &token).unwrap();
            assert_eq!(page["totalSize"], 7, "{page}");
            seen.extend(
                page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()),
            );
            pages += 1;
            if pages == 1 {
                // A task changed after the first page was read moves to the top, not into a
                // later page a second time.
                tasks.finish(
                    &seen[2],
                    &json!({"message": {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}}),
                );
            }
            token = page["nextPageToken"].as_str().unwrap().to_owned();
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(pages, 3, "3 + 3 + 1");
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!((seen.len(), sorted), (7, expected), "every task once: {seen:?}");
        let refused = tasks.list("alice", None, 3, "not-a-token").unwrap_err();
        assert_eq!(refused.jsonrpc_code(), -32602, "{refused:?}");
    }

    /// A reload's origins hold from the next push notification config and the next
    /// notification on; the old ones no longer do.
    #[test]
    fn a_reload_moves_where_webhooks_may_be() {
        let (book, _taken) = pushed_book(None);
        let at = |url: &str| json!({ "url": url });
        assert!(book.push_config(&at("https://hooks.example.com/a")).is_ok());
        assert!(book.push_config(&at("https://elsewhere.example.com/a")).is_err());
        let moved =
            A2aConfig { push_origins: vec!["https://elsewhere.example.com".into()], ..A2aConfig::default() };
        book.set_bounds(&moved);
        assert!(book.push_config(&at("https://elsewhere.example.com/a")).is_ok());
        let refused = book.push_config(&at("https://hooks.example.com/a")).unwrap_err();
        assert!(format!("{refused:?}").contains("a2a.push_origins"), "{refused:?}");
        let old = reqwest::Url::parse("https://hooks.example.com/a").unwrap();
        assert!(!book.allows_webhook(&old), "a notification queued for the old origin is not sent");
    }

    fn pushed_book(
        records: Option<KeptRecords>,
    ) -> (TaskBook, tokio::sync::mpsc::UnboundedReceiver<Notification>) {
        let config =
            A2aConfig { push_origins: vec!["https://hooks.example.com".into()], ..A2aConfig::default() };
        let (written, taken) = tokio::sync::mpsc::unbounded_channel();
        (TaskBook::load(records, &config, Some(written)).unwrap(), taken)
    }

    fn kinds(taken: &mut tokio::sync::mpsc::UnboundedReceiver<Notification>) -> Vec<String> {
        std::iter::from_fn(|| taken.try_recv().ok())
            .map(|n| {
                let (kind, body) = n.payload.as_object().unwrap().iter().next().unwrap();
                let state = body.pointer("/status/state").and_then(Value::as_str).unwrap_or_default();
                format!("{}#{} {kind} {state}", n.lane.rsplit('/').next().unwrap(), n.seq)
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn each_change_of_a_task_is_a_notification_per_config_in_order_kept_until_queued() {
        let (tasks, mut taken) = pushed_book(None);
        let hook = tasks.push_config(&json!({"id": "h", "url": "https://hooks.example.com/a"})).unwrap();
        let task = tasks.open("alice", &message("c1"), Some(hook), None).unwrap();
        let id = task["id"].as_str().unwrap();
        let second = tasks.push_config(&json!({"id": "g", "url": "https://hooks.example.com/b"})).unwrap();
        tasks.set_push("alice", id, second).unwrap();
        assert!(
            tasks
                .set_push(
                    "bob",
                    id,
                    tasks.push_config(&json!({"url": "https://hooks.example.com/"})).unwrap()
                )
                .is_err()
        );
        tasks.report(id, json!({"parts": [{"text": "halfway"}]}));
        tasks.finish(id, &json!({"message": {"parts": [{"text": "done"}]}}));
        tasks.report(id, json!({"parts": [{"text": "too late"}]}));
        assert_eq!(
            kinds(&mut taken),
            [
                "h#0 task TASK_STATE_WORKING",
                "h#1 statusUpdate TASK_STATE_WORKING",
                "g#2 statusUpdate TASK_STATE_WORKING",
                "h#3 artifactUpdate",
                "h#4 statusUpdate TASK_STATE_COMPLETED",
                "g#5 artifactUpdate",
                "g#6 statusUpdate TASK_STATE_COMPLETED",
            ]
        );
        let waiting =
            |tasks: &TaskBook| tasks.lock()[id].outbox.iter().map(|n| n.id.clone()).collect::<Vec<_>>();
        assert_eq!(waiting(&tasks).len(), 7, "the record holds them until the broker has them");
        let first_two: Vec<String> = waiting(&tasks)[..2].to_vec();
        tasks.queued(id, &first_two);
        assert_eq!(waiting(&tasks).len(), 5);
        tasks.delete_push("alice", id, "g").unwrap();
        assert_eq!(tasks.push_configs("alice", id).unwrap().len(), 1);
        assert!(tasks.delete_push("alice", id, "g").is_err());
    }

    #[test]
    fn what_a_record_still_holds_goes_out_again_after_a_restart_and_an_interrupted_task_says_so() {
        let dir = std::env::temp_dir().join(format!("silpgate-push-{}", crate::util::token::unguessable()));
        let store = crate::store::SledStore::open(&dir, None).unwrap();
        let (tasks, mut taken) = pushed_book(Some(store.kept("a2a_tasks").unwrap()));
        let hook = tasks.push_config(&json!({"id": "h", "url": "https://hooks.example.com/a"})).unwrap();
        let working = tasks.open("alice", &message("c1"), Some(hook.clone()), None).unwrap();
        let queued = tasks.open("alice", &message("c2"), Some(hook), None).unwrap();
        let queued_id = queued["id"].as_str().unwrap();
        let on_broker: Vec<String> = std::iter::from_fn(|| taken.try_recv().ok()).map(|n| n.id).collect();
        tasks.queued(queued_id, &on_broker);
        drop(tasks);
        let (tasks, mut taken) = pushed_book(Some(store.kept("a2a_tasks").unwrap()));
        let mut again = kinds(&mut taken);
        again.sort();
        // The first task's opening, never queued, goes again; both tasks, interrupted, fail.
        assert_eq!(
            again,
            [
                "h#0 task TASK_STATE_WORKING",
                "h#1 statusUpdate TASK_STATE_FAILED",
                "h#1 statusUpdate TASK_STATE_FAILED"
            ]
        );
        let working_id = working["id"].as_str().unwrap();
        assert_eq!(tasks.get("alice", working_id, None).unwrap()["status"]["state"], "TASK_STATE_FAILED");
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_canceled_task_stays_canceled_and_the_bound_forgets_the_oldest_finished() {
        let tasks = book(2);
        let first = tasks.open("a", &message("c"), None, None).unwrap();
        let first = first["id"].as_str().unwrap();
        assert_eq!(tasks.cancel("a", first).unwrap()["status"]["state"], "TASK_STATE_CANCELED");
        tasks.finish(first, &json!({"message": {"parts": []}}));
        assert_eq!(tasks.get("a", first, None).unwrap()["status"]["state"], "TASK_STATE_CANCELED");
        let second = tasks.open("a", &message("c"), None, None).unwrap();
        // Full: the finished (canceled) one makes room; then every kept task is working.
        tasks.open("a", &message("c"), None, None).unwrap();
        assert!(tasks.get("a", first, None).is_err());
        assert!(tasks.get("a", second["id"].as_str().unwrap(), None).is_ok());
        assert_eq!(tasks.open("a", &message("c"), None, None).unwrap_err(), Failure::TooManyTasks(2));
    }

    /// Two streams following a task see the task as it stood when each began, then every
    /// later change in the same order, and end with it; one that began after the end gets
    /// the ended task alone. Another client cannot follow it.
    #[tokio::test]
    async fn watchers_follow_a_task_live_in_the_order_of_its_changes_and_end_with_it() {
        let tasks = book(10);
        let (opened, mut first) = tokio::sync::mpsc::unbounded_channel();
        let task = tasks.open("alice", &message("c1"), None, Some(opened)).unwrap();
        let id = task["id"].as_str().unwrap();
        tasks.report(id, json!({"parts": [{"text": "one"}]}));
        let mut second = tasks.watch("alice", id).unwrap();
        assert_eq!(tasks.watch("bob", id).unwrap_err().jsonrpc_code(), -32001);
        tasks.report(id, json!({"parts": [{"text": "two"}]}));
        tasks.finish(id, &json!({"message": {"parts": [{"text": "done"}]}}));
        let drain = |stream: &mut UnboundedReceiver<Value>| {
            let mut seen = Vec::new();
            while let Ok(event) = stream.try_recv() {
                let (kind, body) = event.as_object().unwrap().iter().next().unwrap();
                let said = body
                    .pointer("/status/message/parts/0/text")
                    .or(body.pointer("/artifact/parts/0/text"))
                    .or(body.pointer("/status/state"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                seen.push(format!("{kind} {said}"));
            }
            assert!(stream.is_closed(), "the stream ends with the task");
            seen
        };
        assert_eq!(
            drain(&mut first),
            [
                "task TASK_STATE_WORKING",
                "statusUpdate one",
                "statusUpdate two",
                "artifactUpdate done",
                "statusUpdate TASK_STATE_COMPLETED"
            ]
        );
        assert_eq!(
            drain(&mut second),
            ["task one", "statusUpdate two", "artifactUpdate done", "statusUpdate TASK_STATE_COMPLETED"]
        );
        let mut late = tasks.watch("alice", id).unwrap();
        assert_eq!(drain(&mut late), ["task TASK_STATE_COMPLETED"]);
    }

    /// A reload's new bounds apply from the next task on.
    #[test]
    fn new_bounds_apply_from_the_next_task_on() {
        let tasks = book(10);
        tasks.open("a", &message("c"), None, None).unwrap();
        tasks.set_bounds(&A2aConfig { max_tasks: 10, max_tasks_per_client: 1, ..A2aConfig::default() });
        assert_eq!(tasks.open("a", &message("c"), None, None).unwrap_err(), Failure::TooManyTasksOfClient(1));
        tasks.set_bounds(&A2aConfig { max_tasks: 10, max_tasks_per_client: 2, ..A2aConfig::default() });
        tasks.open("a", &message("c"), None, None).expect("room again");
    }

    /// One client's slow tasks fill its own share, not the book: another client still gets
    /// a task, and the first gets one again once one of its own ends.
    #[test]
    fn one_client_cannot_hold_every_slot() {
        let tasks = TaskBook::load(
            None,
            &A2aConfig { max_tasks: 4, max_tasks_per_client: 2, task_ttl_secs: 3600, ..A2aConfig::default() },
            None,
        )
        .unwrap();
        let first = tasks.open("greedy", &message("c"), None, None).unwrap();
        tasks.open("greedy", &message("c"), None, None).unwrap();
        let refused = tasks.open("greedy", &message("c"), None, None).unwrap_err();
        assert_eq!(refused, Failure::TooManyTasksOfClient(2));
        assert!(refused.message().contains("a2a.max_tasks_per_client"), "{}", refused.message());
        assert_eq!(refused.http_status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
        tasks.open("patient", &message("c"), None, None).expect("another client still gets a task");
        tasks.finish(first["id"].as_str().unwrap(), &json!({"message": {"parts": []}}));
        tasks.open("greedy", &message("c"), None, None).expect("a share freed");
    }
}
