//! The A2A operations silpgate serves, whichever binding brings them; what they fail with is
//! [`Failure`], which each binding renders in its own way.

pub(super) use super::failure::Failure;
use crate::a2a::map;
use crate::doors::{Front, ToSender};
use crate::gateway::Transport;
use crate::nlip::{Content, Format, Message, Submessage};
use crate::principal::Principal;
use axum::http::HeaderMap;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

/// The task `params.id` names.
fn task_id(params: &Value) -> Result<&str, Failure> {
    params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::InvalidParams("params.id names no task".into()))
}

/// `GetTask` (`id`, `historyLength`).
pub(super) fn get_task(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    let history = params.get("historyLength").and_then(Value::as_u64).map(|n| n as usize);
    front.a2a_tasks.get(client, task_id(params)?, history)
}

/// `CancelTask` (`id`): the task, canceled. The work on it is given up, and an A2A agent is
/// told to cancel its own task for it.
pub(super) fn cancel_task(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    front.a2a_tasks.cancel(client, task_id(params)?)
}

/// `ListTasks` (`contextId`, `pageSize`: 50 by default, at most 100, `pageToken`).
pub(super) fn list_tasks(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    let context = params.get("contextId").and_then(Value::as_str);
    let size = params.get("pageSize").and_then(Value::as_u64).map_or(50, |n| n.clamp(1, 100) as usize);
    let token = params.get("pageToken").and_then(Value::as_str).unwrap_or_default();
    front.a2a_tasks.list(client, context, size, token)
}

/// `SubscribeToTask` (`id`): the task as it stands, at once, then each later change's events
/// as it happens, until the task ends.
pub(super) fn subscribe(front: &Front, client: &str, params: &Value) -> Result<Events, Failure> {
    front.a2a_tasks.watch(client, task_id(params)?)
}

/// A stream of A2A 1.0 `StreamResponse` values, as they come.
pub(super) type Events = tokio::sync::mpsc::UnboundedReceiver<Value>;

/// `CreateTaskPushNotificationConfig` (a `TaskPushNotificationConfig`: `taskId`, `id`,
/// `url`, `token`, `authentication`): the config as kept.
pub(super) fn create_push_config(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    let config = front.a2a_tasks.push_config(params)?;
    front.a2a_tasks.set_push(client, push_task_id(params)?, config)
}

/// `GetTaskPushNotificationConfig` (`taskId`, `id`).
pub(super) fn get_push_config(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    let (task, id) = push_config_id(front, params)?;
    let configs = front.a2a_tasks.push_configs(client, task)?;
    configs
        .into_iter()
        .find(|c| c["id"] == id)
        .ok_or_else(|| Failure::TaskNotFound(format!("task {task} has no push notification config {id}")))
}

/// `ListTaskPushNotificationConfigs` (`taskId`): every config, on one page.
pub(super) fn list_push_configs(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    if !front.a2a_tasks.pushes() {
        return Err(Failure::PushNotSupported);
    }
    let configs = front.a2a_tasks.push_configs(client, push_task_id(params)?)?;
    Ok(json!({"configs": configs, "nextPageToken": ""}))
}

/// `DeleteTaskPushNotificationConfig` (`taskId`, `id`): `{}`.
pub(super) fn delete_push_config(front: &Front, client: &str, params: &Value) -> Result<Value, Failure> {
    let (task, id) = push_config_id(front, params)?;
    front.a2a_tasks.delete_push(client, task, id)?;
    Ok(json!({}))
}

/// The task a push notification config request names (`taskId`).
fn push_task_id(params: &Value) -> Result<&str, Failure> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::InvalidParams("params.taskId names no task".into()))
}

/// The task and the config a request names (`taskId`, `id`), when push notifications are offered.
fn push_config_id<'a>(front: &Front, params: &'a Value) -> Result<(&'a str, &'a str), Failure> {
    if !front.a2a_tasks.pushes() {
        return Err(Failure::PushNotSupported);
    }
    let id = params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::InvalidParams("params.id names no push notification config".into()))?;
    Ok((push_task_id(params)?, id))
}

