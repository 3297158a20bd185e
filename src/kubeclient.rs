//! The Kubernetes client the relay runs with, built one way for the binary and the tests: every
//! request bounded in time, the client's own retries off.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use thiserror::Error;

use crate::config::KubernetesConfig;

/// Why no Kubernetes client could be built. Each message says what failed and leaves the
/// cause to its source: print the chain (`{:#}` of an `anyhow::Error`).
#[derive(Debug, Error)]
pub enum ClientError {
    /// The kubeconfig file `kubernetes.kubeconfig` names cannot be read or parsed.
    #[error("reading kubernetes.kubeconfig {path}")]
    Kubeconfig {
        /// The file, as configured.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        source: KubeconfigError,
    },
    /// The kubeconfig, or the context `kubernetes.context` names in it, cannot be used.
    #[error("loading the kubeconfig")]
    Config(#[from] KubeconfigError),
    /// Neither an in-cluster service account nor a kubeconfig was found or usable.
    #[error("finding the cluster (in-cluster service account, $KUBECONFIG, ~/.kube/config)")]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration was found, but the client could not be built from it (TLS, say).
    #[error("building the client")]
    Client(#[from] kube::Error),
}

/// A client of the cluster `k` names: its kubeconfig (and context) when set, else the in-cluster
/// service account, then `$KUBECONFIG` / `~/.kube/config`.
pub async fn connect(k: &KubernetesConfig) -> Result<kube::Client, ClientError> {
    let options = KubeConfigOptions {
        context: k.context.clone(),
        ..Default::default()
    };
    let config = match &k.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if k.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    build(config, k)
}

/// A client of the API server at `url`, without credentials (a local server, the simulator).
pub fn at(url: http::Uri, k: &KubernetesConfig) -> Result<kube::Client, ClientError> {
    build(kube::Config::new(url), k)
}

fn build(mut config: kube::Config, k: &KubernetesConfig) -> Result<kube::Client, ClientError> {
    // Every request is bounded: connecting, sending, and any silence while reading a response
    // (a watch sends a bookmark about every minute; its own idle timeout acts first).
    config.connect_timeout = Some(Duration::from_secs(10));
    config.write_timeout = Some(Duration::from_secs(30));
    config.read_timeout = Some(Duration::from_secs(
        u64::from(k.watch_idle_timeout_seconds) + 30,
    ));
    // The relay retries itself, with its own backoff, counted in its metrics: the client's
    // built-in retries of 429/503/504 (up to 15, backing off up to 1000 s) would hide errors
    // and stall a stream on a position the server will never reach.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Where a client is built from, for a part of the relay that builds its own on a runtime of
/// its own (the API server's reachability probe): a client is bound to the runtime it was built
/// on, and a busy runtime must not slow its probe.
#[derive(Clone, Debug)]
pub enum Target {
    /// As [`connect`] finds the cluster `kubernetes` names.
    Configured(KubernetesConfig),
    /// As [`at`] reaches `url`.
    At(http::Uri, KubernetesConfig),
}

impl Target {
    /// A client of this target.
    pub async fn connect(&self) -> Result<kube::Client, ClientError> {
        match self {
            Target::Configured(k) => connect(k).await,
            Target::At(url, k) => at(url.clone(), k),
        }
    }
}
