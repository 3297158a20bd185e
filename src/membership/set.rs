//! [`Members`]: one stream's known objects, compact enough for a million of them.
//!
//! Object identities are kept in a byte arena (chunks of one size, see [`Arena`]) indexed by uid:
//! a canonical (lowercase, hyphenated) UUID, which is what the API server assigns, is kept as
//! its 16 bytes; any other uid is indexed by a 128-bit hash and kept whole in its entry. An entry
//! is the object's name, namespace (a flag when it is the set's usual one) and resourceVersion,
//! each length-prefixed, then where it was announced: its topic (a flag when it is the set's
//! usual one) and its key (a flag when it is the default `namespace/name`), so a retraction
//! needs nothing else.
//!
//! The index is a sorted array (20 bytes a member, what a restore builds in one pass) and a small
//! hash map of what joined since; both are merged back into the array once the map or the removed
//! entries grow past a quarter of it. Removals leave garbage in the arena, reclaimed in the same
//! pass once it outweighs what is live.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::arena::Arena;
use super::Known;

/// A uid as the set indexes it: a canonical UUID's 16 bytes, or a 128-bit hash of any other uid
/// (see [`Members::key`]).
pub type Key = [u8; 16];

/// Bytes of garbage tolerated before the arena is rewritten (and then only once it outweighs
/// what is live).
const RECLAIM_FLOOR: usize = 1 << 20;

/// Records a set appends during a restore before it compacts them, whatever its size.
const RESTORE_FLOOR: usize = 1024;

/// Entries the hash map may hold before it is merged into the sorted array, whatever its size.
const DELTA_FLOOR: usize = 4096;

/// The arena offset of a removed entry of the sorted array.
const REMOVED: u32 = u32::MAX;

/// Marks a tombstone's position during a restore.
const TOMBSTONE: u32 = 1 << 31;

/// Entry flags.
const OTHER_UID: u8 = 1;
const USUAL_NAMESPACE: u8 = 2;
const NO_NAMESPACE: u8 = 4;
/// The topic is stored in the entry.
const OWN_TOPIC: u8 = 8;
/// The topic is the set's usual one.
const USUAL_TOPIC: u8 = 16;
/// The key is stored in the entry.
const OWN_KEY: u8 = 32;
/// The key is the default rendering: `namespace/name`, or `name` without a namespace.
const DEFAULT_KEY: u8 = 64;
/// The resourceVersion is a decimal integer (as KEP-5504 makes it), stored as a varint.
const NUMERIC_RV: u8 = 128;

/// The set of objects a stream announced, by uid.
#[derive(Default)]
pub struct Members {
    /// Sorted by key (once [`Members::finish_restore`] ran); `REMOVED` marks a removed entry.
    base: Vec<(Key, u32)>,
    /// Entries of `base` marked removed.
    removed: usize,
    /// Members that joined since `base` was built.
    delta: HashMap<Key, u32, BuildHasherDefault<KeyHasher>>,
    /// `base` holds records in log order, not yet sorted (a restore in progress).
    restoring: bool,
    /// During a restore: the entries `base` kept at its last compaction.
    kept: usize,
    arena: Arena,
    /// Where an entry is encoded before it is pushed to the arena.
    scratch: Vec<u8>,
    /// Bytes of the arena no entry uses any more.
    garbage: usize,
    /// The namespace most entries share (a namespaced stream's), stored once.
    usual_namespace: Option<Box<str>>,
    /// The topic most entries were announced on, stored once.
    usual_topic: Option<Box<str>>,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members").field("len", &self.len()).finish()
    }
}

impl Members {
    /// How many objects are members.
    pub fn len(&self) -> usize {
        self.base.len() - self.removed + self.delta.len()
    }

    /// Whether no object is a member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the set holds on the heap (its arrays' and map's capacity, not the allocator's
    /// own overhead).
    pub fn heap_bytes(&self) -> usize {
        self.base.capacity() * size_of::<(Key, u32)>()
            + self.delta.capacity() * (size_of::<(Key, u32)>() + 1)
            + self.arena.heap_bytes()
            + self.scratch.capacity()
    }

