//! Other releases' claims, beyond what a term restores.
//!
//! Before a stream starts, the overlap check refuses it when another release's live members
//! announced objects of its scope on its topic (the two would interleave on each key). A term
//! restores only its own membership topic, or its shard's partition of it, so a release on the
//! other kind of topic (a single leader against a sharded release) or in another partition (any
//! release's cluster-wide stream, a release with another shard count) went unseen. A term now
//! also reads the claims in the other topics, every partition: a single leader at each term's
//! start (the shards' topic), a sharded replica once, while it first joins the group (the
//! single-leader topic and the shards' topic), for all the shards it owns since: its terms wait
//! for that read before their streams start.
//!
//! A sharded replica whose reads of them keep failing (a partition of either topic without a
//! leader, say) waits [`claims_wait`] (its session timeout): past it, its terms' streams start
//! unchecked against the claims, with a warning, and the read goes on for the terms that start
//! after it. A read that is slow but works is waited for. A single leader waits for it in any
//! case, since the read also tells it whether its release ran sharded.
//!
//! A topic the release may not read (ACLs) is skipped with a warning. What an owner of this
//! release claims (its single leader's ConfigMap, or any of its shards',
//! whatever their number) is not another release's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{CheckpointConfig, ShardingConfig};
use crate::envelope::ShardOwner;
use crate::membership::{Claim, Log, Restored, TopicError};

/// The wait between two failed reads of the claims.
const RETRY: Duration = Duration::from_secs(5);

/// How long a sharded replica's terms wait for the claims, while reading them fails, before
/// their streams start unchecked against them: a partition of either topic without a leader
/// (or under its min ISR) must not keep every shard of the replica from relaying. As long as the group waits for a silent
/// replica (its session): past that, the replica would hold its shards without relaying them
/// longer than a dead one would.
pub(super) fn claims_wait(sharding: &ShardingConfig) -> Duration {
    Duration::from_millis(u64::from(sharding.session_timeout_ms))
}

/// Claims of other releases a term checks its streams against, beyond those it restores.
#[derive(Clone, Debug)]
pub(super) enum Others {
    /// To be read when the term starts, from these topics.
    In(Vec<String>),
    /// Read (or being read) once for every term of the replica: the term waits for it.
    Reading(tokio::sync::watch::Receiver<Option<Arc<[Claim]>>>),
}

/// What reading other topics found.
pub(super) struct Found {
    /// Other releases' live claims.
    pub others: Arc<[Claim]>,
    /// A live claim of one of this release's shards, if any: the release ran sharded, even
    /// where the markers the API server kept say otherwise (an etcd restore to before).
    pub ours_sharded: Option<Claim>,
}

/// The claims of other releases a term of `shard` (`None`: a single leader's) of the release
/// whose checkpoint is `c` checks its streams against, reading them by `log` if the term reads
/// them itself; `Ok(None)` once `stop`. A single leader whose own shards' members are live is
/// refused (`Err`, the refusal): its release ran sharded.
pub(super) async fn for_term(
    c: &CheckpointConfig,
    others: Others,
    log: &Arc<dyn Log>,
    shard: Option<ShardOwner>,
    stop: &CancellationToken,
) -> Result<Option<Arc<[Claim]>>, String> {
    match others {
        Others::Reading(mut read) => Ok(tokio::select! {
            _ = stop.cancelled() => None,
            read = read.wait_for(Option::is_some) => read.ok().and_then(|r| r.clone()),
        }),
        Others::In(topics) => {
            let Some(found) = read(c, log, &topics, None, stop).await else {
                return Ok(None);
            };
            if let (None, Some(claim)) = (shard, found.ours_sharded) {
                let marker = format!(
                    "the shards' membership topic holds live members of its shard {}",
                    claim.owner
                );
                return Err(crate::leader::unsharding_refusal(&marker));
            }
            Ok(Some(found.others))
        }
    }
}

/// The live claims of other releases than the one whose checkpoint is `c` in `topics`, read by
/// `log` (every partition), tried again until read; `None` once `stop`, or when an attempt
/// failed once `patience` had passed since the first began (a read that is slow but works is
/// waited for).
pub(super) async fn read(
    c: &CheckpointConfig,
    log: &Arc<dyn Log>,
    topics: &[String],
    patience: Option<Duration>,
    stop: &CancellationToken,
) -> Option<Found> {
    let first = Instant::now();
    loop {
        let started = Instant::now();
        let (log, list) = (log.clone(), topics.to_vec());
        let read = tokio::task::spawn_blocking(move || {
            let mut claims = Vec::new();
            for topic in &list {
                let mut read = Restored::claims_only();
                match log.replay(topic, &mut |k, v| read.apply(k, v), &|| false) {
                    Ok(()) => {}
                    // A topic this release may not read is checked by nothing here,
                    // but does not keep the release from relaying.
                    Err(TopicError::Unauthorized(e)) => {
                        tracing::warn!(%topic, error = %e, "not allowed to read other releases' claims; streams are not checked against them");
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                read.finish();
                claims.extend(read.into_claims());
            }
            Ok::<_, TopicError>(claims)
        });
        let failed = tokio::select! {
            _ = stop.cancelled() => return None,
            read = read => match read {
                Ok(Ok(claims)) => {
                    let base = crate::membership::Owner::new(&c.namespace, &c.name);
                    let (mine, others): (Vec<Claim>, Vec<Claim>) =
                        claims.into_iter().partition(|claim| c.owns(&claim.owner));
                    let ours_sharded = mine.into_iter().find(|claim| claim.owner != base.as_str());
                    tracing::info!(?topics, claims = others.len(), seconds = started.elapsed().as_secs_f64(), "read other releases' claims");
                    return Some(Found { others: others.into(), ours_sharded });
                }
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            },
        };
        tracing::warn!(?topics, error = %failed, "reading other releases' claims failed; retrying");
        if patience.is_some_and(|p| first.elapsed() >= p) {
            return None;
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ShardingConfig;

    #[test]
    fn a_release_owns_its_configmap_and_every_shards() {
        let ours = |name| ShardingConfig::of_release("relay", name);
        assert!(ours("relay"));
        assert!(ours("relay-s0"));
        assert!(ours("relay-s63"));
        assert!(!ours("relay-s"));
        assert!(!ours("relay-b"));
        assert!(!ours("relay-s1x"));
        assert!(!ours("relay2"));
        assert!(!ours("other-s1"));
    }
}
