//! Resync requests set on a sharded release's checkpoint ConfigMap, passed on to its shards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::Store;
use crate::config::Config;

/// Passes the resync requests set on the release's checkpoint ConfigMap (`kubectl annotate`,
/// as without sharding) on to every shard's ConfigMap, whose owners take them, until `stop`.
/// The ConfigMap is created if missing, so there is one to annotate. Every replica runs this,
/// but only the one relaying shard 0 (`passes`) passes requests on, so a request is passed on
/// once (twice at worst, while shard 0 moves, or after a crash in between).
pub(super) async fn pass_on_resyncs(
    client: kube::Client,
    cfg: Arc<Config>,
    passes: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let ns = &cfg.checkpoint.namespace;
    let release = Store::new(client.clone(), ns, &cfg.checkpoint.name);
    if let Err(e) = release.create_if_missing().await {
        tracing::warn!(error = %e, "creating the checkpoint ConfigMap, where resync requests are set, failed");
    }
    let shards: Vec<Store> = cfg
        .sharding
        .configmaps(&cfg.checkpoint.name)
        .iter()
        .map(|name| Store::new(client.clone(), ns, name))
        .collect();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(crate::relay::term::writer::RESYNC_POLL) => {}
        }
        if !passes.load(Ordering::Relaxed) {
            continue;
        }
        match release.pass_on_resync_request(&shards).await {
            Ok(Some(what)) => {
                tracing::info!(%what, shards = shards.len(), "passed a resync request on to every shard")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "passing a resync request on to the shards failed")
            }
        }
    }
}
