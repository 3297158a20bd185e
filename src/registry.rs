//! The relay's live state: which streams run, how each one is doing, and whether this replica
//! leads.
//!
//! The registry is the one owner of that state. Each stream gets a [`Reporter`] when it starts
//! and publishes through it, over a `tokio::sync::watch` channel, its [`Phase`] and, as Kafka
//! acknowledges its events, the checkpoint it may save. Readers never lock a stream: `/readyz`
//! reads the phases, the checkpoint writer takes the checkpoints published since it last looked,
//! the supervisor registers and retires.
//!
//! Entries carry a generation: a stream that retires removes its own entry and schedules its
//! checkpoint's deletion only if no newer stream of the same id registered since.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::IntGauge;
use tokio::sync::{watch, Notify};

use crate::checkpoint::Saved;
use crate::config::StreamId;

/// What a stream is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Started, not yet synced.
    #[default]
    Starting,
    /// Announcing the whole current state (list or initial events).
    Syncing,
    /// Synced, its watch open: the only phase that counts as up.
    Watching,
    /// Waiting before a retry, or for its resource to be served.
    Waiting,
    /// Ended.
    Stopped,
}

/// What a stream publishes.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// What the stream is doing now.
    pub phase: Phase,
    /// The latest checkpoint the stream may save (everything before it acknowledged).
    pub checkpoint: Option<Arc<Saved>>,
    /// Why the stream is not watching, when an error keeps it from it (a missing permission,
    /// Kafka refusing its records): what readiness shows an operator.
    pub problem: Option<String>,
}

/// Whether this replica relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Holds the leader Lease, or runs without election: runs the streams.
    Leader,
    /// Waiting for the leader Lease; runs no streams.
    Standby,
    /// A member of a sharded release: runs the streams of the shards it owns, perhaps none.
    Member,
}

struct Entry {
    generation: u64,
    status: watch::Receiver<Status>,
    /// Asks the stream to relist and reconcile.
    resync: Arc<ResyncRequest>,
    /// Unix time of the last line the stream read (its `stream_last_event` gauge).
    last_line: Option<IntGauge>,
}

struct Inner {
    role: Role,
    /// Why the process must be restarted, once something failed beyond repair.
    failed: Option<String>,
    /// Why relaying cannot start (a membership topic that is not what it should be), by whose
    /// problem it is (a shard's checkpoint owner; `""` the replica's own), with the problem's
    /// kind: not ready until every one is resolved. Keyed, so that one shard's success does not
    /// clear another's problem.
    blocked: BTreeMap<String, (String, String)>,
    /// A watching stream that read nothing for longer than this (seconds) is stalled.
    stall_after: i64,
    streams: BTreeMap<String, Entry>,
    /// Streams retired for good since the writer last looked: their checkpoints are deleted.
    retired: Vec<String>,
    next_generation: u64,
    /// The checkpoint of each stream the writer last wrote.
    written: HashMap<String, Arc<Saved>>,
}

/// Which streams a part of the relay deals with (a shard's), by stream id.
pub type Part = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Every stream: the part of a relay that is not sharded.
pub fn whole() -> Part {
    Arc::new(|_| true)
}

/// Shared handle to the registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
    /// Wakes whoever waits for a checkpoint to be written.
    wrote: Arc<Notify>,
    /// The streams waiting for their checkpoint to be written, and a counter raised with each:
    /// their writer writes at once rather than at its next interval.
    wanted: Arc<(Mutex<BTreeSet<String>>, watch::Sender<u64>)>,
    /// Raised whenever a stream registers, changes phase or is retired.
    changes: Arc<watch::Sender<u64>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

/// What `/readyz` reports.
#[derive(Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Whether `/readyz` passes: a standby, or every stream (one at least) watching, unblocked.
    pub ready: bool,
    /// Streams not watching.
    pub down: Vec<String>,
    /// Of those, the ones an error keeps down, with the error.
    pub problems: BTreeMap<String, String>,
    /// Why relaying cannot start, if it cannot: every problem, each named by whose it is.
    pub blocked: Option<String>,
}

impl Registry {
    /// A registry with a 120 s stall bound, the default `watchIdleTimeoutSeconds`.
    pub fn new() -> Self {
        Self::with_stall_bound(std::time::Duration::from_secs(120))
    }

