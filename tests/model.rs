//! Model-based: the consumer's promise under random histories.
//!
//! Each case draws, from its seed, a history of cluster operations (create, modify, delete,
//! recreate under the same name, moving a pod in and out of the label selector, moving a
//! namespace in and out of the namespace selector, compacting history so positions expire (a
//! delta resync follows), cutting watches and syncs, asking for a resync, full or delta, as
//! `watchrelay resync` does, etcd snapshots and restores with and without a bumped revision,
//! followed by the runbook's `watchrelay resync all` where no checkpoint was written between
//! the snapshot and the restore, the one restore a relay cannot see),
//! interleaved with relay runs, some of which begin with Kafka refusing records (a
//! retirement's, a sync's), and namespaces moving in or out of the selector while no relay
//! runs. A run ends in a clean stop or in a
//! crash at a random point, with Kafka having written a random prefix of what was sent: before
//! or after acknowledgements, between a membership record and its event. Between runs the
//! configuration may change: the label selector on or off, the scope's shape (a namespace
//! selector, a list of namespaces, all namespaces), its watch strategy (one stream per namespace
//! or one cluster-wide stream filtered in the relay), the channel's name. In half the cases a
//! second release (its own checkpoint ConfigMap, the same cluster name, the same membership
//! topic and the same pods topic) relays namespace `c` and restarts in turn. After the history,
//! one clean run of each: the view built by applying every delivered record key by key must
//! hold, key by key, the very version (uid and resourceVersion) the cluster holds in the two
//! releases' scopes; so must the view that keeps each key's record of the highest
//! `watchrelay.version`, as a table engine keeping the highest version does. A second test
//! runs such cases with both releases on `delivery: exactlyOnce`, over the transactions in
//! memory described below (a crash leaves its transaction open, for the next run's producer to
//! abort; Kafka that stops acknowledging stalls the commits): the committed log must also hold
//! each change once, but for what a list announces again (a requested full resync, a restore)
//! and what a retired stream's successor announces after retracting it (see `assert_once`).
//!
//! A third test runs a sharded release instead: up to three replicas, each with a producer of
//! its own over the shared log, join, leave cleanly, crash (Kafka having written a random prefix
//! of what was sent), are cut off from the group past their session (frozen, or partitioned
//! from the coordinator: they fence themselves while their shards move), have their data
//! partition stall across a rebalance and come back, and are replaced one by one in rolling
//! updates to another configuration (old and new side by side; a change that would move keys
//! between shards refused by the first new replica), while the group loses its epochs and
//! owner epochs are raised by hand on the shards' ConfigMaps, between the same cluster
//! operations, meeting in an in-memory group that hands shards over as Kafka's cooperative
//! protocol does; the consumer's view must end as the cluster's all the same. A fourth checks
//! the history of such cases as well: every change outside a 410's gap is published, in order.
//! A fifth runs those cases with `delivery: exactlyOnce` over transactions in memory (each
//! term's producer fenced by the next owner's, a stalled partition failing commits, commits'
//! answers lost so the relay must read their outcome, the broker restarting past every
//! replica's session): the committed log must hold every change once, in order.
//!
//! `WATCHRELAY_MODEL_CASES` sets the cases per test (default 6); `WATCHRELAY_MODEL_SEED` runs one
//! case. A failing case prints its seed and history.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::bed::{eventually, Bed, Relay};
use common::rng::Rng;
use common::view::{self, consumer_view_by, events, json, version_view_by};
use watchrelay::checkpoint::WRITES_KEY;
use watchrelay::config::Config;
use watchrelay::producer::{Producer, Record};
use watchrelay::testing::{Lane, Memory, MemoryGroup, Order, Transactions};
use watchrelay_sim::{objects, Fault, SimConfig};

const NAMESPACES: [&str; 2] = ["a", "b"];
/// The second release's namespace.
const OTHER: &str = "c";
const NAMES: u64 = 6;

/// How the first release's channel covers namespaces `a` and `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Selector,
    List,
    /// Every namespace: drawn only without the second release, whose namespace it would cover.
    All,
}

/// The first release's configuration in one run.
#[derive(Clone, Copy, Debug)]
struct Run {
    selector: bool,
    shape: Shape,
    /// The channel's name: `pods`, or `renamed`.
    renamed: bool,
    /// Watched by one cluster-wide stream (filtered in the relay for a selector or a list;
    /// `watchStrategy: clusterWide`), not one stream per namespace; with sharding on, every
    /// shard runs its part of it, the replica reading the collection once for all its shards.
    wide: bool,
}

impl Run {
    fn draw(rng: &mut Rng, other: bool) -> Self {
        let shape = match rng.below(if other { 2 } else { 3 }) {
            0 => Shape::Selector,
            1 => Shape::List,
            _ => Shape::All,
        };
        Self {
            selector: rng.chance(50),
            shape,
            renamed: rng.chance(25),
            wide: rng.chance(50),
        }
    }
}

