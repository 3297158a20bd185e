//! Known-object membership: which objects each stream has announced, kept in a compacted Kafka
//! topic used as a changelog (as Kafka Connect keeps source offsets).
//!
//! A stream needs its known objects to infer deletions it could not see: after a 410, a
//! relist's state lacks them, and each gets an inferred DELETED. The set lives in memory as
//! [`Members`] and in the membership topic as one record per (owner, stream, uid): the key is
//! `<owner>/<stream>/<uid>`, the value what an inferred DELETED needs (`{"name", "namespace",
//! "rv", "topic", "key"}`: the identity, the resourceVersion at which the object joined, and the
//! topic and key it was announced under) and a null value (a tombstone) once the object is gone.
//! At the start of each term the relay reads the topic from the beginning to its end offsets and
//! rebuilds every stream's set; compaction only bounds how much there is to read, the latest
//! record of each key decides.
//!
//! # Ownership
//! The [`Owner`] is the relay's checkpoint ConfigMap (`<namespace>/<name>`): every release has
//! its own, so releases sharing a cluster name, a membership topic and even channel names never
//! read, retire or tombstone each other's members. Records of other owners are skipped while
//! reading. Records an older version wrote without an owner (`<stream>/<uid>`) are adopted once:
//! only for streams that have a position in this relay's own ConfigMap, and only until the
//! ConfigMap records that the topic was adopted (see [`crate::checkpoint::MembershipMark`]).
//!
//! # Retraction
//! Because a record carries the topic and key its object was announced under, what a stream
//! announced can be retracted after its channel was renamed or removed, or its topic or key
//! template changed: an inferred DELETED goes to that topic and key.
//!
//! # No hole after a crash at any instant
//! The invariant: *an object a consumer may hold is a member in the topic.* It holds because
//! 1. **Joining comes first.** Before the first record announcing an object on a stream is
//!    handed to the producer, the object's membership record has been acknowledged by Kafka.
//!    Records wait in stream order behind pending joins (the outbox holds them), so nothing about
//!    an object precedes its join. Joins are pipelined: creations cost one extra round trip of
//!    latency, other changes nothing.
//! 2. **Leaving comes last.** The tombstone is produced only after the object's DELETED (real or
//!    inferred) was acknowledged, so a consumer that may still hold the object always finds it a
//!    member, and one whose tombstone landed has read its DELETED.
//!
//! Kill the relay at any point: each object a consumer holds is either in the topic as a member
//! or has its DELETED in the consumer's partition. After the restart a stream either resumes its
//! watch from its checkpoint (which replays every change after it, deletions included) or, when
//! that position has expired, relists and infers a DELETED for every member the list lacks.
//!
//! What can go wrong is only ever a member too many (a join acknowledged whose event was never
//! sent, a tombstone lost in the crash): it costs one superfluous inferred DELETED. On a key it
//! shares with a live object (same name, new uid) that DELETED is published before the live
//! object's ADDED, which the same resync sends, so the consumer still ends with the live object.
//!
//! The residual window is the fencing one (see [`crate::relay`]): a deposed leader's request
//! already on the wire can land after the new leader read the topic.

mod arena;
mod set;

use std::collections::{HashMap, HashSet};

pub use set::{Key, Members};

use crate::envelope::Record;
use crate::producer::{Inbox, Producer, Receipt, Refused, Sent};
pub use crate::tracker::Known;

/// The key of the record marking where a reading of the topic ends: a tombstone, which
/// [`Restored::apply`] skips.
pub const END_MARKER: &str = "~/end";

/// The stream name of an owner's topic mark: `<owner>/~/topic`.
const MARK: &str = "~";

/// Who owns persisted state: the checkpoint ConfigMap, as `<namespace>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner(String);

impl Owner {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}/{name}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The membership key of `uid` on `owner`'s `stream`.
pub fn key(owner: &Owner, stream: &str, uid: &str) -> String {
    format!("{owner}/{stream}/{uid}")
}

/// The record that makes `uid` a member of `owner`'s `stream` (`Some`) or no longer one
/// (`None`).
pub fn record(
    topic: &str,
    owner: &Owner,
    stream: &str,
    uid: &str,
    known: Option<&Known>,
) -> Record {
    Record {
        topic: topic.to_string(),
        key: key(owner, stream, uid),
        value: known
            .map(|k| serde_json::to_vec(k).expect("plain strings serialize"))
            .unwrap_or_default(),
        headers: Default::default(),
        tombstone: known.is_none(),
    }
}

