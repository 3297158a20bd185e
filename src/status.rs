//! `watchrelay status`: what the checkpoint ConfigMap and the leader Lease say, per stream.
//!
//! With `sharding.enabled`, every shard's checkpoint ConfigMap (`<checkpoint.name>-s<k>`) is read
//! too: its owner and owner epoch, how many streams it holds and how old its oldest position is,
//! and its streams join the per-stream list, each with its shard.

use std::fmt::Write;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde::Serialize;

use crate::checkpoint::{self, EPOCH_ANNOTATION, OWNER_ANNOTATION, RESYNC_ANNOTATION};
use crate::config::{Config, ShardingConfig, StreamId};

/// How many shard ConfigMaps are read at once.
const PARALLEL_READS: usize = 16;

/// What `watchrelay status` reports, as a table ([`text`]) or as JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `namespace/name` of the checkpoint ConfigMap.
    pub checkpoint: String,
    /// Every stream with a saved position, ordered by id.
    pub streams: Vec<StreamStatus>,
    /// A resync requested and not yet taken by the relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync_requested: Option<String>,
    /// With leader election on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<Leader>,
    /// With sharding on: every shard, ordered by number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardStatus>>,
}

/// One stream's saved position.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamStatus {
    /// The stream's id, `<channel>.<namespace>`.
    pub stream: String,
    /// The resourceVersion up to which Kafka acknowledged everything.
    pub position: Option<String>,
    /// When it was acknowledged.
    pub acknowledged_at: Option<String>,
    /// Seconds since `acknowledgedAt`: how far behind a restart would resume.
    pub age_seconds: Option<i64>,
    /// With sharding on, the shard whose checkpoint ConfigMap holds the position; `None` for a
    /// position in the main checkpoint ConfigMap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

/// One shard's checkpoint ConfigMap (with sharding on).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    /// The shard's number, from 0.
    pub shard: u32,
    /// The name of its checkpoint ConfigMap (`<checkpoint.name>-s<k>`).
    pub config_map: String,
    /// Whether that ConfigMap exists: a shard without one was never owned.
    pub exists: bool,
    /// The replica that last claimed the shard ([`OWNER_ANNOTATION`]).
    pub owner: Option<String>,
    /// Its owner epoch ([`EPOCH_ANNOTATION`]), which grows with each claim.
    pub owner_epoch: Option<u64>,
    /// How many streams have an entry in the ConfigMap.
    pub streams: usize,
    /// Seconds since the oldest of its positions was acknowledged: how far behind the shard's
    /// next owner would resume.
    pub oldest_age_seconds: Option<i64>,
}

/// Who holds the leader Lease.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// The holder's identity; `None` when the Lease is free.
    pub holder: Option<String>,
    /// When the holder last renewed the Lease (RFC 3339).
    pub renewed_at: Option<String>,
    /// Seconds since that renewal: a leader that stopped renewing shows here.
    pub age_seconds: Option<i64>,
}

fn age(at: &str) -> Option<i64> {
    let t: jiff::Timestamp = at.parse().ok()?;
    Some(jiff::Timestamp::now().as_second() - t.as_second())
}

/// The positions a checkpoint ConfigMap holds, each marked with `shard`.
fn positions(cm: &ConfigMap, shard: Option<u32>) -> Vec<StreamStatus> {
    checkpoint::read(cm)
        .into_iter()
        .map(|(stream, saved)| StreamStatus {
            stream,
            age_seconds: saved.at.as_deref().and_then(age),
            position: saved.rv,
            acknowledged_at: saved.at,
            shard,
        })
        .collect()
}

