//! Reading the membership topic back into sets: the latest record of each key decides.

use std::collections::{HashMap, HashSet};

use super::record::{END_MARKER, MARK, POSITION_PREFIX};
use super::{Known, Members, Owner};
use crate::checkpoint::Saved;

/// What another owner's live member says: that owner announced objects of `namespace` on
/// `topic`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    /// The other owner: its checkpoint ConfigMap, `<namespace>/<name>`.
    pub owner: String,
    /// The topic its member was announced on.
    pub topic: String,
    /// The member's namespace; `None` for a cluster-scoped object.
    pub namespace: Option<String>,
}

/// Every stream's members, rebuilt from the membership topic: this owner's, and the ownerless
/// records of older versions for the streams that may adopt them.
#[derive(Debug)]
pub struct Restored {
    owner: Owner,
    streams: HashMap<String, Members>,
    /// Ownerless records, kept only for these streams (`None`: none kept).
    legacy_for: Option<HashSet<String>>,
    legacy: HashMap<String, Members>,
    /// The id of this owner's topic mark, as read.
    pub mark: Option<String>,
    /// The checkpoint ConfigMap's write counter, as last copied here ([`super::writes_record`]).
    pub writes: Option<u64>,
    /// The checkpoint ConfigMap's era floor, as last copied here (0 in copies of older
    /// versions).
    pub era_floor: u64,
    /// The streams' positions committed with their records, with exactly-once delivery
    /// ([`super::position_record`]), by stream id.
    pub positions: HashMap<String, Saved>,
    /// Records read.
    pub records: u64,
    /// Records of other owners (skipped as members).
    pub foreign: u64,
    /// Other owners' live members while reading: a hash of the key, and the claim it makes.
    foreign_live: HashMap<u64, u32>,
    /// Distinct claims of other owners: who announced on which topic in which namespace.
    claim_list: Vec<Claim>,
    claim_index: HashMap<Claim, u32>,
    /// Once read: the claims other owners' live members make, by namespace (each stream of
    /// thousands looks up its own namespace's, not every claim).
    claims: HashMap<Option<String>, Vec<Claim>>,
    /// Records that could not be read (and were skipped).
    pub malformed: u64,
}

