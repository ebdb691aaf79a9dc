//! The desired state of a PXE host's filter: the static ruleset configuration (where DHCP is filtered and how
//! packets are marked) plus the dynamic part (mode, unknown-MAC policy, allow and deny sets).

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::MacAddr;

/// Which packets the agent's table may let through to the local DHCP/PXE service.
///
/// Every error path in ironguard leads to [`Mode::Blocked`]; it is also what a freshly created table starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Nothing is marked: the table itself drops all DHCP/PXE traffic, and so does the guard.
    #[default]
    Blocked,
    /// Deny (and allow) sets are kept warm, but nothing is marked: no DHCP is served. Ready to lead.
    Follower,
    /// Whitelist and blacklist are live; with policy `allow` unknown MACs reach the pass rule.
    Leader,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Blocked => "blocked",
            Mode::Follower => "follower",
            Mode::Leader => "leader",
        })
    }
}

/// Which address of a DHCP packet is matched against the sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatchMode {
    /// The BOOTP client hardware address (`@th,288,48`): works behind DHCP relays.
    Chaddr,
    /// The Ethernet source address: only meaningful when nodes share the PXE host's L2 segment.
    EtherSaddr,
    /// Both: a packet is allowed if either address is allowed, denied if either is denied.
    #[default]
    Both,
}

impl MatchMode {
    /// Whether sets and rules keyed by the Ethernet source exist in this mode.
    pub fn uses_ether(self) -> bool {
        matches!(self, MatchMode::EtherSaddr | MatchMode::Both)
    }

    /// Whether sets and rules keyed by the BOOTP chaddr exist in this mode.
    pub fn uses_chaddr(self) -> bool {
        matches!(self, MatchMode::Chaddr | MatchMode::Both)
    }
}

/// What the leader does with a MAC that is in neither set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownMacPolicy {
    /// Unknown MACs reach the pass rule (discovery of nodes Ironic does not know yet).
    Allow,
    /// Only allowed MACs get DHCP; there is no pass rule. The default: serving strangers is an explicit choice.
    #[default]
    Deny,
}

impl fmt::Display for UnknownMacPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnknownMacPolicy::Allow => "allow",
            UnknownMacPolicy::Deny => "deny",
        })
    }
}

/// A netfilter hook on which DHCP/PXE traffic is filtered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    /// Traffic to a dnsmasq running on the host itself (the default).
    Input,
    /// Traffic routed or bridged to a containerized dnsmasq.
    Forward,
}

impl HookKind {
    /// The chain name used for this hook in both tables.
    pub fn chain_name(self) -> &'static str {
        match self {
            HookKind::Input => "input",
            HookKind::Forward => "forward",
        }
    }
}

/// What enforces the filter on a PXE host. Several can run together (`backends = ["nftables",
/// "dnsmasq-hostsdir"]`): every change is applied to each, nftables first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// The kernel's nftables: an owned table that dies with the agent, the guard, the kernel lease (the default).
    Nftables,
    /// dnsmasq's `--dhcp-hostsdir`, written in the format of Ironic's `ironic-pxe-filter` and ironic-inspector's
    /// dnsmasq filter. Nothing in the kernel: see docs/operations.md for what it does not guarantee alone.
    DnsmasqHostsdir,
    /// iptables-legacy rules in a dedicated chain and `hash:mac` ipsets swapped with `ipset swap`, for hosts
    /// without nftables.
    Ipset,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Nftables => "nftables",
            Backend::DnsmasqHostsdir => "dnsmasq-hostsdir",
            Backend::Ipset => "ipset",
        })
    }
}

/// `[dataplane.hostsdir]`: the dnsmasq hostsdir backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostsdirConfig {
    /// The directory dnsmasq reads with `--dhcp-hostsdir` (Ironic: `[pxe_filter] dhcp_hostsdir`; ironic-inspector:
    /// `[dnsmasq_pxe_filter] dhcp_hostsdir`). It must exist before dnsmasq starts and never be replaced: dnsmasq
    /// watches the directory it found at start.
    pub dir: PathBuf,
}

impl Default for HostsdirConfig {
    fn default() -> Self {
        Self { dir: PathBuf::from("/var/lib/ironguard/dhcp-hostsdir") }
    }
}

/// `[dataplane.ipset]`: the iptables-legacy and ipset backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IpsetConfig {
    /// The iptables command whose rules live in the legacy (x_tables) ruleset.
    pub iptables: String,
    /// The ipset command.
    pub ipset: String,
}

