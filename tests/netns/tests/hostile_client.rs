//! Hostile clients on the PXE network against a real Ironic 39 (standalone, noauth, fake-hardware, sqlite; see
//! `tests/netns/src/ironic.rs`), with the real control plane and agent, a real dnsmasq and real DHCP clients in
//! network namespaces. A stranger's namespace on the PXE bridge (a machine that is no Ironic node) tries each attack
//! of docs/security.md, "The PXE network is hostile", with plain curl: each is refused with the status
//! ironic-inspector's API gives, and changes nothing — Ironic's nodes and ports, ironguard's filter state and its
//! inspection records — and the stranger never gets DHCP. Then a storm of such posts from eight addresses runs
//! beside a legitimate inspection, which still finishes with its own node's data.
//!
//! Not tried here: operator calls (`POST /v1/rules`, start, abort) without credentials. This site serves the
//! inspector API with `auth_strategy = noauth` and `insecure = true` on the bridge (`ironic_site.rs`), so every
//! operator call is accepted there by design; their refusal under `http_basic` and `keystone` is tested in
//! `controlplane/tests/suite/inspector_auth.rs`, and `noauth` off loopback without `insecure` does not start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use ironguard_dataplane::MacAddr;
use ironguard_netns_tests::ironic_site::{INSPECTOR, IronicSite as Site, dhcp_becomes, ipa_callback};
use ironguard_netns_tests::{DEADLINE, Netns, TempDir, ipa_inventory, mac, wait_for};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The attacker's address on the PXE bridge (outside dnsmasq's range, 10.77.0.100-250).
const ATTACKER_IP: &str = "10.77.0.66";
/// The address node-a's ramdisk posts from (what its lease would give it).
const NODE_A_IP: &str = "10.77.0.50";
const BMC_A: &str = "10.1.50.10";
const BMC_B: &str = "10.1.50.11";

/// node-a's NIC, node-b's NIC, and the attacker's own.
fn macs() -> (MacAddr, MacAddr, MacAddr) {
    (mac("52:54:00:50:00:0a"), mac("52:54:00:50:00:0b"), mac("52:54:00:50:00:66"))
}

/// The attacker: node namespace 2 (0 is node-a, 1 node-b).
fn attacker(site: &Site) -> &Netns {
    &site.lan.nodes[2]
}

/// Everything a refused attack must leave as it was: every Ironic node and port (sorted), ironguard's filter state
/// (its revision, policy, counts and every entry with its reasons) and every inspection record ironguard keeps
/// (`updated_at` included: a record is saved only when a request runs, and a refused callback enqueues none).
fn snapshot(site: &Site) -> Value {
    let listed = site.ironic.api_ok(
        "GET",
        "/v1/nodes?fields=uuid,name,provision_state,power_state,maintenance,properties,extra,driver_info",
        None,
    );
    let mut nodes = listed["nodes"].as_array().expect("Ironic lists nodes").clone();
    nodes.sort_by(|x, y| x["uuid"].as_str().cmp(&y["uuid"].as_str()));
    let listed = site.ironic.api_ok("GET", "/v1/ports?fields=uuid,address,node_uuid,pxe_enabled,extra", None);
    let mut ports = listed["ports"].as_array().expect("Ironic lists ports").clone();
    ports.sort_by(|x, y| x["address"].as_str().cmp(&y["address"].as_str()));
    let mut filters: Value =
        serde_json::from_str(&site.ctl_ok(&["filters", "show", "--json"])).expect("filters show --json");
    if let Some(entries) = filters["entries"].as_array_mut() {
        for e in entries.iter_mut() {
            for k in ["allow_reasons", "deny_reasons"] {
                if let Some(r) = e[k].as_array_mut() {
                    r.sort_by(|x, y| x.as_str().cmp(&y.as_str()));
                }
            }
        }
        entries.sort_by(|x, y| x["mac"].as_str().cmp(&y["mac"].as_str()));
    }
    let list: Value =
        serde_json::from_str(&site.ctl_ok(&["inspect", "list", "--all", "--json"])).expect("inspect list --json");
    let mut inspections = list["inspections"].as_array().cloned().unwrap_or_default();
    inspections.sort_by(|x, y| x["node"].as_str().cmp(&y["node"].as_str()));
    json!({"ironic_nodes": nodes, "ironic_ports": ports, "filters": filters, "inspections": inspections})
}

