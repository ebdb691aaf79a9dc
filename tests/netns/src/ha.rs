//! A high-availability site: three (or more) PXE hosts on one provisioning bridge, each with its own dnsmasq
//! (distinct ranges and server identifiers) and agent; etcd and two control-plane replicas on a separate
//! management bridge. A partition is made by taking one host's management link down. With
//! [`HaOptions::ironic_conductors`] every PXE host also runs a real Ironic 39 conductor (one MariaDB, JSON-RPC;
//! [`IronicConductors`]) and the control planes filter for Ironic's own inspection.
//!
//! ```text
//!   ns "mgmt": br-mgmt 10.90.0.1/24 ── etcd :2379, control planes :9100 and :9110
//!   ns "pxeN": mgmt0 10.90.0.(10+N) ─ br-mgmt     prov0 10.80.0.(1+N) ─ br-prov ; dnsmasq, agent
//!   ns "prov": br-prov (L2 only)
//!   ns "nodeM": eth0 ─ br-prov ; DHCP clients
//! ```

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;

use crate::ironic_ha::{API_PORT, IronicConductors};
use crate::{
    ControlPlane, Dnsmasq, EtcdProcess, EtcdRelease, Lease, Netns, Proc, TempDir, assert_kernel_refuses, dhcp,
    dhcp_refused, run_ok, start_agent, verdict, veth, wait_for,
};

/// The DHCP server every PXE host of a site runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// dnsmasq on UDP sockets, filtered on the input hook.
    Dnsmasq,
    /// ISC dhcpd on AF_PACKET sockets, filtered at egress (`hooks = []`, `egress_interfaces = ["prov0"]`).
    Dhcpd,
}

/// How a host's DHCP server is (re)started: as the site wants it, or broken in one of the ways a server that
/// still holds its socket can serve nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerSetup {
    Normal,
    /// A range for another network only: nothing to offer on prov0.
    NoRange,
    /// A range of one address, leased to another client until long after the test.
    Exhausted,
    /// Listening on the management interface instead of prov0.
    WrongInterface,
}

/// One PXE host of the site.
#[derive(Debug)]
pub struct PxeHost {
    pub ns: Netns,
    /// The DHCP server (dnsmasq or ISC dhcpd, as the site's [`ServerKind`]).
    pub server: Proc,
    pub agent: Option<Proc>,
    pub ip: Ipv4Addr,
    pub id: String,
    config: String,
}

/// The whole site.
#[derive(Debug)]
pub struct HaSite {
    /// With [`HaOptions::ironic_conductors`]: one conductor per PXE host (index i on host i) and their MariaDB.
    /// First, so that it is dropped (its logs read, MariaDB stopped) while the namespaces and directory exist.
    pub ironic: Option<IronicConductors>,
    pub hosts: Vec<PxeHost>,
    pub nodes: Vec<Netns>,
    pub cps: Vec<ControlPlane>,
    /// etcd: the only member, or the first of a cluster ([`HaOptions::etcd_members`]).
    pub etcd: EtcdProcess,
    /// The other members of a cluster (none for one member).
    pub etcd_peers: Vec<EtcdProcess>,
    /// The client URLs of every member, as the agents and control planes are given them.
    pub etcd_endpoints: Vec<String>,
    pub mgmt: Netns,
    /// The namespaces of a cluster's members (none for one member, which runs in `mgmt`).
    pub etcd_ns: Vec<Netns>,
    pub prov: Netns,
    pub dir: TempDir,
    pub server: ServerKind,
    pub plan: DhcpPlan,
    /// The agents' TTL and margin.
    pub election: Election,
}

/// TTL and margin most HA tests run with ([`Election::TESTS`]): shorter than the agent's defaults, so that faults
/// that wait out a lease take less time; every safety property holds for any TTL and margin.
pub const TTL_SECS: u64 = 3;
pub const MARGIN_MS: u64 = 1000;

/// The agents' `[election]` TTL and margin on a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Election {
    pub ttl_secs: u64,
    pub margin_ms: u64,
}

impl Election {
    /// What most tests run with ([`TTL_SECS`], [`MARGIN_MS`]).
    pub const TESTS: Self = Self { ttl_secs: TTL_SECS, margin_ms: MARGIN_MS };
    /// The agent's defaults (`ElectionSection::default()`; `tests/ha.rs` checks they are the same).
    pub const DEFAULTS: Self = Self { ttl_secs: 5, margin_ms: 1500 };

    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }
}

