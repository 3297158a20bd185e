//! The registry's REST API: Confluent's (which Apicurio Registry also serves, under
//! `/apis/ccompat/v7`), and for Apicurio its own, for the ids its readers look for.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use thiserror::Error;

use crate::config::SchemaRegistryConfig;
use crate::envelope::SchemaIds;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why the registry did not take a schema.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The registry could not be reached, or did not answer in time.
    #[error("schema registry {url}: {message}")]
    Unreachable {
        /// The request's URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The registry answered with an error.
    #[error("schema registry {url}: {status}: {body}")]
    Status {
        /// The request's URL.
        url: String,
        /// The answer's status.
        status: StatusCode,
        /// The answer's body.
        body: String,
    },
    /// The subject's compatibility rule refuses the schema.
    #[error("schema registry: subject {subject}'s compatibility rule {rule} refuses the new schema of its topic ({message}); let the subject take it (change the rule, or delete the subject) or restore the resource's previous schema")]
    Incompatible {
        /// The subject.
        subject: String,
        /// Its compatibility rule (`BACKWARD`, `FULL_TRANSITIVE`...).
        rule: String,
        /// What the registry said.
        message: String,
    },
}

impl ClientError {
    /// Whether trying again later may succeed, as opposed to a refusal of the schema that
    /// stands until someone acts (incompatible, 409; invalid, 422). Everything else is tried
    /// again: the registry unreachable or failing, and also a 401, 403 or 404, which an auth
    /// blip or an ingress in front of a restarting registry answers for a while. Stopping every
    /// topic of the relay for those would turn a registry's restart into a crash loop.
    pub fn transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Status { status, .. } => !matches!(
                *status,
                StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY
            ),
            Self::Incompatible { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_of_the_schema_stands() {
        let status = |code: u16| ClientError::Status {
            url: "http://registry/subjects/t-value/versions".into(),
            status: StatusCode::from_u16(code).unwrap(),
            body: String::new(),
        };
        for code in [401, 403, 404, 408, 429, 500, 502, 503] {
            assert!(status(code).transient(), "{code}");
        }
        for code in [409, 422] {
            assert!(!status(code).transient(), "{code}");
        }
    }
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// A client of one registry.
#[derive(Clone)]
pub struct Client {
    http: hyper_util::client::legacy::Client<Https, Full<Bytes>>,
    /// The Confluent-compatible API's base, without a trailing `/`.
    base: String,
    /// Apicurio's own API (`/apis/registry/v3`), when `base` is Apicurio's ccompat API.
    apicurio: Option<String>,
    /// The `Authorization` header's value.
    auth: Option<String>,
}

impl Client {
    /// A client of the registry `cfg` names; `None` without one.
    pub fn new(cfg: &SchemaRegistryConfig) -> std::io::Result<Option<Self>> {
        let Some(url) = &cfg.url else {
            return Ok(None);
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .build();
        let base = url.trim_end_matches('/').to_string();
        let apicurio = base
            .find("/apis/ccompat/")
            .map(|at| format!("{}/apis/registry/v3", &base[..at]));
        let auth = cfg.username.as_ref().map(|user| {
            use base64::Engine as _;
            let pass = cfg.password.as_deref().unwrap_or_default();
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
            )
        });
        Ok(Some(Self {
            http: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https),
            base,
            apicurio,
            auth,
        }))
    }

    /// Whether the registry is Apicurio's (its Confluent-compatible API under `/apis/ccompat/`),
    /// whose own ids the records carry in headers.
    pub fn is_apicurio(&self) -> bool {
        self.apicurio.is_some()
    }

    /// One request; the answer's status and JSON body (`null` when empty or not JSON).
    async fn call(
        &self,
        method: Method,
        url: String,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ClientError> {
        let unreachable = |message: String| ClientError::Unreachable {
            url: url.clone(),
            message,
        };
        let mut req = Request::builder().method(method).uri(&url).header(
            "accept",
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        if let Some(auth) = &self.auth {
            req = req.header("authorization", auth);
        }
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/vnd.schemaregistry.v1+json");
                Full::new(Bytes::from(b.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let req = req.body(body).map_err(|e| unreachable(e.to_string()))?;
        let answer = tokio::time::timeout(TIMEOUT, async {
            let res = self.http.request(req).await.map_err(|e| e.to_string())?;
            let status = res.status();
            let bytes = res
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        })
        .await
        .map_err(|_| unreachable(format!("no answer in {TIMEOUT:?}")))?
        .map_err(unreachable)?;
        let (status, bytes) = answer;
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() || status == StatusCode::CONFLICT {
            return Ok((status, value));
        }
        Err(ClientError::Status {
            url,
            status,
            body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
        })
    }

    /// Registers `schema` (JSON Schema) under `subject`: a new version when it differs from
    /// the subject's, the existing one when it does not. The ids records carry.
    pub async fn register(&self, subject: &str, schema: &Value) -> Result<SchemaIds, ClientError> {
        let body = json!({"schemaType": "JSON", "schema": schema.to_string()});
        let url = format!("{}/subjects/{subject}/versions", self.base);
        let (status, answer) = self.call(Method::POST, url.clone(), Some(&body)).await?;
        if status == StatusCode::CONFLICT {
            return Err(ClientError::Incompatible {
                subject: subject.to_string(),
                rule: self.rule(subject).await,
                message: answer["message"].as_str().unwrap_or("refused").to_string(),
            });
        }
        let id = answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| ClientError::Status {
                url,
                status,
                body: format!("no schema id in {answer}"),
            })?;
        let mut ids = SchemaIds {
            id,
            global_id: None,
            content_id: None,
        };
        if let Some(apicurio) = &self.apicurio {
            // The version the schema is under, then Apicurio's ids of that version.
            let url = format!("{}/subjects/{subject}", self.base);
            let (_, found) = self.call(Method::POST, url, Some(&body)).await?;
            let version = &found["version"];
            let url = format!("{apicurio}/groups/default/artifacts/{subject}/versions/{version}");
            let (_, meta) = self.call(Method::GET, url, None).await?;
            ids.global_id = meta["globalId"].as_u64();
            ids.content_id = meta["contentId"].as_u64();
        }
        Ok(ids)
    }

    /// The compatibility rule `subject` is under: its own, else the registry's.
    async fn rule(&self, subject: &str) -> String {
        let url = format!("{}/config/{subject}?defaultToGlobal=true", self.base);
        match self.call(Method::GET, url, None).await {
            Ok((_, v)) => v["compatibilityLevel"]
                .as_str()
                .or_else(|| v["compatibility"].as_str())
                .unwrap_or("(not said)")
                .to_string(),
            Err(_) => "(could not be read)".to_string(),
        }
    }
}
