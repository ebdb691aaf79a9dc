//! The agent's decisions as a state machine without I/O of its own: [`Core::step`] takes one [`Event`] (a stream
//! message batch, coordination news, DHCP health, a touched guard, a tick, the fence deadline, the lease's rewrite,
//! shutdown) with the current time and the dataplane, changes the typed state, writes the kernel through
//! [`Dataplane`] (the one narrow interface to it), and returns the [`Effect`]s the async shell must carry out
//! (reopen the stream for a snapshot, exit). Everything else the shell needs it reads back: [`Core::status`],
//! [`Core::may_lead`], [`Core::resume_revision`], [`Core::fence_deadline`]. Models: raft-rs's `RawNode::step`/`Ready`,
//! quinn-proto.
//!
//! The state is typed so that contradictions cannot be written: the filter state is one [`FilterSync`] (none yet,
//! applied at a revision, a failed batch waiting for a snapshot, or a refused regression), the guard one
//! [`GuardState`], the read-back one [`ReadBack`]. [`decide`] maps the state to the mode the table must be in;
//! every doubt leads to [`Mode::Blocked`].
//!
//! A kernel batch that fails while following the stream is not fatal: nothing changed (batches are atomic), the
//! agent blocks and resynchronises. A failed switch of the mode or of the kernel lease is fatal ([`CoreError`]):
//! the table can no longer be trusted, so the process exits and the kernel deletes the table it owns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_coord::Expiry;
use ironguard_dataplane::monitor::GuardEvent;
use ironguard_dataplane::{Dataplane, Delta, DesiredState, MacAddr, Mode, NftError, RulesetConfig, UnknownMacPolicy};
use ironguard_proto::v1::{self as pb, AgentStatus, DhcpHealth, filter_event::Event as FilterEventKind};
use tracing::{debug, error, info, info_span, warn};

use crate::coordination::CoordState;
use crate::dhcp_health::Health;
use crate::metrics::{CauseLabel, KindLabel, Metrics, SetLabel};
use crate::stream::{self, Identity, StreamMsg};

/// On the local backend (no etcd, nothing to fence against), the kernel lease is a watchdog: refreshed on every
/// tick of the main loop for this long, so a hung or frozen agent stops serving within it.
pub const LOCAL_LEASE: Duration = Duration::from_secs(2);
/// A lease shorter than this is not worth opening for: the keep-alive came too late, wait for the next one.
const MIN_LEASE: Duration = Duration::from_millis(20);
/// Read-backs that fail in a row before the agent stops trusting its table and blocks.
pub const READBACK_FAILURE_BOUND: u32 = 3;
/// While read-backs fail, the next one comes this soon (not a whole reconcile period later).
pub const READBACK_RETRY: Duration = Duration::from_secs(1);

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

/// Where the agent stands with the control plane's filter state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterSync {
    /// Nothing received yet (the table is Blocked).
    None,
    /// The state at `rev` is in the kernel and the stream follows it.
    Applied { rev: u64 },
    /// A kernel batch failed (or the stream broke its order); a snapshot was asked for.
    Failed { err: String },
    /// The control plane offered an older state than this agent applied: refused, closed until it is current.
    Regressed { applied: u64, offered: u64 },
}

/// The guard as the agent last found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardState {
    Intact,
    /// Missing or wrong, and the last repair failed.
    Broken {
        error: String,
    },
}

/// The periodic read-back of the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBack {
    /// Read-backs that failed in a row, and the last error.
    pub failures: u32,
    pub last_error: Option<String>,
    /// When the next one is due.
    pub next: Instant,
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
    /// The guard is missing or wrong and cannot be repaired: a leader without a guard would leave DHCP open if
    /// it crashed, so the agent steps down.
    GuardBroken(String),
    /// The kernel could not be read back [`READBACK_FAILURE_BOUND`] times in a row: the table is not trusted.
    ReadBackFailing(String),
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
            Reason::GuardBroken(e) => write!(f, "the guard cannot be repaired ({e}): not leading without it"),
            Reason::ReadBackFailing(e) => write!(
                f,
                "the kernel could not be read back {READBACK_FAILURE_BOUND} times in a row ({e}): closed until a \
                 read-back succeeds"
            ),
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
            Reason::GuardBroken(_) => {
                "see the kernel error logged before this line; check what else manages nftables on this host \
                 (ironguardctl chains; ironguard-agent guard status); the agent leads again once its guard is whole"
            }
            Reason::ReadBackFailing(_) => {
                "see the read-back error logged before this line (netlink, memory); the agent reopens by itself \
                 after a read-back succeeds"
            }
            Reason::ApplyFailed => "see the kernel error logged before this line; the agent resyncs by itself",
            Reason::ShuttingDown => "nothing: the agent is stopping and the guard keeps DHCP closed",
            Reason::NotElected | Reason::Leading => "nothing",
        }
    }

    /// The label of the fail-closed counter for this reason, if it is one.
    pub fn cause(&self) -> Option<&'static str> {
        match self {
            Reason::NoState => Some("no-state"),
            Reason::ControlPlaneLost(_) => Some("controlplane-lost"),
            Reason::ApplyFailed => Some("apply-failed"),
            Reason::ShuttingDown => Some("shutdown"),
            Reason::Partitioned(_) => Some("partition"),
            Reason::StoreAmnesia(_) => Some("store-amnesia"),
            Reason::StateRegressed { .. } => Some("state-regressed"),
            Reason::ReadBackFailing(_) => Some("readback-failing"),
            Reason::GuardBroken(_) | Reason::DhcpUnhealthy(_) | Reason::Leading | Reason::NotElected => None,
        }
    }
}