    /// A registry in which a watching stream that read nothing for longer than `bound` counts
    /// as stalled, hence not ready.
    pub fn with_stall_bound(bound: std::time::Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                role: Role::Leader,
                failed: None,
                blocked: BTreeMap::new(),
                stall_after: i64::try_from(bound.as_secs()).unwrap_or(i64::MAX),
                streams: BTreeMap::new(),
                retired: Vec::new(),
                next_generation: 0,
                written: HashMap::new(),
            })),
            wrote: Arc::new(Notify::new()),
            wanted: Arc::new((Mutex::default(), watch::Sender::new(0))),
            changes: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Changes whenever a stream registers, changes phase or is retired: what waits for
    /// streams to reach a phase looks again then.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether every stream of `ids` watches, or was retired after it registered (`seen`
    /// keeps, across calls, which of them registered).
    pub fn watching(&self, ids: &[String], seen: &mut BTreeSet<String>) -> bool {
        let inner = self.lock();
        let mut all = true;
        for id in ids {
            match inner.streams.get(id) {
                Some(e) => {
                    seen.insert(id.clone());
                    all &= e.status.borrow().phase == Phase::Watching;
                }
                None => all &= seen.contains(id),
            }
        }
        all
    }

    /// Changes whenever a stream waits for its checkpoint to be written (see
    /// [`Reporter::written`]): a writer watching it writes then, not at its next interval.
    pub fn writes_wanted(&self) -> watch::Receiver<u64> {
        self.wanted.1.subscribe()
    }

    /// Whether a stream in `part` waits for its checkpoint to be written; those are forgotten.
    pub fn take_wanted(&self, part: &dyn Fn(&str) -> bool) -> bool {
        let mut wanted = self.wanted.0.lock().expect("wanted lock poisoned");
        let before = wanted.len();
        wanted.retain(|id| !part(id));
        wanted.len() < before
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("registry lock poisoned")
    }

    /// Registers stream `id` (replacing an older entry of the same id) and returns its reporter.
    pub fn register(&self, id: &str) -> Reporter {
        let (tx, rx) = watch::channel(Status::default());
        let resync = Arc::new(ResyncRequest::default());
        let mut inner = self.lock();
        inner.next_generation += 1;
        let generation = inner.next_generation;
        inner.retired.retain(|r| r != id);
        inner.streams.insert(
            id.to_string(),
            Entry {
                generation,
                status: rx,
                resync: resync.clone(),
                last_line: None,
            },
        );
        drop(inner);
        self.changed();
        Reporter {
            id: id.to_string(),
            generation,
            tx,
            resync,
            registry: self.clone(),
        }
    }

    /// A new leadership term (or a standby period) begins: the streams of the previous term are
    /// gone, their checkpoints written when it ended.
    pub fn begin_term(&self, role: Role) {
        let mut inner = self.lock();
        inner.role = role;
        inner.streams.clear();
        inner.retired.clear();
    }

    /// Something failed beyond repair (a fatal producer error, a stream task that died): the
    /// process is no longer healthy and must be restarted. The first reason is kept.
    pub fn fail(&self, reason: String) {
        let mut inner = self.lock();
        if inner.failed.is_none() {
            tracing::error!(%reason, "unhealthy: the process needs a restart");
            inner.failed = Some(reason);
        }
    }

    /// Relaying cannot start for `reason` (`None`: it can again), a problem of the replica's
    /// own. Logged when it changes.
    pub fn block(&self, reason: Option<String>) {
        self.block_for("", reason.map(|r| (String::new(), r)));
    }

    /// `who`'s part (a shard's checkpoint owner, or a step of the whole replica such as its
    /// topics, `topics`) cannot relay for `problem`, its kind and
    /// message (`None`: it can again). Other parts' problems stay. Logged when it changes.
    pub fn block_for(&self, who: &str, problem: Option<(String, String)>) {
        let mut inner = self.lock();
        if inner.blocked.get(who) == problem.as_ref() {
            return;
        }
        match problem {
            Some(p) => {
                tracing::error!(who, reason = %p.1, "not relaying");
                inner.blocked.insert(who.to_string(), p);
            }
            None => {
                tracing::info!(who, "relaying can go on: the problem that held it is gone");
                inner.blocked.remove(who);
            }
        }
    }

    /// How many parts are blocked by a problem of `kind`.
    pub fn blocked_count(&self, kind: &str) -> usize {
        self.lock()
            .blocked
            .values()
            .filter(|(k, _)| k == kind)
            .count()
    }

    /// Whether any part is blocked by a problem of `kind`.
    pub fn blocked_by(&self, kind: &str) -> bool {
        self.lock().blocked.values().any(|(k, _)| k == kind)
    }

    /// `Err(reason)` once [`Registry::fail`] was called: what `/healthz` reports.
    pub fn health(&self) -> Result<(), String> {
        match &self.lock().failed {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    /// Whether this replica leads or stands by in its current term.
    pub fn role(&self) -> Role {
        self.lock().role
    }

    /// Ready means every stream has synced and has its watch open, not merely that the process
    /// runs. A standby replica is ready too: it is doing its job, and a rolling update has to be
    /// able to start one before the leader stops.
    pub fn readiness(&self) -> Readiness {
        let inner = self.lock();
        if inner.role == Role::Standby {
            return Readiness {
                ready: true,
                down: Vec::new(),
                problems: BTreeMap::new(),
                blocked: None,
            };
        }
        let now = crate::metrics::unix_now();
        let stalled = |e: &Entry| {
            e.last_line
                .as_ref()
                .is_some_and(|g| now.saturating_sub(g.get()) > inner.stall_after)
        };
        let down: Vec<String> = inner
            .streams
            .iter()
            .filter(|(_, e)| e.status.borrow().phase != Phase::Watching || stalled(e))
            .map(|(id, _)| id.clone())
            .collect();
        let problems = down
            .iter()
            .filter_map(|id| {
                let problem = inner.streams[id].status.borrow().problem.clone()?;
                Some((id.clone(), problem))
            })
            .collect();
        let some = !inner.streams.is_empty() || inner.role == Role::Member;
        let blocked = (!inner.blocked.is_empty()).then(|| {
            inner
                .blocked
                .iter()
                .map(|(who, (_, message))| match who.as_str() {
                    "" => message.clone(),
                    who => format!("{who}: {message}"),
                })
                .collect::<Vec<_>>()
                .join("; ")
        });
        Readiness {
            ready: down.is_empty() && some && blocked.is_none(),
            down,
            problems,
            blocked,
        }
    }

    /// Every registered stream and its phase.
    pub fn phases(&self) -> BTreeMap<String, Phase> {
        self.lock()
            .streams
            .iter()
            .map(|(id, e)| (id.clone(), e.status.borrow().phase))
            .collect()
    }

    /// The ids of every stream it holds, running or stopped.
    pub fn ids(&self) -> Vec<String> {
        self.ids_of(&|_| true)
    }

    /// The ids of the streams in `part` it holds, running or stopped.
    pub fn ids_of(&self, part: &dyn Fn(&str) -> bool) -> Vec<String> {
        self.lock()
            .streams
            .keys()
            .filter(|id| part(id))
            .cloned()
            .collect()
    }

    /// Forgets the streams in `part` (a shard that moved to another replica): their last
    /// checkpoints were written when they stopped.
    pub fn forget(&self, part: &dyn Fn(&str) -> bool) {
        let mut inner = self.lock();
        inner.streams.retain(|id, _| !part(id));
        inner.retired.retain(|id| !part(id));
        inner.written.retain(|id, _| !part(id));
    }

    /// Asks the streams of channel `what` (or every stream, for `all`) to relist and reconcile:
    /// re-announcing every object, or with `delta` only those changed since their position.
    /// Returns how many were asked.
    pub fn request_resync(&self, what: &str, delta: bool) -> usize {
        self.request_resync_of(what, delta, &|_| true)
    }

    /// [`Registry::request_resync`] of the streams in `part` alone.
    pub fn request_resync_of(&self, what: &str, delta: bool, part: &dyn Fn(&str) -> bool) -> usize {
        let inner = self.lock();
        let mut asked = 0;
        for (id, e) in inner.streams.iter().filter(|(id, _)| part(id)) {
            let channel = StreamId::parts(id).map_or(id.as_str(), |(c, _)| c);
            if what == "all" || what == channel {
                if !delta {
                    e.resync.full.store(true, Ordering::Relaxed);
                }
                e.resync.notify.notify_one();
                asked += 1;
            }
        }
        asked
    }

    /// The writer wrote `checkpoints` to the ConfigMap.
    pub fn mark_written(&self, checkpoints: &BTreeMap<String, Option<Arc<Saved>>>) {
        let mut inner = self.lock();
        for (id, saved) in checkpoints {
            match saved {
                Some(saved) => inner.written.insert(id.clone(), saved.clone()),
                None => inner.written.remove(id),
            };
        }
        drop(inner);
        self.wrote.notify_waiters();
    }

    /// The checkpoints published since the last call, and `None` for each stream retired since.
    pub fn take_checkpoints(&self) -> BTreeMap<String, Option<Arc<Saved>>> {
        self.take_checkpoints_of(&|_| true)
    }

    /// [`Registry::take_checkpoints`] of the streams in `part` alone.
    pub fn take_checkpoints_of(
        &self,
        part: &dyn Fn(&str) -> bool,
    ) -> BTreeMap<String, Option<Arc<Saved>>> {
        let mut inner = self.lock();
        let (taken, kept): (Vec<String>, Vec<String>) =
            inner.retired.drain(..).partition(|id| part(id));
        inner.retired = kept;
        let mut out: BTreeMap<String, Option<Arc<Saved>>> =
            taken.into_iter().map(|id| (id, None)).collect();
        for (id, e) in inner.streams.iter_mut().filter(|(id, _)| part(id)) {
            // Read whether or not the stream is still running: a stopped stream's last
            // checkpoint is the one its final write needs.
            let status = e.status.borrow_and_update();
            if status.has_changed() {
                if let Some(saved) = &status.checkpoint {
                    out.insert(id.clone(), Some(saved.clone()));
                }
            }
        }
        out
    }
}

/// A pending resync request of one stream: a full one wins over a delta one.
#[derive(Default)]
struct ResyncRequest {
    notify: Notify,
    full: AtomicBool,
}

/// A stream's side of the registry.
pub struct Reporter {
    id: String,
    generation: u64,
    tx: watch::Sender<Status>,
    resync: Arc<ResyncRequest>,
    registry: Registry,
}

impl Reporter {
    /// The stream's id, `<channel>.<namespace>`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Publishes the stream's phase; watching clears its problem.
    pub fn phase(&self, phase: Phase) {
        let changed = self.tx.send_if_modified(|s| {
            let changed = s.phase != phase;
            s.phase = phase;
            if phase == Phase::Watching {
                s.problem = None;
            }
            changed
        });
        if changed {
            self.registry.changed();
        }
    }

    /// Publishes why the stream cannot watch (until it watches again).
    pub fn problem(&self, problem: String) {
        self.tx.send_modify(|s| s.problem = Some(problem));
    }

    /// Lets readiness see how long ago the stream last read a line (`gauge` holds its Unix
    /// time).
    pub fn track_liveness(&self, gauge: IntGauge) {
        if let Some(e) = self.registry.lock().streams.get_mut(&self.id) {
            if e.generation == self.generation {
                e.last_line = Some(gauge);
            }
        }
    }

    /// Completes when a resync of this stream was requested (at once if one is pending), with
    /// whether a delta resync suffices (no full one was asked for).
    pub async fn resync_requested(&self) -> bool {
        self.resync.notify.notified().await;
        !self.resync.full.swap(false, Ordering::Relaxed)
    }

    /// Publishes a checkpoint the stream may save.
    pub fn checkpoint(&self, saved: Saved) -> Arc<Saved> {
        let saved = Arc::new(saved);
        self.tx.send_modify(|s| s.checkpoint = Some(saved.clone()));
        saved
    }

    /// Completes once the writer has written `saved` (published with [`Reporter::checkpoint`]).
    pub async fn written(&self, saved: &Arc<Saved>) {
        let (ids, bump) = &*self.registry.wanted;
        ids.lock()
            .expect("wanted lock poisoned")
            .insert(self.id.clone());
        bump.send_modify(|n| *n = n.wrapping_add(1));
        loop {
            let wrote = self.registry.wrote.notified();
            tokio::pin!(wrote);
            wrote.as_mut().enable();
            let done = self
                .registry
                .lock()
                .written
                .get(&self.id)
                .is_some_and(|w| Arc::ptr_eq(w, saved));
            if done {
                return;
            }
            wrote.await;
        }
    }

    /// The stream is gone for good (its namespace left): its entry is removed and its checkpoint
    /// deleted on the next write, unless a newer stream of the same id registered since.
    pub fn retire(self) {
        let mut inner = self.registry.lock();
        if inner
            .streams
            .get(&self.id)
            .is_some_and(|e| e.generation == self.generation)
        {
            inner.streams.remove(&self.id);
            inner.retired.push(self.id.clone());
            drop(inner);
            self.registry.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(rv: &str) -> Saved {
        Saved {
            rv: Some(rv.into()),
            at: None,
            query: None,
            sum: None,
            table: None,
            fences: Default::default(),
            covered: None,
            route: None,
            kind: None,
            known: None,
            rewound: false,
            era: 0,
        }
    }

    #[test]
    fn one_parts_success_does_not_clear_anothers_problem() {
        let r = Registry::new();
        r.begin_term(Role::Member);
        let problem = |kind: &str, m: &str| Some((kind.to_string(), m.to_string()));
        r.block_for("w/cp-s0", problem("changed", "topic T was recreated"));
        r.block_for("w/cp-s1", problem("unavailable", "topic T is unreachable"));
        // Shard 2 restores fine: the others stay blocked.
        r.block_for("w/cp-s2", None);
        let readiness = r.readiness();
        assert!(!readiness.ready);
        assert_eq!(
            readiness.blocked.as_deref(),
            Some("w/cp-s0: topic T was recreated; w/cp-s1: topic T is unreachable")
        );
        assert!(r.blocked_by("changed") && r.blocked_by("unavailable"));
        r.block_for("w/cp-s1", None);
        assert!(!r.blocked_by("unavailable") && r.blocked_by("changed"));
        assert_eq!(
            r.readiness().blocked.as_deref(),
            Some("w/cp-s0: topic T was recreated")
        );
        // The replica's own problem is named as before, beside the shards'.
        r.block(Some("topic S has 3 partitions".into()));
        r.block_for("w/cp-s0", None);
        assert_eq!(
            r.readiness().blocked.as_deref(),
            Some("topic S has 3 partitions")
        );
        r.block(None);
        assert_eq!(r.readiness().blocked, None);
        assert!(r.readiness().ready);
    }

    #[test]
    fn readiness_follows_phases_and_role() {
        let r = Registry::new();
        assert!(!r.readiness().ready, "no stream yet");
        let a = r.register("a");
        let b = r.register("b");
        a.phase(Phase::Watching);
        assert_eq!(
            r.readiness(),
            Readiness {
                ready: false,
                down: vec!["b".into()],
                problems: BTreeMap::new(),
                blocked: None,
            }
        );
        b.phase(Phase::Watching);
        assert!(r.readiness().ready);
        // A watching stream that has read nothing for longer than the bound is stalled.
        let gauge = IntGauge::new("last", "last line").unwrap();
        gauge.set(crate::metrics::unix_now() - 1000);
        b.track_liveness(gauge.clone());
        assert_eq!(r.readiness().down, vec!["b".to_string()]);
        gauge.set(crate::metrics::unix_now());
        assert!(r.readiness().ready);
        r.begin_term(Role::Standby);
        assert!(r.readiness().ready, "a standby is ready");
        assert!(r.phases().is_empty());
    }

    #[test]
    fn checkpoints_are_taken_once_and_retirements_become_deletions() {
        let r = Registry::new();
        let a = r.register("a");
        let b = r.register("b");
        a.checkpoint(saved("3"));
        b.phase(Phase::Watching);
        let taken = r.take_checkpoints();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken["a"].as_deref(), Some(&saved("3")));
        assert!(r.take_checkpoints().is_empty(), "nothing new since");
        b.checkpoint(saved("5"));
        drop(b);
        assert_eq!(
            r.take_checkpoints()["b"].as_deref(),
            Some(&saved("5")),
            "a stopped stream's last checkpoint is still taken"
        );
        a.checkpoint(saved("4"));
        a.retire();
        assert_eq!(
            r.take_checkpoints().into_iter().collect::<Vec<_>>(),
            vec![("a".into(), None)]
        );
    }

    #[tokio::test]
    async fn resync_requests_reach_the_streams_of_their_channel() {
        let r = Registry::new();
        let pods_a = r.register("pods.a");
        let pods_b = r.register("pods.b");
        let nodes = r.register("nodes._all");
        assert_eq!(r.request_resync("pods", false), 2);
        assert!(!pods_a.resync_requested().await, "a full resync");
        assert!(!pods_b.resync_requested().await);
        assert_eq!(r.request_resync("all", true), 3);
        assert!(nodes.resync_requested().await, "a delta resync");
        assert!(pods_a.resync_requested().await);
        assert_eq!(r.request_resync("services", false), 0);
        // A full request and a delta one pending together: the full one wins.
        r.request_resync("pods", false);
        r.request_resync("pods", true);
        assert!(!pods_b.resync_requested().await);
    }

    #[test]
    fn an_old_stream_retiring_never_touches_a_newer_one_of_the_same_id() {
        let r = Registry::new();
        let old = r.register("a");
        let new = r.register("a");
        old.retire();
        assert!(r.take_checkpoints().is_empty());
        new.checkpoint(saved("9"));
        assert_eq!(r.take_checkpoints()["a"].as_deref(), Some(&saved("9")));
        assert_eq!(r.phases().len(), 1);
    }
}
