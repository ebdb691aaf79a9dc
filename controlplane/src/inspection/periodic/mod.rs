//! The singleton periodic tasks of inspection, run by the elected control-plane leader only. One task, one type,
//! one file:
//!
//! - [`timeout::InspectionTimeout`]: inspections running longer than `timeout_secs` end in error.
//! - [`clean_up::CleanUp`]: finished inspections older than `clean_up_after_secs` are forgotten.
//! - [`stale_allows::StaleAllows`]: an inspection's allow that outlived the inspection is removed.
//! - [`ironic_sync::IronicSync`]: the deny set becomes every port MAC Ironic knows (reason `ironic`); nodes
//!   deleted from Ironic are removed.
//! - [`ironic_inspection::IronicInspections`]: the ports of nodes Ironic itself is inspecting are allowed (reason
//!   `ironic-inspection`) and denied again once they leave; it also publishes the effective unknown-MAC policy for
//!   `while-inspecting`.
//!
//! The two Ironic tasks keep a set of MACs under one reason in step with Ironic through [`mirror::ReasonMirror`],
//! which turns "these MACs should carry the reason now" into the difference from the last run.

mod clean_up;
mod ironic_inspection;
mod ironic_sync;
mod mirror;
mod stale_allows;
mod timeout;

pub use ironic_sync::HeldDrop;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use super::engine::Engine;
use crate::metrics::WhatLabel;
use crate::singleton::{Lead, PeriodicTask};
use crate::store::Fence;

/// The deny reason of MACs known to Ironic.
pub const IRONIC: &str = "ironic";
/// The allow reason of MACs of nodes Ironic itself inspects.
pub const IRONIC_INSPECTION: &str = "ironic-inspection";

/// What the leader does with MACs in neither set (`[filter] unknown_mac_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicySetting {
    Allow,
    /// The default: a MAC nobody allowed gets no DHCP.
    #[default]
    Deny,
    /// Allowed only while some node is being inspected (by ironguard or by Ironic), or with auto-discovery.
    WhileInspecting,
}

/// `[sync]` in the control-plane configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncConfig {
    /// Period of the full Ironic port synchronisation, seconds (0 disables it).
    pub ironic_sync_secs: u64,
    /// Allow the ports of nodes Ironic itself is inspecting.
    pub ironic_inspection: bool,
    /// Inspect interfaces whose nodes count (Ironic 39: "agent").
    pub ironic_inspect_interfaces: Vec<String>,
    /// Also allow nodes Ironic inspects while they are in maintenance (by default they get no DHCP: an operator
    /// who puts a node in maintenance wants it left alone).
    pub ironic_inspection_maintenance: bool,
    /// Period of that poll (a list of the nodes in `inspect wait` and `inspecting`), milliseconds.
    pub ironic_inspection_period_ms: u64,
    /// A node's ports are read when Ironic starts inspecting it and again once this many seconds have passed (not
    /// at every poll): a port added to or removed from a node during its inspection counts within this long. 0
    /// reads them at every poll.
    pub ironic_inspection_ports_secs: u64,
    /// Once Ironic has not answered that poll for this long (seconds), the `ironic-inspection` allows are dropped
    /// (DHCP closes for those nodes) until it answers again: an allow nobody can confirm does not stay open for a
    /// whole outage. 0 keeps them for ever.
    pub ironic_inspection_unreachable_secs: u64,
    /// For `while-inspecting`: allow unknown MACs even when nothing is inspected (node auto-discovery).
    pub auto_discovery: bool,
    /// Period of the inspection timeout check, seconds.
    pub timeout_check_secs: u64,
    /// Period of the clean-up, seconds.
    pub clean_up_secs: u64,
    /// The Ironic sync drops at most this share (percent) of the `ironic` denies, and of the inspections of nodes
    /// gone from Ironic, in one run once more than [`DROP_FLOOR`] would go. One short or empty answer from Ironic (a
    /// token scoped to another project, a database restored from an old backup) would otherwise open every denied
    /// MAC at once. A larger drop is held, and logged at every run with what to do, until an operator confirms it:
    /// by removing those denies by hand (`ironguardctl filters remove MAC... --reason ironic`), or by raising this
    /// to 100 for one run.
    pub ironic_drop_max_percent: u32,
}

