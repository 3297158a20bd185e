//! Fanning out the streams a release kept whole from before fan-out (`watchrelay
//! split-whole`), while no replica of the release runs.
//!
//! Releases before fan-out ran a channel over one collection as one stream in its channel's
//! shard (`<channel>._all`); replicas of this version keep it so ([`Config::keeping_whole`]),
//! since splitting it into every shard's part (`<channel>._all-s<k>`) while replicas run would
//! let the whole stream's DELETEDs race the parts' ADDEDs (see `moves`). With the release
//! stopped nothing races: the split hands each shard the members of the objects it owns and
//! the whole stream's position, and once the release starts again each part resumes from that
//! position. Every change after it is published once, in order; nothing is retracted, and
//! consumers see nothing of the split but the relay's pause.
//!
//! # Steps
//! 1. The group is claimed from outside ([`Coordinator::claim_idle`](crate::group::Coordinator)),
//!    which its coordinator accepts only while no replica is a member: the split is refused
//!    while the release runs.
//! 2. Every shard's checkpoint ConfigMap is stamped with a new owner epoch (a deposed owner's
//!    late write fails) and marked ([`SPLITTING_KEY`]): a replica refuses to start while a mark
//!    stands, naming this command. The group is claimed again: a replica that joined since is
//!    seen (or deposes a mark's write), and the marks are removed. One that joins later finds them, and one that settled
//!    its configuration before them stops at its first term (see [`SPLITS_KEY`]).
//! 3. With exactly-once delivery every shard's transactional id is fenced: no producer of an
//!    earlier owner commits after the split read the positions.
//! 4. For each stream kept whole: its position (its ConfigMap entry, or with exactly-once
//!    delivery the one committed with its records, which the entry may lag) and its members
//!    are read from its shard. Every shard gets its part's members (its objects) in its
//!    partition of the shards' topic, acknowledged, then its part's entry with that position
//!    (era and query included) in its ConfigMap; the whole stream's shard comes last, where the
//!    whole stream's members are tombstoned and its entry removed with the part's written.
//! 5. Every mark is removed, and each ConfigMap's split count ([`SPLITS_KEY`]) raised.
//!
//! A failure or a crash before the end leaves marks: no replica starts, and running the split
//! again finishes it. A stream whose entry left its shard was split; one still there is split
//! again from the same position and members, which writes the same parts (nothing ran since).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::context::{Context, RelayError, Sink};
use super::moves;
use crate::checkpoint::{encode, CheckpointError, Ownership, Store, SPLITS_KEY, SPLITTING_KEY};
use crate::config::{ShardingConfig, StreamId};
use crate::group::GroupError;
use crate::membership::{self, Log, Owner, Restored};
use crate::producer::{self, Producer, Record};

/// What the split made of one stream kept whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The stream kept whole (`<channel>._all`).
    pub stream: String,
    /// Its shard.
    pub shard: u32,
    /// The position every part resumes from; `None`: the stream had none, and each part lists.
    pub position: Option<String>,
    /// How many members each shard's part took (every shard's, none or more).
    pub members: BTreeMap<u32, usize>,
}

/// Who the split is, on the ConfigMaps it stamps.
const SPLITTER: &str = "watchrelay-split-whole";

/// Members written at a time.
const BATCH: usize = 10_000;

fn failed(what: &str, e: impl std::fmt::Display) -> RelayError {
    RelayError::Split(format!("{what}: {e}"))
}

/// Splits every stream `ctx`'s release keeps whole into the shards' parts (see the module).
pub(super) async fn run(ctx: &Context) -> Result<Vec<Split>, RelayError> {
    let cfg = &ctx.cfg;
    if !cfg.sharding.enabled {
        return Err(RelayError::Refused(
            "sharding is off: only a sharded release keeps streams whole".into(),
        ));
    }
    let (settled, cut_short) = moves::kept_whole(cfg, &ctx.client)
        .await
        .map_err(RelayError::Refused)?;
    let whole: Vec<String> = settled
        .channels
        .iter()
        .filter(|c| c.kept_whole)
        .map(|c| c.stream_id(None).to_string())
        .collect();
    if whole.is_empty() && !cut_short {
        return Ok(Vec::new());
    }
    for id in &whole {
        adopted(ctx, id).await?;
    }
    claim(ctx).await?;
    // A replica that joined meanwhile: the marks come off again (its terms, stopped at a
    // marked shard or deposed by the stamps, start again on the release as it was).
    let marked = mark(ctx, &whole.join(" ")).await;
    let shards = match marked {
        Ok(shards) => shards,
        Err(e) => return Err(withdrawn(ctx, e).await),
    };
    if let Err(e) = claim(ctx).await {
        return Err(withdrawn(ctx, e).await);
    }
    fence(ctx).await?;
    let (producer, _) = ctx.sink()?;
    let mut splits = Vec::new();
    for id in &whole {
        splits.push(split(ctx, producer.as_ref(), &shards, id).await?);
    }
    let count = shards.iter().map(|(_, loaded)| *loaded).max().unwrap_or(0) + 1;
    unmark(&shards, count).await?;
    Ok(splits)
}

