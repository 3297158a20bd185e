//! Scale-out (`sharding`): replicas share the streams through a Kafka consumer group.
//!
//! Every stream belongs to one of `shards` virtual shards, a pure function of its id (see
//! [`ShardingConfig::shard_of_stream`]): a per-namespace stream to the shard of its namespace.
//! A stream over one collection is fanned out (see [`ShardingConfig::fans`]): every shard runs
//! its part of it (`<channel>._all-s<k>`), which holds the objects of the shard's namespaces, or
//! for a cluster-scoped resource the objects whose names fall in the shard
//! ([`ShardingConfig::shard_of_object`]); a replica reads the collection once for all its
//! shards. Those are the very objects the per-namespace streams of the shard would hold, so an
//! object's shard never depends on how its channel watches it. The shard
//! is the top bits of FNV-1a 64 passed through MurmurHash3's 64-bit finalizer: FNV-1a's top bits
//! alone barely depend on a name's last characters, and namespaces named `team-0` to
//! `team-4999` left some of 64 shards empty and put 390 namespaces in one.

use serde::Deserialize;

use std::sync::Arc;

use super::hash::{fmix64, fnv1a64};
use super::{
    invalid, is_topic, topic_rule_for, Channel, ConfigError, Scope, Shape, StreamId, WatchStrategy,
};

/// Which group protocol the replicas' consumer group speaks (`sharding.groupProtocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GroupProtocol {
    /// The classic protocol with the `cooperative-sticky` assignor (KIP-429): only moving
    /// shards stop. The default.
    #[default]
    Classic,
    /// The KIP-848 protocol, assignments computed by the broker (Kafka 4.0 and later).
    Consumer,
}

/// Scale-out: replicas own shards of the streams through a consumer group (`sharding`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ShardingConfig {
    /// Off (the default): one process relays every stream.
    pub enabled: bool,
    /// How many virtual shards the streams are spread over: a power of two, fixed once the
    /// topics exist (each has one partition per shard).
    pub shards: u32,
    /// The compacted topic of the shards' memberships, one partition per shard;
    /// `watchrelay.{cluster}.shards` when absent. The group's own (empty) topic is its name
    /// with `.owners` appended.
    pub topic: Option<String>,
    /// The consumer group's protocol.
    pub group_protocol: GroupProtocol,
    /// The classic protocol's session: a replica that stops heartbeating for this long loses
    /// its shards (under the `consumer` protocol the broker's group configuration decides).
    pub session_timeout_ms: u32,
    /// A replica that has not proven it still owns its shards for this long (a commit the
    /// group coordinator accepted) stops producing for them; below the session timeout, so it
    /// stops before another replica may own them.
    pub ownership_deadline_ms: u32,
    /// A replica whose API server has not answered for this long gives its shards up (leaves
    /// the group) until it answers again; 0 keeps them.
    pub api_unreachable_seconds: u32,
    /// Where the API server offers sharded lists and watches (the `ShardedListAndWatch`
    /// gate), each replica asks it for its shards' namespaces only, instead of reading a
    /// fanned-out collection of namespaced objects whole and dropping the others'.
    pub server_ranges: bool,
    /// How many splits of streams kept whole the release's shards recorded when this replica
    /// read them before relaying (see [`crate::checkpoint::SPLITS_KEY`]); not configured. A
    /// term that finds more stops the replica: what it settled at its start is out of date.
    #[serde(skip)]
    pub splits_seen: u64,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            shards: 64,
            topic: None,
            group_protocol: GroupProtocol::Classic,
            session_timeout_ms: 10_000,
            ownership_deadline_ms: 5_000,
            api_unreachable_seconds: 30,
            server_ranges: true,
            splits_seen: 0,
        }
    }
}

