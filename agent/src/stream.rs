//! The agent's two conversations with the control plane: the `WatchFilters` stream (reconnected with back-off
//! to any configured endpoint, resuming from the last applied revision) and the periodic `ReportStatus`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
}

pub(crate) async fn connect(endpoint: &str, cfg: &ControlPlaneSection) -> Result<PxeFilterClient<Channel>, String> {
    let ep = cfg
        .client_auth()
        .endpoint(endpoint)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
        .http2_keep_alive_interval(Duration::from_secs(2))
        .keep_alive_timeout(Duration::from_secs(cfg.silence_timeout_secs.max(1)))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let channel = ep.connect().await.map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    Ok(PxeFilterClient::new(channel).max_decoding_message_size(256 << 20))
}

/// The loss reported when the stream is reopened on purpose, for a snapshot after a failed apply.
pub const RESYNC: &str = "resynchronising from a snapshot";

/// Keeps one WatchFilters stream open, forever (until `shutdown`). `resync` restarts the stream at once (used
/// after a failed apply, with `applied` reset so the server sends a snapshot).
pub async fn watch_loop(
    cfg: ControlPlaneSection,
    who: Identity,
    applied: Arc<AtomicU64>,
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
            let mut client = connect(&endpoint, &cfg).await?;
            let since = applied.load(Ordering::SeqCst);
            let req = WatchFiltersRequest {
                agent_id: who.agent_id.clone(),
                host: who.host.clone(),
                network: who.network.clone(),
                since_revision: since,
            };
            let mut stream = client
                .watch_filters(req)
                .await
                .map_err(|s| format!("WatchFilters on {endpoint}: {}", s.message()))?
                .into_inner();
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
/// report carries the kernel lease's end as last written (`lease`), read when the report is sent.
pub async fn report_loop(
    cfg: ControlPlaneSection,
    mut status: watch::Receiver<AgentStatus>,
    lease: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client: Option<PxeFilterClient<Channel>> = None;
    let mut idx = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.report_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = status.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let mut s = status.borrow_and_update().clone();
        s.lease_until_unix_ms = lease.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..cfg.endpoints.len() {
            if client.is_none() {
                let ep = &cfg.endpoints[idx % cfg.endpoints.len()];
                match connect(ep, &cfg).await {
                    Ok(c) => client = Some(c),
                    Err(_) => {
                        idx += 1;
                        continue;
                    }
                }
            }
            let Some(c) = client.as_mut() else { continue };
            let mut req = tonic::Request::new(s.clone());
            req.set_timeout(Duration::from_millis(cfg.connect_timeout_ms));
            match c.report_status(req).await {
                Ok(r) => {
                    let current = r.into_inner().current_revision;
                    metrics.lag.set(current.saturating_sub(s.applied_revision) as i64);
                    if warned {
                        info!("status reports reach the control plane again");
                        warned = false;
                    }
                    break;
                }
                Err(e) => {
                    if !warned {
                        warn!(error = %e.message(), "cannot report status");
                        warned = true;
                    }
                    client = None;
                    idx += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_that_repeats_backs_off_like_any_loss() {
        let max = Duration::from_secs(2);
        assert_eq!(reconnect_pause(RESYNC, 0, max), Duration::ZERO);
        // The 10th resync in a row (each within 5 s of the last): at least 0.75 x max, not a busy loop.
        assert!(reconnect_pause(RESYNC, 10, max) >= max.mul_f64(0.75));
        assert!(reconnect_pause(RESYNC, 1, max) >= Duration::from_millis(150));
        assert!(reconnect_pause("stream from x failed: y", 0, max) >= Duration::from_millis(75));
    }
}
