//! Configuration changes that would move keys from a stream in one shard to a stream in
//! another, found before a sharded replica relays anything.
//!
//! Retractions come before announcements only inside one shard's term: a stream the new
//! configuration no longer runs is retired (a DELETED for every object it announced) by the
//! term of its own shard, whenever that shard's next term starts, on whichever replica. When a
//! new stream in *another* shard announces the same keys, the two terms race, and the
//! retirement's DELETEDs can land after the new stream's ADDEDs: every live object of the old
//! stream ends DELETED downstream. Such changes are:
//! - a switch to or from a stream over one collection recorded whole (`<channel>._all`, in the
//!   channel's shard, as releases before fan-out ran it) while `<channel>.<ns>` lives in the
//!   namespace's shard;
//! - renaming a channel read cluster-wide (`<old>._all` and `<new>._all` hash apart);
//! - a stream over one collection recorded whole (`<channel>._all`, in the channel's shard, as
//!   releases before fan-out ran it) that every shard now runs its part of
//!   (`<channel>._all-s<k>`);
//! - any other retired stream whose topic a configured stream in another shard writes.
//!
//! A replica refuses to start on such a change while any shard's checkpoint ConfigMap still
//! holds the old stream, and names the safe way: remove the channel (or change it to its old
//! shape), roll out, wait until its streams are retired, then make the change. A stream kept
//! whole is fanned out without retracting anything by `watchrelay split-whole`, with the
//! release stopped (see `split`); a replica refuses to start while a split is under way. A
//! change within one namespace never crosses, and neither does a `watchStrategy` switch of a
//! namespaced channel between its per-namespace streams and its fanned-out parts: an object
//! lives in its namespace's shard in both shapes, and that shard hands the members over
//! (`membership::regroup`).
//!
//! The shard count and the shards' topic are fixed for a release's life the same way: every
//! stream's shard and every shard's ConfigMap depend on them. The first sharded replica records
//! them on the release's checkpoint ConfigMap; a replica configured otherwise refuses to start.
//!
//! [`crossings`] is pure: the recorded streams in, the refused moves out; [`check`] reads the
//! ConfigMaps.

use tokio_util::sync::CancellationToken;

use crate::checkpoint::{Store, SPLITTING_KEY};
use crate::config::{Channel, Config, Scope, Shape, ShardingConfig, StreamId};

/// Reads the release's sharding mark and every shard's checkpoint ConfigMap, decides what
/// `watchStrategy: auto` runs (see [`Config::settled`]) and returns the configuration so
/// settled, or says why this replica must not start (`Err`): a shard count or shards' topic
/// other than the release's, or a change that moves keys between shards. A read that fails is
/// tried again; `cfg` as it is once `stop` fires first.
pub(super) async fn check(
    cfg: &Config,
    client: &kube::Client,
    stop: &CancellationToken,
) -> Result<Config, String> {
    let read =
        crate::checkpoint::until_read("reading the shards' checkpoint ConfigMaps", stop, || {
            read(cfg, client, true)
        });
    let Some(held) = read.await else {
        return Ok(cfg.clone());
    };
    judge(cfg, client, held).await
}

/// What [`check`] would say of `cfg` against what the release holds now, read once and
/// without recording anything: the pre-upgrade check of a configuration no replica runs yet.
pub(super) async fn preview(cfg: &Config, client: &kube::Client) -> Result<Config, String> {
    let held = read(cfg, client, false)
        .await
        .map_err(|e| format!("reading the shards' checkpoint ConfigMaps: {e}"))?;
    judge(cfg, client, held).await
}

