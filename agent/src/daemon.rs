//! `ironguard-agent run`: the async shell around the agent's [`Core`].
//!
//! Start-up: guard installed → agent's table created `Blocked` (then `READY=1`) → the input tasks (the control
//! plane stream, the coordination task, DHCP health and provisioning links, guard notifications) → the main
//! loop, which turns whatever arrives into one [`Event`], lets [`Core::step`] decide and write the kernel, and
//! carries out the [`Effect`]s. Every decision lives in the core; this file only moves events and results.
//!
//! The lease fence is enforced by the kernel: a leader's marking rules match only while the lease element in its
//! table lives, and the core moves that element's expiry to the fence deadline after each keep-alive (and writes
//! it again for the same deadline when a backend with coarse timeouts asks), never past it. A frozen or starved
//! agent therefore stops serving at its deadline without running any code. The fence arm of the main loop is a
//! second line; a stop (which only closes) and the tick (the systemd watchdog, the local backend's lease, the
//! read-backs) come right after it, so no flood of stream or coordination news can starve them ([`next_event`];
//! tested below). The tick never bursts to catch up ([`main_tick`]), and a read-back's period counts from its end,
//! so on a starved CPU, where each step takes longer than a tick, the inputs are still served between ticks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_dataplane::monitor::{GuardEvent, Monitor};
use ironguard_dataplane::{Dataplane, DesiredState, Mode, UnknownMacPolicy};
use ironguard_proto::v1::AgentStatus;
use rand::Rng as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::AgentConfig;
use crate::coordination::{self, Candidacy, CoordState};
use crate::core::{Core, CoreConfig, Effect, Event};
use crate::dhcp_health::{self, Health};
use crate::dhcp_probe;
use crate::link;
use crate::metrics::{AdminState, Metrics};
use crate::notify::{self, Notification};
use crate::stream::{self, Identity, ResumePoint, StreamMsg};

pub use crate::core::{LOCAL_LEASE, Reason, decide, lease_until};

/// The table, reachable from the panic hook for a best-effort switch to `Blocked`.
static TABLE: OnceLock<SharedDataplane> = OnceLock::new();

type SharedDataplane = Arc<Mutex<Box<dyn Dataplane>>>;

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

/// Where the main loop's events come from.
struct Sources {
    stream: mpsc::Receiver<StreamMsg>,
    coord: watch::Receiver<CoordState>,
    health: watch::Receiver<Health>,
    guard: mpsc::Receiver<GuardEvent>,
    relink: mpsc::Receiver<()>,
}

/// Where the core's results go: the kernel (through the dataplane), the input tasks, the admin endpoint and the
/// status reports.
struct Shell {
    dp: SharedDataplane,
    /// The revision (and store epoch) the stream resumes from.
    resume: Arc<ResumePoint>,
    /// Where the filter regression floor is kept across restarts, and what was written there last.
    floor_file: Option<std::path::PathBuf>,
    floor_saved: Mutex<FilterFloor>,
    resync: watch::Sender<u64>,
    want_lead: watch::Sender<bool>,
    /// Whether the table is open (Leader): the coordination task records a hand-over only once it is not.
    open: watch::Sender<bool>,
    status: watch::Sender<AgentStatus>,
    /// The end of the kernel lease as last written (Unix milliseconds; 0: none), for status reports.
    lease_wall: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
    why: Arc<Mutex<String>>,
    stop: watch::Sender<bool>,
    coord_stop: CancellationToken,
}

/// The filter regression floor and its store epoch, kept in the state directory (`agent-<id>.filters.json`) so that
/// a restarted agent still refuses an older state of the same store (a control plane restored from a backup).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FilterFloor {
    pub floor: u64,
    pub epoch: String,
}

impl FilterFloor {
    /// The file beside the coordination state file.
    pub fn path(cfg: &AgentConfig) -> Option<std::path::PathBuf> {
        cfg.agent.state_file().map(|p| p.with_extension("filters.json"))
    }

    /// What a previous run kept; `None` when there is no file. A file that cannot be read is said and ignored:
    /// the floor then starts at 0, as without the file.
    pub fn load(path: &std::path::Path) -> Option<Self> {
        let bytes = std::fs::read(path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "ignoring an unreadable filter floor file");
                None
            }
        }
    }

    /// Written to a temporary file and renamed, so a crash never leaves half a file.
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }
}

