//! The `PxeFilter` gRPC service.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use ironguard_dataplane::{MacAddr, UnknownMacPolicy};
use ironguard_proto::v1::pxe_filter_server::PxeFilter;
use ironguard_proto::v1::{
    self as pb, AgentStatus, ExplainMacRequest, FilterDelta, FilterEntry, FilterEvent, FilterSnapshot, FilterState,
    GetFilterStateRequest, Heartbeat, ListAgentsRequest, ListAgentsResponse, MacExplanation, ReportStatusResponse,
    UpdatePxeFiltersRequest, UpdatePxeFiltersResponse, WatchFiltersRequest, filter_event::Event,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{Instrument as _, info, info_span, warn};

use crate::agents::AgentRegistry;
use crate::filter::{self, RevisionDelta};
use crate::metrics::{AgentLabel, Metrics, ResultLabel};
use crate::store::{FilterStore, Snapshot};

/// Shared by every request handler.
pub struct PxeFilterService {
    /// For `ExplainMac`: inspection records and the Ironic client.
    pub engine: Arc<crate::inspection::engine::Engine>,
    /// Who may call what (checked first in every call).
    pub authz: Arc<crate::authz::Authz>,
    pub store: Arc<dyn FilterStore>,
    pub agents: Arc<AgentRegistry>,
    pub metrics: Arc<Metrics>,
    pub heartbeat: Duration,
    /// Becomes true on shutdown: open watch streams end, so the server can stop.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The discovery windows (sent to the agents of their network on their streams).
    pub windows: Arc<crate::discovery::Windows>,
    /// What this replica found wrong with its etcd servers' versions ([`ironguard_coord::versions::watch`]).
    pub etcd_warnings: Arc<std::sync::Mutex<Vec<String>>>,
}

impl std::fmt::Debug for PxeFilterService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PxeFilterService").finish_non_exhaustive()
    }
}

pub(crate) fn policy_to_pb(p: UnknownMacPolicy) -> pb::UnknownMacPolicy {
    match p {
        UnknownMacPolicy::Allow => pb::UnknownMacPolicy::Allow,
        UnknownMacPolicy::Deny => pb::UnknownMacPolicy::Deny,
    }
}

fn strings(v: impl IntoIterator<Item = MacAddr>) -> Vec<String> {
    v.into_iter().map(|m| m.to_string()).collect()
}

fn snapshot_event(s: Snapshot) -> FilterEvent {
    FilterEvent {
        event: Some(Event::Snapshot(FilterSnapshot {
            revision: s.revision,
            allow: strings(s.allow),
            deny: strings(s.deny),
            unknown_mac_policy: policy_to_pb(s.policy) as i32,
            epoch: s.epoch,
        })),
    }
}

fn delta_event(d: RevisionDelta, epoch: &str) -> FilterEvent {
    FilterEvent {
        event: Some(Event::Delta(FilterDelta {
            revision: d.revision,
            allow_add: strings(d.delta.allow_add),
            allow_remove: strings(d.delta.allow_remove),
            deny_add: strings(d.delta.deny_add),
            deny_remove: strings(d.delta.deny_remove),
            unknown_mac_policy: d.policy.map(|p| policy_to_pb(p) as i32).unwrap_or(0),
            epoch: epoch.to_string(),
        })),
    }
}

fn discovery_event(open_for: Duration) -> FilterEvent {
    let w = pb::DiscoveryWindow { open_for_ms: open_for.as_millis() as u64 };
    FilterEvent { event: Some(Event::Discovery(w)) }
}

fn window_status(e: crate::discovery::WindowError) -> Status {
    match e {
        crate::discovery::WindowError::Invalid(m) => Status::invalid_argument(m),
        e @ crate::discovery::WindowError::Store(_) => Status::unavailable(e.to_string()),
    }
}

impl PxeFilterService {
    /// The open windows, for the discovery calls.
    fn discovery_windows(&self) -> pb::DiscoveryWindows {
        let now = ironguard_proto::time::now_ms();
        let windows = self
            .windows
            .list()
            .into_iter()
            .map(|(network, w)| pb::DiscoveryWindowInfo {
                network,
                until_unix_ms: w.until_unix_ms,
                remaining_ms: w.until_unix_ms.saturating_sub(now),
                opened_by: w.opened_by,
            })
            .collect();
        pb::DiscoveryWindows { windows, note: self.windows.dhcp_note().unwrap_or_default().to_string() }
    }

