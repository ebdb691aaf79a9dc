//! What a processing run wants done in Ironic, collected by the hooks and applied by the engine.
//!
//! ironic-inspector writes to Ironic from inside each hook and re-reads the node after every write. Here the hooks
//! only record their writes in a [`Plan`]; the engine applies it as ONE node JSON-PATCH, then port creates, port
//! patches and port deletes. The two differences that matter are folded in here:
//! - capabilities from several hooks merge into one `/properties/capabilities` op, against the node's string;
//! - a hook that changes a port this run creates (e.g. `local_link_connection` after `validate_interfaces`)
//!   changes the [`NewPort`] instead of patching a port that does not exist yet ([`Plan::port_by_address`]).
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One JSON-patch operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchOp {
    /// `add`, `replace` or `remove`.
    pub op: String,
    /// JSON pointer, e.g. `/properties/cpus`.
    pub path: String,
    /// The value (absent for `remove`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

impl PatchOp {
    /// An op from its parts.
    pub fn new(op: &str, path: &str, value: Option<Value>) -> Self {
        Self { op: op.to_owned(), path: path.to_owned(), value }
    }
}

/// What the hooks see of the node as Ironic has it (the engine fetches it once before processing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeView {
    /// Node UUID.
    pub uuid: String,
    /// Ironic provision state, e.g. `manageable`.
    pub provision_state: String,
    /// `node.properties`.
    pub properties: Map<String, Value>,
    /// `node.extra`.
    pub extra: Map<String, Value>,
    /// The node's ports.
    pub ports: Vec<PortView>,
}

/// One of the node's ports as Ironic has it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PortView {
    /// Port UUID.
    pub uuid: String,
    /// MAC address (lowercase).
    pub address: String,
    /// `pxe_enabled`.
    pub pxe_enabled: bool,
    /// `extra`.
    pub extra: Map<String, Value>,
    /// `local_link_connection`.
    pub local_link_connection: Map<String, Value>,
    /// `physical_network`.
    pub physical_network: Option<String>,
}

/// A port to create (`POST /v1/ports`, with the node's UUID).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewPort {
    /// MAC address (lowercase).
    pub address: String,
    /// `pxe_enabled`.
    pub pxe_enabled: bool,
    /// `extra`, e.g. `{"client-id": ...}`.
    pub extra: Map<String, Value>,
    /// `local_link_connection`.
    pub local_link_connection: Map<String, Value>,
    /// `physical_network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_network: Option<String>,
}

/// Which port a hook changes: one Ironic already has, or one this plan creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortTarget {
    /// An existing port, by UUID.
    Existing(String),
    /// The n-th port of [`Plan::new_ports`].
    New(usize),
}

/// A port as it will be once the plan is applied: the node's ports minus deletes plus creates, patches applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedPort {
    /// Where changes to this port go ([`Plan::update_port`]).
    pub target: PortTarget,
    /// MAC address (lowercase).
    pub address: String,
    /// `pxe_enabled`.
    pub pxe_enabled: bool,
    /// `extra`.
    pub extra: Map<String, Value>,
    /// `local_link_connection`.
    pub local_link_connection: Map<String, Value>,
    /// `physical_network`.
    pub physical_network: Option<String>,
}

/// Everything a processing run wants done in Ironic.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    node_ops: Vec<PatchOp>,
    capabilities: Vec<(String, Option<String>)>,
    new_ports: Vec<NewPort>,
    port_patches: Vec<(String, Vec<PatchOp>)>,
    port_deletes: Vec<String>,
}

