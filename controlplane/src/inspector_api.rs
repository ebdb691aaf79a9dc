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
use crate::inspection::records::NodeRecord;
use crate::inspection::service::MAX_DATA_BYTES;

/// The API version ironguard implements (ironic-inspector's last).
pub const MAX_VERSION: &str = "1.18";

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
        .route("/v1/introspection/{node}/data/unprocessed", post(reapply))
        .route("/v1/continue", post(continue_))
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

fn api_error(e: ApiError) -> Response {
    let code = match &e {
        ApiError::UnknownNode(_) | ApiError::NoMatch(_) => StatusCode::NOT_FOUND,
        ApiError::ProvisionState { .. } | ApiError::Illegal { .. } | ApiError::NoData(_) | ApiError::BadData(_) => {
            StatusCode::BAD_REQUEST
        }
        ApiError::NoIronic | ApiError::Ironic(_) => StatusCode::SERVICE_UNAVAILABLE,
        ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, e.to_string())
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
            {"name": "continue", "links": [{"href": "/v1/continue", "rel": "self"}]}
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
    match api.engine.start(&node, manage_boot).await {
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

async fn data(State(api): State<Api>, Path(node): Path<String>) -> Response {
    let node = uuid(&api, &node).await;
    match api.engine.store.get_data(&node).await {
        Ok(Some(d)) => reply(StatusCode::OK, d),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("Introspection data not found for node {node}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn reapply(State(api): State<Api>, Path(node): Path<String>) -> Response {
    let node = uuid(&api, &node).await;
    match api.engine.reapply(&node).await {
        Ok(_) => (StatusCode::ACCEPTED, headers()).into_response(),
        Err(e) => api_error(e),
    }
}

async fn continue_(State(api): State<Api>, body: Bytes) -> Response {
    if body.len() > MAX_DATA_BYTES {
        let msg = format!("introspection data is over {MAX_DATA_BYTES} bytes");
        return error(StatusCode::PAYLOAD_TOO_LARGE, msg);
    }
    let data: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("introspection data is not JSON: {e}")),
    };
    match api.engine.continue_inspection(data).await {
        Ok(uuid) => reply(StatusCode::OK, json!({"uuid": uuid})),
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
}
