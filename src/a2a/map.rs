//! How an NLIP envelope becomes an A2A 1.0 message and an A2A answer becomes an NLIP envelope
//! (A2A's protobuf JSON: camelCase fields, `ROLE_*` and `TASK_STATE_*` enum names).
//!
//! - Each NLIP part (the message's own content, then every submessage that is not a token)
//!   is one A2A part, in order: string content a `text` part, JSON content a `data` part, bytes
//!   a `raw` part (base64). Its `metadata.nlip` holds `format`, `subformat` and `label`, so
//!   that the way back is exact; a SILP part (`silp-code`, `silp-json`, `silp-ir`) also names
//!   its encoding in `metadata.silp_encoding` (`code`, `json`, `ir`: draft -02 §7.2's names).
//! - The conversation token is the A2A `contextId`; the message's `messagetype`, when set, is
//!   `metadata.nlip.messagetype`. Other tokens (authentication) never leave silpgate.
//! - A session renewal notice is not a part: it is the message's `metadata.silp_renewal`
//!   (`{"silp":"v1","session":..,"renewed":true,"turn":..}`), beside the parts it comes with.
//! - An answer's parts map back the same way; a part without `metadata.nlip` is read as
//!   `text`/`english`, `structured`/`json`, `binary`/its media type, or `location`/`uri`,
//!   except a SILP part: one whose `metadata.silp_encoding` names its encoding, or a `data`
//!   part holding an IR (an object with `silp` and `intent`), is `structured`/`silp-*`.

use crate::code::Code;
use crate::gateway::session::is_renewal_notice;
use crate::nlip::{Content, Format, Message, Submessage};
use base64::Engine;
use serde_json::{Map, Value, json};

/// The role of a message silpgate sends.
pub(crate) const ROLE_USER: &str = "ROLE_USER";
/// The role of a message silpgate answers with (its front door).
pub(crate) const ROLE_AGENT: &str = "ROLE_AGENT";

/// Why an A2A answer cannot be read as NLIP.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapError {
    #[error("{path}: {why}")]
    Part { path: String, why: String },
}

/// The SILP encoding a subformat carries, in draft -02's words.
pub(crate) fn silp_encoding(subformat: &str) -> Option<&'static str> {
    match subformat.to_ascii_lowercase().as_str() {
        "silp-code" => Some("code"),
        "silp-json" => Some("json"),
        "silp-ir" => Some("ir"),
        _ => None,
    }
}

