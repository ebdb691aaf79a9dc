//! The hooks: one small unit each, behind [`Hook`], named by [`HookKind`].
//!
//! ironic-inspector's hooks (and the Ironic names that behave the same) keep ironic-inspector's semantics; the
//! Ironic hooks the facts say differ (`architecture`, `memory`, `cpus`, `root-device`, `boot-mode`,
//! `cpu-capabilities`, `parse-lldp`, `local-link-connection`, `physical-network`) keep Ironic's.
use std::fmt::Debug;

use serde_json::Value;

use super::config::ProcessingConfig;
use super::plan::{NodeView, Plan};

mod accelerators;
mod capabilities;
mod extra_hardware;
mod ironic_properties;
mod lldp;
mod local_link_connection;
mod pci_devices;
mod physnet;
mod raid_device;
mod ramdisk_error;
mod root_disk;
mod scheduler;
mod validate_interfaces;

/// One processing hook. Errors are the message of a [`super::HookError`]; the pipeline adds the hook's name.
pub(crate) trait Hook: Debug + Send + Sync {
    /// Phase 1, on the raw ramdisk data before lookup.
    fn before_processing(&self, _data: &mut Value) -> Result<(), String> {
        Ok(())
    }

    /// Phase 2, with the node: enrich `data`, record Ironic writes in `plan`.
    fn before_update(&self, _data: &mut Value, _node: &NodeView, _plan: &mut Plan) -> Result<(), String> {
        Ok(())
    }
}

/// Every hook implementation; several configured names may share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookKind {
    RamdiskError,
    RootDiskSelection,
    Scheduler,
    ValidateInterfaces,
    Capabilities,
    PciDevices,
    ExtraHardware,
    RaidDevice,
    LldpBasic,
    LocalLinkConnection,
    PhysnetCidrMap,
    Accelerators,
    IronicArchitecture,
    IronicMemory,
    IronicCpus,
    IronicBootMode,
    IronicCpuCapabilities,
    IronicRootDevice,
    IronicParseLldp,
    IronicLocalLinkConnection,
    IronicPhysicalNetwork,
}

/// ironic-inspector's `[processing]default_processing_hooks`.
pub(crate) const DEFAULT_PROCESSING_HOOKS: &str =
    "ramdisk_error,root_disk_selection,scheduler,validate_interfaces,capabilities,pci_devices";

/// Every accepted name: ironic-inspector's first, then Ironic's.
const NAMES: &[(&str, HookKind)] = &[
    ("ramdisk_error", HookKind::RamdiskError),
    ("root_disk_selection", HookKind::RootDiskSelection),
    ("scheduler", HookKind::Scheduler),
    ("validate_interfaces", HookKind::ValidateInterfaces),
    ("capabilities", HookKind::Capabilities),
    ("pci_devices", HookKind::PciDevices),
    ("extra_hardware", HookKind::ExtraHardware),
    ("raid_device", HookKind::RaidDevice),
    ("lldp_basic", HookKind::LldpBasic),
    ("local_link_connection", HookKind::LocalLinkConnection),
    ("physnet_cidr_map", HookKind::PhysnetCidrMap),
    ("accelerators", HookKind::Accelerators),
    ("ramdisk-error", HookKind::RamdiskError),
    ("validate-interfaces", HookKind::ValidateInterfaces),
    ("ports", HookKind::ValidateInterfaces),
    ("architecture", HookKind::IronicArchitecture),
    ("memory", HookKind::IronicMemory),
    ("cpus", HookKind::IronicCpus),
    ("boot-mode", HookKind::IronicBootMode),
    ("cpu-capabilities", HookKind::IronicCpuCapabilities),
    ("root-device", HookKind::IronicRootDevice),
    ("parse-lldp", HookKind::IronicParseLldp),
    ("local-link-connection", HookKind::IronicLocalLinkConnection),
    ("physical-network", HookKind::IronicPhysicalNetwork),
    ("extra-hardware", HookKind::ExtraHardware),
    ("raid-device", HookKind::RaidDevice),
    ("pci-devices", HookKind::PciDevices),
];

