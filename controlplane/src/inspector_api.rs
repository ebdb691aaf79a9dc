//! The ironic-inspector v1 REST API, so that ironic-python-agent (`POST /v1/continue`) and
//! `openstack baremetal introspection ...` work against ironguard unchanged. A thin layer over the inspection
//! engine; off unless `[server] inspector_listen` is set (ironic-inspector's port is 5050).
//!
//! Access follows ironic-inspector and Ironic standalone ([`crate::http_access`], `[inspector_api]`): `GET /`,
//! `GET /v1` and `POST /v1/continue` are open to anyone; every other call is an operator call, checked by the
//! configured `auth_strategy` before its handler runs (so a refused call reads no body and changes nothing).
//! `POST /v1/continue` has a body limit (413), a per-source rate limit (429), and replies that name no node but
//! the caller's own. [`InspectorListener`] binds the listener, with TLS when configured, and serves the router.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use ironguard_inspection::bounded::{self, Bounds, BoundsError};
use ironguard_inspection::lookup::LookupError;
use ironguard_inspection::machine::State as IState;
use ironguard_inspection::records::NodeRecord;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::{debug, info, warn};

use crate::http_access::rate_limit::RateLimiter;
use crate::http_access::{AccessError, AuthStrategy, Authenticator, InspectorApiConfig, Refusal};
use crate::inspection::engine::{ApiError, Engine, Poster};
use crate::inspection::process::StoredData;
use crate::listener::{Incoming, Limits};
use crate::tls::ServerTls;

/// The API version ironguard implements (ironic-inspector's last).
pub const MAX_VERSION: &str = "1.18";

/// Largest introspection rule accepted.
pub const MAX_RULE_BYTES: usize = 1 << 20;

/// How long a `/v1/continue` body waits for room in `continue_memory_mib` before it is answered 503.
const BUDGET_WAIT: Duration = Duration::from_secs(2);
/// The first bytes of every body are not taken from `continue_memory_mib`: a small callback (an inventory without
/// its logs) never waits for room behind maximum bodies. Bounded by the open connections (at most 384: 24 MiB).
const FREE_PER_BODY: usize = 64 << 10;
/// Bodies up to this size are parsed in a lane of their own (`continue_workers` of them at once).
const SMALL_BODY: usize = 1 << 20;
/// How long a client may take to send a request's headers, from its connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// After a body is found over its limit, this much more is read and dropped (for at most [`DRAIN_TIME`]) so that
/// the client gets the 413 rather than a reset connection.
const DRAIN_BYTES: usize = 32 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// The reply to a `/v1/continue` call whose node is not waiting for data: the same whatever the node's state, and
/// naming no node.
const NOT_WAITING: &str = "The following failures happened during running pre-processing hooks:\n\
                           Look up error: No node is waiting for introspection data from this machine";

/// How the API is guarded: authentication for operator calls, limits for `/v1/continue`.
#[derive(Debug)]
pub struct Access {
    pub auth: Authenticator,
    pub continue_max_bytes: usize,
    pub continue_rate: RateLimiter,
    /// Failed operator authentications per source (`auth_failure_burst`, then `auth_failures_per_minute`): a source
    /// past it is answered 429 before any bcrypt or Keystone check, so junk credentials cannot drive those checks
    /// one for one. Callers whose credentials are right never spend from it.
    pub auth_failures: RateLimiter,
    /// `continue_memory_mib`, in KiB permits: what the bodies being read and parsed hold.
    continue_budget: Semaphore,
    continue_budget_kib: usize,
    /// `continue_workers`: bodies parsed and looked up at once, larger than [`SMALL_BODY`] and up to it.
    continue_workers: Semaphore,
    continue_small_workers: Semaphore,
    continue_bounds: Bounds,
    continue_read_timeout: Duration,
}

