//! Objects the relay writes itself: an object reduced to its identity, a bookmark's object.

use serde::Serialize;

use crate::event::Meta;

/// An object reduced to its identity: used for inferred DELETED events and for events too
/// large to publish.
pub fn reference_object(meta: &Meta) -> Vec<u8> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Md<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        uid: &'a str,
        resource_version: &'a str,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Obj<'a> {
        api_version: &'a str,
        kind: &'a str,
        metadata: Md<'a>,
    }
    serde_json::to_vec(&Obj {
        api_version: meta.api_version(),
        kind: meta.kind(),
        metadata: Md {
            name: meta.name(),
            namespace: meta.namespace(),
            uid: meta.uid(),
            resource_version: meta.resource_version(),
        },
    })
    .expect("serializing plain strings cannot fail")
}

/// A BOOKMARK-shaped object carrying only a resourceVersion and optional annotations.
pub fn bookmark_object(
    api_version: &str,
    kind: &str,
    rv: &str,
    annotation: Option<(&str, &str)>,
) -> Vec<u8> {
    let mut md = serde_json::json!({ "resourceVersion": rv });
    if let Some((k, v)) = annotation {
        md["annotations"] = serde_json::json!({ k: v });
    }
    serde_json::to_vec(
        &serde_json::json!({ "apiVersion": api_version, "kind": kind, "metadata": md }),
    )
    .expect("serializing a json Value cannot fail")
}
