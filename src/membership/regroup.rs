//! Moving members, at the start of a term, between the streams that relay the same objects in
//! two shapes: per namespace (`<channel>.<namespace>`) and over the collection read
//! cluster-wide (`<channel>._all`, or with sharding on the shard's part of it,
//! `<channel>._all-s<k>`).
//!
//! A `watchStrategy` switch, or a scope that changes shape (`namespaces: [a, b]` to
//! `allNamespaces`), changes which stream relays an object, not what the consumer should hold
//! of it. So the term, before any of its streams starts, hands the old shape's members to the
//! new shape's streams instead of retiring them (a DELETED for every object, then an ADDED for
//! each from the new streams): the consumer sees nothing of the switch but what changed
//! meanwhile. With sharding on, an object of a namespaced channel lives in its namespace's
//! shard in both shapes, so the move never leaves the shard: replicas of one rollout may run
//! the two shapes side by side.
//!
//! # Per-key order
//! The receiving stream starts without a position: its first sync lists its scope and, as
//! every sync against known members does, publishes only objects whose resourceVersion differs
//! from the member's, and an inferred DELETED for each member the list lacks (a namespace the
//! new shape no longer covers, an object deleted meanwhile). Nothing is published here; the old
//! streams are not running (this runs before any stream of the term starts), so the new stream
//! continues each key where the old one left it. Members of namespaces the new scope does not
//! hold are retired afterwards like any stream's that no longer runs.
//!
//! # Crash safety
//! The members are first written under the receiving streams and acknowledged, then tombstoned
//! under the old ones, then the ConfigMap drops the old entries and the receiving streams'
//! positions in one write. A crash at any point leaves the old stream recorded (in the topic or
//! the ConfigMap), and the next term makes the same move again: writing a member twice changes
//! nothing, and a receiving stream always relists. A configuration changed back meanwhile moves
//! the members back the same way.
//!
//! [`plan`] is pure: the recorded streams in, the moves out; [`Regroup::run`] makes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::retire::still_runs;
use crate::checkpoint::{encode, Saved, Store};
use crate::config::{Config, Shape, Shapes, StreamId};
use crate::membership::{self, Known, Members, Owner, Restored};
use crate::metrics::Metrics;
use crate::producer::Producer;

/// One stream's members handed to the stream(s) of the other shape in the same shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// A per-namespace stream's members to the stream over the collection (the shard's part).
    Gather {
        /// The per-namespace stream.
        from: String,
        /// The stream over the collection.
        into: String,
    },
    /// The members of the stream over the collection, each to the stream of its namespace.
    Scatter {
        /// The stream over the collection.
        from: String,
        /// The channel now relayed per namespace.
        channel: String,
    },
}

/// The moves a term makes before it starts, for the streams `ids` it holds state of
/// (positions, members), under `cfg` with its channels in `shapes`: shard `shard`'s term with
/// sharding on, whose stream over the collection is its part, or the whole relay's (`None`),
/// whose stream over the collection is `<channel>._all`. Only streams the term no longer runs
/// move, and only to a stream that relays the same channel's objects in the same shard;
/// everything else is left to the retirement.
pub fn plan<'a>(
    cfg: &Config,
    shapes: &Shapes,
    shard: Option<u32>,
    ids: impl IntoIterator<Item = &'a str>,
) -> Vec<Move> {
    let ids: BTreeSet<&str> = ids.into_iter().collect();
    let whole = |name: &str| match shard {
        Some(k) => StreamId::fanned(name, k).to_string(),
        None => StreamId::new(name, None).to_string(),
    };
    let mut moves = Vec::new();
    for id in ids {
        if still_runs(cfg, shapes, id) != Some(false) {
            continue;
        }
        let Some((name, namespace)) = StreamId::parts(id) else {
            continue;
        };
        let Some(channel) = cfg.channels.iter().find(|c| c.name == name) else {
            continue;
        };
        if !channel.path.namespaced {
            continue;
        }
        match namespace {
            Some(ns) if shard.is_none_or(|k| cfg.sharding.shard_of(ns) == k) => {
                let into = whole(name);
                if still_runs(cfg, shapes, &into) == Some(true) {
                    moves.push(Move::Gather {
                        from: id.to_string(),
                        into,
                    });
                }
            }
            None if id == whole(name) && shapes.get(name) == Some(&Shape::PerNamespace) => {
                moves.push(Move::Scatter {
                    from: id.to_string(),
                    channel: name.to_string(),
                });
            }
            _ => {}
        }
    }
    moves
}

