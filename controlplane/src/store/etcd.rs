//! The etcd backend: the filter state shared by every control-plane replica.
//!
//! ```text
//! <prefix>/filter/meta            {"revision": N, "policy": "allow"}   every write compares-and-swaps this key
//! <prefix>/filter/entries/<mac>   the reasons of one MAC
//! <prefix>/filter/log/<N:020>     the delta of revision N (the last `change_log_length` are kept)
//! ```
//!
//! A write is one etcd transaction guarded by the meta key's modification revision, so replicas writing at once
//! serialise (the loser retries on the new state). etcd limits a transaction to 128 operations by default, so a
//! request naming more than [`MACS_PER_TXN`] MACs is applied in several revisions, in order; each is atomic.
//! Every replica keeps a mirror of the state fed by a watch on the prefix, and serves agents from it — so an agent
//! that moves to another replica resumes from its revision without a full reload.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_nft::{MacAddr, UnknownMacPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::mirror::Mirror;
use super::{Applied, Counts, FilterStore, Snapshot, StoreError};
use crate::filter::{Entry, FilterState, ReasonChange, RevisionDelta, apply_changes};

/// Distinct MACs written by one transaction (2 ops each at most is fine: one put or delete per MAC, plus meta,
/// log record and log trim — well under etcd's default limit of 128 operations).
pub const MACS_PER_TXN: usize = 100;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Meta {
    revision: u64,
    policy: UnknownMacPolicy,
}

fn etcd_err(op: &'static str) -> impl FnOnce(ironguard_coord::CoordError) -> StoreError {
    move |e| StoreError::Embedded { op, source: Box::new(e) }
}

struct WriteRequest {
    changes: Vec<ReasonChange>,
    policy: Option<UnknownMacPolicy>,
    reply: oneshot::Sender<Result<Applied, StoreError>>,
}

struct Keys {
    root: String,
    meta: String,
    entries: String,
    log: String,
}

impl Keys {
    fn new(c: &EtcdCoordinator) -> Self {
        let root = c.full("filter/");
        Self { meta: format!("{root}meta"), entries: format!("{root}entries/"), log: format!("{root}log/"), root }
    }

    fn entry(&self, mac: &MacAddr) -> String {
        format!("{}{mac}", self.entries)
    }

    fn log_record(&self, revision: u64) -> String {
        format!("{}{revision:020}", self.log)
    }
}

/// The etcd-backed store.
pub struct EtcdStore {
    mirror: Arc<RwLock<Mirror>>,
    writes: mpsc::Sender<WriteRequest>,
    revision: watch::Receiver<u64>,
    stop: CancellationToken,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("revision", &*self.revision.borrow()).finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Reads the whole filter state at one etcd revision.
async fn load(c: &EtcdCoordinator, keys: &Keys, log_len: usize) -> Result<(Mirror, i64), StoreError> {
    let root = keys.root.clone();
    let r = c
        .retry("load the filter state", |mut cl| {
            let root = root.clone();
            async move { cl.get(root, Some(GetOptions::new().with_prefix())).await }
        })
        .await
        .map_err(etcd_err("load the filter state"))?;
    let at = r.header().map(|h| h.revision()).unwrap_or(0);
    let mut state = FilterState::default();
    let mut log = Vec::new();
    for kv in r.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if key == keys.meta {
            let m: Meta = serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt(format!("meta: {e}")))?;
            state.revision = m.revision;
            state.policy = m.policy;
        } else if let Some(mac) = key.strip_prefix(&keys.entries) {
            let mac: MacAddr = mac.parse().map_err(|e| StoreError::Corrupt(format!("entry key: {e}")))?;
            let e: Entry =
                serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt(format!("entry {mac}: {e}")))?;
            state.entries.insert(mac, e);
        } else if key.starts_with(&keys.log) {
            let d: RevisionDelta =
                serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt(format!("revision record: {e}")))?;
            log.push(d);
        }
    }
    log.sort_by_key(|d| d.revision);
    Ok((Mirror::new(state, log, log_len), at))
}

