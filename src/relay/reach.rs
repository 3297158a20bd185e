//! Whether the API server answers, as a sharded replica asks before giving its shards up.
//!
//! A replica whose API server has not answered for `sharding.apiUnreachableSeconds` leaves the
//! shard group. The probe that decides it runs on a thread and a runtime of its own, with a
//! client of its own: on the relay's runtime, many shards' syncs and decodes could hold a probe
//! back long enough to look like an outage, and the replica would hand every shard over, join
//! again and repeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::kubeclient::Target;

/// How often the API server is probed, and how long a probe may take.
pub(super) const PROBE: Duration = Duration::from_secs(2);

/// When the API server last answered a probe.
pub(super) struct Reach {
    base: Instant,
    /// Milliseconds past `base`.
    answered: AtomicU64,
}

impl Reach {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            answered: AtomicU64::new(0),
        })
    }

    /// Probes `target` every [`PROBE`] until `stop`, on a thread of its own.
    pub(super) fn start(target: Target, stop: CancellationToken) -> Arc<Self> {
        let reach = Self::new();
        let r = reach.clone();
        let spawned = std::thread::Builder::new()
            .name("api-probe".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::error!(error = %e, "no runtime for the API server probe");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = loop {
                        match target.connect().await {
                            Ok(client) => break client,
                            Err(e) => {
                                tracing::warn!(
                                    error = format!("{:#}", anyhow::Error::new(e)),
                                    "building the API server probe's client"
                                )
                            }
                        }
                        if pause(&stop).await {
                            return;
                        }
                    };
                    r.probe(client, stop).await;
                });
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no thread for the API server probe");
        }
        reach
    }

    async fn probe(&self, client: kube::Client, stop: CancellationToken) {
        loop {
            if let Ok(Ok(_)) = tokio::time::timeout(PROBE, client.apiserver_version()).await {
                let now = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.answered.store(now, Ordering::Relaxed);
            }
            if pause(&stop).await {
                return;
            }
        }
    }

    /// How long the API server has not answered.
    pub(super) fn silent(&self) -> Duration {
        let answered = Duration::from_millis(self.answered.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(answered)
    }
}

/// Waits one [`PROBE`]; true when `stop` came first.
async fn pause(stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(PROBE) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relay's runtime held up, for longer than a probe's period, by work that never
    /// yields does not make the API server look silent.
    #[test]
    fn a_busy_runtime_is_not_an_unreachable_server() {
        // The API server runs apart, as in a cluster.
        let server = tokio::runtime::Runtime::new().expect("runtime");
        let sim = server
            .block_on(watchrelay_sim::Sim::start(
                watchrelay_sim::SimConfig::default(),
            ))
            .expect("simulator starts");
        let url: http::Uri = sim.url().parse().expect("url");
        let relay = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let busy = PROBE * 4;
        let silent = relay.block_on(async {
            let stop = CancellationToken::new();
            let _stop = stop.clone().drop_guard();
            let reach = Reach::start(Target::At(url, Default::default()), stop);
            while reach.answered.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            std::thread::sleep(busy);
            reach.silent()
        });
        assert!(
            silent < busy - PROBE,
            "the server answered all along, but looked silent for {silent:?}"
        );
        drop(sim);
    }
}
