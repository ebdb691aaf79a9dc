//! The inspection engine: the public operations (start, continue, abort, reapply) that validate and enqueue, and
//! the pool of workers that take requests, lock the node, advance the machine, save, run the task, and only then
//! consume the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_coord::{Coordinator, Session};
use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::{self, Attributes, LookupError, lookup_attributes};
use ironguard_inspection::machine::{self, Event, State};
use ironguard_inspection::outcome::fold_effects;
use ironguard_inspection::processing::{self, Pipeline, Plan, ProcessingConfig};
use ironguard_inspection::records::{self, Kind, NodeRecord, Taken};
use ironguard_inspection::rules;
use ironguard_ironic::{Ironic, IronicError};
use ironguard_proto::time::now_ms;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info, info_span, warn};

use super::process::{self, Requests, StoredData};
use crate::agents::{AgentRegistry, DhcpEvidence};
use crate::filter::{ReasonChange, Side};
use crate::store::{FilterStore, InspectionStore, RuleStore, StoreError};

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
    /// Agent network whose leader must apply the allow (empty: the one network whose agents report; with agents
    /// of several networks reporting, a start fails until this names one).
    pub network: String,
    /// Inspections running longer than this end in error (the singleton timeout task), seconds.
    pub timeout_secs: u64,
    /// Finished inspections older than this are removed by the clean-up task, seconds.
    pub clean_up_after_secs: u64,
    /// What ties a ramdisk's data (`POST /v1/continue`) to the node it names: "dhcp" (the default) or "none".
    pub callback_evidence: CallbackEvidence,
    /// Where that data may come from, with `callback_evidence = "dhcp"`: "link" (the default) or "any".
    pub callback_source: CallbackSource,
}

/// Where a ramdisk's data may come from (`[inspection] callback_source`), checked with `callback_evidence =
/// "dhcp"`. The evidence ties the data's boot interface to the node; this ties the *sender* to it, so that another
/// machine that names the node's boot interface (it is in the node's DHCP broadcasts) is refused too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallbackSource {
    /// From an address on a link of the control plane's host that its neighbour table (ARP, NDP) gives to one of
    /// the node's interfaces that got DHCP through the filter during the inspection (as a rule its boot interface).
    #[default]
    Link,
    /// From anywhere: for ramdisks that post through a router, a NAT or a reverse proxy. A machine that names a
    /// booting node's boot interface can then post data for the node before the node's own ramdisk does.
    Any,
}

/// What ties a ramdisk's data (`POST /v1/continue`, unauthenticated) to the node it names
/// (`[inspection] callback_evidence`). Anyone on the PXE network hears a booting node's MAC in its broadcasts and
/// can name it; only a PXE host's kernel knows which interface booted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallbackEvidence {
    /// The data's boot interface must be a MAC the node's inspection allowed, and a PXE host's kernel must have
    /// let DHCP from it through since the inspection started. Ports that processing creates for the node's other
    /// interfaces are marked unverified and are not allowed in a later inspection.
    #[default]
    Dhcp,
    /// None: data that names a waiting node is accepted, as ironic-inspector accepts it. Any machine on the PXE
    /// network can then post data for a waiting node (and get its MACs made the node's ports).
    None,
}

/// Who posts introspection data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poster {
    /// A ramdisk on the PXE network (`POST /v1/continue`, unauthenticated), from this address: its data needs
    /// evidence.
    Ramdisk { from: std::net::IpAddr },
    /// An authenticated operator (`Inspection.Continue`, `ironguardctl inspect continue`): trusted as written.
    Operator,
}

/// A kernel's DHCP time and the control plane's clock may differ by this much (same host: not at all).
const EVIDENCE_SKEW_MS: u64 = 5_000;

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
            callback_evidence: CallbackEvidence::Dhcp,
            callback_source: CallbackSource::Link,
        }
    }
}

/// `[discovery]` in the control-plane configuration: the `enroll` node-not-found hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// `enroll`: a ramdisk whose data matches no inspection enrolls its machine in Ironic (ironic-inspector's
    /// `[processing] node_not_found_hook = enroll`). Empty: such data is refused (404).
    pub node_not_found_hook: String,
    /// The driver of an enrolled node.
    pub enroll_node_driver: String,
    /// More fields of the enrolled node (e.g. `{"resource_class": "baremetal"}`), as a JSON object.
    pub enroll_node_fields: serde_json::Map<String, Value>,
    /// Which BMC address becomes `driver_info.ipmi_address`, in order of preference: "4", "6".
    pub enabled_bmc_address_version: Vec<String>,
    /// The most machines enrolled per network and minute while its discovery window is open (more get 503 and
    /// retry).
    pub enroll_per_minute: u32,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            node_not_found_hook: String::new(),
            enroll_node_driver: "fake-hardware".into(),
            enroll_node_fields: serde_json::Map::new(),
            enabled_bmc_address_version: vec!["4".into(), "6".into()],
            enroll_per_minute: 60,
        }
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.node_not_found_hook.as_str(), "" | "enroll") {
            return Err(format!(
                "[discovery] node_not_found_hook {:?}: only \"enroll\" (or empty) is known",
                self.node_not_found_hook
            ));
        }
        if self.enroll_node_driver.is_empty() {
            return Err("[discovery] enroll_node_driver must not be empty".into());
        }
        if self.enroll_per_minute == 0 {
            return Err("[discovery] enroll_per_minute must be at least 1".into());
        }
        for v in &self.enabled_bmc_address_version {
            if v != "4" && v != "6" {
                return Err(format!("[discovery] enabled_bmc_address_version: {v:?} is neither \"4\" nor \"6\""));
            }
        }
        Ok(())
    }

    pub fn enroll(&self) -> bool {
        self.node_not_found_hook == "enroll"
    }
}

