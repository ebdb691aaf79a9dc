//! How nodes and ports look on the wire, and the list-call query parameters Ironic shares between resources
//! (`fields`, `detail`, `limit`, `marker`) with the `next` link of a full page.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::model::{Node, Port};

/// Every field of a node's detailed view at microversion 1.81 (besides the links), which is also what `fields`
/// may name.
pub(crate) const NODE_FIELDS: &[&str] = &[
    "uuid",
    "created_at",
    "updated_at",
    "allocation_uuid",
    "automated_clean",
    "bios_interface",
    "boot_interface",
    "boot_mode",
    "chassis_uuid",
    "clean_step",
    "conductor",
    "conductor_group",
    "console_enabled",
    "console_interface",
    "deploy_interface",
    "deploy_step",
    "description",
    "driver",
    "driver_info",
    "driver_internal_info",
    "extra",
    "fault",
    "inspect_interface",
    "inspection_finished_at",
    "inspection_started_at",
    "instance_info",
    "instance_uuid",
    "last_error",
    "lessee",
    "maintenance",
    "maintenance_reason",
    "management_interface",
    "name",
    "network_data",
    "network_interface",
    "owner",
    "power_interface",
    "power_state",
    "properties",
    "protected",
    "protected_reason",
    "provision_state",
    "provision_updated_at",
    "raid_config",
    "raid_interface",
    "rescue_interface",
    "reservation",
    "resource_class",
    "retired",
    "retired_reason",
    "secure_boot",
    "storage_interface",
    "target_power_state",
    "target_provision_state",
    "target_raid_config",
    "traits",
    "vendor_interface",
];

/// Node fields of microversions after 1.81: naming one in `fields` is Ironic's 406.
pub(crate) const NODE_FIELDS_NEWER: &[&str] =
    &["shard", "parent_node", "firmware_interface", "service_step", "disable_power_off", "instance_name", "health"];

/// What `GET /v1/nodes` shows without `fields` or `detail`, as in Ironic.
pub(crate) const NODE_LIST_FIELDS: &[&str] =
    &["uuid", "name", "instance_uuid", "power_state", "provision_state", "maintenance"];

/// The node's hardware interfaces besides `inspect_interface` (a typed field of [`Node`]).
pub(crate) const OTHER_INTERFACES: &[&str] = &[
    "bios_interface",
    "boot_interface",
    "console_interface",
    "deploy_interface",
    "management_interface",
    "network_interface",
    "power_interface",
    "raid_interface",
    "rescue_interface",
    "storage_interface",
    "vendor_interface",
];

/// Node fields that are JSON objects in Ironic, shown as `{}` when unset.
pub(crate) const NODE_DICT_FIELDS: &[&str] = &[
    "clean_step",
    "deploy_step",
    "driver_info",
    "driver_internal_info",
    "extra",
    "instance_info",
    "network_data",
    "properties",
    "raid_config",
    "target_raid_config",
];

/// The interfaces a node of hardware type `driver` gets by default (what Ironic's conductor computes from the
/// enabled interfaces of a stock configuration). Not `inspect_interface`, which defaults to "agent" in the fake.
pub(crate) fn default_interface(driver: &str, field: &str) -> &'static str {
    let fake = driver == "fake-hardware";
    let redfish = driver == "redfish";
    match field {
        "bios_interface" if redfish => "redfish",
        "bios_interface" => "no-bios",
        "boot_interface" | "deploy_interface" if fake => "fake",
        "boot_interface" => "ipxe",
        "deploy_interface" => "direct",
        "console_interface" => "no-console",
        "management_interface" | "power_interface" | "vendor_interface" if fake => "fake",
        "management_interface" | "power_interface" | "vendor_interface" if redfish => "redfish",
        "management_interface" | "power_interface" | "vendor_interface" => "ipmitool",
        "network_interface" | "storage_interface" => "noop",
        "raid_interface" => "no-raid",
        "rescue_interface" => "no-rescue",
        _ => "",
    }
}

