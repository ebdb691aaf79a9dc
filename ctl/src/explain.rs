//! `ironguardctl explain MAC`: does this MAC get DHCP now, on each PXE host, and why.
//!
//! The control plane's `ExplainMac` answers for every host from what it holds: the MAC's reasons with their source
//! and age, the revision that last moved it, each agent's mode, lease and applied revision with the MAC's
//! membership there, the rule that decides, and the Ironic/inspection state behind the reasons. With `--local`
//! the kernel of this host (or of `--netns`) is read too and judged by the same function
//! ([`ironguard_dataplane::decide`]), so a host whose kernel disagrees with its agent's report shows it.

use std::fmt::Write as _;

use ironguard_dataplane::{MacAddr, MacDecision, Mode as NftMode, UnknownMacPolicy};
use ironguard_proto::time::now_ms;
use ironguard_proto::v1::{self as pb, MacExplanation};
use serde::Serialize;

use crate::agents::{AgentReport, Mode};
use crate::table::Table;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExplainReport {
    pub mac: String,
    /// What the filter decides before any host's state: "allowed (...)", "denied (...)", "unknown MAC: ...".
    pub decision: String,
    /// Served by at least one host, as the control plane judges from the agents' reports (None: no control plane
    /// answer).
    pub served_anywhere: Option<bool>,
    pub revision: u64,
    pub unknown_mac_policy: String,
    /// The revision that last moved this MAC in or out of a set (0: never / not recorded).
    pub changed_revision: u64,
    pub allow: Vec<ReasonReport>,
    pub deny: Vec<ReasonReport>,
    pub nodes: Vec<NodeReport>,
    pub coordination: String,
    /// (network, leader agent id; None: nobody leads).
    pub leaders: Vec<(String, Option<String>)>,
    pub hosts: Vec<HostReport>,
    /// This host's kernel, read directly (`--local`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalReport>,
    /// Why the control plane's part is missing (it could not be asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controlplane_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonReport {
    pub reason: String,
    pub source: String,
    /// Unix milliseconds; None: not recorded (stored before ironguard kept times).
    pub since_unix_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    pub node: String,
    pub name: String,
    pub source: String,
    pub state: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostReport {
    pub agent: AgentReport,
    pub served: bool,
    pub rule: String,
    pub why: String,
    /// Membership at the revision the agent applied; None when the change log no longer reaches back to it.
    pub in_allow: Option<bool>,
    pub in_deny: Option<bool>,
    pub unknown_mac_policy: String,
    /// Unix milliseconds at which the agent's kernel lease ends, as of its last report (None: no lease).
    pub lease_until_unix_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocalReport {
    /// The namespace read (`--netns`), None: this process's.
    pub netns: Option<String>,
    pub served: bool,
    pub rule: String,
    pub why: String,
    /// The kernel's view: the agent table's mode (None: absent), the lease, set membership and the pass rule.
    pub mode: Option<String>,
    pub lease_expires_in_ms: Option<u64>,
    pub in_allow: bool,
    pub in_deny: bool,
    pub pass_rule: bool,
    pub guarded: bool,
}

fn policy_name(p: i32) -> String {
    match pb::UnknownMacPolicy::try_from(p) {
        Ok(pb::UnknownMacPolicy::Allow) => "allow".into(),
        Ok(pb::UnknownMacPolicy::Deny) => "deny".into(),
        _ => "unspecified".into(),
    }
}

impl ExplainReport {
    /// From the control plane's answer (and the local kernel's view, if read).
    pub fn new(answer: MacExplanation, local: Option<LocalReport>) -> Self {
        let reasons = |v: Vec<pb::ReasonInfo>| {
            v.into_iter()
                .map(|r| ReasonReport {
                    reason: r.reason,
                    source: r.source,
                    since_unix_ms: Some(r.since_unix_ms).filter(|t| *t != 0),
                })
                .collect()
        };
        let hosts: Vec<HostReport> = answer
            .hosts
            .into_iter()
            .map(|h| {
                let info = h.agent.unwrap_or_default();
                let lease = info.status.as_ref().map(|s| s.lease_until_unix_ms).filter(|t| *t != 0);
                HostReport {
                    agent: AgentReport::from(info),
                    served: h.served,
                    rule: h.rule,
                    why: h.why,
                    in_allow: h.membership_known.then_some(h.in_allow),
                    in_deny: h.membership_known.then_some(h.in_deny),
                    unknown_mac_policy: policy_name(h.unknown_mac_policy),
                    lease_until_unix_ms: lease,
                }
            })
            .collect();
        Self {
            served_anywhere: Some(hosts.iter().any(|h| h.served)),
            mac: answer.mac,
            decision: answer.decision,
            revision: answer.revision,
            unknown_mac_policy: policy_name(answer.unknown_mac_policy),
            changed_revision: answer.changed_revision,
            allow: reasons(answer.allow),
            deny: reasons(answer.deny),
            nodes: answer
                .nodes
                .into_iter()
                .map(|n| NodeReport { node: n.node, name: n.name, source: n.source, state: n.state, detail: n.detail })
                .collect(),
            coordination: answer.coordination,
            leaders: answer
                .leaders
                .into_iter()
                .map(|l| (l.network, Some(l.agent_id).filter(|a| !a.is_empty())))
                .collect(),
            hosts,
            local,
            controlplane_error: None,
        }
    }

    /// Only the local kernel's view: the control plane could not be asked.
    pub fn local_only(mac: MacAddr, local: LocalReport, error: String) -> Self {
        Self {
            mac: mac.to_string(),
            decision: String::new(),
            served_anywhere: None,
            revision: 0,
            unknown_mac_policy: String::new(),
            changed_revision: 0,
            allow: vec![],
            deny: vec![],
            nodes: vec![],
            coordination: String::new(),
            leaders: vec![],
            hosts: vec![],
            local: Some(local),
            controlplane_error: Some(error),
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(e) = &self.controlplane_error {
            let _ = writeln!(out, "MAC {}: the control plane could not be asked: {e}", self.mac);
        } else {
            let _ = writeln!(out, "MAC {}: {}", self.mac, self.decision);
            let moved = match self.changed_revision {
                0 => String::new(),
                r => format!(" (this MAC last moved at revision {r})"),
            };
            let _ = writeln!(
                out,
                "  filter revision {}{moved}; unknown-MAC policy: {}",
                self.revision, self.unknown_mac_policy
            );
            for (side, list) in [("allow", &self.allow), ("deny", &self.deny)] {
                if list.is_empty() {
                    continue;
                }
                let _ = writeln!(out, "  {side} reasons:");
                for r in list {
                    let _ = writeln!(out, "    {:<20} {} — {}", r.reason, since(r.since_unix_ms), r.source);
                }
            }
            if !self.nodes.is_empty() {
                let _ = writeln!(out, "  behind the reasons:");
                for n in &self.nodes {
                    let who = match (n.node.is_empty(), n.name.is_empty()) {
                        (true, _) => String::new(),
                        (false, true) => format!("{} ", n.node),
                        (false, false) => format!("{} ({}) ", n.name, n.node),
                    };
                    let detail = if n.detail.is_empty() { String::new() } else { format!(" — {}", n.detail) };
                    let _ = writeln!(out, "    {who}{}: {}{detail}", n.source, n.state);
                }
            }
            let _ = write!(out, "coordination: {}", self.coordination);
            for (network, leader) in &self.leaders {
                let _ = write!(
                    out,
                    "; network {network}: {}",
                    leader.as_deref().unwrap_or("NO LEADER (every host closed)")
                );
            }
            out.push('\n');
            if self.hosts.is_empty() {
                let _ =
                    writeln!(out, "no agent has reported: no PXE host serves this MAC (each host's guard drops DHCP)");
            } else {
                let mut t = Table::new(&["HOST", "AGENT", "MODE", "APPLIED", "DHCP", "RULE", "WHY"]);
                for h in &self.hosts {
                    let a = &h.agent;
                    let mut why = h.why.clone();
                    if let Some(until) = h.lease_until_unix_ms {
                        let reported = now_ms().saturating_sub(a.last_seen_ms);
                        let left = until.saturating_sub(reported);
                        let _ = write!(
                            why,
                            "; kernel lease {}.{} s left at its last report ({})",
                            left / 1000,
                            left % 1000 / 100,
                            in_or_ago(reported)
                        );
                    }
                    t.row(vec![
                        if a.host.is_empty() { "-".into() } else { a.host.clone() },
                        if a.elected { format!("{} *", a.agent_id) } else { a.agent_id.clone() },
                        if a.stale { "STALE".into() } else { a.mode.to_string().to_uppercase() },
                        a.applied_revision.to_string(),
                        if h.served { "YES".into() } else { "no".into() },
                        h.rule.clone(),
                        why,
                    ]);
                }
                out.push_str(&t.render());
            }
        }
        if let Some(l) = &self.local {
            let ns = l.netns.as_deref().map(|n| format!(" (netns {n})")).unwrap_or_default();
            let _ = writeln!(
                out,
                "this host's kernel{ns}: {} — {} — {}",
                if l.served { "SERVED" } else { "not served" },
                l.rule,
                l.why
            );
            if let Some(disagree) = self.disagreement() {
                let _ = writeln!(out, "WARNING: {disagree}");
            }
        }
        out
    }

    /// The kernel read with `--local` says otherwise than every report from the hosts would suggest for it. Only
    /// judged when exactly one agent reported (the local one is then known); otherwise None.
    fn disagreement(&self) -> Option<String> {
        let l = self.local.as_ref()?;
        let [h] = self.hosts.as_slice() else { return None };
        (h.served != l.served).then(|| {
            format!(
                "the kernel ({}) disagrees with the agent's last report ({}): the agent repairs drift on its next check; \
                 if this persists, see `ironguardctl chains` and the agent's log",
                if l.served { "served" } else { "not served" },
                if h.served { "served" } else { "not served" }
            )
        })
    }
}

/// "since 3 min ago" or "since: not recorded".
fn since(at: Option<u64>) -> String {
    match at {
        Some(t) => format!("since {}", in_or_ago(t)),
        None => "since: not recorded".into(),
    }
}

/// "12 s ago", "in 2.1 s".
fn in_or_ago(at_ms: u64) -> String {
    let now = now_ms();
    if at_ms > now {
        let ms = at_ms - now;
        return format!("in {}.{} s", ms / 1000, ms % 1000 / 100);
    }
    let s = (now - at_ms) / 1000;
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        7200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// Reads this host's kernel (or `netns`'s, from a thread of its own, so the rest of the process — the gRPC
/// connection — stays where it is) and judges `mac` there.
pub fn local(netns: Option<String>, mac: MacAddr) -> anyhow::Result<LocalReport> {
    let ns = netns.clone();
    let observed = std::thread::spawn(move || -> anyhow::Result<ironguard_dataplane::Observed> {
        if let Some(n) = &ns {
            crate::netns::enter(n)?;
        }
        Ok(ironguard_dataplane::observe(true)?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("reading the kernel's tables failed (the reading thread panicked)"))??;
    let i = observed.mac_inputs(mac);
    let MacDecision { served, rule, why } = ironguard_dataplane::decide(i);
    Ok(LocalReport {
        netns,
        served,
        rule,
        why,
        mode: i.mode.map(|m| Mode::from(nft_mode_pb(m) as i32).to_string()),
        lease_expires_in_ms: observed.owned.as_ref().and_then(|t| t.lease_expires_in_ms()),
        in_allow: i.in_allow,
        in_deny: i.in_deny,
        pass_rule: i.policy == UnknownMacPolicy::Allow,
        guarded: i.guarded,
    })
}

fn nft_mode_pb(m: NftMode) -> pb::Mode {
    match m {
        NftMode::Blocked => pb::Mode::Blocked,
        NftMode::Follower => pb::Mode::Follower,
        NftMode::Leader => pb::Mode::Leader,
    }
}

#[cfg(test)]
mod tests {
    use ironguard_proto::v1::{AgentInfo, AgentStatus, HostVerdict, NetworkLeader, NodeState, ReasonInfo};

    use super::*;

    fn answer() -> MacExplanation {
        let agent = |id: &str, host: &str, mode: pb::Mode, elected: bool| AgentInfo {
            status: Some(AgentStatus {
                agent_id: id.into(),
                host: host.into(),
                network: "prov".into(),
                applied_revision: 41,
                mode: mode as i32,
                lease_until_unix_ms: if elected { now_ms() + 2500 } else { 0 },
                ..Default::default()
            }),
            elected,
            ..Default::default()
        };
        MacExplanation {
            mac: "52:54:00:12:34:56".into(),
            revision: 42,
            unknown_mac_policy: pb::UnknownMacPolicy::Deny as i32,
            allow: vec![ReasonInfo {
                reason: "inspection:node-1".into(),
                source: "ironguard's inspection of node node-1".into(),
                since_unix_ms: now_ms() - 180_000,
            }],
            deny: vec![ReasonInfo { reason: "ironic".into(), source: "Ironic sync".into(), since_unix_ms: 0 }],
            changed_revision: 40,
            hosts: vec![
                HostVerdict {
                    agent: Some(agent("a", "pxe-a", pb::Mode::Leader, true)),
                    served: true,
                    rule: "ironguard:allow-mac (inet ironguard whitelist)".into(),
                    why: "allowed: in the allow set of the leader".into(),
                    in_allow: true,
                    in_deny: true,
                    membership_known: true,
                    unknown_mac_policy: pb::UnknownMacPolicy::Deny as i32,
                },
                HostVerdict {
                    agent: Some(agent("b", "pxe-b", pb::Mode::Follower, false)),
                    served: false,
                    rule: "ironguard:deny-mac (inet ironguard blacklist)".into(),
                    why: "denied: in the deny set".into(),
                    in_allow: false,
                    in_deny: false,
                    membership_known: false,
                    unknown_mac_policy: pb::UnknownMacPolicy::Deny as i32,
                },
            ],
            leaders: vec![NetworkLeader { network: "prov".into(), agent_id: "a".into() }],
            coordination: "etcd".into(),
            nodes: vec![NodeState {
                node: "uuid-1".into(),
                name: "node-1".into(),
                source: "ironic".into(),
                state: "inspect wait".into(),
                detail: "inspect interface agent".into(),
            }],
            decision: "allowed (inspection:node-1) — also denied (ironic), but allow comes first".into(),
        }
    }

    #[test]
    fn the_text_answers_per_host_with_the_rule_reasons_and_ironic_state() {
        let r = ExplainReport::new(answer(), None);
        assert_eq!(r.served_anywhere, Some(true));
        let text = r.render();
        assert!(text.starts_with("MAC 52:54:00:12:34:56: allowed (inspection:node-1)"), "{text}");
        assert!(text.contains("this MAC last moved at revision 40"), "{text}");
        assert!(text.contains("inspection:node-1") && text.contains("since 3 min ago"), "{text}");
        assert!(text.contains("since: not recorded"), "{text}");
        assert!(text.contains("node-1 (uuid-1) ironic: inspect wait — inspect interface agent"), "{text}");
        assert!(text.contains("network prov: a"), "{text}");
        let a = text.lines().find(|l| l.starts_with("pxe-a")).unwrap();
        assert!(a.contains("a *") && a.contains("LEADER") && a.contains("YES") && a.contains("allow-mac"), "{a}");
        assert!(a.contains("kernel lease 2."), "{a}");
        let b = text.lines().find(|l| l.starts_with("pxe-b")).unwrap();
        assert!(b.contains("FOLLOWER") && b.contains(" no ") && !b.contains("lease"), "{b}");
    }

    #[test]
    fn json_keeps_unknown_membership_and_times_apart_from_false_and_zero() {
        let r = ExplainReport::new(answer(), None);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["hosts"][0]["in_allow"], true);
        assert_eq!(v["hosts"][1]["in_allow"], serde_json::Value::Null, "not known is not false");
        assert_eq!(v["deny"][0]["since_unix_ms"], serde_json::Value::Null, "not recorded is not 1970");
        assert_eq!(v["hosts"][0]["agent"]["mode"], "leader");
        assert!(v.get("local").is_none());
    }

    #[test]
    fn a_kernel_that_disagrees_with_the_only_report_is_flagged() {
        let mut a = answer();
        a.hosts.truncate(1);
        let local = LocalReport {
            netns: Some("pxe".into()),
            served: false,
            rule: "ironguard-guard:drop-unmarked (inet ironguard_guard)".into(),
            why: "the agent's table is absent".into(),
            mode: None,
            lease_expires_in_ms: None,
            in_allow: false,
            in_deny: false,
            pass_rule: false,
            guarded: true,
        };
        let text = ExplainReport::new(a, Some(local.clone())).render();
        assert!(text.contains("this host's kernel (netns pxe): not served"), "{text}");
        assert!(text.contains("WARNING: the kernel (not served) disagrees"), "{text}");
        let only = ExplainReport::local_only("52:54:00:12:34:56".parse().unwrap(), local, "unreachable".into());
        assert!(only.render().starts_with("MAC 52:54:00:12:34:56: the control plane could not be asked: unreachable"));
    }
}
