//! The start of a term: the membership topic verified and read back.
//!
//! # The topic is verified, never trusted
//! Every start checks, before reading a single member, that the topic is what the membership
//! needs (see [`verify`]): compacted with no time or size retention (an admin's
//! `cleanup.policy=delete` or `retention.ms` would silently drop members), the topic this relay
//! recorded (its [`MembershipMark`]: the topic's name, the id of the mark record this relay
//! wrote into it, its partitions). A topic deleted and created again lacks the mark; one with
//! another partition count spreads keys differently. A mismatch, or an authorization error,
//! blocks the term: `/readyz` names the problem, `watchrelay_membership_topic_problem{reason}`
//! is 1, an error is logged, and the check is repeated until it passes. Nothing is relayed on a
//! topic that cannot keep the promise.
//!
//! # Adoption, once
//! A ConfigMap without a mark was written by an older version (or is new). Then the ownerless
//! records of that version (`<stream>/<uid>`) are adopted for the streams that have a position
//! in this relay's own ConfigMap, as are the known-object sets even older versions kept in the
//! ConfigMap itself; only once Kafka acknowledged them is the mark written, first to the topic,
//! then to the ConfigMap. A crash midway repeats the adoption; nothing is lost, at worst a
//! member too many, which costs a superfluous inferred DELETED.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Log, TopicError, TopicState};
use crate::checkpoint::{Loaded, MembershipMark, Store, MARK_KEY};
use crate::membership::{self, Known, Owner, Restored};
use crate::metrics::Metrics;
use crate::producer::Producer;
use crate::registry::Registry;

/// How long to wait before trying again after a failure.
const RESTORE_RETRY: Duration = Duration::from_secs(5);

/// Why the membership topic cannot be used, as the metric's `reason` label and a message that
/// names the topic, the property and the way out.
#[derive(Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

/// Every `reason` a [`Problem`] can have.
pub const PROBLEMS: [&str; 7] = [
    "not_compacted",
    "retention",
    "recreated",
    "partitions",
    "changed",
    "unauthorized",
    "unavailable",
];

fn problem(reason: &'static str, message: String) -> Problem {
    Problem { reason, message }
}

/// Checks what the broker reports of the membership `topic` against what it must be, and
/// against what this relay recorded of it (`mark`).
pub fn verify(
    topic: &str,
    state: &TopicState,
    mark: Option<&MembershipMark>,
) -> Result<(), Problem> {
    let config = |k: &str| state.configs.get(k).map(String::as_str);
    let policy = config("cleanup.policy").unwrap_or("delete");
    let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
    if !policies.contains(&"compact") {
        return Err(problem(
            "not_compacted",
            format!("membership topic {topic} has cleanup.policy={policy}: retention would drop members; set cleanup.policy=compact on it"),
        ));
    }
    if policies.contains(&"delete") {
        for key in ["retention.ms", "retention.bytes"] {
            let value = config(key).unwrap_or("unset");
            if value != "-1" {
                return Err(problem(
                    "retention",
                    format!("membership topic {topic} has cleanup.policy={policy} with {key}={value}: retention would drop members; set cleanup.policy=compact (or {key}=-1)"),
                ));
            }
        }
    }
    if let Some(mark) = mark {
        if mark.topic != topic {
            return Err(problem(
                "changed",
                format!("checkpoint.membership.topic is {topic} but this relay's members are in {}: set it back, or remove the {MARK_KEY} entry of the checkpoint ConfigMap to start over in {topic} (objects deleted meanwhile may then never get a DELETED)", mark.topic),
            ));
        }
        // No topic has 0 partitions: a mark saying so was written from a broker's answer
        // given before it knew the topic's partitions, and is rewritten with the count.
        if mark.partitions != 0 && mark.partitions != state.partitions {
            return Err(problem(
                "partitions",
                format!("membership topic {topic} has {} partitions, {} when this relay last read it: records of one key may now be in two partitions, out of order; restore the partition count, or remove the {MARK_KEY} entry of the checkpoint ConfigMap after moving the topic's records", state.partitions, mark.partitions),
            ));
        }
    }
    Ok(())
}

