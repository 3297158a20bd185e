//! The membership topic's record format: keys `<owner>/<stream>/<uid>`, the owner's marks.

use super::Known;
use crate::producer::Record;

/// The key of the record marking where a reading of the topic ends: a tombstone, which
/// [`Restored::apply`](super::Restored::apply) skips.
pub const END_MARKER: &str = "~/end";

/// The stream name of an owner's topic mark: `<owner>/~/topic`.
pub(super) const MARK: &str = "~";

/// Who owns persisted state: the checkpoint ConfigMap, as `<namespace>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner(String);

impl Owner {
    /// The owner of the checkpoint ConfigMap `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(format!("{namespace}/{name}"))
    }

    /// `<namespace>/<name>`, the first part of each of its membership keys.
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
        partition: None,
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
        partition: None,
    }
}

/// How the key of an owner's [`writes_record`] ends.
pub const WRITES_SUFFIX: &str = "/~/writes";

/// The record that copies the checkpoint ConfigMap's write counter (see
/// [`crate::checkpoint::WRITES_KEY`]) and its era floor (see
/// [`crate::checkpoint::ERA_FLOOR_ANNOTATION`]) into the topic, after each write: a restore of
/// the cluster rewinds the ConfigMap but not this copy.
pub fn writes_record(topic: &str, owner: &Owner, writes: u64, era_floor: u64) -> Record {
    Record {
        topic: topic.to_string(),
        key: format!("{owner}{WRITES_SUFFIX}"),
        value: serde_json::to_vec(&serde_json::json!({ "writes": writes, "era": era_floor }))
            .expect("numbers serialize"),
        headers: Default::default(),
        tombstone: false,
        partition: None,
    }
}

/// How the last part of a position record's key begins: `<owner>/~/pos:<stream>`.
pub(super) const POSITION_PREFIX: &str = "pos:";

/// The record that makes `saved` the position of `owner`'s `stream` in the topic, with
/// exactly-once delivery: committed in the transaction of the records before it, it is what a
/// restart resumes from (see [`super::Restored::positions`]); a tombstone once the position is
/// the ConfigMap's again.
pub fn position_record(
    topic: &str,
    owner: &Owner,
    stream: &str,
    saved: Option<&crate::checkpoint::Saved>,
) -> Record {
    Record {
        topic: topic.to_string(),
        key: format!("{owner}/{MARK}/{POSITION_PREFIX}{stream}"),
        value: saved
            .map(|s| crate::checkpoint::encode(s).into_bytes())
            .unwrap_or_default(),
        headers: Default::default(),
        tombstone: saved.is_none(),
        partition: None,
    }
}
