//! [`IpsetDataplane`]: the filter for hosts whose firewall is iptables-legacy (x_tables), as ironic-inspector's
//! iptables filter ran it — but with one set lookup instead of one rule (and one iptables process) per MAC, sets
//! swapped atomically, and a lease the kernel enforces.
//!
//! ```text
//! ipset: ironguard-allow, ironguard-deny   hash:mac (replaced whole with `ipset swap`)
//!        ironguard-lease                   bitmap:port with per-element timeouts (the leader's lease, in seconds)
//! -t mangle  PREROUTING -p udp [-i IF] --dport PORT -j ironguard
//!            ironguard: clear ironguard's mark bits;
//!                       [blocked: RETURN]
//!                       [leader: lease dst + allow src -> MARK; marked -> RETURN]
//!                       deny src -> RETURN
//!                       [leader, unknown MACs allowed: lease dst -> MARK]
//! -t filter  INPUT/FORWARD -p udp -j ironguard-guard
//!            ironguard-guard: -p udp [-i IF] --dport PORT -m mark ! --mark MARK/MASK -j DROP
//! ```
//!
//! Where it is weaker than nftables (docs/operations.md): nothing dies with the agent — iptables-legacy has no
//! owned tables — so after SIGKILL the leader's rules stay until its lease element expires (whole seconds, rounded
//! down: at most TTL − margin after its last keep-alive), not at once; the sets key on the Ethernet source only
//! (iptables cannot look a set up by the BOOTP chaddr), so behind a DHCP relay the relay's MAC decides; DHCPv4
//! only; each change runs an `ipset` or `iptables-restore` process (milliseconds), and a delta touching both sets
//! is two atomic steps (the closing one first). Needs the kernel's `hash:mac` set type (`ip_set_hash_mac`).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::dataplane::{ApplyReport, Dataplane};
use crate::model::{Delta, DesiredState, HookKind, Mode, RulesetConfig, UnknownMacPolicy};
use crate::{MacAddr, NftError};

pub const ALLOW_SET: &str = "ironguard-allow";
pub const DENY_SET: &str = "ironguard-deny";
pub const LEASE_SET: &str = "ironguard-lease";
/// The agent's chain in the mangle table (marks what may pass).
pub const MARK_CHAIN: &str = "ironguard";
/// The guard's chain in the filter table (drops DHCP without the mark).
pub const GUARD_CHAIN: &str = "ironguard-guard";
const COMMENT_BLOCKED: &str = "ironguard:blocked";