/// Starts the site's etcd: one member in `mgmt` at 10.90.0.1, or a cluster of `members` (see
/// [`HaOptions::etcd_members`]), started together and waited for together (a member serves only once a quorum
/// runs). Returns the members' namespaces (none for one member), the members and their client URLs.
fn start_etcd(mgmt: &Netns, release: EtcdRelease, members: usize) -> (Vec<Netns>, Vec<EtcdProcess>, Vec<String>) {
    if members <= 1 {
        let etcd = EtcdProcess::start_in_release("ha", mgmt.name(), "10.90.0.1", 2379, 2380, release);
        return (Vec::new(), vec![etcd], vec!["http://10.90.0.1:2379".into()]);
    }
    let ips: Vec<String> = (0..members).map(|i| format!("10.90.0.{}", 21 + i)).collect();
    let initial = ips.iter().enumerate().map(|(i, ip)| format!("m{i}=http://{ip}:2380")).collect::<Vec<_>>().join(",");
    let token = crate::unique("etcd-cluster");
    let mut nss = Vec::new();
    let mut procs = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let ns = Netns::new(&format!("etcd{i}"));
        veth(&ns, "mgmt0", mgmt, &format!("e{i}"));
        mgmt.ip(&["link", "set", &format!("e{i}"), "master", "br-mgmt"]);
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "mgmt0"]);
        procs.push(EtcdProcess::launch_member(ns.name(), ip, &format!("m{i}"), &initial, &token, release));
        nss.push(ns);
    }
    for p in &procs {
        p.wait_up(Duration::from_secs(60));
    }
    let endpoints = ips.iter().map(|ip| format!("http://{ip}:2379")).collect();
    (nss, procs, endpoints)
}

/// How an HA site is set up.
#[derive(Debug, Clone)]
pub struct HaOptions {
    pub hosts: usize,
    pub nodes: usize,
    /// The control planes' unknown-MAC policy.
    pub policy: &'static str,
    /// The agents' `[controlplane] lost_after_secs`.
    pub lost_after_secs: u64,
    pub server: ServerKind,
    /// The etcd server's release.
    pub etcd: EtcdRelease,
    /// etcd's members: 1 runs in the management namespace at 10.90.0.1; more make a cluster, each member in a
    /// namespace of its own on the management bridge at 10.90.0.21, .22, … (so that one can be killed, cut off or
    /// paused alone), and every agent and control plane is given all of them.
    pub etcd_members: usize,
    /// The agents' TTL and margin.
    pub election: Election,
    /// A real Ironic 39 conductor on every PXE host (API on its management address and on the provisioning network,
    /// port [`API_PORT`]; one MariaDB; JSON-RPC), and the control planes following Ironic's own inspection
    /// (`[sync] ironic_inspection`) through host 0's API.
    pub ironic_conductors: bool,
}

impl Default for HaOptions {
    fn default() -> Self {
        Self {
            hosts: 3,
            nodes: 1,
            policy: "allow",
            lost_after_secs: 30,
            server: ServerKind::Dnsmasq,
            etcd: EtcdRelease::Debian12,
            etcd_members: 1,
            election: Election::TESTS,
            ironic_conductors: false,
        }
    }
}

/// How the provisioning network is addressed and split among the hosts' DHCP servers: the hosts' own addresses
/// are 10.80.0.(1+i) with `prefix_len`, and host i's dnsmasq leases the `per_host` addresses from `first` +
/// i·`per_host` on, a slice no other host's dnsmasq hands out (a hand-over leaves leases on the old host; see
/// docs/operations.md), with its own lease file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DhcpPlan {
    pub prefix_len: u8,
    pub first: Ipv4Addr,
    pub per_host: u32,
}

impl Default for DhcpPlan {
    /// 10.80.0.0/24, twenty addresses each from 10.80.0.100: 100–119, 120–139, 140–159.
    fn default() -> Self {
        Self { prefix_len: 24, first: Ipv4Addr::new(10, 80, 0, 100), per_host: 20 }
    }
}

impl DhcpPlan {
    /// The first and last address of host `i`'s slice.
    pub fn slice(&self, i: usize) -> (Ipv4Addr, Ipv4Addr) {
        let lo = u32::from(self.first) + i as u32 * self.per_host;
        (Ipv4Addr::from(lo), Ipv4Addr::from(lo + self.per_host - 1))
    }

