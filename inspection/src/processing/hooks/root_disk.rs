//! `root_disk_selection` (ironic-inspector) and `root-device` (Ironic): pick the root disk by the node's root
//! device hints (or take IPA's guess) and set `local_gb`.
//!
//! ironic-inspector writes `local_gb` as a string and only when `overwrite_existing` is on or the node has none;
//! Ironic writes an integer, always.
use serde_json::Value;

use super::Hook;
use crate::processing::config::ProcessingConfig;
use crate::processing::data::{checked_inventory, inventory, object_mut, truthy};
use crate::processing::device_hints::Hints;
use crate::processing::plan::{NodeView, Plan};

const GIB: i64 = 1 << 30;

/// Root disk and `local_gb`.
#[derive(Debug)]
pub(crate) struct RootDiskSelection {
    /// Ironic's `root-device` semantics (integer, always written, inventory left alone).
    ironic: bool,
    disk_partitioning_spacing: bool,
    overwrite_existing: bool,
}

impl RootDiskSelection {
    /// ironic-inspector's `root_disk_selection`.
    pub(crate) fn inspector(cfg: &ProcessingConfig) -> Self {
        Self {
            ironic: false,
            disk_partitioning_spacing: cfg.disk_partitioning_spacing,
            overwrite_existing: cfg.overwrite_existing,
        }
    }

    /// Ironic's `root-device`.
    pub(crate) fn ironic(cfg: &ProcessingConfig) -> Self {
        Self { ironic: true, disk_partitioning_spacing: cfg.disk_partitioning_spacing, overwrite_existing: true }
    }

    /// Applies the node's hints: drops `skip_block_devices`, then picks the first disk matching `root_device`
    /// into `data.root_disk`. Nothing happens without hints.
    fn apply_hints(&self, data: &mut Value, node: &NodeView) -> Result<(), String> {
        let Some(hints) = node.properties.get("root_device").filter(|h| truthy(h)) else {
            return Ok(());
        };
        let mut disks: Vec<Value> =
            data.pointer("/inventory/disks").and_then(Value::as_array).cloned().unwrap_or_default();
        let skip = skipped_disk_names(node, &disks)?;
        if !skip.is_empty() {
            disks.retain(|d| !d.get("name").and_then(Value::as_str).is_some_and(|n| skip.iter().any(|s| s == n)));
            if let (false, Some(Value::Object(inventory))) = (self.ironic, data.get_mut("inventory")) {
                inventory.insert("disks".to_owned(), Value::Array(disks.clone()));
            }
        }
        let failed = |e: String| {
            if self.ironic {
                format!(
                    "No disks could be found using root device hints {hints} for node {} because they failed to \
                     validate. Error: {e}",
                    node.uuid
                )
            } else {
                format!(
                    "No disks could be found using the root device hints {hints} because they failed to validate. \
                     Error: {e}"
                )
            }
        };
        let device = Hints::parse(hints).map_err(failed)?.first_match(&disks).map_err(failed)?.cloned();
        let Some(device) = device else {
            return Err(if self.ironic {
                format!("No disks satisfied root device hints for node {}", node.uuid)
            } else {
                "No disks satisfied root device hints".to_owned()
            });
        };
        object_mut(data)?.insert("root_disk".to_owned(), device);
        Ok(())
    }
}

/// Names of the disks matched by any hint dict of `properties.skip_block_devices`.
fn skipped_disk_names(node: &NodeView, disks: &[Value]) -> Result<Vec<String>, String> {
    let hints = match node.properties.get("skip_block_devices") {
        Some(Value::Array(hints)) => hints.as_slice(),
        Some(other) if truthy(other) => return Err(format!("skip_block_devices {other} is not a list of hints")),
        _ => return Ok(Vec::new()),
    };
    let mut names: Vec<String> = Vec::new();
    for hint in hints {
        let parsed = Hints::parse(hint).map_err(|e| format!("Invalid skip_block_devices hint {hint}: {e}"))?;
        for disk in disks {
            let Some(fields) = disk.as_object() else { continue };
            let matched = parsed.matches(fields).map_err(|e| format!("Invalid skip_block_devices hint {hint}: {e}"))?;
            match fields.get("name").and_then(Value::as_str) {
                Some(name) if matched && !names.iter().any(|n| n == name) => names.push(name.to_owned()),
                _ => {}
            }
        }
    }
    Ok(names)
}

/// `root_disk.size // GiB`, minus 1 with spacing when not 0. A disk-less node is 0.
fn local_gb(root_disk: Option<&Value>, spacing: bool) -> Result<i64, String> {
    let Some(root_disk) = root_disk.filter(|d| truthy(d)) else {
        return Ok(0);
    };
    // Python's `size // GiB`; a float size is floored (saturating), anything else has no size.
    let size = match root_disk.get("size") {
        Some(Value::Number(n)) => n.as_i64().unwrap_or_else(|| n.as_f64().map_or(i64::MAX, |f| f.floor() as i64)),
        other => return Err(format!("root disk {root_disk} has no usable size: {}", other.unwrap_or(&Value::Null))),
    };
    let gib = size.div_euclid(GIB);
    Ok(if gib != 0 && spacing { gib - 1 } else { gib })
}

