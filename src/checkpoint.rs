//! Stream positions in one ConfigMap.
//!
//! Each stream owns one key (`<channel>.<namespace>`, or `<channel>._all` for a cluster-wide
//! stream) holding the resourceVersion of its longest acknowledged prefix and the known-object
//! set at that same position. Writes are debounced, use optimistic concurrency (the ConfigMap's
//! own resourceVersion) and are retried on 409 Conflict after re-reading.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::tracker::{Known, Tracker};

/// ConfigMaps are limited to 1 MiB; leave room for metadata.
const BUDGET: usize = 900 * 1024;

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("checkpoint ConfigMap {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("checkpoint ConfigMap {name} kept changing under us (409 Conflict {attempts} times)")]
    Conflict { name: String, attempts: u32 },
}

/// What one stream persisted.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    pub rv: Option<String>,
    /// Absent when the set did not fit; a resync then cannot infer deletions for that stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<HashMap<String, Known>>,
}

/// State one stream shares with the checkpoint writer and the readiness probe.
#[derive(Debug)]
pub struct StreamShared {
    pub id: String,
    pub tracker: Mutex<Tracker>,
    /// Set by the stream when its checkpoint moved; cleared by the writer.
    pub dirty: AtomicBool,
    /// The stream has synced and its watch is open.
    pub up: AtomicBool,
}

impl StreamShared {
    pub fn new(id: String, saved: Option<Saved>) -> Arc<Self> {
        let (rv, known) = saved
            .map(|s| (s.rv, s.known.unwrap_or_default()))
            .unwrap_or_default();
        Arc::new(Self {
            id,
            tracker: Mutex::new(Tracker::resume(rv, known)),
            dirty: AtomicBool::new(false),
            up: AtomicBool::new(false),
        })
    }

    fn snapshot(&self) -> Saved {
        let t = self.tracker.lock().expect("tracker lock poisoned");
        Saved {
            rv: t.checkpoint().map(str::to_string),
            known: Some(t.known().clone()),
        }
    }
}

/// The set of live streams, shared by the supervisor (which adds and removes) and the writer.
#[derive(Default)]
pub struct Streams {
    pub live: BTreeMap<String, Arc<StreamShared>>,
    /// Keys of streams that stopped for good (their namespace went away); deleted on next write.
    pub removed: Vec<String>,
    /// This replica is waiting for the leader Lease and runs no streams.
    pub standby: bool,
}

pub struct Store {
    api: Api<ConfigMap>,
    name: String,
}

impl Store {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    fn err(&self, source: kube::Error) -> CheckpointError {
        CheckpointError::Api {
            name: self.name.clone(),
            source,
        }
    }

    /// Reads every stream's saved position. A missing ConfigMap is an empty one; an entry that
    /// cannot be parsed is ignored (that stream starts over with a list).
    pub async fn load(&self) -> Result<HashMap<String, Saved>, CheckpointError> {
        let cm = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?;
        let mut out = HashMap::new();
        for (k, v) in cm.and_then(|c| c.data).unwrap_or_default() {
            match serde_json::from_str::<Saved>(&v) {
                Ok(s) => {
                    out.insert(k, s);
                }
                Err(e) => {
                    tracing::warn!(key = %k, error = %e, "ignoring unreadable checkpoint entry")
                }
            }
        }
        Ok(out)
    }

    /// Applies `updates` (None deletes a key) on top of whatever the ConfigMap holds now.
    pub async fn write(
        &self,
        updates: &BTreeMap<String, Option<String>>,
    ) -> Result<(), CheckpointError> {
        const ATTEMPTS: u32 = 5;
        for _ in 0..ATTEMPTS {
            let current = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| self.err(e))?;
            let result = match current {
                None => {
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            ..Default::default()
                        },
                        data: Some(
                            updates
                                .iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                                .collect(),
                        ),
                        ..Default::default()
                    };
                    self.api.create(&PostParams::default(), &cm).await
                }
                Some(mut cm) => {
                    let data = cm.data.get_or_insert_with(Default::default);
                    for (k, v) in updates {
                        match v {
                            Some(v) => data.insert(k.clone(), v.clone()),
                            None => data.remove(k),
                        };
                    }
                    // metadata.resourceVersion is kept: a concurrent writer makes this a 409.
                    self.api
                        .replace(&self.name, &PostParams::default(), &cm)
                        .await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(CheckpointError::Conflict {
            name: self.name.clone(),
            attempts: ATTEMPTS,
        })
    }
}

