//! TLS for the simulator: a self-signed certificate the server accepts connections with.

use std::sync::Arc;

/// A self-signed server certificate for 127.0.0.1 and localhost.
pub struct Tls {
    pub cert_pem: String,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl Tls {
    pub fn self_signed() -> Result<Self, String> {
        let ck = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .map_err(|e| e.to_string())?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
        Ok(Self {
            cert_pem: ck.cert.pem(),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}
