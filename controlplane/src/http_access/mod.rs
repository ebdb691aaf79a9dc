//! Who may call the ironic-inspector v1 REST API, and how often (its TLS: [`crate::tls`], [`crate::listener`]).
//!
//! - [`config`]: the `[inspector_api]` section ([`InspectorApiConfig`]).
//! - [`htpasswd`]: `http_basic`, an Apache htpasswd file of bcrypt entries.
//! - [`keystone`]: `keystone`, tokens validated against Keystone's `GET /v3/auth/tokens`.
//! - [`rate_limit`]: a token bucket per source address, for the unauthenticated `POST /v1/continue`.
//!
//! [`Authenticator`] is the configured strategy; the inspector API asks it about every operator call and turns a
//! [`Refusal`] into ironic-inspector's JSON error. Secrets (passwords, tokens, hashes) never reach a log line, a
//! reply or `--print-config`: they are [`Secret`]s or are only hashed with a per-process key for the caches.

pub mod config;
pub mod htpasswd;
pub mod keystone;
pub mod rate_limit;

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use base64::Engine as _;

pub use config::{AuthStrategy, InspectorApiConfig};

pub use ironguard_coord::Secret;
pub use ironguard_coord::secret::REDACTED;

/// The caller of an operator call, for the audit log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user name (`http_basic`, `keystone`), or `None` under `noauth`.
    pub user: Option<String>,
}

/// Why an operator call is refused: the status, the message for the reply, and a challenge header for 401s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// `WWW-Authenticate`, on 401s.
    pub challenge: Option<HeaderValue>,
}

impl Refusal {
    fn unauthorized(message: impl Into<String>, challenge: &HeaderValue) -> Self {
        Self { status: StatusCode::UNAUTHORIZED, message: message.into(), challenge: Some(challenge.clone()) }
    }

    fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), challenge: None }
    }
}

/// The configured authentication strategy, ready to check requests.
#[derive(Debug, Clone)]
pub enum Authenticator {
    NoAuth,
    HttpBasic(Arc<htpasswd::HtpasswdAuth>),
    Keystone(Arc<keystone::KeystoneAuth>),
}

/// Something in the `[inspector_api]` configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("[inspector_api] http_basic_auth_user_file: {0}")]
    Htpasswd(#[from] htpasswd::HtpasswdError),
    #[error("[inspector_api] keystone: {0}")]
    Keystone(#[from] keystone::KeystoneError),
    #[error("[inspector_api] TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

impl Authenticator {
    /// Builds the strategy `cfg` names, reading its files (a bad htpasswd line is an error naming its number).
    pub fn new(cfg: &InspectorApiConfig) -> Result<Self, AccessError> {
        Ok(match cfg.auth_strategy {
            AuthStrategy::Noauth => Authenticator::NoAuth,
            AuthStrategy::HttpBasic => {
                Authenticator::HttpBasic(Arc::new(htpasswd::HtpasswdAuth::open(&cfg.http_basic_auth_user_file)?))
            }
            AuthStrategy::Keystone => Authenticator::Keystone(Arc::new(keystone::KeystoneAuth::new(cfg)?)),
        })
    }

    pub fn strategy(&self) -> AuthStrategy {
        match self {
            Authenticator::NoAuth => AuthStrategy::Noauth,
            Authenticator::HttpBasic(_) => AuthStrategy::HttpBasic,
            Authenticator::Keystone(_) => AuthStrategy::Keystone,
        }
    }

    /// Decides about one operator call from its headers. Never logs a header's value.
    pub async fn check(&self, headers: &HeaderMap) -> Result<Identity, Refusal> {
        match self {
            Authenticator::NoAuth => Ok(Identity { user: None }),
            Authenticator::HttpBasic(auth) => {
                let (user, password) = basic_credentials(headers, auth.challenge())?;
                auth.verify(&user, &password).await?;
                Ok(Identity { user: Some(user) })
            }
            Authenticator::Keystone(auth) => {
                let token = match headers.get("X-Auth-Token").map(|v| v.to_str()) {
                    None => return Err(Refusal::unauthorized("Authentication required", auth.challenge())),
                    Some(Err(_)) => return Err(Refusal::unauthorized("Invalid token", auth.challenge())),
                    Some(Ok(t)) if t.trim().is_empty() => {
                        return Err(Refusal::unauthorized("Authentication required", auth.challenge()));
                    }
                    Some(Ok(t)) => t.trim(),
                };
                let user = auth.check(token).await?;
                Ok(Identity { user: Some(user) })
            }
        }
    }
}

/// The user and password of an `Authorization: Basic` header: 401 when it is missing, 400 when it cannot be
/// parsed or is another scheme (as Ironic's basic-auth middleware answers).
fn basic_credentials(headers: &HeaderMap, challenge: &HeaderValue) -> Result<(String, Vec<u8>), Refusal> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(Refusal::unauthorized("Authorization required", challenge));
    };
    let unparsable = || Refusal::status(StatusCode::BAD_REQUEST, "Could not parse Authorization header");
    let value = value.to_str().map_err(|_| unparsable())?;
    let (scheme, token) = value.trim().split_once(char::is_whitespace).ok_or_else(unparsable)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(Refusal::status(StatusCode::BAD_REQUEST, "Unsupported authorization type: only Basic is accepted"));
    }
    let undecodable = || Refusal::status(StatusCode::BAD_REQUEST, "Could not decode authorization token");
    let pair = base64::engine::general_purpose::STANDARD.decode(token.trim()).map_err(|_| undecodable())?;
    let colon = pair.iter().position(|b| *b == b':').ok_or_else(undecodable)?;
    let user = String::from_utf8(pair[..colon].to_vec()).map_err(|_| undecodable())?;
    Ok((user, pair[colon + 1..].to_vec()))
}