    /// The network's mask, e.g. 255.255.255.0.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0))
    }

    /// dnsmasq's `--dhcp-range` for host `i`, with a lease of one hour.
    pub fn dnsmasq_range(&self, i: usize) -> String {
        let (lo, hi) = self.slice(i);
        format!("{lo},{hi},{},1h", self.netmask())
    }

    /// Whether `ip` lies in host `i`'s slice.
    pub fn holds(&self, i: usize, ip: Ipv4Addr) -> bool {
        let (lo, hi) = self.slice(i);
        (lo..=hi).contains(&ip)
    }
}

impl HaSite {
    pub fn new(n_hosts: usize, n_nodes: usize) -> Self {
        Self::with_options(HaOptions { hosts: n_hosts, nodes: n_nodes, ..Default::default() })
    }

    pub fn with_options(o: HaOptions) -> Self {
        Self::with_plan(o, DhcpPlan::default())
    }

    /// A site whose provisioning network is addressed and split as `plan` says.
    pub fn with_plan(o: HaOptions, plan: DhcpPlan) -> Self {
        let (n_hosts, n_nodes) = (o.hosts, o.nodes);
        let dir = TempDir::new("ha");
        let mgmt = Netns::new("mgmt");
        let prov = Netns::new("prov");
        mgmt.ip(&["link", "add", "br-mgmt", "type", "bridge", "forward_delay", "0"]);
        mgmt.ip(&["addr", "add", "10.90.0.1/24", "dev", "br-mgmt"]);
        mgmt.ip(&["link", "set", "br-mgmt", "up"]);
        prov.ip(&["link", "add", "br-prov", "type", "bridge", "forward_delay", "0"]);
        prov.ip(&["link", "set", "br-prov", "up"]);
        let (etcd_ns, mut members, etcd_endpoints) = start_etcd(&mgmt, o.etcd, o.etcd_members);
        let etcd = members.remove(0);
        let etcd_peers = members;
        let etcd_list = etcd_endpoints.join(",");
        let etcd_toml = etcd_endpoints.iter().map(|e| format!("\"{e}\"")).collect::<Vec<_>>().join(", ");
        let etcd_flag = ["--etcd", etcd_list.as_str()];
        // Ironic is reached through host 0's conductor, and the others' APIs when it does not answer (one database).
        let cp_config = dir.join("controlplane-ironic.toml");
        if o.ironic_conductors {
            let urls: Vec<String> = (0..n_hosts).map(|i| format!("http://10.90.0.{}:{API_PORT}", 10 + i)).collect();
            std::fs::write(&cp_config, ironic_cp_config(&urls))
                .expect("write the control planes' Ironic configuration");
        }
        let cp_config = cp_config.to_str().unwrap_or_default().to_string();
        let mut hosts = Vec::new();
        for i in 0..n_hosts {
            let ns = Netns::new(&format!("pxe{i}"));
            veth(&ns, "mgmt0", &mgmt, &format!("m{i}"));
            mgmt.ip(&["link", "set", &format!("m{i}"), "master", "br-mgmt"]);
            ns.ip(&["addr", "add", &format!("10.90.0.{}/24", 10 + i), "dev", "mgmt0"]);
            veth(&ns, "prov0", &prov, &format!("h{i}"));
            prov.ip(&["link", "set", &format!("h{i}"), "master", "br-prov"]);
            let ip = Ipv4Addr::new(10, 80, 0, 1 + i as u8);
            ns.ip(&["addr", "add", &format!("{ip}/{}", plan.prefix_len), "dev", "prov0"]);
            let server = start_server(&ns, &dir, o.server, &plan, i, ServerSetup::Normal);
            let id = format!("pxe-{i}");
            let dataplane = match o.server {
                ServerKind::Dnsmasq => "interfaces = [\"prov0\"]\n",
                ServerKind::Dhcpd => "interfaces = [\"prov0\"]\nhooks = []\negress_interfaces = [\"prov0\"]\n",
            };
            let config = format!(
                "[agent]\nid = \"{id}\"\nnetwork = \"prov\"\n\n[controlplane]\n{}endpoints = [\"https://10.90.0.1:9100\", \"https://10.90.0.1:9110\"]\n\
                 lost_after_secs = {}\nmax_backoff_ms = 500\nconnect_timeout_ms = 500\nsilence_timeout_secs = 4\nreport_interval_ms = 500\n\n\
                 [etcd]\nendpoints = [{etcd_toml}]\ndial_timeout_ms = 500\nrequest_timeout_ms = 500\n\n\
                 [election]\nttl_secs = {}\nmargin_ms = {}\n\n[dhcp_health]\ninterval_ms = 200\n\n\
                 [admin]\nlisten = \"127.0.0.1:9181\"\n\n[dataplane]\n{dataplane}",
                crate::pki::pki().agent_toml(&id),
                o.lost_after_secs,
                o.election.ttl_secs,
                o.election.margin_ms
            );
            hosts.push(PxeHost { ns, server, agent: None, ip, id, config });
        }
        let mut nodes = Vec::new();
        for j in 0..n_nodes {
            let node = Netns::new("node");
            veth(&node, "eth0", &prov, &format!("n{j}"));
            prov.ip(&["link", "set", &format!("n{j}"), "master", "br-prov"]);
            nodes.push(node);
        }
        // Before the agents: a host serves nobody until its agent leads, and Ironic's ports are then already known.
        let ironic = o.ironic_conductors.then(|| {
            let ips: Vec<String> = (0..n_hosts).map(|i| format!("10.90.0.{}", 10 + i)).collect();
            let members: Vec<(&Netns, &str)> =
                hosts.iter().map(|h| &h.ns).zip(ips.iter().map(String::as_str)).collect();
            // The API also on the provisioning network, where the ramdisk posts `/v1/continue_inspection`.
            IronicConductors::start(&members, &dir, CONDUCTOR_CONF)
        });
        // The control planes after Ironic: their first requests go to host 0's API, and stay there while it answers.
        let mut cps = Vec::new();
        for (grpc, admin) in [(9100u16, 9101u16), (9110, 9111)] {
            let mut extra: Vec<&str> = etcd_flag.to_vec();
            let rid = format!("cp-{grpc}");
            extra.extend(["--replica-id", rid.as_str(), "--unknown-mac-policy", o.policy]);
            if o.ironic_conductors {
                extra.extend(["--config", cp_config.as_str()]);
            }
            cps.push(ControlPlane::start_on(&mgmt, &dir, "10.90.0.1", grpc, admin, &extra));
        }
        let mut site = Self {
            ironic,
            hosts,
            nodes,
            cps,
            etcd,
            etcd_peers,
            etcd_endpoints,
            mgmt,
            etcd_ns,
            prov,
            dir,
            server: o.server,
            plan,
            election: o.election,
        };
        for i in 0..n_hosts {
            site.start_agent(i);
        }
        site
    }

