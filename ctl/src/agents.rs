//! `ironguardctl agents`: the answer to `ListAgents` — every agent's mode, applied revision, lag and DHCP health —
//! as text or JSON.

use std::fmt::{self, Write as _};

use ironguard_proto::v1::{self as pb, ListAgentsResponse};
use serde::{Serialize, Serializer};

use crate::table::Table;

/// The firewall mode an agent reports. A value this build does not know is kept, not mistaken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Unspecified,
    Blocked,
    Follower,
    Leader,
    Unrecognized(i32),
}

impl From<i32> for Mode {
    fn from(value: i32) -> Self {
        match pb::Mode::try_from(value) {
            Ok(pb::Mode::Unspecified) => Self::Unspecified,
            Ok(pb::Mode::Blocked) => Self::Blocked,
            Ok(pb::Mode::Follower) => Self::Follower,
            Ok(pb::Mode::Leader) => Self::Leader,
            Err(_) => Self::Unrecognized(value),
        }
    }
}

/// Lower case, as in JSON: `leader`; the text table shows it upper case.
impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unspecified => f.write_str("unspecified"),
            Self::Blocked => f.write_str("blocked"),
            Self::Follower => f.write_str("follower"),
            Self::Leader => f.write_str("leader"),
            Self::Unrecognized(n) => write!(f, "unrecognized({n})"),
        }
    }
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The JSON document printed by `ironguardctl agents --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentsReport {
    pub current_revision: u64,
    pub agents: Vec<AgentReport>,
    /// "etcd" or "embedded" (empty from an older control plane).
    pub coordination: String,
    /// Each network and its elected agent (`None`: nobody leads).
    pub leaders: Vec<(String, Option<String>)>,
    /// The last store amnesia (etcd replaced or restored) the control plane saw, and how it handled it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_amnesia: Option<String>,
    /// What is wrong with the agents (one id from several hosts, several self-electing agents on one network).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentReport {
    pub agent_id: String,
    pub host: String,
    pub network: String,
    pub mode: Mode,
    /// Why the agent is in its mode: "leader", "dhcp unhealthy", "control plane lost", ...
    pub mode_reason: String,
    pub applied_revision: u64,
    /// Current revision minus applied revision.
    pub lag: u64,
    pub allow_count: u64,
    pub deny_count: u64,
    /// `None` when the agent reported no DHCP health.
    pub dhcp: Option<DhcpReport>,
    /// `None` when the agent's last operation succeeded.
    pub last_error: Option<String>,
    pub last_seen_ms: u64,
    /// No report for longer than the control plane's staleness bound: the agent is probably gone.
    pub stale: bool,
    /// Holds its network's election (HA) — the one host that may serve DHCP.
    pub elected: bool,
    pub version: String,
    pub snapshots_applied: u64,
    pub resumes: u64,
    /// "etcd", or "local" (no etcd: the agent elects itself); empty from an older agent.
    pub coordination: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DhcpReport {
    pub healthy: bool,
    pub detail: String,
}

impl From<pb::AgentInfo> for AgentReport {
    fn from(info: pb::AgentInfo) -> Self {
        let status = info.status.unwrap_or_default();
        Self {
            agent_id: status.agent_id,
            host: status.host,
            network: status.network,
            mode: status.mode.into(),
            mode_reason: status.mode_reason,
            applied_revision: status.applied_revision,
            lag: info.lag,
            allow_count: status.allow_count,
            deny_count: status.deny_count,
            dhcp: status.dhcp.map(|d| DhcpReport { healthy: d.healthy, detail: d.detail }),
            last_error: Some(status.last_error).filter(|e| !e.is_empty()),
            last_seen_ms: info.last_seen_ms,
            stale: info.stale,
            elected: info.elected,
            version: status.version,
            snapshots_applied: status.snapshots_applied,
            resumes: status.resumes,
            coordination: status.coordination,
        }
    }
}

impl From<ListAgentsResponse> for AgentsReport {
    fn from(answer: ListAgentsResponse) -> Self {
        Self {
            current_revision: answer.current_revision,
            agents: answer.agents.into_iter().map(AgentReport::from).collect(),
            coordination: answer.coordination,
            leaders: answer
                .leaders
                .into_iter()
                .map(|l| (l.network, Some(l.agent_id).filter(|a| !a.is_empty())))
                .collect(),
            store_amnesia: Some(answer.store_amnesia).filter(|a| !a.is_empty()),
            warnings: answer.warnings,
        }
    }
}

impl AgentsReport {
    /// Human-readable rendering: the current revision, then one line per agent whose last column gathers the
    /// free text (DHCP health, mode reason, last error).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "current revision: {}", self.current_revision);
        if !self.coordination.is_empty() {
            let _ = writeln!(out, "coordination: {}", self.coordination);
        }
        if let Some(a) = &self.store_amnesia {
            let _ = writeln!(out, "STORE AMNESIA: {a}");
        }
        for w in &self.warnings {
            let _ = writeln!(out, "WARNING: {w}");
        }
        for (network, leader) in &self.leaders {
            match leader {
                Some(a) => {
                    let _ = writeln!(out, "network {network}: leader {a}");
                }
                None => {
                    let _ = writeln!(out, "network {network}: NO LEADER (every host closed)");
                }
            }
        }
        if self.agents.is_empty() {
            let _ = writeln!(out, "no agent has reported to the control plane");
            return out;
        }
        let mut table =
            Table::new(&["AGENT", "HOST", "NETWORK", "MODE", "APPLIED", "LAG", "LAST SEEN", "DHCP / REASON / ERROR"]);
        for a in &self.agents {
            table.row(vec![
                if a.elected { format!("{} *", a.agent_id) } else { or_dash(&a.agent_id) },
                or_dash(&a.host),
                or_dash(&a.network),
                a.mode.to_string().to_uppercase(),
                a.applied_revision.to_string(),
                a.lag.to_string(),
                last_seen(a.last_seen_ms, a.stale),
                a.notes(),
            ]);
        }
        out.push_str(&table.render());
        out
    }
}

impl AgentReport {
    /// `dhcp healthy; reason: leader` or `dhcp unhealthy (nothing listens on udp/67); reason: ...; error: ...`.
    fn notes(&self) -> String {
        let mut notes = vec![match &self.dhcp {
            Some(d) if d.healthy => "dhcp healthy".to_string(),
            Some(d) if d.detail.is_empty() => "dhcp unhealthy".to_string(),
            Some(d) => format!("dhcp unhealthy ({})", d.detail),
            None => "dhcp unknown".to_string(),
        }];
        if !self.mode_reason.is_empty() {
            notes.push(format!("reason: {}", self.mode_reason));
        }
        if let Some(e) = &self.last_error {
            notes.push(format!("error: {e}"));
        }
        notes.join("; ")
    }
}

/// Seconds with one decimal, `STALE` appended when the control plane considers the agent gone.
fn last_seen(ms: u64, stale: bool) -> String {
    let seen = format!("{}.{}s ago", ms / 1000, ms % 1000 / 100);
    if stale { format!("{seen} STALE") } else { seen }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() { "-".to_string() } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use ironguard_proto::v1::{AgentInfo, AgentStatus, DhcpHealth};

    use super::*;

    fn sample() -> ListAgentsResponse {
        ListAgentsResponse {
            current_revision: 42,
            agents: vec![
                AgentInfo {
                    status: Some(AgentStatus {
                        agent_id: "pxe-a".into(),
                        host: "ctrl-1".into(),
                        network: "provisioning".into(),
                        applied_revision: 42,
                        mode: pb::Mode::Leader as i32,
                        allow_count: 2,
                        deny_count: 1,
                        last_error: String::new(),
                        dhcp: Some(DhcpHealth {
                            healthy: true,
                            detail: "dnsmasq (pid 123) listening on udp/67".into(),
                        }),
                        mode_reason: "leader".into(),
                        version: "0.1.0".into(),
                        snapshots_applied: 1,
                        resumes: 0,
                        lease_until_unix_ms: 0,
                        ..Default::default()
                    }),
                    lag: 0,
                    last_seen_ms: 1_234,
                    stale: false,
                    elected: false,
                },
                AgentInfo {
                    status: Some(AgentStatus {
                        agent_id: "pxe-b".into(),
                        host: "ctrl-2".into(),
                        network: "provisioning".into(),
                        applied_revision: 40,
                        mode: pb::Mode::Blocked as i32,
                        allow_count: 2,
                        deny_count: 0,
                        last_error: "apply revision 41: netlink: Operation not permitted".into(),
                        dhcp: Some(DhcpHealth { healthy: false, detail: "nothing listens on udp/67".into() }),
                        mode_reason: "dhcp unhealthy".into(),
                        version: "0.1.0".into(),
                        snapshots_applied: 2,
                        resumes: 3,
                        lease_until_unix_ms: 0,
                        ..Default::default()
                    }),
                    lag: 2,
                    last_seen_ms: 95_020,
                    stale: true,
                    elected: false,
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn renders_one_line_per_agent() {
        let text = AgentsReport::from(sample()).render();
        assert_eq!(
            text,
            "current revision: 42\n\
             AGENT  HOST    NETWORK       MODE     APPLIED  LAG  LAST SEEN        DHCP / REASON / ERROR\n\
             pxe-a  ctrl-1  provisioning  LEADER   42       0    1.2s ago         dhcp healthy; reason: leader\n\
             pxe-b  ctrl-2  provisioning  BLOCKED  40       2    95.0s ago STALE  dhcp unhealthy (nothing listens on \
             udp/67); reason: dhcp unhealthy; error: apply revision 41: netlink: Operation not permitted\n"
        );
    }

    #[test]
    fn the_control_planes_warnings_come_first() {
        let answer = ListAgentsResponse {
            warnings: vec![
                "agent id \"pxe-a\" is reported by 2 hosts (ctrl-1, ctrl-9): give each agent its own id".into(),
            ],
            ..sample()
        };
        let text = AgentsReport::from(answer.clone()).render();
        assert!(
            text.starts_with(
                "current revision: 42\nWARNING: agent id \"pxe-a\" is reported by 2 hosts (ctrl-1, ctrl-9): give"
            ),
            "{text}"
        );
        let json = serde_json::to_value(AgentsReport::from(answer)).unwrap();
        assert_eq!(json["warnings"][0].as_str().map(|w| w.contains("ctrl-9")), Some(true), "{json}");
        let none = serde_json::to_value(AgentsReport::from(sample())).unwrap();
        assert!(none.get("warnings").is_none(), "no warnings, no key: {none}");
    }

    #[test]
    fn no_agents_says_so() {
        let text = AgentsReport::from(ListAgentsResponse { current_revision: 7, agents: vec![], ..Default::default() })
            .render();
        assert_eq!(text, "current revision: 7\nno agent has reported to the control plane\n");
    }

    #[test]
    fn a_follower_without_dhcp_report_or_reason() {
        let info = AgentInfo {
            status: Some(AgentStatus {
                agent_id: "pxe-c".into(),
                mode: pb::Mode::Follower as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text =
            AgentsReport::from(ListAgentsResponse { current_revision: 1, agents: vec![info], ..Default::default() })
                .render();
        let line = text.lines().last().unwrap();
        assert_eq!(line, "pxe-c  -     -        FOLLOWER  0        0    0.0s ago   dhcp unknown");
    }

    #[test]
    fn json_uses_strings_for_the_mode_and_null_for_no_error() {
        let json = serde_json::to_value(AgentsReport::from(sample())).unwrap();
        assert_eq!(json["current_revision"], 42);
        assert_eq!(
            json["agents"][0],
            serde_json::json!({
                "agent_id": "pxe-a",
                "host": "ctrl-1",
                "network": "provisioning",
                "mode": "leader",
                "mode_reason": "leader",
                "applied_revision": 42,
                "lag": 0,
                "allow_count": 2,
                "deny_count": 1,
                "dhcp": {"healthy": true, "detail": "dnsmasq (pid 123) listening on udp/67"},
                "last_error": null,
                "last_seen_ms": 1234,
                "stale": false,
                "elected": false,
                "version": "0.1.0",
                "snapshots_applied": 1,
                "resumes": 0,
                "coordination": ""
            })
        );
        assert_eq!(json["agents"][1]["mode"], "blocked");
        assert_eq!(json["agents"][1]["stale"], true);
        assert_eq!(json["agents"][1]["last_error"], "apply revision 41: netlink: Operation not permitted");
    }

    #[test]
    fn a_mode_this_build_does_not_know_is_kept() {
        assert_eq!(Mode::from(9), Mode::Unrecognized(9));
        assert_eq!(Mode::from(9).to_string(), "unrecognized(9)");
        assert_eq!(Mode::from(2).to_string(), "follower");
    }
}
