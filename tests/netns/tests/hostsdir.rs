//! The dnsmasq hostsdir backend against a real dnsmasq configured as for Ironic's `ironic-pxe-filter` (or
//! ironic-inspector's dnsmasq filter): `--dhcp-hostsdir=DIR`, nothing else. The agent writes DIR in their format;
//! dnsmasq re-reads it through inotify; real udhcpc clients (directly on the bridge, and behind a DHCP relay) show
//! what dnsmasq serves. Also what the backend does *not* guarantee alone (SIGKILL), what closes it then (`guard
//! install`, the unit's ExecStopPost), and the recommended pairing with the nftables backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use ironguard_netns_tests::shapes::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const M1: &str = "52:54:00:13:d0:01";
const M2: &str = "52:54:00:13:d0:02";
const UNKNOWN: &str = "52:54:00:13:d0:99";
const SERVER: &str = "10.93.0.1";

/// A PXE host with a dnsmasq on `br0` (10.93.0.1/24) reading `hosts/` as its `--dhcp-hostsdir`, `n` nodes on the
/// bridge, and a DHCP relay (10.93.2.2 ↔ 10.93.1.1) with one node (`far`) behind it.
struct HostsLan {
    dnsmasq: Dnsmasq,
    _relay_dnsmasq: Dnsmasq,
    nodes: Vec<Netns>,
    far: Netns,
    _relay: Netns,
    pxe: Netns,
    hosts: PathBuf,
    dir: TempDir,
}

impl HostsLan {
    fn new(n: usize) -> Self {
        let dir = TempDir::new("hostsdir");
        let hosts = dir.join("hosts");
        // The directory exists, closed, before dnsmasq starts (the guard unit's job).
        run_ok(std::process::Command::new(bin("ironguard-agent")).args([
            "guard",
            "install",
            "--backend",
            "dnsmasq-hostsdir",
            "--hostsdir",
            hosts.to_str().unwrap(),
        ]));
        let RelayedLan { relay_dnsmasq, nodes, far, relay, pxe } = RelayedLan::new(&dir, "hd", 93, n);
        let hostsdir = format!("--dhcp-hostsdir={}", hosts.display());
        let dnsmasq = dnsmasq(
            &pxe,
            &dir,
            "pxe",
            &[
                "--interface=br0",
                "--interface=s0",
                "--dhcp-authoritative",
                "--dhcp-range=10.93.0.100,10.93.0.200,255.255.255.0,1h",
                "--dhcp-range=10.93.1.100,10.93.1.200,255.255.255.0,1h",
                &hostsdir,
            ],
            67,
        );
        Self { dnsmasq, _relay_dnsmasq: relay_dnsmasq, nodes, far, _relay: relay, pxe, hosts, dir }
    }

    /// One client per (MAC, what it should get), on nodes 0.., at the same time. Here dnsmasq decides, not the
    /// kernel: read its files before a client that must get nothing.
    fn dhcp_all(&self, clients: &[(&str, Want)]) -> Vec<Option<Lease>> {
        let attempts: Vec<DhcpAttempt> = clients
            .iter()
            .enumerate()
            .map(|(i, (m, want))| dhcp_start(&self.nodes[i], "eth0", mac(m), *want))
            .collect();
        attempts.into_iter().map(DhcpAttempt::finish).collect()
    }

    fn dataplane(&self, backends: &str) -> String {
        format!("backends = {backends}\n[dataplane.hostsdir]\ndir = \"{}\"\n", self.hosts.display())
    }
}

