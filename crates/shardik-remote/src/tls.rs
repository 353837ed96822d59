//! Mutual TLS (rustls, `ring` provider) from PEM files.
//!
//! Every node has a certificate chain and key signed by a CA that all nodes trust. Each side
//! of a connection verifies the other's certificate against that CA: the dialer checks that
//! the server certificate is valid for [`TlsConfig::server_name`] (one name shared by all
//! nodes, such as `shardik-node`, in each certificate's subject alternative names), and the
//! acceptor requires a client certificate signed by the CA. The shared-secret handshake then
//! runs inside TLS, so both can be used together.
//!
//! Making certificates with OpenSSL (a CA, then one key and certificate per node):
//!
//! ```text
//! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
//!     -subj "/CN=shardik-ca" -keyout ca.key -out ca.pem
//! openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=node-1" \
//!     -keyout node-1.key -out node-1.csr
//! printf "subjectAltName=DNS:shardik-node\nextendedKeyUsage=serverAuth,clientAuth\n" > ext.cnf
//! openssl x509 -req -in node-1.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
//!     -extfile ext.cnf -out node-1.pem
//! ```

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::RemoteError;

/// TLS settings of a node: both the server and the client side of its connections.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) client: Arc<ClientConfig>,
    pub(crate) server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn config_err(what: &str, e: impl std::fmt::Display) -> RemoteError {
    RemoteError::Config(format!("TLS: {what}: {e}"))
}

impl TlsConfig {
    /// Loads the node's certificate chain and private key and the CA certificate(s) that
    /// peers' certificates must be signed by, all PEM files. `server_name` is the DNS name
    /// every node's certificate carries.
    pub fn from_pem_files(
        cert_chain: impl AsRef<Path>,
        key: impl AsRef<Path>,
        ca: impl AsRef<Path>,
        server_name: &str,
    ) -> Result<TlsConfig, RemoteError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| config_err(&format!("cannot read {}", p.display()), e))
        };
        TlsConfig::from_pem(
            &read(cert_chain.as_ref())?,
            &read(key.as_ref())?,
            &read(ca.as_ref())?,
            server_name,
        )
    }

    /// Like [`from_pem_files`](TlsConfig::from_pem_files) with the PEM contents in memory.
    pub fn from_pem(
        cert_chain: &[u8],
        key: &[u8],
        ca: &[u8],
        server_name: &str,
    ) -> Result<TlsConfig, RemoteError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| config_err("bad certificate chain", e))?;
        if certs.is_empty() {
            return Err(config_err("certificate chain", "no certificate found"));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| config_err("bad private key", e))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca) {
            let ca = ca.map_err(|e| config_err("bad CA certificate", e))?;
            roots
                .add(ca)
                .map_err(|e| config_err("unusable CA certificate", e))?;
        }
        if roots.is_empty() {
            return Err(config_err("CA", "no certificate found"));
        }
        let roots = Arc::new(roots);
        // The provider is chosen explicitly: no process-wide default is needed or installed.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| config_err("client verifier", e))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| config_err("protocol versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| config_err("server certificate", e))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_err("protocol versions", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| config_err("client certificate", e))?;
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| config_err("server name", e))?;
        Ok(TlsConfig {
            server: Arc::new(server),
            client: Arc::new(client),
            server_name,
        })
    }

    /// The DNS name every node's certificate must carry.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }
}
