//! Ironic's own inspection of many nodes at once through the HA site with three conductors (issue 24's production
//! shape): the nodes enrolled and set up by [`enroll_nodes`], one round of inspections by [`run_round`], with a
//! fault mid-run ([`SiteFault`]). The test (`tests/ironic_ha.rs`) runs a round; `ironguard-bench site` repeats them
//! and reports the figures of [`RoundReport`].
//!
//! A round, as a site lives it:
//! - every inspected node is put in `inspect` through one of the conductors' APIs (in turn), and its namespace then
//!   boots as a ramdisk would: DHCP (busybox udhcpc, again until a lease comes), then ironic-python-agent's callback
//!   `POST /v1/continue_inspection` to the API of the host that leased it. A callback that finds no API there
//!   (its host died), a 5xx (the node's conductor died and Ironic has not moved it yet) or a 409 (the node is
//!   locked by a conductor's other task: "please retry") is sent again, a second later, to the next host's API:
//!   ironic-python-agent retries on a 5xx and a 409 (`ironic_python_agent/inspector.py`), and a VIP in front of the
//!   conductors gives a real ramdisk the next API. The node is
//!   done when Ironic has it back in `manageable` with its data processed.
//! - meanwhile the nodes Ironic does not inspect (enroll, manageable, available, active, maintenance) and a stranger
//!   no one enrolled ask for DHCP every 2 s, and a probe node that Ironic inspects but whose ramdisk never reports
//!   sends a DISCOVER every 100 ms: each must be answered by one server at most.
//! - the fault: when a third of the nodes have posted their data, the host that leads then dies whole (agent, dnsmasq
//!   and conductor SIGKILLed), or one conductor that does not share the leader's host restarts. A node whose data the
//!   dead conductor was processing stays `inspecting`: Ironic fails such a node only when that conductor starts
//!   again. Once one has waited 20 s, the dead host is brought back (dnsmasq, conductor, agent), as its operator
//!   would, and the node is inspected again.
//!
//! What the round measures comes from the real parts: leases from udhcpc, offers and acknowledgements from every
//! dnsmasq's own log (`--log-dhcp`: per exchange id), double offers from the probe's capture, openness from every
//! host's kernel, Ironic's requests from the control planes' metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;
use serde_json::json;

use crate::ha::{HaSite, Watcher, certain_runs, dual_open, probe_results};
use crate::ironic::{RestClient, ipa_inventory};
use crate::ironic_ha::API_PORT;
use crate::{DhcpAttempt, Lease, Netns, Want, dhcp_start, mac, metric, set_mac_up, wait_for};

/// The states of the nodes Ironic does not inspect, in turn.
pub const OTHER_STATES: [&str; 5] = ["enroll", "manageable", "available", "active", "maintenance"];

/// How long a node may wait in `inspecting` under a dead conductor before the dead host is brought back.
const STUCK_FOR: Duration = Duration::from_secs(20);

/// The one host whose kernel says it leads (as `ironguardctl chains` reads it), if exactly one does.
fn current_leader(hosts: &[crate::ha::PxeHost]) -> Option<usize> {
    let leaders: Vec<usize> =
        hosts.iter().enumerate().filter(|(_, h)| crate::verdict(&h.ns) == "LEADER").map(|(i, _)| i).collect();
    (leaders.len() == 1).then(|| leaders[0])
}

/// How long a node may take from its inspection's start to `manageable`, for a round with a fault included: a bound
/// for a node that never finishes, not a measurement.
const NODE_DEADLINE: Duration = Duration::from_secs(180);

/// One enrolled node and the namespace that plays it.
#[derive(Debug, Clone)]
pub struct SiteNode {
    /// Index in the site's nodes.
    pub j: usize,
    pub name: String,
    pub mac: MacAddr,
    pub uuid: String,
    pub bmc: String,
    /// Its provision state between rounds.
    pub state: &'static str,
}

/// The site's nodes: those Ironic inspects, the others, the probe node and a stranger (a MAC nobody enrolled).
#[derive(Debug, Clone)]
pub struct SiteNodes {
    pub inspected: Vec<SiteNode>,
    pub others: Vec<SiteNode>,
    pub probe: SiteNode,
    /// (node index, MAC)
    pub stranger: (usize, MacAddr),
}

impl SiteNodes {
    /// Namespaces the site needs for `inspected` and `others`: one each, the probe node's and the stranger's.
    pub fn namespaces(inspected: usize, others: usize) -> usize {
        inspected + others + 2
    }
}

/// What a site fault does mid-round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteFault {
    None,
    /// The leading PXE host dies whole: its agent, dnsmasq and Ironic conductor SIGKILLed together.
    LeaderHostDies,
    /// The conductor of a host that does not lead is stopped (SIGTERM) and started again.
    ConductorRestarts,
}

impl SiteFault {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "no fault",
            Self::LeaderHostDies => "leader host killed",
            Self::ConductorRestarts => "a conductor restarted",
        }
    }
}