fn config(bed: &Bed, run: Run) -> Config {
    let labels = if run.selector {
        "    labelSelector: tier=web\n"
    } else {
        ""
    };
    let scope = match run.shape {
        Shape::Selector => "namespaceSelector: relay=yes",
        Shape::List => "namespaces: [a, b]",
        Shape::All => "allNamespaces: true",
    };
    let name = if run.renamed { "renamed" } else { "pods" };
    // Every namespace with `clusterWide`: one stream over the collection (with sharding on, each
    // shard its part of it), not one per namespace.
    let strategy = if run.wide {
        "    watchStrategy: clusterWide\n"
    } else {
        ""
    };
    bed.config(
        &format!("  - operationId: watchNamespacedPods\n    name: {name}\n    {scope}\n    topic: pods\n{labels}{strategy}"),
        "",
    )
}

/// The second release: namespace `c` into the same topic, under its own checkpoint ConfigMap.
fn other_config(bed: &Bed) -> Config {
    let mut cfg = bed.config(
        "  - operationId: watchNamespacedPods\n    name: pods\n    namespaces: [c]\n    topic: pods\n",
        "",
    );
    cfg.checkpoint.name = "relay-b".into();
    cfg
}

fn pod(ns: &str, name: &str, tier: &str) -> serde_json::Value {
    let mut p = objects::pod(ns, name);
    p["metadata"]["labels"]["tier"] = tier.into();
    p
}

/// An etcd snapshot the history took, with each checkpoint ConfigMap's write counter then.
struct Taken {
    snapshot: watchrelay_sim::Snapshot,
    writes: BTreeMap<String, String>,
}

/// Each checkpoint ConfigMap's write counter (its `.writes` entry), by name.
fn write_counters(bed: &Bed) -> BTreeMap<String, String> {
    bed.sim
        .list("configmaps", Some(common::bed::CHECKPOINT_NS))
        .into_iter()
        .filter_map(|cm| {
            let name = cm["metadata"]["name"].as_str()?.to_string();
            Some((name, cm["data"][WRITES_KEY].as_str()?.to_string()))
        })
        .collect()
}

/// One random cluster operation; returns what it did. `snapshot` is the etcd snapshot the
/// history took last, if any. With `exact`, only changes of pods: nothing that excuses a list
/// collapsing changes (a compaction, a restore, a resync asked for, a namespace's scope).
fn operate(bed: &Bed, rng: &mut Rng, snapshot: &mut Option<Taken>, exact: bool) -> String {
    let ns = rng.pick(&[NAMESPACES[0], NAMESPACES[1], OTHER]);
    let name = format!("p{}", rng.below(NAMES));
    let tier = rng.pick(&["web", "db"]);
    let exists = bed.sim.get("pods", Some(ns), &name).is_some();
    let did = change(bed, rng, snapshot, exact, (ns, &name, tier, exists));
    // Each change followed by another of the same pod: a list that collapses them loses one,
    // which the history check then sees.
    if exact && bed.sim.get("pods", Some(ns), &name).is_some() {
        let patch = serde_json::json!({"metadata": {"labels": {"step": rng.next().to_string()}}});
        bed.sim.merge_patch("pods", Some(ns), &name, patch).unwrap();
        return format!("{did}, then changed again");
    }
    did
}

fn change(
    bed: &Bed,
    rng: &mut Rng,
    snapshot: &mut Option<Taken>,
    exact: bool,
    (ns, name, tier, exists): (&str, &str, &str, bool),
) -> String {
    match rng.below(13) {
        7 | 8 | 10..=12 if exact => "nothing".into(),
        0..=2 if exists => {
            bed.sim.delete("pods", Some(ns), name).unwrap();
            bed.sim
                .create("pods", Some(ns), pod(ns, name, tier))
                .unwrap();
            format!("recreate {ns}/{name} {tier}")
        }
        0..=2 => {
            bed.sim
                .create("pods", Some(ns), pod(ns, name, tier))
                .unwrap();
            format!("create {ns}/{name} {tier}")
        }
        3..=4 if exists => {
            let patch = serde_json::json!({"metadata": {"labels": {"tier": tier}}});
            bed.sim.merge_patch("pods", Some(ns), name, patch).unwrap();
            format!("label {ns}/{name} {tier}")
        }
        5..=6 if exists => {
            bed.sim.delete("pods", Some(ns), name).unwrap();
            format!("delete {ns}/{name}")
        }
        7 if ns != OTHER => {
            let on = rng.chance(50);
            bed.label(ns, on);
            format!("namespace {ns} in scope: {on}")
        }
        8 => {
            bed.sim.compact();
            "compact".into()
        }
        9 => {
            bed.sim.drop_watches();
            "cut watches".into()
        }
        10 => {
            // As `watchrelay resync` asks: every object again, or only what changed.
            let what = rng.pick(&["all", "all;delta"]);
            let ask =
                serde_json::json!({"metadata": {"annotations": {"watchrelay.io/resync": what}}});
            match bed.sim.merge_patch(
                "configmaps",
                Some(common::bed::CHECKPOINT_NS),
                common::bed::CHECKPOINT_NAME,
                ask,
            ) {
                Ok(_) => format!("resync requested: {what}"),
                Err(_) => "resync requested before the first checkpoint: none".into(),
            }
        }
        11 => {
            *snapshot = Some(Taken {
                snapshot: bed.sim.snapshot(),
                writes: write_counters(bed),
            });
            "etcd snapshot".into()
        }
        12 => match snapshot {
            Some(taken) => {
                let bump = rng.chance(50).then_some(1000);
                // The restore no relay can see (docs/delivery.md): no checkpoint written
                // between the snapshot and the restore, so nothing went back. The runbook's
                // `watchrelay resync all` follows it there.
                let blind: Vec<String> = write_counters(bed)
                    .into_iter()
                    .filter(|(name, writes)| taken.writes.get(name) == Some(writes))
                    .map(|(name, _)| name)
                    .collect();
                bed.sim.restore(&taken.snapshot, bump);
                let ask = serde_json::json!({"metadata": {"annotations": {"watchrelay.io/resync": "all"}}});
                for name in &blind {
                    bed.sim
                        .merge_patch(
                            "configmaps",
                            Some(common::bed::CHECKPOINT_NS),
                            name,
                            ask.clone(),
                        )
                        .unwrap();
                }
                format!("etcd restored from the snapshot, bumped {bump:?}; resync all asked of {blind:?}")
            }
            None => "nothing".into(),
        },
        _ => "nothing".into(),
    }
}

