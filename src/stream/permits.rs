//! A stream's share of `kubernetes.maxConcurrentSyncs`: the permit a sync holds while it reads
//! from the API server, lent back while it waits for Kafka.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::machine::Stop;

/// A stream's share of `kubernetes.maxConcurrentSyncs` (see [`Permit`]).
pub(super) struct Syncs {
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    /// The sync permit, while syncing.
    pub(super) held: Permit,
}

/// A stream's share of `kubernetes.maxConcurrentSyncs`. A sync holds a permit while it reads
/// from the API server, and lends it back while it waits for Kafka: one partition that stops
/// acknowledging must not hold every permit and keep unrelated streams from syncing.
pub(super) enum Permit {
    /// Not syncing.
    None,
    Held(#[expect(dead_code, reason = "held for its drop")] tokio::sync::OwnedSemaphorePermit),
    /// Syncing, waiting for Kafka: taken again before the next read.
    Lent,
}

impl Syncs {
    /// While a sync waits for Kafka, its permit goes back to the other streams.
    pub(super) fn lend(&mut self) {
        if let Permit::Held(_) = self.held {
            self.held = Permit::Lent;
        }
    }

    /// Before a sync reads on: its permit, taken again if it was lent (unless `stop` fires
    /// first).
    pub(super) async fn reclaim(&mut self, stop: &CancellationToken) -> Result<(), Stop> {
        if let Permit::Lent = self.held {
            let permit = tokio::select! {
                _ = stop.cancelled() => return Err(Stop::Cancelled),
                p = self.permits.clone().acquire_owned() => p.map_err(|_| Stop::Cancelled)?,
            };
            self.held = Permit::Held(permit);
        }
        Ok(())
    }

    /// Waits `delay`, then for one of the relay's sync permits; `None` when `stop` fires first.
    pub(super) async fn take(
        &self,
        delay: Duration,
        stop: &CancellationToken,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::select! {
            _ = stop.cancelled() => None,
            permit = async {
                tokio::time::sleep(delay).await;
                self.permits.clone().acquire_owned().await
            } => permit.ok(),
        }
    }
}
