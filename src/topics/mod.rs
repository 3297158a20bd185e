//! The topics a configuration names, and what each must be: the channels' topics (from their
//! templates), the dead-letter topic, the membership topic and, with sharding on, the shards'
//! topics. [`plan`] and [`check`] are pure; [`admin`] creates and describes them on Kafka.
//!
//! One owner per topic: the relay creates the channel and dead-letter topics at start
//! ([`Plan::published`]); the membership module and the shard group create their own compacted
//! topics when they first need them. `watchrelay topics` prints the whole plan, for teams whose
//! Kafka is managed elsewhere.
//!
//! A channel whose topic names `{namespace}` over a selector or every namespace has topics
//! that come and go with the namespaces: the plan lists the template ([`Plan::templates`]), and
//! its topics must exist (or the broker create them) before their namespaces are relayed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::config::{Config, OversizePolicy, Scope};

pub mod admin;

pub use admin::{TopicError, TopicState};

/// Partitions of a topic the relay creates when the configuration names no count.
pub const DEFAULT_PARTITIONS: i32 = 6;

/// What a topic is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Records of these channels.
    Channels(Vec<String>),
    /// Reference envelopes of oversized events.
    DeadLetter,
    /// Which objects each stream announced (compacted).
    Membership,
    /// The shards' membership records, one partition per shard (compacted).
    Shards,
    /// The shard group's empty topic, one partition per shard (compacted).
    Owners,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Channels(names) => write!(f, "channel {}", names.join(", ")),
            Role::DeadLetter => f.write_str("dead letter"),
            Role::Membership => f.write_str("membership"),
            Role::Shards => f.write_str("shards"),
            Role::Owners => f.write_str("shard group"),
        }
    }
}

/// One topic as the configuration wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The topic's name.
    pub name: String,
    /// What it is for.
    pub role: Role,
    /// Partitions it is created with.
    pub partitions: i32,
    /// The least partitions an existing topic may have: set where the configuration names a
    /// count (the shards' topics and the membership topic are checked by their owners).
    pub at_least: Option<i32>,
    /// Its replication factor when created; `None`: the broker's default.
    pub replication: Option<i32>,
    /// Topic configurations it is created with (`cleanup.policy=compact` among them when it
    /// must be compacted).
    pub configs: BTreeMap<String, String>,
}

impl Spec {
    /// Whether the topic must be compacted: a channel with tombstones, or the relay's state.
    pub fn compacted(&self) -> bool {
        self.configs
            .get("cleanup.policy")
            .is_some_and(|p| p.split(',').any(|p| p.trim() == "compact"))
    }
}

/// Every topic a configuration names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The topics the relay publishes records to: channels' and the dead-letter topic.
    pub published: Vec<Spec>,
    /// The topics of the relay's own state: membership, and with sharding the shards'.
    pub state: Vec<Spec>,
    /// Topic templates naming `{namespace}` whose namespaces are known only at run time, with
    /// their channel and what each topic would be created with.
    pub templates: Vec<Spec>,
}

/// The topics `cfg` names, each with what it must be. Channels sharing a topic share one
/// entry: the most partitions any asks for, compacted if any has tombstones.
pub fn plan(cfg: &Config) -> Plan {
    let cluster = &cfg.cluster_name;
    let defaults = &cfg.kafka.topics;
    let mut published: BTreeMap<String, Spec> = BTreeMap::new();
    let mut templates = Vec::new();
    for channel in cfg.channels.iter() {
        let mut configs = defaults.configs.clone();
        configs.extend(channel.topic_configs.clone());
        if channel.tombstones {
            configs
                .entry("cleanup.policy".into())
                .or_insert_with(|| "compact".into());
        }
        let at_least = channel.partitions.or(defaults.partitions);
        let spec = |name: String| Spec {
            name,
            role: Role::Channels(vec![channel.name.clone()]),
            partitions: at_least.unwrap_or(DEFAULT_PARTITIONS),
            at_least,
            replication: defaults.replication_factor,
            configs: configs.clone(),
        };
        let names: Vec<String> = match &channel.scope {
            _ if !channel.topic.contains("{namespace}") => vec![channel.topic_for(cluster, None)],
            Scope::Cluster if !channel.path.namespaced => vec![channel.topic_for(cluster, None)],
            Scope::Namespaces(list) => list
                .iter()
                .map(|ns| channel.topic_for(cluster, Some(ns)))
                .collect(),
            Scope::Cluster | Scope::Selector(_) => {
                templates.push(spec(channel.topic.replace("{cluster}", cluster)));
                continue;
            }
        };
        for name in names {
            let new = spec(name.clone());
            published
                .entry(name)
                .and_modify(|s| merge(s, &new))
                .or_insert(new);
        }
    }
    if cfg.kafka.oversize == OversizePolicy::DeadLetter {
        if let Some(name) = &cfg.kafka.dead_letter_topic {
            published.entry(name.clone()).or_insert_with(|| Spec {
                name: name.clone(),
                role: Role::DeadLetter,
                partitions: defaults.partitions.unwrap_or(DEFAULT_PARTITIONS),
                at_least: defaults.partitions,
                replication: defaults.replication_factor,
                configs: BTreeMap::new(),
            });
        }
    }
    let membership = &cfg.checkpoint.membership;
    let compact = || BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
    let mut state = vec![Spec {
        name: membership.topic(cluster),
        role: Role::Membership,
        partitions: membership.partitions.unwrap_or(1),
        at_least: None,
        replication: membership.replication_factor,
        configs: compact(),
    }];
    if cfg.sharding.enabled {
        let shards = cfg.sharding.shards.cast_signed();
        for (name, role) in [
            (cfg.sharding.topic(cluster), Role::Shards),
            (cfg.sharding.owners_topic(cluster), Role::Owners),
        ] {
            state.push(Spec {
                name,
                role,
                partitions: shards,
                at_least: None,
                replication: membership.replication_factor,
                configs: compact(),
            });
        }
    }
    Plan {
        published: published.into_values().collect(),
        state,
        templates,
    }
}

