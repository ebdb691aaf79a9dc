//! The ironic-inspector v1 REST API, so that ironic-python-agent (`POST /v1/continue`) and
//! `openstack baremetal introspection ...` work against ironguard unchanged. A thin layer over the inspection
//! engine; off unless `[server] inspector_listen` is set (ironic-inspector's port is 5050).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::inspection::engine::{ApiError, Engine};
use crate::inspection::machine::State as IState;
use crate::inspection::process::StoredData;
use crate::inspection::records::NodeRecord;
use crate::inspection::service::MAX_DATA_BYTES;

/// The API version ironguard implements (ironic-inspector's last).
pub const MAX_VERSION: &str = "1.18";

/// Largest introspection rule accepted.
pub const MAX_RULE_BYTES: usize = 1 << 20;

#[derive(Clone)]
struct Api {
    engine: Arc<Engine>,
}

/// The router, mounted at `/`.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/v1", get(v1))
        .route("/v1/", get(v1))
        .route("/v1/introspection", get(list))
        .route("/v1/introspection/{node}", get(status).post(start))
        .route("/v1/introspection/{node}/abort", post(abort))
        .route("/v1/introspection/{node}/data", get(data))
        .route("/v1/introspection/{node}/data/unprocessed", get(unprocessed_data).post(reapply))
        .route("/v1/continue", post(continue_))
        .route("/v1/rules", get(list_rules).post(create_rule).delete(delete_all_rules))
        .route("/v1/rules/{uuid}", get(get_rule).delete(delete_rule))
        // One byte over the cap reaches `continue_`, which answers with a JSON error like every other.
        .layer(DefaultBodyLimit::max(MAX_DATA_BYTES + 1))
        .with_state(Api { engine })
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
        | ApiError::BadRule(_) => StatusCode::BAD_REQUEST,
        ApiError::RuleExists(_) => StatusCode::CONFLICT,
        ApiError::NoIronic | ApiError::Ironic(_) => StatusCode::SERVICE_UNAVAILABLE,
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
    match api.engine.store.get(node).await {
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

async fn start(State(api): State<Api>, Path(node): Path<String>, Query(q): Query<HashMap<String, String>>) -> Response {
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

async fn status(State(api): State<Api>, Path(node): Path<String>) -> Response {
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

async fn abort(State(api): State<Api>, Path(node): Path<String>) -> Response {
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

async fn data(State(api): State<Api>, Path(node): Path<String>) -> Response {
    stored_data(&api, &node, false).await
}

async fn unprocessed_data(State(api): State<Api>, Path(node): Path<String>) -> Response {
    stored_data(&api, &node, true).await
}

async fn reapply(State(api): State<Api>, Path(node): Path<String>) -> Response {
    let node = uuid(&api, &node).await;
    match api.engine.reapply(&node).await {
        Ok(_) => (StatusCode::ACCEPTED, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

/// `POST /v1/continue[?node_uuid=...]`: the ramdisk's data. `node_uuid` (as Ironic's `continue_inspection` takes
/// it) restricts the lookup to that node.
async fn continue_(State(api): State<Api>, Query(q): Query<HashMap<String, String>>, body: Bytes) -> Response {
    if body.len() > MAX_DATA_BYTES {
        let msg = format!("introspection data is over {MAX_DATA_BYTES} bytes");
        return error(StatusCode::PAYLOAD_TOO_LARGE, msg);
    }
    let data: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("introspection data is not JSON: {e}")),
    };
    match api.engine.continue_inspection(data, q.get("node_uuid").cloned()).await {
        Ok(uuid) => reply(StatusCode::OK, json!({"uuid": uuid})),
        Err(e) => api_error(e),
    }
}

fn rule_links(mut v: Value) -> Value {
    let href = format!("/v1/rules/{}", v["uuid"].as_str().unwrap_or_default());
    v["links"] = json!([{"href": href, "rel": "self"}]);
    v
}

/// `POST /v1/rules`: 201 with the rule (200 below API 1.6, as ironic-inspector), 400 for an invalid rule,
/// 409 for a uuid taken.
async fn create_rule(State(api): State<Api>, h: HeaderMap, body: Bytes) -> Response {
    let version = match requested_version(&h) {
        Ok(v) => v,
        Err((code, msg)) => return error(code, msg),
    };
    if body.len() > MAX_RULE_BYTES {
        return error(StatusCode::PAYLOAD_TOO_LARGE, format!("a rule is at most {MAX_RULE_BYTES} bytes"));
    }
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

async fn get_rule(State(api): State<Api>, Path(uuid): Path<String>) -> Response {
    match api.engine.get_rule(&uuid).await {
        Ok(rule) => reply(StatusCode::OK, rule_links(rule.full())),
        Err(e) => api_error(e),
    }
}

async fn delete_rule(State(api): State<Api>, Path(uuid): Path<String>) -> Response {
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
