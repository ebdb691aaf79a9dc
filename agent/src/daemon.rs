//! `ironguard-agent run`: the daemon.
//!
//! Start-up: guard installed → agent's table created `Blocked` (then `READY=1`) → subscribe to the control plane
//! → apply the snapshot → `Leader` while the local DHCP service is healthy, `Follower` otherwise. Every failure
//! leads to `Blocked`: no state yet, control plane unreachable beyond `lost_after_secs`, a kernel batch rejected,
//! SIGTERM. If even the switch to `Blocked` fails, the process exits and the kernel deletes its table.
//!
//! The lease fence is enforced by the kernel: a leader's marking rules match only while the lease element in its
//! table lives, and the agent moves that element's expiry to the fence deadline (TTL − margin after the send time
//! of the last successful keep-alive) after each keep-alive, never otherwise. A frozen or starved agent therefore
//! stops serving at its deadline without running any code. The timer branch of the main loop is a second line.
//! On the local backend (no etcd) the lease is a watchdog: refreshed on every tick for [`LOCAL_LEASE`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_coord::Expiry;
use ironguard_dataplane::monitor::{GuardEvent, Monitor};
use ironguard_dataplane::{Dataplane, Delta, DesiredState, MacAddr, Mode, NftError, UnknownMacPolicy};
use ironguard_proto::v1::{self as pb, AgentStatus, DhcpHealth, filter_event::Event};
use rand::Rng as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, info_span, warn};

use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::coordination::{self, Candidacy, CoordState};
use crate::dhcp_health::{self, Health};
use crate::link;
use crate::metrics::{AdminState, CauseLabel, KindLabel, Metrics, SetLabel};
use crate::stream::{self, Identity, StreamMsg};

/// On the local backend (no etcd, nothing to fence against), the kernel lease is a watchdog: refreshed on every
/// tick of the main loop for this long, so a hung or frozen agent stops serving within it.
pub const LOCAL_LEASE: Duration = Duration::from_secs(2);
/// A lease shorter than this is not worth opening for: the keep-alive came too late, wait for the next one.
const MIN_LEASE: Duration = Duration::from_millis(20);

/// Until when the kernel may mark packets, given the session: the fence deadline of an etcd session, a short
/// watchdog on the local backend, nothing without a session. Pure.
pub fn lease_until(expiry: Expiry, margin: Duration, now: Instant) -> Option<Instant> {
    let until = match expiry {
        Expiry::Never => now + LOCAL_LEASE,
        Expiry::At(_) => expiry.deadline(margin)?,
        Expiry::Expired => return None,
    };
    (until >= now + MIN_LEASE).then_some(until)
}

/// Why the agent is in its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    NoState,
    ControlPlaneLost(Duration),
    DhcpUnhealthy(String),
    /// No valid session: etcd unreachable or the lease fence tripped.
    Partitioned(String),
    /// The coordination store forgot (replaced or restored): closed until every earlier leader's fence passed.
    StoreAmnesia(String),
    /// The control plane's filter state went back (from the revision applied here to an older one): closed
    /// rather than loosen anything, until it is at least where it was.
    StateRegressed {
        applied: u64,
        offered: u64,
    },
    /// Healthy and current, but another agent holds the election (or the campaign is under way).
    NotElected,
    Leading,
    ApplyFailed,
    ShuttingDown,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::NoState => write!(f, "no filter state from the control plane yet"),
            Reason::ControlPlaneLost(d) => write!(f, "control plane unreachable for {}s", d.as_secs()),
            Reason::DhcpUnhealthy(d) => write!(f, "local DHCP service unhealthy: {d}"),
            Reason::Partitioned(d) => write!(f, "no valid lease in etcd (fenced): {d}"),
            Reason::StateRegressed { applied, offered } => write!(
                f,
                "the control plane's filter state went back from revision {applied} to {offered} (store amnesia?): \
                 closed until it is at revision {applied} again; if it never will, check the control plane and \
                 restart this agent"
            ),
            Reason::StoreAmnesia(d) => {
                write!(f, "{d}; closed until every earlier leader's fence deadline has passed (one TTL)")
            }
            Reason::NotElected => {
                write!(f, "follower: another agent leads this network (or the election is under way)")
            }
            Reason::Leading => write!(f, "leader (local DHCP healthy, filter state current)"),
            Reason::ApplyFailed => write!(f, "a kernel batch failed; waiting for a full resync"),
            Reason::ShuttingDown => write!(f, "shutting down"),
        }
    }
}

impl Reason {
    /// What an operator can do about a host closed for this reason (or that nothing is needed), for the log line
    /// that says the host failed closed.
    pub fn next_step(&self) -> &'static str {
        match self {
            Reason::NoState | Reason::ControlPlaneLost(_) => {
                "check that the control plane runs and is reachable from this host with the configured certificate \
                 (systemctl status ironguard-controlplane; ironguardctl agents); the agent reopens when it has the \
                 current filter state"
            }
            Reason::DhcpUnhealthy(_) => "check the DHCP service and the provisioning link on this host",
            Reason::Partitioned(_) => {
                "check etcd (etcdctl endpoint health) and this host's route to it; the agent campaigns again when its \
                 session is back"
            }
            Reason::StoreAmnesia(_) => {
                "nothing to do for DHCP (it reopens by itself); find out why etcd lost or rolled back its data"
            }
            Reason::StateRegressed { .. } => {
                "check the control plane's store (ironguardctl agents shows the revisions)"
            }
            Reason::ApplyFailed => "see the kernel error logged before this line; the agent resyncs by itself",
            Reason::ShuttingDown => "nothing: the agent is stopping and the guard keeps DHCP closed",
            Reason::NotElected | Reason::Leading => "nothing",
        }
    }

    /// The label of the fail-closed counter for this reason, if it is one.
    fn cause(&self) -> Option<&'static str> {
        match self {
            Reason::NoState => Some("no-state"),
            Reason::ControlPlaneLost(_) => Some("controlplane-lost"),
            Reason::ApplyFailed => Some("apply-failed"),
            Reason::ShuttingDown => Some("shutdown"),
            Reason::Partitioned(_) => Some("partition"),
            Reason::StoreAmnesia(_) => Some("store-amnesia"),
            Reason::StateRegressed { .. } => Some("state-regressed"),
            Reason::DhcpUnhealthy(_) | Reason::Leading | Reason::NotElected => None,
        }
    }
}

