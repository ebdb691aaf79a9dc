//! The inspection engine: the public operations (start, continue, abort, reapply) that validate and enqueue, and
//! the pool of workers that take requests, lock the node, advance the machine, save, run the task, and only then
//! consume the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_coord::{Coordinator, Session};
use ironguard_nft::MacAddr;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info, info_span, warn};

use super::machine::{self, Event, State};
use super::records::{Kind, NodeRecord, Taken, now_ms};
use crate::agents::AgentRegistry;
use crate::filter::{ReasonChange, Side};
use crate::ironic::{Ironic, IronicError};
use crate::store::{FilterStore, InspectionStore, StoreError};

/// Provision states in which Ironic lets a node be inspected.
pub const INSPECTABLE: [&str; 5] = ["enroll", "manageable", "inspecting", "inspect wait", "inspect failed"];

/// `[inspection]` in the control-plane configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InspectionConfig {
    /// Worker tasks taking requests (0: the number of CPUs).
    pub workers: usize,
    /// How long a worker waits for a request before looking again, milliseconds.
    pub take_timeout_ms: u64,
    /// A taken request not consumed within this lease is delivered again (a live worker renews it), milliseconds.
    pub request_lease_ms: u64,
    /// How long `start` waits for the leader agent to apply the node's allow, seconds.
    pub allow_timeout_secs: u64,
    /// Power the node off when processing, abort or timeout ends an inspection it booted.
    pub power_off: bool,
    /// Reboot throttle: hold a distributed lock while powering on, then sleep this long (0: off), milliseconds.
    pub reboot_quantum_ms: u64,
    /// Agent network whose leader must apply the allow (empty: any network).
    pub network: String,
    /// Inspections running longer than this end in error (the singleton timeout task), seconds.
    pub timeout_secs: u64,
    /// Finished inspections older than this are removed by the clean-up task, seconds.
    pub clean_up_after_secs: u64,
}

impl Default for InspectionConfig {
    fn default() -> Self {
        Self {
            workers: 0,
            take_timeout_ms: 3000,
            request_lease_ms: 30_000,
            allow_timeout_secs: 30,
            power_off: true,
            reboot_quantum_ms: 0,
            network: String::new(),
            timeout_secs: 3600,
            clean_up_after_secs: 86_400,
        }
    }
}

/// Why a public operation was refused. Nothing was enqueued.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("node {0} is not known to Ironic")]
    UnknownNode(String),
    #[error("node {node} is in provision state {state:?}; inspection needs one of {}", INSPECTABLE.join(", "))]
    ProvisionState { node: String, state: String },
    #[error("node {node}: {source}")]
    Illegal {
        node: String,
        #[source]
        source: machine::IllegalTransition,
    },
    #[error("no node is waiting for inspection data with these MAC or BMC addresses: {0}")]
    NoMatch(String),
    #[error("invalid introspection data: {0}")]
    BadData(String),
    #[error("node {0} has no stored introspection data to reapply")]
    NoData(String),
    #[error("Ironic is not configured ([ironic] url): inspections cannot run")]
    NoIronic,
    #[error(transparent)]
    Ironic(#[from] IronicError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A processing hook: runs on the ramdisk's data when it arrives (and on reapply).
pub trait ProcessingHook: Send + Sync {
    fn name(&self) -> &'static str;
    /// May enrich `data`; an error fails the inspection with the message.
    fn process(&self, node: &NodeRecord, data: &mut Value) -> Result<(), String>;
}

/// The minimal built-in hook: stamps the data with the node and the time it was processed.
#[derive(Debug)]
pub struct RecordData;

impl ProcessingHook for RecordData {
    fn name(&self) -> &'static str {
        "record"
    }

    fn process(&self, node: &NodeRecord, data: &mut Value) -> Result<(), String> {
        let obj = data.as_object_mut().ok_or("introspection data must be a JSON object")?;
        obj.insert("ironguard".into(), serde_json::json!({"node": node.uuid, "processed_at_ms": now_ms()}));
        Ok(())
    }
}

/// Where a test makes the worker process die (`IRONGUARD_TEST_CRASH=<point>:<kind>`), to prove redelivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// After taking the request, before saving the transition.
    BeforeTransition(Kind),
    /// After the task, before saving its outcome and consuming the request.
    AfterTask(Kind),
}

