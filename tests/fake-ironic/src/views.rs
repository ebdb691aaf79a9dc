//! How nodes and ports look on the wire, and the list-call query parameters Ironic shares between resources
//! (`fields`, `detail`, `limit`, `marker`) with the `next` link of a full page.

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::model::{Node, Port};

/// Every field of a node's detailed view (besides `links`), which is also what `fields` may name.
pub(crate) const NODE_FIELDS: &[&str] = &[
    "uuid",
    "name",
    "instance_uuid",
    "provision_state",
    "target_provision_state",
    "power_state",
    "target_power_state",
    "inspect_interface",
    "driver",
    "driver_info",
    "maintenance",
    "maintenance_reason",
    "extra",
    "properties",
    "inspection_started_at",
    "inspection_finished_at",
    "last_error",
];

/// What `GET /v1/nodes` shows without `fields` or `detail`, as in Ironic.
pub(crate) const NODE_LIST_FIELDS: &[&str] =
    &["uuid", "name", "instance_uuid", "power_state", "provision_state", "maintenance"];

/// The top-level node fields `PATCH` may change; the other ones in [`NODE_FIELDS`] are read-only.
pub(crate) const NODE_PATCHABLE: &[&str] = &[
    "name",
    "instance_uuid",
    "inspect_interface",
    "driver",
    "driver_info",
    "maintenance",
    "extra",
    "properties",
    "inspection_started_at",
    "inspection_finished_at",
];

/// Every field of a port's detailed view (besides `links`).
pub(crate) const PORT_FIELDS: &[&str] = &[
    "uuid",
    "address",
    "node_uuid",
    "pxe_enabled",
    "extra",
    "local_link_connection",
    "physical_network",
    "portgroup_uuid",
];

/// What `GET /v1/ports` shows without `fields` or `detail`, as in Ironic.
pub(crate) const PORT_LIST_FIELDS: &[&str] = &["uuid", "address"];

/// Ironic's `self` and `bookmark` links of a resource.
pub(crate) fn links(base: &str, resource: &str, uuid: &str) -> Value {
    json!([
        {"href": format!("{base}/v1/{resource}/{uuid}"), "rel": "self"},
        {"href": format!("{base}/{resource}/{uuid}"), "rel": "bookmark"},
    ])
}

/// The detailed view of a node, as `GET /v1/nodes/{ident}` shows it.
pub(crate) fn node_view(node: &Node, base: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("uuid".into(), json!(node.uuid));
    m.insert("name".into(), json!(node.name));
    m.insert("instance_uuid".into(), json!(node.instance_uuid));
    m.insert("provision_state".into(), json!(node.provision_state));
    m.insert("target_provision_state".into(), Value::Null);
    m.insert("power_state".into(), json!(node.power_state));
    m.insert("target_power_state".into(), Value::Null);
    m.insert("inspect_interface".into(), json!(node.inspect_interface));
    m.insert("driver".into(), json!(node.driver));
    m.insert("driver_info".into(), Value::Object(node.driver_info.clone()));
    m.insert("maintenance".into(), json!(node.maintenance));
    m.insert("maintenance_reason".into(), Value::Null);
    m.insert("extra".into(), Value::Object(node.extra.clone()));
    m.insert("properties".into(), Value::Object(node.properties.clone()));
    m.insert("inspection_started_at".into(), json!(node.inspection_started_at));
    m.insert("inspection_finished_at".into(), json!(node.inspection_finished_at));
    m.insert("last_error".into(), Value::Null);
    m.insert("links".into(), links(base, "nodes", &node.uuid));
    m
}

/// The detailed view of a port.
pub(crate) fn port_view(port: &Port, base: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("uuid".into(), json!(port.uuid));
    m.insert("address".into(), json!(port.address));
    m.insert("node_uuid".into(), json!(port.node_uuid));
    m.insert("pxe_enabled".into(), json!(port.pxe_enabled));
    m.insert("extra".into(), Value::Object(port.extra.clone()));
    m.insert("local_link_connection".into(), json!({}));
    m.insert("physical_network".into(), Value::Null);
    m.insert("portgroup_uuid".into(), Value::Null);
    m.insert("links".into(), links(base, "ports", &port.uuid));
    m
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

/// A node rebuilt from its patched view: the patchable fields taken from `doc`, the rest from `old`. A removed
/// top-level field goes back to its default, as in Ironic.
pub(crate) fn node_from_patched(doc: &Map<String, Value>, old: &Node) -> Result<Node, ApiError> {
    let mut node = old.clone();
    node.name = opt_string(doc, "name")?;
    node.instance_uuid = opt_string(doc, "instance_uuid")?;
    node.inspect_interface = opt_string(doc, "inspect_interface")?.unwrap_or_else(|| Node::default().inspect_interface);
    node.driver = opt_string(doc, "driver")?.ok_or_else(|| {
        ApiError::bad_request("Invalid input for field/attribute driver. Value: 'None'. Mandatory field missing.")
    })?;
    node.driver_info = object(doc, "driver_info")?;
    node.extra = object(doc, "extra")?;
    node.properties = object(doc, "properties")?;
    node.maintenance = match doc.get("maintenance") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid("maintenance", v)),
    };
    node.inspection_started_at = opt_string(doc, "inspection_started_at")?;
    node.inspection_finished_at = opt_string(doc, "inspection_finished_at")?;
    Ok(node)
}

fn invalid(field: &str, value: &Value) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, format!("Invalid input for field/attribute {field}. Value: '{value}'."))
}

fn opt_string(doc: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match doc.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(invalid(field, v)),
    }
}

fn object(doc: &Map<String, Value>, field: &str) -> Result<Map<String, Value>, ApiError> {
    match doc.get(field) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(v) => Err(invalid(field, v)),
    }
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
