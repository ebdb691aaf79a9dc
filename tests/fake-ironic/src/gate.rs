//! The layer in front of every Ironic API request, in this order: record the [`crate::Call`], apply the first
//! matching [`crate::Fault`] (latency, then maybe an error), check authentication, check the requested
//! microversion; then stamp `/v1` responses with Ironic's version headers. `/_fake/...` requests skip all of it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::Instrument as _;

use crate::error::ApiError;
use crate::model::{Fault, new_uuid};
use crate::server::Shared;

pub(crate) const VERSION_HEADER: &str = "x-openstack-ironic-api-version";
const MIN_VERSION_HEADER: &str = "x-openstack-ironic-api-minimum-version";
const MAX_VERSION_HEADER: &str = "x-openstack-ironic-api-maximum-version";
/// The service-neutral microversion header (`OpenStack-API-Version: baremetal 1.x`), also accepted by Ironic.
const GENERIC_VERSION_HEADER: &str = "openstack-api-version";

pub(crate) async fn gate(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    if path == "/_fake" || path.starts_with("/_fake/") {
        return next.run(req).await;
    }
    let method = req.method().as_str().to_owned();
    let path_and_query = req.uri().path_and_query().map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
    let requested = requested_version(req.headers());
    let fault = {
        let mut store = shared.store();
        store.record_call(&method, &path_and_query, requested.clone());
        store.take_fault(&method, &path_and_query)
    };
    let span = tracing::debug_span!("request", %method, path = %path_and_query);
    answer(shared, req, next, fault, requested, method, path).instrument(span).await
}

async fn answer(
    shared: Arc<Shared>,
    mut req: Request,
    next: Next,
    fault: Option<Fault>,
    requested: Option<String>,
    method: String,
    path: String,
) -> Response {
    let is_v1 = path == "/v1" || path.starts_with("/v1/");
    // Decided up front so that every /v1 answer (a fault's too) carries the version the request asked for.
    let version = if is_v1 { check_version(&shared, requested.as_deref()) } else { Ok(String::new()) };
    let effective = version.as_ref().map_or_else(|_| shared.config.min_version.clone(), Clone::clone);
    let mut resp = 'answer: {
        if let Some(fault) = fault {
            if fault.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
            }
            if fault.status != 0 {
                tracing::debug!(status = fault.status, "injected fault");
                break 'answer fault_response(&fault, &method, &path).into_response();
            }
        }
        if !is_public(&path) && !authorized(&shared, req.headers()) {
            break 'answer unauthorized(&shared);
        }
        match &version {
            Err(e) => break 'answer e.clone().into_response(),
            Ok(v) if is_v1 => {
                req.extensions_mut().insert(ApiVersion(parse_version(v).map_or(1, |(_, minor)| minor)));
            }
            Ok(_) => {}
        }
        next.run(req).await
    };

    let headers = resp.headers_mut();
    if is_v1 {
        insert(headers, MIN_VERSION_HEADER, &shared.config.min_version);
        insert(headers, MAX_VERSION_HEADER, &shared.config.max_version);
        insert(headers, VERSION_HEADER, &effective);
    }
    insert(headers, "openstack-request-id", &format!("req-{}", new_uuid()));
    resp
}

/// The microversion a `/v1` request is served at (its minor number; the major is always 1), for the handlers
/// whose behaviour depends on it. Outside `/v1` (or if the gate did not run) it is 1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ApiVersion(pub(crate) u32);

