//! Writing nodes as Ironic does: `POST /v1/nodes` (enrolment) and `PATCH /v1/nodes/{ident}[?reset_interfaces=]`,
//! with the checks of Ironic's API and conductor in their order and with their messages
//! (`ironic/api/controllers/v1/node.py`, `ConductorManager.update_node`).
//!
//! Not emulated: policy (owner/lessee) checks, boot-mode restrictions, console handling, the `network_data`
//! schema (any object passes) and whether an interface is enabled and supported by the hardware type.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Map, Value, json};

use crate::api::{Pairs, json_response, request_body, with_location};
use crate::error::ApiError;
use crate::gate::ApiVersion;
use crate::model::{Node, Store, new_uuid, now_iso};
use crate::patch::{self, Op};
use crate::pyfmt::str_of;
use crate::schema::Schema;
use crate::server::Shared;
use crate::validate::{self, RESERVED_NODE_NAMES, is_uuid_like, is_valid_logical_name, is_valid_node_name};
use crate::views::{self, NODE_FIELDS, NODE_FIELDS_NEWER, OTHER_INTERFACES, Query, default_interface, node_default};

type Result<T, E = ApiError> = std::result::Result<T, E>;

/// Ironic's `PATCH_ALLOWED_FIELDS` for nodes; the fields of later microversions are then refused with a 406.
const PATCH_ALLOWED: &[&str] = &[
    "automated_clean",
    "bios_interface",
    "boot_interface",
    "chassis_uuid",
    "conductor_group",
    "console_interface",
    "deploy_interface",
    "description",
    "disable_power_off",
    "driver",
    "driver_info",
    "extra",
    "inspect_interface",
    "instance_info",
    "instance_name",
    "instance_uuid",
    "lessee",
    "maintenance",
    "management_interface",
    "name",
    "network_data",
    "network_interface",
    "owner",
    "power_interface",
    "properties",
    "protected",
    "protected_reason",
    "raid_interface",
    "rescue_interface",
    "resource_class",
    "retired",
    "retired_reason",
    "shard",
    "storage_interface",
    "vendor_interface",
    "parent_node",
    "firmware_interface",
];

/// The microversion (minor) that introduced each node field that is not in 1.1 (Ironic's `VERSIONED_FIELDS`).
const VERSIONED_FIELDS: &[(&str, u32)] = &[
    ("driver_internal_info", 3),
    ("name", 5),
    ("inspection_finished_at", 6),
    ("inspection_started_at", 6),
    ("clean_step", 7),
    ("raid_config", 12),
    ("target_raid_config", 12),
    ("network_interface", 20),
    ("resource_class", 21),
    ("boot_interface", 31),
    ("console_interface", 31),
    ("deploy_interface", 31),
    ("inspect_interface", 31),
    ("management_interface", 31),
    ("power_interface", 31),
    ("raid_interface", 31),
    ("vendor_interface", 31),
    ("storage_interface", 33),
    ("traits", 37),
    ("rescue_interface", 38),
    ("bios_interface", 40),
    ("fault", 42),
    ("deploy_step", 44),
    ("conductor_group", 46),
    ("automated_clean", 47),
    ("protected", 48),
    ("protected_reason", 48),
    ("conductor", 49),
    ("owner", 50),
    ("description", 51),
    ("allocation_uuid", 52),
    ("events", 54),
    ("retired", 61),
    ("retired_reason", 61),
    ("lessee", 65),
    ("network_data", 66),
    ("boot_mode", 75),
    ("secure_boot", 75),
    ("shard", 82),
    ("parent_node", 83),
    ("firmware_interface", 86),
    ("service_step", 87),
    ("disable_power_off", 95),
    ("instance_name", 104),
    ("health", 109),
];

/// The fields of later microversions than the request's (Ironic's `disallowed_fields`). The fake serves up to
/// 1.81, so those of later ones are always disallowed.
fn disallowed(version: ApiVersion) -> impl Iterator<Item = &'static str> {
    VERSIONED_FIELDS
        .iter()
        .filter(move |(field, minor)| !version.at_least(*minor) || NODE_FIELDS_NEWER.contains(field))
        .map(|(field, _)| *field)
}

/// States with a transition under way in which a node cannot be updated (Ironic: a target provision state is set
/// and the state is not in `UPDATE_ALLOWED_STATES`).
const TRANSITIONAL: &[&str] = &[
    "deploying",
    "wait call-back",
    "deploy hold",
    "deleting",
    "cleaning",
    "clean wait",
    "clean hold",
    "adopting",
    "rescuing",
    "rescue wait",
    "unrescuing",
    "servicing",
    "service wait",
];

