//! High availability on a real etcd: three PXE hosts (real dnsmasq each, distinct server identifiers), two
//! control-plane replicas, real DHCP clients — and the invariant: at most one host serves DHCP at any instant.
//! These tests assert order and invariants; how fast each handover is, `ironguard-bench ha` measures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_netns_tests::ha::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const NODE_MAC: &str = "52:54:00:44:00:01";

/// After the handover, the new leader's server answers.
fn lease_from(site: &HaSite, host: usize) {
    let got = wait_for(Duration::from_secs(10), || site.dhcp(0, mac(NODE_MAC)));
    let lease = got.expect("a lease from the new leader");
    assert_from_leader(site, &lease, host);
}

/// The lease came from `host`'s server, or (the lead may move on its own on a busy machine, each host closed by
/// its fence first) from the host that leads after the exchange.
fn assert_from_leader(site: &HaSite, lease: &Lease, host: usize) {
    if lease.server_id != site.hosts[host].ip {
        let now = site.wait_leader(None, Duration::from_secs(15)).expect("a leader").0;
        assert_eq!(lease.server_id, site.hosts[now].ip, "the offer comes from the leader's dnsmasq (pxe-{host} led)");
    }
}

/// The sites that run with the agent's defaults (the benchmark's etcd cluster faults) run with what the agent
/// really defaults to.
#[test]
fn the_sites_defaults_are_the_agents() {
    let d = ironguard_agent::config::ElectionSection::default();
    assert_eq!(Election::DEFAULTS, Election { ttl_secs: d.ttl_secs, margin_ms: d.margin_ms });
}

#[test]
fn exactly_one_leader_and_offers_only_from_its_dnsmasq() {
    exactly_one_leader_on(EtcdRelease::Debian12);
}

/// As above on Debian 13's etcd 3.5 (3.5.16, which lacks the 3.5.23 and 3.5.28 fixes: the warnings name them).
#[test]
fn exactly_one_leader_and_offers_only_from_its_dnsmasq_on_etcd_3_5() {
    exactly_one_leader_on(EtcdRelease::Debian13);
}

