//! The supervisor: spawns the streams of one term and follows namespace selectors.
//!
//! # Streams of one id never overlap
//! A namespace that leaves a selector and comes back (a flapping label) starts a new stream of
//! the same id while the old one may still be leaving (publishing inferred DELETEDs, waiting for
//! its position to be forgotten in the ConfigMap). The new stream waits for the old one to end
//! before it even registers: its ADDEDs come after the old one's DELETEDs on every key, and the
//! old one keeps its registry entry, so its checkpoint writes complete and it cannot wait
//! forever for a write nobody makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::checkpoint::Saved;
use crate::config::{Channel, Scope, Shape, Shapes, StreamId};
use crate::membership::{Claim, Restored};
use crate::registry::{Part, Registry};
use crate::relay::feeds::Feeds;
use crate::stream::{Ended, Lifetime, NamespaceFilter, Namespaces, Resumed, Stream, Wiring};

/// Spawns streams and follows namespace selectors, within one term.
#[derive(Clone)]
pub(super) struct Supervisor {
    wiring: Arc<Wiring>,
    registry: Registry,
    /// Checkpoints loaded at the start of the term, taken by the first stream of each id.
    saved: Arc<Mutex<HashMap<String, Saved>>>,
    /// Members read at the start of the term, taken by the first stream of each id; a stream
    /// that returns later keeps its members in its outbox until it leaves.
    members: Arc<Mutex<Restored>>,
    /// Cancelled when the latest stream of each id has ended.
    ends: Arc<Mutex<HashMap<StreamId, CancellationToken>>>,
    /// How each channel over several namespaces watches them this term.
    shapes: Arc<Shapes>,
    /// The streams this term runs (a shard's, or all).
    part: Part,
    /// The namespaces each selector matches, followed once for the replica.
    feeds: Arc<Feeds>,
    tasks: TaskTracker,
}

/// A running stream, as its owner sees it.
struct Handle {
    stop: CancellationToken,
    /// Cancelled when the stream goes away for good: it deletes what it announced, and its
    /// checkpoint is deleted.
    leaving: CancellationToken,
}

impl Handle {
    fn retire(self) {
        self.leaving.cancel();
        self.stop.cancel();
    }
}

impl Supervisor {
    pub fn new(
        wiring: Arc<Wiring>,
        registry: Registry,
        saved: HashMap<String, Saved>,
        members: Restored,
        shapes: Shapes,
        part: Part,
        feeds: Arc<Feeds>,
    ) -> Self {
        Self {
            wiring,
            registry,
            saved: Arc::new(Mutex::new(saved)),
            members: Arc::new(Mutex::new(members)),
            ends: Arc::default(),
            shapes: Arc::new(shapes),
            part,
            feeds,
            tasks: TaskTracker::new(),
        }
    }

    /// Starts the streams of `channels`, and the followers of their namespace selectors; the
    /// ids of the streams started here (not those a follower starts as namespaces come).
    pub fn start(&self, channels: &[Arc<Channel>], cancel: &CancellationToken) -> Vec<String> {
        let mut started = Vec::new();
        let mut spawn = |channel: &Arc<Channel>, ns: Option<&String>, filter| {
            started.push(self.id_of(channel, ns.map(String::as_str)).to_string());
            self.spawn(channel, ns.cloned(), cancel, filter);
        };
        for channel in channels {
            let wide = self.shapes.get(&channel.name) == Some(&Shape::ClusterWide);
            // A stream over one collection goes whole to the term whose part holds it, or with
            // sharding on, each shard's term runs its part.
            if (wide || channel.scope == Scope::Cluster) && !self.ours(channel, None) {
                continue;
            }
            match &channel.scope {
                Scope::Cluster => spawn(channel, None, None),
                Scope::Namespaces(list) if wide => {
                    let filter = self.within(channel, NamespaceFilter::fixed(list.iter().cloned()));
                    spawn(channel, None, Some(filter));
                }
                Scope::Namespaces(list) => {
                    for ns in list.iter().filter(|ns| self.ours(channel, Some(ns))) {
                        spawn(channel, Some(ns), None);
                    }
                }
                Scope::Selector(sel) if wide => {
                    let filter = NamespaceFilter::following(self.feeds.subscribe(sel));
                    spawn(channel, None, Some(self.within(channel, filter)));
                }
                Scope::Selector(sel) => {
                    let follower = self.clone().follow_namespaces(
                        channel.clone(),
                        self.feeds.subscribe(sel),
                        cancel.child_token(),
                    );
                    self.tasks.spawn(follower);
                }
            }
        }
        started
    }

