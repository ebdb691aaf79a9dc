//! A client for Ironic's REST API: microversion negotiation, `noauth` / `http_basic` / Keystone password auth,
//! a TLS CA, paginated lists that follow `next` and ask only for the fields needed, and retries with back-off on
//! connection errors, 5xx and 409 (node locked).
//!
//! [`Ironic`] is the client, built from an [`IronicConfig`] (the control plane's `[ironic]` section); its calls
//! return the few fields ironguard reads ([`Node`], [`Port`], [`InterfaceValidation`]) or Ironic's JSON as it is,
//! and fail with an [`IronicError`]. [`IronicHealth`] is where it reports whether Ironic answers.
//! [`crypto_provider`] is the process's rustls provider, installed once, here, for every TLS client and server.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{OnceCell, RwLock};
use tracing::{debug, warn};

/// The highest microversion ironguard speaks; the client uses min(this, the server's maximum).
pub const MAX_MICROVERSION: (u32, u32) = (1, 81);
/// The lowest it needs (`fields` on node lists, ports by `node_uuid`).
pub const MIN_MICROVERSION: (u32, u32) = (1, 8);

/// How to reach and authenticate to Ironic (`[ironic]` in the control-plane configuration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IronicConfig {
    /// Ironic API endpoint, e.g. `https://ironic.example:6385`. Empty: no Ironic (inspections cannot run).
    pub url: String,
    /// More API endpoints of the same Ironic, for an HA Ironic with no virtual address in front of it (one API per
    /// conductor, e.g. `["http://10.0.0.12:6385", "http://10.0.0.13:6385"]`). A request that cannot reach the
    /// endpoint in use (connection refused or timed out, 502/503/504) moves to the next one at once; later requests
    /// stay on the endpoint that answered. Every endpoint must reach the same database.
    pub fallback_urls: Vec<String>,
    /// `noauth`, `http_basic` or `password` (Keystone v3).
    pub auth_type: String,
    pub username: String,
    pub password: ironguard_coord::Secret,
    pub password_file: String,
    /// Keystone (password auth): identity endpoint, e.g. `https://keystone.example:5000/v3`.
    pub auth_url: String,
    pub project_name: String,
    pub user_domain_name: String,
    pub project_domain_name: String,
    /// PEM CA bundle for Ironic's (and Keystone's) certificate.
    pub ca_file: String,
    /// Per-request timeout, milliseconds.
    pub timeout_ms: u64,
    /// Retries after a connection error, a 5xx or a 409, with back-off starting at `retry_backoff_ms`.
    pub retries: u32,
    pub retry_backoff_ms: u64,
    /// Page size of list requests (Ironic's `max_limit`, 1000 by default; 0 is rejected by Ironic).
    pub page_size: u32,
}

impl Default for IronicConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            fallback_urls: Vec::new(),
            auth_type: "noauth".into(),
            username: String::new(),
            password: ironguard_coord::Secret::default(),
            password_file: String::new(),
            auth_url: String::new(),
            project_name: String::new(),
            user_domain_name: "Default".into(),
            project_domain_name: "Default".into(),
            ca_file: String::new(),
            timeout_ms: 10_000,
            retries: 5,
            retry_backoff_ms: 200,
            page_size: 1000,
        }
    }
}

impl IronicConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.is_empty() || self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(format!("[ironic] url {:?} must start with http:// or https://", self.url));
        }
        if self.url.is_empty() && !self.fallback_urls.is_empty() {
            return Err("[ironic] fallback_urls needs url (the endpoint tried first)".into());
        }
        for u in &self.fallback_urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(format!("[ironic] fallback_urls entry {u:?} must start with http:// or https://"));
            }
        }
        match self.auth_type.as_str() {
            "noauth" => {}
            "http_basic" => {
                if self.username.is_empty() {
                    return Err("[ironic] http_basic needs a username".into());
                }
            }
            "password" => {
                if self.auth_url.is_empty() || self.username.is_empty() || self.project_name.is_empty() {
                    return Err("[ironic] password auth needs auth_url, username and project_name".into());
                }
            }
            other => return Err(format!("[ironic] auth_type {other:?} is not one of noauth, http_basic, password")),
        }
        if self.page_size == 0 {
            return Err("[ironic] page_size must be positive (Ironic rejects limit=0)".into());
        }
        if self.timeout_ms == 0 {
            return Err("[ironic] timeout_ms must be positive".into());
        }
        Ok(())
    }

    fn password(&self) -> Result<String, IronicError> {
        if self.password_file.is_empty() {
            return Ok(self.password.expose().to_string());
        }
        let text = std::fs::read_to_string(&self.password_file)
            .map_err(|e| IronicError::Config(format!("cannot read {}: {e}", self.password_file)))?;
        Ok(text.lines().next().unwrap_or_default().to_string())
    }
}

