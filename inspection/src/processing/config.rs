//! `[processing]` in the control-plane configuration: ironic-inspector's `[processing]`, `[capabilities]`,
//! `[pci_devices]`, `[extra_hardware]`, `[port_physnet]` and `[accelerators]` options in one table.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::hooks::HookKind;
use super::net::Cidr;

/// Which MACs become ports (`[processing]add_ports`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddPorts {
    /// Only the PXE-booting NIC; falls back to `active` when the ramdisk does not say which one it was.
    #[default]
    Pxe,
    /// Every NIC with a valid MAC.
    All,
    /// NICs that had an IP address in the ramdisk.
    Active,
    /// No ports are created.
    Disabled,
}

/// Which existing ports survive (`[processing]keep_ports`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepPorts {
    /// Delete nothing.
    #[default]
    All,
    /// Keep ports whose MAC the ramdisk reported.
    Present,
    /// Keep only ports of the valid interfaces (`macs`).
    Added,
}

/// `[capabilities]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilitiesConfig {
    /// Store the boot mode (`bios`/`uefi`) as capability `boot_mode` (inspector hook `capabilities`).
    pub boot_mode: bool,
    /// CPU flag → capability set to `true` when the flag is present.
    pub cpu_flags: BTreeMap<String, String>,
}

/// ironic-inspector's `DEFAULT_CPU_FLAGS_MAPPING`, in its order (the order capabilities are added in).
pub(crate) const DEFAULT_CPU_FLAGS: [(&str, &str); 6] = [
    ("vmx", "cpu_vt"),
    ("svm", "cpu_vt"),
    ("aes", "cpu_aes"),
    ("pse", "cpu_hugepages"),
    ("pdpe1gb", "cpu_hugepages_1g"),
    ("smx", "cpu_txt"),
];

impl Default for CapabilitiesConfig {
    fn default() -> Self {
        Self {
            boot_mode: false,
            cpu_flags: DEFAULT_CPU_FLAGS.iter().map(|(f, c)| ((*f).to_owned(), (*c).to_owned())).collect(),
        }
    }
}

impl CapabilitiesConfig {
    /// The flag mapping in the order capabilities are added: ironic-inspector's default flags first in its own
    /// order, then any other configured flag by name (a `BTreeMap` keeps no configured order).
    pub fn ordered_cpu_flags(&self) -> Vec<(&str, &str)> {
        let defaults = DEFAULT_CPU_FLAGS.iter().filter_map(|(flag, _)| self.cpu_flags.get_key_value(*flag));
        let others = self.cpu_flags.iter().filter(|(flag, _)| !DEFAULT_CPU_FLAGS.iter().any(|(f, _)| f == flag));
        defaults.chain(others).map(|(f, c)| (f.as_str(), c.as_str())).collect()
    }
}

/// One `[pci_devices]alias` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciAlias {
    /// PCI vendor id as IPA reports it, e.g. `10de`.
    pub vendor_id: String,
    /// PCI product id, e.g. `1eb8`.
    pub product_id: String,
    /// Capability name counted, e.g. `gpu_t4`.
    pub name: String,
}

/// `[pci_devices]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PciDevicesConfig {
    /// Devices counted into capabilities.
    pub alias: Vec<PciAlias>,
}

/// One known accelerator (`[accelerators]known_devices`, the YAML's `pci_devices` entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownAccelerator {
    /// PCI vendor id, e.g. `10de`.
    pub vendor_id: String,
    /// PCI device id, matched against IPA's `product_id`, e.g. `1eb8`.
    pub device_id: String,
    /// Accelerator type, e.g. `GPU`.
    #[serde(rename = "type", default)]
    pub device_type: String,
    /// Description, e.g. `NVIDIA Corporation Tesla T4`.
    #[serde(default)]
    pub device_info: String,
}

