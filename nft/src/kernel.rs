//! [`KernelDataplane`]: the agent's table, created with the `owner` flag through one long-lived netlink socket.
//! Dropping the value (or the process dying in any way) closes the socket and the kernel deletes the table;
//! the guard then drops all DHCP/PXE traffic.

use std::time::Instant;

use tracing::{debug, info_span};

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
    inject_invalid: bool,
}

/// Milliseconds left until `until`, rounded down (so the kernel never expires an element later than asked).
fn remaining_ms(until: Option<Instant>, now: Instant) -> u64 {
    until.map_or(0, |u| u.saturating_duration_since(now).as_millis().min(u64::MAX as u128) as u64)
}

impl KernelDataplane {
    /// Opens the owner socket. Fails with [`NftError::OwnedByOther`] if another process owns the table.
    pub fn open() -> Result<Self, NftError> {
        let sock = NetlinkSocket::open()?;
        let dp = Self { sock, committed: None, capacity: (0, 0), lease_until: None, inject_invalid: false };
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

    /// Installs or rebuilds the guard through this table's socket: where the kernel has `persist`, the guard is
    /// then held by this process (no other process can change or delete it, `nft flush ruleset` skips it) and
    /// stays in place, orphaned, when this process dies. Refused if another live process holds it.
    /// With `hold = false` the guard is rebuilt as a plain table (what older kernels get anyway).
    pub fn claim_guard(&mut self, config: &crate::RulesetConfig, hold: bool) -> Result<(), NftError> {
        let flags = if hold { crate::guard::guard_flags()? } else { 0 };
        crate::guard::install_with(&mut self.sock, config, flags)
    }

    /// Makes the next batch carry an object the kernel must reject. For tests of the all-or-nothing guarantee.
    #[doc(hidden)]
    pub fn inject_invalid_object_once(&mut self) {
        self.inject_invalid = true;
    }

    fn commit(&mut self, mut tx: Tx, what: &str) -> Result<ApplyReport, NftError> {
        if tx.is_empty() {
            return Ok(ApplyReport::default());
        }
        if std::mem::take(&mut self.inject_invalid) {
            ruleset::add_invalid_object(&mut tx)?;
        }
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
        };
        debug!(elapsed_us = report.elapsed.as_micros() as u64, "committed");
        Ok(report)
    }
}

impl Dataplane for KernelDataplane {
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        let tx = ruleset::full_owned(desired, remaining_ms(self.lease_until, Instant::now()))?;
        let report = self.commit(tx, "full")?;
        self.committed = Some(desired.clone());
        self.capacity =
            (ruleset::set_capacity(desired.allow.len()) as usize, ruleset::set_capacity(desired.deny.len()) as usize);
        Ok(report)
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
        let ms = remaining_ms(until, Instant::now());
        let tx = ruleset::lease_refresh(config, ms);
        match self.commit(tx, "lease") {
            Ok(r) => {
                self.lease_until = until.filter(|_| ms > 0);
                Ok(r)
            }
            Err(e) => Err(e),
        }
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lease_until
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.committed.as_ref()
    }

    fn observe(&self, with_members: bool) -> Result<Observed, NftError> {
        observe::observe(with_members)
    }
}
