//! A2A 0.3 on the wire, translated to and from the 1.0 shapes the rest of silpgate speaks, so
//! that one set of handlers serves both generations. Much of the installed base still speaks
//! 0.3. What differs, and nothing else:
//! - method names: `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`,
//!   `tasks/resubscribe` for 1.0's `SendMessage`, `SendStreamingMessage`, `GetTask`,
//!   `CancelTask`, `SubscribeToTask`;
//! - a part says its `kind` (`text`, `data`, `file`); a data part holds an object; a file part
//!   holds `{bytes | uri, mimeType, name}` where 1.0 has `raw`/`url`, `mediaType`, `filename`;
//! - roles are `user`/`agent`, task states `completed`, `input-required`, … (1.0:
//!   `ROLE_USER`, `TASK_STATE_COMPLETED`, …);
//! - a result is the Message or Task itself, carrying `kind`, where 1.0 wraps it in
//!   `{"message": …}` or `{"task": …}`.
//!
//! 0.3's data parts take only objects. Other JSON content travels as `{"value": …}` with
//! `metadata.silpgate_wrapped_value = true`, and is unwrapped on the way back.

use serde_json::{Map, Value, json};

/// The 0.3 protocol version, as cards and interfaces name it.
pub(crate) const VERSION: &str = "0.3.0";

/// Marks a 0.3 data part whose object only wraps JSON that is not one.
const WRAPPED: &str = "silpgate_wrapped_value";

/// Marks a push notification config made by a 0.3 client, translated: its webhook is sent
/// 0.3's payloads.
pub(crate) const PUSHED_AS_0_3: &str = "silpgate_pushed_as_0_3";

/// The 1.0 method a 0.3 method is, or `None` when `method` is not a 0.3 method.
pub(crate) fn method_as_1_0(method: &str) -> Option<&'static str> {
    Some(match method {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        "tasks/pushNotificationConfig/set" => "CreateTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/get" => "GetTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/list" => "ListTaskPushNotificationConfigs",
        "tasks/pushNotificationConfig/delete" => "DeleteTaskPushNotificationConfig",
        _ => return None,
    })
}

/// A 0.3 `PushNotificationConfig` (`id`, `url`, `token`, `authentication` with `schemes`
/// and `credentials`) as 1.0's flattened config (`authentication` with one `scheme`).
pub(crate) fn push_notification_config_from(config: &Value) -> Value {
    // Its webhook reads 0.3's payloads: the task, whole, at each change.
    let mut flat = json!({PUSHED_AS_0_3: true});
    for key in ["id", "url", "token"] {
        if let Some(value) = config.get(key).filter(|v| !v.is_null()) {
            flat[key] = value.clone();
        }
    }
    if let Some(authentication) = config.get("authentication").filter(|a| a.is_object()) {
        let scheme = authentication.pointer("/schemes/0").cloned().unwrap_or(Value::Null);
        flat["authentication"] = json!({"scheme": scheme});
        if let Some(credentials) = authentication.get("credentials").filter(|c| !c.is_null()) {
            flat["authentication"]["credentials"] = credentials.clone();
        }
    }
    flat
}

/// 0.3's `tasks/pushNotificationConfig/set` params (`taskId`, `pushNotificationConfig`) as
/// 1.0's `CreateTaskPushNotificationConfig` params.
pub(crate) fn push_config_from(params: &Value) -> Value {
    let mut flat =
        push_notification_config_from(params.get("pushNotificationConfig").unwrap_or(&Value::Null));
    if let Some(task) = params.get("taskId") {
        flat["taskId"] = task.clone();
        // 0.3 names a task's one config by the task's id.
        if flat.get("id").is_none() {
            flat["id"] = task.clone();
        }
    }
    flat
}

/// 0.3's get, list and delete params (`id`: the task, `pushNotificationConfigId`) as 1.0's
/// (`taskId`, `id`).
pub(crate) fn push_config_params_from(params: &Value) -> Value {
    let task = params.get("id").cloned().unwrap_or(Value::Null);
    let config = params.get("pushNotificationConfigId").filter(|c| !c.is_null()).unwrap_or(&task).clone();
    json!({"taskId": task, "id": config})
}