impl EtcdStore {
    /// Loads the state from etcd and starts following it.
    pub async fn open(coord: EtcdCoordinator, log_len: usize) -> Result<Self, StoreError> {
        let keys = Keys::new(&coord);
        let log_len = log_len.max(1);
        let (mirror, at) = load(&coord, &keys, log_len).await?;
        info!(
            revision = mirror.state.revision,
            entries = mirror.state.entries.len(),
            etcd_revision = at,
            "filter state loaded from etcd"
        );
        let (rev_tx, rev_rx) = watch::channel(mirror.state.revision);
        let mirror = Arc::new(RwLock::new(mirror));
        let stop = CancellationToken::new();
        tokio::spawn(follow(coord.clone(), Keys::new(&coord), mirror.clone(), at, rev_tx, log_len, stop.clone()));
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(writer(coord, keys, rx, rev_rx.clone(), log_len, stop.clone()));
        Ok(Self { mirror, writes: tx, revision: rev_rx, stop })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Mirror> {
        self.mirror.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps the mirror in step with etcd; reloads everything if the watch is lost (e.g. compaction).
async fn follow(
    c: EtcdCoordinator,
    keys: Keys,
    mirror: Arc<RwLock<Mirror>>,
    mut at: i64,
    rev_tx: watch::Sender<u64>,
    log_len: usize,
    stop: CancellationToken,
) {
    loop {
        let mut client = c.client();
        let watch =
            client.watch(keys.root.clone(), Some(WatchOptions::new().with_prefix().with_start_revision(at + 1))).await;
        let mut w = match watch {
            Ok(w) => w,
            Err(e) => {
                warn!(error = %e, "cannot watch the filter state; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => continue, _ = stop.cancelled() => return }
            }
        };
        loop {
            let msg = tokio::select! { m = w.message() => m, _ = stop.cancelled() => return };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => break,
            };
            if resp.canceled() || resp.compact_revision() > 0 {
                warn!(reason = resp.cancel_reason(), "filter watch cancelled; reloading");
                break;
            }
            if let Some(h) = resp.header() {
                at = at.max(h.revision());
            }
            let mut changed = false;
            {
                let mut m = mirror.write().unwrap_or_else(|e| e.into_inner());
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    at = at.max(kv.mod_revision());
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let put = ev.event_type() == EventType::Put;
                    if key == keys.meta && put {
                        if let Ok(meta) = serde_json::from_slice::<Meta>(kv.value()) {
                            m.state.revision = meta.revision;
                            m.state.policy = meta.policy;
                            changed = true;
                        }
                    } else if let Some(mac) = key.strip_prefix(&keys.entries) {
                        let Ok(mac) = mac.parse::<MacAddr>() else { continue };
                        let e =
                            if put { serde_json::from_slice(kv.value()).unwrap_or_default() } else { Entry::default() };
                        m.set_entry(mac, e);
                    } else if key.starts_with(&keys.log) && put {
                        if let Ok(d) = serde_json::from_slice::<RevisionDelta>(kv.value()) {
                            m.push_record(d);
                        }
                    }
                }
                m.trim_to(log_len);
            }
            if changed {
                let rev = mirror.read().unwrap_or_else(|e| e.into_inner()).state.revision;
                rev_tx.send_replace(rev);
            }
        }
        // Lost the watch: reload the whole state, then watch again from there.
        match load(&c, &keys, log_len).await {
            Ok((mut fresh, now)) => {
                fresh.recount();
                let rev = fresh.state.revision;
                *mirror.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                at = now;
                rev_tx.send_replace(rev);
            }
            Err(e) => {
                warn!(error = %e, "reloading the filter state failed; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => return }
            }
        }
    }
}

/// Takes waiting requests, packs up to [`MACS_PER_TXN`] MACs per transaction, commits with compare-and-swap.
async fn writer(
    c: EtcdCoordinator,
    keys: Keys,
    mut rx: mpsc::Receiver<WriteRequest>,
    mut revision: watch::Receiver<u64>,
    log_len: usize,
    stop: CancellationToken,
) {
    let mut carry: Option<WriteRequest> = None;
    loop {
        let first = match carry.take() {
            Some(r) => r,
            None => {
                tokio::select! { r = rx.recv() => match r { Some(r) => r, None => return }, _ = stop.cancelled() => return }
            }
        };
        // A large request is split into chunks of distinct MACs, each its own revision.
        let mut chunks: Vec<Vec<ReasonChange>> = Vec::new();
        let mut cur: Vec<ReasonChange> = Vec::new();
        let mut macs: BTreeSet<MacAddr> = BTreeSet::new();
        for ch in first.changes {
            if !macs.contains(&ch.mac) && macs.len() == MACS_PER_TXN {
                chunks.push(std::mem::take(&mut cur));
                macs.clear();
            }
            macs.insert(ch.mac);
            cur.push(ch);
        }
        let mut group = vec![(first.reply, first.policy)];
        // Small requests waiting behind it share its last transaction.
        while let Ok(next) = rx.try_recv() {
            let distinct: BTreeSet<MacAddr> = next.changes.iter().map(|c| c.mac).collect();
            if macs.union(&distinct).count() > MACS_PER_TXN || next.policy.is_some() {
                carry = Some(next);
                break;
            }
            macs.extend(distinct);
            cur.extend(next.changes);
            group.push((next.reply, None));
        }
        chunks.push(cur);
        let policy = group[0].1;
        let mut result = Ok(Applied { revision: *revision.borrow(), record: None });
        for (i, chunk) in chunks.iter().enumerate() {
            let pol = if i == 0 { policy } else { None };
            result = commit(&c, &keys, chunk, pol, log_len).await;
            if result.is_err() {
                break;
            }
        }
        // Read-your-writes: wait until this replica's mirror has the revision.
        if let Ok(a) = &result {
            let want = a.revision;
            let _ = tokio::time::timeout(Duration::from_secs(5), revision.wait_for(|r| *r >= want)).await;
        }
        for (reply, _) in group {
            let _ = reply.send(match &result {
                Ok(a) => Ok(a.clone()),
                Err(e) => Err(StoreError::Embedded { op: "commit to etcd", source: e.to_string().into() }),
            });
        }
    }
}

/// One compare-and-swap transaction (retried while other replicas win the race).
async fn commit(
    c: &EtcdCoordinator,
    keys: &Keys,
    changes: &[ReasonChange],
    policy: Option<UnknownMacPolicy>,
    log_len: usize,
) -> Result<Applied, StoreError> {
    let macs: Vec<MacAddr> = changes.iter().map(|c| c.mac).collect::<BTreeSet<_>>().into_iter().collect();
    for attempt in 0..20u32 {
        // Read meta and the named entries at one etcd revision.
        let mut ops = vec![TxnOp::get(keys.meta.clone(), None)];
        ops.extend(macs.iter().map(|m| TxnOp::get(keys.entry(m), None)));
        let read = c
            .retry("read for a write", |mut cl| {
                let txn = Txn::new().and_then(ops.clone());
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(etcd_err("read for a write"))?;
        let mut meta_mod = 0i64;
        let mut meta = Meta { revision: 0, policy: UnknownMacPolicy::Allow };
        let mut current: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        for (i, r) in read.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = r else { continue };
            let Some(kv) = g.kvs().first() else { continue };
            if i == 0 {
                meta_mod = kv.mod_revision();
                meta = serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt(format!("meta: {e}")))?;
            } else if let Ok(e) = serde_json::from_slice::<Entry>(kv.value()) {
                current.insert(macs[i - 1], e);
            }
        }
        let (updated, delta) = apply_changes(&|m| current.get(m).cloned(), changes);
        let new_policy = policy.filter(|p| meta.revision == 0 || *p != meta.policy);
        if delta.is_empty() && new_policy.is_none() {
            return Ok(Applied { revision: meta.revision, record: None });
        }
        let revision = meta.revision + 1;
        let record = RevisionDelta { revision, delta, policy: new_policy };
        let next = Meta { revision, policy: new_policy.unwrap_or(meta.policy) };
        let mut w: Vec<TxnOp> = Vec::with_capacity(updated.len() + 3);
        for (mac, e) in &updated {
            if e.is_empty() {
                w.push(TxnOp::delete(keys.entry(mac), None));
            } else {
                let v = serde_json::to_vec(e).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                w.push(TxnOp::put(keys.entry(mac), v, None));
            }
        }
        let meta_v = serde_json::to_vec(&next).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let rec_v = serde_json::to_vec(&record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        w.push(TxnOp::put(keys.meta.clone(), meta_v, None));
        w.push(TxnOp::put(keys.log_record(revision), rec_v, None));
        let keep_from = (revision + 1).saturating_sub(log_len as u64);
        if keep_from > 0 {
            w.push(TxnOp::delete(keys.log.clone(), Some(DeleteOptions::new().with_range(keys.log_record(keep_from)))));
        }
        let guard = if meta_mod == 0 {
            Compare::create_revision(keys.meta.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(keys.meta.clone(), CompareOp::Equal, meta_mod)
        };
        let r = c
            .retry("commit", |mut cl| {
                let txn = Txn::new().when([guard.clone()]).and_then(w.clone());
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(etcd_err("commit"))?;
        if r.succeeded() {
            return Ok(Applied { revision, record: Some(record) });
        }
        debug!(attempt, "another replica wrote first; retrying on the new state");
        tokio::time::sleep(ironguard_coord::backoff(attempt.min(4), Duration::from_millis(200))).await;
    }
    Err(StoreError::Embedded { op: "commit to etcd", source: "too much contention (20 attempts)".into() })
}

#[async_trait]
impl FilterStore for EtcdStore {
    async fn apply(&self, changes: Vec<ReasonChange>, policy: Option<UnknownMacPolicy>) -> Result<Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.writes.send(WriteRequest { changes, policy, reply }).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    fn snapshot(&self) -> Snapshot {
        self.read().snapshot()
    }

    fn counts(&self) -> Counts {
        self.read().counts()
    }

    fn deltas_since(&self, since: u64) -> Option<Vec<RevisionDelta>> {
        self.read().deltas_since(since)
    }

    fn entries(&self, macs: &[MacAddr]) -> (u64, Vec<(MacAddr, Entry)>) {
        self.read().entries(macs)
    }

    fn revision(&self) -> watch::Receiver<u64> {
        self.revision.clone()
    }
}
