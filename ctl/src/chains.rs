//! `ironguardctl chains`: what the kernel of a host holds, and the verdict.

use std::fmt::Write as _;

use ironguard_dataplane::ruleset::Side;
use ironguard_dataplane::{Mode, Observed, ObservedTable, Verdict};
use serde::Serialize;

use crate::owner::{OwnerProcess, Owners};

/// The JSON document printed by `ironguardctl chains --json`.
#[derive(Debug, Serialize)]
pub struct ChainsReport {
    pub netns: Option<String>,
    pub verdict: Verdict,
    pub verdict_text: String,
    pub guard_present: bool,
    /// `owner, persist`: the guard outlives its holder and refuses every other process while held.
    pub guard_persistent: bool,
    /// The netlink port holding the guard (the running agent), and which process that is.
    pub guard_held_by: Option<u32>,
    pub guard_holder: Option<OwnerProcess>,
    /// Whether the guard drops unmarked DHCP (it exists and every base chain holds its drop rules).
    pub guard_drops: bool,
    pub owned_present: bool,
    /// Milliseconds until the leader's kernel lease expires (absent: no live lease).
    pub lease_expires_in_ms: Option<u64>,
    pub mode: Option<Mode>,
    pub pass_rule: bool,
    pub owner_portid: Option<u32>,
    pub owner_process: Option<OwnerProcess>,
    /// The request side's tables (`inet`).
    pub guard: Option<ObservedTable>,
    pub owned: Option<ObservedTable>,
    /// The reply side's tables (`netdev`, egress hook), where egress interfaces are configured. The summary fields
    /// above describe the request side when it exists, else this one; `verdict` covers both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_guard: Option<ObservedTable>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_owned: Option<ObservedTable>,
    /// Who holds which netlink port, found once for the whole report.
    #[serde(skip)]
    owners: Owners,
}

impl ChainsReport {
    pub fn new(netns: Option<String>, observed: Observed) -> Self {
        let verdict = observed.verdict();
        let primary = if observed.present_sides() == [Side::Replies] { Side::Replies } else { Side::Requests };
        let (guard, owned) = observed.side(primary);
        let owner_portid = owned.and_then(|t| t.owner_portid);
        let owners = Owners::new();
        Self {
            netns,
            verdict,
            verdict_text: verdict.to_string(),
            guard_present: guard.is_some(),
            guard_persistent: guard.is_some_and(|g| g.flags & 0x4 != 0),
            guard_held_by: guard.and_then(|g| g.owner_portid),
            guard_holder: guard.and_then(|g| g.owner_portid).and_then(|p| owners.resolve(p)),
            guard_drops: guard.is_some_and(|g| g.guard_drops()),
            owned_present: owned.is_some(),
            lease_expires_in_ms: owned.and_then(|t| t.lease_expires_in_ms()),
            mode: owned.map(|t| t.mode()),
            pass_rule: owned.is_some_and(|t| t.has_pass_rule()),
            owner_portid,
            owner_process: owner_portid.and_then(|p| owners.resolve(p)),
            guard: observed.guard,
            owned: observed.owned,
            egress_guard: observed.egress_guard,
            egress_owned: observed.egress_owned,
            owners,
        }
    }

    /// Human-readable rendering; the last line is always `verdict: ...`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(ns) = &self.netns {
            let _ = writeln!(out, "network namespace: {ns}");
        }
        let replies = self.egress_guard.is_some() || self.egress_owned.is_some();
        let requests = self.guard.is_some() || self.owned.is_some() || !replies;
        if requests {
            render_side(&mut out, &self.owners, "inet", "", self.guard.as_ref(), self.owned.as_ref());
        }
        if replies {
            let what = " (DHCP replies, egress hook)";
            render_side(&mut out, &self.owners, "netdev", what, self.egress_guard.as_ref(), self.egress_owned.as_ref());
        }
        let _ = writeln!(out, "verdict: {}", self.verdict);
        out
    }
}

