//! The daemon's stop signal, as every task waits for it: a `watch` that turns true once.

use tokio::sync::watch;

/// Completes once `shutdown` turns true, or once its sender is gone.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, before any caller's next await.
    let _ = shutdown.wait_for(|stop| *stop).await;
}
