//! `ExplainMac`: the operator's first question — does this MAC get DHCP, on which PXE host, and why.
//!
//! Everything comes from what the control plane holds or can ask: the MAC's reasons with when each was added and
//! the revision that last moved it ([`crate::filter::Entry`]); each agent's last report (mode, lease, applied
//! revision), with the MAC's membership *at the revision that agent applied*, rebuilt from the change log; and the
//! state behind each reason — ironguard's inspection record, or the Ironic node that owns the port, asked now.
//! The verdict per host is [`ironguard_dataplane::decide`], the same function `ironguardctl explain --local` applies to
//! what the kernel itself holds.

use std::time::Duration;

use ironguard_dataplane::{MacAddr, MacInputs, Mode, UnknownMacPolicy};
use ironguard_proto::time::now_ms;
use ironguard_proto::v1::{self as pb, AgentInfo, HostVerdict, MacExplanation, NodeState, ReasonInfo};

use crate::agents::AgentRegistry;
use crate::filter::{Entry, Reasons, RevisionDelta};
use crate::inspection::engine::Engine;
use crate::inspection::periodic::{IRONIC, IRONIC_INSPECTION};
use crate::service::policy_to_pb;
use crate::store::FilterStore;

/// How long the explanation waits for Ironic before saying it could not be asked.
const IRONIC_TIMEOUT: Duration = Duration::from_secs(5);

/// Prefix of the reason an ironguard inspection of a node gives its MACs.
const INSPECTION_PREFIX: &str = "inspection:";

/// Who sets a reason, in words.
pub fn reason_source(reason: &str) -> String {
    match reason {
        crate::filter::API => "an operator or integration (UpdatePxeFilters / ironguardctl filters)".into(),
        IRONIC => "Ironic sync: a port of a node known to Ironic (denied unless being inspected)".into(),
        IRONIC_INSPECTION => "Ironic's own inspection: the node is in inspect wait/inspecting".into(),
        r => match r.strip_prefix(INSPECTION_PREFIX) {
            Some(node) => format!("ironguard's inspection of node {node}"),
            None => format!("an operator or integration (UpdatePxeFilters, reason {r:?})"),
        },
    }
}

fn reasons(r: &Reasons) -> Vec<ReasonInfo> {
    r.with_since()
        .map(|(reason, since)| ReasonInfo {
            reason: reason.to_string(),
            source: reason_source(reason),
            since_unix_ms: since,
        })
        .collect()
}

/// Membership (allow, deny) and policy at revision `at`, rebuilt from the current ones by undoing the revisions
/// after it; `None` when the log no longer reaches back to `at` (or the agent has applied nothing).
pub fn state_at(
    current: (bool, bool, UnknownMacPolicy),
    after: Option<&[RevisionDelta]>,
    mac: MacAddr,
    at: u64,
) -> Option<(bool, bool, UnknownMacPolicy)> {
    if at == 0 {
        return None;
    }
    let (mut allow, mut deny, mut policy) = current;
    for d in after?.iter().rev() {
        if d.delta.allow_add.contains(&mac) {
            allow = false;
        }
        if d.delta.allow_remove.contains(&mac) {
            allow = true;
        }
        if d.delta.deny_add.contains(&mac) {
            deny = false;
        }
        if d.delta.deny_remove.contains(&mac) {
            deny = true;
        }
        // A record names the policy only when it changes, and there are two: before it, it was the other one.
        if let Some(p) = d.policy {
            policy = match p {
                UnknownMacPolicy::Allow => UnknownMacPolicy::Deny,
                UnknownMacPolicy::Deny => UnknownMacPolicy::Allow,
            };
        }
    }
    Some((allow, deny, policy))
}

fn mode_of(m: i32) -> Option<Mode> {
    match pb::Mode::try_from(m).ok()? {
        pb::Mode::Blocked => Some(Mode::Blocked),
        pb::Mode::Follower => Some(Mode::Follower),
        pb::Mode::Leader => Some(Mode::Leader),
        pb::Mode::Unspecified => None,
    }
}

