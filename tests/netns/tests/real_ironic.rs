//! ironguard against a real OpenStack Ironic 39 (standalone, noauth, fake-hardware, sqlite; see
//! `tests/netns/src/ironic.rs`), with the real control plane and agent, a real dnsmasq and real DHCP clients in
//! network namespaces. The real Ironic is the judge: its pagination, its provision states, its
//! `/v1/continue_inspection`, its power and boot APIs, and the OpenStack clients and ironic-python-agent code
//! that talk to ironguard's inspector API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ironguard_dataplane::MacAddr;
use ironguard_netns_tests::ironic_site::{IronicSite as Site, dhcp_becomes, ipa_callback};
use ironguard_netns_tests::*;
use serde_json::Value;

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
    let leases = site.lan.dhcp_all(&[(0, a, Want::Nothing), (1, b, Want::Nothing), (2, unknown, Want::Nothing)]);
    assert!(leases.iter().all(Option::is_none), "nobody gets DHCP while nothing is inspected: {leases:?}");

    site.ironic.drive_to(&node_a, "inspect wait");
    assert_eq!(site.ironic.power_state(&node_a).as_deref(), Some("power on"), "Ironic powered the node on");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], a, true, DEADLINE), "the node Ironic inspects boots");
    assert!(site.reasons(a).0.contains(&"ironic-inspection".to_string()));
    let others = site.lan.dhcp_all(&[(1, b, Want::Nothing), (2, unknown, Want::Nothing)]);
    assert!(others.iter().all(Option::is_none), "only that node: {others:?}");

    // The ramdisk's data reaches Ironic (lookup by MAC and BMC address); Ironic finishes, ironguard closes.
    let (status, reply) = site.ironic.continue_inspection(&ipa_inventory(&[a], "10.1.39.10"));
    assert_eq!(status, 202, "Ironic accepted the inspection data: {reply}");
    assert_eq!(reply["node"]["uuid"], node_a.as_str());
    let node = site.ironic.wait_provision_state(&node_a, "manageable", Duration::from_secs(20));
    assert_eq!(node["properties"]["cpu_arch"], "x86_64", "Ironic processed the data itself");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], a, false, DEADLINE), "closed again after inspection");
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
    let clients: Vec<(usize, MacAddr, Want)> = [9u8, 3, 4, 5, 6, 7]
        .iter()
        .enumerate()
        .map(|(ns, i)| (ns, m(*i), if ns == 0 { Want::Lease } else { Want::Nothing }))
        .collect();
    let leases = site.lan.dhcp_all(&clients);
    let seen = watcher.stop();

    assert!(leases[0].is_some(), "w5, on the last page, gets its lease");
    for (k, lease) in leases.iter().enumerate().skip(1) {
        assert!(lease.is_none(), "{} ({}) got a lease: {lease:?}", plan[[9usize, 3, 4, 5, 6, 7][k]].0, clients[k].1);
    }
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
    // Ironic answers a power change with 202 and its conductor applies it a moment later.
    let on = wait_for(Duration::from_secs(30), || {
        (site.ironic.power_state(&uuid).as_deref() == Some("power on")).then_some(())
    });
    assert!(on.is_some(), "ironguard powered the node on: {:?}", site.ironic.power_state(&uuid));
    // Ironic's own request log: the boot device was set to PXE before the power-on.
    let log = site.ironic.proc.log_text();
    let boot = log.find(&format!("PUT /v1/nodes/{uuid}/management/boot_device - 204"));
    let power = log.find(&format!("PUT /v1/nodes/{uuid}/states/power - 202"));
    assert!(boot.is_some() && power.is_some() && boot < power, "PXE, then power on, in Ironic's log:\n{log}");
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], n, true, DEADLINE), "the inspected node boots");
    assert!(no_dhcp(&site.lan.pxe, &site.lan.nodes[1], "eth0", other).is_none(), "the other node does not");
    // `ironguardctl explain` says why, with the state behind each reason: ironguard's inspection record and the
    // node Ironic owns the port of (asked now), and this host's kernel agrees.
    let why: Value = serde_json::from_str(&site.ctl_ok(&["explain", &n.to_string(), "--local", "--json"])).unwrap();
    assert!(why["decision"].as_str().unwrap().starts_with(&format!("allowed (inspection:{uuid})")), "{why:#}");
    assert_eq!(why["local"]["served"], true, "{why:#}");
    let nodes = why["nodes"].as_array().unwrap();
    assert!(nodes.iter().any(|x| x["source"] == "ironguard inspection" && x["state"] == "waiting"), "{why:#}");
    assert!(nodes.iter().any(|x| x["source"] == "ironic" && x["node"] == uuid.as_str() && x["name"] == "node-ig"));
    let why: Value = serde_json::from_str(&site.ctl_ok(&["explain", &other.to_string(), "--json"])).unwrap();
    assert_eq!(why["decision"], "denied (ironic)", "{why:#}");
    let ironic = why["nodes"].as_array().unwrap().iter().find(|x| x["source"] == "ironic").expect("Ironic asked");
    assert_eq!((ironic["name"].as_str(), ironic["state"].as_str()), (Some("node-other"), Some("manageable")));

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
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], n, false, DEADLINE), "DHCP closed again");
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
    let osc = |args: &[&str]| site.openstack(args);
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
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], n, false, DEADLINE), "aborted: no DHCP");

    let (ok, out) = osc(&["start", &uuid]);
    assert!(ok, "introspection start again: {out}");
    site.wait_inspection(&uuid, "waiting", Duration::from_secs(20));
    // The node boots through the filter: the evidence its ramdisk's data needs.
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], n, true, DEADLINE), "the inspected node boots");
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