/// The record that marks the topic as `owner`'s, with `id`: it stays (compaction keeps the
/// latest record of a key) as long as the topic lives, so a topic deleted and created again
/// lacks it.
pub fn mark_record(topic: &str, owner: &Owner, id: &str) -> Record {
    Record {
        topic: topic.to_string(),
        key: format!("{owner}/{MARK}/topic"),
        value: serde_json::to_vec(&serde_json::json!({ "id": id })).expect("a string serializes"),
        headers: Default::default(),
        tombstone: false,
    }
}

/// How the key of an owner's [`writes_record`] ends.
pub const WRITES_SUFFIX: &str = "/~/writes";

/// The record that copies the checkpoint ConfigMap's write counter (see
/// [`crate::checkpoint::WRITES_KEY`]) into the topic, after each write: a restore of the
/// cluster rewinds the ConfigMap but not this copy.
pub fn writes_record(topic: &str, owner: &Owner, writes: u64) -> Record {
    Record {
        topic: topic.to_string(),
        key: format!("{owner}{WRITES_SUFFIX}"),
        value: serde_json::to_vec(&serde_json::json!({ "writes": writes }))
            .expect("a number serializes"),
        headers: Default::default(),
        tombstone: false,
    }
}

/// What another owner's live member says: that owner announced objects of `namespace` on
/// `topic`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    pub owner: String,
    pub topic: String,
    pub namespace: Option<String>,
}

/// Every stream's members, rebuilt from the membership topic: this owner's, and the ownerless
/// records of older versions for the streams that may adopt them.
#[derive(Debug)]
pub struct Restored {
    owner: Owner,
    streams: HashMap<String, Members>,
    /// Ownerless records, kept only for these streams (`None`: none kept).
    legacy_for: Option<HashSet<String>>,
    legacy: HashMap<String, Members>,
    /// The id of this owner's topic mark, as read.
    pub mark: Option<String>,
    /// The checkpoint ConfigMap's write counter, as last copied here ([`writes_record`]).
    pub writes: Option<u64>,
    /// Records read.
    pub records: u64,
    /// Records of other owners (skipped as members).
    pub foreign: u64,
    /// Other owners' live members while reading: a hash of the key, and the claim it makes.
    foreign_live: HashMap<u64, u32>,
    /// Distinct claims of other owners: who announced on which topic in which namespace.
    claim_list: Vec<Claim>,
    claim_index: HashMap<Claim, u32>,
    /// Once read: the claims other owners' live members make, by namespace (each stream of
    /// thousands looks up its own namespace's, not every claim).
    claims: HashMap<Option<String>, Vec<Claim>>,
    /// Records that could not be read (and were skipped).
    pub malformed: u64,
}

impl Restored {
    /// A restore for `owner`; ownerless records of the streams in `legacy_for` are kept for
    /// adoption.
    pub fn new(owner: Owner, legacy_for: Option<HashSet<String>>) -> Self {
        Self {
            owner,
            streams: HashMap::new(),
            legacy_for,
            legacy: HashMap::new(),
            mark: None,
            writes: None,
            records: 0,
            foreign: 0,
            malformed: 0,
            foreign_live: HashMap::new(),
            claim_list: Vec::new(),
            claim_index: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    /// Another owner's membership record: what it claims while its member lives.
    fn apply_foreign(&mut self, owner: &str, key: &str, value: Option<&[u8]>) {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        let h = h.finish();
        let known = value
            .filter(|v| !v.is_empty())
            .and_then(|v| serde_json::from_slice::<Known>(v).ok());
        let Some(known) = known else {
            self.foreign_live.remove(&h);
            return;
        };
        let Some(topic) = known.topic else { return };
        let claim = Claim {
            owner: owner.to_string(),
            topic,
            namespace: known.namespace,
        };
        let next = self.claim_list.len() as u32;
        let i = *self.claim_index.entry(claim.clone()).or_insert(next);
        if i == next {
            self.claim_list.push(claim);
        }
        self.foreign_live.insert(h, i);
    }

    /// The claims of other owners' live members on objects of `namespace` (`None`:
    /// cluster-scoped objects): the streams of two releases on one key interleave, and one's
    /// inferred DELETED can land after the other's live record.
    pub fn claims_in(&self, namespace: Option<&str>) -> &[Claim] {
        self.claims
            .get(&namespace.map(str::to_string))
            .map_or(&[], Vec::as_slice)
    }

    /// Every claim of other owners' live members.
    pub fn claims(&self) -> impl Iterator<Item = &Claim> {
        self.claims.values().flatten()
    }

    /// Applies one record of the topic, in its partition's order. Call [`Restored::finish`]
    /// once every record is applied.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.records += 1;
        let Some(key) = std::str::from_utf8(key).ok() else {
            self.malformed += 1;
            return;
        };
        if key == END_MARKER {
            return;
        }
        let parts: Vec<&str> = key.split('/').collect();
        let (stream, uid, legacy) = match parts[..] {
            [ns, name, stream, uid] => {
                let owner = self.owner.as_str();
                let mine = owner.len() == ns.len() + 1 + name.len()
                    && owner.starts_with(ns)
                    && owner[ns.len() + 1..] == *name;
                if !mine {
                    self.foreign += 1;
                    if stream != MARK {
                        self.apply_foreign(&format!("{ns}/{name}"), key, value);
                    }
                    return;
                }
                if stream == MARK {
                    let v = value.and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok());
                    match uid {
                        "writes" => self.writes = v.and_then(|v| v["writes"].as_u64()),
                        _ => self.mark = v.and_then(|v| v["id"].as_str().map(str::to_string)),
                    }
                    return;
                }
                (stream, uid, false)
            }
            [stream, uid] => {
                if !self.legacy_for.as_ref().is_some_and(|s| s.contains(stream)) {
                    self.foreign += 1;
                    return;
                }
                (stream, uid, true)
            }
            _ => {
                self.malformed += 1;
                return;
            }
        };
        let sets = if legacy {
            &mut self.legacy
        } else {
            &mut self.streams
        };
        match value.filter(|v| !v.is_empty()) {
            None => {
                if let Some(m) = sets.get_mut(stream) {
                    m.restore_record(uid, None);
                }
            }
            Some(v) => match serde_json::from_slice::<Known>(v) {
                Ok(known) => {
                    sets.entry(stream.to_string())
                        .or_default()
                        .restore_record(uid, Some(&known));
                }
                Err(e) => {
                    self.malformed += 1;
                    tracing::warn!(%stream, %uid, error = %e, "skipping an unreadable membership record");
                }
            },
        }
    }

