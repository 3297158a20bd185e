//! Moving members, at the start of a term, between the streams that relay the same objects in
//! two shapes: per namespace (`<channel>.<namespace>`) and over the collection read
//! cluster-wide (`<channel>._all`, or with sharding on the shard's part of it,
//! `<channel>._all-s<k>`).
//!
//! A `watchStrategy` switch, or a scope that changes shape (`namespaces: [a, b]` to
//! `allNamespaces`), changes which stream relays an object, not what the consumer should hold
//! of it. So the term, before any of its streams starts, hands the old shape's members to the
//! new shape's streams instead of retiring them (a DELETED for every object, then an ADDED for
//! each from the new streams): the consumer sees nothing of the switch but what changed
//! meanwhile. With sharding on, an object of a namespaced channel lives in its namespace's
//! shard in both shapes, so the move never leaves the shard: replicas of one rollout may run
//! the two shapes side by side.
//!
//! # History and per-key order
//! Resource versions are the cluster's, whatever the query, so a position of the old shape is
//! a position of the new one wherever the old streams covered the new stream's whole scope:
//! - **Scatter**: each per-namespace stream resumes from the position of the stream over the
//!   collection, which covered its namespace (read under the same scope, or unfiltered over
//!   every namespace under the same selectors): every change after it is published. Every
//!   namespace the scope holds (in the shard) gets the position, with members or not: a fixed
//!   list's, or for `allNamespaces` and a selector those the term read there before it planned.
//! - **Gather** into a stream over the collection, when each namespace its scope holds (in the
//!   shard) had its stream with a position: the stream resumes from the lowest of them. The
//!   namespaces are a fixed list's, or for `allNamespaces` and a selector those the term read
//!   there before it planned (a namespace whose objects a watch from that position would not
//!   show had no stream, so it is one of them). A namespace whose stream was further on is
//!   fenced at its own position (the receiving entry's `fences`): the stream does not publish
//!   its changes up to there again (see `stream::fences`). A namespace
//!   there without a stream (created during the switch) does not stop the resume when the
//!   term read it empty of the channel's objects, or over every namespace holding none of them
//!   at or below that position ([`ScopeNow::unseen`]): every object it holds or will hold
//!   changed after that position, so the watch shows each one.
//! - **Gather, partly**, when a namespace there without a stream holds objects (one that
//!   entered a fixed list or a selector during the switch): the stream resumes from the lowest
//!   position over the namespaces of the members it was handed, and takes the others in as
//!   namespaces entering its scope (see `stream::scope`).
//! - Over every namespace, such a namespace does not stop the resume when each object it holds
//!   changed after the gathered position ([`ScopeNow::unseen`]): the watch shows them all.
//!   When one holds an object at or below it (a namespace the old scope left out), the stream
//!   resumes all the same, and takes in what its position does not cover before it watches:
//!   the receiving entry names the namespaces whose streams it gathered (`covered`), and the
//!   stream announces the other namespaces' objects at or below the position (see
//!   `stream::take_in`).
//! - Otherwise (the namespaces could not be read) the receiving stream starts without a
//!   position: its first sync lists its scope against the members it was handed, announces
//!   every object again (the versions it holds; changes in between collapse into them) and
//!   infers a DELETED for each member the list lacks.
//!
//! Nothing is published here; the old streams are not running (this runs before any stream of
//! the term starts), so the new stream continues each key where the old one left it, in the
//! highest era of the streams it takes over (versions never go back). Members of namespaces the
//! new scope does not hold are retired afterwards like any stream's that no longer runs.
//!
//! # Crash safety
//! The members are first written under the receiving streams and acknowledged, then tombstoned
//! under the old ones, then the ConfigMap drops the old entries and writes the receiving
//! streams' (their carried positions, or none) in one write. A crash at any point leaves the old
//! stream recorded (in the topic or the ConfigMap), and the next term makes the same move again:
//! writing a member twice changes nothing, and the receiving entries come out the same. A
//! configuration changed back meanwhile moves the members back the same way.
//!
//! [`plan`] is pure: the recorded streams in, the moves out; [`Regroup::run`] makes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::retire::still_runs;
use crate::checkpoint::{encode, Saved, Store};
use crate::config::{Channel, Config, Scope, Shape, Shapes, StreamId};
use crate::membership::{self, Known, Members, Owner, Restored};
use crate::metrics::Metrics;
use crate::producer::Producer;

/// One stream's members handed to the stream(s) of the other shape in the same shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// A per-namespace stream's members to the stream over the collection (the shard's part).
    Gather {
        /// The per-namespace stream.
        from: String,
        /// The stream over the collection.
        into: String,
        /// The query `from`'s position must have been taken under for it to stand under the
        /// configuration now (its namespace's query, its selectors as configured now).
        query: String,
        /// When the streams gathered into `into` cover its whole scope (a fixed list whose
        /// every namespace of the shard had its stream), the query `into` has under the
        /// configuration now: it then resumes from the lowest of their positions, stamped with
        /// this query so that a later move can check it in turn. `None`: see `partly`.
        into_query: Option<String>,
        /// Without `into_query`, when the scope's namespaces are known and filter the stream
        /// (a fixed list or a selector, not every namespace), but one there without a stream
        /// holds objects (one that entered the scope during the switch): the base of the
        /// stream's fingerprint (its selectors). It then resumes from the lowest of the
        /// positions over the namespaces of the members it was handed, stamped with their
        /// fingerprint, and takes the others in as namespaces entering its scope, each listed
        /// (see `stream::scope`). `None`: it relists.
        partly: Option<String>,
        /// Over every namespace (read unfiltered), when a namespace there without a stream
        /// holds objects the gathered position does not cover (one the old scope left out):
        /// the namespaces that had their streams. The stream resumes all the same
        /// (`into_query`), and takes the others' objects in before it watches (see
        /// `stream::take_in`).
        take_in: Option<BTreeSet<String>>,
    },
    /// The members of the stream over the collection, each to the stream of its namespace.
    Scatter {
        /// The stream over the collection.
        from: String,
        /// The channel now relayed per namespace.
        channel: String,
        /// The namespaces of a fixed list (in the shard) it covered: each one's stream takes
        /// its position, even with no member to take over.
        listed: Vec<String>,
        /// The query the stream over the collection must have had for its position to stand
        /// for each namespace now: over a fixed list, the list's namespaces of the shard under
        /// the selectors configured now. `None` (a dynamic scope, whose namespaces then cannot
        /// be told): the receiving streams relist.
        query: Option<String>,
        /// With `query`, the other query whose position stands for each namespace: the
        /// collection read unfiltered under the selectors configured now (an `allNamespaces`
        /// stream, narrowed to a list or a selector), whose position covers every namespace.
        whole: String,
        /// The query each listed namespace's stream has under the configuration now, stamped
        /// with a carried position.
        queries: BTreeMap<String, String>,
    },
}