/// Two channels on one topic: it serves both.
fn merge(into: &mut Spec, other: &Spec) {
    if let (Role::Channels(a), Role::Channels(b)) = (&mut into.role, &other.role) {
        a.extend(b.iter().cloned());
    }
    into.partitions = into.partitions.max(other.partitions);
    into.at_least = into.at_least.max(other.at_least);
    for (k, v) in &other.configs {
        into.configs.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if other.compacted() && !into.compacted() {
        into.configs
            .insert("cleanup.policy".into(), "compact".into());
    }
}

/// Whether an existing topic serves `spec`: at least the partitions the configuration names
/// (fewer would put keys the configuration spreads in fewer places, and adding partitions
/// later moves keys between them, breaking their order), and compacted where it must be. The
/// error says what to do.
pub fn check(spec: &Spec, state: &TopicState) -> Result<(), String> {
    let wanted = spec.at_least.map_or(0, |p| usize::try_from(p).unwrap_or(0));
    if state.partitions < wanted {
        return Err(format!(
            "topic {} ({}) has {} partitions, fewer than the {} configured: lower the configured count to {} (adding partitions to a topic moves keys between partitions and breaks their order), or recreate the topic",
            spec.name, spec.role, state.partitions, wanted, state.partitions
        ));
    }
    let policy = state
        .configs
        .get("cleanup.policy")
        .map_or("delete", String::as_str);
    if spec.compacted() && !policy.split(',').any(|p| p.trim() == "compact") {
        return Err(format!(
            "topic {} ({}) has cleanup.policy={policy}, but its records need compaction (tombstones: true keeps only the live objects once compacted): set cleanup.policy=compact on the topic",
            spec.name, spec.role
        ));
    }
    Ok(())
}

/// What keeps a relay of `specs` from starting, the topics being as `states` says (`None`: it
/// does not exist): missing topics it may not create (with `create` it creates them), then
/// each existing topic's [`check`]. Empty when it can start.
pub fn problems(specs: &[Spec], states: &[Option<TopicState>], create: bool) -> Vec<String> {
    let missing: Vec<&str> = specs
        .iter()
        .zip(states)
        .filter(|(_, s)| s.is_none())
        .map(|(spec, _)| spec.name.as_str())
        .collect();
    let mut out = Vec::new();
    if !missing.is_empty() && !create {
        out.push(format!(
            "missing topics: {}; create them (`watchrelay topics` prints how) or let the relay create them (kafka.topics.create: true)",
            missing.join(", ")
        ));
    }
    out.extend(
        specs
            .iter()
            .zip(states)
            .filter_map(|(spec, state)| check(spec, state.as_ref()?).err()),
    );
    out
}

/// The plan as a table: topic, partitions, replication, configurations, role.
pub fn table(plan: &Plan) -> String {
    let mut rows = vec![[
        "TOPIC".to_string(),
        "PARTITIONS".into(),
        "REPLICATION".into(),
        "CONFIGS".into(),
        "FOR".into(),
    ]];
    let all = plan
        .published
        .iter()
        .chain(&plan.state)
        .chain(&plan.templates);
    for s in all {
        rows.push([
            s.name.clone(),
            s.partitions.to_string(),
            s.replication.map_or("default".into(), |r| r.to_string()),
            configs(s, ","),
            s.role.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    if !plan.templates.is_empty() {
        let _ = writeln!(
            out,
            "\n{{namespace}} stands for each namespace the channel relays: those topics are not created at start."
        );
    }
    out
}

/// The plan as `kafka-topics.sh --create` lines against `bootstrap`, one a topic.
pub fn commands(plan: &Plan, bootstrap: &str) -> String {
    let mut out = String::new();
    for s in plan
        .published
        .iter()
        .chain(&plan.state)
        .chain(&plan.templates)
    {
        let _ = write!(
            out,
            "kafka-topics.sh --bootstrap-server {bootstrap} --create --if-not-exists --topic {} --partitions {}",
            s.name, s.partitions
        );
        if let Some(r) = s.replication {
            let _ = write!(out, " --replication-factor {r}");
        }
        for (k, v) in &s.configs {
            let _ = write!(out, " --config {k}={v}");
        }
        let _ = writeln!(out);
    }
    out
}

fn configs(spec: &Spec, sep: &str) -> String {
    if spec.configs.is_empty() {
        return "-".into();
    }
    spec.configs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(sep)
}

#[cfg(test)]
mod tests;
