//! DHCP servers on raw sockets (ISC dhcpd here; Kea in raw mode works the same way): they read requests from an
//! AF_PACKET socket, which sees a frame before any netfilter hook, so dropping DISCOVERs at the input hook stops
//! nothing. ironguard filters their *replies* instead, at the netdev egress hook of the provisioning interfaces
//! (`egress_interfaces`), by the BOOTP chaddr — with the same owned table, guard, modes and kernel lease as the
//! request side. Every test uses the real ISC dhcpd from Debian and busybox udhcpc clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_netns_tests::shapes::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const M1: &str = "52:54:00:13:e0:01";
const M2: &str = "52:54:00:13:e0:02";
const UNKNOWN: &str = "52:54:00:13:e0:99";
const SERVER: &str = "10.92.0.1";

/// A PXE host running dhcpd on `br0` (10.92.0.1/24, nodes on the bridge) and on `s0` (10.92.2.1/24, towards a DHCP
/// relay whose clients are on 10.92.1.0/24):
///
/// ```text
/// nodes[i] --(eth0 | p{i})-- br0 [pxe: dhcpd] s0 --(s0 | r1 10.92.2.2)-- relay (dnsmasq --dhcp-relay) r0 10.92.1.1 --(eth0)-- far
/// ```
struct RawLan {
    // Dropped in this order: the servers (their logs printed if the test failed), the namespaces, the directory.
    dhcpd: Dhcpd,
    _relay_dnsmasq: Dnsmasq,
    nodes: Vec<Netns>,
    far: Netns,
    _relay: Netns,
    pxe: Netns,
    dir: TempDir,
}

impl RawLan {
    fn new(n: usize) -> Self {
        let dir = TempDir::new("raw");
        let RelayedLan { relay_dnsmasq, nodes, far, relay, pxe } = RelayedLan::new(&dir, "raw", 92, n);
        let dhcpd = Self::start_dhcpd(&pxe, &dir);
        Self { dhcpd, _relay_dnsmasq: relay_dnsmasq, nodes, far, _relay: relay, pxe, dir }
    }

    fn start_dhcpd(pxe: &Netns, dir: &TempDir) -> Dhcpd {
        dhcpd(
            pxe,
            dir,
            "pxe",
            &["br0", "s0"],
            &[
                ("10.92.0.0", "255.255.255.0", "10.92.0.100", "10.92.0.200"),
                ("10.92.1.0", "255.255.255.0", "10.92.1.100", "10.92.1.200"),
                ("10.92.2.0", "255.255.255.0", "", ""),
            ],
        )
    }

    /// One DHCP client per (MAC, what it should get), on nodes 0.., at the same time; for a client that must get
    /// nothing, the PXE host's kernel is read first and must refuse it.
    fn dhcp_all(&self, clients: &[(&str, Want)]) -> Vec<Option<Lease>> {
        for (m, want) in clients {
            if *want == Want::Nothing {
                assert_kernel_refuses(&self.pxe, mac(m));
            }
        }
        let attempts: Vec<DhcpAttempt> = clients
            .iter()
            .enumerate()
            .map(|(i, (m, want))| dhcp_start(&self.nodes[i], "eth0", mac(m), *want))
            .collect();
        attempts.into_iter().map(DhcpAttempt::finish).collect()
    }

    /// A DHCP exchange through the relay, for a MAC that should get a lease.
    fn relayed(&self, m: &str) -> Option<Lease> {
        dhcp(&self.far, "eth0", mac(m))
    }

    /// The negative proof through the relay: the kernel refuses `m` (read first), and one DISCOVER gets no offer.
    fn relayed_refused(&self, m: &str) -> Option<Lease> {
        no_dhcp(&self.pxe, &self.far, "eth0", mac(m))
    }

    /// The `[dataplane]` lines of an agent on this host: no request-side hook, replies filtered on both interfaces.
    const DATAPLANE: &'static str = "hooks = []\negress_interfaces = [\"br0\", \"s0\"]\n";
}

fn served_by(l: &Option<Lease>) -> Option<String> {
    l.as_ref().map(|l| l.server_id.to_string())
}

fn stop(mut p: Proc) {
    p.signal(Signal::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "{}", p.log_text());
}

