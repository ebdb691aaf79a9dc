//! The etcd backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, PutOptions, SortOrder,
    SortTarget, TlsOptions, Txn, TxnOp, WatchOptions,
};
use futures::StreamExt as _;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::amnesia::{Amnesia, StoreLook, StoreMemory, judge};
use crate::lanes::{Lanes, keep_alive};
use crate::session::{Expiry, Session};
use crate::{CoordError, Coordinator, EtcdConfig, HANDOVER_SLACK, HandOver, KeyValue, KvEvent, Leadership, LockGuard};

/// A connected etcd backend.
#[derive(Clone)]
pub struct EtcdCoordinator {
    client: Client,
    prefix: String,
    request_timeout: Duration,
    retries: u32,
    memory: std::sync::Arc<std::sync::Mutex<StoreMemory>>,
    /// A client per endpoint: keep-alives go on all, requests to the one that answered last.
    lanes: Arc<Lanes>,
    /// The client for watches: it requires an etcd leader ([`EtcdCoordinator::watch_client`]).
    watcher: Client,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

fn read(path: &str) -> Result<Vec<u8>, CoordError> {
    std::fs::read(path).map_err(|source| CoordError::ReadFile { path: path.to_string(), source })
}

fn e(op: &'static str) -> impl FnOnce(etcd_client::Error) -> CoordError {
    move |source| CoordError::Etcd { op, source }
}

/// The error of a request that got no answer within its bound (what [`EtcdCoordinator::retry`] reports too).
fn timed_out() -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("request timeout"))
}

/// Whether an error is worth retrying (the cluster or the network, not the request).
fn transient(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Aborted
            ) || client_timeout(s)
        }
        _ => false,
    }
}

/// A request that ran past the channel's own timeout (`with_timeout`, the request timeout): tonic reports it as
/// `Cancelled` ("Timeout expired"), not `DeadlineExceeded`, with the timeout as its source. It is the same event as
/// [`timed_out`] (which is retried): a slow or busy member, not a refused request.
fn client_timeout(s: &tonic::Status) -> bool {
    if s.code() != tonic::Code::Cancelled {
        return false;
    }
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

fn kv(k: &etcd_client::KeyValue, prefix_len: usize) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(k.key().get(prefix_len..).unwrap_or_default()).into_owned(),
        value: k.value().to_vec(),
        create_revision: k.create_revision(),
        mod_revision: k.mod_revision(),
    }
}

/// The fence a successor waits out for a hand-over record it cannot read: longer than any configured fence.
const UNKNOWN_FENCE_MS: u64 = 30_000;

/// Takes a write of the hand-over record seen at `at` (the first instant this process knew of it), if it is newer
/// than the one known.
fn learn(record: &mut Option<(i64, HandOver, Instant)>, mod_rev: i64, value: &[u8], at: Instant) {
    if record.as_ref().is_some_and(|(m, _, _)| *m >= mod_rev) {
        return;
    }
    // An unreadable record is taken as an open one of unknown length: wait the longest there is.
    let h = serde_json::from_slice::<HandOver>(value).unwrap_or(HandOver {
        rev: 0,
        lease: 0,
        holder: String::new(),
        open: true,
        fence_ms: UNKNOWN_FENCE_MS,
    });
    *record = Some((mod_rev, h, at));
}

/// The hand-over record of a holder, as written (a fixed field order: a transaction compares it byte for byte).
fn handover_bytes(l: &Leadership, open: bool, fence_ms: u64) -> Vec<u8> {
    let h = HandOver { rev: l.revision, lease: l.lease, holder: l.holder.clone(), open, fence_ms };
    serde_json::to_vec(&h).unwrap_or_default()
}

impl EtcdCoordinator {
    /// The key of an election's hand-over record (beside the candidates' directory, not in it).
    fn fence_key(&self, election: &str) -> String {
        self.full(&format!("election/{election}.fence"))
    }

    /// The revision of the last write of `l`'s election's hand-over record, if that record is `l`'s and open.
    async fn own_open_record(&self, l: &Leadership) -> Result<Option<i64>, CoordError> {
        let f = self.fence_key(&l.election);
        let r = self
            .retry("read the hand-over record", |mut c| {
                let f = f.clone();
                async move { c.get(f, None).await }
            })
            .await?;
        Ok(r.kvs().first().and_then(|kv| {
            let h = serde_json::from_slice::<HandOver>(kv.value()).ok()?;
            (h.rev == l.revision && h.open).then_some(kv.mod_revision())
        }))
    }