/// Runs `program args`, with `stdin` if given; its stdout on success, a [`NftError::Command`] otherwise.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
    let command = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NftError::Io { what: format!("running {command}"), source: e })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| NftError::Io { what: format!("writing to {command}"), source: e })?;
    }
    let out =
        child.wait_with_output().map_err(|e| NftError::Io { what: format!("waiting for {command}"), source: e })?;
    if !out.status.success() {
        return Err(NftError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn restore_command(iptables: &str) -> String {
    format!("{iptables}-restore")
}

fn save_command(iptables: &str) -> String {
    format!("{iptables}-save")
}

/// `[-i IF] -p udp --dport PORT` for every configured interface and port.
fn dhcp_matches(c: &RulesetConfig) -> Vec<String> {
    let ifaces: Vec<Option<&String>> =
        if c.interfaces.is_empty() { vec![None] } else { c.interfaces.iter().map(Some).collect() };
    let mut out = vec![];
    for i in ifaces {
        for p in &c.ports {
            out.push(match i {
                Some(i) => format!("-i {i} -p udp -m udp --dport {p}"),
                None => format!("-p udp -m udp --dport {p}"),
            });
        }
    }
    out
}

fn mark(c: &RulesetConfig) -> String {
    format!("0x{:x}/0x{:x}", c.mark, c.mask)
}

/// The `iptables-restore --noflush` input that replaces the agent's mangle chain for a mode and policy.
pub fn mark_chain_script(c: &RulesetConfig, mode: Mode, policy: UnknownMacPolicy) -> String {
    let m = mark(c);
    let mut r = vec![format!("-A {MARK_CHAIN} -j MARK --set-xmark 0x0/0x{:x}", c.mask)];
    if mode == Mode::Blocked {
        r.push(format!("-A {MARK_CHAIN} -m comment --comment {COMMENT_BLOCKED} -j RETURN"));
    }
    if mode == Mode::Leader {
        r.push(format!(
            "-A {MARK_CHAIN} -m set --match-set {LEASE_SET} dst -m set --match-set {ALLOW_SET} src -j MARK --set-xmark {m}"
        ));
        r.push(format!("-A {MARK_CHAIN} -m mark --mark {m} -j RETURN"));
    }
    r.push(format!("-A {MARK_CHAIN} -m set --match-set {DENY_SET} src -j RETURN"));
    if mode == Mode::Leader && policy == UnknownMacPolicy::Allow {
        r.push(format!("-A {MARK_CHAIN} -m set --match-set {LEASE_SET} dst -j MARK --set-xmark {m}"));
    }
    format!("*mangle\n:{MARK_CHAIN} - [0:0]\n{}\nCOMMIT\n", r.join("\n"))
}

/// The `iptables-restore --noflush` input that replaces the guard chain.
pub fn guard_chain_script(c: &RulesetConfig) -> String {
    let rules: Vec<String> = dhcp_matches(c)
        .into_iter()
        .map(|m| format!("-A {GUARD_CHAIN} {m} -m mark ! --mark {} -j DROP", mark(c)))
        .collect();
    format!("*filter\n:{GUARD_CHAIN} - [0:0]\n{}\nCOMMIT\n", rules.join("\n"))
}

fn hook_chain(h: HookKind) -> &'static str {
    match h {
        HookKind::Input => "INPUT",
        HookKind::Forward => "FORWARD",
    }
}

/// Inserts `-p udp -j TARGET` at the head of `chain` in `table` unless it is there.
fn ensure_jump(iptables: &str, table: &str, chain: &str, target: &str) -> Result<(), NftError> {
    let spec = ["-p", "udp", "-j", target];
    let mut check = vec!["-w", "-t", table, "-C", chain];
    check.extend(spec);
    if run(iptables, &check, None).is_ok() {
        return Ok(());
    }
    let mut insert = vec!["-w", "-t", table, "-I", chain, "1"];
    insert.extend(spec);
    run(iptables, &insert, None).map(|_| ())
}

/// Removes every `-p udp -j TARGET` from `chain` in `table`.
fn remove_jumps(iptables: &str, table: &str, chain: &str, target: &str) {
    while run(iptables, &["-w", "-t", table, "-D", chain, "-p", "udp", "-j", target], None).is_ok() {}
}

/// Installs (or replaces) the guard: the filter chain and its jumps from INPUT/FORWARD. The chain's rules are
/// replaced in one `iptables-restore` (atomic for the table); the jump is added once.
pub fn guard_install(c: &RulesetConfig) -> Result<(), NftError> {
    c.validate()?;
    let restore = restore_command(&c.ipset.iptables);
    run(&restore, &["-w", "--noflush"], Some(&guard_chain_script(c)))?;
    for h in [HookKind::Input, HookKind::Forward] {
        if c.hooks.contains(&h) {
            ensure_jump(&c.ipset.iptables, "filter", hook_chain(h), GUARD_CHAIN)?;
        } else {
            remove_jumps(&c.ipset.iptables, "filter", hook_chain(h), GUARD_CHAIN);
        }
    }
    Ok(())
}

/// Removes the guard (decommissioning).
pub fn guard_remove(c: &RulesetConfig) -> Result<(), NftError> {
    for h in [HookKind::Input, HookKind::Forward] {
        remove_jumps(&c.ipset.iptables, "filter", hook_chain(h), GUARD_CHAIN);
    }
    let _ = run(&c.ipset.iptables, &["-w", "-t", "filter", "-F", GUARD_CHAIN], None);
    let _ = run(&c.ipset.iptables, &["-w", "-t", "filter", "-X", GUARD_CHAIN], None);
    Ok(())
}

/// The rules of `chain` in `table`, as `iptables-save` prints them (`-A CHAIN ...`), and whether `from` jumps to it.
fn saved_rules(iptables: &str, table: &str, chain: &str) -> Result<(Vec<String>, Vec<String>), NftError> {
    let out = run(&save_command(iptables), &["-t", table], None)?;
    let own = format!("-A {chain} ");
    let jump = format!("-j {chain}");
    let rules = out.lines().filter(|l| l.starts_with(&own)).map(String::from).collect();
    let jumps = out
        .lines()
        .filter(|l| l.starts_with("-A ") && !l.starts_with(&own) && l.ends_with(&jump))
        .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
        .collect();
    Ok((rules, jumps))
}

/// What is wrong with the guard for `c` (empty: in place as configured).
pub fn guard_problems(c: &RulesetConfig) -> Vec<String> {
    let (rules, jumps) = match saved_rules(&c.ipset.iptables, "filter", GUARD_CHAIN) {
        Ok(x) => x,
        Err(e) => return vec![format!("cannot read the iptables guard back: {e}")],
    };
    let mut p = vec![];
    let want = dhcp_matches(c).len();
    let drops = rules.iter().filter(|r| r.ends_with("-j DROP")).count();
    if rules.len() != want || drops != want {
        p.push(format!(
            "iptables guard chain {GUARD_CHAIN} has {} rules ({drops} drop rules), {want} configured",
            rules.len()
        ));
    }
    for h in &c.hooks {
        if !jumps.iter().any(|j| j == hook_chain(*h)) {
            p.push(format!("{} does not jump to {GUARD_CHAIN}", hook_chain(*h)));
        }
    }
    p
}

/// The members of an ipset (`ipset save NAME`).
fn set_members(ipset: &str, name: &str) -> Result<BTreeSet<MacAddr>, NftError> {
    let out = run(ipset, &["save", name], None)?;
    Ok(out
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("add {name} ")))
        .filter_map(|m| m.split_whitespace().next()?.parse().ok())
        .collect())
}

