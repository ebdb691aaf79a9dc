//! Prometheus metrics of the agent and its admin endpoint (`/metrics`, `/healthz`, `/readyz`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabel {
    pub set: &'static str,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Apply latency by kind: full, delta, mode.
    pub apply_seconds: Family<KindLabel, Histogram>,
    pub set_size: Family<SetLabel, Gauge>,
    pub applied_revision: Gauge,
    pub lag: Gauge,
    /// 1 blocked, 2 follower, 3 leader.
    pub mode: Gauge,
    pub fail_closed: Family<CauseLabel, Counter>,
    pub netlink_errors: Counter,
    pub kernel_transactions: Counter,
    pub snapshots_applied: Counter,
    pub resumes: Counter,
    pub drift_repairs: Counter,
    /// Kernel lease refreshes (after keep-alives, or on the local backend's tick), and refreshes skipped because
    /// the keep-alive's deadline had already passed.
    pub lease_refreshes: Counter,
    pub lease_late: Counter,
    /// Lease writes repeated because the batch that carried the lease reached the kernel late (a starved agent).
    pub lease_rewrites: Counter,
    /// Guard rebuilds after a change notification or a read-back showed it deleted, flushed or altered.
    pub guard_repairs: Counter,
    /// 1 while the guard is whole (0: missing or wrong and the last repair failed: the agent does not lead).
    pub guard_ok: Gauge,
    /// Read-backs of the kernel that failed (after a bound in a row, the agent blocks).
    pub readback_errors: Counter,
    pub dhcp_healthy: Gauge,
    pub stream_connected: Gauge,
    /// etcd endpoints whose server lacks fixes the agent's leases rely on (`ironguard_coord::versions`); 0 without
    /// etcd, -1 until read.
    pub etcd_outdated: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("ironguard_agent");
        let apply_seconds = Family::<KindLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00002, 2.0, 18))
        });
        r.register("apply_seconds", "Kernel apply latency by kind (full, delta, mode)", apply_seconds.clone());
        let set_size = Family::<SetLabel, Gauge>::default();
        r.register("set_elements", "MACs in the allow and deny sets", set_size.clone());
        let applied_revision = Gauge::default();
        r.register("applied_revision", "Filter revision applied to the kernel", applied_revision.clone());
        let lag = Gauge::default();
        r.register("revision_lag", "Control plane revision minus applied revision, at the last report", lag.clone());
        let mode = Gauge::default();
        r.register("mode", "Firewall mode: 1 blocked, 2 follower, 3 leader", mode.clone());
        let fail_closed = Family::<CauseLabel, Counter>::default();
        r.register("fail_closed_transitions", "Transitions to Blocked by cause", fail_closed.clone());
        let netlink_errors = Counter::default();
        r.register("netlink_errors", "Failed kernel batches", netlink_errors.clone());
        let kernel_transactions = Counter::default();
        r.register("kernel_transactions", "Committed nf_tables transactions", kernel_transactions.clone());
        let snapshots_applied = Counter::default();
        r.register("snapshots_applied", "Full reloads from a control-plane snapshot", snapshots_applied.clone());
        let resumes = Counter::default();
        r.register(
            "stream_resumes",
            "Reconnections resumed from the applied revision without a full reload",
            resumes.clone(),
        );
        let drift_repairs = Counter::default();
        r.register("drift_repairs", "Full applies triggered by a read-back that differed", drift_repairs.clone());
        let lease_refreshes = Counter::default();
        r.register(
            "lease_refreshes",
            "Kernel lease refreshes (the leader's fence, enforced by the kernel)",
            lease_refreshes.clone(),
        );
        let lease_late = Counter::default();
        r.register("lease_late", "Keep-alives that came too late to refresh the kernel lease", lease_late.clone());
        let lease_rewrites = Counter::default();
        r.register(
            "lease_rewrites",
            "Kernel lease writes repeated because the batch reached the kernel late (the agent was starved)",
            lease_rewrites.clone(),
        );
        let guard_repairs = Counter::default();
        r.register("guard_repairs", "Guard rebuilds after it was deleted, flushed or altered", guard_repairs.clone());
        let guard_ok = Gauge::default();
        r.register(
            "guard_ok",
            "1 while the guard is whole; 0 when it is missing or wrong and cannot be repaired (the agent does not lead)",
            guard_ok.clone(),
        );
        let readback_errors = Counter::default();
        r.register("readback_errors", "Read-backs of the kernel that failed", readback_errors.clone());
        let dhcp_healthy = Gauge::default();
        r.register("dhcp_healthy", "1 if the local DHCP service is healthy", dhcp_healthy.clone());
        let stream_connected = Gauge::default();
        r.register("stream_connected", "1 while a WatchFilters stream is open", stream_connected.clone());
        let etcd_outdated = Gauge::default();
        etcd_outdated.set(-1);
        r.register(
            "etcd_servers_outdated",
            "etcd endpoints whose server version lacks lease or read fixes the agent relies on (see the log; -1 until \
             read)",
            etcd_outdated.clone(),
        );
        Self {
            registry: r,
            apply_seconds,
            set_size,
            applied_revision,
            lag,
            mode,
            fail_closed,
            netlink_errors,
            kernel_transactions,
            snapshots_applied,
            resumes,
            drift_repairs,
            lease_refreshes,
            lease_late,
            lease_rewrites,
            guard_repairs,
            guard_ok,
            readback_errors,
            dhcp_healthy,
            stream_connected,
            etcd_outdated,
        }
    }

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

/// What the admin endpoint serves.
#[derive(Debug, Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Filter state applied, control plane reachable, DHCP healthy.
    pub ready: Arc<AtomicBool>,
    /// Why not ready, in words.
    pub why: Arc<std::sync::Mutex<String>>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let why = s.why.lock().map(|w| w.clone()).unwrap_or_default();
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, format!("ready: {why}\n"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n"))
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
        m.fail_closed.get_or_create(&super::CauseLabel { cause: "store-amnesia" }).inc();
        m.apply_seconds.get_or_create(&super::KindLabel { kind: "full" }).observe(0.001);
        m.set_size.get_or_create(&super::SetLabel { set: "allow" }).set(1);
        let exported = m.encode();
        let missing = ironguard_testkit::metrics::missing_from(&exported, "ironguard_agent_");
        assert!(missing.is_empty(), "named in packaging/ but not exported: {missing:?}\n{exported}");
        let named = ironguard_testkit::metrics::named_with_prefix("ironguard_agent_").len();
        assert!(named >= 5, "only {named} ironguard_agent_* metrics named in packaging/");
    }
}