/// A 1.0 push notification config as 0.3's `TaskPushNotificationConfig`.
pub(crate) fn push_config_to(config: &Value) -> Value {
    let mut inner = json!({});
    for key in ["id", "url", "token"] {
        if let Some(value) = config.get(key) {
            inner[key] = value.clone();
        }
    }
    if let Some(scheme) = config.pointer("/authentication/scheme") {
        inner["authentication"] = json!({"schemes": [scheme]});
    }
    json!({"taskId": config.get("taskId").cloned().unwrap_or(Value::Null), "pushNotificationConfig": inner})
}

/// The 0.3 method for a 1.0 one (the connector's requests to a 0.3 agent).
pub(crate) fn method_as_0_3(method: &str) -> Option<&'static str> {
    Some(match method {
        "SendMessage" => "message/send",
        "SendStreamingMessage" => "message/stream",
        "GetTask" => "tasks/get",
        "CancelTask" => "tasks/cancel",
        "SubscribeToTask" => "tasks/resubscribe",
        _ => return None,
    })
}

/// A 0.3 message in 1.0's shape. Fields 1.0 does not know are left for 1.0's reader to judge.
pub(crate) fn message_from(message: &Value) -> Value {
    let Some(object) = message.as_object() else {
        return message.clone();
    };
    let mut out = object.clone();
    out.remove("kind");
    if let Some(role) = object.get("role").and_then(Value::as_str) {
        out.insert("role".into(), Value::String(role_from(role)));
    }
    if let Some(parts) = object.get("parts").and_then(Value::as_array) {
        out.insert("parts".into(), Value::Array(parts.iter().map(part_from).collect()));
    }
    Value::Object(out)
}

/// A 1.0 message in 0.3's shape.
pub(crate) fn message_to(message: &Value) -> Value {
    let Some(object) = message.as_object() else {
        return message.clone();
    };
    let mut out = object.clone();
    out.insert("kind".into(), json!("message"));
    if let Some(role) = object.get("role").and_then(Value::as_str) {
        out.insert("role".into(), Value::String(role_to(role)));
    }
    if let Some(parts) = object.get("parts").and_then(Value::as_array) {
        out.insert("parts".into(), Value::Array(parts.iter().map(part_to).collect()));
    }
    Value::Object(out)
}

/// A 1.0 task in 0.3's shape: its state, status message, artifacts and history translated.
pub(crate) fn task_to(task: &Value) -> Value {
    let Some(object) = task.as_object() else {
        return task.clone();
    };
    let mut out = object.clone();
    out.insert("kind".into(), json!("task"));
    if let Some(status) = object.get("status") {
        out.insert("status".into(), status_to(status));
    }
    translate_list(&mut out, "history", message_to);
    translate_list(&mut out, "artifacts", |artifact| {
        let mut artifact = artifact.clone();
        if let Some(parts) = artifact.get("parts").and_then(Value::as_array) {
            artifact["parts"] = Value::Array(parts.iter().map(part_to).collect());
        }
        artifact
    });
    Value::Object(out)
}

/// A 0.3 task in 1.0's shape.
pub(crate) fn task_from(task: &Value) -> Value {
    let Some(object) = task.as_object() else {
        return task.clone();
    };
    let mut out = object.clone();
    out.remove("kind");
    if let Some(status) = object.get("status") {
        out.insert("status".into(), status_from(status));
    }
    translate_list(&mut out, "history", message_from);
    translate_list(&mut out, "artifacts", |artifact| {
        let mut artifact = artifact.clone();
        if let Some(parts) = artifact.get("parts").and_then(Value::as_array) {
            artifact["parts"] = Value::Array(parts.iter().map(part_from).collect());
        }
        artifact
    });
    Value::Object(out)
}

