//! Traffic shapes beyond "dnsmasq on the PXE host, DHCPv4 on udp/67, input hook": a dnsmasq in its own namespace
//! (a container) that the PXE host bridges or routes to (the forward hook), proxyDHCP on udp/4011 and DHCPv6 on
//! udp/547. What their tests need besides the rest of the harness:
//!
//! * [`dnsmasq`]: a dnsmasq with exactly the DHCP arguments a shape needs (proxy mode, a DHCPv6 range, a relay),
//!   waited on until it listens on the port that shape uses;
//! * [`GuardedHost`]: a control plane (embedded store, unknown MACs denied) and a real agent with the shape's
//!   `[dataplane]` and `[dhcp_health]`, both on the PXE host;
//! * clients: [`dhcp6`] (ISC `dhclient -6`, a real DHCPv6 client), [`pxe_probe`] (a PXE ROM's udp/67 and udp/4011
//!   exchanges with a proxyDHCP server, scapy) and [`solicit_with_duid`] (one hand-made SOLICIT, scapy).

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use ironguard_dataplane::MacAddr;

use crate::{
    ControlPlane, Dnsmasq, Netns, Proc, SETUP_DEADLINE, TempDir, Transport, Want, agent_toml, bin, ctl, port_bound,
    run_ok, start_agent, unique, verdict, wait_for,
};

/// Fails the test unless every `(command, Debian package)` is installed: these shapes need more than
/// [`crate::require_privileges`] checks for.
pub fn require_tools(tools: &[(&str, &str)]) {
    crate::require_privileges();
    let missing: Vec<String> = tools
        .iter()
        .filter(|(tool, _)| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(tool, pkg)| format!("{tool} (Debian package {pkg})"))
        .collect();
    assert!(missing.is_empty(), "cannot set up the end-to-end test: missing {}", missing.join(", "));
}

