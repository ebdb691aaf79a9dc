//! Finding the node a ramdisk's data belongs to, as ironic-inspector does on `/v1/continue`.
//!
//! The data names lookup attributes: the MACs of all its interfaces and its BMC addresses (IPv4 and IPv6;
//! `''`, `0.0.0.0` and `::/0` discarded), and optionally a node UUID. Every node ironguard has a record of is a
//! candidate; each (attribute, value) pair it shares with the data scores 1; the highest score wins. A tie, no
//! match, or a best match whose inspection already ended are errors with ironic-inspector's messages (which the REST
//! API returns as 400, prefixed as ironic-inspector prefixes its pre-processing failures). A given node UUID must
//! be a candidate and is the only one considered.

use std::net::IpAddr;

use ironguard_dataplane::MacAddr;
use serde_json::Value;

use crate::machine::State;
use crate::processing;
use crate::records::NodeRecord;

/// What the data offers to look its node up with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub macs: Vec<MacAddr>,
    pub bmc_addresses: Vec<String>,
    pub node_uuid: Option<String>,
}

impl Attributes {
    /// Nothing to look up with.
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty() && self.bmc_addresses.is_empty() && self.node_uuid.is_none()
    }

    /// The BMC addresses, normalised as they are compared.
    pub fn normalised_bmcs(&self) -> Vec<String> {
        self.bmc_addresses.iter().filter_map(|b| normalise_bmc(b)).collect()
    }

    fn describe(&self) -> String {
        let macs: Vec<String> = self.macs.iter().map(|m| format!("'{m}'")).collect();
        let bmcs: Vec<String> =
            self.bmc_addresses.iter().filter(|b| usable_bmc(b)).map(|b| format!("'{}'", crate::clip(b, 64))).collect();
        let mut parts = vec![];
        if !bmcs.is_empty() {
            parts.push(format!("'bmc_address': [{}]", bmcs.join(", ")));
        }
        if !macs.is_empty() {
            parts.push(format!("'mac': [{}]", macs.join(", ")));
        }
        if let Some(u) = &self.node_uuid {
            parts.push(format!("'uuid': '{}'", crate::clip(u, 64)));
        }
        // Bounded: it is echoed to the caller (a gRPC message travels in a header).
        crate::clip(&format!("{{{}}}", parts.join(", ")), 2000)
    }
}

/// Why no single node was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("Could not find a node for attributes {0}")]
    NotFound(String),
    /// The node UUIDs are logged, not returned: the reply reveals nothing about other nodes.
    #[error("Multiple nodes match the same number of attributes {attributes}")]
    Tie { attributes: String, nodes: Vec<String> },
    #[error("Introspection for node {node} already finished")]
    Finished { node: String },
}

impl LookupError {
    /// ironic-inspector's reply text: lookup is one of its pre-processing steps.
    pub fn reply_message(&self) -> String {
        format!("The following failures happened during running pre-processing hooks:\nLook up error: {self}")
    }
}

/// A BMC address worth looking up with: not empty, not `0.0.0.0`, not `::/0`.
pub fn usable_bmc(address: &str) -> bool {
    let a = address.trim();
    !(a.is_empty() || a == "0.0.0.0" || a == "::/0" || a == "::")
}

/// The lookup form of a BMC address recorded from a node's `driver_info`: a URL is reduced to its host, brackets
/// and ports are dropped; a loopback or unspecified address (`0::` is `::`) is no lookup address at all.
pub fn normalise_bmc(value: &str) -> Option<String> {
    let v = value.trim();
    let host = match v.split_once("://") {
        Some((_, rest)) => rest.split(['/', '?', '#']).next().unwrap_or_default(),
        None => v,
    };
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let host = if let Some(inner) = host.strip_prefix('[') {
        inner.split(']').next().unwrap_or_default()
    } else if host.matches(':').count() == 1 {
        host.split(':').next().unwrap_or_default()
    } else {
        host
    };
    if !usable_bmc(host) {
        return None;
    }
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() || ip.is_unspecified() => None,
        Ok(ip) => Some(ip.to_string()),
        Err(_) => Some(host.to_ascii_lowercase()),
    }
}

