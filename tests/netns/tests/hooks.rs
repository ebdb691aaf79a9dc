//! Traffic shapes beyond "dnsmasq on the PXE host, DHCPv4, udp/67, input hook", each proven with real packets: the
//! real agent and control plane (embedded store, unknown MACs denied), a real dnsmasq, real clients (busybox
//! udhcpc, ISC `dhclient -6`) or a PXE ROM's packets made with scapy.
//!
//! * a dnsmasq in its own namespace (a container) on a Linux bridge of the PXE host, filtered on the forward hook
//!   (`hooks = ["forward"]`), and what happens to that bridged traffic without `bridge-nf-call-iptables`;
//! * a dnsmasq in a container that the PXE host routes to, behind a DHCP relay (forward hook, BOOTP chaddr);
//! * proxyDHCP: a PXE ROM's DISCOVER on udp/67 and boot item REQUEST on udp/4011 (`ports = [67, 4011]`);
//! * DHCPv6 on udp/547, direct (identified by the Ethernet source, whatever the DUID says) and relayed (decided per
//!   relay, not per client).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_netns_tests::shapes::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const M1: &str = "52:54:00:13:00:01";
const M2: &str = "52:54:00:13:00:02";
const UNKNOWN: &str = "52:54:00:13:00:99";

/// SIGKILL: the agent's table goes with its socket, so the host reads CLOSED once the process is reaped.
fn sigkill(host: &mut GuardedHost, pxe: &Netns) {
    host.agent.signal(Signal::SIGKILL);
    assert!(host.agent.wait_exit(Duration::from_secs(30)).is_some(), "the killed agent is reaped");
    assert_eq!(verdict(pxe), "CLOSED", "closed by the time the killed agent is reaped");
}

