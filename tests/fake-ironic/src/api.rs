//! The emulated part of Ironic's REST API: version discovery, nodes (list, show, validate, power, boot device,
//! delete), ports (list, show, delete), and the routes of the writes that live in their own modules: nodes
//! ([`crate::node_write`]: create, patch), ports ([`crate::port_write`]: create, patch) and traits
//! ([`crate::traits`]).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::model::{Node, Port};
use crate::server::Shared;
use crate::validate::is_uuid_like;
use crate::views::{
    self, NODE_FIELDS, NODE_FIELDS_NEWER, NODE_LIST_FIELDS, PORT_FIELDS, PORT_FIELDS_NEWER, PORT_LIST_FIELDS, Query,
};
use crate::{node_write, port_write, traits};

type Result<T, E = ApiError> = std::result::Result<T, E>;
pub(crate) type Pairs = axum::extract::Query<Vec<(String, String)>>;

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(root))
        .route("/v1", get(v1))
        .route("/v1/", get(v1))
        .route("/v1/nodes", get(list_nodes).post(node_write::create_node))
        .route("/v1/nodes/detail", get(list_nodes_detail))
        .route("/v1/nodes/{ident}", get(show_node).patch(node_write::patch_node).delete(delete_node))
        .route("/v1/nodes/{ident}/traits", get(traits::list).put(traits::replace).delete(traits::remove_all))
        .route("/v1/nodes/{ident}/traits/{name}", put(traits::add).delete(traits::remove))
        .route("/v1/nodes/{ident}/validate", get(validate_node))
        .route("/v1/nodes/{ident}/management/boot_device", put(set_boot_device))
        .route("/v1/nodes/{ident}/states/power", put(set_power_state))
        .route("/v1/ports", get(list_ports).post(port_write::create_port))
        .route("/v1/ports/detail", get(list_ports_detail))
        .route("/v1/ports/{uuid}", get(show_port).patch(port_write::patch_port).delete(delete_port))
}

/// Unknown paths get Ironic's 404 body.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "The resource could not be found.")
}

pub(crate) fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

pub(crate) fn with_location(mut resp: Response, location: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Parses a JSON request body; anything else is Ironic's 400.
pub(crate) fn json_body(body: &Bytes) -> Result<Value> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))
}

/// A body as Ironic's `method.body` reads it: an empty body is `{}`, anything else must be JSON.
pub(crate) fn request_body(body: &Bytes) -> Result<Value> {
    if body.is_empty() { Ok(Value::Object(serde_json::Map::new())) } else { json_body(body) }
}

// --- versions --------------------------------------------------------------------------------------------------

fn version(shared: &Shared, base: &str) -> Value {
    json!({
        "id": "v1",
        "status": "CURRENT",
        "version": shared.config.max_version,
        "min_version": shared.config.min_version,
        "links": [{"href": format!("{base}/v1/"), "rel": "self"}],
    })
}

async fn root(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let base = shared.base_url(&headers);
    let v = version(&shared, &base);
    json_response(
        StatusCode::OK,
        json!({
            "name": "OpenStack Ironic API",
            "description": "Ironic is an OpenStack project which enables the provision and management of \
                            baremetal machines.",
            "versions": [v],
            "default_version": v,
        }),
    )
}

async fn v1(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let base = shared.base_url(&headers);
    json_response(
        StatusCode::OK,
        json!({
            "id": "v1",
            "links": [{"href": format!("{base}/v1/"), "rel": "self"}],
            "media_types": [{"base": "application/json", "type": "application/vnd.openstack.ironic.v1+json"}],
            "nodes": [
                {"href": format!("{base}/v1/nodes/"), "rel": "self"},
                {"href": format!("{base}/nodes/"), "rel": "bookmark"},
            ],
            "ports": [
                {"href": format!("{base}/v1/ports/"), "rel": "self"},
                {"href": format!("{base}/ports/"), "rel": "bookmark"},
            ],
            "version": version(&shared, &base),
        }),
    )
}

// --- nodes -----------------------------------------------------------------------------------------------------

async fn list_nodes(State(shared): State<Arc<Shared>>, headers: HeaderMap, pairs: Pairs) -> Result<Response> {
    nodes_page(&shared, &headers, Query::new(pairs.0), false)
}