    /// Stops host `i`'s DHCP server (SIGCONT first, in case it was frozen) and starts it again as `setup` says.
    pub fn restart_server(&mut self, i: usize, setup: ServerSetup) {
        let h = &mut self.hosts[i];
        h.server.signal(nix::sys::signal::Signal::SIGCONT);
        h.server.kill();
        h.server = start_server(&h.ns, &self.dir, self.server, &self.plan, i, setup);
    }

    /// Host `i` dies whole: its agent, its DHCP server and its Ironic conductor (if any) get SIGKILL at once.
    /// Returns when all three are gone.
    pub fn kill_host(&mut self, i: usize) {
        use nix::sys::signal::Signal::SIGKILL;
        let h = &mut self.hosts[i];
        let mut procs: Vec<&mut Proc> = vec![&mut h.server];
        procs.extend(h.agent.as_mut());
        if let Some(ironic) = self.ironic.as_mut() {
            procs.push(&mut ironic.conductors[i].proc);
        }
        for p in &procs {
            p.signal(SIGKILL);
        }
        for p in procs {
            p.wait_exit(crate::SETUP_DEADLINE);
        }
    }

    /// Host `i` back after [`HaSite::kill_host`]: its DHCP server, its conductor (same configuration and database;
    /// returns once its API answers) and its agent.
    pub fn revive_host(&mut self, i: usize) {
        let conductor = self.ironic.as_mut().map(|c| &mut c.conductors[i]);
        revive_host(&mut self.hosts[i], i, &self.dir, self.server, &self.plan, conductor);
    }

    pub fn start_agent(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        h.agent = Some(start_agent(&h.ns, &self.dir, &h.config, None));
    }