/// Everything the mode depends on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub have_state: bool,
    pub apply_failed: bool,
    /// The filter state offered went back: (applied, offered).
    pub regressed: Option<(u64, u64)>,
    pub lost_for: Option<Duration>,
    pub lost_after: Duration,
    pub dhcp: &'a Health,
    /// The session (lease) is alive for more than the margin: the lease fence holds.
    pub session_valid: bool,
    pub session_error: Option<&'a str>,
    /// Store amnesia seen less than one TTL ago: the reason.
    pub store_amnesia: Option<&'a str>,
    pub elected: bool,
    pub shutting_down: bool,
}

/// What the agent's table should be, given what the agent knows. Pure, so every branch is unit-tested.
pub fn decide(i: &Inputs<'_>) -> (Mode, Reason) {
    if i.shutting_down {
        return (Mode::Blocked, Reason::ShuttingDown);
    }
    if i.apply_failed {
        return (Mode::Blocked, Reason::ApplyFailed);
    }
    if let Some((applied, offered)) = i.regressed {
        return (Mode::Blocked, Reason::StateRegressed { applied, offered });
    }
    if !i.have_state {
        return (Mode::Blocked, Reason::NoState);
    }
    if let Some(d) = i.lost_for.filter(|d| *d >= i.lost_after) {
        return (Mode::Blocked, Reason::ControlPlaneLost(d));
    }
    if let Some(why) = i.store_amnesia {
        return (Mode::Blocked, Reason::StoreAmnesia(why.to_string()));
    }
    if !i.session_valid {
        return (Mode::Blocked, Reason::Partitioned(i.session_error.unwrap_or("lease fence").to_string()));
    }
    if !i.dhcp.healthy {
        return (Mode::Follower, Reason::DhcpUnhealthy(i.dhcp.detail.clone()));
    }
    if !i.elected {
        return (Mode::Follower, Reason::NotElected);
    }
    (Mode::Leader, Reason::Leading)
}

/// Whether the agent may campaign: everything a leader needs except the election itself.
fn may_lead(i: &Inputs<'_>) -> bool {
    let mut j = i.clone();
    j.elected = true;
    decide(&j).0 == Mode::Leader
}

fn mode_pb(m: Mode) -> pb::Mode {
    match m {
        Mode::Blocked => pb::Mode::Blocked,
        Mode::Follower => pb::Mode::Follower,
        Mode::Leader => pb::Mode::Leader,
    }
}

fn policy_from_pb(v: i32) -> Option<UnknownMacPolicy> {
    match pb::UnknownMacPolicy::try_from(v) {
        Ok(pb::UnknownMacPolicy::Allow) => Some(UnknownMacPolicy::Allow),
        Ok(pb::UnknownMacPolicy::Deny) => Some(UnknownMacPolicy::Deny),
        _ => None,
    }
}

fn macs(v: &[String]) -> Result<Vec<MacAddr>, ironguard_dataplane::MacError> {
    v.iter().map(|s| s.parse()).collect()
}

/// The table, reachable from the panic hook for a best-effort switch to `Blocked`.
static TABLE: OnceLock<Arc<Mutex<Box<dyn Dataplane>>>> = OnceLock::new();

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(t) = TABLE.get() {
            if let Ok(mut dp) = t.try_lock() {
                let _ = dp.set_mode(Mode::Blocked, UnknownMacPolicy::Deny);
            }
        }
        previous(info);
    }));
}

struct Daemon {
    cfg: AgentConfig,
    dp: Arc<Mutex<Box<dyn Dataplane>>>,
    metrics: Arc<Metrics>,
    applied: Arc<AtomicU64>,
    have_state: bool,
    apply_failed: bool,
    policy: UnknownMacPolicy,
    generation: u64,
    first_event_pending: bool,
    lost_since: Option<Instant>,
    dhcp: Health,
    mode: Mode,
    reason: Reason,
    last_error: String,
    snapshots: u64,
    resumes: u64,
    status_tx: watch::Sender<AgentStatus>,
    /// The end of the kernel lease as last written (Unix milliseconds; 0: none), for status reports.
    lease_wall: Arc<AtomicU64>,
    resync_tx: watch::Sender<u64>,
    ready: Arc<AtomicBool>,
    why: Arc<Mutex<String>>,
    who: Identity,
    coord: CoordState,
    want_lead: watch::Sender<bool>,
    /// The session expiry estimate the kernel lease was last refreshed for.
    lease_for: Expiry,
    /// The highest filter revision ever applied, and a refused regression (applied, offered).
    floor: u64,
    regressed: Option<(u64, u64)>,
}

impl Daemon {
    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn Dataplane>> {
        self.dp.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn inputs(&self, shutting_down: bool) -> Inputs<'_> {
        Inputs {
            have_state: self.have_state,
            apply_failed: self.apply_failed,
            regressed: self.regressed,
            lost_for: self.lost_since.map(|t| t.elapsed()),
            lost_after: self.cfg.controlplane.lost_after(),
            dhcp: &self.dhcp,
            session_valid: self.coord.expiry.valid_with_margin(self.cfg.election.margin(), Instant::now()),
            session_error: self.coord.error.as_deref(),
            store_amnesia: self
                .coord
                .amnesia
                .as_ref()
                .filter(|(at, _)| at.elapsed() < self.cfg.election.ttl())
                .map(|(_, why)| why.as_str()),
            elected: self.coord.elected,
            shutting_down,
        }
    }

