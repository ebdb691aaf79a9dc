//! The agent's side of high availability: a session (lease) kept alive in etcd, membership in its network's
//! party, and a candidacy in the network's election — campaigning only while the main loop says it may lead.
//!
//! The main loop owns the safety decision: it opens (Leader) only while this task reports `elected` *and* the
//! session's expiry estimate is more than the margin away (the lease fence). This task only campaigns and
//! resigns, and always after the main loop has closed.

use std::sync::Arc;
use std::time::Duration;

use ironguard_coord::{CoordError, Coordinator, Expiry, Leadership, Session};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What the coordination task tells the main loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordState {
    /// Lease expiry estimate of the current session (`Expired` while there is none).
    pub expiry: Expiry,
    /// Session generation: changes when a new session (lease) replaces the old one.
    pub session: u64,
    /// True once this agent won the election in the current session.
    pub elected: bool,
    /// The last coordination error, in words.
    pub error: Option<String>,
}

impl Default for CoordState {
    fn default() -> Self {
        Self { expiry: Expiry::Expired, session: 0, elected: false, error: Some("not connected yet".into()) }
    }
}

/// Identity and timing of the candidacy.
#[derive(Debug, Clone)]
pub struct Candidacy {
    pub agent_id: String,
    pub host: String,
    pub network: String,
    pub ttl: Duration,
}

fn election(network: &str) -> String {
    format!("agents/{network}")
}

/// Runs until `shutdown`: then resigns, revokes the lease (etcd), and returns. `want_lead` is set by the main loop.
pub async fn run(
    coord: Arc<dyn Coordinator>,
    who: Candidacy,
    mut want_lead: watch::Receiver<bool>,
    state: watch::Sender<CoordState>,
    shutdown: CancellationToken,
) {
    let mut generation = 0u64;
    let mut attempt = 0u32;
    while !shutdown.is_cancelled() {
        let session = tokio::select! {
            s = coord.session(who.ttl) => s,
            _ = shutdown.cancelled() => break,
        };
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                state.send_modify(|s| {
                    s.expiry = Expiry::Expired;
                    s.elected = false;
                    s.error = Some(format!("cannot open a session: {e}"));
                });
                let pause = ironguard_coord::backoff(attempt, Duration::from_secs(2));
                attempt = attempt.saturating_add(1);
                tokio::select! { _ = tokio::time::sleep(pause) => continue, _ = shutdown.cancelled() => break }
            }
        };
        attempt = 0;
        generation += 1;
        let member = format!("members/{}/{}", who.network, who.agent_id);
        let _ = coord.put(&member, format!("{{\"host\":{:?}}}", who.host).into_bytes(), Some(&session)).await;
        info!(lease = format!("{:x}", session.lease), backend = coord.backend(), "joined the party");
        state.send_modify(|s| {
            s.expiry = session.expiry();
            s.session = generation;
            s.elected = false;
            s.error = None;
        });
        let ended = serve_session(&*coord, &who, &session, generation, &mut want_lead, &state, &shutdown).await;
        state.send_modify(|s| {
            s.elected = false;
            s.expiry = Expiry::Expired;
        });
        if shutdown.is_cancelled() {
            // Resigned already (serve_session); revoke so that a successor need not wait for the TTL.
            if let Err(e) = coord.revoke(&session).await {
                warn!(error = %e, "could not revoke the lease; it expires within its TTL");
            }
            break;
        }
        warn!(reason = %ended, "session ended; opening a new one");
        tokio::select! { _ = tokio::time::sleep(Duration::from_millis(200)) => {}, _ = shutdown.cancelled() => break }
    }
}

/// Campaigns and resigns as `want_lead` says, while the session lives. Returns why it ended.
async fn serve_session(
    coord: &dyn Coordinator,
    who: &Candidacy,
    session: &Session,
    generation: u64,
    want_lead: &mut watch::Receiver<bool>,
    state: &watch::Sender<CoordState>,
    shutdown: &CancellationToken,
) -> String {
    let mut expiry = session.watch();
    let election = election(&who.network);
    loop {
        // Forward expiry changes; stop when the session is gone.
        if *expiry.borrow() == Expiry::Expired {
            return "lease expired".into();
        }
        if !*want_lead.borrow() {
            tokio::select! {
                _ = want_lead.changed() => continue,
                r = expiry.changed() => {
                    if r.is_err() { return "session closed".into(); }
                    let e = *expiry.borrow();
                    state.send_modify(|s| if s.session == generation { s.expiry = e });
                    continue;
                }
                _ = shutdown.cancelled() => return "shutdown".into(),
            }
        }
        // Campaign until elected, or until we may no longer lead.
        let cancel = CancellationToken::new();
        let campaign = coord.campaign(&election, &who.agent_id, session, cancel.clone());
        tokio::pin!(campaign);
        let result = loop {
            tokio::select! {
                r = &mut campaign => break Some(r),
                _ = want_lead.changed() => if !*want_lead.borrow() { cancel.cancel(); },
                r = expiry.changed() => {
                    if r.is_err() { cancel.cancel(); }
                    let e = *expiry.borrow();
                    state.send_modify(|s| if s.session == generation { s.expiry = e });
                    if e == Expiry::Expired { cancel.cancel(); }
                }
                _ = shutdown.cancelled() => cancel.cancel(),
            }
        };
        let leadership: Leadership = match result {
            Some(Ok(l)) => l,
            Some(Err(CoordError::Cancelled)) | None => continue,
            Some(Err(e)) => {
                state.send_modify(|s| s.error = Some(format!("campaign failed: {e}")));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = shutdown.cancelled() => return "shutdown".into(),
                }
            }
        };
        info!(election, "elected");
        state.send_modify(|s| {
            if s.session == generation {
                s.elected = true;
                s.error = None;
            }
        });
        // Lead until the main loop says stop (it has closed first) or the session ends.
        let why = loop {
            tokio::select! {
                _ = want_lead.changed() => if !*want_lead.borrow() { break "stepping down"; },
                r = expiry.changed() => {
                    let e = if r.is_err() { Expiry::Expired } else { *expiry.borrow() };
                    state.send_modify(|s| if s.session == generation { s.expiry = e });
                    if e == Expiry::Expired { break "lease expired"; }
                }
                _ = shutdown.cancelled() => break "shutdown",
            }
        };
        state.send_modify(|s| s.elected = false);
        match coord.resign(&leadership).await {
            Ok(()) => info!(why, "resigned"),
            Err(e) => warn!(why, error = %e, "could not resign; the candidacy ends with the lease"),
        }
        if why != "stepping down" {
            return why.into();
        }
    }
}