    /// Stops host `i`'s agent (SIGTERM) and starts it again with its configuration edited by `edit`, under
    /// `wrapper` if given (e.g. `unshare --uts` for a host name of its own).
    pub fn restart_agent_with(&mut self, i: usize, wrapper: Option<&[&str]>, edit: impl FnOnce(&str) -> String) {
        let h = &mut self.hosts[i];
        if let Some(mut p) = h.agent.take() {
            p.signal(nix::sys::signal::Signal::SIGTERM);
            p.wait_exit(EXIT_DEADLINE);
        }
        let config = edit(&h.config);
        h.agent = Some(start_agent(&h.ns, &self.dir, &config, wrapper));
    }

    /// The verdict of every host, in order.
    pub fn verdicts(&self) -> Vec<String> {
        self.hosts.iter().map(|h| verdict(&h.ns)).collect()
    }

    /// Index of the host whose kernel state says LEADER, if exactly one does.
    pub fn leader(&self) -> Option<usize> {
        let v = self.verdicts();
        let leaders: Vec<usize> = v.iter().enumerate().filter(|(_, v)| *v == "LEADER").map(|(i, _)| i).collect();
        (leaders.len() == 1).then(|| leaders[0])
    }

    /// Waits until exactly one host leads, other than `not` (if given).
    pub fn wait_leader(&self, not: Option<usize>, timeout: Duration) -> Option<(usize, Duration)> {
        let t = Instant::now();
        wait_for(timeout, || self.leader().filter(|l| Some(*l) != not).map(|l| (l, t.elapsed())))
    }

    /// Cuts (or restores) host `i`'s management link: etcd and the control planes become unreachable.
    pub fn partition(&self, i: usize, cut: bool) {
        self.hosts[i].ns.ip(&["link", "set", "mgmt0", if cut { "down" } else { "up" }]);
    }

    /// etcd's member `i` (0: [`HaSite::etcd`]).
    pub fn etcd_member(&mut self, i: usize) -> &mut EtcdProcess {
        match i {
            0 => &mut self.etcd,
            i => &mut self.etcd_peers[i - 1],
        }
    }

    /// Cuts (or restores) etcd member `i`'s only link (a cluster's member: from the other members and every client).
    pub fn cut_etcd_member(&self, i: usize, cut: bool) {
        self.etcd_ns[i].ip(&["link", "set", "mgmt0", if cut { "down" } else { "up" }]);
    }