    fn target(&self, shutting_down: bool) -> (Mode, Reason) {
        decide(&self.inputs(shutting_down))
    }

    /// When the lease fence trips, if the session can expire.
    fn fence_deadline(&self) -> Option<Instant> {
        self.coord.expiry.deadline(self.cfg.election.margin())
    }

    fn record(&self, kind: &'static str, r: &Result<ironguard_dataplane::ApplyReport, NftError>) {
        let until = self.lock().lease_until();
        self.lease_wall.store(stream::unix_ms_of(until), Ordering::SeqCst);
        match r {
            Ok(rep) => {
                self.metrics.apply_seconds.get_or_create(&KindLabel { kind }).observe(rep.elapsed.as_secs_f64());
                self.metrics.kernel_transactions.inc_by(rep.transactions as u64);
                self.metrics.lease_rewrites.inc_by(rep.lease_rewrites as u64);
            }
            Err(_) => {
                self.metrics.netlink_errors.inc();
            }
        }
    }

    /// Brings the table to the mode it should be in. A failure here is fatal: the table cannot be trusted, so the
    /// process exits and the kernel removes it.
    fn converge_mode(&mut self, shutting_down: bool) -> anyhow::Result<()> {
        let (mode, reason) = self.target(shutting_down);
        let changed = mode != self.mode || reason != self.reason;
        if mode != self.mode {
            let span = info_span!("mode_switch", from = %self.mode, to = %mode, reason = %reason);
            let _g = span.enter();
            if mode == Mode::Leader {
                // The lease first: the marking rules are useless (and harmless) without it.
                self.refresh_lease()?;
            }
            let policy = self.policy;
            let r = tokio::task::block_in_place(|| self.lock().set_mode(mode, policy));
            self.record("mode", &r);
            r.with_context(|| format!("switching to {mode}"))?;
            if mode == Mode::Blocked {
                if let Some(cause) = reason.cause() {
                    self.metrics.fail_closed.get_or_create(&CauseLabel { cause }).inc();
                }
                warn!(next_step = reason.next_step(), "failed closed: DHCP blocked on this host because {reason}");
            } else {
                info!("mode switched");
            }
            self.mode = mode;
            self.metrics.mode.set(mode_pb(mode) as i64);
        }
        if changed {
            self.reason = reason;
            self.publish();
        }
        // Only after the table is closed may the candidacy be withdrawn; only when leading is possible campaign.
        let may = may_lead(&self.inputs(shutting_down));
        self.want_lead.send_if_modified(|w| {
            let changed = *w != may;
            *w = may;
            changed
        });
        Ok(())
    }

    /// Moves the kernel lease to the current fence deadline (see [`lease_until`]). Called when a keep-alive
    /// succeeded (a new expiry estimate), when becoming Leader, and on the local backend's tick; only while
    /// leading or becoming the leader. A deadline already too close drops the lease instead: the kernel then
    /// marks nothing until the next keep-alive. A failure here is fatal, as for any kernel batch of the mode.
    fn refresh_lease(&mut self) -> anyhow::Result<()> {
        let until = lease_until(self.coord.expiry, self.cfg.election.margin(), Instant::now());
        if until.is_none() {
            self.metrics.lease_late.inc();
            warn!(expiry = ?self.coord.expiry, "no time left on the lease: the kernel lease is dropped");
        }
        let r = tokio::task::block_in_place(|| self.lock().refresh_lease(until));
        self.record("lease", &r);
        r.context("refreshing the kernel lease")?;
        self.metrics.lease_refreshes.inc();
        self.lease_for = self.coord.expiry;
        Ok(())
    }

    /// After coordination news: a leader whose session got a new expiry estimate (a keep-alive succeeded) moves
    /// its kernel lease.
    fn on_keepalive(&mut self) -> anyhow::Result<()> {
        if self.mode == Mode::Leader && self.coord.expiry != self.lease_for {
            self.refresh_lease()?;
        }
        Ok(())
    }

    /// Another process touched the guard: check it and repair it at once.
    fn on_guard_event(&mut self, ev: &GuardEvent) -> anyhow::Result<()> {
        let problems = tokio::task::block_in_place(|| self.guard_problems());
        if problems.is_empty() {
            info!(event = %ev, "the guard was touched but is intact");
            return Ok(());
        }
        warn!(event = %ev, problems = ?problems, "the guard was tampered with; repairing it now");
        self.repair_guard("change notification");
        Ok(())
    }

    /// What is wrong with the guard now: missing, not dropping as configured, or (where the kernel has
    /// `persist`) not held by this agent.
    fn guard_problems(&self) -> Vec<String> {
        self.lock().guard_problems(&self.cfg.dataplane, self.cfg.guard.claim)
    }

    /// Rebuilds the guard through the agent's own socket (claiming it where the kernel allows). Logged, counted;
    /// a failure is retried by the next read-back and changes nothing else (the agent's own table stays right).
    fn repair_guard(&mut self, trigger: &'static str) {
        let start = Instant::now();
        let cfg = self.cfg.dataplane.clone();
        let hold = self.cfg.guard.claim;
        let r = tokio::task::block_in_place(|| self.lock().claim_guard(&cfg, hold));
        match r {
            Ok(()) => {
                self.metrics.guard_repairs.inc();
                info!(trigger, elapsed_us = start.elapsed().as_micros() as u64, "guard repaired");
            }
            Err(e) => {
                self.metrics.netlink_errors.inc();
                error!(trigger, error = %e, "repairing the guard failed; DHCP stays closed only while this agent's table is Blocked or Follower");
            }
        }
    }

