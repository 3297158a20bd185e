//! The built-in channel catalogue and the parsing of watch path templates.
//!
//! Every channel of the two AsyncAPI documents the product was specified from is listed here,
//! addressed by its operationId. Custom channels use the same [`ChannelPath`] parser, so a CRD
//! path behaves exactly like a built-in one.

use thiserror::Error;

/// A watch path template such as `/api/v1/namespaces/{namespace}/pods`, split into the parts the
/// API needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelPath {
    /// The template as written, used as the envelope's `channel`.
    pub template: String,
    /// Empty for the core group.
    pub group: String,
    /// The API version, e.g. `v1` or `v1beta1`.
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    pub resource: String,
    /// Whether the template contains `{namespace}`.
    pub namespaced: bool,
}

/// A watch path template that is neither a core nor a group collection path.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PathError {
    /// The template, as written, does not have one of the two shapes.
    #[error("path {0:?} must look like /api/v1/[namespaces/{{namespace}}/]RESOURCE or /apis/GROUP/VERSION/[namespaces/{{namespace}}/]RESOURCE")]
    Shape(String),
}

impl ChannelPath {
    /// Splits `template` into its parts; `{namespace}` is the only placeholder it may hold.
    pub fn parse(template: &str) -> Result<Self, PathError> {
        let bad = || PathError::Shape(template.to_string());
        let parts: Vec<&str> = template.trim_end_matches('/').split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            ["", "api", v, rest @ ..] => ("", *v, rest),
            ["", "apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Err(bad()),
        };
        let (namespaced, resource) = match rest {
            [r] => (false, *r),
            ["namespaces", "{namespace}", r] => (true, *r),
            _ => return Err(bad()),
        };
        let ok = |s: &str| !s.is_empty() && !s.contains(['{', '}', '?', ' ']);
        if !ok(version) || !ok(resource) || (!group.is_empty() && !ok(group)) {
            return Err(bad());
        }
        Ok(Self {
            template: template.to_string(),
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            namespaced,
        })
    }

    /// `v1` or `apps/v1`, as in an object's apiVersion.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The concrete collection URL for one namespace, or the cluster-wide collection when
    /// `namespace` is `None` (which for a namespaced resource lists across all namespaces).
    pub fn collection_url(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => {
                format!("{}/namespaces/{}/{}", self.prefix(), ns, self.resource)
            }
            _ => format!("{}/{}", self.prefix(), self.resource),
        }
    }

    /// `pods` or `deployments.apps`: the usual short form for logs, metrics and topics.
    pub fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// One catalogue entry.
#[derive(Clone, Copy, Debug)]
pub struct CatalogueEntry {
    /// The AsyncAPI operationId a configuration names the channel by, e.g. `watchAllPods`.
    pub operation_id: &'static str,
    /// The watch path template, as [`ChannelPath::parse`] reads it.
    pub path: &'static str,
    /// The AsyncAPI message name the channel publishes.
    pub message: &'static str,
    /// The kind of the objects it carries: what an object the relay writes without a watch
    /// line (an inferred DELETED) says it is.
    pub kind: &'static str,
}

/// Every channel of both AsyncAPI documents. Where a channel appears in both documents
/// (`watchNamespacedServices`), the more specific message name wins.
pub const CATALOGUE: &[CatalogueEntry] = &[
    e("watchAllPods", "/api/v1/pods", "WatchEvent", "Pod"),
    e(
        "watchNamespacedPods",
        "/api/v1/namespaces/{namespace}/pods",
        "WatchEvent",
        "Pod",
    ),
    e(
        "watchNamespacedDeployments",
        "/apis/apps/v1/namespaces/{namespace}/deployments",
        "WatchEvent",
        "Deployment",
    ),
    e(
        "watchNamespacedServices",
        "/api/v1/namespaces/{namespace}/services",
        "ServiceWatchEvent",
        "Service",
    ),
    e(
        "watchAllServices",
        "/api/v1/services",
        "ServiceWatchEvent",
        "Service",
    ),
    e("watchNodes", "/api/v1/nodes", "WatchEvent", "Node"),
    e(
        "watchNamespaces",
        "/api/v1/namespaces",
        "WatchEvent",
        "Namespace",
    ),
    e(
        "watchNamespacedEvents",
        "/apis/events.k8s.io/v1/namespaces/{namespace}/events",
        "WatchEvent",
        "Event",
    ),
    e(
        "watchNamespacedIngresses",
        "/apis/networking.k8s.io/v1/namespaces/{namespace}/ingresses",
        "IngressWatchEvent",
        "Ingress",
    ),
    e(
        "watchNamespacedEndpointSlices",
        "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        "EndpointSliceWatchEvent",
        "EndpointSlice",
    ),
    e(
        "watchNamespacedNetworkPolicies",
        "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
        "NetworkPolicyWatchEvent",
        "NetworkPolicy",
    ),
    e(
        "watchNamespacedGateways",
        "/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/gateways",
        "GatewayWatchEvent",
        "Gateway",
    ),
    e(
        "watchNamespacedHTTPRoutes",
        "/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes",
        "HTTPRouteWatchEvent",
        "HTTPRoute",
    ),
];

const fn e(
    operation_id: &'static str,
    path: &'static str,
    message: &'static str,
    kind: &'static str,
) -> CatalogueEntry {
    CatalogueEntry {
        operation_id,
        path,
        message,
        kind,
    }
}

/// The built-in channel with that operationId, or None for one outside the catalogue.
pub fn lookup(operation_id: &str) -> Option<&'static CatalogueEntry> {
    CATALOGUE.iter().find(|c| c.operation_id == operation_id)
}

/// The kind of a built-in resource (`plural[.group]`), or None for one outside the catalogue.
pub fn kind_of(resource_name: &str) -> Option<&'static str> {
    CATALOGUE
        .iter()
        .find(|c| ChannelPath::parse(c.path).is_ok_and(|p| p.resource_name() == resource_name))
        .map(|c| c.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_path_parses() {
        for c in CATALOGUE {
            let p = ChannelPath::parse(c.path).unwrap();
            assert_eq!(p.namespaced, c.path.contains("{namespace}"), "{}", c.path);
        }
    }

    #[test]
    fn parses_group_and_core_paths() {
        let p = ChannelPath::parse("/apis/apps/v1/namespaces/{namespace}/deployments").unwrap();
        assert_eq!(
            (p.group.as_str(), p.version.as_str(), p.resource.as_str()),
            ("apps", "v1", "deployments")
        );
        assert_eq!(
            p.collection_url(Some("a")),
            "/apis/apps/v1/namespaces/a/deployments"
        );
        assert_eq!(p.collection_url(None), "/apis/apps/v1/deployments");
        assert_eq!(p.resource_name(), "deployments.apps");
        let n = ChannelPath::parse("/api/v1/nodes").unwrap();
        assert!(!n.namespaced);
        assert_eq!(n.collection_url(Some("ignored")), "/api/v1/nodes");
        assert_eq!(n.api_version(), "v1");
    }

    #[test]
    fn rejects_malformed_paths() {
        for bad in [
            "",
            "/api",
            "/api/v1/namespaces/x/pods",
            "/apis/apps/v1/{namespace}/x",
            "pods",
            "/apis/g/v1/a/b/c",
        ] {
            assert!(ChannelPath::parse(bad).is_err(), "{bad}");
        }
    }
}