impl Shell {
    /// Keeps the core's regression floor and epoch on disk when they changed.
    fn save_floor(&self, core: &Core) {
        let Some(path) = &self.floor_file else { return };
        let (floor, epoch) = core.floor();
        let mut saved = self.floor_saved.lock().unwrap_or_else(|e| e.into_inner());
        if saved.floor == floor && saved.epoch == epoch {
            return;
        }
        let now = FilterFloor { floor, epoch: epoch.to_string() };
        match now.save(path) {
            Ok(()) => *saved = now,
            Err(e) => warn!(path = %path.display(), error = %e, "cannot keep the filter floor; a restart forgets it"),
        }
    }

    /// When the dataplane wants the lease written again for a longer lease (a leader only).
    fn lease_due(&self, core: &Core) -> Option<Instant> {
        if core.mode() != Mode::Leader {
            return None;
        }
        self.dp.lock().unwrap_or_else(|e| e.into_inner()).lease_rewrite_at()
    }

    /// One step of the core, then its results carried out. `Ok(Some(why))`: the core asks the process to exit.
    fn step(&self, core: &mut Core, event: Event) -> anyhow::Result<Option<String>> {
        let mut dp = self.dp.lock().unwrap_or_else(|e| e.into_inner());
        let effects = tokio::task::block_in_place(|| core.step(&mut **dp, Instant::now(), event))?;
        self.resume.set(core.resume_revision(), core.epoch());
        self.save_floor(core);
        self.lease_wall.store(stream::unix_ms_of(dp.lease_until()), Ordering::SeqCst);
        let status = core.status(&**dp);
        drop(dp);
        self.status.send_if_modified(|old| std::mem::replace(old, status.clone()) != status);
        self.ready.store(core.ready(), Ordering::Relaxed);
        if let Ok(mut w) = self.why.lock() {
            *w = core.reason().to_string();
        }
        // Only after the table is closed may the candidacy be withdrawn; only when leading is possible campaign.
        let may = core.may_lead(Instant::now());
        self.want_lead.send_if_modified(|w| std::mem::replace(w, may) != may);
        let leading = core.mode() == Mode::Leader;
        self.open.send_if_modified(|o| std::mem::replace(o, leading) != leading);
        let mut exit = None;
        for e in effects {
            match e {
                Effect::Resync => self.resync.send_modify(|g| *g += 1),
                Effect::Exit(why) => exit = Some(why),
            }
        }
        Ok(exit)
    }
}

/// The main loop's clock: the systemd watchdog, the local backend's lease, read-backs when due.
const TICK: Duration = Duration::from_millis(250);

