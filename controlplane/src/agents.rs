//! What each agent last reported: applied revision, mode, DHCP health — and who leads each network.
//!
//! Single host: kept in memory. With etcd: every replica writes the reports it receives under
//! `<prefix>/agents/status/<id>@<host>` (with the time received), so `ListAgents` on any replica shows every agent,
//! and the leader of each network is read from the agents' election. Reports are kept per agent id *and* host, so
//! two hosts that report one id (a copied configuration) show as two rows, with a warning ([`conflicts`]).

use std::collections::BTreeSet;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironguard_coord::Coordinator;
use ironguard_dataplane::MacAddr;
use ironguard_proto::time::now_ms;
use ironguard_proto::v1::{AgentInfo, AgentStatus, Mode, NetworkLeader};
use prost::Message as _;
use tracing::warn;

/// Where reports live.
pub enum AgentRegistry {
    Local {
        /// By agent id and host.
        agents: Mutex<BTreeMap<(String, String), (AgentStatus, Instant)>>,
        /// The conflicts already logged.
        warned: Mutex<BTreeSet<String>>,
        stale_after: Duration,
        reports: tokio::sync::watch::Sender<u64>,
    },
    Shared {
        coord: Arc<dyn Coordinator>,
        stale_after: Duration,
        reports: tokio::sync::watch::Sender<u64>,
    },
}

impl std::fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AgentRegistry::Local { .. } => "AgentRegistry::Local",
            AgentRegistry::Shared { .. } => "AgentRegistry::Shared",
        })
    }
}

const STATUS: &str = "agents/status/";

