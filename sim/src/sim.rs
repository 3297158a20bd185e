//! The [`Sim`] handle: starting a simulator, reaching it (URL, CA, kubeconfig), changing and
//! reading its objects, its journal and snapshots, and shutdown. Fault injection is in `faults`,
//! churn in `churn`, the state the handle shares with the server in `state`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::requests::{RequestCounts, Requests};
use crate::resources::{self, Resource};
use crate::server;
use crate::state::{Faults, Inner};
use crate::store::{JournalEntry, Snapshot, Store};
use crate::tls::Tls;
use crate::{SimConfig, SimError};

/// Handle to a running simulator; cheap to clone.
#[derive(Clone)]
pub struct Sim {
    pub(crate) inner: Arc<Inner>,
    addr: SocketAddr,
}

impl Sim {
    /// Starts a simulator serving `cfg` on loopback (or `cfg.addr`), with the built-in resources.
    pub async fn start(cfg: SimConfig) -> Result<Sim, SimError> {
        let listener = tokio::net::TcpListener::bind(
            cfg.addr
                .unwrap_or_else(|| "127.0.0.1:0".parse().expect("valid")),
        )
        .await
        .map_err(|e| SimError::new(500, "Bind", e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| SimError::new(500, "Bind", e.to_string()))?;
        let tls = if cfg.tls {
            Some(Tls::self_signed().map_err(|e| SimError::new(500, "Tls", e))?)
        } else {
            None
        };
        let inner = Arc::new(Inner {
            store: Mutex::new(Store::new(
                resources::builtin(),
                cfg.history_limit,
                cfg.journal_limit,
            )),
            faults: Faults::default(),
            cfg,
            watches: Mutex::new(CancellationToken::new()),
            shutdown: CancellationToken::new(),
            tls,
            requests: Requests::default(),
        });
        tokio::spawn(server::serve(listener, inner.clone()));
        Ok(Sim { inner, addr })
    }

    /// The server's base URL, `http://` or `https://` with the bound address.
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The self-signed certificate clients must trust, in PEM; `None` without TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.inner.tls.as_ref().map(|t| t.cert_pem.clone())
    }

    /// A kubeconfig for `kubectl` and the `kube` crate: this server, its CA and its token.
    pub fn kubeconfig_yaml(&self) -> String {
        let ca = match self.ca_pem() {
            Some(pem) => format!(
                "    certificate-authority-data: {}\n",
                base64(pem.as_bytes())
            ),
            None => String::new(),
        };
        let user = match &self.inner.cfg.token {
            Some(t) => format!("    token: {t}\n"),
            None => "    {}\n".to_string(),
        };
        let user = if user.trim() == "{}" {
            "  user: {}\n".to_string()
        } else {
            format!("  user:\n{user}")
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n{ca}contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n{user}",
            self.url()
        )
    }

    /// Writes [`Sim::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.inner.store.lock().expect("store lock poisoned")
    }

    /// Creates `obj` as the API server does (uid, resourceVersion, `generateName`); 409 if taken.
    pub fn create(
        &self,
        resource: &str,
        namespace: Option<&str>,
        obj: Value,
    ) -> Result<Value, SimError> {
        self.store()
            .create(resource, namespace, obj)
            .map(|v| (*v).clone())
    }

    /// Replaces an object; a `metadata.resourceVersion` in `obj` must match the current one (409).
    pub fn update(
        &self,
        resource: &str,
        namespace: Option<&str>,
        obj: Value,
    ) -> Result<Value, SimError> {
        self.store()
            .update(resource, namespace, obj)
            .map(|v| (*v).clone())
    }

    /// Applies an RFC 7386 merge patch to object `name`, as `kubectl patch --type merge` does.
    pub fn merge_patch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
    ) -> Result<Value, SimError> {
        self.store()
            .merge_patch(resource, namespace, name, &patch)
            .map(|v| (*v).clone())
    }

    /// Deletes object `name`, returning its last state at the deletion's resourceVersion.
    pub fn delete(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, SimError> {
        self.store()
            .delete(resource, namespace, name)
            .map(|v| (*v).clone())
    }

    /// The current state of object `name`; `None` when it does not exist.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.store()
            .get(resource, namespace, name)
            .map(|v| (*v).clone())
    }

    /// Every current object of `resource` (in `namespace`, or all), by namespace and name.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.store()
            .state_at(resource, namespace, None)
            .unwrap_or_default()
            .into_iter()
            .map(|v| (*v).clone())
            .collect()
    }

    /// The list and watch requests served so far.
    pub fn requests(&self) -> RequestCounts {
        self.inner.requests.counts()
    }

    /// The requests served so far for `resource` (its plural: `namespaces`, `configmaps`), by
    /// verb (`list`, `watch`, `get`, `create`, `update`, `patch`, `delete`).
    pub fn requests_for(&self, resource: &str) -> std::collections::BTreeMap<&'static str, u64> {
        self.inner.requests.verbs(resource)
    }

    /// Counts requests afresh from now on.
    pub fn reset_requests(&self) {
        self.inner.requests.reset();
    }

    /// The latest resourceVersion: the revision of the last change.
    pub fn current_rv(&self) -> u64 {
        self.store().rv
    }

    /// Drops all history: every watch or list from an earlier resourceVersion gets 410 Expired.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// The keyspace now, as etcd's `snapshot save` takes it.
    pub fn snapshot(&self) -> Snapshot {
        self.store().snapshot()
    }

    /// Restores `snapshot`, as `etcdutl snapshot restore` and an API server restart do: every
    /// object, the revision and the kept history go back to the snapshot's (with `bump`, the
    /// revision moves that far past it and all history is compacted), and every open watch
    /// ends. Kafka, and whatever the relay keeps outside the cluster, are not rewound.
    pub fn restore(&self, snapshot: &Snapshot, bump: Option<u64>) {
        self.store().restore(snapshot, bump);
        self.drop_watches();
    }

    /// Makes a custom resource type appear in discovery and serve requests.
    pub fn register_crd(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
    ) {
        self.register_resource(Resource::new(group, version, plural, kind, namespaced, &[]));
    }

    /// Makes any resource type appear in discovery and serve requests (a CRD with its schema:
    /// `Resource::new(..).with_schema(..)`).
    pub fn register_resource(&self, res: Resource) {
        self.store().register(res);
    }

    /// Every change so far, oldest first (only the newest `journal_limit` when one is set).
    pub fn journal(&self) -> Vec<JournalEntry> {
        self.store().journal.iter().cloned().collect()
    }

    /// Stops serving: every open watch ends and the server accepts no more requests.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.drop_watches();
    }
}

/// Standard base64 with padding, for the kubeconfig's `certificate-authority-data`.
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