/// `auth_strategy = "keystone"` against a real Keystone (`tests/netns/src/keystone.rs`): the OpenStack client logs
/// in to Keystone and sends its token; ironguard validates it with Keystone as its own service user. An operator's
/// token runs `openstack baremetal introspection rule import|start|status|list`; no token, a token Keystone never
/// issued and a reader's token are refused (401, 401, 403) and change nothing: no inspection, no rule, the node
/// still `manageable` in Ironic.
#[test]
fn openstack_baremetal_introspection_with_a_real_keystone_token() {
    use ironguard_netns_tests::ironic_site::INSPECTOR;
    use ironguard_netns_tests::keystone::{ADMIN_PASSWORD, VIEWER_PASSWORD};
    let site = Site::with_keystone(1, 1000);
    let ks = site.keystone.as_ref().unwrap();
    let n = mac("52:54:00:39:05:01");
    let uuid = site.ironic.enroll("node-ks", &[n], "10.1.39.70", "agent");
    site.ironic.drive_to(&uuid, "manageable");
    let introspection = |user: &str, password: &str, args: &[&str]| {
        let all: Vec<&str> = ["--inspector-url", INSPECTOR, "baremetal", "introspection"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        ks.openstack(&site.lan.pxe, user, password, &all)
    };
    let rules = site.lan.dir.join("rules.json");
    let rule = serde_json::json!([{"description": "keystone rule", "conditions": [
        {"op": "eq", "field": "node://driver", "value": "fake-hardware"}],
        "actions": [{"action": "set-attribute", "path": "/extra/checked_by", "value": "keystone"}]}]);
    std::fs::write(&rules, rule.to_string()).unwrap();
    let rules = rules.to_str().unwrap();

    // Refused, each for its reason.
    // The words of a 401 and a 403 as keystonemiddleware and webob give them (the OpenStack client prints the
    // body's message, not the status code).
    let unauthenticated = |out: &str| out.contains("The request you have made requires authentication");
    let forbidden = |out: &str| out.contains("Access was denied to this resource");
    let (ok, out) = site.openstack(&["start", "node-ks"]);
    assert!(!ok && unauthenticated(&out), "no token: {out}");
    let forged = site
        .lan
        .pxe
        .cmd("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "X-Auth-Token: gAAAAABforgedforgedforgedforgedforgedforgedforged"])
        .arg(format!("{INSPECTOR}/v1/introspection/{uuid}"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&forged.stdout), "401", "a token Keystone never issued");
    let (ok, out) = introspection("viewer", VIEWER_PASSWORD, &["start", "node-ks"]);
    assert!(!ok && forbidden(&out), "a reader's token: {out}");
    let (ok, out) = introspection("viewer", VIEWER_PASSWORD, &["rule", "import", rules]);
    assert!(!ok && forbidden(&out), "a reader's token: {out}");
    let (ok, out) = introspection("admin", "wrong-password", &["list"]);
    assert!(!ok && unauthenticated(&out), "Keystone itself refuses a wrong password: {out}");
    assert!(!site.ctl(&["inspect", "status", &uuid]).status.success(), "no inspection was started");
    let listed: Value = serde_json::from_str(&site.ctl_ok(&["rules", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "no rule was stored: {listed}");
    assert_eq!(site.ironic.provision_state(&uuid), "manageable");

    // The operator's token.
    let (ok, out) = introspection("admin", ADMIN_PASSWORD, &["rule", "import", rules, "-f", "json"]);
    assert!(ok, "rule import: {out}");
    let (ok, out) = introspection("admin", ADMIN_PASSWORD, &["rule", "list", "-f", "json"]);
    assert!(ok && out.contains("keystone rule"), "rule list: {out}");
    let (ok, out) = introspection("admin", ADMIN_PASSWORD, &["start", "node-ks"]);
    assert!(ok, "introspection start: {out}");
    site.wait_inspection(&uuid, "waiting", Duration::from_secs(30));
    let (ok, out) = introspection("admin", ADMIN_PASSWORD, &["status", &uuid, "-f", "json"]);
    assert!(ok, "introspection status: {out}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((status["state"].as_str(), status["finished"].as_bool()), (Some("waiting"), Some(false)), "{status}");
    let (ok, out) = introspection("admin", ADMIN_PASSWORD, &["list", "-f", "json"]);
    assert!(ok && out.contains(&uuid), "introspection list: {out}");
    // The started inspection is real: Ironic powered the node on for it, and it boots through the filter.
    assert!(dhcp_becomes(&site.lan.pxe, &site.lan.nodes[0], n, true, DEADLINE), "the inspected node boots");
    drop(site.agent);
}