impl AgentRegistry {
    pub fn local(stale_after: Duration) -> Self {
        Self::Local {
            agents: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeSet::new()),
            stale_after,
            reports: tokio::sync::watch::channel(0).0,
        }
    }

    pub fn shared(coord: Arc<dyn Coordinator>, stale_after: Duration) -> Self {
        Self::Shared { coord, stale_after, reports: tokio::sync::watch::channel(0).0 }
    }

    /// Changes whenever this replica receives a report (waiters then re-read; other replicas' reports are seen by
    /// polling).
    pub fn reports(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            AgentRegistry::Local { reports, .. } | AgentRegistry::Shared { reports, .. } => reports.subscribe(),
        }
    }

    /// "etcd" or "embedded".
    pub fn coordination(&self) -> &'static str {
        match self {
            AgentRegistry::Local { .. } => "embedded",
            AgentRegistry::Shared { .. } => "etcd",
        }
    }

    /// Records a report.
    pub async fn report(&self, status: AgentStatus) {
        match self {
            AgentRegistry::Local { agents, warned, stale_after, reports } => {
                let found = {
                    let mut agents = agents.lock().unwrap_or_else(|e| e.into_inner());
                    let key = (status.agent_id.clone(), status.host.clone());
                    agents.insert(key, (status, Instant::now()));
                    let all: Vec<_> = agents.values().map(|(s, at)| (s.clone(), at.elapsed())).collect();
                    conflicts(&all, *stale_after)
                };
                let mut warned = warned.lock().unwrap_or_else(|e| e.into_inner());
                for w in &found {
                    if warned.insert(w.clone()) {
                        warn!(warning = %w, "agents in conflict");
                    }
                }
                warned.retain(|w| found.contains(w));
                reports.send_modify(|n| *n += 1);
            }
            AgentRegistry::Shared { coord, reports, .. } => {
                let mut v = now_ms().to_be_bytes().to_vec();
                v.extend(status.encode_to_vec());
                if let Err(e) = coord.put(&format!("{STATUS}{}@{}", status.agent_id, status.host), v, None).await {
                    warn!(error = %e, agent = %status.agent_id, "cannot store an agent report in etcd");
                }
                reports.send_modify(|n| *n += 1);
            }
        }
    }

    /// Every known agent: (status, age).
    async fn all(&self) -> Vec<(AgentStatus, Duration)> {
        match self {
            AgentRegistry::Local { agents, .. } => agents
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|(s, seen)| (s.clone(), seen.elapsed()))
                .collect(),
            AgentRegistry::Shared { coord, .. } => {
                let now = now_ms();
                match coord.get_prefix(STATUS).await {
                    Ok(kvs) => {
                        let all: Vec<(bool, AgentStatus, Duration)> = kvs
                            .into_iter()
                            .filter_map(|kv| {
                                let at = u64::from_be_bytes(kv.value.get(..8)?.try_into().ok()?);
                                let s = AgentStatus::decode(kv.value.get(8..)?).ok()?;
                                // Written by a replica from before the host was in the key.
                                let old = kv.key.ends_with(&format!("{STATUS}{}", s.agent_id));
                                Some((old, s, Duration::from_millis(now.saturating_sub(at))))
                            })
                            .collect();
                        // An old-style report is left out once the same agent reports under the new key.
                        let renewed: BTreeSet<String> =
                            all.iter().filter(|(old, ..)| !old).map(|(_, s, _)| s.agent_id.clone()).collect();
                        all.into_iter()
                            .filter(|(old, s, _)| !old || !renewed.contains(&s.agent_id))
                            .map(|(_, s, age)| (s, age))
                            .collect()
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read agent reports from etcd");
                        vec![]
                    }
                }
            }
        }
    }

    fn stale_after(&self) -> Duration {
        match self {
            AgentRegistry::Local { stale_after, .. } | AgentRegistry::Shared { stale_after, .. } => *stale_after,
        }
    }

    /// Every agent with its lag behind `current`, the leader of each network, and what is wrong ([`conflicts`]).
    pub async fn list(&self, current: u64) -> (Vec<AgentInfo>, Vec<NetworkLeader>, Vec<String>) {
        let all = self.all().await;
        let stale_after = self.stale_after();
        let warnings = conflicts(&all, stale_after);
        let networks: std::collections::BTreeSet<String> = all.iter().map(|(s, _)| s.network.clone()).collect();
        let mut leaders = Vec::new();
        for net in networks {
            let leader = match self {
                AgentRegistry::Shared { coord, .. } => {
                    coord.leader(&format!("agents/{net}")).await.ok().flatten().unwrap_or_default()
                }
                AgentRegistry::Local { .. } => all
                    .iter()
                    .find(|(s, age)| s.network == net && s.mode == Mode::Leader as i32 && *age <= stale_after)
                    .map(|(s, _)| s.agent_id.clone())
                    .unwrap_or_default(),
            };
            leaders.push(NetworkLeader { network: net, agent_id: leader });
        }
        let infos = all
            .into_iter()
            .map(|(s, age)| AgentInfo {
                lag: current.saturating_sub(s.applied_revision),
                last_seen_ms: age.as_millis() as u64,
                stale: age > stale_after,
                elected: leaders.iter().any(|l| l.network == s.network && l.agent_id == s.agent_id),
                status: Some(s),
            })
            .collect();
        (infos, leaders, warnings)
    }

    /// With `[inspection] network` empty: the one network whose live agents report. Agents of several networks are
    /// an error (a leader of another network applying an allow says nothing of the nodes' network); none is the
    /// empty name, for which no leader counts.
    pub async fn the_network(&self) -> Result<String, String> {
        let stale_after = self.stale_after();
        let networks: BTreeSet<String> =
            self.all().await.into_iter().filter(|(_, age)| *age <= stale_after).map(|(s, _)| s.network).collect();
        match networks.len() {
            0 | 1 => Ok(networks.into_iter().next().unwrap_or_default()),
            _ => Err(format!(
                "agents of several networks report ({}): set [inspection] network to the one the nodes boot on",
                networks.into_iter().collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// What the kernels of `network`'s agents saw of `mac`'s DHCP: the evidence a ramdisk's data needs before it is
    /// accepted for a node (`[inspection] callback_evidence`). Every report of the network counts, a former
    /// leader's last one too: what its kernel let through stays true.
    pub async fn dhcp_passed(&self, network: &str, mac: MacAddr) -> DhcpEvidence {
        let mut unobserved = Vec::new();
        let mut observed = false;
        let mut best: Option<(u64, String)> = None;
        for (s, _) in self.all().await.into_iter().filter(|(s, _)| s.network == network) {
            if !s.dhcp_seen_observed {
                let why = if s.dhcp_seen_error.is_empty() { "does not observe DHCP" } else { &s.dhcp_seen_error };
                unobserved.push(format!("agent {}: {why}", s.agent_id));
                continue;
            }
            observed = true;
            let passed = s
                .dhcp_seen
                .iter()
                .filter(|d| d.mac.parse::<MacAddr>() == Ok(mac))
                .filter_map(|d| d.passed.as_ref().filter(|p| p.count > 0).map(|p| p.last_unix_ms))
                .max();
            if let Some(t) = passed.filter(|t| best.as_ref().is_none_or(|(b, _)| t > b)) {
                best = Some((t, s.agent_id.clone()));
            }
        }
        match best {
            Some((last_unix_ms, agent)) => DhcpEvidence::Passed { last_unix_ms, agent },
            None if observed => DhcpEvidence::NotPassed,
            None if unobserved.is_empty() => {
                DhcpEvidence::Unobservable(format!("no agent of network {network:?} reports"))
            }
            None => DhcpEvidence::Unobservable(unobserved.join("; ")),
        }
    }

    /// The highest revision applied by a live agent in `Leader` mode on `network`.
    pub async fn leader_applied(&self, network: &str) -> Option<u64> {
        let stale_after = self.stale_after();
        self.all()
            .await
            .into_iter()
            .filter(|(s, age)| *age <= stale_after && s.mode == Mode::Leader as i32 && s.network == network)
            .map(|(s, _)| s.applied_revision)
            .max()
    }
}

/// What the kernels of a network's agents saw of one MAC's DHCP ([`AgentRegistry::dhcp_passed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DhcpEvidence {
    /// A request from the MAC was let through to a DHCP server, last at this time (Unix milliseconds, the agent's
    /// clock), by this agent's kernel.
    Passed { last_unix_ms: u64, agent: String },
    /// The network's agents observe DHCP and none reports the MAC let through (not let through, or not reported
    /// yet: a report follows a change within seconds).
    NotPassed,
    /// No agent of the network can say: why.
    Unobservable(String),
}

/// What is wrong with the live agents as they report (stale reports are left out), in words with what to do:
/// - one agent id reported by several hosts: a copied configuration; their reports overwrite each other's in the
///   election and in `leader_applied`, and their certificates (one name) cannot tell them apart;
/// - several agents of one network that elect themselves without etcd ("local"): each may lead, so each may serve
///   DHCP on the same wire.
pub fn conflicts(all: &[(AgentStatus, Duration)], stale_after: Duration) -> Vec<String> {
    let live: Vec<&AgentStatus> = all.iter().filter(|(_, age)| *age <= stale_after).map(|(s, _)| s).collect();
    let mut out = Vec::new();
    let mut hosts: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut local: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in &live {
        hosts.entry(&s.agent_id).or_default().insert(&s.host);
        if s.coordination == "local" {
            local.entry(&s.network).or_default().insert(&s.agent_id);
        }
    }
    for (id, hosts) in hosts.iter().filter(|(_, h)| h.len() > 1) {
        let list: Vec<&str> = hosts.iter().copied().collect();
        out.push(format!(
            "agent id {id:?} is reported by {} hosts ({}): give each agent its own [agent] id (and certificate)",
            list.len(),
            list.join(", ")
        ));
    }
    // The same etcd server reported by several agents is one warning naming them all.
    let mut etcd: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in &live {
        for w in &s.etcd_warnings {
            etcd.entry(w).or_default().insert(&s.agent_id);
        }
    }
    for (w, ids) in &etcd {
        let list: Vec<&str> = ids.iter().copied().collect();
        out.push(format!("agent{} {}: {w}", if list.len() > 1 { "s" } else { "" }, list.join(", ")));
    }
    for (network, ids) in local.iter().filter(|(_, ids)| ids.len() > 1) {
        let list: Vec<&str> = ids.iter().copied().collect();
        out.push(format!(
            "network {network:?}: agents {} run without etcd, so each elects itself and may serve DHCP: give the \
             agents of one network one etcd ([etcd] endpoints), or keep one agent per network",
            list.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, host: &str, network: &str, coordination: &str) -> AgentStatus {
        AgentStatus {
            agent_id: id.into(),
            host: host.into(),
            network: network.into(),
            coordination: coordination.into(),
            ..Default::default()
        }
    }

    const FRESH: Duration = Duration::from_secs(1);
    const BOUND: Duration = Duration::from_secs(10);

    #[test]
    fn one_id_from_two_hosts_and_two_local_agents_of_one_network_are_flagged() {
        let all = vec![
            (status("pxe-1", "host-a", "prov", "etcd"), FRESH),
            (status("pxe-1", "host-b", "prov", "etcd"), FRESH),
            (status("pxe-2", "host-c", "lab", "local"), FRESH),
            (status("pxe-3", "host-d", "lab", "local"), FRESH),
            (status("pxe-4", "host-e", "other", "local"), FRESH),
        ];
        let w = conflicts(&all, BOUND);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("\"pxe-1\" is reported by 2 hosts (host-a, host-b)"), "{w:?}");
        assert!(w[1].contains("network \"lab\": agents pxe-2, pxe-3 run without etcd"), "{w:?}");
    }

    /// What the agents say of their etcd servers is listed once per server, with every agent that says it; a
    /// stale agent's report is not.
    #[test]
    fn outdated_etcd_servers_are_listed_once_with_the_agents_that_report_them() {
        let old = ironguard_coord::versions::warning("http://10.0.0.1:2379", "3.4.23").unwrap_or_default();
        let other = ironguard_coord::versions::warning("http://10.0.0.2:2379", "3.5.16").unwrap_or_default();
        let with = |id: &str, host: &str, w: &[&String]| {
            let mut s = status(id, host, "prov", "etcd");
            s.etcd_warnings = w.iter().map(|w| w.to_string()).collect();
            s
        };
        let all = vec![
            (with("pxe-1", "host-a", &[&old, &other]), FRESH),
            (with("pxe-2", "host-b", &[&old]), FRESH),
            (with("pxe-3", "host-c", &[]), FRESH),
            (with("pxe-9", "host-z", &[&other]), BOUND * 2),
        ];
        let w = conflicts(&all, BOUND);
        assert_eq!(w, vec![format!("agents pxe-1, pxe-2: {old}"), format!("agent pxe-1: {other}")], "{w:?}");
        assert!(w[0].contains("3.4.23") && w[0].contains("upgrade etcd"), "{w:?}");
    }

    #[test]
    fn stale_reports_older_agents_and_one_local_agent_per_network_are_not_flagged() {
        let all = vec![
            (status("pxe-1", "host-a", "prov", "etcd"), FRESH),
            (status("pxe-1", "host-b", "prov", "etcd"), BOUND * 2),
            (status("pxe-2", "host-c", "lab", "local"), FRESH),
            (status("pxe-3", "host-d", "lab", ""), FRESH),
            (status("pxe-4", "host-e", "lab", "local"), BOUND * 2),
        ];
        assert_eq!(conflicts(&all, BOUND), Vec::<String>::new());
    }

    /// `[inspection] network` empty: the leader of the one reporting network counts; with agents of two networks,
    /// neither does (a start fails and says what to set).
    #[tokio::test]
    async fn leader_applied_counts_for_one_network_only() {
        let r = AgentRegistry::local(BOUND);
        let leader = |id: &str, network: &str, rev: u64| AgentStatus {
            mode: Mode::Leader as i32,
            applied_revision: rev,
            ..status(id, id, network, "etcd")
        };
        r.report(leader("pxe-a", "prov", 7)).await;
        assert_eq!(r.the_network().await, Ok("prov".to_string()));
        assert_eq!(r.leader_applied("prov").await, Some(7));
        r.report(leader("pxe-b", "lab", 9)).await;
        let e = r.the_network().await.unwrap_err();
        assert!(e.contains("several networks report (lab, prov)"), "{e}");
        assert_eq!(r.leader_applied("prov").await, Some(7), "lab's leader does not count for prov");
        assert_eq!(r.leader_applied("").await, None, "no network named, no leader counts");
    }

    /// The evidence for a MAC is the newest `passed` among the network's reports; a MAC only requested is not let
    /// through; a network whose agents do not observe (ipset, hostsdir) cannot say, and says why.
    #[tokio::test]
    async fn dhcp_evidence_is_the_newest_pass_on_the_network() {
        use ironguard_proto::v1::{DhcpSeen, SeenCount};
        let r = AgentRegistry::local(BOUND);
        let seen = |mac: &str, requests: u64, passed: u64, at: u64| DhcpSeen {
            mac: mac.into(),
            requests: Some(SeenCount { count: requests, last_unix_ms: at }),
            passed: Some(SeenCount { count: passed, last_unix_ms: if passed > 0 { at } else { 0 } }),
            answers: None,
        };
        let m1: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let m2: MacAddr = "52:54:00:00:00:02".parse().unwrap();
        assert!(matches!(r.dhcp_passed("prov", m1).await, DhcpEvidence::Unobservable(w) if w.contains("no agent")));
        let mut a = status("pxe-a", "host-a", "prov", "etcd");
        a.dhcp_seen_observed = true;
        a.dhcp_seen = vec![seen("52:54:00:00:00:01", 3, 2, 1000), seen("52:54:00:00:00:02", 9, 0, 1500)];
        r.report(a).await;
        let mut b = status("pxe-b", "host-b", "prov", "etcd");
        b.dhcp_seen_observed = true;
        b.dhcp_seen = vec![seen("52:54:00:00:00:01", 1, 1, 4000)];
        r.report(b).await;
        assert_eq!(r.dhcp_passed("prov", m1).await, DhcpEvidence::Passed { last_unix_ms: 4000, agent: "pxe-b".into() });
        assert_eq!(r.dhcp_passed("prov", m2).await, DhcpEvidence::NotPassed, "requested, never let through");
        assert!(matches!(r.dhcp_passed("lab", m1).await, DhcpEvidence::Unobservable(_)), "another network's pass");
        let mut c = status("pxe-c", "host-c", "ipset", "etcd");
        c.dhcp_seen_error = "this host's backend does not observe DHCP (only nftables does)".into();
        r.report(c).await;
        let e = r.dhcp_passed("ipset", m1).await;
        assert!(
            matches!(&e, DhcpEvidence::Unobservable(w) if w.contains("pxe-c") && w.contains("only nftables")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn the_local_registry_keeps_one_row_per_host_of_an_id() {
        let r = AgentRegistry::local(BOUND);
        r.report(status("pxe-1", "host-a", "prov", "etcd")).await;
        r.report(status("pxe-1", "host-b", "prov", "etcd")).await;
        r.report(status("pxe-1", "host-a", "prov", "etcd")).await;
        let (infos, _, warnings) = r.list(0).await;
        let hosts: Vec<String> = infos.iter().map(|i| i.status.clone().unwrap_or_default().host).collect();
        assert_eq!(hosts, vec!["host-a", "host-b"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }
}