    /// The member etcd's leader is, as the members that answer say (`etcdctl endpoint status`); `None` while none
    /// is elected or none answers.
    pub fn etcd_leader_member(&self) -> Option<usize> {
        let out = crate::faults::etcdctl(self, &["endpoint", "status", "-w", "json"]).ok()?;
        let statuses: serde_json::Value = serde_json::from_str(&out).ok()?;
        let statuses = statuses.as_array()?;
        let leader = statuses.iter().find_map(|s| s["Status"]["leader"].as_u64().filter(|l| *l != 0))?;
        let endpoint =
            statuses.iter().find(|s| s["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
                .as_str()?
                .to_string();
        self.etcd_endpoints.iter().position(|e| *e == endpoint)
    }

    /// One DHCP exchange from node `j` with `mac`, which should get a lease.
    pub fn dhcp(&self, j: usize, mac: MacAddr) -> Option<Lease> {
        dhcp(&self.nodes[j], "eth0", mac)
    }

    /// Whether every host's kernel refuses `mac` now (read back and judged as `ironguardctl explain --local` does).
    pub fn all_refuse(&self, mac: MacAddr) -> bool {
        self.hosts.iter().all(|h| !crate::kernel_decision(&h.ns, mac).served)
    }

    /// The negative proof from node `j`: every host's kernel refuses `mac` (read first), and one DISCOVER gets no
    /// offer. `None` unless one came anyway.
    pub fn dhcp_refused(&self, j: usize, mac: MacAddr) -> Option<Lease> {
        for h in &self.hosts {
            assert_kernel_refuses(&h.ns, mac);
        }
        dhcp_refused(&self.nodes[j], "eth0", mac)
    }

    /// Runs the scapy DHCP probe in node `j` for `seconds` (and at least `min_discovers` DISCOVERs), sending a
    /// DISCOVER every `interval` seconds.
    pub fn spawn_probe(
        &self,
        j: usize,
        mac: MacAddr,
        seconds: f64,
        interval: f64,
        min_discovers: usize,
    ) -> std::process::Child {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/dhcp_probe.py");
        self.nodes[j].ip(&["link", "set", "eth0", "address", &mac.to_string()]);
        self.nodes[j]
            .cmd("/usr/bin/python3")
            .arg(script)
            .args(["eth0", &mac.to_string(), &seconds.to_string(), &interval.to_string()])
            .arg(min_discovers.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the scapy probe (python3-scapy)")
    }
}

/// [`HaSite::revive_host`] from the site's parts, for a caller that holds other parts of the site borrowed (host
/// `h`, number `i`, and its conductor if the site has them).
pub fn revive_host(
    h: &mut PxeHost,
    i: usize,
    dir: &TempDir,
    kind: ServerKind,
    plan: &DhcpPlan,
    conductor: Option<&mut crate::ironic::RealIronic>,
) {
    h.server.signal(nix::sys::signal::Signal::SIGCONT);
    h.server.kill();
    h.server = start_server(&h.ns, dir, kind, plan, i, ServerSetup::Normal);
    if let Some(c) = conductor {
        c.restart(&h.ns);
    }
    h.agent = Some(start_agent(&h.ns, dir, &h.config, None));
}

/// The control planes' configuration for a site with Ironic conductors: Ironic at the first of `urls` and the
/// others when it does not answer (an HA Ironic without a VIP), its ports denied and its own inspection followed
/// quickly.
fn ironic_cp_config(urls: &[String]) -> String {
    let fallback = urls[1..].iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(", ");
    format!(
        "[ironic]\nurl = \"{}\"\nfallback_urls = [{fallback}]\ntimeout_ms = 5000\nretries = 3\nretry_backoff_ms = 100\n\n\
         [sync]\nironic_sync_secs = 1\nironic_inspection = true\nironic_inspection_period_ms = 300\n",
        urls[0]
    )
}

/// What every conductor of the site adds to its configuration: its API on every address (also the provisioning
/// network, where the ramdisk posts), and a dead conductor noticed within seconds rather than Ironic's minute
/// (heartbeat every 2 s, dead after 10 s, hash ring rebuilt every 3 s), so that its nodes move to a live one.
pub const CONDUCTOR_CONF: &str = "[api]\nhost_ip = 0.0.0.0\n\n[conductor]\nheartbeat_interval = 2\nheartbeat_timeout = 10\n\n\
                                  [DEFAULT]\nhash_ring_reset_interval = 3\n";

/// Starts host `i`'s DHCP server: its own slice of the plan's network, or broken as `setup` says.
fn start_server(ns: &Netns, dir: &TempDir, kind: ServerKind, plan: &DhcpPlan, i: usize, setup: ServerSetup) -> Proc {
    let (lo, hi) = plan.slice(i);
    let (lo, hi) = (lo.to_string(), hi.to_string());
    let mask = plan.netmask().to_string();
    let (iface, lo, hi) = match setup {
        ServerSetup::Normal => ("prov0", lo, hi),
        ServerSetup::NoRange => ("prov0", "10.99.0.100".to_string(), "10.99.0.119".to_string()),
        ServerSetup::Exhausted => ("prov0", lo.clone(), lo),
        ServerSetup::WrongInterface => ("mgmt0", format!("10.90.0.{}", 200 + i), format!("10.90.0.{}", 200 + i)),
    };
    // The one address of an exhausted range, leased to someone else for a long time.
    let taken = "52:54:00:99:99:99";
    match kind {
        ServerKind::Dnsmasq => {
            let tag = format!("dnsmasq-pxe{i}");
            let text = if setup == ServerSetup::Exhausted {
                let until =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
                        + 86_400;
                format!("{until} {taken} {lo} other *\n")
            } else {
                String::new()
            };
            std::fs::write(dir.join(&format!("{tag}.leases")), text).expect("write the dnsmasq lease file");
            let mask = if iface == "prov0" { mask } else { "255.255.255.0".to_string() };
            Dnsmasq::start_range(ns, dir, &tag, iface, &format!("{lo},{hi},{mask},1h"), &[]).proc
        }
        ServerKind::Dhcpd => {
            let leases = if setup == ServerSetup::Exhausted {
                format!(
                    "lease {lo} {{\n  starts 4 2026/01/01 00:00:00;\n  ends 4 2036/01/01 00:00:00;\n  binding state active;\n  \
                     hardware ethernet {taken};\n}}\n"
                )
            } else {
                String::new()
            };
            let net = Ipv4Addr::from(u32::from(plan.first) & u32::from(plan.netmask())).to_string();
            let mut subnets = vec![(net.as_str(), mask.as_str(), lo.as_str(), hi.as_str())];
            if setup == ServerSetup::WrongInterface {
                subnets = vec![("10.90.0.0", "255.255.255.0", lo.as_str(), hi.as_str())];
            }
            if setup == ServerSetup::NoRange {
                // dhcpd refuses to listen on an interface none of its subnets covers: declare prov0's without a
                // range, and the range in a network nobody is on
                subnets = vec![
                    (net.as_str(), mask.as_str(), "", ""),
                    ("10.99.0.0", "255.255.255.0", lo.as_str(), hi.as_str()),
                ];
            }
            crate::shapes::dhcpd_with_leases(ns, dir, &format!("pxe{i}"), &[iface], &subnets, &leases).proc
        }
    }
}

/// Parses the probe's output: per DISCOVER, the servers that offered.
pub fn probe_results(child: std::process::Child) -> Vec<(u64, Vec<String>)> {
    let out = child.wait_with_output().expect("probe");
    assert!(out.status.success(), "probe failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let servers = v["servers"].as_array()?.iter().filter_map(|s| s.as_str().map(String::from)).collect();
            Some((v["xid"].as_u64()?, servers))
        })
        .collect()
}

/// Samples every host's kernel state (leader rules present or not) from threads inside their namespaces.
#[derive(Debug)]
pub struct Watcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<(Instant, Instant, bool)>>>,
    progress: Vec<std::sync::Arc<std::sync::Mutex<Progress>>>,
}

/// How far one host's sampling thread has got, for tests that must know it has seen something before they stop it.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// When the latest read began.
    last_began: Option<Instant>,
    /// When the first read of the current run of open reads began, and how many reads that run has.
    open_since: Option<Instant>,
    open_reads: u32,
}

