//! ironic-inspector's introspection processing hooks, as a pure pipeline: no I/O, no Ironic client, no store.
//!
//! The engine builds a [`Pipeline`] from the `[processing]` [`ProcessingConfig`], then for each ramdisk
//! submission:
//! 1. [`Pipeline::before_processing`] on the raw data (errors collected, every hook runs);
//! 2. node lookup with [`lookup_attributes`];
//! 3. [`Pipeline::before_update`] with the node as Ironic has it ([`NodeView`]); the hooks enrich the data and
//!    record Ironic writes in a [`Plan`] (the first error stops);
//! 4. applying the plan: ONE node JSON-PATCH ([`Plan::node_patch`]), then port creates, patches and deletes.
//!
//! Modules:
//! - [`config`]: the `[processing]` table and its validation.
//! - [`plan`]: [`Plan`], the node and port views, JSON-patch ops, the capabilities merge.
//! - `hooks`: one file per hook (or per ironic-inspector/Ironic pair of a hook), behind a small `Hook` trait;
//!   the name table maps ironic-inspector's and Ironic's names to them.
//! - `data`: reading the ramdisk data as ironic-inspector's `utils` does (inventory check, PXE MAC, BMC
//!   addresses, interface records); `net`: MACs, IPs, CIDRs.
//! - `device_hints`: root device hints (oslo `specs_matcher` operators); `lldp_tlv`: the LLDP TLV parser.
//!
//! The processed data keeps the keys ironic-inspector's hooks add (`all_interfaces`, `interfaces`, `macs`,
//! `ipmi_address`, `root_disk`, `local_gb`, `cpus`, `cpu_arch`, `memory_mb`, `extra`, ...), since introspection
//! rules and `GET /v1/introspection/{uuid}/data` read them. The hooks ignore `logs`; the engine drops it.
use serde_json::Value;

pub mod config;
pub mod plan;

mod data;
mod device_hints;
mod hooks;
mod lldp_tlv;
mod net;
#[cfg(test)]
mod testdata;

pub use config::{
    AddPorts, CapabilitiesConfig, KeepPorts, KnownAccelerator, PciAlias, PciDevicesConfig, ProcessingConfig,
};
pub use plan::{NewPort, NodeView, PatchOp, Plan, PlannedPort, PortTarget, PortView, node_view, parse_capabilities};

use hooks::{Hook, HookKind};

/// A processing failure: the hook that failed and why, e.g. hook `ramdisk_error`, message
/// `Ramdisk reported error: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("processing hook {hook} failed: {message}")]
pub struct HookError {
    /// The hook's name (ironic-inspector's for its hooks and their Ironic aliases, Ironic's for Ironic's own).
    pub hook: String,
    /// What went wrong, in ironic-inspector's words where it has them.
    pub message: String,
}

/// The configured hooks, in order.
#[derive(Debug)]
pub struct Pipeline {
    hooks: Vec<(HookKind, Box<dyn Hook>)>,
}

impl Pipeline {
    /// Validates the configuration and parses `processing_hooks`: comma-separated names;
    /// `$default_processing_hooks` expands to `ramdisk_error,root_disk_selection,scheduler,validate_interfaces,
    /// capabilities,pci_devices`; ironic-inspector's names and Ironic's (as aliases or with Ironic's behaviour)
    /// are accepted; a hook named twice runs once, at its first place. An unknown name is an error naming it and
    /// listing the valid names.
    pub fn new(cfg: &ProcessingConfig) -> Result<Self, String> {
        cfg.validate()?;
        let hooks = HookKind::parse_list(&cfg.processing_hooks)?
            .into_iter()
            .map(|kind| kind.build(cfg).map(|hook| (kind, hook)))
            .collect::<Result<_, _>>()?;
        Ok(Self { hooks })
    }

    /// The hooks' names, in order.
    pub fn hook_names(&self) -> Vec<&'static str> {
        self.hooks.iter().map(|(kind, _)| kind.name()).collect()
    }

    /// Every name `processing_hooks` accepts.
    pub fn valid_hook_names() -> Vec<&'static str> {
        HookKind::valid_names().collect()
    }

    /// Phase 1 (before lookup): every hook's `before_processing`, in order, on the raw ramdisk data. Errors are
    /// collected and every hook still runs, as in ironic-inspector; all errors are returned.
    pub fn before_processing(&self, data: &mut Value) -> Vec<HookError> {
        self.hooks
            .iter()
            .filter_map(|(kind, hook)| hook.before_processing(data).err().map(|message| error(*kind, message)))
            .collect()
    }

    /// Phase 2 (after lookup, with the node): every hook's `before_update`, in order; the first error stops and
    /// is returned.
    pub fn before_update(&self, data: &mut Value, node: &NodeView, plan: &mut Plan) -> Result<(), HookError> {
        for (kind, hook) in &self.hooks {
            hook.before_update(data, node, plan).map_err(|message| error(*kind, message))?;
        }
        Ok(())
    }
}

