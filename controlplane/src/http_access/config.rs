//! The `[inspector_api]` section: authentication, TLS and the limits of `POST /v1/continue`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Secret;
use super::htpasswd;

/// How operator calls to the inspector API are authenticated (Ironic standalone's `auth_strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthStrategy {
    /// Anyone who can reach the listener may make operator calls (a warning is logged at start).
    #[default]
    Noauth,
    /// HTTP basic authentication against an Apache htpasswd file of bcrypt entries.
    HttpBasic,
    /// `X-Auth-Token` validated against Keystone's `GET /v3/auth/tokens`.
    Keystone,
}

impl AuthStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthStrategy::Noauth => "noauth",
            AuthStrategy::HttpBasic => "http_basic",
            AuthStrategy::Keystone => "keystone",
        }
    }
}

/// `[inspector_api]`: who may call the ironic-inspector v1 REST API (served when `[server] inspector_listen` is
/// set) and how. `GET /`, `GET /v1` and `POST /v1/continue` (ironic-python-agent's call) are never authenticated;
/// every other call is an operator call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InspectorApiConfig {
    /// `noauth` (the default), `http_basic` or `keystone`. `noauth` is refused on a listener that is not a
    /// loopback address unless `insecure = true`.
    pub auth_strategy: AuthStrategy,
    /// Serve the API without authentication on a network address (`auth_strategy = noauth` and an
    /// `inspector_listen` that is not loopback): anyone who can reach it may start and abort inspections and change
    /// introspection rules. ironic-inspector's behaviour; logged as a warning at every start.
    pub insecure: bool,
    /// `http_basic`: the Apache htpasswd file (`user:$2y$...` bcrypt lines, e.g. made with `htpasswd -B`). Read at
    /// start (an invalid file stops the start) and again whenever its modification time, size or inode changes; a
    /// file that becomes unreadable or invalid refuses every operator call until it is fixed.
    pub http_basic_auth_user_file: String,
    /// `keystone`: the identity endpoint, e.g. `https://keystone.example:5000` (`/v3` is added when missing).
    pub keystone_url: String,
    /// `keystone`: PEM CA bundle for Keystone's certificate (default: the system's roots).
    pub keystone_ca_file: String,
    /// `keystone`: the service user ironguard logs in as to validate tokens (Keystone's `GET /v3/auth/tokens`
    /// needs a token of its own, with the `admin` or `service` role). Either this user with its password and
    /// project, or `keystone_service_token_file`.
    pub keystone_username: String,
    /// The service user's password; shown as `<redacted>` by `--print-config`.
    pub keystone_password: Secret,
    /// A file whose first line is the service user's password (instead of `keystone_password`).
    pub keystone_password_file: String,
    pub keystone_user_domain_name: String,
    /// The project the service user's token is scoped to.
    pub keystone_project_name: String,
    pub keystone_project_domain_name: String,
    /// A file whose first line is a ready service token (instead of a service user); read again when Keystone
    /// refuses the token it holds.
    pub keystone_service_token_file: String,
    /// A token is accepted only if it carries one of these roles (any of them, case-insensitively); empty: any
    /// valid token. The default is ironic-inspector's `is_admin` rule.
    pub keystone_roles: Vec<String>,
    /// How long a validation result is cached, seconds (never past the token's `expires_at`).
    pub keystone_cache_secs: u64,
    /// Milliseconds to wait for Keystone.
    pub keystone_timeout_ms: u64,
    /// PEM certificate chain: with `tls_key_file`, the listener serves HTTPS only (rustls, TLS 1.2 and 1.3).
    /// Read at start.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: String,
    /// Largest `POST /v1/continue` body, bytes; larger ones are answered 413. The default leaves room for
    /// ironic-python-agent's logs.
    pub continue_max_bytes: usize,
    /// `POST /v1/continue` calls each source address may make per minute on average (IPv6: per /64); more are
    /// answered 429 with `Retry-After`.
    pub continue_rate_per_minute: u32,
    /// How many calls a source may make at once before the rate applies.
    pub continue_rate_burst: u32,
    /// Failed operator authentications (401) each source address may make per minute on average, after
    /// `auth_failure_burst` at once (IPv6: per /64). A source past it is answered 429 with `Retry-After` before its
    /// credentials are checked, so junk credentials cannot drive bcrypt or Keystone one check per request. Callers
    /// with the right credentials never spend from it.
    pub auth_failures_per_minute: u32,
    pub auth_failure_burst: u32,
    /// Memory for `POST /v1/continue` bodies being read and parsed, all callers together, MiB (at least
    /// `continue_max_bytes`). Each body holds only the bytes it has sent past its first 64 KiB (which every
    /// connection may hold), so slow senders and small callbacks hold nothing of it; a body that finds the budget
    /// spent for 2 s is answered 503 with `Retry-After` (ironic-python-agent retries).
    pub continue_memory_mib: usize,
    /// `POST /v1/continue` bodies parsed and looked up at once, in each of two lanes: bodies up to 1 MiB (an
    /// inventory without its logs) and larger ones; more wait their turn in their lane.
    pub continue_workers: usize,
    /// JSON values a `POST /v1/continue` body may hold, all levels together (a large real inventory has about
    /// 15 000); more are answered 400. Bounds the memory and time its parsing takes.
    pub continue_max_values: usize,
    /// Seconds a `POST /v1/continue` body may take to arrive, from the end of its headers; a slower one is
    /// answered 408. (Headers themselves must arrive within 10 s of the connection.)
    pub continue_read_timeout_secs: u64,
}