/// `[processing]` in the control-plane configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessingConfig {
    /// Comma-separated hook names; `$default_processing_hooks` expands to the six default hooks.
    pub processing_hooks: String,
    /// Which MACs become ports.
    pub add_ports: AddPorts,
    /// Which existing ports survive.
    pub keep_ports: KeepPorts,
    /// Overwrite node properties that are already set.
    pub overwrite_existing: bool,
    /// Keep `pxe_enabled` of ports in line with the PXE-booting NIC.
    pub update_pxe_enabled: bool,
    /// Leave 1 GiB of the root disk for partitioning (`local_gb` is one less).
    pub disk_partitioning_spacing: bool,
    /// Power the node off after processing (used by the engine, not by hooks).
    pub power_off: bool,
    /// `[capabilities]`.
    pub capabilities: CapabilitiesConfig,
    /// `[pci_devices]`.
    pub pci_devices: PciDevicesConfig,
    /// `[extra_hardware]strict`.
    pub extra_hardware_strict: bool,
    /// `[port_physnet]cidr_map`: `cidr:physnet` entries.
    pub physnet_cidr_map: Vec<String>,
    /// `[accelerators]known_devices`.
    pub accelerators: Vec<KnownAccelerator>,
}

impl Default for ProcessingConfig {
    fn default() -> Self {
        Self {
            processing_hooks: "$default_processing_hooks".to_owned(),
            add_ports: AddPorts::Pxe,
            keep_ports: KeepPorts::All,
            overwrite_existing: true,
            update_pxe_enabled: true,
            disk_partitioning_spacing: true,
            power_off: true,
            capabilities: CapabilitiesConfig::default(),
            pci_devices: PciDevicesConfig::default(),
            extra_hardware_strict: false,
            physnet_cidr_map: Vec::new(),
            accelerators: Vec::new(),
        }
    }
}

impl ProcessingConfig {
    /// Validates: `add_ports=disabled` with `keep_ports=added`, hook names, `cidr:physnet` entries, PCI aliases,
    /// known accelerators and CPU flag capability names.
    pub fn validate(&self) -> Result<(), String> {
        if self.add_ports == AddPorts::Disabled && self.keep_ports == KeepPorts::Added {
            return Err("Configuration error: add_ports set to disabled and keep_ports set to added. \
                        Please change keep_ports to all."
                .to_owned());
        }
        HookKind::parse_list(&self.processing_hooks)?;
        self.cidr_map()?;
        for alias in &self.pci_devices.alias {
            if alias.vendor_id.is_empty() || alias.product_id.is_empty() || !is_capability_name(&alias.name) {
                return Err(format!(
                    "[processing] pci_devices alias {alias:?} needs a vendor_id, a product_id and a name \
                     without ',' or ':'"
                ));
            }
        }
        for device in &self.accelerators {
            if device.vendor_id.is_empty() || device.device_id.is_empty() {
                return Err(format!("[processing] accelerator {device:?} is missing vendor_id or device_id"));
            }
        }
        for (flag, capability) in &self.capabilities.cpu_flags {
            if !is_capability_name(capability) {
                return Err(format!("[processing] cpu_flags: capability {capability:?} of flag {flag:?} is invalid"));
            }
        }
        Ok(())
    }

    /// `physnet_cidr_map` parsed, in order (split at the last `:` like ironic-inspector).
    pub(crate) fn cidr_map(&self) -> Result<Vec<(Cidr, String)>, String> {
        self.physnet_cidr_map
            .iter()
            .map(|entry| {
                let (cidr, physnet) = entry
                    .rsplit_once(':')
                    .ok_or_else(|| format!("[processing] physnet_cidr_map entry {entry:?} is not cidr:physnet"))?;
                if physnet.is_empty() {
                    return Err(format!("[processing] physnet_cidr_map entry {entry:?} has no physical network"));
                }
                let cidr = Cidr::parse(cidr).map_err(|e| format!("[processing] physnet_cidr_map: {e}"))?;
                Ok((cidr, physnet.to_owned()))
            })
            .collect()
    }
}