impl Restored {
    /// A restore for `owner`; ownerless records of the streams in `legacy_for` are kept for
    /// adoption.
    pub fn new(owner: Owner, legacy_for: Option<HashSet<String>>) -> Self {
        Self {
            owner,
            streams: HashMap::new(),
            legacy_for,
            legacy: HashMap::new(),
            mark: None,
            writes: None,
            era_floor: 0,
            positions: HashMap::new(),
            records: 0,
            foreign: 0,
            malformed: 0,
            foreign_live: HashMap::new(),
            claim_list: Vec::new(),
            claim_index: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    /// A read that keeps only other owners' claims: every record counts as another owner's
    /// (no owner's ConfigMap has an empty namespace and name), so no member is held.
    pub fn claims_only() -> Self {
        Self::new(Owner::new("", ""), None)
    }

    /// The live claims read, once [`Restored::finish`]ed.
    pub fn into_claims(self) -> Vec<Claim> {
        self.claims.into_values().flatten().collect()
    }

    /// Adds claims read elsewhere (other topics, other partitions) to the ones checked.
    pub fn add_claims(&mut self, claims: &[Claim]) {
        for claim in claims {
            let here = self.claims.entry(claim.namespace.clone()).or_default();
            if !here.contains(claim) {
                here.push(claim.clone());
            }
        }
    }

    /// Another owner's membership record: what it claims while its member lives.
    fn apply_foreign(&mut self, owner: &str, key: &str, value: Option<&[u8]>) {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        let h = h.finish();
        let known = value
            .filter(|v| !v.is_empty())
            .and_then(|v| serde_json::from_slice::<Known>(v).ok());
        let Some(known) = known else {
            self.foreign_live.remove(&h);
            return;
        };
        let Some(topic) = known.topic else { return };
        let claim = Claim {
            owner: owner.to_string(),
            topic,
            namespace: known.namespace,
        };
        let next = self.claim_list.len() as u32;
        let i = *self.claim_index.entry(claim.clone()).or_insert(next);
        if i == next {
            self.claim_list.push(claim);
        }
        self.foreign_live.insert(h, i);
    }

    /// The claims of other owners' live members on objects of `namespace` (`None`:
    /// cluster-scoped objects): the streams of two releases on one key interleave, and one's
    /// inferred DELETED can land after the other's live record.
    pub fn claims_in(&self, namespace: Option<&str>) -> &[Claim] {
        self.claims
            .get(&namespace.map(str::to_string))
            .map_or(&[], Vec::as_slice)
    }

    /// Every claim of other owners' live members.
    pub fn claims(&self) -> impl Iterator<Item = &Claim> {
        self.claims.values().flatten()
    }

    /// Applies one record of the topic, in its partition's order. Call [`Restored::finish`]
    /// once every record is applied.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.records += 1;
        let Some(key) = std::str::from_utf8(key).ok() else {
            self.malformed += 1;
            return;
        };
        if key == END_MARKER {
            return;
        }
        let parts: Vec<&str> = key.split('/').collect();
        let (stream, uid, legacy) = match parts[..] {
            [ns, name, stream, uid] => {
                let owner = self.owner.as_str();
                let mine = owner.len() == ns.len() + 1 + name.len()
                    && owner.starts_with(ns)
                    && owner[ns.len() + 1..] == *name;
                if !mine {
                    self.foreign += 1;
                    if stream != MARK {
                        self.apply_foreign(&format!("{ns}/{name}"), key, value);
                    }
                    return;
                }
                if stream == MARK {
                    if let Some(id) = uid.strip_prefix(POSITION_PREFIX) {
                        self.apply_position(id, value);
                        return;
                    }
                    let v = value.and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok());
                    match uid {
                        "writes" => {
                            self.writes = v.as_ref().and_then(|v| v["writes"].as_u64());
                            let era = v.as_ref().and_then(|v| v["era"].as_u64());
                            self.era_floor = self.era_floor.max(era.unwrap_or(0));
                        }
                        _ => self.mark = v.and_then(|v| v["id"].as_str().map(str::to_string)),
                    }
                    return;
                }
                (stream, uid, false)
            }
            [stream, uid] => {
                if !self.legacy_for.as_ref().is_some_and(|s| s.contains(stream)) {
                    self.foreign += 1;
                    return;
                }
                (stream, uid, true)
            }
            _ => {
                self.malformed += 1;
                return;
            }
        };
        let sets = if legacy {
            &mut self.legacy
        } else {
            &mut self.streams
        };
        match value.filter(|v| !v.is_empty()) {
            None => {
                if let Some(m) = sets.get_mut(stream) {
                    m.restore_record(uid, None);
                }
            }
            Some(v) => match serde_json::from_slice::<Known>(v) {
                Ok(known) => {
                    sets.entry(stream.to_string())
                        .or_default()
                        .restore_record(uid, Some(&known));
                }
                Err(e) => {
                    self.malformed += 1;
                    tracing::warn!(%stream, %uid, error = %e, "skipping an unreadable membership record");
                }
            },
        }
    }

    /// A position record of this owner's stream `id`: the latest one decides, a tombstone
    /// removes it.
    fn apply_position(&mut self, id: &str, value: Option<&[u8]>) {
        match value.filter(|v| !v.is_empty()) {
            None => {
                self.positions.remove(id);
            }
            Some(v) => match serde_json::from_slice::<Saved>(v) {
                Ok(saved) => {
                    self.positions.insert(id.to_string(), saved);
                }
                Err(e) => {
                    self.malformed += 1;
                    tracing::warn!(stream = %id, error = %e, "skipping an unreadable position record");
                }
            },
        }
    }

    /// Ends the restore: the latest record of each key decides.
    pub fn finish(&mut self) {
        for m in self.streams.values_mut().chain(self.legacy.values_mut()) {
            m.finish_restore();
        }
        let live: HashSet<u32> = self.foreign_live.drain().map(|(_, i)| i).collect();
        self.claims.clear();
        for i in live {
            let claim = self.claim_list[i as usize].clone();
            self.claims
                .entry(claim.namespace.clone())
                .or_default()
                .push(claim);
        }
        self.claim_list = Vec::new();
        self.claim_index = HashMap::new();
    }

    /// Sets the members of `stream`.
    pub fn insert(&mut self, stream: &str, members: Members) {
        self.streams.insert(stream.to_string(), members);
    }

    /// The members of `stream`, if it has any.
    pub fn get(&self, stream: &str) -> Option<&Members> {
        self.streams.get(stream)
    }

    /// The members of `stream`, taken once.
    pub fn take(&mut self, stream: &str) -> Members {
        let mut m = self.streams.remove(stream).unwrap_or_default();
        m.finish_restore();
        m
    }