/// The ipset script that fills a temporary set with `macs` and swaps it in for `live`.
fn swap_script(live: &str, macs: &BTreeSet<MacAddr>) -> String {
    let tmp = format!("{live}-t");
    let maxelem = (macs.len() * 2).max(65536);
    let mut s = format!("create {tmp} hash:mac hashsize 1024 maxelem {maxelem} -exist\nflush {tmp}\n");
    for m in macs {
        s.push_str(&format!("add {tmp} {m}\n"));
    }
    s.push_str(&format!("swap {tmp} {live}\ndestroy {tmp}\n"));
    s
}

/// The ipset backend.
#[derive(Debug)]
pub struct IpsetDataplane {
    config: RulesetConfig,
    committed: Option<DesiredState>,
    lease_until: Option<Instant>,
}

impl IpsetDataplane {
    /// Checks the tools and the kernel (a throw-away `hash:mac` set), then creates the sets and the agent's mangle
    /// chain (Blocked) with its jump from PREROUTING.
    pub fn open(config: &RulesetConfig) -> Result<Self, NftError> {
        config.validate()?;
        let ipset = &config.ipset.ipset;
        let probe = format!("ironguard-probe-{}", std::process::id());
        match run(ipset, &["create", &probe, "hash:mac"], None) {
            Ok(_) => {
                let _ = run(ipset, &["destroy", &probe], None);
            }
            Err(NftError::Command { stderr, .. }) if stderr.contains("not supported") => {
                return Err(NftError::Unsupported(format!(
                    "this kernel has no hash:mac ipset type (CONFIG_IP_SET_HASH_MAC, module ip_set_hash_mac): the \
                     ipset backend cannot run here; use the nftables backend ({stderr})"
                )));
            }
            Err(e) => return Err(e),
        }
        let script = format!(
            "create {ALLOW_SET} hash:mac -exist\ncreate {DENY_SET} hash:mac -exist\n\
             create {LEASE_SET} bitmap:port range 0-65535 timeout 0 -exist\n"
        );
        run(ipset, &["restore"], Some(&script))?;
        let dp = Self { config: config.clone(), committed: None, lease_until: None };
        dp.write_mode(Mode::Blocked, UnknownMacPolicy::Deny)?;
        for m in dhcp_matches(config) {
            let args: Vec<&str> = m.split_whitespace().collect();
            let mut check = vec!["-w", "-t", "mangle", "-C", "PREROUTING"];
            check.extend(&args);
            check.extend(["-j", MARK_CHAIN]);
            if run(&config.ipset.iptables, &check, None).is_err() {
                let mut ins = vec!["-w", "-t", "mangle", "-I", "PREROUTING", "1"];
                ins.extend(&args);
                ins.extend(["-j", MARK_CHAIN]);
                run(&config.ipset.iptables, &ins, None)?;
            }
        }
        Ok(dp)
    }