impl Default for IpsetConfig {
    fn default() -> Self {
        Self { iptables: "iptables-legacy".into(), ipset: "ipset".into() }
    }
}

fn default_backends() -> Vec<Backend> {
    vec![Backend::Nftables]
}

/// Default packet mark: a single bit, so ironguard coexists with other users of marks.
pub const DEFAULT_MARK: u32 = 0x0010_0000;
/// Default mark mask.
pub const DEFAULT_MASK: u32 = 0x0010_0000;

/// The static part of the ruleset, normally read from the agent's configuration file. The guard table and the
/// agent's table are built from the same configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RulesetConfig {
    /// Interfaces on which DHCP/PXE is filtered; empty means every interface.
    pub interfaces: Vec<String>,
    /// UDP destination ports of the DHCP/PXE service (67 by default; add 4011 for proxy-DHCP/PXE).
    pub ports: Vec<u16>,
    /// Hooks on which traffic is filtered (input by default; forward for a containerized dnsmasq). May be empty
    /// when `egress_interfaces` is not: a PXE host whose DHCP server reads raw sockets needs no input hook.
    pub hooks: Vec<HookKind>,
    /// Interfaces on which the DHCP server's *replies* are filtered at the netdev egress hook (Linux 5.16+), for
    /// servers that read and write AF_PACKET sockets (ISC dhcpd, Kea in raw mode): their requests reach them before
    /// any netfilter hook, so only the offers and acks they send can be stopped. Keyed by the BOOTP chaddr. Empty
    /// by default.
    pub egress_interfaces: Vec<String>,
    /// Which address of a packet is matched against the sets.
    pub match_mode: MatchMode,
    /// The packet mark the agent's table sets on traffic it lets through; the guard drops anything without it.
    pub mark: u32,
    /// The bits of the packet mark that belong to ironguard.
    pub mask: u32,
    /// What enforces the filter: `["nftables"]` (the default), `["dnsmasq-hostsdir"]`, `["ipset"]`, or nftables or
    /// ipset together with the hostsdir.
    #[serde(default = "default_backends")]
    pub backends: Vec<Backend>,
    pub hostsdir: HostsdirConfig,
    pub ipset: IpsetConfig,
    /// The agent's probe identity (a BOOTP chaddr), set by the agent from `[dhcp_health]`, never read from
    /// `[dataplane]`: with it, the agent's table lets the agent's own probe DISCOVERs reach the local DHCP server
    /// in every mode but Blocked, and counts the OFFERs that server sends (docs/architecture.md, "Leadership
    /// confirmed by answers").
    #[serde(skip)]
    pub probe: Option<MacAddr>,
}

impl Default for RulesetConfig {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            ports: vec![67],
            hooks: vec![HookKind::Input],
            egress_interfaces: Vec::new(),
            match_mode: MatchMode::Both,
            mark: DEFAULT_MARK,
            mask: DEFAULT_MASK,
            backends: default_backends(),
            hostsdir: HostsdirConfig::default(),
            ipset: IpsetConfig::default(),
            probe: None,
        }
    }
}

/// A ruleset configuration that cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no DHCP/PXE port configured (ports = [])")]
    NoPorts,
    #[error("port 0 is not a DHCP/PXE port")]
    PortZero,
    #[error("port {0} is listed twice")]
    DuplicatePort(u16),
    #[error(
        "nothing to filter: no hook (hooks = []) and no egress interface (egress_interfaces = []); use hooks = \
         [\"input\"] for a dnsmasq on the host, egress_interfaces = [\"IFNAME\"] for a DHCP server on raw sockets"
    )]
    NoHooks,
    #[error("hook {0:?} is listed twice")]
    DuplicateHook(HookKind),
    #[error("interface name {0:?} is not valid (1 to 15 bytes, no '/', whitespace or NUL)")]
    InterfaceName(String),
    #[error("interface {0:?} is listed twice")]
    DuplicateInterface(String),
    #[error("egress interface name {0:?} is not valid (1 to 15 bytes, no '/', whitespace or NUL)")]
    EgressInterfaceName(String),
    #[error("egress interface {0:?} is listed twice")]
    DuplicateEgressInterface(String),
    #[error("the mask is 0: ironguard needs at least one bit of the packet mark")]
    ZeroMask,
    #[error("the mark 0x{mark:08x} has bits outside the mask 0x{mask:08x}")]
    MarkOutsideMask { mark: u32, mask: u32 },
    #[error("the mark is 0: an unmarked packet would look like an allowed one")]
    ZeroMark,
    #[error("no backend configured (backends = []); use [\"nftables\"]")]
    NoBackend,
    #[error("backend {0} is listed twice")]
    DuplicateBackend(Backend),
    #[error("backends nftables and ipset cannot run together: both filter the same packets in the kernel")]
    TwoKernelBackends,
    #[error("egress_interfaces needs the nftables backend (the netdev egress hook)")]
    EgressNeedsNftables,
    #[error("the ipset backend filters DHCPv4 only (iptables); port 547 (DHCPv6) needs the nftables backend")]
    IpsetNoDhcpv6,
    #[error("[dataplane.hostsdir] dir must be an absolute path, not {0:?}")]
    HostsdirRelative(PathBuf),
}

