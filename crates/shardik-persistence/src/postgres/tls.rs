//! TLS to PostgreSQL (rustls, `ring` provider).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::StoreError;

/// How a [`PostgresStore`](super::PostgresStore) talks TLS to the server: which certificate
/// authorities it trusts, and optionally a client certificate.
///
/// With TLS configured, a URL without `sslmode` (or with `sslmode=prefer`) means
/// `sslmode=require`: the store never falls back to plaintext. A URL with `sslmode=disable`
/// contradicts it: [`connect_with`](super::PostgresStore::connect_with) refuses it with a
/// configuration error instead of connecting in plaintext. The server's certificate must be
/// valid for the host name (or IP address) in the URL.
///
/// ```no_run
/// # async fn run() -> Result<(), shardik_persistence::StoreError> {
/// use shardik_persistence::{PostgresOptions, PostgresStore, PostgresTls};
///
/// let options = PostgresOptions {
///     tls: Some(PostgresTls::from_ca_pem_file("/etc/shardik/db-ca.pem")?),
///     ..PostgresOptions::default()
/// };
/// let store = PostgresStore::connect_with("postgres://app@db.internal/app", options).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresTls {
    pub(super) client: Arc<ClientConfig>,
}

impl std::fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTls").finish_non_exhaustive()
    }
}

fn config_err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("postgres TLS: {what}: {e}"))
}

impl PostgresTls {
    /// Trusts the CA certificate(s) in the PEM file at `ca`.
    pub fn from_ca_pem_file(ca: impl AsRef<Path>) -> Result<PostgresTls, StoreError> {
        PostgresTls::from_ca_pem(&read(ca.as_ref())?)
    }

    /// Trusts the CA certificate(s) in `ca` (PEM).
    pub fn from_ca_pem(ca: &[u8]) -> Result<PostgresTls, StoreError> {
        Ok(PostgresTls::from_client_config(
            builder()?
                .with_root_certificates(roots(ca)?)
                .with_no_client_auth(),
        ))
    }

    /// Trusts the CA certificate(s) in `ca` and authenticates with the client certificate
    /// chain `cert_chain` and its private key `key` (all PEM), for servers that require
    /// client certificates (`clientcert=verify-full` in `pg_hba.conf`).
    pub fn from_ca_and_client_pem(
        ca: &[u8],
        cert_chain: &[u8],
        key: &[u8],
    ) -> Result<PostgresTls, StoreError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| config_err("bad client certificate chain", e))?;
        if certs.is_empty() {
            return Err(config_err(
                "client certificate chain",
                "no certificate found",
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| config_err("bad client private key", e))?;
        let config = builder()?
            .with_root_certificates(roots(ca)?)
            .with_client_auth_cert(certs, key)
            .map_err(|e| config_err("client certificate", e))?;
        Ok(PostgresTls::from_client_config(config))
    }

    /// Uses a rustls client configuration as it is (other trust roots, such as the system's
    /// or webpki's; other verifiers). It must use a crypto provider of its own or the
    /// process default one (see [`rustls::crypto::CryptoProvider`]).
    pub fn from_client_config(config: ClientConfig) -> PostgresTls {
        PostgresTls {
            client: Arc::new(config),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| config_err(&format!("cannot read {}", path.display()), e))
}

/// A client configuration builder with the `ring` provider chosen explicitly (no
/// process-wide default is needed or installed) and rustls's safe protocol versions.
fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, StoreError> {
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| config_err("protocol versions", e))
}

fn roots(ca: &[u8]) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| config_err("bad CA certificate", e))?;
        roots
            .add(cert)
            .map_err(|e| config_err("unusable CA certificate", e))?;
    }
    if roots.is_empty() {
        return Err(config_err("CA", "no certificate found"));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_a_clear_error() {
        let err = PostgresTls::from_ca_pem(b"not a certificate").unwrap_err();
        assert!(
            err.to_string().contains("CA: no certificate found"),
            "{err}"
        );
        let err = PostgresTls::from_ca_pem_file("/nonexistent/ca.pem").unwrap_err();
        assert!(
            err.to_string().contains("cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        let err = PostgresTls::from_ca_and_client_pem(b"", b"", b"").unwrap_err();
        assert!(
            err.to_string().contains("client certificate chain"),
            "{err}"
        );
    }
}
