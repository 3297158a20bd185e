//! Stream positions in one ConfigMap.
//!
//! Each stream owns one key (`<channel>.<namespace>`, or `<channel>._all` for a cluster-wide
//! stream). `data[key]` holds the resourceVersion of its longest acknowledged prefix as JSON
//! (`{"rv":"4711"}`, readable with kubectl); `binaryData[key]` holds the known-object set at that
//! same position as zstd-compressed JSON, about a third of its plain size. One update writes
//! both, so they always describe the same moment; the set also carries its resourceVersion, and
//! one that does not match the position (left by an older version of the relay) is not used.
//! Writes are debounced, use optimistic concurrency (the ConfigMap's own resourceVersion) and are
//! retried on 409 Conflict after re-reading.

//!
//! This module is the format; [`Store`] reads and writes the ConfigMap and [`writer`] is the loop
//! that writes what the streams publish.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use crate::tracker::Known;

mod store;
pub mod writer;

pub use store::Store;

/// An annotation on the checkpoint ConfigMap that asks the running relay to relist and
/// reconcile the streams of a channel (its name) or of every channel (`all`); the relay removes
/// it once it has asked them.
pub const RESYNC_ANNOTATION: &str = "watchrelay.io/resync";

/// ConfigMaps are limited to 1 MiB (`data` and `binaryData` together); leave room for metadata.
pub(crate) const BUDGET: usize = 900 * 1024;

/// zstd level for known-object sets: the default, fast and already compact on identities.
const ZSTD_LEVEL: i32 = 3;

/// Decompressed sets larger than this are refused rather than allocated.
const MAX_KNOWN_BYTES: u64 = 64 << 20;

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("checkpoint ConfigMap {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("checkpoint ConfigMap {name}: the positions alone take {bytes} bytes, over the {budget}-byte budget; use fewer streams per ConfigMap")]
    TooLarge {
        name: String,
        bytes: usize,
        budget: usize,
    },
    #[error("checkpoint write timed out after {0:?}")]
    TimedOut(std::time::Duration),
    #[error("checkpoint ConfigMap {name} kept changing under us (409 Conflict {attempts} times)")]
    Conflict { name: String, attempts: u32 },
}

/// What one stream persisted: its acknowledged position and the objects known there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Saved {
    pub rv: Option<String>,
    /// When Kafka had acknowledged everything up to `rv` (RFC 3339); absent in older entries.
    #[serde(default)]
    pub at: Option<String>,
    /// The fingerprint of the query the position belongs to (path, namespace, selectors): a
    /// position is never resumed under another query. Absent in older entries.
    #[serde(default)]
    pub query: Option<String>,
    /// Absent when the set did not fit; a resync then cannot infer deletions for that stream.
    /// (Inline in `data` in the layout before `binaryData` was used; still read.)
    #[serde(default)]
    pub known: Option<HashMap<String, Known>>,
}

/// The `data` part of a stream's checkpoint.
#[derive(Serialize)]
struct Position<'a> {
    rv: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<&'a str>,
}

/// A known-object set as stored in `binaryData`, with the position it belongs to.
#[derive(Serialize, Deserialize)]
struct KnownAt<K> {
    rv: Option<String>,
    known: K,
}

/// One stream's checkpoint, encoded for the ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// For `data`.
    pub position: String,
    /// For `binaryData`: the compressed known-object set; `None` when the stream's set is
    /// incomplete, and any stored one is removed.
    pub known: Option<Vec<u8>>,
}

impl Update {
    pub fn encode(saved: &Saved) -> Self {
        let known = saved.known.as_ref().map(|known| {
            let json = serde_json::to_vec(&KnownAt {
                rv: saved.rv.clone(),
                known,
            })
            .expect("plain strings serialize");
            zstd::bulk::compress(&json, ZSTD_LEVEL)
                .expect("compressing into a growable buffer cannot fail")
        });
        Self {
            position: serde_json::to_string(&Position {
                rv: saved.rv.as_deref(),
                at: saved.at.as_deref(),
                query: saved.query.as_deref(),
            })
            .expect("plain strings serialize"),
            known,
        }
    }
}

fn decode_known(bytes: &[u8]) -> Result<KnownAt<HashMap<String, Known>>, String> {
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
/// starts over with a list); a known-object set that cannot be read is left out of its entry.
pub fn read(cm: &ConfigMap) -> HashMap<String, Saved> {
    let mut out = HashMap::new();
    for (k, v) in cm.data.iter().flatten() {
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
                // Another position's set: an older relay wrote `data` since. What `data` holds
                // (an inline set, or none) stands.
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(key = %k, error = %e, "ignoring an unreadable known-object set");
                    saved.known = None;
                }
            }
        }
        out.insert(k.clone(), saved);
    }
    out
}

/// Rewrites entries of the older layout (a set inline in `data`) as position and `binaryData`.
/// Only entries that mention a set are parsed: after the first write there are none.
pub(crate) fn migrate_inline(
    data: &mut BTreeMap<String, String>,
    binary: &mut BTreeMap<String, ByteString>,
) {
    for (k, v) in data.iter_mut().filter(|(_, v)| v.contains("\"known\"")) {
        let Ok(saved) = serde_json::from_str::<Saved>(v) else {
            continue;
        };
        let u = Update::encode(&saved);
        *v = u.position;
        if let Some(known) = u.known {
            binary.insert(k.clone(), ByteString(known));
        }
    }
}

