//! Writing ports as Ironic does: `POST /v1/ports` and `PATCH /v1/ports/{uuid}`, with the checks of Ironic's API
//! and conductor in their order and with their messages (`ironic/api/controllers/v1/port.py`,
//! `ConductorManager.update_port`).
//!
//! Not emulated: port groups (none exist, so naming one is a 400), port names (a field of 1.88), policy checks
//! and the network interface's own validation. The fields of later microversions that a patch may still change
//! at 1.81 (`name`, `description`, ...) are validated and then dropped: 1.81 never shows them.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Map, Value, json};

use crate::api::{json_response, request_body, with_location};
use crate::error::{ApiError, FakeError};
use crate::gate::ApiVersion;
use crate::model::{Port, new_uuid, now_iso};
use crate::node_write::check_ident;
use crate::patch;
use crate::pyfmt::str_of;
use crate::schema::Schema;
use crate::server::Shared;
use crate::validate;
use crate::views::{self, PORT_FIELDS_NEWER};

type Result<T, E = ApiError> = std::result::Result<T, E>;

/// Ironic's `PATCH_ALLOWED_FIELDS` for ports.
const PATCH_ALLOWED: &[&str] = &[
    "address",
    "extra",
    "is_smartnic",
    "local_link_connection",
    "node_ident",
    "node_uuid",
    "physical_network",
    "portgroup_uuid",
    "pxe_enabled",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
];

/// The states in which the conductor lets a port's connectivity fields change (or in maintenance).
const CONNECTIVITY_UPDATE_STATES: &[&str] = &["enroll", "inspecting", "inspect wait", "manageable"];

/// Ironic's `PORT_SCHEMA` (also the schema of a patched port).
fn port_schema() -> Schema {
    const STR_OR_NULL: &[&str] = &["string", "null"];
    const BOOL_OR_STRING: &[&str] = &["string", "boolean", "null"];
    Schema::of_type(&["object"])
        .properties(vec![
            ("address", Schema::of_type(&["string"])),
            ("extra", Schema::of_type(&["object", "null"])),
            ("is_smartnic", Schema::of_type(BOOL_OR_STRING)),
            ("local_link_connection", Schema::of_type(&["null", "object"])),
            ("node_ident", Schema::of_type(&["string"])),
            ("node_uuid", Schema::of_type(&["string"])),
            ("physical_network", Schema::of_type(STR_OR_NULL).max_length(64)),
            ("portgroup_uuid", Schema::of_type(STR_OR_NULL)),
            ("pxe_enabled", Schema::of_type(BOOL_OR_STRING)),
            ("uuid", Schema::of_type(STR_OR_NULL)),
            ("name", Schema::of_type(STR_OR_NULL)),
            ("description", Schema::of_type(STR_OR_NULL).max_length(255)),
            ("vendor", Schema::of_type(STR_OR_NULL).max_length(32)),
            ("category", Schema::of_type(STR_OR_NULL).max_length(80)),
            ("available_for_dynamic_portgroup", Schema::of_type(&["boolean"])),
        ])
        .required(&["address"])
        .one_of(vec![
            (Schema::new().required(&["node_ident"]), "{'required': ['node_ident']}"),
            (Schema::new().required(&["node_uuid"]), "{'required': ['node_uuid']}"),
        ])
        .no_additional_properties()
}

/// Ironic's `PORT_VALIDATOR_EXTRA`, in its order: the address lowercased, booleans converted from oslo's
/// strings, `local_link_connection` checked and its `switch_id` lowercased.
fn check_extra(fields: &mut Map<String, Value>) -> Result<()> {
    if let Some(Value::String(address)) = fields.get("address") {
        let address = validate::mac_address("address", address)?;
        fields.insert("address".into(), Value::String(address));
    }
    for (name, kind) in [
        ("node_uuid", "uuid"),
        ("is_smartnic", "bool"),
        ("local_link_connection", "llc"),
        ("portgroup_uuid", "uuid"),
        ("pxe_enabled", "bool"),
        ("uuid", "uuid"),
        ("available_for_dynamic_portgroup", "bool"),
    ] {
        let Some(value) = fields.get_mut(name) else { continue };
        match kind {
            "uuid" => validate::uuid(name, value)?,
            "bool" => *value = validate::boolean(name, value)?.map_or(Value::Null, Value::Bool),
            _ => *value = validate::local_link_connection(value)?,
        }
    }
    Ok(())
}

