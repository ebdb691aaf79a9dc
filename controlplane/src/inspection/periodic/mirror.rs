//! Keeps the set of MACs carrying one reason on one side of the filter in step with a source of truth.

use std::collections::BTreeSet;

use ironguard_dataplane::MacAddr;

use crate::filter::{ReasonChange, Side};
use crate::inspection::engine::Engine;
use crate::store::{Fence, FilterStore};

/// "These MACs should carry `reason` on `side` now" becomes the reason changes against what the filter state holds
/// at each run, not against the previous run: a reason an operator removed by hand (`ironguardctl filters remove
/// MAC --reason ironic`) is added again at the next run while the source still names the MAC, as the API promises,
/// and a new leader starts from what is published.
#[derive(Debug)]
pub(super) struct ReasonMirror {
    side: Side,
    reason: &'static str,
}

/// What one [`ReasonMirror::sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Synced {
    pub changed: usize,
    pub revision: Option<u64>,
    /// Removals held back ([`super::drop_held`]): the MACs keep the reason.
    pub held: usize,
    /// Those MACs.
    pub held_macs: Vec<MacAddr>,
    /// MACs carrying the reason before the run.
    pub before: usize,
}

impl ReasonMirror {
    pub(super) fn new(side: Side, reason: &'static str) -> Self {
        Self { side, reason }
    }

    /// Publishes the difference between `now` and the MACs that carry the reason in the filter state, as one filter
    /// change (a failed apply is simply retried in full at the next run).
    ///
    /// With `max_drop_percent`, removals are held back (only additions are published) when they are a mass drop
    /// ([`super::drop_held`]).
    pub(super) async fn sync(
        &self,
        engine: &Engine,
        now: BTreeSet<MacAddr>,
        max_drop_percent: Option<u32>,
        fence: &Fence,
    ) -> anyhow::Result<Synced> {
        let before = carrying(engine.filters.as_ref(), self.side, self.reason);
        let mut changes = diff(self.side, self.reason, &before, &now);
        let removing = changes.iter().filter(|c| !c.present).count();
        let mut held = 0;
        let mut held_macs = Vec::new();
        if max_drop_percent.is_some_and(|p| super::drop_held(removing, before.len(), p)) {
            held_macs = changes.iter().filter(|c| !c.present).map(|c| c.mac).collect();
            changes.retain(|c| c.present);
            held = removing;
        }
        // In writes of at most MIRROR_CHUNK MACs: each write is one revision on either store, and one etcd revision
        // holds a bounded number (a first sync of a site with tens of thousands of ports is several).
        let mut revision = None;
        for chunk in changes.chunks(MIRROR_CHUNK) {
            revision = Some(engine.filters.apply_fenced(chunk.to_vec(), None, fence).await?.revision);
        }
        Ok(Synced { changed: changes.len(), revision, held, held_macs, before: before.len() })
    }
}

/// The most MACs one sync writes at once (well under what one etcd revision may hold).
const MIRROR_CHUNK: usize = 10_000;

/// Reason changes that take `before` to `after`.
fn diff(side: Side, reason: &str, before: &BTreeSet<MacAddr>, after: &BTreeSet<MacAddr>) -> Vec<ReasonChange> {
    let added = after.difference(before).map(|m| (m, true));
    let removed = before.difference(after).map(|m| (m, false));
    added
        .chain(removed)
        .map(|(mac, present)| ReasonChange { mac: *mac, side, reason: reason.to_string(), present })
        .collect()
}

/// MACs that currently carry `reason` on `side` in the filter state.
fn carrying(filters: &dyn FilterStore, side: Side, reason: &str) -> BTreeSet<MacAddr> {
    let (_, entries) = filters.entries(&[]);
    entries
        .into_iter()
        .filter(|(_, e)| match side {
            Side::Allow => e.allow.contains(reason),
            Side::Deny => e.deny.contains(reason),
        })
        .map(|(m, _)| m)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_adds_and_removes_only_the_difference() {
        let m = |s: &str| s.parse::<MacAddr>().unwrap();
        let before: BTreeSet<_> = [m("52:54:00:00:00:01"), m("52:54:00:00:00:02")].into();
        let after: BTreeSet<_> = [m("52:54:00:00:00:02"), m("52:54:00:00:00:03")].into();
        let d = diff(Side::Deny, "ironic", &before, &after);
        assert_eq!(d.len(), 2);
        assert!(d.iter().any(|c| c.mac == m("52:54:00:00:00:03") && c.present));
        assert!(d.iter().any(|c| c.mac == m("52:54:00:00:00:01") && !c.present));
        assert!(diff(Side::Deny, "ironic", &after, &after).is_empty());
    }
}
