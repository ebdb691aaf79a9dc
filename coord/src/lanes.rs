//! One connection per etcd endpoint ("lanes"), beside the balanced one.
//!
//! A session's keep-alives go on every lane at once, each lane a stream of its own ([`keep_alive`]): whichever
//! member answers first moves the lease's expiry estimate. So a member that dies, restarts or is cut off from the
//! others costs nothing while another member answers: no stream has to time out and be opened again first, and no
//! load balancer has to notice which member is gone. The lanes also say which member answered a keep-alive last —
//! one that reaches the etcd leader now — and [`Lanes::preferred`] gives the coordinator's requests to it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::session::Expiry;

/// Keep-alives per TTL on each lane (see [`keep_alive`]).
pub const KEEPALIVES_PER_TTL: u32 = 6;

/// The etcd endpoints, each with a client of its own (connected when first needed).
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    options: ConnectOptions,
    /// Bound on connecting one lane (dial and, with a user, authentication).
    connect_bound: Duration,
}

struct Lane {
    endpoint: String,
    client: Mutex<Option<Client>>,
    /// When a keep-alive on this lane was last answered.
    answered: Mutex<Option<Instant>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lanes {
    pub(crate) fn new(endpoints: &[String], options: ConnectOptions, connect_bound: Duration) -> Self {
        let lanes = endpoints
            .iter()
            .map(|e| Lane { endpoint: e.clone(), client: Mutex::new(None), answered: Mutex::new(None) })
            .collect();
        Self { lanes, options, connect_bound }
    }

    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Lane `i`'s client, connected first if it is not yet (bounded by the dial and request timeouts).
    async fn client(&self, i: usize) -> Result<Client, String> {
        let lane = &self.lanes[i];
        if let Some(c) = locked(&lane.client).clone() {
            return Ok(c);
        }
        let connect = Client::connect([lane.endpoint.as_str()], Some(self.options.clone()));
        let client = match tokio::time::timeout(self.connect_bound, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("no answer within the dial and request timeouts".into()),
        };
        Ok(locked(&lane.client).get_or_insert(client).clone())
    }

    fn answered(&self, i: usize, at: Instant) {
        let mut last = locked(&self.lanes[i].answered);
        if last.is_none_or(|t| t < at) {
            *last = Some(at);
        }
    }

    /// The client of the lane whose keep-alive was answered last, if that was within `fresh` and there is more
    /// than one lane (with one, the balanced client is the same member).
    pub(crate) fn preferred(&self, fresh: Duration) -> Option<Client> {
        if self.lanes.len() < 2 {
            return None;
        }
        let best = self
            .lanes
            .iter()
            .filter_map(|l| locked(&l.answered).map(|t| (t, l)))
            .filter(|(t, _)| t.elapsed() < fresh)
            .max_by_key(|(t, _)| *t)?;
        locked(&best.1.client).clone()
    }
}

/// What a lane heard.
enum Heard {
    /// A keep-alive sent at `sent` was answered: the lease lives until at least `sent + ttl`.
    Renewed { sent: Instant, ttl: Duration },
    /// etcd says the lease is gone.
    Gone,
}

/// Keeps a lease alive on every lane and publishes its expiry estimate until the lease is gone or `stop` fires.
///
/// Each lane sends a keep-alive every TTL/6 on one stream, pipelined: a request does not wait for the answer to the
/// one before, and each answer moves the estimate to its own request's send time plus the TTL (etcd answers a
/// stream in order; a member without a leader holds the requests until it has one, so the requests sent during an
/// etcd election are answered when it ends). A slow etcd (an fsync or a defrag that takes a second) delays the
/// answers without losing them; with the defaults (TTL 3 s, margin 1 s) a stall of up to 1.5 s costs no hand-over.
/// The estimate only moves forward, and only by at least half a period at a time, so the lanes' answers to one
/// round of keep-alives make one change (each change costs the leader a confirmation in etcd).
pub(crate) async fn keep_alive(
    lanes: Arc<Lanes>,
    lease: i64,
    ttl: Duration,
    expiry_tx: watch::Sender<Expiry>,
    stop: CancellationToken,
    request_timeout: Duration,
) {
    let period = ttl / KEEPALIVES_PER_TTL;
    let (tx, mut rx) = mpsc::channel(16 * lanes.len().max(1));
    let lanes_stop = stop.child_token();
    let _stop_lanes = lanes_stop.clone().drop_guard();
    for i in 0..lanes.len() {
        tokio::spawn(lane(lanes.clone(), i, lease, ttl, tx.clone(), lanes_stop.clone(), request_timeout));
    }
    drop(tx);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            heard = rx.recv() => match heard {
                Some(Heard::Renewed { sent, ttl }) => {
                    let at = sent + ttl;
                    let current = *expiry_tx.borrow();
                    if let Expiry::At(t) = current {
                        if at >= t + period / 2 {
                            expiry_tx.send_replace(Expiry::At(at));
                        }
                    }
                }
                Some(Heard::Gone) => {
                    warn!(lease = format!("{lease:x}"), "etcd says the lease is gone");
                    expiry_tx.send_replace(Expiry::Expired);
                    return;
                }
                // Every lane ended: none does but on `stop`.
                None => return,
            },
            _ = tick.tick() => {
                // Copy out first: holding the borrow while sending would deadlock the channel's lock.
                let current = *expiry_tx.borrow();
                if let Expiry::At(t) = current {
                    if Instant::now() >= t {
                        warn!(lease = format!("{lease:x}"), "lease expired without a successful keep-alive");
                        expiry_tx.send_replace(Expiry::Expired);
                        return;
                    }
                }
            }
        }
    }
}

