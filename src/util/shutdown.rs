//! The stop signal, as every task that must stop waits for it: a signal that turns on once
//! and stays on. The daemon holds the [`Stop`] and turns it on; each task holds a clone of
//! the [`Shutdown`] and asks whether it is stopping, or waits until it is.

use tokio::sync::watch;

/// Turns the signal on, for every [`Shutdown`] made with it.
#[derive(Debug, Clone)]
pub(crate) struct Stop(watch::Sender<bool>);

impl Stop {
    /// Turns the signal on; the ones already on stay on.
    pub(crate) fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// A task's view of the stop signal.
#[derive(Debug, Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A signal, off, and the switch that turns it on.
    pub(crate) fn new() -> (Stop, Shutdown) {
        let (stop, shutdown) = watch::channel(false);
        (Stop(stop), Shutdown(shutdown))
    }

    /// Whether the signal is on.
    pub(crate) fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once the signal is on, or once its [`Stop`] is gone.
    pub(crate) async fn stopped(&mut self) {
        // The guard `wait_for` returns is dropped here, before any caller's next await.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_view_sees_the_signal_once_it_is_on_and_a_gone_switch_ends_the_wait() {
        let (stop, shutdown) = Shutdown::new();
        let mut late = shutdown.clone();
        assert!(!shutdown.is_stopping());
        stop.stop();
        assert!(shutdown.is_stopping() && late.is_stopping());
        late.stopped().await;
        let (stop, mut orphan) = Shutdown::new();
        drop(stop);
        orphan.stopped().await;
        assert!(!orphan.is_stopping(), "a gone switch ends waits without turning the signal on");
    }
}
