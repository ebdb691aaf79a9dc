//! Renders a desired state as an `nft -f` script with exactly the content the netlink backend creates. The
//! benchmark loads it to compare against `nft -f` on the same content, and a test checks that both produce
//! the same `nft list` output.

use std::fmt::Write as _;

use crate::MacAddr;
use crate::model::{DesiredState, HookKind, Mode, RulesetConfig, UnknownMacPolicy};
use crate::ruleset::{
    EGRESS_CHAIN, GUARD_PRIORITY, LEASE_DEFAULT_TIMEOUT_MS, LEASE_SET, OWNED_PRIORITY, SEEN_SIZE, SEEN_TIMEOUT_MS,
    SeenKind, SetKind, Side, comments, seen_chains,
};

fn dhcp_matches(side: Side, config: &RulesetConfig) -> Vec<String> {
    let mut out = Vec::new();
    let ifaces: Vec<Option<&String>> = if config.interfaces.is_empty() || side == Side::Replies {
        vec![None]
    } else {
        config.interfaces.iter().map(Some).collect()
    };
    let dir = port_dir(side);
    for iface in ifaces {
        for port in &config.ports {
            out.push(match iface {
                Some(i) => format!("iifname \"{i}\" udp {dir} {port}"),
                None => format!("udp {dir} {port}"),
            });
        }
    }
    out
}

fn port_dir(side: Side) -> &'static str {
    if side == Side::Replies { "sport" } else { "dport" }
}

fn key(side: Side, kind: SetKind) -> &'static str {
    match (side, kind.is_chaddr()) {
        (Side::Requests, true) => "meta nfproto ipv4 @th,288,48",
        (Side::Replies, true) => "meta protocol ip @th,288,48",
        (_, false) => "ether saddr",
    }
}

fn element(kind: SetKind, m: &MacAddr) -> String {
    if kind.is_chaddr() {
        let o = m.octets();
        format!("0x{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", o[0], o[1], o[2], o[3], o[4], o[5])
    } else {
        m.to_string()
    }
}

fn mark_set(c: &RulesetConfig) -> String {
    format!("meta mark set meta mark & 0x{:08x} | 0x{:08x}", !c.mask, c.mark)
}

fn hook_line(h: HookKind, priority: i32) -> String {
    format!("\t\ttype filter hook {} priority {priority}; policy accept;\n", h.chain_name())
}

/// The base chains of a side, each with one rule per DHCP match: `match` + `rest`.
fn base_chains(out: &mut String, side: Side, c: &RulesetConfig, priority: i32, rest: &str) {
    let chains: Vec<(&str, String)> = match side {
        Side::Requests => c.hooks.iter().map(|&h| (h.chain_name(), hook_line(h, priority))).collect(),
        Side::Replies => {
            let devs: Vec<String> = c.egress_interfaces.iter().map(|d| format!("\"{d}\"")).collect();
            vec![(
                EGRESS_CHAIN,
                format!(
                    "\t\ttype filter hook egress devices = {{ {} }} priority {priority}; policy accept;\n",
                    devs.join(", ")
                ),
            )]
        }
    };
    for (name, hook) in chains {
        let _ = writeln!(out, "\tchain {name} {{");
        out.push_str(&hook);
        for m in dhcp_matches(side, c) {
            let _ = writeln!(out, "\t\t{m} {rest}");
        }
        out.push_str("\t}\n");
    }
}

/// The agent's tables (one per side the configuration uses) as an nft script. `owner` adds `flags owner` (the
/// table then lives only as long as the `nft` process, so the benchmark leaves it out).
pub fn owned_table_script(table: &str, s: &DesiredState, owner: bool) -> String {
    let mut out = String::with_capacity(64 + (s.allow.len() + s.deny.len()) * 40);
    for side in Side::for_config(&s.config) {
        owned_side_script(&mut out, side, table, s, owner);
    }
    out
}

