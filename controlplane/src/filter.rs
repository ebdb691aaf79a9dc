//! The authoritative filter state: for each MAC, why it is allowed and why it is denied.
//!
//! A MAC is in the effective allow set while it has at least one allow reason, and in the deny set while it has
//! at least one deny reason (a MAC in both is served: the agents' whitelist comes first). Reasons belong to their
//! sources — `api` (UpdatePxeFilters), `inspection:<node>`, `ironic`, `ironic-inspection` — so one source never
//! undoes another's decision. Every change to the effective sets (or to the unknown-MAC policy) is one revision.

use std::collections::{BTreeMap, BTreeSet};

use ironguard_nft::{Delta, MacAddr, UnknownMacPolicy};
use serde::{Deserialize, Serialize};

/// The reason recorded for changes made through `UpdatePxeFilters`.
pub const API: &str = "api";

/// Largest number of MACs one `UpdatePxeFilters` request may name.
pub const MAX_MACS_PER_REQUEST: usize = 100_000;

/// Which set a reason puts a MAC in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Allow,
    Deny,
}

/// Add (`present = true`) or drop one reason for one MAC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonChange {
    pub mac: MacAddr,
    pub side: Side,
    pub reason: String,
    pub present: bool,
}

/// The reasons recorded for one MAC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub allow: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub deny: BTreeSet<String>,
}

impl Entry {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    fn side_mut(&mut self, side: Side) -> &mut BTreeSet<String> {
        match side {
            Side::Allow => &mut self.allow,
            Side::Deny => &mut self.deny,
        }
    }
}

/// One revision: what changed in the effective sets, and the policy if it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionDelta {
    pub revision: u64,
    pub delta: Delta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<UnknownMacPolicy>,
}

/// The whole state at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FilterState {
    pub revision: u64,
    pub entries: BTreeMap<MacAddr, Entry>,
    pub policy: UnknownMacPolicy,
}

impl FilterState {
    /// The effective allow set.
    pub fn allowed(&self) -> impl Iterator<Item = MacAddr> + '_ {
        self.entries.iter().filter(|(_, e)| !e.allow.is_empty()).map(|(m, _)| *m)
    }

    /// The effective deny set.
    pub fn denied(&self) -> impl Iterator<Item = MacAddr> + '_ {
        self.entries.iter().filter(|(_, e)| !e.deny.is_empty()).map(|(m, _)| *m)
    }
}

/// Applies reason changes to the entries they name (looked up with `get`), returning the new entries and the change
/// in effective membership. `get` sees the state before this call; entries that end up empty are returned empty
/// (the caller deletes them).
pub fn apply_changes(
    get: &dyn Fn(&MacAddr) -> Option<Entry>,
    changes: &[ReasonChange],
) -> (BTreeMap<MacAddr, Entry>, Delta) {
    let mut touched: BTreeMap<MacAddr, (Entry, Entry)> = BTreeMap::new();
    for c in changes {
        let (_, after) = touched.entry(c.mac).or_insert_with(|| {
            let e = get(&c.mac).unwrap_or_default();
            (e.clone(), e)
        });
        let set = after.side_mut(c.side);
        if c.present {
            set.insert(c.reason.clone());
        } else {
            set.remove(&c.reason);
        }
    }
    let mut delta = Delta::default();
    let mut out = BTreeMap::new();
    for (mac, (before, after)) in touched {
        match (before.allow.is_empty(), after.allow.is_empty()) {
            (true, false) => delta.allow_add.push(mac),
            (false, true) => delta.allow_remove.push(mac),
            _ => {}
        }
        match (before.deny.is_empty(), after.deny.is_empty()) {
            (true, false) => delta.deny_add.push(mac),
            (false, true) => delta.deny_remove.push(mac),
            _ => {}
        }
        if before != after {
            out.insert(mac, after);
        }
    }
    (out, delta)
}

/// A request that cannot be applied. Nothing changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error(transparent)]
    Mac(#[from] ironguard_nft::MacError),
    #[error("MAC {0} is named in more than one of allow, deny and remove")]
    Conflict(MacAddr),
    #[error("the request names {0} MACs; at most {MAX_MACS_PER_REQUEST} are accepted per request")]
    TooMany(usize),
}

