//! Read-back: what the kernel really holds in the guard table and the agent's table, read over netlink from any
//! process (the owner socket is not needed), plus the verdict line and a drift check against a desired state.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dataplane::ProbeCounts;
use crate::model::{DesiredState, Mode, UnknownMacPolicy};
use crate::netlink::{
    self, Attrs, DumpSocket, Dumped, Message, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE, be_u32, be_u64,
};
use crate::rule::{self, DhcpMessage, Stmt};
use crate::ruleset::{
    BuiltChain, EGRESS_CHAIN, GUARD_TABLE, LEASE_SET, OWNED_TABLE, SEEN_SIZE, SEEN_TIMEOUT_MS, SeenKind, SetKind, Side,
    comments, guard_rules, owned_rules, parse_comment,
};
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

/// One rule: what it does (its expressions decoded into statements), its comment (which names its role for
/// people, and decides nothing) and its counter (the packets it matched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedRule {
    pub handle: u64,
    pub comment: Option<String>,
    /// What the rule does, e.g. `[udp, port {dport 67}, counter, jump "pxe"]`.
    #[serde(default)]
    pub statements: Vec<Stmt>,
    pub packets: Option<u64>,
    pub bytes: Option<u64>,
}

impl ObservedRule {
    /// The statements as one line of nft-like text.
    pub fn text(&self) -> String {
        rule::text(&self.statements)
    }
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

    /// The chains a DHCP packet entering `pxe` can reach before a rule there drops or accepts every packet:
    /// `pxe` ends at its first unconditional drop or accept, and only the chains it jumps to before that count.
    fn reachable_from_pxe(&self) -> Vec<&ObservedChain> {
        let Some(pxe) = self.chain("pxe") else {
            return vec![];
        };
        let mut out = Vec::new();
        for r in &pxe.rules {
            match rule::verdict(&r.statements) {
                Some(Stmt::Jump(c)) => out.extend(self.chain(c)),
                Some(Stmt::Drop | Stmt::Accept) if rule::unconditional(&r.statements) => break,
                _ => {}
            }
        }
        out
    }

    /// The mode the agent's table is in, judged from what its rules do: Blocked when `pxe` drops every packet
    /// before jumping anywhere (or is missing), Leader when a chain `pxe` reaches holds a rule that marks and
    /// accepts, Follower otherwise. Comments play no part.
    pub fn mode(&self) -> Mode {
        let reachable = self.reachable_from_pxe();
        if reachable.is_empty() {
            Mode::Blocked
        } else if reachable.iter().any(|c| c.rules.iter().any(|r| rule::marks(&r.statements))) {
            Mode::Leader
        } else {
            Mode::Follower
        }
    }

    /// Whether the pass rule is present: a rule reachable from `pxe` that marks and accepts packets whatever their
    /// address (a leader whose unknown-MAC policy is allow).
    pub fn has_pass_rule(&self) -> bool {
        self.reachable_from_pxe()
            .iter()
            .any(|c| c.rules.iter().any(|r| rule::marks(&r.statements) && !rule::keyed(&r.statements)))
    }

    /// Milliseconds until the kernel lease expires, if it is live (an element of the lease set exists).
    pub fn lease_expires_in_ms(&self) -> Option<u64> {
        self.set(LEASE_SET).filter(|s| s.elements > 0).map(|s| s.expires_in_ms.unwrap_or(u64::MAX))
    }

    /// For the guard table: whether it drops unmarked DHCP, judged from what its rules do: it has at least one
    /// base chain, every base chain holds a rule that drops packets without the mark, and none accepts. A flushed
    /// or emptied guard does not, nor one whose drop rule was edited to accept.
    pub fn guard_drops(&self) -> bool {
        let bases: Vec<&ObservedChain> = self.chains.iter().filter(|c| c.hook.is_some()).collect();
        !bases.is_empty()
            && bases.iter().all(|c| {
                c.rules.iter().any(|r| rule::drops_unmarked(&r.statements))
                    && !c.rules.iter().any(|r| rule::verdict(&r.statements) == Some(&Stmt::Accept))
            })
    }

    /// What is wrong with this guard table, on `side`, for `config` (empty: it is installed as configured): every
    /// base chain hooked as built and holding the rules built for `config`, compared by what they do.
    pub fn guard_problems(&self, side: Side, config: &crate::RulesetConfig) -> Vec<String> {
        let mut problems = Vec::new();
        let fam = side.family_name();
        for b in guard_rules(side, config) {
            let Some(c) = self.chain(b.name) else {
                problems.push(format!("guard base chain {fam} {} is missing", b.name));
                continue;
            };
            if c.rules.len() != b.rules.len() {
                let drops = c.rules.iter().filter(|r| rule::drops_unmarked(&r.statements)).count();
                problems.push(format!(
                    "guard base chain {fam} {} has {} rules ({drops} drop rules), {} configured",
                    c.name,
                    c.rules.len(),
                    b.rules.len()
                ));
            }
            chain_drift(side, c, &b, config, &format!("guard base chain {fam}"), &mut problems);
        }
        problems
    }
}

