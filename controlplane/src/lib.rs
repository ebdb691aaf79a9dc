//! `ironguard-controlplane` — the unprivileged service that owns the filter state and serves it to agents.
//!
//! - [`filter`]: per-MAC allow/deny reasons, revisions, and the pure rules that turn requests into deltas.
//! - [`store`]: the [`store::FilterStore`] interface and its embedded (redb) backend.
//! - [`service`]: the `PxeFilter` gRPC service (UpdatePxeFilters, WatchFilters, ReportStatus, …).
//! - [`agents`]: what each agent last reported, and who leads each network.
//! - [`singleton`]: periodic tasks run by the elected control-plane leader only.
//! - [`inspection`]: the inspection engine (work queue, workers, tasks, gRPC `Inspection`) around the pure domain of
//!   [`ironguard_inspection`] (state machine, lookup, processing hooks, rules); Ironic is reached through
//!   [`ironguard_ironic`].
//! - [`inspector_api`]: the ironic-inspector v1 REST API (for ironic-python-agent and the OpenStack CLI).
//! - [`http_access`]: who may call that API and how often (noauth / http_basic / keystone, rate limits).
//! - [`listener`]: the one accept loop of the gRPC and ironic-inspector APIs (plaintext or TLS, the same limits on
//!   connections and handshakes); [`tls`]: their certificates; [`authz`]: who may call what over gRPC.
//! - [`admin`] and [`metrics`]: `/metrics`, `/healthz`, `/readyz`; [`refusals`]: refused calls logged without
//!   flooding.
//! - [`explain`]: `ExplainMac`, why a MAC gets DHCP or not on each PXE host.
//! - [`config`]: TOML + environment + flags; [`cli`]: the flags (`main.rs` runs them, `ironguard-gen-docs` makes
//!   the man page from them).
//!
//! [`serve`] binds the listeners and [`Server::run`] serves until the shutdown future resolves; tests call them
//! with `127.0.0.1:0`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod agents;
pub mod authz;
pub mod cli;
pub mod config;
pub mod discovery;
pub mod explain;
pub mod filter;
pub mod http_access;
pub mod inspection;
pub mod inspector_api;
pub mod listener;
pub mod metrics;
pub mod refusals;
pub mod service;
pub mod singleton;
pub mod store;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use ironguard_coord::Coordinator;
use ironguard_inspection::processing::Pipeline;
use ironguard_ironic::Ironic;
use ironguard_proto::v1::inspection_server::InspectionServer;
use ironguard_proto::v1::pxe_filter_server::PxeFilterServer;
use tokio::net::TcpListener;
use tracing::{info, warn};

pub use config::ControlPlaneConfig;

use crate::agents::AgentRegistry;
#[cfg(feature = "test-hooks")]
use crate::inspection::engine::CrashPoint;
use crate::inspection::engine::Engine;
use crate::inspection::periodic::PolicySetting;
use crate::inspection::service::InspectionService;
use crate::metrics::Metrics;
use crate::service::PxeFilterService;
use crate::store::FilterStore;

/// A control plane with its listeners bound, ready to [`run`](Server::run).
pub struct Server {
    /// The inspection engine (its workers start with [`Server::run`]).
    pub engine: Arc<Engine>,
    /// The ironic-inspector v1 REST API's address, when enabled.
    pub inspector_addr: Option<SocketAddr>,
    inspector: Option<inspector_api::InspectorListener>,
    periodic: Vec<singleton::PeriodicTask>,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub store: Arc<dyn FilterStore>,
    /// True while this replica leads the control plane and runs the singleton tasks.
    pub leading: tokio::sync::watch::Receiver<bool>,
    coord: Arc<dyn Coordinator>,
    replica: String,
    leading_tx: tokio::sync::watch::Sender<bool>,
    grpc: TcpListener,
    grpc_tls: Option<tls::ServerTls>,
    authz: Arc<authz::Authz>,
    admin: TcpListener,
    service: PxeFilterService,
    metrics: Arc<Metrics>,
    store_gauges: Arc<metrics::StoreGauges>,
    ready: Arc<AtomicBool>,
    stop_tx: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("grpc_addr", &self.grpc_addr).field("admin_addr", &self.admin_addr).finish()
    }
}