/// The node `attributes` identify among `records`.
/// How well `r` matches: one point per shared MAC, per shared BMC address (`bmcs`: the attributes' addresses,
/// normalised) and for the node UUID; 0 when the attributes name another node.
pub fn score(attributes: &Attributes, bmcs: &[String], r: &NodeRecord) -> usize {
    if attributes.node_uuid.as_deref().is_some_and(|u| u != r.uuid) {
        return 0;
    }
    let macs = r.macs.iter().filter(|m| attributes.macs.contains(m)).count();
    let bmc = if bmcs.is_empty() {
        0
    } else {
        r.bmc_addresses.iter().filter_map(|b| normalise_bmc(b)).filter(|b| bmcs.contains(b)).count()
    };
    macs + bmc + usize::from(attributes.node_uuid.is_some())
}

pub fn lookup(attributes: &Attributes, records: &[NodeRecord]) -> Result<String, LookupError> {
    let bmcs = attributes.normalised_bmcs();
    let mut scored: Vec<(usize, &NodeRecord)> =
        records.iter().map(|r| (score(attributes, &bmcs, r), r)).filter(|(score, _)| *score > 0).collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.uuid.cmp(&b.1.uuid)));
    let Some(&(best, winner)) = scored.first() else {
        return Err(LookupError::NotFound(attributes.describe()));
    };
    let tied: Vec<String> = scored.iter().take_while(|(s, _)| *s == best).map(|(_, r)| r.uuid.clone()).collect();
    if tied.len() > 1 {
        return Err(LookupError::Tie { attributes: attributes.describe(), nodes: tied });
    }
    if matches!(winner.state, State::Finished | State::Error) {
        return Err(LookupError::Finished { node: winner.uuid.clone() });
    }
    Ok(winner.uuid.clone())
}

/// What the data offers to look its node up with: the MACs of all its interfaces and its BMC addresses
/// (ironic-inspector's lookup attributes), and a `node_uuid` if the caller or the data names one.
/// The most MAC addresses (after deduplication) a ramdisk's data may name for its lookup. A real machine has a few
/// dozen interfaces at most (SR-IOV virtual functions are not in IPA's inventory); the lookup's cost grows with the
/// list, and the `enroll` hook asks Ironic once per MAC.
pub const MAX_CALLER_MACS: usize = 256;

