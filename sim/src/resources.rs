//! The resource types the simulator serves, built in and registered at run time.

/// One resource type, as discovery describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Empty for the core group.
    pub group: String,
    /// The API version within the group, e.g. `v1`.
    pub version: String,
    /// The plural name in URLs, e.g. `deployments`.
    pub plural: String,
    /// The singular name `kubectl` accepts, e.g. `deployment`.
    pub singular: String,
    /// The objects' `kind`, e.g. `Deployment`.
    pub kind: String,
    /// Whether its objects live in namespaces (served under `/namespaces/{namespace}/`).
    pub namespaced: bool,
    /// Abbreviations discovery lists for `kubectl`, e.g. `deploy`.
    pub short_names: Vec<String>,
    /// The object schema a CRD declares (`openAPIV3Schema`); built-in kinds get a generic one.
    pub schema: Option<serde_json::Value>,
}

impl Resource {
    /// A resource without a schema of its own; its singular is `kind` in lower case.
    pub fn new(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        short: &[&str],
    ) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            schema: None,
        }
    }

    /// This resource with the object schema a CRD declares (`openAPIV3Schema`).
    pub fn with_schema(mut self, schema: serde_json::Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// `pods` or `deployments.apps`.
    pub fn key(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The key of its group-version in `/openapi/v3`: `api/v1` or `apis/{group}/{version}`.
    pub fn openapi_path(&self) -> String {
        if self.group.is_empty() {
            format!("api/{}", self.version)
        } else {
            format!("apis/{}/{}", self.group, self.version)
        }
    }

    /// Its schema's name in the OpenAPI document, named as the API server names them:
    /// `io.k8s.api.{group}.{version}.{Kind}` for built-in groups, the reversed group otherwise.
    pub fn schema_name(&self) -> String {
        let group = match self.group.as_str() {
            "" => "io.k8s.api.core".to_string(),
            g if !g.contains('.') => format!("io.k8s.api.{g}"),
            g => match g.strip_suffix(".k8s.io") {
                Some(short) if !short.contains('.') => format!("io.k8s.api.{short}"),
                _ => g.split('.').rev().collect::<Vec<_>>().join("."),
            },
        };
        format!("{group}.{}.{}", self.version, self.kind)
    }

    /// `v1` or `apps/v1`, as its objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The built-in resources every simulator serves from the start.
pub fn builtin() -> Vec<Resource> {
    let r = Resource::new;
    vec![
        r("", "v1", "pods", "Pod", true, &["po"]),
        r("", "v1", "services", "Service", true, &["svc"]),
        r("", "v1", "nodes", "Node", false, &["no"]),
        r("", "v1", "namespaces", "Namespace", false, &["ns"]),
        r("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
        r("", "v1", "secrets", "Secret", true, &[]),
        r("events.k8s.io", "v1", "events", "Event", true, &["ev"]),
        r("apps", "v1", "deployments", "Deployment", true, &["deploy"]),
        r(
            "networking.k8s.io",
            "v1",
            "ingresses",
            "Ingress",
            true,
            &["ing"],
        ),
        r(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
        ),
        r(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
        ),
        r(
            "gateway.networking.k8s.io",
            "v1",
            "gateways",
            "Gateway",
            true,
            &["gtw"],
        ),
        r(
            "gateway.networking.k8s.io",
            "v1",
            "httproutes",
            "HTTPRoute",
            true,
            &[],
        ),
        r("coordination.k8s.io", "v1", "leases", "Lease", true, &[]),
        r(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
        ),
    ]
}