impl RulesetConfig {
    /// Checks that this configuration can be turned into a ruleset that means what it says.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ports.is_empty() {
            return Err(ConfigError::NoPorts);
        }
        let mut seen = BTreeSet::new();
        for &p in &self.ports {
            if p == 0 {
                return Err(ConfigError::PortZero);
            }
            if !seen.insert(p) {
                return Err(ConfigError::DuplicatePort(p));
            }
        }
        if self.hooks.is_empty() && self.egress_interfaces.is_empty() {
            return Err(ConfigError::NoHooks);
        }
        let mut seen = BTreeSet::new();
        for &h in &self.hooks {
            if !seen.insert(h) {
                return Err(ConfigError::DuplicateHook(h));
            }
        }
        let mut seen = BTreeSet::new();
        for name in &self.interfaces {
            if !valid_ifname(name) {
                return Err(ConfigError::InterfaceName(name.clone()));
            }
            if !seen.insert(name.as_str()) {
                return Err(ConfigError::DuplicateInterface(name.clone()));
            }
        }
        let mut seen = BTreeSet::new();
        for name in &self.egress_interfaces {
            if !valid_ifname(name) {
                return Err(ConfigError::EgressInterfaceName(name.clone()));
            }
            if !seen.insert(name.as_str()) {
                return Err(ConfigError::DuplicateEgressInterface(name.clone()));
            }
        }
        if self.mask == 0 {
            return Err(ConfigError::ZeroMask);
        }
        if self.mark & !self.mask != 0 {
            return Err(ConfigError::MarkOutsideMask { mark: self.mark, mask: self.mask });
        }
        if self.mark == 0 {
            return Err(ConfigError::ZeroMark);
        }
        self.validate_backends()
    }

    fn validate_backends(&self) -> Result<(), ConfigError> {
        if self.backends.is_empty() {
            return Err(ConfigError::NoBackend);
        }
        let mut seen = BTreeSet::new();
        for &b in &self.backends {
            if !seen.insert(b) {
                return Err(ConfigError::DuplicateBackend(b));
            }
        }
        if self.uses(Backend::Nftables) && self.uses(Backend::Ipset) {
            return Err(ConfigError::TwoKernelBackends);
        }
        if self.uses_egress() && !self.uses(Backend::Nftables) {
            return Err(ConfigError::EgressNeedsNftables);
        }
        if self.uses(Backend::Ipset) && self.ports.contains(&547) {
            return Err(ConfigError::IpsetNoDhcpv6);
        }
        if self.uses(Backend::DnsmasqHostsdir) && !self.hostsdir.dir.is_absolute() {
            return Err(ConfigError::HostsdirRelative(self.hostsdir.dir.clone()));
        }
        Ok(())
    }

    /// Whether `backend` is one of the configured backends.
    pub fn uses(&self, backend: Backend) -> bool {
        self.backends.contains(&backend)
    }
}

fn valid_ifname(name: &str) -> bool {
    !name.is_empty() && name.len() < 16 && !name.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace())
}

impl RulesetConfig {
    /// Whether the `inet` tables (input/forward hooks on requests) exist for this configuration.
    pub fn uses_inet(&self) -> bool {
        !self.hooks.is_empty()
    }

    /// Whether the `netdev` tables (egress hook on the server's replies) exist for this configuration.
    pub fn uses_egress(&self) -> bool {
        !self.egress_interfaces.is_empty()
    }
}

/// Everything the agent's table should hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DesiredState {
    pub config: RulesetConfig,
    pub mode: Mode,
    pub unknown_mac_policy: UnknownMacPolicy,
    pub allow: BTreeSet<MacAddr>,
    pub deny: BTreeSet<MacAddr>,
}

impl DesiredState {
    /// An empty, blocked state for this configuration.
    pub fn blocked(config: RulesetConfig) -> Self {
        Self { config, ..Self::default() }
    }