/// One host's verdict from its agent's last report.
fn host_verdict(
    store: &dyn FilterStore,
    info: AgentInfo,
    current: (bool, bool, UnknownMacPolicy),
    mac: MacAddr,
) -> HostVerdict {
    let status = info.status.clone().unwrap_or_default();
    let after = store.deltas_since(status.applied_revision);
    let at = state_at(current, after.as_deref(), mac, status.applied_revision);
    let (in_allow, in_deny, policy) = at.unwrap_or((false, false, UnknownMacPolicy::Deny));
    let (seen, seen_note) = seen_of(&status, mac);
    let mut v = HostVerdict {
        agent: Some(info.clone()),
        in_allow,
        in_deny,
        membership_known: at.is_some(),
        unknown_mac_policy: policy_to_pb(policy) as i32,
        seen_observed: status.dhcp_seen_observed,
        seen_full: status.dhcp_seen_full,
        seen,
        seen_note,
        ..Default::default()
    };
    if info.stale {
        v.rule = format!(
            "{} (inet {})",
            ironguard_dataplane::ruleset::comments::GUARD_DROP,
            ironguard_dataplane::GUARD_TABLE
        );
        v.why = format!(
            "no report for {} s: the agent is probably gone, and its host's guard drops all DHCP",
            info.last_seen_ms / 1000
        );
        return v;
    }
    let mode = mode_of(status.mode);
    if mode == Some(Mode::Leader) && at.is_none() {
        v.rule = "unknown".into();
        v.why = format!(
            "the agent leads at revision {}, which the change log no longer reaches: its sets there are not known \
             here (run `ironguardctl explain --local` on the host)",
            status.applied_revision
        );
        return v;
    }
    let d = ironguard_dataplane::decide(MacInputs {
        // The guard is the agent's to repair; a missing one shows in the agent's mode reason and metrics, and in
        // `--local`. A report cannot vouch for the kernel between two reads.
        guarded: true,
        mode,
        // Live when the agent last reported (it moves its lease on every keep-alive, and reports at least every
        // report interval; a leader that stops doing both goes stale, above).
        lease_live: status.lease_until_unix_ms > now_ms().saturating_sub(info.last_seen_ms),
        in_allow,
        in_deny,
        policy,
    });
    v.served = d.served;
    v.rule = d.rule;
    v.why = match mode {
        Some(Mode::Blocked) if !status.mode_reason.is_empty() => {
            format!("{} (agent: {})", d.why, status.mode_reason)
        }
        _ => d.why,
    };
    v
}

/// This MAC's entry in what the host's kernel saw (as of the agent's last report), or why there is none.
fn seen_of(status: &pb::AgentStatus, mac: MacAddr) -> (Option<pb::DhcpSeen>, String) {
    if !status.dhcp_seen_observed {
        let why = if status.dhcp_seen_error.is_empty() {
            "the agent reports no observation of DHCP (an agent older than this control plane)".to_string()
        } else {
            status.dhcp_seen_error.clone()
        };
        return (None, why);
    }
    match status.dhcp_seen.iter().find(|d| d.mac.parse::<MacAddr>() == Ok(mac)) {
        Some(d) => (Some(d.clone()), String::new()),
        // The agent reports at most 128 MACs (served first, then the newest); its kernel keeps an hour.
        None if status.dhcp_seen_full => (
            None,
            "not seen, but this host's kernel recorded as many MACs in the last hour as it holds (4096: a flood of \
             made-up addresses?): this MAC's requests may have been missed"
                .to_string(),
        ),
        None if status.dhcp_seen.len() >= 128 => (
            None,
            "not among the 128 MACs this host reported (served ones first, then the newest): many MACs sent DHCP \
             here lately"
                .to_string(),
        ),
        None => (None, "no DHCP request from this MAC reached this host in the last hour".to_string()),
    }
}