impl Access {
    /// From `[inspector_api]`, reading the files it names.
    pub fn new(cfg: &InspectorApiConfig) -> Result<Self, AccessError> {
        Ok(Self {
            auth: Authenticator::new(cfg)?,
            continue_max_bytes: cfg.continue_max_bytes,
            continue_rate: RateLimiter::new(cfg.continue_rate_per_minute, cfg.continue_rate_burst),
            auth_failures: RateLimiter::new(cfg.auth_failures_per_minute, cfg.auth_failure_burst),
            continue_budget: Semaphore::new(cfg.continue_memory_mib.saturating_mul(1024)),
            continue_budget_kib: cfg.continue_memory_mib.saturating_mul(1024),
            continue_workers: Semaphore::new(cfg.continue_workers),
            continue_small_workers: Semaphore::new(cfg.continue_workers),
            continue_bounds: Bounds { max_values: cfg.continue_max_values, ..Bounds::default() },
            continue_read_timeout: Duration::from_secs(cfg.continue_read_timeout_secs),
        })
    }
}

#[derive(Clone)]
struct Api {
    engine: Arc<Engine>,
    access: Arc<Access>,
}

/// The router, mounted at `/`. It needs the peer address ([`ConnectInfo`]) for `/v1/continue`'s rate limit:
/// serve it with `into_make_service_with_connect_info::<SocketAddr>()`, as [`InspectorListener::serve`] does.
pub fn router(engine: Arc<Engine>, access: Arc<Access>) -> Router {
    let api = Api { engine, access };
    let operator = Router::new()
        .route("/v1/introspection", get(list))
        .route("/v1/introspection/{node}", get(status).post(start))
        .route("/v1/introspection/{node}/abort", post(abort))
        .route("/v1/introspection/{node}/data", get(data))
        .route("/v1/introspection/{node}/data/unprocessed", get(unprocessed_data).post(reapply))
        .route("/v1/rules", get(list_rules).post(create_rule).delete(delete_all_rules))
        .route("/v1/rules/{uuid}", get(get_rule).delete(delete_rule))
        .method_not_allowed_fallback(method_not_allowed)
        // Around each route (405s included), before any handler or body extractor.
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), require_operator));
    Router::new()
        .route("/", get(root))
        .route("/v1", get(v1))
        .route("/v1/", get(v1))
        .route("/v1/continue", post(continue_))
        .method_not_allowed_fallback(method_not_allowed)
        .merge(operator)
        // No route: in ironic-inspector's error format too (axum's own is an empty body).
        .fallback(|| async { error(StatusCode::NOT_FOUND, "The requested URL was not found on the server") })
        // Bodies are read with `read_limited` and its own limits; this bounds any other extractor.
        .layer(DefaultBodyLimit::max(MAX_RULE_BYTES + 1))
        .with_state(api)
}

/// The inspector API's listener, bound and configured ([`InspectorListener::bind`] fails on a bad
/// `[inspector_api]`), ready to [`serve`](InspectorListener::serve).
pub struct InspectorListener {
    tcp: TcpListener,
    tls: Option<ServerTls>,
    access: Arc<Access>,
    local: SocketAddr,
}

impl std::fmt::Debug for InspectorListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InspectorListener").field("local", &self.local).field("tls", &self.tls.is_some()).finish()
    }
}

