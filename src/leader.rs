//! Leader election over a `coordination.k8s.io/v1` Lease, so that a standby replica can take
//! over within seconds instead of waiting for a new pod.
//!
//! The protocol is the one Kubernetes components use with Leases:
//! - the holder writes `renewTime` every retry period;
//! - a candidate takes the Lease over once it has seen no change to it for the holder's
//!   `leaseDurationSeconds`, timed on the candidate's own clock (from when it first saw the
//!   current version), so clock skew between nodes does not matter;
//! - every write carries the resourceVersion it read, so of two candidates only one wins (409).
//!
//! A leader that cannot renew within `renewDeadlineSeconds` stops relaying (and stands by again), and that deadline is
//! shorter than the lease duration: the old leader has stopped reading its watches before a
//! standby may start. What the old leader had in flight is still acknowledged or replayed, and a
//! checkpoint either replica writes covers only what Kafka acknowledged, so a handover can
//! duplicate events but not lose them.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{SHARDING_ANNOTATION, SHARD_OWNERS_ANNOTATION};
use crate::config::{Config, LeaderElectionConfig};

/// What one attempt on the Lease found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease (acquired or renewed).
    Leading,
    /// Another replica holds it and has renewed it recently enough.
    Following(String),
    /// The write lost a race (409) or the API failed: try again.
    Retry(String),
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    /// The Lease version last seen and when it was first seen.
    observed: Option<(String, Instant)>,
    /// When the last successful acquisition or renewal was *sent*: a standby times the Lease
    /// from when it saw the write, which is later, so the leader's deadline runs out first.
    renewed: Instant,
}

