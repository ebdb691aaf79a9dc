//! [`FakeDataplane`]: the same contract as the kernel backend, in memory, for fast unit tests of the agent and
//! anything else that drives a dataplane. It counts transactions and can be told to fail, so callers' error
//! paths (which must all lead to `Blocked`) can be tested without a kernel.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::NftError;
use crate::dataplane::{ApplyReport, Dataplane};
use crate::model::{Delta, DesiredState, Mode, UnknownMacPolicy};
use crate::observe::{Observed, ObservedChain, ObservedRule, ObservedSet, ObservedTable};
use crate::rule::Stmt;
use crate::ruleset::{BuiltChain, GUARD_TABLE, OWNED_TABLE, SeenKind, Side, guard_rules, owned_rules};

/// Shared, inspectable state of a fake (clone the handle to look inside from a test).
#[derive(Debug, Default)]
pub struct FakeState {
    pub committed: Option<DesiredState>,
    pub guard_installed: bool,
    pub transactions: u32,
    /// The end of the lease as last refreshed.
    pub lease_until: Option<Instant>,
    /// Errors to return from the next mutating calls, in order (each failure changes nothing).
    pub fail_next: VecDeque<Errno>,
    /// Read-backs ([`Dataplane::drift`]) to fail from now on, one per call.
    pub fail_reads: u32,
    /// How long each read-back takes (the processes of the ipset backend on a starved CPU).
    pub read_delay: std::time::Duration,
    /// What [`Dataplane::probe_counts`] reports while the committed state has a probe identity.
    pub probe_counts: crate::ProbeCounts,
    /// What [`Dataplane::dhcp_seen`] reports, as a test sets it.
    pub seen: Vec<crate::MacSeen>,
}

/// An in-memory dataplane.
#[derive(Debug, Clone, Default)]
pub struct FakeDataplane {
    pub state: Arc<Mutex<FakeState>>,
    committed: Option<DesiredState>,
}

impl FakeDataplane {
    /// A fake host with the guard installed.
    pub fn new() -> Self {
        let f = Self::default();
        f.lock().guard_installed = true;
        f
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a failure for the next mutating call.
    pub fn fail_next(&self, errno: Errno) {
        self.lock().fail_next.push_back(errno);
    }

    fn commit(&mut self, next: DesiredState, elements: usize, what: &str) -> Result<ApplyReport, NftError> {
        let mut st = self.lock();
        if let Some(errno) = st.fail_next.pop_front() {
            return Err(NftError::Rejected { object: format!("{what} (fake)"), errno, reason: None });
        }
        st.transactions += 1;
        st.committed = Some(next.clone());
        drop(st);
        self.committed = Some(next);
        Ok(ApplyReport { transactions: 1, messages: 1, bytes: 0, elements, elapsed: Duration::ZERO, lease_rewrites: 0 })
    }
}

impl Dataplane for FakeDataplane {
    fn probe_counts(&self) -> Result<Option<crate::ProbeCounts>, NftError> {
        let st = self.lock();
        Ok(st.committed.as_ref().and_then(|c| c.config.probe).map(|_| st.probe_counts))
    }

    fn dhcp_seen(&self) -> Result<Option<Vec<crate::MacSeen>>, NftError> {
        Ok(Some(self.lock().seen.clone()))
    }

    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError> {
        desired.config.validate()?;
        let n = desired.allow.len() + desired.deny.len();
        self.commit(desired.clone(), n, "full apply")
    }

    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError> {
        let mut next = self.committed.clone().ok_or(NftError::NotInitialised)?;
        let eff = next.merge(delta);
        if eff.is_empty() {
            return Ok(ApplyReport::default());
        }
        self.commit(next, eff.len(), "delta")
    }

    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError> {
        let cur = self.committed.clone().ok_or(NftError::NotInitialised)?;
        if cur.mode == mode && cur.unknown_mac_policy == policy {
            return Ok(ApplyReport::default());
        }
        self.commit(DesiredState { mode, unknown_mac_policy: policy, ..cur }, 0, "mode switch")
    }

    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError> {
        self.committed.as_ref().ok_or(NftError::NotInitialised)?;
        let mut st = self.lock();
        if let Some(errno) = st.fail_next.pop_front() {
            return Err(NftError::Rejected { object: "lease (fake)".into(), errno, reason: None });
        }
        st.transactions += 1;
        st.lease_until = until.filter(|u| *u > Instant::now());
        Ok(ApplyReport {
            transactions: 1,
            messages: 2,
            bytes: 0,
            elements: 1,
            elapsed: Duration::ZERO,
            lease_rewrites: 0,
        })
    }