/// What the filter decides for a MAC before any host's state.
fn decision(entry: &Entry, policy: UnknownMacPolicy) -> String {
    let list = |r: &Reasons| r.iter().collect::<Vec<_>>().join(", ");
    match (entry.allow.is_empty(), entry.deny.is_empty()) {
        (false, true) => format!("allowed ({})", list(&entry.allow)),
        (false, false) => {
            format!("allowed ({}) — also denied ({}), but allow comes first", list(&entry.allow), list(&entry.deny))
        }
        (true, false) => format!("denied ({})", list(&entry.deny)),
        (true, true) => format!("unknown MAC: the unknown-MAC policy ({policy}) decides"),
    }
}

/// The states behind the reasons: ironguard's inspection records, and the Ironic node owning the port.
async fn nodes(engine: &Engine, entry: &Entry, mac: MacAddr) -> Vec<NodeState> {
    let mut out = Vec::new();
    for reason in entry.allow.iter().chain(entry.deny.iter()) {
        let Some(node) = reason.strip_prefix(INSPECTION_PREFIX) else { continue };
        let mut s = NodeState { node: node.to_string(), source: "ironguard inspection".into(), ..Default::default() };
        match engine.store.get(node).await {
            Ok(Some(rec)) => {
                s.state = rec.state.to_string();
                let mut detail = Vec::new();
                if let Some(t) = rec.started_at {
                    detail.push(format!("started {}", ago(t)));
                }
                if let Some(t) = rec.finished_at {
                    detail.push(format!("finished {}", ago(t)));
                }
                if let Some(e) = &rec.error {
                    detail.push(format!("error: {e}"));
                }
                s.detail = detail.join("; ");
            }
            Ok(None) => {
                s.state = "none".into();
                s.detail = format!(
                    "no inspection record: the reason outlived its inspection (drop it with `ironguardctl filters \
                     remove {mac} --reason {reason}`)"
                );
            }
            Err(e) => {
                s.state = "unknown".into();
                s.detail = format!("cannot read the inspection record: {e}");
            }
        }
        out.push(s);
    }
    let Some(ironic) = &engine.ironic else {
        if entry.deny.contains(IRONIC) || entry.allow.contains(IRONIC_INSPECTION) {
            out.push(NodeState {
                source: "ironic".into(),
                state: "unknown".into(),
                detail: "no [ironic] url is configured on this replica".into(),
                ..Default::default()
            });
        }
        return out;
    };
    let ask = async {
        let ports = ironic.ports_by_address(&mac.to_string()).await?;
        let mut found = Vec::new();
        for p in ports {
            found.push((p.node_uuid.clone(), ironic.get_node(&p.node_uuid).await?));
        }
        Ok::<_, ironguard_ironic::IronicError>(found)
    };
    match tokio::time::timeout(IRONIC_TIMEOUT, ask).await {
        Ok(Ok(found)) if found.is_empty() => out.push(NodeState {
            source: "ironic".into(),
            state: "no port".into(),
            detail: "Ironic has no port with this address".into(),
            ..Default::default()
        }),
        Ok(Ok(found)) => {
            for (uuid, n) in found {
                let mut detail = Vec::new();
                if let Some(i) = &n.inspect_interface {
                    detail.push(format!("inspect interface {i}"));
                }
                if n.maintenance == Some(true) {
                    detail.push("in maintenance".into());
                }
                if let Some(p) = &n.power_state {
                    detail.push(format!("power {p}"));
                }
                out.push(NodeState {
                    node: uuid,
                    name: n.name.clone().unwrap_or_default(),
                    source: "ironic".into(),
                    state: n.provision_state.clone().unwrap_or_default(),
                    detail: detail.join(", "),
                });
            }
        }
        Ok(Err(e)) => out.push(NodeState {
            source: "ironic".into(),
            state: "unknown".into(),
            detail: format!("Ironic could not be asked: {e}"),
            ..Default::default()
        }),
        Err(_) => out.push(NodeState {
            source: "ironic".into(),
            state: "unknown".into(),
            detail: format!("Ironic did not answer within {} s", IRONIC_TIMEOUT.as_secs()),
            ..Default::default()
        }),
    }
    out
}

