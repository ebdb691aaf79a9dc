//! The authoritative filter state: for each MAC, why it is allowed and why it is denied.
//!
//! A MAC is in the effective allow set while it has at least one allow reason, and in the deny set while it has
//! at least one deny reason (a MAC in both is served: the agents' whitelist comes first). Reasons belong to their
//! sources — `api` (UpdatePxeFilters), `inspection:<node>`, `ironic`, `ironic-inspection` — so one source never
//! undoes another's decision. Every change to the effective sets (or to the unknown-MAC policy) is one revision.

use std::collections::BTreeMap;

use ironguard_dataplane::{Delta, MacAddr, UnknownMacPolicy};
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

/// Reasons on one side of one MAC, each with when it was added (Unix milliseconds; 0 for a reason stored before
/// ironguard recorded times). The common reasons are bits with a fixed slot for their time, so the usual entry
/// allocates nothing beyond its map slot (100k MACs known to Ironic cost a few MB, not tens); other reasons
/// (`inspection:<node>`) are a list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reasons {
    common: u8,
    common_since: [u64; COMMON_REASONS.len()],
    other: Vec<(Box<str>, u64)>,
}

const COMMON_REASONS: [&str; 3] = [API, "ironic", "ironic-inspection"];

impl Reasons {
    pub fn is_empty(&self) -> bool {
        self.common == 0 && self.other.is_empty()
    }

    /// Adds a reason; true if it was new. A reason already present keeps the time it was first added.
    pub fn insert(&mut self, reason: &str) -> bool {
        self.insert_at(reason, 0)
    }

    /// Adds a reason added at `since_ms` (Unix milliseconds); true if it was new.
    pub fn insert_at(&mut self, reason: &str, since_ms: u64) -> bool {
        if let Some(i) = COMMON_REASONS.iter().position(|r| *r == reason) {
            let had = self.common & (1 << i) != 0;
            if !had {
                self.common |= 1 << i;
                self.common_since[i] = since_ms;
            }
            return !had;
        }
        match self.other.binary_search_by(|(r, _)| (**r).cmp(reason)) {
            Ok(_) => false,
            Err(at) => {
                self.other.insert(at, (reason.into(), since_ms));
                true
            }
        }
    }

    /// Drops a reason; true if it was there.
    pub fn remove(&mut self, reason: &str) -> bool {
        if let Some(i) = COMMON_REASONS.iter().position(|r| *r == reason) {
            let had = self.common & (1 << i) != 0;
            self.common &= !(1 << i);
            self.common_since[i] = 0;
            return had;
        }
        match self.other.binary_search_by(|(r, _)| (**r).cmp(reason)) {
            Ok(at) => {
                self.other.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, reason: &str) -> bool {
        match COMMON_REASONS.iter().position(|r| *r == reason) {
            Some(i) => self.common & (1 << i) != 0,
            None => self.other.binary_search_by(|(r, _)| (**r).cmp(reason)).is_ok(),
        }
    }

    /// The reasons, common ones first.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.with_since().map(|(r, _)| r)
    }

    /// The reasons with when each was added (Unix milliseconds; 0: not recorded), common ones first.
    pub fn with_since(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        COMMON_REASONS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.common & (1 << i) != 0)
            .map(|(i, r)| (*r, self.common_since[i]))
            .chain(self.other.iter().map(|(r, t)| (&**r, *t)))
    }
}

/// One stored reason: a bare string (no time recorded, as stored before times were kept) or with its time.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredReason {
    Bare(String),
    Timed { reason: String, since_ms: u64 },
}

impl Serialize for Reasons {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.with_since().map(|(r, t)| match t {
            0 => StoredReason::Bare(r.to_string()),
            t => StoredReason::Timed { reason: r.to_string(), since_ms: t },
        }))
    }
}

impl<'de> Deserialize<'de> for Reasons {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<StoredReason>::deserialize(d)?;
        let mut r = Reasons::default();
        for x in v {
            match x {
                StoredReason::Bare(reason) => r.insert(&reason),
                StoredReason::Timed { reason, since_ms } => r.insert_at(&reason, since_ms),
            };
        }
        Ok(r)
    }
}

/// The reasons recorded for one MAC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(default, skip_serializing_if = "Reasons::is_empty")]
    pub allow: Reasons,
    #[serde(default, skip_serializing_if = "Reasons::is_empty")]
    pub deny: Reasons,
    /// The revision that last changed this MAC's membership of the effective sets (0: not recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changed_revision: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Entry {
    /// No reason on either side (the entry is deleted).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    fn side_mut(&mut self, side: Side) -> &mut Reasons {
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

