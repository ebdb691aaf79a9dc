//! Reading the ramdisk's data the way ironic-inspector's `utils` does: the inventory check, Python truthiness and
//! `int()`, the PXE MAC, the BMC addresses, and the interface records `validate_interfaces` builds.
use serde_json::{Map, Value};

use super::net::is_valid_mac;

/// The data as a JSON object, or the error ironic-inspector would hit on anything else.
pub(crate) fn object_mut(data: &mut Value) -> Result<&mut Map<String, Value>, String> {
    data.as_object_mut().ok_or_else(|| "introspection data is not a JSON object".to_owned())
}

/// ironic-inspector's `utils.get_inventory`: the inventory must be a non-empty object with a non-empty
/// `interfaces`; a missing `disks` is set to `[]` (a diskless node). Read it afterwards with [`inventory`].
pub(crate) fn checked_inventory(data: &mut Value) -> Result<(), String> {
    match data.get("inventory") {
        Some(Value::Object(inventory)) if !inventory.is_empty() => {
            if !inventory.get("interfaces").is_some_and(truthy) {
                return Err("No network interfaces provided in the inventory".to_owned());
            }
        }
        Some(other) if truthy(other) => return Err(format!("Hardware inventory is malformed: {other}")),
        _ => return Err("Hardware inventory is empty or missing".to_owned()),
    }
    if let Some(Value::Object(inventory)) = data.get_mut("inventory") {
        if !inventory.get("disks").is_some_and(truthy) {
            inventory.insert("disks".to_owned(), Value::Array(Vec::new()));
        }
    }
    Ok(())
}

/// The inventory for Ironic's hooks, which only need it to be an object (Ironic's API checked the rest).
pub(crate) fn inventory(data: &Value) -> Result<&Map<String, Value>, String> {
    data.get("inventory").and_then(Value::as_object).ok_or_else(|| "Hardware inventory is empty or missing".to_owned())
}

/// Python truthiness of a JSON value.
pub(crate) fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Python's `int(value)`: integers, floats (truncated), booleans, and strings of decimal digits (surrounding
/// whitespace, a sign and `_` between digits allowed). `None` where Python raises (or the result overflows).
pub(crate) fn python_int(value: &Value) -> Option<i64> {
    match value {
        Value::Bool(b) => Some(i64::from(*b)),
        Value::Number(n) => {
            n.as_i64().or_else(|| n.as_f64().filter(|f| f.is_finite() && f.abs() < 9.2e18).map(|f| f.trunc() as i64))
        }
        Value::String(s) => {
            let s = s.trim();
            let (negative, digits) = match s.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, s.strip_prefix('+').unwrap_or(s)),
            };
            let well_formed = !digits.is_empty()
                && !digits.starts_with('_')
                && !digits.ends_with('_')
                && !digits.contains("__")
                && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
            if !well_formed {
                return None;
            }
            let n: i64 = digits.replace('_', "").parse().ok()?;
            Some(if negative { -n } else { n })
        }
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// How Python's `"%s" % value` shows a value in a message (strings bare, the rest as JSON).
pub(crate) fn show(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

/// The PXE MAC from the top-level `boot_interface`; the pxelinux form `01-aa-bb-...` has its prefix stripped and
/// `-` turned into `:`. Lowercased (ironic-inspector lowercases only the pxelinux form; IPA sends lowercase).
pub(crate) fn pxe_mac(data: &Value) -> Option<String> {
    let boot_interface = data.get("boot_interface")?.as_str().filter(|s| !s.is_empty())?;
    let mac = match boot_interface.split_once('-') {
        Some((_, rest)) => rest.replace('-', ":"),
        None => boot_interface.to_owned(),
    };
    Some(mac.to_ascii_lowercase())
}

/// The BMC addresses as ironic-inspector reads them: `inventory.bmc_address` (top-level `ipmi_address` when the
/// inventory has no such key) and `inventory.bmc_v6address` (likewise `ipmi_v6address`); `''`, `0.0.0.0` and
/// `::/0` mean unknown.
pub(crate) fn bmc_addresses(data: &Value) -> (Option<String>, Option<String>) {
    let read = |inventory_key: &str, top_key: &str| {
        let value = match data.get("inventory").and_then(Value::as_object) {
            Some(inventory) if inventory.contains_key(inventory_key) => inventory.get(inventory_key),
            _ => data.get(top_key),
        };
        value.and_then(Value::as_str).filter(|a| !matches!(*a, "" | "0.0.0.0" | "::/0")).map(str::to_owned)
    };
    (read("bmc_address", "ipmi_address"), read("bmc_v6address", "ipmi_v6address"))
}

/// One entry of `all_interfaces`: `{ip, mac, client_id, pxe}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InterfaceRecord {
    /// Interface name.
    pub name: String,
    /// The IPv4 address, else the IPv6 address without `%scope`.
    pub ip: Option<String>,
    /// Lowercase MAC.
    pub mac: String,
    /// IPA's `client_id` (InfiniBand), as sent.
    pub client_id: Value,
    /// `mac == pxe_mac`.
    pub pxe: bool,
}

