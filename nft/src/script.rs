//! Renders a desired state as an `nft -f` script with exactly the content the netlink backend creates. The
//! benchmark loads it to compare against `nft -f` on the same content, and a test checks that both produce
//! the same `nft list` output.

use std::fmt::Write as _;

use crate::MacAddr;
use crate::model::{DesiredState, HookKind, Mode, RulesetConfig, UnknownMacPolicy};
use crate::ruleset::{GUARD_PRIORITY, LEASE_DEFAULT_TIMEOUT_MS, LEASE_SET, OWNED_PRIORITY, SetKind, comments};

fn dhcp_matches(config: &RulesetConfig) -> Vec<String> {
    let mut out = Vec::new();
    let ifaces: Vec<Option<&String>> =
        if config.interfaces.is_empty() { vec![None] } else { config.interfaces.iter().map(Some).collect() };
    for iface in ifaces {
        for port in &config.ports {
            out.push(match iface {
                Some(i) => format!("iifname \"{i}\" udp dport {port}"),
                None => format!("udp dport {port}"),
            });
        }
    }
    out
}

fn key(kind: SetKind) -> &'static str {
    if kind.is_chaddr() { "meta nfproto ipv4 @th,288,48" } else { "ether saddr" }
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

/// The agent's table as an nft script. `owner` adds `flags owner` (the table then lives only as long as the
/// `nft` process, so the benchmark leaves it out).
pub fn owned_table_script(table: &str, s: &DesiredState, owner: bool) -> String {
    let c = &s.config;
    let mut out = String::with_capacity(64 + (s.allow.len() + s.deny.len()) * 40);
    let _ = writeln!(out, "table inet {table} {{");
    if owner {
        out.push_str("\tflags owner\n");
    }
    for k in SetKind::for_config(c) {
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
    let _ = writeln!(out, "\tchain whitelist {{");
    if s.mode == Mode::Leader {
        for k in SetKind::for_config(c).filter(|k| k.is_allow()) {
            let cm = if k.is_chaddr() { comments::ALLOW_CHADDR } else { comments::ALLOW_MAC };
            let _ = writeln!(
                out,
                "\t\tudp dport @{LEASE_SET} {} @{} counter {} accept comment \"{cm}\"",
                key(k),
                k.name(),
                mark_set(c)
            );
        }
    }
    out.push_str("\t}\n\tchain blacklist {\n");
    for k in SetKind::for_config(c).filter(|k| !k.is_allow()) {
        let cm = if k.is_chaddr() { comments::DENY_CHADDR } else { comments::DENY_MAC };
        let _ = writeln!(out, "\t\t{} @{} counter drop comment \"{cm}\"", key(k), k.name());
    }
    if s.mode == Mode::Leader && s.unknown_mac_policy == UnknownMacPolicy::Allow {
        let _ =
            writeln!(out, "\t\tudp dport @{LEASE_SET} counter {} accept comment \"{}\"", mark_set(c), comments::PASS);
    }
    out.push_str("\t}\n\tchain pxe {\n");
    if s.mode == Mode::Blocked {
        let _ = writeln!(out, "\t\tcounter drop comment \"{}\"", comments::BLOCKED);
    }
    let _ = writeln!(out, "\t\tjump whitelist comment \"{}\"", comments::TO_WHITELIST);
    let _ = writeln!(out, "\t\tjump blacklist comment \"{}\"", comments::TO_BLACKLIST);
    let _ = writeln!(out, "\t\tcounter drop comment \"{}\"", comments::NOT_MARKED);
    out.push_str("\t}\n");
    for &h in &c.hooks {
        let _ = writeln!(out, "\tchain {} {{", h.chain_name());
        out.push_str(&hook_line(h, OWNED_PRIORITY));
        for m in dhcp_matches(c) {
            let _ = writeln!(out, "\t\t{m} counter jump pxe comment \"{}\"", comments::DHCP_JUMP);
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
    out
}

/// The guard table as an nft script.
pub fn guard_table_script(table: &str, c: &RulesetConfig) -> String {
    let mut out = format!("table inet {table} {{\n");
    for &h in &c.hooks {
        let _ = writeln!(out, "\tchain {} {{", h.chain_name());
        out.push_str(&hook_line(h, GUARD_PRIORITY));
        for m in dhcp_matches(c) {
            let _ = writeln!(
                out,
                "\t\t{m} meta mark & 0x{:08x} != 0x{:08x} counter drop comment \"{}\"",
                c.mask,
                c.mark,
                comments::GUARD_DROP
            );
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
    out
}
