//! The namespaces matching each namespace selector, followed once per replica.
//!
//! A selector channel (and, with sharding on, an `allNamespaces` channel, spread per namespace)
//! needs the set of namespaces its selector matches. Every term of the replica (one per owned
//! shard) reads it from here: one list and one watch of namespaces per selector and replica,
//! whatever the number of shards, kept across terms and handovers. Each follower publishes the
//! whole matched set, once listed, then each change; a term compares it with what it runs.
//! Sets sent in quick succession may reach a term as the last alone: a namespace that left and
//! came back at once is one that stayed, and its stream goes on.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::stream::Namespaces;

/// The followers of this replica's selectors; they stop when it is dropped.
pub(super) struct Feeds {
    client: kube::Client,
    feeds: Mutex<HashMap<String, watch::Receiver<Namespaces>>>,
    stop: CancellationToken,
}

impl Drop for Feeds {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Feeds {
    pub(super) fn new(client: kube::Client) -> Self {
        Self {
            client,
            feeds: Mutex::default(),
            stop: CancellationToken::new(),
        }
    }

    /// The namespaces `selector` matches (`None` until first listed); its follower starts on
    /// the first call.
    pub(super) fn subscribe(&self, selector: &str) -> watch::Receiver<Namespaces> {
        let mut feeds = self.feeds.lock().expect("feeds lock poisoned");
        if let Some(rx) = feeds.get(selector) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        feeds.insert(selector.to_string(), rx.clone());
        tokio::spawn(follow(
            self.client.clone(),
            selector.to_string(),
            tx,
            self.stop.clone(),
        ));
        rx
    }
}

/// Sends the namespaces matching `selector` on `matched`: the whole set once listed, then
/// every change, as kube's watcher follows them (relisting, backing off); until `stop`.
async fn follow(
    client: kube::Client,
    selector: String,
    matched: watch::Sender<Namespaces>,
    stop: CancellationToken,
) {
    let api: Api<Namespace> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let mut listing: HashSet<String> = HashSet::new();
    let mut set: Option<BTreeSet<String>> = None;
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = events.next() => ev,
        };
        let Some(ev) = ev else { return };
        let name = |ns: Namespace| ns.metadata.name.unwrap_or_default();
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(ns)) => {
                listing.insert(name(ns));
            }
            Ok(Event::InitDone) => set = Some(listing.drain().collect()),
            Ok(Event::Apply(ns)) => {
                if let Some(s) = set.as_mut() {
                    s.insert(name(ns));
                }
            }
            Ok(Event::Delete(ns)) => {
                if let Some(s) = set.as_mut() {
                    s.remove(&name(ns));
                }
            }
            Err(e) => {
                tracing::warn!(%selector, error = %e, "namespace watch failed; retrying");
                continue;
            }
        }
        if let Some(s) = &set {
            matched.send_if_modified(|current| {
                let moved = current.as_deref() != Some(s);
                if moved {
                    *current = Some(Arc::new(s.clone()));
                }
                moved
            });
        }
    }
}