/// Everything the moves need.
pub struct Regroup<'a> {
    /// Writes the members under their new streams, then tombstones the old.
    pub producer: &'a Arc<dyn Producer>,
    /// The shard's checkpoint ConfigMap.
    pub store: &'a Store,
    /// Drops the old streams' series.
    pub metrics: &'a Metrics,
    /// Whose membership records these are.
    pub owner: &'a Owner,
    /// The membership topic's name.
    pub topic: &'a str,
}

impl Regroup<'_> {
    /// Makes `moves` on `restored` and `saved`, in memory as in the topic and the ConfigMap.
    /// Returns false when stopped first, or when a write failed (try again before any stream
    /// starts).
    pub async fn run(
        &self,
        moves: &[Move],
        restored: &mut Restored,
        saved: &mut HashMap<String, Saved>,
        stop: &CancellationToken,
    ) -> bool {
        let mut updates: BTreeMap<String, Option<String>> = BTreeMap::new();
        for m in moves {
            let from = match m {
                Move::Gather { from, .. } | Move::Scatter { from, .. } => from,
            };
            let mut into: BTreeMap<String, Vec<(String, Known)>> = BTreeMap::new();
            let members = restored.get(from).map_or(0, Members::len);
            for (uid, known) in restored.get(from).into_iter().flat_map(|m| m.iter()) {
                let id = match (m, known.namespace.as_deref()) {
                    (Move::Gather { into, .. }, _) => into.clone(),
                    (Move::Scatter { channel, .. }, Some(ns)) => {
                        StreamId::new(channel, Some(ns)).to_string()
                    }
                    // A cluster-scoped object in a namespaced channel's part: none is ever.
                    (Move::Scatter { .. }, None) => continue,
                };
                into.entry(id).or_default().push((uid, known));
            }
            if let Move::Gather { into: part, .. } = m {
                into.entry(part.clone()).or_default();
            }
            tracing::info!(stream = %from, objects = members, to = into.len(), "the channel changed shape; handing the stream's members over to its new streams without retracting them");
            let carried = saved.get(from).map(unpositioned);
            for (id, part) in into {
                let sent = membership::adopt(
                    self.producer.as_ref(),
                    self.topic,
                    self.owner,
                    &id,
                    part.into_iter(),
                    stop,
                )
                .await;
                let adopted = match sent {
                    Ok(adopted) => adopted,
                    Err(e) => {
                        tracing::warn!(stream = %from, error = %e, "handing members over cut short; trying again");
                        return false;
                    }
                };
                let mut held = restored.take(&id);
                for (uid, known) in adopted.iter() {
                    held.insert(&uid, &known);
                }
                restored.insert(&id, held);
                let entry = saved
                    .get(&id)
                    .map(unpositioned)
                    .or_else(|| carried.clone())
                    .unwrap_or_default();
                updates.insert(id.clone(), Some(encode(&entry)));
                saved.insert(id, entry);
            }
            let leaves: Vec<_> = restored
                .get(from)
                .into_iter()
                .flat_map(|m| m.iter())
                .map(|(uid, _)| membership::record(self.topic, self.owner, from, &uid, None))
                .collect();
            if let Err(e) = membership::send_all(self.producer.as_ref(), leaves, stop).await {
                tracing::warn!(stream = %from, error = %e, "tombstoning handed-over members cut short; trying again");
                return false;
            }
            restored.take(from);
            saved.remove(from);
            updates.insert(from.clone(), None);
            self.metrics.forget_stream(from);
        }
        if updates.is_empty() {
            return true;
        }
        tokio::select! {
            _ = stop.cancelled() => false,
            r = self.store.write(&updates) => match r {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "writing the checkpoint ConfigMap failed");
                    false
                }
            },
        }
    }
}

