//! `watchrelay status`: what the checkpoint ConfigMap and the leader Lease say, per stream.

use std::fmt::Write;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde::Serialize;

use crate::checkpoint::{self, RESYNC_ANNOTATION};
use crate::config::Config;

/// What `watchrelay status` reports, as a table ([`text`]) or as JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `namespace/name` of the checkpoint ConfigMap.
    pub checkpoint: String,
    /// Every stream with a saved position, ordered by id.
    pub streams: Vec<StreamStatus>,
    /// A resync requested and not yet taken by the relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync_requested: Option<String>,
    /// With leader election on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<Leader>,
}

/// One stream's saved position.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamStatus {
    /// The stream's id, `<channel>.<namespace>`.
    pub stream: String,
    /// The resourceVersion up to which Kafka acknowledged everything.
    pub position: Option<String>,
    /// When it was acknowledged.
    pub acknowledged_at: Option<String>,
    /// Seconds since `acknowledgedAt`: how far behind a restart would resume.
    pub age_seconds: Option<i64>,
}

/// Who holds the leader Lease.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// The holder's identity; `None` when the Lease is free.
    pub holder: Option<String>,
    /// When the holder last renewed the Lease (RFC 3339).
    pub renewed_at: Option<String>,
    /// Seconds since that renewal: a leader that stopped renewing shows here.
    pub age_seconds: Option<i64>,
}

fn age(at: &str) -> Option<i64> {
    let t: jiff::Timestamp = at.parse().ok()?;
    Some(jiff::Timestamp::now().as_second() - t.as_second())
}

/// Reads the status from the cluster.
pub async fn read(client: kube::Client, cfg: &Config) -> Result<Status, kube::Error> {
    let ns = &cfg.checkpoint.namespace;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(&cfg.checkpoint.name)
        .await?;
    let mut streams: Vec<StreamStatus> = cm
        .as_ref()
        .map(checkpoint::read)
        .unwrap_or_default()
        .into_iter()
        .map(|(stream, saved)| StreamStatus {
            stream,
            age_seconds: saved.at.as_deref().and_then(age),
            position: saved.rv,
            acknowledged_at: saved.at,
        })
        .collect();
    streams.sort_by(|a, b| a.stream.cmp(&b.stream));
    let resync_requested = cm
        .and_then(|cm| cm.metadata.annotations)
        .and_then(|mut a| a.remove(RESYNC_ANNOTATION));
    let le = &cfg.leader_election;
    let leader = if le.enabled {
        let lease_ns = le.namespace.as_ref().unwrap_or(ns);
        let lease = Api::<Lease>::namespaced(client, lease_ns)
            .get_opt(&le.name)
            .await?;
        let spec = lease.and_then(|l| l.spec);
        let renewed_at = spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| format!("{:.0}", t.0));
        Some(Leader {
            lease: format!("{lease_ns}/{}", le.name),
            holder: spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty()),
            age_seconds: renewed_at.as_deref().and_then(age),
            renewed_at,
        })
    } else {
        None
    };
    Ok(Status {
        checkpoint: format!("{ns}/{}", cfg.checkpoint.name),
        streams,
        resync_requested,
        leader,
    })
}

/// The status as a table.
pub fn text(s: &Status) -> String {
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "checkpoint ConfigMap {}", s.checkpoint);
    if let Some(l) = &s.leader {
        let _ = writeln!(
            out,
            "leader {} (Lease {}, renewed {})",
            opt(&l.holder),
            l.lease,
            l.age_seconds
                .map(|a| format!("{a}s ago"))
                .unwrap_or_else(|| "never".into())
        );
    }
    if let Some(r) = &s.resync_requested {
        let _ = writeln!(out, "resync requested: {r}");
    }
    if s.streams.is_empty() {
        let _ = writeln!(out, "no stream has saved a position yet");
        return out;
    }
    let width = s
        .streams
        .iter()
        .map(|x| x.stream.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(out, "{:width$}  {:>12}  {:>8}", "STREAM", "POSITION", "AGE");
    for st in &s.streams {
        let _ = writeln!(
            out,
            "{:width$}  {:>12}  {:>8}",
            st.stream,
            opt(&st.position),
            st.age_seconds
                .map(|a| format!("{a}s"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    out
}
