//! Stream positions in one ConfigMap.
//!
//! Each stream owns one key (`<channel>.<namespace>`, or `<channel>._all` for a cluster-wide
//! stream) in `data`: the resourceVersion of its longest acknowledged prefix, when Kafka had
//! acknowledged it and the fingerprint of the query it belongs to, as JSON
//! (`{"rv":"4711","at":"…","query":"…"}`, readable with kubectl). That is a hundred bytes or so
//! per stream however many objects it follows (a stream filtered to some namespaces adds the
//! set-sum of them, 64 to 256 hex digits, and their invertible table, 784): which objects each
//! stream announced lives in the membership topic (see [`crate::membership`]), not here.
//! Writes are debounced, use optimistic concurrency (the ConfigMap's own resourceVersion) and
//! are retried on 409 Conflict after re-reading.
//!
//! Older versions kept known-object sets in the ConfigMap (inline in `data`, later zstd JSON in
//! `binaryData`). They are still read, once, so the relay can move them to the membership
//! topic; the first write removes them.
//!
//! This module is the format; [`Store`] reads and writes the ConfigMap. The loop that writes what
//! the streams publish is the relay's checkpoint writer.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod store;

pub use store::{Ownership, Store, Written};

/// The first and the longest wait between two attempts of [`until_read`].
const READ_RETRY: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(30),
);

/// What `attempt` reads, once it succeeds; `None` once `stop` fires first. An attempt that
/// fails (the API server unreachable or overloaded, a ConfigMap forbidden) is logged as `what`
/// failing and tried again with a doubling wait, never the end of the relay: nothing that
/// needs the answer starts before it.
pub async fn until_read<T, E, F>(
    what: &str,
    stop: &tokio_util::sync::CancellationToken,
    mut attempt: impl FnMut() -> F,
) -> Option<T>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut wait = READ_RETRY.0;
    loop {
        let error = tokio::select! {
            _ = stop.cancelled() => return None,
            read = attempt() => match read {
                Ok(read) => return Some(read),
                Err(e) => e,
            },
        };
        tracing::warn!(%error, retry_in = ?wait, "{what} failed; nothing that needs it starts before it is read");
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(READ_RETRY.1);
    }
}

/// An annotation on the checkpoint ConfigMap that asks the running relay to relist and
/// reconcile the streams of a channel (its name) or of every channel (`all`), re-announcing every
/// object, or with a `;delta` suffix only those changed since each stream's position (see
/// [`resync_request`]); the relay removes it once it has asked them.
pub const RESYNC_ANNOTATION: &str = "watchrelay.io/resync";

const DELTA_SUFFIX: &str = ";delta";

/// An annotation on a shard's checkpoint ConfigMap: the owner epoch of the replica that last
/// wrote it. A write finding a higher epoch than its own fails ([`CheckpointError::Deposed`]).
pub const EPOCH_ANNOTATION: &str = "watchrelay.io/owner-epoch";

/// An annotation on a shard's checkpoint ConfigMap: the replica that owns it, for people.
pub const OWNER_ANNOTATION: &str = "watchrelay.io/owner";

/// The annotation of a sharded release's checkpoint ConfigMap saying which replica last claimed
/// each shard: a JSON object, shard number to replica identity, written by each replica as it
/// claims shards. A summary for people; each shard's ConfigMap and the group are authoritative.
pub const SHARD_OWNERS_ANNOTATION: &str = "watchrelay.io/shard-owners";

/// The annotation of a sharded release's checkpoint ConfigMap naming the shard count, the
/// shards' membership topic and the function mapping streams to shards that its shards were
/// made with (`<shards> <topic> <function>`), set by the first
/// sharded replica: a replica configured otherwise refuses to start, since the shard of every
/// stream and the meaning of every shard's ConfigMap depend on them.
pub const SHARDING_ANNOTATION: &str = "watchrelay.io/sharding";