/// Ironic's `_check_allowed_port_fields`: a 406 for a field of a later microversion than the request's.
/// `local_link` is the `local_link_connection` of a body, whose keys are checked too.
fn check_versions(fields: &BTreeSet<&str>, local_link: Option<&Value>, version: ApiVersion) -> Result<()> {
    let has = |f: &str| fields.contains(f);
    let too_new = (!version.at_least(19) && (has("pxe_enabled") || has("local_link_connection")))
        || (!version.at_least(24) && has("portgroup_uuid"))
        || (!version.at_least(34) && has("physical_network"))
        || (!version.at_least(53) && has("is_smartnic"))
        || (!version.at_least(64) && has("local_link_connection/network_type"))
        || local_link.is_some_and(|l| {
            (!version.at_least(64) && l.get("network_type").is_some()) || l.get("vtep-logical-switch").is_some()
        })
        || PORT_FIELDS_NEWER.iter().any(|f| has(f));
    if too_new { Err(ApiError::not_acceptable()) } else { Ok(()) }
}

fn pxe_enabled(value: Option<&Value>) -> Result<bool> {
    match value {
        None => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        // The port object's field is not nullable: Ironic fails with a 500.
        Some(_) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "Field `pxe_enabled' cannot be None")),
    }
}

fn dict(value: Option<&Value>) -> Map<String, Value> {
    value.and_then(Value::as_object).cloned().unwrap_or_default()
}

/// `POST /v1/ports`: 201 with the port and its `Location`.
pub(crate) async fn create_port(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let body = request_body(&body)?;
    port_schema().check("port", &body).map_err(ApiError::bad_request)?;
    let Value::Object(mut fields) = body else { return Err(ApiError::bad_request("a port must be an object")) };
    check_extra(&mut fields)?;
    if fields.contains_key("node_ident") {
        // A field of 1.94.
        return Err(ApiError::not_acceptable());
    }
    let node_uuid = fields.get("node_uuid").map_or_else(|| "None".to_owned(), str_of);
    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let node = store
        .node(&node_uuid)
        .cloned()
        .ok_or_else(|| ApiError::bad_request(format!("Node {node_uuid} could not be found.")))?;
    let keys: BTreeSet<&str> = fields.keys().map(String::as_str).collect();
    check_versions(&keys, fields.get("local_link_connection").filter(|l| !l.is_null()), version)?;
    if let Some(group) = fields.get("portgroup_uuid").and_then(Value::as_str) {
        return Err(ApiError::bad_request(format!("Portgroup {group} could not be found.")));
    }
    let local_link = fields.get("local_link_connection").filter(|l| !l.is_null());
    if fields.get("is_smartnic") == Some(&json!(true)) && local_link.is_some_and(|l| !validate::is_smart_nic_link(l)) {
        return Err(ApiError::bad_request("Smart NIC port must have port_id and hostname in local_link_connection"));
    }
    let physical_network = fields.get("physical_network").and_then(Value::as_str).map(str::to_owned);
    if physical_network.as_deref() == Some("") {
        return Err(ApiError::bad_request("A non-empty value is required when setting physical_network"));
    }
    let port = Port {
        uuid: fields.get("uuid").and_then(Value::as_str).filter(|u| !u.is_empty()).map_or_else(new_uuid, str::to_owned),
        address: fields.get("address").and_then(Value::as_str).unwrap_or_default().to_owned(),
        node_uuid: node.uuid.clone(),
        pxe_enabled: pxe_enabled(fields.get("pxe_enabled"))?,
        extra: dict(fields.get("extra")),
        local_link_connection: dict(local_link),
        physical_network,
        is_smartnic: fields.get("is_smartnic") == Some(&json!(true)),
        created_at: Some(now_iso()),
        ..Port::default()
    };
    let port = store.add_port(port)?;
    let location = format!("{base}/v1/ports/{}", port.uuid);
    Ok(with_location(json_response(StatusCode::CREATED, Value::Object(views::port_view(&port, &base))), &location))
}

/// The port as Ironic's patch applies to it: every field of the port object.
fn port_doc(port: &Port) -> Map<String, Value> {
    let mut doc = views::port_view(port, "");
    doc.remove("links");
    for field in ["name", "description", "vendor", "category"] {
        doc.insert(field.to_owned(), Value::Null);
    }
    doc.insert("available_for_dynamic_portgroup".to_owned(), json!(true));
    doc
}

