//! The listeners' certificates: the rustls server configurations of the gRPC API (TLS 1.3 and 1.2, optional client
//! certificates that must chain to `client_ca_file`) and of the ironic-inspector API (HTTPS, no client
//! certificates), read from PEM files; and the name a client certificate proves.
//!
//! A gRPC connection without a client certificate is accepted: it may still carry an operator's bearer token. The
//! connection's identity is the certificate's first DNS subject alternative name, or its common name when it has
//! none; [`crate::authz`] decides what that identity may call.
//!
//! [`ServerTls::reload`] re-reads the files (the gRPC API's on SIGHUP): new connections get the new configuration,
//! established connections and their streams carry on untouched. [`crate::listener`] accepts the connections.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

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

/// A certificate, key or CA file cannot be used. Names the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {reason}")]
    Read { what: &'static str, path: PathBuf, reason: String },
    #[error("{what} {path}: no PEM certificate in the file")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {path}: a PEM section is malformed")]
    NotPem { what: &'static str, path: PathBuf },
    // The key's parse error is not shown: it could quote the key file.
    #[error("{what} {path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file")]
    NoKey { what: &'static str, path: PathBuf },
    #[error("the client CA {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
    #[error("the certificate and key cannot be used together: {0}")]
    Config(String),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read { what, path: path.to_path_buf(), reason: e.to_string() })
}

/// Every certificate in a PEM file (at least one).
fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&read(what, path)?)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NotPem { what, path: path.to_path_buf() })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_path_buf() });
    }
    Ok(certs)
}

fn read_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(what, path)?).map_err(|_| TlsError::NoKey { what, path: path.to_path_buf() })
}

fn builder() -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>, TlsError> {
    rustls::ServerConfig::builder_with_provider(ironguard_ironic::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(format!("TLS versions: {e}")))
}

/// The gRPC API's configuration: `[grpc]`'s certificate and key, client certificates verified against
/// `client_ca_file` when it is set, HTTP/2.
pub fn grpc_server_config(cfg: &GrpcConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = read_certs("the gRPC certificate", &cfg.tls_cert_file)?;
    let key = read_key("the gRPC key", &cfg.tls_key_file)?;
    let builder = if cfg.client_ca_file.as_os_str().is_empty() {
        builder()?.with_no_client_auth()
    } else {
        let ca =
            |e: &dyn std::fmt::Display| TlsError::ClientCa { path: cfg.client_ca_file.clone(), reason: e.to_string() };
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs("the client CA", &cfg.client_ca_file)? {
            roots.add(c).map_err(|e| ca(&e))?;
        }
        // A connection without a certificate is accepted at this level: it may carry the operator's token.
        let provider = ironguard_ironic::crypto_provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| ca(&e))?;
        builder()?.with_client_cert_verifier(verifier)
    };
    let mut sc = builder.with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
    sc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(sc))
}

/// The ironic-inspector API's configuration: `cert_file` (a chain, leaf first) and `key_file`, no client
/// certificates, HTTP/1.1.
pub fn https_server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = read_certs("the certificate", cert_file)?;
    let key = read_key("the key", key_file)?;
    let mut sc =
        builder()?.with_no_client_auth().with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
    sc.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(sc))
}

/// Where a [`ServerTls`] reads its configuration from.
#[derive(Debug, Clone)]
enum Source {
    Grpc(GrpcConfig),
    Https { cert_file: PathBuf, key_file: PathBuf },
}

impl Source {
    fn build(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        match self {
            Source::Grpc(cfg) => grpc_server_config(cfg),
            Source::Https { cert_file, key_file } => https_server_config(cert_file, key_file),
        }
    }
}

/// The rustls configuration a listener gives each new connection, replaced as a whole by [`ServerTls::reload`].
#[derive(Debug, Clone)]
pub struct ServerTls {
    source: Source,
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl ServerTls {
    fn new(source: Source) -> Result<Self, TlsError> {
        let current = Arc::new(RwLock::new(source.build()?));
        Ok(Self { source, current })
    }

    /// The gRPC API's ([`grpc_server_config`]).
    pub fn grpc(cfg: &GrpcConfig) -> Result<Self, TlsError> {
        Self::new(Source::Grpc(cfg.clone()))
    }

    /// The ironic-inspector API's ([`https_server_config`]).
    pub fn https(cert_file: &Path, key_file: &Path) -> Result<Self, TlsError> {
        Self::new(Source::Https { cert_file: cert_file.to_path_buf(), key_file: key_file.to_path_buf() })
    }

    /// Re-reads the files. On error the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = self.source.build()?;
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = fresh;
        Ok(())
    }

    /// The configuration for a connection accepted now.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
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