/// Who calls an operation: the client's key (its limits, quotas and kept tasks) and, when
/// clients authenticate, its principal.
pub(super) struct Caller<'a> {
    pub client: &'a str,
    pub principal: Option<&'a Principal>,
}

/// A message the door has taken: its envelope, the client's context, and who sent it.
pub(super) struct Taken {
    envelope: Message,
    context: Option<String>,
    principal: Option<Principal>,
}

/// Checks a `SendMessage`'s message (1.0's shape) and makes its envelope, which meets the
/// limits and the conversation quota of every door.
pub(super) fn take(front: &Front, caller: &Caller<'_>, message: Option<&Value>) -> Result<Taken, Failure> {
    let client = caller.client;
    let message = message.ok_or("SendMessage needs params.message")?;
    let parts =
        message.get("parts").and_then(Value::as_array).ok_or("params.message.parts must be an array")?;
    if parts.is_empty() {
        return Err("params.message.parts is empty".into());
    }
    let mut envelope =
        map::envelope(parts, "params.message.parts").map_err(|e| Failure::InvalidParams(e.to_string()))?;
    let context = message.get("contextId").and_then(Value::as_str).filter(|c| !c.is_empty());
    if let Some(context) = context {
        envelope.push(Submessage::new(Format::Token, "conversation", Content::text(context)));
    }
    if let Some(messagetype) = message.pointer("/metadata/nlip/messagetype").and_then(Value::as_str) {
        envelope.messagetype = Some(messagetype.to_owned());
    }
    // Built from A2A parts, it meets the limits /nlip decodes with: bytes, depth, values,
    // submessages, the conversation token's length.
    let encoding = crate::nlip::Encoding::Json;
    if let Err(e) = crate::nlip::decode(&crate::nlip::encode(&envelope, encoding), encoding, &front.limits) {
        return Err(Failure::InvalidParams(e.to_string()));
    }
    if let Err(limit) = front.conversations.admit(client, envelope.conversation_token(), Instant::now()) {
        return Err(Failure::TooManyConversations(limit));
    }
    Ok(Taken { envelope, context: context.map(str::to_owned), principal: caller.principal.cloned() })
}

/// One `SendMessage` (its 1.0 request: `message`, `configuration`): the result
/// (`{"message"}` or `{"task"}`), or why it is refused. With `returnImmediately`, the result
/// is a task, working, which the door keeps and the answer finishes ([`super::tasks`]). With
/// a push notification config, the door keeps the task too, so that its changes can be
/// pushed: the result is that task, once it has ended unless `returnImmediately` says not to
/// wait. A message naming a kept task (`taskId`) that asked for input or authentication
/// answers it: that task works again, and goes on at the agent ([`start_kept`]). A task
/// that asks is kept whichever way it began, so that it can be answered.
pub(super) async fn send_message(
    front: &Arc<Front>,
    headers: &HeaderMap,
    caller: &Caller<'_>,
    request: &Value,
) -> Result<Value, Failure> {
    let client = caller.client;
    let push = match request.pointer("/configuration/taskPushNotificationConfig").filter(|c| !c.is_null()) {
        Some(config) => Some(front.a2a_tasks.push_config(config)?),
        None => None,
    };
    let later = request.pointer("/configuration/returnImmediately").and_then(Value::as_bool).unwrap_or(false);
    if !later && push.is_none() && continued_task(request).is_none() {
        let message = request.get("message");
        let taken = take(front, caller, message)?;
        let result = deliver(front, taken, crate::telemetry::extract_http(headers), None).await;
        return Ok(keep_if_asking(front, client, message, result));
    }
    let id = start_kept(front, headers, caller, request, push, None)?;
    if later {
        return Ok(json!({"task": front.a2a_tasks.get(client, &id, None)?}));
    }
    let deadline = tokio::time::Instant::now() + reply_wait(front);
    Ok(json!({"task": front.a2a_tasks.ended(client, &id, deadline).await?}))
}