/// 16 MiB: ironic-python-agent's data with its compressed logs.
pub const DEFAULT_CONTINUE_MAX_BYTES: usize = 16 << 20;

impl Default for InspectorApiConfig {
    fn default() -> Self {
        Self {
            auth_strategy: AuthStrategy::Noauth,
            insecure: false,
            http_basic_auth_user_file: "/etc/ironguard/htpasswd".into(),
            keystone_url: String::new(),
            keystone_ca_file: String::new(),
            keystone_username: String::new(),
            keystone_password: Secret::default(),
            keystone_password_file: String::new(),
            keystone_user_domain_name: "Default".into(),
            keystone_project_name: String::new(),
            keystone_project_domain_name: "Default".into(),
            keystone_service_token_file: String::new(),
            keystone_roles: vec!["admin".into(), "administrator".into(), "baremetal_admin".into()],
            keystone_cache_secs: 60,
            keystone_timeout_ms: 10_000,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            continue_max_bytes: DEFAULT_CONTINUE_MAX_BYTES,
            continue_rate_per_minute: 60,
            continue_rate_burst: 10,
            auth_failures_per_minute: 10,
            auth_failure_burst: 10,
            continue_memory_mib: 48,
            continue_workers: 2,
            continue_max_values: 100_000,
            continue_read_timeout_secs: 30,
        }
    }
}

impl InspectorApiConfig {
    /// True when the listener serves HTTPS.
    pub fn tls(&self) -> bool {
        !self.tls_cert_file.is_empty()
    }

    /// Refuses `noauth` on a listener that other machines can reach (anything but a loopback address) unless the
    /// operator wrote `insecure = true`: the API starts, aborts and reads inspections and changes rules.
    pub fn validate_exposure(&self, listen: std::net::SocketAddr) -> Result<(), String> {
        if self.auth_strategy == AuthStrategy::Noauth && !listen.ip().is_loopback() && !self.insecure {
            return Err(format!(
                "[inspector_api] the ironic-inspector API would listen on {listen} without authentication: anyone \
                 who can reach that address (a machine on the PXE network) could start and abort inspections and \
                 change introspection rules. Set auth_strategy = \"http_basic\" (with http_basic_auth_user_file) or \
                 \"keystone\", listen on a loopback address, or set insecure = true to serve it unauthenticated \
                 anyway (see docs/security.md)"
            ));
        }
        Ok(())
    }