impl Move {
    /// The channel whose streams it moves.
    pub fn channel(&self) -> &str {
        match self {
            Move::Gather { from, .. } => StreamId::parts(from).map_or("", |(name, _)| name),
            Move::Scatter { channel, .. } => channel,
        }
    }
}

/// The moves a term makes before it starts, for the streams `ids` it holds state of
/// (positions, members), under `cfg` with its channels in `shapes`: shard `shard`'s term with
/// sharding on, whose stream over the collection is its part, or the whole relay's (`None`),
/// whose stream over the collection is `<channel>._all`. Only streams the term no longer runs
/// move, and only to a stream that relays the same channel's objects in the same shard;
/// everything else is left to the retirement.
///
/// `namespaces` holds, by channel, what the term read of the namespaces its scope holds now
/// (see [`ScopeNow`]): with them a dynamic scope's (`allNamespaces`, a namespace selector)
/// streams carry their positions across the switch as a fixed list's do. A dynamic channel
/// missing from it relists.
pub fn plan<'a>(
    cfg: &Config,
    shapes: &Shapes,
    shard: Option<u32>,
    ids: impl IntoIterator<Item = &'a str>,
    namespaces: &HashMap<String, ScopeNow>,
) -> Vec<Move> {
    let ids: BTreeSet<&str> = ids.into_iter().collect();
    let whole = |name: &str| match shard {
        Some(k) => StreamId::fanned(name, k).to_string(),
        None => StreamId::new(name, None).to_string(),
    };
    let mut moves = Vec::new();
    for &id in &ids {
        if still_runs(cfg, shapes, id) != Some(false) {
            continue;
        }
        let Some((name, namespace)) = StreamId::parts(id) else {
            continue;
        };
        let Some(channel) = cfg.channels.iter().find(|c| c.name == name) else {
            continue;
        };
        // Kept whole in its channel's shard: per-namespace streams in other shards would cross
        // (refused at start), in its own they are retired.
        if !channel.path.namespaced || channel.kept_whole {
            continue;
        }
        match namespace {
            Some(ns) if shard.is_none_or(|k| cfg.sharding.shard_of(ns) == k) => {
                let into = whole(name);
                if still_runs(cfg, shapes, &into) == Some(true) {
                    let listed = listed_in(cfg, channel, shard, namespaces);
                    // A namespace the scope no longer holds is not gathered: its stream is
                    // retired, each member deleted where it was announced.
                    if listed.as_ref().is_some_and(|l| !l.contains(&ns)) {
                        continue;
                    }
                    // Every namespace of the shard the scope holds had its stream, or holds
                    // none of the channel's objects: their positions cover the whole scope of
                    // the stream over the collection.
                    let covered = listed.as_ref().map(|listed| {
                        unstreamed(name, listed, &ids)
                            .all(|ns| unseen_in(channel, namespaces).contains(ns))
                    });
                    // Over every namespace, the stream resumes whatever the namespaces hold:
                    // it takes in what its position does not cover.
                    let every = channel.scope == Scope::Cluster;
                    let into_query = listed
                        .as_ref()
                        .filter(|_| covered == Some(true) || every)
                        .map(|listed| part_query(channel, listed));
                    let take_in = listed
                        .as_ref()
                        .filter(|_| every && covered == Some(false))
                        .map(|listed| streamed(name, listed, &ids));
                    let partly = (into_query.is_none() && listed.is_some() && !every)
                        .then(|| channel.query_fingerprint(None, true));
                    moves.push(Move::Gather {
                        from: id.to_string(),
                        into,
                        query: channel.query_fingerprint(Some(ns), false),
                        into_query,
                        partly,
                        take_in,
                    });
                }
            }
            None if id == whole(name) && shapes.get(name) == Some(&Shape::PerNamespace) => {
                let listed = listed_in(cfg, channel, shard, namespaces);
                let query = listed.as_ref().map(|l| part_query(channel, l));
                let listed: Vec<String> = listed
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                let queries = listed
                    .iter()
                    .map(|ns| (ns.clone(), channel.query_fingerprint(Some(ns), false)))
                    .collect();
                moves.push(Move::Scatter {
                    from: id.to_string(),
                    channel: name.to_string(),
                    listed,
                    query,
                    whole: channel.query_fingerprint(None, false),
                    queries,
                });
            }
            _ => {}
        }
    }
    moves
}