/// Why a public operation was refused. Nothing was enqueued.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("node {0} is not known to Ironic")]
    UnknownNode(String),
    #[error("node {node} is in provision state {state:?}; inspection needs one of {}", INSPECTABLE.join(", "))]
    ProvisionState { node: String, state: String },
    #[error(
        "node {0} is in maintenance mode; inspect it anyway with maintenance_ok (ironguardctl inspect start --maintenance-ok)"
    )]
    Maintenance(String),
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
    /// Data from the PXE network that nothing ties to the node it names (`[inspection] callback_evidence`).
    #[error("introspection data refused: {0}")]
    NoEvidence(String),
    /// The evidence cannot be read yet (reports lag a boot by seconds) or now: the poster should retry.
    #[error("introspection data not accepted yet: {0}")]
    EvidencePending(String),
    /// ironic-inspector's pre-processing failures (hooks' `before_processing`), in its words.
    #[error("The following failures happened during running pre-processing hooks:\n{0}")]
    PreProcessing(String),
    /// No single node for the data (ironic-inspector's lookup errors).
    #[error("{}", .0.reply_message())]
    Lookup(LookupError),
    /// The `enroll` hook refused to enroll a new machine.
    #[error("Look up error: {0}")]
    Discovery(String),
    #[error("invalid introspection rule: {0}")]
    BadRule(String),
    #[error("rule {0} already exists")]
    RuleExists(String),
    #[error("rule {} was not found", ironguard_inspection::clip(.0, 64))]
    UnknownRule(String),
    #[error("node {0} has no stored introspection data to reapply")]
    NoData(String),
    #[error("Ironic is not configured ([ironic] url): inspections cannot run")]
    NoIronic,
    #[error(transparent)]
    Ironic(#[from] IronicError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The variable that names a [`CrashPoint`] (`IRONGUARD_TEST_CRASH=<point>:<kind>`). Only a build with the
/// `test-hooks` feature reads it, and only such a binary holds this string.
pub const CRASH_VAR: &str = "IRONGUARD_TEST_CRASH";

/// Where a test makes the worker process die ([`CRASH_VAR`]), to prove redelivery. Read only by a build with the
/// `test-hooks` feature, which release builds and the packages never enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// After taking the request, before saving the transition.
    BeforeTransition(Kind),
    /// After the task, before saving its outcome and consuming the request.
    AfterTask(Kind),
}

impl CrashPoint {
    #[cfg(feature = "test-hooks")]
    pub fn from_env() -> Option<Self> {
        Self::parse(&std::env::var(CRASH_VAR).ok()?)
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
    /// `[processing]`: the hooks' options, and the pipeline built from them.
    pub processing: ProcessingConfig,
    pub pipeline: Pipeline,
    /// `[discovery]`: what happens to data from a machine no inspection knows.
    pub discovery: DiscoveryConfig,
    /// The discovery windows: the `enroll` hook enrolls only machines booted on a network whose window is open.
    pub windows: Arc<crate::discovery::Windows>,
    pub rules: Arc<dyn RuleStore>,
    /// The last callbacks by the MACs they named (this replica's, in memory).
    pub callbacks: super::callbacks::CallbackLog,
    #[cfg(feature = "test-hooks")]
    pub crash: Option<CrashPoint>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// What became of a request a worker took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Run (or left for redelivery after a store failure).
    Done,
    /// The node was locked by another worker: released for later.
    Later,
    /// The worker's coordination session is unusable: released, and the worker opens a new session.
    SessionLost,
}

/// The reason recorded for a node's allow during its inspection.
pub fn reason(node: &str) -> String {
    format!("inspection:{node}")
}

impl Engine {
    fn ironic(&self) -> Result<&Arc<Ironic>, ApiError> {
        self.ironic.as_ref().ok_or(ApiError::NoIronic)
    }

    async fn record(&self, node: &str) -> Result<NodeRecord, ApiError> {
        Ok(self.store.get(node).await?.unwrap_or_else(|| NodeRecord::new(node, now_ms())))
    }