/// The inspector API cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error("binding the ironic-inspector API on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl InspectorListener {
    /// Reads `[inspector_api]`'s files (htpasswd, certificate and key, Keystone CA) and binds `addr`.
    pub async fn bind(addr: SocketAddr, cfg: &InspectorApiConfig) -> Result<Self, ListenError> {
        let access = Arc::new(Access::new(cfg)?);
        let tls = if cfg.tls() {
            Some(ServerTls::https(cfg.tls_cert_file.as_ref(), cfg.tls_key_file.as_ref()).map_err(AccessError::from)?)
        } else {
            None
        };
        let tcp = TcpListener::bind(addr).await.map_err(|source| ListenError::Bind { addr, source })?;
        let local = tcp.local_addr().map_err(|source| ListenError::Bind { addr, source })?;
        Ok(Self { tcp, tls, access, local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves the API until `shutdown` resolves.
    pub async fn serve(
        self,
        engine: Arc<Engine>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let strategy = self.access.auth.strategy();
        if strategy == AuthStrategy::Noauth {
            warn!(
                addr = %self.local,
                loopback = self.local.ip().is_loopback(),
                "ironic-inspector API with auth_strategy = noauth: anyone who can reach it may start, abort and read \
                 inspections and change introspection rules; set [inspector_api] auth_strategy"
            );
        }
        info!(addr = %self.local, tls = self.tls.is_some(), auth_strategy = strategy.as_str(), "ironic-inspector v1 API serving");
        let incoming = Incoming::new("inspector-api", self.tcp, self.tls, Limits::default())?;
        crate::listener::serve_http(incoming, router(engine, self.access), HEADER_READ_TIMEOUT, shutdown).await
    }
}

/// Lets an operator call through to its handler, or answers the refusal. A source whose failed authentications
/// are past their budget gets 429 before its credentials are checked.
async fn require_operator(State(api): State<Api>, req: Request, next: Next) -> Response {
    let source = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let Some(ip) = source {
        if let Err(wait) = api.access.auth_failures.peek(ip) {
            crate::refused!(
                "auth-failures",
                ip,
                "inspector API: too many failed authentications from this address (429), credentials not checked; a client with a wrong password, or someone guessing"
            );
            return too_many("Too many failed authentication attempts from this address", wait);
        }
    }
    match api.access.auth.check(req.headers()).await {
        Ok(id) => {
            let user = id.user.as_deref().unwrap_or("-");
            if matches!(*req.method(), Method::GET | Method::HEAD) {
                debug!(user, method = %req.method(), path = %req.uri().path(), "inspector API: operator call");
            } else {
                info!(user, method = %req.method(), path = %req.uri().path(), "inspector API: operator call");
            }
            next.run(req).await
        }
        Err(r) => {
            if let (Some(ip), StatusCode::UNAUTHORIZED) = (source, r.status) {
                let _ = api.access.auth_failures.check(ip);
            }
            refusal(r)
        }
    }
}

/// 429 with `what; retry in N s` and `Retry-After: N` (the wait rounded up, at least 1 s).
fn too_many(what: &str, wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut resp = error(StatusCode::TOO_MANY_REQUESTS, format!("{what}; retry in {secs} s"));
    resp.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    resp
}

fn refusal(r: Refusal) -> Response {
    let mut resp = error(r.status, r.message);
    if let Some(c) = r.challenge {
        resp.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, c);
    }
    resp
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("X-OpenStack-Ironic-Inspector-API-Minimum-Version", HeaderValue::from_static("1.0"));
    h.insert("X-OpenStack-Ironic-Inspector-API-Maximum-Version", HeaderValue::from_static(MAX_VERSION));
    h.insert("X-OpenStack-Ironic-Inspector-API-Version", HeaderValue::from_static(MAX_VERSION));
    h
}

fn reply(code: StatusCode, body: Value) -> Response {
    (code, headers(), axum::Json(body)).into_response()
}

/// A route with another method: JSON, as every other error (axum's own 405 has an empty body).
async fn method_not_allowed() -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "The method is not allowed for the requested URL")
}

/// One path parameter (a node or rule identifier). A rejection — a segment that decodes to invalid UTF-8 — is
/// answered as every other error, in JSON.
struct Param(String);

impl<S: Send + Sync> FromRequestParts<S> for Param {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Response> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(p)) => Ok(Param(p)),
            Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("Invalid URL: {}", e.body_text()))),
        }
    }
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    reply(code, json!({"error": {"message": msg.into()}}))
}