/// The states in which the conductor lets a node's interfaces and resource class change.
const INTERFACE_UPDATE_STATES: &[&str] = &["enroll", "inspecting", "inspect wait", "manageable", "available"];

const STR_OR_NULL: &[&str] = &["string", "null"];
const BOOL_OR_STRING: &[&str] = &["string", "boolean", "null"];
const OBJECT_OR_NULL: &[&str] = &["object", "null"];

/// Ironic's node schema (`node_schema()`, plus `protected` and `protected_reason` for a patch).
fn node_schema(for_patch: bool) -> Schema {
    let s = |max: Option<usize>| {
        let schema = Schema::of_type(STR_OR_NULL);
        match max {
            Some(n) => schema.max_length(n),
            None => schema,
        }
    };
    let b = || Schema::of_type(BOOL_OR_STRING);
    let o = || Schema::of_type(OBJECT_OR_NULL);
    let mut properties = vec![
        ("automated_clean", b()),
        ("bios_interface", s(None)),
        ("boot_interface", s(None)),
        ("boot_mode", s(None)),
        ("chassis_uuid", s(None)),
        ("conductor_group", s(None)),
        ("console_enabled", b()),
        ("console_interface", s(None)),
        ("deploy_interface", s(None)),
        ("description", s(Some(4096))),
        ("disable_power_off", b()),
        ("driver", Schema::of_type(&["string"])),
        ("driver_info", o()),
        ("extra", o()),
        ("firmware_interface", s(None)),
        ("inspect_interface", s(None)),
        ("instance_info", o()),
        ("instance_name", Schema::of_type(STR_OR_NULL).min_length(1).max_length(255)),
        ("instance_uuid", s(None)),
        ("lessee", s(None)),
        ("management_interface", s(None)),
        ("maintenance", b()),
        ("name", s(None)),
        (
            "network_data",
            Schema::new().any_of(vec![
                Schema::of_type(&["null"]),
                Schema::of_type(&["object"]).no_additional_properties(),
                Schema::of_type(&["object"]),
            ]),
        ),
        ("network_interface", s(None)),
        ("owner", s(None)),
        ("parent_node", s(Some(36))),
        ("power_interface", s(None)),
        ("properties", o()),
        ("raid_interface", s(None)),
        ("rescue_interface", s(None)),
        ("resource_class", s(Some(80))),
        ("retired", b()),
        ("retired_reason", s(None)),
        ("secure_boot", b()),
        ("shard", s(None)),
        ("storage_interface", s(None)),
        ("uuid", s(None)),
        ("vendor_interface", s(None)),
    ];
    if for_patch {
        properties.push(("protected", b()));
        properties.push(("protected_reason", s(None)));
    }
    Schema::of_type(&["object"]).properties(properties).required(&["driver"]).no_additional_properties()
}

/// Ironic's `NODE_VALIDATE_EXTRA`: booleans (converted from oslo's strings) and UUIDs, in its order.
fn check_extra(fields: &mut Map<String, Value>) -> Result<()> {
    const CHECKS: &[(&str, bool)] = &[
        ("automated_clean", true),
        ("chassis_uuid", false),
        ("console_enabled", true),
        ("disable_power_off", true),
        ("instance_uuid", false),
        ("protected", true),
        ("maintenance", true),
        ("retired", true),
        ("uuid", false),
    ];
    for (name, is_bool) in CHECKS {
        let Some(value) = fields.get_mut(*name) else { continue };
        if *is_bool {
            *value = validate::boolean(name, value)?.map_or(Value::Null, Value::Bool);
        } else {
            validate::uuid(name, value)?;
        }
    }
    Ok(())
}

/// Ironic's `_check_names_acceptable` for one name; `invalid` words the 400 for a malformed one.
fn check_name(name: &Value, version: ApiVersion, invalid: impl Fn(&str) -> String) -> Result<()> {
    if !version.at_least(5) {
        return Err(ApiError::not_acceptable());
    }
    let text = str_of(name);
    if !name.as_str().is_some_and(is_valid_node_name) {
        return Err(ApiError::bad_request(invalid(&text)));
    }
    if RESERVED_NODE_NAMES.contains(&text.as_str()) {
        return Err(ApiError::bad_request(format!(
            "The word \"{text}\" is reserved and can not be used as a node name. Reserved words are: {}.",
            RESERVED_NODE_NAMES.join(", ")
        )));
    }
    Ok(())
}

