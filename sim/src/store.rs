//! Objects, the resourceVersion counter, the history log and the journal.
//!
//! One counter orders every change of every resource, as etcd's revision does. The history keeps
//! each change with the object after it and the object before it, so the store can answer a
//! list at an older resourceVersion (by undoing later changes) and replay a watch from any
//! position still inside the window. Everything older than `compacted` is gone: asking for it is
//! 410 Expired.
//!
//! A kept change holds its object as JSON text, as etcd holds its revisions, not as a parsed
//! value: a pod is about 5 KB as text and ten times that parsed, and a churn of thousands of
//! changes a second keeps every one of them for the whole window. The parsed objects stay with
//! the newest [`HOT`] changes, where live watchers with selectors read them; an older change
//! parses its text again when a replay or a list at an older resourceVersion asks for it.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::resources::Resource;
use crate::SimError;

/// An object's JSON as the store wrote it, parsed again.
fn parse(json: &Bytes) -> Arc<Value> {
    Arc::new(serde_json::from_slice(json).expect("the store wrote it"))
}

/// How many of the newest changes keep their objects parsed.
const HOT: usize = 1 << 10;

/// One change, serialized once as a watch line and shared by every watcher.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: String,
    pub event_type: &'static str,
    /// `{"type":..,"object":..}\n`
    pub line: Bytes,
    /// The object after the change as JSON: a slice of `line`.
    object: Bytes,
    /// The object before the change as JSON (None for ADDED): a slice of the line that made it,
    /// where the store still had it.
    prev: Option<Bytes>,
    /// Both parsed, while the change is among the newest [`HOT`].
    parsed: Mutex<Option<Parsed>>,
}

type Parsed = (Arc<Value>, Option<Arc<Value>>);

impl Change {
    /// The object after the change.
    pub fn object(&self) -> Arc<Value> {
        match &*self.parsed.lock().expect("change lock poisoned") {
            Some((object, _)) => object.clone(),
            None => parse(&self.object),
        }
    }

    /// The object before the change (None for ADDED).
    pub fn prev(&self) -> Option<Arc<Value>> {
        match &*self.parsed.lock().expect("change lock poisoned") {
            Some((_, prev)) => prev.clone(),
            None => self.prev.as_ref().map(parse),
        }
    }

    /// Drops the parsed objects; the text stays.
    fn cool(&self) {
        self.parsed.lock().expect("change lock poisoned").take();
    }
}

type Key = (String, String, String);

fn key(resource: &str, ns: Option<&str>, name: &str) -> Key {
    (
        resource.to_string(),
        ns.unwrap_or("").to_string(),
        name.to_string(),
    )
}

/// The keyspace at one revision, as an etcd snapshot holds it ([`crate::Sim::snapshot`]).
#[derive(Clone)]
pub struct Snapshot {
    rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<Change>>,
    compacted: u64,
}

/// One change as it happened: the ground truth tests compare against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    /// The resourceVersion the change got: the store's revision after it.
    pub rv: u64,
    /// ADDED, MODIFIED or DELETED.
    pub event_type: String,
    /// The object's `metadata.uid`; a name deleted and created again gets a new one.
    pub uid: String,
    /// The object's `kind`, e.g. `Pod`.
    pub kind: String,
    /// The object's namespace; `None` for a cluster-scoped one.
    pub namespace: Option<String>,
    /// The object's `metadata.name`, unique within its resource and namespace.
    pub name: String,
    /// `plural[.group]`.
    pub resource: String,
}

pub struct Store {
    pub rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    pub history: VecDeque<Arc<Change>>,
    /// History holds every change with rv > compacted.
    pub compacted: u64,
    history_limit: usize,
    pub journal: VecDeque<JournalEntry>,
    journal_limit: Option<usize>,
    pub resources: BTreeMap<String, Resource>,
    pub tx: broadcast::Sender<Arc<Change>>,
    uid_seed: u64,
    /// Each current object's JSON, a slice of the line that made it: the next change's `prev`.
    texts: BTreeMap<Key, Bytes>,
}

