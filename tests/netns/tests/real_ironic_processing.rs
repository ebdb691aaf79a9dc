//! Processing against a real Ironic 39: what an inspection writes to Ironic once the ramdisk's data arrives, as
//! ironic-inspector's defaults and options give it — properties, capabilities, ports, root device hints, ramdisk
//! errors, lookup by BMC address and ties, discovery of unknown machines, introspection rules (through the
//! OpenStack client too) and reapply. The data is posted with ironic-python-agent's own callback code from a node's
//! namespace, shaped as IPA sends it; the real Ironic's node, ports and traits are the judge.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ironguard_dataplane::MacAddr;
use ironguard_netns_tests::ironic_site::{IronicSite as Site, dhcp_becomes, ipa_callback};
use ironguard_netns_tests::*;
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

/// IPA's data for a machine with two NICs (`pxe` boots; both have an IPv4 address), two disks (`/dev/vda` 20 GiB,
/// the root disk IPA reports, and `/dev/vdb` 100 GiB, serial `disk-2`), 4 CPUs with the flags vmx, aes and pdpe1gb,
/// and 8 GiB of RAM.
fn two_nics_two_disks(pxe: MacAddr, second: MacAddr, bmc: &str) -> Value {
    let mut d = ipa_inventory(&[pxe, second], bmc);
    d["inventory"]["cpu"]["flags"] = json!(["fpu", "vme", "lm", "vmx", "aes", "pdpe1gb", "sse4_2"]);
    let disks = d["inventory"]["disks"].as_array_mut().unwrap();
    let mut vdb = disks[0].clone();
    vdb["name"] = json!("/dev/vdb");
    vdb["size"] = json!(100 * GIB);
    vdb["serial"] = json!("disk-2");
    vdb["by_path"] = json!("/dev/disk/by-path/pci-0000:00:06.0");
    disks.push(vdb);
    d
}

fn props(site: &Site, uuid: &str) -> Value {
    site.ironic.node(uuid)["properties"].clone()
}