impl CrashPoint {
    pub fn from_env() -> Option<Self> {
        Self::parse(&std::env::var("IRONGUARD_TEST_CRASH").ok()?)
    }

    /// `before-transition:process`, `after-task:start`, ...
    pub fn parse(v: &str) -> Option<Self> {
        let (point, kind) = v.split_once(':')?;
        let kind: Kind = serde_json::from_value(Value::String(kind.to_string())).ok()?;
        match point {
            "before-transition" => Some(CrashPoint::BeforeTransition(kind)),
            "after-task" => Some(CrashPoint::AfterTask(kind)),
            _ => None,
        }
    }
}

/// The inspection engine.
pub struct Engine {
    pub store: Arc<dyn InspectionStore>,
    pub filters: Arc<dyn FilterStore>,
    pub agents: Arc<AgentRegistry>,
    pub ironic: Option<Arc<Ironic>>,
    pub coord: Arc<dyn Coordinator>,
    pub cfg: InspectionConfig,
    pub hooks: Vec<Box<dyn ProcessingHook>>,
    pub crash: Option<CrashPoint>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// The reason recorded for a node's allow during its inspection.
pub fn reason(node: &str) -> String {
    format!("inspection:{node}")
}

/// MAC addresses announced in introspection data (ironic-python-agent's `inventory.interfaces`, or a plain
/// `macs` list), and the BMC address.
pub fn data_addresses(data: &Value) -> (Vec<MacAddr>, Vec<String>) {
    let mut macs = vec![];
    let mut bmcs = vec![];
    if let Some(ifaces) = data["inventory"]["interfaces"].as_array() {
        for i in ifaces {
            if let Some(m) = i["mac_address"].as_str().and_then(|s| s.parse().ok()) {
                macs.push(m);
            }
        }
    }
    if let Some(list) = data["macs"].as_array() {
        macs.extend(list.iter().filter_map(|m| m.as_str()?.parse::<MacAddr>().ok()));
    }
    for key in ["bmc_address", "bmc_v6address"] {
        if let Some(b) = data["inventory"][key].as_str().filter(|b| !b.is_empty() && *b != "0.0.0.0") {
            bmcs.push(b.to_string());
        }
    }
    (macs, bmcs)
}

impl Engine {
    fn ironic(&self) -> Result<&Arc<Ironic>, ApiError> {
        self.ironic.as_ref().ok_or(ApiError::NoIronic)
    }

    async fn record(&self, node: &str) -> Result<NodeRecord, ApiError> {
        Ok(self.store.get(node).await?.unwrap_or_else(|| NodeRecord::new(node)))
    }

    /// Starts (or restarts) the inspection of `node` (UUID or name).
    pub async fn start(&self, node: &str, manage_boot: bool) -> Result<(NodeRecord, u64), ApiError> {
        let ironic = self.ironic()?;
        let n = match ironic.get_node(node).await {
            Ok(n) => n,
            Err(IronicError::NotFound { .. }) => return Err(ApiError::UnknownNode(node.to_string())),
            Err(e) => return Err(e.into()),
        };
        let state = n.provision_state.clone().unwrap_or_default();
        if !INSPECTABLE.contains(&state.as_str()) {
            return Err(ApiError::ProvisionState { node: n.uuid.clone(), state });
        }
        let rec = self.record(&n.uuid).await?;
        machine::advance(rec.state, Event::Start)
            .map_err(|source| ApiError::Illegal { node: n.uuid.clone(), source })?;
        let id = self.store.enqueue(&n.uuid, Kind::Start, serde_json::json!({"manage_boot": manage_boot})).await?;
        info!(node = %n.uuid, request = id, "inspection requested");
        Ok((rec, id))
    }

