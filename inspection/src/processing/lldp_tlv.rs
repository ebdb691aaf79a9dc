//! LLDP TLVs as IPA sends them (`[[type, "hex"], ...]`) and as ironic-inspector's `lldp_parsers` and
//! `lldp_tlvs` read them: the 802.1AB basic management set plus the 802.1Q and 802.3 organisational TLVs, into
//! name/value pairs such as `switch_chassis_id`, `switch_port_id`, `switch_system_name`, `switch_port_vlans`.
//!
//! A TLV that is not valid hex, too short, not UTF-8 where text is expected, or of an unknown subtype is skipped,
//! as ironic-inspector does after logging it.
use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value, json};

pub(crate) const TLV_CHASSIS_ID: u64 = 1;
pub(crate) const TLV_PORT_ID: u64 = 2;
const TLV_PORT_DESCRIPTION: u64 = 4;
pub(crate) const TLV_SYS_NAME: u64 = 5;
const TLV_SYS_DESCRIPTION: u64 = 6;
const TLV_SYS_CAPABILITIES: u64 = 7;
const TLV_MGMT_ADDRESS: u64 = 8;
const TLV_ORG_SPECIFIC: u64 = 127;

const OUI_802_1: [u8; 3] = [0x00, 0x80, 0xc2];
const OUI_802_3: [u8; 3] = [0x00, 0x12, 0x0f];

/// Chassis ID subtype "MAC address", the only one `local_link_connection` takes as `switch_id`.
pub(crate) const CHASSIS_SUBTYPE_MAC: u8 = 4;

/// One TLV: its type and its value bytes (`None` when the value was not valid hex).
pub(crate) type RawTlv = (u64, Option<Vec<u8>>);

