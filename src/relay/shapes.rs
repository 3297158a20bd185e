//! Deciding, at the start of a term, how each channel over several namespaces watches them
//! ([`Shape`]): before anything is retired or started, since the streams a term runs depend on
//! it.

use std::collections::{BTreeSet, HashMap};

use crate::config::Config;
use crate::config::{Channel, Scope, Shape, Shapes, StreamId};
use crate::event::comparable;
use crate::kubeapi::{self, Query};
use crate::membership::regroup::ScopeNow;
use crate::metrics::Metrics;

/// Each channel's shape this term. `known` are the stream ids the relay holds state of
/// (positions, members): they say what each channel ran last time. A selector channel left to
/// `auto` keeps what it ran last time; it lists its namespaces once to count them, to decide its
/// first shape, or to say (log and `watch_strategy_switch_pending`) that the count now calls for
/// the other one: a switch moves every stream of the channel (see
/// [`crate::membership::regroup`]), so it takes an explicit `watchStrategy`. Should counting fail, a channel that never ran watches per namespace.
pub(super) async fn decide<'a>(
    cfg: &Config,
    client: &kube::Client,
    metrics: &Metrics,
    known: impl Iterator<Item = &'a str>,
) -> Shapes {
    let mut previous: HashMap<&str, Shape> = HashMap::new();
    for id in known {
        if let Some((name, ns)) = StreamId::parts(id) {
            let shape = match ns {
                None => Shape::ClusterWide,
                Some(_) => Shape::PerNamespace,
            };
            previous.entry(name).or_insert(shape);
        }
    }
    let threshold = cfg.kubernetes.cluster_wide_above as usize;
    let mut shapes = Shapes::new();
    for channel in &cfg.channels {
        let mut before = previous.get(channel.name.as_str()).copied();
        let count = match &channel.scope {
            Scope::Cluster => continue,
            // Decided by the list alone, as `watchrelay rbac` decides the permissions.
            Scope::Namespaces(list) => {
                before = None;
                list.len()
            }
            Scope::Selector(_) if cfg.sharding.enabled => {
                if let Some(shape) = sharded(cfg, channel) {
                    shapes.insert(channel.name.clone(), shape);
                }
                continue;
            }
            Scope::Selector(sel) => {
                // Only `auto` needs the count.
                let probe = channel.shape(0, None, threshold);
                if channel.shape(usize::MAX, None, threshold) == probe {
                    0
                } else {
                    match count_namespaces(client, sel).await {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::warn!(channel = %channel.name, error = %e, "counting the selector's namespaces failed; keeping the last term's watch strategy");
                            if let Some(shape) = before {
                                shapes.insert(channel.name.clone(), shape);
                                continue;
                            }
                            0
                        }
                    }
                }
            }
        };
        if let Some(shape) = channel.shape(count, before, threshold) {
            tracing::info!(channel = %channel.name, namespaces = count, ?shape, "watch strategy");
            let by_count = channel.shape(count, None, threshold);
            let pending = before.is_some() && by_count != Some(shape);
            if pending {
                tracing::warn!(channel = %channel.name, namespaces = count, kept = ?shape, by_count = ?by_count, threshold, "watchStrategy auto keeps the shape it ran; the namespace count now calls for the other one. Switching moves every stream of the channel: set watchStrategy explicitly to switch");
            }
            metrics
                .watch_strategy_switch_pending
                .with_label_values(&[&channel.name])
                .set(i64::from(pending));
            shapes.insert(channel.name.clone(), shape);
        }
    }
    shapes
}

/// A channel's shape in a sharded release: every replica must decide alike, whatever it
/// counts, so a selector's `auto` is per namespace and a list's is decided by its length.
pub(super) fn sharded(cfg: &Config, channel: &Channel) -> Option<Shape> {
    let threshold = cfg.kubernetes.cluster_wide_above as usize;
    match &channel.scope {
        Scope::Cluster => None,
        Scope::Namespaces(list) => channel.shape(list.len(), None, threshold),
        Scope::Selector(_) => channel.shape(0, None, usize::MAX),
    }
}

