//! One member's record, where its retraction goes, and how an event changes a stream's
//! membership.

use crate::envelope::Route;
use crate::event::{Identity, Meta};

/// The compact identity the relay keeps per object to infer deletions after a 410.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Known {
    /// The object's `metadata.name`, for the DELETED the relay infers when it is gone.
    pub name: String,
    /// The object's namespace; `None` for a cluster-scoped object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The resourceVersion it was last announced at.
    pub rv: String,
    /// The topic the object was announced on: where its retraction goes, whatever the
    /// configuration says by then. Absent in records of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The Kafka key it was announced under. Absent in records of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Known {
    /// Member `uid` as its inferred DELETED names it: an object of `kind` in `api_version`,
    /// at the version it joined at.
    pub fn meta(&self, uid: &str, kind: &str, api_version: &str) -> Meta {
        Meta::new(Identity {
            uid,
            name: &self.name,
            namespace: self.namespace.as_deref(),
            resource_version: &self.rv,
            api_version,
            kind,
        })
    }

    /// Where member `meta`'s inferred DELETED goes: the topic and key it was announced under,
    /// or where `route` puts it for a record of an older version that did not say.
    pub fn place(&self, meta: &Meta, route: &Route) -> (String, String) {
        (
            self.topic.clone().unwrap_or_else(|| route.topic.clone()),
            self.key.clone().unwrap_or_else(|| route.key.render(meta)),
        )
    }
}

/// How an event changes the stream's membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The object is alive: it becomes a member before its event is sent.
    Join {
        /// The object's `metadata.uid`, the member's key in the stream.
        uid: String,
        /// What the membership record keeps of it.
        known: Known,
    },
    /// The same, for the object of the announcement it is sent with, whose identity is taken
    /// from it only when the object is not a member yet (most events are of members).
    Announced,
    /// The object is gone: it leaves once its DELETED is acknowledged.
    Leave {
        /// The `metadata.uid` of the member that leaves.
        uid: String,
    },
}
