//! `pci_devices` / `pci-devices`: counts the PCI devices of each configured alias into capabilities
//! (`name:<count>`). Reads IPA's optional `pci_devices` collector data; with no alias it changes nothing.
use serde_json::Value;

use super::Hook;
use crate::processing::config::{PciAlias, ProcessingConfig};
use crate::processing::plan::{NodeView, Plan, parse_capabilities};

/// Counts aliased PCI devices.
#[derive(Debug)]
pub(crate) struct PciDevices {
    aliases: Vec<PciAlias>,
}

impl PciDevices {
    pub(crate) fn new(cfg: &ProcessingConfig) -> Self {
        Self { aliases: cfg.pci_devices.alias.clone() }
    }

    /// The alias name of a (vendor, product) pair; a later alias for the same pair wins, as in a Python dict.
    fn alias(&self, vendor: &str, product: &str) -> Option<&str> {
        self.aliases.iter().rev().find(|a| a.vendor_id == vendor && a.product_id == product).map(|a| a.name.as_str())
    }
}

/// A device's `(vendor_id, product_id)`, `None` where not a string.
type DeviceIds<'a> = (Option<&'a str>, Option<&'a str>);

/// `(vendor_id, product_id)` of each device of `data.pci_devices`; a device without them fails, as in
/// ironic-inspector.
fn device_ids(devices: &Value) -> Result<Vec<DeviceIds<'_>>, String> {
    let devices = devices.as_array().ok_or_else(|| format!("pci_devices {devices} is not a list"))?;
    devices
        .iter()
        .map(|dev| match (dev.get("vendor_id"), dev.get("product_id")) {
            (Some(vendor), Some(product)) => Ok((vendor.as_str(), product.as_str())),
            _ => Err(format!("PCI device {dev} has no vendor_id or product_id")),
        })
        .collect()
}

impl Hook for PciDevices {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let Some(devices) = data.get("pci_devices") else {
            return Ok(());
        };
        // Count per (vendor, product) in first-seen order, then name the counts: two pairs with one alias name
        // overwrite rather than add up, as ironic-inspector's dict comprehension does.
        let mut counts: Vec<((&str, &str), u64)> = Vec::new();
        for (vendor, product) in device_ids(devices)? {
            let (Some(vendor), Some(product)) = (vendor, product) else { continue };
            if self.alias(vendor, product).is_none() {
                continue;
            }
            match counts.iter_mut().find(|(pair, _)| *pair == (vendor, product)) {
                Some((_, n)) => *n += 1,
                None => counts.push(((vendor, product), 1)),
            }
        }
        let mut named: Vec<(String, Option<String>)> = Vec::new();
        for ((vendor, product), count) in counts {
            let name = self.alias(vendor, product).unwrap_or_default().to_owned();
            match named.iter_mut().find(|(n, _)| *n == name) {
                Some(existing) => existing.1 = Some(count.to_string()),
                None => named.push((name, Some(count.to_string()))),
            }
        }
        if named.is_empty() {
            return Ok(());
        }
        parse_capabilities(node.properties.get("capabilities").unwrap_or(&Value::Null))?;
        plan.merge_capabilities(named);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::plan::PatchOp;
    use crate::processing::testdata;
    use serde_json::json;

    fn alias(vendor: &str, product: &str, name: &str) -> PciAlias {
        PciAlias { vendor_id: vendor.into(), product_id: product.into(), name: name.into() }
    }

    fn run(aliases: Vec<PciAlias>, data: &mut Value) -> Result<Vec<PatchOp>, String> {
        let mut cfg = ProcessingConfig::default();
        cfg.pci_devices.alias = aliases;
        let mut plan = Plan::new();
        let mut node = testdata::node();
        node.properties.insert("capabilities".into(), json!("boot_mode:uefi"));
        PciDevices::new(&cfg).before_update(data, &node, &mut plan)?;
        Ok(plan.node_patch(&node))
    }

    #[test]
    fn counts_aliased_devices_into_capabilities() {
        let aliases =
            vec![alias("10de", "1eb8", "gpu_t4"), alias("8086", "1572", "nic_x710"), alias("1af4", "9999", "none")];
        assert_eq!(
            run(aliases, &mut testdata::pci_and_extra_hardware()),
            Ok(vec![PatchOp::new(
                "add",
                "/properties/capabilities",
                Some(json!("boot_mode:uefi,gpu_t4:2,nic_x710:2"))
            )])
        );
    }

    #[test]
    fn no_alias_or_no_data_changes_nothing() {
        assert_eq!(run(vec![], &mut testdata::pci_and_extra_hardware()), Ok(vec![]));
        assert_eq!(run(vec![alias("10de", "1eb8", "gpu")], &mut testdata::two_nics_two_disks()), Ok(vec![]));
    }

    #[test]
    fn malformed_devices_fail() {
        assert!(run(vec![], &mut json!({"pci_devices": [{"bus": "0000:00:01.0"}]})).is_err());
        assert!(run(vec![], &mut json!({"pci_devices": "none"})).is_err());
    }
}
