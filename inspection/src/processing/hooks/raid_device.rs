//! `raid_device` / `raid-device`: learns the root device after RAID creation in two runs, with
//! ironic-inspector's method (the first run's disk serials are kept in `node.extra.block_devices`; Ironic compares
//! against its stored inventory instead, which this pure module does not have).
use serde_json::{Value, json};

use super::Hook;
use crate::processing::data::{object_mut, truthy};
use crate::processing::plan::{NodeView, Plan};

/// First run: `add /extra/block_devices {"serials": [...]}`. Second run, with exactly one new serial:
/// `remove /extra/block_devices` and `add /properties/root_device {"serial": X}`. Skipped when the node already
/// has `root_device`.
#[derive(Debug)]
pub(crate) struct RaidDevice;

/// Serials of the inventory's disks (or of an older ramdisk's `block_devices`).
fn current_serials(data: &Value) -> Result<Vec<Value>, String> {
    if let Some(inventory) = data.get("inventory") {
        let inventory = inventory.as_object().ok_or_else(|| format!("inventory {inventory} is not an object"))?;
        let disks = inventory.get("disks").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        return Ok(disks.iter().filter_map(|d| d.get("serial")).filter(|s| truthy(s)).cloned().collect());
    }
    Ok(data.pointer("/block_devices/serials").and_then(Value::as_array).cloned().unwrap_or_default())
}

impl Hook for RaidDevice {
    fn before_processing(&self, data: &mut Value) -> Result<(), String> {
        let object = object_mut(data)?;
        if !object.get("local_gb").is_some_and(truthy) {
            object.insert("local_gb".to_owned(), Value::from(1));
        }
        Ok(())
    }

    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let current = current_serials(data)?;
        if current.is_empty() || node.properties.contains_key("root_device") {
            return Ok(());
        }
        let Some(saved) = node.extra.get("block_devices") else {
            plan.set_node("add", "/extra/block_devices", Some(json!({"serials": current})));
            return Ok(());
        };
        let previous = saved
            .get("serials")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("node extra block_devices {saved} has no list of serials"))?;
        let new: Vec<&Value> = current.iter().filter(|s| !previous.contains(s)).collect();
        if let [serial] = new.as_slice() {
            plan.set_node("remove", "/extra/block_devices", None);
            plan.set_node("add", "/properties/root_device", Some(json!({"serial": serial})));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::plan::PatchOp;
    use crate::processing::testdata;

    fn run(data: &mut Value, node: &NodeView) -> Vec<PatchOp> {
        let mut plan = Plan::new();
        RaidDevice.before_update(data, node, &mut plan).expect("raid_device");
        plan.node_patch(node)
    }

    #[test]
    fn first_run_saves_the_serials() {
        assert_eq!(
            run(&mut testdata::two_nics_two_disks(), &testdata::node()),
            [PatchOp::new(
                "add",
                "/extra/block_devices",
                Some(json!({"serials": ["S3YJNX0M100001", "WD-WCC4N0000002"]}))
            )]
        );
    }

    #[test]
    fn second_run_with_one_new_serial_sets_the_root_device() {
        let mut node = testdata::node();
        node.extra.insert("block_devices".into(), json!({"serials": ["WD-WCC4N0000002"]}));
        assert_eq!(
            run(&mut testdata::two_nics_two_disks(), &node),
            [
                PatchOp::new("remove", "/extra/block_devices", None),
                PatchOp::new("add", "/properties/root_device", Some(json!({"serial": "S3YJNX0M100001"}))),
            ]
        );
        node.extra.insert("block_devices".into(), json!({"serials": []}));
        assert_eq!(run(&mut testdata::two_nics_two_disks(), &node), [], "two new serials: cannot tell");
        node.extra.insert("block_devices".into(), json!({"serials": ["S3YJNX0M100001", "WD-WCC4N0000002"]}));
        assert_eq!(run(&mut testdata::two_nics_two_disks(), &node), [], "no new serial");
    }

    #[test]
    fn known_root_device_or_no_disks_skip() {
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"name": "/dev/sda"}));
        assert_eq!(run(&mut testdata::two_nics_two_disks(), &node), []);
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["disks"] = json!([]);
        assert_eq!(run(&mut data, &testdata::node()), []);
    }

    #[test]
    fn phase_one_fakes_local_gb() {
        let mut data = json!({"inventory": {}});
        RaidDevice.before_processing(&mut data).expect("raid_device");
        assert_eq!(data["local_gb"], json!(1));
        let mut data = json!({"local_gb": 50});
        RaidDevice.before_processing(&mut data).expect("raid_device");
        assert_eq!(data["local_gb"], json!(50));
    }
}