async fn list_nodes_detail(State(shared): State<Arc<Shared>>, headers: HeaderMap, pairs: Pairs) -> Result<Response> {
    nodes_page(&shared, &headers, Query::new(pairs.0), true)
}

fn nodes_page(shared: &Shared, headers: &HeaderMap, query: Query, detail_route: bool) -> Result<Response> {
    let base = shared.base_url(headers);
    let limit = query.limit(shared.config.max_limit)?;
    views::reject_newer_fields(&query, NODE_FIELDS_NEWER)?;
    let shape = query.shape(NODE_FIELDS, detail_route)?;
    let provision_state = query.get("provision_state");
    let driver = query.get("driver");
    let maintenance = match query.get("maintenance") {
        None => None,
        Some(v) => Some(views::parse_bool(v).ok_or_else(|| {
            ApiError::bad_request(format!("Invalid input for field/attribute maintenance. Value: '{v}'."))
        })?),
    };
    let store = shared.store();
    let page: Vec<&Node> = store
        .nodes_after(query.get("marker"))?
        .filter(|n| provision_state.is_none_or(|s| n.provision_state == s))
        .filter(|n| driver.is_none_or(|d| n.driver == d))
        .filter(|n| maintenance.is_none_or(|m| n.maintenance == m))
        .take(limit)
        .collect();
    let next = match page.last() {
        Some(last) if page.len() == limit => Some(query.next_url(&base, "nodes", limit, &last.uuid)),
        _ => None,
    };
    let items = page.into_iter().map(|n| shape.apply(views::node_view(n, &base), NODE_LIST_FIELDS)).collect();
    Ok(json_response(StatusCode::OK, views::page("nodes", items, next)))
}

async fn show_node(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(ident): Path<String>,
    pairs: Pairs,
) -> Result<Response> {
    let base = shared.base_url(&headers);
    let query = Query::new(pairs.0);
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    views::reject_newer_fields(&query, NODE_FIELDS_NEWER)?;
    // One node words an unknown field its own way (Ironic's `_get_fields_for_node_query`).
    let mut named = query.get("fields").unwrap_or_default().split(',').map(str::trim).filter(|f| !f.is_empty());
    if let Some(bad) = named.find(|f| !NODE_FIELDS.contains(f)) {
        return Err(ApiError::bad_request(format!("Field {bad} is not a valid field.")));
    }
    let shape = query.shape(NODE_FIELDS, false)?.or_detail();
    Ok(json_response(StatusCode::OK, shape.apply(views::node_view(node, &base), NODE_LIST_FIELDS)))
}

async fn validate_node(State(shared): State<Arc<Shared>>, Path(ident): Path<String>) -> Result<Response> {
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
    let ok = json!({"result": true, "reason": null});
    let power = if node.power_valid {
        ok.clone()
    } else {
        json!({
            "result": false,
            "reason": "Missing the following IPMI credentials in node's driver_info: ipmi_address."
        })
    };
    let unsupported = json!({"result": null, "reason": "not supported"});
    Ok(json_response(
        StatusCode::OK,
        json!({
            "power": power,
            "management": ok,
            "boot": ok,
            "deploy": ok,
            "inspect": ok,
            "network": ok,
            "console": unsupported,
            "raid": unsupported,
            "rescue": unsupported,
            "bios": unsupported,
            "storage": ok,
        }),
    ))
}

const BOOT_DEVICES: &[&str] = &["pxe", "disk", "cdrom", "bios", "safe"];

