//! The agent's two conversations with the control plane: the `WatchFilters` stream (reconnected with back-off
//! to any configured endpoint, resuming from the last applied revision) and the periodic `ReportStatus`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{AgentStatus, FilterEvent, WatchFiltersRequest};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::config::ControlPlaneSection;
use crate::metrics::Metrics;

/// What the watch task tells the main loop. `generation` numbers connections, so events of a stream that was
/// replaced are recognised and ignored.
#[derive(Debug)]
pub enum StreamMsg {
    Connected { generation: u64, endpoint: String, since: u64 },
    Event { generation: u64, event: FilterEvent },
    Lost { generation: u64, error: String },
}

/// Who is watching.
#[derive(Debug, Clone)]
pub struct Identity {
    pub agent_id: String,
    pub host: String,
    pub network: String,
    /// "etcd", or "local" without etcd (the agent elects itself), as reported to the control plane.
    pub coordination: &'static str,
}

/// Opens a channel to `endpoint`: TCP, TLS and the HTTP/2 handshake, all within `connect_timeout_ms` (tonic's own
/// connect timeout covers the TCP connection only, so a replica that accepts and never completes TLS would hold
/// the caller for ever).
pub(crate) async fn connect(endpoint: &str, cfg: &ControlPlaneSection) -> Result<PxeFilterClient<Channel>, String> {
    let bound = Duration::from_millis(cfg.connect_timeout_ms);
    let ep = cfg
        .client_auth()
        .endpoint(endpoint)
        .map_err(|e| e.to_string())?
        .connect_timeout(bound)
        .http2_keep_alive_interval(Duration::from_secs(2))
        .keep_alive_timeout(Duration::from_secs(cfg.silence_timeout_secs.max(1)))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let channel = match tokio::time::timeout(bound, ep.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(format!("cannot connect to {endpoint}: {e}")),
        Err(_) => {
            return Err(format!(
                "cannot connect to {endpoint}: no connection (TCP, TLS, HTTP/2) within {} ms (connect_timeout_ms)",
                bound.as_millis()
            ));
        }
    };
    Ok(PxeFilterClient::new(channel).max_decoding_message_size(256 << 20))
}

/// Where the stream resumes from: the revision whose state is applied here (0: none trusted, a snapshot) and the
/// control plane store's epoch it belongs to. Set by the main loop after each step.
#[derive(Debug, Default)]
pub struct ResumePoint(std::sync::Mutex<(u64, String)>);

impl ResumePoint {
    pub fn set(&self, revision: u64, epoch: &str) {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if p.0 != revision || p.1 != epoch {
            *p = (revision, epoch.to_string());
        }
    }

