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
    /// The last inspection callbacks that named this MAC, as the answering replica received them, newest first.
    pub callbacks: Vec<CallbackReport>,
    /// Where the boot stops, from what the hosts' kernels saw and the callbacks (None: no control plane answer).
    pub diagnosis: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallbackReport {
    pub at_unix_ms: u64,
    pub accepted: bool,
    pub node: String,
    pub detail: String,
}

/// How many of one kind of DHCP packet a host's kernel saw for the MAC, and when the last was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CountReport {
    pub count: u64,
    /// Unix milliseconds (agent's clock); None: none seen.
    pub last_unix_ms: Option<u64>,
}

/// The MAC's DHCP as one host's kernel saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SeenReport {
    /// Requests that reached the filter.
    pub requests: CountReport,
    /// Requests the filter let through to the local server.
    pub passed: CountReport,
    /// Replies the local server sent to it.
    pub answers: CountReport,
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
    /// What this host's kernel saw of the MAC (None: nothing seen, or not observed: see `seen_note`).
    pub seen: Option<SeenReport>,
    /// The host's backend observes DHCP and its agent could read it.
    pub seen_observed: bool,
    /// Its kernel's observation is full (a flood?): a MAC not seen there may have been missed.
    pub seen_full: bool,
    pub seen_note: String,
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
                    seen: h.seen.map(|d| SeenReport {
                        requests: count(d.requests),
                        passed: count(d.passed),
                        answers: count(d.answers),
                    }),
                    seen_observed: h.seen_observed,
                    seen_full: h.seen_full,
                    seen_note: h.seen_note,
                }
            })
            .collect();
        let callbacks: Vec<CallbackReport> = answer
            .callbacks
            .into_iter()
            .map(|c| CallbackReport { at_unix_ms: c.at_unix_ms, accepted: c.accepted, node: c.node, detail: c.detail })
            .collect();
        let nodes: Vec<NodeReport> = answer
            .nodes
            .into_iter()
            .map(|n| NodeReport { node: n.node, name: n.name, source: n.source, state: n.state, detail: n.detail })
            .collect();
        let diagnosis = Some(diagnose(&hosts, &callbacks, &nodes));
        Self {
            served_anywhere: Some(hosts.iter().any(|h| h.served)),
            mac: answer.mac,
            decision: answer.decision,
            revision: answer.revision,
            unknown_mac_policy: policy_name(answer.unknown_mac_policy),
            changed_revision: answer.changed_revision,
            allow: reasons(answer.allow),
            deny: reasons(answer.deny),
            nodes,
            coordination: answer.coordination,
            leaders: answer
                .leaders
                .into_iter()
                .map(|l| (l.network, Some(l.agent_id).filter(|a| !a.is_empty())))
                .collect(),
            hosts,
            local,
            controlplane_error: None,
            callbacks,
            diagnosis,
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
            callbacks: vec![],
            diagnosis: None,
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

impl ExplainReport {
    /// The boot as each host's kernel saw it, the callbacks, and where the boot stops.
    pub fn render_timeline(&self) -> String {
        let mut out = String::new();
        if self.controlplane_error.is_some() {
            let _ =
                writeln!(out, "boot timeline: not available without the control plane (it holds the hosts' reports)");
            return out;
        }
        let _ = writeln!(out, "boot timeline (what each host's kernel saw, as of its agent's last report):");
        if self.hosts.is_empty() {
            let _ = writeln!(out, "  no agent has reported");
        }
        for h in &self.hosts {
            let a = &h.agent;
            let who = format!(
                "{} (agent {}, {})",
                if a.host.is_empty() { "-" } else { &a.host },
                a.agent_id,
                if a.stale { "STALE".to_string() } else { a.mode.to_string().to_uppercase() }
            );
            let line = match (&h.seen, h.seen_observed) {
                (Some(s), _) => format!(
                    "{} reached the filter; {} let through; {} from the local server",
                    counted(s.requests, "DHCP request", "DHCP requests"),
                    counted_bare(s.passed),
                    counted(s.answers, "answer", "answers")
                ),
                (None, true) => format!("nothing seen: {}", h.seen_note),
                (None, false) => format!("not observed: {}", h.seen_note),
            };
            let _ = writeln!(out, "  {who}: {line}");
        }
        if self.callbacks.is_empty() {
            let _ = writeln!(out, "inspection callbacks naming this MAC (this control plane replica): none");
        } else {
            let _ = writeln!(out, "inspection callbacks naming this MAC (this control plane replica), newest first:");
            for c in &self.callbacks {
                let what =
                    if c.accepted { format!("accepted for node {}", c.node) } else { format!("REFUSED: {}", c.detail) };
                let _ = writeln!(out, "  {}: {what}", in_or_ago(c.at_unix_ms));
            }
        }
        if let Some(d) = &self.diagnosis {
            let _ = writeln!(out, "diagnosis: {d}");
        }
        out
    }
}

fn count(c: Option<pb::SeenCount>) -> CountReport {
    let c = c.unwrap_or_default();
    CountReport { count: c.count, last_unix_ms: Some(c.last_unix_ms).filter(|t| *t != 0) }
}

/// "3 DHCP requests (last 12 s ago)", "no answer".
fn counted(c: CountReport, one: &str, many: &str) -> String {
    match (c.count, c.last_unix_ms) {
        (0, _) => format!("no {one}"),
        (1, Some(t)) => format!("1 {one} ({})", in_or_ago(t)),
        (n, Some(t)) => format!("{n} {many} (last {})", in_or_ago(t)),
        (1, None) => format!("1 {one}"),
        (n, None) => format!("{n} {many}"),
    }
}

/// "3 (last 12 s ago)", "none".
fn counted_bare(c: CountReport) -> String {
    match (c.count, c.last_unix_ms) {
        (0, _) => "none".into(),
        (n, Some(t)) => format!("{n} (last {})", in_or_ago(t)),
        (n, None) => n.to_string(),
    }
}

/// Packets this close to the last request count as its answer (a DISCOVER and its retries, the REQUEST).
const SAME_EXCHANGE_MS: u64 = 5000;

/// Where the boot stops, in words: no request reached a host, requests were dropped, the server did not answer,
/// no callback came, or the callback was refused.
pub fn diagnose(hosts: &[HostReport], callbacks: &[CallbackReport], nodes: &[NodeReport]) -> String {
    let observed: Vec<&HostReport> = hosts.iter().filter(|h| h.seen_observed).collect();
    if observed.is_empty() {
        return if hosts.is_empty() {
            "cannot tell: no agent has reported".into()
        } else {
            "cannot tell: no host observes DHCP (the ipset and hostsdir backends do not; nftables does)".into()
        };
    }
    let last = |f: fn(&SeenReport) -> CountReport| -> Option<(u64, String)> {
        observed.iter().filter_map(|h| h.seen.as_ref().and_then(|s| f(s).last_unix_ms).map(|t| (t, label(h)))).max()
    };
    let Some((request, _)) = &last(|s| s.requests) else {
        if observed.iter().any(|h| h.seen_full) {
            return "no DHCP request from this MAC was recorded, but some hosts' observation is full (a flood of \
                    made-up addresses?): it may have been missed there; run `ironguardctl explain --local` on the \
                    host, and look for the flood's source"
                .into();
        }
        return "no DHCP request from this MAC reached any PXE host: is the node powered on, set to boot from the \
         network on this NIC, and on this network (VLAN, switch port)?"
            .into();
    };
    let passed = last(|s| s.passed).filter(|(t, _)| t + SAME_EXCHANGE_MS >= *request);
    let Some((passed_at, host)) = passed else {
        let hosts: Vec<String> =
            observed.iter().filter(|h| h.seen.is_some_and(|s| s.requests.count > 0)).map(|h| label(h)).collect();
        let why = hosts_why(observed.as_slice());
        return format!(
            "its latest DHCP requests ({}) reached {} but no host let them through: {why}",
            in_or_ago(*request),
            hosts.join(", ")
        );
    };
    let answered = last(|s| s.answers).filter(|(t, _)| t + SAME_EXCHANGE_MS >= passed_at);
    let Some((answer_at, server)) = answered else {
        return format!(
            "let through on {host} ({}) but the local DHCP server there did not answer: check its log, its ranges \
             (an exhausted or missing range) and that it listens on that interface",
            in_or_ago(passed_at)
        );
    };
    let ironic_waits = nodes.iter().find(|n| n.source == "ironic" && n.state == "inspect wait");
    match callbacks.iter().find(|c| c.at_unix_ms + SAME_EXCHANGE_MS >= answer_at) {
        Some(c) if c.accepted => format!(
            "booted: {server} answered ({}), and the ramdisk's callback was accepted for node {} ({})",
            in_or_ago(answer_at),
            c.node,
            in_or_ago(c.at_unix_ms)
        ),
        Some(c) => format!(
            "{server} answered ({}), but the ramdisk's callback was REFUSED ({}): {}",
            in_or_ago(answer_at),
            in_or_ago(c.at_unix_ms),
            c.detail
        ),
        None => {
            let ironic = match ironic_waits {
                Some(n) => format!(
                    "; Ironic still waits for it (node {} in inspect wait): the callback goes to Ironic",
                    if n.name.is_empty() { &n.node } else { &n.name }
                ),
                None => String::new(),
            };
            format!(
                "offered: {server} answered ({}), but no inspection callback naming this MAC came after it to this \
                 replica: the ramdisk did not boot (TFTP/HTTP, kernel arguments), cannot reach the callback URL, or \
                 posted to another replica{ironic}",
                in_or_ago(answer_at)
            )
        }
    }
}

/// A host in words: its name and its agent (hosts may share a name; agents do not).
fn label(h: &HostReport) -> String {
    match h.agent.host.as_str() {
        "" => format!("agent {}", h.agent.agent_id),
        host => format!("{host} (agent {})", h.agent.agent_id),
    }
}

/// Why the hosts did not serve, from their verdicts (the leader's first).
fn hosts_why(observed: &[&HostReport]) -> String {
    if !observed.iter().any(|h| h.agent.elected && !h.agent.stale) {
        return "no host leads (every host is closed): see `ironguardctl agents`".into();
    }
    observed
        .iter()
        .find(|h| h.agent.elected)
        .map(|h| format!("on the leader {}: {}", label(h), h.why))
        .unwrap_or_default()
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
                    ..Default::default()
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
                    ..Default::default()
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
            callbacks: vec![],
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

    fn seen(requests: (u64, u64), passed: (u64, u64), answers: (u64, u64)) -> Option<pb::DhcpSeen> {
        let c = |(count, ago): (u64, u64)| {
            Some(pb::SeenCount { count, last_unix_ms: if count == 0 { 0 } else { now_ms() - ago } })
        };
        Some(pb::DhcpSeen {
            mac: "52:54:00:12:34:56".into(),
            requests: c(requests),
            passed: c(passed),
            answers: c(answers),
        })
    }

    /// The answer with what each host's kernel saw (leader a, follower b) and the callbacks.
    fn observed(a: Option<pb::DhcpSeen>, b: Option<pb::DhcpSeen>, callbacks: Vec<pb::CallbackSeen>) -> ExplainReport {
        let mut x = answer();
        for (h, s) in x.hosts.iter_mut().zip([a, b]) {
            h.seen_observed = true;
            h.seen_note = if s.is_none() {
                "no DHCP request from this MAC reached this host in the last hour".into()
            } else {
                String::new()
            };
            h.seen = s;
        }
        x.callbacks = callbacks;
        ExplainReport::new(x, None)
    }

    #[test]
    fn the_timeline_names_where_a_boot_stops() {
        // nothing reached any host
        let r = observed(None, None, vec![]);
        assert!(r.diagnosis.as_deref().unwrap().starts_with("no DHCP request from this MAC reached any PXE host"));
        // ... unless a host's observation is full: then it may have been missed
        let mut x = answer();
        for h in &mut x.hosts {
            h.seen_observed = true;
        }
        x.hosts[1].seen_full = true;
        let d = ExplainReport::new(x, None).diagnosis.unwrap();
        assert!(d.contains("may have been missed"), "{d}");
        // requests reached both, dropped everywhere: the leader's reason is given
        let r = observed(seen((3, 2000), (0, 0), (0, 0)), seen((3, 2000), (0, 0), (0, 0)), vec![]);
        let d = r.diagnosis.clone().unwrap();
        assert!(d.contains("reached pxe-a (agent a), pxe-b (agent b) but no host let them through"), "{d}");
        assert!(d.contains("on the leader pxe-a (agent a): allowed: in the allow set"), "{d}");
        // let through an hour ago, dropped now: the latest requests count
        let r = observed(seen((9, 1000), (4, 3_600_000), (4, 3_600_000)), None, vec![]);
        assert!(r.diagnosis.unwrap().contains("no host let them through"));
        // let through, no answer
        let r = observed(seen((3, 1000), (3, 1000), (0, 0)), seen((3, 1000), (0, 0), (0, 0)), vec![]);
        let d = r.diagnosis.unwrap();
        assert!(d.starts_with("let through on pxe-a (agent a)") && d.contains("did not answer"), "{d}");
        // answered, no callback; Ironic's node waits (the answer() has one in inspect wait)
        let r = observed(seen((4, 9000), (4, 9000), (2, 8900)), seen((4, 9000), (0, 0), (0, 0)), vec![]);
        let d = r.diagnosis.clone().unwrap();
        assert!(d.starts_with("offered: pxe-a (agent a) answered") && d.contains("no inspection callback"), "{d}");
        assert!(d.contains("Ironic still waits for it (node node-1 in inspect wait)"), "{d}");
        // answered, the callback refused (an older accepted one does not count)
        let cb = |ago: u64, accepted: bool| pb::CallbackSeen {
            at_unix_ms: now_ms() - ago,
            accepted,
            node: if accepted { "uuid-1".into() } else { String::new() },
            detail: if accepted { String::new() } else { "Could not find a node for attributes".into() },
        };
        let r = observed(seen((4, 9000), (4, 9000), (2, 8900)), None, vec![cb(3000, false), cb(600_000, true)]);
        let d = r.diagnosis.clone().unwrap();
        assert!(d.contains("callback was REFUSED") && d.contains("Could not find a node"), "{d}");
        // and accepted
        let r = observed(seen((4, 9000), (4, 9000), (2, 8900)), None, vec![cb(3000, true)]);
        assert!(r.diagnosis.clone().unwrap().starts_with("booted: pxe-a (agent a) answered"));
        let text = r.render_timeline();
        assert!(text.contains("pxe-a (agent a, LEADER): 4 DHCP requests (last 9 s ago) reached the filter; 4 (last 9 s ago) let through; 2 answers (last 8 s ago) from the local server"), "{text}");
        assert!(text.contains("pxe-b (agent b, FOLLOWER): nothing seen: no DHCP request"), "{text}");
        assert!(text.contains("3 s ago: accepted for node uuid-1"), "{text}");
        assert!(text.contains("diagnosis: booted"), "{text}");
    }

    #[test]
    fn a_host_that_does_not_observe_says_so_and_no_observation_is_no_diagnosis() {
        let mut x = answer();
        for h in &mut x.hosts {
            h.seen_note = "this host's backend does not observe DHCP (only nftables does)".into();
        }
        let r = ExplainReport::new(x, None);
        assert!(r.diagnosis.as_deref().unwrap().starts_with("cannot tell: no host observes DHCP"));
        assert!(r.render_timeline().contains("pxe-a (agent a, LEADER): not observed: this host's backend does not"));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["hosts"][0]["seen"], serde_json::Value::Null);
        assert_eq!(v["hosts"][0]["seen_observed"], false);
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
