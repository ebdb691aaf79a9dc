//! Ironic's `architecture`, `memory` and `cpus`: one property each, as Ironic stores them (`cpu_arch` a string,
//! `memory_mb` and `cpus` integers), written whatever the node has.
use serde_json::Value;

use super::Hook;
use crate::processing::data::{inventory, python_int};
use crate::processing::plan::{NodeView, Plan};

/// `architecture`: `cpu_arch` from `inventory.cpu.architecture`; missing fails the inspection.
#[derive(Debug)]
pub(crate) struct Architecture;

impl Hook for Architecture {
    fn before_update(&self, data: &mut Value, _node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let inventory = inventory(data)?;
        let cpu = inventory.get("cpu");
        let Some(arch) = cpu.and_then(|c| c.get("architecture")).and_then(Value::as_str) else {
            return Err(format!(
                "Inventory has malformed or missing CPU architecture information: {}",
                cpu.unwrap_or(&Value::Null)
            ));
        };
        plan.set_node("add", "/properties/cpu_arch", Some(Value::from(arch)));
        Ok(())
    }
}

/// `memory`: `memory_mb` from `inventory.memory.physical_mb` (an integer); missing fails the inspection.
#[derive(Debug)]
pub(crate) struct Memory;

impl Hook for Memory {
    fn before_update(&self, data: &mut Value, _node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let inventory = inventory(data)?;
        let memory = inventory.get("memory");
        let physical_mb = memory.and_then(|m| m.get("physical_mb"));
        let Some(mb) = physical_mb.filter(|v| v.is_number() || v.is_string()).and_then(python_int) else {
            return Err(format!("Inventory has missing memory information: {}", memory.unwrap_or(&Value::Null)));
        };
        plan.set_node("add", "/properties/memory_mb", Some(Value::from(mb)));
        Ok(())
    }
}

/// `cpus`: `cpus` from `inventory.cpu.count` (an integer); a count of 0 (or none) only warns, a malformed one
/// fails.
#[derive(Debug)]
pub(crate) struct Cpus;

impl Hook for Cpus {
    fn before_update(&self, data: &mut Value, _node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let inventory = inventory(data)?;
        let count = match inventory.get("cpu").and_then(|c| c.get("count")) {
            None => 0,
            Some(count) => python_int(count).ok_or_else(|| format!("invalid literal for int(): {count}"))?,
        };
        if count != 0 {
            plan.set_node("add", "/properties/cpus", Some(Value::from(count)));
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

    fn run(hook: &dyn Hook, data: &mut Value) -> Result<Vec<PatchOp>, String> {
        let mut plan = Plan::new();
        let mut node = testdata::node();
        node.properties.insert("cpus".into(), json!("64"));
        hook.before_update(data, &node, &mut plan)?;
        Ok(plan.node_patch(&node))
    }

    #[test]
    fn write_integers_whatever_the_node_has() {
        let data = testdata::two_nics_two_disks();
        let add = |path: &str, value: Value| Ok(vec![PatchOp::new("add", path, Some(value))]);
        assert_eq!(run(&Architecture, &mut data.clone()), add("/properties/cpu_arch", json!("x86_64")));
        assert_eq!(run(&Memory, &mut data.clone()), add("/properties/memory_mb", json!(8192)));
        assert_eq!(run(&Cpus, &mut data.clone()), add("/properties/cpus", json!(4)));
    }

    #[test]
    fn missing_architecture_or_memory_fails() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"].as_object_mut().expect("cpu").remove("architecture");
        data["inventory"]["memory"] = json!({"total": 8_589_934_592u64});
        let arch = run(&Architecture, &mut data.clone()).expect_err("architecture");
        assert!(arch.starts_with("Inventory has malformed or missing CPU architecture information"), "{arch}");
        let memory = run(&Memory, &mut data.clone()).expect_err("memory");
        assert!(memory.starts_with("Inventory has missing memory information"), "{memory}");
        data["inventory"]["memory"]["physical_mb"] = json!(null);
        assert!(run(&Memory, &mut data.clone()).is_err());
    }

    #[test]
    fn zero_cpus_only_warns_and_garbage_fails() {
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"]["count"] = json!(0);
        assert_eq!(run(&Cpus, &mut data.clone()), Ok(vec![]));
        data["inventory"]["cpu"] = json!({});
        assert_eq!(run(&Cpus, &mut data.clone()), Ok(vec![]));
        data["inventory"]["cpu"]["count"] = json!("lots");
        assert!(run(&Cpus, &mut data).is_err());
        assert!(run(&Cpus, &mut json!({})).is_err(), "no inventory");
    }
}