/// An Ironic call failed.
#[derive(Debug, thiserror::Error)]
pub enum IronicError {
    #[error("Ironic configuration: {0}")]
    Config(String),
    #[error("{what} not found in Ironic")]
    NotFound { what: String },
    #[error("Ironic answered {status} to {op}: {message}")]
    Http { op: String, status: u16, message: String },
    #[error("Ironic is unreachable for {op} after {attempts} attempts: {last}")]
    Exhausted { op: String, attempts: u32, last: String },
    #[error("Ironic's answer to {op} is not what was expected: {detail}")]
    Protocol { op: String, detail: String },
    #[error("Keystone authentication failed: {0}")]
    Auth(String),
}

/// The fields of a node ironguard reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    pub uuid: String,
    pub name: Option<String>,
    pub provision_state: Option<String>,
    pub power_state: Option<String>,
    pub inspect_interface: Option<String>,
    pub driver_info: Option<Value>,
    pub maintenance: Option<bool>,
}

impl Node {
    /// BMC addresses found in `driver_info` (`*_address` keys).
    pub fn bmc_addresses(&self) -> Vec<String> {
        let mut out = vec![];
        if let Some(Value::Object(m)) = &self.driver_info {
            for (k, v) in m {
                if k.ends_with("_address") {
                    if let Some(s) = v.as_str() {
                        out.push(s.to_string());
                    }
                }
            }
        }
        out.sort();
        out
    }
}

/// The fields of a port ironguard reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Port {
    pub uuid: String,
    pub address: String,
    pub node_uuid: String,
}

/// Result of `GET /v1/nodes/{uuid}/validate` for one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct InterfaceValidation {
    pub result: Option<bool>,
    pub reason: Option<String>,
}

/// An Ironic client.
#[derive(Debug)]
pub struct Ironic {
    http: reqwest::Client,
    cfg: IronicConfig,
    /// `url` then `fallback_urls`, without a trailing `/`.
    bases: Vec<String>,
    /// The index in `bases` of the endpoint in use.
    current: AtomicUsize,
    /// The index of the endpoint that answered last (`usize::MAX`: none yet), so that a move away from it is said
    /// at `warn` and the rounds of an Ironic that answers nowhere (e.g. not started yet) only at `debug`.
    answered: AtomicUsize,
    version: OnceCell<String>,
    token: RwLock<Option<String>>,
    health: IronicHealth,
}

/// Ironic's reachability, for `/metrics` (`ironguard_ironic_up` and the failed attempts of the control plane).
#[derive(Debug, Clone, Default)]
pub struct IronicHealth {
    pub failed_attempts: prometheus_client::metrics::counter::Counter,
    pub up: prometheus_client::metrics::gauge::Gauge,
    /// Every request sent (each attempt counts).
    pub requests: prometheus_client::metrics::counter::Counter,
    /// Moves from an endpoint that did not answer to the next of `url` and `fallback_urls`.
    pub failovers: prometheus_client::metrics::counter::Counter,
}

/// The rustls crypto provider of the process (ring, already in the tree for tonic and etcd-client), installed as
/// the process default the first time it is asked for. reqwest's clients read the process default (this crate's,
/// the control plane's Keystone client); the control plane's TLS listeners take it from here. The one place that
/// installs it.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            // Fails only if something in the process installed another one first: then that one is the default.
            let _ = rustls::crypto::ring::default_provider().install_default();
            CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
        })
        .clone()
}