    /// Whether the object with `uid` is a member.
    pub fn contains(&self, uid: &str) -> bool {
        self.offset(&key(uid)).is_some()
    }

    /// What the set keeps of member `uid`; `None` when it is not one.
    pub fn get(&self, uid: &str) -> Option<Known> {
        let k = key(uid);
        self.offset(&k).map(|at| self.decode(k, at).1)
    }

    /// The key `uid` is indexed by: 16 bytes where a uid and its `Known` take a hundred, for
    /// bookkeeping over every member (a resync's).
    pub fn key(uid: &str) -> Key {
        key(uid)
    }

    /// The member indexed by `k`, with its uid.
    pub fn get_key(&self, k: &Key) -> Option<(String, Known)> {
        self.offset(k).map(|at| self.decode(*k, at))
    }

    /// Every member's key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.entries().map(|(k, _)| k)
    }

    /// Where `k`'s entry is in the arena.
    fn offset(&self, k: &Key) -> Option<u32> {
        debug_assert!(!self.restoring, "a restore in progress is not queried");
        if let Some(&at) = self.delta.get(k) {
            return Some(at);
        }
        let i = self.base.binary_search_by(|(b, _)| b.cmp(k)).ok()?;
        Some(self.base[i].1).filter(|&at| at != REMOVED)
    }

    /// Adds (or replaces) `uid`.
    pub fn insert(&mut self, uid: &str, known: &Known) {
        let at = self.push_entry(uid, known);
        let k = key(uid);
        if let Ok(i) = self.base.binary_search_by(|(b, _)| b.cmp(&k)) {
            match std::mem::replace(&mut self.base[i].1, at) {
                REMOVED => self.removed -= 1,
                old => self.garbage += self.entry_len(old),
            }
        } else if let Some(old) = self.delta.insert(k, at) {
            self.garbage += self.entry_len(old);
        }
        self.maintain();
    }

    /// Removes `uid`; returns whether it was a member.
    pub fn remove(&mut self, uid: &str) -> bool {
        let k = key(uid);
        let old = match self.delta.remove(&k) {
            Some(at) => at,
            None => {
                let Ok(i) = self.base.binary_search_by(|(b, _)| b.cmp(&k)) else {
                    return false;
                };
                match std::mem::replace(&mut self.base[i].1, REMOVED) {
                    REMOVED => return false,
                    at => {
                        self.removed += 1;
                        at
                    }
                }
            }
        };
        self.garbage += self.entry_len(old);
        self.maintain();
        true
    }

    /// During a restore: the next record of `uid` in log order (`None`, a tombstone). Nothing
    /// may be queried until [`Members::finish_restore`].
    pub fn restore_record(&mut self, uid: &str, known: Option<&Known>) {
        self.restoring = true;
        self.room_for_record();
        let at = match known {
            Some(known) => self.push_entry(uid, known),
            None => {
                // A byte of its own keeps positions in the arena strictly in log order.
                self.arena.push(&[0]) | TOMBSTONE
            }
        };
        self.base.push((key(uid), at));
    }

    /// Ends a restore: the latest record of each uid decides. Sorts in place: the index never
    /// exists twice.
    pub fn finish_restore(&mut self) {
        if !std::mem::take(&mut self.restoring) {
            return;
        }
        self.compact_restored();
        self.kept = 0;
        self.base.shrink_to_fit();
        self.arena.shrink_to_fit();
        self.scratch = Vec::new();
    }

    /// During a restore, before a record is appended to a full index: the set first compacts
    /// what it read (keeps the latest record of each uid, see [`Members::compact_restored`])
    /// once it appended an eighth of what it kept, then grows the index by a sixteenth of what
    /// it holds, exactly (a large vector grows in place, its pages remapped; the arena grows a
    /// chunk at a time, see [`Arena`]). So a topic holding history (superseded records,
    /// tombstones) is read in memory that follows what is live at that point of the log, an
    /// eighth and a sixteenth over at most and never doubled, not the records read; and
    /// compactions cost O(records log members).
    fn room_for_record(&mut self) {
        if self.base.len() < self.base.capacity() {
            return;
        }
        if self.base.len() - self.kept >= (self.kept / 8).max(RESTORE_FLOOR) {
            self.compact_restored();
            self.kept = self.base.len();
        }
        if self.base.len() == self.base.capacity() {
            self.base
                .reserve_exact((self.base.len() / 16).max(RESTORE_FLOOR));
        }
    }

    /// Keeps the latest record of each uid read so far (none for a tombstone), sorted, and
    /// rewrites the arena within itself. Arena positions follow log order before and after, so
    /// records appended later still sort after the ones kept.
    fn compact_restored(&mut self) {
        // Arena positions follow log order, so the last record of a uid sorts last.
        self.base
            .sort_unstable_by_key(|&(k, at)| (k, at & !TOMBSTONE));
        let mut kept = 0;
        for i in 0..self.base.len() {
            let (k, at) = self.base[i];
            let last = self.base.get(i + 1).is_none_or(|(next, _)| *next != k);
            if last && at & TOMBSTONE == 0 {
                self.base[kept] = (k, at);
                kept += 1;
            }
        }
        self.base.truncate(kept);
        self.removed = 0;
        // Entries move down in arena order, each to where the previous one ended.
        self.base.sort_unstable_by_key(|&(_, at)| at);
        self.arena
            .retain(self.base.iter_mut().map(|(_, at)| at), entry_len);
        self.garbage = 0;
        self.base.sort_unstable_by_key(|&(k, _)| k);
    }

    /// The keys of the members in `namespace`, in no particular order. Only each entry's
    /// namespace is read, in place: nothing is decoded or allocated per member, so a
    /// namespace's members are found in a stream of a million in milliseconds.
    pub fn keys_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = Key> + 'a {
        self.entries()
            .filter(move |&(_, at)| self.namespace_at(at) == Some(namespace))
            .map(|(k, _)| k)
    }

    /// The namespaces the members are in, read in place as [`Members::keys_in`] does.
    pub fn namespaces(&self) -> BTreeSet<String> {
        let found: BTreeSet<&str> = self
            .entries()
            .filter_map(|(_, at)| self.namespace_at(at))
            .collect();
        found.into_iter().map(str::to_string).collect()
    }

    /// Every live entry: its key and where it is in the arena.
    fn entries(&self) -> impl Iterator<Item = (Key, u32)> + '_ {
        self.base
            .iter()
            .copied()
            .filter(|(_, at)| *at != REMOVED)
            .chain(self.delta.iter().map(|(k, at)| (*k, *at)))
    }

    /// The namespace of the entry at `at`, read in place; `None` for a cluster-scoped object.
    fn namespace_at(&self, at: u32) -> Option<&str> {
        let mut r = Reader {
            bytes: self.arena.entry(at),
            at: 0,
        };
        let flags = r.byte();
        if flags & OTHER_UID != 0 {
            r.str();
        }
        if flags & NO_NAMESPACE != 0 {
            None
        } else if flags & USUAL_NAMESPACE != 0 {
            self.usual_namespace.as_deref()
        } else {
            Some(r.str())
        }
    }

    /// Every member, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (String, Known)> + '_ {
        self.entries().map(|(k, at)| self.decode(k, at))
    }

    /// Appends `uid`'s entry to the arena; returns its offset.
    fn push_entry(&mut self, uid: &str, known: &Known) -> u32 {
        if self.usual_namespace.is_none() {
            self.usual_namespace = known.namespace.as_deref().map(Box::from);
        }
        if self.usual_topic.is_none() {
            self.usual_topic = known.topic.as_deref().map(Box::from);
        }
        let mut entry = std::mem::take(&mut self.scratch);
        entry.clear();
        self.encode(&mut entry, uid, known);
        let at = self.arena.push(&entry);
        self.scratch = entry;
        at
    }

    /// The length of the entry at `at`.
    fn entry_len(&self, at: u32) -> usize {
        entry_len(self.arena.entry(at))
    }

    /// Merges the map into the sorted array, and rewrites the arena, when either has grown.
    fn maintain(&mut self) {
        let quarter = self.base.len() / 4;
        if self.delta.len() > quarter.max(DELTA_FLOOR) || self.removed > quarter.max(DELTA_FLOOR) {
            let mut base: Vec<(Key, u32)> = self
                .base
                .iter()
                .copied()
                .filter(|(_, at)| *at != REMOVED)
                .chain(self.delta.drain())
                .collect();
            base.sort_unstable_by_key(|&(k, _)| k);
            self.base = base;
            self.removed = 0;
        }
        self.reclaim();
    }

    /// Writes `uid`'s entry to `out`.
    fn encode(&self, out: &mut Vec<u8>, uid: &str, known: &Known) {
        let canonical = parse_uuid(uid).is_some();
        let namespace = known.namespace.as_deref();
        let mut flags = if canonical { 0 } else { OTHER_UID };
        match namespace {
            None => flags |= NO_NAMESPACE,
            Some(ns) if self.usual_namespace.as_deref() == Some(ns) => flags |= USUAL_NAMESPACE,
            Some(_) => {}
        }
        match known.topic.as_deref() {
            None => {}
            Some(t) if self.usual_topic.as_deref() == Some(t) => flags |= USUAL_TOPIC,
            Some(_) => flags |= OWN_TOPIC,
        }
        match known.key.as_deref() {
            None => {}
            Some(k) if is_default_key(k, namespace, &known.name) => flags |= DEFAULT_KEY,
            Some(_) => flags |= OWN_KEY,
        }
        let numeric_rv = crate::event::comparable(&known.rv);
        if numeric_rv.is_some() {
            flags |= NUMERIC_RV;
        }
        out.push(flags);
        if !canonical {
            push_str(out, uid);
        }
        if flags & (NO_NAMESPACE | USUAL_NAMESPACE) == 0 {
            push_str(out, namespace.unwrap_or_default());
        }
        push_str(out, &known.name);
        match numeric_rv {
            Some(mut n) => loop {
                let low = (n & 0x7f) as u8;
                n >>= 7;
                if n == 0 {
                    out.push(low);
                    break;
                }
                out.push(low | 0x80);
            },
            None => push_str(out, &known.rv),
        }
        if let (true, Some(t)) = (flags & OWN_TOPIC != 0, known.topic.as_deref()) {
            push_str(out, t);
        }
        if let (true, Some(k)) = (flags & OWN_KEY != 0, known.key.as_deref()) {
            push_str(out, k);
        }
    }

    fn decode(&self, key: Key, at: u32) -> (String, Known) {
        let mut r = Reader {
            bytes: self.arena.entry(at),
            at: 0,
        };
        let flags = r.byte();
        let uid = if flags & OTHER_UID != 0 {
            r.str().to_string()
        } else {
            format_uuid(&key)
        };
        let namespace = if flags & NO_NAMESPACE != 0 {
            None
        } else if flags & USUAL_NAMESPACE != 0 {
            self.usual_namespace.as_deref().map(str::to_string)
        } else {
            Some(r.str().to_string())
        };
        let name = r.str().to_string();
        let rv = r.rv(flags);
        let topic = if flags & OWN_TOPIC != 0 {
            Some(r.str().to_string())
        } else if flags & USUAL_TOPIC != 0 {
            self.usual_topic.as_deref().map(str::to_string)
        } else {
            None
        };
        let key = if flags & OWN_KEY != 0 {
            Some(r.str().to_string())
        } else if flags & DEFAULT_KEY != 0 {
            Some(match &namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.clone(),
            })
        } else {
            None
        };
        (
            uid,
            Known {
                name,
                namespace,
                rv,
                topic,
                key,
            },
        )
    }

    /// Rewrites the arena once garbage outweighs what is live.
    fn reclaim(&mut self) {
        if self.garbage < RECLAIM_FLOOR || self.garbage * 2 < self.arena.used() {
            return;
        }
        let mut arena = Arena::default();
        let offsets = self
            .base
            .iter_mut()
            .map(|(_, at)| at)
            .chain(self.delta.values_mut())
            .filter(|at| **at != REMOVED);
        for at in offsets {
            let entry = self.arena.entry(*at);
            *at = arena.push(&entry[..entry_len(entry)]);
        }
        self.arena = arena;
        self.garbage = 0;
    }
}

