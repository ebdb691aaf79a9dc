//! `validate_interfaces` (also `validate-interfaces` and `ports`): which NICs are valid, which become ports,
//! which ports go, and `pxe_enabled` — with ironic-inspector's rules.
use serde_json::{Map, Value};

use super::Hook;
use crate::processing::config::{AddPorts, KeepPorts, ProcessingConfig};
use crate::processing::data::{
    InterfaceRecord, bmc_addresses, checked_inventory, interface_records, object_mut, pxe_mac, truthy,
};
use crate::processing::net::parse_ip;
use crate::processing::plan::{NewPort, NodeView, PatchOp, Plan};

/// Provision states in which ports are created but neither deleted nor updated.
const ACTIVE_STATES: [&str; 2] = ["active", "rescue"];

/// Phase 1 builds `ipmi_address`, `ipmi_v6address`, `all_interfaces`, `interfaces` (the valid set) and `macs`;
/// phase 2 creates, deletes and updates ports.
#[derive(Debug)]
pub(crate) struct ValidateInterfaces {
    add_ports: AddPorts,
    keep_ports: KeepPorts,
    overwrite_existing: bool,
    update_pxe_enabled: bool,
}

impl ValidateInterfaces {
    pub(crate) fn new(cfg: &ProcessingConfig) -> Self {
        Self {
            add_ports: cfg.add_ports,
            keep_ports: cfg.keep_ports,
            overwrite_existing: cfg.overwrite_existing,
            update_pxe_enabled: cfg.update_pxe_enabled,
        }
    }

    /// `_validate_interfaces`: drops `lo` and loopback IPs; in `pxe` mode with a known PXE MAC keeps only the PXE
    /// NIC; unless `all`, keeps only NICs with an IP (the PXE NIC included).
    fn valid(&self, all: &[InterfaceRecord], pxe_known: bool) -> Result<Vec<InterfaceRecord>, String> {
        if all.is_empty() {
            return Err("No interfaces supplied by the ramdisk".to_owned());
        }
        let mut valid = Vec::new();
        for iface in all {
            if iface.name == "lo" {
                continue;
            }
            if let Some(ip) = &iface.ip {
                let ip = parse_ip(ip)
                    .ok_or_else(|| format!("failed to detect a valid IP address from {ip:?} of {}", iface.name))?;
                if ip.is_loopback() {
                    continue;
                }
            }
            if self.add_ports == AddPorts::Pxe && pxe_known && !iface.pxe {
                continue;
            }
            if self.add_ports != AddPorts::All && iface.ip.is_none() {
                continue;
            }
            valid.push(iface.clone());
        }
        if valid.is_empty() {
            let all: Map<String, Value> = all.iter().map(|i| (i.name.clone(), i.to_json())).collect();
            return Err(format!("No suitable interfaces found in {}", Value::Object(all)));
        }
        Ok(valid)
    }
}

/// A valid interface as stored in `data.interfaces`.
struct StoredInterface {
    mac: String,
    pxe: bool,
    client_id: Value,
}

fn stored_interfaces(data: &Value) -> Result<Vec<StoredInterface>, String> {
    let interfaces = data.get("interfaces").and_then(Value::as_object).ok_or_else(|| {
        "introspection data has no valid interfaces (validate_interfaces did not run first)".to_owned()
    })?;
    interfaces
        .iter()
        .map(|(name, iface)| {
            let mac = iface.get("mac").and_then(Value::as_str).ok_or_else(|| format!("interface {name} has no MAC"))?;
            Ok(StoredInterface {
                mac: mac.to_ascii_lowercase(),
                pxe: iface.get("pxe").is_none_or(truthy),
                client_id: iface.get("client_id").cloned().unwrap_or(Value::Null),
            })
        })
        .collect()
}