/// [`check`]'s verdict on what the release holds.
async fn judge(cfg: &Config, client: &kube::Client, held: Held) -> Result<Config, String> {
    if let Some((shard, streams)) = held.splitting.first() {
        return Err(format!(
            "a split of the streams kept whole ({streams}) into the shards' parts is under way or was cut short (shard {shard}'s checkpoint ConfigMap holds {SPLITTING_KEY}): run `watchrelay split-whole` with this configuration again, with the release scaled to zero, to finish it"
        ));
    }
    let recorded = held.recorded.clone();
    let settled = settle(cfg, client, held).await?;
    let found = crossings(&settled, &recorded);
    if found.is_empty() {
        return Ok(settled);
    }
    Err(refusal(&found))
}

/// `cfg` as the release runs it, from what it holds: `watchStrategy: auto` decided (see
/// [`Config::settled`]) and the streams recorded whole kept whole; `Err` for a shard count or
/// shards' topic other than the release's.
async fn settle(cfg: &Config, client: &kube::Client, held: Held) -> Result<Config, String> {
    let Held {
        mark,
        recorded,
        single,
        splits,
        ..
    } = held;
    let ours = mark_of(cfg);
    if mark != ours {
        return Err(format!(
            "this release's shards were made as `{mark}` (sharding.shards and the shards' topic), not `{ours}`: the shard count and topic cannot change for a release's checkpoints. Keep sharding.shards and sharding.topic as they were; a new count takes a new release (its own checkpoint.name and sharding.topic) that announces every object afresh"
        ));
    }
    // What the shards ran, and for a channel they never ran, what a single leader of the
    // release ran (before it moved to sharding).
    let mut ids: Vec<String> = recorded.iter().map(|r| r.id.clone()).collect();
    let channel_of = |id: &str| StreamId::parts(id).map(|(name, _)| name.to_string());
    let sharded: std::collections::HashSet<String> =
        ids.iter().filter_map(|id| channel_of(id)).collect();
    ids.extend(
        single
            .into_iter()
            .filter(|id| channel_of(id).is_some_and(|c| !sharded.contains(&c))),
    );
    let selected = super::shapes::count_selectors(cfg, client).await;
    let in_shards: Vec<String> = recorded.iter().map(|r| r.id.clone()).collect();
    let mut settled = cfg.settled(&ids, &selected).keeping_whole(&in_shards);
    settled.sharding.splits_seen = splits;
    for channel in &settled.channels {
        if let Some(before) = cfg.channels.iter().find(|c| c.name == channel.name) {
            if before.strategy != channel.strategy {
                tracing::info!(channel = %channel.name, strategy = ?channel.strategy, "watchStrategy auto decided for this replica");
            }
        }
        if channel.kept_whole {
            tracing::info!(channel = %channel.name, shard = cfg.sharding.shard_of_stream(&channel.stream_id(None).to_string()), "relayed whole in its channel's shard, as the release ran it before fan-out: not fanned out");
        }
    }
    Ok(settled)
}

/// `cfg` as the release runs it, its channels kept whole marked so (see
/// [`Config::keeping_whole`]), and whether a split of them was cut short (a shard's ConfigMap
/// still marked): read once without recording anything, for `watchrelay split-whole`. `Err`
/// as [`check`] says, but for a split cut short, which the split finishes.
pub(super) async fn kept_whole(
    cfg: &Config,
    client: &kube::Client,
) -> Result<(Config, bool), String> {
    let held = read(cfg, client, false)
        .await
        .map_err(|e| format!("reading the shards' checkpoint ConfigMaps: {e}"))?;
    let marked = !held.splitting.is_empty();
    Ok((settle(cfg, client, held).await?, marked))
}

/// The sharding mark of `cfg`: `<shards> <topic> <shard function>`. The function that maps a
/// stream to its shard is named too, so that a future change of it refuses to start rather
/// than split streams between two mappings.
fn mark_of(cfg: &Config) -> String {
    format!(
        "{} {} {SHARD_FUNCTION}",
        cfg.sharding.shards,
        cfg.sharding.topic(&cfg.cluster_name)
    )
}

/// The name of [`ShardingConfig::shard_of`]'s mapping, recorded in the sharding mark.
const SHARD_FUNCTION: &str = "fnv1a64-fmix64-top-bits";

