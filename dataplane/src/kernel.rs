//! [`KernelDataplane`]: the agent's table, created with the `owner` flag through one long-lived netlink socket.
//! Dropping the value (or the process dying in any way) closes the socket and the kernel deletes the table;
//! the guard then drops all DHCP/PXE traffic.

use std::time::{Duration, Instant};

use tracing::{debug, info_span, warn};

use crate::NftError;
use crate::dataplane::{ApplyReport, Dataplane};
use crate::model::{Delta, DesiredState, Mode, UnknownMacPolicy};
use crate::netlink::{DumpSocket, NetlinkSocket};
use crate::observe::{self, Observed};
use crate::ruleset::{self, OWNED_TABLE, Tx};

/// The agent's table in the kernel of the current network namespace.
#[derive(Debug)]
pub struct KernelDataplane {
    sock: NetlinkSocket,
    committed: Option<DesiredState>,
    /// Sizes the allow and deny sets were created with (see [`ruleset::set_capacity`]).
    capacity: (usize, usize),
    /// The end of the kernel lease as last set (re-applied, with what remains of it, by a full rebuild).
    lease_until: Option<Instant>,
    #[cfg(feature = "test-hooks")]
    hooks: TestHooks,
}

/// Faults the end-to-end tests inject (feature `test-hooks`, which release builds and the packages never enable).
#[cfg(feature = "test-hooks")]
#[derive(Debug, Default)]
struct TestHooks {
    /// The next batch carries an object the kernel must reject.
    inject_invalid: bool,
    /// The next `.1` batches that carry the lease wait `.0` between computing its timeout and sending.
    lease_write_delay: (Duration, u32),
}

#[cfg(feature = "test-hooks")]
impl TestHooks {
    /// What the hooks do to a batch about to be committed.
    fn before_commit(&mut self, what: &str, mut tx: Tx) -> Result<Tx, NftError> {
        if matches!(what, "lease" | "full") && self.lease_write_delay.1 > 0 {
            self.lease_write_delay.1 -= 1;
            std::thread::sleep(self.lease_write_delay.0);
        }
        if std::mem::take(&mut self.inject_invalid) {
            ruleset::add_invalid_object(&mut tx)?;
        }
        Ok(tx)
    }
}

/// A lease element's timeout counts from when the kernel applies its batch, not from when it was computed. A
/// batch that took longer than this from computing the timeout to the kernel's acknowledgement (the agent was
/// preempted, throttled by its cgroup's `cpu.max`, or paused in between) may have moved the lease past its
/// deadline by as much: the lease is then written again with the time that is left, which a batch that is not
/// itself late makes exact again.
pub const LEASE_APPLY_SLACK: Duration = Duration::from_millis(5);
/// Late lease writes in a row after which the lease is dropped instead (fail closed): an agent this starved cannot
/// hold its fence to the deadline, and the next keep-alive writes it again.
pub const LEASE_REWRITES: u32 = 3;

/// Milliseconds left until `until`, rounded down (so the kernel never expires an element later than asked).
fn remaining_ms(until: Option<Instant>, now: Instant) -> u64 {
    until.map_or(0, |u| u.saturating_duration_since(now).as_millis().min(u64::MAX as u128) as u64)
}

impl KernelDataplane {
    /// Opens the owner socket. Fails with [`NftError::OwnedByOther`] if another process owns the table.
    pub fn open() -> Result<Self, NftError> {
        let sock = NetlinkSocket::open()?;
        let dp = Self {
            sock,
            committed: None,
            capacity: (0, 0),
            lease_until: None,
            #[cfg(feature = "test-hooks")]
            hooks: TestHooks::default(),
        };
        if let Some(tables) = observe::read_tables(&DumpSocket::open()?)? {
            if let Some(t) = tables.iter().find(|t| t.name == OWNED_TABLE) {
                return Err(NftError::OwnedByOther {
                    table: OWNED_TABLE.to_string(),
                    portid: t.owner_portid.unwrap_or(0),
                });
            }
        }
        Ok(dp)
    }