/// Checks that the topic still holds this relay's mark once it was read.
fn verify_mark(topic: &str, mark: &MembershipMark, found: Option<&str>) -> Result<(), Problem> {
    if found == Some(mark.id.as_str()) {
        return Ok(());
    }
    Err(problem(
        "recreated",
        format!("membership topic {topic} lacks this relay's mark {}: it was deleted and created again (or emptied), and the members it held are lost; to accept the loss, remove the {MARK_KEY} entry of the checkpoint ConfigMap and run `watchrelay resync all` (objects deleted meanwhile may never get a DELETED)", mark.id),
    ))
}

/// Why an attempt ended without members.
enum Halt {
    Stopped,
    Problem(Problem),
}

impl From<TopicError> for Halt {
    fn from(e: TopicError) -> Self {
        match e {
            TopicError::Stopped => Halt::Stopped,
            TopicError::Unauthorized(m) => Halt::Problem(problem(
                "unauthorized",
                format!("the membership topic: {m}; grant this relay's principal Describe, DescribeConfigs, Read and Write on the topic (and Create, or create it compacted yourself)"),
            )),
            TopicError::Other(m) => Halt::Problem(problem("unavailable", m)),
        }
    }
}

/// Everything a restore needs.
pub struct Restore<'a> {
    /// Writes the adopted members and the topic mark.
    pub producer: &'a Arc<dyn Producer>,
    /// Creates, describes and reads the membership topic.
    pub log: &'a Arc<dyn Log>,
    /// The checkpoint ConfigMap, where the verified mark is recorded.
    pub store: &'a Store,
    /// Where the restore's duration, size and problems are published.
    pub metrics: &'a Metrics,
    /// Held not ready, with the reason, while the topic cannot be restored.
    pub registry: &'a Registry,
    /// Whose records are this relay's: the checkpoint ConfigMap.
    pub owner: &'a Owner,
    /// The membership topic's name.
    pub topic: &'a str,
    /// Partitions the topic is created with, when missing.
    pub partitions: i32,
    /// Replication factor the topic is created with; `None`: the broker's default.
    pub replication: Option<i32>,
}