/// What a term read, before it planned, of the namespaces a channel's scope holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeNow {
    /// The namespaces a dynamic scope holds (every namespace, or its selector's); empty for a
    /// fixed list, whose namespaces are the configuration's.
    pub namespaces: BTreeSet<String>,
    /// Namespaces of the scope that had no stream to gather (created during the switch, or
    /// added to the scope with it) and held none of the channel's objects when read, or, over
    /// every namespace, none at or below the gathered streams' lowest position (see
    /// [`lowest_gathered`]): every object they hold or will hold changed after that position,
    /// so a watch from it shows each one. The gather resumes over them.
    pub unseen: BTreeSet<String>,
}

/// The namespaces of `listed` whose stream of channel `name` is among `ids`.
fn streamed(name: &str, listed: &[&str], ids: &BTreeSet<&str>) -> BTreeSet<String> {
    let unstreamed: BTreeSet<&str> = unstreamed(name, listed, ids).collect();
    listed
        .iter()
        .filter(|ns| !unstreamed.contains(*ns))
        .map(|ns| ns.to_string())
        .collect()
}

/// The namespaces of `listed` whose stream of channel `name` is not among `ids`.
fn unstreamed<'l>(
    name: &'l str,
    listed: &'l [&'l str],
    ids: &'l BTreeSet<&str>,
) -> impl Iterator<Item = &'l str> + 'l {
    listed
        .iter()
        .copied()
        .filter(move |ns| !ids.contains(StreamId::new(name, Some(ns)).to_string().as_str()))
}

fn unseen_in<'n>(
    channel: &Channel,
    namespaces: &'n HashMap<String, ScopeNow>,
) -> &'n BTreeSet<String> {
    static NONE: BTreeSet<String> = BTreeSet::new();
    namespaces.get(&channel.name).map_or(&NONE, |s| &s.unseen)
}

/// The namespaces of `channel`'s scope in `shard` that keep its gather from resuming: those
/// with no stream among `ids` and not known to be unseen (see [`ScopeNow::unseen`]). `None`
/// when its scope's namespaces were not read, or no gather into the stream over the
/// collection is due.
pub fn unstreamed_in<'a>(
    cfg: &Config,
    channel: &Channel,
    shard: Option<u32>,
    ids: impl IntoIterator<Item = &'a str>,
    namespaces: &HashMap<String, ScopeNow>,
) -> Option<Vec<String>> {
    let ids: BTreeSet<&str> = ids.into_iter().collect();
    let listed = listed_in(cfg, channel, shard, namespaces)?;
    let unseen = unseen_in(channel, namespaces);
    Some(
        unstreamed(&channel.name, &listed, &ids)
            .filter(|ns| !unseen.contains(*ns))
            .map(str::to_string)
            .collect(),
    )
}

/// The namespaces `channel`'s scope holds in `shard` (all of them without sharding), sorted
/// and once each: its fixed list, or what a dynamic scope holds in `namespaces`; `None` for a
/// dynamic scope whose namespaces were not read.
fn listed_in<'c>(
    cfg: &Config,
    channel: &'c Channel,
    shard: Option<u32>,
    namespaces: &'c HashMap<String, ScopeNow>,
) -> Option<Vec<&'c str>> {
    let list: Vec<&str> = match &channel.scope {
        Scope::Namespaces(list) => list.iter().map(String::as_str).collect(),
        Scope::Cluster | Scope::Selector(_) => namespaces
            .get(&channel.name)?
            .namespaces
            .iter()
            .map(String::as_str)
            .collect(),
    };
    let mut listed: Vec<&str> = list
        .into_iter()
        .filter(|ns| shard.is_none_or(|k| cfg.sharding.shard_of(ns) == k))
        .collect();
    listed.sort_unstable();
    listed.dedup();
    Some(listed)
}

/// The query of the stream over the collection whose scope holds `listed`, as it stamps it:
/// over every namespace it reads the collection unfiltered; over a list or a selector it is
/// filtered to them.
fn part_query(channel: &Channel, listed: &[&str]) -> String {
    if channel.scope == Scope::Cluster {
        return channel.query_fingerprint(None, false);
    }
    Channel::scoped_fingerprint(
        listed.iter().copied(),
        &channel.query_fingerprint(None, true),
    )
}

/// Everything the moves need.
pub struct Regroup<'a> {
    /// Writes the members under their new streams, then tombstones the old.
    pub producer: &'a Arc<dyn Producer>,
    /// The shard's checkpoint ConfigMap.
    pub store: &'a Store,
    /// Drops the old streams' series.
    pub metrics: &'a Metrics,
    /// Whose membership records these are.
    pub owner: &'a Owner,
    /// The membership topic's name.
    pub topic: &'a str,
}

