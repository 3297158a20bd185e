//! Scale-out: this replica relays the shards the consumer group assigns it, each as a term of
//! its own.
//!
//! A shard's term is today's term cut to the shard: its streams (see
//! [`crate::config::ShardingConfig::shard_of_stream`]), its own checkpoint ConfigMap
//! (`<checkpoint.name>-s<k>`, stamped with the owner epoch so a deposed owner's write fails),
//! its own membership owner and its own partition `k` of the shards' membership topic, which
//! its restore alone reads, to an end marker it wrote. Every record it produces carries the shard
//! and the owner epoch (envelope metadata and `ce_shard`, `ce_ownerepoch` headers). Before its
//! first term, a shard copies its share of a single leader's state (`migrate.rs`).
//!
//! # A shard's lifecycle
//! Each shard's phase is decided by the pure machine in `lifecycle.rs` (claimed, starting,
//! running, revoking, fenced, lost, ended); [`Book`](book::Book) feeds it what the group, the clock and the
//! shard's term report and performs its actions:
//! - **Claimed** ([`Event::Claimed`](crate::group::Event::Claimed)): the owner epoch is stamped on the shard's ConfigMap
//!   (above every one stamped before), then its term starts: restore, then its streams.
//! - **Revoked** (not lost): its term stops as at a shutdown (streams drain, the term's own
//!   records are awaited, the final positions are written), then the group is answered and the
//!   rebalance goes on: the next owner resumes exactly there. Records of the term still
//!   undelivered then are purged first, so none lands after the next owner's.
//! - **Held** (the ownership deadline passed): its term takes and commits nothing until a
//!   renewal proves ownership again, then goes on (see [`crate::group::Deadline`]).
//! - **Fenced** (the ownership deadline lapsed, or its writer found a newer owner) and **lost**
//!   (the assignment was lost): its term stops without draining, the producer's queued and
//!   in-flight records are purged and nothing more is written. A fenced shard is claimed
//!   again, under a new epoch, if the group still assigns it here.
//! - A shard claimed again while its previous term still stops starts once that one ended.
//!
//! A stop of the process leaves the group: every shard is handed over first. So does a replica
//! whose API server has not answered for `sharding.apiUnreachableSeconds`, which joins again
//! once it answers.
//!
//! # The loop
//! A [`Replica`]'s membership (`replica.rs`) executes: it waits for what can happen and feeds
//! it to the book, then performs what the book leaves to it (starting terms, claiming again).
//! Nothing is polled:
//! - the group's [`Event`](crate::group::Event)s (claims, revokes, a fatal error of its
//!   client);
//! - each term's end, and its report (with its shard and which term it is) that every stream
//!   it started watches, which completes the takeover;
//! - the clock, only when the book asks for it ([`Book::next_look`](book::Book::next_look)):
//!   the ownership deadline while a term may still produce, a claim due again, and the API
//!   server's silence reaching its grace while terms run. A deadline renewed meanwhile is
//!   looked at again, later.
//!
//! The module's parts: [`book`] (the shards as held), [`replica`] (the loop and the terms it
//! starts), [`share`] (a term's share of the producer), [`resyncs`] (resync requests passed on
//! to the shards). [`run`] sets the replica up.

use std::sync::Arc;

use super::context::{Context, RelayError};
use super::migrate::LegacyCell;
use super::others;
use crate::registry::Role;
use replica::{Member, Replica};

mod book;
mod replica;
mod resyncs;
mod share;

/// Relays the shards this replica owns until shut down, then hands them over and leaves
/// the group. A replica that cannot reach the API server for
/// `sharding.apiUnreachableSeconds` leaves the group too (its shards go to replicas that
/// can relay them) and joins again once it answers.
pub(super) async fn run(relay: &Context) -> Result<(), RelayError> {
    let cfg = &relay.cfg;
    relay.registry.begin_term(Role::Member);
    let (producer, log) = relay.sink()?;
    if !replica::ensure_topics(relay, &log).await {
        return Ok(());
    }
    // No replica of the single-leader version may lead once shards run.
    let le = &cfg.leader_election;
    let lease_ns = cfg.lease_namespace();
    let mut elector = crate::leader::Elector::new(relay.client.clone(), lease_ns, le);
    if !elector.park(&relay.shutdown).await {
        return Ok(());
    }
    let mut topics = vec![cfg.sharding.topic(&cfg.cluster_name)];
    let single = cfg.checkpoint.membership.topic(&cfg.cluster_name);
    if !topics.contains(&single) {
        topics.push(single);
    }
    // Read while the replica joins, not before: a partition out of reach (its leader
    // stalled) must not keep the replica out of the group, and only a term's streams need
    // the claims. Failing past its session, the terms' streams start unchecked against
    // them (with a warning) and the read goes on: terms started after it check them.
    let (found, others) = tokio::sync::watch::channel(None);
    let read = async {
        let c = &cfg.checkpoint;
        let stop = &relay.shutdown;
        let wait = others::claims_wait(&cfg.sharding);
        let read = match others::read(c, &log, &topics, Some(wait), stop).await {
            Some(read) => Some(read),
            None if stop.is_cancelled() => None,
            None => {
                tracing::warn!(?topics, wait_seconds = wait.as_secs(), "other releases' claims still unread: this replica's streams start unchecked against them until they are read");
                let _ = found.send(Some(Arc::from([])));
                others::read(c, &log, &topics, None, stop).await
            }
        };
        if let Some(read) = read {
            let _ = found.send(Some(read.others));
        }
        std::future::pending::<()>().await;
    };
    let member = Member {
        producer,
        log: log.clone(),
        identity: crate::leader::identity(&cfg.leader_election),
        legacy: LegacyCell::default(),
        passes: Arc::default(),
        others,
    };
    let replica = Replica { relay, member };
    tokio::select! {
        relayed = replica.memberships() => relayed,
        () = read => unreachable!("the read waits forever once done"),
    }
}
