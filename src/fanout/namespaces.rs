//! The namespaces a replica knows, as points of the server's hash with their shards: what
//! the [`super::cover`]s of its hubs are computed from.
//!
//! One follower per replica, started by the first hub whose API server filters by shard: a
//! paginated list of the namespaces, then a watch from its resourceVersion, relisted after a
//! 410 or a failure. Every change of the set of names is published (the receivers see the
//! latest). A follower that may not list namespaces (403) says so, and the hubs read their
//! collections whole.
//!
//! A removed namespace is remembered for [`KEEP_REMOVED`]: a hub's watch reopened from a
//! position still asks for it, or the server would filter out the DELETEDs of its objects that
//! lie after the position (the hub's watch may lag the follower by any amount: it is paced by
//! its slowest part). A removed namespace has no objects left, so asking for it costs a range
//! and nothing else. What was removed before the follower's first list it cannot know: a read
//! from a position before that list reads whole ([`Names::to_ask`]).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cover::{point, Points};
use crate::config::ShardingConfig;
use crate::decode;
use crate::event::EventType;
use crate::kubeapi::{self, ApiError, Query, WatchFrom};

const PATH: &str = "/api/v1/namespaces";
const PAGE: u32 = 500;
const RETRY: Duration = Duration::from_secs(1);

/// How long a removed namespace is still asked for by reads from a position: longer than the
/// API server holds its history (etcd compacts every 5 minutes by default), after which a read
/// from a position before the removal is answered 410 anyway.
pub const KEEP_REMOVED: Duration = Duration::from_secs(15 * 60);

/// What the follower knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// Its first list has not ended yet.
    Listing,
    /// Every namespace, as of its latest change.
    Known(Arc<Names>),
    /// Namespaces may not be listed: the hubs read their collections whole.
    Unavailable,
}

/// The namespaces there, and those removed lately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// Every namespace there, sorted by the server's hash.
    pub points: Points,
    /// Namespaces removed lately (`(point, shard)`), and when the follower saw them go.
    pub removed: Vec<(u64, u32, Instant)>,
    /// The position of the follower's first list (`None`: one that does not compare): what
    /// was removed before it is not known.
    pub listed_at: Option<u64>,
}

impl Names {
    /// The namespaces a read at `now` must ask for: from now (a list, `from` `None`), those
    /// there; from a position, also those removed within [`KEEP_REMOVED`], whose objects'
    /// DELETEDs may lie after it. `None`, to read whole, for a read from a position before the
    /// follower's first list (or one that does not compare with it).
    pub fn to_ask(&self, from: Option<&str>, now: Instant) -> Option<Points> {
        let Some(from) = from else {
            return Some(self.points.clone());
        };
        let known = crate::event::comparable(from)
            .zip(self.listed_at)
            .is_some_and(|(from, listed)| from >= listed);
        if !known {
            return None;
        }
        let mut points = self.points.clone();
        points.extend(
            self.removed
                .iter()
                .filter(|(_, _, at)| now.duration_since(*at) <= KEEP_REMOVED)
                .map(|&(p, k, _)| (p, k)),
        );
        points.sort_unstable();
        points.dedup();
        Some(points)
    }
}

/// The follower's state: the names there, and those removed with when.
#[derive(Debug, Default)]
struct Book {
    names: BTreeSet<String>,
    removed: VecDeque<(String, Instant)>,
    /// The position of its first list, once it ended (`None` inside: it does not compare).
    listed_at: Option<Option<u64>>,
}

impl Book {
    /// A list at `rv` found `names`: those no longer there were removed by then.
    fn listed(&mut self, names: BTreeSet<String>, rv: &str, now: Instant) {
        let gone: Vec<String> = self.names.difference(&names).cloned().collect();
        for name in gone {
            self.removed.push_back((name, now));
        }
        self.names = names;
        self.listed_at
            .get_or_insert_with(|| crate::event::comparable(rv));
    }

    /// An event of the namespaces' watch; whether what is published changes.
    fn event(&mut self, kind: EventType, name: &str, now: Instant) -> bool {
        match kind {
            EventType::Added | EventType::Modified => self.names.insert(name.to_string()),
            EventType::Deleted => {
                let removed = self.names.remove(name);
                if removed {
                    self.removed.push_back((name.to_string(), now));
                }
                removed
            }
            EventType::Bookmark | EventType::Error => false,
        }
    }

