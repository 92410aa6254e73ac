//! Why an A2A request is not served, in A2A's own terms: one failure per refusal, which each
//! binding renders in its own way (a JSON-RPC error code, or an HTTP status with a
//! `google.rpc.Status`-shaped body).

use axum::http::StatusCode;
use serde_json::{Value, json};

/// Why an A2A request is not served, in A2A's own terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The body is not JSON.
    Parse(String),
    /// Not a request this binding reads.
    InvalidRequest(String),
    MethodNotFound(String),
    /// Its params are not a message silpgate takes (the NLIP limits included).
    InvalidParams(String),
    TaskNotFound(String),
    VersionNotSupported(String),
    /// The client is at its conversation quota (`http.max_conversations_per_client`).
    TooManyConversations(usize),
    TaskNotCancelable(String),
    /// Push notification configs are not taken (the card says so).
    PushNotSupported,
    /// Every kept task is still working, and there are `a2a.max_tasks` of them.
    TooManyTasks(usize),
    /// The client has `a2a.max_tasks_per_client` kept tasks still working.
    TooManyTasksOfClient(usize),
}

impl From<&str> for Failure {
    fn from(why: &str) -> Self {
        Failure::InvalidParams(why.to_owned())
    }
}

impl Failure {
    /// The JSON-RPC error code.
    pub(super) fn jsonrpc_code(&self) -> i64 {
        match self {
            Failure::Parse(_) => -32700,
            Failure::InvalidRequest(_)
            | Failure::TooManyConversations(_)
            | Failure::TooManyTasks(_)
            | Failure::TooManyTasksOfClient(_) => -32600,
            Failure::TaskNotCancelable(_) => -32002,
            Failure::PushNotSupported => -32003,
            Failure::MethodNotFound(_) => -32601,
            Failure::InvalidParams(_) => -32602,
            Failure::TaskNotFound(_) => -32001,
            Failure::VersionNotSupported(_) => -32009,
        }
    }

    /// The HTTP status: HTTP+JSON's for every failure. JSON-RPC answers with it only for the
    /// limits (conversations, kept tasks), which are about the client rather than the request.
    pub(super) fn http_status(&self) -> StatusCode {
        match self {
            Failure::TooManyConversations(_)
            | Failure::TooManyTasks(_)
            | Failure::TooManyTasksOfClient(_) => StatusCode::TOO_MANY_REQUESTS,
            Failure::MethodNotFound(_) | Failure::TaskNotFound(_) => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub(super) fn message(&self) -> String {
        match self {
            Failure::Parse(why)
            | Failure::InvalidRequest(why)
            | Failure::MethodNotFound(why)
            | Failure::InvalidParams(why)
            | Failure::TaskNotFound(why)
            | Failure::TaskNotCancelable(why)
            | Failure::VersionNotSupported(why) => why.clone(),
            Failure::PushNotSupported => "push notifications are not supported here (the card says pushNotifications: false); poll with GetTask or use SubscribeToTask".into(),
            Failure::TooManyTasks(limit) => format!(
                "too_many_tasks: all {limit} tasks kept (a2a.max_tasks) are still working; send the message without returnImmediately, or later"
            ),
            Failure::TooManyTasksOfClient(limit) => format!(
                "too_many_tasks: this client has {limit} kept tasks still working, the most it may have (a2a.max_tasks_per_client); wait for one to end"
            ),
            Failure::TooManyConversations(limit) => format!(
                "too_many_conversations: this client has {limit} live conversations, the most it may have"
            ),
        }
    }

    /// The HTTP+JSON error body: `code` (the HTTP status), `status` (its gRPC name),
    /// `message`, and an `ErrorInfo` detail naming A2A's reason.
    pub(super) fn rest_body(&self) -> Value {
        let (status, reason) = match self {
            Failure::Parse(_) | Failure::InvalidRequest(_) => ("INVALID_ARGUMENT", "INVALID_REQUEST"),
            Failure::InvalidParams(_) => ("INVALID_ARGUMENT", "INVALID_PARAMS"),
            Failure::MethodNotFound(_) => ("NOT_FOUND", "METHOD_NOT_FOUND"),
            Failure::TaskNotFound(_) => ("NOT_FOUND", "TASK_NOT_FOUND"),
            Failure::VersionNotSupported(_) => ("FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"),
            Failure::TooManyConversations(_) => ("RESOURCE_EXHAUSTED", "TOO_MANY_CONVERSATIONS"),
            Failure::TooManyTasks(_) | Failure::TooManyTasksOfClient(_) => {
                ("RESOURCE_EXHAUSTED", "TOO_MANY_TASKS")
            }
            Failure::TaskNotCancelable(_) => ("FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"),
            Failure::PushNotSupported => ("FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED"),
        };
        json!({"error": {
            "code": self.http_status().as_u16(),
            "status": status,
            "message": self.message(),
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                         "domain": "a2a-protocol.org", "metadata": {}}],
        }})
    }
}