/// Opens the store (embedded, or etcd when configured) and binds both listeners.
pub async fn serve(config: &ControlPlaneConfig) -> anyhow::Result<Server> {
    config.validate()?;
    let stale = Duration::from_secs(config.agents.stale_after_secs);
    let (stores, agents, coord): (store::Stores, AgentRegistry, Arc<dyn Coordinator>) = if config.etcd.enabled() {
        let c = ironguard_coord::etcd::EtcdCoordinator::connect(&config.etcd)
            .await
            .with_context(|| format!("connecting to etcd {:?}", config.etcd.endpoints))?;
        let stores = store::etcd::open(c.clone(), config.store.change_log_length)
            .await
            .context("opening the control plane's state in etcd")?;
        let coord: Arc<dyn Coordinator> = Arc::new(c);
        (stores, AgentRegistry::shared(coord.clone(), stale), coord)
    } else {
        let stores = store::embedded::open(&config.store.data_dir, config.store.change_log_length)
            .context("opening the embedded store")?;
        let coord = Arc::new(ironguard_coord::local::LocalCoordinator::new());
        (stores, AgentRegistry::local(stale), coord)
    };
    let store: Arc<dyn FilterStore> = stores.filters.clone();
    let inspections = stores.inspections.clone();
    // Publish the configured unknown-MAC policy (a new revision only if it differs from the stored one).
    // while-inspecting starts closed; the ironic-inspection task opens it while something is inspected.
    let initial_policy = match config.filter.unknown_mac_policy {
        PolicySetting::Allow => ironguard_dataplane::UnknownMacPolicy::Allow,
        PolicySetting::Deny | PolicySetting::WhileInspecting => ironguard_dataplane::UnknownMacPolicy::Deny,
    };
    store.apply(vec![], Some(initial_policy)).await.context("recording the unknown-MAC policy")?;
    let metrics = Arc::new(Metrics::new());
    let grpc_tls = if config.grpc.tls() { Some(tls::ServerTls::grpc(&config.grpc)?) } else { None };
    let authz = authz::Authz::new(&config.grpc)?;
    let grpc = TcpListener::bind(config.grpc_listen())
        .await
        .with_context(|| format!("binding the gRPC listener on {}", config.grpc_listen()))?;
    let admin = TcpListener::bind(config.server.admin_listen)
        .await
        .with_context(|| format!("binding the admin listener on {}", config.server.admin_listen))?;
    let agents = Arc::new(agents);
    let ironic = if config.ironic.url.is_empty() {
        None
    } else {
        let health = ironguard_ironic::IronicHealth {
            failed_attempts: metrics.ironic_failed_attempts.clone(),
            up: metrics.ironic_up.clone(),
            requests: metrics.ironic_requests.clone(),
            failovers: metrics.ironic_failovers.clone(),
        };
        Some(Arc::new(Ironic::new(config.ironic.clone()).context("configuring the Ironic client")?.with_health(health)))
    };
    // Discovery windows open unknown MACs' DHCP only where the unknown-MAC policy lets anything open it.
    let window_dhcp = match config.filter.unknown_mac_policy {
        PolicySetting::WhileInspecting | PolicySetting::Allow => Ok(()),
        PolicySetting::Deny => Err("[filter] unknown_mac_policy = \"deny\": unknown MACs get no DHCP, window or not \
                                    (windows still let the enroll hook enroll machines that boot otherwise); set it \
                                    to \"while-inspecting\" for windows to open DHCP"
            .to_string()),
    };
    let windows = discovery::Windows::new(coord.clone(), window_dhcp, config.discovery.enroll_per_minute);
    let engine = Arc::new(Engine {
        store: inspections,
        filters: store.clone(),
        agents: agents.clone(),
        ironic,
        coord: coord.clone(),
        cfg: config.inspection.clone(),
        pipeline: Pipeline::new(&config.processing).map_err(|e| anyhow::anyhow!("[processing]: {e}"))?,
        processing: config.processing.clone(),
        discovery: config.discovery.clone(),
        windows: windows.clone(),
        rules: stores.rules.clone(),
        callbacks: Default::default(),
        #[cfg(feature = "test-hooks")]
        crash: CrashPoint::from_env(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let authz = Arc::new(authz);
    let service = PxeFilterService {
        engine: engine.clone(),
        authz: authz.clone(),
        stopping: stop_rx,
        store: store.clone(),
        agents,
        metrics: metrics.clone(),
        heartbeat: Duration::from_secs(config.server.heartbeat_secs),
        windows,
        etcd_warnings: {
            let gauge = metrics.etcd_outdated.clone();
            ironguard_coord::versions::watch(&config.etcd, move |n| {
                gauge.set(n as i64);
            })
        },
    };
    let counts = store.counts();
    metrics.revision.set(counts.revision as i64);
    metrics.allowed.set(counts.allow as i64);
    metrics.denied.set(counts.deny as i64);
    let inspector = match config.server.inspector_listen {
        Some(a) => Some(inspector_api::InspectorListener::bind(a, &config.inspector_api).await?),
        None => None,
    };
    let inspector_addr = inspector.as_ref().map(|l| l.local_addr());
    let grpc_addr = grpc.local_addr()?;
    let replica = if config.server.replica_id.is_empty() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}:{}", host.trim(), grpc_addr.port())
    } else {
        config.server.replica_id.clone()
    };
    let (leading_tx, leading) = tokio::sync::watch::channel(false);
    // Discovery (the enroll hook) opens unknown MACs' DHCP only inside the windows operators open (`discovery`),
    // not for ever: `[sync] auto_discovery` is the explicit way to keep them open.
    let store_gauges = Arc::new(metrics::StoreGauges::new(engine.store.clone(), &metrics));
    let periodic = inspection::periodic::tasks(
        engine.clone(),
        config.sync.clone(),
        config.filter.unknown_mac_policy,
        metrics.ironic_sync_held.clone(),
    );
    Ok(Server {
        inspector,
        inspector_addr,
        engine,
        periodic,
        leading,
        coord,
        replica,
        leading_tx,
        grpc_addr,
        admin_addr: admin.local_addr()?,
        store,
        grpc,
        grpc_tls,
        authz,
        admin,
        service,
        metrics,
        store_gauges,
        ready: Arc::new(AtomicBool::new(false)),
        stop_tx,
    })
}

impl Server {
    /// Serves gRPC (with health and reflection) and the admin endpoint until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        // The server itself is not generic: compiled once in this crate, not again for each caller's kind of
        // shutdown future (a copy of the whole server per test made the integration tests' build the workspace's
        // longest).
        self.run_until(Box::pin(shutdown)).await
    }

    async fn run_until(self, shutdown: Pin<Box<dyn Future<Output = ()> + Send>>) -> anyhow::Result<()> {
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter.set_serving::<PxeFilterServer<PxeFilterService>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ironguard_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        let stop_tx = self.stop_tx;
        let stop_rx = stop_tx.subscribe();
        let admin_state = admin::AdminState {
            metrics: self.metrics.clone(),
            store_gauges: self.store_gauges.clone(),
            ready: self.ready.clone(),
        };
        let mut admin_stop = stop_rx.clone();
        let admin = axum::serve(self.admin, admin::router(admin_state)).with_graceful_shutdown(async move {
            let _ = admin_stop.wait_for(|v| *v).await;
        });
        let mut grpc_stop = stop_rx.clone();
        let grpc_incoming =
            listener::Incoming::new("grpc", self.grpc, self.grpc_tls.clone(), listener::Limits::default())?;
        let grpc = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(5)))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(PxeFilterServer::new(self.service))
            .add_service(InspectionServer::new(InspectionService {
                engine: self.engine.clone(),
                authz: self.authz.clone(),
                store_gauges: self.store_gauges.clone(),
            }))
            .serve_with_incoming_shutdown(grpc_incoming, async move {
                let _ = grpc_stop.wait_for(|v| *v).await;
            });
        match &self.grpc_tls {
            Some(t) => {
                info!(grpc = %self.grpc_addr, "gRPC over TLS; SIGHUP reloads its certificate, key and client CA");
                tokio::spawn(reload_on_sighup(t.clone()));
            }
            None => warn!(
                grpc = %self.grpc_addr,
                operator_calls_open = self.authz.operator_calls_open(),
                "gRPC IN PLAINTEXT ([grpc] insecure = true): anyone who reaches this port can pose as any agent{}",
                if self.authz.operator_calls_open() { " and change the filter, power nodes on and manage rules" } else { "" }
            ),
        }
        info!(grpc = %self.grpc_addr, admin = %self.admin_addr, coordination = self.coord.backend(), "control plane serving");
        self.ready.store(true, Ordering::Relaxed);
        let tasks_stop = tokio_util::sync::CancellationToken::new();
        if let Some(l) = self.inspector {
            let mut stop = stop_tx.subscribe();
            let engine = self.engine.clone();
            tokio::spawn(async move {
                let r = l
                    .serve(engine, async move {
                        let _ = stop.wait_for(|v| *v).await;
                    })
                    .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "ironic-inspector API failed");
                }
            });
        }
        let mut tasks = self.periodic.clone();
        if self.coord.backend() == "etcd" {
            tasks.push(agent_report_cleanup(self.coord.clone()));
        }
        tokio::spawn(singleton::run(
            self.coord.clone(),
            self.replica.clone(),
            tasks,
            self.leading_tx.clone(),
            tasks_stop.clone(),
        ));
        let workers = self.engine.spawn_workers(&self.replica, tasks_stop.clone());
        info!(workers = workers.len(), ironic = self.engine.ironic.is_some(), "inspection workers started");
        let mut tasks_stop_rx = stop_tx.subscribe();
        tokio::spawn(async move {
            let _ = tasks_stop_rx.wait_for(|v| *v).await;
            tasks_stop.cancel();
        });
        tokio::spawn(async move {
            shutdown.await;
            info!("shutting down");
            let _ = stop_tx.send(true);
        });
        let mut deadline_rx = stop_rx.clone();
        let serve = async {
            let (g, a) = tokio::join!(grpc, admin);
            g.context("gRPC server")?;
            a.context("admin server")
        };
        // Once asked to stop, give connections 5 s to finish, then stop regardless.
        let deadline = async move {
            let _ = deadline_rx.wait_for(|v| *v).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        tokio::select! {
            r = serve => r?,
            _ = deadline => tracing::warn!("connections still open 5 s after shutdown; stopping anyway"),
        }
        Ok(())
    }
}