/// `k:v,k:v` as a set of pairs (ironic-inspector merges capabilities into a dict: the order is not the point).
fn capabilities(p: &Value) -> BTreeSet<String> {
    p["capabilities"].as_str().unwrap_or_default().split(',').filter(|s| !s.is_empty()).map(String::from).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The node's ports as Ironic has them: address → (pxe_enabled, extra).
fn ports(site: &Site, uuid: &str) -> std::collections::BTreeMap<String, (bool, Value)> {
    let v = site.ironic.api_ok("GET", &format!("/v1/ports?node_uuid={uuid}&fields=address,pxe_enabled,extra"), None);
    v["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["address"].as_str().unwrap().to_string(), (p["pxe_enabled"] == true, p["extra"].clone())))
        .collect()
}

fn port_uuid(site: &Site, address: MacAddr) -> String {
    let v = site.ironic.api_ok("GET", &format!("/v1/ports?address={address}&fields=uuid"), None);
    v["ports"][0]["uuid"].as_str().unwrap().to_string()
}

fn patch_node(site: &Site, uuid: &str, ops: Value) {
    site.ironic.api_ok("PATCH", &format!("/v1/nodes/{uuid}"), Some(&ops));
}

fn traits(site: &Site, uuid: &str) -> BTreeSet<String> {
    let v = site.ironic.api_ok("GET", &format!("/v1/nodes/{uuid}/traits"), None);
    v["traits"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

/// Polls Ironic until `check` holds for the node's properties (a reapply runs in the background).
fn wait_props(site: &Site, uuid: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let p = props(site, uuid);
        if check(&p) {
            return p;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{what} never happened: {p}\n{}", site.cp.proc.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The default hooks on a node with two NICs (one PXE), two disks and CPU flags; then root device hints and a
/// ramdisk error, each through reapply or a new inspection.
#[test]
fn default_hooks_fill_the_node_as_ironic_inspector_does() {
    let site = Site::new(1, 1000);
    let (pxe, second, stale) = (mac("52:54:00:40:00:01"), mac("52:54:00:40:00:02"), mac("52:54:00:40:00:03"));
    // The node's ports before: the PXE NIC (pxe_enabled wrongly false) and a port for a NIC the machine no longer has.
    let uuid = site.ironic.enroll("node-p", &[stale, pxe], "10.1.40.10", "agent");
    site.ironic.drive_to(&uuid, "manageable");
    site.start_inspection("node-p", &uuid);
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], pxe, true, DEADLINE), "the node boots");

    let data = two_nics_two_disks(pxe, second, "10.1.40.10");
    let t = Instant::now();
    let (ok, reply, err) = ipa_callback(&site.lan.nodes[0], "10.77.0.20", &site.lan.dir, &data);
    assert!(ok, "IPA's callback failed: {err}");
    assert_eq!(serde_json::from_str::<Value>(&reply).unwrap()["uuid"], uuid.as_str());
    site.wait_inspection(&uuid, "finished", Duration::from_secs(30));
    eprintln!("callback to finished: {:?}", t.elapsed());

    // ironic-inspector's defaults: strings, local_gb one GiB under the root disk (20 GiB), CPU flag capabilities.
    let p = props(&site, &uuid);
    assert_eq!(p["cpus"], "4", "{p}");
    assert_eq!(p["cpu_arch"], "x86_64", "{p}");
    assert_eq!(p["memory_mb"], "8192", "{p}");
    assert_eq!(p["local_gb"], "19", "{p}");
    assert_eq!(capabilities(&p), set(&["cpu_vt:true", "cpu_aes:true", "cpu_hugepages_1g:true"]), "{p}");
    // add_ports = pxe: no port for the second NIC; keep_ports = all: the stale port stays; update_pxe_enabled: the
    // PXE NIC's port is PXE-enabled again.
    let ports_after = ports(&site, &uuid);
    assert_eq!(ports_after.keys().cloned().collect::<Vec<_>>(), [pxe.to_string(), stale.to_string()]);
    assert!(ports_after[&pxe.to_string()].0, "the PXE port is pxe_enabled: {ports_after:?}");
    let off = wait_for(Duration::from_secs(10), || {
        (site.ironic.power_state(&uuid).as_deref() == Some("power off")).then_some(())
    });
    assert!(off.is_some(), "powered off after processing");

    // The processed data (hooks' results, no logs) and the data as IPA sent it.
    let processed = site.data(&uuid);
    assert_eq!(processed["local_gb"], 19);
    assert_eq!(processed["cpus"], 4);
    assert_eq!(processed["macs"], json!([pxe.to_string()]));
    assert_eq!(processed["root_disk"]["name"], "/dev/vda");
    assert!(processed["all_interfaces"]["eth1"]["pxe"] == false && processed["all_interfaces"]["eth0"]["pxe"] == true);
    assert!(processed.get("logs").is_none(), "logs are never stored");
    let raw: Value = serde_json::from_str(&site.ctl_ok(&["inspect", "data", &uuid, "--unprocessed"])).unwrap();
    assert!(raw.get("all_interfaces").is_none() && raw["inventory"] == data["inventory"], "as IPA sent it");

    // Root device hints: the 100 GiB disk by serial, through reapply (the stored data processed again).
    patch_node(&site, &uuid, json!([{"op": "add", "path": "/properties/root_device", "value": {"serial": "disk-2"}}]));
    site.ctl_ok(&["inspect", "reapply", &uuid]);
    wait_props(&site, &uuid, "local_gb from the hinted disk", |p| p["local_gb"] == "99");
    site.wait_inspection(&uuid, "finished", Duration::from_secs(20));
    assert_eq!(site.data(&uuid)["root_disk"]["serial"], "disk-2");
    // A hint no disk satisfies fails the inspection and changes nothing.
    patch_node(&site, &uuid, json!([{"op": "add", "path": "/properties/root_device", "value": {"name": "/dev/nope"}}]));
    site.ctl_ok(&["inspect", "reapply", &uuid]);
    let st = site.wait_inspection(&uuid, "error", Duration::from_secs(20));
    assert!(st["error"].as_str().unwrap().contains("No disks satisfied root device hints"), "{st}");
    assert_eq!(props(&site, &uuid)["local_gb"], "99", "nothing written");

    // A ramdisk error: IPA is told so (400) and nothing is written. Unlike ironic-inspector, the inspection is not
    // ended: anyone on the PXE network can post an `error` naming this node's MAC (it is in the node's DHCP
    // broadcasts), so a callback never ends an inspection. The node keeps waiting for its data, an abort or its
    // timeout, and `explain --timeline` shows the refused callback with the ramdisk's words.
    patch_node(&site, &uuid, json!([{"op": "remove", "path": "/properties/root_device"}]));
    site.start_inspection(&uuid, &uuid);
    let mut broken = data.clone();
    broken["error"] = json!("The disk controller reported a failure");
    let (ok, _, err) = ipa_callback(&site.lan.nodes[0], "10.77.0.20", &site.lan.dir, &broken);
    assert!(!ok && err.contains("400"), "IPA was refused: {err}");
    let st = site.wait_inspection(&uuid, "waiting", Duration::from_secs(20));
    assert!(st["error"].is_null(), "{st}");
    let timeline = site.ctl_ok(&["explain", &pxe.to_string(), "--timeline"]);
    assert!(timeline.contains("The disk controller reported a failure"), "{timeline}");
    assert_eq!(props(&site, &uuid)["local_gb"], "99", "nothing written");
    site.ctl_ok(&["inspect", "abort", &uuid]);
    let st = site.wait_inspection(&uuid, "error", Duration::from_secs(20));
    assert!(st["error"].as_str().unwrap().contains("aborted"), "{st}");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], pxe, false, DEADLINE), "DHCP closed after the abort");
}

