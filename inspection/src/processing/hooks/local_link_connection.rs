//! `local_link_connection` (ironic-inspector) and `local-link-connection` (Ironic): the switch a port is plugged
//! into, from LLDP, into the port's `local_link_connection` (`port_id` from the Port ID TLV, `switch_id` from a
//! MAC-subtype Chassis ID; Ironic also `switch_info` from the System Name).
//!
//! ironic-inspector prefers `lldp_processed` (from `lldp_basic`) and respects `overwrite_existing`; Ironic parses
//! the raw TLVs and never overwrites a key the port has. A port created in this run gets the values in its
//! create request.
use serde_json::{Map, Value};

use super::Hook;
use crate::processing::data::{checked_inventory, inventory, truthy};
use crate::processing::lldp_tlv::{
    CHASSIS_SUBTYPE_MAC, TLV_CHASSIS_ID, TLV_PORT_ID, TLV_SYS_NAME, chassis_id, port_id, raw_tlvs, sys_name,
};
use crate::processing::net::is_valid_mac;
use crate::processing::plan::{NodeView, PatchOp, Plan, PlannedPort};

/// An inventory interface that is in `all_interfaces`, has a port, and has LLDP data.
struct Candidate<'a> {
    name: String,
    port: PlannedPort,
    tlvs: &'a Value,
}

fn candidates<'a>(data: &'a Value, node: &NodeView, plan: &Plan) -> Result<Vec<Candidate<'a>>, String> {
    let all = data
        .get("all_interfaces")
        .and_then(Value::as_object)
        .ok_or_else(|| "introspection data has no all_interfaces (validate_interfaces must run first)".to_owned())?;
    let raw = data.get("lldp_raw").and_then(Value::as_object);
    let interfaces = data.pointer("/inventory/interfaces").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let mut found = Vec::new();
    for iface in interfaces {
        let name = iface.get("name").and_then(Value::as_str).ok_or_else(|| format!("interface {iface} has no name"))?;
        if !all.contains_key(name) {
            continue;
        }
        let mac = iface
            .get("mac_address")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("interface {name} has no mac_address"))?;
        let Some(port) = plan.port_by_address(node, mac) else { continue };
        let tlvs = raw.and_then(|r| r.get(name)).filter(|t| truthy(t)).or_else(|| iface.get("lldp"));
        let Some(tlvs) = tlvs.filter(|t| !t.is_null()) else { continue };
        found.push(Candidate { name: name.to_owned(), port, tlvs });
    }
    Ok(found)
}

fn set(plan: &mut Plan, port: &PlannedPort, item: &str, value: Value) {
    plan.update_port(&port.target, PatchOp::new("add", &format!("/local_link_connection/{item}"), Some(value)));
}

/// ironic-inspector's `local_link_connection`.
#[derive(Debug)]
pub(crate) struct InspectorLocalLinkConnection {
    pub(crate) overwrite_existing: bool,
}

impl InspectorLocalLinkConnection {
    fn allowed(&self, port: &PlannedPort, item: &str) -> bool {
        self.overwrite_existing || !port.local_link_connection.contains_key(item)
    }

    /// From `lldp_processed`: `switch_id` (a MAC only) and `port_id`.
    fn processed_items(&self, processed: Option<&Value>, port: &PlannedPort) -> Vec<(&'static str, Value)> {
        let Some(processed) = processed else { return Vec::new() };
        [("switch_chassis_id", "switch_id"), ("switch_port_id", "port_id")]
            .into_iter()
            .filter_map(|(name, item)| {
                let value = processed.get(name).filter(|v| truthy(v))?;
                if item == "switch_id" && !value.as_str().is_some_and(is_valid_mac) {
                    return None;
                }
                self.allowed(port, item).then(|| (item, value.clone()))
            })
            .collect()
    }

    /// From the raw TLVs, in their order.
    fn raw_items(&self, tlvs: &Value, port: &PlannedPort) -> Vec<(&'static str, Value)> {
        let mut found = Vec::new();
        for (kind, data) in raw_tlvs(tlvs) {
            let Some(data) = data else { continue };
            let item = match kind {
                TLV_PORT_ID => port_id(&data).ok().flatten().flatten().map(|id| ("port_id", id)),
                TLV_CHASSIS_ID => match chassis_id(&data) {
                    Ok(Some((CHASSIS_SUBTYPE_MAC, Some(id)))) => Some(("switch_id", id)),
                    _ => None,
                },
                _ => None,
            };
            if let Some((item, value)) = item.filter(|(item, v)| !v.is_empty() && self.allowed(port, item)) {
                found.push((item, Value::String(value)));
            }
        }
        found
    }
}

impl Hook for InspectorLocalLinkConnection {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        checked_inventory(data)?;
        let data = &*data;
        let mut updates = Vec::new();
        for candidate in candidates(data, node, plan)? {
            let processed =
                data.get("all_interfaces").and_then(|a| a.get(&candidate.name)).and_then(|i| i.get("lldp_processed"));
            let mut found = self.processed_items(processed, &candidate.port);
            if found.is_empty() {
                found = self.raw_items(candidate.tlvs, &candidate.port);
            }
            updates.push((candidate.port, found));
        }
        for (port, found) in updates {
            for (item, value) in found {
                set(plan, &port, item, value);
            }
        }
        Ok(())
    }
}

/// Ironic's `local-link-connection`.
#[derive(Debug)]
pub(crate) struct IronicLocalLinkConnection;