/// The TLVs of one interface; entries that are not `[integer, string]` are skipped.
pub(crate) fn raw_tlvs(tlvs: &Value) -> Vec<RawTlv> {
    let Some(entries) = tlvs.as_array() else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| match entry.as_array().map(Vec::as_slice) {
            Some([kind, Value::String(hex)]) => Some((kind.as_u64()?, decode_hex(hex))),
            _ => None,
        })
        .collect()
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    let hex = hex.as_bytes();
    if hex.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16);
    hex.chunks(2).map(|pair| u8::try_from(nibble(pair[0])? * 16 + nibble(pair[1])?).ok()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(bytes: &[u8]) -> Option<String> {
    let octets = bytes.get(..6)?;
    Some(octets.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"))
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// An IANA address (family byte, then the address). `Ok(None)` for a family other than IPv4, IPv6 or MAC.
fn iana_address(bytes: &[u8]) -> Result<Option<String>, ()> {
    let (&family, rest) = bytes.split_first().ok_or(())?;
    Ok(match family {
        1 => Some(Ipv4Addr::from(<[u8; 4]>::try_from(rest.get(..4).ok_or(())?).map_err(|_| ())?).to_string()),
        2 => Some(Ipv6Addr::from(<[u8; 16]>::try_from(rest.get(..16).ok_or(())?).map_err(|_| ())?).to_string()),
        6 => Some(mac(rest).ok_or(())?),
        _ => None,
    })
}

fn text(bytes: &[u8]) -> Result<String, ()> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ())
}

/// Chassis ID TLV: `(subtype, value)`, the value `None` for a network address of an unknown family;
/// `Ok(None)` for an unknown subtype.
pub(crate) fn chassis_id(data: &[u8]) -> Result<Option<(u8, Option<String>)>, ()> {
    let (&subtype, rest) = data.split_first().ok_or(())?;
    Ok(match subtype {
        1 | 2 | 3 | 6 | 7 => Some((subtype, Some(text(rest)?))),
        CHASSIS_SUBTYPE_MAC => Some((subtype, Some(mac(rest).ok_or(())?))),
        5 => Some((subtype, iana_address(rest)?)),
        _ => None,
    })
}

/// Port ID TLV value, `Some(None)` for a network address of an unknown family; `Ok(None)` for an unknown
/// subtype.
pub(crate) fn port_id(data: &[u8]) -> Result<Option<Option<String>>, ()> {
    let (&subtype, rest) = data.split_first().ok_or(())?;
    Ok(match subtype {
        1 | 2 | 5 | 7 => Some(Some(text(rest)?)),
        3 => Some(Some(mac(rest).ok_or(())?)),
        4 => Some(iana_address(rest)?),
        _ => None,
    })
}

/// System Name TLV value.
pub(crate) fn sys_name(data: &[u8]) -> Result<String, ()> {
    text(data)
}

/// Name/value pairs; the first value of a name stays, list values accumulate.
#[derive(Debug, Default)]
struct Pairs(Map<String, Value>);

impl Pairs {
    fn set(&mut self, name: &str, value: Value) {
        self.0.entry(name.to_owned()).or_insert(value);
    }

    fn append(&mut self, name: &str, value: Value) {
        let entry = self.0.entry(name.to_owned()).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = entry {
            items.push(value);
        }
    }
}

/// `LLDPBasicMgmtParser`: every TLV of one interface into name/value pairs.
pub(crate) fn parse_basic(tlvs: &[RawTlv]) -> Map<String, Value> {
    let mut pairs = Pairs::default();
    for (kind, data) in tlvs {
        let Some(data) = data else { continue };
        match *kind {
            // An address of an unknown family is stored as null, as ironic-inspector does.
            TLV_CHASSIS_ID => {
                if let Ok(Some((_, id))) = chassis_id(data) {
                    pairs.set("switch_chassis_id", id.map_or(Value::Null, Value::String));
                }
            }
            TLV_PORT_ID => {
                if let Ok(Some(id)) = port_id(data) {
                    pairs.set("switch_port_id", id.map_or(Value::Null, Value::String));
                }
            }
            TLV_PORT_DESCRIPTION | TLV_SYS_NAME | TLV_SYS_DESCRIPTION => {
                let name = match *kind {
                    TLV_PORT_DESCRIPTION => "switch_port_description",
                    TLV_SYS_NAME => "switch_system_name",
                    _ => "switch_system_description",
                };
                if let Ok(value) = text(data) {
                    pairs.set(name, Value::String(value));
                }
            }
            TLV_SYS_CAPABILITIES => {
                if let (4, Some(system), Some(enabled)) = (data.len(), u16_at(data, 0), u16_at(data, 2)) {
                    pairs.set("switch_capabilities_support", capability_names(system));
                    pairs.set("switch_capabilities_enabled", capability_names(enabled));
                }
            }
            TLV_MGMT_ADDRESS => {
                // length byte, then an IANA address
                if let Some(Ok(Some(address))) = data.get(1..).map(iana_address) {
                    pairs.append("switch_mgmt_addresses", Value::String(address));
                }
            }
            TLV_ORG_SPECIFIC if data.len() >= 4 => {
                // ironic-inspector's (and Ironic's) 802.1/802.3 parsers share the pairs only once there is one
                // (`nv or {}`): an organisational TLV before any other value is parsed and lost. Real LLDPDUs
                // start with the Chassis ID, so this only shows with odd data; kept for identical results.
                let mut lost = Pairs::default();
                let target = if pairs.0.is_empty() { &mut lost } else { &mut pairs };
                let (oui, subtype, payload) = (&data[..3], data[3], &data[4..]);
                if oui == OUI_802_1 {
                    parse_dot1(target, subtype, payload);
                } else if oui == OUI_802_3 {
                    parse_dot3(target, subtype, payload);
                }
            }
            _ => {}
        }
    }
    pairs.0
}

/// System capabilities bits (`Capabilities` BitStruct) as ironic-inspector names them, in its order.
fn capability_names(bits: u16) -> Value {
    const NAMES: [(u16, &str); 10] = [
        (0x0002, "Repeater"),
        (0x0004, "Bridge"),
        (0x0008, "WLAN"),
        (0x0010, "Router"),
        (0x0020, "Telephone"),
        (0x0040, "DOCSIS cable device"),
        (0x0080, "Station only"),
        (0x0100, "C-Vlan"),
        (0x0200, "S-Vlan"),
        (0x0400, "TPMR"),
    ];
    NAMES.iter().filter(|(bit, _)| bits & bit != 0).map(|(_, name)| Value::from(*name)).collect()
}

/// Link aggregation (802.1 subtype 7, 802.3 subtype 3): exactly status byte + port id.
fn link_aggregation(pairs: &mut Pairs, data: &[u8]) {
    if let (5, Some(port)) = (data.len(), u32_at(data, 1)) {
        pairs.set("switch_port_link_aggregation_enabled", Value::Bool(data[0] & 0x02 != 0));
        pairs.set("switch_port_link_aggregation_support", Value::Bool(data[0] & 0x01 != 0));
        pairs.set("switch_port_link_aggregation_id", Value::from(port));
    }
}

fn parse_dot1(pairs: &mut Pairs, subtype: u8, data: &[u8]) {
    match subtype {
        1 => {
            if let Some(vlan) = u16_at(data, 0) {
                pairs.set("switch_port_untagged_vlan_id", Value::from(vlan));
            }
        }
        2 => {
            if let (3, Some(vlan)) = (data.len(), u16_at(data, 1)) {
                pairs.set("switch_port_protocol_vlan_enabled", Value::Bool(data[0] & 0x04 != 0));
                pairs.set("switch_port_protocol_vlan_support", Value::Bool(data[0] & 0x02 != 0));
                pairs.append("switch_port_protocol_vlan_ids", Value::from(vlan));
            }
        }
        3 => {
            let Some(vlan) = u16_at(data, 0) else { return };
            let Some(&len) = data.get(2) else { return };
            let Some(name) = data.get(3..3 + usize::from(len)) else { return };
            let end = name.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
            if let Ok(name) = text(&name[..end]) {
                pairs.append("switch_port_vlans", json!({"name": name, "id": vlan}));
            }
        }
        4 => {
            let Some(&len) = data.first() else { return };
            if let Some(protocol) = data.get(1..1 + usize::from(len)) {
                pairs.append("switch_protocol_identities", Value::String(hex(protocol)));
            }
        }
        6 => {
            if let Some(vlan) = u16_at(data, 0) {
                pairs.set("switch_port_management_vlan_id", Value::from(vlan));
            }
        }
        7 => link_aggregation(pairs, data),
        _ => {}
    }
}

fn parse_dot3(pairs: &mut Pairs, subtype: u8, data: &[u8]) {
    match subtype {
        1 => {
            let (5, Some(pmd), Some(mau)) = (data.len(), u16_at(data, 1), u16_at(data, 3)) else { return };
            let Some(mau_type) = OPER_MAU_TYPES.get(usize::from(mau)) else { return };
            pairs.set("switch_port_autonegotiation_enabled", Value::Bool(data[0] & 0x02 != 0));
            pairs.set("switch_port_autonegotiation_support", Value::Bool(data[0] & 0x01 != 0));
            pairs.set("switch_port_physical_capabilities", autoneg_capabilities(pmd));
            pairs.set("switch_port_mau_type", Value::from(*mau_type));
        }
        3 => link_aggregation(pairs, data),
        4 => {
            if let Some(mtu) = u16_at(data, 0) {
                pairs.set("switch_port_mtu", Value::from(mtu));
            }
        }
        _ => {}
    }
}

/// `get_autoneg_cap`: the PMD auto-negotiation capability names, sorted. As in ironic-inspector, "10BASE-T fdx"
/// follows the half-duplex bit.
fn autoneg_capabilities(pmd: u16) -> Value {
    const BITS: [(u16, &str); 15] = [
        (0x4000, "10BASE-T hdx"),
        (0x4000, "10BASE-T fdx"),
        (0x1000, "10BASE-T4"),
        (0x0800, "100BASE-TX hdx"),
        (0x0400, "100BASE-TX fdx"),
        (0x0200, "100BASE-T2 hdx"),
        (0x0100, "100BASE-T2 fdx"),
        (0x0080, "PAUSE fdx"),
        (0x0040, "Asym PAUSE fdx"),
        (0x0020, "Sym PAUSE fdx"),
        (0x0010, "Asym and Sym PAUSE fdx"),
        (0x0008, "1000BASE-X hdx"),
        (0x0004, "1000BASE-X fdx"),
        (0x0002, "1000BASE-T hdx"),
        (0x0001, "1000BASE-T fdx"),
    ];
    let mut names: Vec<&str> = BITS.iter().filter(|(bit, _)| pmd & bit != 0).map(|(_, name)| *name).collect();
    names.sort_unstable();
    names.dedup();
    names.into_iter().map(Value::from).collect()
}

/// RFC 4836 `ifMauTypeList`, as ironic-inspector's `OPER_MAU_TYPES`.
const OPER_MAU_TYPES: [&str; 54] = [
    "Unknown",
    "AUI",
    "10BASE-5",
    "FOIRL",
    "10BASE-2",
    "10BASE-T duplex mode unknown",
    "10BASE-FP",
    "10BASE-FB",
    "10BASE-FL duplex mode unknown",
    "10BROAD36",
    "10BASE-T half duplex",
    "10BASE-T full duplex",
    "10BASE-FL half duplex",
    "10BASE-FL full duplex",
    "100 BASE-T4",
    "100BASE-TX half duplex",
    "100BASE-TX full duplex",
    "100BASE-FX half duplex",
    "100BASE-FX full duplex",
    "100BASE-T2 half duplex",
    "100BASE-T2 full duplex",
    "1000BASE-X half duplex",
    "1000BASE-X full duplex",
    "1000BASE-LX half duplex",
    "1000BASE-LX full duplex",
    "1000BASE-SX half duplex",
    "1000BASE-SX full duplex",
    "1000BASE-CX half duplex",
    "1000BASE-CX full duplex",
    "1000BASE-T half duplex",
    "1000BASE-T full duplex",
    "10GBASE-X",
    "10GBASE-LX4",
    "10GBASE-R",
    "10GBASE-ER",
    "10GBASE-LR",
    "10GBASE-SR",
    "10GBASE-W",
    "10GBASE-EW",
    "10GBASE-LW",
    "10GBASE-SW",
    "10GBASE-CX4",
    "2BASE-TL",
    "10PASS-TS",
    "100BASE-BX10D",
    "100BASE-BX10U",
    "100BASE-LX10",
    "1000BASE-BX10D",
    "1000BASE-BX10U",
    "1000BASE-LX10",
    "1000BASE-PX10D",
    "1000BASE-PX10U",
    "1000BASE-PX20D",
    "1000BASE-PX20U",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::testdata;

    #[test]
    fn parses_the_fixtures_switch() {
        let data = testdata::lldp();
        let pairs = parse_basic(&raw_tlvs(&data["inventory"]["interfaces"][0]["lldp"]));
        assert_eq!(
            Value::Object(pairs),
            json!({
                "switch_chassis_id": "00:1c:73:aa:bb:cc",
                "switch_port_id": "Ethernet1/3",
                "switch_port_description": "leaf-1 Ethernet1/3 to node-1 eth0",
                "switch_system_name": "leaf-1.example.com",
                "switch_system_description": "Arista Networks EOS version 4.28.3M",
                "switch_capabilities_support": ["Bridge", "Router"],
                "switch_capabilities_enabled": ["Bridge", "Router"],
                "switch_mgmt_addresses": ["192.0.2.1"],
                "switch_port_untagged_vlan_id": 100,
                "switch_port_vlans": [{"name": "provisioning", "id": 100}, {"name": "tenant", "id": 200}],
                "switch_port_link_aggregation_enabled": false,
                "switch_port_link_aggregation_support": true,
                "switch_port_link_aggregation_id": 0,
                "switch_port_autonegotiation_enabled": true,
                "switch_port_autonegotiation_support": true,
                "switch_port_physical_capabilities": ["1000BASE-T fdx", "100BASE-TX fdx", "100BASE-TX hdx", "10BASE-T fdx", "10BASE-T hdx"],
                "switch_port_mau_type": "1000BASE-T full duplex",
                "switch_port_mtu": 9216,
            })
        );
    }

    #[test]
    fn ids_by_subtype() {
        assert_eq!(chassis_id(&[4, 0, 0x1c, 0x73, 0xaa, 0xbb, 0xcc]), Ok(Some((4, Some("00:1c:73:aa:bb:cc".into())))));
        assert_eq!(chassis_id(&[7, b'l', b'e', b'a', b'f']), Ok(Some((7, Some("leaf".into())))));
        assert_eq!(chassis_id(&[5, 1, 192, 0, 2, 1]), Ok(Some((5, Some("192.0.2.1".into())))));
        assert_eq!(chassis_id(&[5, 9, 1]), Ok(Some((5, None))));
        assert_eq!(chassis_id(&[8, 1]), Ok(None));
        assert_eq!(chassis_id(&[4, 0, 1]), Err(()));
        assert_eq!(chassis_id(&[]), Err(()));
        assert_eq!(port_id(&[3, 0x52, 0x54, 0, 0x12, 0x34, 0x56]), Ok(Some(Some("52:54:00:12:34:56".into()))));
        assert_eq!(port_id(&[6, 1, 2]), Ok(None));
        assert_eq!(port_id(&[5, 0xff]), Err(()));
    }

    #[test]
    fn malformed_tlvs_are_skipped() {
        let tlvs =
            raw_tlvs(&json!([[1, "zz"], [2, "050"], "junk", [5, "6869"], [7, "0014"], [127, "0080c2"], ["1", "00"]]));
        assert_eq!(tlvs.len(), 5);
        assert_eq!(Value::Object(parse_basic(&tlvs)), json!({"switch_system_name": "hi"}));
        assert!(raw_tlvs(&json!(null)).is_empty());
    }

    #[test]
    fn organisational_tlvs_before_any_value_are_lost_as_in_ironic_inspector() {
        let mtu = json!([127, "00120f042400"]);
        assert_eq!(Value::Object(parse_basic(&raw_tlvs(&json!([mtu, [5, "61"]])))), json!({"switch_system_name": "a"}));
        assert_eq!(
            Value::Object(parse_basic(&raw_tlvs(&json!([[5, "61"], mtu])))),
            json!({"switch_system_name": "a", "switch_port_mtu": 9216})
        );
        assert_eq!(Value::Object(parse_basic(&raw_tlvs(&json!([[1, "05"]])))), json!({}));
        assert_eq!(Value::Object(parse_basic(&raw_tlvs(&json!([[1, "0509"]])))), json!({"switch_chassis_id": null}));
    }

    #[test]
    fn first_value_wins_and_lists_accumulate() {
        let tlvs = raw_tlvs(&json!([[5, "61"], [5, "62"], [8, "0501c0000201"], [8, "0501c0000202"]]));
        assert_eq!(
            Value::Object(parse_basic(&tlvs)),
            json!({"switch_system_name": "a", "switch_mgmt_addresses": ["192.0.2.1", "192.0.2.2"]})
        );
    }
}
