//! ironguard against a real OpenStack Ironic 39 (standalone, noauth, fake-hardware, sqlite; see
//! `tests/netns/src/ironic.rs`), with the real control plane and agent, a real dnsmasq and real DHCP clients in
//! network namespaces. The real Ironic is the judge: its pagination, its provision states, its
//! `/v1/continue_inspection`, its power and boot APIs, and the OpenStack clients and ironic-python-agent code
//! that talk to ironguard's inspector API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::{Duration, Instant};

use ironguard_netns_tests::ironic::venv_bin;
use ironguard_netns_tests::*;
use ironguard_nft::MacAddr;
use serde_json::Value;

const AGENT_ADMIN: &str = "127.0.0.1:9181";
const INSPECTOR: &str = "http://10.77.0.1:5050";

/// A PXE host namespace with dnsmasq, a real Ironic, the control plane (embedded store, unknown MACs denied,
/// inspector API on the PXE bridge) and the agent as leader; `n` node namespaces.
struct Site {
    // Dropped in this order: the processes (printing their logs if the test failed), then the namespaces and the
    // directory holding those logs.
    agent: Proc,
    cp: ControlPlane,
    ironic: RealIronic,
    lan: PxeLan,
}

impl Site {
    fn new(n: usize, page_size: u32) -> Self {
        let lan = PxeLan::new(n);
        let ironic = RealIronic::start(&lan.pxe, &lan.dir, 6385);
        let cfg = lan.dir.join("controlplane.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\ninspector_listen = \"10.77.0.1:5050\"\n\n[filter]\nunknown_mac_policy = \"deny\"\n\n\
                 [ironic]\nurl = \"{}\"\nretries = 3\nretry_backoff_ms = 100\npage_size = {page_size}\n\n\
                 [inspection]\nworkers = 2\ntake_timeout_ms = 200\nallow_timeout_secs = 15\n\n\
                 [sync]\nironic_sync_secs = 1\nironic_inspection = true\nironic_inspection_period_ms = 300\n\
                 timeout_check_secs = 5\n",
                ironic.url
            ),
        )
        .unwrap();
        let cp = ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--config", cfg.to_str().unwrap()]);
        let agent = start_agent(&lan.pxe, &lan.dir, &agent_toml("agent-r", &cp.url(), "br0", AGENT_ADMIN, 30), None);
        let leader = wait_for(Duration::from_secs(10), || (verdict(&lan.pxe) == "LEADER").then_some(()));
        assert!(leader.is_some(), "the agent did not lead:\n{}", agent.log_text());
        Self { agent, cp, ironic, lan }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        ctl(&self.lan.pxe, args)
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "ironguardctl {args:?} failed: {}{}\ncontrol plane log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.cp.proc.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// (allow reasons, deny reasons) of a MAC in the control plane's filter state.
    fn reasons(&self, m: MacAddr) -> (Vec<String>, Vec<String>) {
        let v: Value = serde_json::from_str(&self.ctl_ok(&["filters", "show", "--json", "--mac", &m.to_string()]))
            .expect("filters show --json");
        let e = v["entries"].as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
        let list = |k: &str| {
            e[k].as_array().map(|a| a.iter().filter_map(|r| r.as_str().map(String::from)).collect()).unwrap_or_default()
        };
        (list("allow_reasons"), list("deny_reasons"))
    }

    /// `ironguardctl inspect status UUID --json` → state.
    fn inspection_state(&self, uuid: &str) -> Value {
        serde_json::from_str(&self.ctl_ok(&["inspect", "status", uuid, "--json"])).expect("inspect status --json")
    }