/// The A2A message for `envelope`.
pub(crate) fn message(envelope: &Message, message_id: &str, role: &str) -> Value {
    let mut parts = Vec::new();
    let own_is_empty = matches!(&envelope.content, Content::Json(Value::String(s)) if s.is_empty());
    let others = envelope.submessages().iter().filter(|s| !s.is_token() && !is_renewal_notice(s));
    // An empty text body next to real parts says nothing; alone, it is the message.
    if !own_is_empty || others.clone().next().is_none() {
        parts.push(part(envelope.format, &envelope.subformat, &envelope.content, envelope.label.as_deref()));
    }
    for sub in others {
        parts.push(part(sub.format, &sub.subformat, &sub.content, sub.label.as_deref()));
    }
    let mut out = Map::new();
    out.insert("messageId".into(), Value::String(message_id.to_owned()));
    out.insert("role".into(), Value::String(role.to_owned()));
    out.insert("parts".into(), Value::Array(parts));
    if let Some(context) = envelope.conversation_token() {
        out.insert("contextId".into(), Value::String(context.to_owned()));
    }
    let mut metadata = Map::new();
    if let Some(messagetype) = &envelope.messagetype {
        metadata.insert("nlip".into(), json!({"messagetype": messagetype}));
    }
    if let Some(notice) = envelope.submessages().iter().find(|s| is_renewal_notice(s)) {
        metadata
            .insert("silp_renewal".into(), notice.content.json().map(|v| v.into_owned()).unwrap_or_default());
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    Value::Object(out)
}

/// One A2A part.
fn part(format: Format, subformat: &str, content: &Content, label: Option<&str>) -> Value {
    let mut nlip = Map::new();
    nlip.insert("format".into(), Value::String(format.as_str().to_owned()));
    nlip.insert("subformat".into(), Value::String(subformat.to_owned()));
    if let Some(label) = label {
        nlip.insert("label".into(), Value::String(label.to_owned()));
    }
    let mut metadata = Map::new();
    metadata.insert("nlip".into(), Value::Object(nlip));
    if let Some(encoding) = silp_encoding(subformat) {
        metadata.insert("silp_encoding".into(), Value::String(encoding.to_owned()));
    }
    let mut part = match content {
        Content::Json(Value::String(text)) => json!({"text": text}),
        Content::Json(_) | Content::Raw(_) => {
            json!({"data": content.json(), "mediaType": "application/json"})
        }
        Content::Binary(bytes) => json!({
            "raw": base64::engine::general_purpose::STANDARD.encode(bytes),
            "mediaType": "application/octet-stream",
        }),
    };
    part["metadata"] = Value::Object(metadata);
    part
}

/// The NLIP envelope for an answer's parts (`path` names them in errors). No parts: an empty
/// English text.
pub(crate) fn envelope(parts: &[Value], path: &str) -> Result<Message, MapError> {
    let mut read = parts.iter().enumerate().map(|(i, p)| submessage(p, &format!("{path}[{i}]")));
    let Some(first) = read.next().transpose()? else {
        return Ok(Message::text(""));
    };
    let mut message = Message::new(first.format, first.subformat, first.content);
    message.label = first.label;
    for sub in read {
        message.push(sub?);
    }
    Ok(message)
}

/// One A2A part as an NLIP submessage.
fn submessage(part: &Value, path: &str) -> Result<Submessage, MapError> {
    let bad = |why: &str| MapError::Part { path: path.to_owned(), why: why.to_owned() };
    let object = part.as_object().ok_or_else(|| bad("a part is not an object"))?;
    let media_type = object.get("mediaType").and_then(Value::as_str);
    let (format, subformat, content) = if let Some(text) = object.get("text") {
        let text = text.as_str().ok_or_else(|| bad("text is not a string"))?;
        (Format::Text, "english".to_owned(), Content::text(text))
    } else if let Some(data) = object.get("data") {
        (Format::Structured, "json".to_owned(), Content::Json(data.clone()))
    } else if let Some(raw) = object.get("raw") {
        let raw = raw.as_str().ok_or_else(|| bad("raw is not a string"))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|e| bad(&format!("raw is not base64: {e}")))?;
        (Format::Binary, media_type.unwrap_or("octet-stream").to_owned(), Content::Binary(bytes))
    } else if let Some(url) = object.get("url") {
        let url = url.as_str().ok_or_else(|| bad("url is not a string"))?;
        (Format::Location, "uri".to_owned(), Content::text(url))
    } else {
        return Err(bad("a part has none of text, data, raw, url"));
    };
    let mut sub = Submessage::new(format, subformat, content);
    // A SILP part says so in `silp_encoding`; a data part holding an IR is one without saying.
    let encoding = object.get("metadata").and_then(|m| m.get("silp_encoding")).and_then(Value::as_str);
    let holds_ir = |c: &Content| matches!(c, Content::Json(Value::Object(o)) if o.contains_key("silp") && o.contains_key("intent"));
    let silp = match encoding {
        Some("code") => Some("silp-code"),
        Some("json") => Some("silp-json"),
        Some("ir") => Some("silp-ir"),
        _ if holds_ir(&sub.content) => Some("silp-ir"),
        _ => None,
    };
    if let Some(subformat) = silp {
        sub.format = Format::Structured;
        subformat.clone_into(&mut sub.subformat);
    }
    // What the sender said this part is in NLIP wins over the defaults above.
    if let Some(nlip) = object.get("metadata").and_then(|m| m.get("nlip")) {
        if let Some(format) = nlip.get("format").and_then(Value::as_str).and_then(Format::parse) {
            sub.format = format;
        }
        if let Some(subformat) = nlip.get("subformat").and_then(Value::as_str) {
            subformat.clone_into(&mut sub.subformat);
        }
        sub.label = nlip.get("label").and_then(Value::as_str).map(str::to_owned);
    }
    Ok(sub)
}