    /// Connects to etcd with the configured TLS, credentials and timeouts.
    pub async fn connect(cfg: &EtcdConfig) -> Result<Self, CoordError> {
        cfg.validate()?;
        if !cfg.enabled() {
            return Err(CoordError::Config("no etcd endpoints configured".into()));
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(cfg.dial_timeout_ms))
            .with_timeout(Duration::from_millis(cfg.request_timeout_ms))
            .with_keep_alive(Duration::from_secs(2), Duration::from_millis(cfg.request_timeout_ms))
            .with_keep_alive_while_idle(true);
        if !cfg.username.is_empty() {
            let password = if cfg.password_file.is_empty() {
                cfg.password.expose().to_string()
            } else {
                String::from_utf8_lossy(&read(&cfg.password_file)?).lines().next().unwrap_or_default().to_string()
            };
            opts = opts.with_user(cfg.username.clone(), password);
        }
        if cfg.tls() {
            let mut tls = TlsOptions::new();
            if !cfg.ca_file.is_empty() {
                tls = tls.ca_certificate(Certificate::from_pem(read(&cfg.ca_file)?));
            }
            if !cfg.cert_file.is_empty() {
                tls = tls.identity(Identity::from_pem(read(&cfg.cert_file)?, read(&cfg.key_file)?));
            }
            opts = opts.with_tls(tls);
        }
        // The client dials lazily, but authenticates at once when a user is set: bounded like any request.
        let bound = Duration::from_millis(cfg.dial_timeout_ms.saturating_add(cfg.request_timeout_ms));
        let lanes = Arc::new(Lanes::new(&cfg.endpoints, opts.clone(), bound));
        // Watches require an etcd leader: a member without one (cut from the others) ends the watches it serves, so
        // that the watcher opens another (on another member) instead of staying on one that hears nothing.
        let watching = Client::connect(&cfg.endpoints, Some(opts.clone().with_require_leader(true)));
        let watcher = match tokio::time::timeout(bound, watching).await {
            Ok(r) => r.map_err(e("connect"))?,
            Err(_) => return Err(CoordError::Etcd { op: "connect", source: timed_out() }),
        };
        let client = match tokio::time::timeout(bound, Client::connect(&cfg.endpoints, Some(opts))).await {
            Ok(r) => r.map_err(e("connect"))?,
            Err(_) => return Err(CoordError::Etcd { op: "connect", source: timed_out() }),
        };
        Ok(Self {
            client,
            prefix: cfg.prefix.clone(),
            request_timeout: Duration::from_millis(cfg.request_timeout_ms),
            retries: cfg.retries.max(1),
            memory: Default::default(),
            lanes,
            watcher,
        })
    }

