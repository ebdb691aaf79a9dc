//! The singleton periodic tasks of inspection, run by the elected control-plane leader only:
//!
//! - `inspection-timeout`: inspections running longer than `timeout_secs` end in error.
//! - `ironic-sync`: the deny set becomes every port MAC Ironic knows (reason `ironic`); nodes deleted from Ironic are
//!   removed. Only the difference from the previous run becomes a filter change.
//! - `ironic-inspection`: the ports of nodes Ironic itself is inspecting (`inspect wait` / `inspecting`, with a
//!   configured inspect interface) are allowed (reason `ironic-inspection`), and denied again once they leave.
//!   It also publishes the effective unknown-MAC policy for `while-inspecting`.
//! - `clean-up`: finished inspections older than `clean_up_after_secs` are forgotten.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironguard_nft::{MacAddr, UnknownMacPolicy};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::engine::Engine;
use super::machine::State;
use super::records::{Kind, now_ms};
use crate::filter::{ReasonChange, Side};
use crate::singleton::PeriodicTask;

/// The deny reason of MACs known to Ironic.
pub const IRONIC: &str = "ironic";
/// The allow reason of MACs of nodes Ironic itself inspects.
pub const IRONIC_INSPECTION: &str = "ironic-inspection";

/// What the leader does with MACs in neither set (`[filter] unknown_mac_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicySetting {
    #[default]
    Allow,
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
    /// Period of that (cheap) poll, milliseconds.
    pub ironic_inspection_period_ms: u64,
    /// For `while-inspecting`: allow unknown MACs even when nothing is inspected (node auto-discovery).
    pub auto_discovery: bool,
    /// Period of the inspection timeout check, seconds.
    pub timeout_check_secs: u64,
    /// Period of the clean-up, seconds.
    pub clean_up_secs: u64,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            ironic_sync_secs: 15,
            ironic_inspection: true,
            ironic_inspect_interfaces: vec!["agent".into()],
            ironic_inspection_period_ms: 2000,
            auto_discovery: false,
            timeout_check_secs: 60,
            clean_up_secs: 600,
        }
    }
}

fn task(
    name: &'static str,
    period: Duration,
    f: impl Fn() -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send + Sync + 'static,
) -> PeriodicTask {
    PeriodicTask { name, period, run: Arc::new(move |_stop| f()) }
}

/// Turns "these MACs should carry `reason` on `side`" into reason changes against what carried it last time.
fn diff(side: Side, reason: &str, before: &BTreeSet<MacAddr>, after: &BTreeSet<MacAddr>) -> Vec<ReasonChange> {
    let mut out = Vec::new();
    for m in after.difference(before) {
        out.push(ReasonChange { mac: *m, side, reason: reason.to_string(), present: true });
    }
    for m in before.difference(after) {
        out.push(ReasonChange { mac: *m, side, reason: reason.to_string(), present: false });
    }
    out
}

/// MACs that currently carry `reason` on `side` in the filter state.
fn carrying(engine: &Engine, side: Side, reason: &str) -> BTreeSet<MacAddr> {
    let (_, entries) = engine.filters.entries(&[]);
    entries
        .into_iter()
        .filter(|(_, e)| match side {
            Side::Allow => e.allow.contains(reason),
            Side::Deny => e.deny.contains(reason),
        })
        .map(|(m, _)| m)
        .collect()
}