/// The kept task a request's message answers (`message.taskId`), if it names one.
fn continued_task(request: &Value) -> Option<&str> {
    request.pointer("/message/taskId").and_then(Value::as_str).filter(|id| !id.is_empty())
}

/// Opens a kept task for `request`, or takes up again the one its message answers, and sets
/// the work on it going; `watcher` follows it from the task as it stands. The task's id.
fn start_kept(
    front: &Arc<Front>,
    headers: &HeaderMap,
    caller: &Caller<'_>,
    request: &Value,
    push: Option<super::push::PushConfig>,
    watcher: Option<tokio::sync::mpsc::UnboundedSender<Value>>,
) -> Result<String, Failure> {
    let message = request.get("message").unwrap_or(&Value::Null);
    let (taken, id) = match continued_task(request) {
        Some(id) => {
            // The answer belongs to the task's conversation, whether or not it says so.
            let message = front.a2a_tasks.answering(caller.client, id, message)?;
            let taken = take(front, caller, Some(&message))?;
            front.a2a_tasks.resume(caller.client, id, &message, push, watcher)?;
            (taken, id.to_owned())
        }
        None => {
            let taken = take(front, caller, Some(message))?;
            let task = front.a2a_tasks.open(caller.client, message, push, watcher)?;
            (taken, task["id"].as_str().unwrap_or_default().to_owned())
        }
    };
    let parent = crate::telemetry::extract_http(headers);
    tokio::spawn(work_on(front.clone(), id.clone(), taken, parent));
    Ok(id)
}

/// `result` of a request the door did not keep a task for; when it is a task asking for
/// input or authentication, that task is kept (so that a message naming it can answer it),
/// and the result is the kept task.
fn keep_if_asking(front: &Front, client: &str, message: Option<&Value>, result: Value) -> Value {
    let Some(task) = result.get("task").filter(|t| map::TaskState::of(t).question().is_some()) else {
        return result;
    };
    let message = message.unwrap_or(&Value::Null);
    let opened = front.a2a_tasks.open(client, message, None, None);
    let Some(id) = opened.ok().and_then(|t| t["id"].as_str().map(str::to_owned)) else {
        // No room to keep it: the question still reaches the client.
        return result;
    };
    front.a2a_tasks.finish(&id, &json!({"task": task}));
    front.a2a_tasks.get(client, &id, None).map_or(result, |kept| json!({"task": kept}))
}

/// How long a blocking request waits for its task: the reply timeout, and a little more for
/// the answer to come back.
fn reply_wait(front: &Front) -> std::time::Duration {
    std::time::Duration::from_millis(front.core().gateway.config().gateway.reply_timeout_ms)
        + std::time::Duration::from_secs(5)
}

/// Works on kept task `id` (see [`follow`]).
async fn work_on(front: Arc<Front>, id: String, taken: Taken, parent: opentelemetry::Context) {
    // Counted until the delivery is dropped, after it: a stop waits for the agent to be told.
    let _working = front.a2a_tasks.working();
    let context = taken.context.clone();
    let (progress, reports) = tokio::sync::mpsc::unbounded_channel();
    let answer = deliver(&front, taken, parent, Some(progress));
    follow(&front, &id, context.as_deref(), answer, None, reports).await;
}