/// Everything the mode depends on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub sync: &'a FilterSync,
    pub lost_for: Option<Duration>,
    pub lost_after: Duration,
    pub dhcp: &'a Health,
    /// The session (lease) is alive for more than the margin: the lease fence holds.
    pub session_valid: bool,
    pub session_error: Option<&'a str>,
    /// Store amnesia seen less than one TTL ago: the reason.
    pub store_amnesia: Option<&'a str>,
    /// The guard is broken and its repair failed: the error.
    pub guard_broken: Option<&'a str>,
    /// Read-backs failed [`READBACK_FAILURE_BOUND`] times in a row: the last error.
    pub readback_failing: Option<&'a str>,
    pub elected: bool,
    pub shutting_down: bool,
}

/// What the agent's table should be, given what the agent knows. Pure, so every branch is unit-tested.
pub fn decide(i: &Inputs<'_>) -> (Mode, Reason) {
    if i.shutting_down {
        return (Mode::Blocked, Reason::ShuttingDown);
    }
    match i.sync {
        FilterSync::Failed { .. } => return (Mode::Blocked, Reason::ApplyFailed),
        FilterSync::Regressed { applied, offered } => {
            return (Mode::Blocked, Reason::StateRegressed { applied: *applied, offered: *offered });
        }
        FilterSync::None => return (Mode::Blocked, Reason::NoState),
        FilterSync::Applied { .. } => {}
    }
    if let Some(e) = i.readback_failing {
        return (Mode::Blocked, Reason::ReadBackFailing(e.to_string()));
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
    if let Some(e) = i.guard_broken {
        return (Mode::Follower, Reason::GuardBroken(e.to_string()));
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
pub fn may_lead(i: &Inputs<'_>) -> bool {
    let mut j = i.clone();
    j.elected = true;
    decide(&j).0 == Mode::Leader
}

/// What happens to the agent.
#[derive(Debug)]
pub enum Event {
    /// A stream message and every message queued behind it (a burst of deltas becomes one kernel transaction).
    Stream(Vec<StreamMsg>),
    /// News from the coordination task: a keep-alive (new expiry), elected or not, amnesia.
    Coord(CoordState),
    /// The local DHCP service's health changed.
    Dhcp(Health),
    /// Another process touched the guard (nf_tables notification).
    GuardTouched(GuardEvent),
    /// A provisioning link changed: read the kernel back (a rebuilt interface may have lost its egress chains).
    LinkChanged,
    /// The main loop's clock: the local backend's watchdog lease, read-back when due, the mode re-evaluated.
    Tick,
    /// The fence deadline passed: no keep-alive succeeded for TTL − margin.
    FenceDeadline,
    /// The dataplane's moment to write the lease again for the same deadline, so that it lasts longer
    /// ([`Dataplane::lease_rewrite_at`]: ipset's whole seconds).
    LeaseDue,
    /// SIGTERM, SIGINT or the shell's shutdown: close.
    Shutdown,
}

/// What the shell must do after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Reopen the control plane stream from [`Core::resume_revision`] (0 after a failure: a snapshot).
    Resync,
    /// Stop the process (after closing): the fence tripped and `exit_on_partition` is set.
    Exit(String),
}

/// A kernel write the agent cannot recover from: the table's state is unknown, so the process must exit (the
/// kernel then deletes the table it owns).
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("switching to {mode}")]
    ModeSwitch {
        mode: Mode,
        #[source]
        source: NftError,
    },
    #[error("refreshing the kernel lease")]
    Lease(#[source] NftError),
}

/// The settings the core decides with.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub dataplane: RulesetConfig,
    /// Hold the guard (`owner, persist`) where the kernel allows.
    pub guard_claim: bool,
    pub ttl: Duration,
    pub margin: Duration,
    /// Without a stream for this long, the last state is not trusted.
    pub lost_after: Duration,
    pub exit_on_partition: bool,
    /// Mean period of the full read-back.
    pub reconcile_every: Duration,
    pub who: Identity,
}

impl CoreConfig {
    pub fn new(cfg: &crate::AgentConfig, who: Identity) -> Self {
        Self {
            dataplane: cfg.dataplane.clone(),
            guard_claim: cfg.guard.claim,
            ttl: cfg.election.ttl(),
            margin: cfg.election.margin(),
            lost_after: cfg.controlplane.lost_after(),
            exit_on_partition: cfg.election.exit_on_partition,
            reconcile_every: Duration::from_secs(cfg.reconcile.interval_secs),
            who,
        }
    }
}

