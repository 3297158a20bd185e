//! Pure record assembly: one announcement in, one Kafka record out.
//!
//! The object bytes come from [`crate::decode`] already trimmed; the envelope is written around
//! them by copying, never by re-encoding the object.
//!
//! # What an envelope guarantees
//! - The top level validates against the AsyncAPI `WatchEvent` schema: `type` and `object`.
//! - `watchrelay.id` is deterministic: the same change of the same object always has the same
//!   id (`{uid}/{resourceVersion}`), so consumers can drop the duplicates that at-least-once
//!   delivery allows. A resync re-announcement of an unchanged object repeats the id of the
//!   event that last announced it.
//! - `watchrelay.version` never goes back on a key (see [`version`]): the highest version of a
//!   key is its last word, for consumers that keep the highest rather than the last record.
//! - `watchrelay.synthetic` marks DELETED events that the relay inferred (the object vanished
//!   while the stream could not see it); `watchrelay.resync` marks events produced by a relist.
//! - An event too large for Kafka is replaced by a reference: the same envelope and headers with
//!   the object reduced to its identity and `watchrelay.truncatedBytes` set.
//! - Nothing promises that a consumer sees every intermediate state: Kubernetes itself may
//!   coalesce changes, and after a 410 only the current state is re-announced.

mod announcement;
mod objects;
mod read;
mod route;
mod write;

pub use announcement::{now_rfc3339, Announcement, Id, Stamp};
pub use objects::{bookmark_object, reference_object};
pub use read::announced;
pub(crate) use route::envelope_schema;
pub use route::{document_id, payload_uri, Rendered, Route, SchemaIds, SchemaTag, ShardOwner};
pub use write::{next_era, record, record_of_value, reference, retraction, tombstone, version};

#[cfg(test)]
mod tests;