/// Each option where it changes the result: add_ports = all, keep_ports = present, overwrite_existing = false,
/// disk_partitioning_spacing = false, boot_mode capability on, a CPU flag mapping of our own.
#[test]
fn processing_options_change_the_result() {
    let site = Site::with_config(
        1,
        1000,
        "[processing]\nadd_ports = \"all\"\nkeep_ports = \"present\"\noverwrite_existing = false\n\
         disk_partitioning_spacing = false\n\
         [processing.capabilities]\nboot_mode = true\ncpu_flags = { sse4_2 = \"cpu_sse42\" }\n",
    );
    let (pxe, second, stale) = (mac("52:54:00:41:00:01"), mac("52:54:00:41:00:02"), mac("52:54:00:41:00:03"));
    let uuid = site.ironic.enroll("node-o", &[pxe, stale], "10.1.41.10", "agent");
    patch_node(
        &site,
        &uuid,
        json!([{"op": "add", "path": "/properties/cpus", "value": "64"},
               {"op": "add", "path": "/properties/capabilities", "value": "existing:yes"}]),
    );
    let stale_port = port_uuid(&site, stale);
    site.ironic.drive_to(&uuid, "manageable");
    site.start_inspection("node-o", &uuid);
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], pxe, true, DEADLINE), "the node boots");
    let data = two_nics_two_disks(pxe, second, "10.1.41.10");
    let (ok, _, err) = ipa_callback(&site.lan.nodes[0], "10.77.0.21", &site.lan.dir, &data);
    assert!(ok, "{err}");
    site.wait_inspection(&uuid, "finished", Duration::from_secs(30));

    let p = props(&site, &uuid);
    assert_eq!(p["cpus"], "64", "overwrite_existing = false keeps what was set: {p}");
    assert_eq!(p["memory_mb"], "8192", "and sets what was not: {p}");
    assert_eq!(p["local_gb"], "20", "no partitioning spacing: {p}");
    assert_eq!(capabilities(&p), set(&["existing:yes", "boot_mode:bios", "cpu_sse42:true"]), "{p}");
    let ports_after = ports(&site, &uuid);
    assert_eq!(
        ports_after.keys().cloned().collect::<Vec<_>>(),
        [pxe.to_string(), second.to_string()],
        "add_ports = all creates the second NIC's port; keep_ports = present deletes the stale one"
    );
    assert!(!ports_after[&second.to_string()].0, "the new non-PXE port is not PXE-enabled");
    // No DHCP from the second NIC was seen: its port is marked, and the next inspection does not allow it.
    assert!(ports_after[&second.to_string()].1.get("ironguard_unverified").is_some(), "{ports_after:?}");
    assert!(ports_after[&pxe.to_string()].1.get("ironguard_unverified").is_none(), "{ports_after:?}");
    site.start_inspection(&uuid, &uuid);
    let why: Value = serde_json::from_str(&site.ctl_ok(&["explain", &second.to_string(), "--json"])).unwrap();
    assert!(!why["decision"].as_str().unwrap().starts_with("allowed"), "{why:#}");
    let why: Value = serde_json::from_str(&site.ctl_ok(&["explain", &pxe.to_string(), "--json"])).unwrap();
    assert!(why["decision"].as_str().unwrap().starts_with("allowed"), "{why:#}");
    let (status, _) = site.ironic.api("GET", &format!("/v1/ports/{stale_port}"), None);
    assert_eq!(status, 404, "the stale port is gone");
}

