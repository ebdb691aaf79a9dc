//! Prometheus metrics of the control plane, served on the admin port at `/metrics`: [`Metrics`], set where things
//! happen, and [`StoreGauges`], read from the store at scrape.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::warn;

use crate::store::InspectionStore;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhatLabel {
    pub what: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabel {
    pub agent: String,
    pub network: String,
}

/// Every metric the control plane exports.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub revision: Gauge,
    pub allowed: Gauge,
    pub denied: Gauge,
    pub updates: Family<ResultLabel, Counter>,
    pub update_seconds: Histogram,
    pub watchers: Gauge,
    pub snapshots_sent: Counter,
    pub resumes_served: Counter,
    pub agent_lag: Family<AgentLabel, Gauge>,
    pub agent_mode: Family<AgentLabel, Gauge>,
    /// 1 while the agent reports its local DHCP server healthy (answering its probes), 0 otherwise.
    pub agent_dhcp_healthy: Family<AgentLabel, Gauge>,
    /// Ironic requests that got no usable answer (connection refused, timeout, TLS failure, 5xx, a locked node):
    /// each attempt counts, retries included.
    pub ironic_failed_attempts: Counter,
    /// 1 while the last Ironic call got an answer, 0 once a call gave up after its retries (-1 before any call).
    pub ironic_up: Gauge,
    /// Ironic requests sent, each attempt counted.
    pub ironic_requests: Counter,
    /// Moves from an Ironic API endpoint that did not answer to the next of `[ironic] url` and `fallback_urls`.
    pub ironic_failovers: Counter,
    /// What the Ironic sync holds back as a mass drop (`[sync] ironic_drop_max_percent`), by what: "denies"
    /// (`ironic` denies of ports Ironic no longer lists), "inspections" (of nodes it no longer lists). 0: nothing.
    pub ironic_sync_held: Family<WhatLabel, Gauge>,
    /// etcd endpoints whose server lacks fixes ironguard's leases rely on (`ironguard_coord::versions`), as read at
    /// start: 0 when all have them, or without etcd; -1 until read.
    pub etcd_outdated: Gauge,
    /// Queued inspection requests that could not be read and were moved to quarantine, in the whole store (every
    /// replica's): read at scrape ([`StoreGauges`]); -1 until read.
    pub inspection_quarantined: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ironguard_controlplane");
        let revision = Gauge::default();
        registry.register("filter_revision", "Current filter state revision", revision.clone());
        let allowed = Gauge::default();
        registry.register("allowed_macs", "MACs in the effective allow set", allowed.clone());
        let denied = Gauge::default();
        registry.register("denied_macs", "MACs in the effective deny set", denied.clone());
        let updates = Family::<ResultLabel, Counter>::default();
        registry.register("filter_updates", "UpdatePxeFilters requests by result", updates.clone());
        let update_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "filter_update_seconds",
            "UpdatePxeFilters latency (durable commit included)",
            update_seconds.clone(),
        );
        let watchers = Gauge::default();
        registry.register("watchers", "Open WatchFilters streams", watchers.clone());
        let snapshots_sent = Counter::default();
        registry.register("snapshots_sent", "Full snapshots sent to agents", snapshots_sent.clone());
        let resumes_served = Counter::default();
        registry.register(
            "resumes_served",
            "Watches resumed with deltas only (no full reload)",
            resumes_served.clone(),
        );
        let agent_lag = Family::<AgentLabel, Gauge>::default();
        registry.register(
            "agent_lag_revisions",
            "Current revision minus the agent's applied revision",
            agent_lag.clone(),
        );
        let agent_mode = Family::<AgentLabel, Gauge>::default();
        registry.register("agent_mode", "Agent mode: 1 blocked, 2 follower, 3 leader", agent_mode.clone());
        let agent_dhcp_healthy = Family::<AgentLabel, Gauge>::default();
        registry.register(
            "agent_dhcp_healthy",
            "1 while the agent reports its local DHCP server healthy (answering its probes)",
            agent_dhcp_healthy.clone(),
        );
        let ironic_failed_attempts = Counter::default();
        registry.register(
            "ironic_failed_attempts",
            "Ironic requests that got no usable answer (refused, timeout, TLS, 5xx, locked node), retries included",
            ironic_failed_attempts.clone(),
        );
        let ironic_up = Gauge::default();
        ironic_up.set(-1);
        registry.register(
            "ironic_up",
            "1 while the last Ironic call got an answer, 0 once a call gave up after its retries, -1 before any",
            ironic_up.clone(),
        );
        let ironic_requests = Counter::default();
        registry.register("ironic_requests", "Ironic requests sent, each attempt counted", ironic_requests.clone());
        let ironic_failovers = Counter::default();
        registry.register(
            "ironic_failovers",
            "Moves from an Ironic API endpoint that did not answer to the next of [ironic] url and fallback_urls",
            ironic_failovers.clone(),
        );
        let ironic_sync_held = Family::<WhatLabel, Gauge>::default();
        // Exported at 0 from the start: an alert on a series that appears only when it fires would never be tested.
        for what in ["denies", "inspections"] {
            ironic_sync_held.get_or_create(&WhatLabel { what }).set(0);
        }
        registry.register(
            "ironic_sync_held",
            "What the Ironic sync holds back as a mass drop until an operator confirms it: ironic denies of ports, or \
             inspections of nodes, that Ironic no longer lists (0: nothing held)",
            ironic_sync_held.clone(),
        );
        let etcd_outdated = Gauge::default();
        etcd_outdated.set(-1);
        registry.register(
            "etcd_servers_outdated",
            "etcd endpoints whose server version lacks lease or read fixes ironguard relies on (see the log and \
             ironguardctl agents for which; -1 until read)",
            etcd_outdated.clone(),
        );
        let inspection_quarantined = Gauge::default();
        inspection_quarantined.set(-1);
        registry.register(
            "inspection_quarantined",
            "Queued inspection requests that could not be read, moved to quarantine (ironguardctl inspect quarantine \
             lists them; -1 until read)",
            inspection_quarantined.clone(),
        );
        registry.register(
            "refusals",
            "Calls refused (bad or missing credentials, rate limit, oversized body), by kind; logged at most once a minute per kind and source",
            crate::refusals::counts(),
        );
        Self {
            registry,
            revision,
            allowed,
            denied,
            updates,
            update_seconds,
            watchers,
            snapshots_sent,
            resumes_served,
            agent_lag,
            agent_mode,
            agent_dhcp_healthy,
            ironic_failed_attempts,
            ironic_up,
            ironic_requests,
            ironic_failovers,
            ironic_sync_held,
            etcd_outdated,
            inspection_quarantined,
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Gauges read from the store when `/metrics` is scraped, so that every replica reports what the shared store holds
/// (a request quarantined by another replica's worker too) without a task of its own. A read takes at most
/// [`StoreGauges::READ_TIMEOUT`] (a failed one keeps the last value, and is logged), and the store is read at most
/// once per [`StoreGauges::MIN_AGE`] whoever scrapes: the admin port cannot be used to flood the store.
pub struct StoreGauges {
    inspections: Arc<dyn InspectionStore>,
    quarantined: Gauge,
    /// When the store was last read; `None`: read at the next scrape.
    read_at: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for StoreGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreGauges").field("quarantined", &self.quarantined.get()).finish()
    }
}

