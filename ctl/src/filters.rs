//! `ironguardctl filters`: the requests it sends (`GetFilterState`, `UpdatePxeFilters`) and how their answers
//! read, as text or JSON.

use std::fmt::{self, Write as _};

use ironguard_dataplane::MacAddr;
use ironguard_proto::v1::{self as pb, FilterState, GetFilterStateRequest, UpdatePxeFiltersRequest};
use serde::{Serialize, Serializer};

use crate::table::Table;

/// What `filters allow|deny|remove` does to the "api" reasons of the MACs it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterAction {
    Allow,
    Deny,
    Remove,
}

impl fmt::Display for FilterAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Remove => "remove",
        })
    }
}

/// The `UpdatePxeFilters` request for `action` on `macs`, each MAC once, written in canonical form.
pub fn update_request(action: FilterAction, macs: &[MacAddr]) -> UpdatePxeFiltersRequest {
    let macs = canonical(macs);
    let mut request = UpdatePxeFiltersRequest::default();
    match action {
        FilterAction::Allow => request.allow = macs,
        FilterAction::Deny => request.deny = macs,
        FilterAction::Remove => request.remove = macs,
    }
    request
}

/// The `GetFilterState` request for `macs` (every MAC if empty).
pub fn state_request(macs: &[MacAddr]) -> GetFilterStateRequest {
    GetFilterStateRequest { macs: canonical(macs) }
}

fn canonical(macs: &[MacAddr]) -> Vec<String> {
    let mut seen = Vec::with_capacity(macs.len());
    for mac in macs {
        if !seen.contains(mac) {
            seen.push(*mac);
        }
    }
    seen.iter().map(MacAddr::to_string).collect()
}

/// The effective unknown-MAC policy. A value this build does not know is kept, not mistaken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownMacPolicy {
    Unspecified,
    Allow,
    Deny,
    Unrecognized(i32),
}

impl From<i32> for UnknownMacPolicy {
    fn from(value: i32) -> Self {
        match pb::UnknownMacPolicy::try_from(value) {
            Ok(pb::UnknownMacPolicy::Unspecified) => Self::Unspecified,
            Ok(pb::UnknownMacPolicy::Allow) => Self::Allow,
            Ok(pb::UnknownMacPolicy::Deny) => Self::Deny,
            Err(_) => Self::Unrecognized(value),
        }
    }
}

impl fmt::Display for UnknownMacPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unspecified => f.write_str("unspecified"),
            Self::Allow => f.write_str("allow"),
            Self::Deny => f.write_str("deny"),
            Self::Unrecognized(n) => write!(f, "unrecognized({n})"),
        }
    }
}