    /// A node's inspection as an operator sees it ([`records::as_seen`]): `starting` while its start is queued.
    pub async fn status(&self, node: &str) -> Result<Option<NodeRecord>, StoreError> {
        let rec = self.store.get(node).await?;
        if rec.as_ref().is_some_and(|r| !matches!(r.state, State::Finished | State::Error)) {
            return Ok(rec); // in progress: the queue cannot change what is shown
        }
        let pending = self.store.pending().await?;
        Ok(records::as_seen(rec, node, &pending))
    }

    /// Starts (or restarts) the inspection of `node` (UUID or name). A node in maintenance is refused unless
    /// `maintenance_ok`, as ironic-inspector refuses it.
    pub async fn start(
        &self,
        node: &str,
        manage_boot: bool,
        maintenance_ok: bool,
    ) -> Result<(NodeRecord, u64), ApiError> {
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
        if n.maintenance == Some(true) && !maintenance_ok {
            return Err(ApiError::Maintenance(n.uuid.clone()));
        }
        let rec = self.record(&n.uuid).await?;
        machine::advance(rec.state, Event::Start)
            .map_err(|source| ApiError::Illegal { node: n.uuid.clone(), source })?;
        let id = self.store.enqueue(&n.uuid, Kind::Start, serde_json::json!({"manage_boot": manage_boot})).await?;
        info!(node = %n.uuid, request = id, "inspection requested");
        Ok((rec, id))
    }

    /// The ramdisk's data (`POST /v1/continue`), as ironic-inspector takes it: every hook's `before_processing`,
    /// the lookup of its node (or the `enroll` hook for an unknown machine), then processing enqueued for a worker.
    /// Returns the node's UUID at once. Pre-processing failures fail the node's inspection, if one was found, and
    /// are returned.
    ///
    /// `raw` is the body `data` was parsed from: the unprocessed data that is stored is parsed from it again once the
    /// data is accepted, so that a refused body (anyone's, from the PXE network) never costs a second copy.
    ///
    /// Data a ramdisk posts must carry the evidence `[inspection] callback_evidence` asks for ([`Engine::evidence`]).
    pub async fn continue_inspection(
        &self,
        data: Value,
        raw: &[u8],
        node_uuid: Option<String>,
        poster: Poster,
    ) -> Result<String, ApiError> {
        let macs = if data.is_object() { lookup_attributes(&data, None).macs } else { Vec::new() };
        let r = self.continue_checked(data, raw, node_uuid, poster).await;
        self.callbacks.record(&macs, now_ms(), r.as_deref().map_err(|e| e.to_string()));
        r
    }

    /// [`Engine::continue_inspection`] without the record of its outcome.
    async fn continue_checked(
        &self,
        data: Value,
        raw: &[u8],
        node_uuid: Option<String>,
        poster: Poster,
    ) -> Result<String, ApiError> {
        if !data.is_object() {
            return Err(ApiError::BadData("expected a JSON object".into()));
        }
        // The ramdisk's `logs` (a base64 tarball, often megabytes) are never stored, neither with the processed nor
        // with the unprocessed data: they would not fit an etcd value, and processing and reapply do not read them.
        let mut data = process::without_logs(data);
        let failures = self.pipeline.before_processing(&mut data);
        let attrs = lookup_attributes(&data, node_uuid);
        if attrs.macs.len() > lookup::MAX_CALLER_MACS {
            return Err(ApiError::BadData(format!(
                "{} interface MAC addresses; at most {} are looked up",
                attrs.macs.len(),
                lookup::MAX_CALLER_MACS
            )));
        }
        let failed = failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n");
        if attrs.is_empty() && failures.is_empty() {
            return Err(ApiError::BadData(
                "no interface MAC (inventory.interfaces[].mac_address), no BMC address and no node_uuid".into(),
            ));
        }
        let records = self.store.lookup_candidates(&attrs).await?;
        // The boot interface the evidence ties to the node, when evidence is asked for.
        let mut evidenced = None;
        let mut enrolled = false;
        let node = match lookup::lookup(&attrs, &records) {
            Ok(n) => n,
            Err(LookupError::NotFound(described)) if self.discovery.enroll() && failures.is_empty() => {
                // A machine no inspection knows: it must have booted through the filter (within the hour the kernel
                // remembers) from one of its own interfaces before it becomes an Ironic node, on a network whose
                // discovery window an operator opened (an operator's own data needs no window).
                evidenced = self.evidence(poster, &data, "(a new machine)", &attrs.macs, None).await?;
                if poster != Poster::Operator {
                    let network = self.callback_network("(a new machine)").await?;
                    match self.windows.admit_enrollment(&network) {
                        Ok(()) => {}
                        Err(crate::discovery::Admission::Closed(why)) => {
                            info!(network = %network, "data from an unknown machine not enrolled: {why}");
                            return Err(ApiError::Lookup(LookupError::NotFound(described)));
                        }
                        Err(crate::discovery::Admission::Busy(why)) => {
                            warn!(network = %network, "data from an unknown machine not enrolled yet: {why}");
                            return Err(ApiError::EvidencePending(why));
                        }
                    }
                }
                enrolled = true;
                self.enroll(&mut data, &attrs).await?
            }
            Err(e) => {
                return Err(if failures.is_empty() { ApiError::Lookup(e) } else { ApiError::PreProcessing(failed) });
            }
        };
        if !failures.is_empty() {
            // ironic-inspector ends the node's inspection here. Not ironguard: anyone on the PXE network can post a
            // body naming a waiting node's MAC (it is in the node's DHCP broadcasts), and junk, or a forged ramdisk
            // `error`, would end another machine's inspection. The refusal changes nothing: the node keeps waiting
            // for its real data, or times out; the refusal is in the callback log (`explain --timeline`).
            warn!(node = %node, failures = %failed, "pre-processing failed: refused, the inspection is unchanged");
            return Err(ApiError::PreProcessing(failed));
        }
        let rec = match records.iter().find(|r| r.uuid == node) {
            Some(r) => Some(r.clone()),
            None => self.store.get(&node).await?,
        };
        let state = rec.as_ref().map_or(State::Finished, |r| r.state);
        machine::advance(state, Event::Process).map_err(|source| ApiError::Illegal { node: node.clone(), source })?;
        if !enrolled {
            let (allowed, since) = rec.as_ref().map_or((&[][..], None), |r| (&r.macs[..], r.started_at));
            evidenced = self.evidence(poster, &data, &node, allowed, Some(since.unwrap_or(u64::MAX))).await?;
        }
        // Parsed within its bounds once already: the same bytes, without the logs.
        let unlimited = ironguard_inspection::bounded::Bounds { max_values: usize::MAX, max_depth: usize::MAX };
        let unprocessed = ironguard_inspection::bounded::parse_callback(raw, unlimited)
            .map_err(|e| ApiError::BadData(e.to_string()))?;
        let id = self
            .store
            .enqueue(
                &node,
                Kind::Process,
                serde_json::json!({
                    "data": data,
                    "unprocessed": unprocessed,
                    "boot_mac": evidenced.map(|m| m.to_string()),
                }),
            )
            .await?;
        info!(node = %node, request = id, "introspection data received");
        Ok(node)
    }