/// What Ironic shows for a node field the fake keeps no value of.
pub(crate) fn node_default(driver: &str, field: &str) -> Value {
    if OTHER_INTERFACES.contains(&field) {
        return json!(default_interface(driver, field));
    }
    match field {
        f if NODE_DICT_FIELDS.contains(&f) => json!({}),
        "console_enabled" | "protected" | "retired" => json!(false),
        "conductor_group" => json!(""),
        "conductor" => json!(CONDUCTOR),
        _ => Value::Null,
    }
}

/// The conductor every node of the fake is mapped to (the host named in "node is locked" errors too).
pub(crate) const CONDUCTOR: &str = "fake-conductor";

/// One field of a node as the API shows it.
pub(crate) fn node_field(node: &Node, field: &str) -> Value {
    match field {
        "uuid" => json!(node.uuid),
        "name" => json!(node.name),
        "instance_uuid" => json!(node.instance_uuid),
        "provision_state" => json!(node.provision_state),
        "power_state" if node.power_state.is_empty() => Value::Null,
        "power_state" => json!(node.power_state),
        "inspect_interface" => json!(node.inspect_interface),
        "driver" => json!(node.driver),
        "driver_info" => Value::Object(node.driver_info.clone()),
        "maintenance" => json!(node.maintenance),
        "extra" => Value::Object(node.extra.clone()),
        "properties" => Value::Object(node.properties.clone()),
        "inspection_started_at" => json!(node.inspection_started_at),
        "inspection_finished_at" => json!(node.inspection_finished_at),
        "traits" => json!(node.traits),
        "resource_class" => json!(node.resource_class),
        "created_at" => json!(node.created_at),
        "updated_at" => json!(node.updated_at),
        // Computed by Ironic, never stored.
        "conductor" | "allocation_uuid" | "reservation" | "target_power_state" | "target_provision_state" => {
            node_default(&node.driver, field)
        }
        other => match node.other.get(other) {
            Some(Value::Null) | None => node_default(&node.driver, other),
            Some(v) => v.clone(),
        },
    }
}

/// Ironic's `self` and `bookmark` links of a resource.
pub(crate) fn links(base: &str, resource: &str, uuid: &str) -> Value {
    json!([
        {"href": format!("{base}/v1/{resource}/{uuid}"), "rel": "self"},
        {"href": format!("{base}/{resource}/{uuid}"), "rel": "bookmark"},
    ])
}

/// The detailed view of a node, as `GET /v1/nodes/{ident}` shows it: every field of [`NODE_FIELDS`], its links
/// and the links to its sub-resources.
///
/// The view is that of microversion 1.81 whatever the request's: the fake does not hide the fields older
/// microversions lack.
pub(crate) fn node_view(node: &Node, base: &str) -> Map<String, Value> {
    let mut m: Map<String, Value> = NODE_FIELDS.iter().map(|f| ((*f).to_owned(), node_field(node, f))).collect();
    m.insert("links".into(), links(base, "nodes", &node.uuid));
    for sub in ["ports", "states", "portgroups", "volume"] {
        m.insert(sub.into(), links(base, "nodes", &format!("{}/{sub}", node.uuid)));
    }
    m
}

/// Every field of a port's detailed view at microversion 1.81 (besides `links`).
pub(crate) const PORT_FIELDS: &[&str] = &[
    "uuid",
    "created_at",
    "updated_at",
    "address",
    "extra",
    "internal_info",
    "is_smartnic",
    "local_link_connection",
    "physical_network",
    "pxe_enabled",
    "node_uuid",
    "portgroup_uuid",
];

/// Port fields of microversions after 1.81: naming one in `fields` (or a body) is Ironic's 406.
pub(crate) const PORT_FIELDS_NEWER: &[&str] =
    &["name", "description", "vendor", "category", "available_for_dynamic_portgroup"];

/// What `GET /v1/ports` shows without `fields` or `detail`, as in Ironic.
pub(crate) const PORT_LIST_FIELDS: &[&str] = &["uuid", "address"];