/// `fields` (comma-separated) with `required` added where missing.
fn with_fields(fields: &str, required: &[&str]) -> String {
    let mut out: Vec<&str> = fields.split(',').map(str::trim).filter(|f| !f.is_empty()).collect();
    for r in required {
        if !out.contains(r) {
            out.push(r);
        }
    }
    out.join(",")
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (a, b) = v.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Ironic's error bodies put a JSON document in a string: `{"error_message": "{\"faultstring\": ...}"}`.
fn error_message(body: &str) -> String {
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) => return body.chars().take(300).collect(),
    };
    let inner = v.get("error_message").cloned().unwrap_or(Value::Null);
    let inner = match inner {
        Value::String(s) => serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)),
        other => other,
    };
    inner
        .get("faultstring")
        .and_then(|f| f.as_str())
        .map(str::to_string)
        .or_else(|| inner.as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(300).collect())
}

/// `id` (a node or port UUID or name, a trait) as one segment of a URL path. Percent-encoded, so that a `/`, `?`,
/// `#` or `%` in it cannot reach another endpoint (`x/../<uuid>` used to fetch node `<uuid>`); `""`, `.` and `..`,
/// which every URL parser resolves away, name nothing and are refused as not found.
fn segment(id: &str) -> Result<String, IronicError> {
    if matches!(id, "" | "." | "..") {
        return Err(IronicError::NotFound { what: format!("{id:?} (not a usable identifier)") });
    }
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}