impl IronicLocalLinkConnection {
    /// `port_id`, `switch_id` and `switch_info` from the raw TLVs (the later TLV wins), none the port has.
    /// `None` when a TLV is undecodable: Ironic then leaves the port alone.
    fn items(tlvs: &Value, port: &PlannedPort) -> Option<Map<String, Value>> {
        let mut items = Map::new();
        for (kind, data) in raw_tlvs(tlvs) {
            let data = data?;
            let item = match kind {
                TLV_PORT_ID => port_id(&data).ok()?.flatten().map(|id| ("port_id", id)),
                TLV_CHASSIS_ID => match chassis_id(&data).ok()? {
                    Some((CHASSIS_SUBTYPE_MAC, Some(id))) => Some(("switch_id", id)),
                    _ => None,
                },
                TLV_SYS_NAME => Some(("switch_info", sys_name(&data).ok()?)),
                _ => None,
            };
            if let Some((item, value)) = item.filter(|(item, _)| !port.local_link_connection.contains_key(*item)) {
                items.insert(item.to_owned(), Value::String(value));
            }
        }
        Some(items)
    }
}

impl Hook for IronicLocalLinkConnection {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        inventory(data)?;
        let updates: Vec<(PlannedPort, Map<String, Value>)> = candidates(data, node, plan)?
            .into_iter()
            .filter_map(|c| Self::items(c.tlvs, &c.port).map(|items| (c.port, items)))
            .collect();
        for (port, items) in updates {
            for (item, value) in items {
                set(plan, &port, &item, value);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::config::ProcessingConfig;
    use crate::processing::hooks::lldp::LldpBasic;
    use crate::processing::hooks::validate_interfaces::ValidateInterfaces;
    use crate::processing::plan::{NewPort, PortView};
    use crate::processing::testdata::{self, ETH0, ETH1};
    use serde_json::json;

    /// The LLDP fixture after `validate_interfaces`, with eth0 created by this run and eth1 an existing port.
    fn setup(lldp_basic: bool) -> (Value, NodeView, Plan) {
        let mut data = testdata::lldp();
        let mut node = testdata::node();
        let mut existing = PortView { uuid: "p-eth1".into(), address: ETH1.into(), ..Default::default() };
        existing.local_link_connection.insert("port_id".into(), json!("old"));
        node.ports.push(existing);
        let mut plan = Plan::new();
        let validate = ValidateInterfaces::new(&ProcessingConfig::default());
        validate.before_processing(&mut data).expect("validate");
        validate.before_update(&mut data, &node, &mut plan).expect("validate");
        if lldp_basic {
            LldpBasic.before_update(&mut data, &node, &mut plan).expect("lldp_basic");
        }
        (data, node, plan)
    }

    fn llc(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect()
    }

    #[test]
    fn inspector_sets_the_new_ports_link_and_patches_the_existing_one() {
        for lldp_basic in [false, true] {
            let (mut data, node, mut plan) = setup(lldp_basic);
            InspectorLocalLinkConnection { overwrite_existing: true }
                .before_update(&mut data, &node, &mut plan)
                .expect("llc");
            assert_eq!(
                plan.new_ports(),
                [NewPort {
                    address: ETH0.into(),
                    pxe_enabled: true,
                    local_link_connection: llc(&[("switch_id", "00:1c:73:aa:bb:cc"), ("port_id", "Ethernet1/3")]),
                    ..Default::default()
                }]
            );
            assert_eq!(
                plan.port_patches(),
                [(
                    "p-eth1".to_owned(),
                    vec![PatchOp::new("add", "/local_link_connection/port_id", Some(json!("00:1c:73:dd:ee:01")))]
                )],
                "eth1's chassis id is not a MAC: no switch_id"
            );
        }
    }

    #[test]
    fn inspector_respects_overwrite_existing() {
        let (mut data, node, mut plan) = setup(true);
        InspectorLocalLinkConnection { overwrite_existing: false }
            .before_update(&mut data, &node, &mut plan)
            .expect("llc");
        assert!(plan.port_patches().is_empty());
        assert_eq!(plan.new_ports()[0].local_link_connection.len(), 2);
    }

    #[test]
    fn ironic_adds_switch_info_and_never_overwrites() {
        let (mut data, node, mut plan) = setup(false);
        IronicLocalLinkConnection.before_update(&mut data, &node, &mut plan).expect("llc");
        assert_eq!(
            plan.new_ports()[0].local_link_connection,
            llc(&[
                ("switch_id", "00:1c:73:aa:bb:cc"),
                ("port_id", "Ethernet1/3"),
                ("switch_info", "leaf-1.example.com")
            ])
        );
        assert_eq!(
            plan.port_patches(),
            [(
                "p-eth1".to_owned(),
                vec![PatchOp::new("add", "/local_link_connection/switch_info", Some(json!("leaf-2.example.com")))]
            )]
        );
    }

    #[test]
    fn ironic_leaves_a_port_with_undecodable_tlvs_alone() {
        let (mut data, node, mut plan) = setup(false);
        data["lldp_raw"] = json!({"eth1": [[5, "6869"], [2, "zz"]]});
        IronicLocalLinkConnection.before_update(&mut data, &node, &mut plan).expect("llc");
        assert!(plan.port_patches().is_empty());
    }

    #[test]
    fn needs_all_interfaces() {
        let mut data = testdata::lldp();
        let mut plan = Plan::new();
        let hook = InspectorLocalLinkConnection { overwrite_existing: true };
        assert!(hook.before_update(&mut data, &testdata::node(), &mut plan).is_err());
        assert!(IronicLocalLinkConnection.before_update(&mut data, &testdata::node(), &mut plan).is_err());
    }
}