    /// What the hubs see, the removals older than [`KEEP_REMOVED`] forgotten.
    fn names(&mut self, sharding: &ShardingConfig, now: Instant) -> Names {
        while self
            .removed
            .front()
            .is_some_and(|(_, at)| now.duration_since(*at) > KEEP_REMOVED)
        {
            self.removed.pop_front();
        }
        let removed = self
            .removed
            .iter()
            // Removed, then back: asked for as it is there.
            .filter(|(n, _)| !self.names.contains(n))
            .map(|(n, when)| (point(n), sharding.shard_of(n), *when))
            .collect();
        let points = points_of(&self.names, sharding);
        Names {
            points,
            removed,
            listed_at: self.listed_at.flatten(),
        }
    }
}

/// Lists every namespace, as the points of `sharding`, sorted, straight from the server: for a
/// read that must know every namespace there now, whatever the follower has seen so far.
pub async fn list_points(
    client: &kube::Client,
    sharding: &ShardingConfig,
) -> Result<Points, ApiError> {
    let (names, _) = list(client).await?;
    Ok(points_of(&names, sharding))
}

/// `names` as points of the server's hash with their shards, sorted.
fn points_of(names: &BTreeSet<String>, sharding: &ShardingConfig) -> Points {
    let mut points: Points = names
        .iter()
        .map(|n| (point(n), sharding.shard_of(n)))
        .collect();
    points.sort_unstable();
    points
}

/// Every namespace's name, and the list's resourceVersion.
async fn list(client: &kube::Client) -> Result<(BTreeSet<String>, String), ApiError> {
    #[derive(Deserialize)]
    struct Item {
        metadata: Md,
    }
    #[derive(Deserialize)]
    struct Md {
        name: String,
    }
    let mut names = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let page = kubeapi::list_page(
            client,
            PATH,
            &Query::default(),
            Some(PAGE),
            token.as_deref(),
        )
        .await?;
        for item in &page.items {
            let item: Item = serde_json::from_str(item.get())?;
            names.insert(item.metadata.name);
        }
        match page.continue_token {
            Some(c) => token = Some(c),
            None => return Ok((names, page.resource_version)),
        }
    }
}

/// What the hubs see.
pub type Known = watch::Receiver<Namespaces>;

/// Starts following the namespaces until `stop`.
pub fn follow(
    client: kube::Client,
    sharding: ShardingConfig,
    watch_timeout_seconds: u32,
    stop: CancellationToken,
) -> Known {
    let (tx, rx) = watch::channel(Namespaces::Listing);
    let follower = Follower {
        client,
        sharding,
        watch_timeout_seconds,
        book: Book::default(),
        tx,
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = follower.run() => {}
        }
    });
    rx
}

struct Follower {
    client: kube::Client,
    sharding: ShardingConfig,
    watch_timeout_seconds: u32,
    book: Book,
    tx: watch::Sender<Namespaces>,
}

