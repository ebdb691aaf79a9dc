//! What the tests of ironguard's crates share: [`prop`], the property-test runner; [`hostile`], strategies for
//! hostile JSON and the IPA-shaped fixtures; and [`metrics`], the check that the alert rules and the dashboard in
//! `packaging/` name only metrics a process exports.

pub mod hostile;
pub mod metrics;
pub mod prop;