const CAPABILITIES_PATH: &str = "/properties/capabilities";

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds/overwrites one node op, e.g. ("add", "/properties/cpus", "4"). Later writes to the same path win.
    pub fn set_node(&mut self, op: &str, path: &str, value: Option<Value>) {
        let new = PatchOp::new(op, path, value);
        match self.node_ops.iter_mut().find(|o| o.path == path) {
            Some(existing) => *existing = new,
            None => self.node_ops.push(new),
        }
    }

    /// Merges capabilities (value `None` removes one); all merges become ONE op on `/properties/capabilities`,
    /// computed against the node's existing `properties.capabilities` string ("k:v,k:v"), new values winning.
    pub fn merge_capabilities(&mut self, caps: impl IntoIterator<Item = (String, Option<String>)>) {
        for (key, value) in caps {
            match self.capabilities.iter_mut().find(|(k, _)| *k == key) {
                Some(existing) => existing.1 = value,
                None => self.capabilities.push((key, value)),
            }
        }
    }

    /// Records a port to create.
    pub fn create_port(&mut self, port: NewPort) {
        self.new_ports.push(port);
    }

    /// Records one op on an existing port; ops on the same path of the same port: the later wins.
    /// Ignored for a port this plan deletes.
    pub fn patch_port(&mut self, port_uuid: &str, op: PatchOp) {
        if self.port_deletes.iter().any(|d| d == port_uuid) {
            return;
        }
        let group = match self.port_patches.iter().position(|(uuid, _)| uuid == port_uuid) {
            Some(i) => &mut self.port_patches[i].1,
            None => {
                self.port_patches.push((port_uuid.to_owned(), Vec::new()));
                let last = self.port_patches.len() - 1;
                &mut self.port_patches[last].1
            }
        };
        match group.iter_mut().find(|o| o.path == op.path) {
            Some(existing) => *existing = op,
            None => group.push(op),
        }
    }

    /// Records a port deletion (and drops any patch planned for it).
    pub fn delete_port(&mut self, port_uuid: &str) {
        self.port_patches.retain(|(uuid, _)| uuid != port_uuid);
        if !self.port_deletes.iter().any(|d| d == port_uuid) {
            self.port_deletes.push(port_uuid.to_owned());
        }
    }

    /// The node's single JSON-PATCH (node ops, then the merged capabilities), empty if nothing changes.
    pub fn node_patch(&self, node: &NodeView) -> Vec<PatchOp> {
        if self.capabilities.is_empty() {
            return self.node_ops.clone();
        }
        // A hook that set the whole capabilities string is the base the merges apply to.
        let explicit = self.node_ops.iter().find(|o| o.path == CAPABILITIES_PATH && o.op != "remove");
        let base = match explicit {
            Some(op) => op.value.clone().unwrap_or(Value::Null),
            None => node.properties.get("capabilities").cloned().unwrap_or(Value::Null),
        };
        let mut entries = capability_entries(&base);
        for (key, value) in &self.capabilities {
            match entries.iter_mut().find(|(k, _)| k == key) {
                Some(existing) => existing.1 = Slot::from(value.clone()),
                None => entries.push((key.clone(), Slot::from(value.clone()))),
            }
        }
        let mut ops: Vec<PatchOp> = self.node_ops.iter().filter(|o| o.path != CAPABILITIES_PATH).cloned().collect();
        ops.push(PatchOp::new("add", CAPABILITIES_PATH, Some(Value::String(render_capabilities(&entries)))));
        ops
    }

    /// Ports to create, in order.
    pub fn new_ports(&self) -> &[NewPort] {
        &self.new_ports
    }

    /// Patches of existing ports, grouped per port UUID, in the order first touched.
    pub fn port_patches(&self) -> Vec<(String, Vec<PatchOp>)> {
        self.port_patches.iter().filter(|(_, ops)| !ops.is_empty()).cloned().collect()
    }

    /// UUIDs of ports to delete.
    pub fn port_deletes(&self) -> &[String] {
        &self.port_deletes
    }

    /// Number of Ironic write requests this plan needs: the node patch counts 1 if non-empty, plus one per port
    /// create, per patched port and per port delete.
    pub fn write_requests(&self, node: &NodeView) -> usize {
        usize::from(!self.node_patch(node).is_empty())
            + self.new_ports.len()
            + self.port_patches().len()
            + self.port_deletes.len()
    }

    /// True if the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.node_ops.is_empty()
            && self.capabilities.is_empty()
            && self.new_ports.is_empty()
            && self.port_patches.is_empty()
            && self.port_deletes.is_empty()
    }

    /// The port with this MAC as it will be after the plan (existing, not deleted, or created by the plan).
    pub fn port_by_address(&self, node: &NodeView, mac: &str) -> Option<PlannedPort> {
        let mac = mac.to_ascii_lowercase();
        let existing = node
            .ports
            .iter()
            .filter(|p| !self.port_deletes.contains(&p.uuid))
            .find(|p| p.address.eq_ignore_ascii_case(&mac));
        if let Some(port) = existing {
            let mut planned = PlannedPort {
                target: PortTarget::Existing(port.uuid.clone()),
                address: port.address.to_ascii_lowercase(),
                pxe_enabled: port.pxe_enabled,
                extra: port.extra.clone(),
                local_link_connection: port.local_link_connection.clone(),
                physical_network: port.physical_network.clone(),
            };
            if let Some((_, ops)) = self.port_patches.iter().find(|(uuid, _)| *uuid == port.uuid) {
                for op in ops {
                    planned.apply(op);
                }
            }
            return Some(planned);
        }
        let (index, port) = self.new_ports.iter().enumerate().find(|(_, p)| p.address.eq_ignore_ascii_case(&mac))?;
        Some(PlannedPort {
            target: PortTarget::New(index),
            address: port.address.to_ascii_lowercase(),
            pxe_enabled: port.pxe_enabled,
            extra: port.extra.clone(),
            local_link_connection: port.local_link_connection.clone(),
            physical_network: port.physical_network.clone(),
        })
    }

    /// Changes a port found with [`Plan::port_by_address`]: a patch of an existing port, or an edit of a port
    /// this plan creates (paths `/pxe_enabled`, `/physical_network`, `/extra/<k>`, `/local_link_connection/<k>`).
    pub fn update_port(&mut self, target: &PortTarget, op: PatchOp) {
        match target {
            PortTarget::Existing(uuid) => self.patch_port(uuid, op),
            PortTarget::New(index) => {
                if let Some(port) = self.new_ports.get_mut(*index) {
                    let mut planned = PlannedPort {
                        target: target.clone(),
                        address: port.address.clone(),
                        pxe_enabled: port.pxe_enabled,
                        extra: std::mem::take(&mut port.extra),
                        local_link_connection: std::mem::take(&mut port.local_link_connection),
                        physical_network: port.physical_network.take(),
                    };
                    planned.apply(&op);
                    port.pxe_enabled = planned.pxe_enabled;
                    port.extra = planned.extra;
                    port.local_link_connection = planned.local_link_connection;
                    port.physical_network = planned.physical_network;
                }
            }
        }
    }
}

