//! The decoder's contract with serde_json, over any input: the one property that the fuzz
//! target (`fuzz/fuzz_targets/decode.rs`) and the fast tier's random lines (`tests/decoder.rs`)
//! both assert, so what the fuzzer explores and what every test run checks cannot drift apart.
//!
//! For any bytes:
//! - not UTF-8: refused;
//! - the scanner accepts a value exactly when serde_json does, except nesting deeper than 128
//!   levels, which the scanner refuses;
//! - delimiting (only strings and brackets checked) accepts whatever full validation accepts,
//!   with the same span;
//! - a line that is not JSON is never decoded without trimming; trimmed (managedFields
//!   dropped), only when full validation refuses it and delimiting its managedFields does not;
//! - a decoded line's object is serde_json's object of that line: untouched without trimming,
//!   without `metadata.managedFields` when trimmed.

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::decode::{decode_line, DecodeError, Trim};
use crate::json::Scanner;

const KEEP: Trim = Trim {
    drop_managed_fields: false,
    allow_secret_data: true,
};
const DROP: Trim = Trim {
    drop_managed_fields: true,
    allow_secret_data: true,
};

/// An object's members in order, duplicates kept.
struct Fields(Vec<(String, Box<RawValue>)>);

impl<'de> serde::Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut out = Vec::new();
                while let Some(member) = map.next_entry()? {
                    out.push(member);
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl Fields {
    /// The value of `key` when it occurs exactly once.
    fn single(&self, key: &str) -> Option<&RawValue> {
        let mut found = self.0.iter().filter(|(k, _)| k == key);
        let first = found.next()?;
        found.next().is_none().then_some(&*first.1)
    }
}

/// Asserts the contract above for `data`; panics, naming the input, where it does not hold.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        assert!(
            matches!(decode_line(data, KEEP), Err(DecodeError::Utf8)),
            "not UTF-8, not refused: {data:?}"
        );
        return;
    };
    let serde = serde_json::from_str::<IgnoredAny>(text).is_ok();
    let mut sc = Scanner::new(text);
    let full = sc.value().and_then(|span| sc.end().map(|()| span));
    let too_deep = full.as_ref().is_err_and(|e| e.what == "nested too deeply");
    if !too_deep {
        assert_eq!(full.is_ok(), serde, "scanner {full:?} on {text:?}");
    }
    let mut sc = Scanner::new(text);
    let delimited = sc.delimit().and_then(|span| sc.end().map(|()| span));
    if let Ok(span) = &full {
        assert_eq!(delimited.as_ref(), Ok(span), "delimiting {text:?}");
    }

    let keep = decode_line(data, KEEP);
    let drop = decode_line(data, DROP);
    if !serde || too_deep {
        assert!(keep.is_err(), "invalid, decoded: {text:?}");
        if drop.is_ok() {
            // Only what delimiting does not check: the error lies in the managedFields the
            // trimmed decode dropped.
            let Err(DecodeError::Json(e)) = keep else {
                panic!("invalid, refused for another reason: {text:?}: {keep:?}");
            };
            let before = &text[..e.at.min(text.len())];
            assert!(
                before.contains("\"managedFields\""),
                "invalid outside managedFields, decoded when trimmed: {text:?} ({e})"
            );
        }
        return;
    }
    // Valid JSON may still not be a watch event (no object, no resourceVersion): refused
    // with or without trimming alike.
    assert_eq!(
        keep.is_ok(),
        drop.is_ok(),
        "trimming changed the outcome: {text:?}"
    );
    let (Ok(keep), Ok(drop)) = (keep, drop) else {
        return;
    };
    // The line's first `object` (the one decoded), compared when it is the only one.
    let Ok(line) = serde_json::from_str::<Fields>(text) else {
        return;
    };
    let Some(object) = line.single("object") else {
        return;
    };
    // A number beyond f64 is valid JSON that a `Value` cannot hold.
    let Ok(expected) = serde_json::from_str::<Value>(object.get()) else {
        return;
    };
    let got: Value = serde_json::from_slice(&keep.object).expect("the relay writes JSON");
    assert_eq!(got, expected, "untrimmed object of {text:?}");
    let mut expected = expected;
    let single_metadata =
        serde_json::from_str::<Fields>(object.get()).is_ok_and(|o| o.single("metadata").is_some());
    if let (true, Some(Value::Object(md))) = (single_metadata, expected.get_mut("metadata")) {
        md.remove("managedFields");
    }
    let got: Value = serde_json::from_slice(&drop.object).expect("the relay writes JSON");
    if single_metadata {
        assert_eq!(got, expected, "trimmed object of {text:?}");
    }
}
