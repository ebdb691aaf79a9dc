//! The faults a real PXE host meets, injected into the leader of an [`HaSite`], one round at a time; used by the
//! fault-matrix tests and by `ironguard-bench ha`.
//!
//! Every round: find the leader, inject the fault, wait until the site serves again (some host is LEADER), end
//! the fault (thaw, restore, restart the agent as systemd would), and wait for a single leader again. The judge
//! of safety is not here but in the kernel watcher and the DHCP probes that run across all rounds: no two hosts
//! open at one instant, no DISCOVER answered twice, no unknown MAC answered.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::ha::{HaSite, signal_agent};
use crate::{Netns, verdict, wait_for};

/// One kind of fault, applied to the current leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `systemctl stop`: SIGTERM, then started again.
    Sigterm,
    /// SIGKILL, and the agent stays down until a successor leads.
    Sigkill,
    /// SIGKILL and an immediate restart (systemd `Restart=`), which revokes the previous run's lease.
    SigkillRestart,
    /// SIGSTOP for 2 × TTL (a VM pause, a cgroup freeze), then SIGCONT.
    Sigstop,
    /// The agent's CPU quota cut to 1 ms per second (cgroup `cpu.max` / `cpu.cfs_quota_us`) for 2 × TTL.
    CpuStarve,
    /// The kernel's OOM killer (cgroup memory limit), then restarted.
    Oom,
    /// The leader's packets to etcd dropped for 2 × TTL.
    CutEtcd,
    /// The leader's management link (etcd and both control planes) down until a successor serves.
    Partition,
    /// The leader's packets to both control planes dropped until it gives up (lost_after) and a bit more.
    CutControlPlane,
    /// etcd stopped for 2 × TTL, then started again on its data.
    EtcdStop,
    /// etcd replaced by an empty etcd on the same address (data lost).
    EtcdReplace,
    /// The leader's provisioning link set down, then up again.
    LinkDown,
    /// `nft flush ruleset` on the leader's host while its agent runs, then SIGKILL of the agent.
    FlushRulesetThenKill,
    /// `nft delete table inet ironguard_guard` while the agent runs, then SIGKILL.
    DeleteGuardThenKill,
    /// `nft flush chain inet ironguard_guard input` while the agent runs, then SIGKILL.
    FlushGuardChainThenKill,
    /// An operator's `etcdctl lease revoke` of the leader's lease: its election key goes at once, long before the
    /// leader's fence deadline.
    LeaseRevoke,
    /// The leader's election key deleted by hand (`etcdctl del`); its lease lives on.
    KeyDelete,
    /// Everything the leader sends on its management link (its keep-alives, its confirmations) delayed by 0–3 s
    /// (`tc netem`) for 2 × TTL.
    DelayedKeepalives,
    /// The leader frozen (SIGSTOP), then its lease revoked: it cannot close by itself, and its successor must wait
    /// out its kernel lease; thawed once a successor serves.
    FrozenThenRevoke,
    /// etcd stalls for 1 s (SIGSTOP, then SIGCONT: what a slow fsync or a defrag does) — no hand-over wanted.
    EtcdStall,
    /// The leader's DHCP server frozen (SIGSTOP; its socket stays bound) until a successor serves.
    DhcpFrozen,
    /// The leader's DHCP server restarted with a range for another network only: it runs, listens and offers
    /// nothing on the provisioning network, until a successor serves.
    DhcpNoRange,
    /// A cluster's etcd leader member killed (SIGKILL) for 2 × TTL: the other two keep the quorum and elect another
    /// etcd leader; then started again on its data.
    EtcdLeaderMemberKill,
    /// A cluster's follower member killed for 2 × TTL, then started again.
    EtcdFollowerMemberKill,
    /// A cluster's etcd leader member cut off from the other members and from every client for 2 × TTL (a minority
    /// partition that holds the etcd leader), then joined again.
    EtcdLeaderMemberCut,
    /// A cluster's etcd leader member cut off from the other members only (its peer port dropped both ways in its
    /// namespace) for 2 × TTL: the agents' connections to it stay up and its answers stop (the agents must move on
    /// to the others); then joined again.
    EtcdLeaderPeersCut,
    /// Two of three members killed (quorum lost) for 2 × TTL: every host must close; then both started again.
    EtcdQuorumLoss,
    /// Every member of the cluster restarted in turn, each once the one before serves again.
    EtcdRollingRestart,
    /// The cluster restored from a snapshot taken before a MAC was denied (every member stopped, its data replaced
    /// by `snapshot restore`, started again): the store forgets the deny and its revisions go back. Nothing may be
    /// loosened: no host serves that MAC while the site recovers.
    EtcdRestore,
    /// The same with `--bump-revision` (etcd 3.5): the revisions go on past any seen before, the data is still old.
    EtcdRestoreBumped,
}

