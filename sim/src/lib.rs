//! watchrelay-sim: a Kubernetes API server simulator for tests, benchmarks and demos.
//!
//! It serves the Kubernetes HTTP API on loopback following the API concepts documentation
//! (one resourceVersion counter, history replay, 410 Expired as an in-stream ERROR event,
//! bookmarks, `sendInitialEvents`, pagination with consistent snapshots, optimistic concurrency),
//! so that real clients (`kubectl`, the `kube` crate) work against it. Tests drive it through
//! [`Sim`]: they change objects, inject faults and read the journal of every change.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

mod churn;
pub mod objects;
mod openapi;
mod requests;
pub mod resources;
pub mod selector;
mod server;
mod store;
mod watch;

pub use churn::{ChurnHandle, ChurnSpec};

/// The body of every response: whole documents and watch streams alike.
pub(crate) type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;
pub use requests::RequestCounts;
pub use resources::Resource;
pub use store::Snapshot;
use store::Store;

/// An API error, shaped like a Kubernetes `Status`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{code} {reason}: {message}")]
pub struct SimError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// The Status's `details`: what object the error is about, as the API server says it.
    pub details: Option<Value>,
}

impl SimError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }
    /// The error concerns object `name` of `resource` (`plural[.group]`): the details the API
    /// server gives NotFound, AlreadyExists and Conflict.
    pub fn about(mut self, resource: &str, name: &str) -> Self {
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        let mut details = json!({"name": name, "kind": plural});
        if !group.is_empty() {
            details["group"] = group.into();
        }
        self.details = Some(details);
        self
    }
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} {name:?} not found")).about(resource, name)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn expired(rv: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// A fault for the next requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 500 Internal Server Error.
    ServerError,
    /// 429 Too Many Requests with a Retry-After header.
    TooManyRequests { retry_after_secs: u32 },
}

/// One change as it happened: the ground truth tests compare against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    pub rv: u64,
    /// ADDED, MODIFIED or DELETED.
    pub event_type: String,
    pub uid: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// `plural[.group]`.
    pub resource: String,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Serve HTTPS with a self-signed certificate.
    pub tls: bool,
    /// Require this bearer token (401 otherwise).
    pub token: Option<String>,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Changes kept for watch replay and old lists; older ones are compacted.
    pub history_limit: usize,
    /// Journal entries kept ([`Sim::journal`]); the oldest are dropped past it. `None` keeps
    /// every one, as tests that compare against the whole journal need.
    pub journal_limit: Option<usize>,
    pub addr: Option<SocketAddr>,
    /// Serve `sendInitialEvents` watches (the WatchList feature). Off, such a watch is refused
    /// with 422, as by an API server with the feature gate disabled.
    pub watch_list: bool,
    /// How long each list request takes to answer (zero: at once), so tests can see how many
    /// run at once.
    pub list_delay: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            tls: false,
            token: None,
            bookmark_interval: Duration::from_secs(1),
            history_limit: 200_000,
            journal_limit: None,
            addr: None,
            watch_list: true,
            list_delay: Duration::ZERO,
        }
    }
}

/// Faults armed by tests, consumed by the server.
#[derive(Default)]
pub(crate) struct Faults {
    pub fail: Mutex<Option<(usize, Fault)>>,
    pub cut_line: AtomicBool,
    pub stall_watch: AtomicBool,
    pub malformed: AtomicBool,
    pub denied: Mutex<Vec<String>>,
    /// List requests with a continue token still to fail (500).
    pub fail_continued: AtomicUsize,
}

pub(crate) struct Inner {
    pub store: Mutex<Store>,
    pub faults: Faults,
    pub cfg: SimConfig,
    /// Cancelled to drop every open watch; replaced by a fresh token afterwards.
    pub watches: Mutex<CancellationToken>,
    pub shutdown: CancellationToken,
    pub tls: Option<server::Tls>,
    pub requests: requests::Requests,
}

/// Handle to a running simulator; cheap to clone.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl Sim {
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
            Some(server::Tls::self_signed().map_err(|e| SimError::new(500, "Tls", e))?)
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
            requests: requests::Requests::default(),
        });
        tokio::spawn(server::serve(listener, inner.clone()));
        Ok(Sim { inner, addr })
    }

    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    pub fn ca_pem(&self) -> Option<String> {
        self.inner.tls.as_ref().map(|t| t.cert_pem.clone())
    }

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

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.inner.store.lock().expect("store lock poisoned")
    }

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

    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.store()
            .get(resource, namespace, name)
            .map(|v| (*v).clone())
    }

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

    /// Counts requests afresh from now on.
    pub fn reset_requests(&self) {
        self.inner.requests.reset();
    }

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

    /// Ends every open watch cleanly, as an API server restart or a load balancer would.
    pub fn drop_watches(&self) {
        let mut w = self.inner.watches.lock().expect("watches lock poisoned");
        w.cancel();
        *w = CancellationToken::new();
    }

    /// Fails the next `n` list requests that carry a continue token (a later page), with 500.
    pub fn fail_next_pages(&self, n: usize) {
        self.inner.faults.fail_continued.store(n, Ordering::Relaxed);
    }

    /// Fails the next `n` resource requests (discovery and `/version` are spared).
    pub fn fail_next(&self, n: usize, fault: Fault) {
        *self.inner.faults.fail.lock().expect("faults lock poisoned") = Some((n, fault));
    }

    /// How many of the failures armed by [`Sim::fail_next`] are still to be served.
    pub fn pending_failures(&self) -> usize {
        self.inner
            .faults
            .fail
            .lock()
            .expect("faults lock poisoned")
            .map_or(0, |(n, _)| n)
    }

    /// The next event line written on any watch is cut in half and the connection aborted.
    pub fn cut_next_watch_line(&self) {
        self.inner.faults.cut_line.store(true, Ordering::SeqCst);
    }

    /// The next event written on any watch is preceded by a line that is not JSON.
    /// The next watch is accepted and then sends nothing at all, no event and no bookmark, as
    /// over a half-open connection, until the client gives up on it.
    pub fn stall_next_watch(&self) {
        self.inner.faults.stall_watch.store(true, Ordering::SeqCst);
    }

    pub fn inject_malformed_line(&self) {
        self.inner.faults.malformed.store(true, Ordering::SeqCst);
    }

    /// Requests for `resource` (`plural[.group]`) get 403 Forbidden from now on.
    pub fn deny(&self, resource: &str) {
        self.inner
            .faults
            .denied
            .lock()
            .expect("faults lock poisoned")
            .push(resource.to_string());
    }

    /// Lifts [`Sim::deny`] for `resource`.
    pub fn allow(&self, resource: &str) {
        self.inner
            .faults
            .denied
            .lock()
            .expect("faults lock poisoned")
            .retain(|r| r != resource);
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

    pub fn journal(&self) -> Vec<JournalEntry> {
        self.store().journal.iter().cloned().collect()
    }

    pub fn start_churn(&self, spec: ChurnSpec) -> ChurnHandle {
        churn::start(self.clone(), spec)
    }

    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.drop_watches();
    }
}

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