/// The detailed view of a port (that of microversion 1.81, whatever the request's).
pub(crate) fn port_view(port: &Port, base: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("uuid".into(), json!(port.uuid));
    m.insert("created_at".into(), json!(port.created_at));
    m.insert("updated_at".into(), json!(port.updated_at));
    m.insert("address".into(), json!(port.address));
    m.insert("extra".into(), Value::Object(port.extra.clone()));
    m.insert("internal_info".into(), Value::Object(port.internal_info.clone()));
    m.insert("is_smartnic".into(), json!(port.is_smartnic));
    m.insert("local_link_connection".into(), Value::Object(port.local_link_connection.clone()));
    m.insert("physical_network".into(), json!(port.physical_network));
    m.insert("pxe_enabled".into(), json!(port.pxe_enabled));
    m.insert("node_uuid".into(), json!(port.node_uuid));
    m.insert("portgroup_uuid".into(), Value::Null);
    m.insert("links".into(), links(base, "ports", &port.uuid));
    m
}

/// Ironic's 406 when `fields` names a field of a later microversion than the fake serves.
pub(crate) fn reject_newer_fields(query: &Query, newer: &[&str]) -> Result<(), ApiError> {
    let named = query.get("fields").unwrap_or_default();
    if named.split(',').map(|f| f.trim().to_ascii_lowercase()).any(|f| newer.contains(&f.as_str())) {
        return Err(ApiError::not_acceptable());
    }
    Ok(())
}

/// Keeps only `keep` of a view, plus `uuid` and `links` (Ironic always keeps `links`; `uuid` is what a client
/// needs for the next page's marker).
pub(crate) fn select<S: AsRef<str>>(mut view: Map<String, Value>, keep: &[S]) -> Value {
    view.retain(|k, _| k == "uuid" || k == "links" || keep.iter().any(|f| f.as_ref() == k));
    Value::Object(view)
}

/// Which fields a response shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The list view: the resource's short set of fields.
    Summary,
    /// Every field.
    Detail,
    /// These fields (plus `uuid` and `links`).
    Fields(Vec<String>),
}

impl Shape {
    /// A single resource shows every field unless `fields` names some.
    pub(crate) fn or_detail(self) -> Shape {
        if self == Shape::Summary { Shape::Detail } else { self }
    }

    pub(crate) fn apply(&self, view: Map<String, Value>, summary: &[&str]) -> Value {
        match self {
            Shape::Summary => select(view, summary),
            Shape::Detail => Value::Object(view),
            Shape::Fields(fields) => select(view, fields),
        }
    }
}

/// The query string of a request, decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub(crate) fn new(pairs: Vec<(String, String)>) -> Query {
        Query { pairs }
    }

    /// The first value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The page size: `max_limit` when absent, capped at `max_limit`; zero, negative or not a number is a 400,
    /// as in Ironic.
    pub(crate) fn limit(&self, max_limit: usize) -> Result<usize, ApiError> {
        let Some(raw) = self.get("limit") else { return Ok(max_limit) };
        let limit: i64 = raw.trim().parse().map_err(|_| {
            ApiError::bad_request(format!(
                "Invalid input for field/attribute limit. Value: '{raw}'. unable to convert to int"
            ))
        })?;
        if limit <= 0 {
            return Err(ApiError::bad_request("Limit must be positive"));
        }
        Ok(usize::try_from(limit).map_or(max_limit, |l| l.min(max_limit)))
    }

    /// `fields` (checked against `valid`) or `detail` (true with `detail_route`), or the summary.
    pub(crate) fn shape(&self, valid: &[&str], detail_route: bool) -> Result<Shape, ApiError> {
        let detail = detail_route
            || match self.get("detail") {
                None => false,
                Some(v) => parse_bool(v).ok_or_else(|| {
                    ApiError::bad_request(format!("Invalid input for field/attribute detail. Value: '{v}'."))
                })?,
            };
        let Some(fields) = self.get("fields") else {
            return Ok(if detail { Shape::Detail } else { Shape::Summary });
        };
        if detail {
            return Err(ApiError::bad_request("Can not specify ?detail=True and fields in the same request."));
        }
        let fields: Vec<String> =
            fields.split(',').map(str::trim).filter(|f| !f.is_empty()).map(str::to_owned).collect();
        let invalid: Vec<&str> = fields.iter().map(String::as_str).filter(|f| !valid.contains(f)).collect();
        if !invalid.is_empty() {
            return Err(ApiError::bad_request(format!("Field(s) \"{}\" are not valid", invalid.join(", "))));
        }
        Ok(Shape::Fields(fields))
    }

    /// Ironic's `next` link, as Ironic 39 builds it (`api/controllers/v1/collection.py`): `sort_key`, `sort_dir`,
    /// the flags the resource keeps (nodes: `associated`, `maintenance`, `retired` when true and `detail` when
    /// given; ports: `detail`), `fields`, then `limit` and `marker`. Every other filter (`provision_state`,
    /// `node_uuid`, `driver`, ...) is dropped, so a client that follows `next` verbatim lists everything after
    /// the first page.
    pub(crate) fn next_url(&self, base: &str, resource: &str, limit: usize, marker: &str) -> String {
        let python_bool = |v: &str| if parse_bool(v) == Some(true) { "True" } else { "False" };
        let mut url = format!(
            "{base}/v1/{resource}?sort_key={}&sort_dir={}&",
            self.get("sort_key").unwrap_or("id"),
            self.get("sort_dir").unwrap_or("asc")
        );
        if resource == "nodes" {
            for flag in ["associated", "maintenance", "retired"] {
                if self.get(flag).and_then(parse_bool) == Some(true) {
                    url.push_str(&format!("{flag}=True&"));
                }
            }
        }
        if let Some(d) = self.get("detail") {
            url.push_str(&format!("detail={}&", python_bool(d)));
        }
        if let Some(f) = self.get("fields") {
            url.push_str(&format!("fields={f}&"));
        }
        url.push_str(&format!("limit={limit}&marker={marker}"));
        url
    }
}