/// Shard `shard`'s status from its checkpoint ConfigMap `name` (`None` when it does not exist),
/// and the positions it holds.
fn shard_status(
    shard: u32,
    name: String,
    cm: Option<&ConfigMap>,
) -> (ShardStatus, Vec<StreamStatus>) {
    let streams = cm.map(|cm| positions(cm, Some(shard))).unwrap_or_default();
    let annotation = |key: &str| {
        cm.and_then(|cm| cm.metadata.annotations.as_ref())
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let status = ShardStatus {
        shard,
        config_map: name,
        exists: cm.is_some(),
        owner: annotation(OWNER_ANNOTATION),
        owner_epoch: annotation(EPOCH_ANNOTATION).and_then(|e| e.parse().ok()),
        streams: streams.len(),
        oldest_age_seconds: streams
            .iter()
            .filter(|s| s.position.is_some())
            .filter_map(|s| s.age_seconds)
            .max(),
    };
    (status, streams)
}

/// Reads every shard's checkpoint ConfigMap, a few at a time.
async fn read_shards(
    api: &Api<ConfigMap>,
    cfg: &Config,
) -> Result<(Vec<ShardStatus>, Vec<StreamStatus>), kube::Error> {
    let found: Vec<(u32, String, Option<ConfigMap>)> =
        futures::stream::iter((0..cfg.sharding.shards).map(|k| {
            let name = ShardingConfig::configmap(&cfg.checkpoint.name, k);
            async move {
                let cm = api.get_opt(&name).await?;
                Ok::<_, kube::Error>((k, name, cm))
            }
        }))
        .buffered(PARALLEL_READS)
        .try_collect()
        .await?;
    let mut shards = Vec::with_capacity(found.len());
    let mut streams = Vec::new();
    for (k, name, cm) in found {
        let (shard, positions) = shard_status(k, name, cm.as_ref());
        shards.push(shard);
        streams.extend(positions);
    }
    Ok((shards, streams))
}

/// Reads the status from the cluster.
pub async fn read(client: kube::Client, cfg: &Config) -> Result<Status, kube::Error> {
    let ns = &cfg.checkpoint.namespace;
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let cm = api.get_opt(&cfg.checkpoint.name).await?;
    // Sharded, the main ConfigMap's positions are a single leader's, copied into the shards.
    let (mut streams, shards) = if cfg.sharding.enabled {
        let (shards, positions) = read_shards(&api, cfg).await?;
        (positions, Some(shards))
    } else {
        let positions = cm.as_ref().map(|cm| positions(cm, None));
        (positions.unwrap_or_default(), None)
    };
    streams.sort_by(|a, b| a.stream.cmp(&b.stream).then(a.shard.cmp(&b.shard)));
    let resync_requested = cm
        .and_then(|cm| cm.metadata.annotations)
        .and_then(|mut a| a.remove(RESYNC_ANNOTATION));
    let le = &cfg.leader_election;
    let leader = if le.enabled {
        let lease_ns = le.namespace.as_ref().unwrap_or(ns);
        let lease = Api::<Lease>::namespaced(client, lease_ns)
            .get_opt(&le.name)
            .await?;
        let spec = lease.and_then(|l| l.spec);
        let renewed_at = spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| format!("{:.0}", t.0));
        Some(Leader {
            lease: format!("{lease_ns}/{}", le.name),
            holder: spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty()),
            age_seconds: renewed_at.as_deref().and_then(age),
            renewed_at,
        })
    } else {
        None
    };
    Ok(Status {
        checkpoint: format!("{ns}/{}", cfg.checkpoint.name),
        streams,
        resync_requested,
        leader,
        shards,
    })
}