/// What the release holds.
struct Held {
    /// Its sharding mark.
    mark: String,
    /// The streams of every shard's ConfigMap.
    recorded: Vec<Recorded>,
    /// The streams a single leader of the release recorded in its own.
    single: Vec<String>,
    /// The shards whose ConfigMap a split of streams kept whole still marks, with the streams.
    splitting: Vec<(u32, String)>,
    /// The most splits of streams kept whole a shard recorded.
    splits: u64,
}

/// What the release holds; with `record`, `cfg`'s sharding mark is recorded when none was.
async fn read(
    cfg: &Config,
    client: &kube::Client,
    record: bool,
) -> Result<Held, crate::checkpoint::CheckpointError> {
    let ns = &cfg.checkpoint.namespace;
    let release = Store::new(client.clone(), ns, &cfg.checkpoint.name);
    let mark = if record {
        release.sharding_mark(&mark_of(cfg)).await?
    } else {
        release
            .recorded_sharding_mark()
            .await?
            .unwrap_or_else(|| mark_of(cfg))
    };
    let single = release.load().await?.streams.into_keys().collect();
    let (mut recorded, mut splitting, mut splits) = (Vec::new(), Vec::new(), 0);
    for k in 0..cfg.sharding.shards {
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, k);
        let loaded = Store::new(client.clone(), ns, &name).load().await?;
        splitting.extend(loaded.splitting.map(|streams| (k, streams)));
        splits = splits.max(loaded.splits);
        recorded.extend(
            loaded
                .streams
                .iter()
                .map(|(id, saved)| Recorded::new(id, saved.route.as_deref())),
        );
    }
    Ok(Held {
        mark,
        recorded,
        single,
        splitting,
        splits,
    })
}

/// A stream some shard's checkpoint ConfigMap still holds: its id, and the topic its route
/// names (older entries have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The stream's id.
    pub id: String,
    /// The topic it published to.
    pub topic: Option<String>,
}

impl Recorded {
    /// The entry of stream `id` as saved, its route `<topic> <key template>`.
    pub fn new(id: &str, route: Option<&str>) -> Self {
        Self {
            id: id.to_string(),
            topic: route
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_string),
        }
    }
}

/// A retired stream whose keys a configured stream in another shard would announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    /// The stream still recorded, to be retired.
    pub retired: String,
    /// Its shard.
    pub from: u32,
    /// The configured channel that would announce its keys.
    pub channel: String,
    /// The configured stream, or `<channel>.<namespace>` for namespaces not known in advance.
    pub announced: String,
    /// Its shard; `None` for namespaces not known in advance, each in its own.
    pub to: Option<u32>,
}

impl std::fmt::Display for Crossing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stream {} (shard {}) would be retired while channel {} announces its keys from {} ",
            self.retired, self.from, self.channel, self.announced
        )?;
        match self.to {
            Some(to) => write!(f, "(shard {to})"),
            None => f.write_str("(other shards)"),
        }
    }
}

/// How a configured channel runs in a sharded release: over the collection, each shard its
/// part, or one stream per namespace (the listed ones, or any).
enum Runs<'a> {
    Fanned,
    /// Whole, in its channel's shard, as the release ran it before fan-out.
    Whole,
    Listed(&'a [String]),
    AnyNamespace,
}

fn runs<'a>(cfg: &Config, channel: &'a Channel) -> Runs<'a> {
    if channel.kept_whole {
        return Runs::Whole;
    }
    match (&channel.scope, super::shapes::sharded(cfg, channel)) {
        (Scope::Cluster, _) | (_, Some(Shape::ClusterWide)) => Runs::Fanned,
        (Scope::Namespaces(list), _) => Runs::Listed(list),
        _ => Runs::AnyNamespace,
    }
}

