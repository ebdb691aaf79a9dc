//! What each agent last reported: applied revision, mode, DHCP health. Kept in memory; an agent reports every few
//! seconds and after every apply, so a restarted control plane knows every live agent again within seconds.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ironguard_proto::v1::{AgentInfo, AgentStatus, Mode};

/// Agents that reported, by id.
#[derive(Debug)]
pub struct AgentRegistry {
    agents: Mutex<BTreeMap<String, (AgentStatus, Instant)>>,
    stale_after: Duration,
}

impl AgentRegistry {
    pub fn new(stale_after: Duration) -> Self {
        Self { agents: Mutex::new(BTreeMap::new()), stale_after }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (AgentStatus, Instant)>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a report.
    pub fn report(&self, status: AgentStatus) {
        self.lock().insert(status.agent_id.clone(), (status, Instant::now()));
    }

    /// Every agent with its lag behind `current` revision.
    pub fn list(&self, current: u64) -> Vec<AgentInfo> {
        self.lock()
            .values()
            .map(|(s, seen)| {
                let age = seen.elapsed();
                AgentInfo {
                    lag: current.saturating_sub(s.applied_revision),
                    last_seen_ms: age.as_millis() as u64,
                    stale: age > self.stale_after,
                    status: Some(s.clone()),
                }
            })
            .collect()
    }

    /// The highest revision applied by a live agent in `Leader` mode on `network` (any network if empty).
    pub fn leader_applied(&self, network: &str) -> Option<u64> {
        self.lock()
            .values()
            .filter(|(s, seen)| {
                seen.elapsed() <= self.stale_after
                    && s.mode == Mode::Leader as i32
                    && (network.is_empty() || s.network == network)
            })
            .map(|(s, _)| s.applied_revision)
            .max()
    }
}