fn exactly_one_leader_on(release: EtcdRelease) {
    let site = HaSite::with_options(HaOptions { hosts: 3, nodes: 1, etcd: release, ..Default::default() });
    let (leader, took) = site.wait_leader(None, Duration::from_secs(15)).expect("a leader is elected");
    eprintln!("leader pxe-{leader} after {took:?}; verdicts {:?}", site.verdicts());
    // One leader's tables (its lease may be dropped for a moment on a busy machine: FENCED), two followers.
    let v = site.verdicts();
    assert_eq!(v.iter().filter(|v| LEADER_TABLES.contains(&v.as_str())).count(), 1, "{v:?}");
    assert!(LEADER_TABLES.contains(&v[leader].as_str()), "{v:?}");
    assert_eq!(v.iter().filter(|v| *v == "FOLLOWER").count(), 2, "{v:?}");
    // Several DISCOVERs, each answered by one server only, the leader's. On a starved machine a leader may fence
    // and hand over between the election and the probe, or during it (a handover, not a fault): then the answers
    // come from the host that leads after it, or from two hosts in turn, and the probe is run again.
    let mut leader = leader;
    for attempt in 1.. {
        let probe = site.spawn_probe(0, mac(NODE_MAC), 2.0, 0.2, 5);
        let results = probe_results(probe);
        assert!(results.len() >= 5, "the probe sent its DISCOVERs: {results:?}");
        for (xid, servers) in &results {
            assert!(servers.len() <= 1, "DISCOVER {xid:x} answered by {servers:?}");
        }
        let answered: Vec<_> = results.iter().filter(|(_, s)| !s.is_empty()).collect();
        let servers: std::collections::BTreeSet<&String> = answered.iter().map(|(_, s)| &s[0]).collect();
        let now = site.wait_leader(None, Duration::from_secs(15)).expect("a leader after the probe").0;
        let ip = |i: usize| site.hosts[i].ip.to_string();
        if servers.len() == 1 && answered.len() >= results.len() / 2 {
            let server = servers.first().unwrap().as_str();
            assert!(server == ip(leader) || server == ip(now), "answers from a host that did not lead: {results:?}");
            break;
        }
        assert!(attempt < 3 && now != leader, "leader pxe-{leader} stayed, yet {results:?}");
        eprintln!("leadership moved from pxe-{leader} to pxe-{now} around the probe: probing again");
        leader = now;
    }
    lease_from(&site, site.wait_leader(None, Duration::from_secs(15)).expect("a leader").0);
    // ironguardctl agents shows every member and marks the one elected: the host whose kernel leads (read on both
    // sides of the listing, as the lead may move on a busy machine).
    let j = wait_for(Duration::from_secs(60), || {
        let before = site.leader()?;
        let j = agents_json(&site);
        let elected: Vec<&serde_json::Value> =
            j["agents"].as_array()?.iter().filter(|a| a["elected"] == true).collect();
        let ok = j["agents"].as_array()?.len() == 3
            && elected.len() == 1
            && elected[0]["agent_id"] == format!("pxe-{before}")
            && site.leader() == Some(before);
        ok.then_some(j)
    })
    .expect("three agents reported, the kernel's leader elected");
    assert_eq!(j["coordination"], "etcd");
    // The etcd under test, read from its own binary: if it lacks fixes the leases rely on (Debian 12's 3.4.23
    // does), every agent and the control plane say so, in one warning per server naming all the agents.
    let out = run_ok(std::process::Command::new(release.binary()).arg("--version"));
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: ").map(|v| v.trim().to_string()))
        .expect("etcd --version names its version");
    assert!(version.starts_with(&format!("{}.", release.minor())), "{release:?} runs etcd {version}");
    let lacking = ironguard_coord::versions::missing(&version).expect("a version ironguard reads");
    let warnings = wait_for(Duration::from_secs(60), || {
        let j = agents_json(&site);
        let w: Vec<String> = j["warnings"].as_array()?.iter().filter_map(|w| w.as_str().map(String::from)).collect();
        let agents = w.iter().any(|w| w.starts_with("agents pxe-0, pxe-1, pxe-2: etcd at "));
        let cp = w.iter().any(|w| w.starts_with("control plane: etcd at "));
        (lacking.is_empty() || (agents && cp)).then_some(w)
    })
    .expect("the agents and the control plane reported the etcd version");
    if lacking.is_empty() {
        assert!(!warnings.iter().any(|w| w.contains("etcd at")), "etcd {version} has every fix: {warnings:?}");
    } else {
        let w = warnings.iter().find(|w| w.starts_with("agents ")).cloned().unwrap_or_default();
        assert!(w.contains(&format!("runs {version}")) && w.contains(lacking[0].what), "{w}");
        assert!(w.contains(ironguard_coord::versions::RECOMMENDED), "says what to upgrade to: {w}");
    }
}

/// SIGTERM: the leader is closed by the time it exits (exit 0), and the successor opens only after it closed, with
/// no instant of both open. (How soon — the leader resigns and revokes its lease so that the successor need not
/// wait for it to run out — is `ironguard-bench ha`'s `sigterm` row.)
#[test]
fn leader_sigterm_hands_over_at_once() {
    let mut site = HaSite::new(3, 1);
    let (old, _) = site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    lease_from(&site, old);
    let watched = Instant::now();
    let watcher = Watcher::start(&site.hosts);
    assert!(watcher.wait_open(old, watched, DEADLINE), "the watcher saw the old leader open");
    let t = Instant::now();
    let st = signal_agent(&mut site.hosts[old], Signal::SIGTERM);
    assert!(st.is_some_and(|s| s.success()), "SIGTERM: exit 0");
    assert_eq!(verdict(&site.hosts[old].ns), "CLOSED", "closed by the time it exited");
    let (new, gap) = site.wait_leader(Some(old), Duration::from_secs(15)).expect("another host leads");
    eprintln!("SIGTERM handover: pxe-{old} -> pxe-{new} in {:?} (exit after {:?})", gap, t.elapsed());
    assert!(watcher.wait_open(new, t, Duration::from_secs(30)), "the watcher saw the successor open");
    let (runs, _) = watcher.finish();
    let overlaps = dual_open(&runs);
    assert!(overlaps.is_empty(), "the successor opened while the old leader was still open: {overlaps:?}");
    let old_last_open = runs[old].iter().map(|r| r.1).max().expect("the watcher saw the old leader open");
    let new_first_open = runs[new].iter().map(|r| r.0).min().expect("the watcher saw the successor open");
    assert!(old_last_open < new_first_open, "the old leader closed before the successor opened");
    lease_from(&site, new);
}