impl Ironic {
    pub fn new(cfg: IronicConfig) -> Result<Self, IronicError> {
        cfg.validate().map_err(IronicError::Config)?;
        crypto_provider();
        let mut b =
            reqwest::Client::builder().timeout(Duration::from_millis(cfg.timeout_ms)).pool_max_idle_per_host(16);
        if !cfg.ca_file.is_empty() {
            let pem = std::fs::read(&cfg.ca_file)
                .map_err(|e| IronicError::Config(format!("cannot read {}: {e}", cfg.ca_file)))?;
            // A bundle: every certificate in the file is trusted (and only those).
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| IronicError::Config(format!("{}: {e}", cfg.ca_file)))?;
            if certs.is_empty() {
                return Err(IronicError::Config(format!("{}: no PEM certificate in the file", cfg.ca_file)));
            }
            b = b.tls_certs_only(certs);
        }
        let http = b.build().map_err(|e| IronicError::Config(format!("HTTP client: {e}")))?;
        let bases =
            std::iter::once(&cfg.url).chain(&cfg.fallback_urls).map(|u| u.trim_end_matches('/').to_string()).collect();
        Ok(Self {
            http,
            cfg,
            bases,
            current: AtomicUsize::new(0),
            answered: AtomicUsize::new(usize::MAX),
            version: OnceCell::new(),
            token: RwLock::new(None),
            health: IronicHealth::default(),
        })
    }

    /// Reports reachability into these metrics.
    pub fn with_health(mut self, health: IronicHealth) -> Self {
        self.health = health;
        self
    }

    pub fn config(&self) -> &IronicConfig {
        &self.cfg
    }

    /// The endpoint in use.
    fn base(&self) -> &str {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// The endpoint requests go to now (`url`, or one of `fallback_urls` after `url` stopped answering).
    pub fn endpoint(&self) -> &str {
        self.base()
    }

    /// Moves from endpoint `from` (an index in `bases`) to the next, unless another request moved already.
    fn fail_over(&self, from: usize, why: &str) {
        let to = (from + 1) % self.bases.len();
        if self.current.compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.health.failovers.inc();
            if self.answered.load(Ordering::Relaxed) == from {
                warn!(
                    from = %self.bases[from],
                    to = %self.bases[to],
                    "Ironic's API at {} does not answer ({why}); using {} (check that conductor's API service)",
                    self.bases[from],
                    self.bases[to]
                );
            } else {
                debug!(from = %self.bases[from], to = %self.bases[to], why, "Ironic's API does not answer; trying the next");
            }
        }
    }

    /// Asks Ironic for its versions once and settles on min(ours, its maximum).
    pub async fn microversion(&self) -> Result<&str, IronicError> {
        self.version
            .get_or_try_init(|| async {
                let text = self
                    .send_raw(
                        "negotiate the API version",
                        reqwest::Method::GET,
                        &format!("{}/", self.base()),
                        None,
                        None,
                    )
                    .await?;
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| IronicError::Protocol { op: "GET /".into(), detail: e.to_string() })?;
                let max = v["default_version"]["version"]
                    .as_str()
                    .or_else(|| v["versions"][0]["version"].as_str())
                    .and_then(parse_version)
                    .ok_or_else(|| IronicError::Protocol {
                        op: "GET /".into(),
                        detail: "no default_version.version".into(),
                    })?;
                if max < MIN_MICROVERSION {
                    return Err(IronicError::Protocol {
                        op: "GET /".into(),
                        detail: format!(
                            "Ironic's maximum API version {}.{} is older than the {}.{} ironguard needs",
                            max.0, max.1, MIN_MICROVERSION.0, MIN_MICROVERSION.1
                        ),
                    });
                }
                let chosen = max.min(MAX_MICROVERSION);
                debug!(version = format!("{}.{}", chosen.0, chosen.1), "Ironic API version negotiated");
                Ok(format!("{}.{}", chosen.0, chosen.1))
            })
            .await
            .map(String::as_str)
    }

    async fn keystone_token(&self, force: bool) -> Result<String, IronicError> {
        if !force {
            if let Some(t) = self.token.read().await.clone() {
                return Ok(t);
            }
        }
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": self.cfg.username, "password": self.cfg.password()?,
                "domain": {"name": self.cfg.user_domain_name}}}},
            "scope": {"project": {"name": self.cfg.project_name, "domain": {"name": self.cfg.project_domain_name}}}
        }});
        let url = format!("{}/auth/tokens", self.cfg.auth_url.trim_end_matches('/'));
        let r = self.http.post(&url).json(&body).send().await.map_err(|e| IronicError::Auth(format!("{url}: {e}")))?;
        if !r.status().is_success() {
            return Err(IronicError::Auth(format!("{url} answered {}", r.status())));
        }
        let t = r
            .headers()
            .get("X-Subject-Token")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| IronicError::Auth("no X-Subject-Token in Keystone's answer".into()))?;
        *self.token.write().await = Some(t.clone());
        Ok(t)
    }

    /// One HTTP exchange with retries, with the negotiated microversion when `versioned`.
    async fn send(
        &self,
        op: &str,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
        versioned: bool,
    ) -> Result<String, IronicError> {
        let version = if versioned { Some(self.microversion().await?.to_string()) } else { None };
        self.send_raw(op, method, url, body, version.as_deref()).await
    }

    /// One HTTP exchange with retries; returns the body of a 2xx answer (empty for 204).
    async fn send_raw(
        &self,
        op: &str,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
        version: Option<&str>,
    ) -> Result<String, IronicError> {
        // The path below the endpoint, so that a retry after a fail-over goes to the next endpoint.
        let path = self
            .bases
            .iter()
            .find_map(|b| url.strip_prefix(b.as_str()).filter(|rest| rest.is_empty() || rest.starts_with('/')))
            .map(str::to_string);
        // Every endpoint gets a try before the request gives up.
        let attempts = (self.cfg.retries + 1).max(self.bases.len() as u32);
        let mut last = String::new();
        let mut refreshed = false;
        // Whether the last attempt failed over to an endpoint this request has not tried: it goes there at once.
        let mut moved = 0usize;
        let mut fresh = false;
        for attempt in 0..attempts {
            if attempt > 0 && !fresh {
                let pause = Duration::from_millis(self.cfg.retry_backoff_ms).saturating_mul(1 << (attempt - 1).min(6));
                tokio::time::sleep(pause.min(Duration::from_secs(10))).await;
            }
            fresh = false;
            let used = self.current.load(Ordering::Relaxed) % self.bases.len();
            let target = match &path {
                Some(p) => format!("{}{p}", self.bases[used]),
                None => url.to_string(),
            };
            let url = target.as_str();
            self.health.requests.inc();
            let mut req = self.http.request(method.clone(), url).header("Accept", "application/json");
            if let Some(v) = version {
                req = req.header("X-OpenStack-Ironic-API-Version", v);
            }
            match self.cfg.auth_type.as_str() {
                "http_basic" => req = req.basic_auth(&self.cfg.username, Some(self.cfg.password()?)),
                "password" => req = req.header("X-Auth-Token", self.keystone_token(false).await?),
                _ => {}
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    // The causes say why (refused, timed out, "invalid peer certificate: UnknownIssuer").
                    last = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(": ");
                    debug!(op, attempt, error = %e, "Ironic request failed");
                    self.health.failed_attempts.inc();
                    if self.bases.len() > 1 && path.is_some() {
                        self.fail_over(used, &last);
                        moved += 1;
                        fresh = moved < self.bases.len();
                    }
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            // A proxy or a server with no working backend: the next endpoint may answer.
            if matches!(status, 502..=504) && self.bases.len() > 1 && path.is_some() {
                self.health.failed_attempts.inc();
                last = format!("{status}: {}", error_message(&text));
                self.fail_over(used, &last);
                moved += 1;
                fresh = moved < self.bases.len();
                continue;
            }
            // What the match below retries: a 5xx, or a 409 for a locked node.
            if status >= 500 || (status == 409 && error_message(&text).to_lowercase().contains("lock")) {
                self.health.failed_attempts.inc();
            } else {
                self.health.up.set(1);
                self.answered.store(used, Ordering::Relaxed);
            }
            match status {
                200..=299 => return Ok(text),
                401 if self.cfg.auth_type == "password" && !refreshed => {
                    refreshed = true;
                    self.keystone_token(true).await?;
                    continue;
                }
                404 => return Err(IronicError::NotFound { what: error_message(&text) }),
                // 409 is retried when the node is locked (another conductor action); other conflicts are final.
                409 if !error_message(&text).to_lowercase().contains("lock") => {
                    return Err(IronicError::Http { op: op.to_string(), status, message: error_message(&text) });
                }
                409 | 500..=599 => {
                    last = format!("{status}: {}", error_message(&text));
                    warn!(op, attempt, status, "Ironic answered {status}; retrying");
                    continue;
                }
                _ => return Err(IronicError::Http { op: op.to_string(), status, message: error_message(&text) }),
            }
        }
        self.health.up.set(0);
        Err(IronicError::Exhausted { op: op.to_string(), attempts, last })
    }

    async fn send_json<T: for<'de> Deserialize<'de>>(
        &self,
        op: &str,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
        versioned: bool,
    ) -> Result<T, IronicError> {
        let text = self.send(op, method, url, body, versioned).await?;
        serde_json::from_str(&text).map_err(|e| IronicError::Protocol { op: op.to_string(), detail: e.to_string() })
    }

    /// Every item of a paginated list. Ironic builds its `next` link from sort, limit, marker and a few flags only:
    /// it drops filters such as `provision_state` and `node_uuid`, so following it verbatim lists everything after
    /// the first page. Each page is therefore asked for with the caller's whole query plus `limit` and the
    /// `marker` of the last item (its `uuid`); `next` only says whether there is more. A reply without the
    /// collection key is an error, never an empty list.
    async fn list<T: for<'de> Deserialize<'de>>(
        &self,
        op: &str,
        path: &str,
        key: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<T>, IronicError> {
        let protocol = |detail: String| IronicError::Protocol { op: op.to_string(), detail };
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..100_000 {
            let mut url = reqwest::Url::parse(&format!("{}{path}", self.base()))
                .map_err(|e| IronicError::Config(e.to_string()))?;
            {
                let mut q = url.query_pairs_mut();
                for (k, v) in query {
                    q.append_pair(k, v);
                }
                q.append_pair("limit", &self.cfg.page_size.to_string());
                if let Some(m) = &marker {
                    q.append_pair("marker", m);
                }
            }
            let mut page: Value = self.send_json(op, reqwest::Method::GET, url.as_str(), None, true).await?;
            let Some(Value::Array(items)) = page.get_mut(key).map(Value::take) else {
                return Err(protocol(format!("the reply has no {key:?} list")));
            };
            let more = page.get("next").and_then(Value::as_str).is_some_and(|n| !n.is_empty()) && !items.is_empty();
            let last = items.last().map(|it| it.get("uuid").and_then(Value::as_str).map(str::to_string));
            for it in items {
                out.push(serde_json::from_value(it).map_err(|e| protocol(e.to_string()))?);
            }
            if !more {
                return Ok(out);
            }
            let last = last.flatten().ok_or_else(|| protocol(format!("an item of {key:?} has no uuid")))?;
            if marker.as_deref() == Some(last.as_str()) {
                return Err(protocol(format!("the page after marker {last} starts over")));
            }
            marker = Some(last);
        }
        Err(protocol("more than 100000 pages".into()))
    }

    /// A node with only the fields ironguard reads.
    pub async fn get_node(&self, id: &str) -> Result<Node, IronicError> {
        let url = format!(
            "{}/v1/nodes/{}?fields=uuid,name,provision_state,power_state,inspect_interface,driver_info,maintenance",
            self.base(),
            segment(id)?
        );
        self.send_json(&format!("GET node {id}"), reqwest::Method::GET, &url, None, true).await
    }

    /// Nodes in any of these provision states (all nodes if empty), with `fields` (plus `uuid` and
    /// `provision_state`). The server's filter is not trusted alone: every node returned is in one of the states.
    pub async fn list_nodes(&self, provision_states: &[&str], fields: &str) -> Result<Vec<Node>, IronicError> {
        let fields = with_fields(fields, &["uuid", "provision_state"]);
        if provision_states.is_empty() {
            return self.list("list nodes", "/v1/nodes", "nodes", &[("fields", fields)]).await;
        }
        let mut all = Vec::new();
        for ps in provision_states {
            let nodes: Vec<Node> = self
                .list(
                    "list nodes",
                    "/v1/nodes",
                    "nodes",
                    &[("provision_state", ps.to_string()), ("fields", fields.clone())],
                )
                .await?;
            let listed = nodes.len();
            let kept: Vec<Node> = nodes.into_iter().filter(|n| n.provision_state.as_deref() == Some(*ps)).collect();
            if kept.len() < listed {
                warn!(
                    provision_state = ps,
                    ignored = listed - kept.len(),
                    "Ironic listed nodes in other provision states; ignored them"
                );
            }
            all.extend(kept);
        }
        Ok(all)
    }

    /// Ports (address and node only), optionally of one node (re-checked here: only that node's ports).
    pub async fn list_ports(&self, node: Option<&str>) -> Result<Vec<Port>, IronicError> {
        let mut q = vec![("fields", "uuid,address,node_uuid".to_string())];
        if let Some(n) = node {
            q.push(("node_uuid", n.to_string()));
        }
        let mut ports: Vec<Port> = self.list("list ports", "/v1/ports", "ports", &q).await?;
        if let Some(n) = node {
            let listed = ports.len();
            ports.retain(|p| p.node_uuid == n);
            if ports.len() < listed {
                warn!(node = n, ignored = listed - ports.len(), "Ironic listed ports of other nodes; ignored them");
            }
        }
        Ok(ports)
    }

    /// `GET /v1/nodes/{uuid}/validate`, one interface.
    pub async fn validate(&self, uuid: &str, interface: &str) -> Result<InterfaceValidation, IronicError> {
        let v: Value = self
            .send_json(
                &format!("validate node {uuid}"),
                reqwest::Method::GET,
                &format!("{}/v1/nodes/{}/validate", self.base(), segment(uuid)?),
                None,
                true,
            )
            .await?;
        serde_json::from_value(v[interface].clone())
            .map_err(|e| IronicError::Protocol { op: "validate".into(), detail: e.to_string() })
    }

    pub async fn set_boot_device(&self, uuid: &str, device: &str, persistent: bool) -> Result<(), IronicError> {
        let body = json!({"boot_device": device, "persistent": persistent});
        self.send(
            &format!("set boot device of {uuid}"),
            reqwest::Method::PUT,
            &format!("{}/v1/nodes/{}/management/boot_device", self.base(), segment(uuid)?),
            Some(&body),
            true,
        )
        .await
        .map(|_| ())
    }

    /// `target`: "power on", "power off", "rebooting".
    pub async fn set_power(&self, uuid: &str, target: &str) -> Result<(), IronicError> {
        let body = json!({"target": target});
        self.send(
            &format!("{target} {uuid}"),
            reqwest::Method::PUT,
            &format!("{}/v1/nodes/{}/states/power", self.base(), segment(uuid)?),
            Some(&body),
            true,
        )
        .await
        .map(|_| ())
    }

    /// JSON Patch on a node.
    pub async fn patch_node(&self, uuid: &str, ops: &Value) -> Result<(), IronicError> {
        self.send(
            &format!("PATCH node {uuid}"),
            reqwest::Method::PATCH,
            &format!("{}/v1/nodes/{}", self.base(), segment(uuid)?),
            Some(ops),
            true,
        )
        .await
        .map(|_| ())
    }

    /// The whole node as Ironic returns it (properties, extra, driver_info, traits, ...): what processing hooks
    /// and introspection rules read.
    pub async fn get_node_full(&self, id: &str) -> Result<Value, IronicError> {
        let url = format!("{}/v1/nodes/{}", self.base(), segment(id)?);
        self.send_json(&format!("GET node {id}"), reqwest::Method::GET, &url, None, true).await
    }

    /// The node's ports with what processing reads of them.
    pub async fn list_ports_detail(&self, node: &str) -> Result<Vec<Value>, IronicError> {
        let q = vec![
            ("fields", "uuid,address,node_uuid,pxe_enabled,extra,local_link_connection,physical_network".to_string()),
            ("node_uuid", node.to_string()),
        ];
        let ports: Vec<Value> = self.list("list ports", "/v1/ports", "ports", &q).await?;
        Ok(ports.into_iter().filter(|p| p["node_uuid"] == node).collect())
    }

    /// Ports with this MAC address (any node).
    pub async fn ports_by_address(&self, address: &str) -> Result<Vec<Port>, IronicError> {
        let q = vec![("fields", "uuid,address,node_uuid".to_string()), ("address", address.to_string())];
        let ports: Vec<Port> = self.list("find a port by address", "/v1/ports", "ports", &q).await?;
        Ok(ports.into_iter().filter(|p| p.address.eq_ignore_ascii_case(address)).collect())
    }

    /// Every node's UUID and `driver_info` (for BMC address conflicts in discovery).
    pub async fn nodes_with_driver_info(&self) -> Result<Vec<Node>, IronicError> {
        self.list("list nodes", "/v1/nodes", "nodes", &[("fields", "uuid,driver_info".to_string())]).await
    }

    /// JSON Patch on a node; `reset_interfaces` adds `?reset_interfaces=` (a driver change).
    pub async fn patch_node_with(
        &self,
        uuid: &str,
        ops: &Value,
        reset_interfaces: Option<bool>,
    ) -> Result<(), IronicError> {
        let mut url = format!("{}/v1/nodes/{}", self.base(), segment(uuid)?);
        if let Some(r) = reset_interfaces {
            url.push_str(&format!("?reset_interfaces={r}"));
        }
        self.send(&format!("PATCH node {uuid}"), reqwest::Method::PATCH, &url, Some(ops), true).await.map(|_| ())
    }

    /// Creates a port from a full body (`node_uuid`, `address`, `pxe_enabled`, `extra`, ...).
    pub async fn create_port_with(&self, body: &Value) -> Result<Value, IronicError> {
        let what = body["address"].as_str().unwrap_or("?").to_string();
        self.send_json(
            &format!("create port {what}"),
            reqwest::Method::POST,
            &format!("{}/v1/ports", self.base()),
            Some(body),
            true,
        )
        .await
    }

    /// JSON Patch on a port.
    pub async fn patch_port(&self, uuid: &str, ops: &Value) -> Result<(), IronicError> {
        self.send(
            &format!("PATCH port {uuid}"),
            reqwest::Method::PATCH,
            &format!("{}/v1/ports/{}", self.base(), segment(uuid)?),
            Some(ops),
            true,
        )
        .await
        .map(|_| ())
    }

    /// `PUT /v1/nodes/{uuid}/traits/{trait}` (microversion 1.37+).
    pub async fn add_trait(&self, uuid: &str, name: &str) -> Result<(), IronicError> {
        self.send(
            &format!("add trait {name} to {uuid}"),
            reqwest::Method::PUT,
            &format!("{}/v1/nodes/{}/traits/{}", self.base(), segment(uuid)?, segment(name)?),
            None,
            true,
        )
        .await
        .map(|_| ())
    }

    /// `DELETE /v1/nodes/{uuid}/traits/{trait}`; a trait the node does not have is not an error.
    pub async fn remove_trait(&self, uuid: &str, name: &str) -> Result<(), IronicError> {
        match self
            .send(
                &format!("remove trait {name} from {uuid}"),
                reqwest::Method::DELETE,
                &format!("{}/v1/nodes/{}/traits/{}", self.base(), segment(uuid)?, segment(name)?),
                None,
                true,
            )
            .await
        {
            Ok(_) | Err(IronicError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `POST /v1/nodes` (discovery): returns the new node's UUID.
    pub async fn create_node(&self, body: &Value) -> Result<String, IronicError> {
        let v: Value = self
            .send_json(
                "enroll a discovered node",
                reqwest::Method::POST,
                &format!("{}/v1/nodes", self.base()),
                Some(body),
                true,
            )
            .await?;
        v["uuid"].as_str().map(str::to_string).ok_or_else(|| IronicError::Protocol {
            op: "enroll a discovered node".into(),
            detail: "no uuid in the reply".into(),
        })
    }

    pub async fn create_port(&self, node: &str, address: &str) -> Result<Port, IronicError> {
        let body = json!({"node_uuid": node, "address": address});
        self.send_json(
            &format!("create port {address}"),
            reqwest::Method::POST,
            &format!("{}/v1/ports", self.base()),
            Some(&body),
            true,
        )
        .await
    }

    pub async fn delete_port(&self, uuid: &str) -> Result<(), IronicError> {
        self.send(
            &format!("delete port {uuid}"),
            reqwest::Method::DELETE,
            &format!("{}/v1/ports/{}", self.base(), segment(uuid)?),
            None,
            true,
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ironic_error_bodies() {
        let body = r#"{"error_message": "{\"faultstring\": \"Node x could not be found.\", \"debuginfo\": null, \"faultcode\": \"Client\"}"}"#;
        assert_eq!(error_message(body), "Node x could not be found.");
        assert_eq!(error_message("plain"), "plain");
    }

    #[test]
    fn config_validation() {
        IronicConfig::default().validate().unwrap();
        let c = IronicConfig { auth_type: "password".into(), ..Default::default() };
        assert!(c.validate().unwrap_err().contains("auth_url"));
        let c = IronicConfig { page_size: 0, ..Default::default() };
        assert!(c.validate().unwrap_err().contains("limit=0"));
        let c = IronicConfig { url: "ironic:6385".into(), ..Default::default() };
        assert!(c.validate().is_err());
    }

    #[test]
    fn bmc_addresses_from_driver_info() {
        let n = Node {
            driver_info: Some(
                json!({"ipmi_address": "10.0.0.5", "ipmi_username": "x", "redfish_address": "https://b"}),
            ),
            ..Default::default()
        };
        assert_eq!(n.bmc_addresses(), vec!["10.0.0.5".to_string(), "https://b".to_string()]);
    }
}
