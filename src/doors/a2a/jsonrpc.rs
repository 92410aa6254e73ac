//! The JSON-RPC binding of the A2A door, `POST /a2a`, for A2A 1.0 and 0.3 alike: a request's
//! generation is its method's name, 0.3's params and results translated at the edge
//! ([`crate::a2a::v0_3`]); an `A2A-Version` header, when sent, must agree with it.

use super::A2A_MEDIA_TYPE;
use super::operation::{self, Failure};
use crate::a2a::{VERSION, v0_3};
use crate::doors::Front;
use crate::doors::jsonrpc::{admit, error, reply};
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;

/// `POST /a2a`: one JSON-RPC request, answered with one response or a stream of them.
pub(super) async fn post_a2a(
    State(front): State<Arc<Front>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (bytes, client, principal) = match admit(&front, peer, &headers, body).await {
        Ok(admitted) => (admitted.body, admitted.client, admitted.principal),
        Err(refused) => return refused,
    };
    let caller = operation::Caller { client: &client, principal: principal.as_ref() };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(e) => {
            return failed(Value::Null, &Failure::Parse(format!("the body is not JSON: {e}")));
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(asked) = request.get("method").and_then(Value::as_str) else {
        return failed(id, &Failure::InvalidRequest("a request is one JSON-RPC object with a method".into()));
    };
    // The method's name says the generation: 0.3's are `message/send` and the like.
    let (generation, method) = match v0_3::method_as_1_0(asked) {
        Some(method) => (Generation::V0_3, method),
        None => (Generation::V1_0, asked),
    };
    // Without the header a client may mean either; with it, it must match the method's.
    if let Some(version) = headers.get("a2a-version").and_then(|v| v.to_str().ok()).map(str::trim)
        && !generation.accepts(version)
    {
        let failure = match generation {
            Generation::V1_0 => Failure::VersionNotSupported(format!(
                "A2A version '{version}' is not supported with method '{asked}'; this agent speaks {VERSION} (and 0.3's method names)"
            )),
            Generation::V0_3 => Failure::MethodNotFound(format!(
                "method '{asked}' is A2A 0.3's; A2A {version} names it {method}"
            )),
        };
        return failed(id, &failure);
    }
    let content_type = generation.content_type(&headers);
    let old = generation == Generation::V0_3;
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    let respond = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    // 0.3's tasks and results are translated back; 1.0's go as they are.
    let task_out = |task: Value| if old { v0_3::task_to(&task) } else { task };
    let outcome = match method {
        "SendMessage" => {
            let request = if old { send_request_from_0_3(&params) } else { params };
            operation::send_message(&front, &headers, &caller, &request)
                .await
                .map(|result| Answer::One(respond(if old { v0_3::result_to(&result) } else { result })))
        }
        "SendStreamingMessage" => {
            let request = if old { send_request_from_0_3(&params) } else { params };
            operation::send_streaming(&front, &headers, &caller, &request).await.map(Answer::Live)
        }
        "GetTask" => operation::get_task(&front, &client, &params).map(|t| Answer::One(respond(task_out(t)))),
        "CancelTask" => {
            operation::cancel_task(&front, &client, &params).map(|t| Answer::One(respond(task_out(t))))
        }
        "ListTasks" if !old => {
            operation::list_tasks(&front, &client, &params).map(|list| Answer::One(respond(list)))
        }
        "SubscribeToTask" => operation::subscribe(&front, &client, &params).map(Answer::Live),
        "CreateTaskPushNotificationConfig" => {
            let params = if old { v0_3::push_config_from(&params) } else { params };
            operation::create_push_config(&front, &client, &params)
                .map(|config| Answer::One(respond(if old { v0_3::push_config_to(&config) } else { config })))
        }
        "GetTaskPushNotificationConfig" => {
            let params = if old { v0_3::push_config_params_from(&params) } else { params };
            operation::get_push_config(&front, &client, &params)
                .map(|config| Answer::One(respond(if old { v0_3::push_config_to(&config) } else { config })))
        }
        "ListTaskPushNotificationConfigs" => {
            let params = if old { v0_3::push_config_params_from(&params) } else { params };
            operation::list_push_configs(&front, &client, &params).map(|list| {
                let configs = list["configs"].as_array().cloned().unwrap_or_default();
                let old_list = || Value::Array(configs.iter().map(v0_3::push_config_to).collect());
                Answer::One(respond(if old { old_list() } else { list }))
            })
        }
        "DeleteTaskPushNotificationConfig" => {
            let params = if old { v0_3::push_config_params_from(&params) } else { params };
            operation::delete_push_config(&front, &client, &params)
                .map(|done| Answer::One(respond(if old { Value::Null } else { done })))
        }
        _ => Err(Failure::MethodNotFound(format!("method '{asked}' is not served here"))),
    };
    match outcome {
        Ok(Answer::One(body)) => super::reply_as(StatusCode::OK, &body, content_type),
        Ok(Answer::Live(events)) => super::live_event_stream(events, move |event| {
            let result = if old { v0_3::stream_event_to(&event) } else { event };
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        }),
        Err(failure) => failed(id, &failure),
    }
}

/// What a JSON-RPC request is answered with.
enum Answer {
    One(Value),
    /// Server-sent events as they come: stream responses, each sent as a JSON-RPC response.
    Live(operation::Events),
}

/// A 0.3 `message/send` request as 1.0's: its message translated, `blocking: false` as
/// `returnImmediately`, its `pushNotificationConfig` as `taskPushNotificationConfig`.
fn send_request_from_0_3(params: &Value) -> Value {
    let mut request =
        json!({"message": params.get("message").map(v0_3::message_from).unwrap_or(Value::Null)});
    if params.pointer("/configuration/blocking").and_then(Value::as_bool) == Some(false) {
        request["configuration"]["returnImmediately"] = json!(true);
    }
    if let Some(config) = params.pointer("/configuration/pushNotificationConfig").filter(|c| !c.is_null()) {
        request["configuration"]["taskPushNotificationConfig"] = v0_3::push_notification_config_from(config);
    }
    request
}

/// A JSON-RPC error response: HTTP 200, but 429 for the quota, which is about the client.
fn failed(id: Value, failure: &Failure) -> Response {
    let status = match failure {
        Failure::TooManyConversations(_) | Failure::TooManyTasks(_) | Failure::TooManyTasksOfClient(_) => {
            failure.http_status()
        }
        _ => StatusCode::OK,
    };
    reply(status, &error(id, failure.jsonrpc_code(), &failure.message()))
}

/// Which generation of A2A a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generation {
    V1_0,
    V0_3,
}

impl Generation {
    /// True when an `A2A-Version` header of `version` may come with this generation's methods.
    fn accepts(self, version: &str) -> bool {
        match self {
            Generation::V1_0 => version == "1" || version.starts_with("1."),
            Generation::V0_3 => version == "0.3" || version.starts_with("0.3."),
        }
    }

    /// The media type of the answer: A2A 1.0's own when the client named it, else plain JSON,
    /// which every client of either generation reads.
    fn content_type(self, headers: &HeaderMap) -> &'static str {
        let names_a2a = [header::CONTENT_TYPE, header::ACCEPT].iter().any(|name| {
            headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains(A2A_MEDIA_TYPE))
        });
        if self == Generation::V1_0 && names_a2a { A2A_MEDIA_TYPE } else { "application/json" }
    }
}