    fn write_mode(&self, mode: Mode, policy: UnknownMacPolicy) -> Result<(), NftError> {
        run(
            &restore_command(&self.config.ipset.iptables),
            &["-w", "--noflush"],
            Some(&mark_chain_script(&self.config, mode, policy)),
        )
        .map(|_| ())
    }

    fn report(start: Instant, transactions: u32, elements: usize) -> ApplyReport {
        ApplyReport {
            transactions,
            messages: transactions,
            bytes: 0,
            elements,
            elapsed: start.elapsed(),
            lease_rewrites: 0,
        }
    }
}

impl Dataplane for IpsetDataplane {
    /// Blocked first (so nothing is marked while the sets change), both sets swapped in one `ipset restore`, then
    /// the mode's rules. The lease set is left as it is.
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        desired.config.validate()?;
        let start = Instant::now();
        self.write_mode(Mode::Blocked, UnknownMacPolicy::Deny)?;
        let script = format!("{}{}", swap_script(ALLOW_SET, &desired.allow), swap_script(DENY_SET, &desired.deny));
        run(&self.config.ipset.ipset, &["restore"], Some(&script))?;
        self.write_mode(desired.mode, desired.unknown_mac_policy)?;
        self.committed = Some(desired.clone());
        Ok(Self::report(start, 3, desired.allow.len() + desired.deny.len()))
    }

    /// The closing half first (allow removals, deny additions), then the opening half, each one `ipset restore`.
    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError> {
        let current = self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        let eff = current.effective(delta);
        if eff.is_empty() {
            return Ok(ApplyReport::default());
        }
        let start = Instant::now();
        let mut closing = String::new();
        for m in &eff.allow_remove {
            closing.push_str(&format!("del {ALLOW_SET} {m}\n"));
        }
        for m in &eff.deny_add {
            closing.push_str(&format!("add {DENY_SET} {m}\n"));
        }
        let mut opening = String::new();
        for m in &eff.deny_remove {
            opening.push_str(&format!("del {DENY_SET} {m}\n"));
        }
        for m in &eff.allow_add {
            opening.push_str(&format!("add {ALLOW_SET} {m}\n"));
        }
        let mut n = 0;
        for script in [closing, opening].iter().filter(|s| !s.is_empty()) {
            run(&self.config.ipset.ipset, &["-exist", "restore"], Some(script))?;
            n += 1;
        }
        if let Some(c) = self.committed.as_mut() {
            c.merge(&eff);
        }
        Ok(Self::report(start, n, eff.len()))
    }

    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError> {
        let current = self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        if current.mode == mode && current.unknown_mac_policy == policy {
            return Ok(ApplyReport::default());
        }
        let start = Instant::now();
        self.write_mode(mode, policy)?;
        if let Some(c) = self.committed.as_mut() {
            c.mode = mode;
            c.unknown_mac_policy = policy;
        }
        Ok(Self::report(start, 1, 0))
    }

    /// One element per port in `ironguard-lease`, expiring after the whole seconds left until `until` (rounded
    /// down, so never later than asked; under a second left: no lease).
    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        let config = &self.committed.as_ref().ok_or(NftError::NotInitialised)?.config;
        let start = Instant::now();
        let secs = until.map_or(0, |u| u.saturating_duration_since(start).as_secs());
        let script = if secs == 0 {
            format!("flush {LEASE_SET}\n")
        } else {
            config.ports.iter().map(|p| format!("add {LEASE_SET} {p} timeout {secs}\n")).collect()
        };
        run(&self.config.ipset.ipset, &["-exist", "restore"], Some(&script))?;
        self.lease_until = (secs > 0).then(|| start + std::time::Duration::from_secs(secs));
        Ok(Self::report(start, 1, config.ports.len()))
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lease_until
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.committed.as_ref()
    }

    fn claim_guard(&mut self, config: &RulesetConfig, _hold: bool) -> Result<(), NftError> {
        guard_install(config)
    }

    fn guard_problems(&self, config: &RulesetConfig, _hold: bool) -> Vec<String> {
        guard_problems(config)
    }

    fn guard_description(&self, _hold: bool) -> String {
        format!(
            "iptables guard chain {GUARD_CHAIN} ({}; a plain chain: repaired by the read-back)",
            self.config.ipset.iptables
        )
    }

    fn drift(&self, with_members: bool) -> Result<Vec<String>, NftError> {
        let Some(s) = &self.committed else { return Ok(vec!["nothing committed yet".into()]) };
        let mut out = guard_problems(&s.config);
        let (rules, _) = saved_rules(&self.config.ipset.iptables, "mangle", MARK_CHAIN)?;
        let want =
            mark_chain_script(&s.config, s.mode, s.unknown_mac_policy).lines().filter(|l| l.starts_with("-A ")).count();
        if rules.len() != want {
            out.push(format!("mangle chain {MARK_CHAIN} has {} rules, {want} expected for {}", rules.len(), s.mode));
        }
        if with_members {
            for (set, want) in [(ALLOW_SET, &s.allow), (DENY_SET, &s.deny)] {
                let have = set_members(&self.config.ipset.ipset, set)?;
                if &have != want {
                    out.push(format!(
                        "ipset {set}: {} missing, {} unexpected",
                        want.difference(&have).count(),
                        have.difference(want).count()
                    ));
                }
            }
        }
        Ok(out)
    }

    fn kernel_lease(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_chain_marks_only_on_a_leader_and_only_with_the_lease() {
        let c = RulesetConfig { interfaces: vec!["br0".into()], ..Default::default() };
        let blocked = mark_chain_script(&c, Mode::Blocked, UnknownMacPolicy::Allow);
        assert!(blocked.contains(COMMENT_BLOCKED) && !blocked.contains("--set-xmark 0x100000"), "{blocked}");
        let follower = mark_chain_script(&c, Mode::Follower, UnknownMacPolicy::Allow);
        assert!(!follower.contains("--set-xmark 0x100000"), "a follower marks nothing:\n{follower}");
        let leader = mark_chain_script(&c, Mode::Leader, UnknownMacPolicy::Allow);
        let marking: Vec<&str> = leader.lines().filter(|l| l.contains("--set-xmark 0x100000/")).collect();
        assert_eq!(marking.len(), 2, "{leader}");
        assert!(marking.iter().all(|l| l.contains(&format!("--match-set {LEASE_SET} dst"))), "{leader}");
        // deny is checked before the pass rule
        let deny = leader.find(DENY_SET).unwrap();
        let pass = leader.rfind(&format!("--match-set {LEASE_SET} dst -j MARK")).unwrap();
        assert!(deny < pass);
        let deny_policy = mark_chain_script(&c, Mode::Leader, UnknownMacPolicy::Deny);
        assert_eq!(deny_policy.lines().filter(|l| l.contains("--set-xmark 0x100000/")).count(), 1);
    }

    #[test]
    fn the_guard_drops_unmarked_dhcp_on_every_interface_and_port() {
        let c = RulesetConfig { interfaces: vec!["a".into(), "b".into()], ports: vec![67, 4011], ..Default::default() };
        let g = guard_chain_script(&c);
        assert_eq!(g.lines().filter(|l| l.ends_with("-m mark ! --mark 0x100000/0x100000 -j DROP")).count(), 4, "{g}");
    }

    #[test]
    fn a_swap_replaces_the_whole_set() {
        let macs: BTreeSet<MacAddr> = ["52:54:00:00:00:01".parse().unwrap()].into();
        let s = swap_script(ALLOW_SET, &macs);
        assert!(s.contains("add ironguard-allow-t 52:54:00:00:00:01"), "{s}");
        assert!(s.contains("swap ironguard-allow-t ironguard-allow\ndestroy ironguard-allow-t"), "{s}");
    }
}
