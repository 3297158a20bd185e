//! Reading and writing the checkpoint ConfigMap.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use super::{
    encode, read, read_mark, read_writes, size, CheckpointError, Loaded, Saved, BUDGET,
    EPOCH_ANNOTATION, MIGRATED_KEY, OWNER_ANNOTATION, RESYNC_ANNOTATION, SHARDING_ANNOTATION,
    SHARD_OWNERS_ANNOTATION, SPLITS_KEY, SPLITTING_KEY, WRITES_KEY,
};

/// Who writes a shard's ConfigMap: the replica, and its owner epoch of the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// The replica's identity, shown on the ConfigMap.
    pub replica: String,
    /// The owner epoch: it grows with each claim of the shard.
    pub epoch: u64,
}

/// The checkpoint ConfigMap of one relay, read and written through the API server.
pub struct Store {
    api: Api<ConfigMap>,
    name: String,
    /// The write counter as this store last read or wrote it (see [`WRITES_KEY`]).
    writes: AtomicU64,
    /// The highest era floor this store read, was told of or wrote: every write stamps at
    /// least this, so a ConfigMap a restore rewound gets its floor back with the next write.
    era_floor: AtomicU64,
    /// A shard's owner: writes stamp its epoch and fail once a higher one is found.
    ownership: Option<Ownership>,
}

/// The owner epoch stamped on `cm` (0: none, or not a number).
fn stamped(cm: &ConfigMap) -> u64 {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EPOCH_ANNOTATION))
        .and_then(|e| e.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The epoch a new owner stamps: the group's `claimed`, or one above the epoch `found` on the
/// ConfigMap when that is not below it. `None` past the largest epoch (an annotation edited to
/// it): nothing can depose that owner.
fn stamped_epoch(claimed: u64, found: u64) -> Option<u64> {
    if claimed > found {
        Some(claimed)
    } else {
        found.checked_add(1)
    }
}

/// Drops the position of every stream entry in `data`, keeping the rest of each entry (its
/// query, route and kind).
fn forget_positions(data: &mut BTreeMap<String, String>) {
    for (_, value) in data.iter_mut().filter(|(k, _)| !k.starts_with('.')) {
        match serde_json::from_str::<Saved>(value) {
            // Marked, so that a start takes the forgotten entry over any position committed
            // with the stream's records (exactly once), which is of the history before the
            // restore too, and raises its era above that one's (see `Saved::take_committed`).
            // The era from the clock is for a relay of an earlier version, side by side in a
            // rollout: it reads no mark, and keeps the entry only when its era is the later.
            Ok(saved) if saved.rv.is_some() => {
                let era = saved.era.saturating_add(1).max(clock_era());
                *value = encode(&Saved {
                    rv: None,
                    era,
                    rewound: true,
                    ..saved
                });
            }
            Ok(_) => {}
            // Unreadable: read as no position anyway (see `read`); dropped to be sure.
            Err(_) => *value = encode(&Saved::default()),
        }
    }
}

/// The clock as an era counts it: milliseconds since the Unix epoch.
fn clock_era() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Bytes of ConfigMap written.
    pub bytes: usize,
    /// The write counter it wrote.
    pub writes: u64,
    /// The ConfigMap held a lower counter than this store last read or wrote: it went back in
    /// time (an etcd restore, or someone deleted it). The write then dropped every stream's
    /// position: none, restored or from before the restore, is a position in the cluster's
    /// history now.
    pub rewound: bool,
    /// The resync request taken off the ConfigMap in the same write
    /// ([`Store::write_taking_request`] only).
    pub request: Option<String>,
    /// The era floor it stamped (see [`crate::checkpoint::ERA_FLOOR_ANNOTATION`]).
    pub era_floor: u64,
}

