//! The Kubernetes permissions a configuration needs, and no more: `list` and `watch` on each
//! channel's resource, in the namespaces it watches (cluster-wide only for cluster-scoped
//! resources, `allNamespaces` and namespace selectors, both of which also list namespaces, and
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
                    // A switch into it lists the namespaces to resume from the gathered
                    // streams' positions; with sharding its parts follow them.
                    n.cluster.insert((String::new(), "namespaces".into()));
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
                let per_namespace = "namespaceSelector: matching namespaces come and go, so the permission is cluster-wide; watched per namespace";
                let what = match ch.strategy {
                    _ if ch.topic.contains("{namespace}") => {
                        format!("{per_namespace} (the topic names {{namespace}})")
                    }
                    WatchStrategy::PerNamespace => per_namespace.to_string(),
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

/// `needs` as Kubernetes objects that grant it to the service account `namespace/account`, as a
/// `v1` `List` that `kubectl apply -f -` takes: a ClusterRole and its binding for what is read
/// across the cluster, and a Role and its binding in each namespace for what is read there and
/// the relay's own objects (`get` and `update` by name; `create` cannot be limited to names).
/// Every object is named `name`.
pub fn manifests(needs: &Needs, name: &str, namespace: &str, account: &str) -> serde_json::Value {
    use serde_json::json;
    let rule = |(group, resource): &Resource, verbs: &[&str]| json!({"apiGroups": [group], "resources": [resource], "verbs": verbs});
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    let mut items = Vec::new();
    if !needs.cluster.is_empty() {
        let rules: Vec<_> = needs
            .cluster
            .iter()
            .map(|r| rule(r, &["list", "watch"]))
            .collect();
        items.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}),
        );
        items.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject}));
    }
    let namespaces: BTreeSet<&String> = needs.namespaced.keys().chain(needs.own.keys()).collect();
    for ns in namespaces {
        let mut rules: Vec<_> = needs
            .namespaced
            .get(ns)
            .into_iter()
            .flatten()
            .map(|r| rule(r, &["list", "watch"]))
            .collect();
        let mut owned: BTreeMap<Resource, Vec<&str>> = BTreeMap::new();
        for (group, resource, object) in needs.own.get(ns).into_iter().flatten() {
            owned
                .entry((group.clone(), resource.clone()))
                .or_default()
                .push(object);
        }
        for ((group, resource), names) in owned {
            rules.push(json!({"apiGroups": [group], "resources": [resource],
                "resourceNames": names, "verbs": ["get", "update"]}));
            rules.push(rule(&(group, resource), &["create"]));
        }
        items.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": ns}, "rules": rules}),
        );
        items.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subject}),
        );
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The objects grant exactly the needs: list and watch where read, get and update by name
    /// and create for the relay's own, each bound to the account.
    #[test]
    fn manifests_grant_the_needs_to_the_account() {
        let cfg = Config::parse("clusterName: c\nkafka:\n  bootstrapServers: k:1\n  oversize: trim\ncheckpoint:\n  namespace: relay\nleaderElection:\n  enabled: true\nchannels:\n  - operationId: watchNamespacedPods\n    namespaces: [a]\n  - operationId: watchNodes\n").unwrap();
        let list = manifests(&needs(&cfg), "wr", "relay", "sa");
        let items = list["items"].as_array().unwrap();
        let kinds: Vec<(&str, &str)> = items
            .iter()
            .map(|i| {
                (
                    i["kind"].as_str().unwrap(),
                    i["metadata"]["namespace"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("ClusterRole", ""),
                ("ClusterRoleBinding", ""),
                ("Role", "a"),
                ("RoleBinding", "a"),
                ("Role", "relay"),
                ("RoleBinding", "relay")
            ]
        );
        assert_eq!(
            items[0]["rules"],
            serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}])
        );
        assert_eq!(
            items[2]["rules"],
            serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}])
        );
        let own = items[4]["rules"].as_array().unwrap();
        assert!(own.contains(
            &serde_json::json!({"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": [cfg.checkpoint.name], "verbs": ["get", "update"]})
        ));
        assert!(
            own.contains(&serde_json::json!({"apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"], "verbs": ["create"]}))
        );
        for binding in [&items[1], &items[3], &items[5]] {
            assert_eq!(
                binding["subjects"],
                serde_json::json!([{"kind": "ServiceAccount", "name": "sa", "namespace": "relay"}])
            );
        }
    }

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
    fn every_namespace_lists_the_namespaces_with_sharding_or_without() {
        let cfg = Config::parse("clusterName: c\nkafka:\n  bootstrapServers: k:1\n  oversize: trim\ncheckpoint:\n  namespace: relay\nchannels:\n  - operationId: watchNamespacedPods\n    allNamespaces: true\n  - operationId: watchNodes\n").unwrap();
        let r = |g: &str, res: &str| (g.to_string(), res.to_string());
        assert_eq!(
            needs(&cfg).cluster,
            BTreeSet::from([r("", "pods"), r("", "nodes"), r("", "namespaces")])
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