/// The stream as the core sees it.
#[derive(Debug, Clone)]
struct StreamLink {
    /// The connection whose events count (those of a replaced one are ignored).
    generation: u64,
    /// The next event is the first of this connection (a snapshot, or a resume).
    first_event_pending: bool,
    /// Since when no stream has been connected (`Some` at start).
    lost_since: Option<Instant>,
}

/// The agent's state and decisions. See the module documentation.
pub struct Core {
    cfg: CoreConfig,
    metrics: Arc<Metrics>,
    sync: FilterSync,
    /// The highest filter revision ever applied (of [`Core::epoch`]): an offer below it is a regression.
    floor: u64,
    /// The control plane store's epoch of the state applied here (empty: none yet, or a control plane that does
    /// not say). Revisions count within one epoch: a delta or heartbeat of another is never applied.
    epoch: String,
    /// The unknown-MAC policy of the filter state (the store's).
    policy: UnknownMacPolicy,
    /// Until when this network's discovery window is open (unknown MACs get DHCP meanwhile, whatever `policy`
    /// says). Forgotten when the stream is replaced: the control plane sends it again if it is still open.
    discovery_until: Option<Instant>,
    /// The policy in the kernel: `policy`, or allow while the discovery window is open.
    kernel_policy: UnknownMacPolicy,
    stream: StreamLink,
    dhcp: Health,
    coord: CoordState,
    guard: GuardState,
    readback: ReadBack,
    mode: Mode,
    reason: Reason,
    /// The session expiry estimate the kernel lease was last refreshed for.
    lease_for: Expiry,
    last_error: String,
    snapshots: u64,
    resumes: u64,
    shutting_down: bool,
    /// A factor around 1.0 for the read-back period (the shell draws it at random; tests use 1.0).
    jitter: Box<dyn FnMut() -> f64 + Send>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("sync", &self.sync)
            .field("floor", &self.floor)
            .field("mode", &self.mode)
            .field("reason", &self.reason)
            .field("guard", &self.guard)
            .field("readback", &self.readback)
            .finish_non_exhaustive()
    }
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

fn parse_delta(d: &pb::FilterDelta) -> Result<Delta, ironguard_dataplane::MacError> {
    Ok(Delta {
        allow_add: macs(&d.allow_add)?,
        allow_remove: macs(&d.allow_remove)?,
        deny_add: macs(&d.deny_add)?,
        deny_remove: macs(&d.deny_remove)?,
    })
}

impl Core {
    /// A core for a dataplane that was just created Blocked (`DesiredState::blocked`), at `now`.
    pub fn new(cfg: CoreConfig, metrics: Arc<Metrics>, now: Instant, jitter: Box<dyn FnMut() -> f64 + Send>) -> Self {
        let mut core = Self {
            readback: ReadBack { failures: 0, last_error: None, next: now },
            cfg,
            metrics,
            sync: FilterSync::None,
            floor: 0,
            epoch: String::new(),
            // Until a snapshot says otherwise, unknown MACs are denied (a snapshot without a policy keeps this).
            policy: UnknownMacPolicy::Deny,
            discovery_until: None,
            kernel_policy: UnknownMacPolicy::Deny,
            stream: StreamLink { generation: 0, first_event_pending: false, lost_since: Some(now) },
            dhcp: Health { healthy: false, detail: "not checked yet".into() },
            coord: CoordState::default(),
            guard: GuardState::Intact,
            mode: Mode::Blocked,
            reason: Reason::NoState,
            lease_for: Expiry::Expired,
            last_error: String::new(),
            snapshots: 0,
            resumes: 0,
            shutting_down: false,
            jitter,
        };
        core.readback.next = now + core.reconcile_period();
        core.metrics.mode.set(mode_pb(Mode::Blocked) as i64);
        core
    }

