//! The watch event's domain types: its type (one enum for decoding, configuration, metrics and
//! envelopes), what the relay keeps of its object ([`Meta`], [`Identity`]), the decoded event
//! ([`WatchEvent`]) and the resourceVersion comparison.

use std::fmt;

use serde::Deserialize;

/// The `type` of a watch event, as the API server spells it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    /// An object was created, or is part of a list or a watch's initial state.
    Added,
    /// An object changed; the event carries its new state.
    Modified,
    /// An object was deleted; the event carries its last state.
    Deleted,
    /// No object change: the watch's position moved on to the event's resourceVersion.
    Bookmark,
    /// The watch failed; the object is a Status (410 Expired when the position is too old).
    Error,
}

impl EventType {
    /// Every type, in the order of [`EventType::index`].
    pub const ALL: [EventType; 5] = [
        EventType::Added,
        EventType::Modified,
        EventType::Deleted,
        EventType::Bookmark,
        EventType::Error,
    ];

    /// The type as the API server spells it (`ADDED`, …), as envelopes and their headers carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
            EventType::Error => "ERROR",
        }
    }

    /// The type named `s`; `None` for a type the API does not define.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Position in [`EventType::ALL`], for per-type tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the event is about an object (as opposed to a bookmark or an error).
    pub fn is_object_change(self) -> bool {
        matches!(
            self,
            EventType::Added | EventType::Modified | EventType::Deleted
        )
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of event types (which ones a channel publishes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventTypes(u8);

impl EventTypes {
    /// Adds `t` to the set.
    pub fn insert(&mut self, t: EventType) {
        self.0 |= 1 << t.index();
    }

    /// Whether `t` is in the set: whether the channel publishes events of that type.
    pub fn contains(self, t: EventType) -> bool {
        self.0 & (1 << t.index()) != 0
    }

    /// Whether the set holds no type at all.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<EventType> for EventTypes {
    fn from_iter<I: IntoIterator<Item = EventType>>(iter: I) -> Self {
        let mut set = Self::default();
        for t in iter {
            set.insert(t);
        }
        set
    }
}

/// What the relay keeps of an object: its identity and version. Not the API's `Meta`: six
/// fields of it and of the object (kind, apiVersion, name, namespace, uid, resourceVersion),
/// end to end in one buffer, so an event's identity costs one allocation, not six.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// kind, apiVersion, name, namespace, uid, resourceVersion, end to end.
    text: String,
    /// Where each field ends in `text`, in that order.
    ends: [u32; 6],
    /// Whether the object has a namespace (an empty one is none).
    namespaced: bool,
}

/// An object's identity as borrowed text: what a [`Meta`] is made from and read as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The object's `kind`, e.g. `Deployment`.
    pub kind: &'a str,
    /// The object's `apiVersion`, e.g. `apps/v1`.
    pub api_version: &'a str,
    /// `metadata.name`, unique within the namespace.
    pub name: &'a str,
    /// `metadata.namespace`; `None` for a cluster-scoped object.
    pub namespace: Option<&'a str>,
    /// `metadata.uid`: tells apart two objects that had the same name one after the other.
    pub uid: &'a str,
    /// `metadata.resourceVersion`: opaque, ordered only when [`comparable`].
    pub resource_version: &'a str,
}

impl Meta {
    /// Packs `id` into one buffer; an empty namespace counts as none (cluster-scoped).
    pub fn new(id: Identity<'_>) -> Self {
        let namespace = id.namespace.filter(|ns| !ns.is_empty());
        let fields = [
            id.kind,
            id.api_version,
            id.name,
            namespace.unwrap_or(""),
            id.uid,
            id.resource_version,
        ];
        let mut text = String::with_capacity(fields.iter().map(|f| f.len()).sum());
        let mut ends = [0; 6];
        for (end, field) in ends.iter_mut().zip(fields) {
            text.push_str(field);
            *end = u32::try_from(text.len()).expect("an identity under 4 GiB");
        }
        Self {
            text,
            ends,
            namespaced: namespace.is_some(),
        }
    }

    fn field(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// The object's `kind`; empty when the line had none.
    pub fn kind(&self) -> &str {
        self.field(0)
    }

    /// The object's `apiVersion`, e.g. `v1`.
    pub fn api_version(&self) -> &str {
        self.field(1)
    }

    /// `metadata.name`; with the namespace, the object's Kafka [`key`](Meta::key).
    pub fn name(&self) -> &str {
        self.field(2)
    }

    /// `metadata.namespace`; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.namespaced.then(|| self.field(3))
    }

    /// `metadata.uid`, new when an object is deleted and created again under its name.
    pub fn uid(&self) -> &str {
        self.field(4)
    }

    /// `metadata.resourceVersion`, as the API server wrote it.
    pub fn resource_version(&self) -> &str {
        self.field(5)
    }

    /// All six fields, borrowed.
    pub fn identity(&self) -> Identity<'_> {
        Identity {
            kind: self.kind(),
            api_version: self.api_version(),
            name: self.name(),
            namespace: self.namespace(),
            uid: self.uid(),
            resource_version: self.resource_version(),
        }
    }

    /// This identity with `edit` applied: `meta.with(|id| id.name = "web-2")`.
    pub fn with<'a>(&'a self, edit: impl FnOnce(&mut Identity<'a>)) -> Self {
        let mut id = self.identity();
        edit(&mut id);
        Self::new(id)
    }

    /// The Kafka key: `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{ns}/{}", self.name()),
            None => self.name().to_string(),
        }
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.identity().fmt(f)
    }
}

/// A decoded watch line, object already trimmed and re-assembled as JSON bytes.
#[derive(Debug)]
pub struct WatchEvent {
    /// The line's `type`.
    pub event_type: EventType,
    /// The object's identity and resourceVersion (an ERROR's Status has no name or version).
    pub meta: Meta,
    /// The object as it goes into the envelope.
    pub object: Vec<u8>,
    /// For ERROR events: the Status code, when present.
    pub status_code: Option<u16>,
    /// A BOOKMARK annotated `k8s.io/initial-events-end: "true"`: the initial state of a
    /// `sendInitialEvents` watch is complete.
    pub initial_events_end: bool,
}

/// A resourceVersion as the integer KEP-5504 makes it (decimal digits, no sign, no leading
/// zero); `None` for anything else.
pub fn comparable(rv: &str) -> Option<u64> {
    let digits = !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit());
    if !digits || (rv.len() > 1 && rv.starts_with('0')) {
        return None;
    }
    rv.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_hold_what_was_put_in() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(EventType::ALL[t.index()], t);
        }
        assert_eq!(EventType::parse("INVENTED"), None);
        let set: EventTypes = [EventType::Added, EventType::Bookmark]
            .into_iter()
            .collect();
        assert!(set.contains(EventType::Added) && set.contains(EventType::Bookmark));
        assert!(!set.contains(EventType::Deleted));
        assert!(EventTypes::default().is_empty());
    }
}