/// SIGKILL: the killed host is closed by the time it is reaped (its table went with its socket), and a successor
/// opens only once the dead leader's lease could have expired. (The gap is `ironguard-bench ha`'s `sigkill` row.)
#[test]
fn leader_sigkill_closes_at_once_and_a_successor_opens_after_the_lease() {
    let mut site = HaSite::new(3, 1);
    let (old, _) = site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    let t = Instant::now();
    assert!(signal_agent(&mut site.hosts[old], Signal::SIGKILL).is_some(), "the killed agent is reaped");
    assert_eq!(verdict(&site.hosts[old].ns), "CLOSED", "the killed host is closed at once (guard)");
    let (new, _) = site.wait_leader(Some(old), Duration::from_secs(30)).expect("another host leads");
    let gap = t.elapsed();
    eprintln!("SIGKILL handover: pxe-{old} -> pxe-{new} after {gap:?}");
    // The lease ends TTL after its last keep-alive, which went out up to one keep-alive period (TTL/3) before the
    // kill: the successor may open from 2/3 TTL on (less a little for etcd's expiry check), never at once.
    let earliest = Duration::from_secs(TTL_SECS) * 2 / 3 - Duration::from_millis(300);
    assert!(gap >= earliest, "not before the lease expired: {gap:?} < {earliest:?}");
    lease_from(&site, new);
}

/// A leader cut from the management network (etcd and the control planes) closes before a successor opens, and
/// rejoins as a follower once healed; two rounds, so that a healed host is partitioned again. (The repetition is
/// `ironguard-bench ha --rounds 20`'s `management link down` row.)
#[test]
fn partitioned_leaders_close_before_successors_open() {
    let site = HaSite::new(3, 1);
    site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    let watched = Instant::now();
    let watcher = Watcher::start(&site.hosts);
    let rounds = 2;
    let probe = site.spawn_probe(0, mac(NODE_MAC), 3600.0, 0.25, 0);
    let mut gaps = Vec::new();
    let mut handovers = Vec::new();
    for round in 0..rounds {
        let (old, _) = site
            .wait_leader(None, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("round {round}: no leader: {:?}", site.verdicts()));
        assert!(watcher.wait_open(old, watched, DEADLINE), "round {round}: the watcher saw pxe-{old} open");
        let t = Instant::now();
        site.partition(old, true);
        let closed =
            wait_for(Duration::from_secs(30), || (verdict(&site.hosts[old].ns) != "LEADER").then(|| t.elapsed()));
        let closed = closed.unwrap_or_else(|| panic!("round {round}: the partitioned leader never closed"));
        let (new, _) = site
            .wait_leader(Some(old), Duration::from_secs(30))
            .unwrap_or_else(|| panic!("round {round}: no successor"));
        let opened = t.elapsed();
        assert!(watcher.wait_open(new, t, Duration::from_secs(30)), "round {round}: the watcher saw pxe-{new} open");
        gaps.push(opened - closed);
        handovers.push((old, t, new));
        eprintln!("round {round}: pxe-{old} closed after {closed:?}, pxe-{new} open after {opened:?}");
        site.partition(old, false);
        // The healed host rejoins as a follower.
        let rejoined = wait_for(Duration::from_secs(30), || (verdict(&site.hosts[old].ns) == "FOLLOWER").then_some(()));
        assert!(rejoined.is_some(), "round {round}: pxe-{old} did not rejoin: {:?}", site.verdicts());
    }
    let (runs, samples) = watcher.finish();
    let overlaps = dual_open(&runs);
    eprintln!("watcher: {samples} kernel samples; dual-open instants: {overlaps:?}");
    assert!(overlaps.is_empty(), "two hosts had the pass rule at the same instant: {overlaps:?}");
    // The watcher saw every handover (so "never both open" was judged on samples that cover it): the old leader
    // open before its cut and the successor open after it, the old one's last open instant before the new one's
    // first.
    for (round, &(old, cut, new)) in handovers.iter().enumerate() {
        let old_last = runs[old].iter().filter(|r| r.0 < cut).map(|r| r.1).max();
        let new_first = runs[new].iter().filter(|r| r.1 > cut).map(|r| r.0).min();
        let (Some(old_last), Some(new_first)) = (old_last, new_first) else {
            panic!("round {round}: the watcher did not see pxe-{old} open before the cut and pxe-{new} after it");
        };
        assert!(old_last < new_first, "round {round}: pxe-{old} closed before pxe-{new} opened");
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(probe.id() as i32), Signal::SIGTERM);
    let results = probe_results(probe);
    let doubles: Vec<_> = results.iter().filter(|(_, s)| s.len() > 1).collect();
    eprintln!(
        "probe: {} DISCOVERs, {} answered, {} answered twice",
        results.len(),
        results.iter().filter(|(_, s)| !s.is_empty()).count(),
        doubles.len()
    );
    assert!(doubles.is_empty(), "offers from two servers to one DISCOVER: {doubles:?}");
}

