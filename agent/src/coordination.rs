//! The agent's side of high availability: a session (lease) kept alive in etcd, membership in its network's
//! party, and a candidacy in the network's election — campaigning only while the main loop says it may lead.
//!
//! The main loop owns the safety decision: it opens (Leader) only while this task reports `elected` *and* the
//! session's expiry estimate is more than the margin away (the lease fence). This task only campaigns and
//! resigns, and always after the main loop has closed.
//!
//! It also watches for store amnesia (a replaced or rolled-back etcd, see [`ironguard_coord::amnesia`]): on every
//! new session, and after every keep-alive while leading (with a check that its own candidacy key is still
//! there), it looks at the store and reports a forgetting store to the main loop, which closes and waits one TTL
//! before it may open again. What it saw of the store and its current lease id are kept in a small state file,
//! so that a restarted agent still notices amnesia, and revokes the lease of its previous run at once (the
//! successor need not wait for that lease to expire).

use std::sync::Arc;
use std::time::Duration;

use std::path::PathBuf;
use std::time::Instant;

use ironguard_coord::{CoordError, Coordinator, Expiry, Leadership, Session, StoreMemory};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

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
    /// When this agent last saw the store forget (and what), on its monotonic clock.
    pub amnesia: Option<(Instant, String)>,
}

impl Default for CoordState {
    fn default() -> Self {
        Self {
            expiry: Expiry::Expired,
            session: 0,
            elected: false,
            error: Some("not connected yet".into()),
            amnesia: None,
        }
    }
}

/// What survives an agent restart: the lease of the running session and what was seen of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedState {
    /// The lease of the session in use (0: none).
    pub lease: i64,
    pub store: StoreMemory,
}

impl PersistedState {
    pub fn load(path: &std::path::Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// Written to a temporary file and renamed, so a crash never leaves half a file.
    pub fn save(&self, path: &std::path::Path) {
        let tmp = path.with_extension("tmp");
        let write = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = write {
            warn!(path = %path.display(), error = %e, "cannot save the agent's state file");
        }
    }
}

/// Identity and timing of the candidacy.
#[derive(Debug, Clone)]
pub struct Candidacy {
    pub agent_id: String,
    pub host: String,
    pub network: String,
    pub ttl: Duration,
    /// The lease fence's margin: the kernel lease ends this long before the session's expiry estimate.
    pub margin: Duration,
    /// Where the state survives restarts (`None`: it does not).
    pub state_file: Option<PathBuf>,
}

fn election(network: &str) -> String {
    format!("agents/{network}")
}

/// Runs until `shutdown`: then resigns, revokes the lease (etcd), and returns. `want_lead` is set by the main loop.
pub async fn run(
    coord: Arc<dyn Coordinator>,
    who: Candidacy,
    mut want_lead: watch::Receiver<bool>,
    mut open: watch::Receiver<bool>,
    state: watch::Sender<CoordState>,
    shutdown: CancellationToken,
) {
    let mut generation = 0u64;
    let mut attempt = 0u32;
    let mut persisted = who.state_file.as_deref().and_then(PersistedState::load).unwrap_or_default();
    coord.restore_store_memory(persisted.store.clone());
    if persisted.lease != 0 {
        // The previous run of this agent died with a live lease (a crash, SIGKILL, OOM), and its table with it:
        // record its hand-over closed and end the lease now, so that the next leader need not wait out its fence
        // or its TTL. Its keys vanish with it.
        let name = election(&who.network);
        let closed = tokio::select! {
            r = coord.close_previous(&name, persisted.lease) => r,
            _ = shutdown.cancelled() => return,
        };
        match closed {
            Ok(()) => info!(lease = format!("{:x}", persisted.lease), "revoked the lease of this agent's previous run"),
            Err(e) => {
                warn!(lease = format!("{:x}", persisted.lease), error = %e, "could not revoke the previous run's lease; it expires within its TTL")
            }
        }
        persisted.lease = 0;
        save(&who, &persisted, &*coord);
    }
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
        persisted.lease = session.lease;
        // Look at the store before this session may campaign: a store that cannot be looked at is not assumed
        // to be the one this agent knew (fail closed: the session is dropped and a new one tried).
        let looked = tokio::select! {
            ok = look_until_answered(&*coord, &state, &session) => ok,
            _ = shutdown.cancelled() => break,
        };
        save(&who, &persisted, &*coord);
        if !looked {
            warn!("could not look at the store while the session lived; opening a new one");
            continue;
        }
        let member = format!("members/{}/{}", who.network, who.agent_id);
        let joined = coord.put(&member, format!("{{\"host\":{:?}}}", who.host).into_bytes(), Some(&session));
        tokio::select! {
            r = joined => if let Err(e) = r { debug!(error = %e, "could not write this agent's membership"); },
            _ = shutdown.cancelled() => break,
        }
        info!(lease = format!("{:x}", session.lease), backend = coord.backend(), "joined the party");
        state.send_modify(|s| {
            s.expiry = session.expiry();
            s.session = generation;
            s.elected = false;
            s.error = None;
        });
        let ended =
            serve_session(&*coord, &who, &session, generation, &mut want_lead, &mut open, &state, &shutdown).await;
        state.send_modify(|s| {
            s.elected = false;
            s.expiry = Expiry::Expired;
        });
        if shutdown.is_cancelled() {
            // Resigned already (serve_session); revoke so that a successor need not wait for the TTL.
            match coord.revoke(&session).await {
                Ok(()) => {
                    persisted.lease = 0;
                    save(&who, &persisted, &*coord);
                }
                Err(e) => warn!(error = %e, "could not revoke the lease; it expires within its TTL"),
            }
            break;
        }
        // An abandoned session's keys would stay first in the election queue for as long as etcd keeps its lease
        // (it extends every lease when a new etcd leader takes over): end it before opening the next one. While
        // etcd elects a leader the revoke fails, so it is tried again in the background until etcd answers.
        let revoked = tokio::select! {
            r = coord.revoke(&session) => r,
            _ = shutdown.cancelled() => break,
        };
        if let Err(e) = revoked {
            let (coord, lease) = (coord.clone(), session.lease);
            debug!(error = %e, lease = format!("{lease:x}"), "could not revoke the ended session's lease yet; retrying");
            tokio::spawn(async move {
                let revoke = || coord.revoke_lease(lease);
                match revoke_until_done(revoke, REVOKE_RETRY_FOR, REVOKE_RETRY_PAUSE).await {
                    Ok(tries) => info!(lease = format!("{lease:x}"), tries, "revoked the ended session's lease"),
                    Err((tries, e)) => warn!(
                        lease = format!("{lease:x}"),
                        tries,
                        error = %e,
                        "could not revoke the ended session's lease; its candidacy key goes when etcd expires it"
                    ),
                }
            });
        }
        warn!(reason = %ended, "session ended; opening a new one");
        tokio::select! { _ = tokio::time::sleep(Duration::from_millis(200)) => {}, _ = shutdown.cancelled() => break }
    }
}