impl Watcher {
    pub fn start(hosts: &[PxeHost]) -> Self {
        Self::start_every(hosts, Duration::from_millis(2))
    }

    /// Reads every host's kernel state with `pause` between reads (a long run on a busy machine samples less
    /// often: each read costs CPU).
    pub fn start_every(hosts: &[PxeHost], pause: Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut progress = Vec::new();
        for h in hosts {
            let path = format!("/run/netns/{}", h.ns.name());
            let stop = stop.clone();
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Progress::default()));
            progress.push(seen.clone());
            threads.push(std::thread::spawn(move || {
                let f = std::fs::File::open(&path).expect("netns");
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let mut reader = ironguard_dataplane::ServingReader::open().expect("a netlink socket in the namespace");
                let mut samples = Vec::new();
                let mut errors = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match reader.serving() {
                        Ok(open) => {
                            samples.push((t0, Instant::now(), open));
                            let mut p = seen.lock().expect("watcher progress");
                            p.last_began = Some(t0);
                            if !open {
                                (p.open_since, p.open_reads) = (None, 0);
                            } else {
                                p.open_since.get_or_insert(t0);
                                p.open_reads += 1;
                            }
                        }
                        // The ruleset changed during the read: read again at once (no sample, not "closed").
                        Err(ironguard_dataplane::NftError::Unstable(_)) => continue,
                        // Any other failure is a failure of the watcher: never taken for "closed".
                        Err(e) => {
                            errors += 1;
                            eprintln!("watcher: reading the kernel state failed: {e}");
                        }
                    }
                    std::thread::sleep(pause);
                }
                assert_eq!(errors, 0, "the kernel watcher could not read a host's state {errors} times");
                samples
            }));
        }
        Self { stop, threads, progress }
    }

    fn wait_progress(&self, timeout: Duration, done: impl Fn(&[Progress]) -> bool) -> bool {
        wait_for(timeout, || {
            let now: Vec<Progress> = self.progress.iter().map(|p| *p.lock().expect("watcher progress")).collect();
            done(&now).then_some(())
        })
        .is_some()
    }

    /// Waits (up to `timeout`) until host `i` has been read open by at least two reads in a row, all begun after
    /// `after`: a run of certain openness that [`certain_runs`] keeps.
    pub fn wait_open(&self, i: usize, after: Instant, timeout: Duration) -> bool {
        self.wait_progress(timeout, |p| p[i].open_reads >= 2 && p[i].open_since.is_some_and(|t| t > after))
    }

    /// Waits (up to `timeout`) until every host has been read by a read that began after `t`.
    pub fn wait_read_after(&self, t: Instant, timeout: Duration) -> bool {
        self.wait_progress(timeout, |p| p.iter().all(|h| h.last_began.is_some_and(|b| b > t)))
    }

    /// The same as [`Watcher::start`] (for the benchmark, which wants the raw samples).
    pub fn start_raw(hosts: &[PxeHost]) -> Self {
        Self::start(hosts)
    }

    /// Stops sampling; returns every host's samples: (started, finished, open).
    pub fn finish_raw(self) -> Vec<Vec<(Instant, Instant, bool)>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().expect("watcher")).collect()
    }

    /// Stops sampling; returns per host the intervals during which it was certainly open, and the sample count.
    pub fn finish(self) -> (Vec<Vec<(Instant, Instant)>>, usize) {
        let samples = self.finish_raw();
        let n = samples.iter().map(|s| s.len()).sum();
        (certain_runs(&samples), n)
    }
}