    /// Applies a delta to the in-memory state, returning what really changed (adds of present MACs and
    /// removals of absent ones drop out).
    pub fn merge(&mut self, delta: &Delta) -> Delta {
        let mut effective = Delta::default();
        for m in &delta.allow_remove {
            if self.allow.remove(m) {
                effective.allow_remove.push(*m);
            }
        }
        for m in &delta.deny_remove {
            if self.deny.remove(m) {
                effective.deny_remove.push(*m);
            }
        }
        for m in &delta.allow_add {
            if self.allow.insert(*m) {
                effective.allow_add.push(*m);
            }
        }
        for m in &delta.deny_add {
            if self.deny.insert(*m) {
                effective.deny_add.push(*m);
            }
        }
        effective
    }

    /// What the delta would change, without changing anything (and without copying the sets).
    pub fn effective(&self, delta: &Delta) -> Delta {
        fn one(present: &BTreeSet<MacAddr>, add: &[MacAddr], remove: &[MacAddr]) -> (Vec<MacAddr>, Vec<MacAddr>) {
            let adding: BTreeSet<&MacAddr> = add.iter().collect();
            let mut seen = BTreeSet::new();
            // removals apply first: a MAC removed and re-added is unchanged if present, added if absent
            let rem = remove
                .iter()
                .filter(|m| present.contains(m) && !adding.contains(m) && seen.insert(**m))
                .copied()
                .collect();
            let mut seen = BTreeSet::new();
            let add = add.iter().filter(|m| !present.contains(m) && seen.insert(**m)).copied().collect();
            (add, rem)
        }
        let (allow_add, allow_remove) = one(&self.allow, &delta.allow_add, &delta.allow_remove);
        let (deny_add, deny_remove) = one(&self.deny, &delta.deny_add, &delta.deny_remove);
        Delta { allow_add, allow_remove, deny_add, deny_remove }
    }
}

/// A change to the allow and deny sets. Removals apply before additions, so a MAC both removed and added ends up
/// present. Adding a present MAC or removing an absent one is not an error.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Delta {
    pub allow_add: Vec<MacAddr>,
    pub allow_remove: Vec<MacAddr>,
    pub deny_add: Vec<MacAddr>,
    pub deny_remove: Vec<MacAddr>,
}

impl Delta {
    /// True if the delta changes nothing.
    pub fn is_empty(&self) -> bool {
        self.allow_add.is_empty()
            && self.allow_remove.is_empty()
            && self.deny_add.is_empty()
            && self.deny_remove.is_empty()
    }

    /// Number of MACs named.
    pub fn len(&self) -> usize {
        self.allow_add.len() + self.allow_remove.len() + self.deny_add.len() + self.deny_remove.len()
    }