/// Refused unless a sharded replica ran the shard of stream `id` (its ConfigMap records the
/// shards' topic): its members are then in its partition under the shard's owner (a term's
/// start adopts what older versions wrote otherwise, see `membership::restore`).
async fn adopted(ctx: &Context, id: &str) -> Result<(), RelayError> {
    let cfg = &ctx.cfg;
    let home = cfg.sharding.shard_of_stream(id);
    let name = ShardingConfig::configmap(&cfg.checkpoint.name, home);
    let store = Store::new(ctx.client.clone(), &cfg.checkpoint.namespace, &name);
    let loaded = (store.load().await).map_err(|e| failed("reading the stream's shard", e))?;
    if loaded.mark.is_some() {
        return Ok(());
    }
    Err(RelayError::Refused(format!(
        "shard {home}, which holds {id}, was never run by a sharded replica (its checkpoint ConfigMap does not record the shards' topic): run the release on this version until every replica is ready, then stop it and split"
    )))
}

/// Claims the group from outside: refused while a replica is in it.
async fn claim(ctx: &Context) -> Result<(), RelayError> {
    let (coordinator, cfg) = (ctx.coordinator.clone(), ctx.cfg.clone());
    let claimed = tokio::task::spawn_blocking(move || coordinator.claim_idle(&cfg))
        .await
        .map_err(|e| failed("claiming the group", e))?;
    match claimed {
        Ok(_) => Ok(()),
        Err(GroupError::Busy(why)) => Err(RelayError::Refused(format!(
            "replicas of the release are running ({why}): scale the release to zero (every replica stopped), then split"
        ))),
        Err(e) => Err(failed("claiming the group", e)),
    }
}

/// The owner of shard `k`'s ConfigMap and membership records.
fn owner(ctx: &Context, k: u32) -> Owner {
    let cfg = &ctx.cfg;
    let name = ShardingConfig::configmap(&cfg.checkpoint.name, k);
    Owner::new(&cfg.checkpoint.namespace, &name)
}

/// Every shard's ConfigMap stamped with a new owner epoch and marked with `streams`, each with
/// the split count it held.
async fn mark(ctx: &Context, streams: &str) -> Result<Vec<(Store, u64)>, RelayError> {
    let cfg = &ctx.cfg;
    let mut shards = Vec::new();
    for k in 0..cfg.sharding.shards {
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, k);
        let store = Store::new(ctx.client.clone(), &cfg.checkpoint.namespace, &name);
        let mark = async {
            let epoch = store.claim_epoch(SPLITTER, 0).await?;
            let store = store.owned(Ownership {
                replica: SPLITTER.into(),
                epoch,
            });
            let loaded = store.load().await?;
            let mark = BTreeMap::from([(SPLITTING_KEY.to_string(), Some(streams.to_string()))]);
            store.write(&mark).await?;
            Ok::<_, CheckpointError>((store, loaded.splits))
        };
        shards.push(mark.await.map_err(|e| failed("marking the shards", e))?);
    }
    Ok(shards)
}

/// Removes every shard's mark, raising its split count to `count`.
async fn unmark(shards: &[(Store, u64)], count: u64) -> Result<(), RelayError> {
    let updates = BTreeMap::from([
        (SPLITTING_KEY.to_string(), None),
        (SPLITS_KEY.to_string(), Some(count.to_string())),
    ]);
    for (store, _) in shards {
        (store.write(&updates).await).map_err(|e| failed("removing the marks", e))?;
    }
    Ok(())
}

/// `why` the split stopped before it wrote anything but its marks, once every shard's mark is
/// removed: written without an owner epoch, since a replica that joined may have stamped a
/// higher one. A mark that cannot be removed is said too (run the split again).
async fn withdrawn(ctx: &Context, why: RelayError) -> RelayError {
    let cfg = &ctx.cfg;
    let unmark = BTreeMap::from([(SPLITTING_KEY.to_string(), None)]);
    for k in 0..cfg.sharding.shards {
        let name = ShardingConfig::configmap(&cfg.checkpoint.name, k);
        let store = Store::new(ctx.client.clone(), &cfg.checkpoint.namespace, &name);
        if let Err(e) = store.write(&unmark).await {
            return failed(&format!("{why}; then removing the marks"), e);
        }
    }
    why
}

/// With exactly-once delivery, fences every shard's transactional id.
async fn fence(ctx: &Context) -> Result<(), RelayError> {
    for k in 0..ctx.cfg.sharding.shards {
        if let Some((id, connect)) = ctx.txn_connect(&owner(ctx, k)) {
            (producer::fence(connect.as_ref()).await)
                .map_err(|e| failed(&format!("fencing {id}"), e.message))?;
        }
    }
    Ok(())
}

