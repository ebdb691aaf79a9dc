//! `keystone`: the caller's `X-Auth-Token` is validated with Keystone's `GET /v3/auth/tokens` (the caller's token
//! in `X-Subject-Token`, ironguard's service token in `X-Auth-Token`), as keystonemiddleware's `auth_token` does.
//!
//! - A token Keystone does not know (404), or whose `expires_at` has passed, is a 401 with
//!   `WWW-Authenticate: Keystone uri="..."`; a valid token without one of the required roles is a 403.
//! - Results are cached under a keyed hash of the token (never the token) for `keystone_cache_secs`, and never past
//!   the token's expiry.
//! - The service token comes from a service user's password (`POST /v3/auth/tokens`, renewed a minute before it
//!   expires) or from a file; when Keystone refuses it (401/403), it is renewed once and the call retried.
//! - Keystone unreachable or answering anything else: 503, nothing cached (fail closed).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode};
use ironguard_proto::time::now_ms;
use serde_json::{Value, json};
use tracing::{debug, error, warn};

use super::config::InspectorApiConfig;
use super::{CacheKeyer, Refusal, Secret};

/// Cached validations kept at most.
const CACHE_ENTRIES: usize = 10_000;
/// A service token is renewed this long before it expires.
const RENEW_MARGIN: Duration = Duration::from_secs(60);

/// The Keystone client cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum KeystoneError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: String },
    #[error("HTTP client: {0}")]
    Client(String),
    #[error("keystone_url {0:?} cannot be sent in a header")]
    BadUrl(String),
}

/// How ironguard authenticates itself to Keystone.
enum ServiceIdentity {
    Password { user: String, password: Secret, user_domain: String, project: String, project_domain: String },
    PasswordFile { user: String, file: String, user_domain: String, project: String, project_domain: String },
    TokenFile(String),
}

/// What Keystone said about a token.
#[derive(Debug, Clone)]
enum Verdict {
    /// Valid until `expires_ms` (ms since the epoch), for `user`, with or without a required role.
    Valid { user: String, expires_ms: u64, role_ok: bool },
    /// Unknown to Keystone (or malformed).
    Invalid,
}

#[derive(Debug, Clone)]
struct Cached {
    verdict: Verdict,
    until: Instant,
}

/// Validates tokens against Keystone.
pub struct KeystoneAuth {
    http: reqwest::Client,
    /// `.../v3`
    base: String,
    identity: ServiceIdentity,
    service_token: tokio::sync::Mutex<Option<(Secret, Instant)>>,
    roles: Vec<String>,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    keyer: CacheKeyer,
    challenge: HeaderValue,
}

impl std::fmt::Debug for KeystoneAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeystoneAuth").field("base", &self.base).field("roles", &self.roles).finish_non_exhaustive()
    }
}

/// Keystone's v3 base from a configured URL with or without `/v3`.
pub fn v3_base(url: &str) -> String {
    let u = url.trim_end_matches('/');
    if u.ends_with("/v3") { u.to_string() } else { format!("{u}/v3") }
}