    /// The evidence that ties data from the PXE network to the node it names (`[inspection] callback_evidence`):
    /// its boot interface is one of `allowed` (the MACs the node's inspection allowed DHCP) and a PXE host's kernel
    /// let DHCP from it through since `since` (the inspection's start; `None`: within the hour the kernel keeps).
    /// Returns that interface; `None` when no evidence is asked for (an operator's data, or `"none"`).
    ///
    /// A refusal changes nothing: the node keeps waiting for its own ramdisk's data.
    async fn evidence(
        &self,
        poster: Poster,
        data: &Value,
        node: &str,
        allowed: &[MacAddr],
        since: Option<u64>,
    ) -> Result<Option<MacAddr>, ApiError> {
        if poster == Poster::Operator || self.cfg.callback_evidence == CallbackEvidence::None {
            return Ok(None);
        }
        let named = processing::boot_mac(data).ok_or_else(|| {
            ApiError::NoEvidence(
                "the data names no boot interface (`boot_interface`, which ironic-python-agent takes from the \
                 kernel's BOOTIF=): data is accepted only from the interface that booted through ironguard's filter"
                    .into(),
            )
        })?;
        let boot: MacAddr = named.parse().map_err(|_| {
            ApiError::NoEvidence(format!(
                "the boot interface {:?} is not a MAC address",
                ironguard_inspection::clip(&named, 64)
            ))
        })?;
        if !allowed.contains(&boot) {
            warn!(
                node,
                boot = %boot,
                "introspection data refused: its boot interface is not a MAC this inspection allowed DHCP (another \
                 machine posting data for the node, or a ramdisk booted from an interface that is no port of it)"
            );
            return Err(ApiError::NoEvidence(format!(
                "the boot interface {boot} was not allowed DHCP for an inspection that waits for data"
            )));
        }
        let (_, entries) = self.filters.entries(&[boot]);
        if entries.iter().any(|(_, e)| e.allow.is_empty() && !e.deny.is_empty()) {
            return Err(ApiError::NoEvidence(format!(
                "the boot interface {boot} is denied DHCP: it cannot have booted through the filter"
            )));
        }
        let network = self.callback_network(node).await?;
        let since = since.unwrap_or_else(|| now_ms().saturating_sub(ironguard_dataplane::ruleset::SEEN_TIMEOUT_MS));
        match self.agents.dhcp_passed(&network, boot).await {
            DhcpEvidence::Passed { last_unix_ms, agent } if last_unix_ms.saturating_add(EVIDENCE_SKEW_MS) >= since => {
                if let Poster::Ramdisk { from } = poster {
                    self.sender_is_the_node(from, node, boot, allowed, since, &network).await?;
                }
                info!(node, boot = %boot, agent = %agent, "introspection data tied to the node: its boot interface got DHCP through the filter");
                Ok(Some(boot))
            }
            DhcpEvidence::Passed { .. } | DhcpEvidence::NotPassed => {
                warn!(
                    node,
                    boot = %boot,
                    network = %network,
                    "introspection data not accepted (yet): no PXE host let DHCP from its boot interface through since \
                     the inspection started (the node did not boot through the filter, or another machine posts data \
                     for it); ironic-python-agent retries"
                );
                Err(ApiError::EvidencePending(format!(
                    "no DHCP from the boot interface {boot} has been let through since the inspection started; retry"
                )))
            }
            DhcpEvidence::Unobservable(why) => {
                error!(
                    node,
                    boot = %boot,
                    network = %network,
                    why = %why,
                    "introspection data cannot be checked: no PXE host observes DHCP. Run the nftables backend on the \
                     PXE hosts (only it observes), or set [inspection] callback_evidence = \"none\" to accept data \
                     without evidence (any machine on the PXE network can then post data for a waiting node)"
                );
                Err(ApiError::EvidencePending("the data cannot be checked now; retry".into()))
            }
        }
    }

