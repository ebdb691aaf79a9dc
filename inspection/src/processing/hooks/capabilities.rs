//! `capabilities` (ironic-inspector), `boot-mode` and `cpu-capabilities` (Ironic): capabilities from the boot
//! mode and the CPU flags, merged into the node's `properties.capabilities`. `overwrite_existing` is ignored.
use serde_json::Value;

use super::Hook;
use crate::processing::config::ProcessingConfig;
use crate::processing::data::{checked_inventory, inventory, show};
use crate::processing::plan::{NodeView, Plan, parse_capabilities};

/// CPU flag capabilities, plus `boot_mode` when configured (ironic-inspector), or CPU flags only (Ironic's
/// `cpu-capabilities`).
#[derive(Debug)]
pub(crate) struct Capabilities {
    /// ironic-inspector's hook: checked inventory, `inventory.cpu` required, boot mode optional.
    inspector: bool,
    boot_mode: bool,
    cpu_flags: Vec<(String, String)>,
}

impl Capabilities {
    /// ironic-inspector's `capabilities`.
    pub(crate) fn inspector(cfg: &ProcessingConfig) -> Self {
        Self { inspector: true, boot_mode: cfg.capabilities.boot_mode, cpu_flags: flags(cfg) }
    }

    /// Ironic's `cpu-capabilities`.
    pub(crate) fn ironic_cpu(cfg: &ProcessingConfig) -> Self {
        Self { inspector: false, boot_mode: false, cpu_flags: flags(cfg) }
    }
}

fn flags(cfg: &ProcessingConfig) -> Vec<(String, String)> {
    cfg.capabilities.ordered_cpu_flags().into_iter().map(|(f, c)| (f.to_owned(), c.to_owned())).collect()
}

/// `inventory.boot.current_boot_mode`, if any.
fn boot_mode(data: &Value) -> Option<String> {
    data.pointer("/inventory/boot/current_boot_mode").filter(|m| !m.is_null()).map(show)
}

/// Merges `caps` into the plan, failing like ironic-inspector when the node's capabilities are malformed.
fn merge(node: &NodeView, plan: &mut Plan, caps: Vec<(String, String)>) -> Result<(), String> {
    if caps.is_empty() {
        return Ok(());
    }
    parse_capabilities(node.properties.get("capabilities").unwrap_or(&Value::Null))?;
    plan.merge_capabilities(caps.into_iter().map(|(k, v)| (k, Some(v))));
    Ok(())
}

impl Hook for Capabilities {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        let cpu = if self.inspector {
            checked_inventory(data)?;
            Some(inventory(data)?.get("cpu").ok_or_else(|| "the inventory has no cpu".to_owned())?)
        } else {
            inventory(data)?.get("cpu")
        };
        let present: Vec<&str> = cpu
            .and_then(|c| c.get("flags"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut caps: Vec<(String, String)> = Vec::new();
        if let Some(mode) = boot_mode(data).filter(|_| self.boot_mode) {
            caps.push(("boot_mode".to_owned(), mode));
        }
        for (flag, capability) in &self.cpu_flags {
            if present.contains(&flag.as_str()) && !caps.iter().any(|(k, _)| k == capability) {
                caps.push((capability.clone(), "true".to_owned()));
            }
        }
        merge(node, plan, caps)
    }
}

/// Ironic's `boot-mode`: capability `boot_mode` from `inventory.boot.current_boot_mode`, always.
#[derive(Debug)]
pub(crate) struct BootMode;

impl Hook for BootMode {
    fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), String> {
        inventory(data)?;
        let caps = boot_mode(data).map(|mode| ("boot_mode".to_owned(), mode)).into_iter().collect();
        merge(node, plan, caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::plan::PatchOp;
    use crate::processing::testdata;
    use serde_json::json;

    const ALL_CPU_CAPS: &str = "cpu_vt:true,cpu_aes:true,cpu_hugepages:true,cpu_hugepages_1g:true,cpu_txt:true";

    fn run(hook: &dyn Hook, data: &mut Value, node: &NodeView) -> Result<Vec<PatchOp>, String> {
        let mut plan = Plan::new();
        hook.before_update(data, node, &mut plan)?;
        Ok(plan.node_patch(node))
    }

    fn caps(value: &str) -> Result<Vec<PatchOp>, String> {
        Ok(vec![PatchOp::new("add", "/properties/capabilities", Some(json!(value)))])
    }

    #[test]
    fn cpu_flags_map_to_capabilities_in_inspectors_order() {
        let hook = Capabilities::inspector(&ProcessingConfig::default());
        assert_eq!(run(&hook, &mut testdata::two_nics_two_disks(), &testdata::node()), caps(ALL_CPU_CAPS));
    }

    #[test]
    fn boot_mode_option_adds_boot_mode_first() {
        let mut cfg = ProcessingConfig::default();
        cfg.capabilities.boot_mode = true;
        let hook = Capabilities::inspector(&cfg);
        assert_eq!(
            run(&hook, &mut testdata::two_nics_two_disks(), &testdata::node()),
            caps(&format!("boot_mode:uefi,{ALL_CPU_CAPS}"))
        );
    }

    #[test]
    fn merges_with_the_nodes_capabilities_whatever_overwrite_existing_says() {
        let cfg = ProcessingConfig { overwrite_existing: false, ..Default::default() };
        let mut node = testdata::node();
        node.properties.insert("capabilities".into(), json!("profile:compute,cpu_aes:false"));
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"]["flags"] = json!(["fpu", "svm", "aes"]);
        assert_eq!(
            run(&Capabilities::inspector(&cfg), &mut data, &node),
            caps("profile:compute,cpu_aes:true,cpu_vt:true")
        );
    }

    #[test]
    fn nothing_found_writes_nothing() {
        let hook = Capabilities::inspector(&ProcessingConfig::default());
        let mut data = testdata::two_nics_two_disks();
        data["inventory"]["cpu"]["flags"] = json!([]);
        assert_eq!(run(&hook, &mut data, &testdata::node()), Ok(vec![]));
        data["inventory"].as_object_mut().expect("inventory").remove("cpu");
        assert!(run(&hook, &mut data, &testdata::node()).is_err(), "ironic-inspector needs inventory.cpu");
    }

    #[test]
    fn malformed_node_capabilities_fail() {
        let mut node = testdata::node();
        node.properties.insert("capabilities".into(), json!("boot_mode:bios,boot_option"));
        let hook = Capabilities::inspector(&ProcessingConfig::default());
        assert!(run(&hook, &mut testdata::two_nics_two_disks(), &node).is_err());
    }

    #[test]
    fn ironic_boot_mode_and_cpu_capabilities() {
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(run(&BootMode, &mut data, &testdata::node()), caps("boot_mode:uefi"));
        let cpu = Capabilities::ironic_cpu(&ProcessingConfig::default());
        assert_eq!(run(&cpu, &mut data, &testdata::node()), caps(ALL_CPU_CAPS));
        data["inventory"].as_object_mut().expect("inventory").remove("cpu");
        data["inventory"].as_object_mut().expect("inventory").remove("boot");
        assert_eq!(run(&cpu, &mut data, &testdata::node()), Ok(vec![]));
        assert_eq!(run(&BootMode, &mut data, &testdata::node()), Ok(vec![]));
    }
}