    /// The ramdisk's data: finds the waiting node it belongs to and enqueues processing. Returns the node UUID.
    pub async fn continue_inspection(&self, data: Value) -> Result<String, ApiError> {
        if !data.is_object() {
            return Err(ApiError::BadData("expected a JSON object".into()));
        }
        let (macs, bmcs) = data_addresses(&data);
        if macs.is_empty() && bmcs.is_empty() {
            return Err(ApiError::BadData(
                "no interface MAC (inventory.interfaces[].mac_address) and no BMC address".into(),
            ));
        }
        let candidates: Vec<NodeRecord> = self
            .store
            .list()
            .await?
            .into_iter()
            .filter(|r| r.state == State::Waiting)
            .filter(|r| r.macs.iter().any(|m| macs.contains(m)) || r.bmc_addresses.iter().any(|b| bmcs.contains(b)))
            .collect();
        let node = match candidates.as_slice() {
            [one] => one.clone(),
            [] => {
                let what =
                    macs.iter().map(|m| m.to_string()).chain(bmcs.iter().cloned()).collect::<Vec<_>>().join(", ");
                return Err(ApiError::NoMatch(what));
            }
            many => {
                return Err(ApiError::BadData(format!(
                    "the addresses match several waiting nodes: {}",
                    many.iter().map(|r| r.uuid.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
        };
        machine::advance(node.state, Event::Process)
            .map_err(|source| ApiError::Illegal { node: node.uuid.clone(), source })?;
        let id = self.store.enqueue(&node.uuid, Kind::Process, data).await?;
        info!(node = %node.uuid, request = id, "introspection data received");
        Ok(node.uuid)
    }

    pub async fn abort(&self, node: &str) -> Result<u64, ApiError> {
        let rec = self.store.get(node).await?.ok_or_else(|| ApiError::UnknownNode(node.to_string()))?;
        machine::advance(rec.state, Event::Abort)
            .map_err(|source| ApiError::Illegal { node: node.to_string(), source })?;
        Ok(self.store.enqueue(node, Kind::Abort, Value::Null).await?)
    }

    pub async fn reapply(&self, node: &str) -> Result<u64, ApiError> {
        let rec = self.store.get(node).await?.ok_or_else(|| ApiError::UnknownNode(node.to_string()))?;
        machine::advance(rec.state, Event::Reapply)
            .map_err(|source| ApiError::Illegal { node: node.to_string(), source })?;
        if self.store.get_data(node).await?.is_none() {
            return Err(ApiError::NoData(node.to_string()));
        }
        Ok(self.store.enqueue(node, Kind::Reapply, Value::Null).await?)
    }

    /// Runs `workers` worker tasks until `shutdown`.
    pub fn spawn_workers(
        self: &Arc<Self>,
        replica: &str,
        shutdown: CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let n = if self.cfg.workers == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
        } else {
            self.cfg.workers
        };
        (0..n)
            .map(|i| {
                let e = self.clone();
                let id = format!("{replica}/worker-{i}");
                let stop = shutdown.clone();
                tokio::spawn(async move { e.worker(id, stop).await })
            })
            .collect()
    }

    async fn worker(self: Arc<Self>, id: String, stop: CancellationToken) {
        let lease = Duration::from_millis(self.cfg.request_lease_ms);
        let mut wake = self.store.wakeups();
        // One session per worker: its node locks vanish with it.
        let session = loop {
            match self.coord.session(Duration::from_secs(10)).await {
                Ok(s) => break s,
                Err(e) => {
                    warn!(worker = %id, error = %e, "no coordination session yet");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = stop.cancelled() => return }
                }
            }
        };
        while !stop.is_cancelled() {
            let taken = match self.store.take(&id, lease).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    tokio::select! {
                        _ = wake.changed() => {}
                        _ = tokio::time::sleep(Duration::from_millis(self.cfg.take_timeout_ms)) => {}
                        _ = stop.cancelled() => return,
                    }
                    continue;
                }
                Err(e) => {
                    warn!(worker = %id, error = %e, "cannot take a request");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => return }
                    continue;
                }
            };
            let span = info_span!("request", node = %taken.request.node, kind = ?taken.request.kind, id = taken.request.id, attempt = taken.attempt);
            self.handle(taken, &session, &stop).instrument(span).await;
        }
    }