impl Fault {
    /// The faults of an etcd cluster (a site with `etcd_members` 3); [`Fault::ALL`] holds the others.
    pub const CLUSTER: [Fault; 6] = [
        Fault::EtcdLeaderMemberKill,
        Fault::EtcdFollowerMemberKill,
        Fault::EtcdLeaderMemberCut,
        Fault::EtcdLeaderPeersCut,
        Fault::EtcdQuorumLoss,
        Fault::EtcdRollingRestart,
    ];

    /// A restore from a snapshot, with etcd's revisions going back and going on ([`Fault::EtcdRestore`]).
    pub const RESTORES: [Fault; 2] = [Fault::EtcdRestore, Fault::EtcdRestoreBumped];

    /// Whether the fault needs a site whose etcd is a cluster of three ([`Fault::CLUSTER`], [`Fault::RESTORES`]).
    pub fn needs_cluster(self) -> bool {
        Fault::CLUSTER.contains(&self) || Fault::RESTORES.contains(&self)
    }

    pub const ALL: [Fault; 22] = [
        Fault::Sigterm,
        Fault::Sigkill,
        Fault::SigkillRestart,
        Fault::Sigstop,
        Fault::CpuStarve,
        Fault::Oom,
        Fault::CutEtcd,
        Fault::Partition,
        Fault::CutControlPlane,
        Fault::EtcdStop,
        Fault::EtcdReplace,
        Fault::LinkDown,
        Fault::FlushRulesetThenKill,
        Fault::DeleteGuardThenKill,
        Fault::FlushGuardChainThenKill,
        Fault::LeaseRevoke,
        Fault::KeyDelete,
        Fault::DelayedKeepalives,
        Fault::FrozenThenRevoke,
        Fault::EtcdStall,
        Fault::DhcpFrozen,
        Fault::DhcpNoRange,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Sigterm => "sigterm",
            Fault::Sigkill => "sigkill",
            Fault::SigkillRestart => "sigkill+restart",
            Fault::Sigstop => "sigstop 2xTTL",
            Fault::CpuStarve => "cpu starvation",
            Fault::Oom => "oom kill",
            Fault::CutEtcd => "cut from etcd",
            Fault::Partition => "management link down",
            Fault::CutControlPlane => "cut from control plane",
            Fault::EtcdStop => "etcd stopped",
            Fault::EtcdReplace => "etcd replaced (empty)",
            Fault::LinkDown => "provisioning link down",
            Fault::FlushRulesetThenKill => "nft flush ruleset + kill",
            Fault::DeleteGuardThenKill => "nft delete guard + kill",
            Fault::FlushGuardChainThenKill => "nft flush guard chain + kill",
            Fault::LeaseRevoke => "etcdctl lease revoke",
            Fault::KeyDelete => "etcdctl del election key",
            Fault::DelayedKeepalives => "keep-alives delayed 0-3 s",
            Fault::FrozenThenRevoke => "sigstop + lease revoke",
            Fault::EtcdStall => "etcd stalls 1 s",
            Fault::DhcpFrozen => "dhcp server frozen",
            Fault::DhcpNoRange => "dhcp server without a range",
            Fault::EtcdLeaderMemberKill => "etcd leader member killed",
            Fault::EtcdFollowerMemberKill => "etcd follower member killed",
            Fault::EtcdLeaderMemberCut => "etcd leader member cut off",
            Fault::EtcdLeaderPeersCut => "etcd leader member cut from its peers",
            Fault::EtcdQuorumLoss => "etcd quorum lost (2 of 3 down)",
            Fault::EtcdRollingRestart => "etcd rolling restart",
            Fault::EtcdRestore => "etcd restored from a snapshot",
            Fault::EtcdRestoreBumped => "etcd restored from a snapshot, --bump-revision",
        }
    }
}