    /// Appends `later` so that the result has the effect of applying `self` then `later`.
    ///
    /// Used to coalesce a burst of deltas into one kernel transaction.
    pub fn then(&mut self, later: &Delta) {
        fn fold(adds: &mut Vec<MacAddr>, removes: &mut Vec<MacAddr>, l_add: &[MacAddr], l_rem: &[MacAddr]) {
            let rem: BTreeSet<_> = l_rem.iter().collect();
            let add: BTreeSet<_> = l_add.iter().collect();
            adds.retain(|m| !rem.contains(m));
            removes.retain(|m| !add.contains(m));
            adds.extend(l_add.iter().copied());
            removes.extend(l_rem.iter().copied());
        }
        fold(&mut self.allow_add, &mut self.allow_remove, &later.allow_add, &later.allow_remove);
        fold(&mut self.deny_add, &mut self.deny_remove, &later.deny_add, &later.deny_remove);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(last: u8) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, 0, last]).unwrap()
    }

    #[test]
    fn default_config_is_valid() {
        RulesetConfig::default().validate().unwrap();
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let base = RulesetConfig::default();
        let cases: Vec<(RulesetConfig, &str)> = vec![
            (RulesetConfig { ports: vec![], ..base.clone() }, "no DHCP/PXE port"),
            (RulesetConfig { ports: vec![67, 67], ..base.clone() }, "twice"),
            (RulesetConfig { ports: vec![0], ..base.clone() }, "port 0"),
            (RulesetConfig { hooks: vec![], ..base.clone() }, "no hook"),
            (RulesetConfig { egress_interfaces: vec!["x".repeat(16)], ..base.clone() }, "egress interface name"),
            (RulesetConfig { egress_interfaces: vec!["e0".into(), "e0".into()], ..base.clone() }, "listed twice"),
            (RulesetConfig { interfaces: vec!["a".repeat(16)], ..base.clone() }, "interface name"),
            (RulesetConfig { interfaces: vec!["".into()], ..base.clone() }, "interface name"),
            (RulesetConfig { interfaces: vec!["eth 0".into()], ..base.clone() }, "interface name"),
            (RulesetConfig { mask: 0, ..base.clone() }, "mask is 0"),
            (RulesetConfig { mark: 0x3, mask: 0x1, ..base.clone() }, "outside the mask"),
            (RulesetConfig { mark: 0, ..base.clone() }, "mark is 0"),
            (RulesetConfig { backends: vec![], ..base.clone() }, "no backend"),
            (RulesetConfig { backends: vec![Backend::Nftables, Backend::Nftables], ..base.clone() }, "twice"),
            (
                RulesetConfig { backends: vec![Backend::Nftables, Backend::Ipset], ..base.clone() },
                "cannot run together",
            ),
            (
                RulesetConfig {
                    backends: vec![Backend::DnsmasqHostsdir],
                    egress_interfaces: vec!["e0".into()],
                    ..base.clone()
                },
                "needs the nftables backend",
            ),
            (RulesetConfig { backends: vec![Backend::Ipset], ports: vec![67, 547], ..base.clone() }, "DHCPv4 only"),
            (
                RulesetConfig {
                    backends: vec![Backend::DnsmasqHostsdir],
                    hostsdir: HostsdirConfig { dir: "hosts".into() },
                    ..base.clone()
                },
                "absolute path",
            ),
        ];
        for (cfg, want) in cases {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
    }

    #[test]
    fn egress_alone_is_a_valid_configuration() {
        let c = RulesetConfig { hooks: vec![], egress_interfaces: vec!["eth1".into()], ..Default::default() };
        c.validate().unwrap();
        assert!(c.uses_egress() && !c.uses_inet());
        assert!(RulesetConfig::default().uses_inet() && !RulesetConfig::default().uses_egress());
    }

    #[test]
    fn merge_reports_only_real_changes() {
        let mut s = DesiredState::default();
        s.allow.insert(mac(1));
        let d = Delta {
            allow_add: vec![mac(1), mac(2)],
            allow_remove: vec![mac(3)],
            deny_add: vec![mac(4)],
            deny_remove: vec![],
        };
        let eff = s.merge(&d);
        assert_eq!(eff.allow_add, vec![mac(2)]);
        assert!(eff.allow_remove.is_empty());
        assert_eq!(eff.deny_add, vec![mac(4)]);
        assert!(s.allow.contains(&mac(1)) && s.allow.contains(&mac(2)) && s.deny.contains(&mac(4)));
    }

    #[test]
    fn effective_matches_merge() {
        let mut s = DesiredState::default();
        s.allow.extend([mac(1), mac(2)]);
        s.deny.insert(mac(3));
        let d = Delta {
            allow_add: vec![mac(2), mac(4), mac(4), mac(5)],
            allow_remove: vec![mac(1), mac(1), mac(5), mac(2), mac(9)],
            deny_add: vec![mac(3)],
            deny_remove: vec![mac(3)],
        };
        let eff = s.effective(&d);
        let mut merged = s.clone();
        merged.merge(&d);
        let mut via_eff = s.clone();
        via_eff.merge(&eff);
        assert_eq!(via_eff, merged);
        assert_eq!(eff.allow_add, vec![mac(4), mac(5)]);
        assert_eq!(eff.allow_remove, vec![mac(1)]);
        assert!(eff.deny_add.is_empty() && eff.deny_remove.is_empty());
    }

    #[test]
    fn coalesced_deltas_have_the_effect_of_applying_them_in_order() {
        let steps = [
            Delta { allow_add: vec![mac(1), mac(2)], ..Default::default() },
            Delta { allow_remove: vec![mac(1)], deny_add: vec![mac(1)], ..Default::default() },
            Delta { allow_add: vec![mac(1)], deny_remove: vec![mac(1)], ..Default::default() },
            Delta { allow_remove: vec![mac(2)], ..Default::default() },
        ];
        let mut one_by_one = DesiredState::default();
        let mut combined = Delta::default();
        for d in &steps {
            one_by_one.merge(d);
            combined.then(d);
        }
        let mut at_once = DesiredState::default();
        at_once.merge(&combined);
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.allow, BTreeSet::from([mac(1)]));
        assert!(at_once.deny.is_empty());
    }
}
