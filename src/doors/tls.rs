//! TLS for the front door (ECMA-434 profile 1): https and wss with rustls, from a PEM
//! certificate chain and private key. The accept loop that runs the handshakes, each on its
//! own task and under a timeout, is [`super::listener`].

use crate::config::MinTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// Builds the acceptor from PEM files, taking TLS `min_tls` and newer; the error names the
/// file and what is wrong.
pub(crate) fn acceptor(cert: &Path, key: &Path, min_tls: MinTls) -> Result<TlsAcceptor, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate {} is not valid PEM: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match min_tls {
        MinTls::V1_2 => rustls::DEFAULT_VERSIONS,
        MinTls::V1_3 => &[&rustls::version::TLS13],
    };
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
