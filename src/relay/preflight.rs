//! What a replica of a new configuration would refuse at start because of what the release
//! holds, found before any replica runs it: the pre-install and pre-upgrade check
//! (`watchrelay check-config --live`, the chart's hook). It reads the release's checkpoint
//! ConfigMaps and writes nothing; its refusals are the relay's own messages.

use crate::checkpoint::Store;
use crate::config::Config;
use crate::membership::TopicState;

/// `Err` with the relay's message when a replica of `cfg` would refuse to start on what the
/// release holds: a membership topic other than the one its members are in (a changed
/// `clusterName` or `checkpoint.membership.topic`), a sharded release going back to a single
/// leader, another shard count or shards' topic, or a change that moves keys between shards.
/// A release that never ran passes.
pub async fn preflight(cfg: &Config, client: &kube::Client) -> Result<(), String> {
    if cfg.sharding.enabled {
        return super::moves::preview(cfg, client).await.map(drop);
    }
    crate::leader::refuse_unsharding(client, cfg, &tokio_util::sync::CancellationToken::new())
        .await?;
    let store = Store::new(
        client.clone(),
        &cfg.checkpoint.namespace,
        &cfg.checkpoint.name,
    );
    let loaded = store
        .load()
        .await
        .map_err(|e| format!("reading the checkpoint ConfigMap: {e}"))?;
    let Some(mark) = &loaded.mark else {
        return Ok(());
    };
    let topic = cfg.checkpoint.membership.topic(&cfg.cluster_name);
    // The topic as the release recorded it: what the relay checks it against at start.
    let recorded = TopicState::compacted(mark.partitions);
    crate::membership::verify(&topic, &recorded, Some(mark)).map_err(|p| p.message)
}
