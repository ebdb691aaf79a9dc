//! What each agent last reported: applied revision, mode, DHCP health — and who leads each network.
//!
//! Single host: kept in memory. With etcd: every replica writes the reports it receives under
//! `<prefix>/agents/status/<id>` (with the time received), so `ListAgents` on any replica shows every agent, and
//! the leader of each network is read from the agents' election.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironguard_coord::Coordinator;
use ironguard_proto::time::now_ms;
use ironguard_proto::v1::{AgentInfo, AgentStatus, Mode, NetworkLeader};
use prost::Message as _;
use tracing::warn;

/// Where reports live.
pub enum AgentRegistry {
    Local {
        agents: Mutex<BTreeMap<String, (AgentStatus, Instant)>>,
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
        Self::Local { agents: Mutex::new(BTreeMap::new()), stale_after, reports: tokio::sync::watch::channel(0).0 }
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
            AgentRegistry::Local { agents, reports, .. } => {
                agents
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(status.agent_id.clone(), (status, Instant::now()));
                reports.send_modify(|n| *n += 1);
            }
            AgentRegistry::Shared { coord, reports, .. } => {
                let mut v = now_ms().to_be_bytes().to_vec();
                v.extend(status.encode_to_vec());
                if let Err(e) = coord.put(&format!("{STATUS}{}", status.agent_id), v, None).await {
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
                    Ok(kvs) => kvs
                        .into_iter()
                        .filter_map(|kv| {
                            let at = u64::from_be_bytes(kv.value.get(..8)?.try_into().ok()?);
                            let s = AgentStatus::decode(kv.value.get(8..)?).ok()?;
                            Some((s, Duration::from_millis(now.saturating_sub(at))))
                        })
                        .collect(),
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

    /// Every agent with its lag behind `current`, and the leader of each network.
    pub async fn list(&self, current: u64) -> (Vec<AgentInfo>, Vec<NetworkLeader>) {
        let all = self.all().await;
        let stale_after = self.stale_after();
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
        (infos, leaders)
    }

    /// The highest revision applied by a live agent in `Leader` mode on `network` (any network if empty).
    pub async fn leader_applied(&self, network: &str) -> Option<u64> {
        let stale_after = self.stale_after();
        self.all()
            .await
            .into_iter()
            .filter(|(s, age)| {
                *age <= stale_after && s.mode == Mode::Leader as i32 && (network.is_empty() || s.network == network)
            })
            .map(|(s, _)| s.applied_revision)
            .max()
    }
}