/// Every move of keys between shards that `cfg` would make while `recorded` streams are still
/// held by some shard. Empty without sharding, or with one shard.
pub fn crossings(cfg: &Config, recorded: &[Recorded]) -> Vec<Crossing> {
    let sharding = &cfg.sharding;
    if !sharding.enabled || sharding.shards < 2 {
        return Vec::new();
    }
    let mut found = Vec::new();
    for r in recorded {
        let Some((name, namespace)) = StreamId::parts(&r.id) else {
            continue;
        };
        let from = sharding.shard_of_stream(&r.id);
        let own = cfg.channels.iter().find(|c| c.name == name);
        let part = StreamId::shard_in(&r.id).is_some();
        // Still run as it is: not retired.
        let kept = own.is_some_and(|c| {
            matches!(
                (runs(cfg, c), namespace),
                (Runs::Fanned, None) if part
            ) || matches!(
                (runs(cfg, c), namespace),
                (Runs::Whole, None) if !part
            ) || matches!(
                (runs(cfg, c), namespace),
                (Runs::Listed(_) | Runs::AnyNamespace, Some(_))
            )
        });
        if kept {
            continue;
        }
        for c in &cfg.channels {
            let same_keys = c.name == name
                || r.topic
                    .as_deref()
                    .is_some_and(|t| t == c.topic_for(&cfg.cluster_name, namespace));
            if !same_keys {
                continue;
            }
            // One namespaced channel, per namespace or fanned out: either way an object lives
            // in its namespace's shard, whose next term hands the members over (see
            // `membership::regroup`).
            if c.name == name && c.path.namespaced && !c.kept_whole && (namespace.is_some() || part)
            {
                continue;
            }
            let announced: Vec<(String, Option<u32>)> = match (runs(cfg, c), namespace) {
                // Every shard runs its part: some are not the retired stream's.
                (Runs::Fanned, _) => vec![(format!("{}._all-s<k>", c.name), None)],
                (Runs::Whole, _) => {
                    let id = c.stream_id(None).to_string();
                    let to = sharding.shard_of_stream(&id);
                    vec![(id, Some(to))]
                }
                // Per namespace: the retired stream's own namespace lives in its shard.
                (_, Some(_)) => Vec::new(),
                (Runs::Listed(list), None) => list
                    .iter()
                    .map(|ns| {
                        (
                            c.stream_id(Some(ns)).to_string(),
                            Some(sharding.shard_of(ns)),
                        )
                    })
                    .collect(),
                // Whatever namespaces come, some live in other shards than the retired stream.
                (Runs::AnyNamespace, None) => vec![(format!("{}.<namespace>", c.name), None)],
            };
            if let Some((id, to)) = announced.into_iter().find(|(_, to)| *to != Some(from)) {
                found.push(Crossing {
                    retired: r.id.clone(),
                    from,
                    channel: c.name.clone(),
                    announced: id,
                    to,
                });
            }
        }
    }
    found
}