    /// Publishes the status for reports, readiness and metrics.
    fn publish(&self) {
        let (allow, deny) = {
            let dp = self.lock();
            dp.committed().map(|s| (s.allow.len(), s.deny.len())).unwrap_or((0, 0))
        };
        self.metrics.set_size.get_or_create(&SetLabel { set: "allow" }).set(allow as i64);
        self.metrics.set_size.get_or_create(&SetLabel { set: "deny" }).set(deny as i64);
        self.metrics.applied_revision.set(self.applied.load(Ordering::SeqCst) as i64);
        self.metrics.dhcp_healthy.set(self.dhcp.healthy as i64);
        let ready = self.have_state && !self.apply_failed && self.mode != Mode::Blocked && self.dhcp.healthy;
        self.ready.store(ready, Ordering::Relaxed);
        if let Ok(mut w) = self.why.lock() {
            *w = self.reason.to_string();
        }
        self.status_tx.send_replace(AgentStatus {
            agent_id: self.who.agent_id.clone(),
            host: self.who.host.clone(),
            network: self.who.network.clone(),
            applied_revision: self.applied.load(Ordering::SeqCst),
            mode: mode_pb(self.mode) as i32,
            allow_count: allow as u64,
            deny_count: deny as u64,
            last_error: self.last_error.clone(),
            dhcp: Some(DhcpHealth { healthy: self.dhcp.healthy, detail: self.dhcp.detail.clone() }),
            mode_reason: self.reason.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            snapshots_applied: self.snapshots,
            resumes: self.resumes,
            lease_until_unix_ms: self.lease_wall.load(Ordering::SeqCst),
        });
    }

    /// A kernel batch failed: nothing changed in the kernel (batches are atomic), but the applied revision can no
    /// longer be trusted to follow the stream. Block, and resynchronise from a snapshot.
    fn apply_failed(&mut self, what: &str, e: &anyhow::Error) -> anyhow::Result<()> {
        let text = format!("{what}: {e:#}");
        if text == self.last_error {
            // The same kernel error again, on the next resync (which backs off): said once already.
            debug!(error = format!("{e:#}"), "{what} failed again; still closed, retrying");
        } else {
            error!(error = format!("{e:#}"), "{what} failed; failing closed and resynchronising");
        }
        self.last_error = text;
        self.apply_failed = true;
        self.have_state = false;
        self.applied.store(0, Ordering::SeqCst);
        self.resync_tx.send_modify(|g| *g += 1);
        self.converge_mode(false)
    }

    fn on_snapshot(&mut self, s: pb::FilterSnapshot) -> anyhow::Result<()> {
        let span = info_span!("apply_snapshot", revision = s.revision);
        let _g = span.enter();
        if s.revision < self.floor {
            if self.regressed.is_none() {
                error!(
                    applied = self.floor,
                    offered = s.revision,
                    "the control plane offers an older filter state than this agent applied; refusing it and failing closed"
                );
            }
            self.regressed = Some((self.floor, s.revision));
            return self.converge_mode(false);
        }
        if let Some((applied, _)) = self.regressed.take() {
            info!(applied, revision = s.revision, "the control plane's filter state is current again");
        }
        let (allow, deny) = match (macs(&s.allow), macs(&s.deny)) {
            (Ok(a), Ok(d)) => (a, d),
            (Err(e), _) | (_, Err(e)) => {
                return self.apply_failed("snapshot", &anyhow::anyhow!("bad MAC from the control plane: {e}"));
            }
        };
        self.policy = policy_from_pb(s.unknown_mac_policy).unwrap_or(self.policy);
        // Decide the mode as if the state were in place (it will be, or we fail closed).
        self.have_state = true;
        self.apply_failed = false;
        let (mode, reason) = self.target(false);
        let desired = DesiredState {
            config: self.cfg.dataplane.clone(),
            mode,
            unknown_mac_policy: self.policy,
            allow: allow.into_iter().collect(),
            deny: deny.into_iter().collect(),
        };
        let r = tokio::task::block_in_place(|| self.lock().apply(&desired));
        self.record("full", &r);
        match r {
            Ok(rep) => {
                self.applied.store(s.revision, Ordering::SeqCst);
                self.floor = self.floor.max(s.revision);
                self.snapshots += 1;
                self.metrics.snapshots_applied.inc();
                self.mode = mode;
                self.metrics.mode.set(mode_pb(mode) as i64);
                self.reason = reason;
                self.last_error.clear();
                info!(
                    allow = desired.allow.len(),
                    deny = desired.deny.len(),
                    mode = %mode,
                    elapsed_ms = rep.elapsed.as_millis() as u64,
                    "applied snapshot (full reload)"
                );
                self.publish();
                if mode == Mode::Leader && self.lock().lease_until().is_none() {
                    self.refresh_lease()?;
                }
                Ok(())
            }
            Err(e) => self.apply_failed("applying the snapshot", &e.into()),
        }
    }