impl InterfaceRecord {
    /// The JSON ironic-inspector stores under the interface name.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::json!({
            "ip": self.ip,
            "mac": self.mac,
            "client_id": self.client_id,
            "pxe": self.pxe,
        })
    }
}

/// `ValidateInterfacesHook._get_interfaces`: every inventory interface with a name and a valid MAC, in inventory
/// order (a repeated name keeps its first place and takes the later record, as a Python dict does).
pub(crate) fn interface_records(data: &Value) -> Vec<InterfaceRecord> {
    let pxe_mac = pxe_mac(data);
    let interfaces = data.pointer("/inventory/interfaces").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let mut records: Vec<InterfaceRecord> = Vec::new();
    for iface in interfaces {
        let Some(name) = iface.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
            continue;
        };
        let Some(mac) = iface.get("mac_address").and_then(Value::as_str).filter(|m| is_valid_mac(m)) else {
            continue;
        };
        let mac = mac.to_ascii_lowercase();
        let address = |key: &str| iface.get(key).and_then(Value::as_str).filter(|a| !a.is_empty());
        let ip = address("ipv4_address")
            .map(str::to_owned)
            .or_else(|| address("ipv6_address").map(|a| a.split('%').next().unwrap_or(a).to_owned()));
        let record = InterfaceRecord {
            name: name.to_owned(),
            ip,
            pxe: pxe_mac.as_deref() == Some(mac.as_str()),
            mac,
            client_id: iface.get("client_id").cloned().unwrap_or(Value::Null),
        };
        match records.iter_mut().find(|r| r.name == record.name) {
            Some(existing) => *existing = record,
            None => records.push(record),
        }
    }
    records
}

