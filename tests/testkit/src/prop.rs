//! The property-test runner. Case counts come from the environment, so CI runs a few
//! thousand cases per pure property and `scripts/fuzz.sh` many more with the same tests:
//! `IRONGUARD_PROPTEST_CASES` for the pure parsers and decoders, `IRONGUARD_PROPTEST_NET_CASES` for the
//! properties that go over the network. A failing case is kept in the test's regressions file and replayed first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

/// The variable that sets the case count of the pure properties.
pub const CASES_VAR: &str = "IRONGUARD_PROPTEST_CASES";
/// The variable that sets the case count of the properties that go over the network.
pub const NET_CASES_VAR: &str = "IRONGUARD_PROPTEST_NET_CASES";

/// The number of cases: `var` if set to a number, else `default`.
pub fn cases(var: &str, default: u32) -> u32 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs one property for `cases` cases, persisting failures to `regressions` (a file the crate keeps under
/// version control), and prints `prop NAME: N cases in S s` (shown with `--nocapture`). Panics on a failure, with
/// the minimal failing case.
#[allow(clippy::panic)]
pub fn check<S: Strategy>(
    regressions: &'static str,
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..Config::default()
    };
    let ran = AtomicU64::new(0);
    let started = Instant::now();
    let result = TestRunner::new(config).run(&strategy, |v| {
        ran.fetch_add(1, Ordering::Relaxed);
        test(v)
    });
    eprintln!("prop {name}: {} cases in {:.2} s", ran.load(Ordering::Relaxed), started.elapsed().as_secs_f64());
    if let Err(e) = result {
        panic!("prop {name}: {e}");
    }
}
