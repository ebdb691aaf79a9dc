//! `physnet_cidr_map` (ironic-inspector) and `physical-network` (Ironic): a port's `physical_network` from the
//! first `cidr:physnet` entry containing its interface's address.
//!
//! ironic-inspector looks at the first address only (IPv4, else IPv6) and does nothing when
//! `overwrite_existing` is off; Ironic tries each address and always writes.
use std::net::IpAddr;

use serde_json::Value;

use super::Hook;
use crate::processing::config::ProcessingConfig;
use crate::processing::data::{checked_inventory, inventory};
use crate::processing::net::{Cidr, parse_ip};
use crate::processing::plan::{NodeView, PatchOp, Plan};

/// Maps interface addresses to physical networks.
#[derive(Debug)]
pub(crate) struct Physnet {
    ironic: bool,
    overwrite_existing: bool,
    cidr_map: Vec<(Cidr, String)>,
}

impl Physnet {
    /// ironic-inspector's `physnet_cidr_map`.
    pub(crate) fn inspector(cfg: &ProcessingConfig) -> Result<Self, String> {
        Ok(Self { ironic: false, overwrite_existing: cfg.overwrite_existing, cidr_map: cfg.cidr_map()? })
    }

    /// Ironic's `physical-network`.
    pub(crate) fn ironic(cfg: &ProcessingConfig) -> Result<Self, String> {
        Ok(Self { ironic: true, overwrite_existing: true, cidr_map: cfg.cidr_map()? })
    }

    fn physnet(&self, iface: &Value) -> Option<&str> {
        let ips: Vec<IpAddr> = ["ipv4_address", "ipv6_address"]
            .iter()
            .filter_map(|key| iface.get(*key).and_then(Value::as_str).and_then(parse_ip))
            .collect();
        let lookup = |ip: &IpAddr| self.cidr_map.iter().find(|(cidr, _)| cidr.contains(*ip)).map(|(_, p)| p.as_str());
        if self.ironic { ips.iter().find_map(lookup) } else { ips.first().and_then(lookup) }
    }
}

impl Hook for Physnet {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        if self.ironic {
            inventory(data)?;
        } else {
            checked_inventory(data)?;
        }
        if !self.overwrite_existing {
            return Ok(());
        }
        let all = data.get("all_interfaces").and_then(Value::as_object).ok_or_else(|| {
            "introspection data has no all_interfaces (validate_interfaces must run first)".to_owned()
        })?;
        let interfaces = data.pointer("/inventory/interfaces").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let mut updates = Vec::new();
        for iface in interfaces {
            let name =
                iface.get("name").and_then(Value::as_str).ok_or_else(|| format!("interface {iface} has no name"))?;
            if !all.contains_key(name) {
                continue;
            }
            let mac = iface
                .get("mac_address")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("interface {name} has no mac_address"))?;
            let Some(port) = plan.port_by_address(node, mac) else { continue };
            // ironic-inspector reads the addresses of the first interface of that name.
            let first =
                interfaces.iter().find(|i| i.get("name").and_then(Value::as_str) == Some(name)).unwrap_or(iface);
            let Some(physnet) = self.physnet(first) else { continue };
            if port.physical_network.as_deref() != Some(physnet) {
                updates.push((port.target, physnet.to_owned()));
            }
        }
        for (target, physnet) in updates {
            plan.update_port(&target, PatchOp::new("add", "/physical_network", Some(Value::String(physnet))));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::hooks::validate_interfaces::ValidateInterfaces;
    use crate::processing::plan::PortView;
    use crate::processing::testdata::{self, ETH1};
    use serde_json::json;

    fn cfg(overwrite_existing: bool) -> ProcessingConfig {
        ProcessingConfig {
            overwrite_existing,
            physnet_cidr_map: vec![
                "192.0.2.0/24:provisioning".into(),
                "2001:db8::/64:v6net".into(),
                "198.51.100.0/24:tenant".into(),
            ],
            ..Default::default()
        }
    }

    fn run(hook: &Physnet, data: &mut Value) -> Plan {
        let mut node = testdata::node();
        node.ports.push(PortView { uuid: "p-eth1".into(), address: ETH1.into(), ..Default::default() });
        let mut plan = Plan::new();
        let validate = ValidateInterfaces::new(&ProcessingConfig::default());
        validate.before_processing(data).expect("validate");
        validate.before_update(data, &node, &mut plan).expect("validate");
        hook.before_update(data, &node, &mut plan).expect("physnet");
        plan
    }

    #[test]
    fn maps_new_and_existing_ports() {
        let plan = run(&Physnet::inspector(&cfg(true)).expect("hook"), &mut testdata::two_nics_two_disks());
        assert_eq!(plan.new_ports()[0].physical_network.as_deref(), Some("provisioning"));
        assert_eq!(
            plan.port_patches(),
            [("p-eth1".to_owned(), vec![PatchOp::new("add", "/physical_network", Some(json!("tenant")))])]
        );
    }

    #[test]
    fn inspector_does_nothing_without_overwrite_existing() {
        let plan = run(&Physnet::inspector(&cfg(false)).expect("hook"), &mut testdata::two_nics_two_disks());
        assert_eq!(plan.new_ports()[0].physical_network, None);
        assert!(plan.port_patches().is_empty());
        let plan = run(&Physnet::ironic(&cfg(false)).expect("hook"), &mut testdata::two_nics_two_disks());
        assert_eq!(plan.port_patches().len(), 1, "Ironic ignores overwrite_existing");
    }

    #[test]
    fn inspector_only_tries_the_first_address() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["interfaces"][1]["ipv4_address"] = json!("203.0.113.9");
        data["inventory"]["interfaces"][1]["ipv6_address"] = json!("2001:db8::9%eth1");
        let plan = run(&Physnet::inspector(&cfg(true)).expect("hook"), &mut data.clone());
        assert!(plan.port_patches().is_empty());
        let plan = run(&Physnet::ironic(&cfg(true)).expect("hook"), &mut data);
        assert_eq!(
            plan.port_patches(),
            [("p-eth1".to_owned(), vec![PatchOp::new("add", "/physical_network", Some(json!("v6net")))])]
        );
    }

    #[test]
    fn bad_cidr_map_refuses_to_build() {
        let cfg = ProcessingConfig { physnet_cidr_map: vec!["nonsense".into()], ..Default::default() };
        assert!(Physnet::inspector(&cfg).is_err());
    }
}