/// One Ironic node of a snapshot (Null if absent).
fn node_of(snap: &Value, uuid: &str) -> Value {
    snap["ironic_nodes"].as_array().unwrap().iter().find(|n| n["uuid"] == uuid).cloned().unwrap_or(Value::Null)
}

/// The Ironic ports of one node in a snapshot.
fn ports_of(snap: &Value, uuid: &str) -> Vec<Value> {
    snap["ironic_ports"].as_array().unwrap().iter().filter(|p| p["node_uuid"] == uuid).cloned().collect()
}

/// The filter entry of one MAC in a snapshot (Null if the MAC is not listed).
fn filter_entry(snap: &Value, m: MacAddr) -> Value {
    let entries = snap["filters"]["entries"].as_array().cloned().unwrap_or_default();
    let listed = |e: &Value| e["mac"].as_str().and_then(|s| s.parse::<MacAddr>().ok()) == Some(m);
    entries.into_iter().find(listed).unwrap_or(Value::Null)
}

/// The attacker's hardware: 64 CPUs, 1 TiB of RAM, made by "Mallory" (so that it shows if it ever reached a node).
fn attackers_hardware(mut d: Value) -> Value {
    d["inventory"]["cpu"]["count"] = json!(64);
    d["inventory"]["memory"]["physical_mb"] = json!(1_048_576);
    d["inventory"]["system_vendor"]["manufacturer"] = json!("Mallory");
    d
}

/// node-a's MAC (heard in its DHCP broadcasts) and BMC address beside the attacker's own NIC, which is the boot
/// interface, in the pxelinux form ironic-python-agent sends (`01-aa-bb-...`): ironic-inspector and Ironic 39
/// accept this for node-a, with the attacker's hardware and a port for its MAC.
fn hijack_body(a: MacAddr, x: MacAddr) -> Value {
    let mut d = attackers_hardware(ipa_inventory(&[a, x], BMC_A));
    d["boot_interface"] = json!(format!("01-{}", x.to_string().replace(':', "-")));
    d["inventory"]["boot"]["pxe_interface"] = json!(x.to_string());
    d
}

/// Junk naming node-a's MAC: ironic-inspector ends node-a's inspection in `error` on it.
fn junk_body(a: MacAddr) -> Value {
    json!({"inventory": "junk", "macs": [a.to_string()]})
}

/// A forged ramdisk error naming node-a (its MAC and BMC address): ironic-inspector ends the inspection on it.
fn forged_body(a: MacAddr) -> Value {
    let mut d = ipa_inventory(&[a], BMC_A);
    d["error"] = json!("forged by the attacker");
    d
}

/// Writes a body the attacker posts into the test's directory.
fn body_file(site: &Site, name: &str, body: &Value) -> PathBuf {
    let p = site.lan.dir.join(name);
    std::fs::write(&p, body.to_string()).expect("write a body");
    p
}

