//! IPA-shaped fixtures (`tests/data/ipa-*.json`) and a bare node for the hooks' unit tests.
use serde_json::Value;

use super::plan::NodeView;

/// eth0's MAC: the PXE NIC of every fixture.
pub(crate) const ETH0: &str = "52:54:00:12:34:56";
/// eth1's MAC.
pub(crate) const ETH1: &str = "52:54:00:65:43:21";

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("fixture is JSON")
}

/// Two NICs (eth0 PXE with 192.0.2.10, eth1 with 198.51.100.20), two disks (20 GiB SSD, 931 GiB HDD),
/// 4 x86_64 CPUs with vmx/aes/pse/pdpe1gb/smx, 8192 MiB, UEFI, BMC 192.0.2.200.
pub(crate) fn two_nics_two_disks() -> Value {
    parse(include_str!("../../../tests/data/ipa-two-nics-two-disks.json"))
}

/// IPA reporting a collector failure in `error`.
pub(crate) fn ramdisk_error() -> Value {
    parse(include_str!("../../../tests/data/ipa-ramdisk-error.json"))
}

/// The two-NIC node with `ipa-collect-lldp=1`: eth0 on leaf-1 (MAC chassis id, Ethernet1/3, VLANs, MTU...),
/// eth1 on leaf-2 (local chassis id, MAC port id).
pub(crate) fn lldp() -> Value {
    parse(include_str!("../../../tests/data/ipa-lldp.json"))
}

/// A BIOS node with the `pci-devices` and `extra-hardware` collectors: two NVIDIA T4s, an Intel X710.
pub(crate) fn pci_and_extra_hardware() -> Value {
    parse(include_str!("../../../tests/data/ipa-pci-extra-hardware.json"))
}

/// A `manageable` node with no properties and no ports.
pub(crate) fn node() -> NodeView {
    NodeView {
        uuid: "1be26c0b-03f2-4d2e-ae87-c02d7f33c123".into(),
        provision_state: "manageable".into(),
        ..Default::default()
    }
}
