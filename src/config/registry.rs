//! A schema registry (`schemaRegistry`): each topic's envelope schema registered under the
//! topic's subject, its ids carried in every record (see [`crate::schemas`]).

use serde::Deserialize;

use super::{invalid, ConfigError};

/// How records carry their schema's ids (`schemaRegistry.wireFormat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WireFormat {
    /// The value stays plain JSON; the ids travel in headers. The default.
    #[default]
    Headers,
    /// Confluent's wire format as well: the value starts with a zero byte and the schema's id
    /// (4 bytes), for readers that expect it (ksqlDB's `JSON_SR`, Connect's
    /// `JsonSchemaConverter`). The value is then no longer plain JSON.
    Confluent,
}

/// The schema registry (`schemaRegistry`); without `url`, none.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SchemaRegistryConfig {
    /// Base URL of the registry's Confluent-compatible API: a Confluent Schema Registry's root,
    /// or Apicurio Registry's `/apis/ccompat/v7`, whose own API then gives Apicurio's ids too.
    pub url: Option<String>,
    /// How records carry the ids.
    pub wire_format: WireFormat,
    /// HTTP basic authentication's user; `${NAME}` reads the environment.
    pub username: Option<String>,
    /// Its password; `${NAME}` reads the environment.
    pub password: Option<String>,
    /// How often the relay reads the channels' object schemas again (a CRD's schema may
    /// change) and registers what changed.
    pub refresh_seconds: u64,
}

impl Default for SchemaRegistryConfig {
    fn default() -> Self {
        Self {
            url: None,
            wire_format: WireFormat::Headers,
            username: None,
            password: None,
            refresh_seconds: 300,
        }
    }
}

impl SchemaRegistryConfig {
    /// Whether a registry is configured.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.url {
            let ok = url.parse::<http::Uri>().is_ok_and(|uri| {
                matches!(uri.scheme_str(), Some("http" | "https"))
                    && uri.host().is_some_and(|h| !h.is_empty())
            });
            if !ok {
                return Err(invalid(
                    "schemaRegistry.url",
                    format!("{url:?} is not an http:// or https:// URL with a host"),
                ));
            }
        }
        if self.username.is_some() != self.password.is_some() {
            return Err(invalid(
                "schemaRegistry.password",
                "username and password go together",
            ));
        }
        if self.refresh_seconds == 0 {
            return Err(invalid(
                "schemaRegistry.refreshSeconds",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