/// The status as a table.
pub fn text(s: &Status) -> String {
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "checkpoint ConfigMap {}", s.checkpoint);
    if let Some(l) = &s.leader {
        let _ = writeln!(
            out,
            "leader {} (Lease {}, renewed {})",
            opt(&l.holder),
            l.lease,
            l.age_seconds
                .map(|a| format!("{a}s ago"))
                .unwrap_or_else(|| "never".into())
        );
    }
    if let Some(r) = &s.resync_requested {
        let _ = writeln!(out, "resync requested: {r}");
    }
    if let Some(shards) = &s.shards {
        shards_text(&mut out, shards);
    }
    if s.streams.is_empty() {
        let _ = writeln!(out, "no stream has saved a position yet");
        return out;
    }
    let width = s
        .streams
        .iter()
        .map(|x| x.stream.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let seconds = |a: Option<i64>| a.map(|a| format!("{a}s")).unwrap_or_else(|| "-".into());
    if s.shards.is_some() {
        let _ = writeln!(
            out,
            "{:width$}  {:>5}  {:>12}  {:>8}",
            "STREAM", "SHARD", "POSITION", "AGE"
        );
        for st in &s.streams {
            let _ = writeln!(
                out,
                "{:width$}  {:>5}  {:>12}  {:>8}",
                st.stream,
                st.shard.map_or_else(|| "-".into(), |k| k.to_string()),
                opt(&st.position),
                seconds(st.age_seconds),
            );
        }
        // A stream over one collection recorded whole in a sharded release ran so before
        // fan-out: one replica reads the collection for it.
        let whole: Vec<&str> = s
            .streams
            .iter()
            .map(|st| st.stream.as_str())
            .filter(|id| {
                StreamId::parts(id).is_some_and(|(_, ns)| ns.is_none())
                    && StreamId::shard_in(id).is_none()
            })
            .collect();
        if !whole.is_empty() {
            let _ = writeln!(
                out,
                "kept whole from before fan-out: {}; `watchrelay split-whole`, with the release scaled to zero, fans them out",
                whole.join(", ")
            );
        }
        return out;
    }
    let _ = writeln!(out, "{:width$}  {:>12}  {:>8}", "STREAM", "POSITION", "AGE");
    for st in &s.streams {
        let _ = writeln!(
            out,
            "{:width$}  {:>12}  {:>8}",
            st.stream,
            opt(&st.position),
            seconds(st.age_seconds),
        );
    }
    out
}

