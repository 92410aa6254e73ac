//! Push notifications, as the A2A door's tasks hold them: a task's push notification configs
//! (A2A 1.0's `TaskPushNotificationConfig`: where the webhook is, the token it expects, the
//! credentials to present), each checked against `a2a.push_origins` when it is set; and the
//! notifications a change of the task makes, one per config, which wait in the task's record
//! until the broker has them ([`super::courier`] takes them from there).

use super::failure::Failure;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Longest webhook URL taken, in bytes: far above any real one.
const MAX_URL_BYTES: usize = 2048;

/// One push notification config of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushConfig {
    pub id: String,
    pub url: String,
    /// Sent as `X-A2A-Notification-Token`, for the webhook to check that a notification is
    /// about a task it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A2A's `AuthenticationInfo` (`scheme`, `credentials`): sent as `Authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// Made by an A2A 0.3 client: its webhook is sent the task, whole, in 0.3's shape, at
    /// each change (what 0.3 sends), rather than 1.0's `StreamResponse` events.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub v0_3: bool,
}

impl PushConfig {
    /// A config as A2A 1.0 writes it (`id`, `url`, `token`, `authentication`), checked: its
    /// URL must be at one of `origins`, and what goes in headers must fit in one. Without an
    /// `id`, it gets one (a 0.3 client's: its task's id, given by [`PushConfig::of_task`]).
    pub(crate) fn read(config: &Value, origins: &[String]) -> Result<PushConfig, Failure> {
        let invalid = |why: String| Failure::InvalidParams(format!("push notification config: {why}"));
        let text = |name: &str| config.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
        let url = text("url").ok_or_else(|| invalid("url is missing".into()))?;
        if url.len() > MAX_URL_BYTES {
            // Kept with the task and sent on every notification: its size is the client's
            // to choose, so it is bounded here.
            return Err(invalid(format!("url is {} bytes; the longest taken is {MAX_URL_BYTES}", url.len())));
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| invalid(format!("url is not a URL: {e}")))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid(
                "url carries a user name or password; send credentials in authentication".into(),
            ));
        }
        if !at_allowed_origin(&parsed, origins) {
            return Err(invalid(format!(
                "webhooks at {} are not allowed here (a2a.push_origins names where they may be)",
                parsed.origin().ascii_serialization()
            )));
        }
        let authentication = config.get("authentication").filter(|a| !a.is_null());
        let scheme =
            authentication.and_then(|a| a.get("scheme")).and_then(Value::as_str).filter(|s| !s.is_empty());
        let credentials = authentication
            .and_then(|a| a.get("credentials"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if credentials.is_some() && scheme.is_none() {
            return Err(invalid("authentication.credentials needs authentication.scheme".into()));
        }
        let token = text("token");
        for (name, value) in [("token", token), ("authentication", scheme), ("authentication", credentials)] {
            if value.is_some_and(|v| axum::http::HeaderValue::from_str(v).is_err() || v.len() > 4096) {
                return Err(invalid(format!("{name} is not something an HTTP header can carry")));
            }
        }
        let v0_3 = config.get(crate::a2a::v0_3::PUSHED_AS_0_3) == Some(&Value::Bool(true));
        let id = match text("id") {
            Some(id) if id.len() > 128 => return Err(invalid("id is longer than 128 characters".into())),
            // A notification's lane is `<task>/<config id>`: a `/` would make two lanes one.
            Some(id) if id.contains('/') => return Err(invalid("id may not hold '/'".into())),
            Some(id) => id.to_owned(),
            // 0.3 names a task's config by the task's id; the task names it once it exists.
            None if v0_3 => String::new(),
            None => format!("push-{}", crate::util::token::unguessable()),
        };
        Ok(PushConfig {
            id,
            url: url.to_owned(),
            token: token.map(str::to_owned),
            scheme: scheme.map(str::to_owned),
            credentials: credentials.map(str::to_owned),
            v0_3,
        })
    }

    /// The config, named after task `task_id` if it has no name yet.
    pub(crate) fn of_task(mut self, task_id: &str) -> PushConfig {
        if self.id.is_empty() {
            self.id = task_id.to_owned();
        }
        self
    }

    /// The config as A2A 1.0 writes it, for task `task_id`. The credentials are never shown
    /// back: they were given to be sent to the webhook, not to be read again.
    pub(crate) fn to_a2a(&self, task_id: &str) -> Value {
        let mut config = json!({"id": self.id, "taskId": task_id, "url": self.url});
        if let Some(token) = &self.token {
            config["token"] = json!(token);
        }
        if let Some(scheme) = &self.scheme {
            config["authentication"] = json!({"scheme": scheme});
        }
        config
    }

    /// What this config's webhook is sent about a change: `payload`, a `StreamResponse`.
    pub(crate) fn notification(&self, task_id: &str, seq: u64, payload: Value) -> Notification {
        Notification {
            id: format!("{task_id}/{}/{seq}", self.id),
            task: task_id.to_owned(),
            lane: format!("{task_id}/{}", self.id),
            seq,
            url: self.url.clone(),
            token: self.token.clone(),
            authorization: self.scheme.as_ref().map(|scheme| match &self.credentials {
                Some(credentials) => format!("{scheme} {credentials}"),
                None => scheme.clone(),
            }),
            created: crate::util::time::now_millis(),
            payload,
        }
    }
}

