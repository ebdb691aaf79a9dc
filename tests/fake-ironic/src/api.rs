//! The emulated part of Ironic's REST API: version discovery, nodes (list, show, validate, power, boot device,
//! patch, delete) and ports (list, show, create, delete).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use crate::error::{ApiError, FakeError};
use crate::model::{Node, Port, is_mac};
use crate::patch::{self, Op};
use crate::server::Shared;
use crate::views::{self, NODE_FIELDS, NODE_LIST_FIELDS, NODE_PATCHABLE, PORT_FIELDS, PORT_LIST_FIELDS, Query};

type Result<T, E = ApiError> = std::result::Result<T, E>;
type Pairs = axum::extract::Query<Vec<(String, String)>>;

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(root))
        .route("/v1", get(v1))
        .route("/v1/", get(v1))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/nodes/detail", get(list_nodes_detail))
        .route("/v1/nodes/{ident}", get(show_node).patch(patch_node).delete(delete_node))
        .route("/v1/nodes/{ident}/validate", get(validate_node))
        .route("/v1/nodes/{ident}/management/boot_device", put(set_boot_device))
        .route("/v1/nodes/{ident}/states/power", put(set_power_state))
        .route("/v1/ports", get(list_ports).post(create_port))
        .route("/v1/ports/detail", get(list_ports_detail))
        .route("/v1/ports/{uuid}", get(show_port).delete(delete_port))
}

/// Unknown paths get Ironic's 404 body.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "The resource could not be found.")
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn with_location(mut resp: Response, location: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Parses a JSON request body; anything else is Ironic's 400.
pub(crate) fn json_body(body: &Bytes) -> Result<Value> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))
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
    let shape = Query::new(pairs.0).shape(NODE_FIELDS, false)?.or_detail();
    let store = shared.store();
    let node = store.node(&ident).ok_or_else(|| ApiError::node_not_found(&ident))?;
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

async fn patch_node(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let ops = patch::parse(&json_body(&body)?).map_err(ApiError::bad_request)?;
    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let node = store.node_mut(&ident)?;
    let mut view = views::node_view(node, &base);
    view.retain(|k, _| NODE_PATCHABLE.contains(&k.as_str()));
    let mut doc = Value::Object(view);
    for op in &ops {
        let tokens = patch::pointer(&op.path).map_err(ApiError::bad_request)?;
        let root = tokens.first().map_or("", String::as_str);
        if !NODE_PATCHABLE.contains(&root) {
            if NODE_FIELDS.contains(&root) || root == "links" {
                return Err(ApiError::bad_request(format!(
                    "'/{root}' is an internal attribute and can not be updated"
                )));
            }
            if op.op == Op::Add && tokens.len() == 1 {
                return Err(ApiError::bad_request(format!(
                    "Adding a new attribute (/{root}) to the root of the resource is not allowed"
                )));
            }
        }
        patch::apply(&mut doc, op)
            .map_err(|reason| ApiError::bad_request(format!("Couldn't apply patch '{}'. Reason: {reason}", op.path)))?;
    }
    let Value::Object(doc) = doc else {
        return Err(ApiError::bad_request("a patch must leave the node an object"));
    };
    *node = views::node_from_patched(&doc, node)?;
    Ok(json_response(StatusCode::OK, Value::Object(views::node_view(node, &base))))
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
    let limit = query.limit(shared.config.max_limit)?;
    let shape = query.shape(PORT_FIELDS, detail_route)?;
    let address = query.get("address").map(str::to_ascii_lowercase);
    let store = shared.store();
    // `node` takes a UUID or a name, `node_uuid` a UUID; an unknown node is Ironic's 404.
    let node_uuid = match (query.get("node"), query.get("node_uuid")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("Only one of 'node' and 'node_uuid' may be specified."));
        }
        (Some(ident), None) | (None, Some(ident)) => {
            Some(store.node(ident).map(|n| n.uuid.clone()).ok_or_else(|| ApiError::node_not_found(ident))?)
        }
        (None, None) => None,
    };
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
    let shape = Query::new(pairs.0).shape(PORT_FIELDS, false)?.or_detail();
    let store = shared.store();
    let port = store.port(&uuid).ok_or_else(|| ApiError::port_not_found(&uuid))?;
    Ok(json_response(StatusCode::OK, shape.apply(views::port_view(port, &base), PORT_LIST_FIELDS)))
}

async fn create_port(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Result<Response> {
    let body = json_body(&body)?;
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let mandatory = |name: &str| {
        field(name).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| {
            ApiError::bad_request(format!("Invalid input for field/attribute {name}. Mandatory field missing."))
        })
    };
    let address = mandatory("address")?;
    let node_uuid = mandatory("node_uuid")?;
    if !is_mac(&address) {
        return Err(FakeError::InvalidMac(address).into());
    }
    let mut port = Port::new(node_uuid, address);
    if let Some(uuid) = field("uuid").and_then(Value::as_str) {
        port.uuid = uuid.to_owned();
    }
    if let Some(v) = field("pxe_enabled") {
        port.pxe_enabled = v.as_bool().ok_or_else(|| {
            ApiError::bad_request(format!("Invalid input for field/attribute pxe_enabled. Value: '{v}'."))
        })?;
    }
    if let Some(v) = field("extra") {
        port.extra = v
            .as_object()
            .cloned()
            .ok_or_else(|| ApiError::bad_request(format!("Invalid input for field/attribute extra. Value: '{v}'.")))?;
    }
    let base = shared.base_url(&headers);
    let port = shared.store().add_port(port).map_err(|e| match e {
        // A port naming a missing node is a bad request, not a missing resource (Ironic turns the 404 into 400).
        FakeError::NodeNotFound(_) => ApiError::bad_request(e.to_string()),
        other => other.into(),
    })?;
    let location = format!("{base}/v1/ports/{}", port.uuid);
    Ok(with_location(json_response(StatusCode::CREATED, Value::Object(views::port_view(&port, &base))), &location))
}

async fn delete_port(State(shared): State<Arc<Shared>>, Path(uuid): Path<String>) -> Result<Response> {
    shared.store().delete_port(&uuid)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