/// One `POST /v1/continue` with curl from `ns`, from its address `src`, the body read from `file` (no
/// `Expect: 100-continue`): (HTTP status, reply body). Status 0 when curl got no answer.
fn post_file(ns: &Netns, src: &str, file: &Path) -> (u16, String) {
    let out = ns
        .cmd("curl")
        .args(["-s", "--max-time", "60", "--interface", src, "-H", "Content-Type: application/json", "-H", "Expect:"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .args(["-w", "\n%{http_code}"])
        .arg(format!("{INSPECTOR}/v1/continue"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// `$1` posts of the file `$3` from the address `$2` to `$4`, one after the other, as fast as curl goes; one status
/// per line.
const REPEAT: &str = r#"for _ in $(seq "$1"); do
  curl -s -o /dev/null -w '%{http_code}\n' --max-time 30 --interface "$2" \
    -H 'Content-Type: application/json' -H 'Expect:' --data-binary "@$3" "$4"
done"#;

/// `n` posts of `file` from `src` in `ns`, back to back (one `ip netns exec`, so nothing slows them): the statuses.
fn post_repeatedly(ns: &Netns, src: &str, file: &Path, n: usize) -> Vec<u16> {
    let out = ns
        .cmd("bash")
        .arg("-c")
        .arg(REPEAT)
        .arg("repeat")
        .arg(n.to_string())
        .arg(src)
        .arg(file)
        .arg(format!("{INSPECTOR}/v1/continue"))
        .output()
        .expect("run the curl loop");
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().unwrap_or(0)).collect()
}

/// One storm loop: from the address `$1`, posts each body file (`$4...`) to `$2` in turn, until the file `$3`
/// exists (at most 300 s); one status per line.
const STORM: &str = r#"src=$1; url=$2; stop=$3; shift 3
end=$((SECONDS + 300))
while [ ! -e "$stop" ] && [ "$SECONDS" -lt "$end" ]; do
  for f in "$@"; do
    curl -s -o /dev/null -w '%{http_code}\n' --max-time 10 --interface "$src" \
      -H 'Content-Type: application/json' -H 'Expect:' --data-binary "@$f" "$url"
  done
done"#;

/// Background attacker loops, one per source address, each in a process group of its own: on drop (also when the
/// test panics) each that still runs is killed with its curl, and every one is reaped.
#[derive(Debug)]
struct Storm {
    children: Vec<Child>,
    /// Each loop's statuses, one per line.
    outputs: Vec<PathBuf>,
    /// The loops end once this file exists.
    stop: PathBuf,
}

impl Storm {
    fn start(attacker: &Netns, dir: &TempDir, sources: &[String], bodies: &[PathBuf]) -> Self {
        let url = format!("{INSPECTOR}/v1/continue");
        let mut storm = Self { children: Vec::new(), outputs: Vec::new(), stop: dir.join("storm-stop") };
        for src in sources {
            let out = dir.join(&format!("storm-{src}.codes"));
            let file = std::fs::File::create(&out).expect("create a storm output");
            let child = attacker
                .cmd("bash")
                .arg("-c")
                .arg(STORM)
                .arg("storm")
                .arg(src)
                .arg(&url)
                .arg(&storm.stop)
                .args(bodies)
                .stdin(Stdio::null())
                .stdout(file)
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("start a storm loop");
            storm.children.push(child);
            storm.outputs.push(out);
        }
        storm
    }

    /// The statuses each loop got so far, in the order of `sources`.
    fn codes(&self) -> Vec<Vec<String>> {
        self.outputs
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default().lines().map(str::to_string).collect())
            .collect()
    }

    /// True while every loop runs.
    fn all_running(&mut self) -> bool {
        self.children.iter_mut().all(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Asks the loops to stop and waits (up to [`DEADLINE`]) until each has exited; whether they all did.
    fn finish(&mut self) -> bool {
        std::fs::write(&self.stop, "").expect("write the storm's stop file");
        let children = &mut self.children;
        wait_for(DEADLINE, || children.iter_mut().all(|c| matches!(c.try_wait(), Ok(Some(_)))).then_some(())).is_some()
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, "");
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                // The loop's process group: bash and the curl it runs.
                let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether the control plane logged a refusal of introspection data (`continue_error`'s lines, which carry
/// `peer=IP`) from `ip`.
fn logged_refusal(log: &str, ip: &str) -> bool {
    let peer = format!("peer={ip}");
    log.lines().any(|l| l.contains("introspection data refused") && l.split_whitespace().any(|w| w == peer))
}

/// Whether the control plane logged a `refused!` line of `what` (e.g. "over the rate limit (429)") for `ip`.
fn logged_limit(log: &str, what: &str, ip: &str) -> bool {
    let source = format!("source={ip}");
    log.lines().any(|l| l.contains(what) && l.split_whitespace().any(|w| w == source))
}

/// The site both tests start from.
struct Scene {
    site: Site,
    node_a: String,
    node_b: String,
    /// The snapshot taken once everything settled.
    before: Value,
}

/// node-a (MAC A, BMC 10.1.50.10) inspected by ironguard and booted through the filter, waiting for its data;
/// node-b (MAC B, BMC 10.1.50.11) manageable, its port denied by the Ironic sync; the attacker (node namespace 2)
/// with its own MAC, refused DHCP, and an address on the bridge. Then the snapshot.
fn setup() -> Scene {
    let site = Site::new(3, 1000);
    let (a, b, x) = macs();
    let node_a = site.ironic.enroll("node-a", &[a], BMC_A, "agent");
    let node_b = site.ironic.enroll("node-b", &[b], BMC_B, "agent");
    site.ironic.drive_to(&node_a, "manageable");
    site.ironic.drive_to(&node_b, "manageable");
    site.start_inspection("node-a", &node_a);
    // Ironic answers a power change with 202 and its conductor applies it a moment later: settled before the
    // snapshot.
    let on = wait_for(DEADLINE, || (site.ironic.power_state(&node_a).as_deref() == Some("power on")).then_some(()));
    assert!(on.is_some(), "ironguard powered node-a on: {:?}", site.ironic.power_state(&node_a));
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], a, true, DEADLINE), "node-a boots through the filter");
    let denied = wait_for(DEADLINE, || site.reasons(b).1.iter().any(|r| r == "ironic").then_some(()));
    assert!(denied.is_some(), "the Ironic sync denies node-b's port: {:?}", site.reasons(b));
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[1], b, false, DEADLINE), "node-b gets no DHCP");
    // The attacker's own MAC is set on its interface (by the DHCP client) before it sends anything else, then it
    // takes an address on the bridge, as a machine that is not served would.
    assert!(dhcp_becomes(&site.lan.pxe, attacker(&site), x, false, DEADLINE), "the attacker gets no DHCP");
    attacker(&site).ip(&["addr", "replace", &format!("{ATTACKER_IP}/24"), "dev", "eth0"]);
    let (allow, deny) = site.reasons(x);
    assert!(allow.is_empty() && deny.is_empty(), "the attacker's MAC is in no filter entry: {allow:?} {deny:?}");
    let before = snapshot(&site);
    let inspections = before["inspections"].as_array().unwrap();
    assert!(
        inspections.len() == 1 && inspections[0]["node"] == node_a.as_str() && inspections[0]["state"] == "waiting",
        "only node-a's inspection, waiting: {before:#}"
    );
    assert!(filter_entry(&before, a)["allow_reasons"].as_array().is_some_and(|r| !r.is_empty()), "{before:#}");
    Scene { site, node_a, node_b, before }
}

/// Every attack of the "PXE network is hostile" table, one after the other from the attacker's namespace with
/// curl, while node-a waits for its data: each is refused with ironic-inspector's status and a reply that names no
/// node, and afterwards node-a still waits, the snapshot (Ironic's nodes and ports, ironguard's filter state and
/// inspection records) is unchanged, and the attacker still gets no DHCP. The control plane's log names the
/// attacker's address.
#[test]
fn each_hostile_post_is_refused_and_changes_nothing() {
    let Scene { site, node_a, node_b, before } = setup();
    let (a, b, x) = macs();
    let attacker = attacker(&site);
    let unchanged = |what: &str| {
        assert_eq!(site.inspection_state(&node_a)["state"], "waiting", "{what}: node-a keeps waiting for its data");
        let now = snapshot(&site);
        assert!(now == before, "{what} changed something.\nbefore: {before:#}\nafter: {now:#}");
        assert!(dhcp_becomes(&site.lan.pxe, attacker, x, false, DEADLINE), "{what}: the attacker still gets no DHCP");
    };
    let names_no_node = |what: &str, reply: &str| {
        assert!(
            !reply.contains(node_a.as_str()) && !reply.contains(node_b.as_str()),
            "{what}: the reply names no node: {reply}"
        );
    };
    // Each post below takes one of the attacker's 10 burst tokens (9 in all, refilled at 1 a second meanwhile):
    // none of them meets the rate limit, which (f) tries on its own.

    // (a) Hijack: node-a's MAC and BMC address, the attacker's hardware, its own NIC as the boot interface (O14).
    let hijack = body_file(&site, "hijack.json", &hijack_body(a, x));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &hijack);
    assert_eq!(status, 400, "hijack: {reply}");
    assert!(reply.contains(&format!("boot interface {x} was not allowed DHCP")), "hijack: {reply}");
    names_no_node("hijack", &reply);
    unchanged("the hijack");

    // (b) node-a's BMC address alone, with the attacker's own NIC and hardware (O26).
    let bmc_only = body_file(&site, "bmc-only.json", &attackers_hardware(ipa_inventory(&[x], BMC_A)));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &bmc_only);
    assert_eq!(status, 400, "BMC address only: {reply}");
    assert!(reply.contains(&format!("boot interface {x} was not allowed DHCP")), "BMC address only: {reply}");
    names_no_node("BMC address only", &reply);
    unchanged("the post by BMC address");

    // (c) Junk naming node-a's MAC, and a forged ramdisk error for node-a: refused (400), node-a keeps waiting
    // (S7); ironic-inspector would end its inspection in error.
    let junk = body_file(&site, "junk.json", &junk_body(a));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &junk);
    assert_eq!(status, 400, "junk: {reply}");
    assert!(reply.contains("Hardware inventory is malformed"), "junk: {reply}");
    names_no_node("junk", &reply);
    unchanged("the junk");
    let forged = body_file(&site, "forged.json", &forged_body(a));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &forged);
    assert_eq!(status, 400, "forged ramdisk error: {reply}");
    assert!(reply.contains("Ramdisk reported error: forged by the attacker"), "forged ramdisk error: {reply}");
    names_no_node("forged ramdisk error", &reply);
    unchanged("the forged ramdisk error");

    // (d) node-b's MAC, which the Ironic sync denies: as node-b's own data (node-b is not inspected: no node
    // waits for it), and as the boot interface of data naming node-a.
    let as_b = body_file(&site, "as-node-b.json", &attackers_hardware(ipa_inventory(&[b], BMC_B)));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &as_b);
    assert_eq!(status, 400, "node-b's identity: {reply}");
    names_no_node("node-b's identity", &reply);
    unchanged("the post as node-b");
    let b_boot = body_file(&site, "b-boot.json", &attackers_hardware(ipa_inventory(&[b, a], BMC_A)));
    let (status, reply) = post_file(attacker, ATTACKER_IP, &b_boot);
    assert_eq!(status, 400, "node-b's MAC as node-a's boot interface: {reply}");
    assert!(reply.contains(&format!("boot interface {b} was not allowed DHCP")), "{reply}");
    names_no_node("node-b's MAC as the boot interface", &reply);
    unchanged("the post with node-b's MAC as the boot interface");

    // (g) node-a's own NIC as the boot interface (it booted through the filter: the kernel saw its DHCP), with the
    // attacker's hardware, posted from the attacker's own address before node-a's ramdisk posts (O27): the
    // control plane's neighbour table gives that address to the attacker's NIC, not to one of node-a's.
    let mut own_boot = attackers_hardware(ipa_inventory(&[a], BMC_A));
    own_boot["boot_interface"] = json!(format!("01-{}", a.to_string().replace(':', "-")));
    let own_boot = body_file(&site, "node-a-boot.json", &own_boot);
    let (status, reply) = post_file(attacker, ATTACKER_IP, &own_boot);
    assert_eq!(status, 400, "node-a's boot interface from the attacker's address: {reply}");
    assert!(reply.contains(&format!("held by the interface {x}")), "node-a's boot interface: {reply}");
    names_no_node("node-a's boot interface from the attacker", &reply);
    unchanged("the post naming node-a's boot interface");

    // (e) A body over the 16 MiB limit (413), and one nested deeper than the parser's bound (400).
    let big = site.lan.dir.join("oversize.json");
    std::fs::write(&big, vec![b' '; 17 << 20]).expect("write 17 MiB");
    let (status, reply) = post_file(attacker, ATTACKER_IP, &big);
    assert_eq!(status, 413, "oversize: {reply}");
    assert!(reply.contains(&format!("over {} bytes", 16 << 20)), "oversize: {reply}");
    unchanged("the oversize body");
    let deep = site.lan.dir.join("deep.json");
    std::fs::write(&deep, format!("{{\"inventory\": {}{}}}", "[".repeat(1000), "]".repeat(1000))).expect("write");
    let (status, reply) = post_file(attacker, ATTACKER_IP, &deep);
    assert_eq!(status, 400, "deep JSON: {reply}");
    assert!(reply.contains("nested deeper than"), "deep JSON: {reply}");
    unchanged("the deep body");

    // (f) The hijack again, 25 times back to back: past the burst of 10 a source has, 429.
    let codes = post_repeatedly(attacker, ATTACKER_IP, &hijack, 25);
    assert_eq!(codes.len(), 25, "every post was answered: {codes:?}");
    assert!(codes.iter().all(|c| *c == 400 || *c == 429), "refused or rate-limited, nothing else: {codes:?}");
    assert!(codes.contains(&429), "the rate limit answered: {codes:?}");
    unchanged("the burst of posts");

    // The operator reads who tried: the refusals with the attacker's address.
    let log = site.cp.proc.log_text();
    assert!(logged_refusal(&log, ATTACKER_IP), "the refusals name the attacker's address:\n{log}");
    assert!(logged_limit(&log, "over the rate limit (429)", ATTACKER_IP), "the 429s are logged:\n{log}");
    assert!(logged_limit(&log, "body over the limit (413)", ATTACKER_IP), "the 413 is logged:\n{log}");
}

