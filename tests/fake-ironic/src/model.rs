//! What the fake holds: nodes, ports, armed faults and the call log, in one `Store` behind one lock.
//!
//! Nodes and ports keep their insertion order (Ironic sorts by its database id by default), which is what makes
//! `marker` pagination stable.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::FakeError;

/// A bare-metal node as the fake stores it. Everything but `uuid` has a default, so `{"uuid": "…"}` is a valid
/// node for `POST /_fake/nodes` (and an empty or missing `uuid` gets a fresh one).
///
/// The fields Ironic gives meaning to in what the fake emulates are typed; any other field of Ironic's node
/// (`description`, `owner`, `boot_interface`, `instance_info`, `maintenance_reason`, ...) lives in [`Node::other`]
/// under its Ironic name, and the API shows Ironic's default for one that is absent there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    pub uuid: String,
    pub name: Option<String>,
    pub instance_uuid: Option<String>,
    /// A free string: "enroll", "manageable", "inspecting", "inspect wait", "inspect failed", "available", …
    pub provision_state: String,
    /// "power on" or "power off"; empty when not known yet (`null` on the wire), as for a node just created
    /// through `POST /v1/nodes`.
    pub power_state: String,
    pub inspect_interface: String,
    pub driver: String,
    pub driver_info: Map<String, Value>,
    pub maintenance: bool,
    pub extra: Map<String, Value>,
    pub properties: Map<String, Value>,
    pub inspection_started_at: Option<String>,
    pub inspection_finished_at: Option<String>,
    /// The node's traits (API 1.37+). The API keeps them sorted and without duplicates.
    pub traits: Vec<String>,
    pub resource_class: Option<String>,
    /// ISO 8601 (`2024-05-01T10:00:00+00:00`); set when the node is stored if missing.
    pub created_at: Option<String>,
    /// Set by every change made through the API.
    pub updated_at: Option<String>,
    /// Ironic's other node fields, by name, where they differ from Ironic's default (see the type's doc).
    #[serde(flatten)]
    pub other: Map<String, Value>,
    /// Fake-only: the last boot device set through `PUT …/management/boot_device` (not part of Ironic's node).
    pub boot_device: Option<String>,
    /// Fake-only: whether that boot device was set persistent.
    pub boot_device_persistent: bool,
    /// Fake-only: `false` makes `GET …/validate` report the power interface invalid.
    pub power_valid: bool,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            uuid: String::new(),
            name: None,
            instance_uuid: None,
            provision_state: "enroll".to_owned(),
            power_state: "power off".to_owned(),
            inspect_interface: "agent".to_owned(),
            driver: "ipmi".to_owned(),
            driver_info: Map::new(),
            maintenance: false,
            extra: Map::new(),
            properties: Map::new(),
            inspection_started_at: None,
            inspection_finished_at: None,
            traits: Vec::new(),
            resource_class: None,
            created_at: None,
            updated_at: None,
            other: Map::new(),
            boot_device: None,
            boot_device_persistent: false,
            power_valid: true,
        }
    }
}

impl Node {
    /// A node with the given UUID and every other field at its default.
    pub fn new(uuid: impl Into<String>) -> Node {
        Node { uuid: uuid.into(), ..Node::default() }
    }
}

/// A port (a NIC of a node) as the fake stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Port {
    pub uuid: String,
    /// A MAC address; stored lowercase.
    pub address: String,
    pub node_uuid: String,
    pub pxe_enabled: bool,
    pub extra: Map<String, Value>,
    /// `switch_id`, `port_id`, `switch_info`, `hostname`, `network_type` (API 1.19+; validated by the API, not here).
    pub local_link_connection: Map<String, Value>,
    /// API 1.34+.
    pub physical_network: Option<String>,
    /// API 1.53+.
    pub is_smartnic: bool,
    pub internal_info: Map<String, Value>,
    /// ISO 8601; set when the port is stored if missing.
    pub created_at: Option<String>,
    /// Set by every change made through the API.
    pub updated_at: Option<String>,
}