    fn lease_until(&self) -> Option<Instant> {
        self.lock().lease_until
    }

    fn committed(&self) -> Option<&DesiredState> {
        self.committed.as_ref()
    }

    fn claim_guard(&mut self, config: &crate::RulesetConfig, _hold: bool) -> Result<(), NftError> {
        config.validate()?;
        let mut st = self.lock();
        if let Some(errno) = st.fail_next.pop_front() {
            return Err(NftError::Rejected { object: "guard (fake)".into(), errno, reason: None });
        }
        st.guard_installed = true;
        Ok(())
    }

    fn guard_problems(&self, _config: &crate::RulesetConfig, _hold: bool) -> Vec<String> {
        if self.lock().guard_installed { vec![] } else { vec!["the guard is missing (fake)".into()] }
    }

    fn guard_description(&self, _hold: bool) -> String {
        "fake guard".into()
    }

    fn drift(&self, with_members: bool) -> Result<Vec<String>, NftError> {
        let delay = self.lock().read_delay;
        std::thread::sleep(delay);
        {
            let mut st = self.lock();
            if st.fail_reads > 0 {
                st.fail_reads -= 1;
                return Err(NftError::Rejected { object: "read-back (fake)".into(), errno: Errno::EIO, reason: None });
            }
        }
        Ok(self.observe(with_members)?.drift_from(self.committed()))
    }