/// The main loop's tick every `period`. A tick missed while a step ran long fires once, and the next one comes a
/// whole period later: never the burst of catch-up ticks tokio's default sends. (With the burst, a CPU so starved
/// that each step outlasted a tick kept the tick always ready: the biased loop then never looked at a stop or an
/// input, and an agent ignored SIGTERM and its control plane's deltas for minutes; track record T21.)
pub(crate) fn main_tick(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// What wakes the main loop.
#[derive(Debug)]
enum Wake {
    /// Something for the core.
    Event(Event),
    /// SIGTERM, SIGINT or the shell's shutdown.
    Stop,
    /// The watch task is gone (it never ends by itself).
    StreamGone,
}

/// Waits for the next thing the main loop must handle. Biased, in this order: the lease fence (close before the
/// lease can expire), a stop (it only closes), the tick (the watchdog), the lease's rewrite, then the inputs.
/// Whatever floods the inputs, a due fence, stop or tick is taken first: the inputs are only polled when none is
/// ready; and since the tick does not burst ([`main_tick`]), it cannot stay ready for ever.
async fn next_event(
    src: &mut Sources,
    tick: &mut tokio::time::Interval,
    fence: Option<Instant>,
    lease_due: Option<Instant>,
    stop: impl std::future::Future<Output = ()>,
) -> Wake {
    tokio::select! {
        biased;
        () = sleep_until(fence) => Wake::Event(Event::FenceDeadline),
        () = stop => Wake::Stop,
        _ = tick.tick() => Wake::Event(Event::Tick),
        () = sleep_until(lease_due) => Wake::Event(Event::LeaseDue),
        Ok(()) = src.coord.changed() => Wake::Event(Event::Coord(src.coord.borrow_and_update().clone())),
        Ok(()) = src.health.changed() => Wake::Event(Event::Dhcp(src.health.borrow_and_update().clone())),
        Some(ev) = src.guard.recv() => {
            // Coalesce a burst (one `nft flush ruleset` touches every rule).
            while src.guard.try_recv().is_ok() {}
            Wake::Event(Event::GuardTouched(ev))
        }
        Some(()) = src.relink.recv() => Wake::Event(Event::LinkChanged),
        msg = src.stream.recv() => match msg {
            Some(first) => {
                let mut batch = vec![first];
                while let Ok(m) = src.stream.try_recv() {
                    batch.push(m);
                }
                Wake::Event(Event::Stream(batch))
            }
            None => Wake::StreamGone,
        },
    }
}

/// Runs the agent until SIGTERM/SIGINT (or `shutdown` resolves). Returns an error only if the table could not
/// be created or kept safe.
pub async fn run(
    cfg: AgentConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (mut core, shell, mut src, coord_task) = start(cfg).await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut tick = main_tick(TICK);
    tokio::pin!(shutdown);
    let result: anyhow::Result<()> = loop {
        // Only a deadline still ahead arms the fence; once passed, every event re-evaluates the mode.
        let fence = core.fence_deadline().filter(|t| *t > Instant::now());
        let lease_due = shell.lease_due(&core);
        let stop = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                () = &mut shutdown => {}
            }
        };
        let event = match next_event(&mut src, &mut tick, fence, lease_due, stop).await {
            Wake::Event(e) => e,
            Wake::Stop => break Ok(()),
            Wake::StreamGone => break Err(anyhow::anyhow!("the watch task stopped")),
        };
        if matches!(event, Event::Tick) {
            notify::notify(Notification::Watchdog);
        }
        match shell.step(&mut core, event) {
            Ok(None) => {}
            Ok(Some(why)) => break Err(anyhow::anyhow!(why)),
            Err(e) => break Err(e),
        }
    };
    notify::notify(Notification::Stopping);
    let _ = shell.stop.send(true);
    let blocked = shell.step(&mut core, Event::Shutdown);
    // Closed first; now resign and revoke the lease so that the next leader opens at once.
    shell.coord_stop.cancel();
    if tokio::time::timeout(Duration::from_millis(800), coord_task).await.is_err() {
        warn!("resigning took too long; the candidacy ends with the lease");
    }
    match (result, blocked) {
        (Ok(()), Ok(_)) => {
            info!("Blocked; exiting");
            Ok(())
        }
        (result, Err(e)) => {
            error!(error = format!("{e:#}"), "could not switch to Blocked; exiting so the kernel removes the table");
            result.and(Err(e))
        }
        (Err(e), Ok(_)) => Err(e),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Everything before the main loop: the admin endpoint, the guard and the Blocked table, the input tasks.
async fn start(mut cfg: AgentConfig) -> anyhow::Result<(Core, Shell, Sources, tokio::task::JoinHandle<()>)> {
    let probe = dhcp_probe::plan(&cfg).map_err(|e| anyhow::anyhow!(e))?;
    match &probe {
        Some(p) => {
            info!(interface = %p.interface, mac = %p.mac, "probing the local DHCP server: leading needs its answers")
        }
        None => {
            let why = {
                let mut on = cfg.clone();
                on.dhcp_probe.mode = crate::config::ProbeMode::On;
                dhcp_probe::plan(&on).err().unwrap_or_else(|| "[dhcp_probe] mode = \"off\"".into())
            };
            warn!(
                why,
                "the local DHCP server is not probed: this host may lead while its server answers nobody (a frozen or \
                 misconfigured server); docs/operations.md, \"Leadership confirmed by answers\""
            );
        }
    }
    cfg.dataplane.probe = probe.as_ref().map(|p| p.mac);
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
    let (dp, guard) = open_dataplane(&cfg)?;
    notify::notify(Notification::Ready);

    let (stop_tx, stop_rx) = watch::channel(false);
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let who = Identity {
        agent_id: cfg.agent.id.clone(),
        host,
        network: cfg.agent.network.clone(),
        coordination: if cfg.etcd.enabled() { "etcd" } else { "local" },
    };
    let resume = Arc::new(ResumePoint::default());
    let (stream_tx, stream) = mpsc::channel(4096);
    let (resync, resync_rx) = watch::channel(0u64);
    let watch = stream::watch_loop(
        cfg.controlplane.clone(),
        who.clone(),
        resume.clone(),
        stream_tx,
        resync_rx,
        stop_rx.clone(),
    );
    tokio::spawn(watch);
    // High availability: a session and a candidacy in the network's election (etcd), or the local backend.
    let (want_lead, want_lead_rx) = watch::channel(false);
    let (open, open_rx) = watch::channel(false);
    let (coord_tx, coord) = watch::channel(CoordState::default());
    let coord_stop = CancellationToken::new();
    let candidacy = Candidacy {
        agent_id: cfg.agent.id.clone(),
        host: who.host.clone(),
        network: cfg.agent.network.clone(),
        ttl: cfg.election.ttl(),
        margin: cfg.election.margin(),
        state_file: cfg.agent.state_file(),
    };
    let inputs = (want_lead_rx, open_rx);
    let coord_task = tokio::spawn(coordinate(cfg.etcd.clone(), candidacy, inputs, coord_tx, coord_stop.clone()));
    let (status, status_rx) = watch::channel(AgentStatus::default());
    let lease_wall = Arc::new(AtomicU64::new(0));
    let seen = seen_source(dp.clone(), probe.as_ref().map(|p| p.mac));
    // The etcd servers' versions: a server without the lease fixes the fence relies on is logged, counted and
    // reported (the control plane lists it in `ironguardctl agents`).
    let etcd_warnings = {
        let gauge = metrics.etcd_outdated.clone();
        ironguard_coord::versions::watch(&cfg.etcd, move |n| {
            gauge.set(n as i64);
        })
    };
    let report = stream::report_loop(
        cfg.controlplane.clone(),
        status_rx,
        lease_wall.clone(),
        Some(seen),
        metrics.clone(),
        etcd_warnings,
        stop_rx.clone(),
    );
    tokio::spawn(report);
    let (health, relink) = spawn_health(&cfg, probe.map(|p| (p, dp.clone())), stop_rx);

    let mut core =
        Core::new(CoreConfig::new(&cfg, who), metrics, Instant::now(), Box::new(|| rand::rng().random_range(0.8..1.2)));
    let floor_file = FilterFloor::path(&cfg);
    let kept = floor_file.as_deref().and_then(FilterFloor::load).unwrap_or_default();
    if kept != FilterFloor::default() {
        info!(
            floor = kept.floor,
            epoch = %kept.epoch,
            "the filter floor of this agent's previous run: an older state of that store is refused"
        );
        core.restore_floor(kept.floor, kept.epoch.clone());
    }
    let floor_saved = Mutex::new(kept);
    let stop = stop_tx;
    let shell = Shell {
        dp,
        resume,
        floor_file,
        floor_saved,
        resync,
        want_lead,
        open,
        status,
        lease_wall,
        ready,
        why,
        stop,
        coord_stop,
    };
    Ok((core, shell, Sources { stream, coord, health, guard, relink }, coord_task))
}

/// Reads what the kernel saw of recent boots for a report, leaving out the agent's own probe.
fn seen_source(dp: SharedDataplane, probe: Option<ironguard_dataplane::MacAddr>) -> crate::seen::SeenSource {
    Arc::new(move || {
        let read = dp.lock().unwrap_or_else(|e| e.into_inner()).dhcp_seen();
        crate::seen::report(read, probe, ironguard_proto::time::now_ms())
    })
}

/// The guard, claimed by this process where the kernel allows, then the agent's table, Blocked; the guard
/// monitor when there is an nftables guard to watch.
fn open_dataplane(cfg: &AgentConfig) -> anyhow::Result<(SharedDataplane, mpsc::Receiver<GuardEvent>)> {
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
    let dp: SharedDataplane = Arc::new(Mutex::new(dp));
    let _ = TABLE.set(dp.clone());
    install_panic_hook();
    let (guard_tx, guard_rx) = mpsc::channel::<GuardEvent>(16);
    // Without an nftables guard there are no notifications to watch: the sender is dropped and the arm idles.
    if let Some(port) = own_portid {
        spawn_guard_monitor(port, guard_tx);
    }
    Ok((dp, guard_rx))
}

/// The DHCP health check, woken at once by link and address changes (a downed provisioning link makes the
/// leader resign). After a link change the main loop also reads the reply side back: before Linux 6.16 the
/// kernel unbinds a netdev chain from a device that goes away and never binds it again.
fn spawn_health(
    cfg: &AgentConfig,
    probe: Option<(dhcp_probe::Plan, SharedDataplane)>,
    mut stop: watch::Receiver<bool>,
) -> (watch::Receiver<Health>, mpsc::Receiver<()>) {
    let (health_tx, health_rx) = watch::channel(Health { healthy: false, detail: "not checked yet".into() });
    let hcfg = cfg.dhcp_health.clone();
    // The provisioning links: the filtered interfaces and those whose DHCP replies are filtered at egress.
    let mut links = cfg.dataplane.interfaces.clone();
    links.extend(cfg.dataplane.egress_interfaces.iter().filter(|i| !cfg.dataplane.interfaces.contains(i)).cloned());
    let (link_tx, mut link_rx) = mpsc::channel::<()>(1);
    link::watch(link_tx);
    let (relink_tx, relink_rx) = mpsc::channel::<()>(1);
    let egress = !cfg.dataplane.egress_interfaces.is_empty();
    tokio::spawn(async move {
        let mut tick = main_tick(Duration::from_millis(hcfg.interval_ms));
        let mut probe_tick = main_tick(probe.as_ref().map_or(Duration::from_secs(3600), |(p, _)| p.interval));
        let mut prober = probe.map(|(plan, dp)| ProbeTask::new(plan, dp));
        let mut checks: Option<Health> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => match until_stop(health_with_links(&hcfg, &links), &mut stop).await {
                    Some(h) => checks = Some(h),
                    None => return,
                },
                Some(()) = link_rx.recv() => {
                    if egress {
                        let _ = relink_tx.try_send(());
                    }
                    match until_stop(health_with_links(&hcfg, &links), &mut stop).await {
                        Some(h) => checks = Some(h),
                        None => return,
                    }
                }
                _ = probe_tick.tick(), if prober.is_some() => {
                    if let Some(p) = prober.as_mut() {
                        p.round().await;
                    }
                }
                _ = stop.changed() => return,
            };
            let Some(c) = &checks else { continue };
            let h = match &prober {
                None => c.clone(),
                Some(p) => {
                    let v = p.tracker.verdict(Instant::now());
                    let answering = v == dhcp_probe::Verdict::Answering;
                    Health { healthy: c.healthy && answering, detail: format!("{}; {}", c.detail, p.plan.describe(&v)) }
                }
            };
            health_tx.send_if_modified(|old| std::mem::replace(old, h.clone()) != h);
        }
    });
    (health_rx, relink_rx)
}