impl Store {
    /// The store of ConfigMap `name` in `namespace`; nothing is read until [`Store::load`].
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            writes: AtomicU64::new(0),
            era_floor: AtomicU64::new(0),
            ownership: None,
        }
    }

    /// The store of a shard's ConfigMap, written as `ownership` says: optimistic concurrency
    /// and the epoch make a deposed owner's write fail.
    pub fn owned(mut self, ownership: Ownership) -> Self {
        self.ownership = Some(ownership);
        self
    }

    /// Whether this is a shard's ConfigMap, written under an owner epoch.
    pub fn is_owned(&self) -> bool {
        self.ownership.is_some()
    }

    /// The write counter as this store last read or wrote it.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn err(&self, source: kube::Error) -> CheckpointError {
        CheckpointError::Api {
            name: self.name.clone(),
            source,
        }
    }

    /// Reads every stream's saved position and the membership mark. A missing ConfigMap is an
    /// empty one.
    pub async fn load(&self) -> Result<Loaded, CheckpointError> {
        let cm = self.current().await?;
        let loaded = cm
            .as_ref()
            .map(|cm| {
                let streams = read(cm);
                let era_floor = streams
                    .values()
                    .map(|s| s.era)
                    .fold(super::stamped_era_floor(cm), u64::max);
                Loaded {
                    streams,
                    mark: read_mark(cm),
                    writes: read_writes(cm),
                    migrated: cm.data.as_ref().and_then(|d| d.get(MIGRATED_KEY)).cloned(),
                    splitting: cm.data.as_ref().and_then(|d| d.get(SPLITTING_KEY)).cloned(),
                    splits: cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get(SPLITS_KEY))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                    era_floor,
                }
            })
            .unwrap_or_default();
        self.writes.store(loaded.writes, Ordering::Relaxed);
        self.era_floor
            .fetch_max(loaded.era_floor, Ordering::Relaxed);
        Ok(loaded)
    }

    /// Raises the era floor every write stamps to at least `floor` (one copied where a restore
    /// does not reach, see [`Written::era_floor`]).
    pub fn raise_era_floor(&self, floor: u64) {
        self.era_floor.fetch_max(floor, Ordering::Relaxed);
    }

    /// Reads the ConfigMap, lets `change` edit it, and replaces it with a compare-and-swap,
    /// from the read again after a 409, until it lands. `change` returning `None` leaves the
    /// ConfigMap as it is; so does a missing ConfigMap.
    async fn swap<T>(
        &self,
        mut change: impl FnMut(&mut ConfigMap) -> Option<T>,
    ) -> Result<Option<T>, CheckpointError> {
        loop {
            let Some(mut cm) = self.current().await? else {
                return Ok(None);
            };
            let Some(out) = change(&mut cm) else {
                return Ok(None);
            };
            match self
                .api
                .replace(&self.name, &PostParams::default(), &cm)
                .await
            {
                Ok(_) => return Ok(Some(out)),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// The pending resync request of a ConfigMap (the [`RESYNC_ANNOTATION`]), removed from it.
    fn remove_request(cm: &mut ConfigMap) -> Option<String> {
        cm.metadata
            .annotations
            .as_mut()
            .and_then(|a| a.remove(RESYNC_ANNOTATION))
    }

    /// A pending resync request (the [`RESYNC_ANNOTATION`] on the ConfigMap), taken: the
    /// annotation is removed with a compare-and-swap, so a request is taken once. A shard's
    /// deposed owner takes none: the request is left for the owner that stamped the ConfigMap.
    pub async fn take_resync_request(&self) -> Result<Option<String>, CheckpointError> {
        let own = self.ownership.as_ref().map(|o| o.epoch);
        self.swap(|cm| {
            if own.is_some_and(|own| stamped(cm) > own) {
                return None;
            }
            Self::remove_request(cm)
        })
        .await
    }

    /// Creates the ConfigMap, empty, unless it exists: so that requests can be set on it.
    pub async fn create_if_missing(&self) -> Result<(), CheckpointError> {
        match self.put(&self.blank(), false).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Records in the [`SHARD_OWNERS_ANNOTATION`] that `owner` claimed `shards` (creating the
    /// ConfigMap if missing).
    pub async fn record_shard_owner(
        &self,
        shards: &[u32],
        owner: &str,
    ) -> Result<(), CheckpointError> {
        self.create_if_missing().await?;
        self.swap(|cm| {
            let annotations = cm.metadata.annotations.get_or_insert_with(Default::default);
            let mut owners: BTreeMap<u32, String> = annotations
                .get(SHARD_OWNERS_ANNOTATION)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default();
            for shard in shards {
                owners.insert(*shard, owner.to_string());
            }
            let summary = serde_json::to_string(&owners).expect("a map serializes");
            annotations.insert(SHARD_OWNERS_ANNOTATION.into(), summary);
            Some(())
        })
        .await
        .map(drop)
    }

    /// The release's sharding as its first sharded replica recorded it, if one did; writes
    /// nothing (see [`Store::sharding_mark`]).
    pub async fn recorded_sharding_mark(&self) -> Result<Option<String>, CheckpointError> {
        Ok(self
            .current()
            .await?
            .and_then(|cm| cm.metadata.annotations?.remove(SHARDING_ANNOTATION)))
    }

    /// The release's sharding as its first sharded replica recorded it ([`SHARDING_ANNOTATION`]),
    /// or `mark` recorded now when none was (creating the ConfigMap if missing): what every
    /// replica of the release must be configured with.
    pub async fn sharding_mark(&self, mark: &str) -> Result<String, CheckpointError> {
        self.create_if_missing().await?;
        loop {
            let recorded = self
                .swap(|cm| {
                    let annotations = cm.metadata.annotations.get_or_insert_with(Default::default);
                    if annotations.contains_key(SHARDING_ANNOTATION) {
                        return None;
                    }
                    annotations.insert(SHARDING_ANNOTATION.into(), mark.to_string());
                    Some(())
                })
                .await?;
            if recorded.is_some() {
                return Ok(mark.to_string());
            }
            let cm = self.current().await?;
            let found = cm.and_then(|cm| cm.metadata.annotations?.remove(SHARDING_ANNOTATION));
            if let Some(found) = found {
                return Ok(found);
            }
        }
    }

    /// Passes a pending resync request on to the ConfigMaps `to` (a sharded release's shards,
    /// whose owners take it there), then removes it here: with a compare-and-swap, so a request
    /// set meanwhile is passed on too, never dropped. A crash in between passes it on twice, a
    /// second resync at worst. Returns the request passed on, if any.
    pub async fn pass_on_resync_request(
        &self,
        to: &[Store],
    ) -> Result<Option<String>, CheckpointError> {
        loop {
            let Some(mut cm) = self.current().await? else {
                return Ok(None);
            };
            let Some(what) = Self::remove_request(&mut cm) else {
                return Ok(None);
            };
            for store in to {
                store.set_resync_request(&what).await?;
            }
            match self
                .api
                .replace(&self.name, &PostParams::default(), &cm)
                .await
            {
                Ok(_) => return Ok(Some(what)),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// [`Store::request_resync`] with the verbs the relay holds on its ConfigMaps (get and
    /// update, not patch). A ConfigMap not there yet is left alone: it belongs to a shard never
    /// owned, whose first owner lists anyway.
    async fn set_resync_request(&self, what: &str) -> Result<(), CheckpointError> {
        self.swap(|cm| {
            cm.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(RESYNC_ANNOTATION.into(), what.into());
            Some(())
        })
        .await
        .map(drop)
    }

    /// Asks the running relay to resync `what` (a channel name, or `all`).
    pub async fn request_resync(&self, what: &str) -> Result<(), CheckpointError> {
        let patch = serde_json::json!({"metadata": {"annotations": {RESYNC_ANNOTATION: what}}});
        self.api
            .patch(
                &self.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(drop)
            .map_err(|e| self.err(e))
    }

    /// The ConfigMap as the API server has it now, if it exists.
    async fn current(&self) -> Result<Option<ConfigMap>, CheckpointError> {
        self.api.get_opt(&self.name).await.map_err(|e| self.err(e))
    }

    /// An empty ConfigMap of this store's name.
    fn blank(&self) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Replaces the ConfigMap with `cm` (`exists`; its resourceVersion makes a concurrent
    /// writer's change a 409), or creates it.
    async fn put(&self, cm: &ConfigMap, exists: bool) -> Result<ConfigMap, kube::Error> {
        if exists {
            self.api
                .replace(&self.name, &PostParams::default(), cm)
                .await
        } else {
            self.api.create(&PostParams::default(), cm).await
        }
    }

    /// Stamps a new owner epoch of the shard on its ConfigMap (creating it if missing), with a
    /// compare-and-swap: the one the group gave (`claimed`) unless the ConfigMap already holds
    /// that or a higher one, then one above it. The ConfigMap is the authority on epochs, the
    /// group only proves ownership: when the group's committed offsets are gone (offsets
    /// retention past an empty group, the group deleted, a new Kafka cluster) its epochs start
    /// again at 1, and an epoch raised by hand on the ConfigMap is gone past too, so epochs
    /// never go backwards and the new owner deposes every earlier one. The epoch stamped.
    pub async fn claim_epoch(&self, replica: &str, claimed: u64) -> Result<u64, CheckpointError> {
        loop {
            let current = self.current().await?;
            let exists = current.is_some();
            let mut cm = current.unwrap_or_else(|| self.blank());
            let found = stamped(&cm);
            let annotations = cm.metadata.annotations.get_or_insert_with(Default::default);
            let epoch = stamped_epoch(claimed, found).ok_or_else(|| CheckpointError::Deposed {
                name: self.name.clone(),
                found,
                ours: claimed,
            })?;
            annotations.insert(EPOCH_ANNOTATION.into(), epoch.to_string());
            annotations.insert(OWNER_ANNOTATION.into(), replica.to_string());
            let result = self.put(&cm, exists).await;
            match result {
                Ok(_) => return Ok(epoch),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// Applies `updates` (None deletes a stream's entry) on top of whatever the ConfigMap holds
    /// now, raises its write counter, and removes the known-object sets older versions kept.
    /// A ConfigMap found behind this store's counter went back in time: every stream's position
    /// is dropped in the same write (see [`Written::rewound`]).
    pub async fn write(
        &self,
        updates: &BTreeMap<String, Option<String>>,
    ) -> Result<Written, CheckpointError> {
        self.write_with(updates, false).await
    }

    /// [`Store::write`], taking a pending resync request off the ConfigMap in the same
    /// compare-and-swap (as [`Store::take_resync_request`] would, with a read of its own).
    pub async fn write_taking_request(
        &self,
        updates: &BTreeMap<String, Option<String>>,
    ) -> Result<Written, CheckpointError> {
        self.write_with(updates, true).await
    }

    async fn write_with(
        &self,
        updates: &BTreeMap<String, Option<String>>,
        take_request: bool,
    ) -> Result<Written, CheckpointError> {
        const ATTEMPTS: u32 = 5;
        for _ in 0..ATTEMPTS {
            let current = self.current().await?;
            let exists = current.is_some();
            let found = current.as_ref().map_or(0, read_writes);
            let expected = self.writes();
            let writes = found.max(expected) + 1;
            // metadata.resourceVersion is kept: a concurrent writer makes the replace a 409.
            let mut cm = current.unwrap_or_else(|| self.blank());
            if let Some(own) = &self.ownership {
                let found = stamped(&cm);
                let annotations = cm.metadata.annotations.get_or_insert_with(Default::default);
                // An equal epoch stamped by another replica is another owner's too.
                let other = annotations
                    .get(OWNER_ANNOTATION)
                    .is_some_and(|o| *o != own.replica);
                if found > own.epoch || found == own.epoch && other {
                    return Err(CheckpointError::Deposed {
                        name: self.name.clone(),
                        found,
                        ours: own.epoch,
                    });
                }
                annotations.insert(EPOCH_ANNOTATION.into(), own.epoch.to_string());
                annotations.insert(OWNER_ANNOTATION.into(), own.replica.clone());
            }
            let request = if take_request {
                Self::remove_request(&mut cm)
            } else {
                None
            };
            // The era floor outlives the entries that raised it (a stream removed, retired):
            // the stamped one raised by what this write brings (entries the annotation
            // predates were folded in when the term loaded them), and never below what this
            // store saw (a restore rewinds the annotation too).
            let floor = updates
                .values()
                .flatten()
                .map(|entry| super::era_of(entry))
                .fold(super::stamped_era_floor(&cm), u64::max)
                .max(self.era_floor.load(Ordering::Relaxed));
            if floor > 0 {
                cm.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(super::ERA_FLOOR_ANNOTATION.into(), floor.to_string());
            }
            let data = cm.data.get_or_insert_with(Default::default);
            for (k, u) in updates {
                match u {
                    Some(position) => data.insert(k.clone(), position.clone()),
                    None => data.remove(k),
                };
            }
            if found < expected {
                forget_positions(data);
            }
            data.insert(WRITES_KEY.to_string(), writes.to_string());
            let bytes = size(data);
            if bytes > BUDGET {
                return Err(CheckpointError::TooLarge {
                    name: self.name.clone(),
                    bytes,
                    budget: BUDGET,
                });
            }
            cm.binary_data = None;
            let result = self.put(&cm, exists).await;
            match result {
                Ok(_) => {
                    self.writes.store(writes, Ordering::Relaxed);
                    self.era_floor.fetch_max(floor, Ordering::Relaxed);
                    return Ok(Written {
                        bytes: serde_json::to_vec(&cm).map_or(0, |v| v.len()),
                        writes,
                        rewound: found < expected,
                        request,
                        era_floor: floor,
                    });
                }
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

#[cfg(test)]
mod tests {
    use super::stamped_epoch;

    #[test]
    fn positions_forgotten_for_a_rewind_outrank_the_committed_ones() {
        use super::{encode, forget_positions, Saved};
        let saved = Saved {
            rv: Some("24".into()),
            era: 7,
            ..Saved::default()
        };
        let mut data = std::collections::BTreeMap::from([("s".to_string(), encode(&saved))]);
        forget_positions(&mut data);
        let entry: Saved = serde_json::from_str(&data["s"]).unwrap();
        assert_eq!(entry.rv, None);
        // An exactly-once start reads the position committed in Kafka, of the history before
        // the restore, here in an era the stream took after the snapshot (above the restored
        // entry's), or one a replica whose clock is a minute ahead took: the forgotten entry
        // wins, and the stream relists in an era above both.
        let ahead = super::clock_era() + 60_000;
        for era in [8, ahead] {
            let mut entry = entry.clone();
            let committed = Saved {
                era,
                ..saved.clone()
            };
            entry.take_committed(committed);
            assert_eq!(entry.rv, None);
            assert!(entry.era > era);
        }
        // The stream's next write drops the mark.
        let written: Saved = serde_json::from_str(&encode(&Saved {
            rv: Some("30".into()),
            era: entry.era,
            ..Saved::default()
        }))
        .unwrap();
        assert!(!written.rewound);
    }

    #[test]
    fn a_new_owner_epoch_is_above_every_one_stamped() {
        // (claimed by the group, found on the ConfigMap, stamped)
        let table = [
            (5, 4, Some(5)),     // the group's epochs run ahead: taken as they are
            (1, 9, Some(10)),    // the group's offsets were lost: above the stamp
            (9, 9, Some(10)),    // a replayed claim: above the one who stamped it
            (3, 0, Some(3)),     // a ConfigMap never stamped
            (2, u64::MAX, None), // edited to the largest epoch: refused
        ];
        for (claimed, found, want) in table {
            assert_eq!(
                stamped_epoch(claimed, found),
                want,
                "claimed {claimed}, found {found}"
            );
        }
    }
}
