//! Singleton periodic tasks: one instance across all control-plane replicas, run by the elected leader.
//!
//! Replicas campaign in the `controlplane` election with a lease (etcd) or win at once (embedded). The leader runs
//! every task on its own period; when leadership is lost (lease fence, resign, shutdown) every task is cancelled
//! and its waits end at once. Tasks must be idempotent: a new leader may run one again right after the old one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironguard_coord::{CoordError, Coordinator};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, info_span, warn};

use crate::store::Fence;

/// What a task run gets from the lead it runs under.
#[derive(Debug, Clone)]
pub struct Lead {
    /// Cancelled when leadership ends (every wait inside should select on it).
    pub stop: CancellationToken,
    /// For the run's filter writes ([`crate::store::FilterStore::apply_fenced`]): a replica paused past the end
    /// of its lead writes nothing.
    pub fence: Fence,
}

/// The body of a task.
pub type TaskFn = Arc<dyn Fn(Lead) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// A named periodic task.
#[derive(Clone)]
pub struct PeriodicTask {
    pub name: &'static str,
    pub period: Duration,
    pub run: TaskFn,
}

impl std::fmt::Debug for PeriodicTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeriodicTask").field("name", &self.name).field("period", &self.period).finish()
    }
}

/// Lease TTL of the control-plane election.
pub const LEADER_TTL: Duration = Duration::from_secs(5);
/// Tasks stop this long before the lease could expire without keep-alives.
pub const LEADER_MARGIN: Duration = Duration::from_secs(2);

/// Campaigns and runs `tasks` while leading, until `shutdown`. `leading` mirrors the state (for /metrics and tests).
pub async fn run(
    coord: Arc<dyn Coordinator>,
    replica: String,
    tasks: Vec<PeriodicTask>,
    leading: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut attempt = 0u32;
    while !shutdown.is_cancelled() {
        let session = match coord.session(LEADER_TTL).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "control-plane election: cannot open a session");
                let pause = ironguard_coord::backoff(attempt, Duration::from_secs(2));
                attempt = attempt.saturating_add(1);
                tokio::select! { _ = tokio::time::sleep(pause) => continue, _ = shutdown.cancelled() => return }
            }
        };
        attempt = 0;
        let leadership = match coord.campaign("controlplane", &replica, &session, shutdown.child_token()).await {
            Ok(l) => l,
            Err(CoordError::Cancelled) => return,
            Err(e) => {
                warn!(error = %e, "control-plane election failed");
                tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => continue, _ = shutdown.cancelled() => return }
            }
        };
        info!(replica, "leading the control plane: starting singleton tasks");
        leading.send_replace(true);
        let lost = shutdown.child_token();
        let mut handles = Vec::new();
        let fence = Fence::from(&leadership);
        for t in &tasks {
            handles.push(tokio::spawn(periodic(t.clone(), lost.clone(), fence.clone())));
        }
        // Lead until the fence (lease estimate - margin) or shutdown.
        let mut expiry = session.watch();
        loop {
            let deadline = expiry.borrow().deadline(LEADER_MARGIN);
            tokio::select! {
                _ = async { match deadline { Some(t) => tokio::time::sleep_until(t.into()).await, None => std::future::pending().await } } => {
                    if !session.expiry().valid_with_margin(LEADER_MARGIN, Instant::now()) {
                        warn!("control-plane leadership fence: stopping singleton tasks");
                        break;
                    }
                }
                r = expiry.changed() => if r.is_err() { break },
                _ = shutdown.cancelled() => break,
            }
        }
        lost.cancel();
        for h in handles {
            let _ = h.await;
        }
        leading.send_replace(false);
        let _ = coord.resign(&leadership).await;
        if shutdown.is_cancelled() {
            let _ = coord.revoke(&session).await;
            return;
        }
        info!("no longer leading the control plane");
    }
}

async fn periodic(task: PeriodicTask, stop: CancellationToken, fence: Fence) {
    let span = info_span!("singleton", task = task.name);
    async move {
        loop {
            let started = Instant::now();
            let r = tokio::select! {
                r = (task.run)(Lead { stop: stop.clone(), fence: fence.clone() }) => r,
                _ = stop.cancelled() => return,
            };
            if let Err(e) = r {
                warn!(error = format!("{e:#}"), "task failed; next run on schedule");
            }
            let pause = task.period.saturating_sub(started.elapsed());
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
    .instrument(span)
    .await
}