    pub fn get(&self) -> (u64, String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Connects to `endpoint` and opens a `WatchFilters` stream from the revision applied now; the control plane's
/// answer must come within `request_timeout_ms`. Returns the stream and the revision it resumes from.
async fn open_watch(
    endpoint: &str,
    cfg: &ControlPlaneSection,
    who: &Identity,
    resume: &ResumePoint,
) -> Result<(tonic::Streaming<FilterEvent>, u64), String> {
    let mut client = connect(endpoint, cfg).await?;
    let (since, epoch) = resume.get();
    let req = WatchFiltersRequest {
        agent_id: who.agent_id.clone(),
        host: who.host.clone(),
        network: who.network.clone(),
        since_revision: since,
        epoch,
    };
    // Not `Request::set_timeout`: that would bound the whole stream, which is meant to stay open.
    let bound = Duration::from_millis(cfg.request_timeout_ms);
    match tokio::time::timeout(bound, client.watch_filters(req)).await {
        Ok(Ok(r)) => Ok((r.into_inner(), since)),
        Ok(Err(s)) => Err(format!("WatchFilters on {endpoint}: {}", s.message())),
        Err(_) => {
            Err(format!("WatchFilters on {endpoint}: no answer within {} ms (request_timeout_ms)", bound.as_millis()))
        }
    }
}

/// The loss reported when the stream is reopened on purpose, for a snapshot after a failed apply.
pub const RESYNC: &str = "resynchronising from a snapshot";

/// Keeps one WatchFilters stream open, forever (until `shutdown`). `resync` restarts the stream at once (used
/// after a failed apply, with the resume point reset so the server sends a snapshot).
pub async fn watch_loop(
    cfg: ControlPlaneSection,
    who: Identity,
    resume: Arc<ResumePoint>,
    tx: mpsc::Sender<StreamMsg>,
    mut resync: watch::Receiver<u64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut generation = 0u64;
    let mut attempt = 0u32;
    let mut idx = 0usize;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let endpoint = cfg.endpoints[idx % cfg.endpoints.len()].clone();
        idx += 1;
        generation += 1;
        let started = Instant::now();
        let result = async {
            // Connecting and the first answer have their bounds; a resync or shutdown meanwhile ends the attempt.
            let (mut stream, since) = tokio::select! {
                r = open_watch(&endpoint, &cfg, &who, &resume) => r?,
                _ = resync.changed() => return Err(RESYNC.to_string()),
                _ = shutdown.changed() => return Ok(()),
            };
            let _ = tx.send(StreamMsg::Connected { generation, endpoint: endpoint.clone(), since }).await;
            let silence = Duration::from_secs(cfg.silence_timeout_secs.max(1));
            loop {
                tokio::select! {
                    next = tokio::time::timeout(silence, stream.message()) => match next {
                        Ok(Ok(Some(event))) => {
                            if tx.send(StreamMsg::Event { generation, event }).await.is_err() {
                                return Ok(());
                            }
                        }
                        Ok(Ok(None)) => return Err(format!("{endpoint} ended the stream")),
                        Ok(Err(s)) => return Err(format!("stream from {endpoint} failed: {}", s.message())),
                        Err(_) => return Err(format!("stream from {endpoint} silent for {silence:?}")),
                    },
                    _ = resync.changed() => return Err(RESYNC.to_string()),
                    _ = shutdown.changed() => return Ok(()),
                }
            }
        }
        .await;
        let error = match result {
            Ok(()) => return,
            Err(e) => e,
        };
        let _ = tx.send(StreamMsg::Lost { generation, error: error.clone() }).await;
        if started.elapsed() > Duration::from_secs(5) {
            attempt = 0;
        }
        let pause = reconnect_pause(&error, attempt, Duration::from_millis(cfg.max_backoff_ms));
        attempt = attempt.saturating_add(1);
        debug!(error, ?pause, "watch stream lost; reconnecting");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// How long to wait before reopening the stream after the `attempt`-th loss in a row (losses more than 5 s apart
/// start again at 0). A resync after a failed apply reconnects at once the first time; one that follows another
/// within 5 s backs off like any loss, so a kernel error that persists (an egress interface missing on a kernel
/// before 6.16, say) is retried at `max` intervals instead of in a busy loop.
fn reconnect_pause(error: &str, attempt: u32, max: Duration) -> Duration {
    if error == RESYNC && attempt == 0 { Duration::ZERO } else { ironguard_coord::backoff(attempt, max) }
}

/// Unix milliseconds of an `Instant` (0 for `None` or one already past).
pub fn unix_ms_of(at: Option<std::time::Instant>) -> u64 {
    let Some(left) = at.and_then(|t| t.checked_duration_since(std::time::Instant::now())) else { return 0 };
    std::time::SystemTime::now()
        .checked_add(left)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Sends the latest status on every change and every `report_interval`, to the first endpoint that answers. Each
/// report carries the kernel lease's end as last written (`lease`), read when the report is sent. Every connection
/// and call has its bound (`connect_timeout_ms`, `request_timeout_ms`), and shutdown ends a report under way.
pub async fn report_loop(
    cfg: ControlPlaneSection,
    mut status: watch::Receiver<AgentStatus>,
    lease: Arc<std::sync::atomic::AtomicU64>,
    seen: Option<crate::seen::SeenSource>,
    metrics: Arc<Metrics>,
    etcd_warnings: Arc<std::sync::Mutex<Vec<String>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reporter = Reporter { cfg, client: None, idx: 0 };
    let mut tick = tokio::time::interval(Duration::from_millis(reporter.cfg.report_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = status.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let mut s = status.borrow_and_update().clone();
        if s.agent_id.is_empty() {
            continue; // the core has not said anything yet (the channel's first value): nothing to report
        }
        s.lease_until_unix_ms = lease.load(std::sync::atomic::Ordering::SeqCst);
        s.etcd_warnings = etcd_warnings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(source) = &seen {
            let r = read_seen(source.clone()).await;
            (s.dhcp_seen_observed, s.dhcp_seen, s.dhcp_seen_error, s.dhcp_seen_full) =
                (r.observed, r.entries, r.error, r.full);
        }
        let sent = tokio::select! {
            r = reporter.send(&s) => r,
            _ = shutdown.changed() => return,
        };
        match sent {
            Ok(current) => {
                metrics.lag.set(current.saturating_sub(s.applied_revision) as i64);
                if warned {
                    info!("status reports reach the control plane again");
                    warned = false;
                }
            }
            Err(e) => {
                if !warned {
                    warn!(error = %e, "cannot report status");
                    warned = true;
                }
            }
        }
    }
}

/// One read of what the kernel saw, on a blocking thread, within [`crate::seen::READ_BOUND`] (a dataplane busy
/// with a long apply delays it; the report then goes without it).
async fn read_seen(source: crate::seen::SeenSource) -> crate::seen::SeenReport {
    let bound = crate::seen::READ_BOUND;
    match tokio::time::timeout(bound, tokio::task::spawn_blocking(move || source())).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => crate::seen::SeenReport { error: format!("the read failed: {e}"), ..Default::default() },
        Err(_) => crate::seen::SeenReport {
            error: format!("the read took longer than {} ms; this report goes without it", bound.as_millis()),
            ..Default::default()
        },
    }
}

/// The report loop's connection: kept between reports, replaced by the next endpoint's after a failure.
struct Reporter {
    cfg: ControlPlaneSection,
    client: Option<PxeFilterClient<Channel>>,
    idx: usize,
}

impl Reporter {
    /// One report, tried on each endpoint at most once; the control plane's current revision, or the last error.
    async fn send(&mut self, s: &AgentStatus) -> Result<u64, String> {
        let n = self.cfg.endpoints.len();
        let bound = Duration::from_millis(self.cfg.request_timeout_ms);
        let mut last = String::from("no endpoint configured");
        for _ in 0..n {
            let endpoint = self.cfg.endpoints[self.idx % n].clone();
            let mut client = match self.client.take() {
                Some(c) => c,
                None => match connect(&endpoint, &self.cfg).await {
                    Ok(c) => c,
                    Err(e) => {
                        last = e;
                        self.idx += 1;
                        continue;
                    }
                },
            };
            let mut req = tonic::Request::new(s.clone());
            req.set_timeout(bound);
            match tokio::time::timeout(bound, client.report_status(req)).await {
                Ok(Ok(r)) => {
                    self.client = Some(client);
                    return Ok(r.into_inner().current_revision);
                }
                Ok(Err(e)) => last = format!("ReportStatus on {endpoint}: {}", e.message()),
                Err(_) => {
                    last = format!(
                        "ReportStatus on {endpoint}: no answer within {} ms (request_timeout_ms)",
                        bound.as_millis()
                    )
                }
            }
            self.idx += 1;
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_WAIT_MS;

    #[test]
    fn a_resync_that_repeats_backs_off_like_any_loss() {
        let max = Duration::from_secs(2);
        assert_eq!(reconnect_pause(RESYNC, 0, max), Duration::ZERO);
        // The 10th resync in a row (each within 5 s of the last): at least 0.75 x max, not a busy loop.
        assert!(reconnect_pause(RESYNC, 10, max) >= max.mul_f64(0.75));
        assert!(reconnect_pause(RESYNC, 1, max) >= Duration::from_millis(150));
        assert!(reconnect_pause("stream from x failed: y", 0, max) >= Duration::from_millis(75));
    }

    /// A replica that accepts connections and never answers, nor reads: its URL, and a channel that says each accept.
    async fn wedged_replica() -> (String, mpsc::UnboundedReceiver<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (accepted, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = vec![];
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
                let _ = accepted.send(());
            }
        });
        (url, rx)
    }

    fn section(endpoints: Vec<String>, bound_ms: u64) -> ControlPlaneSection {
        ControlPlaneSection {
            endpoints,
            connect_timeout_ms: bound_ms,
            request_timeout_ms: bound_ms,
            max_backoff_ms: 100,
            insecure: true,
            ..Default::default()
        }
    }

    fn who() -> Identity {
        Identity { agent_id: "a".into(), host: "h".into(), network: "n".into(), coordination: "local" }
    }

    /// A deadline for something stuck, not a figure.
    const STUCK: Duration = Duration::from_secs(60);

    struct Watching {
        msgs: mpsc::Receiver<StreamMsg>,
        resync: watch::Sender<u64>,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    fn start_watch(cfg: ControlPlaneSection) -> Watching {
        let (tx, msgs) = mpsc::channel(16);
        let (resync, resync_rx) = watch::channel(0);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(watch_loop(cfg, who(), Arc::new(ResumePoint::default()), tx, resync_rx, stop_rx));
        Watching { msgs, resync, stop, task }
    }

    async fn next_loss(msgs: &mut mpsc::Receiver<StreamMsg>) -> String {
        match tokio::time::timeout(STUCK, msgs.recv()).await {
            Ok(Some(StreamMsg::Lost { error, .. })) => error,
            other => panic!("expected a lost stream, got {other:?}"),
        }
    }

    /// Two replicas that accept and never answer: the watch gives up the first within its bound (saying which
    /// bound), tries the second, gives it up too, and comes back to the first.
    #[tokio::test]
    async fn a_replica_that_never_answers_is_given_up_for_the_next() {
        let (a, mut a_accepts) = wedged_replica().await;
        let (b, mut b_accepts) = wedged_replica().await;
        let mut w = start_watch(section(vec![a.clone(), b.clone()], 200));
        let first = next_loss(&mut w.msgs).await;
        assert!(first.contains(&a) && first.contains("within") && first.contains("_timeout_ms"), "{first}");
        assert!(a_accepts.try_recv().is_ok(), "the first replica was reached");
        let second = next_loss(&mut w.msgs).await;
        assert!(second.contains(&b) && second.contains("within"), "{second}");
        assert!(b_accepts.try_recv().is_ok(), "the second replica was reached");
        let third = next_loss(&mut w.msgs).await;
        assert!(third.contains(&a), "round robin: {third}");
        w.stop.send_replace(true);
        tokio::time::timeout(STUCK, w.task).await.expect("the watch stops on shutdown").expect("no panic");
    }

    /// While an answer is awaited (bounds far away), a resync ends the attempt at once, and so does shutdown.
    #[tokio::test]
    async fn resync_and_shutdown_end_an_attempt_still_waiting_for_its_answer() {
        let (a, mut accepts) = wedged_replica().await;
        let mut w = start_watch(section(vec![a.clone()], MAX_WAIT_MS));
        tokio::time::timeout(STUCK, accepts.recv()).await.expect("connected").expect("listener");
        w.resync.send_modify(|g| *g += 1);
        assert_eq!(next_loss(&mut w.msgs).await, RESYNC);
        // The first resync reconnects at once: to the same (only) replica, where it waits again.
        tokio::time::timeout(STUCK, accepts.recv()).await.expect("reconnected").expect("listener");
        w.stop.send_replace(true);
        tokio::time::timeout(STUCK, w.task).await.expect("the watch stops on shutdown").expect("no panic");
        assert!(w.msgs.try_recv().is_err(), "nothing after shutdown");
    }

    /// A status report to replicas that never answer fails on each in turn, within its bounds.
    #[tokio::test]
    async fn a_report_tries_every_replica_and_gives_up_on_silent_ones() {
        let (a, mut a_accepts) = wedged_replica().await;
        let (b, mut b_accepts) = wedged_replica().await;
        let mut r = Reporter { cfg: section(vec![a, b.clone()], 200), client: None, idx: 0 };
        let e = tokio::time::timeout(STUCK, r.send(&AgentStatus::default())).await.expect("bounded").unwrap_err();
        // Bounded by tonic's own deadline (the grpc-timeout it is given) or, as a second line, by the agent's.
        assert!(e.contains(&b) && (e.contains("within") || e.contains("Timeout expired")), "{e}");
        assert!(a_accepts.try_recv().is_ok() && b_accepts.try_recv().is_ok(), "both replicas were tried");
        assert!(r.client.is_none());
    }

    /// Shutdown ends a report that is still waiting for its answer.
    #[tokio::test]
    async fn shutdown_ends_a_report_waiting_for_its_answer() {
        let (a, mut accepts) = wedged_replica().await;
        let (status, status_rx) = watch::channel(AgentStatus { agent_id: "a".into(), ..Default::default() });
        let (stop, stop_rx) = watch::channel(false);
        let lease = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn(report_loop(
            section(vec![a], MAX_WAIT_MS),
            status_rx,
            lease,
            None,
            Arc::new(Metrics::new()),
            Arc::default(),
            stop_rx,
        ));
        tokio::time::timeout(STUCK, accepts.recv()).await.expect("connected").expect("listener");
        stop.send_replace(true);
        tokio::time::timeout(STUCK, task).await.expect("the report loop stops on shutdown").expect("no panic");
        drop(status);
    }
}