impl PlannedPort {
    /// Applies one op to the fields this view has; other paths are left to Ironic.
    fn apply(&mut self, op: &PatchOp) {
        let remove = op.op == "remove";
        let value = op.value.clone().unwrap_or(Value::Null);
        let mut segments = op.path.trim_start_matches('/').splitn(2, '/');
        let field = segments.next().unwrap_or_default();
        let key = segments.next().map(unescape_pointer);
        match (field, key) {
            ("pxe_enabled", None) => self.pxe_enabled = !remove && value.as_bool().unwrap_or(true),
            ("physical_network", None) => {
                self.physical_network = if remove { None } else { value.as_str().map(str::to_owned) }
            }
            ("extra", Some(key)) => set_key(&mut self.extra, key, remove, value),
            ("local_link_connection", Some(key)) => set_key(&mut self.local_link_connection, key, remove, value),
            ("extra", None) => {
                self.extra = if remove { Map::new() } else { value.as_object().cloned().unwrap_or_default() }
            }
            ("local_link_connection", None) => {
                self.local_link_connection =
                    if remove { Map::new() } else { value.as_object().cloned().unwrap_or_default() }
            }
            _ => {}
        }
    }
}

fn set_key(map: &mut Map<String, Value>, key: String, remove: bool, value: Value) {
    if remove {
        map.remove(&key);
    } else {
        map.insert(key, value);
    }
}

fn unescape_pointer(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// One entry of a capabilities string.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    /// `k:v`.
    Value(String),
    /// An entry without `:` kept verbatim (ironic-inspector would refuse it; the hooks check first).
    Bare,
    /// Removed by a merge; keeps its place as ironic-inspector's dict does.
    Removed,
}

impl From<Option<String>> for Slot {
    fn from(value: Option<String>) -> Self {
        value.map_or(Slot::Removed, Slot::Value)
    }
}

/// The node's capabilities in order, leniently: this cannot fail (the hooks validated with
/// [`parse_capabilities`] before merging).
fn capability_entries(caps: &Value) -> Vec<(String, Slot)> {
    let mut entries: Vec<(String, Slot)> = Vec::new();
    let mut push = |key: String, slot: Slot| match entries.iter_mut().find(|(k, _)| *k == key) {
        Some(existing) => existing.1 = slot,
        None => entries.push((key, slot)),
    };
    match caps {
        Value::String(s) if !s.is_empty() => {
            for entry in s.split(',') {
                match entry.split_once(':') {
                    Some((k, v)) => push(k.to_owned(), Slot::Value(v.to_owned())),
                    None => push(entry.to_owned(), Slot::Bare),
                }
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                push(k.clone(), Slot::Value(v.as_str().map_or_else(|| v.to_string(), str::to_owned)));
            }
        }
        _ => {}
    }
    entries
}

