//! The Kubernetes permissions a configuration needs, and no more: `list` and `watch` on each
//! channel's resource, in the namespaces it watches (cluster-wide only for cluster-scoped
//! resources, `allNamespaces`, namespace selectors, which also watch namespaces, and
//! `namespaces` lists watched cluster-wide by their watch strategy), and read and update of the
//! relay's own checkpoint ConfigMap and Lease by name.
//!
//! `watchrelay rbac` prints it; the chart's RBAC is checked against it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::Config;
use crate::config::{Scope, Shape, WatchStrategy};

/// One resource the relay lists and watches: `(apiGroup, resource)`.
pub type Resource = (String, String);

/// The permissions a configuration needs, as `watchrelay rbac` prints them.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Needs {
    /// Resources listed and watched across the cluster.
    pub cluster: BTreeSet<Resource>,
    /// Resources listed and watched in one namespace each.
    pub namespaced: BTreeMap<String, BTreeSet<Resource>>,
    /// Objects read and updated by name (`get`, `update`; `create` when missing), per
    /// namespace: the checkpoint ConfigMap and the Lease.
    pub own: BTreeMap<String, BTreeSet<(String, String, String)>>,
    /// The channels that read their resource across the cluster, and why.
    pub cluster_wide: BTreeMap<String, String>,
}

/// What `cfg` needs.
pub fn needs(cfg: &Config) -> Needs {
    let mut n = Needs::default();
    let threshold = cfg.kubernetes.cluster_wide_above as usize;
    for ch in &cfg.channels {
        let res = (ch.path.group.clone(), ch.path.resource.clone());
        let why = |n: &mut Needs, why: String| {
            n.cluster_wide.insert(ch.name.clone(), why);
        };
        match &ch.scope {
            Scope::Cluster => {
                n.cluster.insert(res);
                let what = if ch.path.namespaced {
                    "allNamespaces"
                } else {
                    "a cluster-scoped resource"
                };
                why(&mut n, what.into());
            }
            Scope::Namespaces(list)
                if ch.shape(list.len(), None, threshold) == Some(Shape::ClusterWide) =>
            {
                n.cluster.insert(res);
                let what = match ch.strategy {
                    WatchStrategy::ClusterWide => "watchStrategy: clusterWide".to_string(),
                    _ => format!("watchStrategy: auto, {} namespaces listed, over kubernetes.clusterWideAbove ({threshold})", list.len()),
                };
                why(&mut n, what);
            }
            Scope::Namespaces(list) => {
                for ns in list {
                    n.namespaced
                        .entry(ns.clone())
                        .or_default()
                        .insert(res.clone());
                }
            }
            Scope::Selector(_) => {
                n.cluster.insert(res);
                n.cluster.insert((String::new(), "namespaces".into()));
                let what = match ch.strategy {
                    WatchStrategy::PerNamespace => "namespaceSelector: matching namespaces come and go, so the permission is cluster-wide; watched per namespace".to_string(),
                    WatchStrategy::ClusterWide => "namespaceSelector, watchStrategy: clusterWide".to_string(),
                    WatchStrategy::Auto => format!("namespaceSelector, watchStrategy: auto (a first start watches cluster-wide above {threshold} matching namespaces; later starts keep their shape)"),
                };
                why(&mut n, what);
            }
        }
    }
    // A fanned-out collection of namespaced objects is asked of a server that filters by
    // shard for the namespaces of the replica's shards, which it follows.
    if cfg.sharding.enabled
        && cfg.sharding.server_ranges
        && cfg
            .channels
            .iter()
            .any(|ch| ch.path.namespaced && n.cluster_wide.contains_key(&ch.name))
    {
        n.cluster.insert((String::new(), "namespaces".into()));
    }
    n.own
        .entry(cfg.checkpoint.namespace.clone())
        .or_default()
        .insert((
            String::new(),
            "configmaps".into(),
            cfg.checkpoint.name.clone(),
        ));
    // Each shard's positions are in a ConfigMap of its own.
    if cfg.sharding.enabled {
        let own = n.own.entry(cfg.checkpoint.namespace.clone()).or_default();
        for name in cfg.sharding.configmaps(&cfg.checkpoint.name) {
            own.insert((String::new(), "configmaps".into(), name));
        }
    }
    let le = &cfg.leader_election;
    // A sharded release parks the Lease of the single leader it may have been.
    if le.enabled || cfg.sharding.enabled {
        n.own
            .entry(cfg.lease_namespace().to_string())
            .or_default()
            .insert((
                "coordination.k8s.io".into(),
                "leases".into(),
                le.name.clone(),
            ));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scope_gets_exactly_what_it_watches() {
        let cfg = Config::parse("clusterName: c\nkafka:\n  bootstrapServers: k:1\n  oversize: trim\ncheckpoint:\n  namespace: relay\nleaderElection:\n  enabled: true\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n  - operationId: watchNodes\n  - operationId: watchNamespacedDeployments\n    namespaceSelector: team=x\n  - path: /apis/example.com/v1/namespaces/{namespace}/widgets\n    name: widgets\n    namespaces: [a]\n").unwrap();
        let n = needs(&cfg);
        let r = |g: &str, res: &str| (g.to_string(), res.to_string());
        assert_eq!(
            n.cluster,
            BTreeSet::from([
                r("", "nodes"),
                r("apps", "deployments"),
                r("", "namespaces")
            ])
        );
        assert_eq!(
            n.namespaced["a"],
            BTreeSet::from([r("", "pods"), r("example.com", "widgets")])
        );
        assert_eq!(n.namespaced["b"], BTreeSet::from([r("", "pods")]));
        assert_eq!(n.own["relay"].len(), 2);
        assert_eq!(
            n.cluster_wide.keys().collect::<Vec<_>>(),
            ["watchNamespacedDeployments", "watchNodes"],
            "each channel that reads cluster-wide is named, with why"
        );
    }

    #[test]
    fn a_namespaces_list_watched_cluster_wide_needs_the_cluster_wide_collection() {
        let cfg = Config::parse("clusterName: c\nkafka:\n  bootstrapServers: k:1\n  oversize: trim\ncheckpoint:\n  namespace: relay\nkubernetes:\n  clusterWideAbove: 2\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a, b, c]\n  - operationId: watchNamespacedServices\n    namespaces: [a, b, c]\n    watchStrategy: perNamespace\n  - operationId: watchNamespacedDeployments\n    namespaces: [a]\n    watchStrategy: clusterWide\n").unwrap();
        let n = needs(&cfg);
        let r = |g: &str, res: &str| (g.to_string(), res.to_string());
        assert_eq!(
            n.cluster,
            BTreeSet::from([r("", "pods"), r("apps", "deployments")])
        );
        assert_eq!(n.namespaced["c"], BTreeSet::from([r("", "services")]));
        assert!(
            n.cluster_wide["watchNamespacedPods"].contains("3 namespaces listed"),
            "{:?}",
            n.cluster_wide
        );
    }
}
