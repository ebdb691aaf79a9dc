//! Leadership confirmed by answers: a host leads only while its own DHCP server answers the agent's probe
//! DISCOVERs (`[dhcp_probe]`, docs/architecture.md). On the 3-host HA site with real etcd, real agents and real
//! dnsmasq or ISC dhcpd, the leader's server is made to answer nobody while it still holds its socket — frozen, its
//! socket held by another process after it died, no range for the network, its range exhausted, listening on the
//! wrong interface — and another host must take over, with no instant of two hosts open (a kernel watcher on every
//! host) and no DISCOVER answered by two servers (a client on the provisioning network throughout). When no host's
//! server answers, no host leads and every agent says why. How fast each hand-over is, `ironguard-bench ha`
//! measures; these tests assert who leads and the order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ironguard_netns_tests::ha::*;
use ironguard_netns_tests::*;
use nix::sys::signal::Signal;

const NODE_MAC: &str = "52:54:00:45:00:01";
/// How long each step may take at most before the test gives up (a deadline on a wait, not a figure). Beside a CPU
/// hog, the rest of the suite and another build, a handover took over 30 s (T22).
const STEP: Duration = Duration::from_secs(90);

/// One way a server can stop answering while its process (or its socket) lives on.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Frozen,
    SocketHeld,
    Broken(ServerSetup),
}

