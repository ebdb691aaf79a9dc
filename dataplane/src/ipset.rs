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
//! owned tables — so after SIGKILL the leader's rules stay until its lease element expires (at most TTL − margin
//! after its last keep-alive), not at once; the sets key on the Ethernet source only (iptables cannot look a set up
//! by the BOOTP chaddr), so behind a DHCP relay the relay's MAC decides; DHCPv4 only; each change runs an `ipset` or
//! `iptables-restore` process (milliseconds), and a delta touching both sets is two atomic steps (the closing one
//! first). Needs the kernel's `hash:mac` set type (`ip_set_hash_mac`).
//!
//! The lease ([`IpsetLease`]) counts in whole seconds, the only unit of ipset timeouts. Rounded down, an element
//! written just after a keep-alive ends up to a second before the fence deadline, which with the defaults (TTL 3 s,
//! margin 1 s, a keep-alive every second) is about when the next keep-alive's write comes: the lease would lapse for
//! milliseconds now and then. So it is written again, for the same deadline, just before the whole seconds left
//! would drop by one ([`IpsetLease::rewrite_at`]): it then ends [`LEASE_WRITE_ALLOWANCE`] +
//! [`LEASE_ALIGN_EARLY`] before the deadline, close to it and never after it.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tracing::warn;

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

/// Room for the `ipset` process that writes the lease to reach the kernel, whose timeout counts from then: the
/// whole seconds are computed to end this long before the deadline. A write that took longer (plus
/// [`crate::LEASE_APPLY_SLACK`]) is written again with what is left, as the nftables backend does.
pub const LEASE_WRITE_ALLOWANCE: Duration = Duration::from_millis(50);
/// How long before the whole seconds left would drop by one the lease is written again ([`IpsetLease::rewrite_at`]):
/// room for the main loop's timer to fire late. The rewritten lease ends this long plus [`LEASE_WRITE_ALLOWANCE`]
/// before the deadline.
pub const LEASE_ALIGN_EARLY: Duration = Duration::from_millis(100);
/// A rewrite that would make the lease last less than this much longer is not worth a process.
const LEASE_MIN_GAIN: Duration = Duration::from_millis(10);
const SECOND: Duration = Duration::from_secs(1);

/// The lease element as last written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseElement {
    /// The deadline it was written for.
    pub deadline: Instant,
    /// It ends no earlier than this (its timeout counted from before the write)…
    pub earliest: Instant,
    /// …and no later than this (counted from when the write returned).
    pub latest: Instant,
}

/// What a refresh of the lease does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Write the element with this many seconds.
    Write(u64),
    /// Leave the element as it is: it ends by the deadline, and a write now would not make it last longer.
    Keep,
    /// Remove it: no whole second is left before the deadline (or there is no deadline).
    Drop,
}

/// Whole seconds of lease that end by `deadline` if written at `now` (0: none).
pub fn lease_secs(deadline: Instant, now: Instant) -> u64 {
    deadline.checked_sub(LEASE_WRITE_ALLOWANCE).map_or(0, |d| d.saturating_duration_since(now).as_secs())
}

/// What to write at `now` for the deadline `until`, given the element in the kernel. Pure.
pub fn plan_lease(current: Option<LeaseElement>, until: Option<Instant>, now: Instant) -> LeaseWrite {
    let Some(deadline) = until else { return LeaseWrite::Drop };
    let secs = lease_secs(deadline, now);
    let keep = current.is_some_and(|c| {
        c.latest <= deadline + crate::LEASE_APPLY_SLACK && now + Duration::from_secs(secs) <= c.earliest
    });
    match (keep, secs) {
        (true, _) => LeaseWrite::Keep,
        (false, 0) => LeaseWrite::Drop,
        (false, s) => LeaseWrite::Write(s),
    }
}