/// This replica's name in the Lease: a prefix (the configured identity, else the pod or host
/// name) and a per-process suffix. The suffix is never left out: replicas share one
/// configuration, and a restarted process must not mistake its predecessor's Lease for its own.
pub fn identity(cfg: &LeaderElectionConfig) -> String {
    let prefix = cfg
        .identity
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "watchrelay".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!("{prefix}_{:x}{nanos:08x}", std::process::id())
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, cfg: &LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: cfg.name.clone(),
            identity: identity(cfg),
            lease_duration: Duration::from_secs(cfg.lease_duration_seconds.into()),
            renew_deadline: Duration::from_secs(cfg.renew_deadline_seconds.into()),
            retry_period: Duration::from_secs(cfg.retry_period_seconds.into()),
            observed: None,
            renewed: Instant::now(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    async fn attempt(&mut self) -> Attempt {
        let lease = match self.api.get_opt(&self.name).await {
            Ok(lease) => lease,
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        let Some(mut lease) = lease else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return self.write(self.api.create(&PostParams::default(), &lease).await);
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_at = match &self.observed {
            Some((v, at)) if *v == version => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((version, at));
                at
            }
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() {
            let duration = spec
                .lease_duration_seconds
                .map_or(
                    self.lease_duration,
                    |s| Duration::from_secs(s.max(0) as u64),
                );
            if seen_at.elapsed() < duration {
                return Attempt::Following(holder);
            }
        }
        if !mine {
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.lease_duration.as_secs() as i32);
        spec.renew_time = Some(now());
        lease.spec = Some(spec);
        // The resourceVersion read above makes this a compare-and-swap.
        let written = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await;
        self.write(written)
    }

    fn write(&mut self, result: Result<Lease, kube::Error>) -> Attempt {
        match result {
            Ok(lease) => {
                self.observed = lease.metadata.resource_version.map(|v| (v, Instant::now()));
                Attempt::Leading
            }
            Err(e) => Attempt::Retry(e.to_string()),
        }
    }

    /// Waits until this replica holds the Lease; false when `cancel` came first.
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        // Logged when it changes, not at every attempt.
        let mut last = None;
        loop {
            let sent = Instant::now();
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return false,
                a = self.attempt() => a,
            };
            match &attempt {
                Attempt::Leading => {
                    self.renewed = sent;
                    tracing::info!(lease = %self.name, identity = %self.identity, "acquired the lease; relaying");
                    return true;
                }
                _ if last.as_ref() == Some(&attempt) => {}
                Attempt::Following(holder) => {
                    tracing::info!(lease = %self.name, %holder, "standing by while another replica relays")
                }
                Attempt::Retry(why) => {
                    tracing::warn!(lease = %self.name, %why, "cannot take the lease; retrying")
                }
            }
            last = Some(attempt);
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(self.retry_period) => {}
            }
        }
    }

    /// Renews the Lease every retry period until `done` is cancelled. Returns why leadership
    /// was lost, if it was: another replica holds the Lease, or the renew deadline (counted from
    /// when the last successful renewal was sent) passed; an attempt still under way then is
    /// abandoned, so the leader stops within the deadline whatever the API server does.
    pub async fn keep(&mut self, done: &CancellationToken) -> Option<String> {
        loop {
            let deadline = self.renewed + self.renew_deadline;
            let next = (Instant::now() + self.retry_period).min(deadline);
            tokio::select! {
                _ = done.cancelled() => return None,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            let sent = Instant::now();
            let attempt = tokio::select! {
                _ = done.cancelled() => return None,
                a = tokio::time::timeout_at(deadline.into(), self.attempt()) => a,
            };
            match attempt {
                Ok(Attempt::Leading) => self.renewed = sent,
                Ok(Attempt::Following(holder)) => return Some(format!("{holder} holds it")),
                Ok(Attempt::Retry(why)) => {
                    tracing::warn!(lease = %self.name, %why, "lease renewal failed")
                }
                Err(_) => {}
            }
            if Instant::now() >= self.renewed + self.renew_deadline {
                return Some(format!("not renewed for {:?}", self.renew_deadline));
            }
        }
    }

    /// Gives the Lease up after a clean stop, so that a standby takes over at its next attempt
    /// instead of after the lease duration. Bounded in time: shutdown must not outlast the
    /// pod's grace period because the API server is slow.
    /// Releases the Lease if this replica holds it, giving up after `within`.
    pub async fn release(&mut self, within: Duration) {
        match tokio::time::timeout(within, self.clear()).await {
            Ok(Ok(true)) => tracing::info!(lease = %self.name, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "could not release the lease")
            }
            Err(_) => tracing::warn!(lease = %self.name, "releasing the lease timed out"),
        }
    }

    /// Empties the holder if it is this replica; true when it did.
    async fn clear(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(false);
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Parks the Lease for good, for a release that moved to sharding: once any live leader's
    /// term is over (its Lease taken over as a standby would), the holder becomes [`PARKED`]
    /// with the longest duration a Lease can say, and is never renewed. Replicas of a version
    /// before sharding then stand by forever; a missing Lease is created parked. True once
    /// parked (by this replica or another); false when `cancel` came first.
    pub async fn park(&mut self, cancel: &CancellationToken) -> bool {
        let mut said = false;
        loop {
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return false,
                a = self.attempt() => a,
            };
            match attempt {
                Attempt::Following(holder) if holder == PARKED => return true,
                Attempt::Leading => match self.write_parked().await {
                    Ok(()) => {
                        tracing::info!(lease = %self.name, "parked the leader Lease: no replica of a version before sharding can lead again");
                        return true;
                    }
                    Err(e) => {
                        tracing::warn!(lease = %self.name, error = %e, "parking the lease failed; retrying")
                    }
                },
                Attempt::Following(holder) if !said => {
                    said = true;
                    tracing::info!(lease = %self.name, %holder, "waiting for the single leader to stop before sharding starts");
                }
                _ => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(self.retry_period) => {}
            }
        }
    }

    /// Writes the Lease this replica holds as parked (compare-and-swap on what it read).
    async fn write_parked(&self) -> Result<(), kube::Error> {
        let mut lease = self.api.get(&self.name).await?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(PARKED.into());
        spec.lease_duration_seconds = Some(i32::MAX);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(drop)
    }
}

/// The holder of a Lease parked by a sharded release: it never expires.
pub const PARKED: &str = "sharded";