/// What an operator reads when a start is refused for `found`.
pub fn refusal(found: &[Crossing]) -> String {
    let list: Vec<String> = found.iter().take(5).map(ToString::to_string).collect();
    let more = found.len().saturating_sub(list.len());
    let more = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    // A channel kept whole from before fan-out, now per namespace, has a way that retracts
    // nothing.
    let whole = found.iter().any(|c| {
        StreamId::parts(&c.retired).is_some_and(|(name, ns)| name == c.channel && ns.is_none())
            && StreamId::shard_in(&c.retired).is_none()
    });
    let split = if whole {
        ". A stream kept whole from before fan-out (`<channel>._all`) is better split first: with the channel still read cluster-wide and the release scaled to zero, `watchrelay split-whole` hands each shard its part without retracting anything, after which a switch to per-namespace streams is a plain rolling update"
    } else {
        ""
    };
    format!(
        "this configuration moves keys between shards: {}{more}. A stream in one shard cannot be retired in order with a stream in another, so the old stream's DELETEDs could land after the new one's ADDEDs. Make the change in two steps: first remove the channel (or rename it back, or restore its watchStrategy) and roll that out until no shard's checkpoint ConfigMap holds the old stream (every replica started on it and `watchrelay_streams` no longer lists it), then apply this configuration. A `namespaces` list under `watchStrategy: auto` switches shape when its length crosses `kubernetes.clusterWideAbove`: set `watchStrategy` to the shape it runs to keep it{split}",
        list.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(channels: &str, shards: u32) -> Config {
        let yaml = format!(
            "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nsharding:\n  enabled: true\n  shards: {shards}\nchannels:\n{channels}"
        );
        Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    fn rec(id: &str, topic: &str) -> Recorded {
        Recorded::new(id, Some(&format!("{topic} {{namespace}}/{{name}}")))
    }

    /// Two namespaces in different shards of 8, and a channel name in a third.
    fn apart(c: &Config) -> (String, String) {
        let s = &c.sharding;
        let names: Vec<String> = (0..64).map(|i| format!("team-{i}")).collect();
        let a = names
            .iter()
            .find(|n| s.shard_of(n) != s.shard_of("watchNamespacedPods"))
            .unwrap();
        let b = names
            .iter()
            .find(|n| {
                s.shard_of(n) != s.shard_of("watchNamespacedPods") && s.shard_of(n) != s.shard_of(a)
            })
            .unwrap();
        (a.clone(), b.clone())
    }

    #[test]
    fn changes_that_move_keys_between_shards_are_found() {
        let probe = cfg("  - operationId: watchNodes\n", 8);
        let (a, b) = apart(&probe);
        let per_ns = format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [{a}, {b}]\n    topic: pods\n    watchStrategy: perNamespace\n"
        );
        let wide = format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [{a}, {b}]\n    topic: pods\n    watchStrategy: clusterWide\n"
        );
        let pods_a = format!("watchNamespacedPods.{a}");
        let all = "watchNamespacedPods._all".to_string();
        // (configuration, recorded streams, how many crossings)
        let table: Vec<(&str, String, Vec<Recorded>, usize)> =
            vec![
            ("nothing recorded", per_ns.clone(), vec![], 0),
            (
                "the same shape",
                per_ns.clone(),
                vec![rec(&pods_a, "pods")],
                0,
            ),
            (
                "per namespace to fanned out: the same shards",
                wide.clone(),
                vec![rec(&pods_a, "pods")],
                0,
            ),
            (
                "fanned out to per namespace: the same shards",
                per_ns.clone(),
                vec![rec("watchNamespacedPods._all-s3", "pods")],
                0,
            ),
            (
                "recorded whole to per namespace",
                per_ns.clone(),
                vec![rec(&all, "pods")],
                1,
            ),
            (
                "a renamed cluster-scoped channel",
                "  - operationId: watchNodes\n    name: nodes\n    topic: nodes\n".into(),
                vec![rec("watchNodes._all", "nodes")],
                1,
            ),
            (
                "cluster-wide to every namespace, relayed per namespace",
                "  - operationId: watchNamespacedPods\n    allNamespaces: true\n    topic: pods\n"
                    .into(),
                vec![rec(&all, "pods")],
                1,
            ),
            (
                "a stream over one collection recorded whole, now fanned out",
                "  - operationId: watchNodes\n    topic: nodes\n".into(),
                vec![rec("watchNodes._all", "nodes")],
                1,
            ),
            (
                "a shard's part of a fanned-out stream",
                "  - operationId: watchNodes\n    topic: nodes\n".into(),
                vec![rec("watchNodes._all-s3", "nodes")],
                0,
            ),
            (
                "a removed channel whose topic nobody else writes",
                "  - operationId: watchNodes\n    topic: nodes\n".into(),
                vec![rec(&all, "pods")],
                0,
            ),
            (
                "another channel's per-namespace stream on the same topic",
                wide.replace("watchNamespacedPods", "watchNamespacedPods\n    name: pods2"),
                vec![rec(&pods_a, "pods")],
                1,
            ),
        ];
        for (what, channels, recorded, want) in table {
            let c = cfg(&channels, 8);
            let found = crossings(&c, &recorded);
            assert_eq!(found.len(), want, "{what}: {found:?}");
        }
    }

    /// A stream over one collection recorded whole stays whole in its channel's shard: no key
    /// moves, and its parts are not run; a per-namespace stream of another shard still crosses.
    #[test]
    fn a_stream_recorded_whole_is_kept_whole() {
        let nodes = "  - operationId: watchNodes\n    topic: nodes\n";
        let whole = rec("watchNodes._all", "nodes");
        let kept = cfg(nodes, 8).keeping_whole(std::slice::from_ref(&whole.id));
        assert!(kept.channels[0].kept_whole);
        assert!(!kept.sharding.fans(&kept.channels[0], false));
        assert!(crossings(&kept, std::slice::from_ref(&whole)).is_empty());
        // A release that already fanned it out (or never ran it) is not kept whole.
        let fanned = cfg(nodes, 8).keeping_whole(&["watchNodes._all-s3".into()]);
        assert!(!fanned.channels[0].kept_whole);

        let probe = cfg(nodes, 8);
        let (a, _) = apart(&probe);
        let wide = format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [{a}]\n    topic: pods\n    watchStrategy: clusterWide\n"
        );
        let recorded = [
            rec("watchNamespacedPods._all", "pods"),
            rec(&format!("watchNamespacedPods.{a}"), "pods"),
        ];
        let ids: Vec<String> = recorded.iter().map(|r| r.id.clone()).collect();
        let kept = cfg(&wide, 8).keeping_whole(&ids);
        assert!(kept.channels[0].kept_whole);
        let found = crossings(&kept, &recorded);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].announced, "watchNamespacedPods._all");

        // Read cluster-wide as a term decides it: a list under `auto` by its length, never
        // with a topic naming the namespace (that one runs per namespace: not kept).
        let all = ["watchNamespacedPods._all".to_string()];
        let auto = format!(
            "  - operationId: watchNamespacedPods\n    namespaces: [{a}, b]\n    topic: pods\n"
        );
        let mut long = cfg(&auto, 8);
        long.kubernetes.cluster_wide_above = 1;
        assert!(long.keeping_whole(&all).channels[0].kept_whole);
        let mut per_ns = cfg(&auto.replace("topic: pods", "topic: pods.{namespace}"), 8);
        per_ns.kubernetes.cluster_wide_above = 1;
        assert!(!per_ns.keeping_whole(&all).channels[0].kept_whole);
    }

    #[test]
    fn one_shard_or_no_sharding_never_crosses() {
        let c = cfg(
            "  - operationId: watchNamespacedPods\n    namespaces: [a]\n    topic: pods\n    watchStrategy: clusterWide\n",
            1,
        );
        assert!(crossings(&c, &[rec("watchNamespacedPods.a", "pods")]).is_empty());
    }

    #[test]
    fn the_refusal_names_the_stream_and_the_two_steps() {
        let found = [Crossing {
            retired: "pods.a".into(),
            from: 3,
            channel: "pods".into(),
            announced: "pods._all".into(),
            to: Some(5),
        }];
        let text = refusal(&found);
        assert!(text.contains("pods.a (shard 3)"), "{text}");
        assert!(text.contains("two steps"), "{text}");
        assert!(!text.contains("split-whole"), "{text}");
        // A channel kept whole, now per namespace: split it first. Not a renamed one.
        let whole = |channel: &str| Crossing {
            retired: "pods._all".into(),
            from: 3,
            channel: channel.into(),
            announced: "pods.<namespace>".into(),
            to: None,
        };
        assert!(refusal(&[whole("pods")]).contains("split-whole"));
        assert!(!refusal(&[whole("pods2")]).contains("split-whole"));
    }
}