/// Why the egress hook: a guard on the input hook drops every DISCOVER dhcpd's fallback UDP socket would see, yet
/// dhcpd, reading its AF_PACKET socket, answers an unknown MAC anyway. The guard on the egress hook of the same
/// interface drops its OFFER, and the client gets nothing.
#[test]
fn an_af_packet_server_ignores_the_input_hook_and_is_stopped_at_egress() {
    let lan = RawLan::new(1);
    let pxe = &lan.pxe;
    assert_eq!(served_by(&dhcp(&lan.nodes[0], "eth0", mac(UNKNOWN))).as_deref(), Some(SERVER), "no firewall");

    run_ok(pxe.cmd(bin("ironguard-agent")).args(["guard", "install", "--interface", "br0"]));
    assert_eq!(
        served_by(&dhcp(&lan.nodes[0], "eth0", mac(UNKNOWN))).as_deref(),
        Some(SERVER),
        "the input-hook guard does not stop a server on raw sockets"
    );
    assert!(rule_packets(pxe, "guard", "input", "ironguard-guard:drop-unmarked") >= 1, "it saw and dropped them");

    run_ok(pxe.cmd(bin("ironguard-agent")).args(["guard", "install", "--hook", "none", "--egress-interface", "br0"]));
    let j = chains_json(pxe);
    assert!(j["guard"].is_null(), "the guard is reinstalled as configured: no input chain left");
    assert_eq!(j["egress_guard"]["chains"][0]["devices"], serde_json::json!(["br0"]));
    assert_eq!(j["verdict"], "CLOSED");
    assert_eq!(no_dhcp(pxe, &lan.nodes[0], "eth0", mac(UNKNOWN)), None, "the egress guard drops dhcpd's replies");
    assert!(rule_packets(pxe, "egress_guard", "egress", "ironguard-guard:drop-unmarked") >= 1);
    assert!(lan.dhcpd.proc.log_text().contains("DHCPOFFER"), "dhcpd did answer; the kernel dropped the answer");
}