    /// `[inspection] callback_source = "link"`: the data came from one of the node's interfaces. This host's
    /// neighbour table gives the sender's address `from` to `boot` or to another of `allowed` that got DHCP through
    /// the filter since `since` (a TCP connection from an address on a link made this host resolve that address
    /// before it answered). Refused, changing nothing: a sender on no link of this host, or whose address another
    /// interface holds (another machine naming the node's boot interface).
    async fn sender_is_the_node(
        &self,
        from: std::net::IpAddr,
        node: &str,
        boot: MacAddr,
        allowed: &[MacAddr],
        since: u64,
        network: &str,
    ) -> Result<(), ApiError> {
        if self.cfg.callback_source == CallbackSource::Any {
            return Ok(());
        }
        let read = tokio::task::spawn_blocking(move || ironguard_dataplane::neighbour::neighbour_macs(from)).await;
        let holders = match read.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(macs) => macs,
            Err(e) => {
                error!(node, from = %from, error = %e, "introspection data cannot be checked: the neighbour table cannot be read");
                return Err(ApiError::EvidencePending("the data cannot be checked now; retry".into()));
            }
        };
        if holders.is_empty() {
            warn!(
                node,
                from = %from,
                "introspection data refused: its sender is on no link of this host, so nothing ties it to the node's \
                 interfaces; if ramdisks post through a router or a proxy, set [inspection] callback_source = \"any\""
            );
            return Err(ApiError::NoEvidence(format!(
                "the data came from {from}, which is on no link of the control plane's host: it cannot be tied to the \
                 node's interfaces"
            )));
        }
        for mac in holders {
            if mac == boot {
                continue;
            }
            let passed = match self.agents.dhcp_passed(network, mac).await {
                DhcpEvidence::Passed { last_unix_ms, .. } => last_unix_ms.saturating_add(EVIDENCE_SKEW_MS) >= since,
                _ => false,
            };
            if !allowed.contains(&mac) || !passed {
                warn!(
                    node,
                    from = %from,
                    holder = %mac,
                    boot = %boot,
                    "introspection data refused: its sender's address is held by an interface that is not one of the \
                     node's that booted through the filter (another machine naming the node's boot interface)"
                );
                return Err(ApiError::NoEvidence(format!(
                    "the data came from {from}, held by the interface {mac}, which is not an interface of the node that \
                     got DHCP through the filter during this inspection"
                )));
            }
        }
        Ok(())
    }

    /// The network the ramdisks post from: `[inspection] network`, or the one network whose agents report.
    async fn callback_network(&self, node: &str) -> Result<String, ApiError> {
        match self.cfg.network.as_str() {
            "" => self.agents.the_network().await.map_err(|e| {
                error!(node, error = %e, "introspection data cannot be checked");
                ApiError::EvidencePending("the data cannot be checked now; retry".into())
            }),
            n => Ok(n.to_string()),
        }
    }

