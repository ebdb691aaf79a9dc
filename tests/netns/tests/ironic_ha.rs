//! Three real Ironic 39 conductors sharing one MariaDB over JSON-RPC (`tests/netns/src/ironic_ha.rs`), one on each
//! PXE host of the HA site: the production shape ironguard's HA PXE filter serves. One site proves the shape itself
//! (every node mapped to a live conductor, each conductor's API driving nodes another conductor owns) and then an
//! inspection through ironguard (one site: MariaDB and three conductors are the costly part of the set-up).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ironguard_netns_tests::ha::{HaOptions, HaSite};
use ironguard_netns_tests::ironic;
use ironguard_netns_tests::ironic_ha;
use ironguard_netns_tests::*;

/// The HA site with an Ironic conductor on every PXE host. First the shape: three conductors alive; nodes enrolled
/// through one API spread over all three; each conductor's API manages a node another conductor owns (the request
/// crosses JSON-RPC). Then the filter: a node Ironic inspects boots from one host, posts its data to the conductor
/// of the host that leased it (which hands it to the node's owner over JSON-RPC) and finishes; a node Ironic does
/// not inspect gets nothing, and the inspected one is closed again afterwards; no node is left locked.
#[test]
fn three_conductors_on_one_mariadb_and_a_node_inspected_through_the_ha_site() {
    let site = HaSite::with_options(HaOptions {
        hosts: 3,
        nodes: 2,
        policy: "deny",
        ironic_conductors: true,
        ..Default::default()
    });
    let ironic = site.ironic.as_ref().expect("the site's conductors");
    eprintln!("ironic-ha site set-up: {:?}", ironic.timings);
    site.wait_leader(None, DEADLINE).expect("a leader");
    let mut names: Vec<String> = ironic.conductors.iter().map(|c| c.conductor.clone()).collect();
    names.sort();
    let mut alive = ironic.alive_conductors();
    alive.sort();
    assert_eq!(alive, names, "three conductors alive, named by their addresses");
    let api = &ironic.conductors[0];

    // Nodes through conductor 0's API until every conductor owns one (at least six; the hash ring maps random
    // UUIDs, and six cover all three conductors only most of the time).
    let mut nodes: Vec<(String, usize)> = Vec::new();
    for i in 0..30u8 {
        let covered = (0..3).all(|c| nodes.iter().any(|(_, o)| *o == c));
        if nodes.len() >= 6 && covered {
            break;
        }
        let uuid =
            api.enroll(&format!("ha-node-{i}"), &[mac(&format!("52:54:00:91:00:{i:02x}"))], "10.1.91.1", "agent");
        let shown = api.baremetal_json(&["node", "show", &uuid, "--fields", "uuid", "conductor"]);
        let owner = shown["conductor"].as_str().unwrap_or_default().to_string();
        let idx = ironic.index_of(&owner).unwrap_or_else(|| panic!("node {uuid} has no live conductor: {shown}"));
        nodes.push((uuid, idx));
    }
    let per: Vec<usize> = (0..3).map(|c| nodes.iter().filter(|(_, o)| *o == c).count()).collect();
    eprintln!("nodes per conductor: {per:?}");
    assert!(per.iter().all(|n| *n > 0), "every conductor owns a node: {per:?}");
    // Each API drives a node owned by the next conductor: `manage` is an RPC to the owner.
    for (c, conductor) in ironic.conductors.iter().enumerate() {
        let (uuid, _) = nodes.iter().find(|(_, o)| *o == (c + 1) % 3).expect("a node of the next conductor");
        conductor.provision(uuid, "manage");
        conductor.wait_provision_state(uuid, "manageable", Duration::from_secs(60));
    }

    let (a, b) = (mac("52:54:00:92:00:0a"), mac("52:54:00:92:00:0b"));
    let node_a = api.enroll("ha-a", &[a], "10.1.92.10", "agent");
    let node_b = api.enroll("ha-b", &[b], "10.1.92.11", "agent");
    api.drive_to(&node_a, "manageable");
    api.drive_to(&node_b, "manageable");

    api.drive_to(&node_a, "inspect wait");
    let lease = wait_for(DEADLINE, || site.dhcp(0, a)).expect("the node Ironic inspects boots");
    let host = site.hosts.iter().position(|h| h.ip == lease.server_id).expect("the lease comes from a PXE host");
    assert!(site.plan.holds(host, lease.ip), "from that host's own range: {lease:?}");
    assert!(site.dhcp_refused(1, b).is_none(), "a node Ironic does not inspect gets nothing");

    // The ramdisk posts to the host that leased it (its address on the provisioning network).
    site.nodes[0].ip(&["addr", "replace", &format!("{}/24", lease.ip), "dev", "eth0"]);
    let rest = ironic::RestClient {
        ns: site.nodes[0].name().to_string(),
        url: format!("http://{}:{}", lease.server_id, ironic_ha::API_PORT),
    };
    let (status, reply) =
        rest.api("POST", "/v1/continue_inspection", Some(&ipa_inventory(&[a], "10.1.92.10")), Some("latest"));
    assert_eq!(status, 202, "Ironic accepted the inspection data: {reply}");
    let node = api.wait_provision_state(&node_a, "manageable", Duration::from_secs(60));
    assert_eq!(node["properties"]["cpu_arch"], "x86_64", "Ironic processed the data");
    assert!(wait_for(DEADLINE, || site.all_refuse(a).then_some(())).is_some(), "closed again after inspection");
    assert!(site.dhcp_refused(0, a).is_none(), "no lease after inspection");
    let mut alive = ironic.alive_conductors();
    alive.sort();
    assert_eq!(alive, names, "still three alive");
    let reservations = ironic.db.query("SELECT COUNT(*) FROM nodes WHERE reservation IS NOT NULL;");
    assert_eq!(reservations.trim(), "0", "no node is left locked");
}