/// Drops of this many or fewer always go through (`[sync] ironic_drop_max_percent` applies above it): a small site
/// deleting one node of two is not a mass drop.
pub const DROP_FLOOR: usize = 10;

/// Whether dropping `dropping` of `of` entries at once must wait for an operator.
pub(crate) fn drop_held(dropping: usize, of: usize, max_percent: u32) -> bool {
    dropping > DROP_FLOOR && (dropping as u128) * 100 > (of as u128) * u128::from(max_percent.min(100))
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            ironic_sync_secs: 15,
            ironic_inspection: true,
            ironic_inspect_interfaces: vec!["agent".into()],
            ironic_inspection_maintenance: false,
            ironic_inspection_period_ms: 2000,
            ironic_inspection_ports_secs: 10,
            ironic_inspection_unreachable_secs: 300,
            auto_discovery: false,
            timeout_check_secs: 60,
            clean_up_secs: 600,
            ironic_drop_max_percent: 25,
        }
    }
}

/// One periodic task: a run is idempotent (a new leader may repeat it at once).
#[async_trait]
trait Task: Send + Sync + 'static {
    /// One run. Its filter writes carry `fence` ([`FilterStore::apply_fenced`]): a replica that lost the lead
    /// while paused writes nothing.
    async fn run(&self, fence: &Fence) -> anyhow::Result<()>;
}

fn schedule(name: &'static str, period: Duration, task: impl Task) -> PeriodicTask {
    let task = Arc::new(task);
    PeriodicTask {
        name,
        period,
        run: Arc::new(move |lead: Lead| {
            let task = task.clone();
            Box::pin(async move { task.run(&lead.fence).await })
        }),
    }
}

/// Every periodic task of inspection, for the singleton runner.
pub fn tasks(
    engine: Arc<Engine>,
    sync: SyncConfig,
    policy: PolicySetting,
    held: Family<WhatLabel, Gauge>,
) -> Vec<PeriodicTask> {
    let mut out = vec![
        schedule(
            "inspection-timeout",
            Duration::from_secs(sync.timeout_check_secs.max(1)),
            timeout::InspectionTimeout::new(engine.clone()),
        ),
        schedule("clean-up", Duration::from_secs(sync.clean_up_secs.max(1)), clean_up::CleanUp::new(engine.clone())),
        schedule(
            "stale-allows",
            Duration::from_secs(sync.timeout_check_secs.clamp(1, 10)),
            stale_allows::StaleAllows::new(engine.clone()),
        ),
    ];
    let Some(ironic) = engine.ironic.clone() else {
        return out;
    };
    if sync.ironic_sync_secs > 0 {
        out.push(schedule(
            "ironic-sync",
            Duration::from_secs(sync.ironic_sync_secs),
            ironic_sync::IronicSync::new(engine.clone(), ironic.clone(), sync.ironic_drop_max_percent, held),
        ));
    }
    if sync.ironic_inspection || policy == PolicySetting::WhileInspecting {
        let period = Duration::from_millis(sync.ironic_inspection_period_ms.max(100));
        out.push(schedule(
            "ironic-inspection",
            period,
            ironic_inspection::IronicInspections::new(engine, ironic, sync, policy),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mass_drop_is_held_and_a_small_one_goes_through() {
        // at or under the floor: always
        assert!(!drop_held(DROP_FLOOR, DROP_FLOOR, 25));
        assert!(!drop_held(1, 2, 25));
        // over the floor: by the share
        assert!(drop_held(11, 11, 25), "every deny of a site at once");
        assert!(drop_held(1000, 1000, 25));
        assert!(!drop_held(25, 100, 25));
        assert!(drop_held(26, 100, 25));
        // 100: the operator confirmed
        assert!(!drop_held(1000, 1000, 100));
        assert!(!drop_held(1000, 1000, 250));
        // 0: nothing over the floor goes
        assert!(drop_held(11, 1_000_000, 0));
    }
}
