//! Label and field selectors, as the API server parses them.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected (a,b) in {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl Selector {
    /// Parses `a=b,c!=d`, `k in (x,y)`, `k notin (x)`, `k` and `!k`; the error names the bad part.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else if part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Req::Exists(part.into())
            } else {
                return Err(format!("unable to parse requirement {part:?}"));
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether it has no requirement, so matches every object.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `lookup` (key → value) satisfies every requirement.
    pub fn matches<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => lookup(k) == Some(v.as_str()),
            Req::Ne(k, v) => lookup(k) != Some(v.as_str()),
            Req::In(k, vs) => lookup(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => lookup(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => lookup(k).is_some(),
            Req::NotExists(k) => lookup(k).is_none(),
        })
    }

    /// Whether `obj`'s `metadata.labels` satisfy it, as a label selector.
    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches(|k| labels.get(k).and_then(Value::as_str))
    }

    /// Field selectors support metadata.name and metadata.namespace, like most resources.
    pub fn matches_fields(&self, obj: &Value) -> bool {
        let md = &obj["metadata"];
        self.matches(|k| match k {
            "metadata.name" => md["name"].as_str(),
            "metadata.namespace" => md["namespace"].as_str().or(Some("")),
            _ => None,
        })
    }

    /// Field selectors may only name supported fields.
    pub fn check_fields(&self) -> Result<(), String> {
        for r in &self.0 {
            let k = match r {
                Req::Eq(k, _) | Req::Ne(k, _) => k,
                _ => return Err("field selectors support only =, == and !=".into()),
            };
            if k != "metadata.name" && k != "metadata.namespace" {
                return Err(format!("field label not supported: {k}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_requirements() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing notin (x)", true),
            ("env in (prod)", false),
            ("", true),
        ] {
            assert_eq!(
                Selector::parse(sel).unwrap().matches_labels(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn field_requirements() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}});
        assert!(Selector::parse("metadata.name=a")
            .unwrap()
            .matches_fields(&o));
        assert!(!Selector::parse("metadata.namespace!=ns")
            .unwrap()
            .matches_fields(&o));
        assert!(Selector::parse("spec.nodeName=x")
            .unwrap()
            .check_fields()
            .is_err());
    }
}
