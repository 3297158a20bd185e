//! Retiring, at the start of a term, the streams this relay owns but will not run.
//!
//! A stream is retired here when its channel is gone from the configuration (removed or
//! renamed) or its channel's scope no longer has that shape and its members were not handed to
//! the new shape's streams first ([`super::regroup`] does so for a switch between one stream per
//! namespace and one over the collection, see [`Shape`]): `namespaces: [a, b]` became a
//! selector, or the reverse. A channel that goes from
//! `allNamespaces` to a cluster-wide filtered stream, or back, keeps its stream: it reconciles
//! under its new query instead. (A namespace of a selector channel that stopped
//! matching is retired by the channel's follower, once the namespaces are listed: no other stream
//! writes its keys.)
//!
//! # Per-key order
//! Every retraction is acknowledged before any stream of the term starts, so on any key an old
//! stream's inferred DELETED comes before the new streams' announcements of the same object:
//! `namespaces: [a, b]` → a selector costs each object a DELETED then an ADDED, never a DELETED
//! last. (A switch between per-namespace streams and one over the collection is not retired:
//! its members are handed over first, see [`super::regroup`].) Each retraction goes where the object was announced (the topic and key its
//! membership record carries), whatever the configuration says now.
//!
//! # Crash safety
//! The retired streams' positions are forgotten in the ConfigMap first, so a later run under the
//! old configuration reconciles instead of resuming past what was retracted; the membership
//! tombstones follow the acknowledged DELETEDs; the entries go last. A crash at any point repeats
//! the retirement, at worst sending a DELETED twice. A retirement that fails keeps every member
//! it has not tombstoned, in memory and in the topic, and is tried again before any stream
//! starts: nothing it leaves can be retracted after a replacing stream announced the object.
//!
//! # Memory
//! Retractions go in batches of [`BATCH`] members (DELETEDs acknowledged, then their
//! membership tombstones), so retiring a million members holds a batch of records at a time,
//! not a million.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::{self, Saved, Store};
use crate::config::Config;
use crate::config::{Scope, Shape, Shapes, StreamId};
use crate::envelope::{self, Route};
use crate::membership::{self, Known, Members, Owner, Restored};
use crate::metrics::Metrics;
use crate::producer::Producer;

/// Whether the configuration, its channels in `shapes`, still runs stream `id`: `None` when it
/// may (a selector channel's namespace, decided once namespaces are listed), else whether it
/// does.
pub fn still_runs(cfg: &Config, shapes: &Shapes, id: &str) -> Option<bool> {
    let Some((name, ns)) = StreamId::parts(id) else {
        return Some(false);
    };
    let Some(channel) = cfg.channels.iter().find(|c| c.name == name) else {
        return Some(false);
    };
    let wide = shapes.get(name) == Some(&Shape::ClusterWide);
    // With sharding on, a stream over one collection runs as the shards' parts (unless the
    // release kept it whole), without it whole (see `ShardingConfig::fans`).
    let fanned = cfg.sharding.enabled && !channel.kept_whole;
    if ns.is_none() && fanned != StreamId::shard_in(id).is_some() {
        return Some(false);
    }
    match (&channel.scope, ns) {
        (Scope::Cluster, None) => Some(true),
        (_, None) => Some(wide),
        (_, Some(_)) if wide => Some(false),
        (Scope::Namespaces(list), Some(ns)) => Some(list.iter().any(|n| n == ns)),
        (Scope::Selector(_), Some(_)) => None,
        _ => Some(false),
    }
}

/// Members retracted at a time: their DELETEDs (about a kilobyte each, so some 10 MB) are all
/// the records a retirement holds. Retiring a million members: 105 MiB peak RSS, restore
/// included, against 1.7 GiB when every record was built at once (see the retire benchmark).
pub const BATCH: usize = 10_000;

/// Everything a retirement needs.
pub struct Retire<'a> {
    /// The configuration this term runs: what it no longer runs is retired.
    pub cfg: &'a Config,
    /// Each channel's shape this term, which decides whether a stream id still runs.
    pub shapes: &'a Shapes,
    /// Sends the retired members' DELETEDs, then their membership tombstones.
    pub producer: &'a Arc<dyn Producer>,
    /// The checkpoint ConfigMap, whose retired entries are removed.
    pub store: &'a Store,
    /// Counts what is retracted; a retired stream's series are dropped.
    pub metrics: &'a Metrics,
    /// Whose membership records are retired: the checkpoint ConfigMap.
    pub owner: &'a Owner,
    /// The membership topic's name.
    pub topic: &'a str,
    /// With sharding on: the shard and its owner epoch, which the DELETEDs' envelopes carry
    /// like every other record of the shard.
    pub shard: Option<envelope::ShardOwner>,
    /// The highest era the checkpoint ConfigMap held: the retractions' era is above it.
    pub era_floor: u64,
    /// With a schema registry: the schema tag of a topic (and namespace) a configured channel
    /// still publishes to. Retractions there carry its ids, like every other record of it.
    pub tag: Option<&'a Tagger>,
}