/// When to write `current` again, for the same deadline, so that it lasts longer: [`LEASE_ALIGN_EARLY`] before the
/// next instant at which the whole seconds left drop by one. `None`: no rewrite would gain. Pure.
pub fn rewrite_at(current: LeaseElement, now: Instant) -> Option<Instant> {
    let base = current.deadline.checked_sub(LEASE_WRITE_ALLOWANCE)?;
    let best = base.checked_sub(LEASE_ALIGN_EARLY)?;
    if best <= current.earliest + LEASE_MIN_GAIN || base <= now {
        return None;
    }
    // At `now + fraction`, whole seconds are left to `base`; just before it, as many as now.
    let fraction = Duration::from_nanos(u64::from(base.duration_since(now).subsec_nanos()));
    let at = if fraction > LEASE_ALIGN_EARLY {
        now + fraction - LEASE_ALIGN_EARLY
    } else {
        now + fraction + SECOND - LEASE_ALIGN_EARLY
    };
    let secs = lease_secs(current.deadline, at);
    (secs > 0 && at + Duration::from_secs(secs) > current.earliest + LEASE_MIN_GAIN).then_some(at)
}

/// The leader's lease: one element per DHCP port in the `bitmap:port` set `ironguard-lease`, with a kernel timeout
/// in whole seconds that never ends after the deadline it was written for (see the module documentation).
#[derive(Debug, Clone)]
pub struct IpsetLease {
    ipset: String,
    ports: Vec<u16>,
    element: Option<LeaseElement>,
}

impl IpsetLease {
    /// The lease of the set `ironguard-lease` (which must exist), written with the `ipset` command `ipset`.
    pub fn new(ipset: &str, ports: &[u16]) -> Self {
        Self { ipset: ipset.to_string(), ports: ports.to_vec(), element: None }
    }

    /// The element in the kernel, as last written.
    pub fn element(&self) -> Option<LeaseElement> {
        self.element
    }

    /// When to call [`IpsetLease::refresh`] again with the same deadline for a longer lease.
    pub fn rewrite_at(&self) -> Option<Instant> {
        rewrite_at(self.element?, Instant::now())
    }

    /// Moves the lease to end by `until` (`None`: now), writing only what makes it last longer or end sooner. A
    /// write that may have reached the kernel late enough to outlast the deadline is written again with what is
    /// left, and after [`crate::LEASE_REWRITES`] such writes the lease is dropped.
    pub fn refresh(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        let mut report = ApplyReport::default();
        loop {
            let start = Instant::now();
            let secs = match plan_lease(self.element, until, start) {
                LeaseWrite::Keep => return Ok(report),
                LeaseWrite::Drop => {
                    run(&self.ipset, &["-exist", "restore"], Some(&format!("flush {LEASE_SET}\n")))?;
                    self.element = None;
                    report.add(&IpsetDataplane::report(start, 1, 0));
                    return Ok(report);
                }
                LeaseWrite::Write(secs) => secs,
            };
            let script: String = self.ports.iter().map(|p| format!("add {LEASE_SET} {p} timeout {secs}\n")).collect();
            run(&self.ipset, &["-exist", "restore"], Some(&script))?;
            let done = Instant::now();
            report.add(&IpsetDataplane::report(start, 1, self.ports.len()));
            let length = Duration::from_secs(secs);
            let deadline = until.unwrap_or(start);
            self.element = Some(LeaseElement { deadline, earliest: start + length, latest: done + length });
            if done + length <= deadline + crate::LEASE_APPLY_SLACK {
                return Ok(report);
            }
            report.lease_rewrites += 1;
            let give_up = report.lease_rewrites > crate::LEASE_REWRITES;
            warn!(
                took_ms = (done - start).as_millis() as u64,
                rewrites = report.lease_rewrites,
                "the ipset lease write took so long that its element may outlast the fence deadline: {}",
                if give_up {
                    "dropping it (DHCP closed until the next keep-alive)"
                } else {
                    "writing it again with the time left"
                }
            );
            if give_up {
                return self.refresh(None).map(|r| {
                    report.add(&r);
                    report
                });
            }
        }
    }
}