/// etcd down: no keep-alive can succeed, so the kernel stops serving by the fence deadline of the last one, which
/// went out before etcd was gone: no read of any host's kernel that began a TTL after that saw it serving. Every
/// agent then says Blocked, and a leader comes back by itself with etcd. (How long until all read BLOCKED:
/// `ironguard-bench ha`'s `etcd stopped` row, kernel stop − lease end.)
#[test]
fn etcd_down_blocks_everyone_within_the_ttl_and_recovers_by_itself() {
    let mut site = HaSite::new(3, 1);
    site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    let watcher = Watcher::start(&site.hosts);
    site.etcd.stop();
    // Every keep-alive that could still succeed was sent before etcd was gone, so before now.
    let gone = Instant::now();
    let blocked =
        wait_for(Duration::from_secs(30), || site.verdicts().iter().all(|v| v == "BLOCKED").then(|| gone.elapsed()));
    let blocked = blocked.unwrap_or_else(|| panic!("not all blocked: {:?}", site.verdicts()));
    eprintln!("etcd down: all hosts BLOCKED after {blocked:?}");
    let fence = gone + Duration::from_secs(TTL_SECS);
    assert!(watcher.wait_read_after(fence, Duration::from_secs(30)), "every host was read after the fence deadline");
    let samples = watcher.finish_raw();
    for (i, host) in samples.iter().enumerate() {
        let late = host.iter().filter(|(began, _, open)| *open && *began > fence).count();
        assert_eq!(late, 0, "pxe-{i} was read serving {TTL_SECS} s and more after etcd was gone");
    }
    assert!(site.dhcp_refused(0, mac(NODE_MAC)).is_none(), "no lease without etcd");
    let t = Instant::now();
    site.etcd.restart();
    let (l, _) = site.wait_leader(None, Duration::from_secs(20)).expect("a leader again once etcd is back");
    eprintln!("etcd back: pxe-{l} leads after {:?}", t.elapsed());
    lease_from(&site, l);
}

#[test]
fn the_leaders_dnsmasq_dies_and_another_host_leads() {
    let mut site = HaSite::new(3, 1);
    let (old, _) = site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    site.hosts[old].server.kill();
    let (new, took) = site.wait_leader(Some(old), Duration::from_secs(10)).expect("another host leads");
    eprintln!("dnsmasq on pxe-{old} killed: pxe-{new} leads after {took:?}");
    assert_eq!(verdict(&site.hosts[old].ns), "FOLLOWER");
    lease_from(&site, new);
}