impl Follower {
    async fn run(mut self) {
        loop {
            let rv = match self.list().await {
                Ok(rv) => rv,
                Err(ApiError::Status { code: 403, .. }) => {
                    tracing::warn!("namespaces may not be listed: the API server's sharded lists and watches are not used, every replica reads its collections whole");
                    self.tx.send_replace(Namespaces::Unavailable);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing the namespaces failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            self.publish();
            if let Err(e) = self.watch(rv).await {
                tracing::info!(error = %e, "the namespaces' watch ended; relisting");
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    /// Lists every namespace; the list's resourceVersion.
    async fn list(&mut self) -> Result<String, ApiError> {
        let (names, rv) = list(&self.client).await?;
        self.book.listed(names, &rv, Instant::now());
        Ok(rv)
    }

    /// Follows the namespaces from `rv` until the watch cannot go on.
    async fn watch(&mut self, mut rv: String) -> Result<(), ApiError> {
        let trim = decode::Trim {
            drop_managed_fields: true,
            allow_secret_data: false,
        };
        loop {
            let mut w = kubeapi::watch(
                &self.client,
                PATH,
                &Query::default(),
                WatchFrom::Version(&rv),
                self.watch_timeout_seconds,
            )
            .await?;
            while let Some(line) = w.next_line().await? {
                let Ok(ev) = decode::decode_line_into(&line, trim, Vec::new()) else {
                    continue;
                };
                if ev.event_type == EventType::Error {
                    return Err(ApiError::Gone(
                        "the namespaces' watch ended with an error".into(),
                    ));
                }
                rv = ev.meta.resource_version().to_string();
                let changed = self
                    .book
                    .event(ev.event_type, ev.meta.name(), Instant::now());
                if changed {
                    self.publish();
                }
            }
        }
    }

    fn publish(&mut self) {
        let names = self.book.names(&self.sharding, Instant::now());
        self.tx.send_if_modified(|known| {
            let same = matches!(known, Namespaces::Known(n) if **n == names);
            if !same {
                *known = Namespaces::Known(Arc::new(names));
            }
            !same
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(ns: &[&str]) -> BTreeSet<String> {
        ns.iter().map(|n| n.to_string()).collect()
    }

    fn sharding() -> ShardingConfig {
        ShardingConfig {
            enabled: true,
            shards: 4,
            ..ShardingConfig::default()
        }
    }

    /// The names `points` hold, of `all`.
    fn named<'a>(points: Option<Points>, all: &[&'a str]) -> Vec<&'a str> {
        let points = points.expect("a cover, not a whole read");
        let s = sharding();
        all.iter()
            .copied()
            .filter(|n| points.contains(&(point(n), s.shard_of(n))))
            .collect()
    }

    const ALL: [&str; 3] = ["a", "b", "c"];

    /// A removed namespace is still asked for by a read from a position (its objects' DELETEDs
    /// may lie after it), not by a list; a read from before the follower's first list reads
    /// whole, since what went before that list is unknown.
    #[test]
    fn reads_from_a_position_still_ask_for_removed_namespaces() {
        let (mut book, t0) = (Book::default(), Instant::now());
        book.listed(names(&["a", "b"]), "10", t0);
        assert!(book.event(EventType::Deleted, "b", t0));
        let n = book.names(&sharding(), t0);
        assert_eq!(named(Some(n.points.clone()), &ALL), ["a"]);
        assert_eq!(named(n.to_ask(Some("12"), t0), &ALL), ["a", "b"]);
        assert_eq!(named(n.to_ask(Some("10"), t0), &ALL), ["a", "b"]);
        assert_eq!(named(n.to_ask(None, t0), &ALL), ["a"]);
        assert_eq!(n.to_ask(Some("9"), t0), None);
        assert_eq!(n.to_ask(Some("x"), t0), None);
    }

    /// A relist that no longer finds a namespace counts it removed; one removed and created
    /// again is asked for once, as there.
    #[test]
    fn a_relist_removes_and_a_recreate_restores() {
        let (mut book, t0) = (Book::default(), Instant::now());
        book.listed(names(&["a", "b", "c"]), "10", t0);
        book.listed(names(&["a", "c"]), "30", t0);
        let n = book.names(&sharding(), t0);
        assert_eq!(n.removed.len(), 1);
        assert_eq!(n.listed_at, Some(10));
        assert_eq!(named(n.to_ask(Some("20"), t0), &ALL), ["a", "b", "c"]);
        assert!(book.event(EventType::Added, "b", t0));
        let n = book.names(&sharding(), t0);
        assert!(n.removed.is_empty());
        assert_eq!(n.to_ask(Some("20"), t0), Some(n.points.clone()));
        assert!(!book.event(EventType::Deleted, "gone", t0));
        assert!(!book.event(EventType::Bookmark, "", t0));
    }

    /// Removals are forgotten once the server no longer holds their history, whether or not
    /// anything was published since.
    #[test]
    fn removals_are_forgotten_after_the_history() {
        let (mut book, t0) = (Book::default(), Instant::now());
        book.listed(names(&["a", "b"]), "10", t0);
        let gone = t0 + KEEP_REMOVED;
        book.event(EventType::Deleted, "b", gone);
        let n = book.names(&sharding(), gone);
        let at = gone + KEEP_REMOVED;
        assert_eq!(named(n.to_ask(Some("11"), at), &ALL), ["a", "b"]);
        let after = gone + KEEP_REMOVED + Duration::from_secs(1);
        assert_eq!(named(n.to_ask(Some("11"), after), &ALL), ["a"]);
        assert!(book.names(&sharding(), after).removed.is_empty());
    }
}