impl ShardingConfig {
    /// How long a shard's record may wait in the producer for its delivery
    /// (`message.timeout.ms`): the margin by which the session outlasts the ownership deadline.
    /// A replica frozen with records queued (a paused VM, a stopped process) resumes to find
    /// them expired before its producer sends them again, since the next owner may have been
    /// assigned once the session passed: a record taken before the deadline is sent before the
    /// session ends, or not at all. An expired record fails like any other, and its stream
    /// replays it from its checkpoint.
    pub fn delivery_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(
            self.session_timeout_ms
                .saturating_sub(self.ownership_deadline_ms),
        ))
    }

    /// How long a replica whose ownership deadline passed holds its shards, waiting for a
    /// renewal, before it fences them: half the margin by which the session outlasts the
    /// deadline. The other half is slack: the group may evict a member a heartbeat before a
    /// session after its last accepted renewal, and a hold must end before any successor can
    /// start.
    pub fn hold_grace(&self) -> std::time::Duration {
        self.delivery_timeout() / 2
    }

    /// The shards' membership topic.
    pub fn topic(&self, cluster: &str) -> String {
        self.topic
            .clone()
            .unwrap_or_else(|| format!("watchrelay.{cluster}.shards"))
    }

    /// The group's topic: empty, one partition per shard; partition `k` is shard `k`.
    pub fn owners_topic(&self, cluster: &str) -> String {
        format!("{}.owners", self.topic(cluster))
    }

    /// The checkpoint ConfigMap of shard `shard` of the release whose ConfigMap is `checkpoint`.
    pub fn configmap(checkpoint: &str, shard: u32) -> String {
        format!("{checkpoint}-s{shard}")
    }

    /// Whether the checkpoint ConfigMap `name` is the release's own (`checkpoint`) or one of
    /// its shards', whatever their number.
    pub fn of_release(checkpoint: &str, name: &str) -> bool {
        name == checkpoint
            || name
                .strip_prefix(checkpoint)
                .and_then(|rest| rest.strip_prefix("-s"))
                .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    }

    /// The checkpoint ConfigMaps of every shard.
    pub fn configmaps(&self, checkpoint: &str) -> Vec<String> {
        (0..self.shards)
            .map(|k| Self::configmap(checkpoint, k))
            .collect()
    }

    /// The shard of `key`: the top bits of its mixed FNV-1a 64 hash.
    pub fn shard_of(&self, key: &str) -> u32 {
        let bits = self.shards.trailing_zeros();
        if bits == 0 {
            return 0;
        }
        u32::try_from(fmix64(fnv1a64(key)) >> (64 - bits)).expect("at most 10 bits")
    }

    /// The shard of an object: its namespace's, or for a cluster-scoped object its name's.
    pub fn shard_of_object(&self, namespace: Option<&str>, name: &str) -> u32 {
        self.shard_of(namespace.unwrap_or(name))
    }

    /// The shard of stream `id`: its namespace's, a fanned-out part's own, or for a whole
    /// stream over one collection (a release without sharding) its channel's.
    pub fn shard_of_stream(&self, id: &str) -> u32 {
        if let Some(k) = StreamId::shard_in(id) {
            return k;
        }
        match StreamId::parts(id) {
            Some((_, Some(namespace))) => self.shard_of(namespace),
            Some((channel, None)) => self.shard_of(channel),
            None => self.shard_of(id),
        }
    }

    pub(super) fn validate(&self, cluster: &str) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if !self.shards.is_power_of_two() || self.shards > 1024 {
            return Err(invalid(
                "sharding.shards",
                "must be a power of two from 1 to 1024",
            ));
        }
        for topic in [self.topic(cluster), self.owners_topic(cluster)] {
            if !is_topic(&topic) {
                return Err(invalid("sharding.topic", topic_rule_for(&topic)));
            }
        }
        if self.session_timeout_ms < 6_000 {
            return Err(invalid(
                "sharding.sessionTimeoutMs",
                "must be at least 6000 (the broker's default group.min.session.timeout.ms)",
            ));
        }
        if self.ownership_deadline_ms < 2_000
            || self.ownership_deadline_ms + 3_000 > self.session_timeout_ms
        {
            return Err(invalid(
                "sharding.ownershipDeadlineMs",
                "must be at least 2000 and at least 3000 below sessionTimeoutMs, so a replica stops producing before another may own its shards",
            ));
        }
        Ok(())
    }

    /// Whether `channel`, watched over one collection (its scope is the whole cluster, or
    /// `wide`: its namespaces watched cluster-wide), is fanned out to the shards: with sharding
    /// on, always.
    pub fn fans(&self, channel: &Channel, wide: bool) -> bool {
        self.enabled && !channel.kept_whole && (wide || channel.scope == Scope::Cluster)
    }

    /// With sharding on, a namespaced channel over every namespace (`allNamespaces`) is read
    /// once per replica and fanned out to the shards (see [`ShardingConfig::fans`]), unless its
    /// topic names the namespace: then it is relayed per namespace, as a namespace selector
    /// matching every namespace would be ([`ShardingConfig::per_namespace`]). Left to `auto`,
    /// a release that relayed it per namespace before keeps doing so (see
    /// [`Config::settled`](super::Config::settled)).
    pub(super) fn spread(&self, channel: Arc<Channel>) -> Arc<Channel> {
        if !self.enabled
            || !channel.path.namespaced
            || channel.scope != Scope::Cluster
            || !channel.topic.contains("{namespace}")
        {
            return channel;
        }
        Self::per_namespace(&channel)
    }

    /// `channel`, over every namespace, relayed per namespace: a selector matching every
    /// namespace.
    pub(super) fn per_namespace(channel: &Channel) -> Arc<Channel> {
        let mut spread = channel.clone();
        spread.scope = Scope::Selector(String::new());
        spread.strategy = WatchStrategy::PerNamespace;
        Arc::new(spread)
    }

    /// Checks channel `i` can be sharded: every key must have one writer, so a channel whose
    /// namespaces go to different shards (relayed per namespace, or fanned out) needs
    /// `{namespace}` or `{uid}` in its key.
    pub(super) fn check_channel(&self, i: usize, channel: &Channel) -> Result<(), ConfigError> {
        if !self.enabled || !channel.path.namespaced {
            return Ok(());
        }
        if !channel.key.names_namespace_or_uid() {
            return Err(invalid(
                format!("channels[{i}].key"),
                "with sharding on, a channel over several namespaces needs {namespace} or {uid} in its key: namespaces in different shards would otherwise write the same key",
            ));
        }
        Ok(())
    }
}