/// Fails the test unless scapy imports in the system python (python3-scapy).
pub fn require_scapy() {
    static CHECK: OnceLock<bool> = OnceLock::new();
    let ok = *CHECK.get_or_init(|| {
        Command::new("/usr/bin/python3")
            .args(["-c", "import scapy.all, scapy.layers.dhcp6"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        ok,
        "cannot set up the end-to-end test: /usr/bin/python3 cannot import scapy (Debian package python3-scapy)"
    );
}

/// Turns IPv6 duplicate address detection off for the interfaces created in `ns` from now on, so that link-local
/// and static addresses are usable at once (a DHCPv6 client binds its link-local address as soon as it starts).
pub fn no_dad(ns: &Netns) {
    run_ok(ns.cmd("sysctl").args(["-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]));
}

/// Sets this namespace's `net.bridge.bridge-nf-call-iptables` and `-ip6tables` (per network namespace since Linux
/// 5.3; the host's own value is not touched). With them on, IPv4/IPv6 frames a bridge forwards traverse the
/// `inet` family's forward hook, as on a Kubernetes node. Fails the test when the kernel has no br_netfilter.
pub fn bridge_nf_call(ns: &Netns, on: bool) {
    let v = if on { "1" } else { "0" };
    let out = ns
        .cmd("sysctl")
        .args([
            "-w",
            &format!("net.bridge.bridge-nf-call-iptables={v}"),
            &format!("net.bridge.bridge-nf-call-ip6tables={v}"),
        ])
        .output()
        .expect("run sysctl");
    assert!(
        out.status.success(),
        "cannot set up the end-to-end test: net.bridge.bridge-nf-call-iptables is missing in the namespace: this \
         kernel has no br_netfilter loaded (modprobe br_netfilter; ironguard's tests never load modules): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now = ns.cmd("sysctl").args(["-n", "net.bridge.bridge-nf-call-iptables"]).output().expect("run sysctl");
    assert_eq!(String::from_utf8_lossy(&now.stdout).trim(), v, "bridge-nf-call-iptables did not take in {}", ns.name());
}

/// The value of `net.bridge.bridge-nf-call-iptables` outside every test namespace (the host's), if it exists.
pub fn host_bridge_nf_call_iptables() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables").ok().map(|s| s.trim().to_string())
}

/// Where [`dnsmasq`] with this tag writes its pid (a path in the shared file system: an agent in another namespace
/// checks it with `[dhcp_health] pid_file`, as a PXE host does for a containerized dnsmasq).
pub fn dnsmasq_pid_file(dir: &TempDir, tag: &str) -> PathBuf {
    dir.join(&format!("dnsmasq-{tag}.pid"))
}

/// Starts a dnsmasq in `ns` with the common options (foreground, no DNS, log to its log file) and `args`, and
/// waits until something listens on udp/`port` there.
pub fn dnsmasq(ns: &Netns, dir: &TempDir, tag: &str, args: &[&str], port: u16) -> Dnsmasq {
    let mut cmd = ns.cmd("dnsmasq");
    cmd.args(["--keep-in-foreground", "--conf-file=/dev/null", "--port=0", "--user=root", "--log-facility=-"])
        .args(["--log-dhcp", "--no-ping"])
        .arg(format!("--dhcp-leasefile={}", dir.join(&format!("dnsmasq-{tag}.leases")).display()))
        .arg(format!("--pid-file={}", dnsmasq_pid_file(dir, tag).display()))
        .args(args);
    let mut proc = Proc::spawn(&format!("dnsmasq {tag}"), cmd, dir.join(&format!("dnsmasq-{tag}.log")));
    let listening = wait_for(SETUP_DEADLINE, || port_bound(ns, Transport::Udp, port).then_some(()));
    assert!(
        listening.is_some() && proc.running(),
        "dnsmasq {tag} did not start listening on udp/{port}:\n{}",
        proc.log_text()
    );
    Dnsmasq { proc }
}

/// Gives `iface` in `node` the address `mac` (down, set, up), as a node's NIC would have it.
pub fn set_mac(node: &Netns, iface: &str, mac: MacAddr) {
    node.ip(&["link", "set", iface, "down"]);
    node.ip(&["link", "set", iface, "address", &mac.to_string()]);
    node.ip(&["link", "set", iface, "up"]);
}

/// A PXE host guarded by the real agent, with a real control plane (embedded store, `--unknown-mac-policy deny`)
/// on its loopback. Dropped in field order: the agent, then the control plane.
#[derive(Debug)]
pub struct GuardedHost {
    pub agent: Proc,
    pub cp: ControlPlane,
    ns: String,
}

/// The agent's admin endpoint in a [`GuardedHost`] (the PXE host namespace's loopback).
pub const AGENT_ADMIN: &str = "127.0.0.1:9181";

impl GuardedHost {
    /// Starts both. `dataplane`: lines appended to the agent's `[dataplane]` section, which already names
    /// `interface`; `dhcp_health`: lines put at the top of its `[dhcp_health]` section. Waits until the agent leads.
    pub fn start(pxe: &Netns, dir: &TempDir, interface: &str, dataplane: &str, dhcp_health: &str) -> Self {
        Self::start_with(pxe, dir, interface, dataplane, dhcp_health, |toml| toml)
    }

    /// Like [`GuardedHost::start`], with the agent's whole configuration edited by `edit` last.
    pub fn start_with(
        pxe: &Netns,
        dir: &TempDir,
        interface: &str,
        dataplane: &str,
        dhcp_health: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        let cp = ControlPlane::start(pxe, dir, 9100, 9101, &["--unknown-mac-policy", "deny"]);
        let toml = edit(Self::agent_config(&cp, interface, dataplane, dhcp_health));
        let agent = start_agent(pxe, dir, &toml, None);
        let host = Self { agent, cp, ns: pxe.name().to_string() };
        host.wait_verdict(pxe, "LEADER", Duration::from_secs(30));
        host
    }

    /// Like [`GuardedHost::start`] for backends that keep nothing in nftables (the dnsmasq hostsdir): waits until
    /// the agent's own `ironguard_agent_mode` metric says Leader.
    pub fn start_without_nftables(
        pxe: &Netns,
        dir: &TempDir,
        interface: &str,
        dataplane: &str,
        dhcp_health: &str,
    ) -> Self {
        let cp = ControlPlane::start(pxe, dir, 9100, 9101, &["--unknown-mac-policy", "deny"]);
        let agent = Self::start_agent(pxe, dir, &cp, interface, dataplane, dhcp_health);
        let host = Self { agent, cp, ns: pxe.name().to_string() };
        host.wait_mode(pxe, 3, Duration::from_secs(30));
        host
    }

    /// Waits until the agent's `ironguard_agent_mode` metric is `mode` (1 blocked, 2 follower, 3 leader).
    pub fn wait_mode(&self, pxe: &Netns, mode: u32, timeout: Duration) {
        let got = wait_for(timeout, || {
            (crate::metric(pxe, AGENT_ADMIN, "ironguard_agent_mode") == Some(f64::from(mode))).then_some(())
        });
        assert!(got.is_some(), "the agent's mode never became {mode}:\n{}", self.agent.log_text());
    }

    /// `ironguardctl filters allow|deny MAC`, then waits until `done` says the dataplane has it.
    pub fn filter_until(&self, pxe: &Netns, verb: &str, mac: MacAddr, done: impl Fn() -> bool) {
        let m = mac.to_string();
        let out = ctl(pxe, &["--controlplane", &self.cp.url(), "filters", verb, &m]);
        assert!(out.status.success(), "ironguardctl filters {verb} {m}: {out:?}");
        let got = wait_for(Duration::from_secs(30), || done().then_some(()));
        assert!(got.is_some(), "{m} never reached the {verb} set:\n{}", self.agent.log_text());
    }

    /// Starts (or restarts) the agent against this control plane.
    pub fn start_agent(
        pxe: &Netns,
        dir: &TempDir,
        cp: &ControlPlane,
        interface: &str,
        dataplane: &str,
        dhcp_health: &str,
    ) -> Proc {
        start_agent(pxe, dir, &Self::agent_config(cp, interface, dataplane, dhcp_health), None)
    }

    fn agent_config(cp: &ControlPlane, interface: &str, dataplane: &str, dhcp_health: &str) -> String {
        agent_toml("agent-1", &cp.url(), interface, AGENT_ADMIN, 30).replacen(
            "[dhcp_health]\n",
            &format!("[dhcp_health]\n{dhcp_health}"),
            1,
        ) + dataplane
    }

    /// Waits until `ironguardctl chains` says `want` for the PXE host.
    pub fn wait_verdict(&self, pxe: &Netns, want: &str, timeout: Duration) {
        assert_eq!(pxe.name(), self.ns);
        let got = wait_for(timeout, || (verdict(pxe) == want).then_some(()));
        assert!(got.is_some(), "verdict never became {want} (now {}):\n{}", verdict(pxe), self.agent.log_text());
    }

    /// `ironguardctl filters allow|deny MAC`, then waits until the leader's kernel sets hold it (the chaddr set on
    /// the reply side when there is one, else the Ethernet-source set).
    pub fn filter(&self, pxe: &Netns, verb: &str, mac: MacAddr) {
        let m = mac.to_string();
        let out = ctl(pxe, &["--controlplane", &self.cp.url(), "filters", verb, &m]);
        assert!(out.status.success(), "ironguardctl filters {verb} {m}: {out:?}");
        let got = wait_for(Duration::from_secs(30), || {
            let j = elements_json(pxe);
            let (table, set) = match (j["egress_owned"].is_null(), verb == "allow") {
                (true, true) => ("owned", "allow_mac"),
                (true, false) => ("owned", "deny_mac"),
                (false, true) => ("egress_owned", "allow_chaddr"),
                (false, false) => ("egress_owned", "deny_chaddr"),
            };
            members_of(&j, table, set, mac).then_some(())
        });
        assert!(got.is_some(), "{m} never reached the {verb} set:\n{}", self.agent.log_text());
    }
}

/// `ironguardctl chains --json --elements` of `ns`.
fn elements_json(ns: &Netns) -> serde_json::Value {
    let out = run_ok(Command::new(bin("ironguardctl")).args(["chains", "--json", "--elements", "--netns", ns.name()]));
    serde_json::from_slice(&out.stdout).expect("ironguardctl chains --json prints JSON")
}

fn members_of(j: &serde_json::Value, table: &str, set: &str, mac: MacAddr) -> bool {
    let want = mac.to_string();
    j[table]["sets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == set)
        .any(|s| s["members"].as_array().is_some_and(|m| m.iter().any(|x| x.as_str() == Some(want.as_str()))))
}

/// Whether the agent's kernel set `set` holds `mac` (read with `ironguardctl chains --elements`): `table` is
/// `owned` (the request side) or `egress_owned` (the reply side).
pub fn set_has_in(ns: &Netns, table: &str, set: &str, mac: MacAddr) -> bool {
    members_of(&elements_json(ns), table, set, mac)
}

/// Whether the request side's kernel set `set` holds `mac`.
pub fn set_has(ns: &Netns, set: &str, mac: MacAddr) -> bool {
    set_has_in(ns, "owned", set, mac)
}

/// The packet counter of the rule with `comment` in chain `chain` of `table` ("guard" or "owned") in
/// `ironguardctl chains --json`; 0 when the rule is absent.
pub fn rule_packets(ns: &Netns, table: &str, chain: &str, comment: &str) -> u64 {
    let j = crate::chains_json(ns);
    j[table]["chains"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == chain)
        .flat_map(|c| c["rules"].as_array().into_iter().flatten())
        .filter(|r| r["comment"] == comment)
        .filter_map(|r| r["packets"].as_u64())
        .sum()
}

/// The names of the base chains of `table` ("guard" or "owned") in `ironguardctl chains --json`.
pub fn chain_names(ns: &Netns, table: &str) -> Vec<String> {
    let j = crate::chains_json(ns);
    j[table]["chains"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str().map(String::from)).collect()
}

/// A DHCPv6 lease: the address and the server's DUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease6 {
    pub ip: Ipv6Addr,
    pub server_duid: String,
}

/// How long `dhclient -6` solicits for a lease before it gives up (it exits about a second later); it ends at the
/// first lease, so the long window costs nothing unless the test fails.
pub const DHCP6_TIMEOUT_SECS: u32 = 10;
/// The same for a client that must get nothing ([`Want::Nothing`]): its first SOLICIT leaves up to a second after
/// it starts (RFC 8415's random delay), and the second one a second later.
pub const DHCP6_REFUSED_TIMEOUT_SECS: u32 = 2;

/// A `dhclient -6` run in progress.
#[derive(Debug)]
pub struct Dhcp6Attempt {
    child: Child,
    out: PathBuf,
    pid: PathBuf,
    pub mac: MacAddr,
}

/// Gives `iface` in `node` the address `mac`, waits for its link-local address, and starts ISC `dhclient -6` for
/// one address (`-1`: try once, give up after [`DHCP6_TIMEOUT_SECS`], or [`DHCP6_REFUSED_TIMEOUT_SECS`] for a client
/// that must get nothing) with a fresh lease file, so its DUID (DUID-LLT) is made from `mac`. `dir` holds its
/// files. Collect the result with [`Dhcp6Attempt::finish`].
pub fn dhcp6_start(node: &Netns, dir: &TempDir, iface: &str, mac: MacAddr, want: Want) -> Dhcp6Attempt {
    require_tools(&[("dhclient", "isc-dhcp-client")]);
    set_mac(node, iface, mac);
    let ll = wait_for(SETUP_DEADLINE, || {
        let out = node.ip(&["-6", "-o", "addr", "show", "dev", iface, "scope", "link"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text.contains("fe80::") && !text.contains("tentative")).then_some(())
    });
    assert!(ll.is_some(), "{iface} in {} has no usable link-local address", node.name());
    let tag = unique("dhclient6");
    let file = |ext: &str| dir.join(&format!("{tag}.{ext}"));
    let (conf, script, out, lease, pid) = (file("conf"), file("sh"), file("out"), file("leases"), file("pid"));
    let timeout = match want {
        Want::Lease => DHCP6_TIMEOUT_SECS,
        Want::Nothing => DHCP6_REFUSED_TIMEOUT_SECS,
    };
    std::fs::write(&conf, format!("timeout {timeout};\n")).expect("write dhclient.conf");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$reason\" = BOUND6 ] && echo \"LEASE6 $new_ip6_address $new_dhcp6_server_id\" >> '{}'\nexit 0\n",
            out.display()
        ),
    )
    .expect("write dhclient script");
    run_ok(Command::new("chmod").arg("755").arg(&script));
    let child = node
        .cmd("dhclient")
        .args(["-6", "-1", "-cf"])
        .arg(&conf)
        .arg("-lf")
        .arg(&lease)
        .arg("-pf")
        .arg(&pid)
        .arg("-sf")
        .arg(&script)
        .arg(iface)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dhclient -6 (isc-dhcp-client)");
    Dhcp6Attempt { child, out, pid, mac }
}

impl Dhcp6Attempt {
    /// Waits for the client; `Some(lease)` if it got one (the daemon it leaves behind is then killed).
    pub fn finish(self) -> Option<Lease6> {
        let out = self.child.wait_with_output().expect("wait dhclient -6");
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let lease = text.lines().find_map(|l| {
            let mut f = l.strip_prefix("LEASE6 ")?.split_whitespace();
            Some(Lease6 { ip: f.next()?.parse().ok()?, server_duid: f.next()?.to_string() })
        });
        // On success dhclient forks a daemon that keeps the lease; it is ours: end it by its pid.
        if let Some(pid) = std::fs::read_to_string(&self.pid).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let code = out.status.code();
        assert!(
            (code == Some(0) && lease.is_some()) || (code == Some(2) && lease.is_none()),
            "dhclient -6 for {} exit status {} disagrees with its output {text:?}:\n{}",
            self.mac,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        lease
    }
}

/// One DHCPv6 exchange (SOLICIT … REPLY) with `mac`, which should get a lease: `Some(lease)`, or `None` after
/// [`DHCP6_TIMEOUT_SECS`].
pub fn dhcp6(node: &Netns, dir: &TempDir, iface: &str, mac: MacAddr) -> Option<Lease6> {
    dhcp6_start(node, dir, iface, mac, Want::Lease).finish()
}

/// The DHCPv6 negative proof on the PXE host `pxe`: its kernel refuses `mac` (read first), and `dhclient -6` from
/// `node` gets nothing within [`DHCP6_REFUSED_TIMEOUT_SECS`]. `None` unless it got a lease anyway.
pub fn no_dhcp6(pxe: &Netns, node: &Netns, dir: &TempDir, iface: &str, mac: MacAddr) -> Option<Lease6> {
    crate::assert_kernel_refuses(pxe, mac);
    dhcp6_start(node, dir, iface, mac, Want::Nothing).finish()
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name)
}

/// What [`pxe_probe`] saw of a proxyDHCP server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PxeProbe {
    /// A proxy OFFER answered the PXE DISCOVER on udp/67.
    pub offer: bool,
    pub offer_server: Option<String>,
    /// The boot item types the offer's PXE boot menu lists.
    pub boot_types: Vec<u16>,
    /// The server ACKed the boot item REQUEST sent to its udp/4011.
    pub ack: bool,
    /// The boot file that ACK names.
    pub ack_file: Option<String>,
}

/// How long [`pxe_probe_start`] waits for an answer it wants ([`Want::Lease`]); the wait ends at the answer.
pub const PXE_PROBE_TIMEOUT_SECS: u32 = 10;
/// How long it waits for an answer that must not come ([`Want::Nothing`]).
pub const PXE_PROBE_REFUSED_SECS: u32 = 1;

fn pxe_wait(want: Want) -> u32 {
    match want {
        Want::Lease => PXE_PROBE_TIMEOUT_SECS,
        Want::Nothing => PXE_PROBE_REFUSED_SECS,
    }
}

/// A [`pxe_probe`] in progress.
#[derive(Debug)]
pub struct PxeProbeRun {
    child: Child,
    mac: MacAddr,
}

/// Gives `iface` in `node` the address `mac` and starts the two exchanges of a PXE ROM with the proxyDHCP `server`
/// (`scripts/pxe_probe.py`): DISCOVER to udp/67 (broadcast), then a boot item REQUEST to `server`:4011 (unicast
/// from the interface's IPv4 address, which the caller gives it). `offer` and `ack` say whether an answer is wanted
/// to each, which sets how long the probe waits for it. Collect with [`PxeProbeRun::finish`].
pub fn pxe_probe_start(node: &Netns, iface: &str, mac: MacAddr, server: &str, offer: Want, ack: Want) -> PxeProbeRun {
    require_scapy();
    crate::set_mac_up(node, iface, mac);
    let child = node
        .cmd("/usr/bin/python3")
        .arg(script("pxe_probe.py"))
        .args([iface, &mac.to_string(), server, &pxe_wait(offer).to_string(), &pxe_wait(ack).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/pxe_probe.py (python3-scapy)");
    PxeProbeRun { child, mac }
}

impl PxeProbeRun {
    pub fn finish(self) -> PxeProbe {
        let out = self.child.wait_with_output().expect("wait pxe_probe.py");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "pxe_probe.py for {} failed: {text}\n{}",
            self.mac,
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("pxe_probe.py printed {text:?}: {e}"));
        PxeProbe {
            offer: j["offer"] == true,
            offer_server: j["offer_server"].as_str().map(String::from),
            boot_types: j["boot_types"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_u64())
                .map(|t| t as u16)
                .collect(),
            ack: j["ack"] == true,
            ack_file: j["ack_file"].as_str().map(String::from),
        }
    }
}

/// Both exchanges of a PXE ROM with a proxyDHCP server, from `mac` (see [`pxe_probe_start`]).
pub fn pxe_probe(node: &Netns, iface: &str, mac: MacAddr, server: &str, offer: Want, ack: Want) -> PxeProbe {
    pxe_probe_start(node, iface, mac, server, offer, ack).finish()
}

/// What [`solicit_with_duid`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solicit {
    pub advertise: bool,
    /// The Ethernet source the SOLICIT left from.
    pub src_mac: String,
    /// The six bytes 28 bytes into the DHCPv6 message (where BOOTP's chaddr sits), in hex.
    pub at_chaddr_offset: String,
}

/// One SOLICIT from `iface`'s own MAC whose client identifier is a DUID-LL naming `duid_mac`, laid out so that
/// `duid_mac` sits where a DHCPv4 packet has its chaddr (`scripts/dhcp6_solicit.py`); reports the ADVERTISE, waited
/// for as long as `want` says.
pub fn solicit_with_duid(node: &Netns, iface: &str, duid_mac: MacAddr, want: Want) -> Solicit {
    require_scapy();
    let out = node
        .cmd("/usr/bin/python3")
        .arg(script("dhcp6_solicit.py"))
        .args([iface, &duid_mac.to_string(), &pxe_wait(want).to_string()])
        .output()
        .expect("run scripts/dhcp6_solicit.py (python3-scapy)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "dhcp6_solicit.py failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("dhcp6_solicit.py printed {text:?}: {e}"));
    Solicit {
        advertise: j["advertise"] == true,
        src_mac: j["src_mac"].as_str().unwrap_or_default().to_string(),
        at_chaddr_offset: j["at_chaddr_offset"].as_str().unwrap_or_default().to_string(),
    }
}

/// A running ISC dhcpd (`isc-dhcp-server`): it reads and writes its interfaces through AF_PACKET sockets (Linux
/// packet filter), so it sees a DISCOVER before any netfilter hook runs.
#[derive(Debug)]
pub struct Dhcpd {
    pub proc: Proc,
}

/// Starts ISC dhcpd in `ns` on `interfaces`, authoritative, with `subnets` (`(network, netmask, first, last)`; an
/// empty `first` declares the subnet without a range, as dhcpd wants for an interface it serves nobody on), and
/// waits until it listens on udp/67 (its fallback socket, which relayed requests also reach).
pub fn dhcpd(ns: &Netns, dir: &TempDir, tag: &str, interfaces: &[&str], subnets: &[(&str, &str, &str, &str)]) -> Dhcpd {
    dhcpd_with_leases(ns, dir, tag, interfaces, subnets, "")
}

/// [`dhcpd`] with a lease file that starts with `leases` (dhcpd.leases(5) text).
pub fn dhcpd_with_leases(
    ns: &Netns,
    dir: &TempDir,
    tag: &str,
    interfaces: &[&str],
    subnets: &[(&str, &str, &str, &str)],
    leases: &str,
) -> Dhcpd {
    require_tools(&[("dhcpd", "isc-dhcp-server")]);
    let file = |ext: &str| dir.join(&format!("dhcpd-{tag}.{ext}"));
    let mut conf = String::from("default-lease-time 600;\nmax-lease-time 600;\nauthoritative;\nping-check false;\n");
    for (net, mask, first, last) in subnets {
        let range = if first.is_empty() { String::new() } else { format!(" range {first} {last};") };
        conf.push_str(&format!("subnet {net} netmask {mask} {{{range} }}\n"));
    }
    std::fs::write(file("conf"), conf).expect("write dhcpd.conf");
    std::fs::write(file("leases"), leases).expect("write dhcpd leases");
    let mut cmd = ns.cmd("dhcpd");
    cmd.args(["-4", "-f", "-d", "--no-pid", "-cf"]).arg(file("conf")).arg("-lf").arg(file("leases")).args(interfaces);
    let mut proc = Proc::spawn(&format!("dhcpd {tag}"), cmd, file("log"));
    let listening = wait_for(SETUP_DEADLINE, || {
        (port_bound(ns, Transport::Udp, 67) && proc.log_text().contains("Sending on")).then_some(())
    });
    assert!(listening.is_some() && proc.running(), "dhcpd {tag} did not start:\n{}", proc.log_text());
    Dhcpd { proc }
}

/// A PXE host with a bridge `br0` (`10.NET.0.1/24`) holding `n` nodes, and a DHCP relay (a dnsmasq with
/// `--dhcp-relay`) on `10.NET.2.2` ↔ `10.NET.1.1` with one node, `far`, behind it; the PXE host routes
/// `10.NET.1.0/24` to the relay through `s0` (`10.NET.2.1/24`):
///
/// ```text
/// nodes[i] --(eth0 | p{i})-- br0 [pxe] s0 --(s0 | r1)-- relay --(r0 | eth0)-- far
/// ```
///
/// The DHCP server on the PXE host is the caller's (serving `10.NET.0.0/24` on br0 and `10.NET.1.0/24` through s0).
#[derive(Debug)]
pub struct RelayedLan {
    // Dropped in field order: the relay's dnsmasq (its log printed if the test failed), then the namespaces.
    pub relay_dnsmasq: Dnsmasq,
    pub nodes: Vec<Netns>,
    pub far: Netns,
    pub relay: Netns,
    pub pxe: Netns,
}

impl RelayedLan {
    pub fn new(dir: &TempDir, tag: &str, net: u8, n: usize) -> Self {
        let a = |host: &str| format!("10.{net}.{host}");
        let pxe = Netns::new(&format!("{tag}pxe"));
        pxe.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
        pxe.ip(&["addr", "add", &a("0.1/24"), "dev", "br0"]);
        pxe.ip(&["link", "set", "br0", "up"]);
        let nodes: Vec<Netns> = (0..n)
            .map(|i| {
                let node = Netns::new(&format!("{tag}node"));
                crate::veth(&node, "eth0", &pxe, &format!("p{i}"));
                pxe.ip(&["link", "set", &format!("p{i}"), "master", "br0"]);
                node
            })
            .collect();
        let relay = Netns::new(&format!("{tag}relay"));
        let far = Netns::new(&format!("{tag}far"));
        crate::veth(&far, "eth0", &relay, "r0");
        crate::veth(&relay, "r1", &pxe, "s0");
        relay.ip(&["addr", "add", &a("1.1/24"), "dev", "r0"]);
        relay.ip(&["addr", "add", &a("2.2/24"), "dev", "r1"]);
        pxe.ip(&["addr", "add", &a("2.1/24"), "dev", "s0"]);
        pxe.ip(&["route", "add", &a("1.0/24"), "via", &a("2.2")]);
        let relay_to = format!("--dhcp-relay={},{}", a("1.1"), a("2.1"));
        let relay_dnsmasq = dnsmasq(&relay, dir, "relay", &["--interface=r0", "--interface=r1", &relay_to], 67);
        Self { relay_dnsmasq, nodes, far, relay, pxe }
    }
}