    /// The netlink port id that owns the table (what `nft list` and `ironguardctl chains` show).
    pub fn owner_portid(&self) -> u32 {
        self.sock.portid()
    }

    /// Reads back what the kernel holds (both tables, both families).
    pub fn observe(&self, with_members: bool) -> Result<Observed, NftError> {
        observe::observe(with_members)
    }

    /// Makes the next batch carry an object the kernel must reject. For tests of the all-or-nothing guarantee.
    #[cfg(feature = "test-hooks")]
    pub fn inject_invalid_object_once(&mut self) {
        self.hooks.inject_invalid = true;
    }

    /// Makes the next `writes` batches that carry the lease wait `delay` after its timeout was computed, as a
    /// starved agent does. For tests of [`LEASE_APPLY_SLACK`].
    #[cfg(feature = "test-hooks")]
    pub fn delay_lease_writes(&mut self, delay: Duration, writes: u32) {
        self.hooks.lease_write_delay = (delay, writes);
    }

    fn commit(&mut self, tx: Tx, what: &str) -> Result<ApplyReport, NftError> {
        if tx.is_empty() {
            return Ok(ApplyReport::default());
        }
        #[cfg(feature = "test-hooks")]
        let tx = self.hooks.before_commit(what, tx)?;
        let start = Instant::now();
        let f = tx.finish();
        let span =
            info_span!("nft_commit", what, messages = f.last_seq(), bytes = f.bytes.len(), elements = f.elements);
        let _g = span.enter();
        self.sock.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq))?;
        let report = ApplyReport {
            transactions: 1,
            messages: f.last_seq(),
            bytes: f.bytes.len(),
            elements: f.elements,
            elapsed: start.elapsed(),
            lease_rewrites: 0,
        };
        debug!(elapsed_us = report.elapsed.as_micros() as u64, "committed");
        Ok(report)
    }

    /// After a batch that carried the lease (its timeout computed at `computed_at`) was acknowledged: while the
    /// batch may have reached the kernel more than [`LEASE_APPLY_SLACK`] late, writes the lease again with what
    /// is left until `until`; after [`LEASE_REWRITES`] late writes, drops it. `report` gains the extra batches.
    fn settle_lease(
        &mut self,
        until: Option<Instant>,
        mut computed_at: Instant,
        mut report: ApplyReport,
    ) -> Result<ApplyReport, NftError> {
        loop {
            let late = computed_at.elapsed();
            if self.lease_until.is_none() || late <= LEASE_APPLY_SLACK {
                return Ok(report);
            }
            let give_up = report.lease_rewrites >= LEASE_REWRITES;
            warn!(
                late_ms = late.as_millis() as u64,
                rewrites = report.lease_rewrites,
                "the kernel lease reached the kernel {} ms after its timeout was computed (the agent was starved or \
                 preempted), so it may outlast the fence deadline by as much: {}",
                late.as_millis(),
                if give_up {
                    "dropping it (DHCP closed until the next keep-alive)"
                } else {
                    "writing it again with the time left"
                }
            );
            let config = &self.committed.as_ref().ok_or(NftError::NotInitialised)?.config;
            computed_at = Instant::now();
            let ms = if give_up { 0 } else { remaining_ms(until, computed_at) };
            let tx = ruleset::lease_refresh(config, ms);
            let r = self.commit(tx, "lease")?;
            report.add(&r);
            report.lease_rewrites += 1;
            self.lease_until = until.filter(|_| ms > 0);
        }
    }
}

impl Dataplane for KernelDataplane {
    fn probe_counts(&self) -> Result<Option<crate::ProbeCounts>, NftError> {
        match self.committed.as_ref().and_then(|c| c.config.probe) {
            Some(probe) => crate::observe::probe_counts(probe).map(Some),
            None => Ok(None),
        }
    }