    fn kernel_lease(&self) -> bool {
        true
    }
}

impl FakeDataplane {
    /// What the kernel backend would read back for the committed state.
    pub fn observe(&self, with_members: bool) -> Result<Observed, NftError> {
        let st = self.lock();
        let config = st.committed.as_ref().map(|d| d.config.clone()).unwrap_or_default();
        let mut o = Observed::default();
        for side in Side::for_config(&config) {
            let guard = st.guard_installed.then(|| synthesize_guard(side, &config));
            let owned = st.committed.as_ref().map(|d| synthesize(side, d, with_members, st.lease_until));
            match side {
                Side::Requests => (o.guard, o.owned) = (guard, owned),
                Side::Replies => (o.egress_guard, o.egress_owned) = (guard, owned),
            }
        }
        Ok(o)
    }
}

/// The chains of `built` as the kernel lists them: each rule with its statements and comment, a zero counter
/// where it has one, base chains with their hook, priority and (egress) devices.
fn chains(side: Side, config: &crate::RulesetConfig, built: Vec<BuiltChain>) -> Vec<ObservedChain> {
    let mut devices = if side == Side::Replies { config.egress_interfaces.clone() } else { vec![] };
    devices.sort();
    built
        .into_iter()
        .map(|c| ObservedChain {
            name: c.name.into(),
            hook: c.hook.map(|(h, _)| h.to_string()),
            priority: c.hook.map(|(_, p)| p),
            devices: if c.hook.is_some() { devices.clone() } else { vec![] },
            rules: c
                .rules
                .into_iter()
                .map(|r| {
                    let counter = r.stmts.contains(&Stmt::Counter).then_some(0);
                    ObservedRule {
                        handle: 0,
                        comment: Some(r.comment.into()),
                        statements: r.stmts,
                        packets: counter,
                        bytes: counter,
                    }
                })
                .collect(),
        })
        .collect()
}

/// The guard table of `side` as installed for `config`.
fn synthesize_guard(side: Side, config: &crate::RulesetConfig) -> ObservedTable {
    ObservedTable {
        name: GUARD_TABLE.into(),
        family: side.family_name().into(),
        flags: 0,
        owner_portid: None,
        chains: chains(side, config, guard_rules(side, config)),
        sets: vec![],
    }
}

/// What the kernel backend would read back for `d`.
fn synthesize(side: Side, d: &DesiredState, with_members: bool, lease_until: Option<Instant>) -> ObservedTable {
    let built = owned_rules(side, &d.config, d.mode, d.unknown_mac_policy);
    let sets = side
        .set_kinds(&d.config)
        .iter()
        .map(|k| {
            let m = if k.is_allow() { &d.allow } else { &d.deny };
            ObservedSet {
                name: k.name().into(),
                key_type: if k.is_chaddr() { 4 } else { 9 },
                key_len: 6,
                size: Some(crate::ruleset::set_capacity(m.len())),
                elements: m.len(),
                members: with_members.then(|| m.clone()),
                invalid_members: 0,
                expires_in_ms: None,
            }
        })
        .chain(std::iter::once({
            let left = lease_until.and_then(|u| u.checked_duration_since(Instant::now()));
            ObservedSet {
                name: crate::ruleset::LEASE_SET.into(),
                key_type: 13,
                key_len: 2,
                size: None,
                elements: if left.is_some() { d.config.ports.len() } else { 0 },
                members: with_members.then(BTreeSet::new),
                invalid_members: 0,
                expires_in_ms: left.map(|l| l.as_millis() as u64),
            }
        }))
        .chain(SeenKind::ALL.into_iter().filter(|_| side == Side::Requests).map(|k| ObservedSet {
            name: k.set_name().into(),
            key_type: 4,
            key_len: 6,
            size: Some(crate::ruleset::SEEN_SIZE),
            elements: 0,
            members: None,
            invalid_members: 0,
            expires_in_ms: None,
        }))
        .collect();
    ObservedTable {
        name: OWNED_TABLE.into(),
        family: side.family_name().into(),
        flags: 2,
        owner_portid: Some(std::process::id()),
        chains: chains(side, &d.config, built),
        sets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MacAddr;
    use crate::observe::Verdict;

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([2, 0, 0, 0, 0, n]).unwrap()
    }

    #[test]
    fn fake_follows_the_contract() {
        let mut f = FakeDataplane::new();
        assert!(matches!(f.apply_delta(&Delta::default()), Err(NftError::NotInitialised)));
        f.apply(&DesiredState::default()).unwrap();
        assert_eq!(f.observe(false).unwrap().verdict(), Verdict::Blocked);
        f.set_mode(Mode::Leader, UnknownMacPolicy::Allow).unwrap();
        assert_eq!(f.observe(false).unwrap().verdict(), Verdict::Fenced, "leader rules without a lease");
        f.refresh_lease(Some(Instant::now() + Duration::from_secs(2))).unwrap();
        assert_eq!(f.observe(false).unwrap().verdict(), Verdict::Leader);
        f.apply_delta(&Delta { allow_add: vec![mac(1)], ..Default::default() }).unwrap();
        assert!(f.drift(true).unwrap().is_empty());

        // a failed call changes nothing
        f.fail_next(Errno::ENOBUFS);
        let before = f.committed().cloned();
        assert!(f.apply_delta(&Delta { deny_add: vec![mac(2)], ..Default::default() }).is_err());
        assert_eq!(f.committed().cloned(), before);
        assert_eq!(f.state.lock().unwrap().transactions, 4, "apply, mode, lease, delta");
    }

    #[test]
    fn what_the_fake_saw_is_what_a_test_set() {
        let f = FakeDataplane::new();
        assert_eq!(f.dhcp_seen().unwrap(), Some(vec![]));
        let seen = crate::MacSeen {
            mac: mac(1),
            requests: crate::Seen { count: 2, last_ms_ago: Some(5) },
            passed: crate::Seen::default(),
            answers: crate::Seen::default(),
        };
        f.state.lock().unwrap().seen.push(seen.clone());
        assert_eq!(f.dhcp_seen().unwrap(), Some(vec![seen]));
    }

    #[test]
    fn verdicts() {
        let f = FakeDataplane::new();
        assert_eq!(f.observe(false).unwrap().verdict(), Verdict::Closed);
        f.state.lock().unwrap().guard_installed = false;
        assert_eq!(f.observe(false).unwrap().verdict(), Verdict::Unguarded);
    }
}