impl KeystoneAuth {
    pub fn new(cfg: &InspectorApiConfig) -> Result<Self, KeystoneError> {
        // reqwest's TLS takes the process's provider.
        ironguard_ironic::crypto_provider();
        let mut b = reqwest::Client::builder().timeout(Duration::from_millis(cfg.keystone_timeout_ms.max(1)));
        if !cfg.keystone_ca_file.is_empty() {
            let pem = std::fs::read(&cfg.keystone_ca_file)
                .map_err(|e| KeystoneError::Read { path: cfg.keystone_ca_file.clone(), reason: e.to_string() })?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| KeystoneError::Client(e.to_string()))?;
            if certs.is_empty() {
                return Err(KeystoneError::NoCertificate { path: cfg.keystone_ca_file.clone() });
            }
            b = b.tls_certs_only(certs);
        }
        let http = b.build().map_err(|e| KeystoneError::Client(e.to_string()))?;
        let identity = if !cfg.keystone_service_token_file.is_empty() {
            ServiceIdentity::TokenFile(cfg.keystone_service_token_file.clone())
        } else if !cfg.keystone_password_file.is_empty() {
            ServiceIdentity::PasswordFile {
                user: cfg.keystone_username.clone(),
                file: cfg.keystone_password_file.clone(),
                user_domain: cfg.keystone_user_domain_name.clone(),
                project: cfg.keystone_project_name.clone(),
                project_domain: cfg.keystone_project_domain_name.clone(),
            }
        } else {
            ServiceIdentity::Password {
                user: cfg.keystone_username.clone(),
                password: cfg.keystone_password.clone(),
                user_domain: cfg.keystone_user_domain_name.clone(),
                project: cfg.keystone_project_name.clone(),
                project_domain: cfg.keystone_project_domain_name.clone(),
            }
        };
        let challenge = HeaderValue::from_str(&format!("Keystone uri=\"{}\"", cfg.keystone_url.trim_end_matches('/')))
            .map_err(|_| KeystoneError::BadUrl(cfg.keystone_url.clone()))?;
        Ok(Self {
            http,
            base: v3_base(&cfg.keystone_url),
            identity,
            service_token: tokio::sync::Mutex::new(None),
            roles: cfg.keystone_roles.iter().map(|r| r.to_ascii_lowercase()).collect(),
            ttl: Duration::from_secs(cfg.keystone_cache_secs.max(1)),
            cache: Mutex::new(HashMap::new()),
            keyer: CacheKeyer::new(),
            challenge,
        })
    }

    pub fn challenge(&self) -> &HeaderValue {
        &self.challenge
    }

    /// The user of a valid token with a required role; 401, 403 or 503 otherwise.
    pub async fn check(&self, token: &str) -> Result<String, Refusal> {
        let key = self.keyer.key(&[token.as_bytes()]);
        let verdict = match self.cached(&key) {
            Some(v) => v,
            None => {
                let v = self.validate(token).await?;
                self.remember(key, &v);
                v
            }
        };
        match verdict {
            Verdict::Invalid => {
                crate::refused!(
                    "keystone-invalid",
                    "keystone",
                    "inspector API: Keystone token refused: unknown or invalid (401); the client needs a current token from this Keystone"
                );
                Err(Refusal::unauthorized("The request you have made requires authentication.", &self.challenge))
            }
            Verdict::Valid { expires_ms, .. } if expires_ms <= now_ms() => {
                crate::refused!(
                    "keystone-expired",
                    "keystone",
                    "inspector API: Keystone token refused: expired (401); the client must get a new token"
                );
                Err(Refusal::unauthorized("The request you have made requires authentication.", &self.challenge))
            }
            Verdict::Valid { user, role_ok: false, .. } => {
                crate::refused!("keystone-role", user, required = ?self.roles, "inspector API: Keystone token refused: the user has none of the required roles (403); grant one, or change [inspector_api] keystone_roles");
                Err(Refusal::status(StatusCode::FORBIDDEN, "Access was denied to this resource."))
            }
            Verdict::Valid { user, .. } => Ok(user),
        }
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Verdict> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(key).filter(|c| c.until > Instant::now()).map(|c| c.verdict.clone())
    }

    fn remember(&self, key: [u8; 32], verdict: &Verdict) {
        let now = Instant::now();
        let mut until = now + self.ttl;
        let mut verdict = verdict.clone();
        if let Verdict::Valid { expires_ms, .. } = verdict {
            match expires_ms.checked_sub(now_ms()) {
                Some(left) if left > 0 => until = until.min(now + Duration::from_millis(left)),
                // Expired for good: remembered as invalid, like an unknown token.
                _ => verdict = Verdict::Invalid,
            }
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, c| c.until > now);
            if cache.len() >= CACHE_ENTRIES {
                warn!("inspector API: the Keystone validation cache is full; emptied");
                cache.clear();
            }
        }
        cache.insert(key, Cached { verdict, until });
    }

    /// Asks Keystone, renewing the service token once if Keystone refuses it.
    async fn validate(&self, token: &str) -> Result<Verdict, Refusal> {
        let unavailable =
            || Refusal::status(StatusCode::SERVICE_UNAVAILABLE, "The Keystone service is temporarily unavailable.");
        let subject = HeaderValue::from_str(token).map_err(|_| {
            Refusal::unauthorized("The request you have made requires authentication.", &self.challenge)
        })?;
        let url = format!("{}/auth/tokens", self.base);
        for attempt in 0..2 {
            let service = self.service_token(attempt > 0).await.map_err(|e| {
                error!(error = %e, "inspector API: cannot get a Keystone service token");
                unavailable()
            })?;
            let r = self
                .http
                .get(&url)
                .header("X-Auth-Token", service.expose())
                .header("X-Subject-Token", subject.clone())
                .send()
                .await
                .map_err(|e| {
                    warn!(url = %url, error = %e, "inspector API: Keystone is unreachable");
                    unavailable()
                })?;
            let status = r.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(Verdict::Invalid);
            }
            if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
                warn!(status = status.as_u16(), "inspector API: Keystone refused the service token; renewing it");
                continue;
            }
            if !status.is_success() {
                warn!(url = %url, status = status.as_u16(), "inspector API: Keystone cannot validate tokens");
                return Err(unavailable());
            }
            let body: Value = r.json().await.map_err(|e| {
                warn!(error = %e, "inspector API: Keystone's token validation is not JSON");
                unavailable()
            })?;
            return Ok(self.verdict(&body));
        }
        error!("inspector API: Keystone refused a freshly issued service token");
        Err(unavailable())
    }

    fn verdict(&self, body: &Value) -> Verdict {
        let t = &body["token"];
        let Some(expires_ms) = t["expires_at"].as_str().and_then(parse_timestamp_ms) else {
            return Verdict::Invalid;
        };
        let user = t["user"]["name"].as_str().or_else(|| t["user"]["id"].as_str()).unwrap_or("?").to_string();
        let roles: Vec<String> = t["roles"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str()).map(str::to_ascii_lowercase).collect())
            .unwrap_or_default();
        let role_ok = self.roles.is_empty() || roles.iter().any(|r| self.roles.contains(r));
        Verdict::Valid { user, expires_ms, role_ok }
    }

    /// The service token, from the cache unless `renew` or about to expire.
    async fn service_token(&self, renew: bool) -> Result<Secret, String> {
        let mut held = self.service_token.lock().await;
        if !renew {
            if let Some((t, until)) = held.as_ref() {
                if *until > Instant::now() {
                    return Ok(t.clone());
                }
            }
        }
        let (token, until) = match &self.identity {
            ServiceIdentity::TokenFile(path) => {
                let token = first_line(path)?;
                // Kept until Keystone refuses it.
                (token, Instant::now() + Duration::from_secs(365 * 86_400))
            }
            ServiceIdentity::Password { user, password, user_domain, project, project_domain } => {
                self.login(user, password, user_domain, project, project_domain).await?
            }
            ServiceIdentity::PasswordFile { user, file, user_domain, project, project_domain } => {
                let password = first_line(file)?;
                self.login(user, &password, user_domain, project, project_domain).await?
            }
        };
        *held = Some((token.clone(), until));
        Ok(token)
    }

    /// `POST /v3/auth/tokens` with the password method, scoped to the project.
    async fn login(
        &self,
        user: &str,
        password: &Secret,
        user_domain: &str,
        project: &str,
        project_domain: &str,
    ) -> Result<(Secret, Instant), String> {
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": user, "password": password.expose(), "domain": {"name": user_domain}}}},
            "scope": {"project": {"name": project, "domain": {"name": project_domain}}}
        }});
        let url = format!("{}/auth/tokens", self.base);
        let r = self.http.post(&url).json(&body).send().await.map_err(|e| format!("{url}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("{url} answered {} to the service user {user:?}", r.status()));
        }
        let token = r
            .headers()
            .get("X-Subject-Token")
            .and_then(|h| h.to_str().ok())
            .map(Secret::new)
            .ok_or_else(|| format!("{url}: no X-Subject-Token in Keystone's answer"))?;
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let now = Instant::now();
        let until = match v["token"]["expires_at"].as_str().and_then(parse_timestamp_ms) {
            Some(ms) => {
                let left = Duration::from_millis(ms.saturating_sub(now_ms()));
                now + left.saturating_sub(RENEW_MARGIN).max(Duration::from_secs(5))
            }
            None => now + Duration::from_secs(300),
        };
        debug!(user = %user, "inspector API: Keystone service token issued");
        Ok((token, until))
    }
}