impl Restore<'_> {
    /// Verifies and reads the topic, adopting what older versions left, until it succeeds;
    /// `None` when stopped first (a shutdown, a lost Lease, a shard revoked): its problem, no
    /// longer this replica's to solve, is withdrawn.
    pub async fn run(&self, loaded: &mut Loaded, stop: &CancellationToken) -> Option<Restored> {
        loop {
            let problem = match self.attempt(loaded, stop).await {
                Ok(restored) => {
                    self.report(None);
                    return Some(restored);
                }
                Err(Halt::Stopped) => break,
                Err(Halt::Problem(p)) => p,
            };
            self.report(Some(&problem));
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(RESTORE_RETRY) => {}
            }
        }
        self.report(None);
        None
    }

    /// Publishes the problem (or its end) in the readiness, as this owner's (a shard's: other
    /// shards' problems stay), and in the metric: a reason is on while any owner has it.
    fn report(&self, problem: Option<&Problem>) {
        self.registry.block_for(
            self.owner.as_str(),
            problem.map(|p| (p.reason.to_string(), p.message.clone())),
        );
        for reason in PROBLEMS {
            let on = self.registry.blocked_by(reason);
            self.metrics
                .membership_topic_problem
                .with_label_values(&[reason])
                .set(i64::from(on));
        }
    }

    /// Runs `f` on a blocking thread until it returns or `stop` fires; `f` is told to give up
    /// through the flag it is handed.
    async fn blocking<T: Send + 'static>(
        stop: &CancellationToken,
        f: impl FnOnce(&AtomicBool) -> Result<T, TopicError> + Send + 'static,
    ) -> Result<T, Halt> {
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let task = tokio::task::spawn_blocking(move || f(&flag));
        tokio::select! {
            _ = stop.cancelled() => {
                stopped.store(true, Ordering::Relaxed);
                Err(Halt::Stopped)
            }
            r = task => match r {
                Ok(r) => r.map_err(Halt::from),
                Err(e) => Err(Halt::Problem(problem("unavailable", e.to_string()))),
            },
        }
    }

    async fn attempt(
        &self,
        loaded: &mut Loaded,
        stop: &CancellationToken,
    ) -> Result<Restored, Halt> {
        let started = Instant::now();
        let (p, t, partitions, replication) = (
            self.log.clone(),
            self.topic.to_string(),
            self.partitions,
            self.replication,
        );
        let state = Self::blocking(stop, move |_| {
            p.ensure_compacted(&t, partitions, replication)
        })
        .await?;
        verify(self.topic, &state, loaded.mark.as_ref()).map_err(Halt::Problem)?;
        // Ownerless records matter only until this relay adopted them.
        let legacy_for: Option<HashSet<String>> = loaded
            .mark
            .is_none()
            .then(|| loaded.streams.keys().cloned().collect());
        let (p, t, owner) = (self.log.clone(), self.topic.to_string(), self.owner.clone());
        let mut restored = Self::blocking(stop, move |stopped| {
            let mut restored = Restored::new(owner, legacy_for);
            p.replay(&t, &mut |k, v| restored.apply(k, v), &|| {
                stopped.load(Ordering::Relaxed)
            })?;
            restored.finish();
            Ok(restored)
        })
        .await?;
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.membership_restore_seconds.set(seconds);
        self.metrics
            .membership_restored
            .set(i64::try_from(restored.records).unwrap_or(i64::MAX));
        tracing::info!(topic = %self.topic, records = restored.records, members = restored.members(), member_bytes = restored.heap_bytes(), other_owners = restored.foreign, malformed = restored.malformed, seconds, "restored membership");
        match &loaded.mark {
            Some(mark) => {
                verify_mark(self.topic, mark, restored.mark.as_deref()).map_err(Halt::Problem)?;
                if mark.partitions == 0 {
                    let mark = MembershipMark {
                        partitions: state.partitions,
                        ..mark.clone()
                    };
                    self.write_mark(&mark, stop).await?;
                    loaded.mark = Some(mark);
                }
            }
            None => {
                self.adopt(loaded, &mut restored, stop).await?;
                let mark = MembershipMark {
                    topic: self.topic.to_string(),
                    id: restored.mark.clone().unwrap_or_else(new_id),
                    partitions: state.partitions,
                };
                self.write_mark(&mark, stop).await?;
                loaded.mark = Some(mark);
            }
        }
        Ok(restored)
    }

    /// Adopts the ownerless records of older versions, and the sets even older ones kept in
    /// the ConfigMap, for this relay's own streams.
    async fn adopt(
        &self,
        loaded: &Loaded,
        restored: &mut Restored,
        stop: &CancellationToken,
    ) -> Result<(), Halt> {
        let failed =
            |e: membership::SendError| Halt::Problem(problem("unavailable", e.to_string()));
        for id in restored.legacy_streams() {
            let legacy = restored.take_legacy(&id);
            let mut members = restored.take(&id);
            let missing: Vec<_> = legacy
                .iter()
                .filter(|(uid, _)| !members.contains(uid))
                .collect();
            let n = missing.len();
            let adopted = membership::adopt(
                self.producer.as_ref(),
                self.topic,
                self.owner,
                &id,
                missing.into_iter(),
                stop,
            )
            .await
            .map_err(failed)?;
            for (uid, k) in adopted.iter() {
                members.insert(&uid, &k);
            }
            tracing::info!(stream = %id, members = n, "adopted the membership records an older version wrote without an owner");
            restored.insert(&id, members);
        }
        for (id, saved) in &loaded.streams {
            let Some(known) = &saved.known else { continue };
            if restored.streams().any(|s| s == id.as_str()) {
                continue;
            }
            let known: HashMap<String, Known> = match serde_json::from_value(known.clone()) {
                Ok(known) => known,
                Err(e) => {
                    tracing::warn!(stream = %id, error = %e, "ignoring an unreadable legacy known-object set");
                    continue;
                }
            };
            let members = membership::adopt(
                self.producer.as_ref(),
                self.topic,
                self.owner,
                id,
                known.into_iter(),
                stop,
            )
            .await
            .map_err(failed)?;
            tracing::info!(stream = %id, members = members.len(), "moved the known objects kept in the checkpoint ConfigMap to the membership topic");
            restored.insert(id, members);
        }
        Ok(())
    }

    /// Writes `mark` into the topic, then (once acknowledged) into the ConfigMap.
    async fn write_mark(
        &self,
        mark: &MembershipMark,
        stop: &CancellationToken,
    ) -> Result<(), Halt> {
        let failed = |e: String| Halt::Problem(problem("unavailable", e));
        let record = membership::mark_record(self.topic, self.owner, &mark.id);
        membership::send_all(self.producer.as_ref(), [record], stop)
            .await
            .map_err(|e| failed(format!("marking the membership topic: {e}")))?;
        let entry = serde_json::to_string(mark).expect("plain fields serialize");
        let update = BTreeMap::from([(MARK_KEY.to_string(), Some(entry))]);
        let write = self.store.write(&update);
        tokio::select! {
            _ = stop.cancelled() => Err(Halt::Stopped),
            r = write => r.map(drop).map_err(|e| failed(e.to_string())),
        }
    }
}