/// Leaves out the largest known-object sets, of any stream, until the ConfigMap fits its budget.
/// Returns the keys whose set was left out, or the size when positions alone exceed it.
pub(crate) fn fit(
    data: &BTreeMap<String, String>,
    binary: &mut BTreeMap<String, ByteString>,
) -> Result<Vec<String>, usize> {
    let mut size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        + binary
            .iter()
            .map(|(k, v)| k.len() + v.0.len())
            .sum::<usize>();
    let mut dropped = Vec::new();
    while size > BUDGET {
        let Some((k, len)) = binary
            .iter()
            .map(|(k, v)| (k.clone(), k.len() + v.0.len()))
            .max_by_key(|(_, len)| *len)
        else {
            return Err(size);
        };
        binary.remove(&k);
        size -= len;
        dropped.push(k);
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::{Change, Tracker};

    /// What a stream that announced `objects` objects and completed its list saves.
    fn stream_with(id: &str, objects: usize) -> Saved {
        let mut t = Tracker::default();
        {
            // Random-looking uids, as real ones are: they are what compression cannot shrink.
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ id.len() as u64;
            for i in 0..objects {
                let mut uid = String::new();
                for _ in 0..2 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    uid.push_str(&format!("{x:016x}"));
                }
                t.push_done(
                    Some(i.to_string()),
                    Some(Change::Upsert {
                        uid,
                        known: Known {
                            name: format!("web-{}", x % 100_000),
                            namespace: Some("ns".into()),
                            rv: i.to_string(),
                        },
                    }),
                );
            }
            t.push_done(Some(objects.to_string()), Some(Change::Complete));
        }
        Saved {
            rv: t.checkpoint().map(str::to_string),
            at: None,
            query: None,
            known: t.complete_known().cloned(),
        }
    }

    #[test]
    fn known_sets_are_compressed_and_the_largest_left_out_when_they_do_not_fit() {
        let big = stream_with("big", 20_000);
        let small = stream_with("small", 10);
        let (big_u, small_u) = (Update::encode(&big), Update::encode(&small));
        let plain = serde_json::to_vec(big.known.as_ref().unwrap())
            .unwrap()
            .len();
        let packed = big_u.known.clone().unwrap();
        assert!(
            packed.len() * 2 < plain,
            "compressed {} of {plain} bytes",
            packed.len()
        );
        let mut data = BTreeMap::new();
        let mut binary = BTreeMap::new();
        for (k, u) in [("big", &big_u), ("small", &small_u), ("big2", &big_u)] {
            data.insert(k.to_string(), u.position.clone());
            binary.insert(k.to_string(), ByteString(u.known.clone().unwrap()));
        }
        // Two copies of the big set cannot fit; the largest goes first, positions stay.
        let dropped = fit(&data, &mut binary).unwrap();
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert!(dropped[0].starts_with("big"));
        let saved = read(&ConfigMap {
            data: Some(data),
            binary_data: Some(binary),
            ..Default::default()
        });
        assert_eq!(saved.len(), 3);
        assert!(saved[&dropped[0]].known.is_none() && saved[&dropped[0]].rv.is_some());
        assert_eq!(saved["small"].known.as_ref().unwrap().len(), 10);
    }

    #[test]
    fn an_incomplete_set_is_not_persisted_and_a_mismatched_one_not_used() {
        // Resumed from a checkpoint whose set had been left out: only what it saw since.
        let st = Saved {
            rv: Some("5".into()),
            at: None,
            query: None,
            known: None,
        };
        let u = Update::encode(&st);
        assert_eq!(u.known, None);
        let data = BTreeMap::from([("s".to_string(), u.position)]);
        let mut binary = BTreeMap::from([(
            "s".to_string(),
            ByteString(Update::encode(&stream_with("other", 3)).known.unwrap()),
        )]);
        assert_eq!(fit(&data, &mut binary), Ok(vec![]));
        // The stored set belongs to rv 3, the position is rv 5: it is not used.
        let saved = read(&ConfigMap {
            data: Some(data),
            binary_data: Some(binary),
            ..Default::default()
        });
        assert_eq!(saved["s"].rv.as_deref(), Some("5"));
        assert!(saved["s"].known.is_none());
        assert_eq!(
            fit(
                &BTreeMap::from([("p".repeat(BUDGET + 1), String::new())]),
                &mut BTreeMap::new()
            ),
            Err(BUDGET + 1)
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
    fn reads_the_older_inline_layout() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                "s".to_string(),
                r#"{"rv":"7","known":{"u":{"name":"n","rv":"7"}}}"#.to_string(),
            )])),
            ..Default::default()
        };
        let saved = read(&cm);
        assert_eq!(saved["s"].rv.as_deref(), Some("7"));
        assert_eq!(saved["s"].known.as_ref().unwrap()["u"].name, "n");
        // The next write moves it to the new layout.
        let (mut data, mut binary) = (cm.data.unwrap(), BTreeMap::new());
        migrate_inline(&mut data, &mut binary);
        assert_eq!(data["s"], r#"{"rv":"7"}"#);
        let saved = read(&ConfigMap {
            data: Some(data),
            binary_data: Some(binary),
            ..Default::default()
        });
        assert_eq!(saved["s"].known.as_ref().unwrap()["u"].rv, "7");
    }
}