/// One inspected node's round.
#[derive(Debug, Clone)]
pub struct NodeOutcome {
    pub name: String,
    pub mac: MacAddr,
    /// Its lease, and the host that gave it (index).
    pub lease: Option<(Lease, usize)>,
    /// From its `inspect` request accepted to the lease.
    pub boot_to_lease: Option<Duration>,
    /// From its `inspect` request accepted to `manageable` again, with its data processed.
    pub inspect_to_finished: Option<Duration>,
    /// udhcpc runs until the lease (1: the first run leased).
    pub dhcp_runs: u32,
    /// Callbacks sent until Ironic accepted one (202).
    pub posts: u32,
    /// The `last_error` of each inspection Ironic failed before the one that finished (the node was inspected again).
    pub failed_by_ironic: Vec<String>,
    /// Why it did not finish, if it did not.
    pub error: Option<String>,
}

/// A round's figures (see the module's documentation for where each comes from).
#[derive(Debug, Clone)]
pub struct RoundReport {
    pub fault: SiteFault,
    pub nodes: Vec<NodeOutcome>,
    /// The host that died, or whose conductor restarted.
    pub fault_host: Option<usize>,
    /// From the kill to another host certainly open (its kernel read open twice in a row).
    pub failover_gap: Option<Duration>,
    /// From the conductor's stop to its API answering again.
    pub restart_took: Option<Duration>,
    /// When the dead host was brought back (from the kill), if a node was left `inspecting` by its conductor.
    pub revived_after: Option<Duration>,
    /// The probe's DISCOVERs, those answered by two servers or more, and those unanswered.
    pub probe_discovers: usize,
    pub probe_doubles: usize,
    pub probe_unanswered: usize,
    /// Exchanges (MAC and transaction id) of inspected nodes that more than one host's dnsmasq offered.
    pub exchanges_offered_by_two: Vec<String>,
    /// Inspected nodes acknowledged by two hosts at once: one exchange (MAC and transaction id) acknowledged by two
    /// hosts, or more hosts acknowledging a node than its DHCP client ran (a node that boots again, after Ironic
    /// failed its inspection or a client run got no lease, leases from whichever host leads then: not two servers).
    pub acked_by_two: Vec<String>,
    /// Inspected nodes some dnsmasq logged an acknowledgement for (each one that leased: the logs were read).
    pub acked_nodes: usize,
    /// DISCOVERs the others and the stranger sent; offers any dnsmasq logged for them; leases they got.
    pub others_discovers: usize,
    pub others_offers: usize,
    pub others_leases: usize,
    /// Time two hosts' kernels were certainly open together.
    pub dual_open: Duration,
    /// Requests the control planes sent Ironic during the round, and their moves to another Ironic API.
    pub ironic_requests: f64,
    pub ironic_failovers: f64,
    /// The control planes' moves to another Ironic API since they started, before the round too (a slow answer of
    /// an API under load moves them as a dead one does).
    pub ironic_failovers_ever: f64,
    pub wall: Duration,
}

impl RoundReport {
    pub fn finished(&self) -> usize {
        self.nodes.iter().filter(|n| n.inspect_to_finished.is_some()).count()
    }

    /// Everything the round must hold, as failures in words (empty: it held).
    pub fn violations(&self, site_plan: &crate::ha::DhcpPlan) -> Vec<String> {
        let mut v = Vec::new();
        for n in &self.nodes {
            if let Some(e) = &n.error {
                v.push(format!("{} did not finish: {e}", n.name));
            }
            if let Some((lease, host)) = &n.lease {
                if !site_plan.holds(*host, lease.ip) {
                    v.push(format!("{} leased {} from host {host}, outside its slice", n.name, lease.ip));
                }
            }
        }
        let leased = self.nodes.iter().filter(|n| n.lease.is_some()).count();
        if self.acked_nodes != leased {
            v.push(format!("{leased} nodes leased, but the dnsmasq logs acknowledge {}", self.acked_nodes));
        }
        if self.probe_doubles > 0 {
            v.push(format!(
                "{} of the probe's {} DISCOVERs answered by two servers",
                self.probe_doubles, self.probe_discovers
            ));
        }
        if !self.exchanges_offered_by_two.is_empty() {
            v.push(format!("exchanges offered by two hosts: {:?}", self.exchanges_offered_by_two));
        }
        if !self.acked_by_two.is_empty() {
            v.push(format!("nodes acknowledged by two hosts: {:?}", self.acked_by_two));
        }
        if self.others_offers + self.others_leases > 0 {
            v.push(format!(
                "nodes Ironic does not inspect, or a stranger, were offered {} times and leased {} times",
                self.others_offers, self.others_leases
            ));
        }
        if !self.dual_open.is_zero() {
            v.push(format!("two hosts open together for {:?}", self.dual_open));
        }
        v
    }