impl Regroup<'_> {
    /// Makes `moves` on `restored` and `saved`, in memory as in the topic and the ConfigMap.
    /// Returns false when stopped first, or when a write failed (try again before any stream
    /// starts). `saved` changes only once every move is made: a move made before the failure
    /// removed its old stream's entry, whose position a gather or scatter tried again needs.
    pub async fn run(
        &self,
        moves: &[Move],
        restored: &mut Restored,
        saved: &mut HashMap<String, Saved>,
        stop: &CancellationToken,
    ) -> bool {
        let mut moved = saved.clone();
        let done = self.make(moves, restored, &mut moved, stop).await;
        if done {
            *saved = moved;
        }
        done
    }

    async fn make(
        &self,
        moves: &[Move],
        restored: &mut Restored,
        saved: &mut HashMap<String, Saved>,
        stop: &CancellationToken,
    ) -> bool {
        let mut updates: BTreeMap<String, Option<String>> = BTreeMap::new();
        let gathered = gathered_positions(moves, saved);
        // The last gather into each stream: only its entry, written over the others', needs
        // the namespaces of every member handed over.
        let last_gather: HashMap<&str, usize> = moves
            .iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Move::Gather { into, .. } => Some((into.as_str(), i)),
                Move::Scatter { .. } => None,
            })
            .collect();
        for (i, m) in moves.iter().enumerate() {
            let from = match m {
                Move::Gather { from, .. } | Move::Scatter { from, .. } => from,
            };
            let mut into: BTreeMap<String, Vec<(String, Known)>> = BTreeMap::new();
            let members = restored.get(from).map_or(0, Members::len);
            for (uid, known) in restored.get(from).into_iter().flat_map(|m| m.iter()) {
                let id = match (m, known.namespace.as_deref()) {
                    (Move::Gather { into, .. }, _) => into.clone(),
                    (Move::Scatter { channel, .. }, Some(ns)) => {
                        StreamId::new(channel, Some(ns)).to_string()
                    }
                    // A cluster-scoped object in a namespaced channel's part: none is ever.
                    (Move::Scatter { .. }, None) => continue,
                };
                into.entry(id).or_default().push((uid, known));
            }
            match m {
                Move::Gather { into: part, .. } => {
                    into.entry(part.clone()).or_default();
                }
                Move::Scatter {
                    channel, listed, ..
                } => {
                    for ns in listed {
                        into.entry(StreamId::new(channel, Some(ns)).to_string())
                            .or_default();
                    }
                }
            }
            tracing::info!(stream = %from, objects = members, to = into.len(), "the channel changed shape; handing the stream's members over to its new streams without retracting them");
            let old = saved.get(from).cloned().unwrap_or_default();
            for (id, part) in into {
                let sent = membership::adopt(
                    self.producer.as_ref(),
                    self.topic,
                    self.owner,
                    &id,
                    part.into_iter(),
                    stop,
                )
                .await;
                let adopted = match sent {
                    Ok(adopted) => adopted,
                    Err(e) => {
                        tracing::warn!(stream = %from, error = %e, "handing members over cut short; trying again");
                        return false;
                    }
                };
                let mut held = restored.take(&id);
                for (uid, known) in adopted.iter() {
                    held.insert(&uid, &known);
                }
                restored.insert(&id, held);
                // Only a position taken under the query the receiving streams cover now; it is
                // stamped with their query, for the next move to check.
                let (rv, query) = match m {
                    Move::Scatter {
                        query,
                        whole,
                        queries,
                        ..
                    } => {
                        let ns = StreamId::parts(&id).and_then(|(_, ns)| ns);
                        let rv = scattered(&old, query.as_ref(), whole, ns);
                        (rv, ns.and_then(|ns| queries.get(ns).cloned()))
                    }
                    Move::Gather {
                        into_query, partly, ..
                    } => {
                        // Partly: over the namespaces of every member handed over, once the
                        // last gather into the stream made its move (one pass over them).
                        let over_held = || {
                            if last_gather.get(id.as_str()) != Some(&i) {
                                return None;
                            }
                            let held = restored.get(&id).map(Members::namespaces);
                            let held = held.unwrap_or_default();
                            let base = partly.as_deref()?;
                            let names = held.iter().map(String::as_str);
                            Some(Channel::scoped_fingerprint(names, base))
                        };
                        let query = into_query.clone().or_else(over_held);
                        (gathered.get(&id).cloned().flatten(), query)
                    }
                };
                let mut entry = receiving(saved.get(&id), &old, rv, query);
                if let Move::Gather { query, take_in, .. } = m {
                    entry.fences = ahead(saved.get(&id), &old, query, from, entry.rv.as_deref());
                    entry.covered = take_in.clone().filter(|_| entry.rv.is_some());
                    if entry.covered.is_some() {
                        entry.query = entry.query.as_deref().map(crate::checkpoint::taking_in);
                    }
                }
                updates.insert(id.clone(), Some(encode(&entry)));
                saved.insert(id, entry);
            }
            let leaves: Vec<_> = restored
                .get(from)
                .into_iter()
                .flat_map(|m| m.iter())
                .map(|(uid, _)| membership::record(self.topic, self.owner, from, &uid, None))
                .collect();
            if let Err(e) = membership::send_all(self.producer.as_ref(), leaves, stop).await {
                tracing::warn!(stream = %from, error = %e, "tombstoning handed-over members cut short; trying again");
                return false;
            }
            restored.take(from);
            saved.remove(from);
            updates.insert(from.clone(), None);
            self.metrics.forget_stream(from);
        }
        if updates.is_empty() {
            return true;
        }
        tokio::select! {
            _ = stop.cancelled() => false,
            r = self.store.write(&updates) => match r {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "writing the checkpoint ConfigMap failed");
                    false
                }
            },
        }
    }
}

/// Where namespace `ns`'s stream resumes when the stream over the collection scatters into
/// the namespaces' (`old` its entry): from its position when it read under the query the
/// namespace's stream covers now (`query`; `None`: none does) or unfiltered over every
/// namespace (`whole`), or from the namespace's fence when that is further. A position still
/// to take in what it does not cover (see `stream::take_in`) covers only the namespaces it
/// names: the others list.
fn scattered(old: &Saved, query: Option<&String>, whole: &str, ns: Option<&str>) -> Option<String> {
    let covered = match &old.covered {
        Some(names) => {
            old.query.as_deref() == Some(&crate::checkpoint::taking_in(whole))
                && ns.is_some_and(|ns| names.contains(ns))
        }
        None => old.query.as_ref() == query || old.query.as_deref() == Some(whole),
    };
    let rv = old.rv.clone().filter(|_| query.is_some() && covered);
    // A namespace the old stream had published past its position (its fence) resumes from
    // there: what it published is not published again.
    let at = rv.as_deref().and_then(crate::event::comparable);
    let fenced = ns.and_then(|ns| old.fences.get(ns)).filter(|f| {
        at.zip(crate::event::comparable(f))
            .is_some_and(|(at, f)| f > at)
    });
    fenced.cloned().or(rv)
}