/// When a write happens: the time reasons it adds are stamped with, and the revision it creates if it changes
/// any membership (the store's current revision + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteStamp {
    pub now_ms: u64,
    pub next_revision: u64,
}

impl WriteStamp {
    /// Now, for a store at `revision`.
    pub fn now(revision: u64) -> Self {
        Self { now_ms: ironguard_proto::time::now_ms(), next_revision: revision + 1 }
    }
}

/// Applies reason changes to the entries they name (looked up with `get`), returning the new entries and the change
/// in effective membership. `get` sees the state before this call; entries that end up empty are returned empty
/// (the caller deletes them). New reasons are stamped with `stamp.now_ms`, and MACs whose membership changes with
/// `stamp.next_revision`. An entry is returned whenever its reasons changed, even if its membership did not: the
/// caller persists it (without a new revision).
pub fn apply_changes(
    get: &dyn Fn(&MacAddr) -> Option<Entry>,
    changes: &[ReasonChange],
    stamp: WriteStamp,
) -> (BTreeMap<MacAddr, Entry>, Delta) {
    let mut touched: BTreeMap<MacAddr, (Entry, Entry)> = BTreeMap::new();
    for c in changes {
        let (_, after) = touched.entry(c.mac).or_insert_with(|| {
            let e = get(&c.mac).unwrap_or_default();
            (e.clone(), e)
        });
        let set = after.side_mut(c.side);
        if c.present {
            set.insert_at(&c.reason, stamp.now_ms);
        } else {
            set.remove(&c.reason);
        }
    }
    let mut delta = Delta::default();
    let mut out = BTreeMap::new();
    for (mac, (before, mut after)) in touched {
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
        if before.allow.is_empty() != after.allow.is_empty() || before.deny.is_empty() != after.deny.is_empty() {
            after.changed_revision = stamp.next_revision;
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
    Mac(#[from] ironguard_dataplane::MacError),
    #[error("MAC {0} is named in more than one of allow, deny and remove")]
    Conflict(MacAddr),
    #[error("the request names {0} MACs; at most {MAX_MACS_PER_REQUEST} are accepted per request")]
    TooMany(usize),
    #[error("invalid reason {0:?}: 1 to 128 printable ASCII characters without spaces")]
    Reason(String),
}

/// Turns an `UpdatePxeFilters` request into reason changes. Every MAC is validated first, so a single bad one
/// rejects the whole request.
pub fn api_changes(allow: &[String], deny: &[String], remove: &[String]) -> Result<Vec<ReasonChange>, InvalidRequest> {
    api_changes_with(allow, deny, remove, API)
}

/// Like [`api_changes`], with `remove` dropping `remove_reason` (allow and deny side) instead of "api".
pub fn api_changes_with(
    allow: &[String],
    deny: &[String],
    remove: &[String],
    remove_reason: &str,
) -> Result<Vec<ReasonChange>, InvalidRequest> {
    if remove_reason.is_empty() || remove_reason.len() > 128 || !remove_reason.chars().all(|c| c.is_ascii_graphic()) {
        return Err(InvalidRequest::Reason(remove_reason.to_string()));
    }
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
        for side in [Side::Allow, Side::Deny] {
            out.push(ReasonChange { mac: m, side, reason: remove_reason.to_string(), present: false });
        }
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
    fn reasons_are_a_set_and_serialize_as_strings() {
        let mut r = Reasons::default();
        assert!(r.insert("inspection:b") && r.insert("api") && r.insert("inspection:a"));
        assert!(!r.insert("api"));
        assert_eq!(r.iter().collect::<Vec<_>>(), vec!["api", "inspection:a", "inspection:b"]);
        let json = serde_json::to_string(&Entry { allow: r.clone(), ..Entry::default() }).unwrap();
        assert_eq!(json, r#"{"allow":["api","inspection:a","inspection:b"]}"#);
        let back: Entry = serde_json::from_str(&json).unwrap();
        assert_eq!(back.allow, r);
        assert!(r.remove("api") && !r.remove("api") && r.remove("inspection:a"));
        assert!(r.contains("inspection:b") && !r.contains("ironic"));
    }

    #[test]
    fn reasons_from_different_sources_do_not_undo_each_other() {
        let mut state: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        let mut run = |changes: Vec<ReasonChange>| {
            let snapshot = state.clone();
            let (updated, delta) = apply_changes(&|m| snapshot.get(m).cloned(), &changes, WriteStamp::now(0));
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