impl HookKind {
    /// The name the hook reports as: ironic-inspector's for its hooks (and aliases of them), Ironic's for
    /// Ironic's own.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::RamdiskError => "ramdisk_error",
            Self::RootDiskSelection => "root_disk_selection",
            Self::Scheduler => "scheduler",
            Self::ValidateInterfaces => "validate_interfaces",
            Self::Capabilities => "capabilities",
            Self::PciDevices => "pci_devices",
            Self::ExtraHardware => "extra_hardware",
            Self::RaidDevice => "raid_device",
            Self::LldpBasic => "lldp_basic",
            Self::LocalLinkConnection => "local_link_connection",
            Self::PhysnetCidrMap => "physnet_cidr_map",
            Self::Accelerators => "accelerators",
            Self::IronicArchitecture => "architecture",
            Self::IronicMemory => "memory",
            Self::IronicCpus => "cpus",
            Self::IronicBootMode => "boot-mode",
            Self::IronicCpuCapabilities => "cpu-capabilities",
            Self::IronicRootDevice => "root-device",
            Self::IronicParseLldp => "parse-lldp",
            Self::IronicLocalLinkConnection => "local-link-connection",
            Self::IronicPhysicalNetwork => "physical-network",
        }
    }

    /// Every name `processing_hooks` accepts.
    pub(crate) fn valid_names() -> impl Iterator<Item = &'static str> {
        NAMES.iter().map(|(name, _)| *name)
    }

    /// Parses `processing_hooks`: comma-separated names, blanks ignored, `$default_processing_hooks` (or
    /// `${default_processing_hooks}`) expanded; a hook named twice (or by two names) keeps its first place.
    pub(crate) fn parse_list(hooks: &str) -> Result<Vec<HookKind>, String> {
        let expanded = hooks
            .replace("${default_processing_hooks}", DEFAULT_PROCESSING_HOOKS)
            .replace("$default_processing_hooks", DEFAULT_PROCESSING_HOOKS);
        let mut kinds: Vec<HookKind> = Vec::new();
        for name in expanded.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some((_, kind)) = NAMES.iter().find(|(known, _)| *known == name) else {
                let valid: Vec<&str> = Self::valid_names().collect();
                return Err(format!("unknown processing hook {name:?}; valid hooks are: {}", valid.join(", ")));
            };
            if !kinds.contains(kind) {
                kinds.push(*kind);
            }
        }
        Ok(kinds)
    }

    /// The hook, configured.
    pub(crate) fn build(self, cfg: &ProcessingConfig) -> Result<Box<dyn Hook>, String> {
        Ok(match self {
            Self::RamdiskError => Box::new(ramdisk_error::RamdiskError),
            Self::RootDiskSelection => Box::new(root_disk::RootDiskSelection::inspector(cfg)),
            Self::Scheduler => Box::new(scheduler::Scheduler { overwrite_existing: cfg.overwrite_existing }),
            Self::ValidateInterfaces => Box::new(validate_interfaces::ValidateInterfaces::new(cfg)),
            Self::Capabilities => Box::new(capabilities::Capabilities::inspector(cfg)),
            Self::PciDevices => Box::new(pci_devices::PciDevices::new(cfg)),
            Self::ExtraHardware => Box::new(extra_hardware::ExtraHardware { strict: cfg.extra_hardware_strict }),
            Self::RaidDevice => Box::new(raid_device::RaidDevice),
            Self::LldpBasic => Box::new(lldp::LldpBasic),
            Self::LocalLinkConnection => Box::new(local_link_connection::InspectorLocalLinkConnection {
                overwrite_existing: cfg.overwrite_existing,
            }),
            Self::PhysnetCidrMap => Box::new(physnet::Physnet::inspector(cfg)?),
            Self::Accelerators => Box::new(accelerators::Accelerators { known: cfg.accelerators.clone() }),
            Self::IronicArchitecture => Box::new(ironic_properties::Architecture),
            Self::IronicMemory => Box::new(ironic_properties::Memory),
            Self::IronicCpus => Box::new(ironic_properties::Cpus),
            Self::IronicBootMode => Box::new(capabilities::BootMode),
            Self::IronicCpuCapabilities => Box::new(capabilities::Capabilities::ironic_cpu(cfg)),
            Self::IronicRootDevice => Box::new(root_disk::RootDiskSelection::ironic(cfg)),
            Self::IronicParseLldp => Box::new(lldp::ParseLldp),
            Self::IronicLocalLinkConnection => Box::new(local_link_connection::IronicLocalLinkConnection),
            Self::IronicPhysicalNetwork => Box::new(physnet::Physnet::ironic(cfg)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Result<Vec<&'static str>, String> {
        HookKind::parse_list(list).map(|kinds| kinds.into_iter().map(HookKind::name).collect())
    }

    #[test]
    fn defaults_expand_in_place() {
        assert_eq!(
            names("$default_processing_hooks").expect("defaults"),
            ["ramdisk_error", "root_disk_selection", "scheduler", "validate_interfaces", "capabilities", "pci_devices"]
        );
        assert_eq!(
            names("extra_hardware, ${default_processing_hooks} ,lldp_basic,").expect("around defaults"),
            [
                "extra_hardware",
                "ramdisk_error",
                "root_disk_selection",
                "scheduler",
                "validate_interfaces",
                "capabilities",
                "pci_devices",
                "lldp_basic"
            ]
        );
        assert_eq!(names("").expect("empty"), Vec::<&str>::new());
    }

    #[test]
    fn ironic_names_alias_and_duplicates_run_once() {
        assert_eq!(
            names("ramdisk-error,validate-interfaces,ports,architecture").expect("ironic defaults"),
            ["ramdisk_error", "validate_interfaces", "architecture"]
        );
        assert_eq!(
            names("pci_devices,pci-devices,extra-hardware,raid-device,accelerators,scheduler,memory,cpus")
                .expect("mixed"),
            ["pci_devices", "extra_hardware", "raid_device", "accelerators", "scheduler", "memory", "cpus"]
        );
    }

    #[test]
    fn unknown_names_are_refused_with_the_valid_ones() {
        let err = names("ramdisk_error,example").expect_err("unknown");
        assert!(err.contains("\"example\""), "{err}");
        assert!(err.contains("root_disk_selection") && err.contains("physical-network"), "{err}");
        assert!(names("$other_hooks").is_err());
    }

    #[test]
    fn every_name_builds() {
        let cfg = ProcessingConfig::default();
        for (name, kind) in NAMES {
            assert!(kind.build(&cfg).is_ok(), "{name}");
        }
    }
}
