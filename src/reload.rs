//! Reading the configuration file again while running: on SIGHUP, and on `POST /admin/reload`
//! (`silpgate config reload`). What a reload may change, the check that refuses the rest by
//! name, and the swap.
//!
//! A reload applies the agents (`[[agents]]`), the routes (`[[routes]]`), `[auth]` (static
//! tokens, JWT and JWKS settings, allow rules, broker roles, MCP tool rules), the HTTP tokens
//! (`http.tokens`, `http.tokens_env`), the per-client limits (`http.client_rate`,
//! `http.client_burst`, `http.max_conversations_per_client`), the A2A door's task bounds
//! (`a2a.max_tasks`, `max_tasks_per_client`, `task_ttl_secs`, `max_push_configs`), where
//! webhooks may be (`a2a.push_origins`, as long as push notifications stay on, or stay off:
//! turning them on or off starts or stops the courier, at a restart), the log filter
//! (`telemetry.log_filter`, unless `SILPGATE_LOG` sets it) and the share of traces exported
//! (`telemetry.sample_ratio`, from the next trace on). Everything else is read at start
//! only: a file that changes any other setting is refused, naming each, and nothing of it is
//! applied.
//!
//! The file must pass what `silpgate config check` checks, the tokens and JWKS must load, and
//! the broker must have declared a new AMQP agent's queue, before anything changes. Then the
//! new core (gateway and agents' connectors) and the new tokens replace the old ones, each in
//! one step: a message or request already under way finishes under the configuration it
//! started with, the next one starts under the new one. No connection is dropped and no
//! message is refused because of a reload.

use crate::config::{AgentConfig, Config, ConfigError};
use crate::connectors::{Agents, AnswerSink};
use crate::doors::Front;
use crate::doors::admin::{Loaded, Refusal, Refused, Reload, Reloaded};
use crate::doors::amqp::Declare;
use crate::doors::auth::Tokens;
use crate::gateway::Gateway;
use crate::gateway::store::Store;
use crate::intake::Core;
use futures_util::future::BoxFuture;
use sha2::Digest;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Top-level sections a reload applies as a whole.
const RELOADED_SECTIONS: [&str; 3] = ["agents", "routes", "auth"];
/// Settings of other sections a reload applies.
const RELOADED_KEYS: [&str; 12] = [
    "http.tokens",
    "http.tokens_env",
    "http.client_rate",
    "http.client_burst",
    "http.max_conversations_per_client",
    "a2a.max_tasks",
    "a2a.max_tasks_per_client",
    "a2a.task_ttl_secs",
    "a2a.max_push_configs",
    "a2a.push_origins",
    "telemetry.log_filter",
    "telemetry.sample_ratio",
];

/// What `a2a.push_origins` is called when a reload would turn push notifications on or off.
const PUSH_ON_OR_OFF: &str = "a2a.push_origins (from none to some, or from some to none)";