    /// Rejects settings that cannot work, reading the files they name (the htpasswd file is parsed).
    pub fn validate(&self) -> Result<(), String> {
        match self.auth_strategy {
            AuthStrategy::Noauth => {}
            AuthStrategy::HttpBasic => {
                if self.http_basic_auth_user_file.is_empty() {
                    return Err("[inspector_api] http_basic needs http_basic_auth_user_file".into());
                }
                htpasswd::load(Path::new(&self.http_basic_auth_user_file))
                    .map_err(|e| format!("[inspector_api] http_basic_auth_user_file: {e}"))?;
            }
            AuthStrategy::Keystone => self.validate_keystone()?,
        }
        match (self.tls_cert_file.is_empty(), self.tls_key_file.is_empty()) {
            (true, true) => {}
            (false, true) => return Err("[inspector_api] tls_cert_file is set but tls_key_file is not".into()),
            (true, false) => return Err("[inspector_api] tls_key_file is set but tls_cert_file is not".into()),
            (false, false) => {
                readable("tls_cert_file", &self.tls_cert_file)?;
                readable("tls_key_file", &self.tls_key_file)?;
            }
        }
        if self.continue_max_bytes == 0 {
            return Err("[inspector_api] continue_max_bytes must be positive".into());
        }
        if self.continue_memory_mib.saturating_mul(1 << 20) < self.continue_max_bytes {
            return Err(format!(
                "[inspector_api] continue_memory_mib = {} cannot hold one body of continue_max_bytes = {}: raise it \
                 to at least {}",
                self.continue_memory_mib,
                self.continue_max_bytes,
                self.continue_max_bytes.div_ceil(1 << 20)
            ));
        }
        if self.continue_workers == 0 || self.continue_max_values == 0 || self.continue_read_timeout_secs == 0 {
            return Err(
                "[inspector_api] continue_workers, continue_max_values and continue_read_timeout_secs must be positive"
                    .into(),
            );
        }
        if self.continue_rate_per_minute == 0 || self.continue_rate_burst == 0 {
            return Err("[inspector_api] continue_rate_per_minute and continue_rate_burst must be at least 1".into());
        }
        if self.auth_failures_per_minute == 0 || self.auth_failure_burst == 0 {
            return Err("[inspector_api] auth_failures_per_minute and auth_failure_burst must be at least 1".into());
        }
        Ok(())
    }

    fn validate_keystone(&self) -> Result<(), String> {
        if self.keystone_url.is_empty() {
            return Err("[inspector_api] keystone needs keystone_url".into());
        }
        if !(self.keystone_url.starts_with("http://") || self.keystone_url.starts_with("https://")) {
            return Err(format!(
                "[inspector_api] keystone_url {:?} must start with http:// or https://",
                self.keystone_url
            ));
        }
        if !self.keystone_ca_file.is_empty() {
            readable("keystone_ca_file", &self.keystone_ca_file)?;
        }
        let user = !self.keystone_username.is_empty();
        let token_file = !self.keystone_service_token_file.is_empty();
        match (user, token_file) {
            (true, true) => {
                return Err("[inspector_api] set keystone_username or keystone_service_token_file, not both".into());
            }
            (false, false) => {
                return Err("[inspector_api] keystone needs a service identity to validate tokens with: \
                            keystone_username (with keystone_password or keystone_password_file and \
                            keystone_project_name) or keystone_service_token_file"
                    .into());
            }
            (false, true) => readable("keystone_service_token_file", &self.keystone_service_token_file)?,
            (true, false) => {
                if self.keystone_project_name.is_empty() {
                    return Err("[inspector_api] keystone_username needs keystone_project_name".into());
                }
                match (self.keystone_password.is_empty(), self.keystone_password_file.is_empty()) {
                    (true, true) => {
                        return Err("[inspector_api] keystone_username needs keystone_password or \
                                    keystone_password_file"
                            .into());
                    }
                    (false, false) => {
                        return Err("[inspector_api] set keystone_password or keystone_password_file, not both".into());
                    }
                    (true, false) => readable("keystone_password_file", &self.keystone_password_file)?,
                    (false, true) => {}
                }
            }
        }
        if self.keystone_cache_secs == 0 {
            return Err("[inspector_api] keystone_cache_secs must be at least 1".into());
        }
        if self.keystone_timeout_ms == 0 {
            return Err("[inspector_api] keystone_timeout_ms must be positive".into());
        }
        Ok(())
    }
}

fn readable(name: &str, path: &str) -> Result<(), String> {
    std::fs::File::open(path).map(drop).map_err(|e| format!("[inspector_api] {name} {path}: {e}"))
}