/// The annotation of a checkpoint ConfigMap holding the highest era any of its streams was
/// written with: a stream's next era is above it (see [`crate::envelope::next_era`]), so
/// versions never go back across handovers, streams that left and came back, or replicas whose
/// clocks disagree; the entries alone would not keep it once a stream's entry is removed.
pub const ERA_FLOOR_ANNOTATION: &str = "watchrelay.io/era-floor";

/// The era of an encoded entry, 0 when it has none or does not parse.
pub(crate) fn era_of(entry: &str) -> u64 {
    #[derive(Deserialize)]
    struct Era {
        #[serde(default)]
        era: u64,
    }
    serde_json::from_str::<Era>(entry).map_or(0, |e| e.era)
}

/// The era floor stamped on `cm` ([`ERA_FLOOR_ANNOTATION`]), 0 without one. A ConfigMap
/// written before the annotation existed holds its floor in its entries' eras alone: see
/// [`Loaded::era_floor`].
pub fn stamped_era_floor(cm: &ConfigMap) -> u64 {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ERA_FLOOR_ANNOTATION)?.parse().ok())
        .unwrap_or(0)
}

/// The [`RESYNC_ANNOTATION`] value asking for a resync of `what`.
pub fn resync_request(what: &str, delta: bool) -> String {
    if delta {
        format!("{what}{DELTA_SUFFIX}")
    } else {
        what.to_string()
    }
}

/// What a [`RESYNC_ANNOTATION`] value asks for: the channel (or `all`), and whether a delta
/// resync suffices.
pub fn parse_resync_request(value: &str) -> (&str, bool) {
    match value.strip_suffix(DELTA_SUFFIX) {
        Some(what) => (what, true),
        None => (value, false),
    }
}

/// The `data` key of the [`MembershipMark`]: no stream id starts with a dot.
pub const MARK_KEY: &str = ".membership";

/// The `data` key of the write counter: every write of the ConfigMap raises it by one, and the
/// relay keeps a copy of it in the membership topic (see [`crate::membership::writes_record`]).
/// An etcd restore rewinds the ConfigMap with the rest of the cluster, but not Kafka: a counter
/// below what this relay last wrote, or below the membership topic's copy, says the cluster's
/// history went back, and every stream resyncs whole.
pub const WRITES_KEY: &str = ".writes";

/// The write counter a ConfigMap holds (0 without one).
pub fn read_writes(cm: &ConfigMap) -> u64 {
    cm.data
        .as_ref()
        .and_then(|d| d.get(WRITES_KEY))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The `data` key of a shard's ConfigMap saying its share of the single-leader release's state
/// (positions and members) was copied in: the value names where from. Copied once.
pub const MIGRATED_KEY: &str = ".migrated";

/// The `data` key of a sharded release's checkpoint ConfigMaps while `watchrelay split-whole`
/// hands streams kept whole to the shards' parts (the value names them): no replica starts,
/// and no term of the shard runs, until the split removes it (see `relay::split`).
pub const SPLITTING_KEY: &str = ".splitting";

/// The `data` key of a sharded release's checkpoint ConfigMaps counting the splits of streams
/// kept whole made on the release: each split raises it on every shard as it ends. A replica
/// that settled its configuration before a split finds it raised and restarts.
pub const SPLITS_KEY: &str = ".splits";

/// What this relay recorded of its membership topic the last time it verified it: the topic,
/// the id of the mark it wrote into it, and its partitions. A topic deleted and created again
/// lacks the mark; one with other partitions spreads keys differently. Its presence also says
/// the ownerless records of older versions were adopted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipMark {
    /// The membership topic's name.
    pub topic: String,
    /// The id in the mark this relay wrote into the topic ([`crate::membership::mark_record`]).
    pub id: String,
    /// How many partitions the topic had: another count spreads keys differently.
    pub partitions: usize,
}

