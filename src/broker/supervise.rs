//! One broker connection kept up for as long as the daemon runs, for every part of silpgate
//! that holds a connection of its own (the AMQP door, the push courier).
//!
//! A round tries each broker node once ([`Addresses`]); a connection that worked and was lost
//! is followed at once by the next node, and a round that failed everywhere (or a connection
//! that died young) by a capped, jittered backoff. What a connection is for is the
//! [`Client`]'s: readying it, serving through it, saying goodbye.

use super::addresses::{Address, Addresses, Node};
use super::ending::Ending;
use crate::util::backoff::{Backoff, STEADY};
use crate::util::shutdown::Shutdown;
use lapin::{Connection, ConnectionProperties};
use std::time::Duration;
use tracing::warn;

/// How long one broker node may take to accept a connection before the next one is tried: a
/// node that is down refuses at once, one that is unreachable would otherwise hold the attempt
/// for the system's TCP timeout (minutes). Only the connection itself is bounded: declaring a
/// cluster's topology on a busy broker may take longer, and is no sign of a dead node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a goodbye (the broker's part of a close) may take: the broker puts back whatever
/// was not acknowledged when the connection goes, so a broker that does not answer must not
/// keep the process from exiting.
pub(crate) const BROKER_GOODBYE: Duration = Duration::from_secs(5);

/// How one connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Told to stop.
    Shutdown,
    /// The connection (or a channel of it) failed: connect again.
    Lost(String),
    /// Going on could do harm (the store is damaged): stop, with why.
    Fatal(String),
}

impl From<Ending> for Ended {
    fn from(why: Ending) -> Self {
        match why {
            Ending::Broken(why) => Ended::Lost(why),
            Ending::StoreDamaged(why) => Ended::Fatal(why),
        }
    }
}

/// The node a connection reached, and the broker user it authenticated as.
pub(crate) struct Reached {
    pub node: Node,
    pub user: String,
}

/// What a kept connection is for.
pub(crate) trait Client {
    /// What a readied connection serves through (its channels, its consumers).
    type Opened;

    /// Readies a fresh connection: declares what it needs, opens its channels. A failure
    /// moves on to the next node.
    async fn open(&mut self, connection: &Connection) -> lapin::Result<Self::Opened>;

    /// Serves through the connection until it is lost, until going on would do harm, or
    /// until `shutdown` (finishing what it holds first).
    async fn serve(
        &mut self,
        connection: &Connection,
        opened: Self::Opened,
        reached: &Reached,
        shutdown: Shutdown,
    ) -> Ended;

    /// Says goodbye to a connection after its `serve` (a connection that `open` could not
    /// ready is closed by the supervisor itself).
    async fn close(&mut self, connection: &Connection) {
        goodbye(connection, "silpgate closing").await;
    }
}

/// Closes `connection`, waiting at most [`BROKER_GOODBYE`] for the broker.
pub(crate) async fn goodbye(connection: &Connection, why: &str) {
    let _ = tokio::time::timeout(BROKER_GOODBYE, connection.close(200, why.into())).await;
}

/// Keeps `client` connected until `shutdown` (then `Ok`) or until it ends [`Ended::Fatal`]
/// (then `Err` with why). `what` names the client in the log.
///
/// # Errors
/// The client's fatal ending.
pub(crate) async fn supervise<C: Client>(
    what: &str,
    client: &mut C,
    mut addresses: Addresses,
    mut backoff: Backoff,
    mut shutdown: Shutdown,
) -> Result<(), String> {
    loop {
        if shutdown.is_stopping() {
            return Ok(());
        }
        let connected = tokio::select! {
            connected = connect(&mut addresses, client) => connected,
            () = shutdown.stopped() => return Ok(()),
        };
        let ended = match connected {
            Ok((connection, opened, reached)) => {
                let since = std::time::Instant::now();
                let ended = client.serve(&connection, opened, &reached, shutdown.clone()).await;
                client.close(&connection).await;
                if let Ended::Lost(_) = ended {
                    crate::metrics::get().broker_reconnects.inc();
                }
                backoff.connection_ended(since.elapsed());
                match ended {
                    Ended::Lost(reason) if since.elapsed() >= STEADY && addresses.len() > 1 => {
                        warn!(client = what, broker = %reached.node, error = %reason, "Broker connection lost; trying the next node at once.");
                        continue;
                    }
                    Ended::Lost(reason) => Ended::Lost(format!("{}: {reason}", reached.node)),
                    ended => ended,
                }
            }
            Err(e) => Ended::Lost(e),
        };
        match ended {
            Ended::Shutdown => return Ok(()),
            Ended::Fatal(why) => return Err(why),
            Ended::Lost(reason) => {
                let delay = backoff.next_delay();
                warn!(client = what, brokers = ?addresses.nodes(), error = %reason, retry_in_ms = delay.as_millis() as u64, "No broker connection; retrying.");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.stopped() => return Ok(()),
                }
            }
        }
    }
}

/// One round: the first node that connects and that `client` readies. The error is text fit
/// for the log: it names nodes as `host:port` and never holds a URI.
async fn connect<C: Client>(
    addresses: &mut Addresses,
    client: &mut C,
) -> Result<(Connection, C::Opened, Reached), String> {
    let mut failures = Vec::with_capacity(addresses.len());
    let rounds: Vec<(usize, Address)> = addresses.round().map(|(i, a)| (i, a.clone())).collect();
    for (index, address) in rounds {
        let failure = match connect_to(&address, CONNECT_TIMEOUT).await {
            Ok(connection) => match client.open(&connection).await {
                Ok(opened) => {
                    addresses.connected(index);
                    let user = address.uri.authority.userinfo.username.clone();
                    return Ok((connection, opened, Reached { node: address.node, user }));
                }
                Err(e) => {
                    goodbye(&connection, "silpgate could not ready the connection").await;
                    format!("{}: {e}", address.node)
                }
            },
            Err(e) => e,
        };
        warn!(error = %failure, "Cannot connect to a broker node.");
        failures.push(failure);
    }
    Err(failures.join("; "))
}

/// A connection to the first node of a round that accepts one within `timeout`, for a
/// one-off check that needs no supervisor.
///
/// # Errors
/// Why each node failed, named as `host:port`.
pub(crate) async fn connect_any(addresses: &Addresses, timeout: Duration) -> Result<Connection, String> {
    let mut failures = Vec::with_capacity(addresses.len());
    for (_, address) in addresses.round() {
        match connect_to(address, timeout).await {
            Ok(connection) => return Ok(connection),
            Err(e) => failures.push(e),
        }
    }
    Err(failures.join("; "))
}

/// A connection to `address` within `timeout`, or why not, naming the node.
async fn connect_to(address: &Address, timeout: Duration) -> Result<Connection, String> {
    match tokio::time::timeout(timeout, address.connect(ConnectionProperties::default())).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(format!("{}: {e}", address.node)),
        Err(_) => Err(format!("{}: no connection within {timeout:?}", address.node)),
    }
}