    fn reconcile_period(&mut self) -> Duration {
        self.cfg.reconcile_every.mul_f64((self.jitter)().clamp(0.5, 1.5))
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn reason(&self) -> &Reason {
        &self.reason
    }

    pub fn sync(&self) -> &FilterSync {
        &self.sync
    }

    pub fn guard(&self) -> &GuardState {
        &self.guard
    }

    pub fn readback(&self) -> &ReadBack {
        &self.readback
    }

    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The regression floor and the epoch it counts in, to keep across restarts ([`Core::restore_floor`]).
    pub fn floor(&self) -> (u64, &str) {
        (self.floor, &self.epoch)
    }

    /// Takes the floor and epoch a previous run of this agent kept: a control plane that offers an older state of
    /// the same epoch (a restored backup) is refused after a restart as well.
    pub fn restore_floor(&mut self, floor: u64, epoch: String) {
        self.floor = floor;
        self.epoch = epoch;
    }

    /// The store epoch of the state the stream resumes from (with [`Core::resume_revision`]).
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The revision the stream resumes from: the applied one, or 0 (a snapshot) without a trusted state.
    pub fn resume_revision(&self) -> u64 {
        match self.sync {
            FilterSync::Applied { rev } => rev,
            FilterSync::None | FilterSync::Failed { .. } | FilterSync::Regressed { .. } => 0,
        }
    }

    /// The revision whose state is in the kernel, as reported (0 when it is not trusted).
    pub fn applied_revision(&self) -> u64 {
        match self.sync {
            FilterSync::Applied { rev } => rev,
            FilterSync::Regressed { applied, .. } => applied,
            FilterSync::None | FilterSync::Failed { .. } => 0,
        }
    }

    /// When the lease fence trips, if the session can expire.
    pub fn fence_deadline(&self) -> Option<Instant> {
        self.coord.expiry.deadline(self.cfg.margin)
    }

    /// Ready (`/readyz`, `READY`): current state, open, healthy DHCP and a whole guard.
    pub fn ready(&self) -> bool {
        matches!(self.sync, FilterSync::Applied { .. })
            && self.mode != Mode::Blocked
            && self.dhcp.healthy
            && self.guard == GuardState::Intact
    }

    fn inputs(&self, now: Instant) -> Inputs<'_> {
        Inputs {
            sync: &self.sync,
            lost_for: self.stream.lost_since.map(|t| now.saturating_duration_since(t)),
            lost_after: self.cfg.lost_after,
            dhcp: &self.dhcp,
            session_valid: self.coord.expiry.valid_with_margin(self.cfg.margin, now),
            session_error: self.coord.error.as_deref(),
            store_amnesia: self
                .coord
                .amnesia
                .as_ref()
                .filter(|(at, _)| now.saturating_duration_since(*at) < self.cfg.ttl)
                .map(|(_, why)| why.as_str()),
            guard_broken: match &self.guard {
                GuardState::Broken { error } => Some(error.as_str()),
                GuardState::Intact => None,
            },
            readback_failing: self
                .readback
                .last_error
                .as_deref()
                .filter(|_| self.readback.failures >= READBACK_FAILURE_BOUND),
            elected: self.coord.elected,
            shutting_down: self.shutting_down,
        }
    }

    /// Whether the agent may campaign now (the shell tells the coordination task).
    pub fn may_lead(&self, now: Instant) -> bool {
        may_lead(&self.inputs(now))
    }

    /// The status reported to the control plane.
    pub fn status(&self, dp: &dyn Dataplane) -> AgentStatus {
        let (allow, deny) = dp.committed().map(|s| (s.allow.len(), s.deny.len())).unwrap_or((0, 0));
        let who = &self.cfg.who;
        AgentStatus {
            agent_id: who.agent_id.clone(),
            host: who.host.clone(),
            network: who.network.clone(),
            applied_revision: self.applied_revision(),
            mode: mode_pb(self.mode) as i32,
            allow_count: allow as u64,
            deny_count: deny as u64,
            last_error: self.last_error.clone(),
            dhcp: Some(DhcpHealth { healthy: self.dhcp.healthy, detail: self.dhcp.detail.clone() }),
            mode_reason: self.reason.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            snapshots_applied: self.snapshots,
            resumes: self.resumes,
            coordination: who.coordination.to_string(),
            // Filled in by the report loop when it sends, from the lease as last written: a keep-alive is not a
            // change of status; and what the kernel saw, read then.
            lease_until_unix_ms: 0,
            ..Default::default()
        }
    }

    /// Handles one event. See the module documentation.
    pub fn step(&mut self, dp: &mut dyn Dataplane, now: Instant, event: Event) -> Result<Vec<Effect>, CoreError> {
        let mut fx = Vec::new();
        match event {
            Event::Stream(batch) => self.on_stream(dp, now, batch, &mut fx)?,
            Event::Coord(c) => {
                if c.elected != self.coord.elected {
                    info!(elected = c.elected, "election state changed");
                }
                self.coord = c;
                self.converge(dp, now)?;
                // A leader whose session got a new expiry estimate (a keep-alive succeeded) moves its kernel lease.
                if self.mode == Mode::Leader && self.coord.expiry != self.lease_for {
                    self.refresh_lease(dp, now)?;
                }
            }
            Event::Dhcp(h) => {
                if h.healthy != self.dhcp.healthy {
                    info!(healthy = h.healthy, detail = %h.detail, "local DHCP health changed");
                }
                self.dhcp = h;
                self.converge(dp, now)?;
            }
            Event::GuardTouched(ev) => {
                let problems = dp.guard_problems(&self.cfg.dataplane, self.cfg.guard_claim);
                if problems.is_empty() {
                    info!(event = %ev, "the guard was touched but is intact");
                    self.guard = GuardState::Intact;
                } else {
                    warn!(event = %ev, problems = ?problems, "the guard was tampered with; repairing it now");
                    self.repair_guard(dp, "change notification");
                }
                self.converge(dp, now)?;
            }
            Event::LinkChanged => self.reconcile(dp, now, &mut fx)?,
            Event::Tick => {
                if self.discovery_until.is_some_and(|u| now >= u) {
                    info!("the discovery window closed: unknown MACs get DHCP no more");
                    self.discovery_until = None;
                    self.apply_policy(dp, now, &mut fx)?;
                }
                if self.mode == Mode::Leader && self.coord.expiry == Expiry::Never {
                    self.refresh_lease(dp, now)?;
                }
                if now >= self.readback.next {
                    self.reconcile(dp, now, &mut fx)?;
                } else {
                    self.converge(dp, now)?;
                }
            }
            Event::LeaseDue => {
                if self.mode == Mode::Leader {
                    self.refresh_lease(dp, now)?;
                }
            }
            Event::FenceDeadline => {
                warn!("lease fence: no keep-alive succeeded for TTL - margin; closing before the lease can expire");
                self.converge(dp, now)?;
                if self.cfg.exit_on_partition {
                    fx.push(Effect::Exit("exit_on_partition: the lease fence tripped (DHCP closed)".into()));
                }
            }
            Event::Shutdown => {
                self.shutting_down = true;
                info!("stopping: switching to Blocked");
                self.converge(dp, now)?;
            }
        }
        self.publish_metrics(dp);
        Ok(fx)
    }