fn file(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn served_by(l: &Option<Lease>) -> Option<String> {
    l.as_ref().map(|l| l.server_id.to_string())
}

/// The agent (backends = ["dnsmasq-hostsdir"]) leading with unknown MACs denied: dnsmasq serves the allowed MAC,
/// on the bridge and behind the relay (dnsmasq matches the relayed chaddr), and neither the denied nor an unknown
/// one; the files are exactly Ironic's. Someone opening the wildcard by hand is undone by the agent's read-back.
/// Killed with SIGKILL, the agent leaves the files serving — the documented gap — until `guard install` (the
/// unit's ExecStopPost) closes them.
#[test]
fn dnsmasq_serves_what_the_hostsdir_backend_writes() {
    let lan = HostsLan::new(3);
    let pxe = &lan.pxe;
    assert_eq!(file(&lan.hosts, "unknown_hosts_filter"), "*:*:*:*:*:*,ignore\n", "closed before dnsmasq started");
    assert_eq!(dhcp_refused(&lan.nodes[0], "eth0", mac(UNKNOWN)), None, "closed: nobody is served");

    let mut host =
        GuardedHost::start_without_nftables(pxe, &lan.dir, "br0", &lan.dataplane("[\"dnsmasq-hostsdir\"]"), "");
    let hosts = lan.hosts.clone();
    host.filter_until(pxe, "allow", mac(M1), || file(&hosts, M1) == format!("{M1}\n"));
    host.filter_until(pxe, "deny", mac(M2), || file(&hosts, M2) == format!("{M2},ignore\n"));
    assert_eq!(file(&lan.hosts, "unknown_hosts_filter"), "*:*:*:*:*:*,ignore\n", "policy deny");

    let r = lan.dhcp_all(&[(M1, Want::Lease), (M2, Want::Nothing), (UNKNOWN, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER), "allowed\n{}", lan.dnsmasq.proc.log_text());
    assert_eq!(r[1], None, "denied: ignored by dnsmasq");
    assert_eq!(r[2], None, "unknown under policy deny: ignored");
    assert!(dhcp(&lan.far, "eth0", mac(M1)).is_some(), "allowed behind the relay (dnsmasq matches the chaddr)");
    assert_eq!(dhcp_refused(&lan.far, "eth0", mac(M2)), None, "denied behind the relay");

    // A MAC that leaves the allow set keeps its file, rewritten to ignore (dnsmasq never forgets a record).
    host.filter_until(pxe, "remove", mac(M1), || file(&hosts, M1) == format!("{M1},ignore\n"));
    assert_eq!(dhcp_refused(&lan.nodes[0], "eth0", mac(M1)), None, "no longer allowed: ignored");
    host.filter_until(pxe, "allow", mac(M1), || file(&hosts, M1) == format!("{M1}\n"));

    // Tampering: the wildcard opened by hand. The read-back (every 5 s here) closes it again.
    std::fs::write(lan.hosts.join("unknown_hosts_filter"), "*:*:*:*:*:*\n").unwrap();
    let repaired =
        wait_for(DEADLINE, || (file(&hosts, "unknown_hosts_filter") == "*:*:*:*:*:*,ignore\n").then_some(()));
    assert!(repaired.is_some(), "the agent's read-back repairs the wildcard:\n{}", host.agent.log_text());
    assert_eq!(dhcp_refused(&lan.nodes[0], "eth0", mac(UNKNOWN)), None, "unknown ignored again");

    // SIGKILL: nothing in the kernel goes with the agent. The files still serve M1 — this is the gap the
    // documentation names — until `guard install` (ExecStopPost in the unit's drop-in) closes them.
    host.agent.signal(Signal::SIGKILL);
    assert!(host.agent.wait_exit(SETUP_DEADLINE).is_some(), "the killed agent is reaped");
    assert_eq!(
        served_by(&dhcp(&lan.nodes[0], "eth0", mac(M1))).as_deref(),
        Some(SERVER),
        "after SIGKILL the hostsdir alone still serves the allowed MAC"
    );
    let out = run_ok(std::process::Command::new(bin("ironguard-agent")).args([
        "guard",
        "install",
        "--backend",
        "dnsmasq-hostsdir",
        "--hostsdir",
        lan.hosts.to_str().unwrap(),
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("hostsdir closed"), "{out:?}");
    assert_eq!(file(&lan.hosts, M1), format!("{M1},ignore\n"));
    assert_eq!(dhcp_refused(&lan.nodes[0], "eth0", mac(M1)), None, "closed by guard install");
}

/// Follower and Blocked in dnsmasq's terms: with M1 allowed and unknown MACs allowed, both write every file and the
/// wildcard `ignore`, so dnsmasq serves nobody; a leader with unknown MACs allowed opens the wildcard and still ignores the denied MAC.
#[test]
fn a_follower_serves_nobody_and_a_leader_opens_the_wildcard() {
    let lan = HostsLan::new(2);
    let hold = |args: &[&str]| {
        let mut a =
            vec!["--backend", "dnsmasq-hostsdir", "--hostsdir", lan.hosts.to_str().unwrap(), "--interface", "br0"];
        a.extend(args);
        start_hold(&lan.pxe, &lan.dir, &a)
    };
    for mode in ["follower", "blocked"] {
        let mut h = hold(&["--mode", mode, "--unknown-mac-policy", "allow", "--allow", M1]);
        assert_eq!(file(&lan.hosts, M1), format!("{M1},ignore\n"), "{mode}");
        assert_eq!(file(&lan.hosts, "unknown_hosts_filter"), "*:*:*:*:*:*,ignore\n", "{mode}");
        let r = lan.dhcp_all(&[(M1, Want::Nothing), (UNKNOWN, Want::Nothing)]);
        assert_eq!(r, [None, None], "{mode}: dnsmasq serves nobody");
        h.signal(Signal::SIGTERM);
        assert!(h.wait_exit(SETUP_DEADLINE).is_some_and(|s| s.success()));
    }

    let mut h = hold(&["--mode", "leader", "--unknown-mac-policy", "allow", "--deny", M2]);
    assert_eq!(file(&lan.hosts, "unknown_hosts_filter"), "*:*:*:*:*:*\n");
    assert_eq!(file(&lan.hosts, M2), format!("{M2},ignore\n"));
    let r = lan.dhcp_all(&[(UNKNOWN, Want::Lease), (M2, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER), "policy allow: an unknown MAC is served");
    assert_eq!(r[1], None, "a denied MAC is not");
    // SIGTERM: the holder drops to Blocked, which closes every file.
    h.signal(Signal::SIGTERM);
    assert!(h.wait_exit(SETUP_DEADLINE).is_some_and(|s| s.success()));
    assert_eq!(file(&lan.hosts, "unknown_hosts_filter"), "*:*:*:*:*:*,ignore\n");
    assert_eq!(dhcp_refused(&lan.nodes[0], "eth0", mac(UNKNOWN)), None, "stopped: closed");
}

/// The recommended pairing: `backends = ["nftables", "dnsmasq-hostsdir"]`. Both are written; dnsmasq serves the
/// allowed MAC only; and when the agent is killed the kernel guard drops every DISCOVER at once, although the
/// files still say "serve".
#[test]
fn with_nftables_alongside_a_killed_agent_closes_at_once() {
    let lan = HostsLan::new(2);
    let pxe = &lan.pxe;
    let dataplane = lan.dataplane("[\"nftables\", \"dnsmasq-hostsdir\"]");
    let mut host = GuardedHost::start(pxe, &lan.dir, "br0", &dataplane, "");
    let hosts = lan.hosts.clone();
    host.filter_until(pxe, "allow", mac(M1), || {
        file(&hosts, M1) == format!("{M1}\n") && set_has(pxe, "allow_mac", mac(M1))
    });
    assert_kernel_refuses(pxe, mac(UNKNOWN));
    let r = lan.dhcp_all(&[(M1, Want::Lease), (UNKNOWN, Want::Nothing)]);
    assert_eq!(served_by(&r[0]).as_deref(), Some(SERVER));
    assert_eq!(r[1], None);
    host.agent.signal(Signal::SIGKILL);
    assert!(host.agent.wait_exit(SETUP_DEADLINE).is_some(), "the killed agent is reaped");
    assert_eq!(verdict(pxe), "CLOSED", "closed by the time the killed agent is reaped");
    assert_eq!(file(&lan.hosts, M1), format!("{M1}\n"), "the files still say serve");
    assert_eq!(no_dhcp(pxe, &lan.nodes[0], "eth0", mac(M1)), None, "the kernel guard closed DHCP at once");
}