    /// The `enroll` hook: a machine no inspection knows becomes an Ironic node (refused when one of its MACs or its
    /// BMC address already belongs to a node), with an `enrolling` inspection that processes its data.
    async fn enroll(&self, data: &mut Value, attrs: &Attributes) -> Result<String, ApiError> {
        let ironic = self.ironic()?;
        for mac in &attrs.macs {
            if let Some(p) = ironic.ports_by_address(&mac.to_string()).await?.first() {
                return Err(ApiError::Discovery(format!("Port {mac} already exists, uuid: {}", p.uuid)));
            }
        }
        let v4 = attrs.bmc_addresses.iter().find(|b| b.parse::<std::net::Ipv4Addr>().is_ok());
        let v6 = attrs.bmc_addresses.iter().find(|b| b.parse::<std::net::Ipv6Addr>().is_ok());
        let bmc =
            self.discovery.enabled_bmc_address_version.iter().find_map(|v| if v == "4" { v4 } else { v6 }).cloned();
        if let Some(b) = &bmc {
            let want = lookup::normalise_bmc(b);
            for n in ironic.nodes_with_driver_info().await? {
                if n.bmc_addresses().iter().any(|a| lookup::normalise_bmc(a) == want) {
                    return Err(ApiError::Discovery(format!("Node {} already has BMC address {b}", n.uuid)));
                }
            }
        }
        let mut body = serde_json::Map::new();
        for (k, v) in &self.discovery.enroll_node_fields {
            body.insert(k.clone(), v.clone());
        }
        body.insert("driver".into(), Value::String(self.discovery.enroll_node_driver.clone()));
        let driver_info = match &bmc {
            Some(b) => serde_json::json!({"ipmi_address": b}),
            None => serde_json::json!({}),
        };
        body.insert("driver_info".into(), driver_info);
        let uuid = ironic.create_node(&Value::Object(body)).await?;
        if let Some(m) = data.as_object_mut() {
            m.insert("auto_discovered".into(), Value::Bool(true));
        }
        let mut rec = NodeRecord::new(&uuid, now_ms());
        rec.state = State::Enrolling;
        rec.started_at = Some(now_ms());
        rec.manage_boot = false;
        rec.macs = attrs.macs.clone();
        rec.bmc_addresses = bmc.into_iter().collect();
        self.store.save(&mut rec).await?;
        info!(node = %uuid, macs = rec.macs.len(), "unknown machine enrolled in Ironic (discovery)");
        Ok(uuid)
    }

    /// `POST /v1/rules`: validates and stores a rule; returns it as stored.
    pub async fn create_rule(&self, body: &Value) -> Result<rules::Rule, ApiError> {
        let rule = rules::validate(body, now_ms()).map_err(|e| ApiError::BadRule(e.to_string()))?;
        let stored = crate::store::rules::StoredRule {
            uuid: rule.uuid.clone(),
            created_at: rule.created_at,
            body: serde_json::to_value(&rule).map_err(|e| ApiError::BadRule(e.to_string()))?,
        };
        if !self.rules.create(&stored).await? {
            return Err(ApiError::RuleExists(rule.uuid));
        }
        info!(rule = %rule.uuid, "introspection rule created");
        Ok(rule)
    }

    /// Every rule, in the order they apply.
    pub async fn list_rules(&self) -> Result<Vec<rules::Rule>, ApiError> {
        process::load_rules(&*self.rules).await.map_err(ApiError::BadRule)
    }

    pub async fn get_rule(&self, uuid: &str) -> Result<rules::Rule, ApiError> {
        let stored = self.rules.get(uuid).await?.ok_or_else(|| ApiError::UnknownRule(uuid.to_string()))?;
        serde_json::from_value(stored.body).map_err(|e| ApiError::BadRule(e.to_string()))
    }

    pub async fn delete_rule(&self, uuid: &str) -> Result<(), ApiError> {
        if !self.rules.delete(uuid).await? {
            return Err(ApiError::UnknownRule(uuid.to_string()));
        }
        info!(rule = %uuid, "introspection rule deleted");
        Ok(())
    }

    /// Deletes every rule; returns how many there were.
    pub async fn delete_all_rules(&self) -> Result<usize, ApiError> {
        let n = self.rules.delete_all().await?;
        info!(deleted = n, "every introspection rule deleted");
        Ok(n)
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
        let wake = self.store.wakeups();
        // One session per worker: its node locks vanish with it. A session that ends (an etcd outage longer than its
        // TTL: etcd then answers "requested lease not found") is replaced before the next request is taken.
        let mut session: Option<Session> = None;
        while !stop.is_cancelled() {
            if session.as_ref().is_none_or(|s| s.expiry() == ironguard_coord::Expiry::Expired) {
                match self.coord.session(Duration::from_secs(10)).await {
                    Ok(s) => {
                        info!(worker = %id, lease = format!("{:x}", s.lease), "worker session opened");
                        session = Some(s);
                    }
                    Err(e) => {
                        warn!(worker = %id, error = %e, "no coordination session; retrying");
                        tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = stop.cancelled() => return }
                        continue;
                    }
                }
            }
            let Some(sess) = session.as_ref() else { continue };
            let taken = match self.store.take(&id, lease).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    tokio::select! {
                        _ = wake.notified() => {}
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
            if self.handle(taken, sess, &stop).instrument(span).await == Handled::SessionLost {
                session = None;
            }
        }
    }

