//! Known-object membership: which objects each stream has announced, kept in a compacted Kafka
//! topic used as a changelog (as Kafka Connect keeps source offsets).
//!
//! A stream needs its known objects to infer deletions it could not see: after a 410, a
//! relist's state lacks them, and each gets an inferred DELETED. The set lives in memory as
//! [`Members`] and in the membership topic as one record per (stream, uid): the key is
//! `<stream>/<uid>`, the value the identity an inferred DELETED needs (`{"name", "namespace",
//! "rv"}`, the resourceVersion at which the object joined) and a null value (a tombstone) once
//! the object is gone. At the start of each term the relay reads the topic from the beginning to
//! its end offsets and rebuilds every stream's set; compaction only bounds how much there is to
//! read, the latest record of each key decides.
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

mod set;

use std::collections::HashMap;

pub use set::Members;

use crate::decode::ObjectMeta;
use crate::envelope::{Announcement, Record};
use crate::event::EventType;
use crate::producer::{Producer, Receipt, Refused};
pub use crate::tracker::Known;

/// The key of the record marking where a reading of the topic ends: a tombstone, which
/// [`Restored::apply`] takes for the removal of a member no stream has.
pub const END_MARKER: &str = "~/end";

/// The membership key of `uid` on `stream`.
pub fn key(stream: &str, uid: &str) -> String {
    format!("{stream}/{uid}")
}

/// The record that makes `uid` a member of `stream` (`Some`) or no longer one (`None`).
pub fn record(topic: &str, stream: &str, uid: &str, known: Option<&Known>) -> Record {
    Record {
        topic: topic.to_string(),
        key: key(stream, uid),
        value: known
            .map(|k| serde_json::to_vec(k).expect("plain strings serialize"))
            .unwrap_or_default(),
        headers: Vec::new(),
        tombstone: known.is_none(),
    }
}

/// Every stream's members, rebuilt from the membership topic.
#[derive(Debug, Default)]
pub struct Restored {
    streams: HashMap<String, Members>,
    /// Records read.
    pub records: u64,
    /// Records that could not be read (and were skipped).
    pub malformed: u64,
}

impl Restored {
    /// Applies one record of the topic, in its partition's order. Call [`Restored::finish`]
    /// once every record is applied.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.records += 1;
        let Some((stream, uid)) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.rsplit_once('/'))
        else {
            self.malformed += 1;
            return;
        };
        match value.filter(|v| !v.is_empty()) {
            None => {
                if let Some(m) = self.streams.get_mut(stream) {
                    m.restore_record(uid, None);
                }
            }
            Some(v) => match serde_json::from_slice::<Known>(v) {
                Ok(known) => self
                    .streams
                    .entry(stream.to_string())
                    .or_default()
                    .restore_record(uid, Some(&known)),
                Err(e) => {
                    self.malformed += 1;
                    tracing::warn!(%stream, %uid, error = %e, "skipping an unreadable membership record");
                }
            },
        }
    }

    /// Ends the restore: the latest record of each key decides.
    pub fn finish(&mut self) {
        for m in self.streams.values_mut() {
            m.finish_restore();
        }
    }

    /// Sets the members of `stream`.
    pub fn insert(&mut self, stream: &str, members: Members) {
        self.streams.insert(stream.to_string(), members);
    }

    /// The members of `stream`, taken once.
    pub fn take(&mut self, stream: &str) -> Members {
        let mut m = self.streams.remove(stream).unwrap_or_default();
        m.finish_restore();
        m
    }

    /// Members restored, over every stream.
    pub fn members(&self) -> usize {
        self.streams.values().map(Members::len).sum()
    }

    /// Streams with at least one member.
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, _)| s.as_str())
    }
}

/// Writes the known objects an older version kept in the checkpoint ConfigMap as members of
/// `stream`, and waits until Kafka acknowledged them all: only then may the ConfigMap's copy
/// go. Returns the members.
pub async fn adopt(
    producer: &dyn Producer,
    topic: &str,
    stream: &str,
    known: &HashMap<String, Known>,
) -> Result<Members, String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut members = Members::default();
    for (uid, k) in known {
        let record = record(topic, stream, uid, Some(k));
        let meta = ObjectMeta {
            uid: uid.clone(),
            ..ObjectMeta::default()
        };
        let mut receipt = Box::new(Receipt::new(
            tx.clone(),
            0,
            std::time::Instant::now(),
            0,
            Announcement::change(EventType::Added, meta, false),
        ));
        receipt.membership = true;
        loop {
            match producer.send(&record, receipt) {
                Ok(()) => break,
                Err(Refused::Full(back)) => {
                    receipt = back;
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Err(e) => return Err(format!("adopting {stream}'s known objects: {e:?}")),
            }
        }
        members.insert(uid, k);
    }
    drop(tx);
    while let Some(report) = rx.recv().await {
        if let Err(e) = report.result {
            return Err(format!("adopting {stream}'s known objects: {e:?}"));
        }
    }
    Ok(members)
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
        };
        let u1 = "00000000-0000-4000-8000-000000000001";
        let u2 = "00000000-0000-4000-8000-000000000002";
        let mut r = Restored::default();
        for rec in [
            record("t", "pods.a", u1, Some(&k("one"))),
            record("t", "pods.a", u2, Some(&k("two"))),
            record("t", "pods.b", u1, Some(&k("one"))),
            record("t", "pods.a", u1, None),
            record("t", "pods.c", u2, None),
        ] {
            r.apply(
                rec.key.as_bytes(),
                (!rec.tombstone).then_some(&rec.value[..]),
            );
        }
        r.apply(END_MARKER.as_bytes(), None);
        r.apply(b"no-separator", Some(b"{}"));
        r.apply(b"pods.a/x", Some(b"not json"));
        r.finish();
        assert_eq!((r.records, r.malformed, r.members()), (8, 2, 2));
        let a = r.take("pods.a");
        assert_eq!(a.len(), 1);
        assert_eq!(a.get(u2), Some(k("two")));
        assert!(r.take("pods.a").is_empty(), "taken once");
        assert_eq!(r.streams().collect::<Vec<_>>(), ["pods.b"]);
    }
}
