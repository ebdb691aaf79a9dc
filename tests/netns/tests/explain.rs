//! `ironguardctl explain MAC` across HA: three PXE hosts with real agents, dnsmasq and etcd, two control-plane
//! replicas. The answer is checked against what really happens — a real DHCP exchange and each host's kernel read
//! with `--local` — for an unknown MAC, an allowed one, a denied one, and after the leader stops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{SystemTime, UNIX_EPOCH};

use ironguard_netns_tests::ha::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;
use serde_json::Value;

const NODE_MAC: &str = "52:54:00:45:00:01";
const CP: &str = "https://10.90.0.1:9110";

/// `ironguardctl explain` from the management namespace (through the second replica: any replica answers).
fn explain(site: &HaSite, extra: &[&str]) -> Value {
    let mut args = vec!["--controlplane", CP, "explain", NODE_MAC, "--json"];
    args.extend(extra);
    let out = run_ok(ctl_cmd(&site.mgmt).args(&args));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// `explain --local --netns` of host `i`'s namespace: the kernel's own verdict there.
fn local(site: &HaSite, i: usize) -> Value {
    explain(site, &["--local", "--netns", site.hosts[i].ns.name()])["local"].clone()
}

fn host(j: &Value, i: usize) -> &Value {
    j["hosts"].as_array().unwrap().iter().find(|h| h["agent"]["agent_id"] == format!("pxe-{i}")).expect("host listed")
}

fn ctl_ok(site: &HaSite, args: &[&str]) {
    let mut all = vec!["--controlplane", CP];
    all.extend(args);
    run_ok(ctl_cmd(&site.mgmt).args(&all));
}

/// Waits until the explanation satisfies `ready` (the agents apply and report asynchronously).
fn explain_until(site: &HaSite, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    wait_for(DEADLINE, || Some(explain(site, &[])).filter(|j| ready(j)))
        .unwrap_or_else(|| panic!("{what}; last answer: {:#}", explain(site, &[])))
}

#[test]
fn explain_answers_per_host_and_matches_the_kernel_and_real_dhcp() {
    let site = HaSite::with_options(HaOptions { policy: "deny", ..Default::default() });
    site.wait_leader(None, DEADLINE).expect("a leader is elected");
    // Which host leads is read again at each step: on a busy machine etcd itself can be starved long enough that
    // every session is fenced and the lead moves (each host closed by its fence first; faults.rs proves that).

    // Unknown MAC, unknown-MAC policy deny: nobody serves it, and the leader's rule says why.
    let j = explain_until(&site, "three agents reported, one of them elected", |j| {
        j["hosts"].as_array().is_some_and(|h| h.len() == 3 && h.iter().any(|h| h["agent"]["elected"] == true))
    });
    let leader = elected(&j);
    let follower = (leader + 1) % 3;
    assert!(j["decision"].as_str().unwrap().starts_with("unknown MAC"), "{j:#}");
    assert_eq!(j["unknown_mac_policy"], "deny");
    assert_eq!(j["served_anywhere"], false, "{j:#}");
    assert_eq!(j["coordination"], "etcd");
    let l = host(&j, leader);
    assert!(l["rule"].as_str().unwrap().starts_with("ironguard:not-marked"), "{l:#}");
    assert!(l["why"].as_str().unwrap().contains("unknown-MAC policy denies"), "{l:#}");
    assert!(l["lease_until_unix_ms"].as_u64().is_some(), "the leader reports its kernel lease: {l:#}");
    assert!(host(&j, follower)["why"].as_str().unwrap().contains("follower"), "{j:#}");
    assert!(site.dhcp_refused(0, mac(NODE_MAC)).is_none(), "no lease for an unknown MAC");

    // Allowed: exactly the elected leader serves it, with the allow rule, as DHCP and its kernel confirm.
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    ctl_ok(&site, &["filters", "allow", NODE_MAC]);
    let j = explain_until(&site, "the allowed MAC is served", |j| j["served_anywhere"] == true);
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let served: Vec<&Value> = j["hosts"].as_array().unwrap().iter().filter(|h| h["served"] == true).collect();
    assert_eq!(served.len(), 1, "exactly one host serves: {j:#}");
    assert_eq!(served[0]["agent"]["elected"], true, "the one that serves is the elected one: {j:#}");
    let leader = elected(&j);
    assert!(served[0]["rule"].as_str().unwrap().starts_with("ironguard:allow-mac"), "{j:#}");
    assert_eq!(j["allow"][0]["reason"], "api");
    assert!(j["allow"][0]["source"].as_str().unwrap().contains("operator"), "{j:#}");
    let since = j["allow"][0]["since_unix_ms"].as_u64().unwrap();
    assert!(
        since >= before.saturating_sub(1000) && since <= after,
        "since {since}: recorded between the request ({before}) and the answer ({after})"
    );
    assert!(j["changed_revision"].as_u64().unwrap() > 0 && j["changed_revision"] == j["revision"], "{j:#}");
    // The text an operator reads: one line per host, the leader's says YES and names the rule.
    // Read again until it shows the leader serving: a busy machine may catch the leader for a moment without its
    // kernel lease (a late lease write is dropped until the next refresh).
    let explain_text = |leader: usize| {
        let out = run_ok(ctl_cmd(&site.mgmt).args([
            "--controlplane",
            CP,
            "explain",
            NODE_MAC,
            "--local",
            "--netns",
            site.hosts[leader].ns.name(),
        ]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let serving = |t: &String, leader: usize| {
        t.lines().any(|l| l.contains(&format!("pxe-{leader} *")) && l.contains("YES")) && t.contains("SERVED")
    };
    let (text, leader) = wait_for(DEADLINE, || {
        let leader = leader_now(&site);
        Some((explain_text(leader), leader)).filter(|(t, l)| serving(t, *l))
    })
    .unwrap_or_else(|| (explain_text(leader), leader));
    eprintln!("{text}");
    assert!(text.starts_with(&format!("MAC {NODE_MAC}: allowed (api)")), "{text}");
    let line = text.lines().find(|l| l.contains(&format!("pxe-{leader} *"))).expect("the elected host's line");
    assert!(line.contains("LEADER") && line.contains("YES") && line.contains("ironguard:allow-mac"), "{line}");
    assert!(text.contains("this host's kernel") && text.contains("SERVED"), "{text}");
    let lease = site.dhcp(0, mac(NODE_MAC)).expect("the allowed MAC gets a lease");
    let server = site.hosts.iter().position(|h| h.ip == lease.server_id).expect("the lease names a PXE host");
    let k = wait_for(DEADLINE, || Some(local(&site, server)).filter(|k| k["served"] == true))
        .unwrap_or_else(|| local(&site, server));
    assert_eq!((k["served"].as_bool(), k["in_allow"].as_bool()), (Some(true), Some(true)), "{k:#}");
    assert!(k["rule"].as_str().unwrap().starts_with("ironguard:allow-mac"), "{k:#}");
    let leader = leader_now(&site);
    let follower = (leader + 1) % 3;
    let k = local(&site, follower);
    assert_eq!(k["served"], false, "{k:#}");
    assert!(k["rule"].as_str().unwrap().starts_with("ironguard:not-marked"), "{k:#}");

    // Denied: the deny rule decides on every host; no lease.
    ctl_ok(&site, &["filters", "deny", NODE_MAC]);
    let j = explain_until(&site, "the denied MAC is denied everywhere", |j| {
        j["hosts"].as_array().unwrap().iter().all(|h| h["in_deny"] == true)
    });
    assert_eq!(j["decision"], "denied (api)");
    assert_eq!(j["served_anywhere"], false);
    for h in j["hosts"].as_array().unwrap() {
        assert!(h["rule"].as_str().unwrap().starts_with("ironguard:deny-mac"), "{h:#}");
    }
    assert!(site.dhcp_refused(0, mac(NODE_MAC)).is_none(), "no lease for a denied MAC");
    assert!(local(&site, leader_now(&site))["rule"].as_str().unwrap().starts_with("ironguard:deny-mac"));

    // The leader stops: another host takes over and serves the (again allowed) MAC; the stopped host's kernel
    // drops it at the guard.
    ctl_ok(&site, &["filters", "allow", NODE_MAC]);
    let mut site = site;
    let leader = leader_now(&site);
    signal_agent(&mut site.hosts[leader], Signal::SIGTERM).expect("the agent exits on SIGTERM");
    site.wait_leader(Some(leader), DEADLINE).expect("a successor leads");
    // Which host succeeds is read from the answer: on a busy machine the first successor may fence and hand over
    // again (each host closed by its fence first).
    let served =
        |j: &Value| -> Vec<usize> { (0..3).filter(|i| *i != leader && host(j, *i)["served"] == true).collect() };
    let j = explain_until(&site, "a successor serves the MAC", |j| {
        served(j).len() == 1 && host(j, leader)["served"] == false
    });
    assert_eq!(j["hosts"].as_array().unwrap().iter().filter(|h| h["served"] == true).count(), 1, "{j:#}");
    let k = local(&site, leader);
    assert_eq!(k["served"], false);
    assert!(k["rule"].as_str().unwrap().starts_with("ironguard-guard:drop-unmarked"), "{k:#}");
    let lease = site.dhcp(0, mac(NODE_MAC)).expect("a lease from a successor");
    assert_ne!(lease.server_id, site.hosts[leader].ip, "not from the stopped host");

    // A malformed MAC is a usage error before anything is asked.
    let out = ctl_cmd(&site.mgmt).args(["--controlplane", CP, "explain", "52:54:00:zz:00:01"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("52:54:00:zz:00:01"));
}

/// The index of the host the answer says is elected.
fn elected(j: &Value) -> usize {
    let h = j["hosts"].as_array().unwrap().iter().find(|h| h["agent"]["elected"] == true).expect("an elected host");
    let id = h["agent"]["agent_id"].as_str().unwrap();
    id.strip_prefix("pxe-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("agent id {id}"))
}

/// The host that leads now, as the site's kernels show.
fn leader_now(site: &HaSite) -> usize {
    site.wait_leader(None, DEADLINE).expect("a leader").0
}

/// The first host's line of what its kernel saw, or Null.
fn seen(j: &Value, i: usize) -> Value {
    host(j, i)["seen"].clone()
}

fn count(v: &Value, kind: &str) -> u64 {
    v[kind]["count"].as_u64().unwrap_or(0)
}

#[test]
fn explain_timeline_follows_a_real_boot_to_where_it_stops() {
    const BOOT_MAC: &str = "52:54:00:45:00:02";
    let site = HaSite::with_options(HaOptions { policy: "deny", ..Default::default() });
    let (leader, _) = site.wait_leader(None, DEADLINE).expect("a leader is elected");
    let timeline = |what: &str, ready: &dyn Fn(&Value) -> bool| {
        let ask = || {
            let out = run_ok(ctl_cmd(&site.mgmt).args(["--controlplane", CP, "explain", BOOT_MAC, "--json"]));
            serde_json::from_slice::<Value>(&out.stdout).expect("json")
        };
        wait_for(DEADLINE, || Some(ask()).filter(|j| ready(j)))
            .unwrap_or_else(|| panic!("{what}; last answer: {:#}", ask()))
    };

    // Before the node sends anything: every host observes, nothing seen anywhere.
    let j = timeline("three agents report their observation", &|j| {
        j["hosts"].as_array().is_some_and(|h| h.len() == 3 && h.iter().all(|h| h["seen_observed"] == true))
    });
    assert!(
        j["diagnosis"].as_str().unwrap().starts_with("no DHCP request from this MAC reached any PXE host"),
        "{j:#}"
    );

    // Unknown MAC, policy deny: its DISCOVERs reach every host (broadcast on one segment) and none lets them through.
    assert!(site.dhcp_refused(0, mac(BOOT_MAC)).is_none(), "no lease for an unknown MAC");
    let j = timeline("every host saw the requests", &|j| (0..3).all(|i| count(&seen(j, i), "requests") > 0));
    for i in 0..3 {
        assert_eq!(count(&seen(&j, i), "passed"), 0, "nothing let through on pxe-{i}: {j:#}");
        assert_eq!(count(&seen(&j, i), "answers"), 0, "no answer on pxe-{i}: {j:#}");
    }
    let d = j["diagnosis"].as_str().unwrap();
    assert!(d.contains("no host let them through") && d.contains("on the leader "), "{d}");
    assert!(d.contains(&format!("(agent pxe-{leader}): ")), "the leader's verdict: {d}");

    // Allowed: the leader lets it through and its dnsmasq answers; the followers only saw it.
    ctl_ok(&site, &["filters", "allow", BOOT_MAC]);
    wait_for(DEADLINE, || site.hosts.iter().any(|h| crate_served(h, BOOT_MAC)).then_some(()))
        .expect("a host serves the allowed MAC");
    let lease = site.dhcp(0, mac(BOOT_MAC)).expect("the allowed MAC gets a lease");
    let server = site.hosts.iter().position(|h| h.ip == lease.server_id).expect("the lease names a host");
    let j = timeline("the serving host saw the exchange", &|j| count(&seen(j, server), "answers") > 0);
    let s = seen(&j, server);
    assert!(count(&s, "passed") > 0 && count(&s, "requests") >= count(&s, "passed"), "{j:#}");
    for i in (0..3).filter(|i| *i != server) {
        assert_eq!(count(&seen(&j, i), "passed"), 0, "only the server's host let it through: {j:#}");
        assert_eq!(count(&seen(&j, i), "answers"), 0, "only the server's host answered: {j:#}");
    }
    let d = j["diagnosis"].as_str().unwrap();
    assert!(d.starts_with("offered: ") && d.contains(&format!("(agent pxe-{server}) answered")), "{d}");
    assert!(d.contains("no inspection callback"), "{d}");
    // The text an operator reads.
    let out = run_ok(ctl_cmd(&site.mgmt).args(["--controlplane", CP, "explain", BOOT_MAC, "--timeline"]));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(text.contains("boot timeline") && text.contains("diagnosis: offered"), "{text}");
    let line = text.lines().find(|l| l.contains(&format!("(agent pxe-{server}, "))).expect("the server's line");
    assert!(line.contains("reached the filter") && line.contains("from the local server"), "{line}");
}

/// Whether host `h`'s kernel serves `mac` now.
fn crate_served(h: &PxeHost, m: &str) -> bool {
    ironguard_netns_tests::kernel_decision(&h.ns, mac(m)).served
}