/// `PATCH /v1/ports/{uuid}`: JSON Patch on the port. 200 with the port.
pub(crate) async fn patch_port(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    headers: HeaderMap,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response> {
    check_ident("port_ident", &ident)?;
    let ops = patch::parse(&request_body(&body)?)?;
    patch::check_allowed(&ops, PATCH_ALLOWED)?;
    let touched: BTreeSet<&str> = [
        "pxe_enabled",
        "local_link_connection",
        "portgroup_uuid",
        "physical_network",
        "is_smartnic",
        "local_link_connection/network_type",
    ]
    .into_iter()
    .filter(|f| {
        let path = format!("/{f}");
        !patch::values(&ops, &path).is_empty() || patch::is_removed(&ops, &path)
    })
    .collect();
    check_versions(&touched, None, version)?;

    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let old = store.port(&ident).cloned().ok_or_else(|| ApiError::port_not_found(&ident))?;
    let owner = store.node(&old.node_uuid).map(|n| views::node_field(n, "owner")).unwrap_or_default();
    let node = match patch::values(&ops, "/node_uuid").first() {
        None => store.node(&old.node_uuid),
        Some(wanted) => {
            let invalid = || {
                ApiError::bad_request(format!(
                    "Unable to apply the requested node_uuid '{}'. Requested value was invalid.",
                    str_of(wanted)
                ))
            };
            let node = wanted.as_str().and_then(|w| store.node(w)).ok_or_else(invalid)?;
            if views::node_field(node, "owner") != owner {
                return Err(invalid());
            }
            Some(node)
        }
    }
    .cloned()
    .ok_or_else(|| ApiError::node_not_found(&old.node_uuid))?;

    let mut doc = port_doc(&old);
    patch::apply_all(&mut doc, &ops)?;
    doc.insert("node_uuid".into(), json!(node.uuid));
    let schema = port_schema();
    let known: Vec<&str> = schema.property_names().collect();
    doc.retain(|k, _| known.contains(&k.as_str()));
    let mut doc = Value::Object(doc);
    schema.check("patch", &doc).map_err(ApiError::bad_request)?;
    let Value::Object(fields) = &mut doc else { return Err(ApiError::bad_request("a port must be an object")) };
    check_extra(fields)?;
    let port = Port {
        address: fields.get("address").and_then(Value::as_str).unwrap_or_default().to_owned(),
        node_uuid: node.uuid.clone(),
        pxe_enabled: pxe_enabled(Some(fields.get("pxe_enabled").unwrap_or(&Value::Null)))?,
        extra: dict(fields.get("extra")),
        local_link_connection: dict(fields.get("local_link_connection")),
        physical_network: fields.get("physical_network").and_then(Value::as_str).map(str::to_owned),
        is_smartnic: fields.get("is_smartnic") == Some(&json!(true)),
        ..old.clone()
    };

    let state = node.provision_state.as_str();
    if state == "inspecting" && version.at_least(39) {
        return Err(ApiError::conflict(format!(
            "Cannot update port \"{}\" on \"{}\" while it is in state \"inspecting\".",
            old.uuid, node.uuid
        )));
    }
    if patch::first_touches(&ops, "/physical_network") && port.physical_network.as_deref() == Some("") {
        return Err(ApiError::bad_request("A non-empty value is required when setting physical_network"));
    }
    let active = state == "active" || node.instance_uuid.is_some();
    if port.address != old.address && active && !node.maintenance {
        return Err(ApiError::conflict(format!(
            "Cannot update hardware address for port {} as node {} is active or has instance UUID assigned",
            old.uuid, node.uuid
        )));
    }
    let connectivity_changed = port.pxe_enabled != old.pxe_enabled
        || port.local_link_connection != old.local_link_connection
        || port.physical_network != old.physical_network;
    if connectivity_changed && !(CONNECTIVITY_UPDATE_STATES.contains(&state) || node.maintenance) {
        return Err(ApiError::conflict(format!(
            "Port {} can not have any connectivity attributes (portgroup_id, pxe_enabled, local_link_connection, \
             physical_network) updated unless node {} is in a {} state or in maintenance mode. The current state is \
             {state}.",
            old.uuid,
            node.uuid,
            CONNECTIVITY_UPDATE_STATES.join(", ")
        )));
    }
    let port = Port { updated_at: Some(now_iso()), ..port };
    let port = store.update_port(port).map_err(|e| match e {
        FakeError::NodeNotFound(n) => ApiError::node_not_found(&n),
        other => other.into(),
    })?;
    Ok(json_response(StatusCode::OK, Value::Object(views::port_view(&port, &base))))
}