/// Why a reload was refused; the configuration in use stays as it was.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    #[error("silpgate runs on its built-in defaults: there is no configuration file to read again")]
    NoFile,
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error(
        "these settings take effect only at a restart, and the file changes them: {}; a reload applies {} and {}",
        .0.join(", "), RELOADED_SECTIONS.join(", "), RELOADED_KEYS.join(", ")
    )]
    NeedsRestart(Vec<String>),
    #[error("[http] authentication: {0}")]
    Auth(#[from] crate::doors::auth::AuthError),
    #[error(transparent)]
    KeySet(#[from] crate::doors::jwt::KeySetError),
    #[error("[[agents]]: {0}")]
    Agents(#[from] crate::connectors::SetupError),
    #[error("the broker did not declare the agents' queues: {0}")]
    Topology(String),
    #[error("{0}")]
    LogFilter(String),
    #[error("another reload is under way")]
    Busy,
}

impl ReloadError {
    /// How the operator's door refuses it: the kind, the error code and the text.
    fn refused(&self) -> Refused {
        let (kind, code) = match self {
            ReloadError::NeedsRestart(_) => (Refusal::Invalid, "needs_restart"),
            ReloadError::Topology(_) => (Refusal::Unavailable, crate::code::Code::BrokerUnavailable.as_str()),
            ReloadError::Busy => (Refusal::Busy, "reload_in_progress"),
            _ => (Refusal::Invalid, "invalid_config"),
        };
        Refused { kind, code, message: self.to_string() }
    }
}

/// The configuration file in use: its text, its SHA-256 and when it was loaded.
#[derive(Debug, Clone)]
struct File {
    loaded: Loaded,
    text: String,
}

impl File {
    fn of(text: String) -> File {
        let digest = hex(&sha2::Sha256::digest(text.as_bytes()));
        File { loaded: Loaded { digest, at: crate::util::time::now_millis() }, text }
    }
}

/// How long a reload waits for the AMQP side to declare a new agent's queue.
const DECLARE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the configuration file again and applies it ([`Reloader::reload`]).
pub(crate) struct Reloader {
    path: Option<PathBuf>,
    file: Mutex<File>,
    /// One reload at a time.
    busy: tokio::sync::Mutex<()>,
    store: Arc<dyn Store>,
    broker: Option<crate::broker::link::BrokerLink>,
    answers: AnswerSink,
    declares: Option<mpsc::Sender<Declare>>,
}

impl Reloader {
    /// `text`: the file's text as it was loaded at start (`None`: the built-in defaults).
    pub(crate) fn new(
        path: Option<PathBuf>,
        text: Option<String>,
        store: Arc<dyn Store>,
        (broker, answers): (Option<crate::broker::link::BrokerLink>, AnswerSink),
        declares: Option<mpsc::Sender<Declare>>,
    ) -> Reloader {
        let file = Mutex::new(File::of(text.unwrap_or_default()));
        let reloader =
            Reloader { path, file, busy: tokio::sync::Mutex::new(()), store, broker, answers, declares };
        reloader.observe();
        reloader
    }

    fn file(&self) -> File {
        self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Reads the file again and applies it to `front`, or refuses it and changes nothing.
    ///
    /// # Errors
    /// Why it was refused.
    async fn read_again(&self, front: &Front) -> Result<Reloaded, ReloadError> {
        let Ok(_one) = self.busy.try_lock() else { return Err(ReloadError::Busy) };
        let result = self.apply(front).await;
        let metrics = crate::metrics::get();
        match &result {
            Ok(reloaded) => {
                metrics.config_reloads.with_label_values(&["applied"]).inc();
                tracing::info!(digest = %reloaded.loaded.digest, changed = ?reloaded.changed, "Configuration reloaded.");
            }
            Err(e) => {
                metrics.config_reloads.with_label_values(&["refused"]).inc();
                tracing::warn!(error = %e, "Configuration reload refused; the configuration in use is unchanged.");
            }
        }
        result
    }

    async fn apply(&self, front: &Front) -> Result<Reloaded, ReloadError> {
        let path = self.path.as_ref().ok_or(ReloadError::NoFile)?;
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let config = Config::from_file_text(path, &text)?;
        let before = self.file();
        let changed = changed_settings(&before.text, &text)?;
        let mut needs_restart: Vec<String> = changed.iter().filter(|name| !applies(name)).cloned().collect();
        if changed.iter().any(|name| name == "a2a.push_origins")
            && front.a2a_tasks.pushes() != config.a2a.pushes()
        {
            needs_restart.push(PUSH_ON_OR_OFF.to_owned());
        }
        if !needs_restart.is_empty() {
            return Err(ReloadError::NeedsRestart(needs_restart));
        }
        // Everything that can fail comes before the first change.
        let jwts = crate::doors::jwt::Jwts::new(&config.auth).await?;
        let tokens =
            Tokens::new(&config.http.tokens, config.http.tokens_env.as_deref(), &config.auth.tokens)?
                .with_jwts(jwts);
        let log_filter = changed
            .iter()
            .any(|name| name == "telemetry.log_filter")
            .then(|| crate::telemetry::log_filter(&config.telemetry.log_filter))
            .transpose()
            .map_err(ReloadError::LogFilter)?;
        let config = Arc::new(config);
        let agents = Agents::new(&config, self.broker.clone(), self.answers.clone())?;
        self.declare(&config.agents).await?;
        let gateway = Gateway::new(config.clone(), self.store.clone());
        front.intake.replace(Core { gateway, agents });
        *front.auth.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(tokens);
        front.clients.set(config.http.client_rate, config.http.client_burst);
        front.conversations.set_max(config.http.max_conversations_per_client);
        front.a2a_tasks.set_bounds(&config.a2a);
        crate::telemetry::set_sample_ratio(config.telemetry.sample_ratio);
        if let Some(filter) = log_filter
            && !crate::telemetry::set_log_filter(filter)
        {
            tracing::warn!(
                "telemetry.log_filter changed, but SILPGATE_LOG sets the log filter: it stands until a restart."
            );
        }
        let file = File::of(text);
        let loaded = file.loaded.clone();
        *self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = file;
        self.observe();
        Ok(Reloaded { loaded, changed })
    }

    /// Has the AMQP side declare the queues of the AMQP agents that have one (idempotent for
    /// those already there); nothing to do without an AMQP side or such an agent.
    async fn declare(&self, agents: &[AgentConfig]) -> Result<(), ReloadError> {
        let Some(declares) = &self.declares else { return Ok(()) };
        let queued: Vec<AgentConfig> = agents
            .iter()
            .filter(|a| matches!(&a.reach, crate::config::Reach::Amqp(reach) if reach.queue.is_some()))
            .cloned()
            .collect();
        if queued.is_empty() {
            return Ok(());
        }
        let (done, declared) = oneshot::channel();
        let asked = declares.send(Declare { agents: queued, done });
        let answered = tokio::time::timeout(DECLARE_LIMIT, async {
            asked.await.map_err(|_| "the AMQP side has stopped".to_owned())?;
            declared.await.map_err(|_| "the AMQP side has stopped".to_owned())?
        })
        .await;
        match answered {
            Ok(result) => result.map_err(ReloadError::Topology),
            Err(_) => Err(ReloadError::Topology(format!(
                "no answer within {DECLARE_LIMIT:?} (is the broker connected?)"
            ))),
        }
    }

    /// The metrics say which file is loaded and since when.
    fn observe(&self) {
        let loaded = self.file().loaded;
        let metrics = crate::metrics::get();
        metrics.config_info.reset();
        metrics.config_info.with_label_values(&[&loaded.digest]).set(1);
        metrics.config_loaded.set((loaded.at / 1000) as i64);
    }
}

impl Reload for Reloader {
    fn reload<'a>(&'a self, front: &'a Front) -> BoxFuture<'a, Result<Reloaded, Refused>> {
        Box::pin(async move { self.read_again(front).await.map_err(|e| e.refused()) })
    }

    fn loaded(&self) -> Loaded {
        self.file().loaded
    }
}

/// Whether a reload applies the section or setting `name`.
fn applies(name: &str) -> bool {
    RELOADED_SECTIONS.contains(&name) || RELOADED_KEYS.contains(&name)
}

/// The sections (`agents`) and settings (`amqp.prefetch`) whose values differ between two
/// configuration texts: a section reloaded as a whole is named once, any other section by
/// each setting in it that differs.
fn changed_settings(before: &str, after: &str) -> Result<Vec<String>, ConfigError> {
    let table = |text: &str| -> Result<toml::Table, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))
    };
    let (before, after) = (table(before)?, table(after)?);
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    let mut changed = Vec::new();
    // A section one file leaves out is a section of defaults: its settings are compared.
    let empty = toml::Value::Table(toml::Table::new());
    for name in names {
        let (old, new) = (before.get(name), after.get(name));
        if old == new {
            continue;
        }
        let (old, new) = match (old, new) {
            (None, Some(toml::Value::Table(_))) => (Some(&empty), new),
            (Some(toml::Value::Table(_)), None) => (old, Some(&empty)),
            _ => (old, new),
        };
        match (old, new) {
            (Some(toml::Value::Table(old)), Some(toml::Value::Table(new))) if !applies(name) => {
                let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
                keys.sort();
                keys.dedup();
                changed.extend(
                    keys.into_iter().filter(|k| old.get(*k) != new.get(*k)).map(|k| format!("{name}.{k}")),
                );
            }
            _ => changed.push(name.clone()),
        }
    }
    Ok(changed)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reloads on every SIGHUP until the process ends (what it did is logged).
pub(crate) async fn on_hangup(reloader: Arc<dyn Reload>, front: Arc<Front>) {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return tracing::warn!(
            "Cannot install the SIGHUP handler: reload with `silpgate config reload` instead."
        );
    };
    while hangups.recv().await.is_some() {
        let _ = reloader.reload(&front).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_names_each_setting_that_needs_a_restart_and_each_section_it_applies() {
        let before = "[http]\nlisten = \"127.0.0.1:8787\"\ntokens = [\"a\"]\n[amqp]\nurl = \"amqp://x\"\nprefetch = 8\n[[routes]]\nname = \"r\"\ndestination = \"reply\"\nmode = \"passthrough\"\n";
        let after = "[http]\nlisten = \"127.0.0.1:9999\"\ntokens = [\"b\"]\n[amqp]\nurl = \"amqp://x\"\nprefetch = 8\n[store]\npath = \"s\"\n[telemetry]\nlog_filter = \"warn\"\n[[routes]]\nname = \"r2\"\ndestination = \"reply\"\nmode = \"passthrough\"\n";
        let changed = changed_settings(before, after).unwrap();
        assert_eq!(changed, ["http.listen", "http.tokens", "routes", "store.path", "telemetry.log_filter"]);
        let refused: Vec<&String> = changed.iter().filter(|n| !applies(n)).collect();
        assert_eq!(refused, ["http.listen", "store.path"], "a section added is compared setting by setting");
        assert!(changed_settings(before, before).unwrap().is_empty(), "the same file changes nothing");
    }
}
