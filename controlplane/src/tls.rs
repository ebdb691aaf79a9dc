//! The gRPC listener's transport: TLS (rustls) with optional client certificates, or plaintext when
//! `[grpc] insecure = true`; and the identity each connection proves.
//!
//! A client certificate must chain to `client_ca_file` (a connection without one is accepted: it may still carry
//! an operator's bearer token). The connection's identity is the certificate's first DNS subject alternative
//! name, or its common name when it has none; [`crate::authz`] decides what that identity may call.
//!
//! [`ServerTls::reload`] re-reads the certificate, key and CA (on SIGHUP): new connections get the new ones,
//! established connections and their streams carry on untouched.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

/// `[grpc]` in the control-plane configuration: TLS and who may call what.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// PEM certificate chain of the gRPC server.
    pub tls_cert_file: PathBuf,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: PathBuf,
    /// PEM CA certificate(s) that sign client certificates (agents' and operators').
    pub client_ca_file: PathBuf,
    /// Serve plaintext, without client identities (anyone who reaches the port is trusted as any agent, and as an
    /// operator unless `operator_token_file` is set). Logged as a warning at every start.
    pub insecure: bool,
    /// Certificate names (DNS SAN or CN) that are operators: they may change the filter, run inspections and
    /// manage rules. Any other valid client certificate is an agent, and may only watch and report as itself.
    pub operator_names: Vec<String>,
    /// A file holding a bearer token that also makes a call an operator's (`authorization: Bearer <token>`).
    pub operator_token_file: PathBuf,
}

impl GrpcConfig {
    /// TLS is configured (certificate and key).
    pub fn tls(&self) -> bool {
        !self.tls_cert_file.as_os_str().is_empty()
    }

    pub fn validate(&self) -> Result<(), String> {
        let set = |p: &Path| !p.as_os_str().is_empty();
        if set(&self.tls_cert_file) != set(&self.tls_key_file) {
            return Err("[grpc] tls_cert_file and tls_key_file go together".into());
        }
        if self.tls() && !set(&self.client_ca_file) && !set(&self.operator_token_file) {
            return Err("[grpc] with TLS, set client_ca_file (agents and operators prove who they are with \
                        certificates) or operator_token_file; without either nobody could call anything"
                .into());
        }
        if !self.tls() && !self.insecure {
            return Err("the gRPC API needs TLS: set [grpc] tls_cert_file, tls_key_file and client_ca_file (see \
                        docs/operations.md, \"Certificates\"), or insecure = true to serve plaintext without \
                        identities (a warning is logged at every start)"
                .into());
        }
        if self.tls() && self.insecure {
            return Err("[grpc] insecure = true and a TLS certificate are contradictory: choose one".into());
        }
        Ok(())
    }
}

/// What a connection proved, in every request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    /// The client certificate's name, if one was presented (and verified).
    pub identity: Option<String>,
}

/// The server's rustls configuration, replaced as a whole by [`ServerTls::reload`].
#[derive(Debug, Clone)]
pub struct ServerTls {
    cfg: GrpcConfig,
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

fn read_certs(what: &str, path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow::anyhow!("cannot read {what} {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{what} {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{what} {} holds no certificate", path.display());
    }
    Ok(certs)
}

fn build(cfg: &GrpcConfig) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs("the gRPC certificate", &cfg.tls_cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&cfg.tls_key_file)
        .map_err(|e| anyhow::anyhow!("cannot read the gRPC key {}: {e}", cfg.tls_key_file.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| anyhow::anyhow!("TLS versions: {e}"))?;
    let builder = if cfg.client_ca_file.as_os_str().is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs("the client CA", &cfg.client_ca_file)? {
            roots.add(c).map_err(|e| anyhow::anyhow!("client CA {}: {e}", cfg.client_ca_file.display()))?;
        }
        // A connection without a certificate is accepted at this level: it may carry the operator's token.
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| anyhow::anyhow!("client CA {}: {e}", cfg.client_ca_file.display()))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut sc = builder
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("the gRPC certificate and key do not fit together: {e}"))?;
    sc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(sc))
}

impl ServerTls {
    pub fn new(cfg: &GrpcConfig) -> anyhow::Result<Self> {
        Ok(Self { cfg: cfg.clone(), current: Arc::new(RwLock::new(build(cfg)?)) })
    }

    /// Re-reads the certificate, key and CA. On error the previous configuration stays in use.
    pub fn reload(&self) -> anyhow::Result<()> {
        let fresh = build(&self.cfg)?;
        if let Ok(mut c) = self.current.write() {
            *c = fresh;
        }
        Ok(())
    }

    fn config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

/// The name a client certificate proves: its first DNS subject alternative name, else its common name.
pub fn certificate_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(n) = name {
                return Some((*n).to_string());
            }
        }
    }
    cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string)
}

/// One accepted connection, plaintext or TLS.
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream, PeerInfo),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, PeerInfo),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        match self {
            Conn::Plain(_, p) | Conn::Tls(_, p) => p.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s, _) => s.is_write_vectored(),
            Conn::Tls(s, _) => s.is_write_vectored(),
        }
    }
}

/// Accepts connections on `listener`; with `tls`, each completes its handshake (10 s at most) in its own task
/// first, so a slow or hostile client delays nobody else.
pub fn incoming(listener: TcpListener, tls: Option<ServerTls>) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (stream, remote) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "gRPC listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let tx = tx.clone();
            match &tls {
                None => {
                    let peer = PeerInfo { remote: Some(remote), identity: None };
                    if tx.send(Ok(Conn::Plain(stream, peer))).await.is_err() {
                        return;
                    }
                }
                Some(tls) => {
                    let Some(cfg) = tls.config() else { continue };
                    tokio::spawn(async move {
                        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                        match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                            Ok(Ok(s)) => {
                                let identity = s
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .and_then(|c| c.first())
                                    .and_then(|c| certificate_name(c.as_ref()));
                                debug!(%remote, identity = ?identity, "gRPC TLS connection");
                                let _ = tx
                                    .send(Ok(Conn::Tls(Box::new(s), PeerInfo { remote: Some(remote), identity })))
                                    .await;
                            }
                            Ok(Err(e)) => info!(%remote, error = %e, "gRPC TLS handshake refused"),
                            Err(_) => info!(%remote, "gRPC TLS handshake timed out"),
                        }
                    });
                }
            }
        }
    });
    ReceiverStream::new(rx)
}