    /// Each configured endpoint's etcd server version (etcd's `Maintenance.Status`), or why it could not be read:
    /// each endpoint is asked on a connection of its own, bounded by the dial and request timeouts.
    pub async fn server_versions(cfg: &EtcdConfig) -> Vec<(String, Result<String, String>)> {
        let mut out = Vec::with_capacity(cfg.endpoints.len());
        for endpoint in &cfg.endpoints {
            let one = EtcdConfig { endpoints: vec![endpoint.clone()], ..cfg.clone() };
            let version = match Self::connect(&one).await {
                Ok(c) => {
                    let mut client = c.client();
                    match tokio::time::timeout(c.request_timeout, client.status()).await {
                        Ok(Ok(s)) => Ok(s.version().to_string()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("no answer within the request timeout".to_string()),
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            out.push((endpoint.clone(), version));
        }
        out
    }

    /// What to warn about the servers [`EtcdCoordinator::server_versions`] read ([`crate::versions::warning`]);
    /// an endpoint that did not answer is not warned about here (the connection's own errors say it).
    pub fn version_warnings(versions: &[(String, Result<String, String>)]) -> Vec<String> {
        versions.iter().filter_map(|(e, v)| v.as_ref().ok().and_then(|v| crate::versions::warning(e, v))).collect()
    }

    /// The raw client, for backends that need more than the trait (the control plane's filter store).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The client for watches: a member without an etcd leader ends them (etcd's `hasleader`), where a watch would
    /// otherwise stay open on a member cut from the others and hear nothing.
    pub fn watch_client(&self) -> Client {
        self.watcher.clone()
    }

    /// The full key for a key relative to the prefix.
    pub fn full(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }

    fn prefix_len(&self) -> usize {
        self.prefix.len() + 1
    }

    /// Opens a watch, within the request timeout (a wedged etcd never answers a watch's creation).
    async fn open_watch(
        &self,
        key: String,
        options: WatchOptions,
        op: &'static str,
    ) -> Result<etcd_client::WatchStream, CoordError> {
        let mut client = self.watcher.clone();
        match tokio::time::timeout(self.request_timeout, client.watch(key, Some(options))).await {
            Ok(r) => r.map_err(e(op)),
            Err(_) => Err(CoordError::Etcd { op, source: timed_out() }),
        }
    }

    /// The client for a request: the endpoint whose keep-alive was answered last, if one was within the request
    /// timeout (it reaches the etcd leader now), or else the balanced one. So a member that is cut off from the
    /// others, which still accepts connections but answers nothing, does not take a request after it stopped
    /// answering keep-alives while another one answers.
    fn request_client(&self) -> Client {
        self.lanes.preferred(self.request_timeout).unwrap_or_else(|| self.client.clone())
    }

    /// Runs `f` up to `retries` times while it fails transiently, with back-off.
    pub async fn retry<T, F, Fut>(&self, op: &'static str, mut f: F) -> Result<T, CoordError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 0;
        loop {
            let r = tokio::time::timeout(self.request_timeout, f(self.request_client())).await;
            let err = match r {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(err)) => err,
                Err(_) => timed_out(),
            };
            attempt += 1;
            if attempt >= self.retries || !transient(&err) {
                return Err(CoordError::Etcd { op, source: err });
            }
            debug!(op, attempt, error = %err, "retrying etcd request");
            tokio::time::sleep(crate::backoff(attempt - 1, Duration::from_secs(1))).await;
        }
    }
}

pub use crate::lanes::KEEPALIVES_PER_TTL;

#[async_trait]
impl Coordinator for EtcdCoordinator {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn session(&self, ttl: Duration) -> Result<Session, CoordError> {
        let secs = ttl.as_secs().max(1) as i64;
        let sent = Instant::now();
        let r = self.retry("lease grant", |mut c| async move { c.lease_grant(secs, None).await }).await?;
        let granted = Duration::from_secs(r.ttl().max(1) as u64);
        let (tx, rx) = watch::channel(Expiry::At(sent + granted));
        let stop = CancellationToken::new();
        tokio::spawn(keep_alive(self.lanes.clone(), r.id(), granted, tx, stop.clone(), self.request_timeout));
        Ok(Session { lease: r.id(), ttl: granted, expiry: rx, stop, _hold: None })
    }

    async fn revoke(&self, session: &Session) -> Result<(), CoordError> {
        revoke(self, session).await
    }

    async fn campaign(
        &self,
        election: &str,
        value: &str,
        session: &Session,
        cancel: CancellationToken,
    ) -> Result<Leadership, CoordError> {
        let dir = self.full(&format!("election/{election}/"));
        let fence = self.fence_key(election);
        let key = format!("{dir}{:016x}", session.lease);
        let lease = session.lease;
        let (k, v) = (key.clone(), value.to_string());
        let withdraw = |this: &Self, key: String| {
            let this = this.clone();
            async move {
                let _ = this
                    .retry("withdraw", |mut c| {
                        let k = key.clone();
                        async move { c.delete(k, None).await }
                    })
                    .await;
            }
        };
        // Create the candidacy if absent (same lease: same key), attached to the lease. Cancelled meanwhile, the
        // key may have been written: it is withdrawn.
        let created = self.retry("campaign", |mut c| {
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(k.clone(), v.clone(), Some(PutOptions::new().with_lease(lease)))])
                .or_else([TxnOp::get(k.clone(), None)]);
            async move { c.txn(txn).await }
        });
        let r = tokio::select! {
            r = created => r?,
            _ = cancel.cancelled() => {
                withdraw(self, key.clone()).await;
                return Err(CoordError::Cancelled);
            }
        };
        let my_rev = match r.op_responses().into_iter().next() {
            Some(etcd_client::TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()).unwrap_or(0),
            _ => r.header().map(|h| h.revision()).unwrap_or(0),
        };
        let me = Leadership {
            election: election.to_string(),
            key: key.clone(),
            revision: my_rev,
            lease,
            holder: value.to_string(),
        };
        // The hand-over record as last learned: its write's revision and the first instant this candidate knew of
        // that write (the holder's fence ends at most `fence_ms` after it).
        let mut record: Option<(i64, HandOver, Instant)> = None;
        loop {
            // The newest candidate older than us, our own key (a store replaced or restored since the campaign
            // began has forgotten it: that is no victory) and the hand-over record, in one linearizable read.
            let (d, k, f) = (dir.clone(), key.clone(), fence.clone());
            let look = self.retry("campaign wait", |mut c| {
                let older = GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(my_rev - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1);
                let txn = Txn::new().and_then([
                    TxnOp::get(d.clone(), Some(older)),
                    TxnOp::get(k.clone(), None),
                    TxnOp::get(f.clone(), None),
                ]);
                async move { c.txn(txn).await }
            });
            let looked = tokio::select! {
                r = look => r,
                _ = cancel.cancelled() => Err(CoordError::Cancelled),
            };
            let looked = match looked {
                Ok(o) => o,
                Err(err) => {
                    withdraw(self, key.clone()).await;
                    return Err(err);
                }
            };
            let read_at = Instant::now();
            let revision = looked.header().map(|h| h.revision()).unwrap_or(0);
            let mut gets = looked.op_responses().into_iter().filter_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            let (older, mine, handover) = (gets.next(), gets.next(), gets.next());
            let still_mine =
                mine.as_ref().and_then(|g| g.kvs().first()).is_some_and(|kv| kv.create_revision() == my_rev);
            if !still_mine {
                return Err(CoordError::Protocol {
                    op: "campaign",
                    detail: "this candidacy's key vanished from the store (replaced or restored?)".into(),
                });
            }
            if let Some(kv) = handover.as_ref().and_then(|g| g.kvs().first()) {
                learn(&mut record, kv.mod_revision(), kv.value(), read_at);
            }
            let prev_key = older.as_ref().and_then(|g| g.kvs().first()).map(|kv| kv.key().to_vec());
            // First in line: open at once after a hand-over the predecessor confirmed closed (or its own record),
            // otherwise only once the predecessor's fence has certainly ended.
            let wait_until = match (&prev_key, &record) {
                (Some(_), _) => None,
                (None, Some((_, h, at))) if h.open && h.rev != my_rev => {
                    Some(*at + Duration::from_millis(h.fence_ms) + HANDOVER_SLACK)
                }
                (None, _) => return Ok(me),
            };
            if let Some(until) = wait_until {
                if until <= Instant::now() {
                    return Ok(me);
                }
                if let Some((_, h, _)) = &record {
                    debug!(
                        election,
                        predecessor = %h.holder,
                        wait_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64,
                        "first in line, but the predecessor never confirmed it closed: waiting out its fence"
                    );
                }
            }
            // Watch the election (the older candidate's key and the hand-over record, in revision order, so no
            // write of the record can reach us after the deletion it precedes).
            let watch_from = revision + 1;
            let all = self.full(&format!("election/{election}"));
            let opened = tokio::select! {
                r = self.open_watch(all, WatchOptions::new().with_prefix().with_start_revision(watch_from), "campaign watch") => r,
                _ = cancel.cancelled() => Err(CoordError::Cancelled),
            };
            let mut w = match opened {
                Ok(w) => w,
                Err(err) => {
                    withdraw(self, key.clone()).await;
                    return Err(err);
                }
            };
            let deadline = async {
                match wait_until {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => {
                        withdraw(self, key.clone()).await;
                        return Err(CoordError::Cancelled);
                    }
                    () = &mut deadline => return Ok(me),
                    m = w.message() => match m {
                        Ok(Some(resp)) => {
                            let at = Instant::now();
                            let mut recheck = false;
                            for ev in resp.events() {
                                let Some(kv) = ev.kv() else { continue };
                                if kv.key() == fence.as_bytes() && ev.event_type() == EventType::Put {
                                    learn(&mut record, kv.mod_revision(), kv.value(), at);
                                    let closed = record.as_ref().is_some_and(|(_, h, _)| !h.open);
                                    recheck |= wait_until.is_some() && closed;
                                } else if prev_key.as_deref() == Some(kv.key()) && ev.event_type() == EventType::Delete {
                                    recheck = true;
                                }
                            }
                            if recheck {
                                break;
                            }
                        }
                        Ok(None) | Err(_) => break, // re-check from scratch
                    }
                }
            }
        }
    }

    async fn resign(&self, l: &Leadership) -> Result<(), CoordError> {
        let (k, rev, fence) = (l.key.clone(), l.revision, self.fence_key(&l.election));
        // The holder closed before resigning: the key goes and the record says so, in one transaction.
        if let Some(mod_rev) = self.own_open_record(l).await? {
            let closed = handover_bytes(l, false, 0);
            let r = self
                .retry("resign", |mut c| {
                    let txn = Txn::new()
                        .when([
                            Compare::create_revision(k.clone(), CompareOp::Equal, rev),
                            Compare::mod_revision(fence.clone(), CompareOp::Equal, mod_rev),
                        ])
                        .and_then([TxnOp::delete(k.clone(), None), TxnOp::put(fence.clone(), closed.clone(), None)]);
                    async move { c.txn(txn).await }
                })
                .await?;
            if r.succeeded() {
                return Ok(());
            }
        }
        // Never confirmed (or the record is another's by now): just the key.
        self.retry("resign", |mut c| {
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::delete(k.clone(), None)]);
            async move { c.txn(txn).await }
        })
        .await?;
        Ok(())
    }

    async fn confirm(&self, l: &Leadership, fence: Duration) -> Result<bool, CoordError> {
        let (k, rev, f) = (l.key.clone(), l.revision, self.fence_key(&l.election));
        let open = handover_bytes(l, true, fence.as_millis() as u64);
        let r = self
            .retry("confirm the leadership", |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(f.clone(), open.clone(), None)]);
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(r.succeeded())
    }

    async fn lost(&self, l: &Leadership) -> Result<(), CoordError> {
        let mut attempt = 0;
        loop {
            let k = l.key.clone();
            let r = self
                .retry("watch the candidacy", |mut c| {
                    let k = k.clone();
                    async move { c.get(k, None).await }
                })
                .await;
            match r {
                Ok(r) => {
                    if r.kvs().first().is_none_or(|kv| kv.create_revision() != l.revision) {
                        return Ok(());
                    }
                    let from = r.header().map(|h| h.revision()).unwrap_or(0) + 1;
                    let opened = self.open_watch(
                        l.key.clone(),
                        WatchOptions::new().with_start_revision(from),
                        "watch the candidacy",
                    );
                    if let Ok(mut w) = opened.await {
                        attempt = 0;
                        // Until the stream ends or fails: then look again.
                        while let Ok(Some(resp)) = w.message().await {
                            if resp.events().iter().any(|ev| ev.event_type() == EventType::Delete) {
                                return Ok(());
                            }
                        }
                    }
                }
                Err(err) => debug!(error = %err, "cannot watch this candidacy yet"),
            }
            attempt += 1;
            tokio::time::sleep(crate::backoff(attempt, Duration::from_secs(1))).await;
        }
    }

    async fn closed(&self, l: &Leadership) -> Result<(), CoordError> {
        let Some(mod_rev) = self.own_open_record(l).await? else { return Ok(()) };
        let (f, closed) = (self.fence_key(&l.election), handover_bytes(l, false, 0));
        self.retry("record the hand-over", |mut c| {
            let txn = Txn::new()
                .when([Compare::mod_revision(f.clone(), CompareOp::Equal, mod_rev)])
                .and_then([TxnOp::put(f.clone(), closed.clone(), None)]);
            async move { c.txn(txn).await }
        })
        .await?;
        Ok(())
    }

    async fn close_previous(&self, election: &str, lease: i64) -> Result<(), CoordError> {
        let f = self.fence_key(election);
        let r = self
            .retry("record the hand-over", |mut c| {
                let f = f.clone();
                async move { c.get(f, None).await }
            })
            .await?;
        if let Some(kv) = r.kvs().first() {
            if let Ok(h) = serde_json::from_slice::<HandOver>(kv.value()) {
                if h.open && h.lease == lease {
                    // The previous run held the election and died with its table: record it closed before the
                    // revoke makes a successor first in line.
                    let closed = serde_json::to_vec(&HandOver { open: false, fence_ms: 0, ..h }).unwrap_or_default();
                    let mod_rev = kv.mod_revision();
                    self.retry("record the hand-over", |mut c| {
                        let txn = Txn::new()
                            .when([Compare::mod_revision(f.clone(), CompareOp::Equal, mod_rev)])
                            .and_then([TxnOp::put(f.clone(), closed.clone(), None)]);
                        async move { c.txn(txn).await }
                    })
                    .await?;
                }
            }
        }
        self.revoke_lease(lease).await
    }

    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError> {
        let dir = self.full(&format!("election/{election}/"));
        let r = self
            .retry("leader", |mut c| {
                let opts =
                    GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
                let d = dir.clone();
                async move { c.get(d, Some(opts)).await }
            })
            .await?;
        Ok(r.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    async fn put(&self, key: &str, value: Vec<u8>, session: Option<&Session>) -> Result<i64, CoordError> {
        let k = self.full(key);
        let lease = session.map(|s| s.lease);
        let r = self
            .retry("put", |mut c| {
                let opts = lease.map(|l| PutOptions::new().with_lease(l));
                let (k, v) = (k.clone(), value.clone());
                async move { c.put(k, v, opts).await }
            })
            .await?;
        Ok(r.header().map(|h| h.revision()).unwrap_or(0))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, CoordError> {
        let p = self.full(prefix);
        let r = self
            .retry("get", |mut c| {
                let p = p.clone();
                async move { c.get(p, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(r.kvs().iter().map(|k| kv(k, self.prefix_len())).collect())
    }

    async fn delete(&self, key: &str) -> Result<(), CoordError> {
        let k = self.full(key);
        self.retry("delete", |mut c| {
            let k = k.clone();
            async move { c.delete(k, None).await }
        })
        .await?;
        Ok(())
    }

    async fn watch_prefix(
        &self,
        prefix: &str,
        after_revision: i64,
    ) -> Result<BoxStream<'static, Result<Vec<KvEvent>, CoordError>>, CoordError> {
        let p = self.full(prefix);
        let plen = self.prefix_len();
        let w = self
            .open_watch(p, WatchOptions::new().with_prefix().with_start_revision(after_revision + 1), "watch")
            .await?;
        let s = futures::stream::unfold(w, move |mut w| async move {
            loop {
                match w.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            let reason = resp.cancel_reason().to_string();
                            return Some((
                                Err(CoordError::Protocol { op: "watch", detail: format!("cancelled: {reason}") }),
                                w,
                            ));
                        }
                        let evs: Vec<KvEvent> = resp
                            .events()
                            .iter()
                            .filter_map(|ev| {
                                let k = ev.kv()?;
                                Some(match ev.event_type() {
                                    EventType::Put => KvEvent::Put(kv(k, plen)),
                                    EventType::Delete => KvEvent::Delete {
                                        key: String::from_utf8_lossy(k.key().get(plen..).unwrap_or_default())
                                            .into_owned(),
                                        mod_revision: k.mod_revision(),
                                    },
                                })
                            })
                            .collect();
                        // Created/progress responses carry no events.
                        if !evs.is_empty() {
                            return Some((Ok(evs), w));
                        }
                    }
                    Ok(None) => return None,
                    Err(err) => return Some((Err(CoordError::Etcd { op: "watch", source: err }), w)),
                }
            }
        });
        Ok(s.boxed())
    }

    async fn lock(&self, name: &str, session: &Session, cancel: CancellationToken) -> Result<LockGuard, CoordError> {
        lock(self, name, session, &cancel).await
    }

    async fn revoke_lease(&self, lease: i64) -> Result<(), CoordError> {
        match self.retry("lease revoke", |mut c| async move { c.lease_revoke(lease).await }).await {
            Ok(_) => Ok(()),
            Err(CoordError::Etcd { source: etcd_client::Error::GRpcStatus(s), .. })
                if s.code() == tonic::Code::NotFound =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn check_store(&self) -> Result<Option<Amnesia>, CoordError> {
        use rand::Rng as _;
        let key = self.full("epoch");
        let fresh = format!("{:032x}", rand::rng().random::<u128>());
        let r = self
            .retry("read the store epoch", |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), fresh.clone(), None)])
                    .or_else([TxnOp::get(key.clone(), None)]);
                async move { c.txn(txn).await }
            })
            .await?;
        let header =
            r.header().ok_or(CoordError::Protocol { op: "read the store epoch", detail: "no header".into() })?;
        let (cluster_id, revision) = (header.cluster_id(), header.revision());
        let created = r.succeeded();
        let epoch = if created {
            fresh
        } else {
            r.op_responses()
                .into_iter()
                .find_map(|op| match op {
                    etcd_client::TxnOpResponse::Get(g) => {
                        g.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                    }
                    _ => None,
                })
                .unwrap_or_default()
        };
        let look = StoreLook { cluster_id, epoch, created_epoch: created, revision };
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let (next, amnesia) = judge(&memory, &look);
        *memory = next;
        Ok(amnesia)
    }

    async fn still_leading(&self, l: &Leadership) -> Result<bool, CoordError> {
        let k = l.key.clone();
        let r = self
            .retry("check the candidacy", |mut c| {
                let k = k.clone();
                async move { c.get(k, None).await }
            })
            .await?;
        Ok(r.kvs().first().is_some_and(|kv| kv.create_revision() == l.revision))
    }

    fn store_memory(&self) -> StoreMemory {
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn restore_store_memory(&self, memory: StoreMemory) {
        *self.memory.lock().unwrap_or_else(|e| e.into_inner()) = memory;
    }

    async fn unlock(&self, guard: &LockGuard) -> Result<(), CoordError> {
        let k = guard.key.clone();
        self.retry("unlock", |mut c| {
            let k = k.clone();
            async move { c.unlock(k).await }
        })
        .await?;
        Ok(())
    }
}