/// A 0.3 stream event (a Message, a Task, a `status-update` or an `artifact-update`, by
/// `kind`) as 1.0's `StreamResponse`.
pub(crate) fn stream_event_from(event: &Value) -> Value {
    let update = |event: &Value| {
        let mut update = event.as_object().cloned().unwrap_or_default();
        update.remove("kind");
        update.remove("final");
        update
    };
    match event.get("kind").and_then(Value::as_str) {
        Some("status-update") => {
            let mut update = update(event);
            if let Some(status) = event.get("status") {
                update.insert("status".into(), status_from(status));
            }
            json!({"statusUpdate": update})
        }
        Some("artifact-update") => {
            let mut update = update(event);
            if let Some(parts) = event.pointer("/artifact/parts").and_then(Value::as_array) {
                let parts = Value::Array(parts.iter().map(part_from).collect());
                if let Some(artifact) = update.get_mut("artifact") {
                    artifact["parts"] = parts;
                }
            }
            json!({"artifactUpdate": update})
        }
        _ => result_from(event),
    }
}

/// A 1.0 `StreamResponse` as 0.3's stream event: the Message or Task itself, or a
/// `status-update` (with 0.3's `final`, true for a state that ends the task) or an
/// `artifact-update`, each with its `kind`.
pub(crate) fn stream_event_to(event: &Value) -> Value {
    if let Some(update) = event.get("statusUpdate").and_then(Value::as_object) {
        let mut out = update.clone();
        out.insert("kind".into(), json!("status-update"));
        if let Some(status) = update.get("status") {
            let status = status_to(status);
            let state = status.get("state").and_then(Value::as_str).unwrap_or_default();
            let ended = !matches!(state, "submitted" | "working" | "unspecified" | "");
            out.insert("final".into(), Value::Bool(ended));
            out.insert("status".into(), status);
        }
        return Value::Object(out);
    }
    if let Some(update) = event.get("artifactUpdate").and_then(Value::as_object) {
        let mut out = update.clone();
        out.insert("kind".into(), json!("artifact-update"));
        if let Some(parts) = update.get("artifact").and_then(|a| a.get("parts")).and_then(Value::as_array) {
            let parts = Value::Array(parts.iter().map(part_to).collect());
            if let Some(artifact) = out.get_mut("artifact") {
                artifact["parts"] = parts;
            }
        }
        return Value::Object(out);
    }
    result_to(event)
}

/// A 1.0 `SendMessage` result (`{"message"}` or `{"task"}`) as 0.3's result.
pub(crate) fn result_to(result: &Value) -> Value {
    if let Some(message) = result.get("message") {
        message_to(message)
    } else if let Some(task) = result.get("task") {
        task_to(task)
    } else {
        result.clone()
    }
}

/// A 0.3 `message/send` result (a Message or a Task, by `kind`) as 1.0's.
pub(crate) fn result_from(result: &Value) -> Value {
    match result.get("kind").and_then(Value::as_str) {
        Some("message") => json!({"message": message_from(result)}),
        Some("task") => json!({"task": task_from(result)}),
        // Without a kind: a task has a status, a message has parts.
        _ if result.get("status").is_some() => json!({"task": task_from(result)}),
        _ => json!({"message": message_from(result)}),
    }
}

fn status_from(status: &Value) -> Value {
    let Some(object) = status.as_object() else {
        return status.clone();
    };
    let mut out = object.clone();
    if let Some(state) = object.get("state").and_then(Value::as_str) {
        let state = format!("TASK_STATE_{}", state.replace('-', "_").to_ascii_uppercase());
        out.insert("state".into(), Value::String(state.replace("CANCELLED", "CANCELED")));
    }
    if let Some(message) = object.get("message") {
        out.insert("message".into(), message_from(message));
    }
    Value::Object(out)
}

fn status_to(status: &Value) -> Value {
    let Some(object) = status.as_object() else {
        return status.clone();
    };
    let mut out = object.clone();
    if let Some(state) = object.get("state").and_then(Value::as_str) {
        let state = state.strip_prefix("TASK_STATE_").unwrap_or(state).to_ascii_lowercase().replace('_', "-");
        out.insert("state".into(), Value::String(state));
    }
    if let Some(message) = object.get("message") {
        out.insert("message".into(), message_to(message));
    }
    Value::Object(out)
}