    /// One request: lock, transition, task, outcome, consume.
    pub async fn handle(&self, taken: Taken, session: &Session, stop: &CancellationToken) {
        let node = taken.request.node.clone();
        let lock_cancel = CancellationToken::new();
        let c2 = lock_cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c2.cancel();
        });
        let guard = match self.coord.lock(&format!("node/{node}"), session, lock_cancel).await {
            Ok(g) => g,
            Err(_) => {
                info!("node is locked by another worker; leaving the request for later");
                let _ = self.store.release(&taken, Duration::from_millis(200)).await;
                return;
            }
        };
        timer.abort();
        // Renew the request's lease while the task runs.
        let extender = {
            let store = self.store.clone();
            let t = taken.clone();
            let lease = Duration::from_millis(self.cfg.request_lease_ms);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(lease / 3).await;
                    let _ = store.extend(&t, lease).await;
                }
            })
        };
        let outcome = self.run(&taken, stop).await;
        extender.abort();
        match outcome {
            Ok(()) => {
                if let Err(e) = self.store.consume(&taken).await {
                    error!(error = %e, "could not consume the request; it will be delivered again");
                }
            }
            Err(e) => {
                // Store trouble: leave the request; it is delivered again after its lease.
                error!(error = %e, "request not completed; it will be delivered again");
            }
        }
        let _ = self.coord.unlock(&guard).await;
    }

    /// Test hook: stops the worker at `point` and keeps the process alive so a test can SIGKILL it right there.
    fn crash_if(&self, point: CrashPoint) {
        if self.crash == Some(point) {
            error!(?point, "IRONGUARD_TEST_CRASH: worker stopped here, waiting to be killed");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    /// Advances the machine and runs the task. `Err` only for store failures (the request stays).
    async fn run(&self, taken: &Taken, stop: &CancellationToken) -> Result<(), StoreError> {
        let req = &taken.request;
        if req.kind == Kind::Delete {
            self.remove_allow(&req.node).await;
            self.store.remove(&req.node).await?;
            info!("node deleted from Ironic: removed");
            return Ok(());
        }
        let mut rec = self.store.get(&req.node).await?.unwrap_or_else(|| NodeRecord::new(&req.node));
        let Some(event) = req.kind.event() else { return Ok(()) };
        if event.is_strict() && rec.strict_request == Some(req.id) {
            let in_progress = match event {
                Event::Process => State::Processing,
                Event::Abort => State::Aborting,
                _ => State::Reapplying,
            };
            if rec.state != in_progress {
                // The request completed; only its consumption was lost.
                info!(state = %rec.state, "request already completed; dropped");
                return Ok(());
            }
            // Déjà vu: a worker applied this strict transition, then died. Do not repeat the task.
            let msg = format!("a worker stopped while running '{event}' for request {}; not repeated", req.id);
            warn!("{msg}");
            self.cleanup(&rec).await;
            return self.fail(&mut rec, msg).await;
        }
        self.crash_if(CrashPoint::BeforeTransition(req.kind));
        let redelivered_start = req.kind == Kind::Start && rec.state == State::Starting && taken.attempt > 1;
        if !redelivered_start {
            match machine::advance(rec.state, event) {
                Ok(to) => rec.state = to,
                Err(e) => {
                    warn!(error = %e, "request no longer applies; dropped");
                    return Ok(());
                }
            }
            if event.is_strict() {
                rec.strict_request = Some(req.id);
            }
            if req.kind == Kind::Timeout {
                // The timeout event lands in `error` before its task runs: say why from the start.
                rec.error = Some(format!("inspection timed out after {} s", self.cfg.timeout_secs));
                rec.finished_at = Some(now_ms());
            }
            if req.kind == Kind::Start {
                rec.started_at = Some(now_ms());
                rec.finished_at = None;
                rec.error = None;
                rec.manage_boot = req.args["manage_boot"].as_bool().unwrap_or(true);
            }
            self.store.save(&mut rec).await?;
        }
        let result = tokio::select! {
            r = self.task(req.kind, &mut rec, &req.args) => r,
            _ = stop.cancelled() => Err("shutting down".to_string()),
        };
        self.crash_if(CrashPoint::AfterTask(req.kind));
        // The task may have taken long: reload the version to save over.
        let latest = self.store.get(&req.node).await?.map(|r| r.version).unwrap_or(0);
        rec.version = latest;
        match result {
            Ok(()) => {
                if let Some(done) = req.kind.completion() {
                    match machine::advance(rec.state, done) {
                        Ok(to) => rec.state = to,
                        Err(e) => warn!(error = %e, "completion event does not apply"),
                    }
                }
                match req.kind {
                    Kind::Abort => {
                        rec.error = Some("inspection aborted".into());
                        rec.finished_at = Some(now_ms());
                    }
                    Kind::Timeout => {
                        rec.error = Some(format!("inspection timed out after {} s", self.cfg.timeout_secs));
                        rec.finished_at = Some(now_ms());
                    }
                    Kind::Process | Kind::Reapply => {
                        rec.error = None;
                        rec.finished_at = Some(now_ms());
                    }
                    _ => {}
                }
                info!(state = %rec.state, "request done");
                self.store.save(&mut rec).await
            }
            Err(msg) => {
                warn!(error = %msg, "task failed");
                self.cleanup(&rec).await;
                self.fail(&mut rec, msg).await
            }
        }
    }

    /// Moves the node to `error` with a message, by whichever event the machine allows.
    async fn fail(&self, rec: &mut NodeRecord, msg: String) -> Result<(), StoreError> {
        for ev in [Event::Error, Event::Timeout, Event::AbortEnd] {
            if let Ok(to) = machine::advance(rec.state, ev) {
                rec.state = to;
                break;
            }
        }
        rec.error = Some(msg);
        rec.finished_at = Some(now_ms());
        self.store.save(rec).await
    }

    /// Best-effort: no allow left behind, the node powered off if we booted it.
    async fn cleanup(&self, rec: &NodeRecord) {
        self.remove_allow(&rec.uuid).await;
        if rec.manage_boot && self.cfg.power_off {
            if let Some(i) = &self.ironic {
                if let Err(e) = i.set_power(&rec.uuid, "power off").await {
                    warn!(error = %e, "could not power the node off");
                }
            }
        }
    }

    async fn remove_allow(&self, node: &str) {
        // The node's recorded MACs first (cheap); a full scan only when the record has none (e.g. it is gone).
        let macs = match self.store.get(node).await {
            Ok(Some(r)) if !r.macs.is_empty() => r.macs,
            _ => vec![],
        };
        let r = reason(node);
        let (_, entries) = self.filters.entries(&macs);
        let changes: Vec<ReasonChange> = entries
            .into_iter()
            .filter(|(_, e)| e.allow.contains(&r))
            .map(|(mac, _)| ReasonChange { mac, side: Side::Allow, reason: r.clone(), present: false })
            .collect();
        if !changes.is_empty() {
            if let Err(e) = self.filters.apply(changes, None).await {
                error!(error = %e, "could not remove the node's allow");
            }
        }
    }

    async fn task(&self, kind: Kind, rec: &mut NodeRecord, args: &Value) -> Result<(), String> {
        match kind {
            Kind::Start => self.start_task(rec).await,
            Kind::Process => {
                let mut data = args.clone();
                self.process_data(rec, &mut data).await?;
                self.remove_allow(&rec.uuid).await;
                self.power_off(rec).await
            }
            Kind::Reapply => {
                let mut data = self
                    .store
                    .get_data(&rec.uuid)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "no stored introspection data".to_string())?;
                self.process_data(rec, &mut data).await
            }
            Kind::Abort | Kind::Timeout => {
                self.remove_allow(&rec.uuid).await;
                self.power_off(rec).await
            }
            Kind::Delete => Ok(()),
        }
    }

    async fn process_data(&self, rec: &NodeRecord, data: &mut Value) -> Result<(), String> {
        for h in &self.hooks {
            h.process(rec, data).map_err(|e| format!("processing hook {}: {e}", h.name()))?;
        }
        self.store.put_data(&rec.uuid, data).await.map_err(|e| format!("storing the data: {e}"))
    }

    async fn power_off(&self, rec: &NodeRecord) -> Result<(), String> {
        if rec.manage_boot && self.cfg.power_off {
            let i = self.ironic.as_ref().ok_or("Ironic is not configured")?;
            i.set_power(&rec.uuid, "power off").await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn start_task(&self, rec: &mut NodeRecord) -> Result<(), String> {
        let ironic = self.ironic.as_ref().ok_or("Ironic is not configured")?;
        let node = ironic.get_node(&rec.uuid).await.map_err(|e| e.to_string())?;
        let state = node.provision_state.clone().unwrap_or_default();
        if !INSPECTABLE.contains(&state.as_str()) {
            return Err(format!("provision state {state:?} does not allow inspection"));
        }
        if rec.manage_boot {
            let v = ironic.validate(&rec.uuid, "power").await.map_err(|e| e.to_string())?;
            if v.result == Some(false) {
                return Err(format!("power interface invalid: {}", v.reason.unwrap_or_default()));
            }
        }
        let ports = ironic.list_ports(Some(&rec.uuid)).await.map_err(|e| e.to_string())?;
        let macs: Vec<MacAddr> = ports.iter().filter_map(|p| p.address.parse().ok()).collect();
        if macs.is_empty() {
            return Err("the node has no ports with a valid MAC address: nothing to allow".into());
        }
        rec.macs = macs.clone();
        rec.bmc_addresses = node.bmc_addresses();
        let r = reason(&rec.uuid);
        let changes = macs
            .iter()
            .map(|m| ReasonChange { mac: *m, side: Side::Allow, reason: r.clone(), present: true })
            .collect();
        let applied = self.filters.apply(changes, None).await.map_err(|e| e.to_string())?;
        let revision = applied.revision;
        // The node must not PXE boot before the leader serves it.
        let deadline = Instant::now() + Duration::from_secs(self.cfg.allow_timeout_secs);
        let mut reports = self.agents.reports();
        loop {
            if self.agents.leader_applied(&self.cfg.network).await.is_some_and(|r| r >= revision) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no leader agent applied the node's allow (revision {revision}) within {} s",
                    self.cfg.allow_timeout_secs
                ));
            }
            // Woken by a report to this replica; polled for reports that reach another replica.
            let _ = tokio::time::timeout(Duration::from_millis(100), reports.changed()).await;
        }
        info!(revision, macs = macs.len(), "the leader applied the allow");
        if rec.manage_boot {
            self.throttled_power_on(ironic, &rec.uuid, node.power_state.as_deref() == Some("power on")).await?;
        }
        Ok(())
    }

    async fn throttled_power_on(&self, ironic: &Ironic, uuid: &str, on: bool) -> Result<(), String> {
        let guard = if self.cfg.reboot_quantum_ms > 0 {
            let s = self.coord.session(Duration::from_secs(10)).await.map_err(|e| e.to_string())?;
            let g =
                self.coord.lock("reboot-throttle", &s, CancellationToken::new()).await.map_err(|e| e.to_string())?;
            Some((s, g))
        } else {
            None
        };
        let r = async {
            ironic.set_boot_device(uuid, "pxe", false).await.map_err(|e| e.to_string())?;
            ironic.set_power(uuid, if on { "rebooting" } else { "power on" }).await.map_err(|e| e.to_string())
        }
        .await;
        if let Some((s, g)) = guard {
            tokio::time::sleep(Duration::from_millis(self.cfg.reboot_quantum_ms)).await;
            let _ = self.coord.unlock(&g).await;
            drop(s);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_from_ipa_data() {
        let d = serde_json::json!({"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:12:34:56"}, {"mac_address": "bogus"}], "bmc_address": "10.0.0.9"}});
        let (m, b) = data_addresses(&d);
        assert_eq!(m, vec!["52:54:00:12:34:56".parse::<MacAddr>().unwrap()]);
        assert_eq!(b, vec!["10.0.0.9".to_string()]);
        let (m, b) = data_addresses(&serde_json::json!({"inventory": {"bmc_address": "0.0.0.0"}}));
        assert!(m.is_empty() && b.is_empty());
    }

    #[test]
    fn crash_points_parse() {
        assert_eq!(CrashPoint::parse("after-task:process"), Some(CrashPoint::AfterTask(Kind::Process)));
        assert_eq!(CrashPoint::parse("before-transition:start"), Some(CrashPoint::BeforeTransition(Kind::Start)));
        assert_eq!(CrashPoint::parse("after-task:bogus"), None);
        assert_eq!(CrashPoint::parse("nowhere:start"), None);
    }
}