impl super::Config {
    /// The channels whose `watchStrategy: auto` a sharded release decides before it relays
    /// (see [`Config::settled`](super::Config::settled)): over every namespace, or a selector.
    pub fn undecided(&self) -> impl Iterator<Item = &Arc<Channel>> {
        self.channels.iter().filter(move |c| {
            self.sharding.enabled
                && c.path.namespaced
                && c.strategy == WatchStrategy::Auto
                && matches!(c.scope, Scope::Cluster | Scope::Selector(_))
        })
    }

    /// This configuration with `watchStrategy: auto` decided for a sharded release, as every
    /// replica decides it alike: a channel keeps the shape the release ran it in (`recorded`,
    /// the stream ids it holds), per namespace should any of its streams be; a new one over
    /// every namespace is read cluster-wide and fanned out, and a new selector is decided as
    /// [`Channel::shape`] decides `auto` by the count of the namespaces it matches (`selected`,
    /// by channel; per namespace when not counted). Deciding once for the
    /// replica's life keeps its watches few; replicas that decided otherwise (a release changed
    /// meanwhile) stay exact, since a key's shard does not depend on the shape (see
    /// `membership::regroup`).
    pub fn settled(
        &self,
        recorded: &[String],
        selected: &std::collections::HashMap<String, usize>,
    ) -> Self {
        let threshold = self.kubernetes.cluster_wide_above as usize;
        let decided: Vec<(String, WatchStrategy)> = self
            .undecided()
            .map(|c| {
                // What the release ran: per namespace should any of its streams be.
                let ran = |per_namespace: bool| {
                    recorded.iter().any(|id| {
                        StreamId::parts(id).is_some_and(|(name, ns)| {
                            name == c.name && ns.is_some() == per_namespace
                        })
                    })
                };
                let previous = if ran(true) {
                    Some(Shape::PerNamespace)
                } else if ran(false) {
                    Some(Shape::ClusterWide)
                } else {
                    None
                };
                let shape = match c.scope {
                    Scope::Cluster => previous.unwrap_or(Shape::ClusterWide),
                    _ => {
                        let count = selected.get(&c.name).copied().unwrap_or(0);
                        c.shape(count, previous, threshold)
                            .unwrap_or(Shape::PerNamespace)
                    }
                };
                let strategy = match shape {
                    Shape::ClusterWide => WatchStrategy::ClusterWide,
                    Shape::PerNamespace => WatchStrategy::PerNamespace,
                };
                (c.name.clone(), strategy)
            })
            .collect();
        let mut settled = self.clone();
        for channel in &mut settled.channels {
            let Some((_, strategy)) = decided.iter().find(|(n, _)| *n == channel.name) else {
                continue;
            };
            *channel = match (&channel.scope, strategy) {
                (Scope::Cluster, WatchStrategy::PerNamespace) => {
                    ShardingConfig::per_namespace(channel)
                }
                _ => {
                    let mut decided = (**channel).clone();
                    decided.strategy = *strategy;
                    Arc::new(decided)
                }
            };
        }
        settled
    }