fn translate_list(object: &mut Map<String, Value>, key: &str, each: impl Fn(&Value) -> Value) {
    if let Some(items) = object.get(key).and_then(Value::as_array) {
        let translated = items.iter().map(each).collect();
        object.insert(key.into(), Value::Array(translated));
    }
}

fn role_from(role: &str) -> String {
    match role {
        "user" => "ROLE_USER".into(),
        "agent" => "ROLE_AGENT".into(),
        other => other.to_owned(),
    }
}

fn role_to(role: &str) -> String {
    match role {
        "ROLE_USER" => "user".into(),
        "ROLE_AGENT" => "agent".into(),
        other => other.to_owned(),
    }
}

/// A 1.0 part in 0.3's shape.
fn part_to(part: &Value) -> Value {
    let Some(object) = part.as_object() else {
        return part.clone();
    };
    let mut out = Map::new();
    let mut metadata = object.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(text) = object.get("text") {
        out.insert("kind".into(), json!("text"));
        out.insert("text".into(), text.clone());
    } else if let Some(data) = object.get("data") {
        out.insert("kind".into(), json!("data"));
        if data.is_object() {
            out.insert("data".into(), data.clone());
        } else {
            out.insert("data".into(), json!({"value": data}));
            metadata.insert(WRAPPED.into(), Value::Bool(true));
        }
    } else {
        let mut file = Map::new();
        if let Some(raw) = object.get("raw") {
            file.insert("bytes".into(), raw.clone());
        }
        if let Some(url) = object.get("url") {
            file.insert("uri".into(), url.clone());
        }
        if let Some(media_type) = object.get("mediaType") {
            file.insert("mimeType".into(), media_type.clone());
        }
        if let Some(name) = object.get("filename") {
            file.insert("name".into(), name.clone());
        }
        out.insert("kind".into(), json!("file"));
        out.insert("file".into(), Value::Object(file));
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    Value::Object(out)
}

/// A 0.3 part in 1.0's shape. A part of no kind 0.3 knows is passed on as it is, for 1.0's
/// reader to refuse with its path.
fn part_from(part: &Value) -> Value {
    let Some(object) = part.as_object() else {
        return part.clone();
    };
    let mut metadata = object.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let wrapped = metadata.remove(WRAPPED).is_some_and(|w| w == Value::Bool(true));
    let mut out = Map::new();
    match object.get("kind").and_then(Value::as_str) {
        Some("text") => {
            out.insert("text".into(), object.get("text").cloned().unwrap_or(Value::Null));
        }
        Some("data") => {
            let data = object.get("data").cloned().unwrap_or(Value::Null);
            let data = if wrapped { data.get("value").cloned().unwrap_or(Value::Null) } else { data };
            out.insert("data".into(), data);
            out.insert("mediaType".into(), json!("application/json"));
        }
        Some("file") => {
            let file = object.get("file").and_then(Value::as_object).cloned().unwrap_or_default();
            if let Some(bytes) = file.get("bytes") {
                out.insert("raw".into(), bytes.clone());
            }
            if let Some(uri) = file.get("uri") {
                out.insert("url".into(), uri.clone());
            }
            if let Some(mime_type) = file.get("mimeType") {
                out.insert("mediaType".into(), mime_type.clone());
            }
            if let Some(name) = file.get("name") {
                out.insert("filename".into(), name.clone());
            }
        }
        _ => return part.clone(),
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_goes_to_0_3_and_back_unchanged() {
        let message = json!({"messageId": "m1", "role": "ROLE_AGENT", "contextId": "c1", "parts": [
            {"text": "hello", "metadata": {"nlip": {"format": "text", "subformat": "english"}}},
            {"data": {"silp": "v1", "intent": "!BOOK"}, "mediaType": "application/json"},
            {"data": [1, 2], "mediaType": "application/json"},
            {"raw": "AAE=", "mediaType": "application/octet-stream"},
            {"url": "https://example.com/f", "mediaType": "text/plain", "filename": "f"},
        ]});
        let old = message_to(&message);
        assert_eq!(old["kind"], "message");
        assert_eq!(old["role"], "agent");
        let kinds: Vec<&str> =
            old["parts"].as_array().unwrap().iter().map(|p| p["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["text", "data", "data", "file", "file"]);
        assert_eq!(old["parts"][2]["data"], json!({"value": [1, 2]}));
        assert_eq!(old["parts"][3]["file"], json!({"bytes": "AAE=", "mimeType": "application/octet-stream"}));
        assert_eq!(message_from(&old), message);
    }

    #[test]
    fn a_task_result_goes_to_0_3_and_back() {
        let result = json!({"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
            "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "which day?"}]}}}});
        let old = result_to(&result);
        assert_eq!(old["kind"], "task");
        assert_eq!(old["status"]["state"], "input-required");
        assert_eq!(old["status"]["message"]["parts"][0], json!({"kind": "text", "text": "which day?"}));
        assert_eq!(result_from(&old), result);
        let canceled = result_to(&json!({"task": {"id": "t", "status": {"state": "TASK_STATE_CANCELED"}}}));
        assert_eq!(canceled["status"]["state"], "canceled");
        assert_eq!(result_from(&canceled)["task"]["status"]["state"], "TASK_STATE_CANCELED");
    }

    #[test]
    fn stream_events_of_0_3_read_as_1_0s() {
        let status = json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": false,
            "status": {"state": "working", "message": {"kind": "message", "role": "agent", "messageId": "m",
            "parts": [{"kind": "text", "text": "half way"}]}}});
        let read = stream_event_from(&status);
        assert_eq!(read["statusUpdate"]["status"]["state"], "TASK_STATE_WORKING", "{read}");
        assert_eq!(read["statusUpdate"]["status"]["message"]["parts"][0], json!({"text": "half way"}));
        assert!(read["statusUpdate"].get("final").is_none());
        let artifact = json!({"kind": "artifact-update", "taskId": "t", "append": true,
            "artifact": {"artifactId": "a", "parts": [{"kind": "data", "data": {"x": 1}}]}});
        let read = stream_event_from(&artifact);
        assert_eq!(read["artifactUpdate"]["artifact"]["parts"][0]["data"], json!({"x": 1}), "{read}");
        assert_eq!(read["artifactUpdate"]["append"], true);
        let message = json!({"kind": "message", "role": "agent", "messageId": "m", "parts": []});
        assert_eq!(stream_event_from(&message)["message"]["role"], "ROLE_AGENT");
    }

    #[test]
    fn stream_events_go_to_0_3_with_their_kind_and_final_flag() {
        let working = json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_WORKING",
            "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "step 1"}]}}}});
        let old = stream_event_to(&working);
        assert_eq!((old["kind"].as_str(), old["final"].as_bool()), (Some("status-update"), Some(false)));
        assert_eq!(old["status"]["message"]["parts"][0], json!({"kind": "text", "text": "step 1"}));
        let done = stream_event_to(
            &json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}),
        );
        assert_eq!(
            (done["status"]["state"].as_str(), done["final"].as_bool()),
            (Some("completed"), Some(true))
        );
        let artifact = stream_event_to(
            &json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "x"}]}}}),
        );
        assert_eq!(artifact["artifact"]["parts"][0]["kind"], "text");
        assert_eq!(
            stream_event_from(&artifact)["artifactUpdate"]["artifact"]["parts"][0],
            json!({"text": "x"})
        );
        assert_eq!(
            stream_event_to(&json!({"task": {"id": "t", "status": {"state": "TASK_STATE_WORKING"}}}))["kind"],
            "task"
        );
    }

    #[test]
    fn methods_map_both_ways_and_others_are_not_0_3() {
        for method in ["message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe"] {
            assert_eq!(method_as_0_3(method_as_1_0(method).unwrap()), Some(method));
        }
        assert_eq!(method_as_1_0("SendMessage"), None);
        assert_eq!(method_as_0_3("message/send"), None);
    }
}