/// A new mark id: unique enough to tell one topic from its successor.
fn new_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{nanos:x}-{:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(configs: &[(&str, &str)], partitions: usize) -> TopicState {
        TopicState {
            partitions,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created: false,
        }
    }

    fn mark(topic: &str, partitions: usize) -> MembershipMark {
        MembershipMark {
            topic: topic.into(),
            id: "m1".into(),
            partitions,
        }
    }

    #[test]
    fn a_topic_that_drops_members_is_refused_naming_it_and_the_property() {
        let reason =
            |configs: &[(&str, &str)]| verify("m", &state(configs, 1), None).map_err(|p| p.reason);
        assert_eq!(reason(&[("cleanup.policy", "compact")]), Ok(()));
        assert_eq!(
            reason(&[("cleanup.policy", "delete")]),
            Err("not_compacted")
        );
        assert_eq!(
            reason(&[]),
            Err("not_compacted"),
            "the broker's default is delete"
        );
        assert_eq!(
            reason(&[
                ("cleanup.policy", "compact,delete"),
                ("retention.ms", "604800000")
            ]),
            Err("retention")
        );
        assert_eq!(
            reason(&[
                ("cleanup.policy", "compact, delete"),
                ("retention.ms", "-1"),
                ("retention.bytes", "-1")
            ]),
            Ok(())
        );
        let p = verify("m", &state(&[("cleanup.policy", "delete")], 1), None).unwrap_err();
        assert!(
            p.message.contains("membership topic m") && p.message.contains("cleanup.policy=delete"),
            "{}",
            p.message
        );
    }

    #[test]
    fn another_topic_or_partition_count_than_recorded_is_refused() {
        let compact = [("cleanup.policy", "compact")];
        assert_eq!(
            verify("m", &state(&compact, 3), Some(&mark("m", 3))),
            Ok(())
        );
        assert_eq!(
            verify("m", &state(&compact, 6), Some(&mark("m", 3))).map_err(|p| p.reason),
            Err("partitions")
        );
        assert_eq!(
            verify("n", &state(&compact, 3), Some(&mark("m", 3))).map_err(|p| p.reason),
            Err("changed")
        );
        assert_eq!(
            verify("m", &state(&compact, 3), Some(&mark("m", 0))),
            Ok(()),
            "a count of 0 was read before the broker knew the topic, and is rewritten"
        );
        assert_eq!(verify_mark("m", &mark("m", 3), Some("m1")), Ok(()));
        assert_eq!(
            verify_mark("m", &mark("m", 3), None).map_err(|p| p.reason),
            Err("recreated")
        );
        assert_eq!(
            verify_mark("m", &mark("m", 3), Some("m2")).map_err(|p| p.reason),
            Err("recreated")
        );
    }
}
