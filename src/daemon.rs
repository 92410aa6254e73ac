//! `silpgate run`: opens the store, builds the gateway, serves the HTTP/WebSocket front door
//! and, when configured, the AMQP side and the upstream WebSocket streams; sweeps expired state in the background; and shuts down
//! cleanly on SIGTERM or SIGINT (stop accepting and consuming, let in-flight work finish, flush
//! the store, exit 0).

use crate::broker::link::BrokerLink;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::connectors::{Agents, AnswerPath, AnswerSink};
use crate::doors::a2a::courier::Courier;
use crate::doors::amqp::{Amqp, AmqpError};
use crate::doors::stream::Stream;
use crate::doors::{Front, auth::Tokens, http, listener, tls};
use crate::gateway::Gateway;
use crate::gateway::store::Store;
use crate::intake::Intake;
use crate::store::{Retention, SledStore};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot open the store: {0}")]
    Store(#[from] crate::gateway::store::StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
    #[error("cannot install the SIGTERM and SIGINT handlers: {0}")]
    Signals(std::io::Error),
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Tls(String),
    #[error("[a2a] push notifications: {0}")]
    Push(String),
    #[error("[[agents]]: {0}")]
    Agents(#[from] crate::connectors::SetupError),
    #[error("[http] authentication: {0}")]
    Auth(#[from] crate::doors::auth::AuthError),
    #[error(transparent)]
    KeySet(#[from] crate::doors::jwt::KeySetError),
    #[error(transparent)]
    Amqp(#[from] AmqpError),
    #[error("[[streams]]: {0}")]
    Streams(#[from] crate::doors::stream::StreamError),
}

/// A started daemon, ready to serve.
pub struct Daemon {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    front: Arc<Front>,
    store: Arc<SledStore>,
    amqp: Option<Amqp>,
    streams: Vec<Stream>,
    /// Delivers the A2A door's push notifications, when they are offered.
    courier: Option<Courier>,
}

/// Overrides from the command line.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub store: Option<PathBuf>,
    /// The file the configuration was read from: a reload reads it again.
    pub config_file: Option<PathBuf>,
}

/// The store the core and the AMQP door keep their state in: the sled store. A build with the
/// `bench-memory-store` feature hands them an in-memory store instead, which keeps nothing
/// across a restart: it exists only so that benches/bench-amqp-memory.sh can show what the
/// durable state costs.
fn core_store(store: &Arc<SledStore>) -> Arc<dyn Store> {
    #[cfg(feature = "bench-memory-store")]
    {
        let _ = store;
        tracing::warn!(
            "This build keeps its state in memory (feature bench-memory-store): nothing survives a restart."
        );
        Arc::new(crate::gateway::store::MemoryStore::new())
    }
    #[cfg(not(feature = "bench-memory-store"))]
    store.clone()
}

/// Opens everything the configuration names and binds the listener.
pub async fn start(config: Config, overrides: Overrides) -> Result<Daemon, RunError> {
    if !config.tls() && !config.http.plain {
        return Err(RunError::Tls(
            "no TLS certificate is configured (http.tls_cert, http.tls_key); set http.plain = true to serve plain HTTP for local use".into(),
        ));
    }
    let store_dir = overrides.store.unwrap_or_else(|| config.store.path.clone());
    let key =
        crate::store::chain::key_from_env(config.store.hmac_key_env.as_deref()).map_err(RunError::Key)?;
    let store = Arc::new(SledStore::open(&store_dir, key)?);
    let jwts = crate::doors::jwt::Jwts::new(&config.auth).await?;
    let auth = Tokens::new(&config.http.tokens, config.http.tokens_env.as_deref(), &config.auth.tokens)?
        .with_jwts(jwts);
    if auth.is_open() {
        tracing::warn!(
            "HTTP and WebSocket clients are not authenticated: no [http] tokens or tokens_env configured."
        );
    }
    // A bad certificate stops the start before anything listens.
    let tls = match (&config.http.tls_cert, &config.http.tls_key) {
        (Some(cert), Some(key)) => {
            Some(tls::acceptor(cert, key, config.http.min_tls).map_err(RunError::Tls)?)
        }
        _ => None,
    };
    let listen = overrides.listen.unwrap_or_else(|| config.http.listen.clone());
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|source| RunError::Listen { addr: listen.clone(), source })?;
    let limits = config.nlip.limits();
    let streams =
        config.streams.iter().map(|s| Stream::new(s, limits.max_bytes)).collect::<Result<Vec<_>, _>>()?;
    let config = Arc::new(config);
    let cluster = config.cluster.clone().map(|c| {
        // A takeover waits for a running owner's hand-over as long as that owner may drain.
        let handover_wait = Duration::from_secs(config.amqp.as_ref().map_or(30, |a| a.drain_secs));
        let streams = config.streams.iter().map(|s| s.name.clone()).collect();
        Arc::new(Cluster::new(c, store.clone(), handover_wait).with_streams(streams))
    });
    let (link, broker) = BrokerLink::new();
    let answers = AnswerSink::new();
    let agents = Agents::new(&config, config.amqp.is_some().then_some(broker.clone()), answers.clone())?;
    let core_store = core_store(&store);
    let mut intake = Intake::new(Gateway::new(config.clone(), core_store.clone()), agents);
    if let Some(cluster) = &cluster {
        // Front-door messages share what they froze and learnt on the lock stream, as the
        // partition owners do.
        intake = intake.in_cluster(cluster.clone(), broker.clone());
    }
    let intake = Arc::new(intake);
    let answer_path: std::sync::Weak<dyn AnswerPath> = Arc::downgrade(&intake) as std::sync::Weak<Intake>;
    answers.bind(answer_path);
    // A reload asks the AMQP side to declare the queues of the agents it adds.
    let (declares, declare_requests) = match config.amqp {
        Some(_) => {
            let (asks, requests) = tokio::sync::mpsc::channel(1);
            (Some(asks), Some(requests))
        }
        None => (None, None),
    };
    let text = overrides.config_file.as_ref().and_then(|path| std::fs::read_to_string(path).ok());
    let reloader: Arc<dyn crate::doors::admin::Reload> = Arc::new(crate::reload::Reloader::new(
        overrides.config_file.clone(),
        text,
        core_store.clone(),
        (config.amqp.is_some().then(|| broker.clone()), answers.clone()),
        declares,
    ));
    let amqp = config.amqp.clone().map(|amqp| {
        Amqp::new(config.clone(), amqp, core_store.clone(), cluster.clone(), intake.clone(), (link, broker))
            .with_declares(declare_requests)
    });
    let (written, courier_takes) = match (&config.amqp, config.a2a.pushes()) {
        (Some(_), true) => {
            let (written, taken) = tokio::sync::mpsc::unbounded_channel();
            (Some(written), Some(taken))
        }
        _ => (None, None),
    };
    let a2a_tasks = Arc::new(crate::doors::a2a::tasks::TaskBook::load(
        Some(store.kept("a2a_tasks")?),
        &config.a2a,
        written,
    )?);
    let courier = match (courier_takes, &config.amqp) {
        (Some(taken), Some(amqp)) => Some(
            Courier::new(amqp.clone(), config.a2a.clone(), a2a_tasks.clone(), taken)
                .map_err(RunError::Push)?,
        ),
        _ => None,
    };
    let card_signer = match (&config.a2a.card_signing_key_file, &config.a2a.card_signing_kid) {
        (Some(path), Some(kid)) => Some(
            crate::a2a::signature::CardSigner::read(path, kid)
                .map_err(|e| RunError::Key(format!("a2a.card_signing_key_file: {e}")))?,
        ),
        _ => None,
    };
    let front = Arc::new(Front {
        a2a_tasks,
        card_signer,
        reloader,
        broker: amqp.as_ref().map(Amqp::health),
        cluster,
        auth: std::sync::RwLock::new(Arc::new(auth)),
        ws_ping: Duration::from_secs(config.http.ws_ping_secs.max(1)),
        ws_dead: Duration::from_secs(config.http.ws_dead_secs.max(1)),
        clients: crate::doors::limit::PerClient::new(config.http.client_rate, config.http.client_burst),
        observability_tokens: config.http.observability_tokens,
        allowed_origins: config.http.allowed_origins.clone(),
        trusted_proxies: config.http.trusted_proxies.clone(),
        conversations: crate::doors::limit::Conversations::new(
            config.http.max_conversations_per_client,
            Duration::from_secs(config.sessions.idle_timeout_secs.max(1)),
        ),
        connection_rate: (config.http.connection_rate, config.http.connection_burst),
        body_timeout: Duration::from_secs(config.http.body_timeout_secs.max(1)),
        public_url: match &config.http.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let scheme = if config.tls() { "https" } else { "http" };
                let bound = listener.local_addr().map_or_else(|_| listen.clone(), |a| a.to_string());
                format!("{scheme}://{bound}")
            }
        },
        limits,
        intake,
    });
    Ok(Daemon { listener, tls, front, store, amqp, streams, courier })
}

impl Daemon {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The base URL clients use: https when TLS is configured.
    pub(crate) fn base_url(&self) -> std::io::Result<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Ok(format!("{scheme}://{}", self.local_addr()?))
    }

    /// Serves until `shutdown` completes or the AMQP side fails for good, then drains the AMQP
    /// side and flushes the store.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), RunError> {
        let Daemon { listener, tls, front, store, amqp, streams, courier } = self;
        let (stop, stopped) = crate::util::shutdown::Shutdown::new();
        let courier = courier.map(|courier| tokio::spawn(courier.run(stopped.clone())));
        let amqp = amqp.map(|amqp| tokio::spawn(amqp.run(stopped.clone())));
        let streams: Vec<_> =
            streams.into_iter().map(|s| tokio::spawn(s.run(front.clone(), stopped.clone()))).collect();
        let (http_stop, http_stopped) = (stop.clone(), stopped.clone());
        tokio::spawn(async move {
            shutdown.await;
            http_stop.stop();
        });
        let a2a_tasks = front.a2a_tasks.clone();
        let expiry = tokio::spawn(front.intake.clone().expire_forever());
        let hangups = tokio::spawn(crate::reload::on_hangup(front.reloader.clone(), front.clone()));
        let core = front.core();
        let sweeper = tokio::spawn(sweep_forever(store.clone(), retention(core.gateway.config())));
        let bounds = bounds(core.gateway.config());
        drop(core);
        let app = (http::router(front.clone()), http::probes(front));
        let http_shutdown = async move {
            let mut http_stopped = http_stopped;
            http_stopped.stopped().await;
        };
        let http = async {
            listener::serve(listener, tls, app, bounds, http_shutdown).await.map_err(RunError::Serve)
        };
        // The AMQP side stopping on its own (a damaged store) stops the listener as well.
        let amqp_result = async {
            match amqp {
                Some(task) => {
                    let result = task.await.unwrap_or(Ok(()));
                    stop.stop();
                    result
                }
                None => Ok(()),
            }
        };
        // Streams stop reading when told and finish what they read.
        let streams = futures_util::future::join_all(streams);
        let (served, amqp_result, _) = tokio::join!(http, amqp_result, streams);
        // The A2A door's tasks still working cannot be finished after the stop: they fail now,
        // and the agents are told to cancel what they work on for them.
        a2a_tasks.interrupt(Duration::from_secs(2)).await;
        crate::connectors::a2a::cancels_sent(Duration::from_secs(3)).await;
        if let Some(courier) = courier {
            let _ = courier.await;
        }
        sweeper.abort();
        expiry.abort();
        hangups.abort();
        store.flush_async().await?;
        served?;
        amqp_result.map_err(RunError::from)
    }
}