/// The length of the entry that starts `bytes`.
fn entry_len(bytes: &[u8]) -> usize {
    let mut r = Reader { bytes, at: 0 };
    let flags = r.byte();
    let before = 1
        + usize::from(flags & OTHER_UID != 0)
        + usize::from(flags & (NO_NAMESPACE | USUAL_NAMESPACE) == 0);
    let after = usize::from(flags & OWN_TOPIC != 0) + usize::from(flags & OWN_KEY != 0);
    for _ in 0..before {
        r.str();
    }
    r.rv(flags);
    for _ in 0..after {
        r.str();
    }
    r.at
}

/// Whether `key` is the default key template's rendering of `namespace/name`.
fn is_default_key(key: &str, namespace: Option<&str>, name: &str) -> bool {
    match namespace {
        Some(ns) => key
            .strip_prefix(ns)
            .and_then(|k| k.strip_prefix('/'))
            .is_some_and(|k| k == name),
        None => key == name,
    }
}

/// A string with its length: one byte below 255, else 255 and two bytes.
fn push_str(arena: &mut Vec<u8>, s: &str) {
    // Kubernetes names are at most 253 bytes; anything longer is cut at a character boundary.
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    match u8::try_from(end) {
        Ok(len) if len < u8::MAX => arena.push(len),
        _ => {
            arena.push(u8::MAX);
            arena.extend_from_slice(&(end as u16).to_le_bytes());
        }
    }
    arena.extend_from_slice(&s.as_bytes()[..end]);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> u8 {
        self.at += 1;
        self.bytes[self.at - 1]
    }

    fn str(&mut self) -> &'a str {
        let len = match self.byte() {
            u8::MAX => {
                let len = u16::from_le_bytes([self.bytes[self.at], self.bytes[self.at + 1]]);
                self.at += 2;
                len as usize
            }
            len => len as usize,
        };
        self.at += len;
        std::str::from_utf8(&self.bytes[self.at - len..self.at])
            .expect("the arena holds what was written from strings")
    }

    /// A resourceVersion: a varint under [`NUMERIC_RV`], else a string.
    fn rv(&mut self, flags: u8) -> String {
        if flags & NUMERIC_RV == 0 {
            return self.str().to_string();
        }
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte();
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        n.to_string()
    }
}