    /// Applies consecutive deltas as one kernel transaction.
    fn on_deltas(&mut self, deltas: Vec<pb::FilterDelta>) -> anyhow::Result<()> {
        if self.regressed.is_some() {
            // Deltas of a regressed state continue another history: never apply them. Once it is past where this
            // agent was, take a full snapshot of it.
            if deltas.iter().any(|d| d.revision > self.floor) {
                info!(
                    floor = self.floor,
                    "the control plane's state passed the revision applied here; resynchronising"
                );
                self.applied.store(0, Ordering::SeqCst);
                self.resync_tx.send_modify(|g| *g += 1);
            }
            return Ok(());
        }
        let mut combined = Delta::default();
        let mut last = self.applied.load(Ordering::SeqCst);
        let first = last;
        let mut policy = self.policy;
        for d in deltas {
            if d.revision <= last {
                continue; // replayed after a reconnect
            }
            if d.revision != last + 1 {
                return self.apply_failed(
                    "following the stream",
                    &anyhow::anyhow!("revision gap: applied {last}, received {}", d.revision),
                );
            }
            let parsed = (|| -> Result<Delta, ironguard_dataplane::MacError> {
                Ok(Delta {
                    allow_add: macs(&d.allow_add)?,
                    allow_remove: macs(&d.allow_remove)?,
                    deny_add: macs(&d.deny_add)?,
                    deny_remove: macs(&d.deny_remove)?,
                })
            })();
            match parsed {
                Ok(p) => combined.then(&p),
                Err(e) => return self.apply_failed("delta", &anyhow::anyhow!("bad MAC from the control plane: {e}")),
            }
            if let Some(p) = policy_from_pb(d.unknown_mac_policy) {
                policy = p;
            }
            last = d.revision;
        }
        if last == first {
            return Ok(());
        }
        let span = info_span!("apply_delta", from = first, to = last, macs = combined.len());
        let _g = span.enter();
        let r = tokio::task::block_in_place(|| self.lock().apply_delta(&combined));
        self.record("delta", &r);
        if let Err(e) = r {
            return self.apply_failed("applying a delta", &e.into());
        }
        if policy != self.policy {
            self.policy = policy;
            let mode = self.mode;
            let r = tokio::task::block_in_place(|| self.lock().set_mode(mode, policy));
            self.record("mode", &r);
            if let Err(e) = r {
                return self.apply_failed("switching the unknown-MAC policy", &e.into());
            }
            info!(policy = %policy, "unknown-MAC policy changed");
        }
        self.applied.store(last, Ordering::SeqCst);
        self.floor = self.floor.max(last);
        self.last_error.clear();
        tracing::debug!(revisions = last - first, "applied");
        self.publish();
        Ok(())
    }

    /// Handles one stream message plus every message already queued behind it (coalescing a burst of deltas
    /// into one kernel transaction).
    fn on_stream(&mut self, first: StreamMsg, rx: &mut mpsc::Receiver<StreamMsg>) -> anyhow::Result<()> {
        let mut pending: Vec<pb::FilterDelta> = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                StreamMsg::Connected { generation, endpoint, since } => {
                    self.on_deltas(std::mem::take(&mut pending))?;
                    self.generation = generation;
                    self.first_event_pending = true;
                    self.lost_since = None;
                    self.metrics.stream_connected.set(1);
                    info!(endpoint, since, "watching filters");
                    self.converge_mode(false)?;
                }
                StreamMsg::Lost { generation, error } if generation == self.generation => {
                    self.on_deltas(std::mem::take(&mut pending))?;
                    if self.lost_since.is_none() {
                        self.lost_since = Some(Instant::now());
                        if error == crate::stream::RESYNC {
                            // Our own reconnect after a failed apply, already logged as such.
                            debug!(error, "reopening the control plane stream for a snapshot");
                        } else {
                            warn!(
                                error,
                                bound_secs = self.cfg.controlplane.lost_after_secs,
                                "control plane stream lost; keeping the current state until the bound"
                            );
                        }
                    }
                    self.metrics.stream_connected.set(0);
                }
                StreamMsg::Lost { .. } => {}
                StreamMsg::Event { generation, event } if generation == self.generation => {
                    if std::mem::take(&mut self.first_event_pending) {
                        let is_snapshot = matches!(event.event, Some(Event::Snapshot(_)));
                        if !is_snapshot && self.have_state {
                            self.resumes += 1;
                            self.metrics.resumes.inc();
                            info!(
                                revision = self.applied.load(Ordering::SeqCst),
                                "resumed from the applied revision without a full reload"
                            );
                        }
                    }
                    match event.event {
                        Some(Event::Delta(d)) => pending.push(d),
                        Some(Event::Snapshot(s)) => {
                            pending.clear();
                            self.on_snapshot(s)?;
                        }
                        Some(Event::Heartbeat(h)) => {
                            self.on_deltas(std::mem::take(&mut pending))?;
                            let applied = self.applied.load(Ordering::SeqCst);
                            if self.have_state && h.revision > applied {
                                self.apply_failed(
                                    "following the stream",
                                    &anyhow::anyhow!("heartbeat at revision {} but applied {applied}", h.revision),
                                )?;
                            }
                        }
                        None => {}
                    }
                }
                StreamMsg::Event { .. } => {}
            }
            next = rx.try_recv().ok();
        }
        self.on_deltas(pending)
    }

    /// Reads the kernel back; repairs drift with a full apply of the committed state (and reinstalls the guard).
    fn reconcile(&mut self) -> anyhow::Result<()> {
        let span = info_span!("reconcile");
        let _g = span.enter();
        let drift = tokio::task::block_in_place(|| self.lock().drift(true));
        match drift {
            Ok(d) if d.is_empty() => Ok(()),
            Ok(d) => {
                warn!(drift = ?d, "kernel state differs from the committed state; repairing");
                self.metrics.drift_repairs.inc();
                if d.iter().any(|x| x.contains(ironguard_dataplane::GUARD_TABLE) || x.contains("guard")) {
                    self.repair_guard("read-back");
                }
                let committed = self.lock().committed().cloned();
                if let Some(c) = committed {
                    let r = tokio::task::block_in_place(|| self.lock().apply(&c));
                    self.record("full", &r);
                    if let Err(e) = r {
                        return self.apply_failed("repairing drift", &e.into());
                    }
                }
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "read-back failed");
                Ok(())
            }
        }
    }
}