/// Bounded: each check ends within its own bound (systemctl's), and shutdown ends it sooner (`None`).
async fn until_stop(
    check: impl std::future::Future<Output = Health>,
    stop: &mut watch::Receiver<bool>,
) -> Option<Health> {
    tokio::select! {
        h = check => Some(h),
        _ = stop.changed() => None,
    }
}

/// The probe of the local DHCP server: each round reads the table's counters, then sends one DISCOVER.
struct ProbeTask {
    plan: dhcp_probe::Plan,
    dp: SharedDataplane,
    tracker: dhcp_probe::Tracker,
    prober: Option<dhcp_probe::Prober>,
}

impl ProbeTask {
    fn new(plan: dhcp_probe::Plan, dp: SharedDataplane) -> Self {
        let tracker = dhcp_probe::Tracker::new(plan.silence);
        Self { plan, dp, tracker, prober: None }
    }

    async fn round(&mut self) {
        let dp = self.dp.clone();
        let counts = tokio::task::spawn_blocking(move || {
            let dp = dp.lock().unwrap_or_else(|e| e.into_inner());
            match dp.probe_counts() {
                Ok(Some(c)) => Ok(c),
                Ok(None) => Err("the table has no probe rules yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        self.tracker.observe(Instant::now(), counts);
        if self.prober.is_none() {
            match dhcp_probe::Prober::open(&self.plan) {
                Ok(p) => self.prober = Some(p),
                Err(e) => {
                    self.tracker.sent(
                        Instant::now(),
                        Err(format!("cannot open the probe socket on {}: {e}", self.plan.interface)),
                    );
                    return;
                }
            }
        }
        if let Some(p) = &self.prober {
            let sent = p.send().map_err(|e| e.to_string());
            if sent.is_err() {
                // a socket bound to a link that went away: open it again next round
                self.prober = None;
            }
            self.tracker.sent(Instant::now(), sent);
        }
    }
}

/// Connects to etcd (retrying with back-off while it is unreachable) or uses the local backend, then runs the
/// candidacy until `stop`.
async fn coordinate(
    etcd: ironguard_coord::EtcdConfig,
    who: Candidacy,
    (want_lead, open): (watch::Receiver<bool>, watch::Receiver<bool>),
    state: watch::Sender<CoordState>,
    stop: CancellationToken,
) {
    let coord: Arc<dyn ironguard_coord::Coordinator> = if etcd.enabled() {
        let mut attempt = 0;
        loop {
            // Bounded (dial and request timeouts), and shutdown does not wait for it.
            let connected = tokio::select! {
                r = ironguard_coord::etcd::EtcdCoordinator::connect(&etcd) => r,
                _ = stop.cancelled() => return,
            };
            match connected {
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
    coordination::run(coord, who, want_lead, open, state, stop).await;
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
async fn health_with_links(cfg: &crate::config::DhcpHealthSection, interfaces: &[String]) -> Health {
    let problems = link::check(interfaces);
    let h = dhcp_health::check(cfg).await;
    if problems.is_empty() {
        h
    } else {
        Health { healthy: false, detail: format!("{}; {}", problems.join("; "), h.detail) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::StreamMsg;

    struct Inputs {
        stream: mpsc::Sender<StreamMsg>,
        coord: watch::Sender<CoordState>,
        health: watch::Sender<Health>,
        _guard: mpsc::Sender<GuardEvent>,
        _relink: mpsc::Sender<()>,
    }

    fn sources() -> (Sources, Inputs) {
        let (stream_tx, stream) = mpsc::channel(4096);
        let (coord_tx, coord) = watch::channel(CoordState::default());
        let (health_tx, health) = watch::channel(Health { healthy: false, detail: String::new() });
        let (guard_tx, guard) = mpsc::channel(16);
        let (relink_tx, relink) = mpsc::channel(1);
        let src = Sources { stream, coord, health, guard, relink };
        (src, Inputs { stream: stream_tx, coord: coord_tx, health: health_tx, _guard: guard_tx, _relink: relink_tx })
    }

    fn lost(generation: u64) -> StreamMsg {
        StreamMsg::Lost { generation, error: "flood".into() }
    }

    /// Everything ready at once: the fence first, then a stop, then the tick, then the lease's rewrite, then the
    /// inputs (coordination, health, the stream as one batch).
    #[tokio::test]
    async fn the_fence_and_the_tick_come_before_everything_else() {
        let (mut src, inputs) = sources();
        for g in 0..100 {
            inputs.stream.try_send(lost(g)).expect("room");
        }
        inputs.coord.send_modify(|c| c.session = 1);
        inputs.health.send_modify(|h| h.healthy = true);
        // A tick that is due (its first, a second ago); the next one an hour later.
        let past = Instant::now() - Duration::from_secs(1);
        let mut tick = tokio::time::interval_at(past.into(), Duration::from_secs(3600));
        let due = || async {};
        let wake = next_event(&mut src, &mut tick, Some(past), Some(past), due()).await;
        assert!(matches!(wake, Wake::Event(Event::FenceDeadline)), "{wake:?}");
        let wake = next_event(&mut src, &mut tick, None, Some(past), due()).await;
        assert!(matches!(wake, Wake::Stop), "{wake:?}");
        let never = std::future::pending::<()>;
        let wake = next_event(&mut src, &mut tick, None, Some(past), never()).await;
        assert!(matches!(wake, Wake::Event(Event::Tick)), "{wake:?}");
        let wake = next_event(&mut src, &mut tick, None, Some(past), never()).await;
        assert!(matches!(wake, Wake::Event(Event::LeaseDue)), "{wake:?}");
        let wake = next_event(&mut src, &mut tick, None, None, never()).await;
        assert!(matches!(wake, Wake::Event(Event::Coord(_))), "{wake:?}");
        let wake = next_event(&mut src, &mut tick, None, None, never()).await;
        assert!(matches!(wake, Wake::Event(Event::Dhcp(_))), "{wake:?}");
        let wake = next_event(&mut src, &mut tick, None, None, never()).await;
        assert!(matches!(&wake, Wake::Event(Event::Stream(b)) if b.len() == 100), "one batch: {wake:?}");
        drop(inputs);
        let wake = next_event(&mut src, &mut tick, None, None, never()).await;
        assert!(matches!(wake, Wake::StreamGone), "{wake:?}");
    }

    /// A starved CPU: every step takes ten ticks. The tick missed meanwhile fires once, then the waiting input and
    /// a stop are served before the next; with tokio's default (a burst of catch-up ticks) the biased loop took
    /// tick after tick and never saw either (track record T21). Time is tokio's paused clock: no real waits.
    #[tokio::test(start_paused = true)]
    async fn a_step_longer_than_a_tick_does_not_starve_a_stop_or_the_inputs() {
        let (mut src, inputs) = sources();
        let period = Duration::from_millis(250);
        let mut tick = main_tick(period);
        let never = std::future::pending::<()>;
        let wake = next_event(&mut src, &mut tick, None, None, never()).await;
        assert!(matches!(wake, Wake::Event(Event::Tick)), "the first tick at once: {wake:?}");
        for round in 0..3 {
            // A step that takes ten periods, during which an input arrives.
            tokio::time::advance(period * 10).await;
            inputs.stream.try_send(lost(round)).expect("room");
            let wake = next_event(&mut src, &mut tick, None, None, never()).await;
            assert!(matches!(wake, Wake::Event(Event::Tick)), "round {round}: the missed tick, once: {wake:?}");
            let wake = next_event(&mut src, &mut tick, None, None, never()).await;
            assert!(matches!(&wake, Wake::Event(Event::Stream(b)) if b.len() == 1), "round {round}: {wake:?}");
        }
        tokio::time::advance(period * 10).await;
        let wake = next_event(&mut src, &mut tick, None, None, async {}).await;
        assert!(matches!(wake, Wake::Stop), "a stop before the missed tick: {wake:?}");
    }

    /// A flood: producers keep the stream channel full and the coordination state changing, as fast as they can.
    /// The main loop still gets its ticks, each while stream messages were waiting (the tick was taken first); the
    /// stream's messages are served, at the latest once the flood ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_stream_and_coordination_events_does_not_starve_the_tick() {
        let (mut src, inputs) = sources();
        let done = CancellationToken::new();
        let (stream, coord) = (inputs.stream.clone(), inputs.coord.clone());
        let flood = tokio::spawn({
            let done = done.clone();
            async move {
                let mut g = 0u64;
                while !done.is_cancelled() {
                    g += 1;
                    // Waits only while the channel is full: it stays full while the main loop is busy elsewhere.
                    tokio::select! {
                        r = stream.send(lost(g)) => if r.is_err() { return },
                        _ = done.cancelled() => return,
                    }
                    coord.send_modify(|c| c.session = g);
                }
            }
        });
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        let (mut ticks_while_flooded, mut batches) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(120);
        while ticks_while_flooded < 20 {
            assert!(
                Instant::now() < deadline,
                "only {ticks_while_flooded} ticks came through the flood ({batches} batches)"
            );
            let waiting = src.stream.len();
            match next_event(&mut src, &mut tick, None, None, std::future::pending()).await {
                Wake::Event(Event::Tick) if waiting > 0 => ticks_while_flooded += 1,
                Wake::Event(Event::Stream(_)) => {
                    batches += 1;
                    // A step of the core takes time; the flood refills the channel meanwhile.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Wake::Event(_) => {}
                other => panic!("{other:?}"),
            }
        }
        done.cancel();
        flood.await.expect("the flood stops");
        // Coordination changes come before the stream (biased, by design): while both flood, the stream may wait
        // for the flood to end (a loaded machine runs the flood's thread in bursts, and each burst changes the
        // coordination state again; T35). Its messages are served then, none lost.
        while batches == 0 {
            assert!(Instant::now() < deadline, "the stream's messages were never served");
            let wake = next_event(&mut src, &mut tick, None, None, std::future::pending()).await;
            if let Wake::Event(Event::Stream(_)) = wake {
                batches += 1;
            }
        }
    }
}
