//! Sharded list and watch (KEP-5866, `shardSelector`), as kube-apiserver 1.37 serves it with
//! the `ShardedListAndWatch` gate on: `shardRange(object.metadata.namespace|uid, '0x…', '0x…')`
//! terms joined by `||`, each matching the objects whose field's FNV-1a 64 hash, written as 16
//! hex digits, is at or above the start and below the end. Hex values compare as the server
//! compares them: the shorter is the smaller, then as text.

use serde_json::Value;

/// A parsed `shardSelector`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSelector {
    /// `uid` or `namespace`: the member of `metadata` hashed.
    field: &'static str,
    ranges: Vec<(String, String)>,
    text: String,
}

/// FNV-1a 64 of `text`.
fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hex_less(a: &str, b: &str) -> bool {
    (a.len(), a) < (b.len(), b)
}

fn hex_literal(s: &str) -> Result<String, String> {
    let s = s.trim();
    let inner = s
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
        .ok_or_else(|| format!("{s} must be a string literal (e.g. '0xff')"))?;
    let hex = inner
        .strip_prefix("0x")
        .ok_or_else(|| format!("{inner:?} must have '0x' prefix"))?;
    if hex.is_empty()
        || hex.len() > 17
        || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(format!("invalid hex value {inner:?}"));
    }
    Ok(inner.to_string())
}

impl ShardSelector {
    /// Parses `text`, refusing what the API server refuses (with a 500).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut field = None;
        let mut ranges = Vec::new();
        for term in text.split("||") {
            let args = term
                .trim()
                .strip_prefix("shardRange(")
                .and_then(|t| t.strip_suffix(')'))
                .ok_or_else(|| format!("unsupported shard selector term {:?}", term.trim()))?;
            let args: Vec<&str> = args.split(',').collect();
            let [path, start, end] = args[..] else {
                return Err(format!(
                    "shardRange() requires exactly 3 arguments, got {}",
                    args.len()
                ));
            };
            let f = match path.trim() {
                "object.metadata.uid" => "uid",
                "object.metadata.namespace" => "namespace",
                other => return Err(format!("unsupported field path {other:?}")),
            };
            if field.is_some_and(|g| g != f) {
                return Err("all shard ranges must use the same field".into());
            }
            field = Some(f);
            let (start, end) = (hex_literal(start)?, hex_literal(end)?);
            if !hex_less(&start, &end) {
                return Err(format!(
                    "shard range start {start} must be less than end {end}"
                ));
            }
            ranges.push((start, end));
        }
        Ok(Self {
            field: field.ok_or("empty shard selector")?,
            ranges,
            text: text.to_string(),
        })
    }

    /// Whether `obj` is in one of the ranges.
    pub fn matches(&self, obj: &Value) -> bool {
        let value = obj["metadata"][self.field].as_str().unwrap_or("");
        let hash = format!("0x{:016x}", fnv1a64(value));
        self.ranges
            .iter()
            .any(|(start, end)| !hex_less(&hash, start) && hex_less(&hash, end))
    }

    /// The selector as the request gave it, echoed in a list's `metadata.shardInfo`.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn in_ns(ns: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": "x", "uid": "u"}})
    }

    #[test]
    fn two_halves_split_the_namespaces_exactly() {
        let low = ShardSelector::parse(
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')",
        )
        .unwrap();
        let high = ShardSelector::parse(
            "shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')",
        )
        .unwrap();
        for i in 0..100 {
            let o = in_ns(&format!("team-{i}"));
            assert!(low.matches(&o) != high.matches(&o), "team-{i}");
        }
    }

    #[test]
    fn a_range_holds_its_start_and_not_its_end() {
        let h = fnv1a64("shop");
        let sel = |a: u64, b: u64| {
            ShardSelector::parse(&format!(
                "shardRange(object.metadata.namespace, '0x{a:016x}', '0x{b:016x}') || shardRange(object.metadata.namespace, '0x0', '0x1')"
            ))
            .unwrap()
        };
        assert!(sel(h, h + 1).matches(&in_ns("shop")));
        assert!(!sel(h - 1, h).matches(&in_ns("shop")));
    }

    #[test]
    fn what_the_server_refuses() {
        for bad in [
            "",
            "shardRange(object.metadata.name, '0x0', '0x1')",
            "shardRange(object.metadata.uid, '0x1', '0x1')",
            "shardRange(object.metadata.uid, '0x0', '0x1') || shardRange(object.metadata.namespace, '0x0', '0x1')",
            "shardRange(object.metadata.uid, '1', '0x2')",
            "labels(x)",
        ] {
            assert!(ShardSelector::parse(bad).is_err(), "{bad:?}");
        }
    }
}