/// "42 s ago", from Unix milliseconds.
fn ago(at_ms: u64) -> String {
    let s = now_ms().saturating_sub(at_ms) / 1000;
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

/// The whole explanation.
pub async fn explain(store: &dyn FilterStore, agents: &AgentRegistry, engine: &Engine, mac: MacAddr) -> MacExplanation {
    let (revision, entries) = store.entries(&[mac]);
    let entry = entries.into_iter().next().map(|(_, e)| e).unwrap_or_default();
    let policy = store.counts().policy;
    let current = (!entry.allow.is_empty(), !entry.deny.is_empty(), policy);
    let (infos, leaders, _) = agents.list(revision).await;
    let hosts = infos.into_iter().map(|i| host_verdict(store, i, current, mac)).collect();
    let mut deny = reasons(&entry.deny);
    let mut decision = decision(&entry, policy);
    if entry.deny.contains(crate::inspection::periodic::IRONIC) {
        let held = crate::inspection::periodic::HeldDrop::read(engine.coord.as_ref()).await;
        if let Some(note) = held.and_then(|h| h.note(mac)) {
            for r in deny.iter_mut().filter(|r| r.reason == crate::inspection::periodic::IRONIC) {
                r.source = format!("{}; {note}", r.source);
            }
            decision.push_str(" — Ironic no longer lists this port: its deny is held (a mass drop)");
        }
    }
    MacExplanation {
        mac: mac.to_string(),
        revision,
        unknown_mac_policy: policy_to_pb(policy) as i32,
        allow: reasons(&entry.allow),
        deny,
        changed_revision: entry.changed_revision,
        hosts,
        leaders,
        coordination: agents.coordination().to_string(),
        nodes: nodes(engine, &entry, mac).await,
        decision,
        callbacks: engine.callbacks.of(mac),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironguard_dataplane::Delta;

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, 0, n]).unwrap()
    }

    #[test]
    fn membership_at_an_older_revision_undoes_the_later_ones() {
        let m = mac(1);
        let log = [
            RevisionDelta { revision: 5, delta: Delta { allow_add: vec![m], ..Default::default() }, policy: None },
            RevisionDelta { revision: 6, delta: Delta::default(), policy: Some(UnknownMacPolicy::Allow) },
            RevisionDelta {
                revision: 7,
                delta: Delta { allow_remove: vec![m], deny_add: vec![m], ..Default::default() },
                policy: None,
            },
        ];
        let now = (false, true, UnknownMacPolicy::Allow);
        assert_eq!(state_at(now, Some(&log[..]), m, 4), Some((false, false, UnknownMacPolicy::Deny)));
        assert_eq!(state_at(now, Some(&log[1..]), m, 5), Some((true, false, UnknownMacPolicy::Deny)));
        assert_eq!(state_at(now, Some(&log[2..]), m, 6), Some((true, false, UnknownMacPolicy::Allow)));
        assert_eq!(state_at(now, Some(&[]), m, 7), Some(now));
        // Another MAC, in neither set now, that no revision touched: in neither set then.
        let other = (false, false, UnknownMacPolicy::Allow);
        assert_eq!(state_at(other, Some(&log[..]), mac(2), 4), Some((false, false, UnknownMacPolicy::Deny)));
        assert_eq!(state_at(now, None, m, 1), None, "the log does not reach back");
        assert_eq!(state_at(now, Some(&[]), m, 0), None, "nothing applied");
    }

    #[test]
    fn every_reason_has_a_source_in_words() {
        assert!(reason_source("inspection:node-7").contains("node-7"));
        assert!(reason_source("ironic").contains("Ironic"));
        assert!(reason_source("ironic-inspection").contains("inspect"));
        assert!(reason_source("api").contains("operator"));
        assert!(reason_source("ticket-42").contains("ticket-42"));
    }

    #[test]
    fn the_decision_names_the_reasons_and_the_policy() {
        let mut e = Entry::default();
        assert!(decision(&e, UnknownMacPolicy::Deny).contains("unknown-MAC policy (deny)"));
        e.deny.insert("ironic");
        assert_eq!(decision(&e, UnknownMacPolicy::Allow), "denied (ironic)");
        e.allow.insert("inspection:n1");
        assert!(decision(&e, UnknownMacPolicy::Deny).starts_with("allowed (inspection:n1) — also denied (ironic)"));
    }
}
