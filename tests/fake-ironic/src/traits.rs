//! A node's traits (API 1.37+), as Ironic's `NodeTraitsController` serves them:
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/nodes/{ident}/traits` | 200 `{"traits": [...]}` |
//! | `PUT /v1/nodes/{ident}/traits/{trait}`, no body | 204 and a `Location`; adding a trait the node has is fine |
//! | `PUT /v1/nodes/{ident}/traits` `{"traits": [...]}` | 204: the node's traits replaced |
//! | `DELETE /v1/nodes/{ident}/traits/{trait}` | 204, or 404 "Node … doesn't have a trait '…'" |
//! | `DELETE /v1/nodes/{ident}/traits` | 204: every trait removed |
//!
//! Below 1.37 these paths are Ironic's plain 404. Trait names are checked against Ironic's schema, with the fake's
//! stand-in for the list of standard traits (see [`crate::validate::trait_schema`]). A node has at most 50 traits.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::{json_response, request_body, with_location};
use crate::error::ApiError;
use crate::gate::ApiVersion;
use crate::model::now_iso;
use crate::node_write::check_ident;
use crate::schema::Schema;
use crate::server::Shared;
use crate::validate::trait_schema;

type Result<T, E = ApiError> = std::result::Result<T, E>;

/// Ironic's `MAX_TRAITS_PER_NODE`.
const MAX_TRAITS: usize = 50;

/// The body of `PUT /v1/nodes/{ident}/traits`.
fn body_schema() -> Schema {
    Schema::of_type(&["object"])
        .properties(vec![("traits", Schema::of_type(&["array"]).items(trait_schema()))])
        .no_additional_properties()
}

fn check_version(version: ApiVersion, ident: &str) -> Result<()> {
    if !version.at_least(37) {
        return Err(ApiError::resource_not_found());
    }
    check_ident("node", ident)
}

fn too_many(db_id: u64, count: usize) -> ApiError {
    ApiError::bad_request(format!(
        "Could not modify traits for node {db_id} as it would exceed the maximum number of traits per node \
         ({count} vs. {MAX_TRAITS})"
    ))
}

fn exclusive() -> ApiError {
    ApiError::bad_request(
        "A single node trait may be added via PUT /v1/nodes/<node identifier>/traits/<trait> with no body, or all \
         node traits may be replaced via PUT /v1/nodes/<node identifier>/traits with the list of traits specified \
         in the request body.",
    )
}

/// `GET /v1/nodes/{ident}/traits`.
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    Path(ident): Path<String>,
) -> Result<Response> {
    check_version(version, &ident)?;
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    Ok(json_response(StatusCode::OK, json!({"traits": node.traits})))
}

/// `PUT /v1/nodes/{ident}/traits/{trait}`: adds one trait.
pub(crate) async fn add(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    headers: HeaderMap,
    Path((ident, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response> {
    check_version(version, &ident)?;
    trait_schema().check("trait", &json!(name)).map_err(ApiError::bad_request)?;
    let body = request_body(&body)?;
    body_schema().check("body", &body).map_err(ApiError::bad_request)?;
    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let db_id = store.node_db_id(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    if body.get("traits").is_some() {
        return Err(exclusive());
    }
    if is_truthy(&body) {
        return Err(ApiError::bad_request("No body should be provided when adding a trait"));
    }
    let node = store.node_mut(&ident)?;
    let mut traits: BTreeSet<String> = node.traits.iter().cloned().collect();
    traits.insert(name.clone());
    if traits.len() > MAX_TRAITS {
        return Err(too_many(db_id, traits.len()));
    }
    node.traits = traits.into_iter().collect();
    node.updated_at = Some(now_iso());
    let location = format!("{base}/v1/nodes/{ident}/traits/{name}");
    Ok(with_location(StatusCode::NO_CONTENT.into_response(), &location))
}

/// Python's truth of a decoded JSON body (an empty body reads as `{}`).
fn is_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `PUT /v1/nodes/{ident}/traits` `{"traits": [...]}`: replaces all the node's traits.
pub(crate) async fn replace(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    check_version(version, &ident)?;
    let body = request_body(&body)?;
    body_schema().check("body", &body).map_err(ApiError::bad_request)?;
    let mut store = shared.store();
    let db_id = store.node_db_id(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    let Some(Value::Array(wanted)) = body.get("traits") else { return Err(exclusive()) };
    let traits: BTreeSet<String> = wanted.iter().filter_map(Value::as_str).map(str::to_owned).collect();
    if traits.len() > MAX_TRAITS {
        return Err(too_many(db_id, traits.len()));
    }
    let node = store.node_mut(&ident)?;
    node.traits = traits.into_iter().collect();
    node.updated_at = Some(now_iso());
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /v1/nodes/{ident}/traits/{trait}`.
pub(crate) async fn remove(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    Path((ident, name)): Path<(String, String)>,
) -> Result<Response> {
    check_version(version, &ident)?;
    let mut store = shared.store();
    let node = store.node_mut(&ident).map_err(|_| ApiError::node_not_found(&ident))?;
    let Some(at) = node.traits.iter().position(|t| *t == name) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("Node {} doesn't have a trait '{name}'", node.uuid)));
    };
    node.traits.remove(at);
    node.updated_at = Some(now_iso());
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /v1/nodes/{ident}/traits`.
pub(crate) async fn remove_all(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    Path(ident): Path<String>,
) -> Result<Response> {
    check_version(version, &ident)?;
    let mut store = shared.store();
    let node = store.node_mut(&ident).map_err(|_| ApiError::node_not_found(&ident))?;
    node.traits.clear();
    node.updated_at = Some(now_iso());
    Ok(StatusCode::NO_CONTENT.into_response())
}