    /// One request: lock, transition, task, outcome, consume.
    pub async fn handle(&self, taken: Taken, session: &Session, stop: &CancellationToken) -> Handled {
        let node = taken.request.node.clone();
        let lock_cancel = CancellationToken::new();
        let c2 = lock_cancel.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c2.cancel();
        });
        let guard = match self.coord.lock(&format!("node/{node}"), session, lock_cancel).await {
            Ok(g) => g,
            Err(ironguard_coord::CoordError::Cancelled) => {
                info!("node is locked by another worker; leaving the request for later");
                let _ = self.store.release(&taken, Duration::from_millis(200)).await;
                return Handled::Later;
            }
            Err(e) => {
                // Not contention: the worker's session is unusable (e.g. its lease is gone after an etcd outage).
                warn!(error = %e, "cannot lock the node with this worker's session; renewing the session");
                let _ = self.store.release(&taken, Duration::ZERO).await;
                return Handled::SessionLost;
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
        Handled::Done
    }

    /// Test hook: stops the worker at `point` and keeps the process alive so a test can SIGKILL it right there.
    #[cfg(feature = "test-hooks")]
    fn crash_if(&self, point: CrashPoint) {
        if self.crash == Some(point) {
            error!(?point, "{CRASH_VAR}: worker stopped here, waiting to be killed");
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
        let mut rec = self.store.get(&req.node).await?.unwrap_or_else(|| NodeRecord::new(&req.node, now_ms()));
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
        #[cfg(feature = "test-hooks")]
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
        #[cfg(feature = "test-hooks")]
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

    /// Drops the node's `inspection:<node>` allow. A failed write is retried (about 3 s in all); if the store still
    /// refuses, the `stale-allows` task removes the allow on its next run, since the inspection is no longer running.
    async fn remove_allow(&self, node: &str) {
        let r = reason(node);
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=5 {
            // The node's recorded MACs first (cheap); a full scan when the record has none (e.g. it is gone).
            let macs = match self.store.get(node).await {
                Ok(Some(rec)) if !rec.macs.is_empty() => rec.macs,
                _ => vec![],
            };
            let (_, entries) = self.filters.entries(&macs);
            let changes: Vec<ReasonChange> = entries
                .into_iter()
                .filter(|(_, e)| e.allow.contains(&r))
                .map(|(mac, _)| ReasonChange { mac, side: Side::Allow, reason: r.clone(), present: false })
                .collect();
            if changes.is_empty() {
                return;
            }
            match self.filters.apply(changes, None).await {
                Ok(_) => return,
                Err(e) if attempt < 5 => {
                    warn!(error = %e, attempt, "could not remove the node's allow; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => error!(
                    error = %e,
                    "could not remove the node's allow; the stale-allows task will remove it once the store answers"
                ),
            }
        }
    }

    async fn task(&self, kind: Kind, rec: &mut NodeRecord, args: &Value) -> Result<(), String> {
        match kind {
            Kind::Start => self.start_task(rec).await,
            Kind::Process => {
                if let Some(msg) = args["failed"].as_str() {
                    return Err(msg.to_string());
                }
                // An older version queued the data itself as the arguments.
                let (data, unprocessed) = match (args.get("data"), args.get("unprocessed")) {
                    (Some(d), Some(u)) => (d.clone(), u.clone()),
                    _ => (args.clone(), args.clone()),
                };
                // The boot interface the evidence tied to the node: its other new ports are marked unverified.
                let verified = args.get("boot_mac").and_then(Value::as_str).and_then(|m| m.parse::<MacAddr>().ok());
                let node_state = self.process(rec, data, unprocessed, verified).await?;
                self.remove_allow(&rec.uuid).await;
                // [processing] power_off: an active node that sent data (active introspection) stays on.
                if self.processing.power_off && node_state != "active" {
                    self.power_off(rec).await?;
                }
                Ok(())
            }
            Kind::Reapply => {
                let stored = self
                    .store
                    .get_data(&rec.uuid)
                    .await
                    .map_err(|e| e.to_string())?
                    .map(StoredData::from_value)
                    .ok_or_else(|| "no stored introspection data".to_string())?;
                let mut data = stored.unprocessed.clone();
                let failures = self.pipeline.before_processing(&mut data);
                if !failures.is_empty() {
                    let f = failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n");
                    return Err(format!("The following failures happened during running pre-processing hooks:\n{f}"));
                }
                self.process(rec, data, stored.unprocessed, None).await.map(|_| ())
            }
            Kind::Abort | Kind::Timeout => {
                self.remove_allow(&rec.uuid).await;
                self.power_off(rec).await
            }
            Kind::Delete => Ok(()),
        }
    }

    /// Processing proper (see [`process`]): the node from Ironic, the hooks, the stored data, the rules, the plan
    /// written to Ironic. Returns the node's provision state. `verified`: the boot interface the callback's evidence
    /// tied to the node (then every other port created is marked unverified).
    async fn process(
        &self,
        rec: &NodeRecord,
        mut data: Value,
        unprocessed: Value,
        verified: Option<MacAddr>,
    ) -> Result<String, String> {
        let ironic = self.ironic.as_ref().ok_or("Ironic is not configured")?;
        let mut requests = Requests::default();
        let node_json = ironic.get_node_full(&rec.uuid).await.map_err(|e| e.to_string())?;
        let ports = ironic.list_ports_detail(&rec.uuid).await.map_err(|e| e.to_string())?;
        requests.reads += 2;
        let view = processing::node_view(&node_json, &ports);
        if !process::PROCESSABLE.contains(&view.provision_state.as_str()) {
            return Err(format!(
                "Invalid provision state for introspection: \"{}\", valid states are \"{}\"",
                view.provision_state,
                process::PROCESSABLE.join("\", \"")
            ));
        }
        let mut plan = Plan::new();
        self.pipeline.before_update(&mut data, &view, &mut plan).map_err(|e| e.to_string())?;
        let processed = process::without_logs(data);
        let stored = StoredData { processed: processed.clone(), unprocessed };
        self.store.put_data(&rec.uuid, &stored.to_value()).await.map_err(|e| format!("storing the data: {e}"))?;
        let rules = process::load_rules(&*self.rules).await?;
        let effects = rules::apply(&rules, &processed, &node_json).map_err(|e| format!("introspection rules: {e}"))?;
        let outcome = fold_effects(effects, &mut plan);
        let gate = self.port_gate(rec, &plan, verified).await.map_err(|e| e.to_string())?;
        process::apply_plan(ironic, &view, &plan, &outcome, &gate, &mut requests).await?;
        info!(reads = requests.reads, writes = requests.writes, "processed");
        match outcome.failed {
            Some(msg) => Err(msg),
            None => Ok(view.provision_state),
        }
    }

    /// Which of the plan's new ports are never created: a MAC the filter denies (an operator's deny, or a port of
    /// another node in Ironic) or one another node's inspection holds. With `verified`, the others are marked.
    async fn port_gate(
        &self,
        rec: &NodeRecord,
        plan: &Plan,
        verified: Option<MacAddr>,
    ) -> Result<process::PortGate, StoreError> {
        let mut gate = process::PortGate { refused: Default::default(), verified };
        let macs: Vec<MacAddr> = plan.new_ports().iter().filter_map(|p| p.address.parse().ok()).collect();
        if macs.is_empty() {
            return Ok(gate);
        }
        let (_, entries) = self.filters.entries(&macs);
        for (mac, e) in entries.iter().filter(|(_, e)| !e.deny.is_empty()) {
            let reasons: Vec<&str> = e.deny.iter().collect();
            gate.refused.insert(*mac, format!("the filter denies it ({})", reasons.join(", ")));
        }
        let attrs = Attributes { macs: macs.clone(), ..Default::default() };
        for other in self.store.lookup_candidates(&attrs).await?.iter().filter(|r| r.uuid != rec.uuid) {
            for mac in macs.iter().filter(|m| other.macs.contains(m)) {
                gate.refused.entry(*mac).or_insert_with(|| format!("the inspection of node {} holds it", other.uuid));
            }
        }
        Ok(gate)
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
        let ports = ironic.list_ports_detail(&rec.uuid).await.map_err(|e| e.to_string())?;
        let (mut macs, mut unverified) = (Vec::<MacAddr>::new(), Vec::<MacAddr>::new());
        for p in &ports {
            let Some(mac) = p["address"].as_str().and_then(|a| a.parse().ok()) else { continue };
            match p["extra"].get(process::UNVERIFIED) {
                Some(_) => unverified.push(mac),
                None => macs.push(mac),
            }
        }
        if !unverified.is_empty() {
            let list: Vec<String> = unverified.iter().map(|m| m.to_string()).collect();
            warn!(
                ports = %list.join(", "),
                "ports created from introspection data without evidence that the machine owns them are not allowed \
                 DHCP (extra.{}): check each, then `openstack baremetal port unset --extra {} <port>`",
                process::UNVERIFIED,
                process::UNVERIFIED
            );
        }
        if macs.is_empty() {
            return Err(if unverified.is_empty() {
                "the node has no ports with a valid MAC address: nothing to allow".into()
            } else {
                format!(
                    "every port of the node is unverified (extra.{}): nothing to allow; check them, then remove the key",
                    process::UNVERIFIED
                )
            });
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
            let network = match self.cfg.network.as_str() {
                "" => self.agents.the_network().await?,
                n => n.to_string(),
            };
            if self.agents.leader_applied(&network).await.is_some_and(|r| r >= revision) {
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
    fn discovery_config_is_checked() {
        assert!(DiscoveryConfig::default().validate().is_ok());
        assert!(!DiscoveryConfig::default().enroll());
        let bad = DiscoveryConfig { node_not_found_hook: "example".into(), ..Default::default() };
        assert!(bad.validate().unwrap_err().contains("example"));
        let bad = DiscoveryConfig { enabled_bmc_address_version: vec!["5".into()], ..Default::default() };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn crash_points_parse() {
        assert_eq!(CrashPoint::parse("after-task:process"), Some(CrashPoint::AfterTask(Kind::Process)));
        assert_eq!(CrashPoint::parse("before-transition:start"), Some(CrashPoint::BeforeTransition(Kind::Start)));
        assert_eq!(CrashPoint::parse("after-task:bogus"), None);
        assert_eq!(CrashPoint::parse("nowhere:start"), None);
    }
}