/// What the checkpoint ConfigMap holds.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Each stream's position, by stream id (`<channel>.<namespace>`).
    pub streams: HashMap<String, Saved>,
    /// What the relay last verified of its membership topic; `None` before the first run.
    pub mark: Option<MembershipMark>,
    /// The write counter ([`WRITES_KEY`]).
    pub writes: u64,
    /// A shard's ConfigMap: what its share of a single-leader release's state was copied from
    /// ([`MIGRATED_KEY`]), once it was.
    pub migrated: Option<String>,
    /// A shard's ConfigMap: the streams kept whole that a split is handing to the shards'
    /// parts ([`SPLITTING_KEY`]), until it is done.
    pub splitting: Option<String>,
    /// A shard's ConfigMap: how many splits of streams kept whole it recorded ([`SPLITS_KEY`]).
    pub splits: u64,
    /// The highest era its streams were written with: the [`ERA_FLOOR_ANNOTATION`], or the
    /// highest era of its entries if above.
    pub era_floor: u64,
}

/// ConfigMaps are limited to 1 MiB; leave room for metadata.
pub(crate) const BUDGET: usize = 900 * 1024;

/// Decompressed legacy sets larger than this are refused rather than allocated.
const MAX_KNOWN_BYTES: u64 = 64 << 20;

/// Why the checkpoint ConfigMap could not be read or written.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// The API server refused the request, or could not be reached.
    #[error("checkpoint ConfigMap {name}: {source}")]
    Api {
        /// The ConfigMap's name.
        name: String,
        /// What the client reported.
        source: kube::Error,
    },
    /// The streams' positions do not fit in one ConfigMap.
    #[error("checkpoint ConfigMap {name}: the positions take {bytes} bytes, over the {budget}-byte budget; use fewer streams per ConfigMap")]
    TooLarge {
        /// The ConfigMap's name.
        name: String,
        /// Bytes the streams' entries would take.
        bytes: usize,
        /// Bytes a ConfigMap's `data` may take, leaving room for its metadata.
        budget: usize,
    },
    /// A write outlasted its bound; the positions it carried go with the next write.
    #[error("checkpoint write timed out after {0:?}")]
    TimedOut(std::time::Duration),
    /// Every attempt lost to a concurrent writer: the ConfigMap changed between read and write.
    #[error("checkpoint ConfigMap {name} kept changing under us (409 Conflict {attempts} times)")]
    Conflict {
        /// The ConfigMap's name.
        name: String,
        /// How many writes were tried.
        attempts: u32,
    },
    /// A newer owner of the shard wrote the ConfigMap: this replica no longer owns it.
    #[error("checkpoint ConfigMap {name} belongs to owner epoch {found} now, not {ours}: the shard moved to another replica")]
    Deposed {
        /// The ConfigMap's name.
        name: String,
        /// The epoch found on the ConfigMap.
        found: u64,
        /// This writer's epoch.
        ours: u64,
    },
}

