//! Property tests of node lookup (`/v1/continue` finding the node a ramdisk's data belongs to): the lookup
//! attributes of any data, BMC address normalisation of any string, and scoring over any records never panic; a
//! found node is always a candidate that is still inspecting; the order of the records changes nothing; and an
//! address in any notation Ironic's `driver_info` uses normalises to the address itself.
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;

use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::{Attributes, LookupError, lookup, lookup_attributes, normalise_bmc, usable_bmc};
use ironguard_inspection::machine::State;
use ironguard_inspection::records::NodeRecord;
use ironguard_testkit::hostile::{ramdisk_data, text};
use ironguard_testkit::prop::check;
use proptest::prelude::*;

const DEFAULT_CASES: u32 = 3000;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proptest-regressions/prop_lookup.txt");

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_CASES", DEFAULT_CASES)
}

const STATES: [State; 8] = [
    State::Starting,
    State::Waiting,
    State::Processing,
    State::Finished,
    State::Error,
    State::Reapplying,
    State::Aborting,
    State::Enrolling,
];

/// A small pool of MACs, so that records and data share some.
fn mac() -> impl Strategy<Value = MacAddr> {
    (0u8..6).prop_map(|i| MacAddr::from_octets([0x52, 0x54, 0, 0, 0, i + 1]).unwrap())
}

/// BMC addresses in the notations `driver_info` and the ramdisk use, and junk.
fn bmc() -> BoxedStrategy<String> {
    prop_oneof![
        (0u8..4).prop_map(|i| format!("10.0.0.{i}")),
        (0u8..4).prop_map(|i| format!("https://10.0.0.{i}:8443/redfish/v1")),
        (0u8..4).prop_map(|i| format!("[fd00::{i}]:623")),
        (0u8..4).prop_map(|i| format!("redfish+https://user@[fd00::{i}]/x")),
        text(),
    ]
    .boxed()
}

fn record() -> impl Strategy<Value = NodeRecord> {
    (
        prop_oneof![(0u8..5).prop_map(|i| format!("node-{i}")), text()],
        prop::sample::select(STATES.to_vec()),
        prop::collection::vec(mac(), 0..3),
        prop::collection::vec(bmc(), 0..2),
    )
        .prop_map(|(uuid, state, macs, bmcs)| {
            let mut r = NodeRecord::new(&uuid, 0);
            r.state = state;
            r.macs = macs;
            r.bmc_addresses = bmcs;
            r
        })
}

fn attributes() -> impl Strategy<Value = Attributes> {
    (
        prop::collection::vec(mac(), 0..3),
        prop::collection::vec(bmc(), 0..3),
        prop::option::of(prop_oneof![(0u8..5).prop_map(|i| format!("node-{i}")), text()]),
    )
        .prop_map(|(macs, bmc_addresses, node_uuid)| Attributes { macs, bmc_addresses, node_uuid })
}

#[test]
fn lookup_over_any_records_names_a_live_candidate_or_says_why_not() {
    let strategy = (attributes(), prop::collection::vec(record(), 0..6));
    check(REGRESSIONS, "lookup_scoring", cases(), strategy, |(attrs, records)| {
        let found = lookup(&attrs, &records);
        match &found {
            Ok(uuid) => {
                let r = records.iter().find(|r| &r.uuid == uuid);
                prop_assert!(r.is_some(), "{uuid} is no record");
                prop_assert!(
                    !records
                        .iter()
                        .filter(|r| &r.uuid == uuid)
                        .all(|r| matches!(r.state, State::Finished | State::Error))
                );
                if let Some(u) = &attrs.node_uuid {
                    prop_assert_eq!(u, uuid);
                }
            }
            Err(LookupError::Tie { nodes, .. }) => prop_assert!(nodes.len() > 1),
            Err(e) => prop_assert!(!e.reply_message().is_empty()),
        }
        // The answer does not depend on the order the store lists the records in.
        let reversed: Vec<NodeRecord> = records.iter().rev().cloned().collect();
        prop_assert_eq!(found, lookup(&attrs, &reversed));
        Ok(())
    });
}

#[test]
fn a_node_with_a_unique_mac_is_found_by_it() {
    let strategy = (
        prop::collection::vec(record(), 0..5),
        mac(),
        prop::sample::select(vec![State::Waiting, State::Starting, State::Processing]),
    );
    check(REGRESSIONS, "lookup_unique_mac", cases(), strategy, |(others, m, state)| {
        // The others lose the MAC and any BMC address, so only the target can score.
        let mut records: Vec<NodeRecord> = others
            .into_iter()
            .filter(|r| r.uuid != "target")
            .map(|mut r| {
                r.macs.retain(|x| *x != m);
                r
            })
            .collect();
        let mut target = NodeRecord::new("target", 0);
        target.state = state;
        target.macs = vec![m];
        records.push(target);
        let attrs = Attributes { macs: vec![m], bmc_addresses: vec![], node_uuid: None };
        prop_assert_eq!(lookup(&attrs, &records), Ok("target".to_string()));
        Ok(())
    });
}

#[test]
fn bmc_normalisation_of_any_string() {
    check(REGRESSIONS, "lookup_normalise_bmc_any", cases(), text(), |s| {
        let usable = usable_bmc(&s);
        if let Some(n) = normalise_bmc(&s) {
            prop_assert!(usable_bmc(&n), "{s:?} normalised to the unusable {n:?}");
            prop_assert!(!n.is_empty());
            if let Ok(ip) = n.parse::<IpAddr>() {
                prop_assert!(!ip.is_loopback(), "{s:?} -> loopback {n:?}");
            }
        }
        if !usable {
            prop_assert_eq!(normalise_bmc(&s), None, "{:?} is not usable", s);
        }
        Ok(())
    });
}

#[test]
fn an_address_in_any_notation_normalises_to_itself() {
    let strategy = (any::<IpAddr>(), 0u8..6, any::<u16>());
    check(REGRESSIONS, "lookup_normalise_bmc_notations", cases(), strategy, |(ip, form, port)| {
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let written = match form {
            0 => ip.to_string(),
            1 => format!("{host}:{port}"),
            2 => format!("https://{host}:{port}/redfish/v1/Systems/1"),
            3 => format!("redfish+http://admin@{host}/"),
            4 => format!("  {}  ", ip.to_string().to_uppercase()),
            _ => format!("ipmi://{host}?x=1#y"),
        };
        let want = (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string());
        prop_assert_eq!(normalise_bmc(&written), want, "{}", written);
        Ok(())
    });
}

#[test]
fn lookup_attributes_of_any_data() {
    let strategy = (ramdisk_data(), prop::option::of(text()));
    check(REGRESSIONS, "lookup_attributes_of_any_data", cases(), strategy, |(data, node_uuid)| {
        let attrs = lookup_attributes(&data, node_uuid.clone());
        let mut sorted = attrs.macs.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(&sorted, &attrs.macs, "MACs sorted and unique");
        prop_assert!(attrs.bmc_addresses.iter().all(|b| usable_bmc(b)));
        prop_assert!(attrs.node_uuid.as_deref() != Some(""));
        if let Some(u) = node_uuid.filter(|u| !u.is_empty()) {
            prop_assert_eq!(attrs.node_uuid, Some(u), "the caller's UUID wins over the data's");
        }
        Ok(())
    });
}