fn stop(mut p: Proc) {
    p.signal(Signal::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", p.log_text());
}

/// The PXE host `pxe` bridges its provisioning ports: `br0` (10.79.0.254/24; the host itself serves nothing) with port
/// `c0` to the container's `eth0` (10.79.0.1/24, where dnsmasq runs) and ports `p0`.. to the nodes' `eth0` — the
/// shape of a dnsmasq container (or pod) on a bridge network. `bridge-nf-call-iptables` is set inside `pxe` only.
struct BridgedContainer {
    // Dropped in this order: dnsmasq (its log printed if the test failed), the namespaces, the directory.
    dnsmasq: Dnsmasq,
    container: Netns,
    nodes: Vec<Netns>,
    pxe: Netns,
    dir: TempDir,
}

impl BridgedContainer {
    const SERVER: &'static str = "10.79.0.1";
    const DNSMASQ: &'static str = "container";

    fn new(nodes: usize, bridge_nf: bool) -> Self {
        let dir = TempDir::new("bridged");
        let pxe = Netns::new("brpxe");
        bridge_nf_call(&pxe, bridge_nf);
        pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
        // The host itself serves nothing here, but the agent's link check (agent/src/link.rs) wants an IPv4
        // address on every provisioning interface before it leads.
        pxe.ip(&["addr", "add", "10.79.0.254/24", "dev", "br0"]);
        pxe.ip(&["link", "set", "br0", "up"]);
        let container = Netns::new("ctr");
        veth(&container, "eth0", &pxe, "c0");
        pxe.ip(&["link", "set", "c0", "master", "br0"]);
        container.ip(&["addr", "add", "10.79.0.1/24", "dev", "eth0"]);
        let nodes: Vec<Netns> = (0..nodes)
            .map(|i| {
                let node = Netns::new("brnode");
                let port = format!("p{i}");
                veth(&node, "eth0", &pxe, &port);
                pxe.ip(&["link", "set", &port, "master", "br0"]);
                node
            })
            .collect();
        let dnsmasq = Self::start_dnsmasq(&container, &dir);
        Self { dnsmasq, container, nodes, pxe, dir }
    }

    fn start_dnsmasq(container: &Netns, dir: &TempDir) -> Dnsmasq {
        let args =
            ["--interface=eth0", "--dhcp-authoritative", "--dhcp-range=10.79.0.100,10.79.0.200,255.255.255.0,1h"];
        dnsmasq(container, dir, Self::DNSMASQ, &args, 67)
    }

    /// The agent's view of the container's dnsmasq: its pid file (the agent cannot see a socket in another
    /// namespace, so `udp_port = 0`).
    fn health(&self) -> String {
        format!("udp_port = 0\npid_file = \"{}\"\n", dnsmasq_pid_file(&self.dir, Self::DNSMASQ).display())
    }

    /// One client per (MAC, what it should get), on nodes 0.., at the same time; for a client that must get
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
}

/// dnsmasq in its own namespace on a bridge of the PXE host; the agent filters on the forward hook only. With
/// `bridge-nf-call-iptables=1` in the PXE host's namespace (a Kubernetes node's setting), the bridged DISCOVERs
/// traverse the inet forward hook with `iifname` the bridge: allowed MACs get a lease from the container, denied
/// and unknown ones (policy deny) do not, a follower and a dead agent serve nobody, and the agent follows the
/// container's dnsmasq through its pid file.
#[test]
fn a_containerized_dnsmasq_on_a_bridge_is_filtered_on_the_forward_hook() {
    let host_before = host_bridge_nf_call_iptables();
    let mut site = BridgedContainer::new(3, true);
    let pxe = &site.pxe;

    // Control: with no firewall the container's dnsmasq serves every node through the bridge.
    let lease = dhcp(&site.nodes[0], "eth0", mac(UNKNOWN)).expect("a lease from the container with no firewall");
    assert_eq!(lease.server_id.to_string(), BridgedContainer::SERVER);

    let mut host = GuardedHost::start(pxe, &site.dir, "br0", "hooks = [\"forward\"]\n", &site.health());
    assert_eq!(chain_names(pxe, "guard"), ["forward"], "the guard hooks forward only");
    assert!(chain_names(pxe, "owned").contains(&"forward".to_string()), "{:?}", chain_names(pxe, "owned"));
    assert!(!chain_names(pxe, "owned").contains(&"input".to_string()), "no input chain when hooks = [forward]");
    host.filter(pxe, "allow", mac(M1));
    host.filter(pxe, "deny", mac(M2));

    let r = site.dhcp_all(&[(M1, Want::Lease), (M2, Want::Nothing), (UNKNOWN, Want::Nothing)]);
    assert_eq!(r[0].as_ref().map(|l| l.server_id.to_string()).as_deref(), Some(BridgedContainer::SERVER), "allowed");
    assert_eq!(r[1], None, "denied MAC: no lease from the container");
    assert_eq!(r[2], None, "unknown MAC under policy deny: no lease");
    assert!(
        rule_packets(pxe, "owned", "forward", "ironguard:dhcp") >= 3,
        "the DISCOVERs went through the forward hook"
    );
    assert!(rule_packets(pxe, "owned", "whitelist", "ironguard:allow-mac") >= 1);
    assert!(rule_packets(pxe, "owned", "blacklist", "ironguard:deny-mac") >= 1);
    assert!(rule_packets(pxe, "owned", "pxe", "ironguard:not-marked") >= 1, "unknown MACs fall through, unmarked");

    // The container's dnsmasq dies: the agent (pid file) steps down; it leads again when dnsmasq is back.
    site.dnsmasq.proc.kill();
    host.wait_verdict(pxe, "FOLLOWER", Duration::from_secs(30));
    site.dnsmasq = BridgedContainer::start_dnsmasq(&site.container, &site.dir);
    host.wait_verdict(pxe, "LEADER", Duration::from_secs(30));
    assert!(dhcp(&site.nodes[0], "eth0", mac(M1)).is_some(), "leader again: the allowed MAC is served");

    // SIGKILL: the agent's table is gone, the guard (forward) drops every DISCOVER.
    sigkill(&mut host, pxe);
    let dropped = rule_packets(pxe, "guard", "forward", "ironguard-guard:drop-unmarked");
    assert_eq!(no_dhcp(pxe, &site.nodes[0], "eth0", mac(M1)), None, "agent killed: no lease, even for the allowed MAC");
    assert!(rule_packets(pxe, "guard", "forward", "ironguard-guard:drop-unmarked") > dropped, "the guard dropped them");

    // A follower with M1 allowed serves nobody; a leader with policy allow serves unknown MACs but not denied ones.
    let hold =
        start_hold(pxe, &site.dir, &["--interface", "br0", "--hook", "forward", "--mode", "follower", "--allow", M1]);
    assert_eq!(verdict(pxe), "FOLLOWER");
    assert_eq!(no_dhcp(pxe, &site.nodes[0], "eth0", mac(M1)), None, "follower: no lease");
    stop(hold);
    let hold = start_hold(
        pxe,
        &site.dir,
        &["--interface", "br0", "--hook", "forward", "--mode", "leader", "--unknown-mac-policy", "allow", "--deny", M2],
    );
    let r = site.dhcp_all(&[(UNKNOWN, Want::Lease), (M2, Want::Nothing)]);
    assert!(r[0].is_some(), "policy allow: an unknown MAC is served through the forward hook");
    assert_eq!(r[1], None, "policy allow: a denied MAC is not");
    stop(hold);
    assert_eq!(host_bridge_nf_call_iptables(), host_before, "the host's own bridge-nf-call-iptables is untouched");
}

/// The requirement behind the forward hook for a bridged container, shown with the guard alone: with
/// `bridge-nf-call-iptables=0` in the PXE host's namespace, bridged DISCOVERs never reach the inet forward hook,
/// so the guard cannot drop them and the container serves an unknown MAC. (ironguard does not check this setting;
/// architecture.md says so.)
#[test]
fn without_bridge_nf_call_iptables_bridged_dhcp_bypasses_the_forward_hook() {
    let site = BridgedContainer::new(1, true);
    let pxe = &site.pxe;
    run_ok(pxe.cmd(bin("ironguard-agent")).args(["guard", "install", "--interface", "br0", "--hook", "forward"]));
    assert_eq!(no_dhcp(pxe, &site.nodes[0], "eth0", mac(UNKNOWN)), None, "bridge-nf-call-iptables=1: the guard drops");
    let dropped = rule_packets(pxe, "guard", "forward", "ironguard-guard:drop-unmarked");
    assert!(dropped >= 1, "the guard on forward saw the bridged DISCOVERs");

    bridge_nf_call(pxe, false);
    let lease = dhcp(&site.nodes[0], "eth0", mac(UNKNOWN));
    assert_eq!(
        lease.map(|l| l.server_id.to_string()).as_deref(),
        Some(BridgedContainer::SERVER),
        "bridge-nf-call-iptables=0: the bridge hands the DISCOVERs to the container without the forward hook"
    );
    assert_eq!(
        rule_packets(pxe, "guard", "forward", "ironguard-guard:drop-unmarked"),
        dropped,
        "the guard saw nothing"
    );
}

/// A dnsmasq container that the PXE host routes to, serving nodes behind a DHCP relay (a ToR switch):
///
/// ```text
/// node --(eth0 | r0 10.81.1.1)-- relay --(r1 10.81.2.2 | s0 10.81.2.1)-- pxe --(c0 10.81.3.1 | eth0 10.81.3.2)-- container
/// ```
///
/// The relayed DISCOVERs (unicast to 10.81.3.2:67) cross the PXE host's forward hook with `iifname s0` and the
/// relay's Ethernet source: the BOOTP chaddr identifies the node. No bridge, no br_netfilter.
#[test]
fn a_routed_container_behind_a_relay_is_filtered_on_the_forward_hook() {
    let dir = TempDir::new("routed");
    let pxe = Netns::new("rtpxe");
    let relay = Netns::new("rtrelay");
    let node = Netns::new("rtnode");
    let container = Netns::new("rtctr");
    veth(&node, "eth0", &relay, "r0");
    veth(&relay, "r1", &pxe, "s0");
    veth(&pxe, "c0", &container, "eth0");
    relay.ip(&["addr", "add", "10.81.1.1/24", "dev", "r0"]);
    relay.ip(&["addr", "add", "10.81.2.2/24", "dev", "r1"]);
    relay.ip(&["route", "add", "10.81.3.0/24", "via", "10.81.2.1"]);
    pxe.ip(&["addr", "add", "10.81.2.1/24", "dev", "s0"]);
    pxe.ip(&["addr", "add", "10.81.3.1/24", "dev", "c0"]);
    pxe.ip(&["route", "add", "10.81.1.0/24", "via", "10.81.2.2"]);
    run_ok(pxe.cmd("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]));
    container.ip(&["addr", "add", "10.81.3.2/24", "dev", "eth0"]);
    container.ip(&["route", "add", "default", "via", "10.81.3.1"]);
    let args = ["--interface=eth0", "--dhcp-authoritative", "--dhcp-range=10.81.1.100,10.81.1.200,255.255.255.0,1h"];
    let server = dnsmasq(&container, &dir, "container", &args, 67);
    let _relay =
        dnsmasq(&relay, &dir, "relay", &["--interface=r0", "--interface=r1", "--dhcp-relay=10.81.1.1,10.81.3.2"], 67);

    let lease = dhcp(&node, "eth0", mac(UNKNOWN)).expect("relayed and routed DHCP works with no firewall");
    assert_eq!(lease.server_id.to_string(), "10.81.3.2");

    let health = format!("udp_port = 0\npid_file = \"{}\"\n", dnsmasq_pid_file(&dir, "container").display());
    let host = GuardedHost::start(&pxe, &dir, "s0", "hooks = [\"forward\"]\n", &health);
    host.filter(&pxe, "allow", mac(M1));
    host.filter(&pxe, "deny", mac(M2));
    assert_eq!(
        dhcp(&node, "eth0", mac(M1)).map(|l| l.server_id.to_string()).as_deref(),
        Some("10.81.3.2"),
        "allowed chaddr behind the relay: a lease from the routed container\n{}",
        server.proc.log_text()
    );
    assert_eq!(no_dhcp(&pxe, &node, "eth0", mac(M2)), None, "denied chaddr behind the relay: no lease");
    assert_eq!(no_dhcp(&pxe, &node, "eth0", mac(UNKNOWN)), None, "unknown chaddr under policy deny: no lease");
    assert!(
        rule_packets(&pxe, "owned", "forward", "ironguard:dhcp") >= 3,
        "relayed DISCOVERs crossed the forward hook"
    );
    assert!(rule_packets(&pxe, "owned", "whitelist", "ironguard:allow-chaddr") >= 1, "the chaddr rule allowed M1");
    assert_eq!(
        rule_packets(&pxe, "owned", "whitelist", "ironguard:allow-mac"),
        0,
        "the Ethernet source is the relay's"
    );
    assert!(rule_packets(&pxe, "owned", "blacklist", "ironguard:deny-chaddr") >= 1, "the chaddr rule denied M2");
}

/// A PXE host with a dnsmasq in proxy mode (`--dhcp-range=NET,proxy`, `--pxe-service`) on `br0` (10.77.0.1/24) and
/// `n` nodes with addresses 10.77.0.5x (another server hands out addresses in a proxyDHCP network).
struct ProxyLan {
    // Runs (and its log is printed if the test fails) until the LAN is dropped.
    _dnsmasq: Dnsmasq,
    nodes: Vec<Netns>,
    pxe: Netns,
    dir: TempDir,
}

impl ProxyLan {
    const SERVER: &'static str = "10.77.0.1";

    fn new(n: usize) -> Self {
        let dir = TempDir::new("proxy");
        let pxe = Netns::new("pxpxe");
        pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
        pxe.ip(&["addr", "add", "10.77.0.1/24", "dev", "br0"]);
        pxe.ip(&["link", "set", "br0", "up"]);
        let nodes = (0..n)
            .map(|i| {
                let node = Netns::new("pxnode");
                veth(&node, "eth0", &pxe, &format!("p{i}"));
                pxe.ip(&["link", "set", &format!("p{i}"), "master", "br0"]);
                node.ip(&["addr", "add", &format!("10.77.0.{}/24", 50 + i), "dev", "eth0"]);
                node
            })
            .collect();
        let args = ["--interface=br0", "--dhcp-range=10.77.0.0,proxy", "--pxe-service=x86PC,ironguard,pxelinux"];
        let _dnsmasq = dnsmasq(&pxe, &dir, "proxy", &args, 4011);
        Self { _dnsmasq, nodes, pxe, dir }
    }

    /// One probe per (MAC, what it should get on both ports), on nodes 0.., at the same time; for a probe that must
    /// get nothing, the PXE host's kernel is read first and must refuse it.
    fn probe_all(&self, probes: &[(&str, Want)]) -> Vec<PxeProbe> {
        for (m, want) in probes {
            if *want == Want::Nothing {
                assert_kernel_refuses(&self.pxe, mac(m));
            }
        }
        let runs: Vec<PxeProbeRun> = probes
            .iter()
            .enumerate()
            .map(|(i, (m, want))| pxe_probe_start(&self.nodes[i], "eth0", mac(m), Self::SERVER, *want, *want))
            .collect();
        runs.into_iter().map(PxeProbeRun::finish).collect()
    }
}

fn answered_nothing(p: &PxeProbe) -> bool {
    !p.offer && !p.ack
}

/// proxyDHCP with `ports = [67, 4011]`: a PXE ROM's DISCOVER (udp/67) gets a proxy offer and its boot item REQUEST
/// (unicast to udp/4011) an ACK naming the boot file only when its MAC is allowed; denied and unknown MACs get
/// neither, and neither does anyone once the agent is killed. With 4011 left out of the ports (the default is
/// `[67]`), the 4011 exchange is not filtered at all: list it wherever dnsmasq runs `--pxe-service`.
#[test]
fn proxy_dhcp_on_4011_answers_only_allowed_macs() {
    let lan = ProxyLan::new(3);
    let pxe = &lan.pxe;
    let control = pxe_probe(&lan.nodes[0], "eth0", mac(UNKNOWN), ProxyLan::SERVER, Want::Lease, Want::Lease);
    assert!(control.offer && control.ack, "with no firewall the proxy answers on 67 and 4011: {control:?}");
    assert_eq!(control.offer_server.as_deref(), Some(ProxyLan::SERVER));
    assert_eq!(control.boot_types, [0x8000], "dnsmasq's first --pxe-service");
    assert_eq!(control.ack_file.as_deref(), Some("pxelinux.0"));

    let mut host = GuardedHost::start(pxe, &lan.dir, "br0", "ports = [67, 4011]\n", "");
    host.filter(pxe, "allow", mac(M1));
    host.filter(pxe, "deny", mac(M2));
    let r = lan.probe_all(&[(M1, Want::Lease), (M2, Want::Nothing), (UNKNOWN, Want::Nothing)]);
    assert!(r[0].offer && r[0].ack && r[0].ack_file.as_deref() == Some("pxelinux.0"), "allowed: {:?}", r[0]);
    assert!(answered_nothing(&r[1]), "denied: no answer on 67 nor on 4011: {:?}", r[1]);
    assert!(answered_nothing(&r[2]), "unknown under policy deny: no answer on 67 nor on 4011: {:?}", r[2]);

    sigkill(&mut host, pxe);
    assert_kernel_refuses(pxe, mac(M1));
    let r = pxe_probe(&lan.nodes[0], "eth0", mac(M1), ProxyLan::SERVER, Want::Nothing, Want::Nothing);
    assert!(answered_nothing(&r), "agent killed: the guard drops 67 and 4011: {r:?}");

    // The same leader without 4011 in its ports: the boot item REQUEST of a denied MAC is answered.
    let hold = start_hold(
        pxe,
        &lan.dir,
        &["--interface", "br0", "--port", "67", "--mode", "leader", "--unknown-mac-policy", "deny", "--deny", M2],
    );
    assert_kernel_refuses(pxe, mac(M2));
    let r = pxe_probe(&lan.nodes[1], "eth0", mac(M2), ProxyLan::SERVER, Want::Nothing, Want::Lease);
    assert!(!r.offer && r.ack, "ports = [67]: udp/67 filtered, udp/4011 open to a denied MAC: {r:?}");
    stop(hold);
}

/// A PXE host serving DHCPv6 from dnsmasq on `br0` (fd00:77::1/64) to `n` nodes on that bridge.
struct V6Lan {
    dnsmasq: Dnsmasq,
    nodes: Vec<Netns>,
    pxe: Netns,
    dir: TempDir,
}

impl V6Lan {
    fn new(n: usize) -> Self {
        let dir = TempDir::new("v6");
        let pxe = Netns::new("v6pxe");
        no_dad(&pxe);
        pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0", "mcast_snooping", "0"]);
        pxe.ip(&["addr", "add", "fd00:77::1/64", "dev", "br0", "nodad"]);
        // Not needed by DHCPv6: the agent's link check (agent/src/link.rs) wants an IPv4 address on every
        // provisioning interface before it leads, even on an IPv6-only network.
        pxe.ip(&["addr", "add", "10.77.6.1/24", "dev", "br0"]);
        pxe.ip(&["link", "set", "br0", "up"]);
        let nodes = (0..n)
            .map(|i| {
                let node = Netns::new("v6node");
                no_dad(&node);
                veth(&node, "eth0", &pxe, &format!("p{i}"));
                pxe.ip(&["link", "set", &format!("p{i}"), "master", "br0"]);
                node
            })
            .collect();
        let dnsmasq =
            dnsmasq(&pxe, &dir, "v6", &["--interface=br0", "--dhcp-range=fd00:77::10,fd00:77::ff,64,1h"], 547);
        Self { dnsmasq, nodes, pxe, dir }
    }

    /// One `dhclient -6` per (MAC, what it should get), on nodes 0.., at the same time; for a client that must get
    /// nothing, the PXE host's kernel is read first and must refuse it.
    fn dhcp6_all(&self, clients: &[(&str, Want)]) -> Vec<Option<Lease6>> {
        for (m, want) in clients {
            if *want == Want::Nothing {
                assert_kernel_refuses(&self.pxe, mac(m));
            }
        }
        let attempts: Vec<Dhcp6Attempt> = clients
            .iter()
            .enumerate()
            .map(|(i, (m, want))| dhcp6_start(&self.nodes[i], &self.dir, "eth0", mac(m), *want))
            .collect();
        attempts.into_iter().map(Dhcp6Attempt::finish).collect()
    }
}

fn hex(m: &str) -> String {
    m.replace(':', "")
}

/// DHCPv6 with `ports = [547]`: a real DHCPv6 client (`dhclient -6`) gets an address only when the Ethernet source
/// of its SOLICIT is allowed; denied and unknown MACs get nothing, nor does anyone once the agent is killed. The
/// DUID does not count: a SOLICIT from an unknown MAC whose DUID-LL names an allowed MAC — laid out so that it sits
/// exactly where BOOTP's chaddr would be — is not answered (the chaddr rules match IPv4 only), and one from the
/// allowed MAC naming another DUID is.
#[test]
fn dhcpv6_on_547_is_filtered_by_the_ethernet_source() {
    require_scapy();
    let lan = V6Lan::new(3);
    let pxe = &lan.pxe;
    let control = dhcp6(&lan.nodes[0], &lan.dir, "eth0", mac(UNKNOWN)).expect("a DHCPv6 lease with no firewall");
    assert!(control.ip.to_string().starts_with("fd00:77::"), "{control:?}");

    let mut host = GuardedHost::start(pxe, &lan.dir, "br0", "ports = [547]\n", "udp_port = 547\n");
    host.filter(pxe, "allow", mac(M1));
    host.filter(pxe, "deny", mac(M2));
    let t = Instant::now();
    let r = lan.dhcp6_all(&[(M1, Want::Lease), (M2, Want::Nothing), (UNKNOWN, Want::Nothing)]);
    assert!(r[0].is_some(), "allowed MAC: a DHCPv6 address ({:?})\n{}", t.elapsed(), lan.dnsmasq.proc.log_text());
    assert_eq!(r[1], None, "denied MAC: no DHCPv6 address");
    assert_eq!(r[2], None, "unknown MAC under policy deny: no DHCPv6 address");

    // A single SOLICIT each: the MAC changes with the link up, so that the bridge forwards it at once.
    set_mac_up(&lan.nodes[0], "eth0", mac(UNKNOWN));
    assert_kernel_refuses(pxe, mac(UNKNOWN));
    let s = solicit_with_duid(&lan.nodes[0], "eth0", mac(M1), Want::Nothing);
    assert_eq!(s.at_chaddr_offset, hex(M1), "the DUID's MAC sits where a DHCPv4 chaddr would");
    assert!(!s.advertise, "an unknown Ethernet source is not served, whatever its DUID names: {s:?}");
    set_mac_up(&lan.nodes[0], "eth0", mac(M1));
    let s = solicit_with_duid(&lan.nodes[0], "eth0", mac(UNKNOWN), Want::Lease);
    assert!(s.advertise, "the allowed Ethernet source is served, whatever its DUID names: {s:?}");
    assert_eq!(rule_packets(pxe, "owned", "whitelist", "ironguard:allow-chaddr"), 0, "chaddr rules never match DHCPv6");
    assert!(rule_packets(pxe, "owned", "whitelist", "ironguard:allow-mac") >= 2);

    sigkill(&mut host, pxe);
    assert_eq!(no_dhcp6(pxe, &lan.nodes[0], &lan.dir, "eth0", mac(M1)), None, "agent killed: the guard drops udp/547");
    assert!(rule_packets(pxe, "guard", "input", "ironguard-guard:drop-unmarked") >= 1);
}

/// Relayed DHCPv6 (RELAY-FORW from the relay to udp/547) carries the relay's Ethernet source and no BOOTP chaddr,
/// so ironguard decides per relay, not per client: under policy deny an allowed node behind an unknown relay gets
/// nothing, and once the relay's MAC is allowed every node behind it is served, a denied one too.
///
/// ```text
/// node --(eth0 | r0 fd00:81:1::1)-- relay --(r1 fd00:81:2::2 | s0 fd00:81:2::1)-- pxe (dnsmasq)
/// ```
#[test]
fn relayed_dhcpv6_is_decided_per_relay_not_per_client() {
    const RELAY_MAC: &str = "52:54:00:13:0f:01";
    let dir = TempDir::new("v6relay");
    let pxe = Netns::new("v6rpxe");
    let relay = Netns::new("v6relay");
    let node = Netns::new("v6rnode");
    for ns in [&pxe, &relay, &node] {
        no_dad(ns);
    }
    veth(&node, "eth0", &relay, "r0");
    veth(&relay, "r1", &pxe, "s0");
    relay.ip(&["link", "set", "r1", "address", RELAY_MAC]);
    relay.ip(&["addr", "add", "fd00:81:1::1/64", "dev", "r0", "nodad"]);
    relay.ip(&["addr", "add", "fd00:81:2::2/64", "dev", "r1", "nodad"]);
    pxe.ip(&["addr", "add", "fd00:81:2::1/64", "dev", "s0", "nodad"]);
    pxe.ip(&["addr", "add", "10.81.6.1/24", "dev", "s0"]); // for the agent's link check only (see V6Lan)
    pxe.ip(&["route", "add", "fd00:81:1::/64", "via", "fd00:81:2::2"]);
    let _server =
        dnsmasq(&pxe, &dir, "v6server", &["--interface=s0", "--dhcp-range=fd00:81:1::10,fd00:81:1::ff,64,1h"], 547);
    let _relay = dnsmasq(
        &relay,
        &dir,
        "v6relay",
        &["--interface=r0", "--interface=r1", "--dhcp-relay=fd00:81:1::1,fd00:81:2::1"],
        547,
    );
    let control = dhcp6(&node, &dir, "eth0", mac(UNKNOWN)).expect("relayed DHCPv6 works with no firewall");
    assert!(control.ip.to_string().starts_with("fd00:81:1::"), "{control:?}");

    let host = GuardedHost::start(&pxe, &dir, "s0", "ports = [547]\n", "udp_port = 547\n");
    host.filter(&pxe, "allow", mac(M1));
    assert_kernel_refuses(&pxe, mac(RELAY_MAC));
    assert_eq!(
        dhcp6_start(&node, &dir, "eth0", mac(M1), Want::Nothing).finish(),
        None,
        "an allowed node behind an unknown relay: nothing"
    );
    host.filter(&pxe, "allow", mac(RELAY_MAC));
    host.filter(&pxe, "deny", mac(M2));
    assert!(
        dhcp6(&node, &dir, "eth0", mac(M2)).is_some(),
        "the relay's MAC allowed: every node behind it is served, a denied one too"
    );
}
