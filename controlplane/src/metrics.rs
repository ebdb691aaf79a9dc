//! Prometheus metrics of the control plane, served on the admin port at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
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