impl Default for Port {
    fn default() -> Self {
        Port {
            uuid: String::new(),
            address: String::new(),
            node_uuid: String::new(),
            pxe_enabled: true,
            extra: Map::new(),
            local_link_connection: Map::new(),
            physical_network: None,
            is_smartnic: false,
            internal_info: Map::new(),
            created_at: None,
            updated_at: None,
        }
    }
}

impl Port {
    /// A PXE-enabled port with a fresh UUID.
    pub fn new(node_uuid: impl Into<String>, address: impl Into<String>) -> Port {
        Port { uuid: new_uuid(), address: address.into(), node_uuid: node_uuid.into(), ..Port::default() }
    }
}

/// A fault injected into requests whose method and path match. [`Default`] matches everything, forever, and
/// does nothing: set at least `status` or `latency_ms`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fault {
    /// `None` matches every method; otherwise compared case-insensitively.
    pub method: Option<String>,
    /// Matched against the start of the path including its query string (`""` matches everything).
    pub path_prefix: String,
    /// The status to answer with: 409 gives Ironic's "node is locked" body, 503 a service-unavailable body, any
    /// other error status a generic Ironic error body; 0 means no error (latency only).
    pub status: u16,
    /// How many matching requests get this fault before it is exhausted; 0 means forever.
    pub count: u32,
    /// Added to every matching request, before it is answered (also when `status` is 0).
    pub latency_ms: u64,
}

impl Fault {
    fn matches(&self, method: &str, path_and_query: &str) -> bool {
        self.method.as_deref().is_none_or(|m| m.eq_ignore_ascii_case(method))
            && path_and_query.starts_with(&self.path_prefix)
    }
}

/// One request to the Ironic API (the `/_fake` admin API is not recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    pub method: String,
    /// The path with its query string, as sent.
    pub path: String,
    /// The `X-OpenStack-Ironic-API-Version` the client asked for, if any.
    pub api_version: Option<String>,
    pub at: SystemTime,
    /// Arrival order, from 0; keeps counting across [`crate::FakeIronic::clear_calls`].
    pub seq: u64,
}

#[derive(Debug)]
struct ArmedFault {
    fault: Fault,
    /// `None`: forever.
    remaining: Option<u32>,
}

/// Everything the fake holds.
#[derive(Debug, Default)]
pub(crate) struct Store {
    next_node_id: u64,
    nodes: BTreeMap<u64, Node>,
    node_ids: HashMap<String, u64>,
    next_port_id: u64,
    ports: BTreeMap<u64, Port>,
    port_ids: HashMap<String, u64>,
    port_addresses: HashMap<String, u64>,
    faults: Vec<ArmedFault>,
    calls: Vec<Call>,
    next_seq: u64,
    /// How many nodes and MACs [`Store::populate`] has made: the indices it derives names and MACs from.
    populated_nodes: u32,
    populated_macs: u32,
}