/// The entry of a stream that takes members over from `old`: where it published and what it
/// relays (its own entry's, if it has one), the position `rv` when the old shape covered its
/// scope (see the module's doc) with the `query` it stands under, and the highest era of the
/// two, so that versions never go back. Without a position no query is stamped: the stream
/// stamps its own once it runs.
fn receiving(own: Option<&Saved>, old: &Saved, rv: Option<String>, query: Option<String>) -> Saved {
    let base = own.unwrap_or(old);
    Saved {
        query: query.filter(|_| rv.is_some()),
        rv,
        route: base.route.clone(),
        kind: base.kind.clone().or_else(|| old.kind.clone()),
        era: own.map_or(0, |s| s.era).max(old.era),
        ..Saved::default()
    }
}

/// The fences of a stream resuming from `rv`, the lowest of the positions it gathers, once it
/// gathered `old`, the entry of per-namespace stream `from` (under `query`, as
/// [`gathered_positions`] takes it): those of the gathers before it into the same position
/// (`own`), and `from`'s namespace at `old`'s position when that is above `rv`. Its
/// changes up to there were published by `from`: the stream resuming from `rv` does not
/// publish them again (see `stream::fences`).
fn ahead(
    own: Option<&Saved>,
    old: &Saved,
    query: &str,
    from: &str,
    rv: Option<&str>,
) -> BTreeMap<String, String> {
    let Some(at) = rv.and_then(crate::event::comparable) else {
        return BTreeMap::new();
    };
    let mut fences = own
        .filter(|own| own.rv.as_deref() == rv)
        .map(|own| own.fences.clone())
        .unwrap_or_default();
    let ns = StreamId::parts(from).and_then(|(_, ns)| ns);
    let position = position_under(old, query)
        .filter(|rv| crate::event::comparable(rv).is_some_and(|rv| rv > at));
    if let (Some(ns), Some(position)) = (ns, position) {
        fences.insert(ns.to_string(), position.to_string());
    }
    fences
}

/// The position of a per-namespace stream's entry `s`, when it was taken under `query` (or
/// under no query stamped, an older entry's).
fn position_under<'a>(s: &'a Saved, query: &str) -> Option<&'a str> {
    s.query
        .as_ref()
        .is_none_or(|q| q == query)
        .then_some(s.rv.as_deref())
        .flatten()
}

/// The lowest position, as an integer, of the per-namespace streams of `channel` that `moves`
/// gather (each under the query it stood under), as their stream over the collection would
/// resume from it; `None` when none is gathered, or one has no position or one that does not
/// compare.
pub fn lowest_gathered(
    moves: &[Move],
    channel: &str,
    saved: &HashMap<String, Saved>,
) -> Option<u64> {
    let mut lowest = None;
    for m in moves.iter().filter(|m| m.channel() == channel) {
        let Move::Gather { from, query, .. } = m else {
            continue;
        };
        let (rv, _) = carried(from, query, saved)?;
        lowest = Some(lowest.map_or(rv, |l: u64| l.min(rv)));
    }
    lowest
}

/// The position a gather takes from per-namespace stream `from`, with its value as an integer:
/// the stream's position under `query`, the query it stood under; `None` without one, or with
/// one that does not compare.
fn carried<'s>(
    from: &str,
    query: &str,
    saved: &'s HashMap<String, Saved>,
) -> Option<(u64, &'s str)> {
    let rv = saved.get(from).and_then(|s| position_under(s, query))?;
    Some((crate::event::comparable(rv)?, rv))
}

