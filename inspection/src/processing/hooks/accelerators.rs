//! `accelerators`: sets `properties.accelerators` from the PCI devices that match a known accelerator.
//! As in ironic-inspector, nothing is written when none matches (Ironic would write `[]`).
use serde_json::{Map, Value};

use super::Hook;
use crate::processing::config::KnownAccelerator;
use crate::processing::data::truthy;
use crate::processing::plan::{NodeView, Plan};

/// Known accelerators matched on `vendor_id` and `device_id` (= IPA's `product_id`).
#[derive(Debug)]
pub(crate) struct Accelerators {
    pub(crate) known: Vec<KnownAccelerator>,
}

impl Hook for Accelerators {
    fn before_update(&self, data: &mut Value, _node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let Some(devices) = data.get("pci_devices").filter(|d| truthy(d)) else {
            return Ok(());
        };
        let devices = devices.as_array().ok_or_else(|| format!("pci_devices {devices} is not a list"))?;
        let mut found = Vec::new();
        for dev in devices {
            let (Some(vendor), Some(product)) = (dev.get("vendor_id"), dev.get("product_id")) else {
                return Err(format!("PCI device {dev} has no vendor_id or product_id"));
            };
            let Some(known) = self.known.iter().find(|k| {
                vendor.as_str() == Some(k.vendor_id.as_str()) && product.as_str() == Some(k.device_id.as_str())
            }) else {
                continue;
            };
            let bus = dev.get("bus").ok_or_else(|| format!("PCI device {dev} has no bus"))?;
            let mut accelerator = Map::new();
            accelerator.insert("vendor_id".to_owned(), Value::from(known.vendor_id.as_str()));
            accelerator.insert("device_id".to_owned(), Value::from(known.device_id.as_str()));
            accelerator.insert("type".to_owned(), Value::from(known.device_type.as_str()));
            accelerator.insert("device_info".to_owned(), Value::from(known.device_info.as_str()));
            accelerator.insert("pci_address".to_owned(), bus.clone());
            found.push(Value::Object(accelerator));
        }
        if !found.is_empty() {
            plan.set_node("add", "/properties/accelerators", Some(Value::Array(found)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::plan::PatchOp;
    use crate::processing::testdata;
    use serde_json::json;

    fn t4() -> KnownAccelerator {
        KnownAccelerator {
            vendor_id: "10de".into(),
            device_id: "1eb8".into(),
            device_type: "GPU".into(),
            device_info: "NVIDIA Corporation Tesla T4".into(),
        }
    }

    fn run(known: Vec<KnownAccelerator>, data: &mut Value) -> Result<Vec<PatchOp>, String> {
        let mut plan = Plan::new();
        Accelerators { known }.before_update(data, &testdata::node(), &mut plan)?;
        Ok(plan.node_patch(&testdata::node()))
    }

    #[test]
    fn known_devices_become_the_accelerators_property() {
        let accel = |bus: &str| {
            json!({"vendor_id": "10de", "device_id": "1eb8", "type": "GPU",
                   "device_info": "NVIDIA Corporation Tesla T4", "pci_address": bus})
        };
        assert_eq!(
            run(vec![t4()], &mut testdata::pci_and_extra_hardware()),
            Ok(vec![PatchOp::new(
                "add",
                "/properties/accelerators",
                Some(json!([accel("0000:3b:00.0"), accel("0000:d8:00.0")]))
            )])
        );
    }

    #[test]
    fn nothing_known_or_no_devices_writes_nothing() {
        assert_eq!(run(vec![], &mut testdata::pci_and_extra_hardware()), Ok(vec![]));
        assert_eq!(run(vec![t4()], &mut testdata::two_nics_two_disks()), Ok(vec![]));
        assert!(run(vec![t4()], &mut json!({"pci_devices": [{"vendor_id": "10de", "product_id": "1eb8"}]})).is_err());
    }
}