/// The guard and the agent's table of one family.
fn render_side(
    out: &mut String,
    owners: &Owners,
    family: &str,
    what: &str,
    guard: Option<&ObservedTable>,
    owned: Option<&ObservedTable>,
) {
    let persistent = guard.is_some_and(|g| g.flags & 0x4 != 0);
    let held_by = guard.and_then(|g| g.owner_portid);
    let holder = held_by.and_then(|p| owners.resolve(p));
    match guard {
        Some(t) => {
            let held = match (persistent, held_by, &holder) {
                (true, Some(port), Some(p)) => {
                    format!("held by netlink port {port}, pid {} ({}); owner, persist", p.pid, p.command)
                }
                (true, Some(port), None) => format!("held by netlink port {port}; owner, persist"),
                (true, None, _) => "orphaned: no agent holds it (owner, persist: it stays and drops)".into(),
                (false, _, _) => "plain table".into(),
            };
            let drops = if t.guard_drops() { "" } else { " — DOES NOT DROP (flushed or altered)!" };
            let _ = writeln!(out, "guard{what}: present (table {family} {}), {held}{drops}", t.name);
            render_chains(out, t);
        }
        None => {
            let _ = writeln!(out, "guard{what}: ABSENT (table {family} {} missing)", ironguard_dataplane::GUARD_TABLE);
        }
    }
    let owner_portid = owned.and_then(|t| t.owner_portid);
    let owner_process = owner_portid.and_then(|p| owners.resolve(p));
    match owned {
        Some(t) => {
            let owner = match (&owner_portid, &owner_process) {
                (Some(port), Some(p)) => format!("netlink port {port}, pid {} ({})", p.pid, p.command),
                (Some(port), None) => format!("netlink port {port}"),
                (None, _) => "none (no owner flag!)".to_string(),
            };
            let _ = writeln!(out, "agent table{what}: present (table {family} {}), owner: {owner}", t.name);
            let _ = writeln!(
                out,
                "mode: {}   pass rule: {}",
                t.mode(),
                if t.has_pass_rule() { "present (unknown MACs allowed)" } else { "absent" }
            );
            let lease = match t.lease_expires_in_ms() {
                Some(ms) => format!("live, expires in {ms} ms unless renewed"),
                None => "none (nothing is marked)".into(),
            };
            let _ = writeln!(out, "kernel lease: {lease}");
            let _ = writeln!(out, "sets:");
            for s in &t.sets {
                let size = s.size.map(|n| format!(" (size {n})")).unwrap_or_default();
                let _ = writeln!(out, "  {:<14} {:>8} elements{size}", s.name, s.elements);
                if let Some(m) = &s.members {
                    for mac in m {
                        let _ = writeln!(out, "      {mac}");
                    }
                }
            }
            render_chains(out, t);
        }
        None => {
            let _ = writeln!(
                out,
                "agent table{what}: absent (no agent holds table {family} {})",
                ironguard_dataplane::OWNED_TABLE
            );
        }
    }
}

fn render_chains(out: &mut String, t: &ObservedTable) {
    for c in &t.chains {
        match (&c.hook, c.priority) {
            (Some(h), Some(p)) if !c.devices.is_empty() => {
                let _ = writeln!(out, "  chain {} (hook {h}, devices {}, priority {p})", c.name, c.devices.join(", "));
            }
            (Some(h), Some(p)) => {
                let _ = writeln!(out, "  chain {} (hook {h}, priority {p})", c.name);
            }
            _ => {
                let _ = writeln!(out, "  chain {}", c.name);
            }
        }
        if c.rules.is_empty() {
            let _ = writeln!(out, "    (empty)");
        }
        for r in &c.rules {
            let counters = match (r.packets, r.bytes) {
                (Some(p), Some(b)) => format!("packets {p} bytes {b}"),
                _ => "no counter".to_string(),
            };
            let _ = writeln!(out, "    {:<32} {counters}", r.comment.as_deref().unwrap_or("(no comment)"));
            let _ = writeln!(out, "      {}", r.text());
        }
    }
}
