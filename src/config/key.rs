//! A channel's key template: how a record's Kafka key is made from its object.

use crate::event::Meta;

/// How a record's Kafka key is made from its object: `{namespace}`, `{name}`, `{uid}` and
/// `{kind}` are replaced. For a cluster-scoped object `{namespace}/` is left out, so the default
/// `{namespace}/{name}` keys it by name alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    template: String,
    pieces: Vec<KeyPiece>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum KeyPiece {
    Text(String),
    /// `{namespace}` and the `/` after it, if any.
    Namespace {
        slash: bool,
    },
    Name,
    Uid,
    Kind,
}

impl Default for KeyTemplate {
    fn default() -> Self {
        Self::parse("{namespace}/{name}").expect("the default key template is valid")
    }
}

impl KeyTemplate {
    /// Parses a template; it must name the object (`{name}` or `{uid}`) so keys do not collide.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('{') {
                let end = after.find('}').ok_or("unterminated {")?;
                let piece = match &after[..end] {
                    "namespace" => {
                        let slash = after[end + 1..].starts_with('/');
                        rest = &after[end + 1 + usize::from(slash)..];
                        pieces.push(KeyPiece::Namespace { slash });
                        continue;
                    }
                    "name" => KeyPiece::Name,
                    "uid" => KeyPiece::Uid,
                    "kind" => KeyPiece::Kind,
                    other => {
                        return Err(format!(
                            "unknown variable {{{other}}}; use {{namespace}}, {{name}}, {{uid}} or {{kind}}"
                        ))
                    }
                };
                pieces.push(piece);
                rest = &after[end + 1..];
            } else {
                let end = rest.find('{').unwrap_or(rest.len());
                pieces.push(KeyPiece::Text(rest[..end].to_string()));
                rest = &rest[end..];
            }
        }
        if !pieces
            .iter()
            .any(|p| matches!(p, KeyPiece::Name | KeyPiece::Uid))
        {
            return Err("must contain {name} or {uid}, or objects would share keys".into());
        }
        Ok(Self {
            template: template.to_string(),
            pieces,
        })
    }

    /// A template that renders `key` whatever the object: where a retraction goes, once the
    /// key an object was announced under is recorded.
    pub fn fixed(key: &str) -> Self {
        Self {
            template: key.replace('{', "{{"),
            pieces: vec![KeyPiece::Text(key.to_string())],
        }
    }

    /// Whether keys name the namespace or the uid: objects of two namespaces never share one.
    pub fn names_namespace_or_uid(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, KeyPiece::Namespace { .. } | KeyPiece::Uid))
    }

    /// The template as written, e.g. `{namespace}/{name}`.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// The key of `meta`.
    pub fn render(&self, meta: &Meta) -> String {
        let mut key = String::with_capacity(64);
        for p in &self.pieces {
            match p {
                KeyPiece::Text(t) => key.push_str(t),
                KeyPiece::Namespace { slash } => {
                    if let Some(ns) = &meta.namespace() {
                        key.push_str(ns);
                        if *slash {
                            key.push('/');
                        }
                    }
                }
                KeyPiece::Name => key.push_str(meta.name()),
                KeyPiece::Uid => key.push_str(meta.uid()),
                KeyPiece::Kind => key.push_str(meta.kind()),
            }
        }
        key
    }
}