/// A per-process keyed hash (HMAC-SHA-256) for cache keys: the caches never hold a password or a token, and a
/// key cannot be computed or tested without the process's random key.
#[derive(Debug)]
struct CacheKeyer(ring::hmac::Key);

impl CacheKeyer {
    fn new() -> Self {
        let mut key = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut key[..]);
        Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key))
    }

    fn key(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = ring::hmac::Context::with_key(&self.0);
        for p in parts {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            ctx.update(&(p.len() as u64).to_be_bytes());
            ctx.update(p);
        }
        let tag = ctx.sign();
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn basic_headers() {
        let ch = HeaderValue::from_static("Basic realm=\"ironguard\"");
        let enc = base64::engine::general_purpose::STANDARD.encode("op:pa:ss");
        assert_eq!(basic_credentials(&basic(&format!("Basic {enc}")), &ch).unwrap(), ("op".into(), b"pa:ss".to_vec()));
        assert_eq!(basic_credentials(&basic(&format!("basic  {enc}")), &ch).unwrap().0, "op");
        assert_eq!(basic_credentials(&HeaderMap::new(), &ch).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(basic_credentials(&basic("Basic"), &ch).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(basic_credentials(&basic("Bearer abc"), &ch).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(basic_credentials(&basic("Basic !!!"), &ch).unwrap_err().status, StatusCode::BAD_REQUEST);
        let no_colon = base64::engine::general_purpose::STANDARD.encode("op");
        assert_eq!(basic_credentials(&basic(&format!("Basic {no_colon}")), &ch).unwrap_err().status, 400);
    }

    #[test]
    fn secrets_are_redacted_when_printed() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"<redacted>\"");
        assert_eq!(serde_json::to_string(&Secret::default()).unwrap(), "\"\"");
        let back: Secret = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(back.expose(), "hunter2");
    }

    #[test]
    fn cache_keys_are_keyed_and_unambiguous() {
        let k = CacheKeyer::new();
        assert_eq!(k.key(&[b"a", b"bc"]), k.key(&[b"a", b"bc"]));
        assert_ne!(k.key(&[b"ab", b"c"]), k.key(&[b"a", b"bc"]));
        assert_ne!(CacheKeyer::new().key(&[b"a"]), k.key(&[b"a"]), "a new process, a new key");
    }
}