/// What one stream persisted: its acknowledged position.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Saved {
    /// The resourceVersion the stream resumes its watch from; `None` makes it start with a list.
    pub rv: Option<String>,
    /// When Kafka had acknowledged everything up to `rv` (RFC 3339); absent in older entries.
    #[serde(default)]
    pub at: Option<String>,
    /// The fingerprint of the query the position belongs to (path, namespace, selectors): a
    /// position is never resumed under another query. Absent in older entries.
    #[serde(default)]
    pub query: Option<String>,
    /// A stream filtered to some namespaces: the set-sum of those `query` holds (hex, 256 to
    /// 1,024 bits), which tells a start under other namespaces which of those in scope now
    /// without a member the position covered, where `query` alone could try ten. Absent in
    /// older entries, and for other streams.
    #[serde(default)]
    pub sum: Option<String>,
    /// A stream filtered to some namespaces: the invertible table of those `query` holds (hex),
    /// which reads back at a start under other namespaces the few that moved, even those it
    /// cannot name (out of scope now, without a member), where `sum` only chooses among names
    /// it is given. Absent in older entries, and for other streams.
    #[serde(default)]
    pub table: Option<String>,
    /// A stream over a collection read cluster-wide: the namespaces whose changes up to a
    /// resourceVersion above `rv` were published already (by the namespace's own stream,
    /// gathered into it at a switch of `watchStrategy`, or by the list that took the namespace
    /// into a filtered stream's scope), each with that version: a resume from `rv` does not
    /// publish them again. Empty in older entries.
    #[serde(default)]
    pub fences: BTreeMap<String, String>,
    /// A stream over a collection read cluster-wide, resumed from `rv` by a switch that
    /// gathered namespaces' streams while other namespaces of its scope had none: the
    /// namespaces those streams covered. Before it watches, it reads the collection and
    /// announces every object at or below `rv` of the others (the watch from `rv` would show
    /// none of them). Kept until that is acknowledged, so that a take-in cut short is done
    /// again; meanwhile `query` is [`taking_in`]'s, so that a relay that does not know this
    /// field (an older version, side by side in a rollout) takes the position for another
    /// query's and relists rather than resume without taking in. Absent in older entries.
    #[serde(default)]
    pub covered: Option<BTreeSet<String>>,
    /// Where the stream published, as `<topic> <key template>`: under another route its
    /// members are retracted where they were announced and the stream reconciles. Absent in
    /// older entries.
    #[serde(default)]
    pub route: Option<String>,
    /// The kind of the stream's objects, for a resource outside the catalogue (whose kind the
    /// relay learns from the API server): what its inferred DELETEDs say, should the stream be
    /// retired once its channel is gone. Absent for built-in resources.
    #[serde(default)]
    pub kind: Option<String>,
    /// A known-object set an older version kept here, to be moved to the membership topic
    /// (which reads it as its members, by uid). Never written.
    #[serde(default)]
    pub known: Option<serde_json::Value>,
    /// The stream's era: the high part of every record's `watchrelay.version` (see
    /// [`crate::envelope::version`]). 0 in older entries.
    #[serde(default)]
    pub era: u64,
    /// The position was forgotten by a write that found the ConfigMap rewound (an etcd
    /// restore): no position committed with the stream's records in Kafka may replace the
    /// entry, whatever its era (see [`Saved::take_committed`]). Until the stream's next write.
    #[serde(default)]
    pub rewound: bool,
}

impl Saved {
    /// This ConfigMap position replaced by `committed`, the one committed with the stream's
    /// records in the membership topic (exactly once), which it may lag: the era never goes
    /// back, and a kind the committed position lacks is kept.
    ///
    /// An entry that forgot its position in a later era than the committed one's stays as it
    /// is: a stream (or its retirement) forgot the position before publishing what is no
    /// replay from it, and was cut short before that was committed. Resuming from the committed
    /// position would never undo what it had published (a retirement's DELETEDs). A write that
    /// found the ConfigMap rewound (an etcd restore) forgot every position so (`rewound`): the
    /// committed ones are of the history before the restore. Such an entry stays whatever the
    /// committed era (which another replica may have taken from a clock ahead of the one that
    /// forgot), and takes an era above it, so that versions go on rising from both.
    pub fn take_committed(&mut self, committed: Saved) {
        if self.rv.is_none() && (self.rewound || self.era > committed.era) {
            self.era = self.era.max(committed.era.saturating_add(1));
            return;
        }
        let (era, kind) = (self.era, self.kind.take());
        *self = committed;
        self.era = self.era.max(era);
        self.kind = self.kind.take().or(kind);
    }
}