#[test]
fn one_control_plane_replica_dies_and_agents_continue_from_the_other() {
    let mut site = HaSite::new(3, 1);
    let (leader, _) = site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    // Deny the node on the first replica; every agent applies it.
    let ctl_on = |url: &str, args: &[&str]| {
        let mut a = vec!["--controlplane", url];
        a.extend_from_slice(args);
        ctl(&site.mgmt, &a)
    };
    assert!(ctl_on("https://10.90.0.1:9100", &["filters", "deny", NODE_MAC]).status.success());
    assert!(wait_for(Duration::from_secs(20), || site.all_refuse(mac(NODE_MAC)).then_some(())).is_some());
    assert!(site.dhcp_refused(0, mac(NODE_MAC)).is_none(), "denied on every host");
    let snapshots =
        |i: usize| metric(&site.hosts[i].ns, "127.0.0.1:9181", "ironguard_agent_snapshots_applied").unwrap_or(-1.0);
    let before: Vec<f64> = (0..3).map(snapshots).collect();
    site.cps[0].kill9();
    // A change through the surviving replica reaches the agents, which moved to it without a full reload.
    assert!(ctl_on("https://10.90.0.1:9110", &["filters", "allow", NODE_MAC]).status.success());
    let got = wait_for(Duration::from_secs(30), || site.dhcp(0, mac(NODE_MAC)));
    assert_from_leader(&site, &got.expect("allowed via the other replica"), leader);
    let resumed = wait_for(Duration::from_secs(30), || {
        (0..3)
            .all(|i| {
                metric(&site.hosts[i].ns, "127.0.0.1:9181", "ironguard_agent_stream_resumes").unwrap_or(0.0) >= 1.0
            })
            .then_some(())
    });
    assert!(resumed.is_some(), "every agent resumed on the other replica");
    let after: Vec<f64> = (0..3).map(snapshots).collect();
    assert_eq!(before, after, "no full reload");
}

/// The main loop answers SIGTERM whatever the coordination state: here with etcd down and every session expired
/// (the state in which it used to wait for coordination news for seconds): each agent stops, closed, with exit 0,
/// while etcd stays down. (SIGTERM → exit in this state: `ironguard-bench ha`, "SIGTERM → exit, etcd down".)
#[test]
fn sigterm_is_served_at_once_while_etcd_is_down() {
    let mut site = HaSite::new(3, 1);
    site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    site.etcd.stop();
    let blocked = wait_for(Duration::from_secs(30), || site.verdicts().iter().all(|v| v == "BLOCKED").then_some(()));
    assert!(blocked.is_some(), "not all blocked: {:?}", site.verdicts());
    // Well into the expired state: sessions are gone and reconnection attempts are under way.
    std::thread::sleep(Duration::from_secs(2));
    let mut took = vec![];
    for i in 0..3 {
        let t = Instant::now();
        let st = signal_agent(&mut site.hosts[i], Signal::SIGTERM);
        took.push(t.elapsed());
        assert!(st.is_some_and(|s| s.success()), "pxe-{i} exits 0 on SIGTERM");
        assert_eq!(verdict(&site.hosts[i].ns), "CLOSED", "pxe-{i} is closed once it exited");
        let log = site.hosts[i].agent.as_ref().expect("the agent's process").log_text();
        assert!(log.contains("Blocked; exiting"), "pxe-{i} stopped through Blocked:\n{log}");
    }
    eprintln!("SIGTERM to exit with etcd down: {took:?}");
}

