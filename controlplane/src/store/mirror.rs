//! The in-memory copy of the filter state that every backend serves reads from: entries, counts, and a bounded
//! log of recent revisions for agents that resume.

use std::collections::{BTreeMap, VecDeque};

use ironguard_dataplane::{MacAddr, UnknownMacPolicy};

use super::{Counts, Snapshot};
use crate::filter::{Entry, FilterState, RevisionDelta};

/// The revision log keeps at most this many MAC changes in memory; older revisions are served as a snapshot.
const MAX_LOG_MACS: usize = 1_000_000;

/// State, counts and the recent revisions.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    pub(crate) state: FilterState,
    /// The store's epoch (see [`super::FilterStore::epoch`]); empty while an etcd store has none yet.
    pub(crate) epoch: String,
    log: VecDeque<RevisionDelta>,
    /// MACs named by the deltas in `log` (the log is bounded by revisions and by this).
    log_macs: usize,
    allow: usize,
    deny: usize,
}

impl Mirror {
    pub(crate) fn new(
        state: FilterState,
        epoch: String,
        log: impl IntoIterator<Item = RevisionDelta>,
        log_len: usize,
    ) -> Self {
        let log: VecDeque<RevisionDelta> = log.into_iter().collect();
        let log_macs = log.iter().map(|d| d.delta.len()).sum();
        let (allow, deny) = (state.allowed().count(), state.denied().count());
        let mut m = Self { state, epoch, log, log_macs, allow, deny };
        m.trim(log_len);
        m
    }

    fn trim(&mut self, log_len: usize) {
        while self.log.len() > log_len || (self.log_macs > MAX_LOG_MACS && self.log.len() > 1) {
            if let Some(d) = self.log.pop_front() {
                self.log_macs -= d.delta.len();
            }
        }
    }

    /// Applies committed changes: entries (empty ones are removed), the revisions they made, and the new revision
    /// and policy.
    pub(crate) fn commit(
        &mut self,
        entries: BTreeMap<MacAddr, Entry>,
        records: Vec<RevisionDelta>,
        revision: u64,
        policy: UnknownMacPolicy,
        log_len: usize,
    ) {
        for (mac, e) in entries {
            self.set_entry(mac, e);
        }
        for r in records {
            self.push_record(r);
        }
        self.state.revision = revision;
        self.state.policy = policy;
        self.trim(log_len);
    }

    /// Sets one entry without touching counts (counts follow the revision records).
    pub(crate) fn set_entry(&mut self, mac: MacAddr, e: Entry) {
        if e.is_empty() {
            self.state.entries.remove(&mac);
        } else {
            self.state.entries.insert(mac, e);
        }
    }

    /// Appends a revision record and updates the counts from its delta.
    pub(crate) fn push_record(&mut self, r: RevisionDelta) {
        self.allow = (self.allow + r.delta.allow_add.len()).saturating_sub(r.delta.allow_remove.len());
        self.deny = (self.deny + r.delta.deny_add.len()).saturating_sub(r.delta.deny_remove.len());
        self.log_macs += r.delta.len();
        self.log.push_back(r);
    }

    /// Recomputes the counts from the entries (after a full reload).
    pub(crate) fn recount(&mut self) {
        self.allow = self.state.allowed().count();
        self.deny = self.state.denied().count();
    }

    pub(crate) fn trim_to(&mut self, log_len: usize) {
        self.trim(log_len);
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            revision: self.state.revision,
            allow: self.state.allowed().collect(),
            deny: self.state.denied().collect(),
            policy: self.state.policy,
            epoch: self.epoch.clone(),
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts { revision: self.state.revision, allow: self.allow, deny: self.deny, policy: self.state.policy }
    }

    /// The deltas after `since` for an agent whose state is of `epoch`: `None` (a snapshot) when that is not this
    /// store's epoch, or when [`Mirror::deltas_since`] says so. Under one lock: the epoch and the deltas match.
    pub(crate) fn resume(&self, since: u64, epoch: &str) -> Option<Vec<RevisionDelta>> {
        if epoch != self.epoch {
            return None;
        }
        self.deltas_since(since)
    }

    pub(crate) fn deltas_since(&self, since: u64) -> Option<Vec<RevisionDelta>> {
        let current = self.state.revision;
        if since == current {
            return Some(vec![]);
        }
        if since > current {
            return None;
        }
        let oldest = self.log.front()?.revision;
        if oldest > since + 1 {
            return None;
        }
        Some(self.log.iter().filter(|d| d.revision > since).cloned().collect())
    }

    pub(crate) fn entries(&self, macs: &[MacAddr]) -> (u64, Vec<(MacAddr, Entry)>) {
        let list = if macs.is_empty() {
            self.state.entries.iter().map(|(k, v)| (*k, v.clone())).collect()
        } else {
            macs.iter().filter_map(|k| self.state.entries.get(k).map(|v| (*k, v.clone()))).collect()
        };
        (self.state.revision, list)
    }
}