fn error(kind: HookKind, message: String) -> HookError {
    HookError { hook: kind.name().to_owned(), message }
}

/// The lookup attributes ironic-inspector computes: all interface MACs (lowercase; from `all_interfaces` when
/// `validate_interfaces` built it, else from the inventory with the same rules) and the BMC addresses
/// (`inventory.bmc_address`, falling back to the top-level `ipmi_address`, and `inventory.bmc_v6address`;
/// `''`, `0.0.0.0` and `::/0` discarded).
pub fn lookup_attributes(data: &Value) -> (Vec<String>, Vec<String>) {
    let (v4, v6) = data::bmc_addresses(data);
    (data::all_macs(data), v4.into_iter().chain(v6).collect())
}

/// The MAC of the interface the ramdisk booted from, as the data names it: the top-level `boot_interface` (which
/// ironic-python-agent takes from the kernel's `BOOTIF=`; the pxelinux form `01-aa-bb-...` too), else
/// `inventory.boot.pxe_interface`. Lowercase; not checked to be a MAC.
pub fn boot_mac(data: &Value) -> Option<String> {
    data::pxe_mac(data).or_else(|| {
        let pxe = data.get("inventory")?.get("boot")?.get("pxe_interface")?.as_str()?;
        (!pxe.is_empty()).then(|| pxe.to_ascii_lowercase())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use testdata::{ETH0, ETH1};

    fn run(cfg: &ProcessingConfig, data: &mut Value, node: &NodeView) -> Plan {
        let pipeline = Pipeline::new(cfg).expect("pipeline");
        assert_eq!(pipeline.before_processing(data), []);
        let mut plan = Plan::new();
        pipeline.before_update(data, node, &mut plan).expect("before_update");
        plan
    }

    fn add(path: &str, value: Value) -> PatchOp {
        PatchOp::new("add", path, Some(value))
    }

    #[test]
    fn the_boot_mac_is_boot_interface_else_the_inventorys_pxe_interface() {
        let both = json!({"boot_interface": "01-52-54-00-AB-CD-EF", "inventory": {"boot": {"pxe_interface": "52:54:00:00:00:01"}}});
        assert_eq!(boot_mac(&both).as_deref(), Some("52:54:00:ab:cd:ef"));
        let inventory_only =
            json!({"boot_interface": null, "inventory": {"boot": {"pxe_interface": "52:54:00:AB:00:01"}}});
        assert_eq!(boot_mac(&inventory_only).as_deref(), Some("52:54:00:ab:00:01"));
        assert_eq!(boot_mac(&json!({"inventory": {"boot": {"pxe_interface": ""}}})), None);
        assert_eq!(boot_mac(&json!({"inventory": {"boot": {"pxe_interface": 5}}})), None);
        assert_eq!(boot_mac(&json!({"inventory": "junk"})), None);
    }

    const CPU_CAPS: &str = "cpu_vt:true,cpu_aes:true,cpu_hugepages:true,cpu_hugepages_1g:true,cpu_txt:true";

    #[test]
    fn defaults_on_two_nics_and_two_disks() {
        let node = testdata::node();
        let mut data = testdata::two_nics_two_disks();
        let plan = run(&ProcessingConfig::default(), &mut data, &node);
        assert_eq!(
            plan.node_patch(&node),
            [
                add("/properties/local_gb", json!("19")),
                add("/properties/cpus", json!("4")),
                add("/properties/cpu_arch", json!("x86_64")),
                add("/properties/memory_mb", json!("8192")),
                add("/properties/capabilities", json!(CPU_CAPS)),
            ]
        );
        assert_eq!(plan.new_ports(), [NewPort { address: ETH0.into(), pxe_enabled: true, ..Default::default() }]);
        assert!(plan.port_patches().is_empty() && plan.port_deletes().is_empty());
        assert_eq!(plan.write_requests(&node), 2);

        // The processed data keeps ironic-inspector's keys.
        assert_eq!(data["local_gb"], json!(19));
        assert_eq!((&data["cpus"], &data["cpu_arch"], &data["memory_mb"]), (&json!(4), &json!("x86_64"), &json!(8192)));
        assert_eq!(data["root_disk"]["name"], json!("/dev/sda"));
        assert_eq!(data["ipmi_address"], json!("192.0.2.200"));
        assert_eq!(data["macs"], json!([ETH0]));
        assert_eq!(data["interfaces"]["eth0"]["pxe"], json!(true));
        assert_eq!(data["all_interfaces"]["eth1"]["mac"], json!(ETH1));
    }

    #[test]
    fn overwrite_existing_off_keeps_properties_but_merges_capabilities() {
        let mut node = testdata::node();
        node.properties.insert("cpus".into(), json!("8"));
        node.properties.insert("local_gb".into(), json!("100"));
        node.properties.insert("capabilities".into(), json!("boot_mode:bios"));
        let cfg = ProcessingConfig { overwrite_existing: false, ..Default::default() };
        let plan = run(&cfg, &mut testdata::two_nics_two_disks(), &node);
        assert_eq!(
            plan.node_patch(&node),
            [
                add("/properties/cpu_arch", json!("x86_64")),
                add("/properties/memory_mb", json!("8192")),
                add("/properties/capabilities", json!(format!("boot_mode:bios,{CPU_CAPS}"))),
            ]
        );
    }

    #[test]
    fn boot_mode_and_pci_aliases_merge_into_one_capabilities_op() {
        let mut cfg = ProcessingConfig::default();
        cfg.capabilities.boot_mode = true;
        cfg.pci_devices.alias =
            vec![PciAlias { vendor_id: "10de".into(), product_id: "1eb8".into(), name: "gpu_t4".into() }];
        let node = testdata::node();
        let plan = run(&cfg, &mut testdata::pci_and_extra_hardware(), &node);
        let patch = plan.node_patch(&node);
        assert_eq!(
            patch.last(),
            Some(&add("/properties/capabilities", json!(format!("boot_mode:bios,{CPU_CAPS},gpu_t4:2"))))
        );
        assert_eq!(patch.iter().filter(|op| op.path == "/properties/capabilities").count(), 1);
    }

    #[test]
    fn ironic_default_hooks() {
        let cfg = ProcessingConfig {
            processing_hooks: "ramdisk-error,validate-interfaces,ports,architecture".into(),
            ..Default::default()
        };
        let node = testdata::node();
        let pipeline = Pipeline::new(&cfg).expect("pipeline");
        assert_eq!(pipeline.hook_names(), ["ramdisk_error", "validate_interfaces", "architecture"]);
        let plan = run(&cfg, &mut testdata::two_nics_two_disks(), &node);
        assert_eq!(plan.node_patch(&node), [add("/properties/cpu_arch", json!("x86_64"))]);
        assert_eq!(plan.new_ports().len(), 1);
    }

    #[test]
    fn ironic_property_hooks_store_integers() {
        let cfg = ProcessingConfig { processing_hooks: "memory,cpus,root-device".into(), ..Default::default() };
        let node = testdata::node();
        let plan = run(&cfg, &mut testdata::two_nics_two_disks(), &node);
        assert_eq!(
            plan.node_patch(&node),
            [
                add("/properties/memory_mb", json!(8192)),
                add("/properties/cpus", json!(4)),
                add("/properties/local_gb", json!(19))
            ]
        );
    }

    #[test]
    fn every_optional_hook_together() {
        let cfg = ProcessingConfig {
            processing_hooks: "$default_processing_hooks,extra_hardware,raid_device,lldp_basic,local_link_connection,\
                               physnet_cidr_map,accelerators"
                .into(),
            physnet_cidr_map: vec!["192.0.2.0/24:provisioning".into()],
            ..Default::default()
        };
        let node = testdata::node();
        let mut data = testdata::lldp();
        let plan = run(&cfg, &mut data, &node);
        let port = &plan.new_ports()[0];
        assert_eq!(port.physical_network.as_deref(), Some("provisioning"));
        assert_eq!(port.local_link_connection.get("port_id"), Some(&json!("Ethernet1/3")));
        assert!(data["all_interfaces"]["eth0"]["lldp_processed"].is_object());
        assert!(
            plan.node_patch(&node)
                .contains(&add("/extra/block_devices", json!({"serials": ["S3YJNX0M100001", "WD-WCC4N0000002"]})))
        );
    }

    #[test]
    fn phase_one_collects_every_error() {
        let cfg = ProcessingConfig::default();
        let pipeline = Pipeline::new(&cfg).expect("pipeline");
        let mut data = testdata::ramdisk_error();
        data["inventory"]["interfaces"] = json!([]);
        let errors = pipeline.before_processing(&mut data);
        assert_eq!(
            errors.iter().map(|e| e.hook.as_str()).collect::<Vec<_>>(),
            ["ramdisk_error", "validate_interfaces"]
        );
        assert!(errors[0].message.starts_with("Ramdisk reported error: The following errors were encountered:"));
        assert_eq!(errors[1].message, "No network interfaces provided in the inventory");
        assert_eq!(
            errors[1].to_string(),
            "processing hook validate_interfaces failed: No network interfaces provided in the inventory"
        );
    }

    #[test]
    fn phase_two_stops_at_the_first_error() {
        let pipeline = Pipeline::new(&ProcessingConfig::default()).expect("pipeline");
        let mut data = testdata::two_nics_two_disks();
        assert_eq!(pipeline.before_processing(&mut data), []);
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"serial": "missing"}));
        let mut plan = Plan::new();
        let err = pipeline.before_update(&mut data, &node, &mut plan).expect_err("no disk");
        assert_eq!(
            err,
            HookError { hook: "root_disk_selection".into(), message: "No disks satisfied root device hints".into() }
        );
        assert!(plan.is_empty(), "nothing after the failing hook ran");
    }

    #[test]
    fn pipeline_refuses_bad_configuration() {
        let unknown = ProcessingConfig { processing_hooks: "ramdisk_error,nope".into(), ..Default::default() };
        let err = Pipeline::new(&unknown).expect_err("unknown hook");
        assert!(err.contains("\"nope\"") && err.contains("validate_interfaces"), "{err}");
        let conflict =
            ProcessingConfig { add_ports: AddPorts::Disabled, keep_ports: KeepPorts::Added, ..Default::default() };
        assert!(Pipeline::new(&conflict).is_err());
        assert!(Pipeline::valid_hook_names().contains(&"local-link-connection"));
    }

    #[test]
    fn lookup_attributes_work_before_and_after_validate_interfaces() {
        let mut data = testdata::two_nics_two_disks();
        let expected = (vec![ETH0.to_owned(), ETH1.to_owned()], vec!["192.0.2.200".to_owned()]);
        assert_eq!(lookup_attributes(&data), expected);
        assert_eq!(Pipeline::new(&ProcessingConfig::default()).expect("pipeline").before_processing(&mut data), []);
        assert_eq!(lookup_attributes(&data), expected);

        let data = json!({"ipmi_address": "192.0.2.9", "inventory": {"bmc_v6address": "2001:db8::9", "interfaces": [
            {"name": "eth0", "mac_address": "AA:BB:CC:DD:EE:FF"}]}});
        assert_eq!(
            lookup_attributes(&data),
            (vec!["aa:bb:cc:dd:ee:ff".to_owned()], vec!["192.0.2.9".to_owned(), "2001:db8::9".to_owned()])
        );
        assert_eq!(lookup_attributes(&json!(null)), (vec![], vec![]));
    }

    #[test]
    fn no_panic_on_hostile_input() {
        let mut cfg = ProcessingConfig {
            processing_hooks: Pipeline::valid_hook_names().join(","),
            physnet_cidr_map: vec!["0.0.0.0/0:any".into()],
            ..Default::default()
        };
        cfg.pci_devices.alias = vec![PciAlias { vendor_id: "1".into(), product_id: "2".into(), name: "x".into() }];
        let pipeline = Pipeline::new(&cfg).expect("pipeline");
        let mut node = testdata::node();
        node.properties.insert("root_device".into(), json!({"size": ">= 1", "name": "<in> sd"}));
        node.properties.insert("capabilities".into(), json!(7));
        node.extra.insert("block_devices".into(), json!("junk"));
        let inputs = [
            json!(null),
            json!([]),
            json!("x"),
            json!({"inventory": null}),
            json!({"inventory": {"interfaces": "x", "disks": "y", "cpu": 1, "memory": []}}),
            json!({"inventory": {"interfaces": [null, 1, {"name": 1}, {"name": "e", "mac_address": "aa:bb:cc:dd:ee:ff",
                "ipv4_address": 5, "lldp": [[1], [2, 3], "x"]}], "disks": [null, {"size": "x"}], "cpu": {"flags": "vmx"}},
                "root_disk": {"size": -5}, "boot_interface": "01-", "pci_devices": [1], "data": [[{}], 5],
                "lldp_raw": [], "all_interfaces": 3, "interfaces": {"e": 1}, "macs": "m"}),
        ];
        for input in inputs {
            let mut data = input.clone();
            let _ = pipeline.before_processing(&mut data);
            let mut plan = Plan::new();
            let _ = pipeline.before_update(&mut data, &node, &mut plan);
            let _ = plan.node_patch(&node);
            let _ = lookup_attributes(&input);
        }
        let mut data = testdata::lldp();
        let _ = pipeline.before_processing(&mut data);
        let _ = pipeline.before_update(&mut data, &node, &mut Plan::new());
    }
}