    /// Ends the restore: the latest record of each key decides.
    pub fn finish(&mut self) {
        for m in self.streams.values_mut().chain(self.legacy.values_mut()) {
            m.finish_restore();
        }
        let live: HashSet<u32> = self.foreign_live.drain().map(|(_, i)| i).collect();
        self.claims.clear();
        for i in live {
            let claim = self.claim_list[i as usize].clone();
            self.claims
                .entry(claim.namespace.clone())
                .or_default()
                .push(claim);
        }
        self.claim_list = Vec::new();
        self.claim_index = HashMap::new();
    }

    /// Sets the members of `stream`.
    pub fn insert(&mut self, stream: &str, members: Members) {
        self.streams.insert(stream.to_string(), members);
    }

    /// The members of `stream`, if it has any.
    pub fn get(&self, stream: &str) -> Option<&Members> {
        self.streams.get(stream)
    }

    /// The members of `stream`, taken once.
    pub fn take(&mut self, stream: &str) -> Members {
        let mut m = self.streams.remove(stream).unwrap_or_default();
        m.finish_restore();
        m
    }

    /// The ownerless members of `stream` an older version wrote, taken once.
    pub fn take_legacy(&mut self, stream: &str) -> Members {
        self.legacy.remove(stream).unwrap_or_default()
    }

    /// Streams with ownerless members to adopt.
    pub fn legacy_streams(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .legacy
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, _)| s.clone())
            .collect();
        v.sort();
        v
    }

    /// Members restored, over every stream.
    pub fn members(&self) -> usize {
        self.streams.values().map(Members::len).sum()
    }

    /// Bytes the restored sets hold on the heap (see [`Members::heap_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        self.streams
            .values()
            .chain(self.legacy.values())
            .map(Members::heap_bytes)
            .sum()
    }

    /// Streams with at least one member.
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, _)| s.as_str())
    }
}