/// How long the lease of an ended session is revoked again in the background after the first try failed, and how
/// far apart the tries are.
const REVOKE_RETRY_FOR: Duration = Duration::from_secs(30);
const REVOKE_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Calls `revoke` until it succeeds (`Ok(tries)`) or `bound` has passed since the first try (`Err((tries, last
/// error))`), `pause` apart.
async fn revoke_until_done<F, Fut>(mut revoke: F, bound: Duration, pause: Duration) -> Result<u32, (u32, CoordError)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), CoordError>>,
{
    let start = tokio::time::Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        match revoke().await {
            Ok(()) => return Ok(tries),
            Err(e) if start.elapsed() + pause > bound => return Err((tries, e)),
            Err(_) => tokio::time::sleep(pause).await,
        }
    }
}

fn save(who: &Candidacy, persisted: &PersistedState, coord: &dyn Coordinator) {
    if let Some(path) = &who.state_file {
        let p = PersistedState { lease: persisted.lease, store: coord.store_memory() };
        p.save(path);
    }
}

/// Looks at the store until it answers (while the session lives); `false` if the session ended first.
async fn look_until_answered(coord: &dyn Coordinator, state: &watch::Sender<CoordState>, session: &Session) -> bool {
    let mut attempt = 0;
    loop {
        match coord.check_store().await {
            Ok(Some(a)) => {
                report_amnesia(state, &a.to_string());
                return true;
            }
            Ok(None) => return true,
            Err(e) => {
                debug!(error = %e, attempt, "could not look at the store yet");
                if session.expiry() == Expiry::Expired {
                    return false;
                }
                attempt += 1;
                tokio::time::sleep(ironguard_coord::backoff(attempt, Duration::from_millis(500))).await;
            }
        }
    }
}