    /// The ownerless members of `stream` an older version wrote, taken once.
    pub fn take_legacy(&mut self, stream: &str) -> Members {
        self.legacy.remove(stream).unwrap_or_default()
    }

    /// Streams with ownerless members to adopt.
    pub fn legacy_streams(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .legacy
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, _)| s.clone())
            .collect();
        v.sort();
        v
    }

    /// Members restored, over every stream.
    pub fn members(&self) -> usize {
        self.streams.values().map(Members::len).sum()
    }

    /// Bytes the restored sets hold on the heap (see [`Members::heap_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        self.streams
            .values()
            .chain(self.legacy.values())
            .map(Members::heap_bytes)
            .sum()
    }

    /// Streams with at least one member.
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(s, _)| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{mark_record, record, writes_record};

    #[test]
    fn the_latest_record_of_each_key_decides() {
        let k = |name: &str| Known {
            name: name.into(),
            namespace: Some("a".into()),
            rv: "1".into(),
            topic: Some("pods".into()),
            key: Some(format!("a/{name}")),
        };
        let me = Owner::new("team-a", "watchrelay");
        let other = Owner::new("team-b", "watchrelay");
        let u1 = "00000000-0000-4000-8000-000000000001";
        let u2 = "00000000-0000-4000-8000-000000000002";
        let mut r = Restored::new(me.clone(), None);
        for rec in [
            record("t", &me, "pods.a", u1, Some(&k("one"))),
            record("t", &me, "pods.a", u2, Some(&k("two"))),
            record("t", &me, "pods.b", u1, Some(&k("one"))),
            record("t", &other, "pods.d", u1, Some(&k("one"))),
            record("t", &other, "pods.e", u2, Some(&k("gone"))),
            record("t", &other, "pods.e", u2, None),
            record("t", &me, "pods.a", u1, None),
            record("t", &me, "pods.c", u2, None),
            mark_record("t", &me, "id-1"),
            writes_record("t", &me, 41, 7),
            writes_record("t", &other, 99, 1_000),
            writes_record("t", &me, 42, 7),
        ] {
            r.apply(
                rec.key.as_bytes(),
                (!rec.tombstone).then_some(&rec.value[..]),
            );
        }
        r.apply(END_MARKER.as_bytes(), None);
        r.apply(b"no-separator", Some(b"{}"));
        r.apply(b"team-a/watchrelay/pods.a/x", Some(b"not json"));
        r.apply(b"pods.a/legacy", Some(br#"{"name":"old","rv":"1"}"#));
        r.finish();
        assert_eq!((r.records, r.malformed, r.members()), (16, 2, 2));
        assert_eq!(r.writes, Some(42), "the latest of its own copies");
        assert_eq!(r.era_floor, 7, "its own era floor, not another owner's");
        let claims: Vec<&Claim> = r.claims().collect();
        assert_eq!(
            claims,
            [&Claim {
                owner: "team-b/watchrelay".into(),
                topic: "pods".into(),
                namespace: Some("a".into()),
            }],
            "another owner's live member claims its topic and namespace; one that left, nothing"
        );
        assert_eq!(
            r.foreign, 5,
            "another owner's record and an ownerless one not asked for"
        );
        assert_eq!(r.mark.as_deref(), Some("id-1"));
        let a = r.take("pods.a");
        assert_eq!(a.len(), 1);
        assert_eq!(a.get(u2), Some(k("two")));
        assert!(r.take("pods.a").is_empty(), "taken once");
        assert_eq!(r.streams().collect::<Vec<_>>(), ["pods.b"]);
    }
}

#[cfg(test)]
mod legacy_tests {
    use super::*;

    #[test]
    fn ownerless_records_are_kept_only_for_the_streams_that_may_adopt_them() {
        let me = Owner::new("ns", "cm");
        let mut r = Restored::new(me, Some(HashSet::from(["pods.a".to_string()])));
        let v = br#"{"name":"x","namespace":"a","rv":"3"}"#;
        r.apply(b"pods.a/00000000-0000-4000-8000-000000000001", Some(v));
        r.apply(b"pods.b/00000000-0000-4000-8000-000000000002", Some(v));
        r.finish();
        assert_eq!(r.legacy_streams(), ["pods.a"]);
        assert_eq!(r.take_legacy("pods.a").len(), 1);
        assert_eq!(
            r.members(),
            0,
            "ownerless records are not this owner's until adopted"
        );
        assert_eq!(r.foreign, 1);
    }
}
