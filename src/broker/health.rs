//! What the broker connection can do right now: which node it is connected to, and whether
//! silpgate is holding because the broker cannot commit writes to its quorum queues. `/readyz`,
//! `silpgate cluster status`, the metrics and the AMQP workers all read it from here.

use super::addresses::Node;
use std::sync::Mutex;
use tokio::sync::watch;

/// The broker side's state, shared by the connection supervisor (which writes it) and its
/// readers.
#[derive(Debug)]
pub(crate) struct BrokerHealth {
    node: Mutex<Option<Node>>,
    /// Why silpgate is holding, while it is.
    holding: watch::Sender<Option<String>>,
}

/// What `/readyz` says about the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready(Node),
    NotConnected,
    Holding(String),
}

impl Default for BrokerHealth {
    fn default() -> Self {
        BrokerHealth { node: Mutex::new(None), holding: watch::Sender::new(None) }
    }
}

impl BrokerHealth {
    /// Connected to `node` and consuming.
    pub(crate) fn connected(&self, node: &Node) {
        let metrics = crate::metrics::get();
        metrics.broker_connected.set(1);
        metrics.broker_node.reset();
        metrics.broker_node.with_label_values(&[&node.to_string()]).set(1);
        *self.node.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(node.clone());
    }

    /// The connection is gone. A hold ends with it: the next connection probes afresh.
    pub(crate) fn disconnected(&self) {
        let metrics = crate::metrics::get();
        metrics.broker_connected.set(0);
        metrics.broker_node.reset();
        *self.node.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.resume();
    }

    /// The broker does not commit writes to quorum queues (their majority is lost): nothing
    /// can be made safe, so nothing is attempted until [`resume`](Self::resume).
    pub(crate) fn hold(&self, why: String) {
        crate::metrics::get().broker_holding.set(1);
        self.holding.send_replace(Some(why));
    }

    pub(crate) fn resume(&self) {
        crate::metrics::get().broker_holding.set(0);
        self.holding.send_replace(None);
    }

    pub(crate) fn is_holding(&self) -> bool {
        self.holding.borrow().is_some()
    }

    /// Returns once silpgate is not holding.
    pub(crate) async fn released(&self) {
        let mut holding = self.holding.subscribe();
        let _ = holding.wait_for(Option::is_none).await;
    }

    /// The node connected to, if any.
    pub(crate) fn node(&self) -> Option<Node> {
        self.node.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub(crate) fn readiness(&self) -> Readiness {
        if let Some(why) = self.holding.borrow().clone() {
            return Readiness::Holding(why);
        }
        self.node().map_or(Readiness::NotConnected, Readiness::Ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_hold_makes_it_not_ready_until_resumed_and_releases_its_waiters() {
        let health = std::sync::Arc::new(BrokerHealth::default());
        assert_eq!(health.readiness(), Readiness::NotConnected);
        let node = Node { host: "127.0.0.1".into(), port: 5673 };
        health.connected(&node);
        assert_eq!(health.readiness(), Readiness::Ready(node.clone()));
        health.hold("quorum writes are not confirmed".into());
        assert!(matches!(health.readiness(), Readiness::Holding(why) if why.contains("quorum")));
        let waiter = tokio::spawn({
            let health = health.clone();
            async move { health.released().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a waiter must wait while holding");
        health.resume();
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("released").unwrap();
        assert_eq!(health.readiness(), Readiness::Ready(node));
        health.disconnected();
        assert_eq!(health.readiness(), Readiness::NotConnected);
    }
}