/// Hands stream `id`, kept whole in its shard, to every shard's part (step 4 of the module).
async fn split(
    ctx: &Context,
    producer: &dyn Producer,
    shards: &[(Store, u64)],
    id: &str,
) -> Result<Split, RelayError> {
    let cfg = &ctx.cfg;
    let sharding = &cfg.sharding;
    let topic = sharding.topic(&cfg.cluster_name);
    let home = sharding.shard_of_stream(id);
    let (store, _) = &shards[home as usize];
    let loaded = (store.load().await).map_err(|e| failed("reading the stream's shard", e))?;
    let mut saved = loaded.streams.get(id).cloned().unwrap_or_default();
    let members = read(ctx, home).await?;
    if ctx.txn_connect(&owner(ctx, home)).is_some() {
        if let Some(committed) = members.positions.get(id).cloned() {
            saved.take_committed(committed);
        }
    }
    let entry = encode(&saved);
    // Every member joins its shard's part, in one pass: each record in its shard's partition.
    let (channel, _) = StreamId::parts(id).unwrap_or((id, None));
    let mut taken: BTreeMap<u32, usize> = (0..sharding.shards).map(|k| (k, 0)).collect();
    // Each shard's owner and part, named once rather than for every member.
    let parts: Vec<(Owner, String)> = (0..sharding.shards)
        .map(|k| (owner(ctx, k), StreamId::fanned(channel, k).to_string()))
        .collect();
    let held = members.get(id).into_iter().flat_map(|m| m.iter());
    let joins = held.map(|(uid, known)| {
        let k = sharding.shard_of_object(known.namespace.as_deref(), &known.name);
        *taken.entry(k).or_default() += 1;
        let (owner, part) = &parts[k as usize];
        pinned(
            membership::record(&topic, owner, part, &uid, Some(&known)),
            k,
        )
    });
    send(producer, joins).await?;
    // Then each part's position, the whole stream's shard last: its members tombstoned, its
    // entry removed with its part's written.
    let order = (0..sharding.shards).filter(|&k| k != home).chain([home]);
    for k in order {
        let (owner, part) = &parts[k as usize];
        let mut updates = BTreeMap::from([(part.clone(), Some(entry.clone()))]);
        if k == home {
            let leaves = members.get(id).into_iter().flat_map(|m| m.iter());
            let leaves =
                leaves.map(|(uid, _)| pinned(membership::record(&topic, owner, id, &uid, None), k));
            send(producer, leaves).await?;
            updates.insert(id.to_string(), None);
        }
        let (store, _) = &shards[k as usize];
        (store.write(&updates).await).map_err(|e| failed("writing a part's position", e))?;
    }
    tracing::info!(stream = %id, shard = home, position = ?saved.rv, members = members.get(id).map_or(0, |m| m.len()), "split the stream kept whole into the shards' parts");
    Ok(Split {
        stream: id.to_string(),
        shard: home,
        position: saved.rv,
        members: taken,
    })
}

/// The members and committed positions shard `k` holds in the shards' topic.
async fn read(ctx: &Context, k: u32) -> Result<Restored, RelayError> {
    let cfg = &ctx.cfg;
    let log: Arc<dyn Log> = match &ctx.sink {
        Sink::Kafka => Arc::new(membership::log::Kafka::new(&cfg.kafka).partition(k.cast_signed())),
        Sink::Given(_, log, _) => log.clone(),
    };
    let topic = cfg.sharding.topic(&cfg.cluster_name);
    let owner = owner(ctx, k);
    let read = tokio::task::spawn_blocking(move || {
        let mut restored = Restored::new(owner, None);
        log.replay(&topic, &mut |k, v| restored.apply(k, v), &|| false)?;
        restored.finish();
        Ok::<_, membership::TopicError>(restored)
    });
    let read = read
        .await
        .map_err(|e| failed("reading the shards' topic", e))?;
    read.map_err(|e| failed("reading the shards' topic", e))
}

/// `record` in shard `k`'s partition of the shards' topic.
fn pinned(mut record: Record, k: u32) -> Record {
    record.partition = Some(k.cast_signed());
    record
}

/// Sends `records`, a batch at a time, each batch acknowledged before the next.
async fn send(
    producer: &dyn Producer,
    records: impl Iterator<Item = Record>,
) -> Result<(), RelayError> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut records = records.peekable();
    while records.peek().is_some() {
        let batch: Vec<Record> = records.by_ref().take(BATCH).collect();
        (membership::send_all(producer, batch, &stop).await)
            .map_err(|e| failed("writing the shards' topic", e))?;
    }
    Ok(())
}