    /// The round as JSON (times in milliseconds).
    pub fn json(&self) -> serde_json::Value {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        json!({
            "fault": self.fault.name(),
            "nodes": self.nodes.iter().map(|n| json!({
                "name": n.name, "host": n.lease.as_ref().map(|l| l.1), "boot_to_lease_ms": ms(n.boot_to_lease),
                "inspect_to_finished_ms": ms(n.inspect_to_finished), "dhcp_runs": n.dhcp_runs, "posts": n.posts, "failed_by_ironic": n.failed_by_ironic,
                "error": n.error,
            })).collect::<Vec<_>>(),
            "fault_host": self.fault_host,
            "failover_gap_ms": ms(self.failover_gap),
            "restart_ms": ms(self.restart_took),
            "revived_after_ms": ms(self.revived_after),
            "probe_discovers": self.probe_discovers,
            "probe_doubles": self.probe_doubles,
            "probe_unanswered": self.probe_unanswered,
            "exchanges_offered_by_two": self.exchanges_offered_by_two,
            "acked_by_two": self.acked_by_two,
            "acked_nodes": self.acked_nodes,
            "others_discovers": self.others_discovers,
            "others_offers": self.others_offers,
            "others_leases": self.others_leases,
            "dual_open_ms": self.dual_open.as_secs_f64() * 1000.0,
            "ironic_requests": self.ironic_requests,
            "ironic_failovers": self.ironic_failovers,
            "wall_ms": self.wall.as_secs_f64() * 1000.0,
        })
    }
}

/// Enrolls `inspected` nodes (driven to `manageable`), `others` nodes in [`OTHER_STATES`] in turn, the probe node
/// (`manageable`), through the conductors' APIs in turn, and picks the stranger's MAC. The site needs
/// [`SiteNodes::namespaces`] nodes.
pub fn enroll_nodes(site: &HaSite, inspected: usize, others: usize) -> SiteNodes {
    let ironic = site.ironic.as_ref().expect("a site with Ironic conductors");
    assert!(site.nodes.len() >= SiteNodes::namespaces(inspected, others), "the site has too few node namespaces");
    let n_api = ironic.conductors.len();
    let make = |j: usize, tag: &str, k: usize, group: u8| {
        let name = format!("{tag}-{k}");
        let m = mac(&format!("52:54:00:a{group}:{:02x}:{:02x}", k / 256, k % 256));
        let bmc = format!("10.1.{}.{}", 100 + group, k + 1);
        let uuid = ironic.conductors[j % n_api].enroll(&name, &[m], &bmc, "agent");
        SiteNode { j, name, mac: m, uuid, bmc, state: "enroll" }
    };
    let mut inspected_nodes: Vec<SiteNode> = (0..inspected).map(|k| make(k, "inspected", k, 1)).collect();
    let mut other_nodes: Vec<SiteNode> = (0..others).map(|k| make(inspected + k, "other", k, 2)).collect();
    let mut probe = make(inspected + others, "probe", 0, 3);
    let stranger = (inspected + others + 1, mac("52:54:00:a4:00:01"));
    // All `manage` requests first (each conductor verifies its own nodes), then the waits.
    for n in inspected_nodes.iter().chain(std::iter::once(&probe)).chain(other_nodes.iter().filter(|n| n.j % 5 != 0)) {
        ironic.conductors[n.j % n_api].provision(&n.uuid, "manage");
    }
    let api = &ironic.conductors[0];
    for n in inspected_nodes.iter_mut().chain(std::iter::once(&mut probe)) {
        api.wait_provision_state(&n.uuid, "manageable", Duration::from_secs(60));
        n.state = "manageable";
    }
    for (k, n) in other_nodes.iter_mut().enumerate() {
        let want = OTHER_STATES[k % OTHER_STATES.len()];
        if want != "enroll" {
            api.wait_provision_state(&n.uuid, "manageable", Duration::from_secs(60));
        }
        match want {
            "maintenance" => {
                api.api_ok(
                    "PUT",
                    &format!("/v1/nodes/{}/maintenance", n.uuid),
                    Some(&json!({"reason": "ironguard site test"})),
                );
            }
            "enroll" => {}
            other => api.drive_to(&n.uuid, other),
        }
        n.state = want;
    }
    SiteNodes { inspected: inspected_nodes, others: other_nodes, probe, stranger }
}

/// Offers and acknowledgements in a dnsmasq log (`--log-dhcp`), from byte `from` on: (kind, transaction id, MAC).
fn dnsmasq_events(path: &std::path::Path, from: u64) -> Vec<(&'static str, String, String)> {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default()).into_owned();
    let mut out = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let kind = if w.starts_with("DHCPOFFER(") {
                "offer"
            } else if w.starts_with("DHCPACK(") {
                "ack"
            } else {
                continue;
            };
            // "<xid> DHCPOFFER(prov0) <ip> <mac>"
            if let (Some(xid), Some(m)) = (i.checked_sub(1).and_then(|p| words.get(p)), words.get(i + 2)) {
                out.push((kind, xid.to_string(), m.to_lowercase()));
            }
        }
    }
    out
}