/// Lookup by BMC address alone refused (O26: anyone can name a BMC address), a tie refused without touching either
/// node, and discovery: an unknown machine boots only while an operator's discovery window is open on its network,
/// and is then enrolled in Ironic with its BMC address; once the window is closed, unknown machines boot no more.
#[test]
fn lookup_by_bmc_ties_and_discovery() {
    let site = Site::with_config(
        3,
        1000,
        "[filter]\nunknown_mac_policy = \"while-inspecting\"\n\
         [discovery]\nnode_not_found_hook = \"enroll\"\nenroll_node_driver = \"fake-hardware\"\n\
         enroll_node_fields = { resource_class = \"discovered\" }\n",
    );
    let (a, b, c) = (mac("52:54:00:42:00:0a"), mac("52:54:00:42:00:0b"), mac("52:54:00:42:00:0c"));
    let node_a = site.ironic.enroll("node-a", &[a], "10.1.42.10", "agent");
    let node_b = site.ironic.enroll("node-b", &[b], "10.1.42.11", "agent");
    for n in [&node_a, &node_b] {
        site.ironic.drive_to(n, "manageable");
        site.start_inspection(n, n);
    }

    // A tie: one attribute of each node. Refused (400, ironic-inspector's words), neither node touched.
    let tie = ipa_inventory(&[a], "10.1.42.11");
    let (ok, _, err) = ipa_callback(&site.lan.nodes[0], "10.77.0.30", &site.lan.dir, &tie);
    assert!(!ok && err.contains("Multiple nodes match the same number of attributes"), "{err}");
    assert_eq!(site.inspection_state(&node_a)["state"], "waiting");
    assert_eq!(site.inspection_state(&node_b)["state"], "waiting");

    // By BMC address alone: node-b's BMC and a NIC that is none of node-b's ports, booted from that NIC. The lookup
    // finds node-b, but nothing ties the poster to node-b's inspection (it was not allowed DHCP for it): refused
    // (ironic-inspector would give node-b this machine's hardware and a port for its NIC), nothing changes.
    let new_nic = mac("52:54:00:42:00:1b");
    let by_bmc = ipa_inventory(&[new_nic], "10.1.42.11");
    let (ok, _, err) = ipa_callback(&site.lan.nodes[1], "10.77.0.31", &site.lan.dir, &by_bmc);
    assert!(!ok && err.contains(&format!("boot interface {new_nic} was not allowed DHCP")), "{err}");
    assert_eq!(site.inspection_state(&node_b)["state"], "waiting");
    assert!(!ports(&site, &node_b).contains_key(&new_nic.to_string()), "no port for the poster's NIC");
    assert!(props(&site, &node_b).get("cpu_arch").is_none(), "no property written");
    site.ctl_ok(&["inspect", "abort", &node_a]);
    site.ctl_ok(&["inspect", "abort", &node_b]);

    // Discovery: no window, no DHCP for a machine nobody knows (the enroll hook alone does not open the network).
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[2], c, false, DEADLINE), "no window: unknown MACs get nothing");
    let listed = site.ctl_ok(&["discovery", "list"]);
    assert!(listed.contains("no discovery window is open"), "{listed}");
    let bad = site.ctl(&["discovery", "open", "--network", "test", "--for", "3d"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("24 hours"), "{bad:?}");
    let opened = site.ctl_ok(&["discovery", "open", "--network", "test", "--for", "10m"]);
    assert!(opened.contains("test") && (opened.contains("9m") || opened.contains("10m")), "{opened}");
    // Inside the window: a machine Ironic does not know gets DHCP, sends its data, and is enrolled.
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[2], c, true, DEADLINE), "unknown MACs boot for discovery");
    let unknown = ipa_inventory(&[c], "10.1.42.99");
    let (ok, reply, err) = ipa_callback(&site.lan.nodes[2], "10.77.0.32", &site.lan.dir, &unknown);
    assert!(ok, "{err}\n{}", site.cp.proc.log_text());
    let new_uuid = serde_json::from_str::<Value>(&reply).unwrap()["uuid"].as_str().unwrap().to_string();
    site.wait_inspection(&new_uuid, "finished", Duration::from_secs(30));
    let node = site.ironic.node(&new_uuid);
    assert_eq!(node["driver"], "fake-hardware");
    assert_eq!(node["driver_info"]["ipmi_address"], "10.1.42.99");
    assert_eq!(node["resource_class"], "discovered", "enroll_node_fields");
    assert_eq!(node["provision_state"], "enroll");
    assert_eq!(node["properties"]["memory_mb"], "8192");
    assert_eq!(ports(&site, &new_uuid).keys().cloned().collect::<Vec<_>>(), [c.to_string()]);
    assert_eq!(site.data(&new_uuid)["auto_discovered"], true);
    // The same machine again: its inspection is over, so it is refused (without naming the node, which
    // ironic-inspector would: a caller could probe MACs for node UUIDs); it is not enrolled twice.
    let (ok, _, err) = ipa_callback(&site.lan.nodes[2], "10.77.0.32", &site.lan.dir, &unknown);
    assert!(!ok && err.contains("No node is waiting for introspection data from this machine"), "{err}");
    assert!(!err.contains(&new_uuid), "{err}");
    // A machine none of ironguard's inspections knows, but whose MAC or BMC address belongs to an Ironic node:
    // refused, nothing enrolled. A port's MAC is denied DHCP (the Ironic sync), so it cannot have booted through
    // the filter: refused before Ironic is asked anything.
    let d = mac("52:54:00:42:00:0d");
    let node_d = site.ironic.enroll("node-d", &[d], "10.1.42.13", "agent");
    let port_d = port_uuid(&site, d);
    let denied = wait_for(Duration::from_secs(30), || {
        let why: Value = serde_json::from_str(&site.ctl_ok(&["explain", &d.to_string(), "--json"])).ok()?;
        why["decision"].as_str()?.starts_with("denied").then_some(())
    });
    assert!(denied.is_some(), "the Ironic sync denies node-d's port");
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[2], "10.77.0.32", &site.lan.dir, &ipa_inventory(&[d], "10.1.42.98"));
    assert!(!ok && err.contains(&format!("boot interface {d} is denied DHCP")), "{err}");
    assert!(!err.contains(&port_d) && !err.contains(&node_d), "{err}");
    // A new MAC that boots, with node-d's BMC address: the enroll hook refuses it. (ironic-inspector names the
    // port or node that is in the way; ironguard does not tell a caller on the provisioning network which node
    // owns an address. The control plane's log says it.)
    let refused = "this machine cannot be enrolled: one of its MAC or BMC addresses already belongs to an Ironic node";
    let e = mac("52:54:00:42:00:0e");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[2], e, true, DEADLINE), "unknown MACs boot for discovery");
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[2], "10.77.0.32", &site.lan.dir, &ipa_inventory(&[e], "10.1.42.13"));
    assert!(!ok && err.contains(refused) && !err.contains(&node_d), "{err}");
    let log = site.cp.proc.log_text();
    assert!(log.contains(&format!("Node {node_d} already has BMC address 10.1.42.13")), "the log names the node");
    let nodes = site.ironic.api_ok("GET", "/v1/nodes?fields=uuid", None);
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 4, "nothing more enrolled");
    // The window closed: unknown machines get no DHCP again.
    let closed = site.ctl_ok(&["discovery", "close", "--network", "test"]);
    assert!(closed.contains("no discovery window is open"), "{closed}");
    let f = mac("52:54:00:42:00:0f");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[2], f, false, DEADLINE), "closed: unknown MACs get nothing");
}

