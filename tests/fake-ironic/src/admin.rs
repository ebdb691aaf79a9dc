//! The admin API under `/_fake/`, so that tests driving the `fake-ironic` binary from another process can do
//! what in-process tests do with [`crate::FakeIronic`]'s methods. These requests are neither recorded nor faulted.
//!
//! | request | effect |
//! |---|---|
//! | `POST /_fake/faults` (a [`crate::Fault`]) | arm a fault |
//! | `DELETE /_fake/faults` | disarm all faults |
//! | `GET /_fake/calls` | the recorded [`crate::Call`]s, in arrival order |
//! | `DELETE /_fake/calls` | forget them |
//! | `POST /_fake/nodes` (a [`crate::Node`]) | add a node, or replace the one with that UUID |
//! | `GET /_fake/nodes` | every stored node |
//! | `GET /_fake/nodes/{ident}` | the stored node (`properties`, `extra`, `driver_info`, `traits`, the other Ironic fields set, and the fake-only `boot_device`, `power_valid`) |
//! | `GET /_fake/nodes/{ident}/ports` | the node's stored ports (404 for an unknown node) |
//! | `PUT /_fake/nodes/{ident}/provision_state` `{"provision_state": "…"}` | set its provision state |
//! | `POST /_fake/ports` (a [`crate::Port`]) | add a port (409 on a duplicate address, 400 on an unknown node) |
//! | `GET /_fake/ports` | every stored port |
//! | `GET /_fake/ports/{uuid}` | the stored port (`pxe_enabled`, `extra`, `local_link_connection`, `physical_network`, ...) |
//!
//! [`crate::client::Admin`] wraps these for tests.
//! | `POST /_fake/populate` `{"nodes": N, "ports_per_node": K, "provision_state": "…"}` | bulk-create nodes |

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::{ApiError, FakeError};
use crate::model::{Fault, Node, Port};
use crate::server::Shared;

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/_fake/faults", post(add_fault).delete(clear_faults))
        .route("/_fake/calls", get(calls).delete(clear_calls))
        .route("/_fake/nodes", post(add_node).get(nodes))
        .route("/_fake/nodes/{ident}", get(node))
        .route("/_fake/nodes/{ident}/ports", get(node_ports))
        .route("/_fake/nodes/{ident}/provision_state", put(set_provision_state))
        .route("/_fake/ports", post(add_port).get(ports))
        .route("/_fake/ports/{uuid}", get(port))
        .route("/_fake/populate", post(populate))
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn add_fault(State(shared): State<Arc<Shared>>, body: Bytes) -> Result<Response> {
    let fault: Fault = parse(&body)?;
    if fault.status != 0 && !(100..=999).contains(&fault.status) {
        return Err(ApiError::bad_request(format!("invalid fault status {}", fault.status)));
    }
    shared.store().inject(fault.clone());
    Ok(json_response(StatusCode::CREATED, json!(fault)))
}

async fn clear_faults(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.store().clear_faults();
    StatusCode::NO_CONTENT
}

async fn calls(State(shared): State<Arc<Shared>>) -> Response {
    let calls = shared.store().calls();
    json_response(StatusCode::OK, json!(calls))
}

async fn clear_calls(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.store().clear_calls();
    StatusCode::NO_CONTENT
}

async fn add_node(State(shared): State<Arc<Shared>>, body: Bytes) -> Result<Response> {
    let node: Node = parse(&body)?;
    let mut store = shared.store();
    let uuid = store.upsert_node(node);
    let node = store.node(&uuid).ok_or_else(|| ApiError::node_not_found(&uuid))?;
    Ok(json_response(StatusCode::CREATED, json!(node)))
}

async fn node(State(shared): State<Arc<Shared>>, Path(ident): Path<String>) -> Result<Response> {
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    Ok(json_response(StatusCode::OK, json!(node)))
}

async fn nodes(State(shared): State<Arc<Shared>>) -> Response {
    let nodes: Vec<Node> = shared.store().nodes().cloned().collect();
    json_response(StatusCode::OK, json!(nodes))
}

async fn node_ports(State(shared): State<Arc<Shared>>, Path(ident): Path<String>) -> Result<Response> {
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    let ports: Vec<&Port> = store.ports().filter(|p| p.node_uuid == node.uuid).collect();
    Ok(json_response(StatusCode::OK, json!(ports)))
}

async fn ports(State(shared): State<Arc<Shared>>) -> Response {
    let ports: Vec<Port> = shared.store().ports().cloned().collect();
    json_response(StatusCode::OK, json!(ports))
}

async fn port(State(shared): State<Arc<Shared>>, Path(uuid): Path<String>) -> Result<Response> {
    let store = shared.store();
    let port = store.port(&uuid).ok_or_else(|| ApiError::port_not_found(&uuid))?;
    Ok(json_response(StatusCode::OK, json!(port)))
}

#[derive(Debug, Deserialize)]
struct ProvisionState {
    provision_state: String,
}

async fn set_provision_state(
    State(shared): State<Arc<Shared>>,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let ProvisionState { provision_state } = parse(&body)?;
    shared.store().node_mut(&ident)?.provision_state = provision_state;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn add_port(State(shared): State<Arc<Shared>>, body: Bytes) -> Result<Response> {
    let port: Port = parse(&body)?;
    let port = shared.store().add_port(port).map_err(|e| match e {
        FakeError::NodeNotFound(_) => ApiError::bad_request(e.to_string()),
        other => other.into(),
    })?;
    Ok(json_response(StatusCode::CREATED, json!(port)))
}

#[derive(Debug, Deserialize)]
struct Populate {
    nodes: usize,
    #[serde(default = "one")]
    ports_per_node: usize,
    #[serde(default = "enroll")]
    provision_state: String,
}

fn one() -> usize {
    1
}

fn enroll() -> String {
    "enroll".to_owned()
}

async fn populate(State(shared): State<Arc<Shared>>, body: Bytes) -> Result<Response> {
    let p: Populate = parse(&body)?;
    let uuids = shared.store().populate(p.nodes, p.ports_per_node, &p.provision_state);
    Ok(json_response(StatusCode::CREATED, json!({"uuids": uuids})))
}