    /// Whether this term runs `channel`'s stream over `namespace`.
    fn ours(&self, channel: &Channel, namespace: Option<&str>) -> bool {
        (self.part)(&self.id_of(channel, namespace))
    }

    /// The id of `channel`'s stream over `namespace` in this term: with sharding on, a stream
    /// over one collection is the shard's part of it.
    fn id_of(&self, channel: &Channel, namespace: Option<&str>) -> StreamId {
        match (namespace, self.wiring.shard) {
            (None, Some(owner)) if !channel.kept_whole => {
                StreamId::fanned(&channel.name, owner.shard)
            }
            _ => channel.stream_id(namespace),
        }
    }

    /// A filtered stream's namespaces, with sharding on only its shard's (all of them for a
    /// stream kept whole).
    fn within(&self, channel: &Channel, filter: NamespaceFilter) -> NamespaceFilter {
        let Some(owner) = self.wiring.shard.filter(|_| !channel.kept_whole) else {
            return filter;
        };
        let sharding = self.wiring.cfg.sharding.clone();
        filter.within(Arc::new(move |ns| sharding.shard_of(ns) == owner.shard))
    }

    /// Waits for every stream and follower to end (cancel them first).
    pub async fn wait(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    fn spawn(
        &self,
        channel: &Arc<Channel>,
        namespace: Option<String>,
        parent: &CancellationToken,
        filter: Option<NamespaceFilter>,
    ) -> Handle {
        let id = self.id_of(channel, namespace.as_deref());
        let stop = parent.child_token();
        let leaving = CancellationToken::new();
        // A stream of the same id still leaving (its namespace left and came back) finishes
        // first: its inferred DELETEDs come before this one's ADDEDs on every key.
        let ended = CancellationToken::new();
        let previous = self
            .ends
            .lock()
            .expect("ends lock poisoned")
            .insert(id.clone(), ended.clone());
        let this = self.clone();
        let (channel, lifetime) = (
            channel.clone(),
            Lifetime {
                stop: stop.clone(),
                shutdown: parent.clone(),
                leaving: leaving.clone(),
            },
        );
        let claimed = self.claimed(&channel, namespace.as_deref(), filter.as_ref());
        tracing::info!(stream = %id, "starting stream");
        self.tasks.spawn(async move {
            if let Some(owner) = claimed {
                let message = format!("another release ({owner}) announced objects of this stream's scope on its topic: the two would interleave on each key. Give the channel a topic of its own (or retire the other release's streams)");
                tracing::error!(stream = %id, %owner, "not relaying: {message}");
                this.registry.register(&id).problem(message);
                lifetime.stop.cancelled().await;
                ended.cancel();
                return;
            }
            if let Some(previous) = previous {
                previous.cancelled().await;
            }
            if lifetime.stop.is_cancelled() && !lifetime.leaving.is_cancelled() {
                ended.cancel();
                return;
            }
            let stream = this.stream(&id, channel, namespace, lifetime, filter);
            // A stream that panicked relays nothing more: the process must restart.
            match std::panic::AssertUnwindSafe(stream.run())
                .catch_unwind()
                .await
            {
                Ok(Ended::Left(reporter)) => {
                    reporter.retire();
                    this.wiring.metrics.forget_stream(&id);
                    tracing::info!(stream = %id, "stream retired");
                }
                Ok(_) => {}
                Err(_) => this.registry.fail(format!("stream {id} died")),
            }
            ended.cancel();
        });
        Handle { stop, leaving }
    }

    /// The other owner, if any, whose live members (in the membership topic at the start of
    /// the term) were announced on this stream's topic in a namespace of its scope. A
    /// cluster-wide stream filtered by a selector is not checked: its namespaces are not known
    /// yet.
    fn claimed(
        &self,
        channel: &Channel,
        namespace: Option<&str>,
        filter: Option<&NamespaceFilter>,
    ) -> Option<String> {
        let cfg = &self.wiring.cfg;
        let cluster = &cfg.cluster_name;
        // A shard's part of a fanned-out stream shares its collection with the release's other
        // shards' parts: their claims are of other objects, never of its own.
        let sibling = |owner: &str| self.wiring.shard.is_some() && cfg.checkpoint.owns(owner);
        let ours = |c: &&Claim| {
            channel.topic_for(cluster, c.namespace.as_deref()) == c.topic && !sibling(&c.owner)
        };
        let members = self.members.lock().expect("members lock poisoned");
        let found = match (namespace, &channel.scope) {
            (Some(_), _) => members.claims_in(namespace).iter().find(ours),
            (None, Scope::Namespaces(list)) if filter.is_some() => list
                .iter()
                .flat_map(|ns| members.claims_in(Some(ns)))
                .find(ours),
            (None, Scope::Selector(_)) => None,
            // One collection: every namespace (or the cluster-scoped objects).
            (None, _) => members.claims().find(ours),
        };
        found.map(|c| c.owner.clone())
    }

    /// Builds stream `id`, with what the term loaded for it, once no other stream of its id
    /// runs.
    fn stream(
        &self,
        id: &str,
        channel: Arc<Channel>,
        namespace: Option<String>,
        lifetime: Lifetime,
        filter: Option<NamespaceFilter>,
    ) -> Stream {
        let saved = self.saved.lock().expect("saved lock poisoned").remove(id);
        let members = self.members.lock().expect("members lock poisoned").take(id);
        let reporter = self.registry.register(id);
        Stream::new(
            channel,
            namespace,
            &self.wiring,
            reporter,
            Resumed { saved, members },
            lifetime,
            filter,
        )
    }

    /// Retires the streams of selector channel `channel` that were left with members or a
    /// position but are not running (`running` says which are) once its namespaces are listed:
    /// their namespace left the scope while the relay was down. Each is started leaving, so it
    /// deletes what it announced and its entry goes.
    fn retire_orphans(
        &self,
        channel: &Arc<Channel>,
        running: &dyn Fn(&str) -> bool,
        parent: &CancellationToken,
    ) {
        let mut orphans: Vec<String> = self
            .members
            .lock()
            .expect("members lock poisoned")
            .streams()
            .map(str::to_string)
            .collect();
        orphans.extend(
            self.saved
                .lock()
                .expect("saved lock poisoned")
                .keys()
                .cloned(),
        );
        orphans.sort();
        orphans.dedup();
        let started = self.ends.lock().expect("ends lock poisoned").clone();
        for id in orphans {
            let Some((name, Some(ns))) = StreamId::parts(&id) else {
                continue;
            };
            if name != channel.name || running(ns) || started.contains_key(id.as_str()) {
                continue;
            }
            tracing::info!(stream = %id, "stream no longer in scope since the last run; deleting what it announced");
            self.spawn(channel, Some(ns.to_string()), parent, None)
                .retire();
        }
    }

    /// Keeps one stream per namespace of `matched` (the namespaces its selector matches) in
    /// this term's part. Streams of namespaces that left are retired, and so are streams
    /// checkpointed or with members whose namespace left while the relay was down.
    async fn follow_namespaces(
        self,
        channel: Arc<Channel>,
        mut matched: tokio::sync::watch::Receiver<Namespaces>,
        cancel: CancellationToken,
    ) {
        let mut running: HashMap<String, Handle> = HashMap::new();
        loop {
            let set = matched.borrow_and_update().clone();
            if let Some(set) = set {
                for name in set.iter().filter(|ns| self.ours(&channel, Some(ns))) {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        running.entry(name.clone())
                    {
                        let h = self.spawn(&channel, Some(name.clone()), &cancel, None);
                        slot.insert(h);
                    }
                }
                let gone: Vec<String> = running
                    .keys()
                    .filter(|n| !set.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    running.remove(&name).expect("present").retire();
                }
                self.retire_orphans(&channel, &|ns| running.contains_key(ns), &cancel);
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = matched.changed() => if changed.is_err() { return },
            }
        }
    }
}