/// The `data` entry of a stream's checkpoint.
#[derive(Serialize)]
struct Position<'a> {
    rv: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sum: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    fences: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    covered: Option<&'a BTreeSet<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    #[serde(skip_serializing_if = "is_zero")]
    era: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    rewound: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The query stamped on the position of a stream still to take in what it does not cover (see
/// [`Saved::covered`]): `query`'s, marked so that no relay unaware of the take-in resumes it.
pub fn taking_in(query: &str) -> String {
    format!("{query}+take-in")
}

/// A stream's checkpoint, encoded for the ConfigMap's `data`.
pub fn encode(saved: &Saved) -> String {
    serde_json::to_string(&Position {
        rv: saved.rv.as_deref(),
        at: saved.at.as_deref(),
        query: saved.query.as_deref(),
        sum: saved.sum.as_deref(),
        table: saved.table.as_deref(),
        fences: &saved.fences,
        covered: saved.covered.as_ref().filter(|_| saved.rv.is_some()),
        route: saved.route.as_deref(),
        kind: saved.kind.as_deref(),
        era: saved.era,
        rewound: saved.rewound,
    })
    .expect("plain strings serialize")
}

/// A legacy `binaryData` set, with the position it belonged to.
#[derive(Deserialize)]
struct KnownAt {
    rv: Option<String>,
    known: serde_json::Value,
}

fn decode_known(bytes: &[u8]) -> Result<KnownAt, String> {
    use std::io::Read;
    let mut json = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .map_err(|e| e.to_string())?
        .take(MAX_KNOWN_BYTES)
        .read_to_end(&mut json)
        .map_err(|e| e.to_string())?;
    if json.len() as u64 >= MAX_KNOWN_BYTES {
        return Err(format!("larger than {MAX_KNOWN_BYTES} bytes"));
    }
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// Longest resourceVersion accepted from a checkpoint (the API server's are about 20 digits).
const MAX_RV: usize = 128;

/// Whether a saved entry can be used: a position is a short printable token.
fn valid(s: &Saved) -> Result<(), String> {
    match &s.rv {
        Some(rv) if rv.is_empty() || rv.len() > MAX_RV => {
            Err(format!("resourceVersion of {} bytes", rv.len()))
        }
        Some(rv) if !rv.bytes().all(|b| b.is_ascii_graphic()) => {
            Err("resourceVersion with unprintable characters".into())
        }
        _ => Ok(()),
    }
}

/// The checkpoints a ConfigMap holds. An entry that cannot be read is left out (that stream
/// starts over with a list); a legacy set that cannot be read is left out of its entry.
pub fn read(cm: &ConfigMap) -> HashMap<String, Saved> {
    let mut out = HashMap::new();
    for (k, v) in cm
        .data
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with('.'))
    {
        let mut saved = match serde_json::from_str::<Saved>(v)
            .map_err(|e| e.to_string())
            .and_then(|s| valid(&s).map(|()| s))
        {
            Ok(s) => s,
            Err(e) => {
                // The entry's content is not logged: the ConfigMap is input like any other.
                tracing::warn!(key = %k, bytes = v.len(), error = %e, "ignoring a corrupt checkpoint entry; that stream starts afresh with a list");
                continue;
            }
        };
        if let Some(bytes) = cm.binary_data.as_ref().and_then(|b| b.get(k)) {
            match decode_known(&bytes.0) {
                Ok(at) if at.rv == saved.rv => saved.known = Some(at.known),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(key = %k, error = %e, "ignoring an unreadable legacy known-object set");
                }
            }
        }
        out.insert(k.clone(), saved);
    }
    out
}

/// The [`MembershipMark`] a ConfigMap holds, if it holds a readable one.
pub fn read_mark(cm: &ConfigMap) -> Option<MembershipMark> {
    let v = cm.data.as_ref()?.get(MARK_KEY)?;
    serde_json::from_str(v)
        .map_err(|e| tracing::warn!(error = %e, "ignoring an unreadable membership mark"))
        .ok()
}