impl StoreGauges {
    pub const MIN_AGE: Duration = Duration::from_secs(1);
    pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

    pub fn new(inspections: Arc<dyn InspectionStore>, metrics: &Metrics) -> Self {
        Self { inspections, quarantined: metrics.inspection_quarantined.clone(), read_at: Default::default() }
    }

    /// Reads the store unless it was read less than [`Self::MIN_AGE`] ago.
    pub async fn refresh(&self) {
        let mut read_at = self.read_at.lock().await;
        if read_at.is_some_and(|t| t.elapsed() < Self::MIN_AGE) {
            return;
        }
        match tokio::time::timeout(Self::READ_TIMEOUT, self.inspections.quarantine_count()).await {
            Ok(Ok(n)) => {
                self.quarantined.set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            Ok(Err(e)) => {
                warn!(error = %e, "/metrics: cannot count the quarantined requests; the gauge keeps its value")
            }
            Err(_) => warn!(
                timeout = ?Self::READ_TIMEOUT,
                "/metrics: counting the quarantined requests took too long; the gauge keeps its value"
            ),
        }
        *read_at = Some(Instant::now());
    }

    /// The next scrape reads the store (this replica just changed what it counts).
    pub async fn invalidate(&self) {
        *self.read_at.lock().await = None;
    }
}

#[cfg(test)]
mod tests {
    /// The alert rules and the dashboard in packaging/ name only metrics this process exports (a renamed metric
    /// would leave an alert that can never fire). Counters and histograms are named by their series
    /// (see `ironguard_testkit::metrics`).
    #[test]
    fn packaging_names_only_exported_metrics() {
        // A family shows in the exposition once it has a series.
        let m = super::Metrics::new();
        let agent = super::AgentLabel { agent: "pxe-1".into(), network: "n".into() };
        m.agent_mode.get_or_create(&agent).set(3);
        m.agent_lag.get_or_create(&agent).set(0);
        m.agent_dhcp_healthy.get_or_create(&agent).set(1);
        m.updates.get_or_create(&super::ResultLabel { result: "ok" }).inc();
        let exported = m.encode();
        let missing = ironguard_testkit::metrics::missing_from(&exported, "ironguard_controlplane_");
        assert!(missing.is_empty(), "named in packaging/ but not exported: {missing:?}\n{exported}");
        let named = ironguard_testkit::metrics::named_with_prefix("ironguard_controlplane_").len();
        assert!(named >= 5, "only {named} ironguard_controlplane_* metrics named in packaging/");
        // The agent's metrics are checked by the agent's copy of this test; nothing else may be named.
        for (_, text) in ironguard_testkit::metrics::PACKAGED {
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let ours = word.starts_with("ironguard_agent_") || word.starts_with("ironguard_controlplane_");
                assert!(!word.starts_with("ironguard_") || ours || word == "ironguard_guard", "unknown metric {word}");
            }
        }
    }
}