/// Follows the work on kept task `id` to its end: the agent's interim reports (`first`, when
/// one was read already, then `reports`) become the task's working status as they come, and
/// the answer ends it. A task canceled meanwhile (or
/// failed by a stop) is given up: the agent, when it works on an A2A task of its own for it,
/// is told to cancel that too.
async fn follow(
    front: &Front,
    id: &str,
    context: Option<&str>,
    answer: impl std::future::Future<Output = Value>,
    first: Option<Message>,
    mut reports: tokio::sync::mpsc::UnboundedReceiver<Message>,
) {
    tokio::pin!(answer);
    let report = |said: Message| {
        if says_only_begun(&said) {
            return;
        }
        let n = crate::util::token::unguessable();
        let mut message = map::message(&said, &format!("silpgate-m{n}"), map::ROLE_AGENT);
        set_context(&mut message, context);
        front.a2a_tasks.report(id, message);
    };
    if let Some(first) = first {
        report(first);
    }
    let given_up = front.a2a_tasks.given_up(id);
    tokio::pin!(given_up);
    let result = loop {
        tokio::select! {
            biased;
            Some(said) = reports.recv() => report(said),
            result = &mut answer => break result,
            () = &mut given_up => {
                // Closing the events first is what says the work was given up (and not just
                // dropped) to the delivery dropped next.
                drop(reports);
                return;
            }
        }
    };
    while let Ok(said) = reports.try_recv() {
        report(said);
    }
    front.a2a_tasks.finish(id, &result);
}

/// True for the empty interim event, which says only that the work has begun.
fn says_only_begun(said: &Message) -> bool {
    matches!(&said.content, Content::Json(Value::String(text)) if text.is_empty())
        && said.submessages().iter().all(|s| s.is_token())
}

