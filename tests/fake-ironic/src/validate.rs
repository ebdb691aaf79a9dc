//! Ironic's argument checks and their messages (`ironic/common/args.py`, oslo's `uuidutils` and `strutils`, and
//! the port and trait schemas of `ironic/api/controllers/v1/utils.py`).

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::model::is_mac;
use crate::pyfmt::str_of;
use crate::schema::Schema;

/// oslo's `is_uuid_like`: 32 hex digits once `urn:`, `uuid:`, surrounding braces and dashes are dropped.
pub(crate) fn is_uuid_like(s: &str) -> bool {
    let hex = s.replace("urn:", "").replace("uuid:", "");
    let hex = hex.trim_matches(|c| c == '{' || c == '}').replace('-', "");
    hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

/// Ironic's logical name: up to 255 RFC 3986 unreserved characters.
pub(crate) fn is_valid_logical_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= 255
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~'))
}

/// A node name: a logical name that does not look like a UUID.
pub(crate) fn is_valid_node_name(s: &str) -> bool {
    is_valid_logical_name(s) && !is_uuid_like(s)
}

/// The words a node cannot be named (the node controller's sub-resources and custom actions).
pub(crate) const RESERVED_NODE_NAMES: &[&str] =
    &["maintenance", "management", "states", "vendor_passthru", "detail", "validate"];

/// `args.uuid`: `None` passes, anything else must be UUID-like.
pub(crate) fn uuid(name: &str, value: &Value) -> Result<(), ApiError> {
    match value {
        Value::Null => Ok(()),
        Value::String(s) if is_uuid_like(s) => Ok(()),
        other => Err(ApiError::bad_request(format!("Expected UUID for {name}: {}", str_of(other)))),
    }
}

/// `args.boolean` (oslo's strict `bool_from_string`): a JSON boolean, or one of oslo's boolean strings.
pub(crate) fn boolean(name: &str, value: &Value) -> Result<Option<bool>, ApiError> {
    let text = match value {
        Value::Null => return Ok(None),
        Value::Bool(b) => return Ok(Some(*b)),
        other => str_of(other),
    };
    match text.trim().to_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(Some(true)),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(Some(false)),
        _ => Err(ApiError::bad_request(format!(
            "Invalid {name}: Unrecognized value '{text}', acceptable values are: '0', '1', 'f', 'false', 'n', 'no', \
             'off', 'on', 't', 'true', 'y', 'yes'"
        ))),
    }
}

/// `args.mac_address`: the address lowercased, or Ironic's 400.
pub(crate) fn mac_address(name: &str, value: &str) -> Result<String, ApiError> {
    let lower = value.to_lowercase();
    if is_mac(&lower) {
        Ok(lower)
    } else {
        Err(ApiError::bad_request(format!("Expected valid MAC address for {name}: {value}")))
    }
}

/// An OpenFlow datapath ID: 16 hex digits.
fn is_datapath_id(s: &str) -> bool {
    s.len() == 16 && s.chars().all(|c| c.is_ascii_hexdigit())
}

// --- local_link_connection ---------------------------------------------------------------------------------------

fn local_link_base(network_types: &'static [&'static str]) -> Schema {
    let network_type: Vec<Value> = network_types.iter().map(|t| json!(t)).collect();
    Schema::of_type(&["object"])
        .properties(vec![
            ("port_id", Schema::of_type(&["string"])),
            ("switch_id", Schema::of_type(&["string"])),
            ("hostname", Schema::of_type(&["string"])),
            ("switch_info", Schema::of_type(&["string"])),
            ("network_type", Schema::of_type(&["string"]).enumeration(network_type)),
            ("vtep-logical-switch", Schema::of_type(&["string"])),
            ("vtep-physical-switch", Schema::of_type(&["string"])),
        ])
        .no_additional_properties()
        .dependent_required(&[
            ("vtep-logical-switch", &["vtep-physical-switch"]),
            ("vtep-physical-switch", &["vtep-logical-switch"]),
        ])
}

/// Ironic's `LOCAL_LINK_CONN_SCHEMA`: a switch port (`port_id` and `switch_id`), a Smart NIC (`port_id` and
/// `hostname`), an unmanaged network (`network_type` "unmanaged"), an OVN VTEP switch, or nothing at all.
fn local_link_schema() -> Schema {
    const MANAGED: &[&str] = &["managed", "unmanaged"];
    Schema::new().any_of(vec![
        local_link_base(MANAGED).required(&["port_id", "switch_id"]),
        local_link_base(MANAGED).required(&["port_id", "hostname"]),
        local_link_base(&["unmanaged"]).required(&["network_type"]),
        local_link_base(MANAGED).required(&["port_id", "vtep-logical-switch", "vtep-physical-switch"]),
        Schema::of_type(&["object"]).no_additional_properties(),
    ])
}

