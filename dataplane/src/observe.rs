//! Read-back: what the kernel really holds in the guard table and the agent's table, read over netlink from any
//! process (the owner socket is not needed), plus the verdict line and a drift check against a desired state.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{DesiredState, Mode, UnknownMacPolicy};
use crate::netlink::{
    self, Attrs, DumpSocket, Dumped, Message, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE, be_u32, be_u64,
};
use crate::ruleset::{EGRESS_CHAIN, GUARD_TABLE, LEASE_SET, OWNED_TABLE, SetKind, Side, comments, parse_comment};
use crate::{MacAddr, NftError};

const NFPROTO_INET: u8 = 1;
const NFPROTO_UNSPEC: u8 = 0;
const NFT_TABLE_F_OWNER: u32 = 0x2;

fn inet() -> String {
    "inet".into()
}

/// What the kernel holds for one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedTable {
    pub name: String,
    /// `inet` (the request side) or `netdev` (the reply side, egress hook).
    #[serde(default = "inet")]
    pub family: String,
    pub flags: u32,
    /// Netlink port id of the owning socket, for tables with the `owner` flag.
    pub owner_portid: Option<u32>,
    pub chains: Vec<ObservedChain>,
    pub sets: Vec<ObservedSet>,
}

/// One chain and its rules, in kernel order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedChain {
    pub name: String,
    /// `input` / `forward` / `egress` / other hook number, for base chains.
    pub hook: Option<String>,
    pub priority: Option<i32>,
    /// The devices a netdev base chain is bound to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    pub rules: Vec<ObservedRule>,
}

/// One rule: its comment identifies it; the counter is the packets it matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedRule {
    pub handle: u64,
    pub comment: Option<String>,
    /// Expression names in order, e.g. `["meta", "cmp", "payload", "cmp", "counter", "immediate"]`.
    pub expressions: Vec<String>,
    pub packets: Option<u64>,
    pub bytes: Option<u64>,
}

/// One set: its size always, its members on request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedSet {
    pub name: String,
    pub key_type: u32,
    pub key_len: u32,
    /// The size the set was created with (its capacity), when it has one.
    pub size: Option<u32>,
    pub elements: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<BTreeSet<MacAddr>>,
    /// Elements whose key is not a valid node MAC (should never happen; counted, not hidden).
    #[serde(skip_serializing_if = "is_zero")]
    pub invalid_members: usize,
    /// For a set with element timeouts (the lease): the soonest expiry among its live elements, milliseconds from
    /// the read. The kernel lists only elements that have not expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The kernel state of a host, as far as ironguard is concerned: the request side (`inet`) and, where egress
/// interfaces are configured, the reply side (`netdev`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Observed {
    pub guard: Option<ObservedTable>,
    pub owned: Option<ObservedTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_guard: Option<ObservedTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_owned: Option<ObservedTable>,
}

/// The one-line answer to "does this host serve DHCP, and could it?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Leader,
    /// The leader's rules are in place but its kernel lease has expired: the kernel marks nothing.
    Fenced,
    Follower,
    Blocked,
    Closed,
    Unguarded,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Leader => "LEADER",
            Verdict::Fenced => "FENCED (leader rules, kernel lease expired: nobody is served)",
            Verdict::Follower => "FOLLOWER",
            Verdict::Blocked => "BLOCKED",
            Verdict::Closed => "CLOSED (agent absent, guard present)",
            Verdict::Unguarded => "UNGUARDED (the guard table is missing or does not drop!)",
        })
    }
}

impl ObservedTable {
    pub fn chain(&self, name: &str) -> Option<&ObservedChain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&ObservedSet> {
        self.sets.iter().find(|s| s.name == name)
    }

    fn has_rule(&self, chain: &str, comment: &str) -> bool {
        self.chain(chain).is_some_and(|c| c.rules.iter().any(|r| r.comment.as_deref() == Some(comment)))
    }

    /// The mode the agent's table is in, judged from its rules.
    pub fn mode(&self) -> Mode {
        if self.has_rule("pxe", comments::BLOCKED) || self.chain("pxe").is_none() {
            Mode::Blocked
        } else if self.has_rule("whitelist", comments::ALLOW_MAC) || self.has_rule("whitelist", comments::ALLOW_CHADDR)
        {
            Mode::Leader
        } else {
            Mode::Follower
        }
    }

    /// Whether the pass rule (leader, unknown MACs allowed) is present.
    pub fn has_pass_rule(&self) -> bool {
        self.has_rule("blacklist", comments::PASS)
    }

