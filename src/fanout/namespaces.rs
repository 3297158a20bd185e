//! The namespaces a replica knows, as points of the server's hash with their shards: what
//! the [`super::cover`]s of its hubs are computed from.
//!
//! One follower per replica, started by the first hub whose API server filters by shard: a
//! paginated list of the namespaces, then a watch from its resourceVersion, relisted after a
//! 410 or a failure. Every change of the set of names is published (the receivers see the
//! latest). A follower that may not list namespaces (403) says so, and the hubs read their
//! collections whole.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cover::{point, Points};
use crate::config::ShardingConfig;
use crate::decode;
use crate::event::EventType;
use crate::kubeapi::{self, ApiError, Query, WatchFrom};

const PATH: &str = "/api/v1/namespaces";
const PAGE: u32 = 500;
const RETRY: Duration = Duration::from_secs(1);

/// What the follower knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// Its first list has not ended yet.
    Listing,
    /// Every namespace, as of its latest change.
    Known(Arc<Points>),
    /// Namespaces may not be listed: the hubs read their collections whole.
    Unavailable,
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
        names: BTreeSet::new(),
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
    names: BTreeSet<String>,
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
                &self.client,
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
                None => {
                    self.names = names;
                    return Ok(page.resource_version);
                }
            }
        }
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
                let changed = match ev.event_type {
                    EventType::Error => {
                        return Err(ApiError::Gone(
                            "the namespaces' watch ended with an error".into(),
                        ))
                    }
                    EventType::Added | EventType::Modified => {
                        self.names.insert(ev.meta.name().to_string())
                    }
                    EventType::Deleted => self.names.remove(ev.meta.name()),
                    EventType::Bookmark => false,
                };
                rv = ev.meta.resource_version().to_string();
                if changed {
                    self.publish();
                }
            }
        }
    }

    fn publish(&self) {
        let mut points: Points = self
            .names
            .iter()
            .map(|n| (point(n), self.sharding.shard_of(n)))
            .collect();
        points.sort_unstable();
        self.tx.send_if_modified(|known| {
            let same = matches!(known, Namespaces::Known(p) if **p == points);
            if !same {
                *known = Namespaces::Known(Arc::new(points));
            }
            !same
        });
    }
}
