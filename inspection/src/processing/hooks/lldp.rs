//! `lldp_basic` (ironic-inspector) and `parse-lldp` (Ironic): parse each interface's LLDP TLVs (from
//! `lldp_raw[name]`, else `interfaces[].lldp`) into name/value pairs. ironic-inspector stores them as
//! `all_interfaces[name].lldp_processed`; Ironic as `parsed_lldp[name]` (at most 64 interfaces).
use serde_json::{Map, Value};

use super::Hook;
use crate::processing::data::{checked_inventory, inventory, object_mut, truthy};
use crate::processing::lldp_tlv::{parse_basic, raw_tlvs};
use crate::processing::plan::{NodeView, Plan};

/// Ironic's limit on interfaces parsed.
const MAX_INTERFACES: usize = 64;

/// An interface name and its parsed LLDP pairs.
type ParsedLldp = (String, Map<String, Value>);

/// Every interface (of the first `limit`) with non-empty parsed LLDP data.
fn parsed_interfaces(data: &Value, limit: usize) -> Result<Vec<ParsedLldp>, String> {
    let raw = data.get("lldp_raw").and_then(Value::as_object);
    let interfaces = data.pointer("/inventory/interfaces").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let mut parsed = Vec::new();
    for iface in interfaces.iter().take(limit) {
        let name = iface.get("name").and_then(Value::as_str).ok_or_else(|| format!("interface {iface} has no name"))?;
        let tlvs = raw.and_then(|r| r.get(name)).filter(|t| truthy(t)).or_else(|| iface.get("lldp"));
        let Some(tlvs) = tlvs.filter(|t| !t.is_null()) else { continue };
        let pairs = parse_basic(&raw_tlvs(tlvs));
        if !pairs.is_empty() {
            parsed.push((name.to_owned(), pairs));
        }
    }
    Ok(parsed)
}

/// ironic-inspector's `lldp_basic`.
#[derive(Debug)]
pub(crate) struct LldpBasic;

impl Hook for LldpBasic {
    fn before_update(&self, data: &mut Value, _node: &NodeView, _plan: &mut Plan) -> Result<(), String> {
        checked_inventory(data)?;
        let parsed = parsed_interfaces(data, usize::MAX)?;
        for (name, pairs) in parsed {
            let iface = data
                .get_mut("all_interfaces")
                .and_then(|all| all.get_mut(&name))
                .and_then(Value::as_object_mut)
                .ok_or_else(|| format!("interface {name} has LLDP data but is not in all_interfaces"))?;
            iface.insert("lldp_processed".to_owned(), Value::Object(pairs));
        }
        Ok(())
    }
}

/// Ironic's `parse-lldp`.
#[derive(Debug)]
pub(crate) struct ParseLldp;

impl Hook for ParseLldp {
    fn before_update(&self, data: &mut Value, _node: &NodeView, _plan: &mut Plan) -> Result<(), String> {
        inventory(data)?;
        let parsed = parsed_interfaces(data, MAX_INTERFACES)?;
        if parsed.is_empty() {
            return Ok(());
        }
        let object = object_mut(data)?;
        let entry = object.entry("parsed_lldp").or_insert(Value::Null);
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Some(stored) = entry.as_object_mut() {
            stored.extend(parsed.into_iter().map(|(name, pairs)| (name, Value::Object(pairs))));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::config::ProcessingConfig;
    use crate::processing::hooks::validate_interfaces::ValidateInterfaces;
    use crate::processing::testdata;
    use serde_json::json;

    fn lldp_data() -> Value {
        let mut data = testdata::lldp();
        ValidateInterfaces::new(&ProcessingConfig::default()).before_processing(&mut data).expect("interfaces");
        data
    }

    #[test]
    fn lldp_basic_stores_lldp_processed_per_interface() {
        let mut data = lldp_data();
        LldpBasic.before_update(&mut data, &testdata::node(), &mut Plan::new()).expect("lldp_basic");
        let eth0 = &data["all_interfaces"]["eth0"]["lldp_processed"];
        assert_eq!(eth0["switch_chassis_id"], json!("00:1c:73:aa:bb:cc"));
        assert_eq!(eth0["switch_port_id"], json!("Ethernet1/3"));
        assert_eq!(
            eth0["switch_port_vlans"],
            json!([{"name": "provisioning", "id": 100}, {"name": "tenant", "id": 200}])
        );
        let eth1 = &data["all_interfaces"]["eth1"]["lldp_processed"];
        assert_eq!(
            *eth1,
            json!({"switch_chassis_id": "leaf-2", "switch_port_id": "00:1c:73:dd:ee:01", "switch_system_name": "leaf-2.example.com"})
        );
        assert!(data.get("parsed_lldp").is_none());
    }

    #[test]
    fn lldp_raw_wins_over_the_inventory() {
        let mut data = lldp_data();
        data["lldp_raw"] = json!({"eth1": [[5, "6f74686572"]], "eth0": []});
        LldpBasic.before_update(&mut data, &testdata::node(), &mut Plan::new()).expect("lldp_basic");
        assert_eq!(data["all_interfaces"]["eth1"]["lldp_processed"], json!({"switch_system_name": "other"}));
        assert_eq!(data["all_interfaces"]["eth0"]["lldp_processed"]["switch_system_name"], json!("leaf-1.example.com"));
    }

    #[test]
    fn lldp_basic_needs_all_interfaces() {
        let mut data = testdata::lldp();
        assert!(LldpBasic.before_update(&mut data, &testdata::node(), &mut Plan::new()).is_err());
        let mut plain = testdata::two_nics_two_disks();
        assert_eq!(
            LldpBasic.before_update(&mut plain, &testdata::node(), &mut Plan::new()),
            Ok(()),
            "no LLDP, nothing to do"
        );
    }

    #[test]
    fn parse_lldp_stores_parsed_lldp() {
        let mut data = testdata::lldp();
        ParseLldp.before_update(&mut data, &testdata::node(), &mut Plan::new()).expect("parse-lldp");
        assert_eq!(data["parsed_lldp"]["eth0"]["switch_system_name"], json!("leaf-1.example.com"));
        assert_eq!(data["parsed_lldp"]["eth1"]["switch_port_id"], json!("00:1c:73:dd:ee:01"));
        assert!(data["all_interfaces"].is_null());
    }
}
