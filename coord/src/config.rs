//! etcd connection settings, shared by the agent and the control plane configuration files (`[etcd]`).

use serde::{Deserialize, Serialize};

use crate::{CoordError, Secret};

/// How to reach etcd. With no endpoints, the embedded (local) backend is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `["https://etcd-1:2379", "https://etcd-2:2379"]`. Empty: no etcd (single host).
    pub endpoints: Vec<String>,
    /// Every key ironguard writes lives under this prefix.
    pub prefix: String,
    /// PEM CA bundle to verify etcd's certificate (TLS when set, or when an endpoint is https://).
    pub ca_file: String,
    /// PEM client certificate and key, for client-certificate authentication.
    pub cert_file: String,
    pub key_file: String,
    /// etcd user (role-based access control).
    pub username: String,
    /// Password for `username`; prefer `password_file`.
    pub password: Secret,
    /// File holding the password (first line).
    pub password_file: String,
    /// Connection (dial) timeout, milliseconds.
    pub dial_timeout_ms: u64,
    /// Timeout of each request, milliseconds.
    pub request_timeout_ms: u64,
    /// Attempts for a request that failed transiently (unavailable, timeout), with back-off in between.
    pub retries: u32,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            prefix: "/ironguard".into(),
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            username: String::new(),
            password: Secret::default(),
            password_file: String::new(),
            dial_timeout_ms: 2000,
            request_timeout_ms: 2000,
            retries: 3,
        }
    }
}

impl EtcdConfig {
    /// True when etcd endpoints are configured.
    pub fn enabled(&self) -> bool {
        !self.endpoints.is_empty()
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), CoordError> {
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(CoordError::Config(format!("endpoint {e:?} must start with http:// or https://")));
            }
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(CoordError::Config(format!(
                "prefix {:?} must start with '/' and not end with '/'",
                self.prefix
            )));
        }
        if self.cert_file.is_empty() != self.key_file.is_empty() {
            return Err(CoordError::Config("cert_file and key_file go together".into()));
        }
        if !self.password.is_empty() && !self.password_file.is_empty() {
            return Err(CoordError::Config("set password or password_file, not both".into()));
        }
        if (!self.password.is_empty() || !self.password_file.is_empty()) && self.username.is_empty() {
            return Err(CoordError::Config("a password needs a username".into()));
        }
        if self.dial_timeout_ms == 0 || self.request_timeout_ms == 0 {
            return Err(CoordError::Config("timeouts must be positive".into()));
        }
        Ok(())
    }

    /// Whether to use TLS.
    pub fn tls(&self) -> bool {
        !self.ca_file.is_empty()
            || !self.cert_file.is_empty()
            || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        EtcdConfig::default().validate().unwrap();
        let bad = |f: fn(&mut EtcdConfig)| {
            let mut c = EtcdConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.endpoints = vec!["etcd:2379".into()]).contains("http://"));
        assert!(bad(|c| c.prefix = "ironguard".into()).contains("prefix"));
        assert!(bad(|c| c.cert_file = "c.pem".into()).contains("together"));
        assert!(bad(|c| c.password = Secret::new("x")).contains("username"));
        assert!(bad(|c| c.request_timeout_ms = 0).contains("positive"));
        let c = EtcdConfig { endpoints: vec!["https://e:2379".into()], ..Default::default() };
        assert!(c.tls() && c.enabled());
    }
}