/// An open keep-alive stream of one lane.
type Stream = (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream);

/// Opens a keep-alive stream on lane `i`. Opening renews the lease once (etcd-client sends a keep-alive and waits for
/// its answer), so a stream that opens is itself a renewal at its send time.
async fn open(lanes: Arc<Lanes>, i: usize, lease: i64, bound: Duration) -> (Instant, Result<Stream, Opening>) {
    let sent = Instant::now();
    let opened = async {
        let mut client = lanes.client(i).await.map_err(Opening::Failed)?;
        match client.lease_keep_alive(lease).await {
            Ok(s) => Ok(s),
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("lease not found") => Err(Opening::Gone),
            Err(e) => Err(Opening::Failed(e.to_string())),
        }
    };
    match tokio::time::timeout(bound, opened).await {
        Ok(r) => (sent, r),
        Err(_) => (sent, Err(Opening::Failed("no answer within the request timeout".into()))),
    }
}

/// Why a stream did not open.
enum Opening {
    Gone,
    Failed(String),
}

/// Streams a lane may be opening at once (each bounded by the request timeout).
const OPENING_AT_ONCE: usize = 4;

/// One lane's keep-alives (see [`keep_alive`]); reports what it hears on `tx` until `stop`.
///
/// A request that is not answered within one period makes the lane open another stream beside the one it has (a
/// hedge), and the first to answer serves on. Why not wait: a member forwards keep-alives to the etcd leader it
/// knows, over one HTTP request each, and when that leader is cut off (no reset, just silence) the request — and
/// every later one on the same stream — waits up to etcd's request timeout (7 s by default) although another
/// leader was elected long before. A new stream is a new request to the leader the member knows now.
async fn lane(
    lanes: Arc<Lanes>,
    i: usize,
    lease: i64,
    ttl: Duration,
    tx: mpsc::Sender<Heard>,
    stop: CancellationToken,
    request_timeout: Duration,
) {
    let endpoint = lanes.lanes[i].endpoint.clone();
    let period = ttl / KEEPALIVES_PER_TTL;
    let mut stream: Option<Stream> = None;
    // Send times of the requests not answered yet, oldest first.
    let mut pending: VecDeque<Instant> = VecDeque::new();
    let mut opening = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let answer = async {
            match stream.as_mut() {
                Some((_, responses)) => responses.message().await,
                None => std::future::pending().await,
            }
        };
        let opened = async {
            match opening.join_next().await {
                Some(r) => r.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            r = answer => match r {
                Ok(Some(r)) if r.ttl() > 0 => {
                    // An answer nobody asked for (none pending) moves nothing.
                    if let Some(sent) = pending.pop_front() {
                        lanes.answered(i, Instant::now());
                        let renewed = Heard::Renewed { sent, ttl: Duration::from_secs(r.ttl() as u64) };
                        if tx.send(renewed).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Some(_)) => {
                    let _ = tx.send(Heard::Gone).await;
                    return;
                }
                Ok(None) | Err(_) => {
                    debug!(lease = format!("{lease:x}"), endpoint, "keep-alive stream ended; opening another");
                    (stream, pending) = (None, VecDeque::new());
                }
            },
            Some((sent, r)) = opened => match r {
                Ok(s) => {
                    lanes.answered(i, Instant::now());
                    if tx.send(Heard::Renewed { sent, ttl }).await.is_err() {
                        return;
                    }
                    // The new stream replaces one that has none or a request waiting too long; a stream that
                    // answers keeps serving and the new one is dropped.
                    if stream.is_none() || pending.front().is_some_and(|t| t.elapsed() >= period) {
                        (stream, pending) = (Some(s), VecDeque::new());
                    }
                }
                Err(Opening::Gone) => {
                    let _ = tx.send(Heard::Gone).await;
                    return;
                }
                Err(Opening::Failed(e)) => {
                    debug!(lease = format!("{lease:x}"), endpoint, error = %e, "cannot open a keep-alive stream");
                }
            },
            _ = tick.tick() => {
                // A stream whose oldest request has waited longer than the lease itself is dead, not slow.
                if pending.front().is_some_and(|t| t.elapsed() >= ttl) {
                    (stream, pending) = (None, VecDeque::new());
                }
                let waiting = stream.is_none() || pending.front().is_some_and(|t| t.elapsed() >= period);
                if waiting && opening.len() < OPENING_AT_ONCE {
                    opening.spawn(open(lanes.clone(), i, lease, request_timeout));
                }
                let sent = Instant::now();
                let Some((keeper, _)) = stream.as_mut() else { continue };
                match tokio::time::timeout(request_timeout, keeper.keep_alive()).await {
                    Ok(Ok(())) => pending.push_back(sent),
                    Ok(Err(_)) | Err(_) => {
                        debug!(lease = format!("{lease:x}"), endpoint, "sending a keep-alive failed");
                        (stream, pending) = (None, VecDeque::new());
                    }
                }
            }
        }
    }
}