/// Serializes the dirty streams (or all of them when `all`), fitting the ConfigMap budget by
/// leaving out the largest known sets first. Returns the updates and the ids whose known set was
/// left out.
pub fn collect(
    streams: &Mutex<Streams>,
    all: bool,
) -> (BTreeMap<String, Option<String>>, Vec<String>) {
    let mut s = streams.lock().expect("streams lock poisoned");
    let mut updates: BTreeMap<String, Option<String>> =
        s.removed.drain(..).map(|k| (k, None)).collect();
    let mut snapshots = Vec::new();
    for (id, st) in &s.live {
        if st.dirty.swap(false, Ordering::AcqRel) || all {
            snapshots.push((id.clone(), st.snapshot()));
        }
    }
    drop(s);
    let mut encoded: Vec<(String, String, Saved)> = snapshots
        .into_iter()
        .map(|(id, saved)| {
            (
                id,
                serde_json::to_string(&saved).expect("plain strings serialize"),
                saved,
            )
        })
        .collect();
    let mut total: usize = encoded.iter().map(|(k, v, _)| k.len() + v.len()).sum();
    let mut dropped = Vec::new();
    encoded.sort_by_key(|(_, v, _)| std::cmp::Reverse(v.len()));
    for (id, v, saved) in encoded.iter_mut() {
        if total <= BUDGET {
            break;
        }
        saved.known = None;
        let smaller = serde_json::to_string(saved).expect("plain strings serialize");
        total -= v.len() - smaller.len();
        *v = smaller;
        dropped.push(id.clone());
    }
    updates.extend(encoded.into_iter().map(|(k, v, _)| (k, Some(v))));
    (updates, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::Change;

    #[test]
    fn collects_only_dirty_streams_and_removals() {
        let streams = Mutex::new(Streams::default());
        let a = StreamShared::new("a".into(), None);
        let b = StreamShared::new(
            "b".into(),
            Some(Saved {
                rv: Some("5".into()),
                known: None,
            }),
        );
        {
            let mut t = a.tracker.lock().unwrap();
            let s = t.push(
                Some("9".into()),
                Some(Change::Upsert {
                    uid: "u".into(),
                    known: Known {
                        name: "n".into(),
                        namespace: None,
                        rv: "9".into(),
                    },
                }),
            );
            t.ack(s);
        }
        a.dirty.store(true, Ordering::Release);
        let mut g = streams.lock().unwrap();
        g.live.insert("a".into(), a);
        g.live.insert("b".into(), b);
        g.removed.push("gone".into());
        drop(g);
        let (u, dropped) = collect(&streams, false);
        assert!(dropped.is_empty());
        assert_eq!(u.get("gone"), Some(&None));
        assert!(!u.contains_key("b"));
        let saved: Saved = serde_json::from_str(u["a"].as_ref().unwrap()).unwrap();
        assert_eq!(saved.rv.as_deref(), Some("9"));
        assert_eq!(saved.known.unwrap()["u"].name, "n");
        let (u, _) = collect(&streams, false);
        assert!(u.is_empty(), "nothing changed since the last collect");
        assert_eq!(collect(&streams, true).0.len(), 2);
    }

    #[test]
    fn oversized_known_sets_are_left_out_largest_first() {
        let streams = Mutex::new(Streams::default());
        for (id, n) in [("big", 12_000), ("small", 10)] {
            let st = StreamShared::new(id.into(), None);
            {
                let mut t = st.tracker.lock().unwrap();
                for i in 0..n {
                    let known = Known {
                        name: format!("object-with-a-long-name-{i:08}"),
                        namespace: Some("ns".into()),
                        rv: format!("{i}"),
                    };
                    t.push_done(
                        Some(i.to_string()),
                        Some(Change::Upsert {
                            uid: format!("00000000-0000-0000-0000-{i:012}"),
                            known,
                        }),
                    );
                }
            }
            streams.lock().unwrap().live.insert(id.into(), st);
        }
        let (u, dropped) = collect(&streams, true);
        assert_eq!(dropped, vec!["big".to_string()]);
        let big: Saved = serde_json::from_str(u["big"].as_ref().unwrap()).unwrap();
        assert!(big.known.is_none() && big.rv.is_some());
        let small: Saved = serde_json::from_str(u["small"].as_ref().unwrap()).unwrap();
        assert_eq!(small.known.unwrap().len(), 10);
    }
}