/// A fresh random (version 4) UUID.
pub fn new_uuid() -> String {
    let v: u128 = rand::random();
    let v = (v & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The unicast, locally administered MAC `52:54:xx:xx:xx:xx` whose last four octets are `index`.
pub fn mac_for_index(index: u32) -> String {
    let b = index.to_be_bytes();
    format!("52:54:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

/// Now as Ironic writes a timestamp: `2024-05-01T10:00:00+00:00` (UTC, whole seconds).
pub fn now_iso() -> String {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    iso_from_unix(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SS+00:00`.
fn iso_from_unix(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+00:00", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Whether `s` is a MAC address written as six colon-separated pairs of hex digits.
pub fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl Store {
    // --- calls -------------------------------------------------------------------------------------------------

    pub(crate) fn record_call(&mut self, method: &str, path: &str, api_version: Option<String>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.calls.push(Call {
            method: method.to_owned(),
            path: path.to_owned(),
            api_version,
            at: SystemTime::now(),
            seq,
        });
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.clone()
    }

    pub(crate) fn clear_calls(&mut self) {
        self.calls.clear();
    }

    // --- faults ------------------------------------------------------------------------------------------------

    pub(crate) fn inject(&mut self, fault: Fault) {
        let remaining = (fault.count != 0).then_some(fault.count);
        self.faults.push(ArmedFault { fault, remaining });
    }

    pub(crate) fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// The first non-exhausted fault matching the request, consuming one of its uses.
    pub(crate) fn take_fault(&mut self, method: &str, path_and_query: &str) -> Option<Fault> {
        let armed =
            self.faults.iter_mut().find(|a| a.remaining != Some(0) && a.fault.matches(method, path_and_query))?;
        if let Some(n) = armed.remaining.as_mut() {
            *n -= 1;
        }
        Some(armed.fault.clone())
    }

    // --- nodes -------------------------------------------------------------------------------------------------

    /// Adds a node, or replaces the one with the same UUID in place. An empty UUID gets a fresh one, which is
    /// returned.
    pub(crate) fn upsert_node(&mut self, mut node: Node) -> String {
        if node.uuid.is_empty() {
            node.uuid = new_uuid();
        }
        if node.created_at.is_none() {
            node.created_at = Some(now_iso());
        }
        let uuid = node.uuid.clone();
        if let Some(id) = self.node_ids.get(&uuid) {
            self.nodes.insert(*id, node);
        } else {
            let id = self.next_node_id;
            self.next_node_id += 1;
            self.node_ids.insert(uuid.clone(), id);
            self.nodes.insert(id, node);
        }
        uuid
    }

    /// The node's database id as Ironic would show it in a message (from 1).
    pub(crate) fn node_db_id(&self, ident: &str) -> Option<u64> {
        self.node_id(ident).map(|id| id + 1)
    }

    /// The UUID of another node than `except` named `name`, if any.
    pub(crate) fn node_named(&self, name: &str, except: &str) -> Option<&str> {
        self.nodes.values().find(|n| n.uuid != except && n.name.as_deref() == Some(name)).map(|n| n.uuid.as_str())
    }

    /// The UUID of another node than `except` with this instance UUID, if any.
    pub(crate) fn node_with_instance(&self, instance: &str, except: &str) -> Option<&str> {
        self.nodes
            .values()
            .find(|n| n.uuid != except && n.instance_uuid.as_deref() == Some(instance))
            .map(|n| n.uuid.as_str())
    }

    fn node_id(&self, ident: &str) -> Option<u64> {
        self.node_ids
            .get(ident)
            .copied()
            .or_else(|| self.nodes.iter().find(|(_, n)| n.name.as_deref() == Some(ident)).map(|(id, _)| *id))
    }

    /// The node with this UUID or name.
    pub(crate) fn node(&self, ident: &str) -> Option<&Node> {
        self.node_id(ident).and_then(|id| self.nodes.get(&id))
    }

    pub(crate) fn node_mut(&mut self, ident: &str) -> Result<&mut Node, FakeError> {
        let id = self.node_id(ident).ok_or_else(|| FakeError::NodeNotFound(ident.to_owned()))?;
        self.nodes.get_mut(&id).ok_or_else(|| FakeError::NodeNotFound(ident.to_owned()))
    }

    pub(crate) fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// Nodes after the node `marker` (by UUID or name), in order.
    pub(crate) fn nodes_after(&self, marker: Option<&str>) -> Result<impl Iterator<Item = &Node>, FakeError> {
        let start = match marker {
            None => 0,
            Some(m) => self.node_id(m).ok_or_else(|| FakeError::NodeNotFound(m.to_owned()))? + 1,
        };
        Ok(self.nodes.range(start..).map(|(_, n)| n))
    }

    /// Deletes the node (by UUID or name) and its ports.
    pub(crate) fn delete_node(&mut self, ident: &str) -> Result<Node, FakeError> {
        let id = self.node_id(ident).ok_or_else(|| FakeError::NodeNotFound(ident.to_owned()))?;
        let node = self.nodes.remove(&id).ok_or_else(|| FakeError::NodeNotFound(ident.to_owned()))?;
        self.node_ids.remove(&node.uuid);
        let ports: Vec<String> =
            self.ports.values().filter(|p| p.node_uuid == node.uuid).map(|p| p.uuid.clone()).collect();
        for uuid in ports {
            let _ = self.delete_port(&uuid);
        }
        Ok(node)
    }

    // --- ports -------------------------------------------------------------------------------------------------

    /// Adds a port; its address is lowercased, an empty UUID gets a fresh one.
    pub(crate) fn add_port(&mut self, mut port: Port) -> Result<Port, FakeError> {
        port.address = port.address.to_ascii_lowercase();
        if !is_mac(&port.address) {
            return Err(FakeError::InvalidMac(port.address));
        }
        if port.uuid.is_empty() {
            port.uuid = new_uuid();
        }
        if port.created_at.is_none() {
            port.created_at = Some(now_iso());
        }
        if self.port_addresses.contains_key(&port.address) {
            return Err(FakeError::DuplicateAddress(port.address));
        }
        if self.port_ids.contains_key(&port.uuid) {
            return Err(FakeError::DuplicatePort(port.uuid));
        }
        // Ports refer to nodes by UUID only, as in Ironic.
        if !self.node_ids.contains_key(&port.node_uuid) {
            return Err(FakeError::NodeNotFound(port.node_uuid));
        }
        let id = self.next_port_id;
        self.next_port_id += 1;
        self.port_ids.insert(port.uuid.clone(), id);
        self.port_addresses.insert(port.address.clone(), id);
        self.ports.insert(id, port.clone());
        Ok(port)
    }

    /// Replaces the port with `port.uuid` (its address lowercased): refuses an address another port has, an
    /// invalid MAC and an unknown node. Returns the port as stored.
    pub(crate) fn update_port(&mut self, mut port: Port) -> Result<Port, FakeError> {
        port.address = port.address.to_ascii_lowercase();
        let id = *self.port_ids.get(&port.uuid).ok_or_else(|| FakeError::PortNotFound(port.uuid.clone()))?;
        if !is_mac(&port.address) {
            return Err(FakeError::InvalidMac(port.address));
        }
        if self.port_addresses.get(&port.address).is_some_and(|other| *other != id) {
            return Err(FakeError::DuplicateAddress(port.address));
        }
        if !self.node_ids.contains_key(&port.node_uuid) {
            return Err(FakeError::NodeNotFound(port.node_uuid));
        }
        if let Some(old) = self.ports.get(&id) {
            self.port_addresses.remove(&old.address);
        }
        self.port_addresses.insert(port.address.clone(), id);
        self.ports.insert(id, port.clone());
        Ok(port)
    }

    pub(crate) fn port(&self, uuid: &str) -> Option<&Port> {
        self.port_ids.get(uuid).and_then(|id| self.ports.get(id))
    }

    pub(crate) fn ports(&self) -> impl Iterator<Item = &Port> {
        self.ports.values()
    }

    /// Ports after the port `marker` (a UUID), in order.
    pub(crate) fn ports_after(&self, marker: Option<&str>) -> Result<impl Iterator<Item = &Port>, FakeError> {
        let start = match marker {
            None => 0,
            Some(m) => self.port_ids.get(m).ok_or_else(|| FakeError::PortNotFound(m.to_owned()))? + 1,
        };
        Ok(self.ports.range(start..).map(|(_, p)| p))
    }

    pub(crate) fn delete_port(&mut self, uuid: &str) -> Result<Port, FakeError> {
        let id = self.port_ids.remove(uuid).ok_or_else(|| FakeError::PortNotFound(uuid.to_owned()))?;
        let port = self.ports.remove(&id).ok_or_else(|| FakeError::PortNotFound(uuid.to_owned()))?;
        self.port_addresses.remove(&port.address);
        Ok(port)
    }

    // --- bulk --------------------------------------------------------------------------------------------------

    /// Creates `nodes` nodes named `node-<n>` in `provision_state` (with an IPMI address `10.x.y.z` from `n`), each
    /// with `ports_per_node` ports whose MACs come from [`mac_for_index`] with a counter of its own (skipping any
    /// address already taken). Returns the new nodes' UUIDs.
    pub(crate) fn populate(&mut self, nodes: usize, ports_per_node: usize, provision_state: &str) -> Vec<String> {
        let mut uuids = Vec::with_capacity(nodes);
        for _ in 0..nodes {
            self.populated_nodes += 1;
            let n = self.populated_nodes;
            let mut node = Node::new(new_uuid());
            node.name = Some(format!("node-{n}"));
            node.provision_state = provision_state.to_owned();
            let [_, a, b, c] = n.to_be_bytes();
            node.driver_info.insert("ipmi_address".to_owned(), Value::String(format!("10.{a}.{b}.{c}")));
            let uuid = self.upsert_node(node);
            for _ in 0..ports_per_node {
                let mac = loop {
                    // Start at 1: 52:54:00:00:00:00 looks like a placeholder. Past 2^32 MACs, wrap (and skip).
                    self.populated_macs = self.populated_macs.wrapping_add(1);
                    let mac = mac_for_index(self.populated_macs);
                    if !self.port_addresses.contains_key(&mac) {
                        break mac;
                    }
                };
                // Cannot fail: the node exists, the address is free and valid, the port UUID is fresh.
                let _ = self.add_port(Port::new(uuid.clone(), mac));
            }
            uuids.push(uuid);
        }
        uuids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(u, new_uuid());
    }

    #[test]
    fn macs_are_unicast_and_unique() {
        assert_eq!(mac_for_index(1), "52:54:00:00:00:01");
        assert_eq!(mac_for_index(0x0102_0304), "52:54:01:02:03:04");
        assert!(is_mac(&mac_for_index(7)));
        // 0x52: bit 0 clear (unicast), bit 1 set (locally administered).
        assert_eq!(0x52 & 1, 0);
    }

    #[test]
    fn populate_gives_distinct_macs_across_calls() {
        let mut s = Store::default();
        s.populate(10, 3, "enroll");
        s.populate(10, 2, "inspect wait");
        let macs: std::collections::HashSet<_> = s.ports().map(|p| p.address.clone()).collect();
        assert_eq!(macs.len(), 50);
        assert_eq!(s.nodes().filter(|n| n.provision_state == "inspect wait").count(), 10);
    }

    #[test]
    fn faults_are_consumed_in_order() {
        let mut s = Store::default();
        s.inject(Fault { path_prefix: "/v1/nodes".into(), status: 503, count: 1, ..Fault::default() });
        s.inject(Fault { method: Some("get".into()), status: 500, ..Fault::default() });
        assert_eq!(s.take_fault("GET", "/v1/nodes?limit=1").map(|f| f.status), Some(503));
        assert_eq!(s.take_fault("GET", "/v1/nodes").map(|f| f.status), Some(500));
        assert_eq!(s.take_fault("PUT", "/v1/nodes").map(|f| f.status), None);
    }

    #[test]
    fn timestamps_are_iso_utc() {
        assert_eq!(iso_from_unix(0), "1970-01-01T00:00:00+00:00");
        assert_eq!(iso_from_unix(1_714_557_600), "2024-05-01T10:00:00+00:00");
        assert_eq!(iso_from_unix(951_782_400), "2000-02-29T00:00:00+00:00");
        assert!(now_iso().ends_with("+00:00"));
    }

    #[test]
    fn updating_a_port_moves_its_address() {
        let mut s = Store::default();
        let uuids = s.populate(1, 2, "enroll");
        let mut ports: Vec<Port> = s.ports().cloned().collect();
        let taken = ports[1].address.clone();
        ports[0].address = taken.to_uppercase();
        assert!(matches!(s.update_port(ports[0].clone()), Err(FakeError::DuplicateAddress(_))));
        ports[0].address = "02:00:00:00:00:AA".into();
        let old = s.ports().next().unwrap().address.clone();
        assert_eq!(s.update_port(ports[0].clone()).unwrap().address, "02:00:00:00:00:aa");
        assert!(!s.port_addresses.contains_key(&old));
        ports[0].node_uuid = "ghost".into();
        assert!(matches!(s.update_port(ports[0].clone()), Err(FakeError::NodeNotFound(_))));
        assert_eq!(s.ports().next().unwrap().node_uuid, uuids[0]);
    }

    #[test]
    fn deleting_a_node_deletes_its_ports() {
        let mut s = Store::default();
        let uuids = s.populate(2, 2, "enroll");
        s.delete_node(&uuids[0]).unwrap();
        assert_eq!(s.ports().count(), 2);
        assert!(s.ports().all(|p| p.node_uuid == uuids[1]));
    }
}