/// The bytes `data` takes.
pub(crate) fn size(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_committed_position_replaces_the_entry_unless_the_entry_forgot_it_since() {
        let at = |rv: Option<&str>, era| Saved {
            rv: rv.map(str::to_string),
            era,
            ..Saved::default()
        };
        // The ConfigMap lagging behind the commits: the committed position wins.
        let mut lagging = at(Some("10"), 5);
        lagging.take_committed(at(Some("20"), 5));
        assert_eq!(lagging, at(Some("20"), 5));
        // Forgotten in the same era (a sync then committed): the committed position wins.
        let mut synced = at(None, 6);
        synced.take_committed(at(Some("30"), 6));
        assert_eq!(synced, at(Some("30"), 6));
        // Forgotten in a later era (a retirement cut short before its commit): it stays
        // forgotten, in its era.
        let mut retiring = at(None, 7);
        retiring.take_committed(at(Some("20"), 5));
        assert_eq!(retiring, at(None, 7));
    }

    #[test]
    fn a_position_is_small_and_round_trips() {
        let saved = Saved {
            rv: Some("4711".into()),
            at: Some("2026-01-01T00:00:00Z".into()),
            query: Some("q1".into()),
            sum: Some("s1".into()),
            table: Some("t1".into()),
            fences: BTreeMap::from([("a".to_string(), "4800".to_string())]),
            covered: Some(BTreeSet::from(["b".to_string()])),
            route: None,
            kind: None,
            known: Some(serde_json::json!({"u": {"name": "n", "rv": "1"}})),
            era: 0,
            rewound: false,
        };
        let entry = encode(&saved);
        assert_eq!(
            entry,
            r#"{"rv":"4711","at":"2026-01-01T00:00:00Z","query":"q1","sum":"s1","table":"t1","fences":{"a":"4800"},"covered":["b"]}"#,
            "no set is ever written"
        );
        let read = read(&ConfigMap {
            data: Some(BTreeMap::from([("s".to_string(), entry)])),
            ..Default::default()
        });
        assert_eq!(
            read["s"],
            Saved {
                known: None,
                ..saved
            }
        );
    }

    #[test]
    fn corrupt_entries_are_left_out_and_the_others_kept() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([
                ("good".to_string(), r#"{"rv":"12"}"#.to_string()),
                ("garbage".to_string(), "{not json".to_string()),
                (
                    "long".to_string(),
                    format!(r#"{{"rv":"{}"}}"#, "9".repeat(500)),
                ),
                ("empty".to_string(), r#"{"rv":""}"#.to_string()),
                ("control".to_string(), "{\"rv\":\"1\\n2\"}".to_string()),
            ])),
            binary_data: Some(BTreeMap::from([(
                "good".to_string(),
                ByteString(b"not zstd".to_vec()),
            )])),
            ..Default::default()
        };
        let saved = read(&cm);
        assert_eq!(saved.keys().collect::<Vec<_>>(), ["good"]);
        assert_eq!(saved["good"].rv.as_deref(), Some("12"));
        assert!(
            saved["good"].known.is_none(),
            "an unreadable set is left out"
        );
    }

    #[test]
    fn legacy_sets_are_read_for_adoption_inline_or_compressed() {
        let compressed = |rv: &str| {
            let json = format!(r#"{{"rv":"{rv}","known":{{"b":{{"name":"m","rv":"8"}}}}}}"#);
            ByteString(zstd::bulk::compress(json.as_bytes(), 3).unwrap())
        };
        let cm = ConfigMap {
            data: Some(BTreeMap::from([
                (
                    "inline".to_string(),
                    r#"{"rv":"7","known":{"u":{"name":"n","rv":"7"}}}"#.to_string(),
                ),
                ("packed".to_string(), r#"{"rv":"8"}"#.to_string()),
                ("stale".to_string(), r#"{"rv":"9"}"#.to_string()),
            ])),
            binary_data: Some(BTreeMap::from([
                ("packed".to_string(), compressed("8")),
                ("stale".to_string(), compressed("3")),
            ])),
            ..Default::default()
        };
        let saved = read(&cm);
        assert_eq!(saved["inline"].known.as_ref().unwrap()["u"]["name"], "n");
        assert_eq!(saved["packed"].known.as_ref().unwrap()["b"]["name"], "m");
        assert!(
            saved["stale"].known.is_none(),
            "a set of another position is not used"
        );
    }
}
