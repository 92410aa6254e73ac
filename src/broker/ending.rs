//! Why a broker connection has to end, told by whoever finds out (a worker, an agent
//! connector, cluster mode's tasks) to the supervisor that holds the connection, which listens
//! for it beside its deliveries: a broken channel means reconnect; a damaged store means stop
//! consuming at once, so that nothing more is acknowledged.

use tokio::sync::mpsc;

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A channel of the connection failed: reconnect.
    Broken(String),
    /// The store refused to read or write state it holds: stop.
    StoreDamaged(String),
}

/// The sending side, cloned into everything that uses the connection.
#[derive(Debug, Clone)]
pub(crate) struct Endings(mpsc::UnboundedSender<Ending>);

impl Endings {
    /// A sender, and the receiver the supervisor listens on.
    pub(crate) fn new() -> (Endings, mpsc::UnboundedReceiver<Ending>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Endings(tx), rx)
    }

    /// The connection is unusable: the supervisor reconnects.
    pub(crate) fn broken(&self, why: impl std::fmt::Display) {
        let _ = self.0.send(Ending::Broken(why.to_string()));
    }

    /// The store is damaged: the supervisor stops the AMQP side, and the daemon with it.
    pub(crate) fn store_damaged(&self, why: impl std::fmt::Display) {
        let _ = self.0.send(Ending::StoreDamaged(why.to_string()));
    }
}