/// `args.uuid_or_name` on an identifier in the path.
pub(crate) fn check_ident(name: &str, ident: &str) -> Result<()> {
    if is_valid_logical_name(ident) || is_uuid_like(ident) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!("Expected UUID or name for {name}: {ident}")))
    }
}

fn no_valid_host(driver: &str, conductor_group: &str) -> ApiError {
    ApiError::bad_request(format!(
        "No valid host was found. Reason: No conductor service registered which supports driver {driver} for \
         conductor group \"{conductor_group}\". Ensure the driver is valid and enabled."
    ))
}

fn chassis_not_found(fields: &Map<String, Value>) -> Result<()> {
    match fields.get("chassis_uuid").and_then(Value::as_str).filter(|c| !c.is_empty()) {
        // The fake has no chassis.
        Some(chassis) => Err(ApiError::bad_request(format!("Chassis {chassis} could not be found."))),
        None => Ok(()),
    }
}

/// The database's unique constraints on a node's name and instance UUID.
fn check_unique(store: &Store, node: &Node) -> Result<()> {
    if let Some(name) = &node.name
        && store.node_named(name, &node.uuid).is_some()
    {
        return Err(ApiError::conflict(format!("A node with name {name} already exists.")));
    }
    if let Some(instance) = &node.instance_uuid
        && store.node_with_instance(instance, &node.uuid).is_some()
    {
        return Err(ApiError::conflict(format!(
            "Instance {instance} is already associated with a node, it cannot be associated with this other node {}",
            node.uuid
        )));
    }
    Ok(())
}

/// Stores validated Ironic node fields into `node`: the typed ones into their fields, the others into
/// [`Node::other`] (interfaces always, as the conductor stores them; anything else only where it differs from
/// Ironic's default, `null` meaning the default).
fn store_fields(node: &mut Node, fields: &Map<String, Value>) {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let dict = |v: &Value| v.as_object().cloned().unwrap_or_default();
    let mut rest = Vec::new();
    for (field, value) in fields {
        match field.as_str() {
            "uuid" => {
                if let Some(uuid) = value.as_str().filter(|u| !u.is_empty()) {
                    node.uuid = uuid.to_owned();
                }
            }
            "name" => node.name = text(value),
            "instance_uuid" => node.instance_uuid = text(value),
            "driver" => node.driver = text(value).unwrap_or_default(),
            "driver_info" => node.driver_info = dict(value),
            "extra" => node.extra = dict(value),
            "properties" => node.properties = dict(value),
            "maintenance" => node.maintenance = value.as_bool().unwrap_or(false),
            "inspect_interface" => {
                node.inspect_interface = text(value).unwrap_or_else(|| Node::default().inspect_interface);
            }
            "resource_class" => node.resource_class = text(value),
            _ => rest.push((field, value)),
        }
    }
    for (field, value) in rest {
        let value = match field.as_str() {
            f if OTHER_INTERFACES.contains(&f) && value.is_null() => json!(default_interface(&node.driver, f)),
            f if OTHER_INTERFACES.contains(&f) => value.clone(),
            // Case-insensitive in Ironic, which stores it lowercase.
            "conductor_group" => json!(value.as_str().unwrap_or_default().to_lowercase()),
            _ => value.clone(),
        };
        if !OTHER_INTERFACES.contains(&field.as_str())
            && (value.is_null() || value == node_default(&node.driver, field))
        {
            node.other.remove(field);
        } else {
            node.other.insert(field.clone(), value);
        }
    }
}