/// Every periodic task of inspection, for the singleton runner.
pub fn tasks(engine: Arc<Engine>, sync: SyncConfig, policy: PolicySetting) -> Vec<PeriodicTask> {
    let mut out = Vec::new();
    let e = engine.clone();
    out.push(task("inspection-timeout", Duration::from_secs(sync.timeout_check_secs.max(1)), move || {
        let e = e.clone();
        Box::pin(async move {
            let limit = e.cfg.timeout_secs * 1000;
            let now = now_ms();
            let pending = e.store.pending().await?;
            for rec in e.store.list().await? {
                let active = matches!(
                    rec.state,
                    State::Starting
                        | State::Waiting
                        | State::Processing
                        | State::Reapplying
                        | State::Aborting
                        | State::Enrolling
                );
                let old = rec.started_at.is_some_and(|t| now.saturating_sub(t) > limit);
                let queued = pending.iter().any(|r| r.node == rec.uuid && r.kind == Kind::Timeout);
                if active && old && !queued {
                    info!(node = %rec.uuid, "inspection timed out");
                    e.store.enqueue(&rec.uuid, Kind::Timeout, serde_json::Value::Null).await?;
                }
            }
            Ok(())
        })
    }));
    let e = engine.clone();
    out.push(task("clean-up", Duration::from_secs(sync.clean_up_secs.max(1)), move || {
        let e = e.clone();
        Box::pin(async move {
            let limit = e.cfg.clean_up_after_secs * 1000;
            let now = now_ms();
            for rec in e.store.list().await? {
                let done = matches!(rec.state, State::Finished | State::Error);
                if done && rec.finished_at.is_some_and(|t| now.saturating_sub(t) > limit) {
                    e.store.remove(&rec.uuid).await?;
                    info!(node = %rec.uuid, "old inspection data removed");
                }
            }
            Ok(())
        })
    }));
    if engine.ironic.is_none() {
        return out;
    }
    if sync.ironic_sync_secs > 0 {
        let e = engine.clone();
        let previous: Arc<Mutex<Option<BTreeSet<MacAddr>>>> = Arc::new(Mutex::new(None));
        out.push(task("ironic-sync", Duration::from_secs(sync.ironic_sync_secs), move || {
            let (e, previous) = (e.clone(), previous.clone());
            Box::pin(async move {
                let ironic = e.ironic.clone().ok_or_else(|| anyhow::anyhow!("no Ironic"))?;
                let ports = ironic.list_ports(None).await?;
                let now: BTreeSet<MacAddr> = ports.iter().filter_map(|p| p.address.parse().ok()).collect();
                let before = previous
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .clone()
                    .unwrap_or_else(|| carrying(&e, Side::Deny, IRONIC));
                let changes = diff(Side::Deny, IRONIC, &before, &now);
                if !changes.is_empty() {
                    let r = e.filters.apply(changes.clone(), None).await?;
                    info!(
                        changed = changes.len(),
                        known = now.len(),
                        revision = r.revision,
                        "deny set synchronised with Ironic's ports"
                    );
                }
                *previous.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = Some(now);
                // Nodes gone from Ironic.
                let nodes: BTreeSet<String> =
                    ironic.list_nodes(&[], "uuid").await?.into_iter().map(|n| n.uuid).collect();
                for rec in e.store.list().await? {
                    if !nodes.contains(&rec.uuid) {
                        info!(node = %rec.uuid, "node deleted from Ironic");
                        e.store.enqueue(&rec.uuid, Kind::Delete, serde_json::Value::Null).await?;
                    }
                }
                Ok(())
            })
        }));
    }
    if sync.ironic_inspection || policy == PolicySetting::WhileInspecting {
        let e = engine.clone();
        let previous: Arc<Mutex<Option<BTreeSet<MacAddr>>>> = Arc::new(Mutex::new(None));
        let sync2 = sync.clone();
        out.push(task(
            "ironic-inspection",
            Duration::from_millis(sync.ironic_inspection_period_ms.max(100)),
            move || {
                let (e, previous, sync) = (e.clone(), previous.clone(), sync2.clone());
                Box::pin(async move {
                    let ironic = e.ironic.clone().ok_or_else(|| anyhow::anyhow!("no Ironic"))?;
                    let nodes = ironic
                        .list_nodes(&["inspect wait", "inspecting"], "uuid,provision_state,inspect_interface")
                        .await?;
                    let nodes: Vec<_> = nodes
                        .into_iter()
                        .filter(|n| {
                            n.inspect_interface
                                .as_deref()
                                .is_some_and(|i| sync.ironic_inspect_interfaces.iter().any(|x| x == i))
                        })
                        .collect();
                    if sync.ironic_inspection {
                        let mut now = BTreeSet::new();
                        for n in &nodes {
                            for p in ironic.list_ports(Some(&n.uuid)).await? {
                                if let Ok(m) = p.address.parse() {
                                    now.insert(m);
                                }
                            }
                        }
                        let before = previous
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .clone()
                            .unwrap_or_else(|| carrying(&e, Side::Allow, IRONIC_INSPECTION));
                        let changes = diff(Side::Allow, IRONIC_INSPECTION, &before, &now);
                        if !changes.is_empty() {
                            let r = e.filters.apply(changes.clone(), None).await?;
                            info!(
                                nodes = nodes.len(),
                                changed = changes.len(),
                                revision = r.revision,
                                "Ironic's own inspections: allow set updated"
                            );
                        }
                        *previous.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = Some(now);
                    }
                    if policy == PolicySetting::WhileInspecting {
                        let ours = e
                            .store
                            .list()
                            .await?
                            .iter()
                            .any(|r| matches!(r.state, State::Starting | State::Waiting | State::Processing));
                        let effective = if ours || !nodes.is_empty() || sync.auto_discovery {
                            UnknownMacPolicy::Allow
                        } else {
                            UnknownMacPolicy::Deny
                        };
                        e.filters.apply(vec![], Some(effective)).await?;
                    }
                    Ok(())
                })
            },
        ));
    }
    out
}