/// True when `url` is at one of `origins` (scheme, host and port).
pub(crate) fn at_allowed_origin(url: &reqwest::Url, origins: &[String]) -> bool {
    let origin = url.origin().ascii_serialization();
    origins.iter().any(|allowed| allowed.trim_end_matches('/').eq_ignore_ascii_case(&origin))
}

/// One notification, as it waits in its task's record and then in the push queue: everything
/// its delivery needs travels with it, so that any instance can deliver it (in a cluster the
/// queue's one active consumer may not be the instance that keeps the task).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Notification {
    /// Unique and stable across redeliveries (`task/config/sequence`): a webhook that may see
    /// one twice (after a crash between the broker's confirm and the record's trim) can tell.
    pub id: String,
    pub task: String,
    /// Notifications of one lane (one config of one task) are delivered in order.
    pub lane: String,
    /// Its place among its task's notifications, so rising along each lane: a copy of one
    /// already delivered is known by it.
    #[serde(default)]
    pub seq: u64,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<String>,
    /// When the change happened, in milliseconds since the Unix epoch.
    pub created: u64,
    /// The A2A `StreamResponse` the webhook is sent.
    pub payload: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGINS: [&str; 1] = ["https://hooks.example.com"];

    fn read(config: Value) -> Result<PushConfig, Failure> {
        PushConfig::read(&config, &ORIGINS.map(str::to_owned))
    }

    #[test]
    fn a_config_at_an_allowed_origin_is_taken_and_its_credentials_are_never_shown_back() {
        let config = read(json!({"url": "https://hooks.example.com/a2a?x=1", "token": "t",
            "authentication": {"scheme": "Bearer", "credentials": "secret"}}))
        .unwrap();
        assert!(config.id.starts_with("push-"));
        let shown = config.to_a2a("task-1");
        assert_eq!(shown["authentication"], json!({"scheme": "Bearer"}));
        assert!(!shown.to_string().contains("secret"));
        let note = config.notification("task-1", 3, json!({"task": {}}));
        assert_eq!(note.authorization.as_deref(), Some("Bearer secret"));
        assert_eq!(note.id, format!("task-1/{}/3", config.id));
    }

    #[test]
    fn a_config_elsewhere_or_with_what_a_header_cannot_carry_is_refused_saying_why() {
        let refused = |config: Value, says: &str| {
            let Failure::InvalidParams(why) = read(config).unwrap_err() else { panic!("not invalid params") };
            assert!(why.contains(says), "{why}");
        };
        refused(json!({"url": "https://evil.example.com/hook"}), "https://evil.example.com are not allowed");
        refused(json!({"url": "http://hooks.example.com/hook"}), "not allowed");
        refused(json!({"url": "https://hooks.example.com:8443/hook"}), "not allowed");
        refused(json!({"url": "https://u:p@hooks.example.com/"}), "user name or password");
        refused(json!({"token": "t"}), "url is missing");
        let long = format!("https://hooks.example.com/{}", "a".repeat(2048));
        refused(json!({ "url": long }), "the longest taken is 2048");
        refused(json!({"url": "https://hooks.example.com/", "id": "a/b"}), "'/'");
        refused(json!({"url": "https://hooks.example.com/", "token": "a\nb"}), "token");
        refused(
            json!({"url": "https://hooks.example.com/", "authentication": {"credentials": "c"}}),
            "scheme",
        );
    }
}
