//! Every field path the configuration file accepts, read from the file's own types.
//!
//! [`field_paths`] drives the file's `Deserialize` implementations with a deserializer that
//! answers every struct with all of its fields, so the list follows the structs as they are:
//! a field added, renamed or removed there is added, renamed or removed here, with no list to
//! keep by hand. The documentation's drift test compares it with the keys
//! `docs/configuration.md` documents; a schema of the chart's `config` value can be checked
//! against it the same way.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess};
use serde::forward_to_deserialize_any;

use super::File;
use serde::Deserialize as _;

/// Every field the configuration file accepts, as a dotted path from the top of the file:
/// `clusterName`, `kubernetes.watchTimeoutSeconds`, `checkpoint.membership.topic`; a field of
/// each element of a list is written after `[]` (`channels[].operationId`). Only fields whose
/// value is not itself a struct of the file are listed: a scalar, a list of scalars, one of a
/// set of names, or a map whose keys are free (`kafka.properties`). Sorted, each once.
pub fn field_paths() -> Vec<String> {
    let found = RefCell::new(BTreeSet::new());
    File::deserialize(Probe {
        path: String::new(),
        found: &found,
    })
    .expect("the probe answers every field of the file's types");
    found.into_inner().into_iter().collect()
}

/// A deserializer standing for the value at `path`: a struct gets all of its fields, each
/// probed in turn; anything else is recorded as a field path and given a plain value.
struct Probe<'a> {
    path: String,
    found: &'a RefCell<BTreeSet<String>>,
}

impl Probe<'_> {
    /// Records this value's path: the element marker of a list of scalars is left out
    /// (`channels[].namespaces`, not `channels[].namespaces[]`).
    fn record(&self) {
        let path = self.path.strip_suffix("[]").unwrap_or(&self.path);
        self.found.borrow_mut().insert(path.to_string());
    }

    fn at(&self, path: String) -> Self {
        Probe {
            path,
            found: self.found,
        }
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Error;

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.record();
        visitor.visit_unit()
    }

    fn deserialize_bool<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.record();
        visitor.visit_bool(false)
    }

    fn deserialize_i8<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_i16<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_i32<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_i64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u8<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u16<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u32<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.record();
        visitor.visit_u64(0)
    }

    fn deserialize_f32<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.record();
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.record();
        visitor.visit_str("")
    }

    fn deserialize_string<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let element = self.at(format!("{}[]", self.path));
        visitor.visit_seq(One(Some(element)))
    }

    fn deserialize_map<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // A map with keys of its own (`kafka.properties`): the map is the field.
        self.record();
        visitor.visit_map(Fields {
            names: &[],
            probe: self,
        })
    }

    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_map(Fields {
            names: fields,
            probe: self,
        })
    }

    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.record();
        let first: StrDeserializer<'_, Error> = variants
            .first()
            .copied()
            .unwrap_or_default()
            .into_deserializer();
        visitor.visit_enum(first)
    }

    forward_to_deserialize_any! {
        char bytes byte_buf unit unit_struct tuple tuple_struct identifier ignored_any
    }
}

/// A struct's fields (or a free map's, none), each value probed at its path.
struct Fields<'a> {
    names: &'static [&'static str],
    probe: Probe<'a>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.names.first() {
            Some(name) => {
                let key: StrDeserializer<'_, Error> = name.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (name, rest) = self.names.split_first().expect("a value follows its key");
        self.names = rest;
        let path = if self.probe.path.is_empty() {
            (*name).to_string()
        } else {
            format!("{}.{name}", self.probe.path)
        };
        seed.deserialize(self.probe.at(path))
    }
}

/// A list of one element, probed at the list's path with `[]` appended.
struct One<'a>(Option<Probe<'a>>);

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0.take().map(|p| seed.deserialize(p)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_reach_nested_structs_and_list_elements() {
        let paths = field_paths();
        for path in [
            "clusterName",
            "kubernetes.watchTimeoutSeconds",
            "kafka.properties",
            "checkpoint.membership.topic",
            "channels[].operationId",
            "channels[].namespaces",
            "channels[].eventTypes",
            "sharding.groupProtocol",
        ] {
            assert!(paths.iter().any(|p| p == path), "{path} missing: {paths:?}");
        }
        // Structs are not fields of their own, and list elements are no paths.
        for absent in [
            "kubernetes",
            "checkpoint.membership",
            "channels",
            "channels[]",
        ] {
            assert!(!paths.iter().any(|p| p == absent), "{absent} listed");
        }
    }

    #[test]
    fn every_path_is_a_field_and_a_made_up_one_is_not() {
        // A file holding one path set to a value no field takes: refused for its type, never
        // as an unknown field. A made-up field beside them is refused as unknown.
        let unknown = |path: &str| {
            let mut value = "[[1]]".to_string();
            for part in path.rsplit('.') {
                value = match part.strip_suffix("[]") {
                    Some(list) => format!("{{{list}: [{value}]}}"),
                    None => format!("{{{part}: {value}}}"),
                };
            }
            let text = &value[1..value.len() - 1];
            match crate::config::Config::parse(text) {
                Ok(_) => panic!("{text} parsed"),
                Err(e) => e.to_string().contains("unknown field"),
            }
        };
        for made_up in [
            "noSuchField",
            "kubernetes.noSuchField",
            "channels[].noSuchField",
        ] {
            assert!(unknown(made_up), "{made_up} not refused as unknown");
        }
        for path in field_paths() {
            assert!(!unknown(&path), "{path} refused as unknown");
        }
    }
}