/// What one round saw.
#[derive(Debug, Clone)]
pub struct Round {
    pub fault: Fault,
    /// The host that led when the fault was injected.
    pub leader: usize,
    pub injected: Instant,
    /// The host leading once the site served again, and when that was first seen.
    pub serving: usize,
    pub serving_at: Instant,
    /// For a leader frozen, starved or cut from etcd: when its kernel lease was due to end (read from its kernel
    /// after the fault began, once its agent could no longer move it).
    pub lease_deadline: Option<Instant>,
    /// For SIGTERM: how long the agent took from the signal to its exit.
    pub stopped_in: Option<Duration>,
    /// For the quorum loss: when both members served again (the site's leader came after).
    pub etcd_back_at: Option<Instant>,
}

/// What ends a fault once the site serves again (thaw, restore a link, remove a block).
type Cleanup = Box<dyn FnOnce(&mut HaSite)>;

/// Runs one round of `fault` on the site's current leader. Err: what went wrong, in words.
pub fn run_round(site: &mut HaSite, fault: Fault) -> Result<Round, String> {
    let ttl = site.election.ttl();
    let (leader, _) = site.wait_leader(None, Duration::from_secs(30)).ok_or("no leader before the fault")?;
    let injected = Instant::now();
    let mut lease_deadline = None;
    let mut restart_after_successor = false;
    let mut cleanup: Option<Cleanup> = None;
    let mut stopped_in = None;
    let mut etcd_back_at = None;
    match fault {
        Fault::Sigterm => {
            signal_agent(&mut site.hosts[leader], Signal::SIGTERM).ok_or("the agent did not exit on SIGTERM")?;
            stopped_in = Some(injected.elapsed());
            restart_after_successor = true;
        }
        Fault::Sigkill => {
            signal_agent(&mut site.hosts[leader], Signal::SIGKILL);
            restart_after_successor = true;
        }
        Fault::SigkillRestart => {
            signal_agent(&mut site.hosts[leader], Signal::SIGKILL);
            site.start_agent(leader);
        }
        Fault::Sigstop => {
            let agent = site.hosts[leader].agent.as_ref().ok_or("no agent")?;
            agent.signal(Signal::SIGSTOP);
            let pid = agent.pid();
            cleanup = Some(Box::new(move |_site: &mut HaSite| {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGCONT);
            }));
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, 2 * ttl);
        }
        Fault::CpuStarve => {
            let pid = site.hosts[leader].agent.as_ref().ok_or("no agent")?.pid();
            let cg = Cgroup::cpu_starved(pid)?;
            cleanup = Some(Box::new(move |_site: &mut HaSite| cg.release(pid)));
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, 2 * ttl);
        }
        Fault::Oom => {
            let pid = site.hosts[leader].agent.as_ref().ok_or("no agent")?.pid();
            let cg = Cgroup::memory_limited(pid, 256 * 1024)?;
            // Make the agent allocate fresh memory: bursts of filter changes it must turn into kernel batches.
            // Memory charged before the move stays with the old cgroup (v1), and the allocator reuses freed
            // pages first, so it can take several bursts before an allocation is charged here. The bursts deny
            // 4000 MACs and remove them again, in turn: every burst is a real change (denying MACs an earlier
            // round left denied would change nothing), and the filter does not grow from round to round.
            let macs: Vec<String> =
                (0..4000u32).map(|i| format!("02:fa:00:00:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)).collect();
            let burst = |verb: &str| {
                let mut args = vec!["--controlplane", "https://10.90.0.1:9100", "filters", verb];
                args.extend(macs.iter().map(String::as_str));
                let _ = crate::ctl(&site.mgmt, &args);
            };
            let mut killed = None;
            let mut denied = false;
            for _ in 0..16 {
                denied = !denied;
                burst(if denied { "deny" } else { "remove" });
                killed = wait_for(Duration::from_secs(3), || {
                    (!site.hosts[leader].agent.as_mut().is_some_and(|a| a.running())).then_some(())
                });
                if killed.is_some() {
                    break;
                }
            }
            if denied {
                burst("remove");
            }
            cg.release(pid);
            killed.ok_or("the OOM killer did not kill the agent")?;
            restart_after_successor = true;
        }
        Fault::CutEtcd => {
            block(&site.hosts[leader].ns, &[2379])?;
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, 2 * ttl);
            cleanup = Some(Box::new(move |site: &mut HaSite| unblock(&site.hosts[leader].ns)));
        }
        Fault::Partition => {
            site.partition(leader, true);
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, 2 * ttl);
            cleanup = Some(Box::new(move |site: &mut HaSite| site.partition(leader, false)));
        }
        Fault::CutControlPlane => {
            block(&site.hosts[leader].ns, &[9100, 9110])?;
            // Long enough for the leader to give up its stale state (lost_after_secs) and hand over.
            std::thread::sleep(2 * ttl);
            cleanup = Some(Box::new(move |site: &mut HaSite| unblock(&site.hosts[leader].ns)));
        }
        Fault::EtcdStop => {
            site.etcd.stop();
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, 2 * ttl);
            site.etcd.restart();
        }
        Fault::EtcdReplace => {
            site.etcd.replace_with_empty();
        }
        Fault::LinkDown => {
            site.hosts[leader].ns.ip(&["link", "set", "prov0", "down"]);
            cleanup = Some(Box::new(move |site: &mut HaSite| {
                site.hosts[leader].ns.ip(&["link", "set", "prov0", "up"]);
            }));
        }
        Fault::FlushRulesetThenKill | Fault::DeleteGuardThenKill | Fault::FlushGuardChainThenKill => {
            let args: &[&str] = match fault {
                Fault::FlushRulesetThenKill => &["flush", "ruleset"],
                Fault::DeleteGuardThenKill => &["delete", "table", "inet", "ironguard_guard"],
                _ => &["flush", "chain", "inet", "ironguard_guard", "input"],
            };
            // Refused (the agent holds the guard) or done; either way the guard must still drop afterwards.
            let _ = site.hosts[leader].ns.nft(args);
            std::thread::sleep(Duration::from_millis(100));
            signal_agent(&mut site.hosts[leader], Signal::SIGKILL);
            let v = verdict(&site.hosts[leader].ns);
            if v != "CLOSED" {
                return Err(format!("after `nft {}` and SIGKILL the host is {v}, not CLOSED", args.join(" ")));
            }
            restart_after_successor = true;
        }
        Fault::LeaseRevoke => {
            let (_, lease) = leader_key(site)?;
            etcdctl(site, &["lease", "revoke", &lease])?;
        }
        Fault::KeyDelete => {
            let (key, _) = leader_key(site)?;
            etcdctl(site, &["del", &key])?;
        }
        Fault::DelayedKeepalives => {
            // This kernel has no netem: the leader's packets to etcd go through an NFQUEUE whose reader releases
            // them 0–3 s late, in order (tests/netns/scripts/nfqueue_delay.py).
            let ns = &site.hosts[leader].ns;
            let rule = [
                "OUTPUT",
                "-p",
                "tcp",
                "-d",
                "10.90.0.1",
                "--dport",
                "2379",
                "-j",
                "NFQUEUE",
                "--queue-num",
                "7",
                "--queue-bypass",
            ];
            let mut delayer = ns
                .cmd("python3")
                .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nfqueue_delay.py"))
                .args(["7", "3000"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("nfqueue_delay.py: {e}"))?;
            let mut ready = String::new();
            let stdout = delayer.stdout.take().ok_or("no stdout")?;
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready).map_err(|e| e.to_string())?;
            if ready.trim() != "ready" {
                let _ = delayer.kill();
                return Err("nfqueue_delay.py did not bind its queue".into());
            }
            let add = ns.cmd("iptables").arg("-A").args(rule).output().map_err(|e| format!("iptables: {e}"))?;
            if !add.status.success() {
                let _ = delayer.kill();
                return Err(format!("iptables: {}", String::from_utf8_lossy(&add.stderr)));
            }
            std::thread::sleep(2 * ttl);
            let _ = ns.cmd("iptables").arg("-D").args(rule).output();
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(delayer.id() as i32), Signal::SIGTERM);
            let _ = delayer.wait();
        }
        Fault::FrozenThenRevoke => {
            let agent = site.hosts[leader].agent.as_ref().ok_or("no agent")?;
            agent.signal(Signal::SIGSTOP);
            let pid = agent.pid();
            let (_, lease) = leader_key(site)?;
            etcdctl(site, &["lease", "revoke", &lease])?;
            cleanup = Some(Box::new(move |_site: &mut HaSite| {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGCONT);
            }));
            lease_deadline = watch_lease_end(&site.hosts[leader].ns, ttl);
        }
        Fault::EtcdStall => {
            site.etcd.freeze();
            std::thread::sleep(Duration::from_secs(1));
            site.etcd.thaw();
            // Whatever the stall caused (a lapse, a hand-over) has happened by then.
            std::thread::sleep(ttl);
        }
        Fault::DhcpFrozen => {
            site.hosts[leader].server.signal(Signal::SIGSTOP);
            cleanup = Some(Box::new(move |site: &mut HaSite| {
                site.hosts[leader].server.signal(Signal::SIGCONT);
            }));
        }
        Fault::DhcpNoRange => {
            site.restart_server(leader, crate::ha::ServerSetup::NoRange);
            cleanup = Some(Box::new(move |site: &mut HaSite| {
                site.restart_server(leader, crate::ha::ServerSetup::Normal);
            }));
        }
        Fault::EtcdLeaderMemberKill | Fault::EtcdFollowerMemberKill => {
            let lead = site.etcd_leader_member().ok_or("no etcd leader member before the fault")?;
            let m = match fault {
                Fault::EtcdLeaderMemberKill => lead,
                _ => (lead + 1) % (site.etcd_peers.len() + 1),
            };
            site.etcd_member(m).stop();
            std::thread::sleep(2 * ttl);
            cleanup = Some(Box::new(move |site: &mut HaSite| {
                let member = site.etcd_member(m);
                member.launch();
                member.wait_up(Duration::from_secs(60));
            }));
        }
        Fault::EtcdLeaderMemberCut => {
            let m = site.etcd_leader_member().ok_or("no etcd leader member before the fault")?;
            site.cut_etcd_member(m, true);
            std::thread::sleep(2 * ttl);
            cleanup = Some(Box::new(move |site: &mut HaSite| {
                site.cut_etcd_member(m, false);
                site.etcd_member(m).wait_up(Duration::from_secs(60));
            }));
        }
        Fault::EtcdLeaderPeersCut => {
            // A MAC allowed before the cut and denied during it: whatever member each control plane's watch sits
            // on, every host must refuse it while the cut lasts (a watch on the cut member hears nothing).
            let (x, cp) = allow_restored_mac(site)?;
            let m = site.etcd_leader_member().ok_or("no etcd leader member before the fault")?;
            let ns = &site.etcd_ns[m];
            block_both_ways(ns, 2380)?;
            let cut_at = Instant::now();
            // While etcd elects another leader a write fails with a clear error, as any etcd write does: the operator
            // tries again. The cut lasts until the deny is written and every host refuses the MAC (bounded: only
            // something stuck takes 30 s), and at least 2 × TTL.
            let bound = Duration::from_secs(30);
            let mut deny = crate::ctl(&site.mgmt, &["--controlplane", cp, "filters", "deny", RESTORED_MAC]);
            while !deny.status.success() && cut_at.elapsed() < bound {
                std::thread::sleep(Duration::from_millis(200));
                deny = crate::ctl(&site.mgmt, &["--controlplane", cp, "filters", "deny", RESTORED_MAC]);
            }
            let refused = deny.status.success()
                && crate::wait_for(bound.saturating_sub(cut_at.elapsed()), || site.all_refuse(x).then_some(()))
                    .is_some();
            std::thread::sleep((2 * ttl).saturating_sub(cut_at.elapsed()));
            unblock(ns);
            site.etcd_member(m).wait_up(Duration::from_secs(60));
            if !refused {
                return Err(format!(
                    "{RESTORED_MAC}, denied while etcd member {m} was cut from its peers, was still served 30 s \
                     into the cut (deny: {})",
                    String::from_utf8_lossy(&deny.stderr).trim()
                ));
            }
        }
        Fault::EtcdQuorumLoss => {
            let lead = site.etcd_leader_member().ok_or("no etcd leader member before the fault")?;
            let down = [lead, (lead + 1) % (site.etcd_peers.len() + 1)];
            for m in down {
                site.etcd_member(m).stop();
            }
            // Without a quorum no keep-alive succeeds: every kernel lease runs out within the TTL (the fence), so
            // after two no host may be open.
            std::thread::sleep(2 * ttl);
            let open: Vec<usize> = (0..site.hosts.len()).filter(|i| verdict(&site.hosts[*i].ns) == "LEADER").collect();
            for m in down {
                site.etcd_member(m).launch();
            }
            for m in down {
                site.etcd_member(m).wait_up(Duration::from_secs(60));
            }
            etcd_back_at = Some(Instant::now());
            if !open.is_empty() {
                return Err(format!("hosts {open:?} still open after 2 × TTL without an etcd quorum"));
            }
        }
        Fault::EtcdRestore | Fault::EtcdRestoreBumped => {
            restore(site, matches!(fault, Fault::EtcdRestoreBumped).then_some(1_000_000), ttl)?;
        }
        Fault::EtcdRollingRestart => {
            for m in 0..=site.etcd_peers.len() {
                site.etcd_member(m).stop();
                std::thread::sleep(ttl);
                let member = site.etcd_member(m);
                member.launch();
                member.wait_up(Duration::from_secs(60));
            }
        }
    }
    // The site serves again: some host leads (for most faults, another one; for a server that answers nobody,
    // certainly another one: its own host still holds the lead until its agent notices).
    let other = matches!(fault, Fault::DhcpFrozen | Fault::DhcpNoRange).then_some(leader);
    let (serving, _) = site
        .wait_leader(other, Duration::from_secs(30))
        .ok_or_else(|| format!("nobody served again after {}: {:?}", fault.name(), site.verdicts()))?;
    let serving_at = Instant::now();
    if let Some(c) = cleanup.take() {
        c(site);
    }
    if restart_after_successor {
        site.start_agent(leader);
    }
    // A single leader again, by itself, and the faulted host back as a follower (or the leader).
    let settled = wait_for(Duration::from_secs(30), || {
        let v = site.verdicts();
        let leaders = v.iter().filter(|v| *v == "LEADER").count();
        let followers = v.iter().filter(|v| *v == "FOLLOWER").count();
        (leaders == 1 && followers == v.len() - 1).then_some(())
    });
    settled
        .ok_or_else(|| format!("not a single leader with followers after {}: {:?}", fault.name(), site.verdicts()))?;
    Ok(Round { fault, leader, injected, serving, serving_at, lease_deadline, stopped_in, etcd_back_at })
}

