//! Property tests of `UpdatePxeFilters` validation (`filter::api_changes_with`) on arbitrary strings: a request is
//! accepted exactly when every MAC parses, no MAC is in two lists, the request is not too large and the reason to
//! remove is 1 to 128 printable ASCII characters; otherwise it is an `InvalidRequest` and nothing changes. Accepted
//! requests, applied to the embedded store over a sequence, keep the store equal to a model built with the pure
//! `apply_changes`, and a revision is created exactly when the effective sets change.
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use ironguard_controlplane::filter::{
    API, Entry, InvalidRequest, MAX_MACS_PER_REQUEST, WriteStamp, api_changes_with, apply_changes,
};
use ironguard_dataplane::MacAddr;
use ironguard_testkit::hostile::text;
use ironguard_testkit::prop::check;
use proptest::prelude::*;

const DEFAULT_CASES: u32 = 3000;
/// Each case of the store property is a sequence of durable writes: fewer.
const DEFAULT_STORE_CASES: u32 = 300;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite/proptest-regressions/prop_filter.txt");

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_CASES", DEFAULT_CASES)
}

fn store_cases() -> u32 {
    // The store cases scale with the pure ones (fuzz.sh raises both).
    let pure = cases();
    (pure / (DEFAULT_CASES / DEFAULT_STORE_CASES)).max(1)
}

/// MAC-ish strings: a small pool of valid ones (so lists overlap), their other notations, and junk.
fn mac_text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (1u8..6).prop_map(|i| format!("52:54:00:00:00:0{i}")),
        2 => (1u8..6).prop_map(|i| format!("52-54-00-00-00-0{i}")),
        1 => (1u8..6).prop_map(|i| format!("52:54:00:00:00:0{i}").to_uppercase()),
        1 => text(),
        1 => prop::sample::select(vec!["ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "00:00:00:00:00:00", " 52:54:00:00:00:01", "52:54:00:00:00:01 "]).prop_map(str::to_owned),
    ]
    .boxed()
}

fn reason() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just(API.to_owned()),
        2 => "inspection:[0-9a-f-]{1,36}",
        1 => text(),
        1 => Just(String::new()),
        1 => Just("x".repeat(129)),
        1 => Just("x".repeat(128)),
        1 => Just("a b".to_owned()),
    ]
    .boxed()
}

fn request() -> impl Strategy<Value = (Vec<String>, Vec<String>, Vec<String>, String)> {
    (
        prop::collection::vec(mac_text(), 0..4),
        prop::collection::vec(mac_text(), 0..4),
        prop::collection::vec(mac_text(), 0..4),
        reason(),
    )
}

/// The rule, written independently of the code under test.
fn acceptable(allow: &[String], deny: &[String], remove: &[String], reason: &str) -> bool {
    let reason_ok = !reason.is_empty() && reason.len() <= 128 && reason.bytes().all(|b| b.is_ascii_graphic());
    let count_ok = allow.len() + deny.len() + remove.len() <= MAX_MACS_PER_REQUEST;
    let parse = |v: &[String]| v.iter().map(|s| s.parse::<MacAddr>().ok()).collect::<Option<BTreeSet<MacAddr>>>();
    let (Some(a), Some(d), Some(r)) = (parse(allow), parse(deny), parse(remove)) else { return false };
    let disjoint = a.is_disjoint(&d) && a.is_disjoint(&r) && d.is_disjoint(&r);
    reason_ok && count_ok && disjoint
}

#[test]
fn requests_are_accepted_exactly_when_valid() {
    check(REGRESSIONS, "filter_request_validation", cases(), request(), |(allow, deny, remove, reason)| {
        let got = api_changes_with(&allow, &deny, &remove, &reason);
        prop_assert_eq!(got.is_ok(), acceptable(&allow, &deny, &remove, &reason), "{:?}", got);
        match got {
            Ok(changes) => {
                // Allow and deny carry the api reason; remove drops the given one; nothing else is touched.
                let named: BTreeSet<MacAddr> =
                    allow.iter().chain(&deny).chain(&remove).map(|s| s.parse().unwrap()).collect();
                for c in &changes {
                    prop_assert!(named.contains(&c.mac));
                    prop_assert!(c.reason == API || (!c.present && c.reason == reason));
                }
            }
            Err(InvalidRequest::Mac(e)) => {
                // The error quotes the offending input.
                prop_assert!(allow.iter().chain(&deny).chain(&remove).any(|s| s.starts_with(&e.input)));
            }
            Err(InvalidRequest::Reason(r)) => prop_assert_eq!(r, reason),
            Err(_) => {}
        }
        Ok(())
    });
}

/// The reasons of each MAC, without the times and revisions they were recorded at (the model's clock is not the
/// store's).
fn reasons(m: &BTreeMap<MacAddr, Entry>) -> BTreeMap<MacAddr, (Vec<String>, Vec<String>)> {
    let list = |r: &ironguard_controlplane::filter::Reasons| r.iter().map(str::to_string).collect::<Vec<_>>();
    m.iter().map(|(k, e)| (*k, (list(&e.allow), list(&e.deny)))).collect()
}

#[test]
fn accepted_requests_change_the_store_as_the_model_says_and_refused_ones_change_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("ig-prop-filter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // One store for every case (opening one costs more than a case): each case starts from what the earlier
    // ones left, read back as the model's starting point.
    let store = ironguard_controlplane::store::embedded::open(&dir, 1000).unwrap().filters;
    let strategy = prop::collection::vec(request(), 1..6);
    check(REGRESSIONS, "filter_store_model", store_cases(), strategy, |requests| {
        let mut model: BTreeMap<MacAddr, Entry> = store.entries(&[]).1.into_iter().collect();
        rt.block_on(async {
            for (allow, deny, remove, reason) in &requests {
                let before = store.entries(&[]);
                match api_changes_with(allow, deny, remove, reason) {
                    Err(_) => {
                        prop_assert_eq!(store.entries(&[]), before, "a refused request changed the store");
                    }
                    Ok(changes) => {
                        let snapshot = model.clone();
                        let (updated, delta) =
                            apply_changes(&|m| snapshot.get(m).cloned(), &changes, WriteStamp::now(0));
                        for (m, e) in updated {
                            if e.is_empty() {
                                model.remove(&m);
                            } else {
                                model.insert(m, e);
                            }
                        }
                        let applied = store.apply(changes, None).await.unwrap();
                        prop_assert_eq!(applied.record.is_some(), !delta.is_empty(), "a revision iff the sets change");
                        prop_assert_eq!(applied.revision, before.0 + u64::from(!delta.is_empty()));
                        let (_, entries) = store.entries(&[]);
                        let stored: BTreeMap<MacAddr, Entry> = entries.into_iter().collect();
                        prop_assert_eq!(reasons(&stored), reasons(&model));
                    }
                }
            }
            Ok(())
        })
    });
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