/// Introspection rules through `openstack baremetal introspection rule ...` and `ironguardctl rules`: conditions on
/// the data and the node, set-attribute with formatting, set-capability, add-trait, a rule that fails the
/// inspection, scope, and reapply after a rule changed.
#[test]
fn introspection_rules_through_the_openstack_client() {
    let site = Site::new(2, 1000);
    let (a, b) = (mac("52:54:00:43:00:0a"), mac("52:54:00:43:00:0b"));
    let node_a = site.ironic.enroll("node-a", &[a], "10.1.43.10", "agent");
    let node_b = site.ironic.enroll("node-b", &[b], "10.1.43.11", "agent");
    for n in [&node_a, &node_b] {
        site.ironic.drive_to(n, "manageable");
    }
    let rules = json!([
        {"description": "big memory", "conditions": [
            {"op": "ge", "field": "memory_mb", "value": 4096},
            {"op": "eq", "field": "node://driver", "value": "fake-hardware"}],
         "actions": [
            {"action": "set-attribute", "path": "/extra/bmc", "value": "{data[inventory][bmc_address]}"},
            {"action": "set-capability", "name": "memory", "value": "big"},
            {"action": "add-trait", "name": "CUSTOM_BIG_MEMORY"}]},
        {"description": "no QEMU in rack 2", "scope": "rack2", "conditions": [
            {"op": "eq", "field": "inventory.system_vendor.manufacturer", "value": "QEMU"}],
         "actions": [{"action": "fail", "message": "QEMU machines are not allowed in rack 2"}]}
    ]);
    let file = site.lan.dir.join("rules.json");
    std::fs::write(&file, rules.to_string()).unwrap();
    let (ok, out) = site.openstack(&["rule", "import", file.to_str().unwrap(), "-f", "json"]);
    assert!(ok, "rule import: {out}");
    let (ok, out) = site.openstack(&["rule", "list", "-f", "json"]);
    assert!(ok, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let big = listed.as_array().unwrap().iter().find(|r| r["Description"] == "big memory").expect("listed");
    let big_uuid = big["UUID"].as_str().unwrap().to_string();
    let (ok, out) = site.openstack(&["rule", "show", &big_uuid, "-f", "json"]);
    assert!(ok && out.contains("CUSTOM_BIG_MEMORY"), "rule show: {out}");
    // An invalid rule is refused with a clear error and stores nothing.
    let bad = site.lan.dir.join("bad-rule.json");
    std::fs::write(&bad, json!({"conditions": [], "actions": [{"action": "no-such-action"}]}).to_string()).unwrap();
    let (ok, out) = site.openstack(&["rule", "import", bad.to_str().unwrap()]);
    assert!(!ok && out.contains("no-such-action"), "{out}");
    let listed: Value = serde_json::from_str(&site.ctl_ok(&["rules", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "ironguardctl sees the same two rules");

    // node-a matches the first rule only (the second is scoped to rack 2).
    site.start_inspection("node-a", &node_a);
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], a, true, DEADLINE), "node-a boots");
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[0], "10.77.0.40", &site.lan.dir, &ipa_inventory(&[a], "10.1.43.10"));
    assert!(ok, "{err}");
    site.wait_inspection(&node_a, "finished", Duration::from_secs(30));
    let n = site.ironic.node(&node_a);
    assert_eq!(n["extra"]["bmc"], "10.1.43.10", "{n}");
    assert!(capabilities(&n["properties"]).contains("memory:big"), "{n}");
    assert!(capabilities(&n["properties"]).contains("cpu_vt:true"), "the hooks' capabilities stay: {n}");
    assert_eq!(traits(&site, &node_a), set(&["CUSTOM_BIG_MEMORY"]));

    // node-b is in rack 2: the failing rule applies; the inspection ends in error with its message.
    patch_node(&site, &node_b, json!([{"op": "add", "path": "/properties/inspection_scope", "value": "rack2"}]));
    site.start_inspection("node-b", &node_b);
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[1], b, true, DEADLINE), "node-b boots");
    let (ok, _, err) =
        ipa_callback(&site.lan.nodes[1], "10.77.0.41", &site.lan.dir, &ipa_inventory(&[b], "10.1.43.11"));
    assert!(ok, "the data was accepted; the rule fails the inspection afterwards: {err}");
    let st = site.wait_inspection(&node_b, "error", Duration::from_secs(30));
    assert!(st["error"].as_str().unwrap().contains("QEMU machines are not allowed in rack 2"), "{st}");

    // Rules changed, then reapply: the stored data meets the new rules.
    let (ok, out) = site.openstack(&["rule", "delete", &big_uuid]);
    assert!(ok, "rule delete: {out}");
    let trait_rule = site.lan.dir.join("trait-rule.json");
    std::fs::write(
        &trait_rule,
        json!({"description": "drop the trait", "actions": [
            {"action": "remove-trait", "name": "CUSTOM_BIG_MEMORY"},
            {"action": "add-trait", "name": "CUSTOM_REAPPLIED"}]})
        .to_string(),
    )
    .unwrap();
    site.ctl_ok(&["rules", "import", trait_rule.to_str().unwrap()]);
    site.ctl_ok(&["inspect", "reapply", &node_a]);
    let t = Instant::now();
    while traits(&site, &node_a) != set(&["CUSTOM_REAPPLIED"]) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "reapply did not apply the new rules: {:?}",
            traits(&site, &node_a)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (ok, out) = site.openstack(&["rule", "purge"]);
    assert!(ok, "rule purge: {out}");
    let (ok, out) = site.openstack(&["rule", "list", "-f", "json"]);
    assert!(ok && serde_json::from_str::<Value>(&out).unwrap().as_array().unwrap().is_empty(), "{out}");
}