/// Connects to etcd (retrying with back-off while it is unreachable) or uses the local backend, then runs the
/// candidacy until `stop`.
async fn coordinate(
    etcd: ironguard_coord::EtcdConfig,
    who: Candidacy,
    want_lead: watch::Receiver<bool>,
    state: watch::Sender<CoordState>,
    stop: CancellationToken,
) {
    let coord: Arc<dyn ironguard_coord::Coordinator> = if etcd.enabled() {
        let mut attempt = 0;
        loop {
            match ironguard_coord::etcd::EtcdCoordinator::connect(&etcd).await {
                Ok(c) => break Arc::new(c),
                Err(e) => {
                    let msg = format!("cannot connect to etcd {:?}: {e}", etcd.endpoints);
                    if attempt == 0 {
                        warn!("{msg}");
                    }
                    state.send_modify(|s| s.error = Some(msg));
                    let pause = ironguard_coord::backoff(attempt, Duration::from_secs(2));
                    attempt += 1;
                    tokio::select! { _ = tokio::time::sleep(pause) => {}, _ = stop.cancelled() => return }
                }
            }
        }
    } else {
        Arc::new(ironguard_coord::local::LocalCoordinator::new())
    };
    coordination::run(coord, who, want_lead, state, stop).await;
}

/// Watches nf_tables change notifications on a thread of its own and reports changes of the guard made by any
/// other process. Without the notification socket the periodic read-back still repairs the guard.
fn spawn_guard_monitor(own_portid: u32, tx: mpsc::Sender<GuardEvent>) {
    let spawned = std::thread::Builder::new().name("guard-monitor".into()).spawn(move || {
        let monitor = match Monitor::open() {
            Ok(m) => m,
            Err(e) => {
                error!(error = %e, "cannot subscribe to nf_tables notifications; the guard is checked on the read-back period only");
                return;
            }
        };
        loop {
            match monitor.next_guard_event(own_portid, Duration::from_secs(1)) {
                Ok(Some(ev)) => {
                    if tx.blocking_send(ev).is_err() {
                        return; // the daemon is gone
                    }
                }
                Ok(None) => {
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "reading nf_tables notifications failed; checking the guard");
                    if tx.blocking_send(GuardEvent::Overflow).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    });
    if let Err(e) = spawned {
        error!(error = %e, "cannot start the guard monitor thread");
    }
}

/// The DHCP service's health, which includes its provisioning links: every configured interface up with an
/// IPv4 address (a dnsmasq on a downed link still listens, and serves nobody).
fn health_with_links(cfg: &crate::config::DhcpHealthSection, interfaces: &[String]) -> Health {
    let problems = link::check(interfaces);
    let h = dhcp_health::check(cfg);
    if problems.is_empty() {
        h
    } else {
        Health { healthy: false, detail: format!("{}; {}", problems.join("; "), h.detail) }
    }
}

fn jittered(mean: Duration) -> Duration {
    mean.mul_f64(rand::rng().random_range(0.8..1.2))
}

/// Runs the agent until SIGTERM/SIGINT (or `shutdown` resolves). Returns an error only if the table could not
/// be created or kept safe.
pub async fn run(
    cfg: AgentConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let why = Arc::new(Mutex::new("starting".to_string()));
    let admin_listener = tokio::net::TcpListener::bind(cfg.admin.listen)
        .await
        .with_context(|| format!("binding the admin endpoint on {}", cfg.admin.listen))?;
    let admin = crate::metrics::router(AdminState { metrics: metrics.clone(), ready: ready.clone(), why: why.clone() });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(admin_listener, admin).await {
            error!(error = %e, "admin endpoint failed");
        }
    });

    // 1. the guard, claimed by this process where the kernel allows, 2. the agent's table, Blocked.
    let mut dp = ironguard_dataplane::backend::open(&cfg.dataplane).context("opening the dataplane")?;
    dp.claim_guard(&cfg.dataplane, cfg.guard.claim).context("installing and claiming the guard")?;
    dp.apply(&DesiredState::blocked(cfg.dataplane.clone())).context("creating the agent's table (Blocked)")?;
    info!(
        backends = ?cfg.dataplane.backends,
        owner_portid = dp.nftables_port(),
        guard = %dp.guard_description(cfg.guard.claim),
        agent = %cfg.agent.id,
        network = %cfg.agent.network,
        "agent's table created, Blocked"
    );
    if !dp.kernel_lease() {
        warn!(
            backends = ?cfg.dataplane.backends,
            "no backend enforces the leader's lease in the kernel: a frozen or killed agent keeps serving until \
             something else closes DHCP; run the nftables backend alongside where the kernel has it \
             (docs/operations.md, \"Backends\")"
        );
    }
    let own_portid = dp.nftables_port();
    let dp = Arc::new(Mutex::new(dp));
    let _ = TABLE.set(dp.clone());
    install_panic_hook();
    let (guard_tx, mut guard_rx) = mpsc::channel::<GuardEvent>(16);
    // Without an nftables guard there are no notifications to watch; the sender is kept so the arm stays idle.
    let _no_monitor = match own_portid {
        Some(port) => {
            spawn_guard_monitor(port, guard_tx);
            None
        }
        None => Some(guard_tx),
    };
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);

    let (stop_tx, stop_rx) = watch::channel(false);
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let who = Identity { agent_id: cfg.agent.id.clone(), host, network: cfg.agent.network.clone() };
    let applied = Arc::new(AtomicU64::new(0));
    let (stream_tx, mut stream_rx) = mpsc::channel(4096);
    let (resync_tx, resync_rx) = watch::channel(0u64);
    tokio::spawn(stream::watch_loop(
        cfg.controlplane.clone(),
        who.clone(),
        applied.clone(),
        stream_tx,
        resync_rx,
        stop_rx.clone(),
    ));
    // High availability: a session and a candidacy in the network's election (etcd), or the local backend.
    let (want_lead_tx, want_lead_rx) = watch::channel(false);
    let (coord_tx, mut coord_rx) = watch::channel(CoordState::default());
    let coord_stop = CancellationToken::new();
    let candidacy = Candidacy {
        agent_id: cfg.agent.id.clone(),
        host: who.host.clone(),
        network: cfg.agent.network.clone(),
        ttl: cfg.election.ttl(),
        state_file: cfg.agent.state_file(),
    };
    let coord_task = tokio::spawn(coordinate(cfg.etcd.clone(), candidacy, want_lead_rx, coord_tx, coord_stop.clone()));
    let (status_tx, status_rx) = watch::channel(AgentStatus::default());
    let lease_wall = Arc::new(AtomicU64::new(0));
    tokio::spawn(stream::report_loop(
        cfg.controlplane.clone(),
        status_rx,
        lease_wall.clone(),
        metrics.clone(),
        stop_rx.clone(),
    ));
    let (health_tx, mut health_rx) = watch::channel(Health { healthy: false, detail: "not checked yet".into() });
    let hcfg = cfg.dhcp_health.clone();
    // The provisioning links: the filtered interfaces and those whose DHCP replies are filtered at egress.
    let mut links = cfg.dataplane.interfaces.clone();
    links.extend(cfg.dataplane.egress_interfaces.iter().filter(|i| !cfg.dataplane.interfaces.contains(i)).cloned());
    let mut hstop = stop_rx.clone();
    // Link and address changes wake the check at once (a downed provisioning link makes the leader resign).
    let (link_tx, mut link_rx) = mpsc::channel::<()>(1);
    link::watch(link_tx);
    // After a link change the main loop also reads the reply side back: before Linux 6.16 the kernel unbinds a
    // netdev chain from a device that goes away and never binds it again, so a rebuilt bridge would stay unfiltered
    // until the next read-back period.
    let (relink_tx, mut relink_rx) = mpsc::channel::<()>(1);
    let egress = !cfg.dataplane.egress_interfaces.is_empty();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(hcfg.interval_ms));
        loop {
            let linked = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = link_rx.recv() => true,
                _ = hstop.changed() => return,
            };
            if linked && egress {
                let _ = relink_tx.try_send(());
            }
            let (c, l) = (hcfg.clone(), links.clone());
            if let Ok(h) = tokio::task::spawn_blocking(move || health_with_links(&c, &l)).await {
                health_tx.send_if_modified(|old| {
                    let changed = *old != h;
                    *old = h;
                    changed
                });
            }
        }
    });

    let mut d = Daemon {
        cfg,
        dp,
        metrics,
        applied,
        have_state: false,
        apply_failed: false,
        policy: UnknownMacPolicy::Allow,
        generation: 0,
        first_event_pending: false,
        lost_since: Some(Instant::now()),
        dhcp: Health { healthy: false, detail: "not checked yet".into() },
        mode: Mode::Blocked,
        reason: Reason::NoState,
        last_error: String::new(),
        snapshots: 0,
        resumes: 0,
        status_tx,
        lease_wall,
        resync_tx,
        ready,
        why,
        who: who.clone(),
        coord: CoordState::default(),
        want_lead: want_lead_tx,
        lease_for: Expiry::Expired,
        floor: 0,
        regressed: None,
    };
    d.metrics.mode.set(mode_pb(Mode::Blocked) as i64);
    d.publish();

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let reconcile_every = Duration::from_secs(d.cfg.reconcile.interval_secs);
    let mut next_reconcile = Instant::now() + jittered(reconcile_every);
    tokio::pin!(shutdown);
    let result: anyhow::Result<()> = loop {
        // Only a deadline still ahead arms the timer; once passed, every event re-evaluates the mode (and the
        // tick does so four times a second), so no arm ever waits for coordination news.
        let fence = d.fence_deadline().filter(|t| *t > Instant::now());
        let step = tokio::select! {
            biased;
            // The lease fence comes first: close before the lease can expire, whatever else is pending. (The
            // kernel lease closes by itself at the same deadline; this is the second line.)
            _ = async {
                match fence {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                warn!("lease fence: no keep-alive succeeded for TTL - margin; closing before the lease can expire");
                let r = d.converge_mode(false);
                if r.is_ok() && d.cfg.election.exit_on_partition {
                    break Err(anyhow::anyhow!("exit_on_partition: the lease fence tripped (DHCP closed)"));
                }
                r
            }
            _ = coord_rx.changed() => {
                let c = coord_rx.borrow_and_update().clone();
                if c.elected != d.coord.elected {
                    info!(elected = c.elected, "election state changed");
                }
                d.coord = c;
                d.publish();
                d.converge_mode(false).and_then(|()| d.on_keepalive())
            }
            _ = term.recv() => break Ok(()),
            _ = int.recv() => break Ok(()),
            _ = &mut shutdown => break Ok(()),
            msg = stream_rx.recv() => match msg {
                Some(m) => d.on_stream(m, &mut stream_rx),
                None => break Err(anyhow::anyhow!("the watch task stopped")),
            },
            Some(ev) = guard_rx.recv() => {
                // Coalesce a burst (one `nft flush ruleset` touches every rule).
                while guard_rx.try_recv().is_ok() {}
                d.on_guard_event(&ev)
            }
            Some(()) = relink_rx.recv() => {
                if d.have_state { d.reconcile() } else { Ok(()) }
            }
            _ = health_rx.changed() => {
                let h = health_rx.borrow_and_update().clone();
                if h.healthy != d.dhcp.healthy {
                    info!(healthy = h.healthy, detail = %h.detail, "local DHCP health changed");
                }
                d.dhcp = h;
                d.publish();
                d.converge_mode(false)
            }
            _ = tick.tick() => {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                let watchdog = if d.mode == Mode::Leader && d.coord.expiry == Expiry::Never {
                    d.refresh_lease()
                } else {
                    Ok(())
                };
                watchdog.and_then(|()| {
                    if Instant::now() >= next_reconcile {
                        next_reconcile = Instant::now() + jittered(reconcile_every);
                        if d.have_state { d.reconcile() } else { Ok(()) }
                    } else {
                        d.converge_mode(false)
                    }
                })
            }
        };
        if let Err(e) = step {
            break Err(e);
        }
    };
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    let _ = stop_tx.send(true);
    info!("stopping: switching to Blocked");
    let blocked = d.converge_mode(true);
    // Closed first; now resign and revoke the lease so that the next leader opens at once.
    coord_stop.cancel();
    if tokio::time::timeout(Duration::from_millis(800), coord_task).await.is_err() {
        warn!("resigning took too long; the candidacy ends with the lease");
    }
    match (&result, blocked) {
        (Ok(()), Ok(())) => {
            info!("Blocked; exiting");
            Ok(())
        }
        (_, Err(e)) => {
            error!(error = format!("{e:#}"), "could not switch to Blocked; exiting so the kernel removes the table");
            result.and(Err(e))
        }
        (Err(_), Ok(())) => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Health {
        Health { healthy: true, detail: "ok".into() }
    }

    fn base(dhcp: &Health) -> Inputs<'_> {
        Inputs {
            have_state: true,
            apply_failed: false,
            regressed: None,
            lost_for: None,
            lost_after: Duration::from_secs(30),
            dhcp,
            session_valid: true,
            session_error: None,
            store_amnesia: None,
            elected: true,
            shutting_down: false,
        }
    }

    #[test]
    fn the_kernel_lease_ends_at_the_fence_deadline() {
        let now = Instant::now();
        let margin = Duration::from_secs(1);
        // An etcd session alive until now + 3 s: the lease runs until the fence deadline, now + 2 s.
        assert_eq!(
            lease_until(Expiry::At(now + Duration::from_secs(3)), margin, now),
            Some(now + Duration::from_secs(2))
        );
        // A keep-alive answered so late that the deadline is (almost) past: no lease.
        assert_eq!(lease_until(Expiry::At(now + Duration::from_millis(1010)), margin, now), None);
        assert_eq!(lease_until(Expiry::At(now + Duration::from_millis(500)), margin, now), None);
        assert_eq!(lease_until(Expiry::Expired, margin, now), None);
        // The local backend: a watchdog.
        assert_eq!(lease_until(Expiry::Never, margin, now), Some(now + LOCAL_LEASE));
    }

    #[test]
    fn every_doubt_blocks() {
        let h = healthy();
        let sick = Health { healthy: false, detail: "nothing listens on udp/67".into() };
        let d = |f: &dyn Fn(&mut Inputs<'_>)| {
            let mut i = base(&h);
            f(&mut i);
            decide(&i)
        };
        assert_eq!(d(&|_| {}).0, Mode::Leader);
        assert_eq!(d(&|i| i.have_state = false), (Mode::Blocked, Reason::NoState));
        assert_eq!(d(&|i| i.apply_failed = true).0, Mode::Blocked);
        assert_eq!(d(&|i| i.lost_for = Some(Duration::from_secs(31))).0, Mode::Blocked);
        assert_eq!(
            d(&|i| i.lost_for = Some(Duration::from_secs(29))).0,
            Mode::Leader,
            "within the bound the last state holds"
        );
        assert_eq!(d(&|i| i.shutting_down = true), (Mode::Blocked, Reason::ShuttingDown));
        // The lease fence closes even an elected leader.
        let (m, r) = d(&|i| i.session_valid = false);
        assert_eq!(m, Mode::Blocked);
        assert_eq!(r.cause(), Some("partition"));
        assert_eq!(d(&|i| i.elected = false), (Mode::Follower, Reason::NotElected));
        let mut i = base(&sick);
        assert_eq!(decide(&i).0, Mode::Follower);
        assert!(decide(&i).1.to_string().contains("udp/67"));
        assert!(!may_lead(&i), "an agent with sick DHCP does not campaign");
        i.dhcp = &h;
        i.elected = false;
        assert!(may_lead(&i), "a healthy follower campaigns");
        i.session_valid = false;
        assert!(!may_lead(&i), "a fenced agent does not campaign");
        // A regressed filter state closes, whatever else holds.
        let (m, r) = d(&|i| i.regressed = Some((42, 3)));
        assert_eq!((m, r.cause()), (Mode::Blocked, Some("state-regressed")));
        assert!(r.to_string().contains("from revision 42 to 3"), "{r}");
        // Store amnesia closes even an elected leader with a valid session, and it does not campaign meanwhile.
        let mut i = base(&h);
        i.store_amnesia = Some("store amnesia: the store's revision went back from 50 to 2");
        let (m, r) = decide(&i);
        assert_eq!((m, r.cause()), (Mode::Blocked, Some("store-amnesia")));
        assert!(r.to_string().contains("went back"), "{r}");
        assert!(!may_lead(&i));
        // control plane loss outranks DHCP health: no state can be trusted
        let mut i = base(&sick);
        i.lost_for = Some(Duration::from_secs(40));
        assert_eq!(decide(&i).0, Mode::Blocked);
    }
}