/// Re-reads the gRPC certificate, key and client CA on every SIGHUP; a failed reload keeps the previous ones.
async fn reload_on_sighup(tls: tls::ServerTls) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        warn!("no SIGHUP handler: certificates are reloaded only on restart");
        return;
    };
    while hup.recv().await.is_some() {
        match tls.reload() {
            Ok(()) => info!("SIGHUP: gRPC certificate, key and client CA reloaded (open connections keep theirs)"),
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                "SIGHUP: reloading the gRPC certificates failed; the previous ones stay in use"
            ),
        }
    }
}

/// Deletes reports of agents silent for more than a day (etcd only: the embedded registry forgets on restart).
fn agent_report_cleanup(coord: Arc<dyn Coordinator>) -> singleton::PeriodicTask {
    singleton::PeriodicTask {
        name: "agent-report-cleanup",
        period: Duration::from_secs(600),
        run: Arc::new(move |_lead| {
            let coord = coord.clone();
            Box::pin(async move {
                let now = ironguard_proto::time::now_ms();
                for kv in coord.get_prefix("agents/status/").await? {
                    let at = kv.value.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).unwrap_or(0);
                    if now.saturating_sub(at) > 86_400_000 {
                        coord.delete(&kv.key).await?;
                        info!(key = %kv.key, "removed the report of an agent silent for a day");
                    }
                }
                Ok(())
            })
        }),
    }
}