/// A `/v1/continue` storm beside a legitimate inspection: eight loops from eight addresses of the attacker's
/// namespace post hijacks, posts by BMC address, junk, forged ramdisk errors and node-b's MAC as fast as curl goes.
/// While they run nothing changes; then node-a's own ramdisk posts its data with ironic-python-agent's own code
/// and is accepted, its inspection finishes with its own hardware (4 CPUs, not the attacker's 64), no port gets
/// the attacker's MAC, node-b is untouched, no storm post was ever accepted, and the attacker never got DHCP.
#[test]
fn a_continue_storm_beside_a_real_inspection_changes_nothing_and_it_still_finishes() {
    let Scene { site, node_a, node_b, before } = setup();
    let (a, b, x) = macs();
    let attacker = attacker(&site);
    let bodies = [
        body_file(&site, "hijack.json", &hijack_body(a, x)),
        body_file(&site, "bmc-only.json", &attackers_hardware(ipa_inventory(&[x], BMC_A))),
        body_file(&site, "junk.json", &junk_body(a)),
        body_file(&site, "forged.json", &forged_body(a)),
        body_file(&site, "b-boot.json", &attackers_hardware(ipa_inventory(&[b, a], BMC_A))),
    ];
    // Eight sources, so that the rate limit (per source) does not answer the whole storm for the engine.
    let sources: Vec<String> = (70..78).map(|i| format!("10.77.0.{i}")).collect();
    for s in &sources {
        attacker.ip(&["addr", "replace", &format!("{s}/24"), "dev", "eth0"]);
    }
    let mut storm = Storm::start(attacker, &site.lan.dir, &sources, &bodies);
    // Every loop is past its burst (10 posts refused by the engine, then 429s): the storm is on.
    let going = wait_for(DEADLINE, || storm.codes().iter().all(|c| c.len() >= 20).then_some(()));
    assert!(going.is_some(), "every storm loop is answered: {:?}", storm.codes());

    // The storm alone changes nothing.
    assert_eq!(site.inspection_state(&node_a)["state"], "waiting", "node-a keeps waiting during the storm");
    let during = snapshot(&site);
    assert!(during == before, "the storm changed something.\nbefore: {before:#}\nduring: {during:#}");

    // node-a's own ramdisk, with ironic-python-agent's own callback code, in the middle of the storm.
    let (ok, reply, err) = ipa_callback(&site.lan.nodes[0], NODE_A_IP, &site.lan.dir, &ipa_inventory(&[a], BMC_A));
    assert!(ok, "node-a's own data was refused during the storm: {err}\n{}", site.cp.proc.log_text());
    let reply: Value = serde_json::from_str(&reply).expect("IPA prints the reply");
    assert_eq!(reply["uuid"], node_a.as_str(), "IPA reads node-a's UUID back");
    site.wait_inspection(&node_a, "finished", Duration::from_secs(60));
    assert!(storm.all_running(), "the storm ran all along the inspection");
    assert!(storm.finish(), "the storm loops stop");
    let codes = storm.codes();
    for (src, c) in sources.iter().zip(&codes) {
        assert!(!c.iter().any(|s| s.starts_with('2')), "{src}: a storm post was accepted: {c:?}");
        assert!(c.iter().any(|s| s == "400"), "{src}: posts reached the engine and were refused: {c:?}");
    }
    assert!(codes.iter().flatten().any(|s| s == "429"), "the rate limit answered the flood");

    // node-a has its own hardware in Ironic and in the stored data, and no port of the attacker's.
    let p = site.ironic.node(&node_a)["properties"].clone();
    assert_eq!(p["cpus"], "4", "node-a's own CPUs, not the attacker's 64: {p}");
    assert_eq!(p["memory_mb"], "8192", "{p}");
    assert_eq!(p["cpu_arch"], "x86_64", "{p}");
    let data = site.data(&node_a);
    assert_eq!(data["inventory"]["system_vendor"]["manufacturer"], "QEMU", "the stored data is node-a's own");
    assert_eq!(data["inventory"]["cpu"]["count"], 4, "the stored data is node-a's own");
    let ports: Vec<String> = site.ironic.ports(&node_a).into_iter().map(|(m, _)| m).collect();
    assert_eq!(ports, [a.to_string()], "node-a's ports are its own NIC's");
    let xp = site.ironic.api_ok("GET", &format!("/v1/ports?address={x}&fields=uuid"), None);
    assert!(xp["ports"].as_array().is_some_and(Vec::is_empty), "no port has the attacker's MAC: {xp}");

    // node-b untouched, no port created or deleted, the attacker in no filter entry.
    let after = snapshot(&site);
    assert_eq!(node_of(&after, &node_b), node_of(&before, &node_b), "node-b in Ironic is unchanged");
    assert_eq!(ports_of(&after, &node_b), ports_of(&before, &node_b), "node-b's ports are unchanged");
    assert_eq!(filter_entry(&after, b), filter_entry(&before, b), "node-b's filter entry is unchanged");
    assert!(
        !after["inspections"].as_array().unwrap().iter().any(|i| i["node"] == node_b.as_str()),
        "node-b was never inspected: {after:#}"
    );
    let addresses =
        |s: &Value| s["ironic_ports"].as_array().unwrap().iter().map(|p| p["address"].clone()).collect::<Vec<_>>();
    assert_eq!(addresses(&after), addresses(&before), "no Ironic port was created or deleted");
    assert_eq!(filter_entry(&after, x), Value::Null, "the attacker's MAC is in no filter entry: {after:#}");
    assert!(dhcp_becomes(&site.lan.pxe, attacker, x, false, DEADLINE), "the attacker still gets no DHCP");

    // The refusals are logged with each storm address.
    let log = site.cp.proc.log_text();
    for src in &sources {
        assert!(logged_refusal(&log, src), "the refusals name {src}:\n{log}");
    }
}