impl Hook for RootDiskSelection {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        if self.ironic {
            inventory(data)?;
        } else {
            checked_inventory(data)?;
        }
        self.apply_hints(data, node)?;
        let local_gb = local_gb(data.get("root_disk"), self.disk_partitioning_spacing)?;
        object_mut(data)?.insert("local_gb".to_owned(), Value::from(local_gb));
        if self.ironic {
            plan.set_node("add", "/properties/local_gb", Some(Value::from(local_gb)));
        } else if self.overwrite_existing || !node.properties.get("local_gb").is_some_and(truthy) {
            plan.set_node("add", "/properties/local_gb", Some(Value::String(local_gb.to_string())));
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

    fn run(hook: &RootDiskSelection, data: &mut Value, node: &NodeView) -> Result<Vec<PatchOp>, String> {
        let mut plan = Plan::new();
        hook.before_update(data, node, &mut plan)?;
        Ok(plan.node_patch(node))
    }

    fn add(path: &str, value: Value) -> PatchOp {
        PatchOp::new("add", path, Some(value))
    }

    #[test]
    fn ipa_root_disk_gives_local_gb_as_a_string_minus_one() {
        let mut data = testdata::two_nics_two_disks();
        let patch = run(&RootDiskSelection::inspector(&ProcessingConfig::default()), &mut data, &testdata::node());
        assert_eq!(patch, Ok(vec![add("/properties/local_gb", json!("19"))]));
        assert_eq!(data["local_gb"], json!(19));
        assert_eq!(data["root_disk"]["name"], json!("/dev/sda"));
    }

    #[test]
    fn without_spacing_local_gb_is_the_whole_disk() {
        let cfg = ProcessingConfig { disk_partitioning_spacing: false, ..Default::default() };
        let mut data = testdata::two_nics_two_disks();
        let patch = run(&RootDiskSelection::inspector(&cfg), &mut data, &testdata::node());
        assert_eq!(patch, Ok(vec![add("/properties/local_gb", json!("20"))]));
    }

    #[test]
    fn hints_pick_by_serial_and_by_size() {
        let hook = RootDiskSelection::inspector(&ProcessingConfig::default());
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"serial": "WD-WCC4N0000002"}));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&hook, &mut data, &node), Ok(vec![add("/properties/local_gb", json!("930"))]));
        assert_eq!(data["root_disk"]["name"], json!("/dev/sdb"));
        assert_eq!(data["local_gb"], json!(930));

        node.properties.insert("root_device".into(), json!({"size": ">= 100"}));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&hook, &mut data, &node), Ok(vec![add("/properties/local_gb", json!("930"))]));
        assert_eq!(data["root_disk"]["serial"], json!("WD-WCC4N0000002"));
    }

    #[test]
    fn no_matching_disk_fails() {
        let hook = RootDiskSelection::inspector(&ProcessingConfig::default());
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"serial": "does-not-exist"}));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&hook, &mut data, &node), Err("No disks satisfied root device hints".to_owned()));

        node.properties.insert("root_device".into(), json!({"size": "-1"}));
        let err = run(&hook, &mut data, &node).expect_err("invalid hints");
        assert!(err.starts_with("No disks could be found using the root device hints"), "{err}");
    }

    #[test]
    fn skip_block_devices_removes_disks_before_matching() {
        let hook = RootDiskSelection::inspector(&ProcessingConfig::default());
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"size": ">= 1"}));
        node.properties.insert("skip_block_devices".into(), json!([{"name": "/dev/sda"}]));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&hook, &mut data, &node), Ok(vec![add("/properties/local_gb", json!("930"))]));
        assert_eq!(data["inventory"]["disks"].as_array().map(Vec::len), Some(1), "inspector drops skipped disks");

        let mut data = testdata::two_nics_two_disks();
        let ironic = RootDiskSelection::ironic(&ProcessingConfig::default());
        assert_eq!(run(&ironic, &mut data, &node), Ok(vec![add("/properties/local_gb", json!(930))]));
        assert_eq!(data["inventory"]["disks"].as_array().map(Vec::len), Some(2), "Ironic leaves the inventory");
    }

    #[test]
    fn overwrite_existing_off_keeps_the_nodes_local_gb() {
        let cfg = ProcessingConfig { overwrite_existing: false, ..Default::default() };
        let mut node = testdata::node();
        node.properties.insert("local_gb".into(), json!("100"));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&RootDiskSelection::inspector(&cfg), &mut data, &node), Ok(vec![]));
        assert_eq!(data["local_gb"], json!(19), "the data still gets local_gb");
        assert_eq!(
            run(&RootDiskSelection::ironic(&cfg), &mut data, &node),
            Ok(vec![add("/properties/local_gb", json!(19))]),
            "root-device always writes, as an integer"
        );
    }

    #[test]
    fn diskless_and_tiny_disks() {
        let hook = RootDiskSelection::inspector(&ProcessingConfig::default());
        let mut data = testdata::two_nics_two_disks();
        data["root_disk"] = json!(null);
        data["inventory"].as_object_mut().expect("inventory").remove("disks");
        assert_eq!(run(&hook, &mut data, &testdata::node()), Ok(vec![add("/properties/local_gb", json!("0"))]));
        assert_eq!(data["inventory"]["disks"], json!([]));

        data["root_disk"] = json!({"name": "/dev/sdz", "size": 512 * 1024 * 1024});
        assert_eq!(run(&hook, &mut data, &testdata::node()), Ok(vec![add("/properties/local_gb", json!("0"))]));

        data["root_disk"] = json!({"name": "/dev/sdz"});
        assert!(run(&hook, &mut data, &testdata::node()).is_err());
    }

    #[test]
    fn needs_an_inventory() {
        let hook = RootDiskSelection::inspector(&ProcessingConfig::default());
        let mut data = json!({"root_disk": {"size": 1}});
        assert_eq!(run(&hook, &mut data, &testdata::node()), Err("Hardware inventory is empty or missing".to_owned()));
    }
}