/// Copies every UDP port-67 socket of process argv[1] into this process (pidfd_getfd, Linux 5.6), prints
/// "holding", and sleeps.
const HOLD_SOCKET: &str = r#"
import ctypes, os, sys, time
pid = int(sys.argv[1])
inodes = set()
for table in ("/proc/net/udp", "/proc/net/udp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(":0043"):
            inodes.add(f[9])
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(pid)
held = []
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:[") and target[8:-1] in inodes:
        n = libc.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
        if n < 0:
            sys.exit(f"pidfd_getfd: errno {ctypes.get_errno()}")
        held.append(n)
if not held:
    sys.exit("no udp/67 socket in that process")
print("holding", held, flush=True)
time.sleep(3600)
"#;

/// Breaks host `i`'s server as `fault` says. Returns the process that holds the socket, for [`Fault::SocketHeld`].
fn break_server(site: &mut HaSite, i: usize, fault: Fault) -> Option<Proc> {
    match fault {
        Fault::Frozen => {
            site.hosts[i].server.signal(Signal::SIGSTOP);
            None
        }
        Fault::SocketHeld => {
            // The server dies while another process holds its very socket (as a child that inherited it would):
            // the holder takes a copy of the server's udp/67 socket (pidfd_getfd), then the server is killed. The
            // socket check sees a listener throughout; nobody reads it.
            let pid = site.hosts[i].server.pid().to_string();
            let mut cmd = site.hosts[i].ns.cmd("/usr/bin/python3");
            cmd.args(["-c", HOLD_SOCKET, &pid]);
            let p = Proc::spawn("udp67-holder", cmd, site.dir.join(&format!("holder-{i}.log")));
            assert!(wait_for(STEP, || p.log_text().contains("holding").then_some(())).is_some(), "{}", p.log_text());
            site.hosts[i].server.kill();
            Some(p)
        }
        Fault::Broken(setup) => {
            site.restart_server(i, setup);
            None
        }
    }
}

/// What the agent of host `i` reports about its DHCP server (`ironguardctl agents`).
fn dhcp_report(site: &HaSite, i: usize) -> Option<(bool, String)> {
    let j = agents_json(site);
    let a = j["agents"].as_array()?.iter().find(|a| a["agent_id"] == format!("pxe-{i}"))?.clone();
    Some((a["dhcp"]["healthy"].as_bool()?, a["dhcp"]["detail"].as_str()?.to_string()))
}

/// Each fault in turn on whichever host leads: another host takes over, the old leader's agent names its silent
/// server, and the broken server is then repaired (so that a healthy follower is always there for the next fault).
fn every_fault_hands_over(server: ServerKind, faults: &[Fault]) {
    let mut site = HaSite::with_options(HaOptions { server, ..Default::default() });
    let (mut leader, _) = site.wait_leader(None, STEP).expect("a leader is elected");
    let watcher = Watcher::start(&site.hosts);
    let seconds = 12.0 * faults.len() as f64;
    let probe = site.spawn_probe(0, mac(NODE_MAC), seconds, 0.3, 10);
    let started = Instant::now();
    for &fault in faults {
        let holder = break_server(&mut site, leader, fault);
        let (next, took) = site.wait_leader(Some(leader), STEP).unwrap_or_else(|| {
            panic!("{fault:?} on pxe-{leader}: no other host leads; verdicts {:?}", site.verdicts())
        });
        eprintln!("{server:?} {fault:?} on pxe-{leader}: pxe-{next} leads after {took:?}");
        assert_ne!(next, leader);
        assert_ne!(verdict(&site.hosts[leader].ns), "LEADER", "{fault:?}: the old leader closed");
        let said = wait_for(STEP, || {
            dhcp_report(&site, leader).filter(|(healthy, detail)| !healthy && detail.contains("no DHCPOFFER"))
        });
        assert!(said.is_some(), "{fault:?}: pxe-{leader} names its silent server: {:?}", dhcp_report(&site, leader));
        // Repair, and wait until that host's agent sees its server answer again.
        drop(holder);
        site.restart_server(leader, ServerSetup::Normal);
        let healthy = wait_for(STEP, || dhcp_report(&site, leader).filter(|(healthy, _)| *healthy));
        assert!(healthy.is_some(), "{fault:?}: pxe-{leader}'s repaired server answers its agent again");
        leader = next;
    }
    let results = probe_results(probe);
    let (runs, _) = watcher.finish();
    let overlaps = dual_open(&runs);
    assert!(overlaps.is_empty(), "two hosts open at once: {overlaps:?}");
    for (xid, servers) in &results {
        assert!(servers.len() <= 1, "DISCOVER {xid:x} answered by {servers:?}");
    }
    let answered = results.iter().filter(|(_, s)| !s.is_empty()).count();
    assert!(answered > 0, "the client was served between the faults ({} DISCOVERs)", results.len());
    eprintln!("{} DISCOVERs in {:?}, {answered} answered, none twice", results.len(), started.elapsed());
}

#[test]
fn a_dnsmasq_that_answers_nobody_loses_the_lead_whatever_the_cause() {
    every_fault_hands_over(
        ServerKind::Dnsmasq,
        &[
            Fault::Frozen,
            Fault::SocketHeld,
            Fault::Broken(ServerSetup::NoRange),
            Fault::Broken(ServerSetup::Exhausted),
            Fault::Broken(ServerSetup::WrongInterface),
        ],
    );
}

#[test]
fn an_isc_dhcpd_that_answers_nobody_loses_the_lead_whatever_the_cause() {
    every_fault_hands_over(
        ServerKind::Dhcpd,
        &[
            Fault::Frozen,
            Fault::SocketHeld,
            Fault::Broken(ServerSetup::NoRange),
            Fault::Broken(ServerSetup::Exhausted),
            Fault::Broken(ServerSetup::WrongInterface),
        ],
    );
}

/// What an agent says of a server that does not answer: silent since it last answered, or not answered yet.
fn silent(detail: &str) -> bool {
    detail.contains("no DHCPOFFER") || detail.contains("has not answered a probe yet")
}

/// No host whose server is silent campaigns: with every server frozen, nobody leads (the agents do not take turns
/// failing), each agent names its silent server, and the first server to answer again makes its host the leader.
#[test]
fn when_no_server_answers_nobody_leads_and_every_agent_says_why() {
    let site = HaSite::new(3, 1);
    site.wait_leader(None, STEP).expect("a leader is elected");
    for h in &site.hosts {
        h.server.signal(Signal::SIGSTOP);
    }
    let all_said = wait_for(STEP, || {
        let r: Option<Vec<(bool, String)>> = (0..3).map(|i| dhcp_report(&site, i)).collect();
        r.filter(|r| r.iter().all(|(healthy, d)| !healthy && silent(d)))
    });
    assert!(all_said.is_some(), "every agent reports its silent server: {:?}", agents_json(&site));
    // From now on nobody opens: sampled for a few probe silences, no host is ever read open.
    let watcher = Watcher::start(&site.hosts);
    std::thread::sleep(Duration::from_secs(6));
    let (runs, _) = watcher.finish();
    assert!(runs.iter().all(|r| r.is_empty()), "no host opened while no server answered: {runs:?}");
    let text = String::from_utf8_lossy(
        &run_ok(ctl_cmd(&site.mgmt).args(["--controlplane", "https://10.90.0.1:9100", "agents"])).stdout,
    )
    .into_owned();
    assert!(text.lines().filter(|l| silent(l)).count() >= 3, "`ironguardctl agents` says why:\n{text}");
    let metrics = http_get(&site.mgmt, "http://127.0.0.1:9101/metrics").expect("the control plane's metrics");
    let healthy: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("ironguard_controlplane_agent_dhcp_healthy{")).collect();
    assert!(
        healthy.len() == 3 && healthy.iter().all(|l| l.ends_with(" 0")),
        "the control plane exports every agent's silent server: {healthy:?}"
    );
    site.hosts[1].server.signal(Signal::SIGCONT);
    let (l, _) = site.wait_leader(None, STEP).expect("the host whose server answers again leads");
    assert_eq!(l, 1);
}