/// The index key of a uid: a canonical UUID's 16 bytes, or a 128-bit hash of anything else.
fn key(uid: &str) -> Key {
    parse_uuid(uid).unwrap_or_else(|| {
        let h = |seed: u64| {
            uid.bytes().fold(seed, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&h(0xcbf2_9ce4_8422_2325).to_le_bytes());
        k[8..].copy_from_slice(&h(0x6c62_272e_07bb_0142).to_le_bytes());
        k
    })
}

/// The 16 bytes of a lowercase hyphenated UUID; `None` for any other spelling.
fn parse_uuid(s: &str) -> Option<Key> {
    /// Where each byte's two digits start.
    const DIGITS: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let b: &[u8; 36] = s.as_bytes().try_into().ok()?;
    if b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return None;
    }
    let mut out = [0u8; 16];
    // Every digit's value is below 16; anything else sets a high bit, checked once at the end.
    let mut bad = 0u8;
    for (byte, &at) in out.iter_mut().zip(&DIGITS) {
        let (hi, lo) = (hex(b[at]), hex(b[at + 1]));
        bad |= hi | lo;
        *byte = hi << 4 | (lo & 0x0f);
    }
    (bad < 16).then_some(out)
}

/// A lowercase hex digit's value, or 0xff.
fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => 0xff,
    }
}