/// The schema tag of a topic, for the stream of a namespace.
pub type Tagger = dyn Fn(&str, Option<&str>) -> Arc<envelope::SchemaTag> + Send + Sync;

impl Retire<'_> {
    /// Retires every stream of `restored` and `saved` the configuration no longer runs; their
    /// members and entries are taken out of both. Returns false when stopped first, or when a
    /// write failed (the next term tries again).
    pub async fn run(
        &self,
        restored: &mut Restored,
        saved: &mut HashMap<String, Saved>,
        stop: &CancellationToken,
    ) -> bool {
        let mut ids: Vec<String> = restored
            .streams()
            .map(str::to_string)
            .chain(saved.keys().cloned())
            .filter(|id| still_runs(self.cfg, self.shapes, id) == Some(false))
            .collect();
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return true;
        }
        // Forget the positions first: a run resuming from one would never undo what follows.
        // The kind a stream learned stays: its retractions name it. Their new era (the DELETEDs
        // come after whatever the stream announced) is written with it, so that it raises the
        // ConfigMap's era floor before anything is published in it.
        let eras: BTreeMap<&String, u64> = ids
            .iter()
            .map(|id| {
                let previous = saved.get(id).map_or(0, |s| s.era).max(self.era_floor);
                (id, envelope::next_era(previous))
            })
            .collect();
        let forgotten: BTreeMap<String, Option<String>> = ids
            .iter()
            .map(|id| {
                let kind = saved.get(id).and_then(|s| s.kind.clone());
                let entry = checkpoint::encode(&Saved {
                    kind,
                    era: eras[id],
                    ..Saved::default()
                });
                (id.clone(), Some(entry))
            })
            .collect();
        if !self.write(&forgotten, stop).await {
            return false;
        }
        for id in &ids {
            // Taken only once retracted: a retry finds what is left to retract.
            let members = restored.get(id);
            let rv = saved.get(id).and_then(|s| s.rv.clone()).unwrap_or_default();
            let kind = saved.get(id).and_then(|s| s.kind.as_deref());
            let era = eras[id];
            tracing::info!(stream = %id, objects = members.map_or(0, Members::len), "stream no longer configured in this shape; retracting what it announced");
            if let Some(members) = members {
                if let Err(e) = self.retract(id, members, (&rv, era), kind, stop).await {
                    tracing::warn!(stream = %id, error = %e, "retiring a stream cut short; trying again");
                    return false;
                }
            }
            restored.take(id);
            saved.remove(id);
        }
        let gone = ids.into_iter().map(|id| (id, None)).collect();
        self.write(&gone, stop).await
    }

    async fn write(
        &self,
        updates: &BTreeMap<String, Option<String>>,
        stop: &CancellationToken,
    ) -> bool {
        tokio::select! {
            _ = stop.cancelled() => false,
            r = self.store.write(updates) => match r {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "writing the checkpoint ConfigMap failed");
                    false
                }
            },
        }
    }

    /// Sends the inferred DELETED of every member of stream `id` where it was announced, then
    /// (once acknowledged) its membership tombstone.
    /// `kind` is the one the stream learned, for a resource outside the catalogue; `at` the
    /// stream's position and the era its DELETEDs carry.
    async fn retract(
        &self,
        id: &str,
        members: &Members,
        at: (&str, u64),
        kind: Option<&str>,
        stop: &CancellationToken,
    ) -> Result<(), membership::SendError> {
        let (name, ns) = StreamId::parts(id).unwrap_or((id, None));
        let channel = self.cfg.channels.iter().find(|c| c.name == name);
        // The objects' kind and apiVersion: a built-in resource's (its channel's, or a vanished
        // channel's named after its operationId), else the kind the stream learned.
        let builtin = crate::catalogue::lookup(name);
        let kind = channel
            .and_then(|c| crate::catalogue::kind_of(&c.path.resource_name()))
            .or(builtin.map(|e| e.kind))
            .or(kind)
            .unwrap_or_default();
        let api_version = channel
            .map(|c| c.path.api_version())
            .or_else(|| {
                builtin
                    .and_then(|e| crate::catalogue::ChannelPath::parse(e.path).ok())
                    .map(|p| p.api_version())
            })
            .unwrap_or_default();
        if kind.is_empty() {
            tracing::warn!(stream = %id, "the kind of the retired stream's objects is unknown; its inferred DELETEDs carry none");
        }
        let cluster = &self.cfg.cluster_name;
        let route = match channel {
            Some(c) => Route::for_stream(c, cluster, ns.map(str::to_string)),
            None => Route::vanished(name, cluster, ns.map(str::to_string)),
        }
        .owned_by(self.shard);
        // On a topic still configured, the DELETEDs wait for its schema and carry its ids (on
        // one no channel writes any more, they go as plain JSON: see docs/tables.md).
        let configured = self
            .cfg
            .channels
            .iter()
            .any(|c| c.topic_for(cluster, ns) == route.topic);
        let route = match self.tag.filter(|_| configured) {
            Some(tag) => {
                let tag = tag(&route.topic, ns);
                tokio::select! {
                    _ = stop.cancelled() => return Err(membership::SendError::Stopped),
                    _ = tag.registered() => {}
                }
                route.tagged(Some(tag))
            }
            None => route,
        };
        let mut unaddressed = 0u64;
        let mut all = members.iter();
        loop {
            let batch: Vec<(String, Known)> = all.by_ref().take(BATCH).collect();
            if batch.is_empty() {
                break;
            }
            let mut deletes = Vec::with_capacity(batch.len());
            let mut tombstones = Vec::new();
            for (uid, known) in &batch {
                let meta = known.meta(uid, kind, &api_version);
                // A record of an older version says neither: it goes where the channel would
                // put it, if the channel still exists.
                let addressed = known.topic.is_some() && known.key.is_some() || channel.is_some();
                let place = addressed.then(|| known.place(&meta, &route));
                match place {
                    Some((topic, key)) => {
                        let rv = if at.0.is_empty() {
                            known.rv.as_str()
                        } else {
                            at.0
                        };
                        let delete = envelope::retraction(&route, meta, rv, &topic, &key, at.1);
                        if channel.is_some_and(|c| c.tombstones) {
                            tombstones.push(delete.tombstone());
                        }
                        deletes.push(delete);
                    }
                    None => unaddressed += 1,
                }
            }
            let n = deletes.len() as u64;
            deletes.extend(tombstones);
            membership::send_all(self.producer.as_ref(), deletes, stop).await?;
            self.metrics
                .synthetic_deletes
                .with_label_values(&[id])
                .inc_by(n);
            let leaves: Vec<_> = batch
                .iter()
                .map(|(uid, _)| membership::record(self.topic, self.owner, id, uid, None))
                .collect();
            membership::send_all(self.producer.as_ref(), leaves, stop).await?;
        }
        if unaddressed > 0 {
            self.metrics.unretractable_members.inc_by(unaddressed);
            tracing::warn!(stream = %id, members = unaddressed, "members recorded by an older version without topic and key, of a channel that no longer exists: no DELETED can be addressed to them");
        }
        self.metrics.forget_stream(id);
        Ok(())
    }
}