/// Where a task is in its lifecycle, as silpgate waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Submitted, working, or a state this version does not know: wait.
    Pending,
    Completed,
    Failed,
    Canceled,
    Rejected,
    InputRequired,
    AuthRequired,
}

impl TaskState {
    /// The state of a task (`status.state`; the 0.3 lower-case names are read too).
    pub(crate) fn of(task: &Value) -> TaskState {
        let state = task.pointer("/status/state").and_then(Value::as_str).unwrap_or_default();
        let state = state.strip_prefix("TASK_STATE_").unwrap_or(state).to_ascii_lowercase().replace('_', "-");
        match state.as_str() {
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "input-required" => TaskState::InputRequired,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Pending,
        }
    }

    /// The NLIP error code of a task that ended without a result, or `None`.
    pub(crate) fn error_code(self) -> Option<&'static str> {
        match self {
            TaskState::Pending | TaskState::Completed => None,
            TaskState::Failed => Some(Code::A2aTaskFailed.as_str()),
            TaskState::Canceled => Some(Code::A2aTaskCanceled.as_str()),
            TaskState::Rejected => Some(Code::A2aTaskRejected.as_str()),
            TaskState::InputRequired => Some(Code::A2aInputRequired.as_str()),
            TaskState::AuthRequired => Some(Code::A2aAuthRequired.as_str()),
        }
    }
}

/// The `messagetype` of an NLIP answer that is an agent's question: its task wants input.
/// The next message of the conversation answers it, in the agent's same task.
pub(crate) const INPUT_REQUIRED: &str = "input-required";
/// The `messagetype` of an NLIP answer saying the agent's task wants authentication; the next
/// message of the conversation goes to the agent's same task, and grants nothing by itself.
pub(crate) const AUTH_REQUIRED: &str = "auth-required";

impl TaskState {
    /// The `messagetype` of the question a task in this state asks, when it is interrupted
    /// rather than ended (input or authentication required).
    pub(crate) fn question(self) -> Option<&'static str> {
        match self {
            TaskState::InputRequired => Some(INPUT_REQUIRED),
            TaskState::AuthRequired => Some(AUTH_REQUIRED),
            _ => None,
        }
    }
}