pub fn lookup_attributes(data: &Value, node_uuid: Option<String>) -> Attributes {
    let (macs, bmcs) = processing::lookup_attributes(data);
    let mut macs: Vec<MacAddr> = macs.iter().filter_map(|m| m.parse().ok()).collect();
    if let Some(list) = data["macs"].as_array() {
        macs.extend(list.iter().filter_map(|m| m.as_str()?.parse::<MacAddr>().ok()));
    }
    macs.sort();
    macs.dedup();
    let node_uuid = node_uuid.or_else(|| data["node_uuid"].as_str().map(str::to_string)).filter(|u| !u.is_empty());
    Attributes { macs, bmc_addresses: bmcs.into_iter().filter(|b| usable_bmc(b)).collect(), node_uuid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_attributes_from_ipa_data() {
        let d = serde_json::json!({"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:12:34:56"}, {"mac_address": "bogus"}], "bmc_address": "10.0.0.9"}});
        let a = lookup_attributes(&d, None);
        assert_eq!(a.macs, vec!["52:54:00:12:34:56".parse::<MacAddr>().unwrap()]);
        assert_eq!(a.bmc_addresses, vec!["10.0.0.9".to_string()]);
        assert_eq!(a.node_uuid, None);
        let a = lookup_attributes(&serde_json::json!({"inventory": {"bmc_address": "0.0.0.0"}}), Some("n1".into()));
        assert!(a.macs.is_empty() && a.bmc_addresses.is_empty());
        assert_eq!(a.node_uuid.as_deref(), Some("n1"));
    }

    fn rec(uuid: &str, state: State, macs: &[&str], bmcs: &[&str]) -> NodeRecord {
        let mut r = NodeRecord::new(uuid, 0);
        r.state = state;
        r.macs = macs.iter().map(|m| m.parse().unwrap()).collect();
        r.bmc_addresses = bmcs.iter().map(|b| b.to_string()).collect();
        r
    }

    fn attrs(macs: &[&str], bmcs: &[&str]) -> Attributes {
        Attributes {
            macs: macs.iter().map(|m| m.parse().unwrap()).collect(),
            bmc_addresses: bmcs.iter().map(|b| b.to_string()).collect(),
            node_uuid: None,
        }
    }

    const A: &str = "52:54:00:00:00:0a";
    const B: &str = "52:54:00:00:00:0b";
    const C: &str = "52:54:00:00:00:0c";

    #[test]
    fn the_highest_score_wins_and_ties_are_errors() {
        let records =
            [rec("n1", State::Waiting, &[A, B], &["10.0.0.1"]), rec("n2", State::Waiting, &[C], &["10.0.0.2"])];
        assert_eq!(lookup(&attrs(&[A], &[]), &records).unwrap(), "n1");
        assert_eq!(lookup(&attrs(&[], &["10.0.0.2"]), &records).unwrap(), "n2", "by BMC address alone");
        // One MAC of n2 and one of n1 plus n1's BMC: n1 scores 2, n2 1.
        assert_eq!(lookup(&attrs(&[A, C], &["10.0.0.1"]), &records).unwrap(), "n1");
        let e = lookup(&attrs(&[A, C], &[]), &records).unwrap_err();
        assert!(matches!(&e, LookupError::Tie { nodes, .. } if nodes == &["n1", "n2"]), "{e:?}");
        assert!(!e.reply_message().contains("n1"), "the reply names no node: {}", e.reply_message());
        assert!(e.reply_message().starts_with("The following failures happened during running pre-processing hooks:"));
    }

    #[test]
    fn no_match_finished_and_node_uuid() {
        let records = [rec("n1", State::Finished, &[A], &[]), rec("n2", State::Waiting, &[B], &[])];
        let e = lookup(&attrs(&[C], &["0.0.0.0"]), &records).unwrap_err();
        assert_eq!(e.to_string(), format!("Could not find a node for attributes {{'mac': ['{C}']}}"));
        assert!(matches!(lookup(&attrs(&[A], &[]), &records), Err(LookupError::Finished { .. })));
        let mut a = attrs(&[], &[]);
        a.node_uuid = Some("n2".into());
        assert_eq!(lookup(&a, &records).unwrap(), "n2");
        a.node_uuid = Some("n9".into());
        assert!(matches!(lookup(&a, &records), Err(LookupError::NotFound(_))));
        // A UUID restricts the candidates: n2's MAC does not find n1.
        let mut a = attrs(&[B], &[]);
        a.node_uuid = Some("n1".into());
        assert!(matches!(lookup(&a, &records), Err(LookupError::Finished { .. })), "n1 scores by its UUID alone");
    }

    #[test]
    fn bmc_addresses_are_normalised() {
        assert_eq!(normalise_bmc("https://10.1.2.3:8443/redfish/v1").as_deref(), Some("10.1.2.3"));
        assert_eq!(normalise_bmc("[fd00::5]:623").as_deref(), Some("fd00::5"));
        assert_eq!(normalise_bmc("fd00::0005").as_deref(), Some("fd00::5"));
        assert_eq!(normalise_bmc("BMC-7.example"), Some("bmc-7.example".to_string()));
        assert_eq!(normalise_bmc("10.1.2.3:623").as_deref(), Some("10.1.2.3"));
        for none in [
            "",
            "0.0.0.0",
            "::/0",
            "127.0.0.1",
            "::1",
            "0::",
            "[::0]:623",
            "http://localhost:8000".replace("localhost", "127.0.0.1").as_str(),
        ] {
            assert_eq!(normalise_bmc(none), None, "{none:?}");
        }
        let records = [rec("n1", State::Waiting, &[], &["redfish+https://[fd00::5]/redfish/v1"])];
        assert_eq!(lookup(&attrs(&[], &["fd00::5"]), &records).unwrap(), "n1");
    }
}