    fn publish_metrics(&self, dp: &dyn Dataplane) {
        let (allow, deny) = dp.committed().map(|s| (s.allow.len(), s.deny.len())).unwrap_or((0, 0));
        let m = &self.metrics;
        m.set_size.get_or_create(&SetLabel { set: "allow" }).set(allow as i64);
        m.set_size.get_or_create(&SetLabel { set: "deny" }).set(deny as i64);
        m.applied_revision.set(self.applied_revision() as i64);
        m.dhcp_healthy.set(self.dhcp.healthy as i64);
        m.guard_ok.set((self.guard == GuardState::Intact) as i64);
        m.mode.set(mode_pb(self.mode) as i64);
    }

    fn record(&self, kind: &'static str, r: &Result<ironguard_dataplane::ApplyReport, NftError>) {
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

    /// The policy for the kernel: `policy`, or allow while the discovery window is open.
    fn effective_policy(&self, policy: UnknownMacPolicy, now: Instant) -> UnknownMacPolicy {
        if self.discovery_until.is_some_and(|u| now < u) { UnknownMacPolicy::Allow } else { policy }
    }

    /// Puts the effective policy in the kernel if it changed (the mode's rules are written again).
    fn apply_policy(&mut self, dp: &mut dyn Dataplane, now: Instant, fx: &mut Vec<Effect>) -> Result<(), CoreError> {
        let policy = self.effective_policy(self.policy, now);
        if policy == self.kernel_policy {
            return Ok(());
        }
        let r = dp.set_mode(self.mode, policy);
        self.record("mode", &r);
        if let Err(e) = r {
            return self.apply_failed(dp, now, "switching the unknown-MAC policy", &e, fx);
        }
        self.kernel_policy = policy;
        info!(policy = %policy, "unknown MACs: policy in the kernel changed");
        Ok(())
    }

    /// The network's discovery window opened (for `open_for_ms` from now), changed or closed (0).
    fn on_discovery(
        &mut self,
        dp: &mut dyn Dataplane,
        now: Instant,
        open_for_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        self.discovery_until = (open_for_ms > 0).then(|| now + Duration::from_millis(open_for_ms));
        if open_for_ms > 0 {
            info!(open_for_secs = open_for_ms / 1000, "discovery window open: unknown MACs get DHCP until it closes");
        } else {
            info!("discovery window closed");
        }
        self.apply_policy(dp, now, fx)
    }

    /// Brings the table to the mode it should be in. A failure is fatal (see [`CoreError`]).
    fn converge(&mut self, dp: &mut dyn Dataplane, now: Instant) -> Result<(), CoreError> {
        let (mode, reason) = decide(&self.inputs(now));
        if mode != self.mode {
            let span = info_span!("mode_switch", from = %self.mode, to = %mode, reason = %reason);
            let _g = span.enter();
            if mode == Mode::Leader {
                // The lease first: the marking rules are useless (and harmless) without it.
                self.refresh_lease(dp, now)?;
            }
            let policy = self.effective_policy(self.policy, now);
            let r = dp.set_mode(mode, policy);
            self.record("mode", &r);
            r.map_err(|source| CoreError::ModeSwitch { mode, source })?;
            self.kernel_policy = policy;
            if mode == Mode::Blocked {
                if let Some(cause) = reason.cause() {
                    self.metrics.fail_closed.get_or_create(&CauseLabel { cause }).inc();
                }
                warn!(next_step = reason.next_step(), "failed closed: DHCP blocked on this host because {reason}");
            } else if let Reason::GuardBroken(_) = reason {
                error!(next_step = reason.next_step(), "stepping down: {reason}");
            } else {
                info!("mode switched");
            }
            self.mode = mode;
        }
        self.reason = reason;
        Ok(())
    }

    /// Moves the kernel lease to the current fence deadline (see [`lease_until`]): after a keep-alive, when
    /// becoming Leader, on the local backend's tick, and when the dataplane asks to write it again
    /// ([`Event::LeaseDue`]). A deadline already too close drops the lease instead: the
    /// kernel then marks nothing until the next keep-alive.
    fn refresh_lease(&mut self, dp: &mut dyn Dataplane, now: Instant) -> Result<(), CoreError> {
        let until = lease_until(self.coord.expiry, self.cfg.margin, now);
        if until.is_none() {
            self.metrics.lease_late.inc();
            warn!(expiry = ?self.coord.expiry, "no time left on the lease: the kernel lease is dropped");
        }
        let r = dp.refresh_lease(until);
        self.record("lease", &r);
        r.map_err(CoreError::Lease)?;
        self.metrics.lease_refreshes.inc();
        self.lease_for = self.coord.expiry;
        Ok(())
    }

    /// Rebuilds the guard (claiming it where the kernel allows). A failure is remembered: the agent does not lead
    /// without a guard, and the next read-back or notification tries again.
    fn repair_guard(&mut self, dp: &mut dyn Dataplane, trigger: &'static str) {
        let start = Instant::now();
        match dp.claim_guard(&self.cfg.dataplane, self.cfg.guard_claim) {
            Ok(()) => {
                self.metrics.guard_repairs.inc();
                info!(trigger, elapsed_us = start.elapsed().as_micros() as u64, "guard repaired");
                self.guard = GuardState::Intact;
            }
            Err(e) => {
                self.metrics.netlink_errors.inc();
                if self.guard == GuardState::Intact {
                    error!(trigger, error = %e, "repairing the guard failed; this host does not lead until it is whole");
                }
                self.guard = GuardState::Broken { error: e.to_string() };
            }
        }
    }

    /// A kernel batch failed, or the stream broke its order: nothing changed in the kernel (batches are atomic),
    /// but the state can no longer be trusted to follow the stream. Block, and resynchronise from a snapshot.
    fn apply_failed(
        &mut self,
        dp: &mut dyn Dataplane,
        now: Instant,
        what: &str,
        e: &dyn std::fmt::Display,
        fx: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        let text = format!("{what}: {e:#}");
        if text == self.last_error {
            // The same kernel error again, on the next resync (which backs off): said once already.
            debug!(error = %e, "{what} failed again; still closed, retrying");
        } else {
            error!(error = %e, "{what} failed; failing closed and resynchronising");
        }
        self.last_error = text.clone();
        self.sync = FilterSync::Failed { err: text };
        fx.push(Effect::Resync);
        self.converge(dp, now)
    }

    fn on_snapshot(
        &mut self,
        dp: &mut dyn Dataplane,
        now: Instant,
        s: pb::FilterSnapshot,
        fx: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        let span = info_span!("apply_snapshot", revision = s.revision);
        let _g = span.enter();
        // A snapshot of another epoch is another history (the store was created again): its revisions are not
        // comparable with the floor, which restarts from it. One of the same epoch below the floor went back.
        let new_history = !s.epoch.is_empty() && s.epoch != self.epoch;
        let floor = if new_history { 0 } else { self.floor };
        if new_history && !self.epoch.is_empty() {
            warn!(
                epoch = %s.epoch,
                was = %self.epoch,
                floor = self.floor,
                "the control plane's filter store is another history than the one applied here (created again): \
                 replacing the whole state with its snapshot; deltas of the old one are never applied"
            );
        }
        if s.revision < floor {
            if !matches!(self.sync, FilterSync::Regressed { .. }) {
                error!(
                    applied = self.floor,
                    offered = s.revision,
                    "the control plane offers an older filter state than this agent applied; refusing it and failing closed"
                );
            }
            self.sync = FilterSync::Regressed { applied: self.floor, offered: s.revision };
            return self.converge(dp, now);
        }
        if let FilterSync::Regressed { applied, .. } = self.sync {
            info!(applied, revision = s.revision, "the control plane's filter state is current again");
        }
        let (allow, deny) = match (macs(&s.allow), macs(&s.deny)) {
            (Ok(a), Ok(d)) => (a, d),
            (Err(e), _) | (_, Err(e)) => {
                let e = format!("bad MAC from the control plane: {e}");
                return self.apply_failed(dp, now, "snapshot", &e, fx);
            }
        };
        // A snapshot is the whole state: a policy it does not name (the protocol's zero value) is deny, never
        // what an earlier snapshot said.
        let policy = policy_from_pb(s.unknown_mac_policy).unwrap_or(UnknownMacPolicy::Deny);
        // Decide the mode as if the state were in place (it will be, or we fail closed).
        let before = std::mem::replace(&mut self.sync, FilterSync::Applied { rev: s.revision });
        let (mode, reason) = decide(&self.inputs(now));
        self.sync = before;
        let desired = DesiredState {
            config: self.cfg.dataplane.clone(),
            mode,
            unknown_mac_policy: self.effective_policy(policy, now),
            allow: allow.into_iter().collect(),
            deny: deny.into_iter().collect(),
        };
        let r = dp.apply(&desired);
        self.record("full", &r);
        match r {
            Ok(rep) => {
                self.sync = FilterSync::Applied { rev: s.revision };
                self.policy = policy;
                self.kernel_policy = desired.unknown_mac_policy;
                self.floor = floor.max(s.revision);
                self.epoch = s.epoch;
                self.snapshots += 1;
                self.metrics.snapshots_applied.inc();
                self.mode = mode;
                self.reason = reason;
                self.last_error.clear();
                info!(
                    allow = desired.allow.len(),
                    deny = desired.deny.len(),
                    mode = %mode,
                    elapsed_ms = rep.elapsed.as_millis() as u64,
                    "applied snapshot (full reload)"
                );
                if mode == Mode::Leader && dp.lease_until().is_none() {
                    self.refresh_lease(dp, now)?;
                }
                Ok(())
            }
            Err(e) => self.apply_failed(dp, now, "applying the snapshot", &e, fx),
        }
    }

    /// Applies consecutive deltas as one kernel transaction.
    fn on_deltas(
        &mut self,
        dp: &mut dyn Dataplane,
        now: Instant,
        deltas: Vec<pb::FilterDelta>,
        fx: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        if deltas.is_empty() {
            return Ok(());
        }
        let first = match self.sync {
            FilterSync::Applied { rev } => rev,
            FilterSync::Regressed { .. } => {
                // Deltas of a regressed state continue another history: never apply them. Once it is past where
                // this agent was, take a full snapshot of it.
                if deltas.iter().any(|d| d.revision > self.floor) && !fx.contains(&Effect::Resync) {
                    info!(
                        floor = self.floor,
                        "the control plane's state passed the revision applied here; resynchronising"
                    );
                    fx.push(Effect::Resync);
                }
                return Ok(());
            }
            // Deltas without a base state (the snapshot failed or has not come): a snapshot is on its way.
            FilterSync::None | FilterSync::Failed { .. } => return Ok(()),
        };
        if let Some(d) = deltas.iter().find(|d| d.epoch != self.epoch) {
            let e = format!(
                "a delta (revision {}) of store epoch {:?}, but the state here is of epoch {:?}",
                d.revision, d.epoch, self.epoch
            );
            return self.apply_failed(dp, now, "following the stream", &e, fx);
        }
        let mut combined = Delta::default();
        let mut last = first;
        let mut policy = self.policy;
        for d in deltas {
            if d.revision <= last {
                continue; // replayed after a reconnect
            }
            if d.revision != last + 1 {
                let e = format!("revision gap: applied {last}, received {}", d.revision);
                return self.apply_failed(dp, now, "following the stream", &e, fx);
            }
            match parse_delta(&d) {
                Ok(p) => combined.then(&p),
                Err(e) => {
                    let e = format!("bad MAC from the control plane: {e}");
                    return self.apply_failed(dp, now, "delta", &e, fx);
                }
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
        let r = dp.apply_delta(&combined);
        self.record("delta", &r);
        if let Err(e) = r {
            return self.apply_failed(dp, now, "applying a delta", &e, fx);
        }
        if policy != self.policy {
            self.policy = policy;
            info!(policy = %policy, "unknown-MAC policy changed");
            self.apply_policy(dp, now, fx)?;
        }
        self.sync = FilterSync::Applied { rev: last };
        self.floor = self.floor.max(last);
        self.last_error.clear();
        debug!(revisions = last - first, "applied");
        Ok(())
    }

    /// Handles a batch of stream messages in order, coalescing consecutive deltas into one kernel transaction.
    fn on_stream(
        &mut self,
        dp: &mut dyn Dataplane,
        now: Instant,
        batch: Vec<StreamMsg>,
        fx: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        let mut pending: Vec<pb::FilterDelta> = Vec::new();
        for msg in batch {
            match msg {
                StreamMsg::Connected { generation, endpoint, since } => {
                    self.on_deltas(dp, now, std::mem::take(&mut pending), fx)?;
                    self.stream = StreamLink { generation, first_event_pending: true, lost_since: None };
                    // A window is the old connection's news: the new one sends it again if it is still open.
                    self.discovery_until = None;
                    self.apply_policy(dp, now, fx)?;
                    self.metrics.stream_connected.set(1);
                    info!(endpoint, since, "watching filters");
                    self.converge(dp, now)?;
                }
                StreamMsg::Lost { generation, error } if generation == self.stream.generation => {
                    self.on_deltas(dp, now, std::mem::take(&mut pending), fx)?;
                    if self.stream.lost_since.is_none() {
                        self.stream.lost_since = Some(now);
                        if error == stream::RESYNC {
                            // Our own reconnect after a failed apply, already logged as such.
                            debug!(error, "reopening the control plane stream for a snapshot");
                        } else {
                            warn!(
                                error,
                                bound_secs = self.cfg.lost_after.as_secs(),
                                "control plane stream lost; keeping the current state until the bound"
                            );
                        }
                    }
                    self.metrics.stream_connected.set(0);
                }
                StreamMsg::Event { generation, event } if generation == self.stream.generation => {
                    if std::mem::take(&mut self.stream.first_event_pending) {
                        let is_snapshot = matches!(event.event, Some(FilterEventKind::Snapshot(_)));
                        if let (false, FilterSync::Applied { rev }) = (is_snapshot, &self.sync) {
                            self.resumes += 1;
                            self.metrics.resumes.inc();
                            info!(revision = rev, "resumed from the applied revision without a full reload");
                        }
                    }
                    match event.event {
                        Some(FilterEventKind::Delta(d)) => pending.push(d),
                        Some(FilterEventKind::Snapshot(s)) => {
                            pending.clear();
                            self.on_snapshot(dp, now, s, fx)?;
                        }
                        Some(FilterEventKind::Heartbeat(h)) => {
                            self.on_deltas(dp, now, std::mem::take(&mut pending), fx)?;
                            let applied = match self.sync {
                                FilterSync::Applied { rev } => Some(rev),
                                _ => None,
                            };
                            if let Some(rev) = applied {
                                if h.epoch != self.epoch {
                                    let e = format!(
                                        "heartbeat of store epoch {:?}, but the state here is of epoch {:?}",
                                        h.epoch, self.epoch
                                    );
                                    self.apply_failed(dp, now, "following the stream", &e, fx)?;
                                } else if h.revision > rev {
                                    let e = format!("heartbeat at revision {} but applied {rev}", h.revision);
                                    self.apply_failed(dp, now, "following the stream", &e, fx)?;
                                }
                            }
                        }
                        Some(FilterEventKind::Discovery(w)) => {
                            self.on_deltas(dp, now, std::mem::take(&mut pending), fx)?;
                            self.on_discovery(dp, now, w.open_for_ms, fx)?;
                        }
                        None => {}
                    }
                }
                StreamMsg::Lost { .. } | StreamMsg::Event { .. } => {} // of a replaced connection
            }
        }
        self.on_deltas(dp, now, pending, fx)?;
        self.converge(dp, now)
    }

    /// Reads the kernel back: checks the guard (repairs it) and the table (repairs drift with a full apply of the
    /// committed state). A read-back that keeps failing blocks after [`READBACK_FAILURE_BOUND`] tries, retried
    /// every [`READBACK_RETRY`] meanwhile. The next read-back is due a period after this one *ended*: one slower
    /// than its period (each `ipset` or `iptables-save` process on a starved CPU) would otherwise be due again at
    /// once, at every tick, and leave the main loop no time for its inputs.
    fn reconcile(&mut self, dp: &mut dyn Dataplane, now: Instant, fx: &mut Vec<Effect>) -> Result<(), CoreError> {
        let span = info_span!("reconcile");
        let _g = span.enter();
        let problems = dp.guard_problems(&self.cfg.dataplane, self.cfg.guard_claim);
        if problems.is_empty() {
            if let GuardState::Broken { .. } = self.guard {
                info!("the guard is whole again");
            }
            self.guard = GuardState::Intact;
        } else {
            warn!(problems = ?problems, "the guard differs from the configuration; repairing it");
            self.repair_guard(dp, "read-back");
        }
        match dp.drift(true) {
            Ok(d) => {
                if self.readback.failures >= READBACK_FAILURE_BOUND {
                    info!("the kernel can be read back again");
                }
                self.readback.failures = 0;
                self.readback.last_error = None;
                self.readback.next = ended(now) + self.reconcile_period();
                if !d.is_empty() {
                    warn!(drift = ?d, "kernel state differs from the committed state; repairing");
                    self.metrics.drift_repairs.inc();
                    if let Some(c) = dp.committed().cloned() {
                        let r = dp.apply(&c);
                        self.record("full", &r);
                        if let Err(e) = r {
                            return self.apply_failed(dp, now, "repairing drift", &e, fx);
                        }
                    }
                }
            }
            Err(e) => {
                self.readback.failures = self.readback.failures.saturating_add(1);
                self.readback.next = ended(now) + READBACK_RETRY;
                self.metrics.readback_errors.inc();
                warn!(error = %e, failures = self.readback.failures, bound = READBACK_FAILURE_BOUND, "read-back failed");
                self.readback.last_error = Some(e.to_string());
            }
        }
        self.converge(dp, now)
    }
}

/// When work that began at `now` ended: the clock now, or `now` itself when the caller's clock runs ahead of it
/// (the tests step the core through time by hand).
fn ended(now: Instant) -> Instant {
    now.max(Instant::now())
}

#[cfg(test)]
mod tests;