/// A wedged etcd (frozen with SIGSTOP: its port still accepts connections, nothing answers — unlike a stopped etcd,
/// which refuses at once): no keep-alive succeeds, so every host stops serving by the fence deadline of the last
/// one that went out before the freeze (no read that began a TTL after it saw a host serving), every agent says
/// Blocked, and SIGTERM still stops each agent, closed, with exit 0, while etcd stays wedged.
#[test]
fn a_wedged_etcd_closes_every_host_by_its_fence_and_sigterm_still_stops_the_agents() {
    let mut site = HaSite::new(2, 1);
    site.wait_leader(None, Duration::from_secs(15)).expect("leader");
    let watcher = Watcher::start(&site.hosts);
    site.etcd.freeze();
    let frozen = Instant::now();
    let blocked = wait_for(Duration::from_secs(30), || site.verdicts().iter().all(|v| v == "BLOCKED").then_some(()));
    assert!(blocked.is_some(), "not all blocked with etcd wedged: {:?}", site.verdicts());
    let fence = frozen + Duration::from_secs(TTL_SECS);
    assert!(watcher.wait_read_after(fence, Duration::from_secs(30)), "every host was read after the fence deadline");
    for (i, host) in watcher.finish_raw().iter().enumerate() {
        let late = host.iter().filter(|(began, _, open)| *open && *began > fence).count();
        assert_eq!(late, 0, "pxe-{i} was read serving {TTL_SECS} s and more after etcd was wedged");
    }
    for i in 0..site.hosts.len() {
        let st = signal_agent(&mut site.hosts[i], Signal::SIGTERM);
        assert!(st.is_some_and(|s| s.success()), "pxe-{i} exits 0 on SIGTERM with etcd wedged");
        assert_eq!(verdict(&site.hosts[i].ns), "CLOSED", "pxe-{i} is closed once it exited");
        let log = site.hosts[i].agent.as_ref().expect("the agent's process").log_text();
        assert!(log.contains("Blocked; exiting"), "pxe-{i} stopped through Blocked:\n{log}");
    }
    site.etcd.thaw();
}

/// What `ironguardctl agents` says of misconfigured agents, through the etcd-backed registry of the control plane:
/// another host reporting agent id pxe-0 (a copied configuration; run with a host name of its own) is a second row
/// with a warning; two agents of one network without etcd (each elects itself, both serve) are a warning too.
#[test]
fn one_id_on_two_hosts_and_two_self_electing_agents_are_shown_with_warnings() {
    let mut site = HaSite::new(2, 0);
    site.wait_leader(None, Duration::from_secs(30)).expect("a first leader");
    let hostname = ["unshare", "--uts", "sh", "-c", "hostname copied-host && exec \"$0\" \"$@\""];
    // Its own state directory, as on another machine (a shared one would hand it pxe-0's lease id to revoke).
    let own = site.dir.join("copied-host");
    std::fs::create_dir_all(&own).unwrap();
    let state_dir = format!("[agent]\nstate_dir = \"{}\"\n", own.display());
    site.restart_agent_with(1, Some(&hostname), |c| c.replace("pxe-1", "pxe-0").replacen("[agent]\n", &state_dir, 1));
    let warned = |site: &HaSite, needle: &str| {
        wait_for(Duration::from_secs(60), || {
            let j = agents_json(site);
            let hit = j["warnings"].as_array()?.iter().any(|w| w.as_str().is_some_and(|w| w.contains(needle)));
            hit.then_some(j)
        })
    };
    let j = warned(&site, "\"pxe-0\" is reported by 2 hosts").expect("no warning about the copied agent id");
    let rows: Vec<&str> = j["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["agent_id"] == "pxe-0" && a["stale"] == false)
        .map(|a| a["host"].as_str().unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "two rows for one id: {j}");
    assert!(rows.contains(&"copied-host"), "{j}");
    let text = String::from_utf8_lossy(
        &run_ok(ctl_cmd(&site.mgmt).args(["--controlplane", "https://10.90.0.1:9100", "agents"])).stdout,
    )
    .into_owned();
    assert!(text.contains("WARNING: agent id \"pxe-0\" is reported by 2 hosts"), "{text}");

    // Both agents without etcd: each elects itself.
    let without_etcd = |c: &str| {
        let start = c.find("[etcd]").expect("an [etcd] section");
        let end = c[start..].find("\n\n").map_or(c.len(), |e| start + e + 2);
        format!("{}{}", &c[..start], &c[end..])
    };
    site.restart_agent_with(1, None, without_etcd);
    site.restart_agent_with(0, None, without_etcd);
    let j = warned(&site, "agents pxe-0, pxe-1 run without etcd").expect("no warning about the self-electing agents");
    let local: Vec<&serde_json::Value> =
        j["agents"].as_array().unwrap().iter().filter(|a| a["coordination"] == "local").collect();
    assert_eq!(local.len(), 2, "{j}");
}
