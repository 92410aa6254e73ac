//! The messages silpgate itself sends back: error messages, control replies, and the token
//! echo every reply carries (ECMA-430 §6.2, §6.3).

use super::message::{Content, Format, Message, Submessage};
use serde_json::{Map, Value, json};
use std::ops::Range;

/// Where in the input an error is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    None,
    /// A path in the envelope, e.g. `submessages[2].format`.
    Path(String),
    /// A byte span in a SILP payload, with the path of the submessage that held it.
    Span {
        path: String,
        span: Range<usize>,
    },
}

/// The label of the structured detail submessage of an error message.
pub(crate) const ERROR_DETAIL_LABEL: &str = "error";

/// The code of an error message (`code` in its structured detail; `error` when it names
/// none), or `None` for a message that is not an error.
pub fn error_code(message: &Message) -> Option<String> {
    if !message.is_error() {
        return None;
    }
    let code = message
        .submessages()
        .iter()
        .find_map(|s| s.content.json()?.get("code").and_then(Value::as_str).map(str::to_owned));
    Some(code.unwrap_or_else(|| "error".to_owned()))
}

/// An error message: `messagetype: error`, an English `text` body, and a `structured`/`json`
/// submessage `{"code", "message", "path" | "span"}` for machines.
pub fn error_message(code: &str, message: &str, location: &Location) -> Message {
    let mut detail = Map::new();
    detail.insert("code".into(), Value::String(code.to_owned()));
    detail.insert("message".into(), Value::String(message.to_owned()));
    let readable = match location {
        Location::None => format!("{code}: {message}"),
        Location::Path(path) => {
            detail.insert("path".into(), Value::String(path.clone()));
            format!("{code} at {path}: {message}")
        }
        Location::Span { path, span } => {
            detail.insert("path".into(), Value::String(path.clone()));
            detail.insert("span".into(), json!([span.start, span.end]));
            format!("{code} at {path}, bytes {}..{}: {message}", span.start, span.end)
        }
    };
    let mut reply = Message::text(readable).with_messagetype("error");
    reply.push(
        Submessage::new(Format::Structured, "json", Content::Json(Value::Object(detail)))
            .with_label(ERROR_DETAIL_LABEL),
    );
    reply
}

/// Appends to `reply` every token submessage of `request`, unchanged and in order, except the
/// tokens this endpoint created itself (`conversation_<own_suffix>`, `authentication_<own_suffix>`).
pub(crate) fn echo_tokens(reply: &mut Message, request: &Message, own_suffix: &str) {
    for token in request.tokens() {
        let own = token.subformat.rsplit_once('_').is_some_and(|(_, suffix)| suffix == own_suffix);
        if !own {
            reply.push(token.clone());
        }
    }
}

/// The control message that confirms a delivery whose agent gave no answer: nobody waited for
/// one (`await = "none"`), or the agent took the request without answering (an HTTP 2xx
/// without a body). `ids` are the ids of the envelopes the agents got.
pub(crate) fn accepted(ids: &[String]) -> Message {
    let content = serde_json::json!({ "delivered": ids });
    Message::new(Format::Structured, "json", Content::Json(content)).with_messagetype("control")
}

/// The ids an [`accepted`] message confirms, if `message` is one.
pub(crate) fn accepted_ids(message: &Message) -> Option<Vec<String>> {
    let Content::Json(content) = &message.content else { return None };
    let object = content.as_object().filter(|o| o.len() == 1 && message.is_control())?;
    let ids = object.get("delivered")?.as_array()?;
    ids.iter().map(|id| id.as_str().map(str::to_owned)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nlip::codec::to_json;

    #[test]
    fn error_messages_carry_code_and_path() {
        let m = error_message(
            "invalid_envelope",
            "missing required field 'format'",
            &Location::Path("submessages[2].format".into()),
        );
        assert_eq!(
            to_json(&m),
            r#"{"messagetype":"error","format":"text","subformat":"english","content":"invalid_envelope at submessages[2].format: missing required field 'format'","submessages":[{"format":"structured","subformat":"json","content":{"code":"invalid_envelope","message":"missing required field 'format'","path":"submessages[2].format"},"label":"error"}]}"#
        );
    }

    #[test]
    fn every_foreign_token_is_echoed() {
        let mut request = Message::text("hi");
        for sub in [
            "conversation",
            "conversation_9.2.3.5",
            "authentication_x",
            "authorization",
            "group_7",
            "conversation_silpgate",
        ] {
            request.push(Submessage::new(Format::Token, sub, Content::text(format!("t-{sub}"))));
        }
        request.push(Submessage::new(Format::Text, "english", Content::text("not a token")));
        let mut reply = Message::text("ok");
        echo_tokens(&mut reply, &request, "silpgate");
        let echoed: Vec<&str> = reply.submessages().iter().map(|s| s.subformat.as_str()).collect();
        assert_eq!(
            echoed,
            ["conversation", "conversation_9.2.3.5", "authentication_x", "authorization", "group_7"]
        );
    }
}