/// Consecutive open samples of a host: certainly open from the end of the first to the start of the last.
pub fn certain_runs(samples: &[Vec<(Instant, Instant, bool)>]) -> Vec<Vec<(Instant, Instant)>> {
    samples
        .iter()
        .map(|host| {
            let mut runs = Vec::new();
            let mut cur: Option<(Instant, Instant)> = None;
            for &(ts, te, open) in host {
                match (open, &mut cur) {
                    (true, None) => cur = Some((te, ts)),
                    (true, Some(run)) => run.1 = ts,
                    (false, Some(_)) => runs.extend(cur.take()),
                    (false, None) => {}
                }
            }
            runs.extend(cur);
            runs.into_iter().filter(|(a, b)| b > a).collect()
        })
        .collect()
}

/// Instants at which two hosts were certainly open together: (host a, host b, overlap).
pub fn dual_open(runs: &[Vec<(Instant, Instant)>]) -> Vec<(usize, usize, Duration)> {
    let mut out = Vec::new();
    for a in 0..runs.len() {
        for b in a + 1..runs.len() {
            for ra in &runs[a] {
                for rb in &runs[b] {
                    let start = ra.0.max(rb.0);
                    let end = ra.1.min(rb.1);
                    if end > start {
                        out.push((a, b, end - start));
                    }
                }
            }
        }
    }
    out
}

/// How long [`signal_agent`] waits for the agent to exit: a deadline for a hung agent, not a figure (the HA
/// benchmark measures SIGTERM → exit).
pub const EXIT_DEADLINE: Duration = Duration::from_secs(30);

/// Kills a host's agent with `sig` and waits (up to [`EXIT_DEADLINE`]) for the process to exit.
pub fn signal_agent(h: &mut PxeHost, sig: nix::sys::signal::Signal) -> Option<std::process::ExitStatus> {
    let p = h.agent.as_mut()?;
    p.signal(sig);
    p.wait_exit(EXIT_DEADLINE)
}

/// `ironguardctl agents --json` from the management namespace.
pub fn agents_json(site: &HaSite) -> serde_json::Value {
    let out = run_ok(crate::ctl_cmd(&site.mgmt).args(["--controlplane", "https://10.90.0.1:9100", "agents", "--json"]));
    serde_json::from_slice(&out.stdout).expect("json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_plan_keeps_the_sites_ranges_and_no_two_slices_overlap() {
        let d = DhcpPlan::default();
        assert_eq!(d.dnsmasq_range(0), "10.80.0.100,10.80.0.119,255.255.255.0,1h");
        assert_eq!(d.dnsmasq_range(2), "10.80.0.140,10.80.0.159,255.255.255.0,1h");
        let big = DhcpPlan { prefix_len: 20, first: Ipv4Addr::new(10, 80, 1, 0), per_host: 1000 };
        assert_eq!(big.netmask(), Ipv4Addr::new(255, 255, 240, 0));
        assert_eq!(big.slice(0), (Ipv4Addr::new(10, 80, 1, 0), Ipv4Addr::new(10, 80, 4, 231)));
        assert_eq!(big.slice(1).0, Ipv4Addr::new(10, 80, 4, 232));
        for plan in [d, big] {
            for i in 0..3 {
                let (lo, hi) = plan.slice(i);
                assert!(plan.holds(i, lo) && plan.holds(i, hi));
                for j in (0..3).filter(|j| *j != i) {
                    assert!(!plan.holds(j, lo) && !plan.holds(j, hi), "slices {i} and {j} overlap");
                }
            }
        }
    }
}