    /// Milliseconds until the kernel lease expires, if it is live (an element of the lease set exists).
    pub fn lease_expires_in_ms(&self) -> Option<u64> {
        self.set(LEASE_SET).filter(|s| s.elements > 0).map(|s| s.expires_in_ms.unwrap_or(u64::MAX))
    }

    /// For the guard table: whether it drops unmarked DHCP, i.e. has at least one base chain and every base
    /// chain holds its drop rules. A flushed or emptied guard does not.
    pub fn guard_drops(&self) -> bool {
        let bases: Vec<&ObservedChain> = self.chains.iter().filter(|c| c.hook.is_some()).collect();
        !bases.is_empty()
            && bases.iter().all(|c| c.rules.iter().any(|r| r.comment.as_deref() == Some(comments::GUARD_DROP)))
    }

    /// What is wrong with this guard table, on `side`, for `config` (empty: it is installed as configured).
    pub fn guard_problems(&self, side: Side, config: &crate::RulesetConfig) -> Vec<String> {
        let mut problems = Vec::new();
        let fam = side.family_name();
        let want_rules = side.rules_per_base_chain(config);
        for name in side.base_chains(config) {
            match self.chain(name) {
                None => problems.push(format!("guard base chain {fam} {name} is missing")),
                Some(c) => {
                    let drops = c.rules.iter().filter(|r| r.comment.as_deref() == Some(comments::GUARD_DROP)).count();
                    if drops != want_rules || c.rules.len() != want_rules {
                        problems.push(format!(
                            "guard base chain {fam} {} has {} rules ({drops} drop rules), {want_rules} configured",
                            c.name,
                            c.rules.len()
                        ));
                    }
                    if let Some(p) = device_problem(side, c, config) {
                        problems.push(format!("guard base chain {fam} {name}: {p}"));
                    }
                }
            }
        }
        problems
    }
}

/// On the reply side: whether the egress chain is bound to the configured devices: none other, and every one that
/// exists now. (Before Linux 6.16 the kernel unbinds a chain from a device that goes away and does not bind it
/// again when the device comes back; since 6.16 it keeps the names, including those of absent devices. A device
/// that does not exist now has no traffic to filter and cannot be bound before 6.16, so its absence is no problem.)
fn device_problem(side: Side, c: &ObservedChain, config: &crate::RulesetConfig) -> Option<String> {
    device_problem_with(side, c, config, |d| nix::net::if_::if_nametoindex(d).is_ok())
}

fn device_problem_with(
    side: Side,
    c: &ObservedChain,
    config: &crate::RulesetConfig,
    exists: impl Fn(&str) -> bool,
) -> Option<String> {
    if side != Side::Replies {
        return None;
    }
    let have: BTreeSet<&str> = c.devices.iter().map(String::as_str).collect();
    let want: BTreeSet<&str> = config.egress_interfaces.iter().map(String::as_str).collect();
    let foreign = have.difference(&want).next().is_some();
    let unbound = want.difference(&have).any(|d| exists(d));
    (foreign || unbound).then(|| format!("bound to devices {have:?}, {want:?} configured"))
}

impl Observed {
    /// The guard and the agent's table of one side.
    pub fn side(&self, side: Side) -> (Option<&ObservedTable>, Option<&ObservedTable>) {
        match side {
            Side::Requests => (self.guard.as_ref(), self.owned.as_ref()),
            Side::Replies => (self.egress_guard.as_ref(), self.egress_owned.as_ref()),
        }
    }

    /// The sides that have a table in the kernel.
    pub fn present_sides(&self) -> Vec<Side> {
        Side::ALL
            .into_iter()
            .filter(|&s| {
                let (g, o) = self.side(s);
                g.is_some() || o.is_some()
            })
            .collect()
    }

    /// The verdict: a missing guard is reported first because it is the dangerous state. With both sides present
    /// (requests and replies), the more open of the two is reported; no table at all is [`Verdict::Unguarded`].
    pub fn verdict(&self) -> Verdict {
        let verdicts: Vec<Verdict> = self.present_sides().into_iter().map(|s| self.side_verdict(s)).collect();
        const OPENNESS: [Verdict; 6] = [
            Verdict::Unguarded,
            Verdict::Leader,
            Verdict::Fenced,
            Verdict::Follower,
            Verdict::Blocked,
            Verdict::Closed,
        ];
        OPENNESS.into_iter().find(|v| verdicts.contains(v)).unwrap_or(Verdict::Unguarded)
    }