/// One `SendStreamingMessage`: its events (1.0 `StreamResponse` values) as they come. Without
/// interim events, the one event is the result, as for `SendMessage`. When the agent reports
/// progress, the door opens a kept task at the first report, under the same bounds and
/// ownership as any, and the stream follows it ([`super::tasks::TaskBook::watch`]): the task,
/// working; a status update carrying each report; then the answer as the task's artifact and
/// its completion, or the error as its failed (or rejected) status. The work goes on when
/// the stream is dropped: the client finds the task with `GetTask`, follows it again with
/// `SubscribeToTask`, or cancels it.
pub(super) async fn send_streaming(
    front: &Arc<Front>,
    headers: &HeaderMap,
    caller: &Caller<'_>,
    request: &Value,
) -> Result<Events, Failure> {
    let (events, stream) = tokio::sync::mpsc::unbounded_channel();
    let returned_at_once =
        request.pointer("/configuration/returnImmediately").and_then(Value::as_bool) == Some(true);
    let pushed = request.pointer("/configuration/taskPushNotificationConfig").is_some_and(|c| !c.is_null());
    // A kept task answers as `SendMessage` does; its changes go to its webhook.
    if returned_at_once || pushed {
        let _ = events.send(send_message(front, headers, caller, request).await?);
        return Ok(stream);
    }
    // An answer to a task's question: the stream follows that task from where it stands.
    if continued_task(request).is_some() {
        start_kept(front, headers, caller, request, None, Some(events))?;
        return Ok(stream);
    }
    // Refused now rather than at the first report, when the stream has begun.
    front.a2a_tasks.room_for(caller.client)?;
    let message = request.get("message").cloned().unwrap_or(Value::Null);
    let taken = take(front, caller, Some(&message))?;
    let parent = crate::telemetry::extract_http(headers);
    let (front, client) = (front.clone(), caller.client.to_owned());
    tokio::spawn(async move {
        let _working = front.a2a_tasks.working();
        let context = taken.context.clone();
        let (progress, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let answer = deliver(&front, taken, parent, Some(progress));
        tokio::pin!(answer);
        let first = tokio::select! {
            biased;
            Some(said) = reports.recv() => said,
            result = &mut answer => {
                let _ = events.send(keep_if_asking(&front, &client, Some(&message), result));
                return;
            }
        };
        let id = match front.a2a_tasks.open(&client, &message, None, Some(events.clone())) {
            Ok(task) => task["id"].as_str().unwrap_or_default().to_owned(),
            Err(refused) => {
                // Another request took the last room meanwhile: the work is given up.
                let n = crate::util::token::unguessable();
                let _ = events.send(json!({"task": {"id": format!("task-{n}"), "contextId": context,
                    "status": {"state": "TASK_STATE_FAILED", "message": {"messageId": format!("silpgate-m{n}"),
                    "role": map::ROLE_AGENT, "parts": [{"text": refused.message()}]}}}}));
                return;
            }
        };
        drop(events);
        follow(&front, &id, context.as_deref(), answer, Some(first), reports).await;
    });
    Ok(stream)
}

/// Sends a taken message through the intake; the answer as A2A's result. The agent's
/// interim events go to `progress`, when given.
async fn deliver(
    front: &Front,
    taken: Taken,
    parent: opentelemetry::Context,
    progress: Option<tokio::sync::mpsc::UnboundedSender<Message>>,
) -> Value {
    let Taken { envelope, context, principal } = taken;
    let context = context.as_deref();
    let asker = crate::doors::Asker::new(Transport::Http, "a2a", principal);
    let answer = match progress {
        Some(progress) => front.request_streaming(envelope, asker, parent, progress).await,
        None => front.request(envelope, asker, parent).await,
    };
    let n = crate::util::token::unguessable();
    let task = |state: &str, message: &Message| {
        let mut status_message = map::message(message, &format!("silpgate-m{n}"), map::ROLE_AGENT);
        set_context(&mut status_message, context);
        let mut task =
            json!({"id": format!("silpgate-t{n}"), "status": {"state": state, "message": status_message}});
        if let Some(context) = context.or(message.conversation_token()) {
            task["contextId"] = Value::String(context.to_owned());
        }
        json!({"task": task})
    };
    match answer {
        ToSender::Reply { reply, .. } if reply.is_error() => {
            task(state_for(crate::nlip::reply::error_code(&reply).as_deref()), &reply)
        }
        ToSender::Reply { reply, .. } if asks(&reply).is_some() => {
            task(asks(&reply).unwrap_or_default(), &reply)
        }
        ToSender::Reply { reply, .. } => {
            let mut answer = map::message(&reply, &format!("silpgate-m{n}"), map::ROLE_AGENT);
            set_context(&mut answer, context);
            json!({"message": answer})
        }
        ToSender::Accepted(ids) => {
            let mut answer =
                map::message(&crate::nlip::reply::accepted(&ids), &format!("silpgate-m{n}"), map::ROLE_AGENT);
            set_context(&mut answer, context);
            json!({"message": answer})
        }
        ToSender::Refused { message, code, .. } => task(state_for(Some(&code)), &message),
    }
}

/// The state of the task an agent's question puts it in (its `messagetype` says which).
fn asks(reply: &Message) -> Option<&'static str> {
    match reply.messagetype.as_deref() {
        Some(map::INPUT_REQUIRED) => Some("TASK_STATE_INPUT_REQUIRED"),
        Some(map::AUTH_REQUIRED) => Some("TASK_STATE_AUTH_REQUIRED"),
        _ => None,
    }
}

/// The state of the task an NLIP error ends.
fn state_for(code: Option<&str>) -> &'static str {
    if code.is_some_and(|c| REJECTIONS.contains(&c)) { "TASK_STATE_REJECTED" } else { "TASK_STATE_FAILED" }
}

/// The codes of a message refused for what it is (by silpgate or by the agent), as opposed to
/// one that could not be handled: an A2A task that was rejected rather than one that failed.
const REJECTIONS: [&str; 13] = [
    "invalid_encoding",
    "invalid_envelope",
    "too_large",
    "too_complex",
    "invalid_syntax",
    "unsupported_version",
    "unsupported_frontend",
    "decode_failed",
    "no_route",
    "invalid_ping",
    "a2a_task_rejected",
    "a2a_refused",
    "mcp_refused",
];

/// The asker's context on an answer that carries none of its own.
fn set_context(message: &mut Value, context: Option<&str>) {
    if let (Some(context), None) = (context, message.get("contextId")) {
        message["contextId"] = Value::String(context.to_owned());
    }
}