fn bounds(config: &Config) -> listener::Bounds {
    let http = &config.http;
    listener::Bounds {
        max_connections: http.max_connections.max(1),
        header_timeout: Duration::from_secs(http.header_timeout_secs.max(1)),
        handshake_timeout: Duration::from_secs(http.handshake_timeout_secs.max(1)),
        drain: Duration::from_secs(config.amqp.as_ref().map_or(30, |a| a.drain_secs)),
    }
}

fn retention(config: &Config) -> Retention {
    Retention {
        ledger_ttl_ms: config.store.ledger_ttl_secs.saturating_mul(1000),
        ledger_max_entries: config.store.ledger_max_entries,
        session_idle_ms: config.sessions.idle_timeout_secs.saturating_mul(1000),
        tombstone_ms: config.store.tombstone_secs.saturating_mul(1000),
    }
}

/// Expires idle sessions and trims the ledger once a minute, and refreshes the store gauges.
async fn sweep_forever(store: Arc<SledStore>, retention: Retention) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    loop {
        every.tick().await;
        let store = store.clone();
        let swept = tokio::task::spawn_blocking(move || {
            let swept = store.sweep(crate::util::time::now_millis(), &retention);
            // The store's size, for the dashboards: live sessions and compile.lock records.
            let metrics = crate::metrics::get();
            if let Ok(sessions) = store.sessions() {
                metrics.sessions.set(sessions.iter().filter(|s| !s.expired).count() as i64);
            }
            if let Ok(head) = store.lock_head() {
                metrics.lock_records.set(i64::try_from(head.records).unwrap_or(i64::MAX));
            }
            swept
        })
        .await;
        if let Ok(Err(e)) = swept {
            tracing::warn!(error = %e, "Sweeping the store failed.");
        }
    }
}

/// A future that completes on SIGTERM or SIGINT. The handlers are installed by this call, not
/// at the future's first poll: a signal that arrives once the daemon has said it is listening,
/// but before the task awaiting the future has run, must stop it cleanly (store flushed,
/// exit 0) instead of killing it with the signal's default action.
pub(crate) fn signals() -> Result<impl Future<Output = ()> + Send + 'static, RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