/// The entry of a stream that takes members over: where it published and what it relays, but
/// no position, which cannot speak for them (it relists).
fn unpositioned(s: &Saved) -> Saved {
    Saved {
        route: s.route.clone(),
        kind: s.kind.clone(),
        ..Saved::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(channel: &str) -> Config {
        let yaml = format!(
            "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nsharding:\n  enabled: true\n  shards: 4\nchannels:\n{channel}\n  - operationId: watchNodes\n"
        );
        Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    /// Namespaces of shard 0 and of another shard, of 4.
    fn namespaces(c: &Config) -> (String, String) {
        let s = &c.sharding;
        let mut names = (0..).map(|i| format!("team-{i}"));
        let ours = names.by_ref().find(|n| s.shard_of(n) == 0).unwrap();
        let theirs = names.find(|n| s.shard_of(n) != 0).unwrap();
        (ours, theirs)
    }

    #[test]
    fn a_shape_switch_moves_members_within_the_shard() {
        const PODS: &str = "watchNamespacedPods";
        let wide = format!("  - operationId: {PODS}\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods");
        let listed = |strategy: &str, ns: &str| {
            format!("  - operationId: {PODS}\n    namespaces: [{ns}]\n    topic: pods\n    watchStrategy: {strategy}")
        };
        let probe = cfg(&wide);
        let (ours, theirs) = namespaces(&probe);
        let per_ns = Shapes::from([(PODS.into(), Shape::PerNamespace)]);
        let cluster_wide = Shapes::from([(PODS.into(), Shape::ClusterWide)]);
        let none = Shapes::new();
        let ns_stream = format!("{PODS}.{ours}");
        let part = format!("{PODS}._all-s0");
        let gather = Move::Gather {
            from: ns_stream.clone(),
            into: part.clone(),
        };
        let scatter = Move::Scatter {
            from: part.clone(),
            channel: PODS.into(),
        };
        // (case, configuration, shapes, recorded streams, moves)
        type Case<'a> = (&'a str, String, &'a Shapes, Vec<String>, Vec<Move>);
        let table: Vec<Case<'_>> = vec![
            ("nothing recorded", wide.clone(), &none, vec![], vec![]),
            (
                "per namespace, now every namespace fanned out",
                wide.clone(),
                &none,
                vec![ns_stream.clone()],
                vec![gather.clone()],
            ),
            (
                "per namespace, now the listed namespaces read cluster-wide",
                listed("clusterWide", &ours),
                &cluster_wide,
                vec![ns_stream.clone(), part.clone()],
                vec![gather.clone()],
            ),
            (
                "fanned out, now per namespace",
                listed("perNamespace", &ours),
                &per_ns,
                vec![part.clone()],
                vec![scatter.clone()],
            ),
            (
                "the same shape: nothing moves",
                listed("perNamespace", &ours),
                &per_ns,
                vec![ns_stream.clone()],
                vec![],
            ),
            (
                "another shard's stream is not this term's",
                wide.clone(),
                &none,
                vec![format!("{PODS}.{theirs}"), format!("{PODS}._all-s1")],
                vec![],
            ),
            (
                "a removed channel is retired, not moved",
                "  - operationId: watchNamespacedServices\n    allNamespaces: true\n    watchStrategy: clusterWide".into(),
                &none,
                vec![ns_stream.clone(), part.clone()],
                vec![],
            ),
            (
                "a whole stream of a release before fan-out is retired, not moved",
                listed("perNamespace", &ours),
                &per_ns,
                vec![format!("{PODS}._all")],
                vec![],
            ),
            (
                "a cluster-scoped channel never moves",
                wide.clone(),
                &none,
                vec!["watchNodes._all-s0".into()],
                vec![],
            ),
        ];
        for (case, channel, shapes, recorded, expected) in table {
            let c = cfg(&channel);
            let got = plan(&c, shapes, Some(0), recorded.iter().map(String::as_str));
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn without_sharding_the_stream_over_the_collection_is_the_whole_one() {
        let unsharded = |channel: &str| {
            Config::parse(&format!(
                "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n{channel}\n"
            ))
            .unwrap()
        };
        let listed = |strategy: &str| {
            unsharded(&format!("  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n    watchStrategy: {strategy}"))
        };
        let every = unsharded("  - operationId: watchNamespacedPods\n    allNamespaces: true");
        let per_ns = Shapes::from([("watchNamespacedPods".into(), Shape::PerNamespace)]);
        let wide = Shapes::from([("watchNamespacedPods".into(), Shape::ClusterWide)]);
        let gather = |ns: &str| Move::Gather {
            from: format!("watchNamespacedPods.{ns}"),
            into: "watchNamespacedPods._all".into(),
        };
        let ids = ["watchNamespacedPods.a", "watchNamespacedPods.b"];
        assert_eq!(
            plan(&listed("clusterWide"), &wide, None, ids),
            vec![gather("a"), gather("b")]
        );
        // namespaces: [a, b] becoming allNamespaces.
        assert_eq!(
            plan(&every, &Shapes::new(), None, ids),
            vec![gather("a"), gather("b")]
        );
        assert_eq!(
            plan(
                &listed("perNamespace"),
                &per_ns,
                None,
                ["watchNamespacedPods._all"]
            ),
            vec![Move::Scatter {
                from: "watchNamespacedPods._all".into(),
                channel: "watchNamespacedPods".into()
            }]
        );
        assert_eq!(plan(&listed("perNamespace"), &per_ns, None, ids), vec![]);
        // A part of a sharded release is not this relay's to move.
        assert_eq!(
            plan(
                &listed("perNamespace"),
                &per_ns,
                None,
                ["watchNamespacedPods._all-s3"]
            ),
            vec![]
        );
    }
}
