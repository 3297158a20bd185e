//! Reading an announcement back from the record it was written to.

use std::borrow::Cow;

use serde::Deserialize;

use super::{Announcement, Id, Stamp};
use crate::decode::Trim;
use crate::event::EventType;

/// The announcement a record was written from, read back from its envelope `value` and its
/// `key`: what a reference needs when Kafka refuses a record for its size after it was sent.
/// Nothing else of an announcement outlives its record. `None` for what [`record`](super::record) did not
/// write.
pub fn announced(value: &[u8], key: &str) -> Option<Announcement> {
    // Past Confluent's wire format prefix (a zero byte and a 4-byte schema id), if any.
    let value = match value {
        [0, _, _, _, _, rest @ ..] => rest,
        _ => value,
    };
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        watchrelay: Written<'a>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Written<'a> {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        resource_version: Cow<'a, str>,
        #[serde(borrow)]
        observed_at: Cow<'a, str>,
        resync: bool,
        synthetic: bool,
        #[serde(default, borrow)]
        version: Option<Cow<'a, str>>,
    }
    let untouched = Trim {
        drop_managed_fields: false,
        allow_secret_data: true,
    };
    let ev = crate::decode::decode_line(value, untouched).ok()?;
    let written = serde_json::from_slice::<Envelope<'_>>(value)
        .ok()?
        .watchrelay;
    let mut meta = ev.meta;
    if ev.event_type == EventType::Bookmark {
        // A marker's name is its stream: its key, not in its object.
        meta = meta.with(|id| id.name = key);
    }
    let list_version = (written.resource_version != meta.resource_version())
        .then(|| written.resource_version.into_owned());
    Some(Announcement {
        event_type: ev.event_type,
        meta,
        // The same text, whatever it was made from.
        id: Id::Text(written.id.into_owned()),
        list_version,
        observed_at: Stamp::parse(&written.observed_at)?,
        resync: written.resync,
        synthetic: written.synthetic,
        // The high part of the version: the era it was written in.
        era: written
            .version
            .and_then(|v| v.parse::<u128>().ok())
            .map_or(0, |v| u64::try_from(v >> 64).unwrap_or(u64::MAX)),
    })
}
