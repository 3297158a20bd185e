//! The checkpoint writer: saves what the streams publish.
//!
//! Every `interval` it takes the checkpoints published since it last looked (and the streams
//! retired since) from the [`Registry`], encodes them and applies them to the ConfigMap in one
//! write. A failed write is kept and retried with the next one; newer checkpoints of the same
//! streams replace what it kept. After `cancel` it writes once more and stops, so a clean stop
//! saves the positions its streams drained to. Once fenced (the Lease or the shard was lost) it
//! writes nothing more. A write that finds a newer owner of its shard on the ConfigMap fences
//! the term itself: the term stops, purged, and the shard is claimed again if it is still
//! assigned here.
//!
//! Each write raises the ConfigMap's write counter and then copies it into the membership topic
//! (see [`crate::checkpoint::WRITES_KEY`]). A ConfigMap found with a lower counter than the
//! writer last wrote went back in time (an etcd restore): that write drops every position, and
//! every stream is asked to resync whole, since objects may be back at versions below the
//! positions. Until a stream has forgotten its position itself (the first step of that resync),
//! a position it publishes is from the old history: it is written without it, so a stop before
//! the resync leaves the next start to reconcile, not to resume.
//!
//! It also takes resync requests left on the ConfigMap ([`crate::checkpoint::RESYNC_ANNOTATION`]),
//! with each write or, when none was made, looking every [`RESYNC_POLL`] ([`SHARD_RESYNC_POLL`]
//! for a shard's), and passes them to the registry. The writers of a replica's shards take
//! turns ([`Pacer`]), so its ConfigMap requests stay bounded whatever it owns, but for the
//! writes its streams wait for in the term's first seconds (their new eras): those come with
//! claims.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::checkpoint::{CheckpointError, Saved, Store, Written};
use crate::config::CHECKPOINT_RESERVE;
use crate::membership::{self, Owner};
use crate::metrics::Metrics;
use crate::producer::Producer;
use crate::registry::{Part, Registry};
use crate::relay::pacer::Pacer;

/// How long copying the write counter into the membership topic may take.
const COPY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the write counter is copied: the membership topic, as the owner's.
pub struct Copy {
    pub producer: Arc<dyn Producer>,
    pub topic: String,
    pub owner: Owner,
}

impl Copy {
    /// Copies what write `w` stamped (the counter and the era floor) in the background, unless
    /// the last copy is still under way (a broker outage): writes never wait for Kafka. A copy
    /// that fails or is skipped only weakens the detection of a restore while the relay is
    /// down, and the floor it would carry; the next write copies again.
    fn send(self: &Arc<Self>, w: &Written, under_way: &mut Option<tokio::task::JoinHandle<()>>) {
        if under_way.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (copy, written) = (self.clone(), (w.writes, w.era_floor));
        *under_way = Some(tokio::spawn(async move {
            let never = CancellationToken::new();
            copy_counter(
                copy.producer.as_ref(),
                &copy.topic,
                &copy.owner,
                written,
                &never,
            )
            .await;
        }));
    }
}

/// Copies the write counter and the era floor a write stamped (`(writes, era_floor)`) into the
/// membership topic and waits for Kafka (at most [`COPY_TIMEOUT`], or until `stop`); a failure
/// is logged, the next write copies again.
async fn copy_counter(
    producer: &dyn Producer,
    topic: &str,
    owner: &Owner,
    (writes, era_floor): (u64, u64),
    stop: &CancellationToken,
) {
    let record = membership::writes_record(topic, owner, writes, era_floor);
    let sent = membership::send_all(producer, [record], stop);
    match tokio::time::timeout(COPY_TIMEOUT, sent).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "copying the checkpoint write counter failed"),
        Err(_) => tracing::warn!("copying the checkpoint write counter timed out"),
    }
}