/// `Err(why and what to do)` when the release of `cfg` ran sharded: going back to a single
/// leader in place is not supported. The single leader would resume from the positions and the
/// membership it had before sharding, missing what the shards relayed since (deletions never
/// retracted), and with leader election on it would stand by forever behind the parked Lease.
/// Read until the API server answers ([`crate::checkpoint::until_read`]); `Ok` when `cancel`
/// comes first.
pub async fn refuse_unsharding(
    client: &kube::Client,
    cfg: &Config,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let read =
        crate::checkpoint::until_read("telling whether this release ran sharded", cancel, || {
            sharded_marker(client, cfg)
        });
    match read.await.flatten() {
        None => Ok(()),
        Some(marker) => Err(unsharding_refusal(&marker)),
    }
}

/// Why a release that ran sharded (as `marker` says) does not relay as a single leader, and
/// the safe ways.
pub fn unsharding_refusal(marker: &str) -> String {
    format!(
        "this release ran sharded ({marker}), and turning sharding.enabled off in place is not supported: a single leader would resume from the positions it had before sharding and miss what the shards relayed since. Keep sharding.enabled: true with sharding.shards and sharding.topic as they are (replicas: 1 for a single relaying replica), or deploy a new release with its own checkpoint.name and leaderElection.name next to this one and remove this one once the new one is ready"
    )
}

/// How long ago the leader Lease of `cfg` was parked, when no single leader ever held it (the
/// release ran without leader election; a sharded replica created the Lease to park it, so it
/// never changed hands); `None` otherwise.
pub async fn parked_unheld_for(
    client: &kube::Client,
    cfg: &Config,
) -> Result<Option<Duration>, kube::Error> {
    let le = &cfg.leader_election;
    let leases: Api<Lease> = Api::namespaced(client.clone(), cfg.lease_namespace());
    let spec = leases.get_opt(&le.name).await?.and_then(|l| l.spec);
    let parked_at = spec
        .filter(|s| s.holder_identity.as_deref() == Some(PARKED))
        .filter(|s| s.lease_transitions.unwrap_or(0) == 0)
        .and_then(|s| s.renew_time);
    Ok(parked_at.map(|at| {
        Duration::try_from(Timestamp::now().duration_since(at.0)).unwrap_or(Duration::ZERO)
    }))
}

/// What says the release of `cfg` runs (or ran) sharded, read once: the leader Lease parked
/// (every sharded replica parks it before any shard runs; a Lease it may not read, without
/// election, is not one), or the release's checkpoint ConfigMap annotated by a sharded replica
/// (its sharding, recorded before any shard runs, or its shards' owners, recorded by versions
/// before that).
pub async fn sharded_marker(
    client: &kube::Client,
    cfg: &Config,
) -> Result<Option<String>, kube::Error> {
    let le = &cfg.leader_election;
    let cp = &cfg.checkpoint;
    let lease_ns = cfg.lease_namespace();
    let leases: Api<Lease> = Api::namespaced(client.clone(), lease_ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &cp.namespace);
    let parked = match leases.get_opt(&le.name).await {
        Ok(lease) => lease
            .and_then(|l| l.spec?.holder_identity)
            .is_some_and(|h| h == PARKED),
        Err(kube::Error::Api(s)) if s.code == 403 && !le.enabled => false,
        Err(e) => return Err(e),
    };
    if parked {
        return Ok(Some(format!(
            "its leader Lease {lease_ns}/{} is parked by sharded replicas",
            le.name
        )));
    }
    let owners = match configmaps.get_opt(&cp.name).await {
        Ok(cm) => cm.and_then(|cm| cm.metadata.annotations).and_then(|a| {
            [SHARDING_ANNOTATION, SHARD_OWNERS_ANNOTATION]
                .into_iter()
                .find(|k| a.contains_key(*k))
        }),
        // Reading it is the relay's first need anyway: it says so then.
        Err(kube::Error::Api(s)) if s.code == 403 => None,
        Err(e) => return Err(e),
    };
    Ok(owners.map(|key| {
        format!(
            "its checkpoint ConfigMap {}/{} has the annotation {key}",
            cp.namespace, cp.name
        )
    }))
}