/// Ironic's `LOCAL_LINK_VALIDATOR`: the schema, then `switch_id` checked as a MAC address or an OpenFlow datapath
/// ID and lowercased. `null` passes as is.
pub(crate) fn local_link_connection(value: &Value) -> Result<Value, ApiError> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    local_link_schema().check("local_link_connection", value).map_err(ApiError::bad_request)?;
    let mut value = value.clone();
    if let Some(Value::String(switch_id)) = value.get_mut("switch_id") {
        let lower = switch_id.to_lowercase();
        if !is_mac(&lower) && !is_datapath_id(&lower) {
            return Err(ApiError::bad_request(format!(
                "Expected a MAC address or OpenFlow datapath ID but received {switch_id}."
            )));
        }
        *switch_id = lower;
    }
    Ok(value)
}

/// Whether `local_link_connection` suits a Smart NIC port (`port_id` and `hostname`).
pub(crate) fn is_smart_nic_link(value: &Value) -> bool {
    local_link_base(&["managed", "unmanaged"]).required(&["port_id", "hostname"]).is_valid(value)
}

// --- traits --------------------------------------------------------------------------------------------------------

/// Whether `name` is in the `CUSTOM_` namespace: `CUSTOM_` then upper-case letters, digits and underscores.
fn is_custom_trait(name: &str) -> bool {
    name.strip_prefix("CUSTOM_").is_some_and(|rest| {
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// Stands in for os-traits' list of standard traits, which the fake does not carry: a name in one of its
/// namespaces (`COMPUTE_`, `HW_`, `MISC_`, `OWNER_`, `STORAGE_`) made of upper-case letters, digits and
/// underscores. Ironic accepts only the names on the list, so a made-up `HW_...` name passes here but not there.
fn is_standard_trait(value: &Value) -> bool {
    const NAMESPACES: &[&str] = &["COMPUTE_", "HW_", "MISC_", "OWNER_", "STORAGE_"];
    value.as_str().is_some_and(|name| {
        NAMESPACES.iter().any(|ns| name.len() > ns.len() && name.starts_with(ns))
            && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// Ironic's `TRAITS_SCHEMA` for one trait: 1 to 255 characters, a custom or a standard trait.
pub(crate) fn trait_schema() -> Schema {
    Schema::of_type(&["string"]).min_length(1).max_length(255).any_of(vec![
        Schema::new().pattern("^CUSTOM_[A-Z0-9_]+$", is_custom_trait),
        Schema::new().enum_check(is_standard_trait, "[<the standard traits of os-traits>]"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_and_names() {
        assert!(is_uuid_like("55555555-5555-5555-5555-555555555555"));
        assert!(is_uuid_like("{5555555555555555555555555555555A}"));
        assert!(!is_uuid_like("node-1"));
        assert!(is_valid_node_name("rack1-u7.example~x"));
        assert!(!is_valid_node_name("has space"));
        assert!(!is_valid_node_name("55555555-5555-5555-5555-555555555555"));
    }

    #[test]
    fn booleans_as_oslo() {
        assert_eq!(boolean("x", &json!(" Yes ")).unwrap(), Some(true));
        assert_eq!(boolean("x", &json!(0)).unwrap(), Some(false));
        assert_eq!(boolean("x", &json!(null)).unwrap(), None);
        assert_eq!(
            boolean("pxe_enabled", &json!("maybe")).unwrap_err().faultstring,
            "Invalid pxe_enabled: Unrecognized value 'maybe', acceptable values are: '0', '1', 'f', 'false', 'n', \
             'no', 'off', 'on', 't', 'true', 'y', 'yes'"
        );
    }

    #[test]
    fn local_links() {
        let ok = local_link_connection(&json!({"port_id": "Eth1/1", "switch_id": "AA:BB:CC:DD:EE:FF"})).unwrap();
        assert_eq!(ok["switch_id"], "aa:bb:cc:dd:ee:ff");
        assert!(local_link_connection(&json!({"port_id": "p", "switch_id": "0123456789ABCDEF"})).is_ok());
        assert!(local_link_connection(&json!({"network_type": "unmanaged"})).is_ok());
        assert!(local_link_connection(&json!({})).is_ok());
        assert_eq!(
            local_link_connection(&json!({"port_id": "Eth1"})).unwrap_err().faultstring,
            "Schema error for local_link_connection: {'port_id': 'Eth1'} is not valid under any of the given \
             schemas. Possible root cause: 'switch_id' is a required property"
        );
        assert_eq!(
            local_link_connection(&json!({"port_id": "p", "switch_id": "x", "color": "red"})).unwrap_err().faultstring,
            "Schema error for local_link_connection: {'color': 'red', 'port_id': 'p', 'switch_id': 'x'} is not \
             valid under any of the given schemas. Possible root cause: Additional properties are not allowed \
             ('color' was unexpected)"
        );
        assert_eq!(
            local_link_connection(&json!({"port_id": "p", "switch_id": "nope"})).unwrap_err().faultstring,
            "Expected a MAC address or OpenFlow datapath ID but received nope."
        );
    }

    #[test]
    fn traits() {
        let s = trait_schema();
        assert!(s.is_valid(&json!("CUSTOM_GPU_A100")));
        assert!(s.is_valid(&json!("HW_CPU_X86_AVX2")));
        assert!(!s.is_valid(&json!("CUSTOM_")));
        assert!(!s.is_valid(&json!("custom_x")));
        assert!(!s.is_valid(&json!("lower")));
        assert!(!s.is_valid(&json!(format!("CUSTOM_{}", "A".repeat(250)))));
    }
}
