//! Moving a single-leader release to sharding: each shard's first owner copies its share of the
//! release's state, once.
//!
//! The single leader kept every position in the checkpoint ConfigMap and every member in the
//! membership topic under its own owner. Before any shard runs, the leader Lease is parked (see
//! [`crate::leader::Elector::park`]): the last single leader has stopped, and no replica of an
//! older version can lead again, so that state no longer moves. A shard's first owner then copies
//! the members of its streams into its partition, under its own owner, waits for Kafka, and only
//! then writes its streams' positions into its ConfigMap with [`MIGRATED_KEY`], in one write.
//! A stream that went over every namespace and is now relayed per namespace is split by its
//! members' namespaces, each part copied by its namespace's shard, with the stream's position:
//! no shard ever retracts what another announces. A stream over one collection, now fanned out
//! to the shards, is split the same way by its members' shards, each part under the shard's
//! part of the stream.
//! A crash midway repeats the copy: at worst a member too many, which costs a superfluous
//! inferred DELETED, as with any adoption. A shard whose ConfigMap has the key is never copied
//! again: the old state is read when a replica claims shards not copied yet, once for all the
//! shards it copies at the same time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::shapes;
use crate::checkpoint::{encode, CheckpointError, Saved, Store, MIGRATED_KEY};
use crate::config::{Config, Shape, StreamId};
use crate::membership::{self, Known, Log, Owner, Restored, SendError, TopicError};
use crate::producer::{self, Connect, Producer, TxnError};

/// Why copying a shard's share of the single-leader state failed (it is tried again).
#[derive(Debug, thiserror::Error)]
pub(super) enum MigrateError {
    /// A checkpoint ConfigMap could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The single leader's membership topic could not be read.
    #[error("reading the single leader's membership topic: {0}")]
    Topic(#[from] TopicError),
    /// The copied members did not all reach the shard's partition.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The leader Lease, which says when the single leader was parked, could not be read.
    #[error("reading the leader Lease: {0}")]
    Lease(kube::Error),
    /// The single leader's transactional id could not be fenced.
    #[error("fencing the single leader's transactional producer: {}", .0.message)]
    Fence(TxnError),
    /// Reading the topic panicked.
    #[error("reading the single leader's membership topic panicked: {0}")]
    Panicked(String),
}

/// The single-leader release's state, as its last leader left it.
pub(super) struct Legacy {
    positions: HashMap<String, Saved>,
    members: Restored,
    /// What it was read from, for the marker.
    from: String,
}

/// The legacy state, read on first need and shared by the shards migrating at the same time:
/// it is dropped once none is (a shard claimed later reads it again), so a replica does not
/// hold a single leader's whole membership for its lifetime.
pub(super) type LegacyCell = Arc<Mutex<Weak<Legacy>>>;

/// How a stream over one collection is shared out (see [`Migration::split`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Split {
    PerNamespace,
    ByShard,
}

/// Where one shard's share goes.
pub(super) struct Target<'a> {
    pub shard: u32,
    pub producer: &'a Arc<dyn Producer>,
    pub store: &'a Store,
    pub owner: &'a Owner,
    pub topic: &'a str,
}

/// The copy of single-leader state into shards, for a release's configuration and cluster.
pub(super) struct Migration<'a> {
    pub cfg: &'a Config,
    pub client: &'a kube::Client,
    /// With exactly-once delivery, what connects the single leader's transactional id: it is
    /// fenced before its state is read (see [`Migration::read_legacy`]).
    pub leader: Option<Arc<dyn Connect>>,
}