fn report_amnesia(state: &watch::Sender<CoordState>, what: &str) {
    error!(
        detail = what,
        "the coordination store forgot what it held (replaced or restored): closing, and waiting one TTL before this agent may open again"
    );
    state.send_modify(|s| s.amnesia = Some((Instant::now(), what.to_string())));
}

/// Looks at the store; a forgetting store is reported to the main loop (which closes and waits). Returns whether
/// it forgot.
async fn look_at_store(coord: &dyn Coordinator, state: &watch::Sender<CoordState>) -> bool {
    match coord.check_store().await {
        Ok(Some(a)) => {
            report_amnesia(state, &a.to_string());
            true
        }
        Ok(None) => false,
        Err(e) => {
            debug!(error = %e, "could not look at the store; will look again");
            false
        }
    }
}

/// Why a call to the store was given up before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupted {
    Shutdown,
    /// The main loop says this agent may no longer lead.
    SteppingDown,
}

/// Runs `call` unless shutdown comes first, or the main loop says this agent may no longer lead: a call to a
/// store that does not answer (a wedged etcd) must not keep the candidacy from stepping down nor the agent from
/// stopping. Each call has its own bound too (the request timeout and retries); this ends it sooner.
async fn unless_interrupted<T>(
    call: impl std::future::Future<Output = T>,
    want_lead: &mut watch::Receiver<bool>,
    shutdown: &CancellationToken,
) -> Result<T, Interrupted> {
    tokio::pin!(call);
    loop {
        tokio::select! {
            r = &mut call => return Ok(r),
            _ = shutdown.cancelled() => return Err(Interrupted::Shutdown),
            r = want_lead.changed() => if r.is_err() || !*want_lead.borrow() { return Err(Interrupted::SteppingDown) },
        }
    }
}

/// Campaigns and resigns as `want_lead` says, while the session lives. Returns why it ended.
///
/// Leading follows the hand-over protocol (docs/architecture.md, "Never two servers"): the election is won only
/// when the predecessor is certainly closed ([`Coordinator::campaign`]); before the main loop may open, and after
/// every keep-alive before the main loop may move its kernel lease, the leadership is confirmed against the store
/// (the key's create revision is the fencing token); the key is watched, so a revoked lease or a deleted key
/// closes the leader at once; and once the main loop has closed, the hand-over record says so.
#[allow(clippy::too_many_arguments)]
async fn serve_session(
    coord: &dyn Coordinator,
    who: &Candidacy,
    session: &Session,
    generation: u64,
    want_lead: &mut watch::Receiver<bool>,
    open: &mut watch::Receiver<bool>,
    state: &watch::Sender<CoordState>,
    shutdown: &CancellationToken,
) -> String {
    let mut expiry = session.watch();
    let election = election(&who.network);
    // How long after a confirmation the kernel lease can still run: up to TTL − margin after the keep-alive that
    // preceded it.
    let fence = session.ttl.saturating_sub(who.margin);
    loop {
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
        // The first confirmation: the store must say this candidacy leads, and the hand-over record must say
        // that this holder may be open, before the main loop opens.
        let sent_for = *expiry.borrow();
        let confirmed = match unless_interrupted(coord.confirm(&leadership, fence), want_lead, shutdown).await {
            Ok(c) => c,
            Err(why) => {
                // Never opened: the candidacy is given up, and the store need not answer for this agent to stop.
                let resigned = unless_interrupted(coord.resign(&leadership), want_lead, shutdown).await;
                match why {
                    Interrupted::Shutdown => return "shutdown".into(),
                    Interrupted::SteppingDown => match resigned {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => return withdraw_failed(&election, &e),
                        Err(_) => return withdraw_failed(&election, &"the store did not answer"),
                    },
                }
            }
        };
        match confirmed {
            Ok(true) => {}
            Ok(false) => {
                warn!(election, "won the election, but the candidacy is gone from the store; not leading");
                let _ = coord.resign(&leadership).await;
                continue;
            }
            Err(e) => {
                warn!(election, error = %e, "cannot confirm the leadership; resigning");
                if let Err(e) = coord.resign(&leadership).await {
                    return withdraw_failed(&election, &e);
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = shutdown.cancelled() => return "shutdown".into(),
                }
            }
        }
        info!(election, revision = leadership.revision, "elected");
        state.send_modify(|s| {
            if s.session == generation {
                s.elected = true;
                s.error = None;
                s.expiry = sent_for;
            }
        });
        // Lead until the main loop says stop (it has closed first), the session ends or the key goes. After each
        // keep-alive the leadership is confirmed before the main loop hears of the new expiry (and moves its kernel
        // lease), and the store is checked for amnesia.
        let lost = coord.lost(&leadership);
        tokio::pin!(lost);
        let why = loop {
            tokio::select! {
                _ = want_lead.changed() => if !*want_lead.borrow() { break "stepping down"; },
                r = expiry.changed() => {
                    let e = if r.is_err() { Expiry::Expired } else { *expiry.borrow() };
                    if e == Expiry::Expired {
                        state.send_modify(|s| if s.session == generation { s.expiry = e });
                        break "lease expired";
                    }
                    // Whatever the store does meanwhile (a wedged etcd answers nothing), stepping down and shutdown
                    // are heard at once.
                    let checked = async {
                        if look_at_store(coord, state).await {
                            return Err("store amnesia");
                        }
                        Ok(coord.confirm(&leadership, fence).await)
                    };
                    match unless_interrupted(checked, want_lead, shutdown).await {
                        Err(Interrupted::Shutdown) => break "shutdown",
                        Err(Interrupted::SteppingDown) => break "stepping down",
                        Ok(Err(why)) => break why,
                        Ok(Ok(Ok(true))) => state.send_modify(|s| if s.session == generation { s.expiry = e }),
                        Ok(Ok(Ok(false))) => break "candidacy gone",
                        // The expiry estimate stays where it was: the fence trips if this lasts.
                        Ok(Ok(Err(err))) => debug!(error = %err, "cannot confirm the leadership after a keep-alive"),
                    }
                }
                r = &mut lost => {
                    if r.is_ok() { break "candidacy gone"; }
                }
                _ = shutdown.cancelled() => break "shutdown",
            }
        };
        state.send_modify(|s| s.elected = false);
        if why == "candidacy gone" {
            error!(
                election,
                "this agent's candidacy is gone from the store (its lease was revoked or its key deleted): closing at once"
            );
        }
        // The hand-over record may say closed only once the main loop has closed.
        let closed = matches!(tokio::time::timeout(Duration::from_secs(5), open.wait_for(|o| !*o)).await, Ok(Ok(_)));
        if !closed {
            warn!(why, "the main loop did not report closed; the successor waits out this agent's fence");
            return why.into();
        }
        let done = if why == "stepping down" || why == "shutdown" {
            coord.resign(&leadership).await
        } else {
            coord.closed(&leadership).await
        };
        match done {
            Ok(()) => info!(why, "closed; hand-over recorded"),
            Err(e) if why == "stepping down" => return withdraw_failed(&election, &e),
            Err(e) => {
                warn!(why, error = %e, "could not record the hand-over; the successor waits out this agent's fence")
            }
        }
        if why != "stepping down" {
            return why.into();
        }
    }
}