    fn publish_gauges(&self) {
        let c = self.store.counts();
        self.metrics.revision.set(c.revision as i64);
        self.metrics.allowed.set(c.allow as i64);
        self.metrics.denied.set(c.deny as i64);
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<FilterEvent, Status>> + Send>>;

#[tonic::async_trait]
impl PxeFilter for PxeFilterService {
    async fn update_pxe_filters(
        &self,
        request: Request<UpdatePxeFiltersRequest>,
    ) -> Result<Response<UpdatePxeFiltersResponse>, Status> {
        let started = Instant::now();
        let operator = self.authz.operator(&request, "UpdatePxeFilters")?;
        let r = request.into_inner();
        let reason = if r.remove_reason.is_empty() { filter::API } else { r.remove_reason.as_str() };
        if reason != filter::API && r.remove.is_empty() {
            return Err(Status::invalid_argument("remove_reason is given but no MAC to remove"));
        }
        let changes = match filter::api_changes_with(&r.allow, &r.deny, &r.remove, reason) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.updates.get_or_create(&ResultLabel { result: "invalid" }).inc();
                warn!(error = %e, "UpdatePxeFilters rejected");
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        let applied = self.store.apply(changes, None).await.map_err(|e| {
            self.metrics.updates.get_or_create(&ResultLabel { result: "error" }).inc();
            Status::unavailable(format!("the filter state could not be saved: {e}"))
        })?;
        let changed = applied.record.as_ref().map(|r| r.delta.len()).unwrap_or(0) as u32;
        self.metrics.updates.get_or_create(&ResultLabel { result: "ok" }).inc();
        self.metrics.update_seconds.observe(started.elapsed().as_secs_f64());
        self.publish_gauges();
        info!(
            revision = applied.revision,
            allow = r.allow.len(),
            deny = r.deny.len(),
            remove = r.remove.len(),
            reason,
            changed,
            operator = %operator,
            "UpdatePxeFilters"
        );
        Ok(Response::new(UpdatePxeFiltersResponse { revision: applied.revision, changed }))
    }

    type WatchFiltersStream = EventStream;

    async fn watch_filters(&self, request: Request<WatchFiltersRequest>) -> Result<Response<EventStream>, Status> {
        if request.get_ref().agent_id.is_empty() {
            return Err(Status::invalid_argument("agent_id is required"));
        }
        self.authz.agent(&request, "WatchFilters", &request.get_ref().agent_id)?;
        let r = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<FilterEvent, Status>>(256);
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let heartbeat = self.heartbeat;
        let mut stopping = self.stopping.clone();
        let windows = self.windows.clone();
        let span = info_span!("watch", agent = %r.agent_id, host = %r.host, network = %r.network);
        tokio::spawn(
            async move {
                metrics.watchers.inc();
                let mut rev_rx = store.revision();
                // Start: deltas if the agent's state is of this store's epoch and the log still covers its
                // revision, else a snapshot. The deltas and heartbeats that follow carry the epoch they belong to.
                let mut epoch = r.epoch.clone();
                let mut last = match (r.since_revision, store.resume(r.since_revision, &r.epoch)) {
                    (since, Some(deltas)) if since > 0 => {
                        metrics.resumes_served.inc();
                        info!(since, deltas = deltas.len(), "agent resumes from its revision (no snapshot)");
                        let mut last = since;
                        for d in deltas {
                            last = d.revision;
                            if tx.send(Ok(delta_event(d, &epoch))).await.is_err() {
                                metrics.watchers.dec();
                                return;
                            }
                        }
                        last
                    }
                    (since, _) => {
                        let s = store.snapshot();
                        metrics.snapshots_sent.inc();
                        if since > 0 && r.epoch != s.epoch {
                            // Another history than the one the agent followed (this store was created again), or
                            // an agent that does not say: its revision means nothing here.
                            info!(since, agent_epoch = %r.epoch, epoch = %s.epoch, "the agent's state is of another store epoch");
                        }
                        info!(
                            since,
                            revision = s.revision,
                            allow = s.allow.len(),
                            deny = s.deny.len(),
                            "sending snapshot"
                        );
                        let rev = s.revision;
                        epoch = s.epoch.clone();
                        if tx.send(Ok(snapshot_event(s))).await.is_err() {
                            metrics.watchers.dec();
                            return;
                        }
                        rev
                    }
                };
                // The network's discovery window, if open (an agent's new stream starts closed), and its changes.
                let mut windows_rx = windows.changes();
                let open = windows.open_for(&r.network);
                let mut told_open = !open.is_zero();
                if told_open && tx.send(Ok(discovery_event(open))).await.is_err() {
                    metrics.watchers.dec();
                    return;
                }
                let mut tick = tokio::time::interval(heartbeat);
                tick.tick().await;
                loop {
                    tokio::select! {
                        changed = rev_rx.changed() => {
                            if changed.is_err() { break; }
                            match store.resume(last, &epoch) {
                                Some(deltas) => {
                                    for d in deltas {
                                        last = d.revision;
                                        if tx.send(Ok(delta_event(d, &epoch))).await.is_err() { break; }
                                    }
                                }
                                None => {
                                    // Fell behind the log while sending, or the store is another epoch now (an
                                    // etcd prefix emptied and written afresh): start over from a snapshot.
                                    let s = store.snapshot();
                                    metrics.snapshots_sent.inc();
                                    last = s.revision;
                                    epoch = s.epoch.clone();
                                    if tx.send(Ok(snapshot_event(s))).await.is_err() { break; }
                                }
                            }
                        }
                        _ = tick.tick() => {
                            let hb = Heartbeat { revision: last, epoch: epoch.clone() };
                            let hb = FilterEvent { event: Some(Event::Heartbeat(hb)) };
                            if tx.send(Ok(hb)).await.is_err() { break; }
                        }
                        changed = windows_rx.changed() => {
                            if changed.is_err() { break; }
                            let open = windows.open_for(&r.network);
                            if !open.is_zero() || told_open {
                                told_open = !open.is_zero();
                                if tx.send(Ok(discovery_event(open))).await.is_err() { break; }
                            }
                        }
                        _ = tx.closed() => break,
                        _ = async { let _ = stopping.wait_for(|s| *s).await; } => break,
                    }
                }
                metrics.watchers.dec();
                info!("watch ended");
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report_status(&self, request: Request<AgentStatus>) -> Result<Response<ReportStatusResponse>, Status> {
        if request.get_ref().agent_id.is_empty() {
            return Err(Status::invalid_argument("agent_id is required"));
        }
        self.authz.agent(&request, "ReportStatus", &request.get_ref().agent_id)?;
        let s = request.into_inner();
        let current = *self.store.revision().borrow();
        let label = AgentLabel { agent: s.agent_id.clone(), network: s.network.clone() };
        self.metrics.agent_lag.get_or_create(&label).set(current.saturating_sub(s.applied_revision) as i64);
        self.metrics.agent_mode.get_or_create(&label).set(s.mode as i64);
        let healthy = s.dhcp.as_ref().is_some_and(|d| d.healthy);
        self.metrics.agent_dhcp_healthy.get_or_create(&label).set(healthy as i64);
        self.agents.report(s).await;
        Ok(Response::new(ReportStatusResponse { current_revision: current }))
    }

    async fn get_filter_state(&self, request: Request<GetFilterStateRequest>) -> Result<Response<FilterState>, Status> {
        self.authz.operator(&request, "GetFilterState")?;
        let r = request.into_inner();
        let macs = r
            .macs
            .iter()
            .map(|m| m.parse::<MacAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let counts = self.store.counts();
        let (revision, entries) = self.store.entries(&macs);
        Ok(Response::new(FilterState {
            revision,
            entries: entries
                .into_iter()
                .map(|(mac, e)| FilterEntry {
                    mac: mac.to_string(),
                    allow_reasons: e.allow.iter().map(str::to_string).collect(),
                    deny_reasons: e.deny.iter().map(str::to_string).collect(),
                })
                .collect(),
            unknown_mac_policy: policy_to_pb(counts.policy) as i32,
            allow_count: counts.allow as u64,
            deny_count: counts.deny as u64,
        }))
    }

    async fn list_agents(&self, request: Request<ListAgentsRequest>) -> Result<Response<ListAgentsResponse>, Status> {
        self.authz.operator(&request, "ListAgents")?;
        let current = *self.store.revision().borrow();
        let (agents, leaders, mut warnings) = self.agents.list(current).await;
        let own = self.etcd_warnings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        warnings.splice(0..0, own.into_iter().map(|w| format!("control plane: {w}")));
        Ok(Response::new(ListAgentsResponse {
            current_revision: current,
            agents,
            coordination: self.agents.coordination().to_string(),
            leaders,
            store_amnesia: self.store.amnesia().unwrap_or_default(),
            warnings,
        }))
    }

    async fn open_discovery(
        &self,
        request: Request<pb::OpenDiscoveryRequest>,
    ) -> Result<Response<pb::DiscoveryWindows>, Status> {
        let operator = self.authz.operator(&request, "OpenDiscovery")?;
        let r = request.into_inner();
        self.windows.open(&r.network, r.seconds, &operator).await.map_err(window_status)?;
        Ok(Response::new(self.discovery_windows()))
    }

    async fn close_discovery(
        &self,
        request: Request<pb::CloseDiscoveryRequest>,
    ) -> Result<Response<pb::DiscoveryWindows>, Status> {
        let operator = self.authz.operator(&request, "CloseDiscovery")?;
        let r = request.into_inner();
        self.windows.close(&r.network, &operator).await.map_err(window_status)?;
        Ok(Response::new(self.discovery_windows()))
    }

    async fn list_discovery(
        &self,
        request: Request<pb::ListDiscoveryRequest>,
    ) -> Result<Response<pb::DiscoveryWindows>, Status> {
        self.authz.operator(&request, "ListDiscovery")?;
        Ok(Response::new(self.discovery_windows()))
    }

    async fn explain_mac(&self, request: Request<ExplainMacRequest>) -> Result<Response<MacExplanation>, Status> {
        self.authz.operator(&request, "ExplainMac")?;
        let mac = request.get_ref().mac.parse::<MacAddr>().map_err(|e| Status::invalid_argument(e.to_string()))?;
        let span = info_span!("explain_mac", %mac);
        let out = crate::explain::explain(self.store.as_ref(), &self.agents, &self.engine, mac).instrument(span).await;
        Ok(Response::new(out))
    }
}
