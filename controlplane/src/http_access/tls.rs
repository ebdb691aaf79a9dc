//! HTTPS for the inspector API: a rustls server configuration (TLS 1.2 and 1.3, ring) from PEM files, and a
//! [`TlsListener`] that axum serves like a TCP listener. Handshakes run in their own tasks with a deadline, so a
//! client that stalls in its handshake holds up nobody else; a connection that does not speak TLS (plain HTTP to the
//! HTTPS port) is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

/// A handshake that has not finished by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// The certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: String },
    #[error("{path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file")]
    NoKey { path: String },
    #[error("the certificate and key cannot be used together: {0}")]
    Config(String),
}

/// The server configuration for `cert_file` (a chain, leaf first) and `key_file`.
pub fn server_config(cert_file: &str, key_file: &str) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let read =
        |path: &str| std::fs::read(path).map_err(|e| TlsError::Read { path: path.into(), reason: e.to_string() });
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(cert_file)?).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: cert_file.into() });
    }
    // The key's parse error is not shown: it could quote the key file.
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?).map_err(|_| TlsError::NoKey { path: key_file.into() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Accepts TCP connections and hands over those whose TLS handshake succeeded.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = tokio::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx));
        Ok(Self { ready, local, acceptor })
    }
}

async fn accept_loop(tcp: TcpListener, tls: TlsAcceptor, tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = tokio::select! {
            r = tcp.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    warn!(error = %e, "inspector API: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        let (tls, tx) = (tls.clone(), tx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(s)) => {
                    let _ = tx.send((s, peer)).await;
                }
                Ok(Err(e)) => debug!(peer = %peer, error = %e, "inspector API: TLS handshake failed"),
                Err(_) => debug!(peer = %peer, "inspector API: TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop ended (it cannot while this holds the receiver): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