fn render_capabilities(entries: &[(String, Slot)]) -> String {
    entries
        .iter()
        .filter_map(|(k, slot)| match slot {
            Slot::Value(v) => Some(format!("{k}:{v}")),
            Slot::Bare => Some(k.clone()),
            Slot::Removed => None,
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a capabilities value as ironic-inspector's `capabilities_to_dict` does: `null`/`""` is empty, otherwise
/// `k:v` entries separated by `,` (split at the first `:`; a repeated key keeps its place and takes the later
/// value). An entry without `:` is an error, as it is for ironic-inspector. A JSON object is accepted too.
pub fn parse_capabilities(caps: &Value) -> Result<Vec<(String, String)>, String> {
    match caps {
        Value::Null => Ok(Vec::new()),
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => {
            if let Some(bad) = s.split(',').find(|e| !e.contains(':')) {
                return Err(format!("malformed capabilities {s:?}: entry {bad:?} is not key:value"));
            }
            Ok(to_pairs(capability_entries(caps)))
        }
        Value::Object(_) => Ok(to_pairs(capability_entries(caps))),
        other => Err(format!("malformed capabilities {other}: expected a \"key:value,...\" string")),
    }
}

fn to_pairs(entries: Vec<(String, Slot)>) -> Vec<(String, String)> {
    entries
        .into_iter()
        .filter_map(|(k, slot)| match slot {
            Slot::Value(v) => Some((k, v)),
            Slot::Bare | Slot::Removed => None,
        })
        .collect()
}

fn string_map(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// The node and its ports as the hooks see them, from Ironic's JSON.
pub fn node_view(node: &Value, ports: &[Value]) -> NodeView {
    NodeView {
        uuid: node["uuid"].as_str().unwrap_or_default().to_string(),
        provision_state: node["provision_state"].as_str().unwrap_or_default().to_string(),
        properties: string_map(&node["properties"]),
        extra: string_map(&node["extra"]),
        ports: ports
            .iter()
            .map(|p| PortView {
                uuid: p["uuid"].as_str().unwrap_or_default().to_string(),
                address: p["address"].as_str().unwrap_or_default().to_ascii_lowercase(),
                pxe_enabled: p["pxe_enabled"].as_bool().unwrap_or(true),
                extra: string_map(&p["extra"]),
                local_link_connection: string_map(&p["local_link_connection"]),
                physical_network: p["physical_network"].as_str().map(str::to_string),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_with_caps(caps: &str) -> NodeView {
        let mut node = NodeView { uuid: "n1".into(), provision_state: "manageable".into(), ..Default::default() };
        node.properties.insert("capabilities".into(), json!(caps));
        node
    }

    fn port(uuid: &str, mac: &str, pxe: bool) -> PortView {
        PortView { uuid: uuid.into(), address: mac.into(), pxe_enabled: pxe, ..Default::default() }
    }

    #[test]
    fn later_node_writes_to_the_same_path_win_in_place() {
        let mut plan = Plan::new();
        plan.set_node("add", "/properties/cpus", Some(json!("4")));
        plan.set_node("add", "/properties/memory_mb", Some(json!("8192")));
        plan.set_node("add", "/properties/cpus", Some(json!(8)));
        let patch = plan.node_patch(&NodeView::default());
        assert_eq!(
            patch,
            vec![
                PatchOp::new("add", "/properties/cpus", Some(json!(8))),
                PatchOp::new("add", "/properties/memory_mb", Some(json!("8192"))),
            ]
        );
        assert_eq!(plan.write_requests(&NodeView::default()), 1);
    }

    #[test]
    fn capabilities_merge_into_one_op_against_the_node_string() {
        let node = node_with_caps("boot_mode:bios,profile:compute,cpu_vt:false");
        let mut plan = Plan::new();
        plan.merge_capabilities([("cpu_vt".to_owned(), Some("true".to_owned()))]);
        plan.set_node("add", "/properties/local_gb", Some(json!("19")));
        plan.merge_capabilities([
            ("gpu".to_owned(), Some("2".to_owned())),
            ("profile".to_owned(), None),
            ("boot_mode".to_owned(), Some("uefi".to_owned())),
        ]);
        assert_eq!(
            plan.node_patch(&node),
            vec![
                PatchOp::new("add", "/properties/local_gb", Some(json!("19"))),
                PatchOp::new("add", "/properties/capabilities", Some(json!("boot_mode:uefi,cpu_vt:true,gpu:2"))),
            ]
        );
    }

    #[test]
    fn capabilities_of_a_node_without_any_and_an_explicit_base() {
        let mut plan = Plan::new();
        plan.merge_capabilities([("cpu_aes".to_owned(), Some("true".to_owned()))]);
        assert_eq!(
            plan.node_patch(&NodeView::default()),
            vec![PatchOp::new("add", "/properties/capabilities", Some(json!("cpu_aes:true")))]
        );
        plan.set_node("add", "/properties/capabilities", Some(json!("a:1")));
        assert_eq!(
            plan.node_patch(&node_with_caps("ignored:1")),
            vec![PatchOp::new("add", "/properties/capabilities", Some(json!("a:1,cpu_aes:true")))]
        );
    }

    #[test]
    fn parse_capabilities_follows_capabilities_to_dict() {
        assert_eq!(parse_capabilities(&json!(null)), Ok(vec![]));
        assert_eq!(parse_capabilities(&json!("")), Ok(vec![]));
        assert_eq!(
            parse_capabilities(&json!("a:1,b:x:y,a:2")),
            Ok(vec![("a".into(), "2".into()), ("b".into(), "x:y".into())])
        );
        assert!(parse_capabilities(&json!("boot_mode:bios,boot_option")).is_err());
        assert!(parse_capabilities(&json!(3)).is_err());
    }

    #[test]
    fn empty_plan_writes_nothing() {
        let plan = Plan::new();
        assert!(plan.is_empty());
        assert!(plan.node_patch(&NodeView::default()).is_empty());
        assert_eq!(plan.write_requests(&NodeView::default()), 0);
    }

    #[test]
    fn port_ops_group_per_port_and_deletes_drop_patches() {
        let mut plan = Plan::new();
        plan.patch_port("p1", PatchOp::new("replace", "/pxe_enabled", Some(json!(false))));
        plan.patch_port("p2", PatchOp::new("add", "/physical_network", Some(json!("a"))));
        plan.patch_port("p1", PatchOp::new("add", "/local_link_connection/port_id", Some(json!("Eth1"))));
        plan.patch_port("p1", PatchOp::new("replace", "/pxe_enabled", Some(json!(true))));
        plan.delete_port("p2");
        plan.patch_port("p2", PatchOp::new("add", "/physical_network", Some(json!("b"))));
        plan.create_port(NewPort { address: "52:54:00:00:00:01".into(), pxe_enabled: true, ..Default::default() });
        assert_eq!(
            plan.port_patches(),
            vec![(
                "p1".to_owned(),
                vec![
                    PatchOp::new("replace", "/pxe_enabled", Some(json!(true))),
                    PatchOp::new("add", "/local_link_connection/port_id", Some(json!("Eth1"))),
                ]
            )]
        );
        assert_eq!(plan.port_deletes(), ["p2".to_owned()]);
        assert_eq!(plan.write_requests(&NodeView::default()), 3);
    }

    #[test]
    fn planned_ports_see_patches_deletes_and_creates() {
        let node = NodeView {
            ports: vec![port("p1", "52:54:00:00:00:01", true), port("p2", "52:54:00:00:00:02", true)],
            ..Default::default()
        };
        let mut plan = Plan::new();
        plan.delete_port("p2");
        plan.patch_port(
            "p1",
            PatchOp::new("add", "/local_link_connection/switch_id", Some(json!("00:1c:73:aa:bb:cc"))),
        );
        plan.create_port(NewPort { address: "52:54:00:00:00:03".into(), ..Default::default() });

        let p1 = plan.port_by_address(&node, "52:54:00:00:00:01").expect("p1");
        assert_eq!(p1.target, PortTarget::Existing("p1".into()));
        assert_eq!(p1.local_link_connection.get("switch_id"), Some(&json!("00:1c:73:aa:bb:cc")));
        assert!(plan.port_by_address(&node, "52:54:00:00:00:02").is_none());

        let new = plan.port_by_address(&node, "52:54:00:00:00:03").expect("new port");
        assert_eq!(new.target, PortTarget::New(0));
        plan.update_port(&new.target, PatchOp::new("add", "/physical_network", Some(json!("physnet1"))));
        plan.update_port(&new.target, PatchOp::new("add", "/local_link_connection/port_id", Some(json!("Eth1/3"))));
        assert_eq!(plan.new_ports()[0].physical_network.as_deref(), Some("physnet1"));
        assert_eq!(plan.new_ports()[0].local_link_connection.get("port_id"), Some(&json!("Eth1/3")));
        assert!(plan.port_patches().iter().all(|(uuid, _)| uuid == "p1"));
    }

    #[test]
    fn patch_op_serialises_without_a_missing_value() {
        let remove = serde_json::to_value(PatchOp::new("remove", "/extra/block_devices", None)).expect("json");
        assert_eq!(remove, json!({"op": "remove", "path": "/extra/block_devices"}));
        let add = serde_json::to_value(PatchOp::new("add", "/properties/cpus", Some(json!("4")))).expect("json");
        assert_eq!(add, json!({"op": "add", "path": "/properties/cpus", "value": "4"}));
    }
}