impl ApiVersion {
    /// Whether the request's microversion is at least 1.`minor`.
    pub(crate) fn at_least(self, minor: u32) -> bool {
        self.0 >= minor
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ApiVersion {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<ApiVersion>().copied().unwrap_or(ApiVersion(1)))
    }
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// The microversion the client asked for, as sent.
fn requested_version(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers.get(VERSION_HEADER) {
        return Some(String::from_utf8_lossy(v.as_bytes()).trim().to_owned());
    }
    let generic = headers.get(GENERIC_VERSION_HEADER)?.to_str().ok()?;
    match generic.split_whitespace().collect::<Vec<_>>()[..] {
        [service, version] if service.eq_ignore_ascii_case("baremetal") => Some(version.to_owned()),
        _ => None,
    }
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The microversion a request is served at, or Ironic's 406 when it asked for one out of range (or unparsable).
fn check_version(shared: &Shared, requested: Option<&str>) -> Result<String, ApiError> {
    let config = &shared.config;
    let Some(requested) = requested else { return Ok(config.min_version.clone()) };
    if requested.eq_ignore_ascii_case("latest") {
        return Ok(config.max_version.clone());
    }
    let Some(version) = parse_version(requested) else {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "Invalid value for X-OpenStack-Ironic-API-Version header",
        ));
    };
    let min = parse_version(&config.min_version).unwrap_or((1, 1));
    let max = parse_version(&config.max_version).unwrap_or((1, 1));
    if version < min || version > max {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "Version {requested} was requested but the minor version is not supported by this service. The \
                 supported version range is: [{}, {}].",
                config.min_version, config.max_version
            ),
        ));
    }
    Ok(format!("{}.{}", version.0, version.1))
}

/// The API roots are readable without credentials, as in Ironic (keystonemiddleware's public routes).
fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/v1" | "/v1/")
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let config = &shared.config;
    if config.require_basic_auth.is_none() && config.require_token.is_none() {
        return true;
    }
    let basic_ok = config.require_basic_auth.as_ref().is_some_and(|(user, password)| {
        let expected = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
        headers.get(header::AUTHORIZATION).is_some_and(|h| h.as_bytes() == expected.as_bytes())
    });
    let token_ok = config
        .require_token
        .as_ref()
        .is_some_and(|token| headers.get("x-auth-token").is_some_and(|h| h.as_bytes() == token.as_bytes()));
    basic_ok || token_ok
}

fn unauthorized(shared: &Shared) -> Response {
    let body = json!({"error": {
        "code": 401,
        "title": "Unauthorized",
        "message": "The request you have made requires authentication.",
    }});
    let mut resp = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    if shared.config.require_basic_auth.is_some() {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"Baremetal API\""));
    }
    resp
}

fn fault_response(fault: &Fault, method: &str, path: &str) -> ApiError {
    match fault.status {
        409 => ApiError::node_locked(node_ident(path).unwrap_or("unknown")),
        503 => ApiError::service_unavailable(),
        status => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            ApiError::new(status, format!("Fault injected by fake-ironic: {} on {method} {path}", status.as_u16()))
        }
    }
}

/// `X` in `/v1/nodes/X/...`.
fn node_ident(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/nodes/")?.split('/').next().filter(|s| !s.is_empty())
}

/// Standard base64 with padding (RFC 4648), enough to build the expected `Authorization: Basic` value.
pub(crate) fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, encoded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn versions_compare_numerically() {
        let shared = Shared::new(crate::FakeIronicConfig::default(), ([127, 0, 0, 1], 0).into());
        assert_eq!(check_version(&shared, None).unwrap(), "1.1");
        assert_eq!(check_version(&shared, Some("1.9")).unwrap(), "1.9");
        assert_eq!(check_version(&shared, Some("latest")).unwrap(), "1.81");
        assert_eq!(check_version(&shared, Some("1.82")).unwrap_err().status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(check_version(&shared, Some("2.0")).unwrap_err().status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(check_version(&shared, Some("1.0")).unwrap_err().status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(check_version(&shared, Some("x")).unwrap_err().status, StatusCode::NOT_ACCEPTABLE);
    }

    #[test]
    fn node_ident_from_path() {
        assert_eq!(node_ident("/v1/nodes/abc/states/power"), Some("abc"));
        assert_eq!(node_ident("/v1/nodes"), None);
    }
}