/// Differences between chain `c` as the kernel holds it and `built`, as ironguard builds it: its hook and priority
/// (and devices) for a base chain, then its rules by what they do. With as many rules on both sides they are
/// compared in order; otherwise the rules missing and the rules not built are named. `what` starts each line.
fn chain_drift(
    side: Side,
    c: &ObservedChain,
    built: &BuiltChain,
    config: &crate::RulesetConfig,
    what: &str,
    out: &mut Vec<String>,
) {
    let name = built.name;
    if let Some((hook, priority)) = built.hook {
        if c.hook.as_deref() != Some(hook) || c.priority != Some(priority) {
            out.push(format!(
                "{what} {name}: hook {} priority {}, hook {hook} priority {priority} built",
                c.hook.as_deref().unwrap_or("none"),
                c.priority.map_or("none".to_string(), |p| p.to_string()),
            ));
        }
        if let Some(p) = device_problem(side, c, config) {
            out.push(format!("{what} {name}: {p}"));
        }
    }
    if c.rules.len() == built.rules.len() {
        for (i, (o, b)) in c.rules.iter().zip(&built.rules).enumerate() {
            if o.statements != b.stmts {
                out.push(format!(
                    "{what} {name}: rule {} is `{}`, `{}` built ({})",
                    i + 1,
                    o.text(),
                    rule::text(&b.stmts),
                    b.comment
                ));
            }
        }
        return;
    }
    let mut unmatched: Vec<&ObservedRule> = c.rules.iter().collect();
    for b in &built.rules {
        match unmatched.iter().position(|o| o.statements == b.stmts) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => out.push(format!("{what} {name}: rule `{}` ({}) is missing", rule::text(&b.stmts), b.comment)),
        }
    }
    for o in unmatched {
        out.push(format!("{what} {name}: rule `{}` was not built by ironguard", o.text()));
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
        for b in owned_rules(side, &desired.config, desired.mode, desired.unknown_mac_policy) {
            let kind = if b.hook.is_some() { "base chain" } else { "chain" };
            match t.chain(b.name) {
                None => out.push(format!("{fam}: {kind} {} is missing", b.name)),
                Some(c) => chain_drift(side, c, &b, &desired.config, &format!("{fam}: {kind}"), out),
            }
        }
        if t.set(LEASE_SET).is_none() {
            out.push(format!("{fam}: set {LEASE_SET} is missing"));
        }
        if side == Side::Requests {
            // The observation sets decide nothing, but the chains that add to them need them: a missing one is
            // drift like any other, repaired by rebuilding the table.
            for k in SeenKind::ALL {
                if t.set(k.set_name()).is_none() {
                    out.push(format!("{fam}: set {} is missing", k.set_name()));
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
    let mut tries = Tries::new();
    while tries.another() {
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
    Err(NftError::Unstable(tries.made))
}

/// How long a reader keeps trying for one generation. A leader rewrites its kernel lease after every keep-alive (a
/// few times a second, more when its writes land late), and each write is a new generation: on a starved host one
/// read can span several writes, so a fixed count of attempts is not enough; a time budget with a floor is.
pub(crate) struct Tries {
    started: std::time::Instant,
    pub(crate) made: u32,
}

impl Tries {
    /// At least this many attempts, however slow each one is.
    const FLOOR: u32 = 5;
    /// Then more until this much time has passed.
    const BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

    pub(crate) fn new() -> Tries {
        Tries { started: std::time::Instant::now(), made: 0 }
    }

    /// Whether to make another attempt (and count it).
    pub(crate) fn another(&mut self) -> bool {
        let go = self.made < Self::FLOOR || self.started.elapsed() < Self::BUDGET;
        if go {
            self.made += 1;
        }
        go
    }
}

/// Whether this host's table currently lets DHCP through for someone: the whitelist's marking rules or the pass
/// rule are present (Leader) *and* the kernel lease is live (an unexpired element in the lease set). Two small
/// dumps of the agent's table. No table: nothing can be open. To read it again and again, [`ServingReader`].
pub fn leader_rules_present() -> Result<bool, NftError> {
    ServingReader::open()?.serving()
}

/// [`leader_rules_present`] read again and again on one socket (the end-to-end tests sample every PXE host's
/// kernel every few milliseconds). The rules change only in a transaction, which moves the ruleset's generation;
/// the lease element also ends on its own, with no transaction. So a read asks the generation first and dumps the
/// rules again only when it moved; the lease set is dumped at every read of a host whose rules mark packets. A host
/// that is not leading costs one small request a read.
#[derive(Debug)]
pub struct ServingReader {
    sock: DumpSocket,
    /// The generation the rules were last dumped at, and for each side whether they mark packets.
    rules: Option<(u32, [bool; 2])>,
}

impl ServingReader {
    pub fn open() -> Result<Self, NftError> {
        Ok(Self { sock: DumpSocket::open()?, rules: None })
    }

    /// One read, as [`leader_rules_present`]. [`NftError::Unstable`] when the ruleset changed during a dump.
    pub fn serving(&mut self) -> Result<bool, NftError> {
        let generation = self.sock.generation()?;
        let marks = match self.rules {
            Some((g, marks)) if g == generation => marks,
            _ => {
                let mut marks = [false; 2];
                for (mark, side) in marks.iter_mut().zip(Side::ALL) {
                    *mark = rules_mark(&self.sock, side.nfproto())?;
                }
                // A transaction between the generation's read and the dumps may show in them: they are kept only
                // when the generation did not move meanwhile (otherwise the next read dumps again).
                self.rules = (self.sock.generation()? == generation).then_some((generation, marks));
                marks
            }
        };
        for (mark, side) in marks.into_iter().zip(Side::ALL) {
            if mark && lease_live(&self.sock, side.nfproto())? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// What the probe rules of the agent's tables counted (both families; a family without the table counts 0):
/// DISCOVERs from `probe` that were let through, and DHCPOFFERs sent. Rules are recognised by what they do.
pub fn probe_counts(probe: MacAddr) -> Result<ProbeCounts, NftError> {
    let sock = DumpSocket::open()?;
    let mut tries = Tries::new();
    while tries.another() {
        if let Some(counts) = probe_counts_once(&sock, probe)? {
            return Ok(counts);
        }
    }
    Err(NftError::Unstable(tries.made))
}

/// One read of [`probe_counts`]; `None` when a dump was interrupted by a change of the ruleset.
fn probe_counts_once(sock: &DumpSocket, probe: MacAddr) -> Result<Option<ProbeCounts>, NftError> {
    let (mut discovers, mut offers) = (0u64, 0u64);
    for side in Side::ALL {
        let d = sock.dump(NFT_MSG_GETRULE, side.nfproto(), &[(1, OWNED_TABLE)], &mut |m| {
            let (table, _, r) = decode_rule(m)?;
            if table != OWNED_TABLE {
                return Ok(());
            }
            let has = |s: &Stmt| r.statements.contains(s);
            let n = r.packets.unwrap_or(0);
            if has(&Stmt::Chaddr(probe)) && has(&Stmt::DhcpType(DhcpMessage::Discover)) {
                discovers += n;
            } else if has(&Stmt::DhcpType(DhcpMessage::Offer)) {
                offers += n;
            }
            Ok(())
        });
        match d {
            Ok(Dumped::Complete) => {}
            Ok(Dumped::Interrupted) => return Ok(None),
            Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(ProbeCounts { discovers, offers }))
}

/// Whether the agent's table of one family has a whitelist or blacklist rule that marks packets (Leader).
fn rules_mark(sock: &DumpSocket, family: u8) -> Result<bool, NftError> {
    let mut marks = false;
    let d = sock.dump(NFT_MSG_GETRULE, family, &[(1, OWNED_TABLE)], &mut |m| {
        let (table, chain, r) = decode_rule(m)?;
        if table == OWNED_TABLE && (chain == "whitelist" || chain == "blacklist") && rule::marks(&r.statements) {
            marks = true;
        }
        Ok(())
    });
    match d {
        Ok(Dumped::Complete) => Ok(marks),
        Ok(Dumped::Interrupted) => Err(NftError::Unstable(1)),
        Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the lease set of the agent's table of one family holds an unexpired element.
fn lease_live(sock: &DumpSocket, family: u8) -> Result<bool, NftError> {
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
        // The table went away since the rules were read: closed.
        Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How often, and how long ago last, the kernel saw one kind of DHCP packet for a MAC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub count: u64,
    pub last_ms_ago: Option<u64>,
}

/// One MAC's DHCP as this host's kernel saw it: requests that reached the filter, requests it let through,
/// replies the local server sent to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacSeen {
    pub mac: MacAddr,
    pub requests: Seen,
    pub passed: Seen,
    pub answers: Seen,
}

impl MacSeen {
    fn get_mut(&mut self, kind: SeenKind) -> &mut Seen {
        match kind {
            SeenKind::Requests => &mut self.requests,
            SeenKind::Passed => &mut self.passed,
            SeenKind::Answers => &mut self.answers,
        }
    }

    /// How long ago the kernel last saw any of the three (`None`: never, as far as the sets remember).
    pub fn last_ms_ago(&self) -> Option<u64> {
        [self.requests, self.passed, self.answers].iter().filter_map(|s| s.last_ms_ago).min()
    }
}

/// One element of an observation set, decoded from an `NFT_MSG_GETSETELEM` dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeenElement {
    /// The chaddr, as the packet carried it (not necessarily a node's address).
    pub(crate) key: [u8; 6],
    /// The element's counter: packets that added or refreshed it.
    pub(crate) packets: u64,
    /// The element's timeout (`None`: not listed, the set's own).
    pub(crate) timeout_ms: Option<u64>,
    /// Milliseconds until it expires.
    pub(crate) expires_ms: Option<u64>,
}

impl SeenElement {
    /// How long ago the last packet refreshed it: its timeout minus what is left of it.
    pub(crate) fn last_ms_ago(&self) -> Option<u64> {
        self.expires_ms.map(|left| self.timeout_ms.unwrap_or(SEEN_TIMEOUT_MS).saturating_sub(left))
    }
}

/// Decodes one `NFTA_LIST_ELEM` of a set-element dump of an observation set: its 6-byte key, its timeout and
/// expiration, and the packets of its counter (`NFTA_SET_ELEM_EXPR`, or the counter among
/// `NFTA_SET_ELEM_EXPRESSIONS`). `None` for an element without a 6-byte key.
pub(crate) fn decode_seen_element(elem: &[u8]) -> Result<Option<SeenElement>, NftError> {
    let mut key = None;
    let (mut packets, mut timeout_ms, mut expires_ms) = (0, None, None);
    for a in Attrs::new(elem) {
        let (ty, v) = a?;
        match ty {
            1 => {
                for k in Attrs::new(v) {
                    let (kty, kv) = k?;
                    if kty == 1 {
                        key = kv.get(..6).and_then(|b| <[u8; 6]>::try_from(b).ok());
                    }
                }
            }
            4 => timeout_ms = be_u64(v),
            5 => expires_ms = be_u64(v),
            7 => packets += counter_packets(v)?,
            10 => {
                for e in Attrs::new(v) {
                    let (_, ev) = e?;
                    packets += counter_packets(ev)?;
                }
            }
            _ => {}
        }
    }
    Ok(key.map(|key| SeenElement { key, packets, timeout_ms, expires_ms }))
}

/// The packets of one expression (`NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`) if it is a counter, else 0.
fn counter_packets(expr: &[u8]) -> Result<u64, NftError> {
    let (mut is_counter, mut packets) = (false, 0);
    for a in Attrs::new(expr) {
        let (ty, v) = a?;
        match ty {
            1 => is_counter = netlink::string(v) == "counter",
            2 => {
                for c in Attrs::new(v) {
                    let (cty, cv) = c?;
                    if cty == 2 {
                        packets = be_u64(cv).unwrap_or(0);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(if is_counter { packets } else { 0 })
}

/// Merges the elements of the three observation sets into one entry per MAC, newest first (by the most recent of
/// the three; then by address). Keys that are not a node's address (zero, broadcast, multicast) are left out.
pub(crate) fn merge_seen(elements: &[(SeenKind, SeenElement)]) -> Vec<MacSeen> {
    let mut by_mac: std::collections::BTreeMap<MacAddr, MacSeen> = std::collections::BTreeMap::new();
    for (kind, e) in elements {
        let Ok(mac) = MacAddr::from_octets(e.key) else { continue };
        let entry = by_mac.entry(mac).or_insert_with(|| MacSeen {
            mac,
            requests: Seen::default(),
            passed: Seen::default(),
            answers: Seen::default(),
        });
        *entry.get_mut(*kind) = Seen { count: e.packets, last_ms_ago: e.last_ms_ago() };
    }
    let mut out: Vec<MacSeen> = by_mac.into_values().collect();
    out.sort_by_key(|m| (m.last_ms_ago().unwrap_or(u64::MAX), m.mac));
    out
}

/// What the kernel saw of each MAC's DHCP lately, from the observation sets of the agent's table
/// ([`SeenKind`]): empty when the table is absent. Retries a dump the ruleset changed under. A set that is full
/// (it records no new address until some expire) is logged.
pub fn dhcp_seen() -> Result<Vec<MacSeen>, NftError> {
    let sock = DumpSocket::open()?;
    let mut tries = Tries::new();
    while tries.another() {
        if let Some(elements) = dhcp_seen_once(&sock)? {
            return Ok(merge_seen(&elements));
        }
    }
    Err(NftError::Unstable(tries.made))
}

/// One read of the three sets; `None` when a dump was interrupted by a change of the ruleset.
fn dhcp_seen_once(sock: &DumpSocket) -> Result<Option<Vec<(SeenKind, SeenElement)>>, NftError> {
    let mut out = Vec::new();
    for kind in SeenKind::ALL {
        let mut n = 0usize;
        let d = sock.dump(NFT_MSG_GETSETELEM, NFPROTO_INET, &[(1, OWNED_TABLE), (2, kind.set_name())], &mut |m| {
            for a in m.nft_attrs()? {
                let (ty, v) = a?;
                if ty != 3 {
                    continue;
                }
                for elem in Attrs::new(v) {
                    let (_, ev) = elem?;
                    n += 1;
                    if let Some(e) = decode_seen_element(ev)? {
                        out.push((kind, e));
                    }
                }
            }
            Ok(())
        });
        match d {
            Ok(Dumped::Complete) => {}
            Ok(Dumped::Interrupted) => return Ok(None),
            // No table (or an older one without the set): nothing seen.
            Err(NftError::Query { errno: nix::errno::Errno::ENOENT, .. }) => {}
            Err(e) => return Err(e),
        }
        if n >= SEEN_SIZE as usize {
            tracing::warn!(set = kind.set_name(), elements = n, "observation set full: new addresses go unrecorded");
        }
    }
    Ok(Some(out))
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
                                (false, 3) => "output".to_string(),
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
    let mut rule = ObservedRule { handle: 0, comment: None, statements: vec![], packets: None, bytes: None };
    let mut tname = String::new();
    for a in m.nft_attrs()? {
        let (ty, v) = a?;
        match ty {
            1 => tname = netlink::string(v),
            2 => chain = netlink::string(v),
            3 => rule.handle = be_u64(v).unwrap_or(0),
            4 => {
                let (statements, counts) = rule::decode_expressions(v)?;
                rule.statements = statements;
                (rule.packets, rule.bytes) = (counts.map(|c| c.0), counts.map(|c| c.1));
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
        // The observation sets hold whatever chaddrs the network sent (not node MACs): counted, never listed here
        // (`dhcp_seen` reads them).
        let seen = SeenKind::ALL.iter().any(|k| k.set_name() == s.name);
        let keys = with_members && s.name != LEASE_SET && !seen;
        let d = sock.dump(NFT_MSG_GETSETELEM, family, &[(1, table.as_str()), (2, s.name.as_str())], &mut |m| {
            tally.add(m, keys)
        })?;
        interrupted |= matches!(d, Dumped::Interrupted);
        s.elements = tally.count;
        s.invalid_members = tally.invalid;
        s.expires_in_ms = tally.expires;
        if with_members && !seen {
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

/// The decoding of each rule shape from kernel messages written here by hand (as the kernel dumps them, not by the
/// builder), and drift when a rule is edited in place.
#[cfg(test)]
mod rule_tests {
    use super::*;
    use crate::netlink::Messages;
    use crate::rule::PortField;
    use crate::{Dataplane, DesiredState, FakeDataplane, MacAddr, RulesetConfig};

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(netlink::align4(v.len()), 0);
        v
    }
    fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(ty | 0x8000, &parts.concat())
    }
    fn name(ty: u16, s: &str) -> Vec<u8> {
        nla(ty, format!("{s}\0").as_bytes())
    }
    fn u32a(ty: u16, v: u32) -> Vec<u8> {
        nla(ty, &v.to_be_bytes())
    }
    fn value(ty: u16, bytes: &[u8]) -> Vec<u8> {
        nested(ty, &[nla(1, bytes)])
    }
    fn expr(kind: &str, attrs: &[Vec<u8>]) -> Vec<u8> {
        nested(1, &[name(1, kind), nested(2, attrs)])
    }
    // The kernel's expressions (nft's registers: 32-bit register 8 here, where ironguard uses register 1).
    fn meta(key: u32) -> Vec<u8> {
        expr("meta", &[u32a(2, key), u32a(1, 8)])
    }
    fn meta_set(key: u32) -> Vec<u8> {
        expr("meta", &[u32a(2, key), u32a(3, 8)])
    }
    fn cmp(op: u32, data: &[u8]) -> Vec<u8> {
        expr("cmp", &[u32a(1, 8), u32a(2, op), value(3, data)])
    }
    fn payload(base: u32, offset: u32, len: u32) -> Vec<u8> {
        expr("payload", &[u32a(1, 8), u32a(2, base), u32a(3, offset), u32a(4, len)])
    }
    fn lookup(set: &str, flags: u32) -> Vec<u8> {
        expr("lookup", &[name(1, set), u32a(2, 8), u32a(5, flags)])
    }
    fn bitwise(mask: u32, xor: u32) -> Vec<u8> {
        let (m, x) = (mask.to_ne_bytes(), xor.to_ne_bytes());
        expr("bitwise", &[u32a(1, 8), u32a(2, 8), u32a(3, 4), value(4, &m), value(5, &x), u32a(6, 0)])
    }
    fn counter(packets: u64) -> Vec<u8> {
        expr("counter", &[nla(1, &(packets * 300).to_be_bytes()), nla(2, &packets.to_be_bytes())])
    }
    fn verdict(code: i32, chain: Option<&str>) -> Vec<u8> {
        let mut v = vec![u32a(1, code as u32)];
        v.extend(chain.map(|c| name(2, c)));
        expr("immediate", &[u32a(1, 0), nested(2, &[nested(2, &v)])])
    }
    const ACCEPT: i32 = 1;
    const DROP: i32 = 0;
    const JUMP: i32 = -3;

    /// One `NFT_MSG_NEWRULE` of table `ironguard_guard`, chain `input`, decoded as the read-back decodes a dump.
    fn decode(exprs: &[Vec<u8>]) -> ObservedRule {
        let mut body = vec![1, 0, 0, 0];
        body.extend(name(1, GUARD_TABLE));
        body.extend(name(2, "input"));
        body.extend(nla(3, &7u64.to_be_bytes()));
        body.extend(nested(4, exprs));
        let mut msg = Vec::new();
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&(10u16 << 8 | 6).to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        let m = Messages::new(&msg).next().unwrap().unwrap();
        let (table, chain, rule) = decode_rule(&m).unwrap();
        assert_eq!((table.as_str(), chain.as_str(), rule.handle), (GUARD_TABLE, "input", 7));
        rule
    }

    const MARK: u32 = 0x0010_0000;
    fn udp_dport(port: u16) -> [Vec<u8>; 4] {
        [meta(16), cmp(0, &[17]), payload(2, 2, 2), cmp(0, &port.to_be_bytes())]
    }

    #[test]
    fn the_guard_rule_and_its_edits_decode_by_what_they_do() {
        let mut ifname = [0u8; 16];
        ifname[..3].copy_from_slice(b"br0");
        let guard = |port: u16, mark: u32, v: i32| {
            let mut e = vec![meta(6), cmp(0, &ifname)];
            e.extend(udp_dport(port));
            e.extend([meta(3), bitwise(MARK, 0), cmp(1, &mark.to_ne_bytes()), counter(3), verdict(v, None)]);
            decode(&e)
        };
        let r = guard(67, MARK, DROP);
        assert_eq!(
            r.text(),
            "iifname \"br0\" meta l4proto udp th dport 67 meta mark & 0x00100000 != 0x00100000 counter drop"
        );
        assert_eq!((r.packets, r.bytes), (Some(3), Some(900)));
        let config = RulesetConfig { interfaces: vec!["br0".into()], ..Default::default() };
        assert_eq!(r.statements, guard_rules(Side::Requests, &config)[0].rules[0].stmts, "what ironguard builds");
        assert!(rule::drops_unmarked(&r.statements));
        // edited to accept, to another port, to another mark: each decodes to what it does
        let accept = guard(67, MARK, ACCEPT);
        assert_eq!(rule::verdict(&accept.statements), Some(&Stmt::Accept));
        assert!(!rule::drops_unmarked(&accept.statements));
        assert!(guard(68, MARK, DROP).statements.contains(&Stmt::Port { field: PortField::Dport, port: 68 }));
        assert!(guard(67, 0, DROP).statements.contains(&Stmt::MarkNot { mask: MARK, mark: 0 }));
        // a prefix match on the interface name is not `iifname "br0"`
        let mut e = vec![meta(6), cmp(0, b"br")];
        e.extend(udp_dport(67));
        assert!(matches!(decode(&e).statements[0], Stmt::Unknown(_)));
    }

    #[test]
    fn the_agents_rules_decode_by_what_they_do() {
        let keep = !MARK;
        // whitelist, request side: th dport @lease meta nfproto ipv4 @th,288,48 @allow_chaddr counter mark accept
        let white = decode(&[
            meta(16),
            cmp(0, &[17]),
            payload(2, 2, 2),
            lookup(LEASE_SET, 0),
            meta(15),
            cmp(0, &[2]),
            payload(2, 36, 6),
            lookup("allow_chaddr", 0),
            counter(0),
            meta(3),
            bitwise(keep, MARK),
            meta_set(3),
            verdict(ACCEPT, None),
        ]);
        assert_eq!(
            white.text(),
            "meta l4proto udp th dport @lease meta nfproto ipv4 @th,288,48 @allow_chaddr counter meta mark set meta \
             mark & 0xffefffff ^ 0x00100000 accept"
        );
        assert!(rule::marks(&white.statements) && rule::keyed(&white.statements));
        // blacklist: meta iiftype ether ether saddr @deny_mac counter drop
        let deny = decode(&[
            meta(8),
            cmp(0, &1u16.to_ne_bytes()),
            payload(0, 6, 6),
            lookup("deny_mac", 0),
            counter(0),
            verdict(DROP, None),
        ]);
        assert_eq!(deny.text(), "meta iiftype ether ether saddr @deny_mac counter drop");
        // an inverted lookup (`ether saddr != @deny_mac`) matches the opposite packets: not the same statement
        let inverted = decode(&[meta(8), cmp(0, &1u16.to_ne_bytes()), payload(0, 6, 6), lookup("deny_mac", 1)]);
        assert!(inverted.statements.iter().any(|s| matches!(s, Stmt::Unknown(_))), "{}", inverted.text());
        // the egress twin's jump: udp sport 67 counter, ironguard's mark bits cleared, jump pxe
        let mut e = vec![meta(16), cmp(0, &[17]), payload(2, 0, 2), cmp(0, &67u16.to_be_bytes()), counter(0)];
        e.extend([meta(3), bitwise(keep, 0), meta_set(3), verdict(JUMP, Some("pxe"))]);
        let jump = decode(&e);
        assert_eq!(
            jump.text(),
            "meta l4proto udp th sport 67 counter meta mark set meta mark & 0xffefffff ^ 0x00000000 jump pxe"
        );
        assert!(!rule::marks(&jump.statements), "clearing the mark is not marking");
        // the pass rule of the reply side: meta protocol ip is not part of it; a bare `counter drop`
        let drop = decode(&[counter(0), verdict(DROP, None)]);
        assert!(rule::unconditional(&drop.statements) && drop.text() == "counter drop");
        // an expression ironguard never writes
        let other = decode(&[expr("log", &[]), verdict(ACCEPT, None)]);
        assert_eq!(other.statements, vec![Stmt::Unknown("log".into()), Stmt::Accept]);
        let ipv4 = decode(&[meta(1), cmp(0, &0x0800u16.to_be_bytes())]);
        assert_eq!(ipv4.statements, vec![Stmt::ProtocolIp]);
    }

    fn dynset(set: &str, timeout_ms: u64, flags: u32) -> Vec<u8> {
        // as the kernel dumps it: key register, op, set name, timeout (0: the set's own), flags
        expr("dynset", &[u32a(4, 1), u32a(3, 1), name(1, set), nla(6, &timeout_ms.to_be_bytes()), u32a(9, flags)])
    }

    #[test]
    fn an_observation_rule_decodes_by_what_it_does() {
        let mut ifname = [0u8; 16];
        ifname[..3].copy_from_slice(b"br0");
        let seen = |timeout_ms: u64, flags: u32| {
            let mut e = vec![meta(6), cmp(0, &ifname), meta(15), cmp(0, &[2])];
            e.extend(udp_dport(67));
            e.extend([expr("payload", &[u32a(1, 1), u32a(2, 2), u32a(3, 36), u32a(4, 6)])]);
            e.push(dynset("seen_requests", timeout_ms, flags));
            decode(&e)
        };
        let r = seen(0, 0);
        assert_eq!(
            r.text(),
            "iifname \"br0\" meta nfproto ipv4 meta l4proto udp th dport 67 update @seen_requests { @th,288,48 }"
        );
        let config = RulesetConfig { interfaces: vec!["br0".into()], ..Default::default() };
        let built = crate::ruleset::seen_chains(&config);
        assert_eq!(r.statements, built[0].rules[0].stmts, "what ironguard builds");
        assert!(rule::verdict(&r.statements).is_none() && !rule::marks(&r.statements));
        // an update with a timeout or expression of its own is not the statement ironguard builds
        assert!(matches!(seen(5000, 0).statements.last(), Some(Stmt::Unknown(_))));
        assert!(matches!(seen(0, 1).statements.last(), Some(Stmt::Unknown(_))));
    }

    /// One element of an observation set as the kernel dumps it.
    fn seen_element(key: [u8; 6], packets: u64, timeout_ms: Option<u64>, expires_ms: u64, list: bool) -> Vec<u8> {
        let mut attrs = vec![nested(1, &[nla(1, &key)])];
        attrs.extend(timeout_ms.map(|t| nla(4, &t.to_be_bytes())));
        attrs.push(nla(5, &expires_ms.to_be_bytes()));
        let c = nested(2, &[nla(1, &(packets * 342).to_be_bytes()), nla(2, &packets.to_be_bytes())]);
        let counter = [name(1, "counter"), c];
        attrs.push(if list { nested(10, &[nested(1, &counter)]) } else { nested(7, &counter) });
        nested(1, &attrs)
    }

    fn decode_one(elem: &[u8]) -> crate::observe::SeenElement {
        let (_, v) = Attrs::new(elem).next().unwrap().unwrap();
        decode_seen_element(v).unwrap().unwrap()
    }

    #[test]
    fn observation_elements_decode_and_merge_newest_first() {
        let a = [0x52, 0x54, 0, 0xaa, 0, 1];
        let e = decode_one(&seen_element(a, 7, Some(3_600_000), 3_599_000, false));
        assert_eq!((e.key, e.packets, e.last_ms_ago()), (a, 7, Some(1000)));
        // the counter among NFTA_SET_ELEM_EXPRESSIONS; no timeout listed: the set's own
        let e2 = decode_one(&seen_element(a, 2, None, 3_000_000, true));
        assert_eq!((e2.packets, e2.last_ms_ago()), (2, Some(600_000)));
        let b = [0x52, 0x54, 0, 0xbb, 0, 2];
        let multicast = [0x01, 0, 0x5e, 0, 0, 1];
        let elems = [
            (SeenKind::Requests, e),
            (SeenKind::Passed, decode_one(&seen_element(a, 3, None, 3_590_000, false))),
            (SeenKind::Requests, decode_one(&seen_element(b, 1, None, 3_599_990, false))),
            (SeenKind::Requests, decode_one(&seen_element(multicast, 9, None, 3_599_999, false))),
        ];
        let seen = merge_seen(&elems);
        let macs: Vec<String> = seen.iter().map(|m| m.mac.to_string()).collect();
        assert_eq!(macs, ["52:54:00:bb:00:02", "52:54:00:aa:00:01"], "newest first; no multicast key");
        assert_eq!(seen[1].requests, Seen { count: 7, last_ms_ago: Some(1000) });
        assert_eq!(seen[1].passed, Seen { count: 3, last_ms_ago: Some(10_000) });
        assert_eq!(seen[1].answers, Seen::default());
        // a mangled element is an error or nothing, never a panic
        assert!(decode_seen_element(&[1, 2, 3]).is_err() || decode_seen_element(&[1, 2, 3]).unwrap().is_none());
    }

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([2, 0, 0, 0, 0, n]).unwrap()
    }

    /// A leader (policy allow) on both sides, as the kernel backend reads it back, and its desired state.
    fn leader() -> (Observed, DesiredState) {
        let config = RulesetConfig {
            interfaces: vec!["br0".into()],
            egress_interfaces: vec!["br0".into()],
            ..Default::default()
        };
        let d = DesiredState {
            config,
            mode: Mode::Leader,
            unknown_mac_policy: UnknownMacPolicy::Allow,
            allow: [mac(1)].into(),
            deny: [mac(2)].into(),
        };
        let mut f = FakeDataplane::new();
        f.apply(&d).unwrap();
        f.refresh_lease(Some(std::time::Instant::now() + std::time::Duration::from_secs(60))).unwrap();
        let o = f.observe(true).unwrap();
        assert_eq!(o.drift(&d), Vec::<String>::new());
        assert_eq!(o.verdict(), Verdict::Leader);
        (o, d)
    }

    fn rule_mut<'a>(t: &'a mut Option<ObservedTable>, chain: &str, i: usize) -> &'a mut ObservedRule {
        let c = t.as_mut().unwrap().chains.iter_mut().find(|c| c.name == chain).unwrap();
        &mut c.rules[i]
    }

    fn replace(r: &mut ObservedRule, from: &Stmt, to: Stmt) {
        let s = r.statements.iter_mut().find(|s| *s == from).unwrap();
        *s = to;
    }

    #[test]
    fn a_guard_rule_edited_to_accept_is_drift_and_unguarded_whatever_its_comment() {
        for (guard, side) in [("guard", Side::Requests), ("egress_guard", Side::Replies)] {
            let (mut o, d) = leader();
            let t = if guard == "guard" { &mut o.guard } else { &mut o.egress_guard };
            let name = if side == Side::Requests { "input" } else { EGRESS_CHAIN };
            let r = rule_mut(t, name, 0);
            replace(r, &Stmt::Drop, Stmt::Accept);
            assert_eq!(r.comment.as_deref(), Some(comments::GUARD_DROP), "the comment still says drop");
            let drift = o.drift(&d);
            assert!(drift.iter().any(|p| p.contains("guard") && p.contains("accept")), "{side:?}: {drift:?}");
            assert!(!o.side(side).0.unwrap().guard_drops());
            assert_eq!(o.side_verdict(side), Verdict::Unguarded);
            assert_eq!(o.verdict(), Verdict::Unguarded);
        }
    }

    #[test]
    fn a_deleted_drop_another_port_or_another_mark_is_drift() {
        let mark = Stmt::SetMark { keep: !MARK, xor: MARK };
        type Edit = Box<dyn Fn(&mut Observed)>;
        let edits: Vec<(&str, &str, Edit)> = vec![
            (
                "final drop deleted",
                "pxe",
                Box::new(|o| {
                    let c = o.owned.as_mut().unwrap().chains.iter_mut().find(|c| c.name == "pxe").unwrap();
                    c.rules.pop();
                }),
            ),
            (
                "egress final drop deleted",
                "pxe",
                Box::new(|o| {
                    let c = o.egress_owned.as_mut().unwrap().chains.iter_mut().find(|c| c.name == "pxe").unwrap();
                    c.rules.pop();
                }),
            ),
            (
                "guard drop deleted",
                "guard",
                Box::new(|o| {
                    o.guard.as_mut().unwrap().chains[0].rules.clear();
                }),
            ),
            (
                "guard port",
                "th dport 68",
                Box::new(|o| {
                    let from = Stmt::Port { field: PortField::Dport, port: 67 };
                    replace(
                        rule_mut(&mut o.guard, "input", 0),
                        &from,
                        Stmt::Port { field: PortField::Dport, port: 68 },
                    );
                }),
            ),
            (
                "egress jump port",
                "th sport 68",
                Box::new(|o| {
                    let from = Stmt::Port { field: PortField::Sport, port: 67 };
                    let r = rule_mut(&mut o.egress_owned, EGRESS_CHAIN, 0);
                    replace(r, &from, Stmt::Port { field: PortField::Sport, port: 68 });
                }),
            ),
            (
                "guard mark",
                "!= 0x00200000",
                Box::new(|o| {
                    let from = Stmt::MarkNot { mask: MARK, mark: MARK };
                    replace(rule_mut(&mut o.guard, "input", 0), &from, Stmt::MarkNot { mask: MARK, mark: 0x20_0000 });
                }),
            ),
            (
                "whitelist mark",
                "^ 0x00200000",
                Box::new(move |o| {
                    replace(
                        rule_mut(&mut o.owned, "whitelist", 0),
                        &mark,
                        Stmt::SetMark { keep: !MARK, xor: 0x20_0000 },
                    );
                }),
            ),
            (
                "egress pass rule mark",
                "^ 0x00200000",
                Box::new(move |o| {
                    let m = Stmt::SetMark { keep: !MARK, xor: MARK };
                    replace(
                        rule_mut(&mut o.egress_owned, "blacklist", 1),
                        &m,
                        Stmt::SetMark { keep: !MARK, xor: 0x20_0000 },
                    );
                }),
            ),
        ];
        for (what, want, edit) in edits {
            let (mut o, d) = leader();
            edit(&mut o);
            let drift = o.drift(&d);
            assert!(drift.iter().any(|p| p.contains(want)), "{what}: {drift:#?}");
        }
    }

    #[test]
    fn mode_and_pass_rule_are_read_from_what_the_rules_do() {
        let (mut o, _) = leader();
        let t = o.owned.as_mut().unwrap();
        assert_eq!((t.mode(), t.has_pass_rule()), (Mode::Leader, true));
        // the pass rule's comment on a rule that drops: not a pass rule
        let pass = t.chains.iter_mut().find(|c| c.name == "blacklist").unwrap().rules.last_mut().unwrap();
        assert_eq!(pass.comment.as_deref(), Some(comments::PASS));
        replace(pass, &Stmt::Accept, Stmt::Drop);
        assert!(!t.has_pass_rule());
        // no rule that marks: a follower, whatever the comments say
        for c in t.chains.iter_mut().filter(|c| c.name == "whitelist") {
            for r in &mut c.rules {
                replace(r, &Stmt::Accept, Stmt::Drop);
            }
        }
        assert_eq!(t.mode(), Mode::Follower);
        // an unconditional drop before the jumps: blocked
        let pxe = t.chains.iter_mut().find(|c| c.name == "pxe").unwrap();
        pxe.rules.insert(
            0,
            ObservedRule { handle: 0, comment: None, statements: vec![Stmt::Drop], packets: None, bytes: None },
        );
        assert_eq!(t.mode(), Mode::Blocked);
    }
}