fn format_uuid(k: &Key) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in k.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Uids are random (or already hashed): their first eight bytes are hash enough.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, _: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(name: &str, ns: Option<&str>, rv: &str) -> Known {
        Known {
            name: name.into(),
            namespace: ns.map(str::to_string),
            rv: rv.into(),
            ..Known::default()
        }
    }

    #[test]
    fn the_namespaces_of_the_members_are_read_in_place() {
        let mut m = Members::default();
        assert!(m.namespaces().is_empty());
        m.insert(
            "0f1e2d3c-4b5a-4697-8877-66554433aa11",
            &known("p", Some("a"), "1"),
        );
        m.insert(
            "0f1e2d3c-4b5a-4697-8877-66554433aa12",
            &known("q", Some("a"), "2"),
        );
        m.insert("not-a-uuid", &known("r", Some("b"), "3"));
        m.insert(
            "0f1e2d3c-4b5a-4697-8877-66554433aa13",
            &known("node", None, "4"),
        );
        let names = |m: &Members| m.namespaces().into_iter().collect::<Vec<_>>();
        assert_eq!(names(&m), ["a", "b"]);
        m.remove("not-a-uuid");
        assert_eq!(names(&m), ["a"]);
    }

    #[test]
    fn only_a_canonical_uuid_is_kept_as_its_bytes() {
        let uuid = "0f1e2d3c-4b5a-4697-8877-66554433aa11";
        let k = parse_uuid(uuid).expect("canonical");
        assert_eq!(k[0], 0x0f);
        assert_eq!(k[15], 0x11);
        assert_eq!(format_uuid(&k), uuid);
        // Every digit position, spoiled in turn (a digit outside the alphabet, an uppercase one,
        // a hyphen's place taken by a digit), is refused.
        for at in 0..uuid.len() {
            for c in ['g', 'A', '-', '0', '/'] {
                let mut b = uuid.as_bytes().to_vec();
                if b[at] == c as u8 {
                    continue;
                }
                b[at] = c as u8;
                let s = String::from_utf8(b).unwrap();
                let hyphen = matches!(at, 8 | 13 | 18 | 23);
                let still_canonical = !hyphen && c == '0';
                assert_eq!(parse_uuid(&s).is_some(), still_canonical, "{s}");
            }
        }
        for other in [
            "",
            "0f1e2d3c4b5a4697887766554433aa11",
            "0f1e2d3c-4b5a-4697-8877-66554433aa1é",
        ] {
            assert_eq!(parse_uuid(other), None, "{other}");
        }
    }

    #[test]
    fn a_namespace_s_members_are_found_without_decoding_the_others() {
        let mut m = Members::default();
        let uid = |i: usize| format!("0f1e2d3c-4b5a-4697-8877-{i:012x}");
        for i in 0..10_000 {
            let ns = ["shop", "blog", "ops"][i % 3];
            m.insert(&uid(i), &known("x", Some(ns), "1"));
        }
        m.insert("not-a-uuid", &known("y", Some("blog"), "1"));
        m.insert(&uid(20_000), &known("node", None, "1"));
        m.remove(&uid(1));
        for (ns, n) in [("shop", 3334), ("blog", 3333), ("ops", 3333), ("none", 0)] {
            let found: Vec<Key> = m.keys_in(ns).collect();
            assert_eq!(found.len(), n, "{ns}");
            assert!(found
                .iter()
                .all(|k| m.get_key(k).unwrap().1.namespace.as_deref() == Some(ns)));
        }
    }

    #[test]
    fn members_round_trip_whatever_their_uid_and_namespace() {
        let mut m = Members::default();
        let uuid = "0f1e2d3c-4b5a-4697-8877-66554433aa11";
        m.insert(uuid, &known("web-1", Some("shop"), "17"));
        m.insert("Not-A-UUID/x", &known("web-2", Some("shop"), "18"));
        m.insert(
            "0F1E2D3C-4B5A-4697-8877-66554433AA11",
            &known("n", None, "1"),
        );
        m.insert("b", &known("web-3", Some("other"), "19"));
        let long = "x".repeat(300);
        m.insert("c", &known(&long, Some("shop"), "20"));
        // resourceVersions that are not canonical integers are kept as they are.
        let odd = [
            "0",
            "007",
            "+5",
            "abc",
            "",
            "18446744073709551615",
            "18446744073709551616",
        ];
        for (i, rv) in odd.iter().enumerate() {
            m.insert(&format!("rv-{i}"), &known("r", Some("shop"), rv));
        }
        for (i, rv) in odd.iter().enumerate() {
            assert_eq!(
                m.get(&format!("rv-{i}")),
                Some(known("r", Some("shop"), rv))
            );
            assert!(m.remove(&format!("rv-{i}")));
        }
        assert_eq!(m.get("c").unwrap().name, long);
        assert!(m.remove("c"));
        assert_eq!(m.len(), 4);
        assert_eq!(m.get(uuid), Some(known("web-1", Some("shop"), "17")));
        assert_eq!(
            m.get("Not-A-UUID/x"),
            Some(known("web-2", Some("shop"), "18"))
        );
        assert_eq!(
            m.get("0F1E2D3C-4B5A-4697-8877-66554433AA11"),
            Some(known("n", None, "1"))
        );
        assert_eq!(m.get("b"), Some(known("web-3", Some("other"), "19")));
        let mut all: Vec<_> = m.iter().map(|(u, _)| u).collect();
        all.sort();
        assert_eq!(
            all,
            [
                "0F1E2D3C-4B5A-4697-8877-66554433AA11",
                uuid,
                "Not-A-UUID/x",
                "b"
            ]
        );
        m.insert(uuid, &known("web-1", Some("shop"), "20"));
        assert_eq!(m.get(uuid).unwrap().rv, "20");
        assert!(m.remove(uuid) && !m.remove(uuid) && !m.contains(uuid));
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn garbage_is_reclaimed_and_entries_survive_it() {
        let mut m = Members::default();
        let uid = |i: u32| format!("{i:08x}-0000-4000-8000-000000000000");
        for round in 0..4 {
            for i in 0..40_000 {
                m.insert(
                    &uid(i),
                    &known(&format!("pod-{i}"), Some("ns"), &round.to_string()),
                );
            }
            for i in (0..40_000).step_by(2) {
                assert!(m.remove(&uid(i)));
            }
        }
        assert_eq!(m.len(), 20_000);
        // 2.4 MB were written; what stays is what is live plus at most the tolerated garbage.
        assert!(
            m.arena.used() < 2 * RECLAIM_FLOOR,
            "{} bytes",
            m.arena.used()
        );
        assert_eq!(m.get(&uid(7)), Some(known("pod-7", Some("ns"), "3")));
    }

    #[test]
    fn restored_then_changed_members_match_a_plain_map() {
        use std::collections::HashMap;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let uid = |i: u64| format!("{i:08x}-0000-4000-8000-{:012x}", i * 7);
        let mut model: HashMap<String, Known> = HashMap::new();
        let mut m = Members::default();
        // A log with superseded records and tombstones, as an uncompacted topic holds: many
        // more records than members, so the restore compacts what it read several times.
        for i in 0..300_000 {
            let u = uid(next(9_000));
            if i % 50_000 == 0 {
                // What the restore holds follows the members (9,000 at most), not the records.
                assert!(m.base.capacity() <= 16_000, "{}", m.base.capacity());
            }
            if next(4) == 0 {
                m.restore_record(&u, None);
                model.remove(&u);
            } else {
                let k = known(&format!("pod-{i}"), Some("ns"), &i.to_string());
                m.restore_record(&u, Some(&k));
                model.insert(u, k);
            }
        }
        m.finish_restore();
        let check = |m: &Members, model: &HashMap<String, Known>| {
            assert_eq!(m.len(), model.len());
            let all: HashMap<String, Known> = m.iter().collect();
            assert_eq!(&all, model);
        };
        check(&m, &model);
        // Then live changes, enough to merge the map into the array and reclaim the arena.
        for i in 0..60_000 {
            let u = uid(next(12_000));
            if next(3) == 0 {
                assert_eq!(m.remove(&u), model.remove(&u).is_some());
            } else {
                let k = known(
                    &format!("p{i}"),
                    Some(if i % 5 == 0 { "other" } else { "ns" }),
                    "1",
                );
                m.insert(&u, &k);
                model.insert(u, k);
            }
        }
        check(&m, &model);
        for (u, k) in &model {
            assert_eq!(m.get(u).as_ref(), Some(k));
        }
    }
}