/// Sends `records` and waits until Kafka acknowledged every one of them, or `stopped` says to
/// give up (checked while the producer's queue is full and between reports).
pub async fn send_all(
    producer: &dyn Producer,
    records: impl IntoIterator<Item = Record>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<(), String> {
    let inbox = Inbox::new();
    let mut sent = 0usize;
    for record in records {
        let mut receipt = Receipt::new(inbox.clone(), 0, Sent::Unordered);
        // A full queue: offered again after 5 ms, doubling to 100 ms while it stays full.
        let mut wait = std::time::Duration::from_millis(5);
        loop {
            match producer.send(&record, receipt) {
                Ok(()) => break,
                Err(Refused::Full(back)) => {
                    receipt = back;
                    tokio::select! {
                        _ = stop.cancelled() => return Err("stopped".into()),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(std::time::Duration::from_millis(100));
                }
                Err(e) => return Err(format!("{e:?}")),
            }
        }
        sent += 1;
    }
    let mut ready = std::collections::VecDeque::new();
    for _ in 0..sent {
        let report = tokio::select! {
            _ = stop.cancelled() => return Err("stopped".into()),
            r = inbox.next(&mut ready) => r,
        };
        report.result.map_err(|e| format!("{e:?}"))?;
    }
    Ok(())
}

/// Records written at a time when adopting members: only a batch of them is held.
const ADOPT_BATCH: usize = 1000;

/// Writes `members` as members of `owner`'s `stream` (an older version's ownerless records, or
/// the sets it kept in the checkpoint ConfigMap) and waits until Kafka acknowledged them all,
/// a batch at a time.
pub async fn adopt(
    producer: &dyn Producer,
    topic: &str,
    owner: &Owner,
    stream: &str,
    mut members: impl Iterator<Item = (String, Known)>,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<Members, String> {
    let mut adopted = Members::default();
    loop {
        let mut records = Vec::with_capacity(ADOPT_BATCH);
        for (uid, k) in members.by_ref().take(ADOPT_BATCH) {
            records.push(record(topic, owner, stream, &uid, Some(&k)));
            adopted.insert(&uid, &k);
        }
        if records.is_empty() {
            return Ok(adopted);
        }
        send_all(producer, records, stop)
            .await
            .map_err(|e| format!("adopting {stream}'s members: {e}"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_record_of_each_key_decides() {
        let k = |name: &str| Known {
            name: name.into(),
            namespace: Some("a".into()),
            rv: "1".into(),
            topic: Some("pods".into()),
            key: Some(format!("a/{name}")),
        };
        let me = Owner::new("team-a", "watchrelay");
        let other = Owner::new("team-b", "watchrelay");
        let u1 = "00000000-0000-4000-8000-000000000001";
        let u2 = "00000000-0000-4000-8000-000000000002";
        let mut r = Restored::new(me.clone(), None);
        for rec in [
            record("t", &me, "pods.a", u1, Some(&k("one"))),
            record("t", &me, "pods.a", u2, Some(&k("two"))),
            record("t", &me, "pods.b", u1, Some(&k("one"))),
            record("t", &other, "pods.d", u1, Some(&k("one"))),
            record("t", &other, "pods.e", u2, Some(&k("gone"))),
            record("t", &other, "pods.e", u2, None),
            record("t", &me, "pods.a", u1, None),
            record("t", &me, "pods.c", u2, None),
            mark_record("t", &me, "id-1"),
            writes_record("t", &me, 41),
            writes_record("t", &other, 99),
            writes_record("t", &me, 42),
        ] {
            r.apply(
                rec.key.as_bytes(),
                (!rec.tombstone).then_some(&rec.value[..]),
            );
        }
        r.apply(END_MARKER.as_bytes(), None);
        r.apply(b"no-separator", Some(b"{}"));
        r.apply(b"team-a/watchrelay/pods.a/x", Some(b"not json"));
        r.apply(b"pods.a/legacy", Some(br#"{"name":"old","rv":"1"}"#));
        r.finish();
        assert_eq!((r.records, r.malformed, r.members()), (16, 2, 2));
        assert_eq!(r.writes, Some(42), "the latest of its own copies");
        let claims: Vec<&Claim> = r.claims().collect();
        assert_eq!(
            claims,
            [&Claim {
                owner: "team-b/watchrelay".into(),
                topic: "pods".into(),
                namespace: Some("a".into()),
            }],
            "another owner's live member claims its topic and namespace; one that left, nothing"
        );
        assert_eq!(
            r.foreign, 5,
            "another owner's record and an ownerless one not asked for"
        );
        assert_eq!(r.mark.as_deref(), Some("id-1"));
        let a = r.take("pods.a");
        assert_eq!(a.len(), 1);
        assert_eq!(a.get(u2), Some(k("two")));
        assert!(r.take("pods.a").is_empty(), "taken once");
        assert_eq!(r.streams().collect::<Vec<_>>(), ["pods.b"]);
    }
}

#[cfg(test)]
mod legacy_tests {
    use super::*;

    #[test]
    fn ownerless_records_are_kept_only_for_the_streams_that_may_adopt_them() {
        let me = Owner::new("ns", "cm");
        let mut r = Restored::new(me, Some(HashSet::from(["pods.a".to_string()])));
        let v = br#"{"name":"x","namespace":"a","rv":"3"}"#;
        r.apply(b"pods.a/00000000-0000-4000-8000-000000000001", Some(v));
        r.apply(b"pods.b/00000000-0000-4000-8000-000000000002", Some(v));
        r.finish();
        assert_eq!(r.legacy_streams(), ["pods.a"]);
        assert_eq!(r.take_legacy("pods.a").len(), 1);
        assert_eq!(
            r.members(),
            0,
            "ownerless records are not this owner's until adopted"
        );
        assert_eq!(r.foreign, 1);
    }
}