/// The identity of a member, for its inferred DELETED.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_of_a_removed_channel_or_another_scope_shape_are_not_run() {
        let cfg = Config::parse(
            "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n\
             - operationId: watchNamespacedPods\n  namespaces: [a, b]\n\
             - operationId: watchNamespacedServices\n  namespaceSelector: team=x\n\
             - operationId: watchNodes\n",
        )
        .unwrap();
        let per = Shapes::from([
            ("watchNamespacedPods".into(), Shape::PerNamespace),
            ("watchNamespacedServices".into(), Shape::PerNamespace),
        ]);
        let runs = |id| still_runs(&cfg, &per, id);
        assert_eq!(runs("watchNamespacedPods.a"), Some(true));
        assert_eq!(runs("watchNamespacedPods.c"), Some(false));
        assert_eq!(runs("watchNamespacedPods._all"), Some(false));
        assert_eq!(runs("watchNamespacedServices.a"), None);
        assert_eq!(runs("watchNamespacedServices._all"), Some(false));
        assert_eq!(runs("watchNodes._all"), Some(true));
        assert_eq!(runs("renamedPods.a"), Some(false));

        // Cluster-wide: the one stream runs, the per-namespace ones do not.
        let wide = Shapes::from([
            ("watchNamespacedPods".into(), Shape::ClusterWide),
            ("watchNamespacedServices".into(), Shape::ClusterWide),
        ]);
        let runs = |id| still_runs(&cfg, &wide, id);
        assert_eq!(runs("watchNamespacedPods._all"), Some(true));
        assert_eq!(runs("watchNamespacedPods.a"), Some(false));
        assert_eq!(runs("watchNamespacedServices._all"), Some(true));
        assert_eq!(runs("watchNamespacedServices.a"), Some(false));

        // Sharded: a stream over one collection runs as the shards' parts, unless the release
        // kept it whole (it ran so before fan-out).
        let mut sharded = cfg.clone();
        sharded.sharding.enabled = true;
        sharded.sharding.shards = 4;
        let runs = |c: &Config, id| still_runs(c, &wide, id);
        assert_eq!(runs(&sharded, "watchNodes._all"), Some(false));
        assert_eq!(runs(&sharded, "watchNodes._all-s2"), Some(true));
        let kept = sharded.keeping_whole(&["watchNodes._all".into()]);
        assert_eq!(runs(&kept, "watchNodes._all"), Some(true));
        assert_eq!(runs(&kept, "watchNodes._all-s2"), Some(false));
        assert_eq!(runs(&kept, "watchNamespacedPods._all-s2"), Some(true));
    }
}