/// ironic-inspector's status codes: lookup and pre-processing failures are 400 (its functional tests expect
/// it), an unknown node or rule 404, a rule uuid taken 409.
fn api_error(e: ApiError) -> Response {
    let code = match &e {
        ApiError::UnknownNode(_) | ApiError::NoMatch(_) | ApiError::UnknownRule(_) => StatusCode::NOT_FOUND,
        ApiError::ProvisionState { .. }
        | ApiError::Maintenance(_)
        | ApiError::Illegal { .. }
        | ApiError::NoData(_)
        | ApiError::BadData(_)
        | ApiError::PreProcessing(_)
        | ApiError::Lookup(_)
        | ApiError::Discovery(_)
        | ApiError::NoEvidence(_)
        | ApiError::BadRule(_) => StatusCode::BAD_REQUEST,
        ApiError::RuleExists(_) => StatusCode::CONFLICT,
        ApiError::NoIronic | ApiError::Ironic(_) | ApiError::EvidencePending(_) => StatusCode::SERVICE_UNAVAILABLE,
        ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if code.is_server_error() {
        tracing::warn!(error = %e, "ironic-inspector API request failed");
    }
    error(code, e.to_string())
}

/// The API version a request asks for (`X-OpenStack-Ironic-Inspector-API-Version`; absent: 1.0, `latest`: the
/// newest), as `(major, minor)`; `Err` is the status and message for a version ironguard does not speak (406) or a
/// malformed one (400).
fn requested_version(h: &HeaderMap) -> Result<(u32, u32), (StatusCode, String)> {
    let max = parse_version(MAX_VERSION).unwrap_or((1, 0));
    let Some(v) = h.get("X-OpenStack-Ironic-Inspector-API-Version") else { return Ok((1, 0)) };
    let v = v.to_str().unwrap_or_default().trim();
    if v.eq_ignore_ascii_case("latest") {
        return Ok(max);
    }
    match parse_version(v) {
        Some(r) if r >= (1, 0) && r <= max => Ok(r),
        Some(_) => Err((
            StatusCode::NOT_ACCEPTABLE,
            format!("Unsupported API version {v}, supported range is 1.0 to {MAX_VERSION}"),
        )),
        None => Err((StatusCode::BAD_REQUEST, format!("Malformed API version {v:?}: expected X.Y"))),
    }
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (a, b) = v.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) from milliseconds since the epoch, as ironic-inspector prints timestamps.
pub fn iso8601(ms: u64) -> String {
    let t = ironguard_proto::time::utc_fields(ms);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

fn status_json(r: &NodeRecord) -> Value {
    json!({
        "uuid": r.uuid,
        "state": r.state.as_str(),
        "finished": matches!(r.state, IState::Finished | IState::Error),
        "error": r.error,
        "started_at": r.started_at.map(iso8601),
        "finished_at": r.finished_at.map(iso8601),
        "links": [{"href": format!("/v1/introspection/{}", r.uuid), "rel": "self"}],
    })
}

async fn root() -> Response {
    reply(
        StatusCode::OK,
        json!({"versions": [{"id": MAX_VERSION, "status": "CURRENT", "links": [{"href": "/v1", "rel": "self"}]}]}),
    )
}

async fn v1() -> Response {
    reply(
        StatusCode::OK,
        json!({"resources": [
            {"name": "introspection", "links": [{"href": "/v1/introspection", "rel": "self"}]},
            {"name": "continue", "links": [{"href": "/v1/continue", "rel": "self"}]},
            {"name": "rules", "links": [{"href": "/v1/rules", "rel": "self"}]}
        ]}),
    )
}

async fn record(api: &Api, node: &str) -> Result<NodeRecord, Response> {
    match api.engine.status(node).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(error(StatusCode::NOT_FOUND, format!("Node {node} was not found"))),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// Inspection records are keyed by UUID; resolve a name through Ironic.
async fn uuid(api: &Api, node: &str) -> String {
    if let Ok(Some(_)) = api.engine.store.get(node).await {
        return node.to_string();
    }
    if let Some(i) = &api.engine.ironic {
        if let Ok(n) = i.get_node(node).await {
            return n.uuid;
        }
    }
    node.to_string()
}

async fn start(State(api): State<Api>, Param(node): Param, Query(q): Query<HashMap<String, String>>) -> Response {
    let manage_boot = match q.get("manage_boot").map(|s| s.to_ascii_lowercase()) {
        None => true,
        Some(v) if matches!(v.as_str(), "true" | "1" | "yes") => true,
        Some(v) if matches!(v.as_str(), "false" | "0" | "no") => false,
        Some(v) => return error(StatusCode::BAD_REQUEST, format!("manage_boot must be a boolean, not {v:?}")),
    };
    match api.engine.start(&node, manage_boot, false).await {
        Ok(_) => (StatusCode::ACCEPTED, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

async fn status(State(api): State<Api>, Param(node): Param) -> Response {
    let node = uuid(&api, &node).await;
    match record(&api, &node).await {
        Ok(r) => reply(StatusCode::OK, status_json(&r)),
        Err(resp) => resp,
    }
}

async fn list(State(api): State<Api>, Query(q): Query<HashMap<String, String>>) -> Response {
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => 1000,
        Some(Ok(0)) | Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "limit must be a positive integer"),
        Some(Ok(n)) => n.min(1000),
    };
    let state = match q.get("state").map(|s| s.parse::<IState>()) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, e),
    };
    let mut all = match api.engine.store.list().await {
        Ok(a) => a,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // Newest first, like ironic-inspector (sorted by start time).
    all.sort_by(|a, b| b.started_at.cmp(&a.started_at).then(a.uuid.cmp(&b.uuid)));
    let mut items: Vec<&NodeRecord> = all.iter().filter(|r| state.is_none_or(|s| r.state == s)).collect();
    if let Some(marker) = q.get("marker") {
        match items.iter().position(|r| &r.uuid == marker) {
            Some(i) => items = items.split_off(i + 1),
            None => return error(StatusCode::BAD_REQUEST, format!("marker {marker} not found")),
        }
    }
    items.truncate(limit);
    reply(StatusCode::OK, json!({"introspection": items.iter().map(|r| status_json(r)).collect::<Vec<_>>()}))
}

async fn abort(State(api): State<Api>, Param(node): Param) -> Response {
    let node = uuid(&api, &node).await;
    match api.engine.abort(&node).await {
        Ok(_) => (StatusCode::ACCEPTED, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

/// The stored data: `processed` (after the hooks, without `logs`) for `/data`, what the ramdisk sent for
/// `/data/unprocessed`.
async fn stored_data(api: &Api, node: &str, unprocessed: bool) -> Response {
    let node = uuid(api, node).await;
    match api.engine.store.get_data(&node).await {
        Ok(Some(d)) => {
            let d = StoredData::from_value(d);
            reply(StatusCode::OK, if unprocessed { d.unprocessed } else { d.processed })
        }
        Ok(None) => error(StatusCode::NOT_FOUND, format!("Introspection data not found for node {node}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn data(State(api): State<Api>, Param(node): Param) -> Response {
    stored_data(&api, &node, false).await
}

async fn unprocessed_data(State(api): State<Api>, Param(node): Param) -> Response {
    stored_data(&api, &node, true).await
}

async fn reapply(State(api): State<Api>, Param(node): Param) -> Response {
    let node = uuid(&api, &node).await;
    match api.engine.reapply(&node).await {
        Ok(_) => (StatusCode::ACCEPTED, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

/// `POST /v1/continue[?node_uuid=...]`: the ramdisk's data. `node_uuid` (as Ironic's `continue_inspection` takes
/// it) restricts the lookup to that node. Unauthenticated, as ironic-python-agent needs: rate-limited per source
/// (429), bounded (413), and answered without naming any node but the one the data is accepted for.
async fn continue_(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(wait) = api.access.continue_rate.check(peer.ip()) {
        crate::refused!(
            "continue-rate",
            peer.ip(),
            "inspector API: /v1/continue over the rate limit (429); a ramdisk retrying too fast, or a flood: raise [inspector_api] continue_rate_per_minute and continue_rate_burst only if real nodes hit it"
        );
        return too_many("Too many introspection data submissions from this address", wait);
    }
    let limit = api.access.continue_max_bytes;
    let access = &api.access;
    let deadline = tokio::time::Instant::now() + access.continue_read_timeout;
    let budget = Budget { pool: &access.continue_budget, total_kib: access.continue_budget_kib };
    let (body, held) = match read_limited(body, &headers, limit, Some(budget), deadline).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            crate::refused!(
                "continue-too-large",
                peer.ip(),
                limit,
                "inspector API: /v1/continue body over the limit (413); raise [inspector_api] continue_max_bytes if real inventories are this large"
            );
            return error(StatusCode::PAYLOAD_TOO_LARGE, format!("introspection data is over {limit} bytes"));
        }
        Err(BodyError::Slow) => {
            crate::refused!(
                "continue-slow",
                peer.ip(),
                "inspector API: /v1/continue body too slow to arrive (408); raise [inspector_api] continue_read_timeout_secs only if real nodes hit it"
            );
            return error(StatusCode::REQUEST_TIMEOUT, "the introspection data took too long to arrive");
        }
        Err(BodyError::Busy) => {
            crate::refused!(
                "continue-busy",
                peer.ip(),
                "inspector API: /v1/continue answered 503: bodies being read fill [inspector_api] continue_memory_mib (a flood, or many large inventories at once)"
            );
            let mut resp =
                error(StatusCode::SERVICE_UNAVAILABLE, "too much introspection data arriving at once; retry");
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(5));
            return resp;
        }
        Err(BodyError::Read(e)) => {
            return error(StatusCode::BAD_REQUEST, format!("cannot read the introspection data: {e}"));
        }
    };
    // Small bodies (every inventory without its logs) have a lane of their own: maximum bodies cannot queue them.
    let lane = if body.len() <= SMALL_BODY { &access.continue_small_workers } else { &access.continue_workers };
    let Ok(_turn) = lane.acquire().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    };
    let data = match bounded::parse_callback(&body, access.continue_bounds) {
        Ok(v) => v,
        Err(e @ (BoundsError::TooManyValues(_) | BoundsError::TooDeep(_))) => {
            crate::refused!(
                "continue-too-complex",
                peer.ip(),
                "inspector API: /v1/continue body over its bounds (400); raise [inspector_api] continue_max_values only if real inventories are this large"
            );
            return error(StatusCode::BAD_REQUEST, e.to_string());
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let accepted = api
        .engine
        .continue_inspection(data, &body, q.get("node_uuid").cloned(), Poster::Ramdisk { from: peer.ip() })
        .await;
    drop((body, held));
    match accepted {
        Ok(uuid) => reply(StatusCode::OK, json!({"uuid": uuid})),
        Err(e) => continue_error(e, peer),
    }
}

/// `/v1/continue`'s errors, without another node's UUID, MACs or BMC address: what the caller sent about itself
/// (bad data, its pre-processing failures, "Could not find a node for attributes <its own>", a tie) is answered
/// as ironic-inspector does; a node that is not waiting (finished, starting, processing, ...) gets one message
/// whatever its state; refusals to enroll and internal failures are answered generically and logged.
fn continue_error(e: ApiError, peer: SocketAddr) -> Response {
    match &e {
        ApiError::BadData(_)
        | ApiError::PreProcessing(_)
        | ApiError::Lookup(LookupError::NotFound(_) | LookupError::Tie { .. }) => api_error(e),
        ApiError::Lookup(LookupError::Finished { node }) | ApiError::Illegal { node, .. } => {
            info!(peer = %peer.ip(), node = %node, error = %e, "inspector API: introspection data refused: not waiting");
            error(StatusCode::BAD_REQUEST, NOT_WAITING)
        }
        // What the caller's own data said about its boot interface; the node it named is in the log only.
        ApiError::NoEvidence(_) => {
            warn!(peer = %peer.ip(), error = %e, "inspector API: introspection data refused: no evidence");
            api_error(e)
        }
        ApiError::EvidencePending(_) => {
            info!(peer = %peer.ip(), error = %e, "inspector API: introspection data not accepted yet: no evidence");
            let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(5));
            resp
        }
        ApiError::Discovery(_) => {
            info!(peer = %peer.ip(), error = %e, "inspector API: introspection data refused: not enrolled");
            error(
                StatusCode::BAD_REQUEST,
                "The following failures happened during running pre-processing hooks:\n\
                 Look up error: this machine cannot be enrolled: one of its MAC or BMC addresses already belongs \
                 to an Ironic node",
            )
        }
        ApiError::NoIronic | ApiError::Ironic(_) => {
            warn!(peer = %peer.ip(), error = %e, "inspector API: introspection data not accepted: Ironic failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "Ironic is unavailable; the data was not accepted, try again")
        }
        ApiError::Store(_) => {
            warn!(peer = %peer.ip(), error = %e, "inspector API: introspection data not accepted: store failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, "the data was not accepted; see the control plane's log")
        }
        _ => {
            info!(peer = %peer.ip(), error = %e, "inspector API: introspection data refused");
            error(StatusCode::BAD_REQUEST, NOT_WAITING)
        }
    }
}

#[derive(Debug)]
enum BodyError {
    TooLarge,
    /// Not all there by its deadline.
    Slow,
    /// No room in the memory budget.
    Busy,
    Read(String),
}

/// The memory budget bodies are read into: KiB permits, taken as bytes arrive.
#[derive(Clone, Copy)]
struct Budget<'a> {
    pool: &'a Semaphore,
    total_kib: usize,
}

/// The body if it is at most `limit` bytes and all there by `deadline`, with the part of `budget` it holds. A larger
/// one (by `Content-Length` or as it arrives) is read on and dropped for a while, keeping nothing, so that the
/// client reads the 413 instead of a reset. Room in `budget` is taken as bytes arrive, never ahead (a slow sender
/// holds what it sent); a body that waits [`BUDGET_WAIT`] for room gives back what it holds.
async fn read_limited<'a>(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: Option<Budget<'a>>,
    deadline: tokio::time::Instant,
) -> Result<(Bytes, Option<SemaphorePermit<'a>>), BodyError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut held: Option<SemaphorePermit<'a>> = None;
    if declared.is_none_or(|n| n <= limit as u64) {
        loop {
            let next = match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(n) => n,
                Err(_) => return Err(BodyError::Slow),
            };
            match next {
                None => return Ok((Bytes::from(buf), held)),
                Some(Err(e)) => return Err(BodyError::Read(e.to_string())),
                Some(Ok(chunk)) if buf.len() + chunk.len() <= limit => {
                    if let Some(b) = budget {
                        let charged = (buf.len() + chunk.len()).saturating_sub(FREE_PER_BODY).div_ceil(1024);
                        let want = charged.saturating_sub(held.as_ref().map_or(0, |p| p.num_permits()));
                        if want > 0 {
                            let wait = tokio::time::Instant::now() + BUDGET_WAIT;
                            let more = u32::try_from(want.min(b.total_kib)).map_err(|_| BodyError::Busy)?;
                            match tokio::time::timeout_at(wait.min(deadline), b.pool.acquire_many(more)).await {
                                Ok(Ok(p)) => match held.as_mut() {
                                    Some(h) => h.merge(p),
                                    None => held = Some(p),
                                },
                                Ok(Err(_)) | Err(_) => return Err(BodyError::Busy),
                            }
                        }
                    }
                    buf.extend_from_slice(&chunk);
                }
                Some(Ok(_)) => break,
            }
        }
    }
    drop((buf, held));
    let drain = async {
        let mut drained = 0usize;
        while let Some(Ok(chunk)) = stream.next().await {
            drained += chunk.len();
            if drained > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    Err(BodyError::TooLarge)
}

fn rule_links(mut v: Value) -> Value {
    let href = format!("/v1/rules/{}", v["uuid"].as_str().unwrap_or_default());
    v["links"] = json!([{"href": href, "rel": "self"}]);
    v
}

/// `POST /v1/rules`: 201 with the rule (200 below API 1.6, as ironic-inspector), 400 for an invalid rule,
/// 409 for a uuid taken.
async fn create_rule(State(api): State<Api>, h: HeaderMap, body: Body) -> Response {
    let version = match requested_version(&h) {
        Ok(v) => v,
        Err((code, msg)) => return error(code, msg),
    };
    let deadline = tokio::time::Instant::now() + api.access.continue_read_timeout;
    let body = match read_limited(body, &h, MAX_RULE_BYTES, None, deadline).await {
        Ok((b, _)) => b,
        Err(BodyError::TooLarge) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, format!("a rule is at most {MAX_RULE_BYTES} bytes"));
        }
        Err(BodyError::Slow) => return error(StatusCode::REQUEST_TIMEOUT, "the rule took too long to arrive"),
        Err(BodyError::Busy) => return error(StatusCode::SERVICE_UNAVAILABLE, "busy; retry"),
        Err(BodyError::Read(e)) => return error(StatusCode::BAD_REQUEST, format!("cannot read the rule: {e}")),
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the rule is not JSON: {e}")),
    };
    match api.engine.create_rule(&body).await {
        Ok(rule) => {
            let code = if version >= (1, 6) { StatusCode::CREATED } else { StatusCode::OK };
            reply(code, rule_links(rule.full()))
        }
        Err(e) => api_error(e),
    }
}

async fn list_rules(State(api): State<Api>) -> Response {
    match api.engine.list_rules().await {
        Ok(rules) => {
            reply(StatusCode::OK, json!({"rules": rules.iter().map(|r| rule_links(r.summary())).collect::<Vec<_>>()}))
        }
        Err(e) => api_error(e),
    }
}

async fn get_rule(State(api): State<Api>, Param(uuid): Param) -> Response {
    match api.engine.get_rule(&uuid).await {
        Ok(rule) => reply(StatusCode::OK, rule_links(rule.full())),
        Err(e) => api_error(e),
    }
}

async fn delete_rule(State(api): State<Api>, Param(uuid): Param) -> Response {
    match api.engine.delete_rule(&uuid).await {
        Ok(()) => (StatusCode::NO_CONTENT, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

async fn delete_all_rules(State(api): State<Api>) -> Response {
    match api.engine.delete_all_rules().await {
        Ok(_) => (StatusCode::NO_CONTENT, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00");
        assert_eq!(iso8601(1_700_000_000_123), "2023-11-14T22:13:20");
        assert_eq!(iso8601(4_102_444_799_000), "2099-12-31T23:59:59");
    }

    #[test]
    fn api_versions() {
        let mut h = HeaderMap::new();
        assert_eq!(requested_version(&h).ok(), Some((1, 0)), "absent: the minimum, as ironic-inspector");
        h.insert("X-OpenStack-Ironic-Inspector-API-Version", HeaderValue::from_static("latest"));
        assert_eq!(requested_version(&h).ok(), Some((1, 18)));
        h.insert("X-OpenStack-Ironic-Inspector-API-Version", HeaderValue::from_static("1.6"));
        assert_eq!(requested_version(&h).ok(), Some((1, 6)));
        h.insert("X-OpenStack-Ironic-Inspector-API-Version", HeaderValue::from_static("1.99"));
        assert_eq!(requested_version(&h).err().map(|r| r.0), Some(StatusCode::NOT_ACCEPTABLE));
        h.insert("X-OpenStack-Ironic-Inspector-API-Version", HeaderValue::from_static("one"));
        assert_eq!(requested_version(&h).err().map(|r| r.0), Some(StatusCode::BAD_REQUEST));
    }
}