/// The real agent and control plane (embedded store, unknown MACs denied) filtering dhcpd's replies on br0 and s0:
/// an allowed MAC gets a lease, denied and unknown ones do not, on the bridge and behind a relay (dhcpd's reply to
/// the relay leaves through its UDP socket and the egress hook of s0, keyed by the same chaddr); `nft flush
/// ruleset` changes nothing; once the agent is killed nobody is served. Then a follower serves nobody, and a leader
/// with policy allow serves unknown MACs but not denied ones.
#[test]
fn dhcpd_on_raw_sockets_is_filtered_at_egress_by_the_agent() {
    let lan = RawLan::new(3);
    let pxe = &lan.pxe;
    let mut host = GuardedHost::start(pxe, &lan.dir, "br0", RawLan::DATAPLANE, "");
    let j = chains_json(pxe);
    assert!(j["guard"].is_null() && j["owned"].is_null(), "no request-side tables with hooks = []");
    assert_eq!(j["egress_owned"]["chains"].as_array().unwrap().iter().filter(|c| c["hook"] == "egress").count(), 1);
    host.filter(pxe, "allow", mac(M1));
    host.filter(pxe, "deny", mac(M2));
    assert!(set_has_in(pxe, "egress_owned", "allow_chaddr", mac(M1)), "the reply side's allow set holds M1");

    let r = lan.dhcp_all(&[(M1, Want::Lease), (M2, Want::Nothing), (UNKNOWN, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER), "allowed\n{}", lan.dhcpd.proc.log_text());
    assert_eq!(r[1], None, "denied: dhcpd's offer is dropped at egress");
    assert_eq!(r[2], None, "unknown under policy deny: dropped at egress");
    assert!(rule_packets(pxe, "egress_owned", "whitelist", "ironguard:allow-chaddr") >= 1);
    assert!(rule_packets(pxe, "egress_owned", "blacklist", "ironguard:deny-chaddr") >= 1);
    assert!(rule_packets(pxe, "egress_owned", "pxe", "ironguard:not-marked") >= 1);

    let far = lan.relayed(M1).expect("allowed behind the relay: served");
    assert!(far.ip.to_string().starts_with("10.92.1."), "{far:?}");
    assert_eq!(lan.relayed_refused(M2), None, "denied behind the relay");
    assert_eq!(lan.relayed_refused(UNKNOWN), None, "unknown behind the relay");

    // Debian's nftables.service restart: the held guard and the agent's tables are left alone.
    run_ok(pxe.cmd("nft").args(["flush", "ruleset"]));
    let v = verdict(pxe);
    assert!(LEADER_TABLES.contains(&v.as_str()), "nft flush ruleset left the held guard and the agent's tables: {v}");
    let r = lan.dhcp_all(&[(M1, Want::Lease), (UNKNOWN, Want::Nothing)]);
    assert!(r[0].is_some() && r[1].is_none(), "after nft flush ruleset: {r:?}");

    // SIGKILL: the agent's tables vanish with its socket; the egress guard drops every reply.
    host.agent.signal(Signal::SIGKILL);
    assert!(host.agent.wait_exit(Duration::from_secs(30)).is_some(), "the killed agent is reaped");
    assert_eq!(verdict(pxe), "CLOSED", "closed by the time the killed agent is reaped");
    let dropped = rule_packets(pxe, "egress_guard", "egress", "ironguard-guard:drop-unmarked");
    let r = lan.dhcp_all(&[(M1, Want::Nothing)]);
    assert_eq!(r[0], None, "agent killed: no lease, even for the allowed MAC");
    assert_eq!(lan.relayed_refused(M1), None, "agent killed: nobody behind the relay either");
    assert!(rule_packets(pxe, "egress_guard", "egress", "ironguard-guard:drop-unmarked") > dropped);

    let hold_args = |extra: &[&str]| -> Vec<String> {
        ["--hook", "none", "--egress-interface", "br0", "--egress-interface", "s0"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    for (mode, verdict_text) in [("follower", "FOLLOWER"), ("blocked", "BLOCKED")] {
        let args = hold_args(&["--mode", mode, "--unknown-mac-policy", "allow", "--allow", M1]);
        let hold = start_hold(pxe, &lan.dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(verdict(pxe), verdict_text);
        let r = lan.dhcp_all(&[(M1, Want::Nothing), (UNKNOWN, Want::Nothing)]);
        assert_eq!(r, [None, None], "{mode}: nobody is served, allowed or unknown");
        stop(hold);
    }
    let args = hold_args(&["--mode", "leader", "--unknown-mac-policy", "allow", "--deny", M2]);
    let hold = start_hold(pxe, &lan.dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let r = lan.dhcp_all(&[(UNKNOWN, Want::Lease), (M2, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER), "policy allow: an unknown MAC is served");
    assert_eq!(r[1], None, "policy allow: a denied MAC is not");
    assert!(lan.relayed(UNKNOWN).is_some(), "policy allow, behind the relay");
    stop(hold);
}

/// The kernel lease on the reply side: a holder frozen with SIGSTOP stops serving when its lease element expires,
/// without running any code (FENCED), and serves again once thawed.
#[test]
fn a_frozen_holder_stops_serving_at_its_kernel_lease_on_egress() {
    let lan = RawLan::new(1);
    let pxe = &lan.pxe;
    let agent = start_hold(
        pxe,
        &lan.dir,
        &["--hook", "none", "--egress-interface", "br0", "--mode", "leader", "--unknown-mac-policy", "allow"],
    );
    assert!(wait_serving_leader(pxe), "{}", verdict(pxe));
    assert!(dhcp(&lan.nodes[0], "eth0", mac(UNKNOWN)).is_some());
    agent.signal(Signal::SIGSTOP);
    // Once it is stopped, nothing moves its lease: read where the kernel will end it (within 2 s: the holder
    // refreshes its lease every 250 ms for 2 s). None: frozen just after it dropped a lease it wrote late.
    assert!(wait_for(DEADLINE, || process_state(agent.pid()).filter(|s| *s == 'T')).is_some(), "the holder stopped");
    let read_from = Instant::now();
    let left = chains_json(pxe)["lease_expires_in_ms"].as_u64();
    // It ends by the kernel alone (FENCED), and not before its end (the kernel counts in 4 ms ticks).
    let fenced = wait_for(DEADLINE, || verdict(pxe).starts_with("FENCED").then(Instant::now));
    let fenced = fenced.unwrap_or_else(|| panic!("the frozen holder's lease ended (verdict {})", verdict(pxe)));
    if let Some(left) = left {
        assert!(left <= 2030, "the lease reaches {left} ms past the freeze");
        let end_earliest = read_from + Duration::from_millis(left);
        assert!(fenced + Duration::from_millis(30) >= end_earliest, "fenced only once its lease had ended");
    }
    let r = lan.dhcp_all(&[(UNKNOWN, Want::Nothing)]);
    assert_eq!(r[0], None, "a frozen holder serves nobody");
    agent.signal(Signal::SIGCONT);
    let back = wait_for(Duration::from_secs(30), || (verdict(pxe) == "LEADER").then_some(()));
    assert!(back.is_some(), "thawed, it serves again");
    assert!(dhcp(&lan.nodes[0], "eth0", mac(UNKNOWN)).is_some());
}

/// A provisioning interface removed and created again under the same name (a bridge or VLAN rebuilt by the network
/// configuration) while the agent leads: dhcpd, restarted on the new interface, still reaches nobody the filter
/// does not allow, and the allowed MAC is served again. (Linux 6.16 and later bind a netdev chain to the device
/// name and re-attach it by itself; on older kernels the chain loses the device and the agent's read-back repairs
/// the guard and its tables.)
#[test]
fn the_egress_filter_follows_a_recreated_interface() {
    let mut lan = RawLan::new(2);
    let pxe = &lan.pxe;
    let host = GuardedHost::start(pxe, &lan.dir, "br0", RawLan::DATAPLANE, "");
    host.filter(pxe, "allow", mac(M1));

    lan.dhcpd.proc.kill();
    pxe.ip(&["link", "del", "br0"]);
    pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
    pxe.ip(&["addr", "add", "10.92.0.1/24", "dev", "br0"]);
    for i in 0..2 {
        pxe.ip(&["link", "set", &format!("p{i}"), "master", "br0"]);
    }
    pxe.ip(&["link", "set", "br0", "up"]);
    lan.dhcpd = RawLan::start_dhcpd(pxe, &lan.dir);
    host.wait_verdict(pxe, "LEADER", Duration::from_secs(30));
    let healed = wait_for(Duration::from_secs(30), || {
        let j = chains_json(pxe);
        let bound = |t: &str| {
            j[t]["chains"].as_array().into_iter().flatten().any(|c| c["devices"] == serde_json::json!(["br0", "s0"]))
        };
        (bound("egress_guard") && bound("egress_owned")).then_some(())
    });
    assert!(healed.is_some(), "both egress chains are bound to the new br0:\n{}", host.agent.log_text());
    let r = lan.dhcp_all(&[(M1, Want::Lease), (UNKNOWN, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER), "the allowed MAC is served on the new interface");
    assert_eq!(r[1], None, "an unknown MAC is not");
}

/// Where the guard is a plain table (`[guard] claim = false`, or a kernel without `persist`), another process can
/// delete it; the agent hears of it from nf_tables' notifications and puts the reply side's guard back at once:
/// with the periodic read-back an hour away, every repair is the notification's, as the agent's log says.
#[test]
fn a_deleted_egress_guard_is_repaired_at_once() {
    let lan = RawLan::new(1);
    let pxe = &lan.pxe;
    let dataplane = format!("{}\n[guard]\nclaim = false\n", RawLan::DATAPLANE);
    let host = GuardedHost::start_with(pxe, &lan.dir, "br0", &dataplane, "", |toml| {
        let hourly = toml.replacen("[reconcile]\ninterval_secs = 5\n", "[reconcile]\ninterval_secs = 3600\n", 1);
        assert_ne!(hourly, toml, "the read-back interval is in the agent's configuration");
        hourly
    });
    assert_eq!(chains_json(pxe)["egress_guard"]["flags"], 0, "a plain guard");
    for tamper in [
        vec!["delete", "table", "netdev", "ironguard_guard"],
        vec!["flush", "chain", "netdev", "ironguard_guard", "egress"],
        vec!["flush", "ruleset"],
    ] {
        run_ok(pxe.cmd("nft").args(&tamper));
        let t = Instant::now();
        let repaired = wait_for(Duration::from_secs(30), || {
            let j = chains_json(pxe);
            let drops = j["egress_guard"]["chains"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["rules"].as_array().is_some_and(|r| !r.is_empty())));
            drops.then_some(())
        });
        assert!(repaired.is_some(), "nft {tamper:?}: the egress guard was not repaired:\n{}", host.agent.log_text());
        eprintln!("nft {tamper:?}: repaired in {:?}", t.elapsed());
    }
    let log = host.agent.log_text();
    let repair_lines: Vec<&str> = log.lines().filter(|l| l.contains("guard repaired")).collect();
    assert!(
        repair_lines.len() >= 3 && repair_lines.iter().all(|l| l.contains("change notification")),
        "every repair was triggered by a change notification, none by the read-back:\n{log}"
    );
    let r = lan.dhcp_all(&[(UNKNOWN, Want::Nothing)]);
    assert_eq!(r[0], None, "still filtered");
}