/// The ipset backend.
#[derive(Debug)]
pub struct IpsetDataplane {
    config: RulesetConfig,
    committed: Option<DesiredState>,
    lease: IpsetLease,
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
        let lease = IpsetLease::new(ipset, &config.ports);
        let dp = Self { config: config.clone(), committed: None, lease };
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

    /// One element per port in `ironguard-lease`, expiring after the whole seconds left until `until` (see
    /// [`IpsetLease::refresh`]: never after `until`, written only when that makes the lease last longer).
    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        self.lease.refresh(until)
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lease.element().map(|e| e.earliest)
    }

    fn lease_rewrite_at(&self) -> Option<Instant> {
        self.lease.rewrite_at()
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
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_plan_writes_whole_seconds_that_end_by_the_deadline_and_never_shortens_for_the_same_one() {
        let now = Instant::now();
        let d = now + 2000 * MS;
        assert_eq!(plan_lease(None, None, now), LeaseWrite::Drop);
        assert_eq!(plan_lease(None, Some(d), now), LeaseWrite::Write(1), "1.95 s left after the allowance: 1 s");
        assert_eq!(plan_lease(None, Some(now + 2060 * MS), now), LeaseWrite::Write(2));
        assert_eq!(plan_lease(None, Some(now + 1049 * MS), now), LeaseWrite::Drop, "under a second left");
        // The element in the kernel ends at now + 1.9 s, for the deadline d: a write now (1 s) would shorten it.
        let e = LeaseElement { deadline: d, earliest: now + 1900 * MS, latest: now + 1905 * MS };
        assert_eq!(plan_lease(Some(e), Some(d), now), LeaseWrite::Keep);
        assert_eq!(plan_lease(Some(e), Some(d), now + 920 * MS), LeaseWrite::Write(1), "at 0.92 s it would gain");
        // Late in its life, no whole second is left, but the element still ends by the deadline: kept, not dropped.
        assert_eq!(plan_lease(Some(e), Some(d), now + 1500 * MS), LeaseWrite::Keep);
        // A deadline earlier than the element's end: never kept.
        assert_eq!(plan_lease(Some(e), Some(now + 1800 * MS), now), LeaseWrite::Write(1));
        assert_eq!(plan_lease(Some(e), Some(now + 900 * MS), now), LeaseWrite::Drop);
        assert_eq!(plan_lease(Some(e), Some(now + 1500 * MS), now - 1000 * MS), LeaseWrite::Write(2));
        assert_eq!(plan_lease(Some(e), None, now), LeaseWrite::Drop);
    }

    /// A simulated leader with the defaults (TTL 3 s, margin 1 s, a keep-alive every second): the keep-alive's
    /// round trip (with its confirmation) varies; after each the lease is written for the new fence deadline, as
    /// the agent's core does; with `aligned`, the main loop also writes it again at [`rewrite_at`], its timer
    /// firing `late`. Each `ipset` write reaches the kernel `write` after its timeout was computed. Returns each
    /// element as the kernel has it: (applied at, ends at, its deadline).
    fn simulate(
        round_trips: &[u32],
        late: Duration,
        write: Duration,
        aligned: bool,
    ) -> Vec<(Instant, Instant, Instant)> {
        let t0 = Instant::now();
        let (fence, period) = (2000 * MS, 1000 * MS);
        let mut current: Option<LeaseElement> = None;
        let mut kernel = vec![];
        let mut refresh = |now: Instant, deadline: Instant, current: &mut Option<LeaseElement>| -> Instant {
            match plan_lease(*current, Some(deadline), now) {
                LeaseWrite::Write(secs) => {
                    let (done, length) = (now + write, Duration::from_secs(secs));
                    kernel.push((done, done + length, deadline));
                    *current = Some(LeaseElement { deadline, earliest: now + length, latest: done + length });
                    done
                }
                LeaseWrite::Keep => now,
                LeaseWrite::Drop => panic!("dropped at {:?} for {:?}", now - t0, deadline - t0),
            }
        };
        for (k, rtt) in round_trips.iter().enumerate() {
            let sent = t0 + period * k as u32;
            let deadline = sent + fence;
            let mut now = refresh(sent + *rtt * MS, deadline, &mut current);
            let next = t0 + period * (k as u32 + 1) + round_trips.get(k + 1).copied().unwrap_or(0) * MS;
            for _ in 0..10 {
                let Some(at) = current.filter(|_| aligned).and_then(|c| rewrite_at(c, now)) else { break };
                assert!(at >= now, "a rewrite is never due in the past");
                if at + late >= next {
                    break;
                }
                now = refresh(at + late, deadline, &mut current);
            }
        }
        kernel
    }

    fn lapses(kernel: &[(Instant, Instant, Instant)]) -> Vec<Duration> {
        kernel.windows(2).filter_map(|w| w[1].0.checked_duration_since(w[0].1)).filter(|d| !d.is_zero()).collect()
    }

    /// Rounded down to whole seconds and written only after each keep-alive, the lease lapses whenever a round trip
    /// is longer than the one before; written again just before its whole seconds drop, it never lapses. Either
    /// way no element ends after its deadline.
    #[test]
    fn the_ipset_lease_never_lapses_between_keep_alives_and_never_outlives_its_deadline() {
        let round_trips = [3, 40, 5, 60, 2, 90, 10, 30, 4, 300, 1, 70, 8, 500, 3];
        for write in [MS, 5 * MS, 15 * MS] {
            let old = simulate(&round_trips, Duration::ZERO, write, false);
            assert!(!lapses(&old).is_empty(), "the old schedule lapses (write {write:?})");
            for late in [Duration::ZERO, MS, 25 * MS, 80 * MS] {
                let kernel = simulate(&round_trips, late, write, true);
                assert!(kernel.len() > round_trips.len(), "aligned rewrites happened");
                assert_eq!(lapses(&kernel), Vec::<Duration>::new(), "write {write:?}, timer late {late:?}");
                for (applied, ends, deadline) in &kernel {
                    assert!(ends <= &(*deadline + crate::LEASE_APPLY_SLACK), "an element outlives its deadline");
                    assert!(applied < ends);
                }
                // The last element ends close to its deadline: the allowance and the early rewrite before it.
                let (_, ends, deadline) = kernel.last().unwrap();
                assert!(*ends + LEASE_WRITE_ALLOWANCE + LEASE_ALIGN_EARLY >= *deadline);
            }
        }
    }

    #[test]
    fn an_aligned_lease_is_not_rewritten_and_a_short_one_is_rewritten_before_its_seconds_drop() {
        let now = Instant::now();
        let d = now + 2000 * MS;
        // Written 10 ms after the keep-alive: 1 s, ending at now + 1.01 s; the rewrite comes 100 ms before the
        // instant 1.95 s (d less the allowance) minus a whole second, i.e. at now + 0.85 s, and ends at d - 150 ms.
        let written = now + 10 * MS;
        let e = LeaseElement { deadline: d, earliest: written + 1000 * MS, latest: written + 1002 * MS };
        let at = rewrite_at(e, written + 2 * MS).expect("a rewrite gains almost a second");
        assert_eq!(at, now + 850 * MS);
        assert_eq!(lease_secs(d, at), 1);
        let aligned = LeaseElement { deadline: d, earliest: at + 1000 * MS, latest: at + 1003 * MS };
        assert_eq!(rewrite_at(aligned, at + 3 * MS), None, "nothing left to gain");
        // Within the early margin of the boundary: the next boundary, a second later, if a second is left then.
        let e2 = LeaseElement { deadline: now + 3000 * MS, earliest: now + 1500 * MS, latest: now + 1500 * MS };
        assert_eq!(rewrite_at(e2, now + 940 * MS), Some(now + 1850 * MS));
        assert_eq!(rewrite_at(e, now + 1960 * MS), None, "the deadline is too close");
    }
}