/// MACs kept by `keep_ports` (`None`: keep everything).
fn expected_macs(keep_ports: KeepPorts, data: &Value) -> Result<Option<Vec<String>>, String> {
    let macs = match keep_ports {
        KeepPorts::All => return Ok(None),
        KeepPorts::Present => data
            .get("all_interfaces")
            .and_then(Value::as_object)
            .ok_or_else(|| "introspection data has no all_interfaces".to_owned())?
            .values()
            .filter_map(|i| i.get("mac").and_then(Value::as_str))
            .map(str::to_ascii_lowercase)
            .collect(),
        KeepPorts::Added => data
            .get("macs")
            .and_then(Value::as_array)
            .ok_or_else(|| "introspection data has no macs".to_owned())?
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_ascii_lowercase)
            .collect(),
    };
    Ok(Some(macs))
}

impl Hook for ValidateInterfaces {
    fn before_processing(&self, data: &mut Value) -> Result<(), String> {
        let (v4, v6) = bmc_addresses(data);
        let object = object_mut(data)?;
        object.insert("ipmi_address".to_owned(), v4.map_or(Value::Null, Value::String));
        object.insert("ipmi_v6address".to_owned(), v6.map_or(Value::Null, Value::String));
        checked_inventory(data)?;
        let all = interface_records(data);
        let valid = self.valid(&all, pxe_mac(data).is_some())?;
        let to_map = |records: &[InterfaceRecord]| -> Value {
            Value::Object(records.iter().map(|r| (r.name.clone(), r.to_json())).collect())
        };
        let object = object_mut(data)?;
        object.insert("all_interfaces".to_owned(), to_map(&all));
        object.insert("interfaces".to_owned(), to_map(&valid));
        object.insert("macs".to_owned(), valid.iter().map(|r| Value::from(r.mac.as_str())).collect());
        Ok(())
    }

    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let interfaces = stored_interfaces(data)?;
        if self.add_ports != AddPorts::Disabled {
            for iface in &interfaces {
                if plan.port_by_address(node, &iface.mac).is_some() {
                    continue;
                }
                let mut extra = Map::new();
                if truthy(&iface.client_id) {
                    extra.insert("client-id".to_owned(), iface.client_id.clone());
                }
                plan.create_port(NewPort {
                    address: iface.mac.clone(),
                    pxe_enabled: if self.update_pxe_enabled { iface.pxe } else { true },
                    extra,
                    ..NewPort::default()
                });
            }
        }
        let expected = expected_macs(self.keep_ports, data)?;
        if ACTIVE_STATES.contains(&node.provision_state.as_str()) {
            return Ok(());
        }
        if let Some(expected) = expected {
            for port in &node.ports {
                if !expected.iter().any(|mac| mac.eq_ignore_ascii_case(&port.address)) {
                    plan.delete_port(&port.uuid);
                }
            }
        }
        if self.overwrite_existing && self.update_pxe_enabled {
            for iface in &interfaces {
                if let Some(port) = plan.port_by_address(node, &iface.mac).filter(|p| p.pxe_enabled != iface.pxe) {
                    plan.update_port(
                        &port.target,
                        PatchOp::new("replace", "/pxe_enabled", Some(Value::Bool(iface.pxe))),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::plan::PortView;
    use crate::processing::testdata::{self, ETH0, ETH1};
    use serde_json::json;

    fn hook(f: impl FnOnce(&mut ProcessingConfig)) -> ValidateInterfaces {
        let mut cfg = ProcessingConfig::default();
        f(&mut cfg);
        ValidateInterfaces::new(&cfg)
    }

    fn port(uuid: &str, mac: &str, pxe: bool) -> PortView {
        PortView { uuid: uuid.into(), address: mac.into(), pxe_enabled: pxe, ..Default::default() }
    }

    fn new_port(mac: &str, pxe: bool) -> NewPort {
        NewPort { address: mac.into(), pxe_enabled: pxe, ..Default::default() }
    }

    /// The ramdisk got no address on interface `index` (IPv4 nor IPv6).
    fn without_ip(data: &mut Value, index: usize) {
        data["inventory"]["interfaces"][index]["ipv4_address"] = json!(null);
        data["inventory"]["interfaces"][index]["ipv6_address"] = json!(null);
    }

    fn run(hook: &ValidateInterfaces, data: &mut Value, node: &NodeView) -> Result<Plan, String> {
        hook.before_processing(data)?;
        let mut plan = Plan::new();
        hook.before_update(data, node, &mut plan)?;
        Ok(plan)
    }

    #[test]
    fn phase_one_builds_the_interface_keys() {
        let mut data = testdata::two_nics_two_disks();
        hook(|_| {}).before_processing(&mut data).expect("valid");
        assert_eq!(data["ipmi_address"], json!("192.0.2.200"));
        assert_eq!(data["ipmi_v6address"], json!(null));
        assert_eq!(
            data["all_interfaces"],
            json!({
                "eth0": {"ip": "192.0.2.10", "mac": ETH0, "client_id": null, "pxe": true},
                "eth1": {"ip": "198.51.100.20", "mac": ETH1, "client_id": null, "pxe": false},
            })
        );
        assert_eq!(
            data["interfaces"],
            json!({"eth0": {"ip": "192.0.2.10", "mac": ETH0, "client_id": null, "pxe": true}})
        );
        assert_eq!(data["macs"], json!([ETH0]));
    }

    #[test]
    fn pxe_mode_creates_the_pxe_port() {
        let plan = run(&hook(|_| {}), &mut testdata::two_nics_two_disks(), &testdata::node()).expect("run");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true)]);
        assert!(plan.port_patches().is_empty() && plan.port_deletes().is_empty());
    }

    #[test]
    fn pxe_mode_without_a_boot_interface_falls_back_to_active() {
        let mut data = testdata::two_nics_two_disks();
        data["boot_interface"] = json!(null);
        without_ip(&mut data, 1);
        let plan = run(&hook(|_| {}), &mut data, &testdata::node()).expect("run");
        assert_eq!(plan.new_ports(), [new_port(ETH0, false)], "no boot_interface: every pxe is false");
    }

    #[test]
    fn active_and_all_modes() {
        let mut data = testdata::two_nics_two_disks();
        let plan = run(&hook(|c| c.add_ports = AddPorts::Active), &mut data, &testdata::node()).expect("active");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true), new_port(ETH1, false)]);

        let mut data = testdata::two_nics_two_disks();
        without_ip(&mut data, 1);
        let plan = run(&hook(|c| c.add_ports = AddPorts::Active), &mut data, &testdata::node()).expect("active");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true)], "active needs an IP");

        let mut data = testdata::two_nics_two_disks();
        without_ip(&mut data, 1);
        let plan = run(&hook(|c| c.add_ports = AddPorts::All), &mut data, &testdata::node()).expect("all");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true), new_port(ETH1, false)]);
        assert_eq!(data["macs"], json!([ETH0, ETH1]));
    }

    #[test]
    fn disabled_creates_nothing() {
        let plan =
            run(&hook(|c| c.add_ports = AddPorts::Disabled), &mut testdata::two_nics_two_disks(), &testdata::node())
                .expect("disabled");
        assert!(plan.is_empty());
    }

    #[test]
    fn pxe_interface_without_ip_is_not_valid_in_pxe_mode() {
        let mut data = testdata::two_nics_two_disks();
        without_ip(&mut data, 0);
        let err = hook(|_| {}).before_processing(&mut data).expect_err("no suitable");
        assert!(err.starts_with("No suitable interfaces found in {"), "{err}");
        assert!(data.get("all_interfaces").is_none());
        assert_eq!(data["ipmi_address"], json!("192.0.2.200"), "the BMC address is set before failing");
    }

    #[test]
    fn loopback_and_missing_interfaces() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["interfaces"][1]["ipv4_address"] = json!("127.0.0.1");
        let plan = run(&hook(|c| c.add_ports = AddPorts::All), &mut data, &testdata::node()).expect("run");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true)]);

        data["inventory"]["interfaces"] = json!([]);
        assert_eq!(
            hook(|_| {}).before_processing(&mut data),
            Err("No network interfaces provided in the inventory".to_owned())
        );
        data["inventory"]["interfaces"] = json!([{"name": "eth0", "mac_address": null}]);
        assert_eq!(hook(|_| {}).before_processing(&mut data), Err("No interfaces supplied by the ramdisk".to_owned()));
        data["inventory"]["interfaces"] = json!([{"name": "eth0", "mac_address": ETH0, "ipv4_address": "bogus"}]);
        assert!(hook(|_| {}).before_processing(&mut data).is_err());
    }

    #[test]
    fn client_id_goes_to_extra_and_update_pxe_enabled_off_creates_pxe_ports() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["interfaces"][1]["client_id"] = json!("ff:00:00:00:00:00:02:00:00:02:c9:00:7f:80");
        let plan = run(
            &hook(|c| {
                c.add_ports = AddPorts::Active;
                c.update_pxe_enabled = false;
            }),
            &mut data,
            &testdata::node(),
        )
        .expect("run");
        let mut eth1 = new_port(ETH1, true);
        eth1.extra.insert("client-id".into(), json!("ff:00:00:00:00:00:02:00:00:02:c9:00:7f:80"));
        assert_eq!(plan.new_ports(), [new_port(ETH0, true), eth1]);
    }

    fn node_with_ports() -> NodeView {
        let mut node = testdata::node();
        node.ports =
            vec![port("p-eth0", ETH0, false), port("p-eth1", ETH1, true), port("p-stale", "52:54:00:99:99:99", true)];
        node
    }

    #[test]
    fn keep_all_fixes_pxe_enabled_of_valid_ports_only() {
        let plan = run(&hook(|_| {}), &mut testdata::two_nics_two_disks(), &node_with_ports()).expect("run");
        assert!(plan.new_ports().is_empty() && plan.port_deletes().is_empty());
        assert_eq!(
            plan.port_patches(),
            [("p-eth0".to_owned(), vec![PatchOp::new("replace", "/pxe_enabled", Some(json!(true)))])],
            "eth1 is not valid in pxe mode, so it keeps pxe_enabled=true"
        );
    }

    #[test]
    fn keep_present_and_added_delete_ports() {
        let plan =
            run(&hook(|c| c.keep_ports = KeepPorts::Present), &mut testdata::two_nics_two_disks(), &node_with_ports())
                .expect("present");
        assert_eq!(plan.port_deletes(), ["p-stale".to_owned()]);

        let plan =
            run(&hook(|c| c.keep_ports = KeepPorts::Added), &mut testdata::two_nics_two_disks(), &node_with_ports())
                .expect("added");
        assert_eq!(plan.port_deletes(), ["p-eth1".to_owned(), "p-stale".to_owned()]);
        assert_eq!(plan.port_patches().len(), 1);
    }

    #[test]
    fn active_mode_patches_every_valid_port() {
        let plan =
            run(&hook(|c| c.add_ports = AddPorts::Active), &mut testdata::two_nics_two_disks(), &node_with_ports())
                .expect("active");
        assert_eq!(
            plan.port_patches(),
            [
                ("p-eth0".to_owned(), vec![PatchOp::new("replace", "/pxe_enabled", Some(json!(true)))]),
                ("p-eth1".to_owned(), vec![PatchOp::new("replace", "/pxe_enabled", Some(json!(false)))]),
            ]
        );
    }

    #[test]
    fn update_pxe_enabled_or_overwrite_existing_off_patches_nothing() {
        for f in [
            (|c: &mut ProcessingConfig| c.update_pxe_enabled = false) as fn(&mut ProcessingConfig),
            |c: &mut ProcessingConfig| c.overwrite_existing = false,
        ] {
            let plan = run(&hook(f), &mut testdata::two_nics_two_disks(), &node_with_ports()).expect("run");
            assert!(plan.is_empty(), "{plan:?}");
        }
    }

    #[test]
    fn active_nodes_get_new_ports_but_no_deletes_or_patches() {
        let mut node = node_with_ports();
        node.ports.remove(0);
        node.provision_state = "active".into();
        let plan = run(&hook(|c| c.keep_ports = KeepPorts::Added), &mut testdata::two_nics_two_disks(), &node)
            .expect("active node");
        assert_eq!(plan.new_ports(), [new_port(ETH0, true)]);
        assert!(plan.port_deletes().is_empty() && plan.port_patches().is_empty());
    }

    #[test]
    fn phase_two_needs_phase_one() {
        let mut plan = Plan::new();
        assert!(hook(|_| {}).before_update(&mut testdata::two_nics_two_disks(), &testdata::node(), &mut plan).is_err());
    }
}