/// A MAC the restore faults allow before the snapshot and deny after it (and the peers' cut, before and during).
const RESTORED_MAC: &str = "52:54:00:5e:57:0e";

/// Allows `RESTORED_MAC` through the first control plane and waits until a host's kernel lets it through: (the
/// MAC, that control plane's URL). Err: what went wrong.
fn allow_restored_mac(site: &HaSite) -> Result<(ironguard_dataplane::MacAddr, &'static str), String> {
    let x = crate::mac(RESTORED_MAC);
    let cp = "https://10.90.0.1:9100";
    // Right after the previous restore round the control plane may still refuse writes: it found etcd's filter
    // state older than its own copy ("store amnesia") and refuses them until it has re-seeded etcd from that copy.
    // The refusal says so, and an operator sends the write again; so does this, for up to 60 s.
    let t = Instant::now();
    let allow = loop {
        let allow = crate::ctl(&site.mgmt, &["--controlplane", cp, "filters", "allow", RESTORED_MAC]);
        let refused_until_reseeded = String::from_utf8_lossy(&allow.stderr).contains("store amnesia");
        if allow.status.success() || !refused_until_reseeded || t.elapsed() > Duration::from_secs(60) {
            break allow;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if !allow.status.success() {
        return Err(format!(
            "allowing {RESTORED_MAC} ({:?} after the first try): {}",
            t.elapsed(),
            String::from_utf8_lossy(&allow.stderr)
        ));
    }
    if t.elapsed() > Duration::from_millis(400) {
        eprintln!(
            "allowing {RESTORED_MAC}: accepted {:?} after the first try (the control plane re-seeded etcd)",
            t.elapsed()
        );
    }
    crate::wait_for(Duration::from_secs(20), || (!site.all_refuse(x)).then_some(()))
        .ok_or("the allowed MAC never reached a host's kernel")?;
    Ok((x, cp))
}

/// The restore faults: `RESTORED_MAC` allowed, a snapshot of the cluster saved, the MAC denied (until every host
/// refuses it), then every member stopped, restored from the snapshot (`bump`: `--bump-revision`) and started. Then,
/// for 3 × TTL, every host's kernel is read every 20 ms: none may serve the MAC. Err: what went wrong.
fn restore(site: &mut HaSite, bump: Option<u64>, ttl: Duration) -> Result<(), String> {
    let (x, cp) = allow_restored_mac(site)?;
    let snapshot = site.dir.join(&crate::unique("etcd-snapshot.db"));
    let out = site
        .mgmt
        .cmd("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &site.etcd_endpoints[0], "--command-timeout", "10s", "snapshot", "save"])
        .arg(&snapshot)
        .output()
        .map_err(|e| format!("etcdctl snapshot save: {e}"))?;
    if !out.status.success() {
        return Err(format!("etcdctl snapshot save: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let deny = crate::ctl(&site.mgmt, &["--controlplane", cp, "filters", "deny", RESTORED_MAC]);
    if !deny.status.success() {
        return Err(format!("denying {RESTORED_MAC}: {}", String::from_utf8_lossy(&deny.stderr)));
    }
    crate::wait_for(Duration::from_secs(20), || site.all_refuse(x).then_some(()))
        .ok_or("the denied MAC is still served by a host")?;
    let members = site.etcd_peers.len() + 1;
    for m in 0..members {
        site.etcd_member(m).stop();
    }
    for m in 0..members {
        site.etcd_member(m).restore_from(&snapshot, bump)?;
    }
    for m in 0..members {
        site.etcd_member(m).launch();
    }
    for m in 0..members {
        site.etcd_member(m).wait_up(Duration::from_secs(60));
    }
    let _ = std::fs::remove_file(&snapshot);
    let until = Instant::now() + 3 * ttl;
    while Instant::now() < until {
        if let Some(h) = site.hosts.iter().find(|h| crate::kernel_decision(&h.ns, x).served) {
            return Err(format!(
                "{} serves {RESTORED_MAC}, denied after the snapshot the store was restored from",
                h.id
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// When a frozen or starved host's kernel lease ended: its kernel is read every 10 ms for `window` (a starved agent
/// still runs now and then, and may move its lease after a keep-alive that succeeded), and the end is the one the
/// kernel held when the lease was first seen gone. None if no live lease was ever read. Takes `window`.
fn watch_lease_end(ns: &Netns, window: Duration) -> Option<Instant> {
    let start = Instant::now();
    let mut end = None;
    while start.elapsed() < window {
        let before = Instant::now();
        // A failed read says nothing either way: only a read that succeeded moves the end or finds the lease gone.
        if let Ok(observed) = crate::in_netns(ns, || ironguard_dataplane::observe(false)) {
            match observed.owned.and_then(|t| t.lease_expires_in_ms()) {
                Some(ms) => end = Some(before + Duration::from_millis(ms)),
                None if end.is_some() => break,
                None => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(window.saturating_sub(start.elapsed()));
    end
}

/// The election key of the current leader (the oldest candidate of the site's network) and its lease, in hex.
fn leader_key(site: &HaSite) -> Result<(String, String), String> {
    let out = etcdctl(
        site,
        &[
            "get",
            "--prefix",
            "/ironguard/election/agents/prov/",
            "--keys-only",
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--limit=1",
        ],
    )?;
    let key = out.lines().find(|l| !l.trim().is_empty()).ok_or("no candidate in etcd")?.trim().to_string();
    let lease = key.rsplit('/').next().unwrap_or_default().trim_start_matches('0').to_string();
    if lease.is_empty() {
        return Err(format!("no lease in the candidate key {key:?}"));
    }
    Ok((key, lease))
}

/// Runs etcdctl against the site's etcd (from the management namespace); its output, or what went wrong.
pub fn etcdctl(site: &HaSite, args: &[&str]) -> Result<String, String> {
    let out = site
        .mgmt
        .cmd("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &site.etcd_endpoints.join(",")])
        .args(["--command-timeout", "5s"])
        .args(args)
        .output()
        .map_err(|e| format!("etcdctl: {e} (the README's test command installs etcd-client)"))?;
    if !out.status.success() {
        return Err(format!("etcdctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Drops the host's outgoing TCP to these ports (a table of the test's own in the host's namespace).
fn block(ns: &Netns, ports: &[u16]) -> Result<(), String> {
    let list = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    load_fault_table(
        ns,
        &format!(
            "table inet ig_fault {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    tcp dport {{ {list} }} drop\n  }}\n}}\n"
        ),
    )
}

/// Drops TCP to and from `port` in `ns`, both ways and on connections either side opened (the same table as
/// [`block`]): a clean partition of that port.
fn block_both_ways(ns: &Netns, port: u16) -> Result<(), String> {
    load_fault_table(
        ns,
        &format!(
            "table inet ig_fault {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n  chain in {{\n    type filter hook input priority 0; policy accept;\n    tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n}}\n"
        ),
    )
}

/// Loads an nft script (the fault's own table, `ig_fault`) in `ns`. Err: nft's complaint.
fn load_fault_table(ns: &Netns, script: &str) -> Result<(), String> {
    let path = std::env::temp_dir().join(crate::unique("fault-block.nft"));
    std::fs::write(&path, script).map_err(|e| e.to_string())?;
    let out = ns.cmd("nft").arg("-f").arg(&path).output().map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let out = out?;
    out.status.success().then_some(()).ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

fn unblock(ns: &Netns) {
    let _ = ns.nft(&["delete", "table", "inet", "ig_fault"]);
}

/// A cgroup made for one fault (cgroup v2 where the cpu and memory controllers are there, v1 otherwise).
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    parent_procs: PathBuf,
}

impl Cgroup {
    fn make(controller: &str) -> Result<Self, String> {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == controller));
        let root = if v2 { PathBuf::from("/sys/fs/cgroup") } else { PathBuf::from("/sys/fs/cgroup").join(controller) };
        let dir = root.join(crate::unique(&format!("fault-{controller}")));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create cgroup {}: {e}", dir.display()))?;
        Ok(Self { dir, parent_procs: root.join("cgroup.procs") })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        std::fs::write(self.dir.join(file), value).map_err(|e| format!("{}/{file} = {value}: {e}", self.dir.display()))
    }

    fn exists(&self, file: &str) -> bool {
        self.dir.join(file).exists()
    }

    /// `pid` (all its threads) gets 1 ms of CPU per second.
    pub fn cpu_starved(pid: i32) -> Result<Self, String> {
        let cg = Self::make("cpu")?;
        if cg.exists("cpu.max") {
            cg.write("cpu.max", "1000 1000000")?;
        } else {
            cg.write("cpu.cfs_period_us", "1000000")?;
            cg.write("cpu.cfs_quota_us", "1000")?;
        }
        cg.write("cgroup.procs", &pid.to_string())?;
        Ok(cg)
    }

    /// `pid` may use `bytes` of memory from now on: its next allocations bring the OOM killer.
    pub fn memory_limited(pid: i32, bytes: u64) -> Result<Self, String> {
        let cg = Self::make("memory")?;
        if cg.exists("memory.max") {
            cg.write("memory.max", &bytes.to_string())?;
        } else {
            cg.write("memory.limit_in_bytes", &bytes.to_string())?;
        }
        cg.write("cgroup.procs", &pid.to_string())?;
        Ok(cg)
    }

    /// Moves `pid` back (if it still lives) and removes the cgroup.
    pub fn release(self, pid: i32) {
        let _ = std::fs::write(&self.parent_procs, pid.to_string());
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