/// How often a lock waiting behind another holder looks again even without a watch event (a watch lost without
/// an error, a holder whose lease ended while the watch was being opened).
const LOCK_RECHECK: Duration = Duration::from_secs(5);

/// Takes the lock `name` for `session`'s lease, waiting as long as it takes: until it is ours, `cancel` fires or the
/// session ends.
///
/// etcd's own `Lock` call waits inside one request, which the connection's request timeout ends (2 s by default):
/// a holder that keeps the lock longer (the reboot throttle's quantum) made every other caller fail. This is the
/// same algorithm on the client side, each step a bounded request: the waiter's key `lock/<name>/<lease:x>` (the
/// key etcd's `Lock` writes, so a replica of an older version excludes with this one during an upgrade), attached
/// to the session's lease, is created if absent; the lock is ours once no key of the name is older than ours;
/// until then we watch the newest older key until it goes. The key vanishes with the lease, so a waiter or holder
/// that dies frees its place. Cancelled (or failed) while waiting, the key this call created is deleted.
async fn lock(
    c: &EtcdCoordinator,
    name: &str,
    session: &Session,
    cancel: &CancellationToken,
) -> Result<LockGuard, CoordError> {
    let dir = c.full(&format!("lock/{name}/"));
    let key = format!("{dir}{:x}", session.lease);
    let lease = session.lease;
    let (k, d) = (key.clone(), dir.clone());
    let created = c.retry("lock", |mut cl| {
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), "", Some(PutOptions::new().with_lease(lease)))])
            .or_else([TxnOp::get(k.clone(), None)]);
        async move { cl.txn(txn).await }
    });
    tokio::pin!(created);
    let r = tokio::select! {
        r = &mut created => r?,
        _ = cancel.cancelled() => {
            // Cancelled while the put is in flight: its answer is awaited (bounded by the request timeout and the
            // retries) rather than dropped, since a dropped request may still land in etcd after a delete sent now
            // (T46: a cancelled waiter's key outlived its delete on a loaded machine, and every later waiter queued
            // behind it). Taken back if it landed, as etcd's own `Lock` does when its caller goes; if its answer
            // never came, deleted all the same.
            let rev = match created.await {
                Ok(r) if r.succeeded() => r.header().map(|h| h.revision()).unwrap_or(0),
                Ok(_) => return Err(CoordError::Cancelled), // the key was there before this call: not ours to take
                Err(_) => 0,
            };
            release_waiter_key(c, key, rev, session).await;
            return Err(CoordError::Cancelled);
        }
    };
    let ours = r.succeeded();
    let my_rev = match r.op_responses().into_iter().next() {
        Some(etcd_client::TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()).unwrap_or(0),
        _ => r.header().map(|h| h.revision()).unwrap_or(0),
    };
    let give_up = |err: CoordError| {
        let key = key.clone();
        async move {
            if ours {
                release_waiter_key(c, key, my_rev, session).await;
            }
            Err(err)
        }
    };
    let mut expiry = session.watch();
    loop {
        // Our key (gone with the lease: the session ended) and the newest key of the name older than ours, at one
        // revision.
        let (k, d2) = (key.clone(), d.clone());
        let look = c.retry("lock wait", |mut cl| {
            let older = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_keys_only();
            let txn = Txn::new().and_then([TxnOp::get(k.clone(), None), TxnOp::get(d2.clone(), Some(older))]);
            async move { cl.txn(txn).await }
        });
        let looked = tokio::select! {
            r = look => r,
            _ = cancel.cancelled() => Err(CoordError::Cancelled),
        };
        let looked = match looked {
            Ok(l) => l,
            Err(err) => return give_up(err).await,
        };
        let revision = looked.header().map(|h| h.revision()).unwrap_or(0);
        let mut gets = looked.op_responses().into_iter().filter_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (mine, older) = (gets.next(), gets.next());
        if mine.as_ref().and_then(|g| g.kvs().first()).is_none_or(|kv| kv.create_revision() != my_rev) {
            return Err(CoordError::Protocol {
                op: "lock",
                detail: "this waiter's key is gone (its session's lease ended)".into(),
            });
        }
        let Some(prev) =
            older.as_ref().and_then(|g| g.kvs().first()).map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        else {
            return Ok(LockGuard { name: name.to_string(), key });
        };
        let opened = tokio::select! {
            r = c.open_watch(prev, WatchOptions::new().with_start_revision(revision + 1), "lock watch") => r,
            _ = cancel.cancelled() => Err(CoordError::Cancelled),
        };
        let mut w = match opened {
            Ok(w) => w,
            Err(err) => return give_up(err).await,
        };
        let recheck = tokio::time::sleep(LOCK_RECHECK);
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return give_up(CoordError::Cancelled).await,
                _ = &mut recheck => break,
                e = expiry.changed() => {
                    if e.is_err() || *expiry.borrow() == Expiry::Expired {
                        return give_up(CoordError::Protocol { op: "lock", detail: "the session ended while waiting".into() }).await;
                    }
                }
                m = w.message() => match m {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.events().iter().any(|ev| ev.event_type() == EventType::Delete) {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
}

/// Deletes the key of a lock waiter that gives up (`rev`: its create revision, 0 if unknown). Until it is gone, every
/// later waiter of the lock queues behind it, for as long as the session lives: so a delete that fails (etcd slow or
/// away) is not left at that. The first try is awaited; after a failure the delete is retried in the background, with
/// back-off, until it succeeds or the session's lease has ended (which deletes the key with it).
async fn release_waiter_key(c: &EtcdCoordinator, key: String, rev: i64, session: &Session) {
    async fn delete_once(c: &EtcdCoordinator, key: &str, rev: i64) -> Result<(), CoordError> {
        c.retry("unlock", |mut cl| {
            let key = key.to_string();
            let txn = if rev > 0 {
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::delete(key, None)])
            } else {
                Txn::new().and_then([TxnOp::delete(key, None)])
            };
            async move { cl.txn(txn).await }
        })
        .await
        .map(|_| ())
    }
    let Err(err) = delete_once(c, &key, rev).await else { return };
    warn!(%key, error = %err, "could not delete a lock waiter's key that gave up; retrying in the background \
        (later waiters of this lock queue behind it until it is gone or its session ends)");
    let (c, expiry) = (c.clone(), session.expiry.clone());
    tokio::spawn(async move {
        for attempt in 0u32.. {
            tokio::time::sleep(crate::backoff(attempt, Duration::from_secs(2))).await;
            if *expiry.borrow() == Expiry::Expired || expiry.has_changed().is_err() {
                return; // the lease has ended (or the session is gone): the key went with it
            }
            match delete_once(&c, &key, rev).await {
                Ok(()) => {
                    info!(%key, attempt, "deleted the key of a lock waiter that gave up");
                    return;
                }
                Err(err) => debug!(%key, attempt, error = %err, "lock waiter's key still there"),
            }
        }
    });
}

/// Revokes a session's lease: its keys (candidacy, membership, locks) disappear at once.
pub async fn revoke(coord: &EtcdCoordinator, session: &Session) -> Result<(), CoordError> {
    session.stop();
    let lease = session.lease;
    coord.retry("lease revoke", |mut c| async move { c.lease_revoke(lease).await }).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_past_the_channel_timeout_is_retried_and_a_cancel_is_not() {
        // What tonic's channel gives a request that outlived `with_timeout`: Cancelled, the timeout as its source.
        let mut past = tonic::Status::cancelled("Timeout expired");
        past.set_source(std::sync::Arc::new(tonic::TimeoutExpired(())));
        assert!(transient(&etcd_client::Error::GRpcStatus(past)));
        assert!(transient(&timed_out()));
        // A cancel for any other reason, and a refused request, are not retried.
        assert!(!transient(&etcd_client::Error::GRpcStatus(tonic::Status::cancelled("context canceled"))));
        assert!(!transient(&etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("no"))));
    }
}