/// All MACs of `all_interfaces` (what ironic-inspector looks nodes up by), or of the inventory when
/// `validate_interfaces` has not built `all_interfaces`.
pub(crate) fn all_macs(data: &Value) -> Vec<String> {
    match data.get("all_interfaces").and_then(Value::as_object) {
        Some(all) => all
            .values()
            .filter_map(|iface| iface.get("mac").and_then(Value::as_str))
            .filter(|mac| !mac.is_empty())
            .map(str::to_ascii_lowercase)
            .collect(),
        None => interface_records(data).into_iter().map(|r| r.mac).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_int_accepts_what_int_accepts() {
        assert_eq!(python_int(&json!(4)), Some(4));
        assert_eq!(python_int(&json!("8192")), Some(8192));
        assert_eq!(python_int(&json!(" -1_000 ")), Some(-1000));
        assert_eq!(python_int(&json!(4.9)), Some(4));
        assert_eq!(python_int(&json!(true)), Some(1));
        assert_eq!(python_int(&json!("4.0")), None);
        assert_eq!(python_int(&json!("1__0")), None);
        assert_eq!(python_int(&json!(null)), None);
        assert_eq!(python_int(&json!("")), None);
    }

    #[test]
    fn inventory_check_follows_get_inventory() {
        let mut missing = json!({"error": null});
        assert_eq!(checked_inventory(&mut missing).err().as_deref(), Some("Hardware inventory is empty or missing"));
        let mut no_ifaces = json!({"inventory": {"interfaces": [], "cpu": {}}});
        assert_eq!(
            checked_inventory(&mut no_ifaces).err().as_deref(),
            Some("No network interfaces provided in the inventory")
        );
        let mut diskless = json!({"inventory": {"interfaces": [{"name": "eth0"}]}});
        assert!(checked_inventory(&mut diskless).is_ok());
        assert_eq!(diskless["inventory"]["disks"], json!([]));
        assert!(checked_inventory(&mut json!([1])).is_err());
        assert!(checked_inventory(&mut json!({"inventory": "x"})).is_err());
    }

    #[test]
    fn pxe_mac_forms() {
        assert_eq!(pxe_mac(&json!({"boot_interface": "01-52-54-00-AB-CD-EF"})).as_deref(), Some("52:54:00:ab:cd:ef"));
        assert_eq!(pxe_mac(&json!({"boot_interface": "52:54:00:ab:cd:ef"})).as_deref(), Some("52:54:00:ab:cd:ef"));
        assert_eq!(pxe_mac(&json!({"boot_interface": null})), None);
        assert_eq!(pxe_mac(&json!({"boot_interface": 7})), None);
        assert_eq!(pxe_mac(&json!({})), None);
    }

    #[test]
    fn bmc_addresses_fall_back_and_discard_unknowns() {
        let data = json!({"inventory": {"bmc_address": "0.0.0.0", "bmc_v6address": "::/0"}, "ipmi_address": "1.2.3.4"});
        assert_eq!(bmc_addresses(&data), (None, None));
        let data =
            json!({"inventory": {"interfaces": []}, "ipmi_address": "192.0.2.5", "ipmi_v6address": "2001:db8::5"});
        assert_eq!(bmc_addresses(&data), (Some("192.0.2.5".into()), Some("2001:db8::5".into())));
        let data = json!({"inventory": {"bmc_address": null, "bmc_v6address": "2001:db8::1"}});
        assert_eq!(bmc_addresses(&data), (None, Some("2001:db8::1".into())));
        assert_eq!(bmc_addresses(&json!("junk")), (None, None));
    }

    #[test]
    fn interface_records_skip_nameless_and_bad_macs() {
        let data = json!({
            "boot_interface": "01-52-54-00-00-00-01",
            "inventory": {"interfaces": [
                {"name": "eth0", "mac_address": "52:54:00:00:00:01", "ipv4_address": "192.0.2.1"},
                {"name": "eth1", "mac_address": "52:54:00:00:00:02", "ipv4_address": null,
                 "ipv6_address": "fe80::1%eth1", "client_id": "ff:00"},
                {"name": "", "mac_address": "52:54:00:00:00:03"},
                {"name": "eth3", "mac_address": "not-a-mac"},
                {"name": "eth4", "mac_address": null},
                {"mac_address": "52:54:00:00:00:05"},
                "garbage"
            ]}
        });
        let records = interface_records(&data);
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[0].to_json(),
            json!({"ip": "192.0.2.1", "mac": "52:54:00:00:00:01", "client_id": null, "pxe": true})
        );
        assert_eq!(
            records[1].to_json(),
            json!({"ip": "fe80::1", "mac": "52:54:00:00:00:02", "client_id": "ff:00", "pxe": false})
        );
        assert_eq!(all_macs(&data), ["52:54:00:00:00:01", "52:54:00:00:00:02"]);
    }
}