/// What a consumer must end with: the pods in the first release's scope under `run`, and the
/// second release's when it runs, key -> uid.
fn in_scope(bed: &Bed, run: Run, other: bool) -> BTreeMap<String, String> {
    let namespaces: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .chain((run.shape == Shape::All).then_some(OTHER))
        .filter(|ns| {
            run.shape != Shape::Selector
                || bed
                    .sim
                    .get("namespaces", None, ns)
                    .is_some_and(|n| n["metadata"]["labels"]["relay"] == "yes")
        })
        .collect();
    let mut want = view::pods_by(
        &bed.sim,
        &namespaces,
        |p| !run.selector || p["metadata"]["labels"]["tier"] == "web",
        view::version,
    );
    if other {
        want.extend(view::pods_by(&bed.sim, &[OTHER], |_| true, view::version));
    }
    want
}

/// What Kafka wrote of what it held when a process crashed: a random prefix, in a random
/// order across partitions. Told in `history` as `what`.
fn crash_writes(producer: &Memory, rng: &mut Rng, history: &mut String, what: &str) {
    let written = rng.below(producer.held() as u64 + 1) as usize;
    let _ = writeln!(
        history,
        "{what}: kafka wrote {written} of {} held",
        producer.held()
    );
    producer.release_first(written, Order::Shuffled(rng.next()));
}

/// The cluster of a case: namespaces `a` and `b` in the selector's scope, `c` for the second
/// release; initial events served or not, as drawn (returned).
async fn model_bed(rng: &mut Rng) -> (Bed, bool) {
    let watch_list = rng.chance(50);
    let bed = Bed::in_memory(
        SimConfig {
            watch_list,
            ..SimConfig::default()
        },
        &[NAMESPACES[0], NAMESPACES[1], OTHER],
    )
    .await;
    for ns in NAMESPACES {
        bed.label(ns, true);
    }
    (bed, watch_list)
}