async fn set_boot_device(
    State(shared): State<Arc<Shared>>,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let body = json_body(&body)?;
    let device = body.get("boot_device").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_request("Invalid input for field/attribute boot_device. Value: 'None'. Mandatory field missing.")
    })?;
    if !BOOT_DEVICES.contains(&device) {
        return Err(ApiError::bad_request(format!(
            "Invalid boot device {device} specified. Valid boot devices: {}.",
            BOOT_DEVICES.join(", ")
        )));
    }
    let persistent = match body.get("persistent") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::bad_request(format!("Invalid input for field/attribute persistent. Value: '{v}'.")));
        }
    };
    let mut store = shared.store();
    let node = store.node_mut(&ident)?;
    node.boot_device = Some(device.to_owned());
    node.boot_device_persistent = persistent;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_power_state(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let body = json_body(&body)?;
    let target = body.get("target").and_then(Value::as_str).unwrap_or("");
    let new_state = match target {
        "power on" | "rebooting" | "soft rebooting" => "power on",
        "power off" | "soft power off" => "power off",
        other => {
            return Err(ApiError::bad_request(format!(
                "Invalid state '{other}' for power. Valid states: power on, power off, rebooting, soft power off, \
                 soft rebooting."
            )));
        }
    };
    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let node = store.node_mut(&ident)?;
    node.power_state = new_state.to_owned();
    let location = format!("{base}/v1/nodes/{}/states", node.uuid);
    Ok(with_location(StatusCode::ACCEPTED.into_response(), &location))
}

async fn delete_node(State(shared): State<Arc<Shared>>, Path(ident): Path<String>) -> Result<Response> {
    shared.store().delete_node(&ident)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// --- ports -----------------------------------------------------------------------------------------------------

async fn list_ports(State(shared): State<Arc<Shared>>, headers: HeaderMap, pairs: Pairs) -> Result<Response> {
    ports_page(&shared, &headers, Query::new(pairs.0), false)
}

async fn list_ports_detail(State(shared): State<Arc<Shared>>, headers: HeaderMap, pairs: Pairs) -> Result<Response> {
    ports_page(&shared, &headers, Query::new(pairs.0), true)
}

fn ports_page(shared: &Shared, headers: &HeaderMap, query: Query, detail_route: bool) -> Result<Response> {
    let base = shared.base_url(headers);
    views::reject_newer_fields(&query, PORT_FIELDS_NEWER)?;
    let limit = query.limit(shared.config.max_limit)?;
    let shape = query.shape(PORT_FIELDS, detail_route)?;
    // Ironic validates `node_uuid` as a UUID, `node` as a UUID or name, and `address` as a MAC address.
    if let Some(n) = query.get("node_uuid")
        && !is_uuid_like(n)
    {
        return Err(ApiError::bad_request(format!("Expected UUID for node_uuid: {n}")));
    }
    if let Some(n) = query.get("node") {
        node_write::check_ident("node", n)?;
    }
    let address = query.get("address").map(|a| crate::validate::mac_address("address", a)).transpose()?;
    let store = shared.store();
    // `node_uuid` wins over `node`; an unknown node is Ironic's 404. With a node, `address` is ignored (as in
    // Ironic, which filters by one or the other).
    let node_uuid = match query.get("node_uuid").or_else(|| query.get("node")) {
        Some(ident) => Some(store.node(ident).map(|n| n.uuid.clone()).ok_or_else(|| ApiError::node_not_found(ident))?),
        None => None,
    };
    let address = if node_uuid.is_some() { None } else { address };
    let page: Vec<&Port> = store
        .ports_after(query.get("marker"))?
        .filter(|p| node_uuid.as_deref().is_none_or(|n| p.node_uuid == n))
        .filter(|p| address.as_deref().is_none_or(|a| p.address == a))
        .take(limit)
        .collect();
    let next = match page.last() {
        Some(last) if page.len() == limit => Some(query.next_url(&base, "ports", limit, &last.uuid)),
        _ => None,
    };
    let items = page.into_iter().map(|p| shape.apply(views::port_view(p, &base), PORT_LIST_FIELDS)).collect();
    Ok(json_response(StatusCode::OK, views::page("ports", items, next)))
}

async fn show_port(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(uuid): Path<String>,
    pairs: Pairs,
) -> Result<Response> {
    let base = shared.base_url(&headers);
    let query = Query::new(pairs.0);
    views::reject_newer_fields(&query, PORT_FIELDS_NEWER)?;
    let shape = query.shape(PORT_FIELDS, false)?.or_detail();
    let store = shared.store();
    let port = store.port(&uuid).ok_or_else(|| ApiError::port_not_found(&uuid))?;
    Ok(json_response(StatusCode::OK, shape.apply(views::port_view(port, &base), PORT_LIST_FIELDS)))
}

async fn delete_port(State(shared): State<Arc<Shared>>, Path(uuid): Path<String>) -> Result<Response> {
    shared.store().delete_port(&uuid)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
