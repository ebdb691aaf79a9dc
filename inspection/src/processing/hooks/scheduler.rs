//! `scheduler`: the properties Nova's scheduler needs — `cpus`, `cpu_arch`, `memory_mb` — as strings.
use serde_json::Value;

use super::Hook;
use crate::processing::data::{checked_inventory, inventory, object_mut, python_int, truthy};
use crate::processing::plan::{NodeView, Plan};

/// Copies `cpus`, `cpu_arch` and `memory_mb` to the top level of the data and the node (strings; a key only when
/// its value is truthy and `overwrite_existing` is on or the node lacks it). Malformed values are skipped.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub(crate) overwrite_existing: bool,
}

const KEYS: [&str; 3] = ["cpus", "cpu_arch", "memory_mb"];

impl Hook for Scheduler {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        checked_inventory(data)?;
        let inventory = inventory(data)?;
        let mut found: Vec<(&str, Value)> = Vec::new();
        // As in ironic-inspector, the architecture is only read when the count is good.
        if let Some(count) = inventory.get("cpu").and_then(|cpu| cpu.get("count")).and_then(python_int) {
            found.push(("cpus", Value::from(count)));
            if let Some(arch) = inventory.get("cpu").and_then(|cpu| cpu.get("architecture")).and_then(Value::as_str) {
                found.push(("cpu_arch", Value::from(arch)));
            }
        }
        if let Some(mb) = inventory.get("memory").and_then(|m| m.get("physical_mb")).and_then(python_int) {
            found.push(("memory_mb", Value::from(mb)));
        }
        let data = object_mut(data)?;
        for (key, value) in found {
            data.insert(key.to_owned(), value);
        }
        for key in KEYS {
            let Some(value) = data.get(key).filter(|v| truthy(v)) else { continue };
            if self.overwrite_existing || !node.properties.get(key).is_some_and(truthy) {
                let text = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
                plan.set_node("add", &format!("/properties/{key}"), Some(Value::String(text)));
            }
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

    fn run(overwrite_existing: bool, data: &mut Value, node: &NodeView) -> Result<Vec<PatchOp>, String> {
        let mut plan = Plan::new();
        Scheduler { overwrite_existing }.before_update(data, node, &mut plan)?;
        Ok(plan.node_patch(node))
    }

    fn add(path: &str, value: &str) -> PatchOp {
        PatchOp::new("add", path, Some(json!(value)))
    }

    #[test]
    fn sets_strings_in_order() {
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(
            run(true, &mut data, &testdata::node()),
            Ok(vec![
                add("/properties/cpus", "4"),
                add("/properties/cpu_arch", "x86_64"),
                add("/properties/memory_mb", "8192")
            ])
        );
        assert_eq!((&data["cpus"], &data["cpu_arch"], &data["memory_mb"]), (&json!(4), &json!("x86_64"), &json!(8192)));
    }

    #[test]
    fn overwrite_existing_off_only_fills_missing_properties() {
        let mut node = testdata::node();
        node.properties.insert("cpus".into(), json!("2"));
        node.properties.insert("memory_mb".into(), json!(""));
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(
            run(false, &mut data, &node),
            Ok(vec![add("/properties/cpu_arch", "x86_64"), add("/properties/memory_mb", "8192")])
        );
    }

    #[test]
    fn malformed_values_are_skipped_not_fatal() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"]["count"] = json!("many");
        data["inventory"]["memory"] = json!({"total": 8_589_934_592u64});
        assert_eq!(run(true, &mut data, &testdata::node()), Ok(vec![]));
        assert!(data.get("cpus").is_none() && data.get("cpu_arch").is_none() && data.get("memory_mb").is_none());

        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"]["count"] = json!(0);
        data["inventory"]["memory"]["physical_mb"] = json!("4096");
        assert_eq!(
            run(true, &mut data, &testdata::node()),
            Ok(vec![add("/properties/cpu_arch", "x86_64"), add("/properties/memory_mb", "4096")]),
            "falsy values are not written"
        );
        assert_eq!(data["cpus"], json!(0));
    }
}
