//! The watch event types: one enum for decoding, configuration, metrics and envelopes.

use std::fmt;

use serde::Deserialize;

/// The `type` of a watch event, as the API server spells it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    pub const ALL: [EventType; 5] = [
        EventType::Added,
        EventType::Modified,
        EventType::Deleted,
        EventType::Bookmark,
        EventType::Error,
    ];

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
    pub fn insert(&mut self, t: EventType) {
        self.0 |= 1 << t.index();
    }

    pub fn contains(self, t: EventType) -> bool {
        self.0 & (1 << t.index()) != 0
    }

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