/// A candidacy that could not be withdrawn (the store did not answer in time: a starved or electing etcd) would
/// stay first in the election's queue for as long as this session lives, and this agent, which does not want to
/// lead, would keep every other host from leading. So the session is ended instead: the caller revokes its lease
/// (again in the background until etcd answers), and the key goes with it. The successor waits out this agent's
/// fence, as the hand-over record could not say closed.
fn withdraw_failed(election: &str, e: &dyn std::fmt::Display) -> String {
    warn!(
        election,
        error = %e,
        "could not withdraw this agent's candidacy; ending the session so that its key goes with the lease"
    );
    format!("could not withdraw the candidacy: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// The lease of an ended session while etcd elects a leader: the revoke fails a few times, then succeeds; it is
    /// tried until then, and given up after the bound when etcd never answers. Tokio's paused clock: no real waits.
    #[tokio::test(start_paused = true)]
    async fn an_ended_sessions_lease_is_revoked_again_until_etcd_answers() {
        let calls = AtomicU32::new(0);
        let flaky =
            || async { if calls.fetch_add(1, Ordering::SeqCst) < 5 { Err(CoordError::LeaseExpired) } else { Ok(()) } };
        let pause = Duration::from_millis(250);
        assert_eq!(revoke_until_done(flaky, Duration::from_secs(30), pause).await.map_err(|(n, _)| n), Ok(6));
        let started = tokio::time::Instant::now();
        let never = || async { Err::<(), _>(CoordError::Cancelled) };
        let (tries, e) = revoke_until_done(never, Duration::from_secs(2), pause).await.unwrap_err();
        assert_eq!((tries, e.to_string()), (9, "cancelled".to_string()), "0, 0.25 … 2 s");
        assert!(started.elapsed() <= Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