impl Migration<'_> {
    /// How the single leader's stream `id` over one collection is shared out: per namespace
    /// (an `allNamespaces` channel, or a selector that was watched cluster-wide, now relayed
    /// per namespace), or by shard (now fanned out); `None` for a stream kept as it is.
    fn split<'a>(&self, id: &'a str) -> Option<(&'a str, Split)> {
        let (name, None) = StreamId::parts(id)? else {
            return None;
        };
        let channel = self.cfg.channels.iter().find(|c| c.name == name)?;
        let shape = shapes::sharded(self.cfg, channel);
        if self
            .cfg
            .sharding
            .fans(channel, shape == Some(Shape::ClusterWide))
        {
            return Some((name, Split::ByShard));
        }
        let per_namespace = shape == Some(Shape::PerNamespace);
        (channel.path.namespaced && per_namespace).then_some((name, Split::PerNamespace))
    }

    /// Waits until a single leader running without leader election has stopped (see
    /// [`crate::config::Config::handoff`]): [`crate::leader::Elector::park`] waited for one
    /// holding the Lease, but one that never held it relays on until it saw the park. A Lease
    /// that a single leader held has changed hands at the park, and no wait is needed.
    async fn await_handoff(&self) -> Result<(), MigrateError> {
        let parked_for = crate::leader::parked_unheld_for(self.client, self.cfg)
            .await
            .map_err(MigrateError::Lease)?;
        let Some(parked_for) = parked_for else {
            return Ok(());
        };
        let left = self.cfg.handoff().saturating_sub(parked_for);
        if !left.is_zero() {
            tracing::info!(seconds = left.as_secs(), "waiting for a single leader without leader election to stop before copying its state");
            tokio::time::sleep(left).await;
        }
        Ok(())
    }

    /// Reads the single-leader release's ConfigMap and membership topic.
    ///
    /// With exactly-once delivery the last leader's transactional id is fenced first: a leader
    /// that crashed rather than stopped left a transaction open, which this aborts (or
    /// completes, had its commit reached the coordinator) instead of leaving it to
    /// `transaction.timeout.ms`, and no instance of it can commit after the copy. The positions
    /// committed with its records are then the truth, as at any term's start: its ConfigMap
    /// may lag them by its last commits, whose changes would otherwise be published again.
    async fn read_legacy(&self, log: Arc<dyn Log>) -> Result<Legacy, MigrateError> {
        let cfg = self.cfg;
        let store = Store::new(
            self.client.clone(),
            &cfg.checkpoint.namespace,
            &cfg.checkpoint.name,
        );
        let mut loaded = store.load().await?;
        if !loaded.streams.is_empty() {
            self.await_handoff().await?;
        }
        if let Some(leader) = &self.leader {
            producer::fence(leader.as_ref())
                .await
                .map_err(MigrateError::Fence)?;
        }
        let topic = cfg.checkpoint.membership.topic(&cfg.cluster_name);
        let owner = Owner::new(&cfg.checkpoint.namespace, &cfg.checkpoint.name);
        let from = format!(
            "{}/{} and {topic}",
            cfg.checkpoint.namespace, cfg.checkpoint.name
        );
        let mut members = tokio::task::spawn_blocking(move || {
            let mut restored = Restored::new(owner, None);
            log.replay(&topic, &mut |k, v| restored.apply(k, v), &|| false)?;
            restored.finish();
            Ok::<_, MigrateError>(restored)
        })
        .await
        .map_err(|e| MigrateError::Panicked(e.to_string()))??;
        if self.leader.is_some() {
            for (id, committed) in std::mem::take(&mut members.positions) {
                if let Some(entry) = loaded.streams.get_mut(&id) {
                    entry.take_committed(committed);
                }
            }
        }
        tracing::info!(
            positions = loaded.streams.len(),
            members = members.members(),
            %from,
            "read the single-leader release's state to share out"
        );
        Ok(Legacy {
            positions: loaded.streams,
            members,
            from,
        })
    }

    /// Copies shard `to.shard`'s share of the single-leader state, unless its ConfigMap says it
    /// was. `log` reads the old membership topic (every partition).
    pub(super) async fn migrate(
        &self,
        to: Target<'_>,
        legacy: &LegacyCell,
        log: &Arc<dyn Log>,
        stop: &CancellationToken,
    ) -> Result<(), MigrateError> {
        let loaded = to.store.load().await?;
        if loaded.migrated.is_some() {
            return Ok(());
        }
        let legacy = {
            let mut cell = legacy.lock().await;
            match cell.upgrade() {
                Some(read) => read,
                None => {
                    let read = Arc::new(self.read_legacy(log.clone()).await?);
                    *cell = Arc::downgrade(&read);
                    read
                }
            }
        };
        let sharding = &self.cfg.sharding;
        let ours = |id: &str| sharding.shard_of_stream(id) == to.shard;
        let mut members = 0;
        let mut updates: BTreeMap<String, Option<String>> = BTreeMap::new();
        for stream in legacy.members.streams() {
            let Some(set) = legacy.members.get(stream) else {
                continue;
            };
            let Some((channel, how)) = self.split(stream) else {
                // A stream that runs as it did: its members as they are (its position below).
                if ours(stream) {
                    members += set.len();
                    let all = set.iter();
                    membership::adopt(to.producer.as_ref(), to.topic, to.owner, stream, all, stop)
                        .await?;
                }
                continue;
            };
            // A stream over every namespace, now relayed per namespace or by shard: the members
            // of this shard, each part under its stream, with the position (a resourceVersion
            // is global: a narrower watch from it misses nothing).
            let mut parts: BTreeMap<String, Vec<(String, Known)>> = BTreeMap::new();
            for (uid, known) in set.iter() {
                let ns = known.namespace.as_deref();
                let id = match (how, ns) {
                    (Split::ByShard, _)
                        if sharding.shard_of_object(ns, &known.name) == to.shard =>
                    {
                        StreamId::fanned(channel, to.shard)
                    }
                    (Split::PerNamespace, Some(ns)) if sharding.shard_of(ns) == to.shard => {
                        StreamId::new(channel, Some(ns))
                    }
                    _ => continue,
                };
                parts.entry(id.to_string()).or_default().push((uid, known));
            }
            let saved = legacy.positions.get(stream).map(encode);
            for (id, part) in parts {
                members += part.len();
                let part = part.into_iter();
                membership::adopt(to.producer.as_ref(), to.topic, to.owner, &id, part, stop)
                    .await?;
                if let Some(saved) = &saved {
                    updates.insert(id, Some(saved.clone()));
                }
            }
        }
        for (id, saved) in &legacy.positions {
            if self.split(id).is_none() && ours(id) {
                updates.insert(id.clone(), Some(encode(saved)));
            }
        }
        let positions = updates.len();
        updates.insert(MIGRATED_KEY.into(), Some(legacy.from.clone()));
        to.store.write(&updates).await?;
        tracing::info!(
            shard = to.shard,
            positions,
            members,
            "copied the shard's share of the single-leader state"
        );
        Ok(())
    }
}