    fn wait_inspection(&self, uuid: &str, want: &str, timeout: Duration) -> Value {
        let t = Instant::now();
        loop {
            let s = self.inspection_state(uuid);
            if s["state"] == want {
                return s;
            }
            assert!(
                t.elapsed() < timeout,
                "inspection of {uuid} never reached {want}: {s}\n{}",
                self.cp.proc.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A node's DHCP outcome, retried until it is `want` (a lease or none) or `timeout` passes.
fn dhcp_becomes(node: &Netns, m: MacAddr, want: bool, timeout: Duration) -> bool {
    wait_for(timeout, || (dhcp(node, "eth0", m).is_some() == want).then_some(())).is_some()
}

/// ironic-python-agent's own `call_inspector`, run in `node`'s namespace with `addr` on its interface (the address
/// its DHCP lease would give the ramdisk): (exit ok, stdout, stderr).
fn ipa_callback(node: &Netns, addr: &str, dir: &TempDir, data: &Value) -> (bool, String, String) {
    node.ip(&["addr", "replace", &format!("{addr}/24"), "dev", "eth0"]);
    let path = dir.join(&format!("ipa-data-{}.json", node.name()));
    std::fs::write(&path, data.to_string()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ironic/ipa_callback.py");
    let out = node
        .cmd(venv_bin("python"))
        .arg(script)
        .arg(&path)
        .args(["--inspection_callback_url", &format!("{INSPECTOR}/v1/continue")])
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("run ipa_callback.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The deny set comes from Ironic's ports; Ironic's own inspection of a node opens DHCP for that node only, and
/// closes it once the ramdisk's data reached Ironic's `/v1/continue_inspection`.
#[test]
fn ironics_own_inspection_opens_dhcp_for_its_node_only() {
    let site = Site::new(3, 1000);
    let (a, b, unknown) = (mac("52:54:00:39:00:0a"), mac("52:54:00:39:00:0b"), mac("52:54:00:39:00:0c"));
    let node_a = site.ironic.enroll("node-a", &[a], "10.1.39.10", "agent");
    let node_b = site.ironic.enroll("node-b", &[b], "10.1.39.11", "agent");
    site.ironic.drive_to(&node_a, "manageable");
    site.ironic.drive_to(&node_b, "manageable");

    let synced = wait_for(Duration::from_secs(10), || {
        (site.reasons(a).1.contains(&"ironic".to_string()) && site.reasons(b).1.contains(&"ironic".to_string()))
            .then_some(())
    });
    assert!(synced.is_some(), "Ironic's ports are denied with reason ironic:\n{}", site.cp.proc.log_text());
    let leases = site.lan.dhcp_all(&[(0, a), (1, b), (2, unknown)]);
    assert!(leases.iter().all(Option::is_none), "nobody gets DHCP while nothing is inspected: {leases:?}");

    site.ironic.drive_to(&node_a, "inspect wait");
    assert_eq!(site.ironic.power_state(&node_a).as_deref(), Some("power on"), "Ironic powered the node on");
    assert!(dhcp_becomes(&site.lan.nodes[0], a, true, Duration::from_secs(10)), "the node Ironic inspects boots");
    assert!(site.reasons(a).0.contains(&"ironic-inspection".to_string()));
    let others = site.lan.dhcp_all(&[(1, b), (2, unknown)]);
    assert!(others.iter().all(Option::is_none), "only that node: {others:?}");

    // The ramdisk's data reaches Ironic (lookup by MAC and BMC address); Ironic finishes, ironguard closes.
    let (status, reply) = site.ironic.continue_inspection(&ipa_inventory(&[a], "10.1.39.10"));
    assert_eq!(status, 202, "Ironic accepted the inspection data: {reply}");
    assert_eq!(reply["node"]["uuid"], node_a.as_str());
    let node = site.ironic.wait_provision_state(&node_a, "manageable", Duration::from_secs(20));
    assert_eq!(node["properties"]["cpu_arch"], "x86_64", "Ironic processed the data itself");
    assert!(dhcp_becomes(&site.lan.nodes[0], a, false, Duration::from_secs(10)), "closed again after inspection");
    assert!(!site.reasons(a).0.contains(&"ironic-inspection".to_string()));
}

/// Ironic's `next` link drops `provision_state`: with more nodes in `inspect wait` than one page holds and nodes
/// in other states behind them, none of the others is ever allowed in the kernel or gets a lease, and the nodes
/// on later pages are allowed.
#[test]
fn more_nodes_in_inspect_wait_than_one_page_and_no_other_node_is_ever_allowed() {
    // Page size 3; the kernel's allow set is sampled all along.
    let site = Site::new(6, 3);
    let m = |i: u8| mac(&format!("52:54:00:39:01:{i:02x}"));
    // Order matters: Ironic lists by id, so the nodes in other states (and one in maintenance) sit right after
    // the first page of inspect-wait nodes, where a client following `next` would find them.
    let plan: [(&str, &str); 10] = [
        ("w1", "inspect wait"),
        ("w2", "inspect wait"),
        ("w3", "inspect wait"),
        ("enrolled", "enroll"),
        ("manageable", "manageable"),
        ("available", "available"),
        ("active", "active"),
        ("maint", "inspect wait"),
        ("w4", "inspect wait"),
        ("w5", "inspect wait"),
    ];
    let uuids: Vec<String> = plan
        .iter()
        .enumerate()
        .map(|(i, (name, _))| site.ironic.enroll(name, &[m(i as u8)], &format!("10.1.39.{}", 100 + i), "agent"))
        .collect();
    let watcher = SetWatcher::start(&site.lan.pxe, "allow_mac");
    // One node is in maintenance (Ironic inspects it all the same): it must not get DHCP.
    site.ironic.drive_to(&uuids[7], "manageable");
    site.ironic.api_ok(
        "PUT",
        &format!("/v1/nodes/{}/maintenance", uuids[7]),
        Some(&serde_json::json!({"reason": "ironguard test"})),
    );
    for (i, (_, state)) in plan.iter().enumerate() {
        site.ironic.drive_to(&uuids[i], state);
    }
    let inspected: Vec<MacAddr> = [0, 1, 2, 8, 9].iter().map(|i| m(*i)).collect();
    let all_allowed = wait_for(Duration::from_secs(10), || {
        inspected.iter().all(|x| site.reasons(*x).0.contains(&"ironic-inspection".to_string())).then_some(())
    });
    assert!(all_allowed.is_some(), "all five nodes in inspect wait are allowed:\n{}", site.cp.proc.log_text());
    // A few more polls of Ironic while the DHCP clients run.
    let clients: Vec<(usize, MacAddr)> = [9u8, 3, 4, 5, 6, 7].iter().enumerate().map(|(ns, i)| (ns, m(*i))).collect();
    let leases = site.lan.dhcp_all(&clients);
    let seen = watcher.stop();

    assert!(leases[0].is_some(), "w5, on the last page, gets its lease");
    for (k, lease) in leases.iter().enumerate().skip(1) {
        assert!(lease.is_none(), "{} ({}) got a lease: {lease:?}", plan[[9usize, 3, 4, 5, 6, 7][k]].0, clients[k].1);
    }
    assert!(seen.samples > 100, "the watcher read the kernel set ({} reads)", seen.samples);
    assert_eq!(seen.read_errors, 0, "every read of the kernel set succeeded: {:?}", seen.last_error);
    let foreign: Vec<&MacAddr> = seen.seen.iter().filter(|x| !inspected.contains(x)).collect();
    assert!(foreign.is_empty(), "MACs of nodes not in inspect wait were allowed in the kernel: {foreign:?}");
    for x in &inspected {
        assert!(seen.seen.contains(x), "{x} was allowed in the kernel");
    }
}

/// ironguard's own inspection drives Ironic: PXE boot device then power on, the node's lease, the callback from
/// the node's namespace with ironic-python-agent's own code, finished, powered off, DHCP closed.
#[test]
fn ironguards_own_inspection_drives_ironics_power_and_boot_device() {
    let site = Site::new(2, 1000);
    let (n, other) = (mac("52:54:00:39:02:01"), mac("52:54:00:39:02:02"));
    let uuid = site.ironic.enroll("node-ig", &[n], "10.1.39.50", "agent");
    let other_uuid = site.ironic.enroll("node-other", &[other], "10.1.39.51", "agent");
    site.ironic.drive_to(&uuid, "manageable");
    site.ironic.drive_to(&other_uuid, "manageable");
    site.ctl_ok(&["inspect", "start", "node-ig"]);
    site.wait_inspection(&uuid, "waiting", Duration::from_secs(20));
    assert_eq!(site.ironic.power_state(&uuid).as_deref(), Some("power on"), "ironguard powered the node on");
    // Ironic's own request log: the boot device was set to PXE before the power-on.
    let log = site.ironic.proc.log_text();
    let boot = log.find(&format!("PUT /v1/nodes/{uuid}/management/boot_device - 204"));
    let power = log.find(&format!("PUT /v1/nodes/{uuid}/states/power - 202"));
    assert!(boot.is_some() && power.is_some() && boot < power, "PXE, then power on, in Ironic's log:\n{log}");
    assert!(dhcp_becomes(&site.lan.nodes[0], n, true, Duration::from_secs(10)), "the inspected node boots");
    assert!(dhcp(&site.lan.nodes[1], "eth0", other).is_none(), "the other node does not");

    let (ok, reply, err) =
        ipa_callback(&site.lan.nodes[0], "10.77.0.50", &site.lan.dir, &ipa_inventory(&[n], "10.1.39.50"));
    assert!(ok, "IPA's callback failed: {err}");
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["uuid"], uuid.as_str(), "IPA reads the node's UUID back");
    site.wait_inspection(&uuid, "finished", Duration::from_secs(20));
    let off = wait_for(Duration::from_secs(10), || {
        (site.ironic.power_state(&uuid).as_deref() == Some("power off")).then_some(())
    });
    assert!(off.is_some(), "ironguard powered the node off after processing");
    assert!(dhcp_becomes(&site.lan.nodes[0], n, false, Duration::from_secs(10)), "DHCP closed again");
    let data: Value = serde_json::from_str(&site.ctl_ok(&["inspect", "data", &uuid])).unwrap();
    assert_eq!(data["inventory"]["cpu"]["count"], 4, "the ramdisk's data is stored");
    // A callback for a node nobody inspects is refused, as ironic-inspector refuses it.
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[1], "10.77.0.51", &site.lan.dir, &ipa_inventory(&[other], "10.1.39.51"));
    assert!(!ok && err.contains("error 4"), "refused: {err}");
    drop(site.agent);
}

/// `openstack baremetal introspection ...` (python-ironic-inspector-client) against ironguard's inspector API.
#[test]
fn openstack_baremetal_introspection_commands_work_unchanged() {
    let site = Site::new(1, 1000);
    let n = mac("52:54:00:39:03:01");
    let uuid = site.ironic.enroll("node-osc", &[n], "10.1.39.60", "agent");
    site.ironic.drive_to(&uuid, "manageable");
    let osc = |args: &[&str]| -> (bool, String) {
        let out = site
            .lan
            .pxe
            .cmd(venv_bin("openstack"))
            .args(["--os-auth-type", "none", "--inspector-url", INSPECTOR, "baremetal", "introspection"])
            .args(args)
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run openstack");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };

    let (ok, out) = osc(&["start", "node-osc"]);
    assert!(ok, "introspection start: {out}");
    site.wait_inspection(&uuid, "waiting", Duration::from_secs(20));
    let (ok, out) = osc(&["status", &uuid, "-f", "json"]);
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((status["state"].as_str(), status["finished"].as_bool()), (Some("waiting"), Some(false)), "{status}");
    let (ok, out) = osc(&["list", "-f", "json"]);
    assert!(ok && out.contains(&uuid), "introspection list: {out}");

    let (ok, out) = osc(&["abort", &uuid]);
    assert!(ok, "introspection abort: {out}");
    site.wait_inspection(&uuid, "error", Duration::from_secs(20));
    assert!(dhcp(&site.lan.nodes[0], "eth0", n).is_none(), "aborted: no DHCP");

    let (ok, out) = osc(&["start", &uuid]);
    assert!(ok, "introspection start again: {out}");
    site.wait_inspection(&uuid, "waiting", Duration::from_secs(20));
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[0], "10.77.0.60", &site.lan.dir, &ipa_inventory(&[n], "10.1.39.60"));
    assert!(ok, "{err}");
    site.wait_inspection(&uuid, "finished", Duration::from_secs(20));
    let (ok, out) = osc(&["status", &uuid, "-f", "json"]);
    let status: Value = serde_json::from_str(&out).unwrap();
    assert!(ok && status["finished"] == true && status["error"].is_null(), "{out}");

    let saved = site.lan.dir.join("saved.json");
    let (ok, out) = osc(&["data", "save", &uuid, "--file", saved.to_str().unwrap()]);
    assert!(ok, "introspection data save: {out}");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(data["inventory"]["interfaces"][0]["mac_address"], n.to_string());

    let (ok, out) = osc(&["reprocess", &uuid]);
    assert!(ok, "introspection reprocess: {out}");
    site.wait_inspection(&uuid, "finished", Duration::from_secs(20));
    let (ok, out) = osc(&["status", "no-such-node"]);
    assert!(!ok && out.to_lowercase().contains("not found"), "an unknown node is reported: {out}");
}
