//! Background churn: creates, modifies and deletes realistic objects at a steady rate.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{objects, Sim};

/// What background churn changes, and how fast ([`Sim::start_churn`]).
#[derive(Clone, Debug)]
pub struct ChurnSpec {
    /// Changes per second across everything.
    pub rate_per_sec: f64,
    /// Namespaces for namespaced resources (created when missing).
    pub namespaces: Vec<String>,
    /// Resource keys: `pods`, `deployments.apps`, `events.events.k8s.io`, `nodes`, ...
    pub resources: Vec<String>,
    /// Steady population per resource and namespace.
    pub max_objects_per_kind: usize,
    /// Stop after this many changes.
    pub total_events: Option<u64>,
}

/// Stops the churn when dropped or on [`ChurnHandle::stop`].
pub struct ChurnHandle {
    cancel: CancellationToken,
    task: Option<JoinHandle<u64>>,
}

impl ChurnHandle {
    /// Stops and returns how many changes were made.
    pub async fn stop(mut self) -> u64 {
        self.cancel.cancel();
        self.task
            .take()
            .expect("present until stopped")
            .await
            .unwrap_or(0)
    }
}

impl Drop for ChurnHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) fn start(sim: Sim, spec: ChurnSpec) -> ChurnHandle {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        for ns in &spec.namespaces {
            let _ = sim.create("namespaces", None, objects::namespace(ns));
        }
        let mut rng: u64 = 0x9e3779b97f4a7c15;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Population per (resource, namespace): names currently alive.
        let mut alive: HashMap<(String, Option<String>), Vec<String>> = HashMap::new();
        let mut serial = 0u64;
        let mut done = 0u64;
        let tick = Duration::from_millis(10);
        let per_tick = spec.rate_per_sec * tick.as_secs_f64();
        let mut budget = 0.0;
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        loop {
            tokio::select! {
                _ = c.cancelled() => break,
                _ = ticks.tick() => {}
            }
            budget += per_tick;
            while budget >= 1.0 {
                budget -= 1.0;
                if spec.total_events.is_some_and(|t| done >= t) {
                    return done;
                }
                let res = &spec.resources[next() as usize % spec.resources.len()];
                let ns = if res == "nodes" || res == "namespaces" {
                    None
                } else {
                    Some(spec.namespaces[next() as usize % spec.namespaces.len()].clone())
                };
                let names = alive.entry((res.clone(), ns.clone())).or_default();
                let roll = next() % 10;
                let ok = if names.len() < spec.max_objects_per_kind / 2
                    || (roll < 3 && names.len() < spec.max_objects_per_kind)
                {
                    serial += 1;
                    let name = format!(
                        "{}-{serial}",
                        res.split('.').next().unwrap_or("obj").trim_end_matches('s')
                    );
                    let Some(obj) = objects::for_resource(res, ns.as_deref(), &name) else {
                        continue;
                    };
                    let ok = sim.create(res, ns.as_deref(), obj).is_ok();
                    if ok {
                        names.push(name);
                    }
                    ok
                } else if roll < 6 || names.is_empty() {
                    if names.is_empty() {
                        continue;
                    }
                    let name = names[next() as usize % names.len()].clone();
                    let patch = json!({"metadata": {"annotations": {"churn/serial": serial.to_string()}}, "status": {"observedAt": done.to_string()}});
                    serial += 1;
                    sim.merge_patch(res, ns.as_deref(), &name, patch).is_ok()
                } else {
                    let name = names.swap_remove(next() as usize % names.len());
                    sim.delete(res, ns.as_deref(), &name).is_ok()
                };
                done += ok as u64;
            }
        }
        done
    });
    ChurnHandle {
        cancel,
        task: Some(task),
    }
}

impl Sim {
    /// Starts background churn as `spec` describes, until the handle is stopped or dropped.
    pub fn start_churn(&self, spec: ChurnSpec) -> ChurnHandle {
        start(self.clone(), spec)
    }
}
