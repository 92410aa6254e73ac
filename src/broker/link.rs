//! The AMQP side's current connection, as everything outside the AMQP side sees it: agents'
//! connectors publish through it, answers' return paths and the intake's cluster steps too.
//! The AMQP side owns the connection and reconnects on its own; the link says which one is up
//! now, or that none is.

use super::ending::Endings;
use super::publish::Publisher;
use tokio::sync::watch;

/// The AMQP side's current connection, as agents' connectors see it.
#[derive(Clone)]
pub(crate) struct Link {
    /// A confirm-mode channel.
    pub publisher: Publisher,
    /// The agents exchange parcels are published to.
    pub exchange: String,
    /// Where agents answer silpgate.
    pub reply_queue: String,
    /// The broker user the connection authenticated as (a front-door message forwarded to its
    /// partition's owner carries it as the broker-checked `user_id`).
    pub user: String,
    /// Told when a publish finds the channel broken, so that the AMQP side reconnects.
    pub endings: Endings,
}

/// Follows the AMQP side's connection: `None` while it is down.
#[derive(Clone)]
pub(crate) struct BrokerLink(watch::Receiver<Option<Link>>);

impl BrokerLink {
    /// A link and the sender the AMQP side updates it through.
    pub(crate) fn new() -> (watch::Sender<Option<Link>>, BrokerLink) {
        let (tx, rx) = watch::channel(None);
        (tx, BrokerLink(rx))
    }

    /// The connection now, if there is one.
    pub(crate) fn current(&self) -> Option<Link> {
        self.0.borrow().clone()
    }
}
