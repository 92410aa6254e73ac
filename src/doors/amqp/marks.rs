//! Marks acknowledged messages `Published` in the ledger, many per store write.
//!
//! The mark only matters when a message is delivered again after its publishes were confirmed
//! (the ack was lost): then it is acknowledged without publishing again. Writing it once per
//! message doubled the store's writes; batching costs at most a duplicate publish, with the
//! same `message_id`, for a message whose ack and mark were both lost in a crash.

use crate::gateway::store::{Changes, LedgerState, Store};
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::warn;

/// Most marks written in one batch.
const BATCH: usize = 1024;

/// Where workers send the ids of messages whose publishes were all confirmed.
#[derive(Clone)]
pub(crate) struct Marks {
    tx: mpsc::UnboundedSender<String>,
}

impl Marks {
    /// Starts the writer; it ends, after writing what it was sent, once every `Marks` is dropped.
    pub(crate) fn start(store: Arc<dyn Store>) -> (Marks, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            let mut ids = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut ids, BATCH).await > 0 {
                let changes = Changes {
                    ledger: ids.drain(..).map(|id| (id, LedgerState::Published)).collect(),
                    ..Changes::default()
                };
                if let Err(e) = store.commit(&changes, crate::util::time::now_millis()) {
                    warn!(error = %e, marks = changes.ledger.len(), "Could not mark messages published.");
                }
            }
        });
        (Marks { tx }, writer)
    }

    pub(crate) fn published(&self, message_id: String) {
        // The writer outlives every sender, so this only fails during a crash.
        let _ = self.tx.send(message_id);
    }
}
