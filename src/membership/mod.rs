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
//!    latency, other changes nothing. With a transactional producer (`delivery: exactlyOnce`)
//!    no record waits for its object's join: the join is handed over first and commits in the
//!    same transaction as the records after it, or in an earlier one, and a consumer reading
//!    committed sees neither without the other (a position passed without a record still
//!    waits for the join's commit). A DELETED whose report comes before its join's (they travel on
//!    different partitions) leaves once the join is reported.
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
mod gate;
mod known;
pub(crate) mod ledger;
pub mod log;
mod record;
pub mod regroup;
mod restore;
mod restored;
mod retire;
mod set;

pub use known::{Change, Known};
pub(crate) use ledger::Ledger;
pub use log::{adopt, send_all, Log, SendError, TopicError, TopicState};
pub use record::{
    key, mark_record, position_record, record, writes_record, Owner, END_MARKER, WRITES_SUFFIX,
};
pub use regroup::Regroup;
pub use restore::{verify, Restore};
pub use restored::{Claim, Restored};
pub use retire::{Retire, Tagger};
pub use set::{Key, Members};