/// `POST /v1/nodes`: enrols a node. 201 with the node (provision state "enroll", "available" before 1.11; power
/// state `null`) and its `Location`.
pub(crate) async fn create_node(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let body = request_body(&body)?;
    node_schema(false).check("node", &body).map_err(ApiError::bad_request)?;
    let Value::Object(mut fields) = body else { return Err(ApiError::bad_request("a node must be an object")) };
    check_extra(&mut fields)?;
    // Ironic's reject_fields_in_newer_versions: a field of a later microversion with a value is a 406.
    for field in disallowed(version) {
        let empty = if field == "conductor_group" { json!("") } else { Value::Null };
        if field == "name" && fields.get("name").is_none_or(Value::is_null) {
            continue;
        }
        if *fields.get(field).unwrap_or(&empty) != empty {
            return Err(ApiError::not_acceptable());
        }
    }
    if let Some(name) = fields.get("name").filter(|n| !n.is_null()) {
        check_name(name, version, |n| format!("Cannot create node with invalid name '{n}'"))?;
    }
    chassis_not_found(&fields)?;
    let mut node = Node {
        provision_state: if version.at_least(11) { "enroll" } else { "available" }.to_owned(),
        power_state: String::new(),
        ..Node::default()
    };
    store_fields(&mut node, &fields);
    if node.uuid.is_empty() {
        node.uuid = new_uuid();
    }
    if node.resource_class.as_deref() == Some("") {
        node.resource_class = None;
    }
    // The conductor gives the node every interface it was not given.
    for field in OTHER_INTERFACES {
        if !node.other.contains_key(*field) {
            node.other.insert((*field).to_owned(), json!(default_interface(&node.driver, field)));
        }
    }
    if !shared.config.enabled_drivers.contains(&node.driver) {
        return Err(no_valid_host(&node.driver, ""));
    }
    let base = shared.base_url(&headers);
    let mut store = shared.store();
    check_unique(&store, &node)?;
    if store.node(&node.uuid).is_some() {
        return Err(ApiError::conflict(format!("A node with UUID {} already exists.", node.uuid)));
    }
    node.created_at = Some(now_iso());
    let uuid = store.upsert_node(node);
    let node = store.node(&uuid).ok_or_else(|| ApiError::node_not_found(&uuid))?;
    let location = format!("{base}/v1/nodes/{uuid}");
    let resp = json_response(StatusCode::CREATED, Value::Object(views::node_view(node, &base)));
    Ok(with_location(resp, &location))
}

/// The node as Ironic's patch applies to it: every field of the object (those of later microversions are
/// `null` in the fake), interfaces as stored.
fn node_doc(node: &Node) -> Map<String, Value> {
    let mut doc: Map<String, Value> =
        NODE_FIELDS.iter().map(|f| ((*f).to_owned(), views::node_field(node, f))).collect();
    for field in NODE_FIELDS_NEWER {
        doc.insert((*field).to_owned(), node.other.get(*field).cloned().unwrap_or(Value::Null));
    }
    doc
}

/// `PATCH /v1/nodes/{ident}`: JSON Patch on the node, `?reset_interfaces=true` resetting the interfaces to the
/// new driver's defaults (only with a driver change, API 1.45+). 200 with the node.
pub(crate) async fn patch_node(
    State(shared): State<Arc<Shared>>,
    version: ApiVersion,
    headers: HeaderMap,
    Path(ident): Path<String>,
    pairs: Pairs,
    body: Bytes,
) -> Result<Response> {
    check_ident("node_ident", &ident)?;
    let query = Query::new(pairs.0);
    let reset = match query.get("reset_interfaces") {
        Some(v) => validate::boolean("reset_interfaces", &json!(v))?,
        None => None,
    };
    let ops = patch::parse(&request_body(&body)?)?;
    if reset.is_some() && !version.at_least(45) {
        return Err(ApiError::not_acceptable());
    }
    patch::check_allowed(&ops, PATCH_ALLOWED)?;
    if disallowed(version).any(|field| !patch::values(&ops, &format!("/{field}")).is_empty()) {
        return Err(ApiError::not_acceptable());
    }
    if reset == Some(true) && patch::values(&ops, "/driver").is_empty() {
        return Err(ApiError::bad_request(
            "The reset_interfaces parameter can only be used when changing the node's driver.",
        ));
    }
    if let Some(Value::String(d)) = patch::values(&ops, "/description").first()
        && d.chars().count() > 4096
    {
        return Err(ApiError::bad_request("Cannot update node with description exceeding 4096 characters"));
    }

    let base = shared.base_url(&headers);
    let mut store = shared.store();
    let old = store.node(&ident).cloned().ok_or_else(|| ApiError::node_not_found(&ident))?;
    let unassociating = old.maintenance && ops.len() == 1 && ops[0].op == Op::Remove && ops[0].path == "/instance_uuid";
    if !unassociating {
        if TRANSITIONAL.contains(&old.provision_state.as_str()) {
            return Err(ApiError::conflict(format!(
                "Node {ident} can not be updated while a state transition is in progress."
            )));
        }
        if old.provision_state == "inspecting" && version.at_least(39) {
            return Err(ApiError::conflict(format!(
                "Cannot update node \"{}\" while it is in state \"inspecting\".",
                old.uuid
            )));
        }
    }
    for name in patch::values(&ops, "/name") {
        check_name(name, version, |n| format!("Node {ident}: Cannot change name to invalid name '{n}'"))?;
    }

    let mut doc = node_doc(&old);
    patch::apply_all(&mut doc, &ops)?;
    let schema = node_schema(true);
    let known: Vec<&str> = schema.property_names().collect();
    doc.retain(|k, _| known.contains(&k.as_str()));
    let mut doc = Value::Object(doc);
    schema.check("patch", &doc).map_err(ApiError::bad_request)?;
    let Value::Object(fields) = &mut doc else { return Err(ApiError::bad_request("a node must be an object")) };
    check_extra(fields)?;
    chassis_not_found(fields)?;
    // A field the patch removed is unset (`None` in Ironic).
    for field in known {
        fields.entry(field).or_insert(Value::Null);
    }
    let mut node = old.clone();
    store_fields(&mut node, fields);
    let driver_changed = node.driver != old.driver;
    if driver_changed && !shared.config.enabled_drivers.contains(&node.driver) {
        let group = views::node_field(&node, "conductor_group");
        return Err(no_valid_host(&node.driver, group.as_str().unwrap_or_default()));
    }
    update_checks(&old, &mut node, driver_changed && reset == Some(true))?;
    check_unique(&store, &node)?;
    node.updated_at = Some(now_iso());
    let stored = store.node_mut(&old.uuid)?;
    *stored = node;
    Ok(json_response(StatusCode::OK, Value::Object(views::node_view(stored, &base))))
}