/// The parts of a task's result: its artifacts' parts in order, else its status message's.
pub(crate) fn task_parts(task: &Value) -> Vec<Value> {
    let from_artifacts: Vec<Value> = task
        .get("artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.get("parts").and_then(Value::as_array))
        .flatten()
        .cloned()
        .collect();
    if !from_artifacts.is_empty() {
        return from_artifacts;
    }
    task.pointer("/status/message/parts").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The text of a task's status message (why it failed), joined by spaces.
pub(crate) fn status_text(task: &Value) -> String {
    let parts = task.pointer("/status/message/parts").and_then(Value::as_array);
    parts
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nlip::Submessage;

    fn silp_request() -> Message {
        let mut m = Message::text("");
        m.push(
            Submessage::new(Format::Structured, "silp-code", Content::text("cancel(order1)"))
                .with_label("task"),
        );
        m.push(Submessage::new(Format::Structured, "silp-ir", Content::Json(json!({"intent": "cancel"}))));
        m.push(Submessage::new(Format::Token, "conversation", Content::text("c-1")));
        m.push(Submessage::new(Format::Token, "authentication", Content::text("secret")));
        m
    }

    #[test]
    fn an_envelope_maps_to_parts_with_its_nlip_names_and_the_conversation_as_context() {
        let a2a = message(&silp_request(), "m-1", ROLE_USER);
        assert_eq!(a2a["messageId"], "m-1");
        assert_eq!(a2a["role"], "ROLE_USER");
        assert_eq!(a2a["contextId"], "c-1");
        let parts = a2a["parts"].as_array().unwrap();
        assert_eq!(parts.len(), 2, "the empty body and the tokens are not parts: {a2a}");
        assert_eq!(parts[0]["text"], "cancel(order1)");
        assert_eq!(parts[0]["metadata"]["nlip"]["subformat"], "silp-code");
        assert_eq!(parts[0]["metadata"]["nlip"]["label"], "task");
        assert_eq!(parts[0]["metadata"]["silp_encoding"], "code");
        assert_eq!(parts[1]["data"]["intent"], "cancel");
        assert_eq!(parts[1]["metadata"]["silp_encoding"], "ir");
        assert!(!a2a.to_string().contains("secret"), "authentication tokens stay home");
    }

    #[test]
    fn parts_map_back_to_the_same_nlip_parts() {
        let a2a = message(&silp_request(), "m-1", ROLE_USER);
        let back = envelope(a2a["parts"].as_array().unwrap(), "parts").unwrap();
        assert_eq!(back.format, Format::Structured);
        assert_eq!(back.subformat, "silp-code");
        assert_eq!(back.content, Content::text("cancel(order1)"));
        assert_eq!(back.label.as_deref(), Some("task"));
        assert_eq!(back.submessages()[0].subformat, "silp-ir");
    }

    #[test]
    fn plain_parts_read_as_text_data_bytes_and_locations_and_bad_ones_say_where() {
        let parts = vec![
            json!({"text": "hi"}),
            json!({"data": {"a": 1}}),
            json!({"raw": "AAE=", "mediaType": "image/png"}),
            json!({"url": "https://example.org/x"}),
        ];
        let m = envelope(&parts, "result.parts").unwrap();
        assert_eq!((m.format, m.subformat.as_str()), (Format::Text, "english"));
        let subs = m.submessages();
        assert_eq!(subs[0].format, Format::Structured);
        assert_eq!(subs[1].content, Content::Binary(vec![0, 1]));
        assert_eq!(subs[1].subformat, "image/png");
        assert_eq!(subs[2].format, Format::Location);
        let error = envelope(&[json!({"raw": "%%"})], "result.parts").unwrap_err().to_string();
        assert!(error.starts_with("result.parts[0]: raw is not base64"), "{error}");
        assert!(envelope(&[json!(7)], "p").is_err());
        assert!(envelope(&[json!({"nothing": 1})], "p").is_err());
        assert_eq!(envelope(&[], "p").unwrap(), Message::text(""));
        let silp = envelope(
            &[
                json!({"data": {"silp": "v1", "intent": "x"}}),
                json!({"text": "a(b)", "metadata": {"silp_encoding": "code"}}),
            ],
            "p",
        )
        .unwrap();
        assert_eq!((silp.format, silp.subformat.as_str()), (Format::Structured, "silp-ir"));
        assert_eq!(silp.submessages()[0].subformat, "silp-code");
    }

    #[test]
    fn task_states_of_both_spellings_and_their_codes() {
        let of = |s: &str| TaskState::of(&json!({"status": {"state": s}}));
        assert_eq!(of("TASK_STATE_COMPLETED"), TaskState::Completed);
        assert_eq!(of("TASK_STATE_INPUT_REQUIRED"), TaskState::InputRequired);
        assert_eq!(of("failed"), TaskState::Failed);
        assert_eq!(of("TASK_STATE_WORKING"), TaskState::Pending);
        assert_eq!(TaskState::of(&json!({})), TaskState::Pending);
        assert_eq!(TaskState::Rejected.error_code(), Some("a2a_task_rejected"));
        assert_eq!(TaskState::Completed.error_code(), None);
    }
}
