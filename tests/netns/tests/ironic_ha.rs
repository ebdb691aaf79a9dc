//! Three real Ironic 39 conductors sharing one MariaDB over JSON-RPC (`tests/netns/src/ironic_ha.rs`), one on each
//! PXE host of the HA site: the production shape ironguard's HA PXE filter serves, inspecting 30 nodes at once
//! through a leader host's death and a conductor's restart (`tests/netns/src/site_round.rs`). One site for both
//! rounds: MariaDB and three conductors are the costly part of the set-up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ironguard_netns_tests::ha::{DhcpPlan, HaOptions, HaSite};
use ironguard_netns_tests::site_round::{self, SiteFault, SiteNodes};
use ironguard_netns_tests::*;

/// Issue 24's production shape at work: 30 nodes inspected by Ironic at once through the site of three PXE hosts
/// (a conductor, dnsmasq and an agent each; MariaDB; a 3-member etcd 3.5; two control planes), 10 more nodes in other
/// states (enroll, manageable, available, active, maintenance), a stranger and a probe node
/// (`tests/netns/src/site_round.rs` says how a round runs and what it reads). Round 1: the leading PXE host dies
/// whole when a third of the nodes have reported. Round 2, on the two hosts left: a conductor restarts mid-round.
/// In both, every node gets a lease from one host (from that host's slice) and finishes; no DISCOVER of the probe is
/// answered twice; no exchange is offered by two hosts; the others and the stranger are never offered; no two
/// kernels are open together; and every inspected MAC is refused again at the end.
#[test]
fn thirty_nodes_inspected_at_once_through_a_leader_host_death_and_a_conductor_restart() {
    let (inspected, others) = (30, 10);
    let mut site = HaSite::with_plan(
        HaOptions {
            hosts: 3,
            nodes: SiteNodes::namespaces(inspected, others),
            policy: "deny",
            etcd: EtcdRelease::Debian13,
            etcd_members: 3,
            ironic_conductors: true,
            ..Default::default()
        },
        DhcpPlan { per_host: 40, ..Default::default() },
    );
    eprintln!("site set-up: {:?}", site.ironic.as_ref().map(|i| i.timings.clone()));
    site.wait_leader(None, DEADLINE).expect("a leader");
    let nodes = site_round::enroll_nodes(&site, inspected, others);
    let ironic = site.ironic.as_ref().expect("conductors");
    // The nodes spread over all three conductors (each conductor's API managed nodes others own: JSON-RPC).
    let owners: std::collections::BTreeSet<String> = nodes
        .inspected
        .iter()
        .map(|n| ironic.conductors[0].node(&n.uuid)["conductor"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(owners.len(), 3, "30 nodes spread over the three conductors: {owners:?}");
    for n in &nodes.others {
        assert_eq!(
            ironic.conductors[0].node(&n.uuid)["provision_state"],
            match n.state {
                "maintenance" => "manageable",
                s => s,
            }
        );
    }

    for fault in [SiteFault::LeaderHostDies, SiteFault::ConductorRestarts] {
        let report = site_round::run_round(&mut site, &nodes, fault);
        let per_host: Vec<usize> = (0..3)
            .map(|h| report.nodes.iter().filter(|n| n.lease.as_ref().is_some_and(|l| l.1 == h)).count())
            .collect();
        eprintln!(
            "{}: {} of {} finished in {:?} ({} inspected again after Ironic failed them), leases per host \
             {per_host:?}, host {:?}, failover {:?}, restart {:?}, probe {} DISCOVERs ({} unanswered), others {} \
             DISCOVERs, Ironic requests {} (fail-overs {})",
            fault.name(),
            report.finished(),
            report.nodes.len(),
            report.wall,
            report.nodes.iter().filter(|n| !n.failed_by_ironic.is_empty()).count(),
            report.fault_host,
            report.failover_gap,
            report.restart_took,
            report.probe_discovers,
            report.probe_unanswered,
            report.others_discovers,
            report.ironic_requests,
            report.ironic_failovers
        );
        let violations = report.violations(&site.plan);
        assert!(violations.is_empty(), "{}: {violations:#?}", fault.name());
        assert_eq!(report.finished(), inspected, "{}: every node finished", fault.name());
        assert!(report.probe_discovers > 0 && report.others_discovers > 0, "the probe and the others asked");
        match fault {
            SiteFault::LeaderHostDies => {
                assert!(report.failover_gap.is_some(), "another host served after the leader host died");
                let dead = report.fault_host.expect("the host killed");
                if dead == 0 {
                    // Host 0's API is the control planes' `[ironic] url`: they moved to the next, at its death or
                    // before (an answer slower than their timeout during the setup moves them too, T45).
                    assert!(report.ironic_failovers_ever > 0.0, "the control planes moved off the dead host's API");
                }
            }
            SiteFault::ConductorRestarts => assert!(report.restart_took.is_some()),
            SiteFault::None => {}
        }
        for n in &nodes.inspected {
            assert!(
                wait_for(DEADLINE, || site
                    .hosts
                    .iter()
                    .filter(|h| h.agent.is_some())
                    .all(|h| !kernel_decision(&h.ns, n.mac).served)
                    .then_some(()))
                .is_some(),
                "{}: {} is refused again after its inspection",
                fault.name(),
                n.name
            );
        }
    }
    // Ironic released every node: a conductor that died or stopped mid-task left no lock behind.
    let ironic = site.ironic.as_ref().expect("conductors");
    let unlocked = wait_for(Duration::from_secs(60), || {
        (ironic.db.query("SELECT COUNT(*) FROM nodes WHERE reservation IS NOT NULL;").trim() == "0").then_some(())
    });
    assert!(
        unlocked.is_some(),
        "nodes left locked: {}",
        ironic.db.query("SELECT name, reservation FROM nodes WHERE reservation IS NOT NULL;")
    );
}