/// Python's truth of a string field: set and not empty.
fn truthy(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.is_empty())
}

/// What the conductor's `update_node` checks and adjusts once the patch is applied.
fn update_checks(old: &Node, node: &mut Node, reset_interfaces: bool) -> Result<()> {
    let field = |n: &Node, f: &str| views::node_field(n, f);
    let changed = |n: &Node, f: &str| field(old, f) != field(n, f);
    let state = old.provision_state.as_str();
    if old.maintenance && !node.maintenance {
        node.other.remove("maintenance_reason");
        node.other.remove("fault");
    }
    let protected = field(node, "protected") == json!(true);
    if changed(node, "protected") {
        if !protected {
            node.other.remove("protected_reason");
        } else if !matches!(state, "active" | "rescue") {
            return Err(ApiError::conflict(format!(
                "Node {} can only be made protected in provision states 'active' or 'rescue', the current state is \
                 '{state}'",
                node.uuid
            )));
        }
    }
    if changed(node, "protected_reason") && truthy(&field(node, "protected_reason")) && !protected {
        return Err(ApiError::bad_request("The protected_reason field can only be set when protected is True"));
    }
    let retired = field(node, "retired") == json!(true);
    if changed(node, "retired") {
        if !retired {
            node.other.remove("retired_reason");
        } else if state == "available" {
            return Err(ApiError::conflict(format!(
                "Node {} can not have 'retired' set in provision state 'available', the current state is '{state}'",
                node.uuid
            )));
        }
    }
    if changed(node, "retired_reason") && truthy(&field(node, "retired_reason")) && !retired {
        return Err(ApiError::bad_request("The retired_reason field can only be set when retired is True"));
    }

    let may_change = INTERFACE_UPDATE_STATES.contains(&state) || old.maintenance;
    let interfaces = OTHER_INTERFACES.iter().copied().chain(["inspect_interface"]);
    for iface in interfaces {
        if !changed(node, iface) {
            if reset_interfaces {
                if iface == "inspect_interface" {
                    node.inspect_interface = Node::default().inspect_interface;
                } else {
                    node.other.insert(iface.to_owned(), json!(default_interface(&node.driver, iface)));
                }
            }
            continue;
        }
        if !may_change {
            return Err(ApiError::conflict(format!(
                "Node {} can not have {iface} updated unless it is in one of allowed ({}) states or in maintenance \
                 mode. Current state is '{state}'.",
                node.uuid,
                INTERFACE_UPDATE_STATES.join(", ")
            )));
        }
    }
    if changed(node, "instance_uuid")
        && let (Some(_), Some(current)) = (&node.instance_uuid, &old.instance_uuid)
    {
        return Err(ApiError::conflict(format!("Node {} is associated with instance {current}.", node.uuid)));
    }
    if changed(node, "resource_class") && old.resource_class.is_some() && !INTERFACE_UPDATE_STATES.contains(&state) {
        return Err(ApiError::conflict(format!(
            "Node {} can not have resource_class updated unless it is in one of allowed ({}) states. Current state \
             is '{state}'.",
            node.uuid,
            INTERFACE_UPDATE_STATES.join(", ")
        )));
    }
    Ok(())
}