fn is_capability_name(name: &str) -> bool {
    !name.is_empty() && !name.contains([',', ':'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ironic_inspectors() {
        let cfg = ProcessingConfig::default();
        assert_eq!(cfg.processing_hooks, "$default_processing_hooks");
        assert_eq!((cfg.add_ports, cfg.keep_ports), (AddPorts::Pxe, KeepPorts::All));
        assert!(cfg.overwrite_existing && cfg.update_pxe_enabled && cfg.disk_partitioning_spacing && cfg.power_off);
        assert!(!cfg.capabilities.boot_mode && !cfg.extra_hardware_strict);
        assert_eq!(cfg.capabilities.cpu_flags.len(), 6);
        assert_eq!(cfg.capabilities.cpu_flags.get("svm").map(String::as_str), Some("cpu_vt"));
        assert!(cfg.pci_devices.alias.is_empty() && cfg.physnet_cidr_map.is_empty() && cfg.accelerators.is_empty());
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn cpu_flags_keep_inspectors_order_first() {
        let mut cfg = CapabilitiesConfig::default();
        cfg.cpu_flags.insert("avx2".into(), "cpu_avx2".into());
        let flags: Vec<&str> = cfg.ordered_cpu_flags().into_iter().map(|(f, _)| f).collect();
        assert_eq!(flags, ["vmx", "svm", "aes", "pse", "pdpe1gb", "smx", "avx2"]);
    }

    #[test]
    fn parses_from_toml_with_lowercase_choices() {
        let cfg: ProcessingConfig = toml::from_str(
            r#"
            processing_hooks = "$default_processing_hooks,lldp_basic"
            add_ports = "all"
            keep_ports = "present"
            overwrite_existing = false
            physnet_cidr_map = ["10.10.10.0/24:physnet_a", "2001:db8::/64:physnet_b"]
            [capabilities]
            boot_mode = true
            [[pci_devices.alias]]
            vendor_id = "10de"
            product_id = "1eb8"
            name = "gpu_t4"
            [[accelerators]]
            vendor_id = "10de"
            device_id = "1eb8"
            type = "GPU"
            device_info = "NVIDIA Corporation Tesla T4"
            "#,
        )
        .expect("config");
        assert_eq!((cfg.add_ports, cfg.keep_ports), (AddPorts::All, KeepPorts::Present));
        assert!(!cfg.overwrite_existing && cfg.capabilities.boot_mode);
        assert_eq!(cfg.capabilities.cpu_flags.len(), 6, "an unset cpu_flags keeps the default mapping");
        assert_eq!(cfg.accelerators[0].device_type, "GPU");
        assert_eq!(cfg.cidr_map().expect("map").len(), 2);
        assert_eq!(cfg.validate(), Ok(()));
        assert!(toml::from_str::<ProcessingConfig>("add_ports = \"some\"").is_err());
        assert!(toml::from_str::<ProcessingConfig>("store_data = \"none\"").is_err());
    }

    #[test]
    fn validate_refuses_bad_settings() {
        let bad = |f: fn(&mut ProcessingConfig)| {
            let mut cfg = ProcessingConfig::default();
            f(&mut cfg);
            cfg.validate()
        };
        let err = bad(|c| {
            c.add_ports = AddPorts::Disabled;
            c.keep_ports = KeepPorts::Added;
        })
        .expect_err("disabled+added");
        assert!(err.contains("add_ports set to disabled and keep_ports set to added"), "{err}");
        assert!(bad(|c| c.processing_hooks = "ramdisk_error,frobnicate".into()).is_err());
        assert!(bad(|c| c.physnet_cidr_map = vec!["10.0.0.1/24:physnet".into()]).is_err());
        assert!(bad(|c| c.physnet_cidr_map = vec!["10.0.0.0/24".into()]).is_err());
        assert!(bad(|c| c.physnet_cidr_map = vec!["10.0.0.0/24:".into()]).is_err());
        assert!(
            bad(|c| c.pci_devices.alias =
                vec![PciAlias { vendor_id: "10de".into(), product_id: "1eb8".into(), name: "a:b".into() }])
            .is_err()
        );
        assert!(
            bad(|c| c.accelerators = vec![KnownAccelerator {
                vendor_id: String::new(),
                device_id: "1eb8".into(),
                device_type: "GPU".into(),
                device_info: String::new()
            }])
            .is_err()
        );
        assert_eq!(
            bad(|c| {
                c.add_ports = AddPorts::Disabled;
                c.keep_ports = KeepPorts::Present;
            }),
            Ok(())
        );
    }
}