fn log_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The control planes' total of a counter (`ironguard_controlplane_ironic_requests_total`, ...).
fn cp_total(site: &HaSite, name: &str) -> f64 {
    site.cps.iter().filter_map(|cp| metric(&site.mgmt, &cp.admin(), name)).sum()
}

/// A DHCP client that asks every 2 s for the whole round and must get nothing: busybox udhcpc.
fn asker(node: &Netns, m: MacAddr) -> Child {
    set_mac_up(node, "eth0", m);
    node.cmd("busybox")
        .args(["udhcpc", "-i", "eth0", "-f", "-q", "-n", "-t", "100000", "-T", "2", "-A", "1", "-s", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn udhcpc")
}

/// Stops an [`asker`]: (DISCOVERs it sent, leases it got).
fn asked(mut child: Child) -> (usize, usize) {
    let _ = child.kill();
    let out = child.wait_with_output().expect("udhcpc");
    let err = String::from_utf8_lossy(&out.stderr);
    // busybox 1.35 says "broadcasting discover", older ones "sending discover".
    let discovers = err.lines().filter(|l| l.ends_with(" discover")).count();
    let leases = err.lines().filter(|l| l.contains("lease of") && l.contains("obtained")).count();
    (discovers, leases)
}

/// Ironic's view of every node, read for all the node threads by one poller ([`Board::poll`]), as an operator's
/// tool reads a list. (Thirty threads asking each for its own node every 200 ms sent the APIs about a hundred
/// requests a second, each of them Python and SQL in a conductor: that cost more CPU than the rest of the site,
/// and slowed the inspections the threads were waiting for.)
struct Board {
    inner: std::sync::Mutex<BoardState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct BoardState {
    /// Polls begun, and the last one that an API answered.
    begun: u64,
    answered: u64,
    nodes: BTreeMap<String, serde_json::Value>,
    stopped: bool,
}

/// Stops the board's poller when dropped.
struct StopBoard<'a>(&'a Board);

impl Drop for StopBoard<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// How often [`Board::poll`] lists the nodes.
const BOARD_EVERY: Duration = Duration::from_millis(250);

impl Board {
    fn new() -> Self {
        Board { inner: std::sync::Mutex::new(BoardState::default()), changed: std::sync::Condvar::new() }
    }

    /// Lists the nodes (`uuid`, `provision_state`, `last_error`, `properties`) from the first API that answers, every
    /// [`BOARD_EVERY`], until [`Board::stop`]. `apis`: each host's API, asked from that host's namespace.
    fn poll(&self, apis: &[RestClient]) {
        let path = "/v1/nodes?fields=uuid,provision_state,last_error,properties";
        loop {
            let n = {
                let mut st = self.inner.lock().expect("board");
                if st.stopped {
                    return;
                }
                st.begun += 1;
                st.begun
            };
            let listed = apis.iter().find_map(|api| {
                let (status, v) = api.api("GET", path, None, Some("latest"));
                (status == 200).then_some(v)
            });
            if let Some(nodes) = listed.as_ref().and_then(|v| v["nodes"].as_array()) {
                let mut st = self.inner.lock().expect("board");
                for node in nodes {
                    if let Some(uuid) = node["uuid"].as_str() {
                        st.nodes.insert(uuid.to_string(), node.clone());
                    }
                }
                st.answered = n;
                self.changed.notify_all();
            }
            std::thread::sleep(BOARD_EVERY);
        }
    }

    fn stop(&self) {
        self.inner.lock().expect("board").stopped = true;
        self.changed.notify_all();
    }

    /// The node as a list begun after this call shows it; `None` when no API answered one within 10 s.
    fn node(&self, uuid: &str) -> Option<serde_json::Value> {
        let st = self.inner.lock().expect("board");
        let want = st.begun + 1;
        let (st, _) = self
            .changed
            .wait_timeout_while(st, Duration::from_secs(10), |st| st.answered < want && !st.stopped)
            .expect("board");
        (st.answered >= want).then(|| st.nodes.get(uuid).cloned()).flatten()
    }
}

/// One request to the first API that answers (not with a connection failure): (status, body).
fn any_api(
    node: &Netns,
    hosts: &[Ipv4Addr],
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut last = (0, serde_json::Value::Null);
    for h in hosts {
        let rest = RestClient { ns: node.name().to_string(), url: format!("http://{h}:{API_PORT}") };
        last = rest.api(method, path, Some(body), Some("latest"));
        if last.0 != 0 {
            break;
        }
    }
    last
}

/// `PUT /v1/nodes/{uuid}/states/provision` with `target` through `api`, as an operator or Metal3 would send it: a
/// 5xx is sent again a second later, up to 10 times. Ironic's API answers 500 to the first call after the node's
/// conductor restarted ("Unable to establish connection to http://<conductor>:8089: RemoteDisconnected": its
/// JSON-RPC client reused a connection to the conductor's previous process), and the next call goes through.
fn provision(api: &crate::ironic::RealIronic, uuid: &str, target: &str) {
    let path = format!("/v1/nodes/{uuid}/states/provision");
    for _ in 0..10 {
        let (status, reply) = api.api("PUT", &path, Some(&json!({"target": target})));
        if (200..300).contains(&status) {
            return;
        }
        assert!(status >= 500, "Ironic answered {status} to PUT {path} ({target}): {reply}");
        eprintln!("Ironic answered {status} to PUT {path} ({target}); sending it again: {reply}");
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("Ironic answered 5xx to PUT {path} ({target}) 10 times");
}

fn processed(v: &serde_json::Value) -> bool {
    v["provision_state"] == "manageable" && v["properties"]["cpu_arch"] == "x86_64"
}

/// How one boot of a node's ramdisk ended.
enum Boot {
    /// Ironic accepted its data.
    Accepted,
    /// Ironic failed the inspection (e.g. its conductor stopped mid-callback): its `last_error`.
    FailedByIronic(String),
}

/// One node's inspection as a ramdisk and its operator live it: DHCP until a lease, the callback to the leasing host's
/// API (the next host's on no answer, a 5xx or a 409), then waiting for Ironic to finish. An inspection Ironic fails is
/// started again (`manage`, `inspect`), as Metal3's baremetal-operator or an operator does, at most twice.
/// `hosts` are the PXE hosts' provisioning addresses.
fn boot(
    node: &Netns,
    n: &SiteNode,
    (hosts, board): (&[Ipv4Addr], &Board),
    prefix: u8,
    started: Instant,
    posted: &AtomicUsize,
    stuck: &AtomicUsize,
) -> NodeOutcome {
    let mut out = NodeOutcome {
        name: n.name.clone(),
        mac: n.mac,
        lease: None,
        boot_to_lease: None,
        inspect_to_finished: None,
        dhcp_runs: 0,
        posts: 0,
        failed_by_ironic: Vec::new(),
        error: None,
    };
    let deadline = started + NODE_DEADLINE;
    loop {
        match boot_once(node, n, (hosts, board), prefix, (started, deadline), stuck, &mut out) {
            Err(e) => {
                out.error = Some(e);
                return out;
            }
            Ok(Boot::Accepted) => {
                posted.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Ok(Boot::FailedByIronic(why)) => {
                out.failed_by_ironic.push(why);
                if out.failed_by_ironic.len() > 2 {
                    out.error = Some(format!("Ironic failed its inspection {} times", out.failed_by_ironic.len()));
                    return out;
                }
                let path = format!("/v1/nodes/{}/states/provision", n.uuid);
                for (target, state) in [("manage", "manageable"), ("inspect", "inspect wait")] {
                    let (status, reply) = any_api(node, hosts, "PUT", &path, &json!({"target": target}));
                    let reached = (status == 202).then(|| {
                        wait_for(deadline.saturating_duration_since(Instant::now()), || {
                            board.node(&n.uuid).filter(|v| v["provision_state"] == state).map(|_| ())
                        })
                    });
                    if reached.flatten().is_none() {
                        out.error = Some(format!(
                            "inspecting it again: {target} answered {status} {reply}, or it never reached {state}"
                        ));
                        return out;
                    }
                }
            }
        }
    }
    // Finished: manageable again, with its data processed (as the board reads it).
    let done = wait_for(deadline.saturating_duration_since(Instant::now()), || {
        board.node(&n.uuid).filter(processed).map(|_| started.elapsed())
    });
    match done {
        Some(d) => out.inspect_to_finished = Some(d),
        None => out.error = Some("accepted its data but never came back to manageable".into()),
    }
    out
}

/// One boot of the ramdisk: DHCP, then the callback until Ironic accepts it or has failed the inspection.
fn boot_once(
    node: &Netns,
    n: &SiteNode,
    (hosts, board): (&[Ipv4Addr], &Board),
    prefix: u8,
    (started, deadline): (Instant, Instant),
    stuck: &AtomicUsize,
    out: &mut NodeOutcome,
) -> Result<Boot, String> {
    let lease = loop {
        out.dhcp_runs += 1;
        let attempt: DhcpAttempt = dhcp_start(node, "eth0", n.mac, Want::Lease);
        if let Some(l) = attempt.finish() {
            break l;
        }
        if Instant::now() > deadline {
            return Err(format!("no lease after {} client runs", out.dhcp_runs));
        }
    };
    out.boot_to_lease.get_or_insert(started.elapsed());
    let host = hosts
        .iter()
        .position(|h| *h == lease.server_id)
        .ok_or(format!("leased by {}, not a PXE host", lease.server_id))?;
    out.lease = Some((lease.clone(), host));
    node.ip(&["addr", "flush", "dev", "eth0"]);
    node.ip(&["addr", "add", &format!("{}/{prefix}", lease.ip), "dev", "eth0"]);
    // A real ramdisk reports only after Ironic powered the machine on and the ramdisk booted, which takes far
    // longer than Ironic's step from `inspecting` into `inspect wait`; this one leases within a second of the
    // `inspect` call (its MAC is let through while the node is `inspecting`), and a post that came before
    // `inspect wait` would be refused (404: Ironic looks up only nodes waiting for data). So it waits for Ironic
    // to leave `inspecting` first: seen on a busy machine with 30 nodes at once, that step took up to 6 s.
    match wait_not_inspecting(board, &n.uuid, deadline, stuck, STUCK_FOR / 2) {
        Some(now) if now["provision_state"] == "inspect wait" => {}
        Some(now) if now["provision_state"] == "inspect failed" => {
            return Ok(Boot::FailedByIronic(now["last_error"].as_str().unwrap_or_default().to_string()));
        }
        now => {
            let state = now.as_ref().map(|v| v["provision_state"].clone());
            return Err(format!("leased, but Ironic never moved the node to inspect wait (it is {state:?})"));
        }
    }
    let data = ipa_inventory(&[n.mac], &n.bmc);
    let mut target = host;
    loop {
        out.posts += 1;
        let rest = RestClient { ns: node.name().to_string(), url: format!("http://{}:{API_PORT}", hosts[target]) };
        let (status, reply) = rest.api("POST", "/v1/continue_inspection", Some(&data), Some("latest"));
        if status == 202 {
            return Ok(Boot::Accepted);
        }
        if Instant::now() > deadline {
            return Err(format!("Ironic never accepted its data: last answer {status}: {reply}"));
        }
        // ironic-python-agent retries a 5xx and a 409 Conflict ("Node ... is locked by host ..., please retry after
        // the current operation is completed": a conductor's periodic task or takeover holds the node's lock).
        if status != 0 && status < 500 && status != 409 {
            // Refused: the node no longer waits for data. Ironic either processed an earlier post whose answer was
            // lost, or holds the node in `inspecting` (a conductor stopped mid-callback) and fails it once that
            // conductor is back.
            let now = wait_not_inspecting(board, &n.uuid, deadline, stuck, Duration::ZERO);
            let now = now.ok_or(format!("Ironic refused its data ({status}: {reply}) and kept it inspecting"))?;
            return match now["provision_state"].as_str() {
                _ if processed(&now) => Ok(Boot::Accepted),
                Some("inspect failed") => {
                    Ok(Boot::FailedByIronic(now["last_error"].as_str().unwrap_or_default().to_string()))
                }
                other => Err(format!("Ironic refused its data ({status}: {reply}); the node is {other:?}")),
            };
        }
        std::thread::sleep(Duration::from_secs(1));
        target = (target + 1) % hosts.len();
    }
}

/// Waits until Ironic has the node in another state than `inspecting` (as the board reads it) and returns
/// it, or `None` at `deadline`. Once it has waited `stuck_after`, the node counts in `stuck` (a node held in
/// `inspecting` by a dead conductor brings that host back: [`run_round`]).
fn wait_not_inspecting(
    board: &Board,
    uuid: &str,
    deadline: Instant,
    stuck: &AtomicUsize,
    stuck_after: Duration,
) -> Option<serde_json::Value> {
    let since = Instant::now();
    let mut counted = false;
    let now = wait_for(deadline.saturating_duration_since(since), || {
        if !counted && since.elapsed() >= stuck_after {
            counted = true;
            stuck.fetch_add(1, Ordering::SeqCst);
        }
        board.node(uuid).filter(|v| v["provision_state"] != "inspecting")
    });
    if counted {
        stuck.fetch_sub(1, Ordering::SeqCst);
    }
    now
}

/// One round: every inspected node inspected at once, with `fault` when a third of them have posted their data.
/// Leaves the inspected nodes and the probe node `manageable` again (for another round) and returns what was seen;
/// the caller judges it ([`RoundReport::violations`]).
pub fn run_round(site: &mut HaSite, nodes: &SiteNodes, fault: SiteFault) -> RoundReport {
    let t_round = Instant::now();
    let live: Vec<usize> = (0..site.hosts.len()).filter(|i| site.hosts[*i].agent.is_some()).collect();
    let hosts_ip: Vec<Ipv4Addr> = site.hosts.iter().map(|h| h.ip).collect();
    let logs: Vec<std::path::PathBuf> =
        (0..site.hosts.len()).map(|i| site.dir.join(&format!("dnsmasq-pxe{i}.log"))).collect();
    let log_from: Vec<u64> = logs.iter().map(|p| log_len(p)).collect();
    let requests0 = cp_total(site, "ironguard_controlplane_ironic_requests_total");
    let failovers0 = cp_total(site, "ironguard_controlplane_ironic_failovers_total");
    let (leader, _) = site.wait_leader(None, crate::SETUP_DEADLINE).expect("a leader before the round");
    let ironic = site.ironic.as_ref().expect("a site with Ironic conductors");
    let api = |k: usize| &ironic.conductors[live[k % live.len()]];

    // The probe node: inspected, its ramdisk silent; its DISCOVERs each get one offer.
    provision(api(0), &nodes.probe.uuid, "inspect");
    let probe_open = wait_for(crate::DEADLINE, || {
        site.hosts.iter().any(|h| crate::kernel_decision(&h.ns, nodes.probe.mac).served).then_some(())
    });
    assert!(probe_open.is_some(), "the probe node's MAC was never let through while Ironic inspects it");
    let probe = site.spawn_probe(nodes.probe.j, nodes.probe.mac, 3600.0, 0.1, 0);
    let askers: Vec<Child> = nodes
        .others
        .iter()
        .map(|n| (n.j, n.mac))
        .chain(std::iter::once(nodes.stranger))
        .map(|(j, m)| asker(&site.nodes[j], m))
        .collect();
    let watcher = Watcher::start_every(&site.hosts, Duration::from_millis(20));

    let posted = AtomicUsize::new(0);
    let prefix = site.plan.prefix_len;
    let fault_at = nodes.inspected.len().div_ceil(3);
    let mut fault_host = None;
    let mut failover_gap = None;
    let mut restart_took = None;
    let mut revived_after = None;
    let (stuck, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let board = Board::new();
    // Each host's API, asked from that host's namespace.
    let apis: Vec<RestClient> = site
        .hosts
        .iter()
        .map(|h| RestClient { ns: h.ns.name().to_string(), url: format!("http://{}:{API_PORT}", h.ip) })
        .collect();
    let outcomes: Vec<NodeOutcome> = {
        let HaSite { ironic, hosts, nodes: node_ns, dir, server, plan, .. } = &mut *site;
        let (stuck, done, board, apis) = (&stuck, &done, &board, &apis);
        let ironic = ironic.as_mut().expect("conductors");
        std::thread::scope(|s| {
            s.spawn(move || board.poll(apis));
            // The poller ends with the round, whether it ends well or by a panic (the scope waits for it).
            let _stop = StopBoard(board);
            let mut handles = Vec::new();
            for (k, n) in nodes.inspected.iter().enumerate() {
                let c = &ironic.conductors[live[k % live.len()]];
                provision(c, &n.uuid, "inspect");
                let started = Instant::now();
                let (node, hosts_ip, posted) = (&node_ns[n.j], &hosts_ip, &posted);
                handles.push(s.spawn(move || {
                    let out = boot(node, n, (hosts_ip, board), prefix, started, posted, stuck);
                    done.fetch_add(1, Ordering::SeqCst);
                    out
                }));
            }
            if fault != SiteFault::None {
                let reached = wait_for(NODE_DEADLINE, || (posted.load(Ordering::SeqCst) >= fault_at).then_some(()));
                assert!(reached.is_some(), "a third of the nodes never posted their data");
                match fault {
                    SiteFault::LeaderHostDies => {
                        // The host that leads now: on a busy machine the lead may have moved since the round began.
                        let leader = wait_for(crate::SETUP_DEADLINE, || current_leader(hosts)).unwrap_or(leader);
                        let h = &hosts[leader];
                        let t = Instant::now();
                        let mut pids = vec![h.server.pid(), ironic.conductors[leader].proc.pid()];
                        pids.extend(h.agent.as_ref().map(|a| a.pid()));
                        for pid in pids {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                        fault_host = Some(leader);
                        let others: Vec<usize> = live.iter().copied().filter(|i| *i != leader).collect();
                        let up = wait_for(crate::SETUP_DEADLINE, || {
                            others.iter().any(|i| watcher.wait_open(*i, t, Duration::from_millis(50))).then_some(())
                        });
                        failover_gap = up.map(|_| t.elapsed());
                        // A node whose data the dead conductor was processing stays `inspecting` (Ironic fails such
                        // a node only when that conductor starts again): once one has waited STUCK_FOR, the dead
                        // host is brought back, as its operator would.
                        let mut stuck_since: Option<Instant> = None;
                        while done.load(Ordering::SeqCst) < nodes.inspected.len() {
                            if stuck.load(Ordering::SeqCst) == 0 {
                                stuck_since = None;
                            } else if stuck_since.get_or_insert_with(Instant::now).elapsed() >= STUCK_FOR {
                                let conductor = Some(&mut ironic.conductors[leader]);
                                crate::ha::revive_host(&mut hosts[leader], leader, dir, *server, plan, conductor);
                                revived_after = Some(t.elapsed());
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                    SiteFault::ConductorRestarts => {
                        let i = *live.iter().find(|i| **i != leader).expect("a host that does not lead");
                        fault_host = Some(i);
                        let t = Instant::now();
                        ironic.conductors[i].restart(&hosts[i].ns);
                        restart_took = Some(t.elapsed());
                    }
                    SiteFault::None => {}
                }
            }
            handles.into_iter().map(|h| h.join().expect("a node's boot panicked")).collect()
        })
    };
    if fault == SiteFault::LeaderHostDies && revived_after.is_none() {
        // Reap what was killed; the host stays dead.
        if let Some(i) = fault_host {
            site.kill_host(i);
            site.hosts[i].agent = None;
        }
    }

    let (probe_discovers, probe_doubles, probe_unanswered) = {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(probe.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let r = probe_results(probe);
        (r.len(), r.iter().filter(|(_, s)| s.len() > 1).count(), r.iter().filter(|(_, s)| s.is_empty()).count())
    };
    let (mut others_discovers, mut others_leases) = (0, 0);
    for a in askers {
        let (d, l) = asked(a);
        others_discovers += d;
        others_leases += l;
    }
    let samples = watcher.finish_raw();
    let dual: Duration = dual_open(&certain_runs(&samples)).iter().map(|(_, _, d)| *d).sum();

    // Every dnsmasq's own record of the round.
    let inspected_macs: BTreeSet<String> = nodes.inspected.iter().map(|n| n.mac.to_string().to_lowercase()).collect();
    let other_macs: BTreeSet<String> = nodes
        .others
        .iter()
        .map(|n| n.mac)
        .chain(std::iter::once(nodes.stranger.1))
        .map(|m| m.to_string().to_lowercase())
        .collect();
    let mut offered: BTreeMap<(String, String), BTreeSet<usize>> = BTreeMap::new();
    let mut acked: BTreeMap<(String, String), BTreeSet<usize>> = BTreeMap::new();
    let mut others_offers = 0;
    for (i, p) in logs.iter().enumerate() {
        for (kind, xid, m) in dnsmasq_events(p, log_from[i]) {
            if other_macs.contains(&m) {
                others_offers += usize::from(kind == "offer");
            } else if inspected_macs.contains(&m) {
                match kind {
                    "offer" => offered.entry((m, xid)).or_default().insert(i),
                    _ => acked.entry((m, xid)).or_default().insert(i),
                };
            }
        }
    }
    let exchanges_offered_by_two =
        offered.iter().filter(|(_, h)| h.len() > 1).map(|((m, x), h)| format!("{m} xid {x} by hosts {h:?}")).collect();
    let mut acked_hosts: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for ((m, _), h) in &acked {
        acked_hosts.entry(m.as_str()).or_default().extend(h);
    }
    let acked_nodes = acked_hosts.len();
    let runs = |m: &str| {
        outcomes.iter().find(|n| n.mac.to_string().eq_ignore_ascii_case(m)).map_or(1, |n| n.dhcp_runs.max(1) as usize)
    };
    let acked_by_two: Vec<String> = acked
        .iter()
        .filter(|(_, h)| h.len() > 1)
        .map(|((m, x), h)| format!("{m} xid {x} by hosts {h:?}"))
        .chain(
            acked_hosts
                .iter()
                .filter(|(m, h)| h.len() > runs(m))
                .map(|(m, h)| format!("{m} by hosts {h:?} in {} DHCP client run(s)", runs(m))),
        )
        .collect();

    // The probe node back to manageable for the next round (abort → inspect failed → manage).
    let site_ref = &*site;
    let ironic = site_ref.ironic.as_ref().expect("conductors");
    let api =
        ironic.conductors.iter().enumerate().find(|(i, _)| site_ref.hosts[*i].agent.is_some()).expect("a live API").1;
    provision(api, &nodes.probe.uuid, "abort");
    api.wait_provision_state(&nodes.probe.uuid, "inspect failed", Duration::from_secs(60));
    provision(api, &nodes.probe.uuid, "manage");
    api.wait_provision_state(&nodes.probe.uuid, "manageable", Duration::from_secs(60));

    RoundReport {
        fault,
        nodes: outcomes,
        fault_host,
        failover_gap,
        restart_took,
        revived_after,
        probe_discovers,
        probe_doubles,
        probe_unanswered,
        exchanges_offered_by_two,
        acked_by_two,
        acked_nodes,
        others_discovers,
        others_offers,
        others_leases,
        dual_open: dual,
        ironic_requests: cp_total(site_ref, "ironguard_controlplane_ironic_requests_total") - requests0,
        ironic_failovers: cp_total(site_ref, "ironguard_controlplane_ironic_failovers_total") - failovers0,
        ironic_failovers_ever: cp_total(site_ref, "ironguard_controlplane_ironic_failovers_total"),
        wall: t_round.elapsed(),
    }
}
