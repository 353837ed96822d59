//! Certificates for the TLS benchmarks and the rustls set-up of the raw TLS lane.
//!
//! The suite makes a CA and one node certificate with rcgen, writes them as PEM files to a
//! fresh temporary directory (removed at the end of the run), and both processes load them:
//! the shardik nodes with [`TlsConfig::from_pem_files`], the raw lane with the same rustls
//! set-up shardik uses (ring provider, mutual authentication, TLS 1.2 and 1.3).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use shardik::remote::{RemoteError, TlsConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The DNS name in the node certificate.
pub const SERVER_NAME: &str = "shardik-node";

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Makes a CA and a node certificate signed by it; writes `ca.pem`, `node.pem` and
/// `node.key` to a new temporary directory and returns it.
pub fn write_certificates() -> Result<PathBuf, Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "shardik-bench-ca");
    let ca_cert = ca.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut node = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
    node.distinguished_name
        .push(DnType::CommonName, "shardik-bench-node");
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = node.signed_by(&key, &ca_cert, &ca_key)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let dir =
        std::env::temp_dir().join(format!("shardik-bench-tls-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("ca.pem"), ca_cert.pem())?;
    std::fs::write(dir.join("node.pem"), cert.pem())?;
    std::fs::write(dir.join("node.key"), key.serialize_pem())?;
    Ok(dir)
}

/// The shardik TLS configuration from the files in `dir`.
pub fn node_tls(dir: &Path) -> Result<TlsConfig, RemoteError> {
    TlsConfig::from_pem_files(
        dir.join("node.pem"),
        dir.join("node.key"),
        dir.join("ca.pem"),
        SERVER_NAME,
    )
}

/// rustls server and client configurations of the raw lane, from the files in `dir`.
fn configs(dir: &Path) -> Result<(ServerConfig, ClientConfig), Error> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join("node.pem"))?.collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(dir.join("node.key"))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(dir.join("ca.pem"))? {
        roots.add(ca?)?;
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs.clone(), key.clone_key())?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?;
    Ok((server, client))
}

/// The raw lane's TLS acceptor (server side, in the peer process).
pub fn raw_acceptor(dir: &Path) -> Result<TlsAcceptor, Error> {
    Ok(TlsAcceptor::from(Arc::new(configs(dir)?.0)))
}

/// The raw lane's TLS client side.
#[derive(Clone)]
pub struct RawTls {
    /// Connects with the node certificate.
    pub connector: TlsConnector,
    /// The name the server certificate is checked against.
    pub server_name: ServerName<'static>,
}

impl RawTls {
    /// Loads the client side from the files in `dir`.
    pub fn load(dir: &Path) -> Result<RawTls, Error> {
        Ok(RawTls {
            connector: TlsConnector::from(Arc::new(configs(dir)?.1)),
            server_name: ServerName::try_from(SERVER_NAME.to_string())?,
        })
    }
}