impl Serialize for UnknownMacPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The JSON document printed by `ironguardctl filters show --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilterStateReport {
    pub revision: u64,
    pub unknown_mac_policy: UnknownMacPolicy,
    /// MACs in the allow set, over the whole state (not only the MACs asked for).
    pub allow_count: u64,
    /// MACs in the deny set, over the whole state.
    pub deny_count: u64,
    pub entries: Vec<FilterEntryReport>,
    /// MACs asked for with `--mac` that the state does not list: the unknown-MAC policy applies to them.
    pub not_listed: Vec<MacAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilterEntryReport {
    pub mac: String,
    pub allow_reasons: Vec<String>,
    pub deny_reasons: Vec<String>,
}

impl FilterStateReport {
    /// The report on `state`, the answer to a request for `requested` (every MAC if empty).
    pub fn new(state: FilterState, requested: &[MacAddr]) -> Self {
        // Compare addresses, not spellings: the server may write a MAC in another case or with dashes.
        let listed = |mac: &MacAddr| state.entries.iter().any(|e| e.mac.parse::<MacAddr>().is_ok_and(|m| m == *mac));
        let mut not_listed: Vec<MacAddr> = Vec::new();
        for mac in requested {
            if !listed(mac) && !not_listed.contains(mac) {
                not_listed.push(*mac);
            }
        }
        Self {
            revision: state.revision,
            unknown_mac_policy: state.unknown_mac_policy.into(),
            allow_count: state.allow_count,
            deny_count: state.deny_count,
            entries: state
                .entries
                .into_iter()
                .map(|e| FilterEntryReport { mac: e.mac, allow_reasons: e.allow_reasons, deny_reasons: e.deny_reasons })
                .collect(),
            not_listed,
        }
    }

    /// Human-readable rendering: a header of revision, policy and counts, then one table row per MAC.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "revision: {}", self.revision);
        let _ = writeln!(out, "unknown-MAC policy: {}", self.unknown_mac_policy);
        let _ = writeln!(out, "allowed MACs: {}", self.allow_count);
        let _ = writeln!(out, "denied MACs: {}", self.deny_count);
        if self.entries.is_empty() {
            let _ = writeln!(out, "no MAC listed");
        } else {
            let mut table = Table::new(&["MAC", "ALLOWED BY", "DENIED BY"]);
            for e in &self.entries {
                table.row(vec![e.mac.clone(), reasons(&e.allow_reasons), reasons(&e.deny_reasons)]);
            }
            out.push_str(&table.render());
        }
        for mac in &self.not_listed {
            let _ = writeln!(out, "{mac}: not listed (unknown-MAC policy {} applies)", self.unknown_mac_policy);
        }
        out
    }
}

fn reasons(list: &[String]) -> String {
    if list.is_empty() { "-".to_string() } else { list.join(", ") }
}

/// What `filters allow|deny|remove` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateReport {
    pub action: FilterAction,
    /// How many distinct MACs were sent.
    pub sent: usize,
    pub revision: u64,
    pub changed: u32,
}

impl UpdateReport {
    pub fn new(request: &UpdatePxeFiltersRequest, action: FilterAction, answer: pb::UpdatePxeFiltersResponse) -> Self {
        let sent = request.allow.len() + request.deny.len() + request.remove.len();
        Self { action, sent, revision: answer.revision, changed: answer.changed }
    }

    /// One line: what was asked, how many MACs changed, and the revision that holds the change.
    pub fn render(&self) -> String {
        let macs = if self.sent == 1 { "MAC" } else { "MACs" };
        if self.changed == 0 {
            format!(
                "{}: {} {macs} sent, none changed; revision {} (unchanged)\n",
                self.action, self.sent, self.revision
            )
        } else {
            format!(
                "{}: {} {macs} sent, {} changed; revision {}\n",
                self.action, self.sent, self.changed, self.revision
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use ironguard_proto::v1::{FilterEntry, UpdatePxeFiltersResponse};

    use super::*;

    fn mac(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    fn sample_state() -> FilterState {
        FilterState {
            revision: 42,
            entries: vec![
                FilterEntry {
                    mac: "52:54:00:12:34:56".into(),
                    allow_reasons: vec!["api".into(), "inspection:node-1".into()],
                    deny_reasons: vec![],
                },
                FilterEntry {
                    mac: "52:54:00:ab:cd:ef".into(),
                    allow_reasons: vec![],
                    deny_reasons: vec!["ironic".into()],
                },
            ],
            unknown_mac_policy: pb::UnknownMacPolicy::Deny as i32,
            allow_count: 1,
            deny_count: 1,
        }
    }

    #[test]
    fn update_requests_put_canonical_distinct_macs_in_the_field_of_the_action() {
        let macs = [mac("52-54-00-AB-CD-EF"), mac("52:54:00:12:34:56"), mac("52:54:00:ab:cd:ef")];
        let want = vec!["52:54:00:ab:cd:ef".to_string(), "52:54:00:12:34:56".to_string()];
        let r = update_request(FilterAction::Allow, &macs);
        assert_eq!((r.allow, r.deny.len(), r.remove.len()), (want.clone(), 0, 0));
        let r = update_request(FilterAction::Deny, &macs);
        assert_eq!((r.allow.len(), r.deny, r.remove.len()), (0, want.clone(), 0));
        let r = update_request(FilterAction::Remove, &macs);
        assert_eq!((r.allow.len(), r.deny.len(), r.remove), (0, 0, want));
    }

    #[test]
    fn state_request_lists_the_macs_asked_for() {
        assert!(state_request(&[]).macs.is_empty());
        assert_eq!(state_request(&[mac("52:54:00:12:34:56")]).macs, ["52:54:00:12:34:56"]);
    }

    #[test]
    fn renders_the_state_as_a_table() {
        let report = FilterStateReport::new(sample_state(), &[]);
        assert_eq!(
            report.render(),
            "revision: 42\n\
             unknown-MAC policy: deny\n\
             allowed MACs: 1\n\
             denied MACs: 1\n\
             MAC                ALLOWED BY              DENIED BY\n\
             52:54:00:12:34:56  api, inspection:node-1  -\n\
             52:54:00:ab:cd:ef  -                       ironic\n"
        );
    }

    #[test]
    fn names_the_macs_asked_for_that_the_state_does_not_list() {
        let mut state = sample_state();
        state.entries.truncate(1);
        state.unknown_mac_policy = pb::UnknownMacPolicy::Allow as i32;
        let report = FilterStateReport::new(state, &[mac("52:54:00:12:34:56"), mac("52:54:00:00:00:01")]);
        assert_eq!(report.not_listed, [mac("52:54:00:00:00:01")]);
        let text = report.render();
        assert!(text.ends_with("52:54:00:00:00:01: not listed (unknown-MAC policy allow applies)\n"), "{text}");
    }

    #[test]
    fn an_empty_state_says_so() {
        let state = FilterState { revision: 3, ..FilterState::default() };
        assert_eq!(
            FilterStateReport::new(state, &[]).render(),
            "revision: 3\nunknown-MAC policy: unspecified\nallowed MACs: 0\ndenied MACs: 0\nno MAC listed\n"
        );
    }

    #[test]
    fn state_json_uses_strings_for_the_policy() {
        let report = FilterStateReport::new(sample_state(), &[mac("52:54:00:00:00:01")]);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "revision": 42,
                "unknown_mac_policy": "deny",
                "allow_count": 1,
                "deny_count": 1,
                "entries": [
                    {"mac": "52:54:00:12:34:56", "allow_reasons": ["api", "inspection:node-1"], "deny_reasons": []},
                    {"mac": "52:54:00:ab:cd:ef", "allow_reasons": [], "deny_reasons": ["ironic"]}
                ],
                "not_listed": ["52:54:00:00:00:01"]
            })
        );
    }

    #[test]
    fn a_policy_value_this_build_does_not_know_is_kept() {
        assert_eq!(UnknownMacPolicy::from(7), UnknownMacPolicy::Unrecognized(7));
        assert_eq!(serde_json::to_string(&UnknownMacPolicy::from(7)).unwrap(), r#""unrecognized(7)""#);
        assert_eq!(serde_json::to_string(&UnknownMacPolicy::from(1)).unwrap(), r#""allow""#);
    }

    #[test]
    fn renders_an_update() {
        let request = update_request(FilterAction::Deny, &[mac("52:54:00:12:34:56"), mac("52:54:00:ab:cd:ef")]);
        let report =
            UpdateReport::new(&request, FilterAction::Deny, UpdatePxeFiltersResponse { revision: 43, changed: 1 });
        assert_eq!(report.render(), "deny: 2 MACs sent, 1 changed; revision 43\n");

        let request = update_request(FilterAction::Remove, &[mac("52:54:00:12:34:56")]);
        let report =
            UpdateReport::new(&request, FilterAction::Remove, UpdatePxeFiltersResponse { revision: 43, changed: 0 });
        assert_eq!(report.render(), "remove: 1 MAC sent, none changed; revision 43 (unchanged)\n");
    }
}
