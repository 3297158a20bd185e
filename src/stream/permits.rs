//! A stream's share of `kubernetes.maxConcurrentSyncs`: the permit a sync holds while it reads
//! from the API server, lent back while it waits for Kafka.

use std::sync::Arc;
use std::time::Duration;

use super::machine::Stop;
use super::Stream;
use crate::registry::Phase;

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

impl Stream {
    /// While a sync waits for Kafka, its permit goes back to the other streams.
    pub(super) fn lend_permit(&mut self) {
        if let Permit::Held(_) = self.syncs.held {
            self.syncs.held = Permit::Lent;
        }
    }

    /// Before a sync reads on: its permit, taken again if it was lent.
    pub(super) async fn reclaim_permit(&mut self) -> Result<(), Stop> {
        if let Permit::Lent = self.syncs.held {
            let permit = tokio::select! {
                _ = self.life.stop.cancelled() => return Err(Stop::Cancelled),
                p = self.syncs.permits.clone().acquire_owned() => p.map_err(|_| Stop::Cancelled)?,
            };
            self.syncs.held = Permit::Held(permit);
        }
        Ok(())
    }

    /// Settles reports until the outbox has room, its sync permit lent meanwhile.
    pub(super) async fn room(&mut self) -> Result<(), Stop> {
        if self.outbox.has_room() {
            return Ok(());
        }
        self.lend_permit();
        self.outbox.wait_for_room().await?;
        self.reclaim_permit().await
    }

    /// Settles reports until nothing is in flight, its sync permit lent meanwhile.
    pub(super) async fn drained(&mut self) -> Result<(), Stop> {
        if self.outbox.in_flight() == 0 {
            return Ok(());
        }
        self.lend_permit();
        self.outbox.wait_until(0).await?;
        self.reclaim_permit().await
    }

    /// Waits a random delay below `syncJitterMs`, then for one of the relay's sync permits;
    /// `None` when cancelled first.
    pub(super) async fn sync_permit(&mut self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let jitter = self.cfg.kubernetes.sync_jitter_ms;
        let delay = Duration::from_millis(if jitter == 0 {
            0
        } else {
            self.backoff.random() % jitter
        });
        self.set_phase(Phase::Waiting);
        tokio::select! {
            _ = self.life.stop.cancelled() => None,
            permit = async {
                tokio::time::sleep(delay).await;
                self.syncs.permits.clone().acquire_owned().await
            } => {
                self.set_phase(Phase::Syncing);
                permit.ok()
            }
        }
    }
}