    /// This configuration with the channels over one collection that the release's shards hold
    /// recorded whole (`recorded` has `<channel>._all`, as releases before fan-out ran them in
    /// their channel's shard) kept whole there: their stream resumes in that shard, from its
    /// position with its members, instead of every shard's part of it relisting. Replicas of
    /// the older version run the same stream the same way, so a rolling upgrade hands it over
    /// like any shard, and every key keeps its history. Decide `auto` first
    /// ([`Config::settled`](super::Config::settled)): a channel over namespaces is kept whole
    /// only when read cluster-wide.
    pub fn keeping_whole(&self, recorded: &[String]) -> Self {
        let threshold = self.kubernetes.cluster_wide_above as usize;
        let mut kept = self.clone();
        for channel in &mut kept.channels {
            // Read cluster-wide as every term decides it (`relay::shapes`): a list by its
            // length under `auto`, never with a topic naming the namespace.
            let wide = match &channel.scope {
                Scope::Cluster => None,
                Scope::Namespaces(list) => channel.shape(list.len(), None, threshold),
                Scope::Selector(_) => channel.shape(0, None, usize::MAX),
            } == Some(Shape::ClusterWide);
            let whole = channel.stream_id(None).to_string();
            if self.sharding.fans(channel, wide) && recorded.contains(&whole) {
                let mut c = (**channel).clone();
                c.kept_whole = true;
                *channel = Arc::new(c);
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharding(shards: u32) -> ShardingConfig {
        ShardingConfig {
            enabled: true,
            shards,
            ..ShardingConfig::default()
        }
    }

    #[test]
    fn the_shard_is_the_top_bits_of_the_hash() {
        // FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fmix64(0), 0);
        let s = sharding(64);
        assert_eq!(
            u64::from(s.shard_of("a")),
            fmix64(0xaf63_dc4c_8601_ec8c) >> 58
        );
        assert_eq!(sharding(1).shard_of("a"), 0);
        assert!((0..1000).all(|i| s.shard_of(&format!("ns-{i}")) < 64));
    }

    #[test]
    fn a_stream_goes_with_its_namespace_or_its_channel() {
        let s = sharding(64);
        assert_eq!(s.shard_of_stream("pods.team-a"), s.shard_of("team-a"));
        assert_eq!(s.shard_of_stream("services.team-a"), s.shard_of("team-a"));
        assert_eq!(s.shard_of_stream("nodes._all"), s.shard_of("nodes"));
        assert_eq!(s.shard_of_stream("nodes._all-s9"), 9);
        assert_eq!(
            s.shard_of_object(Some("team-a"), "web"),
            s.shard_of("team-a")
        );
        assert_eq!(s.shard_of_object(None, "node-1"), s.shard_of("node-1"));
    }

    #[test]
    fn sixty_four_shards_spread_namespaces_evenly() {
        let s = sharding(64);
        // Names that differ in their last characters only: FNV-1a's top bits alone left shards
        // empty here.
        for pattern in ["team-", "ns", "prod-app-"] {
            let mut counts = [0u32; 64];
            for i in 0..5000 {
                counts[s.shard_of(&format!("{pattern}{i}")) as usize] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            // 78 a shard on average.
            assert!(*min > 45 && *max < 115, "{pattern}: {min}..{max}");
        }
    }

    #[test]
    fn settings_are_checked() {
        assert!(sharding(48).validate("c").is_err());
        assert!(sharding(64).validate("c").is_ok());
        let tight = ShardingConfig {
            ownership_deadline_ms: 9_000,
            ..sharding(64)
        };
        assert!(tight.validate("c").is_err());
    }
}
