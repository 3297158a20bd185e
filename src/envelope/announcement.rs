//! An announcement: one change (or inferred DELETED, or marker) of one object, with when it was
//! observed; what a record is written from.

use crate::event::{EventType, Meta};

/// `watchrelay.id`, made from the announcement's object when the record is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Id {
    /// `{uid}/{resourceVersion}`: a change read off a watch or a list.
    Change,
    /// `{uid}/deleted`: an inferred DELETED.
    Deleted,
    /// As it is: a marker's `{what}/{stream}/{resourceVersion}`.
    Text(String),
}

/// One event as the relay announces it: which change of which object, and how it came about.
#[derive(Clone, Debug)]
pub struct Announcement {
    /// The envelope's `type`, and the last part of its `ce_type` header.
    pub event_type: EventType,
    /// The object's identity; the channel's key template makes the Kafka key of it.
    pub meta: Meta,
    /// `watchrelay.id`.
    pub id: Id,
    /// `watchrelay.resourceVersion` when it is not the object's: the list's for inferred events
    /// (see [`Announcement::resource_version`]).
    pub list_version: Option<String>,
    /// When the relay read the event.
    pub observed_at: Stamp,
    /// `watchrelay.resync`: produced by a relist rather than a watch.
    pub resync: bool,
    /// `watchrelay.synthetic`: a DELETED the relay inferred, not one the API server sent.
    pub synthetic: bool,
    /// The era of the stream that announced it: the high part of `watchrelay.version` (see
    /// [`super::version`]). Set by whoever hands it to Kafka.
    pub era: u64,
}

impl Announcement {
    /// `watchrelay.id`, in parts written end to end.
    pub fn id_parts(&self) -> [&str; 3] {
        match &self.id {
            Id::Change => [self.meta.uid(), "/", self.meta.resource_version()],
            Id::Deleted => [self.meta.uid(), "/", "deleted"],
            Id::Text(text) => [text, "", ""],
        }
    }

    /// `watchrelay.resourceVersion`: the object's (a marker's is the position it marks), or the
    /// list's for inferred events.
    pub fn resource_version(&self) -> &str {
        self.list_version
            .as_deref()
            .unwrap_or(self.meta.resource_version())
    }

    /// A change read off a watch or a list.
    pub fn change(event_type: EventType, meta: Meta, resync: bool) -> Self {
        Self {
            event_type,
            id: Id::Change,
            list_version: None,
            observed_at: Stamp::now(),
            resync,
            synthetic: false,
            era: 0,
            meta,
        }
    }

    /// A DELETED the relay inferred: the object was known and a resync at `list_rv` lacks it.
    pub fn inferred_delete(meta: Meta, list_rv: &str) -> Self {
        Self {
            event_type: EventType::Deleted,
            id: Id::Deleted,
            list_version: Some(list_rv.to_string()),
            observed_at: Stamp::now(),
            resync: true,
            synthetic: true,
            era: 0,
            meta,
        }
    }

    /// A BOOKMARK of stream `stream` at `rv`, keyed by the stream; `what` prefixes its id
    /// (`bookmark`, `resync-end`).
    pub fn marker(what: &str, stream: &str, meta: Meta, rv: &str, resync: bool) -> Self {
        Self {
            event_type: EventType::Bookmark,
            id: Id::Text(format!("{what}/{stream}/{rv}")),
            // The marker's own resourceVersion is `rv`.
            list_version: None,
            observed_at: Stamp::now(),
            resync,
            synthetic: false,
            era: 0,
            meta: meta.with(|id| {
                id.name = stream;
                id.resource_version = rv;
            }),
        }
    }
}

/// An RFC 3339 timestamp with milliseconds (`2026-11-25T10:00:00.000Z`), held inline: copied
/// with its event, never allocated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u8,
    text: [u8; 32],
}

impl Stamp {
    /// The current time, formatted once per millisecond (per thread): events read in the same
    /// millisecond share it.
    pub fn now() -> Self {
        thread_local! {
            static LAST: std::cell::Cell<(i64, Option<Stamp>)> = const { std::cell::Cell::new((0, None)) };
        }
        let ms = jiff::Timestamp::now().as_millisecond();
        LAST.with(|last| match last.get() {
            (at, Some(stamp)) if at == ms => stamp,
            _ => {
                let now = jiff::Timestamp::from_millisecond(ms).expect("now is a valid timestamp");
                let stamp = Self::new(&format!("{now:.3}"));
                last.set((ms, Some(stamp)));
                stamp
            }
        })
    }

    /// `text` when it is 32 bytes at most (a timestamp read back).
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() <= 32).then(|| Self::new(text))
    }

    /// `text`, an RFC 3339 timestamp (32 bytes at most).
    pub fn new(text: &str) -> Self {
        assert!(text.len() <= 32, "a timestamp of 32 bytes at most: {text}");
        let mut stamp = Self {
            len: u8::try_from(text.len()).expect("at most 32"),
            text: [0; 32],
        };
        stamp.text[..text.len()].copy_from_slice(text.as_bytes());
        stamp
    }

    /// The timestamp's text, as `watchrelay.observedAt` and the `ce_time` header carry it.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..usize::from(self.len)]).expect("made from a str")
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The current time as RFC 3339 with milliseconds (see [`Stamp::now`]).
pub fn now_rfc3339() -> String {
    Stamp::now().as_str().to_string()
}