/// Turns an `UpdatePxeFilters` request into reason changes. Every MAC is validated first, so a single bad one
/// rejects the whole request.
pub fn api_changes(allow: &[String], deny: &[String], remove: &[String]) -> Result<Vec<ReasonChange>, InvalidRequest> {
    let total = allow.len() + deny.len() + remove.len();
    if total > MAX_MACS_PER_REQUEST {
        return Err(InvalidRequest::TooMany(total));
    }
    let parse = |v: &[String]| v.iter().map(|s| s.parse::<MacAddr>()).collect::<Result<Vec<_>, _>>();
    let (allow, deny, remove) = (parse(allow)?, parse(deny)?, parse(remove)?);
    let mut seen: BTreeMap<MacAddr, usize> = BTreeMap::new();
    for (i, list) in [&allow, &deny, &remove].into_iter().enumerate() {
        for m in list {
            if let Some(prev) = seen.insert(*m, i) {
                if prev != i {
                    return Err(InvalidRequest::Conflict(*m));
                }
            }
        }
    }
    let change = |mac: MacAddr, side, present| ReasonChange { mac, side, reason: API.to_string(), present };
    let mut out = Vec::with_capacity(2 * total);
    for m in allow {
        out.push(change(m, Side::Allow, true));
        out.push(change(m, Side::Deny, false));
    }
    for m in deny {
        out.push(change(m, Side::Deny, true));
        out.push(change(m, Side::Allow, false));
    }
    for m in remove {
        out.push(change(m, Side::Allow, false));
        out.push(change(m, Side::Deny, false));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, 0, n]).unwrap()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn api_changes_validate_everything_first() {
        let err = api_changes(&s(&["52:54:00:00:00:01", "nope"]), &[], &[]).unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
        let err = api_changes(&s(&["52:54:00:00:00:01"]), &s(&["52-54-00-00-00-01"]), &[]).unwrap_err();
        assert!(matches!(err, InvalidRequest::Conflict(_)), "{err}");
        assert!(api_changes(&vec!["52:54:00:00:00:01".to_string(); MAX_MACS_PER_REQUEST + 1], &[], &[]).is_err());
        // the same MAC twice in one list is fine
        assert_eq!(api_changes(&s(&["52:54:00:00:00:01", "52:54:00:00:00:01"]), &[], &[]).unwrap().len(), 4);
    }

    #[test]
    fn reasons_from_different_sources_do_not_undo_each_other() {
        let mut state: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        let mut run = |changes: Vec<ReasonChange>| {
            let snapshot = state.clone();
            let (updated, delta) = apply_changes(&|m| snapshot.get(m).cloned(), &changes);
            for (m, e) in updated {
                if e.is_empty() {
                    state.remove(&m);
                } else {
                    state.insert(m, e);
                }
            }
            delta
        };
        let d = run(api_changes(&[mac(1).to_string()], &[], &[]).unwrap());
        assert_eq!(d.allow_add, vec![mac(1)]);
        let d =
            run(vec![ReasonChange { mac: mac(1), side: Side::Allow, reason: "inspection:n1".into(), present: true }]);
        assert!(d.is_empty(), "a second allow reason changes no membership");
        let d = run(api_changes(&[], &[], &[mac(1).to_string()]).unwrap());
        assert!(d.is_empty(), "removing the api reason keeps the inspection's");
        let d =
            run(vec![ReasonChange { mac: mac(1), side: Side::Allow, reason: "inspection:n1".into(), present: false }]);
        assert_eq!(d.allow_remove, vec![mac(1)]);
        let d = run(api_changes(&[], &[mac(2).to_string()], &[]).unwrap());
        assert_eq!(d.deny_add, vec![mac(2)]);
        let d = run(api_changes(&[mac(2).to_string()], &[], &[]).unwrap());
        assert_eq!(
            (d.allow_add.clone(), d.deny_remove.clone()),
            (vec![mac(2)], vec![mac(2)]),
            "allow replaces the api deny"
        );
        assert_eq!(state.len(), 1);
    }
}