/// Before a term announces anything: raises the ConfigMap's write counter and copies it into
/// the membership topic, waiting for both (bounded). A restore of the cluster to any snapshot
/// taken before now then finds the ConfigMap behind: while this term runs, at its next write;
/// after it, at the next start, against the copy. Without this, a term that announced objects
/// and stopped before it wrote again would leave the snapshot's counter current, and a restore
/// to it would pass unseen. Best effort: a failure is logged, and the writes to come raise the
/// counter anyway.
pub async fn open_term(
    store: &Store,
    producer: &dyn Producer,
    topic: &str,
    owner: &Owner,
    stop: &CancellationToken,
) {
    let written = tokio::time::timeout(WRITE_TIMEOUT, store.write(&BTreeMap::new())).await;
    let written = match written {
        Ok(Ok(w)) => (w.writes, w.era_floor),
        Ok(Err(e)) => {
            return tracing::warn!(error = %e, "raising the checkpoint write counter at the start of the term failed")
        }
        Err(_) => {
            return tracing::warn!(
                "raising the checkpoint write counter at the start of the term timed out"
            )
        }
    };
    copy_counter(producer, topic, owner, written, stop).await;
}

/// How long after a term's start the writes its streams wait for take no turn.
const OPENING: Duration = Duration::from_secs(5);

/// How long a checkpoint write may take before it is abandoned (and retried with the next).
const WRITE_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the writer looks for a resync request, unless a checkpoint write just did.
pub const RESYNC_POLL: Duration = Duration::from_secs(2);

/// [`RESYNC_POLL`] for a shard's writer: a replica may own dozens of shards, each with its
/// ConfigMap, and polling each every 2 s would cost the API server a read a second for every
/// two of them.
pub const SHARD_RESYNC_POLL: Duration = Duration::from_secs(10);

/// Starts a resync that a request asks for.
fn resync(registry: &Registry, part: &Part, request: &str) {
    let (what, delta) = crate::checkpoint::parse_resync_request(request);
    let asked = registry.request_resync_of(what, delta, &**part);
    tracing::info!(%what, delta, streams = asked, "resync requested");
}