/// A case of one process at a time (see the module); `once`: both releases with `delivery:
/// exactlyOnce`, and every change published once but for what a list repeats (see
/// [`assert_once`]).
async fn case(seed: u64, once: bool) {
    let exact = false;
    let mut rng = Rng(seed | 1);
    // Drawn in the order they always were, so a seed replays the same history.
    let (bed, watch_list) = model_bed(&mut rng).await;
    let other = rng.chance(50);
    let producer = Arc::new(Memory::new());
    let txns = once.then(|| Transactions::new(producer.clone()));
    let mut history = format!(
        "seed {seed}: initial events {watch_list}, second release {other}, exactly once: {once}\n"
    );
    let delivery = |mut cfg: Config| {
        if once {
            cfg.kafka.delivery = watchrelay::config::Delivery::ExactlyOnce;
        }
        cfg
    };
    let start = |bed: &Bed, cfg: Config| {
        Relay::start_with_txns(bed, delivery(cfg), producer.clone(), txns.as_ref())
    };
    let start_other = |bed: &Bed| other.then(|| start(bed, other_config(bed)));
    // Kafka stops acknowledging, or (`false`) acknowledges what it held: in transactions, a
    // stalled partition, whose commits wait and fail past their timeout.
    let hold = |on: bool| match &txns {
        Some(t) => t.hold_to(on.then_some("pods")),
        None => producer.hold(on),
    };
    // Where the log stood at the first etcd restore: what follows may announce again what
    // came before (see [`assert_once`]).
    let restored_at = std::cell::Cell::new(None);
    let restored = |did: &str| {
        if did.starts_with("etcd restored") && restored_at.get().is_none() {
            restored_at.set(Some(events(&producer).len()));
        }
    };
    let mut run = Run::draw(&mut rng, other);
    let mut snapshot = None;
    for _ in 0..2 + rng.below(3) {
        // A restart keeps the configuration as often as not.
        if rng.chance(60) {
            run = Run::draw(&mut rng, other);
        }
        let _ = writeln!(history, "start {run:?}");
        // Kafka refuses the first records of the run: a retirement's, a sync's.
        if rng.chance(25) {
            let n = 1 + rng.below(3) as usize;
            producer.fail_next_to("pods", n);
            let _ = writeln!(history, "  kafka fails the next {n} records on pods");
        }
        let relay = start(&bed, config(&bed, run));
        // The second release restarts in turn with the first, or keeps running.
        let b = if rng.chance(50) {
            start_other(&bed)
        } else {
            None
        };
        let hold_at = rng.below(8);
        for i in 0..rng.below(10) {
            if i == hold_at {
                hold(true);
                let _ = writeln!(history, "  kafka stops acknowledging");
            }
            let did = operate(&bed, &mut rng, &mut snapshot, exact);
            restored(&did);
            let _ = writeln!(history, "  {did}");
            // Not a wait: a random pause between operations, so that crashes and stops land
            // at random points of the relay's work.
            tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        }
        if rng.chance(60) {
            crash_writes(&producer, &mut rng, &mut history, "crash");
            relay.kill().await;
            if let Some(b) = b {
                b.kill().await;
            }
            producer.purge();
        } else {
            let _ = writeln!(history, "clean stop");
            hold(false);
            producer.release(Order::Sent);
            relay.stop().await;
            if let Some(b) = b {
                b.stop().await;
            }
        }
        hold(false);
        for _ in 0..rng.below(4) {
            let did = operate(&bed, &mut rng, &mut snapshot, exact);
            restored(&did);
            let _ = writeln!(history, "  down: {did}");
        }
        // A namespace moving in or out of the selector while the relay is down, more often
        // than the operations draw it: the next start resumes across the move when it can.
        if rng.chance(40) {
            let ns = rng.pick(&NAMESPACES);
            let on = rng.chance(50);
            bed.label(ns, on);
            let _ = writeln!(history, "  down: namespace {ns} in scope: {on}");
        }
    }
    if rng.chance(50) {
        run = Run::draw(&mut rng, other);
    }
    let _ = writeln!(history, "final run {run:?}");
    let relay = start(&bed, config(&bed, run));
    let b = start_other(&bed);
    producer.fail_next_to("pods", 0);
    let want = in_scope(&bed, run, other);
    let converged = converges(&producer, &want).await;
    relay.stop().await;
    if let Some(b) = b {
        b.stop().await;
    }
    if !converged {
        fail(seed, &history, &producer, &want);
    }
    if let Some(t) = &txns {
        let reproduce =
            format!("{history}reproduce: WATCHRELAY_MODEL_SEED={seed} cargo test --test model");
        let (committed, aborted) = t.settled_records();
        eprintln!("seed {seed}: {committed} records committed, {aborted} aborted");
        // A history may leave nothing to publish (no pod ever in scope).
        assert!(
            committed > 0 || events(&producer).is_empty(),
            "records outside any transaction\n{reproduce}"
        );
        assert_once(&events(&producer), restored_at.get(), &reproduce);
    }
}