    /// The verdict of one side's pair of tables.
    pub fn side_verdict(&self, side: Side) -> Verdict {
        match self.side(side) {
            (None, _) => Verdict::Unguarded,
            (Some(g), _) if !g.guard_drops() => Verdict::Unguarded,
            (Some(_), None) => Verdict::Closed,
            (Some(_), Some(t)) => match t.mode() {
                Mode::Leader if t.lease_expires_in_ms().is_none() => Verdict::Fenced,
                Mode::Leader => Verdict::Leader,
                Mode::Follower => Verdict::Follower,
                Mode::Blocked => Verdict::Blocked,
            },
        }
    }

    /// What is wrong with the guards for `config`, every side it uses (empty: installed as configured).
    pub fn guard_problems(&self, config: &crate::RulesetConfig) -> Vec<String> {
        let mut out = Vec::new();
        for side in Side::for_config(config) {
            match self.side(side).0 {
                None => out.push(format!("guard table {} {GUARD_TABLE} is missing", side.family_name())),
                Some(g) => out.extend(g.guard_problems(side, config)),
            }
        }
        out
    }

    /// [`Observed::drift`] against what a dataplane committed, if it committed anything.
    pub fn drift_from(&self, committed: Option<&DesiredState>) -> Vec<String> {
        match committed {
            Some(d) => self.drift(d),
            None => vec!["nothing committed yet".to_string()],
        }
    }

    /// Differences between what the kernel holds and `desired`. Empty means no drift. Set members are compared
    /// only if they were read (`observe(true)`); otherwise sizes are compared.
    pub fn drift(&self, desired: &DesiredState) -> Vec<String> {
        let mut out = self.guard_problems(&desired.config);
        for side in Side::for_config(&desired.config) {
            self.side_drift(side, desired, &mut out);
        }
        out
    }

    fn side_drift(&self, side: Side, desired: &DesiredState, out: &mut Vec<String>) {
        let fam = side.family_name();
        let Some(t) = self.side(side).1 else {
            out.push(format!("table {fam} {OWNED_TABLE} is missing"));
            return;
        };
        if t.mode() != desired.mode {
            out.push(format!("{fam}: mode is {} in the kernel, {} desired", t.mode(), desired.mode));
        }
        if desired.mode == Mode::Leader {
            let want_pass = desired.unknown_mac_policy == UnknownMacPolicy::Allow;
            if t.has_pass_rule() != want_pass {
                out.push(format!(
                    "{fam}: pass rule present={} but unknown-MAC policy is {}",
                    t.has_pass_rule(),
                    desired.unknown_mac_policy
                ));
            }
        }
        for chain in ["pxe", "whitelist", "blacklist"] {
            if t.chain(chain).is_none() {
                out.push(format!("{fam}: chain {chain} is missing"));
            }
        }
        if t.set(LEASE_SET).is_none() {
            out.push(format!("{fam}: set {LEASE_SET} is missing"));
        }
        let want = side.rules_per_base_chain(&desired.config);
        for name in side.base_chains(&desired.config) {
            match t.chain(name) {
                None => out.push(format!("{fam}: base chain {name} is missing")),
                Some(c) if c.rules.len() != want => {
                    out.push(format!("{fam}: base chain {} has {} rules, {want} expected", c.name, c.rules.len()))
                }
                Some(c) => {
                    if let Some(p) = device_problem(side, c, &desired.config) {
                        out.push(format!("{fam}: base chain {name}: {p}"));
                    }
                }
            }
        }
        for k in side.set_kinds(&desired.config) {
            let want = if k.is_allow() { &desired.allow } else { &desired.deny };
            match t.set(k.name()) {
                None => out.push(format!("{fam}: set {} is missing", k.name())),
                Some(s) => {
                    if s.elements != want.len() {
                        out.push(format!(
                            "{fam}: set {} holds {} elements, {} desired",
                            k.name(),
                            s.elements,
                            want.len()
                        ));
                    }
                    if let Some(members) = &s.members {
                        let missing = want.difference(members).count();
                        let extra = members.difference(want).count();
                        if missing + extra > 0 {
                            out.push(format!("{fam}: set {}: {missing} missing, {extra} unexpected", k.name()));
                        }
                    }
                }
            }
        }
    }
}

