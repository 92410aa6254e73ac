//! `[a2a]`: silpgate's own A2A door, beyond what `[http]` says of every door: the tasks it
//! keeps, and the push notifications it sends for them.

use super::ConfigError;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct A2aConfig {
    /// At most this many tasks are kept; at the bound, the oldest finished task is forgotten
    /// to make room, and a request finding every kept task still working is refused. Default
    /// 10000.
    pub max_tasks: usize,
    /// At most this many of the kept tasks still working may be one client's (its principal,
    /// else its address): one client holding slow tasks cannot take every slot. Default 1000.
    pub max_tasks_per_client: usize,
    /// A task is forgotten this long after it last changed. Default 86400 (a day).
    pub task_ttl_secs: u64,
    /// The origins (`https://hooks.example.com`, `http://127.0.0.1:9000`: scheme, host and
    /// port) webhooks may be at. A push notification config whose URL is elsewhere is refused.
    /// Empty (the default): push notifications are not offered, and the card says so. Not
    /// empty: needs `[amqp]`, since every notification goes through a queue on the broker.
    pub push_origins: Vec<String>,
    /// The quorum queue notifications wait in until their webhook takes them. Default
    /// `silpgate.a2a.push`.
    pub push_queue: String,
    /// First and longest wait between two attempts at a webhook, in milliseconds (doubling,
    /// with jitter). Defaults 1000 and 60000.
    pub push_retry_initial_ms: u64,
    pub push_retry_max_ms: u64,
    /// A notification its webhook has not taken this long after the change it reports is
    /// dead-lettered (to `amqp.dead_letter_exchange`). Default 86400 (a day).
    pub push_give_up_secs: u64,
    /// One attempt at a webhook that has not answered within this many milliseconds failed.
    /// Default 10000.
    pub push_timeout_ms: u64,
    /// Push notification configs one task may have. Default 8.
    pub max_push_configs: usize,
    /// PEM certificate authorities `https://` webhooks are verified against, besides the
    /// system's: for webhooks behind a private CA. Verification is never off. Default: none.
    pub push_ca_file: Option<std::path::PathBuf>,
    /// A PEM private key (P-256, Ed25519 or RSA) silpgate signs its own agent card with, and
    /// the key id its signatures name (`card_signing_kid`, required with it). Default: the
    /// card is not signed.
    pub card_signing_key_file: Option<std::path::PathBuf>,
    pub card_signing_kid: Option<String>,
}

impl Default for A2aConfig {
    fn default() -> Self {
        A2aConfig {
            max_tasks: 10_000,
            max_tasks_per_client: 1_000,
            task_ttl_secs: 86_400,
            push_origins: Vec::new(),
            push_queue: "silpgate.a2a.push".into(),
            push_retry_initial_ms: 1_000,
            push_retry_max_ms: 60_000,
            push_give_up_secs: 86_400,
            push_timeout_ms: 10_000,
            max_push_configs: 8,
            push_ca_file: None,
            card_signing_key_file: None,
            card_signing_kid: None,
        }
    }
}

impl A2aConfig {
    /// True when push notifications are offered.
    pub fn pushes(&self) -> bool {
        !self.push_origins.is_empty()
    }

    /// Each push origin must be an origin and nothing more: `scheme://host[:port]`, http(s).
    pub(super) fn check(&self, has_broker: bool) -> Result<(), ConfigError> {
        if self.pushes() && !has_broker {
            return Err(ConfigError::Invalid(
                "a2a.push_origins needs [amqp]: push notifications wait in a queue on the broker".into(),
            ));
        }
        for origin in &self.push_origins {
            let invalid = |why: &str| ConfigError::Invalid(format!("a2a.push_origins: '{origin}': {why}"));
            let url = reqwest::Url::parse(origin).map_err(|e| invalid(&e.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid("webhooks are reached over http or https"));
            }
            if url.origin().ascii_serialization() != origin.trim_end_matches('/') {
                return Err(invalid("an origin is a scheme, a host and a port only (no path, no user)"));
            }
        }
        if self.push_queue.is_empty() {
            return Err(ConfigError::Invalid("a2a.push_queue is empty".into()));
        }
        if self.card_signing_key_file.is_some() && self.card_signing_kid.as_deref().is_none_or(str::is_empty)
        {
            return Err(ConfigError::Invalid(
                "a2a.card_signing_key_file needs a2a.card_signing_kid, the key id its signatures name".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(origins: &[&str], has_broker: bool) -> Result<(), String> {
        let config = A2aConfig {
            push_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..A2aConfig::default()
        };
        config.check(has_broker).map_err(|e| e.to_string())
    }

    #[test]
    fn push_origins_are_origins_only_and_need_the_broker() {
        assert!(checked(&[], false).is_ok());
        assert!(checked(&["https://hooks.example.com", "http://127.0.0.1:9000/"], true).is_ok());
        assert!(checked(&["https://hooks.example.com"], false).unwrap_err().contains("needs [amqp]"));
        for (origin, says) in [
            ("https://hooks.example.com/path", "scheme, a host and a port only"),
            ("https://user@hooks.example.com", "scheme, a host and a port only"),
            ("ftp://hooks.example.com", "http or https"),
            ("hooks.example.com", "relative URL"),
        ] {
            let why = checked(&[origin], true).unwrap_err();
            assert!(why.contains(says), "{origin}: {why}");
        }
    }
}