/// Whether the consumer's view reaches `want` (within 30 s): applying the records key by key
/// in partition order, and keeping each key's record of the highest `watchrelay.version`.
async fn converges(producer: &Memory, want: &BTreeMap<String, String>) -> bool {
    for _ in 0..300 {
        let log = events(producer);
        if consumer_view_by(&log, view::version) == *want
            && version_view_by(&log, view::version) == *want
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Fails the case `seed` with its history and every record the consumer read.
fn fail(seed: u64, history: &str, producer: &Memory, want: &BTreeMap<String, String>) {
    let mut records = String::new();
    for r in events(producer) {
        let v = json(&r);
        let _ = writeln!(
            records,
            "  {} {} {} v{}{}{}",
            r.key,
            v["type"].as_str().unwrap_or("null"),
            v["object"]["metadata"]["uid"].as_str().unwrap_or(""),
            v["watchrelay"]["version"].as_str().unwrap_or("-"),
            if v["watchrelay"]["synthetic"] == true {
                " inferred"
            } else {
                ""
            },
            match r.headers.get("ce_shard") {
                Some(shard) => format!(
                    " shard {shard} epoch {}",
                    r.headers.get("ce_ownerepoch").unwrap_or("")
                ),
                None => String::new(),
            }
        );
    }
    panic!(
        "the consumer's view is not the cluster's\n{history}records:\n{records}consumer {:?}\nby version {:?}\ncluster  {want:?}\nreproduce: WATCHRELAY_MODEL_SEED={seed} cargo test --test model",
        consumer_view_by(&events(producer), view::version),
        version_view_by(&events(producer), view::version)
    );
}

/// By how much a session outlasts the ownership deadline: the least the configuration allows.
const SESSION_MARGIN: Duration = Duration::from_secs(3);

/// A case of a sharded release: replicas join, leave cleanly, crash (Kafka having written a
/// random prefix of what was sent) and are cut off from the group past their session between
/// cluster operations, over the in-memory group; the group forgets its epochs (its committed
/// offsets lost) and shards' owner epochs are raised by hand on their ConfigMaps. At the end
/// the consumer's view must be the cluster's, as with one process.
///
/// With `exact`, the history is checked too: the channel covers `namespaces: [a, b]`, a
/// selector matching both or every namespace, drawn once for the case (per namespace or fanned
/// out, switched by rollouts), and the cluster's operations are changes of pods only, but for
/// gaps (see [`gap`]: history dropped while no read reaches the server, then the lists after it
/// cut midway), the one thing that excuses a list collapsing changes. Every change the API
/// server made after the first replica's streams had their positions, outside the gaps, must
/// have its record, each object's in order, whichever replica relayed it, through every crash,
/// cut, stall, handover, shape switch and gap.
/// A sharded case (see the module); `exact`: its history is checked too; `once`: with
/// `delivery: exactlyOnce`, every change is published once.
async fn replicas_case(seed: u64, exact: bool, once: bool) {
    let mut rng = Rng(seed | 1);
    let (bed, watch_list) = model_bed(&mut rng).await;
    let producer = Arc::new(Memory::new());
    let txns = once.then(|| Transactions::new(producer.clone()));
    let group = MemoryGroup::default();
    // With `exact`, the scope is one for the whole case (a list, a selector matching both
    // namespaces, or every namespace), so that only the watch strategy switches: a scope that
    // changes shape relists its new namespaces. Every namespace is always fanned out with
    // sharding on: those cases switch nothing, and check the history across handovers.
    let exact_shape = match exact.then(|| rng.below(3)) {
        Some(1) => Shape::Selector,
        Some(2) => Shape::All,
        _ => Shape::List,
    };
    let draw = |rng: &mut Rng| {
        let run = Run::draw(rng, false);
        if exact {
            Run {
                selector: false,
                shape: exact_shape,
                renamed: false,
                ..run
            }
        } else {
            run
        }
    };
    let mut run = draw(&mut rng);
    let sharded = |run: Run| {
        let mut cfg = common::bed::sharded(config(&bed, run), 4);
        // Short, so that a replica cut off fences itself soon; the session as the group moves
        // a cut replica's shards (its margin after the deadline), so that a hold ends before.
        cfg.sharding.ownership_deadline_ms = 1_000;
        cfg.sharding.session_timeout_ms = 1_000 + SESSION_MARGIN.as_millis() as u32;
        // Lists of several pages, so that a gap's list can be cut midway.
        cfg.kubernetes.list_page_size = 2;
        if once {
            cfg.kafka.delivery = watchrelay::config::Delivery::ExactlyOnce;
        }
        cfg
    };
    let mut cfg = sharded(run);
    // Each replica has a producer of its own over the shared log, as each process has.
    let start = |cfg: &Config| {
        let lane = Lane::new(producer.clone());
        let relay =
            Relay::start_on_lane_with(&bed, cfg.clone(), lane.clone(), &group, txns.as_ref());
        (relay, lane)
    };
    let mut history = format!(
        "seed {seed}: initial events {watch_list}, sharded {run:?}, exactly once: {once}\n"
    );
    let mut snapshot = None;
    // The windows of changes a gap collapsed into lists: `(after, up to)`.
    let mut excused: Vec<(u64, u64)> = Vec::new();
    let mut live = vec![start(&cfg)];
    // Where the history checked starts: once every stream of the first replica has its
    // position (before, a first list announces the state as it is).
    let mut from = 0;
    if exact {
        let first = &live[0].0;
        first.wait_up(2).await;
        let positioned = |id: &String| (0..4).any(|k| bed.shard_checkpoint_rv(k, id).is_some());
        eventually(
            || first.registry.phases().keys().all(positioned),
            || "the first replica's streams never had their positions".into(),
        )
        .await;
        from = bed.sim.current_rv();
        let _ = writeln!(history, "history checked after {from}");
    }
    for _ in 0..6 + rng.below(8) {
        match rng.below(12) {
            0 | 1 if live.len() < 3 => {
                live.push(start(&cfg));
                let _ = writeln!(history, "replica joins: {}", live.len());
            }
            2 if live.len() > 1 => {
                let (r, _) = live.remove(rng.below(live.len() as u64) as usize);
                r.stop().await;
                let _ = writeln!(history, "replica leaves: {}", live.len());
            }
            4 if !live.is_empty() => {
                // A replica cut off from the group (frozen, or partitioned from the
                // coordinator) past its session while the cluster changes: it fences itself,
                // its shards move, and it comes back to learn they were lost.
                let (g, k) = (group.clone(), rng.below(3) as usize);
                tokio::task::spawn_blocking(move || g.cut(k, SESSION_MARGIN))
                    .await
                    .unwrap();
                let _ = writeln!(history, "replica cut off past its session");
                let _ = writeln!(
                    history,
                    "  {}",
                    operate(&bed, &mut rng, &mut snapshot, exact)
                );
                let g = group.clone();
                tokio::task::spawn_blocking(move || g.heal()).await.unwrap();
                let _ = writeln!(history, "replica back");
            }
            5 => {
                // The group's committed offsets are gone (retention past an empty group, the
                // group deleted): its epochs start again at 1, below those stamped.
                group.forget_epochs();
                let _ = writeln!(history, "the group's epochs are lost");
            }
            6 => {
                // Somebody raises a shard's owner epoch by hand on its ConfigMap.
                let k = rng.below(4);
                let name = format!("{}-s{k}", common::bed::CHECKPOINT_NAME);
                let raised = bed
                    .sim
                    .get("configmaps", Some(common::bed::CHECKPOINT_NS), &name)
                    .and_then(|cm| {
                        cm["metadata"]["annotations"]["watchrelay.io/owner-epoch"]
                            .as_str()?
                            .parse::<u64>()
                            .ok()
                    })
                    .map(|e| e + 1 + rng.below(100));
                if let Some(epoch) = raised {
                    let patch = serde_json::json!({"metadata": {"annotations": {"watchrelay.io/owner-epoch": epoch.to_string()}}});
                    let _ = bed.sim.merge_patch(
                        "configmaps",
                        Some(common::bed::CHECKPOINT_NS),
                        &name,
                        patch,
                    );
                    let _ = writeln!(history, "shard {k}'s owner epoch raised by hand to {epoch}");
                }
            }
            7 if !live.is_empty() => {
                // A replica's data partition stalls (its leader frozen) across a rebalance,
                // then comes back: what it still holds of shards that moved must not land
                // after their new owner's records.
                let i = rng.below(live.len() as u64) as usize;
                let lane = live[i].1.clone();
                // In transactions, every replica's: their commits wait, and fail past their
                // timeout.
                match &txns {
                    Some(t) => t.hold_to(Some("pods")),
                    None => lane.hold_to(Some("pods")),
                }
                let _ = writeln!(history, "replica {i}'s data partition stalls");
                for _ in 0..3 {
                    let _ = writeln!(
                        history,
                        "  {}",
                        operate(&bed, &mut rng, &mut snapshot, exact)
                    );
                }
                if live.len() < 3 {
                    live.push(start(&cfg));
                    let _ = writeln!(history, "replica joins: {}", live.len());
                } else {
                    let j = (i + 1 + rng.below(2) as usize) % live.len();
                    let (r, _) = live.remove(j);
                    r.stop().await;
                    let _ = writeln!(history, "replica {j} leaves: {}", live.len());
                }
                // Not a wait: a random stretch of the stall.
                tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
                let _ = writeln!(
                    history,
                    "  {}",
                    operate(&bed, &mut rng, &mut snapshot, exact)
                );
                lane.hold_to(None);
                let _ = writeln!(history, "the partition comes back: {} held", lane.held());
                lane.release();
                if let Some(t) = &txns {
                    t.hold_to(None);
                }
            }
            8 if !live.is_empty() => {
                // A rolling update to another configuration: each replica replaced by one of
                // the new configuration, old and new running side by side meanwhile. A change
                // that would move keys between shards is refused by the first new replica,
                // and the rollout stops there.
                let next = draw(&mut rng);
                let next_cfg = sharded(next);
                let _ = writeln!(history, "rollout to {next:?}");
                let mut rolled = Vec::new();
                let mut refused = None;
                for _ in 0..live.len() {
                    let (new, lane) = start(&next_cfg);
                    // Either refused at start or past its checks (it joined the group).
                    eventually(
                        || new.ended() || new.metrics.shards.get() > 0,
                        || "a new replica neither joined nor ended".into(),
                    )
                    .await;
                    if new.ended() {
                        refused = Some(new.outcome().await);
                        break;
                    }
                    rolled.push((new, lane));
                    // Not a wait: old and new side by side for a random while.
                    tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
                    let (old, _) = live.remove(0);
                    old.stop().await;
                }
                match refused {
                    None => {
                        let _ = writeln!(history, "  rolled out");
                        (run, cfg) = (next, next_cfg);
                    }
                    Some(outcome) => {
                        assert!(
                            rolled.is_empty(),
                            "a replica of the new configuration was refused after another started: {outcome:?}\n{history}"
                        );
                        let _ = writeln!(history, "  refused at start: {outcome:?}");
                    }
                }
                live.extend(rolled);
            }
            9 if exact && !live.is_empty() => {
                let relays: Vec<&Relay> = live.iter().map(|(r, _)| r).collect();
                let (did, window) = gap(
                    &bed,
                    &mut rng,
                    &mut snapshot,
                    &relays,
                    &producer,
                    from,
                    watch_list,
                )
                .await;
                let _ = writeln!(history, "{did}");
                excused.push(window);
            }
            11 if txns.is_some() && !live.is_empty() => {
                // The broker restarts, away past the sessions: every replica fences itself
                // with its transactions open or being committed, and claims again once back.
                let t = txns.as_ref().expect("transactions");
                t.away(true);
                let g = group.clone();
                tokio::task::spawn_blocking(move || g.cut_all(SESSION_MARGIN))
                    .await
                    .unwrap();
                let _ = writeln!(history, "the broker restarts: every replica cut off");
                let _ = writeln!(
                    history,
                    "  {}",
                    operate(&bed, &mut rng, &mut snapshot, exact)
                );
                t.away(false);
                let g = group.clone();
                tokio::task::spawn_blocking(move || g.heal()).await.unwrap();
                let _ = writeln!(history, "the broker is back");
            }
            10 if txns.is_some() => {
                let n = 1 + rng.below(3) as usize;
                txns.as_ref().expect("transactions").lose_commit_answers(n);
                let _ = writeln!(history, "the answers of {n} commits are lost");
            }
            3 if !live.is_empty() => {
                producer.hold(true);
                // Not a wait: a random stretch of work Kafka does not acknowledge.
                tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
                crash_writes(&producer, &mut rng, &mut history, "replica crashes");
                let (r, _) = live.remove(rng.below(live.len() as u64) as usize);
                r.kill().await;
                producer.purge();
                producer.hold(false);
            }
            _ => {
                let _ = writeln!(
                    history,
                    "  {}",
                    operate(&bed, &mut rng, &mut snapshot, exact)
                );
            }
        }
        // Not a wait: a random pause, so that joins, leaves and crashes land at random points.
        tokio::time::sleep(Duration::from_millis(rng.below(80))).await;
    }
    if live.is_empty() {
        live.push(start(&cfg));
    }
    let _ = writeln!(history, "final: {} replicas", live.len());
    let want = in_scope(&bed, run, false);
    let converged = converges(&producer, &want).await;
    let journal: Vec<_> = NAMESPACES
        .iter()
        .flat_map(|ns| bed.journal_after("pods", Some(ns), from))
        .filter(|e| !excused.iter().any(|(a, b)| *a < e.rv && e.rv <= *b))
        .collect();
    // The view can match before every change is published (an object created and deleted while
    // its shard moved ends absent either way): the history is waited for too (within 30 s),
    // while the replicas still run.
    if exact && converged {
        for _ in 0..300 {
            if view::unpublished(&events(&producer), &journal).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (r, _) in live {
        r.stop().await;
    }
    if !converged {
        fail(seed, &history, &producer, &want);
    }
    let reproduce =
        format!("{history}reproduce: WATCHRELAY_MODEL_SEED={seed} cargo test --test model");
    if exact {
        view::assert_published(&events(&producer), &journal, &reproduce);
    }
    if let Some(t) = &txns {
        let (committed, aborted) = t.settled_records();
        eprintln!("seed {seed}: {committed} records committed, {aborted} aborted");
        assert!(
            committed > 0,
            "nothing went through a transaction\n{reproduce}"
        );
    }
    if once {
        assert_once(&events(&producer), None, &reproduce);
    }
    // Every record came from a shard's owner, and per key and shard the owner epochs never go
    // down in partition order (the consumer's epoch rule), whatever happened to the group's
    // epochs or to the stamps on the ConfigMaps.
    let mut highest: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in events(&producer) {
        let epoch: u64 = r
            .headers
            .get("ce_ownerepoch")
            .unwrap_or_else(|| panic!("a record without its owner epoch\n{history}"))
            .parse()
            .unwrap();
        let shard = r.headers.get("ce_shard").unwrap_or_default().to_string();
        let seen = highest.entry((r.key.clone(), shard)).or_default();
        assert!(
            epoch >= *seen,
            "key {}: epoch {epoch} after {seen}\n{history}",
            r.key
        );
        *seen = epoch;
    }
}

/// Asserts that `log` holds each change once. Three things may repeat one, and are counted,
/// not failed:
/// - a list: one cut midway and started over skips what its first attempt announced
///   (`stream::relist`), unless it could not know (past its cap, a delivery failed between),
///   and then announces it again, the same id and version, no state the cluster did not have;
/// - a retraction: a stream retired (its channel renamed, or run in another shape) deletes what
///   it announced (inferred DELETEDs), and the stream taking its objects over announces them
///   again, a DELETED between the two copies;
/// - an etcd restore, after `restored_at` in the log: every stream relists and announces every
///   object again (docs/delivery.md).
fn assert_once(log: &[Record], restored_at: Option<usize>, context: &str) {
    let mut copies: BTreeMap<String, Vec<(usize, bool)>> = BTreeMap::new();
    // Where each object's inferred DELETEDs are, by uid.
    let mut retracted: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in log.iter().enumerate().filter(|(_, r)| !r.tombstone) {
        let v = json(r);
        if v["type"] == "DELETED" && v["watchrelay"]["synthetic"] == true {
            if let Some(uid) = v["object"]["metadata"]["uid"].as_str() {
                retracted.entry(uid.to_string()).or_default().push(i);
            }
        }
        if let Some(id) = v["watchrelay"]["id"].as_str() {
            let resync = v["watchrelay"]["resync"].as_bool() == Some(true);
            copies.entry(id.to_string()).or_default().push((i, resync));
        }
    }
    let (mut relisted, mut reannounced, mut after_restore, mut twice) = (0, 0, 0, Vec::new());
    for (id, c) in copies.iter().filter(|(_, c)| c.len() > 1) {
        let uid = id.split('/').next().unwrap_or_default();
        let retractions = retracted.get(uid).map(Vec::as_slice).unwrap_or_default();
        let after_retraction = |k: usize| {
            let (before, at) = (c[k - 1].0, c[k].0);
            retractions.iter().any(|&d| before < d && d < at)
        };
        if (1..c.len()).all(|k| c[k].1) {
            relisted += 1;
        } else if (1..c.len()).all(|k| c[k].1 || after_retraction(k)) {
            reannounced += 1;
        } else if restored_at.is_some_and(|at| c[1].0 >= at) {
            after_restore += 1;
        } else {
            twice.push(format!("{id} at {c:?} (index, resync)"));
        }
    }
    eprintln!("{relisted} changes announced again by a list started over, {reannounced} after a retraction, {after_restore} after an etcd restore");
    assert!(
        twice.is_empty(),
        "{} changes published more than once, e.g. {:?}\n{context}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
}

/// A gap, the one thing that excuses a list collapsing changes: once every change so far is
/// published, no read reaches the API server while pods change and it then drops its history,
/// so every stream's position is gone (410) and its next sync is a list, which is cut midway
/// (a later page failing, or an initial-events watch cut) and started over. Waits until every
/// stream is positioned past the gap again. Returns what it did and the window of changes the
/// lists may collapse, `(after, up to)`: only those go unchecked.
async fn gap(
    bed: &Bed,
    rng: &mut Rng,
    snapshot: &mut Option<Taken>,
    relays: &[&Relay],
    producer: &Memory,
    from: u64,
    watch_list: bool,
) -> (String, (u64, u64)) {
    let published = || {
        let journal: Vec<_> = NAMESPACES
            .iter()
            .flat_map(|ns| bed.journal_after("pods", Some(ns), from))
            .collect();
        view::unpublished(&events(producer), &journal).is_empty()
    };
    // Bounded: what is still unpublished then fails the case at its end.
    for _ in 0..300 {
        if published() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bed.sim.fail_next(usize::MAX, Fault::ServerError);
    bed.sim.drop_watches();
    let after = bed.sim.current_rv();
    let mut did = String::from("gap:");
    // Some changes at least, so that every position is gone.
    for _ in 0..10 {
        let op = operate(bed, rng, snapshot, true);
        if op != "nothing" {
            let _ = write!(did, " {op};");
        }
        if bed.sim.current_rv() > after && rng.chance(50) {
            break;
        }
    }
    let upto = bed.sim.current_rv();
    bed.sim.compact();
    if watch_list {
        bed.sim.cut_next_watch_line();
    } else {
        bed.sim.fail_next_pages(1);
    }
    bed.sim.stop_failing();
    // Every stream lists past the gap (a stream's position cannot pass it otherwise): those
    // running now, and every stream a shard's checkpoint ConfigMap records, whether or not a
    // term runs it at the moment (a term deposed meanwhile, its shard not yet claimed again,
    // left its pre-gap position there, which its next owner can only relist from).
    let recorded = || {
        (0..4).all(|k| {
            bed.shard_configmap(k).is_none_or(|cm| {
                watchrelay::checkpoint::read(&serde_json::from_value(cm).expect("a ConfigMap"))
                    .values()
                    .all(|s| {
                        s.rv.as_deref()
                            .and_then(|rv| rv.parse::<u64>().ok())
                            .is_some_and(|rv| rv >= upto)
                    })
            })
        })
    };
    let positioned = || {
        recorded()
            && relays.iter().all(|r| {
                r.registry.phases().keys().all(|id| {
                    (0..4)
                        .filter_map(|k| bed.shard_checkpoint_rv(k, id))
                        .max()
                        .is_some_and(|rv| rv >= upto)
                })
            })
    };
    for _ in 0..300 {
        if positioned() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = write!(
        did,
        " history compacted, lists cut once; relisted: {}",
        positioned()
    );
    (did, (after, upto))
}

fn seeds(salt: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("WATCHRELAY_MODEL_SEED") {
        return vec![seed.parse().expect("WATCHRELAY_MODEL_SEED is a number")];
    }
    let cases: u64 = std::env::var("WATCHRELAY_MODEL_CASES")
        .ok()
        .map(|n| n.parse().expect("WATCHRELAY_MODEL_CASES is a number"))
        .unwrap_or(6);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (0..cases)
        .map(|i| base ^ (salt << 32) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_crashes_converge() {
    for seed in seeds(1) {
        case(seed, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_crashes_publish_every_change_once_in_transactions() {
    for seed in seeds(2) {
        case(seed, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_replicas_converge() {
    for seed in seeds(3) {
        replicas_case(seed, false, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_replicas_publish_every_change() {
    for seed in seeds(4) {
        replicas_case(seed, true, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_with_replicas_publish_every_change_once_in_transactions() {
    for seed in seeds(5) {
        replicas_case(seed, true, true).await;
    }
}