/// Reads both tables. Retries when the ruleset changes during the read, so the result is one generation.
pub fn observe(with_members: bool) -> Result<Observed, NftError> {
    let sock = DumpSocket::open()?;
    const ATTEMPTS: u32 = 5;
    for _ in 0..ATTEMPTS {
        let before = sock.generation()?;
        let Some(tables) = read_tables(&sock)? else {
            continue;
        };
        let mut observed = Observed::default();
        let mut consistent = true;
        for mut t in tables {
            match read_contents(&sock, &mut t, with_members) {
                Ok(Dumped::Complete) => {}
                Ok(Dumped::Interrupted) => consistent = false,
                // The table vanished between the listing and this dump (its owner exited): read again.
                Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => {
                    consistent = false;
                    continue;
                }
                Err(e) => return Err(e),
            }
            match (t.family.as_str(), t.name == GUARD_TABLE) {
                ("netdev", true) => observed.egress_guard = Some(t),
                ("netdev", false) => observed.egress_owned = Some(t),
                (_, true) => observed.guard = Some(t),
                (_, false) => observed.owned = Some(t),
            }
        }
        if consistent && sock.generation()? == before {
            return Ok(observed);
        }
    }
    Err(NftError::Unstable(ATTEMPTS))
}

/// Whether this host's table currently lets DHCP through for someone: the whitelist's marking rules or the pass
/// rule are present (Leader) *and* the kernel lease is live (an unexpired element in the lease set). Two small
/// dumps of the agent's table: cheap enough to sample every few milliseconds. No table: nothing can be open.
pub fn leader_rules_present() -> Result<bool, NftError> {
    let sock = DumpSocket::open()?;
    for side in Side::ALL {
        if side_open(&sock, side.nfproto())? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// [`leader_rules_present`] for the agent's table of one family.
fn side_open(sock: &DumpSocket, family: u8) -> Result<bool, NftError> {
    let mut open = false;
    let d = sock.dump(NFT_MSG_GETRULE, family, &[(1, OWNED_TABLE)], &mut |m| {
        for a in m.nft_attrs()? {
            let (ty, v) = a?;
            if ty == 7 {
                if let Some(c) = parse_comment(v) {
                    if c == comments::ALLOW_MAC || c == comments::ALLOW_CHADDR || c == comments::PASS {
                        open = true;
                    }
                }
            }
        }
        Ok(())
    });
    match d {
        Ok(Dumped::Complete) => {}
        Ok(Dumped::Interrupted) => return Err(NftError::Unstable(1)),
        Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => return Ok(false),
        Err(e) => return Err(e),
    }
    if !open {
        return Ok(false);
    }
    let mut live = 0usize;
    let d = sock.dump(NFT_MSG_GETSETELEM, family, &[(1, OWNED_TABLE), (2, LEASE_SET)], &mut |m| {
        for a in m.nft_attrs()? {
            let (ty, v) = a?;
            if ty == 3 {
                live += Attrs::new(v).count();
            }
        }
        Ok(())
    });
    match d {
        Ok(Dumped::Complete) => Ok(live > 0),
        Ok(Dumped::Interrupted) => Err(NftError::Unstable(1)),
        // The table went away between the two dumps: closed.
        Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The members of one set of the agent's table (cheap compared with [`observe`]: one dump of one set).
pub fn set_members(set: &str) -> Result<BTreeSet<MacAddr>, NftError> {
    let sock = DumpSocket::open()?;
    let mut members = BTreeSet::new();
    let d = sock.dump(NFT_MSG_GETSETELEM, NFPROTO_INET, &[(1, OWNED_TABLE), (2, set)], &mut |m| {
        for a in m.nft_attrs()? {
            let (ty, v) = a?;
            if ty != 3 {
                continue;
            }
            for elem in Attrs::new(v) {
                let (_, ev) = elem?;
                if let Some(mac) = element_key(ev) {
                    members.insert(mac);
                }
            }
        }
        Ok(())
    })?;
    match d {
        Dumped::Complete => Ok(members),
        Dumped::Interrupted => Err(NftError::Unstable(1)),
    }
}

/// The MAC key of one set element attribute, if it is a valid node MAC.
pub(crate) fn element_key(elem: &[u8]) -> Option<MacAddr> {
    Attrs::new(elem)
        .flatten()
        .find(|(t, _)| *t == 1)
        .and_then(|(_, kv)| Attrs::new(kv).flatten().find(|(t, _)| *t == 1))
        .and_then(|(_, data)| <[u8; 6]>::try_from(data.get(..6)?).ok())
        .and_then(|o| MacAddr::from_octets(o).ok())
}

// The decoders below turn one message of a dump into what the read-back keeps. They are pure (bytes in, values
// out) so that they are tested on arbitrary and mangled kernel messages; a malformed message is an error, never a
// panic.

/// One table of an `NFT_MSG_GETTABLE` dump, without its contents.
pub(crate) fn decode_table(m: &Message<'_>) -> Result<ObservedTable, NftError> {
    let (mut name, mut flags, mut owner) = (String::new(), 0, None);
    for a in m.nft_attrs()? {
        let (ty, v) = a?;
        match ty {
            1 => name = netlink::string(v),
            2 => flags = be_u32(v).unwrap_or(0),
            7 => owner = be_u32(v),
            _ => {}
        }
    }
    let owner_portid = if flags & NFT_TABLE_F_OWNER != 0 { owner } else { None };
    let family = family_name(m.payload.first().copied().unwrap_or(NFPROTO_INET));
    Ok(ObservedTable { name, family, flags, owner_portid, chains: vec![], sets: vec![] })
}

fn family_name(nfproto: u8) -> String {
    match Side::of_nfproto(nfproto) {
        Some(side) => side.family_name().to_string(),
        None => format!("family {nfproto}"),
    }
}

/// One chain of an `NFT_MSG_GETCHAIN` dump and the name of its table.
pub(crate) fn decode_chain(m: &Message<'_>) -> Result<(String, ObservedChain), NftError> {
    let (mut tname, mut name, mut hook, mut priority) = (String::new(), String::new(), None, None);
    let mut devices = Vec::new();
    let netdev = m.payload.first() == Some(&Side::Replies.nfproto());
    for a in m.nft_attrs()? {
        let (ty, v) = a?;
        match ty {
            1 => tname = netlink::string(v),
            3 => name = netlink::string(v),
            4 => {
                for h in Attrs::new(v) {
                    let (hty, hv) = h?;
                    match hty {
                        1 => {
                            hook = be_u32(hv).map(|n| match (netdev, n) {
                                (false, 1) => "input".to_string(),
                                (false, 2) => "forward".to_string(),
                                (true, 0) => "ingress".to_string(),
                                (true, 1) => EGRESS_CHAIN.to_string(),
                                (_, n) => format!("hook {n}"),
                            })
                        }
                        2 => priority = be_u32(hv).map(|p| p as i32),
                        // NFTA_HOOK_DEV (one device), NFTA_HOOK_DEVS (a list of NFTA_DEVICE_NAME)
                        3 => devices.push(netlink::string(hv)),
                        4 => {
                            for d in Attrs::new(hv) {
                                let (_, dv) = d?;
                                devices.push(netlink::string(dv));
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    devices.sort();
    devices.dedup(); // a chain on one device is reported as NFTA_HOOK_DEV and as NFTA_HOOK_DEVS
    Ok((tname, ObservedChain { name, hook, priority, devices, rules: vec![] }))
}

/// One rule of an `NFT_MSG_GETRULE` dump and the names of its table and chain.
pub(crate) fn decode_rule(m: &Message<'_>) -> Result<(String, String, ObservedRule), NftError> {
    let mut chain = String::new();
    let mut rule = ObservedRule { handle: 0, comment: None, expressions: vec![], packets: None, bytes: None };
    let mut tname = String::new();
    for a in m.nft_attrs()? {
        let (ty, v) = a?;
        match ty {
            1 => tname = netlink::string(v),
            2 => chain = netlink::string(v),
            3 => rule.handle = be_u64(v).unwrap_or(0),
            4 => {
                for e in Attrs::new(v) {
                    let (_, ev) = e?;
                    let mut name = String::new();
                    let mut data: &[u8] = &[];
                    for ea in Attrs::new(ev) {
                        let (ety, eval) = ea?;
                        match ety {
                            1 => name = netlink::string(eval),
                            2 => data = eval,
                            _ => {}
                        }
                    }
                    if name == "counter" {
                        for ca in Attrs::new(data) {
                            let (cty, cv) = ca?;
                            match cty {
                                1 => rule.bytes = be_u64(cv),
                                2 => rule.packets = be_u64(cv),
                                _ => {}
                            }
                        }
                    }
                    rule.expressions.push(name);
                }
            }
            7 => rule.comment = parse_comment(v),
            _ => {}
        }
    }
    Ok((tname, chain, rule))
}

/// One set of an `NFT_MSG_GETSET` dump (no elements yet) and the name of its table.
pub(crate) fn decode_set(m: &Message<'_>) -> Result<(String, ObservedSet), NftError> {
    let mut s = ObservedSet {
        name: String::new(),
        key_type: 0,
        key_len: 0,
        size: None,
        elements: 0,
        members: None,
        invalid_members: 0,
        expires_in_ms: None,
    };
    let mut tname = String::new();
    for a in m.nft_attrs()? {
        let (ty, v) = a?;
        match ty {
            1 => tname = netlink::string(v),
            2 => s.name = netlink::string(v),
            4 => s.key_type = be_u32(v).unwrap_or(0),
            5 => s.key_len = be_u32(v).unwrap_or(0),
            9 => {
                for d in Attrs::new(v) {
                    let (dty, dv) = d?;
                    if dty == 1 {
                        s.size = be_u32(dv);
                    }
                }
            }
            _ => {}
        }
    }
    Ok((tname, s))
}

/// What the elements of one set add up to, over the messages of its `NFT_MSG_GETSETELEM` dump.
#[derive(Debug, Default)]
pub(crate) struct ElementTally {
    pub(crate) count: usize,
    pub(crate) invalid: usize,
    /// The soonest expiry among the elements that have one, milliseconds.
    pub(crate) expires: Option<u64>,
    pub(crate) members: BTreeSet<MacAddr>,
}

impl ElementTally {
    /// Adds the elements of one message; with `keys`, also their MAC keys (counting those that are not a node MAC).
    pub(crate) fn add(&mut self, m: &Message<'_>, keys: bool) -> Result<(), NftError> {
        for a in m.nft_attrs()? {
            let (ty, v) = a?;
            if ty != 3 {
                continue;
            }
            for elem in Attrs::new(v) {
                let (_, ev) = elem?;
                self.count += 1;
                if let Some(ms) = Attrs::new(ev).flatten().find(|(t, _)| *t == 5).and_then(|(_, x)| be_u64(x)) {
                    self.expires = Some(self.expires.map_or(ms, |e| e.min(ms)));
                }
                if !keys {
                    continue;
                }
                match element_key(ev) {
                    Some(mac) => {
                        self.members.insert(mac);
                    }
                    None => self.invalid += 1,
                }
            }
        }
        Ok(())
    }
}

/// Reads only whether each table exists (cheap; for status checks).
pub(crate) fn read_tables(sock: &DumpSocket) -> Result<Option<Vec<ObservedTable>>, NftError> {
    let mut tables = Vec::new();
    let done = sock.dump(NFT_MSG_GETTABLE, NFPROTO_UNSPEC, &[], &mut |m| {
        let t = decode_table(m)?;
        let ours = t.family == "inet" || t.family == "netdev";
        if ours && (t.name == GUARD_TABLE || t.name == OWNED_TABLE) {
            tables.push(t);
        }
        Ok(())
    })?;
    Ok(matches!(done, Dumped::Complete).then_some(tables))
}

fn read_contents(sock: &DumpSocket, t: &mut ObservedTable, with_members: bool) -> Result<Dumped, NftError> {
    let table = t.name.clone();
    let family = if t.family == "netdev" { Side::Replies.nfproto() } else { NFPROTO_INET };
    let mut interrupted = false;
    let mut chains = Vec::new();
    let d = sock.dump(NFT_MSG_GETCHAIN, family, &[], &mut |m| {
        let (tname, chain) = decode_chain(m)?;
        if tname == table {
            chains.push(chain);
        }
        Ok(())
    })?;
    interrupted |= matches!(d, Dumped::Interrupted);

    let mut rules: Vec<(String, ObservedRule)> = Vec::new();
    let d = sock.dump(NFT_MSG_GETRULE, family, &[(1, table.as_str())], &mut |m| {
        let (tname, chain, rule) = decode_rule(m)?;
        if tname == table {
            rules.push((chain, rule));
        }
        Ok(())
    })?;
    interrupted |= matches!(d, Dumped::Interrupted);
    for (chain, rule) in rules {
        if let Some(c) = chains.iter_mut().find(|c| c.name == chain) {
            c.rules.push(rule);
        }
    }
    t.chains = chains;

    let mut sets = Vec::new();
    let d = sock.dump(NFT_MSG_GETSET, family, &[(1, table.as_str())], &mut |m| {
        let (tname, set) = decode_set(m)?;
        if tname == table {
            sets.push(set);
        }
        Ok(())
    })?;
    interrupted |= matches!(d, Dumped::Interrupted);
    for s in &mut sets {
        let mut tally = ElementTally::default();
        let keys = with_members && s.name != LEASE_SET;
        let d = sock.dump(NFT_MSG_GETSETELEM, family, &[(1, table.as_str()), (2, s.name.as_str())], &mut |m| {
            tally.add(m, keys)
        })?;
        interrupted |= matches!(d, Dumped::Interrupted);
        s.elements = tally.count;
        s.invalid_members = tally.invalid;
        s.expires_in_ms = tally.expires;
        if with_members {
            s.members = Some(tally.members);
        }
    }
    t.sets = sets;
    Ok(if interrupted { Dumped::Interrupted } else { Dumped::Complete })
}

/// What one host's tables do with one MAC's DHCP packets, as the inputs of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacInputs {
    /// The guard table is present and drops unmarked DHCP.
    pub guarded: bool,
    /// The agent's table (None: absent — the agent is not running, or its table was deleted with its socket).
    pub mode: Option<Mode>,
    /// The leader's kernel lease is live (its marking rules match).
    pub lease_live: bool,
    pub in_allow: bool,
    pub in_deny: bool,
    pub policy: UnknownMacPolicy,
}

/// The rule that decides, and what it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacDecision {
    /// The host's dnsmasq gets the packet.
    pub served: bool,
    /// The deciding rule's comment and where it sits, e.g. `ironguard:allow-mac (inet ironguard whitelist)`.
    pub rule: String,
    /// Why, in words.
    pub why: String,
}

/// The path a DHCP packet from (or, relayed, for) a MAC takes through the guard and the agent's table, as
/// [`crate::ruleset`] builds them: pxe (blocked?) → whitelist (allow set, leader with a live lease) → blacklist
/// (deny set, then the pass rule of a leader with unknown MACs allowed) → not marked → the guard drops what is not
/// marked. For relayed requests the `-chaddr` twins of the allow/deny rules decide in the same places.
pub fn decide(i: MacInputs) -> MacDecision {
    let d = |served: bool, comment: &str, chain: &str, why: String| MacDecision {
        served,
        rule: format!("{comment} ({chain})"),
        why,
    };
    let owned = |chain: &str| format!("inet {OWNED_TABLE} {chain}");
    if !i.guarded {
        return d(
            true,
            "none",
            &format!("inet {GUARD_TABLE}"),
            "the guard table is missing or does not drop: DHCP is UNFILTERED on this host".into(),
        );
    }
    let guard_drop = |why: String| d(false, comments::GUARD_DROP, &format!("inet {GUARD_TABLE}"), why);
    let Some(mode) = i.mode else {
        return guard_drop("the agent's table is absent (agent not running): the guard drops all DHCP".into());
    };
    match mode {
        Mode::Blocked => d(false, comments::BLOCKED, &owned("pxe"), "the agent is Blocked: it drops all DHCP".into()),
        Mode::Leader if i.lease_live && i.in_allow => {
            d(true, comments::ALLOW_MAC, &owned("whitelist"), "allowed: in the allow set of the leader".into())
        }
        _ if i.in_deny => d(false, comments::DENY_MAC, &owned("blacklist"), "denied: in the deny set".into()),
        Mode::Leader if i.lease_live && i.policy == UnknownMacPolicy::Allow => {
            d(true, comments::PASS, &owned("blacklist"), "unknown MAC, and the unknown-MAC policy allows it".into())
        }
        Mode::Leader if !i.lease_live => d(
            false,
            comments::NOT_MARKED,
            &owned("pxe"),
            "the leader's kernel lease has ended (fenced): its marking rules match nothing".into(),
        ),
        Mode::Leader => {
            d(false, comments::NOT_MARKED, &owned("pxe"), "unknown MAC, and the unknown-MAC policy denies it".into())
        }
        Mode::Follower => d(
            false,
            comments::NOT_MARKED,
            &owned("pxe"),
            "this host is a follower: only the elected leader marks DHCP".into(),
        ),
    }
}

impl Observed {
    /// The inputs of [`decide`] for `mac`, from what the kernel holds: the request side's tables, or the reply
    /// side's where only those exist (keyed by chaddr). Set members must have been read (`observe(true)`); without
    /// them the MAC counts as in neither set.
    pub fn mac_inputs(&self, mac: MacAddr) -> MacInputs {
        let member = |t: &ObservedTable, k: SetKind| {
            t.set(k.name()).and_then(|s| s.members.as_ref()).is_some_and(|m| m.contains(&mac))
        };
        let side = if self.present_sides() == [Side::Replies] { Side::Replies } else { Side::Requests };
        let (guard, owned) = self.side(side);
        let (allow, deny) = match side {
            Side::Requests => (SetKind::AllowMac, SetKind::DenyMac),
            Side::Replies => (SetKind::AllowChaddr, SetKind::DenyChaddr),
        };
        MacInputs {
            guarded: guard.is_some_and(|g| g.guard_drops()),
            mode: owned.map(|t| t.mode()),
            lease_live: owned.and_then(|t| t.lease_expires_in_ms()).is_some(),
            in_allow: owned.is_some_and(|t| member(t, allow)),
            in_deny: owned.is_some_and(|t| member(t, deny)),
            policy: if owned.is_some_and(|t| t.has_pass_rule()) {
                UnknownMacPolicy::Allow
            } else {
                UnknownMacPolicy::Deny
            },
        }
    }
}

#[cfg(test)]
mod decide_tests {
    use super::*;

    fn inputs(mode: Option<Mode>) -> MacInputs {
        MacInputs {
            guarded: true,
            mode,
            lease_live: true,
            in_allow: false,
            in_deny: false,
            policy: UnknownMacPolicy::Deny,
        }
    }

    #[test]
    fn only_a_leader_with_a_live_lease_serves_and_the_rule_is_named() {
        let leader = inputs(Some(Mode::Leader));
        let allowed = decide(MacInputs { in_allow: true, ..leader });
        assert!(allowed.served && allowed.rule.starts_with(comments::ALLOW_MAC), "{allowed:?}");
        // allowed and denied: the whitelist comes first
        assert!(decide(MacInputs { in_allow: true, in_deny: true, ..leader }).served);
        let denied = decide(MacInputs { in_deny: true, policy: UnknownMacPolicy::Allow, ..leader });
        assert!(!denied.served && denied.rule.starts_with(comments::DENY_MAC), "{denied:?}");
        let pass = decide(MacInputs { policy: UnknownMacPolicy::Allow, ..leader });
        assert!(pass.served && pass.rule.starts_with(comments::PASS), "{pass:?}");
        let closed = decide(leader);
        assert!(!closed.served && closed.rule.starts_with(comments::NOT_MARKED), "{closed:?}");
        for fenced in [
            MacInputs { in_allow: true, lease_live: false, ..leader },
            MacInputs { policy: UnknownMacPolicy::Allow, lease_live: false, ..leader },
        ] {
            let f = decide(fenced);
            assert!(!f.served && f.why.contains("fenced"), "{f:?}");
        }
        for mode in [Some(Mode::Follower), Some(Mode::Blocked), None] {
            let any = MacInputs { in_allow: true, policy: UnknownMacPolicy::Allow, ..inputs(mode) };
            assert!(!decide(any).served, "{mode:?} never serves");
        }
        assert!(decide(MacInputs { mode: None, ..inputs(None) }).rule.starts_with(comments::GUARD_DROP));
        let unguarded = decide(MacInputs { guarded: false, ..inputs(Some(Mode::Follower)) });
        assert!(unguarded.served && unguarded.why.contains("UNFILTERED"), "{unguarded:?}");
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    fn chain(devices: &[&str]) -> ObservedChain {
        ObservedChain {
            name: "egress".into(),
            hook: Some("egress".into()),
            priority: Some(0),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            rules: vec![],
        }
    }

    #[test]
    fn an_egress_chain_must_be_bound_to_every_configured_device_that_exists() {
        let config = crate::RulesetConfig {
            hooks: vec![],
            egress_interfaces: vec!["br0".into(), "s0".into()],
            ..Default::default()
        };
        let all = |_: &str| true;
        let no_br0 = |d: &str| d != "br0";
        let problem = |devices: &[&str], exists: &dyn Fn(&str) -> bool| {
            device_problem_with(Side::Replies, &chain(devices), &config, exists)
        };
        assert_eq!(problem(&["br0", "s0"], &all), None);
        // Before 6.16: br0 was deleted and created again; the kernel bound the chain to s0 only.
        assert!(problem(&["s0"], &all).is_some_and(|p| p.contains("\"br0\", \"s0\"")));
        // br0 is gone: nothing to bind (before 6.16 the kernel could not), nothing to repair.
        assert_eq!(problem(&["s0"], &no_br0), None);
        // Since 6.16 the kernel keeps the name of a device that is gone.
        assert_eq!(problem(&["br0", "s0"], &no_br0), None);
        // A device that is no longer configured.
        assert!(problem(&["br0", "s0", "old0"], &all).is_some());
        // The request side has no devices.
        assert_eq!(device_problem_with(Side::Requests, &chain(&[]), &config, all), None);
    }
}