    /// The observation sets exist in the request side's table: none without it (a configuration with egress
    /// hooks only).
    fn dhcp_seen(&self) -> Result<Option<Vec<crate::MacSeen>>, NftError> {
        if self.committed.as_ref().is_some_and(|c| !c.config.uses_inet()) {
            return Ok(None);
        }
        crate::observe::dhcp_seen().map(Some)
    }

    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        let at = Instant::now();
        let tx = ruleset::full_owned(desired, remaining_ms(self.lease_until, at))?;
        let report = self.commit(tx, "full")?;
        self.committed = Some(desired.clone());
        self.capacity =
            (ruleset::set_capacity(desired.allow.len()) as usize, ruleset::set_capacity(desired.deny.len()) as usize);
        self.settle_lease(self.lease_until, at, report)
    }

    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError> {
        let current = self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        let effective = current.effective(delta);
        let allow_after = current.allow.len() + effective.allow_add.len();
        let deny_after = current.deny.len() + effective.deny_add.len();
        if allow_after > self.capacity.0 || deny_after > self.capacity.1 {
            // The sets are fixed-size: grow them by rebuilding the table, still in one transaction.
            let mut next = current.clone();
            next.merge(&effective);
            tracing::info!(allow_after, deny_after, capacity = ?self.capacity, "set capacity reached, rebuilding larger sets");
            return self.apply(&next);
        }
        let tx = ruleset::delta(&current.config, &effective)?;
        let report = self.commit(tx, "delta")?;
        if let Some(c) = self.committed.as_mut() {
            c.merge(&effective);
        }
        Ok(report)
    }

    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError> {
        let current = self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        if current.mode == mode && current.unknown_mac_policy == policy {
            return Ok(ApplyReport::default());
        }
        let tx = ruleset::switch_mode(&current.config, mode, policy)?;
        let report = self.commit(tx, "mode")?;
        if let Some(c) = self.committed.as_mut() {
            c.mode = mode;
            c.unknown_mac_policy = policy;
        }
        Ok(report)
    }

    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        let config = &self.committed.as_ref().ok_or(NftError::NotInitialised)?.config;
        let at = Instant::now();
        let ms = remaining_ms(until, at);
        let tx = ruleset::lease_refresh(config, ms);
        let report = self.commit(tx, "lease")?;
        self.lease_until = until.filter(|_| ms > 0);
        self.settle_lease(until, at, report)
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lease_until
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.committed.as_ref()
    }

    /// Installs or rebuilds the guard through this table's socket: where the kernel has `persist`, the guard is
    /// then held by this process (no other process can change or delete it, `nft flush ruleset` skips it) and
    /// stays in place, orphaned, when this process dies. Refused if another live process holds it.
    /// With `hold = false` the guard is rebuilt as a plain table (what older kernels get anyway).
    fn claim_guard(&mut self, config: &crate::RulesetConfig, hold: bool) -> Result<(), NftError> {
        let flags = if hold { crate::guard::guard_flags()? } else { 0 };
        crate::guard::install_with(&mut self.sock, config, flags)
    }

    /// Missing, not dropping as configured, or (where the kernel has `persist` and `hold`) not held by this agent.
    fn guard_problems(&self, config: &crate::RulesetConfig, hold: bool) -> Vec<String> {
        match crate::guard::status(config) {
            Ok(s) => {
                let mut p = s.problems;
                let want_held = hold && crate::guard::persist_supported().unwrap_or(false);
                if s.installed && want_held && s.held_by != Some(self.owner_portid()) {
                    p.push("the guard is not held by this agent".into());
                }
                p
            }
            Err(e) => vec![format!("cannot read the guard back: {e}")],
        }
    }

    fn guard_description(&self, hold: bool) -> String {
        let persistent = hold && crate::guard::persist_supported().unwrap_or(false);
        if persistent {
            "nftables guard held (owner, persist)".into()
        } else if hold {
            "nftables guard, a plain table (this kernel has no NFT_TABLE_F_PERSIST)".into()
        } else {
            "nftables guard, a plain table ([guard] claim = false)".into()
        }
    }

    fn drift(&self, with_members: bool) -> Result<Vec<String>, NftError> {
        Ok(self.observe(with_members)?.drift_from(self.committed()))
    }

    fn nftables_port(&self) -> Option<u32> {
        Some(self.owner_portid())
    }

    fn kernel_lease(&self) -> bool {
        true
    }
}
