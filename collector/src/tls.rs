//! `--tls-cert`/`--tls-key`: the collector serves HTTPS (rustls). Handshakes run in each
//! connection's own task, under the server's header deadline (`phaseprof_view::web::server`).
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{rustls, TlsAcceptor};

/// The server's certificate chain (leaf first) and key, from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", cert.display()))?;
    if chain.is_empty() {
        bail!("{}: no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("{}: no PEM private key", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .context("the certificate and key do not go together")?;
    Ok(Arc::new(config))
}

/// The handshake `web::server::serve` runs on each accepted connection (within its header
/// deadline and its connection limit, so a silent client holds neither the accept loop nor
/// more than one slot).
pub fn handshake(
    config: Arc<rustls::ServerConfig>,
) -> impl Fn(TcpStream) -> Pin<Box<dyn Future<Output = io::Result<TlsStream<TcpStream>>> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    let acceptor = TlsAcceptor::from(config);
    move |tcp| {
        let acceptor = acceptor.clone();
        Box::pin(async move { acceptor.accept(tcp).await })
    }
}