/// The shards' table: per shard its owner, owner epoch, streams and oldest position's age.
fn shards_text(out: &mut String, shards: &[ShardStatus]) {
    let never = shards.iter().filter(|k| !k.exists).count();
    let _ = writeln!(out, "shards: {} ({never} never owned)", shards.len());
    let owner = |k: &ShardStatus| match (&k.owner, k.exists) {
        (Some(o), _) => o.clone(),
        (None, true) => "-".into(),
        (None, false) => "(never owned)".into(),
    };
    let width = shards
        .iter()
        .map(|k| owner(k).len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:>5}  {:width$}  {:>6}  {:>7}  {:>8}",
        "SHARD", "OWNER", "EPOCH", "STREAMS", "OLDEST"
    );
    for k in shards {
        let _ = writeln!(
            out,
            "{:>5}  {:width$}  {:>6}  {:>7}  {:>8}",
            k.shard,
            owner(k),
            k.owner_epoch.map_or_else(|| "-".into(), |e| e.to_string()),
            k.streams,
            k.oldest_age_seconds
                .map_or_else(|| "-".into(), |a| format!("{a}s")),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::api::ObjectMeta;

    use super::*;

    fn stream(stream: &str, position: &str, age: i64, shard: Option<u32>) -> StreamStatus {
        StreamStatus {
            stream: stream.into(),
            position: Some(position.into()),
            acknowledged_at: Some("2026-01-01T00:00:00Z".into()),
            age_seconds: Some(age),
            shard,
        }
    }

    fn status(streams: Vec<StreamStatus>, shards: Option<Vec<ShardStatus>>) -> Status {
        Status {
            checkpoint: "relay/watchrelay-checkpoints".into(),
            streams,
            resync_requested: None,
            leader: None,
            shards,
        }
    }

    #[test]
    fn without_sharding_the_table_has_no_shard_column() {
        let s = status(
            vec![
                stream("watchNamespacedPods.a", "42", 7, None),
                StreamStatus {
                    stream: "watchNodes._all".into(),
                    position: None,
                    acknowledged_at: None,
                    age_seconds: None,
                    shard: None,
                },
            ],
            None,
        );
        assert_eq!(
            text(&s),
            "checkpoint ConfigMap relay/watchrelay-checkpoints\n\
             STREAM                     POSITION       AGE\n\
             watchNamespacedPods.a            42        7s\n\
             watchNodes._all                   -         -\n"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("shards").is_none() && json["streams"][0].get("shard").is_none());
        assert_eq!(
            text(&status(vec![], None)),
            "checkpoint ConfigMap relay/watchrelay-checkpoints\nno stream has saved a position yet\n"
        );
    }

    #[test]
    fn with_sharding_every_shard_and_each_streams_shard_show() {
        let shard = |k: u32, owner: Option<&str>, epoch, streams, oldest| ShardStatus {
            shard: k,
            config_map: ShardingConfig::configmap("watchrelay-checkpoints", k),
            exists: owner.is_some(),
            owner: owner.map(Into::into),
            owner_epoch: epoch,
            streams,
            oldest_age_seconds: oldest,
        };
        let s = status(
            vec![
                stream("watchNamespacedPods.a", "42", 7, Some(1)),
                stream("watchNamespacedPods.b", "4711", 12, Some(0)),
                stream("watchNodes._all-s1", "4711", 12, Some(1)),
            ],
            Some(vec![
                shard(0, Some("watchrelay-7d9f-abcde"), Some(3), 1, Some(12)),
                shard(1, Some("watchrelay-7d9f-fghij"), Some(1), 2, Some(7)),
                shard(2, None, None, 0, None),
            ]),
        );
        assert_eq!(
            text(&s),
            "checkpoint ConfigMap relay/watchrelay-checkpoints\n\
             shards: 3 (1 never owned)\n\
             SHARD  OWNER                   EPOCH  STREAMS    OLDEST\n\
             \x20   0  watchrelay-7d9f-abcde       3        1       12s\n\
             \x20   1  watchrelay-7d9f-fghij       1        2        7s\n\
             \x20   2  (never owned)               -        0         -\n\
             STREAM                 SHARD      POSITION       AGE\n\
             watchNamespacedPods.a      1            42        7s\n\
             watchNamespacedPods.b      0          4711       12s\n\
             watchNodes._all-s1         1          4711       12s\n"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["shards"][0]["ownerEpoch"], 3);
        assert_eq!(json["shards"][2]["configMap"], "watchrelay-checkpoints-s2");
        assert_eq!(json["shards"][2]["exists"], false);
        assert_eq!(json["streams"][1]["shard"], 0);
        // A stream kept whole from before fan-out is named, with the way to fan it out.
        let mut kept = s;
        kept.streams
            .push(stream("watchAllPods._all", "4712", 3, Some(2)));
        let said = text(&kept);
        assert!(
            said.ends_with("kept whole from before fan-out: watchAllPods._all; `watchrelay split-whole`, with the release scaled to zero, fans them out\n"),
            "{said}"
        );
    }

    #[test]
    fn a_shard_is_read_from_its_configmap() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([
                    (OWNER_ANNOTATION.to_string(), "replica-a".to_string()),
                    (EPOCH_ANNOTATION.to_string(), "5".to_string()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (
                    "watchNamespacedPods.a".to_string(),
                    r#"{"rv":"42","at":"2026-01-01T00:00:00Z"}"#.to_string(),
                ),
                (
                    "watchNamespacedPods.b".to_string(),
                    r#"{"rv":"43","at":"2026-01-02T00:00:00Z"}"#.to_string(),
                ),
                (
                    "watchNamespacedPods.c".to_string(),
                    r#"{"rv":null,"at":"2020-01-01T00:00:00Z"}"#.to_string(),
                ),
                (checkpoint::WRITES_KEY.to_string(), "9".to_string()),
            ])),
            ..ConfigMap::default()
        };
        let (k, streams) = shard_status(2, "cp-s2".into(), Some(&cm));
        assert_eq!(
            (
                k.shard,
                k.exists,
                k.owner.as_deref(),
                k.owner_epoch,
                k.streams
            ),
            (2, true, Some("replica-a"), Some(5), 3)
        );
        assert!(streams.iter().all(|s| s.shard == Some(2)));
        // The oldest position is a's: c has none to resume from.
        let a = streams
            .iter()
            .find(|s| s.stream == "watchNamespacedPods.a")
            .unwrap();
        assert_eq!(k.oldest_age_seconds, a.age_seconds);

        let (k, streams) = shard_status(3, "cp-s3".into(), None);
        assert!(!k.exists && k.owner.is_none() && k.owner_epoch.is_none());
        assert!(streams.is_empty() && k.streams == 0 && k.oldest_age_seconds.is_none());
    }
}