/// How many namespaces each undecided selector channel of a sharded release matches (see
/// [`Config::settled`]); a channel whose count failed is left out, and runs per namespace.
pub(super) async fn count_selectors(cfg: &Config, client: &kube::Client) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut by_selector: HashMap<&str, usize> = HashMap::new();
    for channel in cfg.undecided() {
        let Scope::Selector(sel) = &channel.scope else {
            continue;
        };
        if let Some(&n) = by_selector.get(sel.as_str()) {
            counts.insert(channel.name.clone(), n);
            continue;
        }
        match count_namespaces(client, sel).await {
            Ok(n) => {
                by_selector.insert(sel, n);
                counts.insert(channel.name.clone(), n);
            }
            Err(e) => {
                tracing::warn!(channel = %channel.name, error = %e, "counting the selector's namespaces failed; relaying it per namespace");
            }
        }
    }
    counts
}

async fn count_namespaces(client: &kube::Client, selector: &str) -> Result<usize, kube::Error> {
    kubeapi::namespaces(client, selector, None)
        .await
        .map(|n| n.len())
}

/// The namespaces each of `channels` holds now (every namespace, or its selector's), by
/// channel; a channel whose list failed is left out (its streams then relist at a shape
/// switch), with a warning.
pub(super) async fn scope_namespaces(
    client: &kube::Client,
    channels: &[&Channel],
) -> HashMap<String, ScopeNow> {
    let mut found = HashMap::new();
    for channel in channels {
        let selector = match &channel.scope {
            Scope::Selector(sel) => sel.as_str(),
            _ => "",
        };
        match kubeapi::namespaces(client, selector, None).await {
            Ok(namespaces) => {
                let now = ScopeNow {
                    namespaces,
                    ..ScopeNow::default()
                };
                found.insert(channel.name.clone(), now);
            }
            Err(e) => {
                tracing::warn!(channel = %channel.name, error = %e, "listing the namespaces of a channel that changed shape failed; its streams relist");
            }
        }
    }
    found
}

/// Of `namespaces`, those holding none of `channel`'s objects (under its label and field
/// selectors) at or below resourceVersion `above`: each object they hold changed after it, so
/// a watch from it shows each one. Without `above`, those holding none at all: one list of at
/// most one object each. With it, their objects are listed page by page until one at or below
/// it (or whose version does not compare). A namespace whose list fails is taken for one that
/// holds some.
pub(super) async fn unseen_namespaces(
    client: &kube::Client,
    channel: &Channel,
    namespaces: &[String],
    above: Option<u64>,
) -> BTreeSet<String> {
    #[derive(serde::Deserialize)]
    struct Item {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(rename = "resourceVersion", default)]
        resource_version: String,
    }
    // Whether the watch from `above` would not show `item` as it is now.
    let seen = |item: &serde_json::value::RawValue| {
        let Some(above) = above else { return true };
        let rv = serde_json::from_str::<Item>(item.get()).ok();
        let rv = rv.and_then(|i| comparable(&i.metadata.resource_version));
        rv.is_none_or(|rv| rv <= above)
    };
    let query = Query {
        label_selector: channel.label_selector.as_deref(),
        field_selector: channel.field_selector.as_deref(),
        shard_selector: None,
    };
    let limit = if above.is_some() { 500 } else { 1 };
    let mut unseen = BTreeSet::new();
    'namespaces: for ns in namespaces {
        let path = channel.path.collection_url(Some(ns));
        let mut token: Option<String> = None;
        loop {
            match kubeapi::list_page(client, &path, &query, Some(limit), token.as_deref()).await {
                Ok(page) if page.items.iter().any(|i| seen(i)) => continue 'namespaces,
                // A filtered page may come back empty with more to read: only the end counts.
                Ok(page) => match page.continue_token {
                    Some(c) => token = Some(c),
                    None => {
                        unseen.insert(ns.clone());
                        continue 'namespaces;
                    }
                },
                Err(e) => {
                    tracing::warn!(channel = %channel.name, namespace = %ns, error = %e, "reading whether a namespace without a stream holds objects the gathered position does not show failed; taken for one that does");
                    continue 'namespaces;
                }
            }
        }
    }
    unseen
}
