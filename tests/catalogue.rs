//! The catalogue against the AsyncAPI documents it comes from (no broker needed).

mod common;

use common::schema;
use watchrelay::catalogue::CATALOGUE;

#[test]
fn catalogue_covers_every_asyncapi_channel() {
    for (file, doc) in schema::documents() {
        let channels = doc["channels"]
            .as_object()
            .unwrap_or_else(|| panic!("{file}: no channels"));
        for (path, ch) in channels {
            let op = ch["subscribe"]["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{file} {path}: no operationId"));
            let entry = CATALOGUE
                .iter()
                .find(|c| c.operation_id == op)
                .unwrap_or_else(|| panic!("{file}: channel {path} ({op}) is not in the catalogue"));
            assert_eq!(entry.path, path, "{op}");
            let msg_ref = ch["subscribe"]["message"]["$ref"].as_str().unwrap();
            let msg = doc["components"]["messages"][msg_ref.rsplit('/').next().unwrap()]["name"]
                .as_str()
                .unwrap();
            // A channel in both documents publishes the more specific message name.
            assert!(
                entry.message == msg || msg == "WatchEvent",
                "{op}: catalogue says {}, {file} says {msg}",
                entry.message
            );
        }
    }
}