/// Ironic's (oslo's) boolean strings.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Some(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Some(false),
        _ => None,
    }
}

/// A page of a list: the items and, when the page is full, the `next` link.
pub(crate) fn page(key: &str, items: Vec<Value>, next: Option<String>) -> Value {
    let mut m = Map::new();
    m.insert(key.to_owned(), Value::Array(items));
    if let Some(next) = next {
        m.insert("next".to_owned(), Value::String(next));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(raw: &str) -> Query {
        let pairs = raw
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (k, v) = s.split_once('=').unwrap_or((s, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect();
        Query::new(pairs)
    }

    #[test]
    fn limits() {
        assert_eq!(query("").limit(1000).unwrap(), 1000);
        assert_eq!(query("limit=10").limit(1000).unwrap(), 10);
        assert_eq!(query("limit=5000").limit(1000).unwrap(), 1000);
        assert_eq!(query("limit=0").limit(1000).unwrap_err().faultstring, "Limit must be positive");
        assert!(query("limit=-1").limit(1000).is_err());
        assert!(query("limit=x").limit(1000).is_err());
    }

    #[test]
    fn next_is_built_as_ironic_builds_it() {
        let q = query("provision_state=inspect%20wait&limit=2&marker=a&fields=uuid&maintenance=false");
        assert_eq!(
            q.next_url("http://h", "nodes", 2, "b"),
            "http://h/v1/nodes?sort_key=id&sort_dir=asc&fields=uuid&limit=2&marker=b"
        );
        let q = query("node_uuid=x&sort_dir=desc&detail=true&maintenance=1");
        assert_eq!(
            q.next_url("http://h", "nodes", 5, "c"),
            "http://h/v1/nodes?sort_key=id&sort_dir=desc&maintenance=True&detail=True&limit=5&marker=c"
        );
        assert_eq!(
            query("node_uuid=x&fields=address").next_url("http://h", "ports", 1, "p"),
            "http://h/v1/ports?sort_key=id&sort_dir=asc&fields=address&limit=1&marker=p"
        );
    }

    #[test]
    fn shapes() {
        assert_eq!(query("").shape(NODE_FIELDS, false).unwrap(), Shape::Summary);
        assert_eq!(query("detail=True").shape(NODE_FIELDS, false).unwrap(), Shape::Detail);
        assert_eq!(query("").shape(NODE_FIELDS, true).unwrap(), Shape::Detail);
        assert_eq!(
            query("fields=uuid,provision_state").shape(NODE_FIELDS, false).unwrap(),
            Shape::Fields(vec!["uuid".into(), "provision_state".into()])
        );
        assert!(query("fields=bogus").shape(NODE_FIELDS, false).is_err());
        assert!(query("fields=uuid&detail=true").shape(NODE_FIELDS, false).is_err());
    }
}