/// For each stream that gathers members from streams that covered its whole scope (or part of
/// it, see [`Move::Gather`]'s `partly`), the lowest of their positions; `None` when one of them
/// has none, or one that does not compare.
fn gathered_positions(
    moves: &[Move],
    saved: &HashMap<String, Saved>,
) -> BTreeMap<String, Option<String>> {
    let mut lowest: BTreeMap<String, Option<(u64, &str)>> = BTreeMap::new();
    for m in moves {
        let Move::Gather {
            from,
            into,
            query,
            into_query,
            partly,
            ..
        } = m
        else {
            continue;
        };
        let rv = carried(from, query, saved).filter(|_| into_query.is_some() || partly.is_some());
        let entry = lowest.entry(into.clone()).or_insert(rv);
        *entry = entry.zip(rv).map(|(a, b)| if b.0 < a.0 { b } else { a });
    }
    lowest
        .into_iter()
        .map(|(into, rv)| (into, rv.map(|(_, rv)| rv.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The moves without the queries they carry (checked on their own), a gather's whether it
    /// resumes kept.
    fn strip(moves: Vec<Move>) -> Vec<Move> {
        moves
            .into_iter()
            .map(|m| match m {
                Move::Gather {
                    from,
                    into,
                    into_query,
                    partly,
                    take_in,
                    ..
                } => Move::Gather {
                    from,
                    into,
                    query: String::new(),
                    into_query: into_query.map(|_| String::new()),
                    partly: partly.map(|_| String::new()),
                    take_in,
                },
                Move::Scatter {
                    from,
                    channel,
                    listed,
                    ..
                } => Move::Scatter {
                    from,
                    channel,
                    listed,
                    query: None,
                    whole: String::new(),
                    queries: BTreeMap::new(),
                },
            })
            .collect()
    }

    fn cfg(channel: &str) -> Config {
        let yaml = format!(
            "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nsharding:\n  enabled: true\n  shards: 4\nchannels:\n{channel}\n  - operationId: watchNodes\n"
        );
        Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    /// Namespaces of shard 0 and of another shard, of 4.
    fn namespaces(c: &Config) -> (String, String) {
        let s = &c.sharding;
        let mut names = (0..).map(|i| format!("team-{i}"));
        let ours = names.by_ref().find(|n| s.shard_of(n) == 0).unwrap();
        let theirs = names.find(|n| s.shard_of(n) != 0).unwrap();
        (ours, theirs)
    }

    #[test]
    fn a_shape_switch_moves_members_within_the_shard() {
        const PODS: &str = "watchNamespacedPods";
        let wide = format!("  - operationId: {PODS}\n    allNamespaces: true\n    watchStrategy: clusterWide\n    topic: pods");
        let listed = |strategy: &str, ns: &str| {
            format!("  - operationId: {PODS}\n    namespaces: [{ns}]\n    topic: pods\n    watchStrategy: {strategy}")
        };
        let probe = cfg(&wide);
        let (ours, theirs) = namespaces(&probe);
        let also = (0..)
            .map(|i| format!("team-y{i}"))
            .find(|n| probe.sharding.shard_of(n) == 0)
            .unwrap();
        let per_ns = Shapes::from([(PODS.into(), Shape::PerNamespace)]);
        let cluster_wide = Shapes::from([(PODS.into(), Shape::ClusterWide)]);
        let none = Shapes::new();
        let ns_stream = format!("{PODS}.{ours}");
        let part = format!("{PODS}._all-s0");
        // Gathered into every namespace: the old streams may not have covered all of them.
        let gather = |resumes: bool| Move::Gather {
            from: ns_stream.clone(),
            into: part.clone(),
            query: String::new(),
            into_query: resumes.then(String::new),
            partly: None,
            take_in: None,
        };
        // Over the namespaces of its members, the others taken in as entering its scope.
        let gather_partly = Move::Gather {
            from: ns_stream.clone(),
            into: part.clone(),
            query: String::new(),
            into_query: None,
            partly: Some(String::new()),
            take_in: None,
        };
        // Each listed namespace of the shard gets the part's position, members or not.
        let scatter = Move::Scatter {
            from: part.clone(),
            channel: PODS.into(),
            listed: vec![ours.clone()],
            query: None,
            whole: String::new(),
            queries: BTreeMap::new(),
        };
        // (case, configuration, shapes, recorded streams, moves)
        type Case<'a> = (&'a str, String, &'a Shapes, Vec<String>, Vec<Move>);
        let table: Vec<Case<'_>> = vec![
            ("nothing recorded", wide.clone(), &none, vec![], vec![]),
            (
                "per namespace, now every namespace fanned out",
                wide.clone(),
                &none,
                vec![ns_stream.clone()],
                vec![gather(false)],
            ),
            (
                "per namespace, now the listed namespaces read cluster-wide",
                listed("clusterWide", &ours),
                &cluster_wide,
                vec![ns_stream.clone(), part.clone()],
                vec![gather(true)],
            ),
            (
                "a listed namespace of the shard had no stream: the part resumes partly",
                listed("clusterWide", &format!("{ours}, {also}")),
                &cluster_wide,
                vec![ns_stream.clone(), part.clone()],
                vec![gather_partly],
            ),
            (
                "fanned out, now per namespace",
                listed("perNamespace", &ours),
                &per_ns,
                vec![part.clone()],
                vec![scatter.clone()],
            ),
            (
                "the same shape: nothing moves",
                listed("perNamespace", &ours),
                &per_ns,
                vec![ns_stream.clone()],
                vec![],
            ),
            (
                "another shard's stream is not this term's",
                wide.clone(),
                &none,
                vec![format!("{PODS}.{theirs}"), format!("{PODS}._all-s1")],
                vec![],
            ),
            (
                "a removed channel is retired, not moved",
                "  - operationId: watchNamespacedServices\n    allNamespaces: true\n    watchStrategy: clusterWide".into(),
                &none,
                vec![ns_stream.clone(), part.clone()],
                vec![],
            ),
            (
                "a whole stream of a release before fan-out is retired, not moved",
                listed("perNamespace", &ours),
                &per_ns,
                vec![format!("{PODS}._all")],
                vec![],
            ),
            (
                "a cluster-scoped channel never moves",
                wide.clone(),
                &none,
                vec!["watchNodes._all-s0".into()],
                vec![],
            ),
        ];
        for (case, channel, shapes, recorded, expected) in table {
            let c = cfg(&channel);
            let got = strip(plan(
                &c,
                shapes,
                Some(0),
                recorded.iter().map(String::as_str),
                &HashMap::new(),
            ));
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn a_scatter_resumes_each_namespace_its_position_covers() {
        let q = Some("ns-q".to_string());
        let entry = |query: &str, covered: Option<&[&str]>| Saved {
            rv: Some("100".into()),
            query: Some(query.into()),
            fences: BTreeMap::from([("f".to_string(), "150".to_string())]),
            covered: covered.map(|c| c.iter().map(|n| n.to_string()).collect()),
            ..Saved::default()
        };
        let whole = entry("whole", None);
        let marked = crate::checkpoint::taking_in("whole");
        let pending = entry(&marked, Some(&["a", "f"]));
        // (case, entry, namespace, where it resumes)
        let table: Vec<(&str, &Saved, &str, Option<&str>)> = vec![
            ("read every namespace", &whole, "a", Some("100")),
            ("its fence further on", &whole, "f", Some("150")),
            ("still taking in, covered", &pending, "a", Some("100")),
            ("still taking in, fenced", &pending, "f", Some("150")),
            (
                "still taking in, not covered: it lists",
                &pending,
                "b",
                None,
            ),
        ];
        for (case, old, ns, want) in table {
            assert_eq!(
                scattered(old, q.as_ref(), "whole", Some(ns)).as_deref(),
                want,
                "{case}"
            );
        }
        // Covered namespaces, but not under the mark: another query's position.
        let unmarked = entry("whole", Some(&["a"]));
        assert_eq!(scattered(&unmarked, q.as_ref(), "whole", Some("a")), None);
        // No namespace stream's query: nothing resumes.
        assert_eq!(scattered(&whole, None, "whole", Some("a")), None);
    }

    #[test]
    fn a_receiving_stream_resumes_from_the_lowest_position_it_takes_over() {
        let at = |rv: Option<&str>, era| Saved {
            rv: rv.map(str::to_string),
            era,
            route: Some("pods {key}".into()),
            ..Saved::default()
        };
        let gather = |from: &str, into: &str, resumes: bool| Move::Gather {
            partly: None,
            take_in: None,
            from: from.into(),
            into: into.into(),
            query: "q".into(),
            into_query: resumes.then(String::new),
        };
        let saved = HashMap::from([
            ("p.a".to_string(), at(Some("10"), 5)),
            ("p.b".to_string(), at(Some("7"), 9)),
            ("p.c".to_string(), at(None, 1)),
            ("p.d".to_string(), at(Some("12"), 1)),
        ]);
        let moves = [
            gather("p.a", "x", true),
            gather("p.b", "x", true),
            gather("p.a", "y", true),
            gather("p.c", "y", true),
            gather("p.d", "z", false),
        ];
        let got = gathered_positions(&moves, &saved);
        assert_eq!(got["x"].as_deref(), Some("7"));
        assert_eq!(got["y"], None, "one of them had no position");
        assert_eq!(got["z"], None, "the old streams did not cover the scope");
        // Before the namespaces are read: the lowest of a channel's gathered positions,
        // whether the old streams covered the scope or not.
        let of = |moves: &[Move]| lowest_gathered(moves, "p", &saved);
        assert_eq!(of(&moves[..2]), Some(7));
        assert_eq!(of(&moves[4..]), Some(12));
        assert_eq!(of(&moves), None, "one of them had no position");
        assert_eq!(lowest_gathered(&moves[..2], "other", &saved), None);
        // The era never goes back; a carried position is stamped with the query it stands
        // under, for the next move to check.
        let own = Saved {
            query: Some("old".into()),
            ..at(None, 3)
        };
        let entry = receiving(
            Some(&own),
            &saved["p.b"],
            Some("7".into()),
            Some("q".into()),
        );
        assert_eq!(
            (entry.rv.as_deref(), entry.era, entry.query.as_deref()),
            (Some("7"), 9, Some("q"))
        );
        // Without a position, no query is stamped.
        let entry = receiving(None, &saved["p.c"], None, Some("q".into()));
        assert_eq!((entry.rv, entry.query), (None, None));

        // Gathered into `x` from 7: `a`'s stream had published up to 10, so `a` is fenced at
        // 10; `b`'s stood at 7, nothing to fence. A position under another query, or no
        // position for the receiver, fences nothing.
        let fenced = ahead(None, &saved["p.a"], "q", "p.a", Some("7"));
        assert_eq!(
            fenced,
            BTreeMap::from([("a".to_string(), "10".to_string())])
        );
        let own = Saved {
            rv: Some("7".into()),
            fences: fenced,
            ..Saved::default()
        };
        let both = ahead(Some(&own), &saved["p.d"], "q", "p.d", Some("7"));
        assert_eq!(both.keys().collect::<Vec<_>>(), ["a", "d"]);
        assert!(ahead(None, &saved["p.b"], "q", "p.b", Some("7")).is_empty());
        let under_q = Saved {
            query: Some("q".into()),
            ..saved["p.a"].clone()
        };
        assert!(ahead(None, &under_q, "other", "p.a", Some("7")).is_empty());
        assert!(ahead(None, &saved["p.a"], "q", "p.a", None).is_empty());
        // An entry of the receiver at another position is not this gather's: its fences go.
        let stale = Saved {
            rv: Some("3".into()),
            ..own
        };
        assert_eq!(
            ahead(Some(&stale), &saved["p.b"], "q", "p.b", Some("7")),
            BTreeMap::new()
        );
    }

    #[test]
    fn without_sharding_the_stream_over_the_collection_is_the_whole_one() {
        let unsharded = |channel: &str| {
            Config::parse(&format!(
                "clusterName: c\nkafka:\n  bootstrapServers: k:9092\n  oversize: trim\ncheckpoint:\n  namespace: w\nchannels:\n{channel}\n"
            ))
            .unwrap()
        };
        let listed = |strategy: &str| {
            unsharded(&format!("  - operationId: watchNamespacedPods\n    namespaces: [a, b]\n    watchStrategy: {strategy}"))
        };
        let every = unsharded("  - operationId: watchNamespacedPods\n    allNamespaces: true");
        let per_ns = Shapes::from([("watchNamespacedPods".into(), Shape::PerNamespace)]);
        let wide = Shapes::from([("watchNamespacedPods".into(), Shape::ClusterWide)]);
        let gather = |ns: &str, resumes: bool| Move::Gather {
            from: format!("watchNamespacedPods.{ns}"),
            into: "watchNamespacedPods._all".into(),
            query: String::new(),
            into_query: resumes.then(String::new),
            partly: None,
            take_in: None,
        };
        // Resumed, what the position does not cover taken in first.
        let taking_in = |ns: &str| Move::Gather {
            from: format!("watchNamespacedPods.{ns}"),
            into: "watchNamespacedPods._all".into(),
            query: String::new(),
            into_query: Some(String::new()),
            partly: None,
            take_in: Some(["a", "b"].map(String::from).into()),
        };
        let ids = ["watchNamespacedPods.a", "watchNamespacedPods.b"];
        let none = HashMap::new();
        assert_eq!(
            strip(plan(&listed("clusterWide"), &wide, None, ids, &none)),
            vec![gather("a", true), gather("b", true)]
        );
        // namespaces: [a, b] becoming allNamespaces: other namespaces were never read.
        assert_eq!(
            strip(plan(&every, &Shapes::new(), None, ids, &none)),
            vec![gather("a", false), gather("b", false)]
        );
        // allNamespaces, with the namespaces there now read by the term: when each had its
        // stream, the stream over the collection resumes, stamped with its own (unfiltered)
        // query; a namespace without one (left out by the old scope, holding objects) is taken
        // in before it watches.
        let there = |names: &[&str]| {
            let namespaces: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
            let now = ScopeNow {
                namespaces,
                ..ScopeNow::default()
            };
            HashMap::from([("watchNamespacedPods".to_string(), now)])
        };
        let unfiltered = every.channels[0].query_fingerprint(None, false);
        let resumed = plan(&every, &Shapes::new(), None, ids, &there(&["a", "b"]));
        assert_eq!(
            strip(resumed.clone()),
            vec![gather("a", true), gather("b", true)]
        );
        assert!(resumed
            .iter()
            .all(|m| matches!(m, Move::Gather { into_query: Some(q), .. } if *q == unfiltered)));
        assert_eq!(
            strip(plan(
                &every,
                &Shapes::new(),
                None,
                ids,
                &there(&["a", "b", "c"])
            )),
            vec![taking_in("a"), taking_in("b")]
        );
        // Unless the namespace without a stream held none of the channel's objects when read.
        let mut c_empty = there(&["a", "b", "c"]);
        c_empty.get_mut("watchNamespacedPods").unwrap().unseen = ["c".to_string()].into();
        let with_empty = plan(&every, &Shapes::new(), None, ids, &c_empty);
        assert_eq!(
            strip(with_empty.clone()),
            vec![gather("a", true), gather("b", true)]
        );
        assert_eq!(
            unstreamed_in(
                &every,
                &every.channels[0],
                None,
                ids,
                &there(&["a", "b", "c"])
            ),
            Some(vec!["c".to_string()])
        );
        assert_eq!(
            unstreamed_in(&every, &every.channels[0], None, ids, &c_empty),
            Some(vec![])
        );
        // A selector's per-namespace streams, gathered and scattered back the same way, with
        // the namespaces it matches now: the stream over the collection is filtered to them.
        let selector = |strategy: &str| {
            unsharded(&format!("  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    watchStrategy: {strategy}"))
        };
        let by_selector = there;
        let wide_cfg = selector("clusterWide");
        let filtered = Channel::scoped_fingerprint(
            ["a", "b"],
            &wide_cfg.channels[0].query_fingerprint(None, true),
        );
        let gathered = plan(&wide_cfg, &wide, None, ids, &by_selector(&["a", "b"]));
        assert!(gathered
            .iter()
            .all(|m| matches!(m, Move::Gather { into_query: Some(q), .. } if *q == filtered)));
        assert_eq!(
            strip(plan(&wide_cfg, &wide, None, ids, &none)),
            vec![gather("a", false), gather("b", false)],
            "the selector's namespaces not read: it relists"
        );
        assert_eq!(
            strip(plan(&wide_cfg, &wide, None, ids, &by_selector(&["a"]))),
            vec![gather("a", true)],
            "b left the selector: its stream is retired, not gathered"
        );
        let scattered = plan(
            &selector("perNamespace"),
            &per_ns,
            None,
            ["watchNamespacedPods._all"],
            &by_selector(&["a", "b"]),
        );
        assert!(matches!(
            &scattered[..],
            [Move::Scatter { listed, query: Some(q), .. }] if *listed == ["a", "b"] && *q == filtered
        ));
        // Each listed namespace's stream takes the position when the stream over the
        // collection covered exactly those namespaces under the selectors configured now.
        let per_ns_cfg = listed("perNamespace");
        let base = per_ns_cfg.channels[0].query_fingerprint(None, true);
        assert_eq!(
            plan(
                &per_ns_cfg,
                &per_ns,
                None,
                ["watchNamespacedPods._all"],
                &none
            ),
            vec![Move::Scatter {
                from: "watchNamespacedPods._all".into(),
                channel: "watchNamespacedPods".into(),
                listed: vec!["a".into(), "b".into()],
                query: Some(Channel::scoped_fingerprint(["a", "b"], &base)),
                whole: per_ns_cfg.channels[0].query_fingerprint(None, false),
                queries: ["a", "b"]
                    .map(|ns| {
                        let q = per_ns_cfg.channels[0].query_fingerprint(Some(ns), false);
                        (ns.to_string(), q)
                    })
                    .into(),
            }]
        );
        assert_eq!(
            strip(plan(&listed("perNamespace"), &per_ns, None, ids, &none)),
            vec![]
        );
        // A part of a sharded release is not this relay's to move.
        assert_eq!(
            plan(
                &listed("perNamespace"),
                &per_ns,
                None,
                ["watchNamespacedPods._all-s3"],
                &none,
            ),
            vec![]
        );
    }
}