#[allow(
    clippy::too_many_arguments,
    reason = "each is a different part of the wiring"
)]
pub async fn run(
    store: Store,
    copy: Option<Copy>,
    registry: Registry,
    part: Part,
    metrics: Arc<Metrics>,
    interval: Duration,
    pacer: Arc<Pacer>,
    cancel: CancellationToken,
    fenced: CancellationToken,
) {
    let copy = copy.map(Arc::new);
    let mut copying = None;
    let mut unwritten: BTreeMap<String, Option<Arc<Saved>>> = BTreeMap::new();
    // Streams asked to resync whole after a rewind that have not forgotten their position yet.
    let mut suspect: HashSet<String> = HashSet::new();
    let mut polled = Instant::now();
    let mut wanted = registry.writes_wanted();
    // A stream that asked before this writer watched is served by its first pass.
    wanted.mark_changed();
    let mut next = tokio::time::Instant::now() + interval;
    let poll = match store.is_owned() {
        true => SHARD_RESYNC_POLL,
        false => RESYNC_POLL,
    };
    // The writes its streams wait for in the term's first [`OPENING`] (their new eras, at the
    // term's start) take no turn: they come with claims, not with churn. Paced, the streams of
    // a replica's shards claimed together would start one turn apart, and the read they share
    // would begin before most had joined. Later ones (a resync, a namespace entering or
    // leaving the scope) come with churn and take their turn.
    let opening = tokio::time::Instant::now() + OPENING;
    loop {
        // `awaited`: a stream of this part waits for its checkpoint (a forgotten position, a
        // new era) before it reads on.
        let (last, awaited) = tokio::select! {
            _ = fenced.cancelled() => {
                tracing::warn!(unwritten = unwritten.len(), "fenced: no checkpoint is written after the Lease was lost");
                return;
            }
            _ = cancel.cancelled() => (true, false),
            _ = tokio::time::sleep_until(next) => (false, false),
            // Another part's stream waits for its own writer.
            _ = wanted.changed() => {
                if !registry.take_wanted(&*part) {
                    continue;
                }
                (false, true)
            }
        };
        next = tokio::time::Instant::now() + interval;
        // A stop while waiting for a turn goes straight to the last write.
        let paced = || async {
            tokio::select! {
                _ = cancel.cancelled() => false,
                _ = fenced.cancelled() => false,
                _ = pacer.turn() => true,
            }
        };
        let unpaced = awaited && tokio::time::Instant::now() < opening;
        // An opening write takes the requests with it.
        if !last && !unpaced && polled.elapsed() >= poll {
            if !paced().await {
                continue;
            }
            polled = Instant::now();
            match store.take_resync_request().await {
                Ok(Some(request)) => resync(&registry, &part, &request),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "reading resync requests failed"),
            }
        }
        unwritten.extend(registry.take_checkpoints_of(&*part));
        for (id, saved) in unwritten.iter_mut() {
            if !suspect.contains(id) {
                continue;
            }
            match saved {
                Some(s) if s.rv.is_some() => {
                    *saved = Some(Arc::new(Saved {
                        rv: None,
                        ..(**s).clone()
                    }));
                }
                // It forgot its position (its resync began), or it was retired.
                _ => {
                    suspect.remove(id);
                }
            }
        }
        if !unwritten.is_empty() {
            let updates: BTreeMap<String, Option<String>> = unwritten
                .iter()
                .map(|(id, saved)| (id.clone(), saved.as_deref().map(crate::checkpoint::encode)))
                .collect();
            // The final write has its reserve of the shutdown budget; others a bound of their own.
            let bound = if last {
                CHECKPOINT_RESERVE
            } else {
                WRITE_TIMEOUT
            };
            if !last && !unpaced && !paced().await {
                continue;
            }
            // A request is taken with a write, but not with the last: nobody would act on it.
            let write = async {
                match last {
                    true => store.write(&updates).await,
                    false => store.write_taking_request(&updates).await,
                }
            };
            let written = tokio::time::timeout(bound, write)
                .await
                .unwrap_or_else(|_| Err(CheckpointError::TimedOut(bound)));
            match written {
                Ok(w) => {
                    polled = Instant::now();
                    if let Some(request) = &w.request {
                        resync(&registry, &part, request);
                    }
                    registry.mark_written(&unwritten);
                    unwritten.clear();
                    metrics.checkpoint_writes.with_label_values(&["ok"]).inc();
                    metrics.checkpoint_bytes.inc_by(w.bytes as u64);
                    metrics.checkpoint_written.set(crate::metrics::unix_now());
                    if w.rewound {
                        metrics.history_rewinds.inc();
                        suspect = registry.ids_of(&*part).into_iter().collect();
                        let asked = registry.request_resync_of("all", false, &*part);
                        tracing::error!(writes = w.writes, streams = asked, "the checkpoint ConfigMap went back behind what this relay wrote (an etcd restore?): every stream relists and re-announces every object");
                    }
                    if let Some(copy) = &copy {
                        copy.send(&w, &mut copying);
                    }
                }
                Err(e) => {
                    metrics
                        .checkpoint_writes
                        .with_label_values(&["error"])
                        .inc();
                    if let CheckpointError::Deposed { .. } = e {
                        // Never a writer that quietly stops while its term relays: the term is
                        // fenced, and its shard claimed again if the group still assigns it here.
                        metrics.shard_fences.inc();
                        tracing::error!(error = %e, "deposed: fencing this term of the shard; it is claimed again, above the stamped epoch, if the group still assigns it here");
                        fenced.cancel();
                        return;
                    }
                    tracing::warn!(error = %e, "checkpoint write failed; will retry");
                }
            }
        }
        if last {
            break;
        }
    }
}