fn first_line(path: &str) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let line = text.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        return Err(format!("{path} is empty"));
    }
    Ok(Secret::new(line))
}

/// Milliseconds since the epoch of an ISO 8601 UTC time as Keystone writes it: `2025-01-31T12:00:00.000000Z`
/// (also without fraction, with `+00:00`, or without a zone, which Keystone means as UTC).
pub fn parse_timestamp_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00")).unwrap_or(s);
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, mo, day): (i64, u32, u32) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let (h, mi, sec): (u64, u64, u64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms_frac: u64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    let days = days_from_civil(y, mo, day);
    if days < 0 {
        return None;
    }
    Some(((days as u64 * 86_400) + h * 3600 + mi * 60 + sec) * 1000 + ms_frac)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keystone_timestamps() {
        assert_eq!(parse_timestamp_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_timestamp_ms("2000-02-29T00:00:00.000000Z"), Some(951_782_400_000));
        assert_eq!(parse_timestamp_ms("2023-11-14T22:13:20.123456Z"), Some(1_700_000_000_123));
        assert_eq!(parse_timestamp_ms("2023-11-14T22:13:20+00:00"), Some(1_700_000_000_000));
        assert_eq!(parse_timestamp_ms("2099-12-31T23:59:59"), Some(4_102_444_799_000));
        for bad in ["", "yesterday", "2023-13-01T00:00:00Z", "2023-11-14 22:13:20", "2023-11-14T22:13:20.x1Z"] {
            assert_eq!(parse_timestamp_ms(bad), None, "{bad:?}");
        }
        // Agrees with the formatter the inspector API prints with.
        for ms in [0u64, 951_782_400_000, 1_700_000_000_000, 4_102_444_799_000] {
            let printed = crate::inspector_api::iso8601(ms);
            assert_eq!(parse_timestamp_ms(&printed), Some(ms), "{printed}");
        }
    }

    #[test]
    fn v3_urls() {
        assert_eq!(v3_base("https://ks:5000"), "https://ks:5000/v3");
        assert_eq!(v3_base("https://ks:5000/v3/"), "https://ks:5000/v3");
        assert_eq!(v3_base("https://ks/identity"), "https://ks/identity/v3");
    }
}
