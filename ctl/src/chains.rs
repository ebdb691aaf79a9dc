//! `ironguardctl chains`: what the kernel of a host holds, and the verdict.

use std::fmt::Write as _;

use ironguard_nft::{Mode, Observed, ObservedTable, Verdict};
use serde::Serialize;

use crate::owner::{self, OwnerProcess};

/// The JSON document printed by `ironguardctl chains --json`.
#[derive(Debug, Serialize)]
pub struct ChainsReport {
    pub netns: Option<String>,
    pub verdict: Verdict,
    pub verdict_text: String,
    pub guard_present: bool,
    pub owned_present: bool,
    pub mode: Option<Mode>,
    pub pass_rule: bool,
    pub owner_portid: Option<u32>,
    pub owner_process: Option<OwnerProcess>,
    pub guard: Option<ObservedTable>,
    pub owned: Option<ObservedTable>,
}

impl ChainsReport {
    pub fn new(netns: Option<String>, observed: Observed) -> Self {
        let verdict = observed.verdict();
        let owner_portid = observed.owned.as_ref().and_then(|t| t.owner_portid);
        Self {
            netns,
            verdict,
            verdict_text: verdict.to_string(),
            guard_present: observed.guard.is_some(),
            owned_present: observed.owned.is_some(),
            mode: observed.owned.as_ref().map(|t| t.mode()),
            pass_rule: observed.owned.as_ref().is_some_and(|t| t.has_pass_rule()),
            owner_portid,
            owner_process: owner_portid.and_then(owner::resolve),
            guard: observed.guard,
            owned: observed.owned,
        }
    }

    /// Human-readable rendering; the last line is always `verdict: ...`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(ns) = &self.netns {
            let _ = writeln!(out, "network namespace: {ns}");
        }
        match &self.guard {
            Some(t) => {
                let _ = writeln!(out, "guard: present (table inet {})", t.name);
                render_chains(&mut out, t);
            }
            None => {
                let _ = writeln!(out, "guard: ABSENT (table inet {} missing)", ironguard_nft::GUARD_TABLE);
            }
        }
        match &self.owned {
            Some(t) => {
                let owner = match (&self.owner_portid, &self.owner_process) {
                    (Some(port), Some(p)) => format!("netlink port {port}, pid {} ({})", p.pid, p.command),
                    (Some(port), None) => format!("netlink port {port}"),
                    (None, _) => "none (no owner flag!)".to_string(),
                };
                let _ = writeln!(out, "agent table: present (table inet {}), owner: {owner}", t.name);
                let _ = writeln!(
                    out,
                    "mode: {}   pass rule: {}",
                    t.mode(),
                    if t.has_pass_rule() { "present (unknown MACs allowed)" } else { "absent" }
                );
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
                render_chains(&mut out, t);
            }
            None => {
                let _ = writeln!(out, "agent table: absent (no agent holds table inet {})", ironguard_nft::OWNED_TABLE);
            }
        }
        let _ = writeln!(out, "verdict: {}", self.verdict);
        out
    }
}

fn render_chains(out: &mut String, t: &ObservedTable) {
    for c in &t.chains {
        match (&c.hook, c.priority) {
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
        }
    }
}
