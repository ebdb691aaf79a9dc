//! How the agent and `ironguardctl` reach the control plane's gRPC API: plaintext for `http://` endpoints, TLS
//! (rustls) for `https://` ones, with the CA that signed the control plane's certificate, this client's own
//! certificate and key (its identity: an agent's id, or an operator name), and the operator's bearer token.
//!
//! The files are read each time a channel is built, so a client that reconnects after its certificate was renewed
//! presents the new one.

use std::path::{Path, PathBuf};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// TLS and credentials of a gRPC client. Empty paths are unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientAuth {
    /// PEM CA certificate(s) that signed the control plane's server certificate.
    pub ca_file: PathBuf,
    /// PEM certificate presented to the control plane (with `key_file`).
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: PathBuf,
    /// The name the server certificate must carry, when it differs from the endpoint's host (e.g. when
    /// connecting by IP address to a certificate issued for a DNS name).
    pub server_name: String,
    /// A file holding the operator's bearer token, sent as `authorization: Bearer <token>`.
    pub token_file: PathBuf,
}

/// Why a client cannot be set up. Names the file and what is wrong with it; never its content.
#[derive(Debug, thiserror::Error)]
pub enum ClientAuthError {
    #[error("{url:?} is not a valid endpoint: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ClientAuthError> {
    std::fs::read(path).map_err(|source| ClientAuthError::Read { what, path: path.to_path_buf(), source })
}

impl ClientAuth {
    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// An endpoint for `url`: TLS with these files for `https://`, plaintext for `http://` (a configured
    /// certificate or CA with an `http://` URL is refused rather than silently unused).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, ClientAuthError> {
        let bad = |reason: String| ClientAuthError::BadUrl { url: url.to_string(), reason };
        let ep = Endpoint::from_shared(url.to_string()).map_err(|e| bad(e.to_string()))?;
        if url.starts_with("http://") {
            if !self.ca_file.as_os_str().is_empty() || !self.cert_file.as_os_str().is_empty() {
                return Err(bad("a CA or client certificate is configured: use an https:// URL".into()));
            }
            return Ok(ep);
        }
        if !url.starts_with("https://") {
            return Err(bad("expected http:// or https://".into()));
        }
        let mut tls = ClientTlsConfig::new();
        if !self.ca_file.as_os_str().is_empty() {
            tls = tls.ca_certificate(Certificate::from_pem(read("the CA file", &self.ca_file)?));
        } else {
            return Err(ClientAuthError::Invalid(format!(
                "{url}: TLS needs the CA that signed the control plane's certificate (a CA file)"
            )));
        }
        match (self.cert_file.as_os_str().is_empty(), self.key_file.as_os_str().is_empty()) {
            (false, false) => {
                let cert = read("the certificate", &self.cert_file)?;
                let key = read("the key", &self.key_file)?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            (true, true) => {}
            _ => {
                return Err(ClientAuthError::Invalid(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        }
        if !self.server_name.is_empty() {
            tls = tls.domain_name(self.server_name.clone());
        } else if let Some(v6) = ep.uri().host().and_then(|h| h.strip_prefix('[')).and_then(|h| h.strip_suffix(']')) {
            // An IPv6 literal: the name to verify is the address, without the URI's brackets.
            tls = tls.domain_name(v6.to_string());
        }
        ep.tls_config(tls).map_err(|e| {
            // The transport error says "transport error"; its sources say what is wrong.
            let mut text = e.to_string();
            let mut cur = std::error::Error::source(&e);
            while let Some(s) = cur {
                text = format!("{text}: {s}");
                cur = s.source();
            }
            ClientAuthError::Invalid(format!("{url}: TLS configuration: {text}"))
        })
    }

    /// The `authorization` value of the bearer token, if a token file is configured.
    pub fn bearer(&self) -> Result<Option<MetadataValue<Ascii>>, ClientAuthError> {
        if self.token_file.as_os_str().is_empty() {
            return Ok(None);
        }
        let raw = read("the token file", &self.token_file)?;
        let token = String::from_utf8(raw).map_err(|_| {
            ClientAuthError::Invalid(format!("the token file {} is not UTF-8", self.token_file.display()))
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(ClientAuthError::Invalid(format!("the token file {} is empty", self.token_file.display())));
        }
        format!("Bearer {token}").parse().map(Some).map_err(|_| {
            ClientAuthError::Invalid(format!(
                "the token in {} has characters a header cannot carry",
                self.token_file.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_and_tls_urls() {
        assert!(ClientAuth::default().endpoint("http://127.0.0.1:9100").is_ok());
        let e = ClientAuth::default().endpoint("https://127.0.0.1:9100").unwrap_err().to_string();
        assert!(e.contains("CA"), "{e}");
        let with_ca = ClientAuth { ca_file: "/nonexistent/ca.pem".into(), ..Default::default() };
        let e = with_ca.endpoint("http://127.0.0.1:9100").unwrap_err().to_string();
        assert!(e.contains("https://"), "{e}");
        let e = with_ca.endpoint("https://127.0.0.1:9100").unwrap_err().to_string();
        assert!(e.starts_with("cannot read the CA file /nonexistent/ca.pem"), "{e}");
        assert!(ClientAuth::default().endpoint("ftp://x").is_err());
        let half =
            ClientAuth { ca_file: "/etc/hostname".into(), cert_file: "/etc/hostname".into(), ..Default::default() };
        assert!(half.endpoint("https://x:1").unwrap_err().to_string().contains("needs its key"));
    }

    #[test]
    fn bearer_tokens() {
        assert!(ClientAuth::default().bearer().unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("ig-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "s3cret\n").unwrap();
        let a = ClientAuth { token_file: f.clone(), ..Default::default() };
        assert_eq!(a.bearer().unwrap().unwrap().to_str().unwrap(), "Bearer s3cret");
        std::fs::write(&f, "  \n").unwrap();
        let e = a.bearer().unwrap_err().to_string();
        assert!(e.contains("is empty") && !e.contains("s3cret"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