pub fn watch_line(event_type: &str, object: &Value) -> Bytes {
    line_of(event_type, object).0
}

/// `{"type":..,"object":..}\n`, as the API server writes it, and the object's JSON inside it.
fn line_of(event_type: &str, object: &Value) -> (Bytes, Bytes) {
    let mut v = format!(r#"{{"type":"{event_type}","object":"#).into_bytes();
    let start = v.len();
    serde_json::to_writer(&mut v, object).expect("json values serialize");
    let end = v.len();
    v.extend_from_slice(b"}\n");
    // Exactly as long as the line: history keeps it for the whole window.
    let line = Bytes::from(v.into_boxed_slice());
    (line.clone(), line.slice(start..end))
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("just made an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

impl Store {
    pub fn new(
        resources: Vec<Resource>,
        history_limit: usize,
        journal_limit: Option<usize>,
    ) -> Self {
        let (tx, _) = broadcast::channel(1 << 16);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 1,
            history_limit,
            journal: VecDeque::new(),
            journal_limit,
            resources: resources.into_iter().map(|r| (r.key(), r)).collect(),
            tx,
            uid_seed: seed | 1,
            texts: BTreeMap::new(),
        }
    }

    pub fn resource(&self, key: &str) -> Result<&Resource, SimError> {
        self.resources
            .get(key)
            .ok_or_else(|| SimError::not_found(key, ""))
    }

    fn uid(&mut self) -> String {
        let mut next = || {
            self.uid_seed ^= self.uid_seed << 13;
            self.uid_seed ^= self.uid_seed >> 7;
            self.uid_seed ^= self.uid_seed << 17;
            self.uid_seed
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        )
    }

    /// The namespace an object goes to: the request's, else its own; none when cluster-scoped.
    fn scope(
        &self,
        res: &Resource,
        ns: Option<&str>,
        obj: &Value,
    ) -> Result<Option<String>, SimError> {
        match (
            res.namespaced,
            ns.or_else(|| obj["metadata"]["namespace"].as_str()),
        ) {
            (true, None) => Err(SimError::invalid(
                "namespace is required for a namespaced resource",
            )),
            (true, Some(ns)) => Ok(Some(ns.to_string())),
            (false, _) => Ok(None),
        }
    }

    fn record(
        &mut self,
        res: &Resource,
        event_type: &'static str,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let md = &object["metadata"];
        let namespace = md["namespace"].as_str().map(str::to_string);
        let name = md["name"].as_str().unwrap_or_default().to_string();
        let (line, text) = line_of(event_type, &object);
        let k = key(&res.key(), namespace.as_deref(), &name);
        // The text before, kept from the line that made it (or written again after a restore).
        let before = match event_type {
            "DELETED" => self.texts.remove(&k),
            _ => self.texts.insert(k, text.clone()),
        };
        let prev_text = prev.as_ref().map(|p| {
            before.unwrap_or_else(|| Bytes::from(serde_json::to_vec(&**p).expect("serializes")))
        });
        let change = Arc::new(Change {
            rv: self.rv,
            resource: res.key(),
            namespace,
            name,
            event_type,
            line,
            object: text,
            prev: prev_text,
            parsed: Mutex::new(Some((object.clone(), prev))),
        });
        if self.journal_limit.is_some_and(|n| self.journal.len() >= n) {
            self.journal.pop_front();
        }
        self.journal.push_back(JournalEntry {
            rv: self.rv,
            event_type: event_type.to_string(),
            uid: md["uid"].as_str().unwrap_or_default().to_string(),
            kind: res.kind.clone(),
            namespace: change.namespace.clone(),
            name: change.name.clone(),
            resource: res.key(),
        });
        self.history.push_back(change.clone());
        if let Some(cooled) = self.history.len().checked_sub(HOT + 1) {
            self.history[cooled].cool();
        }
        while self.history.len() > self.history_limit {
            let old = self.history.pop_front().expect("non-empty");
            self.compacted = old.rv;
        }
        let _ = self.tx.send(change);
    }

    /// A copy of the keyspace as etcd's `snapshot save` takes it: objects, revision and the
    /// history still kept.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rv: self.rv,
            objects: self.objects.clone(),
            history: self.history.clone(),
            compacted: self.compacted,
        }
    }

    /// Puts a snapshot back, as `etcdutl snapshot restore` does: every object, revision and
    /// kept change as they were then. With `bump`, the revision moves `bump` past the
    /// snapshot's and everything before it is marked compacted (`--bump-revision
    /// --mark-compacted`), so no position of either history can be resumed.
    pub fn restore(&mut self, snapshot: &Snapshot, bump: Option<u64>) {
        self.objects = snapshot.objects.clone();
        self.texts.clear();
        self.history = snapshot.history.clone();
        self.compacted = snapshot.compacted;
        self.rv = snapshot.rv;
        if let Some(bump) = bump {
            self.rv += bump;
            self.compact();
        }
    }

    /// Forgets all history: every earlier position is now expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    pub fn get(&self, resource: &str, ns: Option<&str>, name: &str) -> Option<Arc<Value>> {
        let res = self.resources.get(resource)?;
        let ns = if res.namespaced { ns } else { None };
        self.objects.get(&key(resource, ns, name)).cloned()
    }

    pub fn create(
        &mut self,
        resource: &str,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<Value>, SimError> {
        let res = self.resource(resource)?.clone();
        let ns = self.scope(&res, ns, &obj)?;
        if !obj.is_object() || !obj["metadata"].is_object() {
            return Err(SimError::invalid("object must have metadata"));
        }
        let name = match (
            obj["metadata"]["name"].as_str(),
            obj["metadata"]["generateName"].as_str(),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) => {
                let suffix: String = self
                    .uid()
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                format!("{prefix}{suffix}")
            }
            _ => {
                return Err(SimError::invalid(
                    "metadata.name or metadata.generateName is required",
                ))
            }
        };
        let k = key(resource, ns.as_deref(), &name);
        if self.objects.contains_key(&k) {
            return Err(SimError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", res.key()),
            )
            .about(&res.key(), &name));
        }
        if let Some(ns) = &ns {
            if resource != "namespaces" && !self.objects.contains_key(&key("namespaces", None, ns))
            {
                return Err(SimError::not_found("namespaces", ns));
            }
        }
        check_size(&res, &obj)?;
        self.rv += 1;
        let uid = self.uid();
        let md = obj["metadata"].as_object_mut().expect("checked above");
        md.insert("name".into(), name.clone().into());
        md.remove("generateName");
        match &ns {
            Some(ns) => md.insert("namespace".into(), ns.clone().into()),
            None => md.remove("namespace"),
        };
        md.insert("uid".into(), uid.into());
        md.insert("resourceVersion".into(), self.rv.to_string().into());
        md.insert("creationTimestamp".into(), now().into());
        md.insert("generation".into(), 1.into());
        if resource == "namespaces" {
            let labels = md.entry("labels").or_insert(json!({}));
            labels["kubernetes.io/metadata.name"] = name.clone().into();
        }
        obj["apiVersion"] = res.api_version().into();
        obj["kind"] = res.kind.clone().into();
        let obj = Arc::new(obj);
        self.objects.insert(k, obj.clone());
        self.record(&res, "ADDED", obj.clone(), None);
        Ok(obj)
    }

    /// Replaces an object. A `metadata.resourceVersion` in `obj` must match (409 otherwise).
    pub fn update(
        &mut self,
        resource: &str,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<Value>, SimError> {
        let res = self.resource(resource)?.clone();
        let ns = self.scope(&res, ns, &obj)?;
        let name = obj["metadata"]["name"]
            .as_str()
            .ok_or_else(|| SimError::invalid("metadata.name is required"))?
            .to_string();
        let k = key(resource, ns.as_deref(), &name);
        let current = self
            .objects
            .get(&k)
            .cloned()
            .ok_or_else(|| SimError::not_found(&res.key(), &name))?;
        if let Some(rv) = obj["metadata"]["resourceVersion"].as_str() {
            if rv
                != current["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
            {
                return Err(SimError::new(
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again", res.key()),
                )
                .about(&res.key(), &name));
            }
        }
        check_size(&res, &obj)?;
        self.rv += 1;
        let cmd = &current["metadata"];
        let spec_changed = obj.get("spec") != current.get("spec");
        let md = obj["metadata"]
            .as_object_mut()
            .ok_or_else(|| SimError::invalid("object must have metadata"))?;
        for f in ["uid", "creationTimestamp"] {
            md.insert(f.into(), cmd[f].clone());
        }
        let generation = cmd["generation"].as_i64().unwrap_or(1) + spec_changed as i64;
        md.insert("generation".into(), generation.into());
        md.insert("resourceVersion".into(), self.rv.to_string().into());
        match &ns {
            Some(ns) => md.insert("namespace".into(), ns.clone().into()),
            None => md.remove("namespace"),
        };
        if resource == "namespaces" {
            let labels = md.entry("labels").or_insert(json!({}));
            labels["kubernetes.io/metadata.name"] = name.clone().into();
        }
        obj["apiVersion"] = res.api_version().into();
        obj["kind"] = res.kind.clone().into();
        let obj = Arc::new(obj);
        self.objects.insert(k, obj.clone());
        self.record(&res, "MODIFIED", obj.clone(), Some(current));
        Ok(obj)
    }

    pub fn merge_patch(
        &mut self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Arc<Value>, SimError> {
        let current = self
            .get(resource, ns, name)
            .ok_or_else(|| SimError::not_found(resource, name))?;
        let mut obj = (*current).clone();
        let precondition = patch["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        merge(&mut obj, patch);
        obj["metadata"]["name"] = name.into();
        match precondition {
            Some(rv) => obj["metadata"]["resourceVersion"] = rv.into(),
            None => {
                obj["metadata"]
                    .as_object_mut()
                    .map(|m| m.remove("resourceVersion"));
            }
        }
        self.update(resource, ns, obj)
    }

    pub fn delete(
        &mut self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, SimError> {
        let res = self.resource(resource)?.clone();
        let ns = if res.namespaced { ns } else { None };
        let current = self
            .objects
            .remove(&key(resource, ns, name))
            .ok_or_else(|| SimError::not_found(&res.key(), name))?;
        self.rv += 1;
        // The DELETED event carries the last state at a new resourceVersion, as etcd's delete
        // revision.
        let mut obj = (*current).clone();
        obj["metadata"]["resourceVersion"] = self.rv.to_string().into();
        let obj = Arc::new(obj);
        self.record(&res, "DELETED", obj.clone(), Some(current));
        Ok(obj)
    }

    /// Objects of `resource` (in `ns`, or all) as of `rv` (current when None), sorted by
    /// namespace and name. Err when `rv` is older than the history window.
    pub fn state_at(
        &self,
        resource: &str,
        ns: Option<&str>,
        rv: Option<u64>,
    ) -> Result<Vec<Arc<Value>>, SimError> {
        self.page_at(resource, ns, rv, None, None, |_| true)
            .map(|(objects, _)| objects)
    }

    /// One page of the state at `rv` (`None`: now): the objects in scope after `after` (their
    /// namespace and name), in key order, that `keep` accepts, at most `limit` of them; and
    /// whether more remain. Costs the page and the history after `rv`, not the whole store, so
    /// a million objects list page by page in linear time.
    pub fn page_at(
        &self,
        resource: &str,
        ns: Option<&str>,
        rv: Option<u64>,
        after: Option<&(String, String)>,
        limit: Option<usize>,
        keep: impl Fn(&Value) -> bool,
    ) -> Result<(Vec<Arc<Value>>, bool), SimError> {
        let in_scope = |k: &Key| k.0 == resource && ns.is_none_or(|n| k.1 == n);
        // What changed since `rv`, undone: the object as it was then (None: it did not exist).
        let mut undone: BTreeMap<Key, Option<Arc<Value>>> = BTreeMap::new();
        if let Some(rv) = rv.filter(|rv| *rv < self.rv) {
            if rv < self.compacted {
                return Err(SimError::expired(rv, self.compacted));
            }
            // Oldest first: each key's state then is its first change's `prev`, read once.
            let first = self.history.partition_point(|c| c.rv <= rv);
            for c in self.history.range(first..) {
                let k = key(&c.resource, c.namespace.as_deref(), &c.name);
                if in_scope(&k) {
                    undone.entry(k).or_insert_with(|| c.prev());
                }
            }
        }
        let from = match after {
            Some((a_ns, a_name)) => Bound::Excluded(key(resource, Some(a_ns), a_name)),
            None => Bound::Included(key(resource, ns, "")),
        };
        let range = (from, Bound::Unbounded);
        let mut now = self
            .objects
            .range::<Key, _>(range.clone())
            .take_while(|(k, _)| in_scope(k))
            .peekable();
        let mut then = undone.range::<Key, _>(range).peekable();
        let mut items = Vec::new();
        loop {
            // The next key of the snapshot, from whichever side comes first.
            let object = match (now.peek(), then.peek()) {
                (None, None) => return Ok((items, false)),
                (Some((a, _)), Some((b, _))) if a < b => now.next().map(|(_, v)| Some(v)),
                (Some((a, _)), Some((b, _))) if a == b => {
                    now.next();
                    then.next().map(|(_, v)| v.as_ref())
                }
                (Some(_), None) => now.next().map(|(_, v)| Some(v)),
                _ => then.next().map(|(_, v)| v.as_ref()),
            }
            .flatten();
            let Some(object) = object.filter(|o| keep(o)) else {
                continue;
            };
            if limit.is_some_and(|l| items.len() == l) {
                return Ok((items, true));
            }
            items.push(object.clone());
        }
    }

    /// Changes after `rv`, oldest first. Err when `rv` is older than the window.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<Change>>, SimError> {
        if rv < self.compacted {
            return Err(SimError::expired(rv, self.compacted));
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Ok(self.history.iter().skip(start).cloned().collect())
    }

    pub fn register(&mut self, res: Resource) {
        self.resources.insert(res.key(), res);
    }
}

fn check_size(res: &Resource, obj: &Value) -> Result<(), SimError> {
    if res.key() == "configmaps" {
        // binaryData counts by its decoded bytes, as the API server validates it.
        fn decoded(b64: &str) -> usize {
            (b64.len() / 4 * 3).saturating_sub(b64.bytes().rev().take_while(|&c| c == b'=').count())
        }
        let field = |name: &str, len: fn(&str) -> usize| -> usize {
            obj[name].as_object().map_or(0, |m| {
                m.iter()
                    .map(|(k, v)| k.len() + len(v.as_str().unwrap_or_default()))
                    .sum()
            })
        };
        let size = field("data", str::len) + field("binaryData", decoded);
        if size > 1024 * 1024 {
            let message = format!("Too long: must have at most 1048576 bytes (has {size})");
            let mut e = SimError::new(
                422,
                "Invalid",
                format!("ConfigMap is invalid: []: {message}"),
            );
            e.details = Some(json!({
                "name": obj["metadata"]["name"], "kind": "ConfigMap",
                "causes": [{"reason": "FieldValueTooLong", "message": message, "field": "[]"}],
            }));
            return Err(e);
        }
    }
    Ok(())
}