fn owned_side_script(out: &mut String, side: Side, table: &str, s: &DesiredState, owner: bool) {
    let c = &s.config;
    let dir = port_dir(side);
    let _ = writeln!(out, "table {} {table} {{", side.family_name());
    if owner {
        out.push_str("\tflags owner\n");
    }
    for k in side.set_kinds(c) {
        let _ = writeln!(out, "\tset {} {{", k.name());
        if k.is_chaddr() {
            out.push_str("\t\ttypeof @th,288,48\n");
        } else {
            out.push_str("\t\ttype ether_addr\n");
        }
        let members = if k.is_allow() { &s.allow } else { &s.deny };
        let _ = writeln!(out, "\t\tsize {}", crate::ruleset::set_capacity(members.len()));
        if !members.is_empty() {
            out.push_str("\t\telements = { ");
            for (i, m) in members.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&element(k, m));
            }
            out.push_str(" }\n");
        }
        out.push_str("\t}\n");
    }
    let _ = writeln!(
        out,
        "\tset {LEASE_SET} {{\n\t\ttype inet_service\n\t\tflags timeout\n\t\ttimeout {}ms\n\t}}",
        LEASE_DEFAULT_TIMEOUT_MS
    );
    if side == Side::Requests {
        for k in SeenKind::ALL {
            let _ = writeln!(
                out,
                "\tset {} {{\n\t\ttypeof @th,288,48\n\t\tsize {SEEN_SIZE}\n\t\tflags dynamic,timeout\n\t\tcounter\n\t\t\
                 timeout {SEEN_TIMEOUT_MS}ms\n\t}}",
                k.set_name()
            );
        }
    }
    let _ = writeln!(out, "\tchain whitelist {{");
    if s.mode == Mode::Leader {
        for k in side.set_kinds(c).into_iter().filter(|k| k.is_allow()) {
            let cm = if k.is_chaddr() { comments::ALLOW_CHADDR } else { comments::ALLOW_MAC };
            let _ = writeln!(
                out,
                "\t\tudp {dir} @{LEASE_SET} {} @{} counter {} accept comment \"{cm}\"",
                key(side, k),
                k.name(),
                mark_set(c)
            );
        }
    }
    out.push_str("\t}\n\tchain blacklist {\n");
    for k in side.set_kinds(c).into_iter().filter(|k| !k.is_allow()) {
        let cm = if k.is_chaddr() { comments::DENY_CHADDR } else { comments::DENY_MAC };
        let _ = writeln!(out, "\t\t{} @{} counter drop comment \"{cm}\"", key(side, k), k.name());
    }
    if s.mode == Mode::Leader && s.unknown_mac_policy == UnknownMacPolicy::Allow {
        let _ =
            writeln!(out, "\t\tudp {dir} @{LEASE_SET} counter {} accept comment \"{}\"", mark_set(c), comments::PASS);
    }
    out.push_str("\t}\n\tchain pxe {\n");
    if s.mode == Mode::Blocked {
        let _ = writeln!(out, "\t\tcounter drop comment \"{}\"", comments::BLOCKED);
    }
    let _ = writeln!(out, "\t\tjump whitelist comment \"{}\"", comments::TO_WHITELIST);
    let _ = writeln!(out, "\t\tjump blacklist comment \"{}\"", comments::TO_BLACKLIST);
    let _ = writeln!(out, "\t\tcounter drop comment \"{}\"", comments::NOT_MARKED);
    out.push_str("\t}\n");
    let clear = match side {
        Side::Requests => String::new(),
        Side::Replies => format!("meta mark set meta mark & 0x{:08x} ", !c.mask),
    };
    base_chains(out, side, c, OWNED_PRIORITY, &format!("counter {clear}jump pxe comment \"{}\"", comments::DHCP_JUMP));
    if side == Side::Requests {
        for chain in seen_chains(c) {
            let Some((hook, priority)) = chain.hook else { continue };
            let _ = writeln!(
                out,
                "\tchain {} {{\n\t\ttype filter hook {hook} priority {priority}; policy accept;",
                chain.name
            );
            for r in &chain.rules {
                let _ = writeln!(out, "\t\t{} comment \"{}\"", crate::rule::text(&r.stmts), r.comment);
            }
            out.push_str("\t}\n");
        }
    }
    out.push_str("}\n");
}

/// The guard tables (one per side the configuration uses) as an nft script.
pub fn guard_table_script(table: &str, c: &RulesetConfig) -> String {
    let mut out = String::new();
    for side in Side::for_config(c) {
        let _ = writeln!(out, "table {} {table} {{", side.family_name());
        let rest = format!(
            "meta mark & 0x{:08x} != 0x{:08x} counter drop comment \"{}\"",
            c.mask,
            c.mark,
            comments::GUARD_DROP
        );
        base_chains(&mut out, side, c, GUARD_PRIORITY, &rest);
        out.push_str("}\n");
    }
    out
}
