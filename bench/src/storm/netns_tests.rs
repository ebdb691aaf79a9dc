//! The simulator against one real dnsmasq in network namespaces (needs root, like tests/netns; fails, never skips,
//! when it cannot set up): the exchange completes for every client, one lease each, no duplicates; a renewal with
//! the server that leased is extended; one with a server that never leased it is NAKed and leased anew from that
//! server's own slice.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::client::Schedule;
use super::sim::{self, Fleet, StormConfig};
use super::{Alone, PLAN, macs, socket_in};

#[test]
fn every_client_leases_from_one_dnsmasq_and_renews_its_address() {
    let lan = Alone::new(1);
    let n = 40;
    let clients = macs(n, 0x41);
    let cfg =
        StormConfig { schedule: Schedule::firmware(), spread: Duration::from_millis(200), renew: true, release: true };
    let bound = AtomicUsize::new(0);
    let o = sim::run(socket_in(&lan.node).unwrap(), &clients, &cfg, &bound).unwrap();
    let log = || lan.dnsmasq.proc.log_text();
    assert_eq!((o.storm.clients, o.storm.bound, o.storm.gave_up), (n, n, 0), "every client leased\n{}", log());
    assert_eq!(o.storm.time_to_lease.len(), n);
    assert_eq!(o.storm.by_server.get(&Alone::SERVER), Some(&n), "all from the one server");
    assert_eq!(o.storm.naks, 0);
    assert_eq!((o.duplicates, o.double_offers), (0, 0));
    assert!(o.offered >= n, "an offer per client at least: {}", o.offered);
    // The renewal: unicast to the server (which ARPs for the client's address first), extended in place.
    let r = o.renewal.as_ref().expect("renewal");
    assert_eq!((r.clients, r.kept, r.naks, r.unanswered), (n, n, 0, 0), "every lease extended\n{}", log());
    // One ACK per client in each phase, and no lease left after the RELEASEs.
    let leases = lan.dir.join("dnsmasq-alone.leases");
    let held = || std::fs::read_to_string(&leases).unwrap_or_default().lines().count();
    assert!(
        ironguard_netns_tests::wait_for(Duration::from_secs(10), || (held() == 0).then_some(())).is_some(),
        "dnsmasq still holds {} leases after every client released",
        held()
    );
}

#[test]
fn a_server_that_never_leased_the_address_naks_the_renewal_and_leases_from_its_own_slice() {
    let mut lan = Alone::new(1);
    let n = 12;
    let clients = macs(n, 0x42);
    let mut fleet = Fleet::new(socket_in(&lan.node).unwrap(), &clients, Schedule::parse("1,2,4").unwrap());
    let bound = AtomicUsize::new(0);
    let storm = fleet.acquire(Duration::ZERO, &bound).unwrap();
    assert_eq!(storm.bound, n, "{}", lan.dnsmasq.proc.log_text());
    let first: BTreeSet<_> = fleet.clients().iter().filter_map(|c| c.lease()).map(|l| l.ip).collect();
    assert_eq!(first.len(), n, "one address each");
    assert!(first.iter().all(|ip| PLAN.holds(0, *ip)), "{first:?}");
    // The hand-over: another dnsmasq (with its own lease file and the next slice) takes the host's place.
    lan.dnsmasq.proc.kill();
    lan.dnsmasq = Alone::dnsmasq(&lan.pxe, &lan.dir, "dnsmasq-next", 1);
    let r = fleet.renew(Duration::ZERO, &bound).unwrap();
    let log = lan.dnsmasq.proc.log_text();
    assert_eq!(r.kept, 0, "nobody keeps an address the new server never leased\n{log}");
    assert_eq!(r.naked_clients, n, "every renewal NAKed (--dhcp-authoritative)\n{log}");
    assert_eq!(r.bound, n, "and leased again\n{log}");
    let second: BTreeSet<_> = fleet.clients().iter().filter_map(|c| c.lease()).map(|l| l.ip).collect();
    assert_eq!(second.len(), n);
    assert!(second.iter().all(|ip| PLAN.holds(1, *ip)), "from the new server's slice: {second:?}");
    assert_eq!((fleet.ledger.duplicates(), fleet.ledger.double_offers()), (0, 0));
}
