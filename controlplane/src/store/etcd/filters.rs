//! The etcd filter state, shared by every control-plane replica.
//!
//! ```text
//! <prefix>/filter/meta            {"revision": N, "policy": "allow"}   every write compares-and-swaps this key
//! <prefix>/filter/entries/<mac>   the reasons of one MAC
//! <prefix>/filter/log/<N:020>     the delta of revision N (the last `change_log_length` are kept)
//! <prefix>/filter/staged/<id>     a large write being prepared (value: when it began, ms)
//! <prefix>/filter/staged/<id>/<mac>   the entry it gives that MAC (empty: none)
//! <prefix>/filter/commit          {"id": <id>, "revision": N}: write <id> is revision N, its entries not all moved yet
//! ```
//!
//! A write is one etcd transaction guarded by the meta key's modification revision, so replicas writing at once
//! serialise (the loser retries on the new state). etcd limits a transaction to 128 operations by default, so a
//! request naming more than [`MACS_PER_TXN`] MACs is *staged*: its entries are written under `staged/<id>/` in
//! as many transactions as it takes, then one transaction writes the meta key, the revision record and the commit
//! record — the instant the whole write happens, as on the embedded store. Every reader applies a committed write's
//! staged entries at that instant (a mirror when its watch brings the commit record; a load that finds one), so
//! no reader and no agent ever sees part of it. Then the entries are moved under `entries/` and the commit record
//! deleted; any writer that finds a commit record finishes that move first (it is idempotent), so a writer that
//! died after its commit delays nothing. A write that loses its race deletes its staging and starts again.
//! Every replica keeps a mirror of the state fed by a watch on the prefix, and serves agents from it — so an agent
//! that moves to another replica resumes from its revision without a full reload.
//!
//! Store amnesia: etcd can be replaced by an empty cluster or restored from an old snapshot. A replica notices
//! when it reloads (the watch breaks) and finds the meta key missing, an older revision or another epoch than its
//! mirror holds. It then keeps serving its mirror (agents see nothing go back), refuses writes, and re-seeds etcd
//! from the mirror with the next revision (entries first, the meta key last, compare-and-swapped so that one
//! replica wins). Settings are never replaced by defaults: a write that finds no meta key takes the mirror's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_dataplane::{MacAddr, UnknownMacPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::filter::{Entry, FilterState, ReasonChange, RevisionDelta, WriteStamp, apply_changes};
use crate::store::mirror::Mirror;
use crate::store::{Applied, Backend, Counts, Fence, FilterStore, Snapshot, StoreError};

/// Distinct MACs written by one transaction (2 ops each at most is fine: one put or delete per MAC, plus meta,
/// log record and log trim — well under etcd's default limit of 128 operations).
pub const MACS_PER_TXN: usize = 100;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    revision: u64,
    policy: UnknownMacPolicy,
    /// Random, written with the first meta key of a store: a store with another epoch is not the one the mirror
    /// followed.
    #[serde(default)]
    epoch: String,
}

fn new_epoch() -> String {
    use rand::Rng as _;
    format!("{:032x}", rand::rng().random::<u128>())
}

/// What a replica knows of the store's meta key from its mirror: writes must not go below it.
#[derive(Debug, Clone, Default)]
struct Floor {
    revision: u64,
    policy: UnknownMacPolicy,
    epoch: String,
}

/// The last store amnesia this replica saw and repaired, for operators (`ironguardctl agents`, logs, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AmnesiaReport {
    /// Seconds since the Unix epoch when it was seen.
    pub seen_at: u64,
    pub detail: String,
    /// The revision the state was re-seeded at (0: not yet).
    pub reseeded_at_revision: u64,
}

fn etcd_err(op: &'static str) -> impl FnOnce(ironguard_coord::CoordError) -> StoreError {
    crate::store::etcd(op)
}

struct WriteRequest {
    changes: Vec<ReasonChange>,
    policy: Option<UnknownMacPolicy>,
    /// A singleton task's write: committed only while this leadership holds.
    fence: Option<Fence>,
    reply: oneshot::Sender<Result<Applied, StoreError>>,
}

struct Keys {
    root: String,
    meta: String,
    entries: String,
    log: String,
    staged: String,
    commit: String,
}

impl Keys {
    fn new(c: &EtcdCoordinator) -> Self {
        let root = c.full("filter/");
        Self {
            meta: format!("{root}meta"),
            entries: format!("{root}entries/"),
            log: format!("{root}log/"),
            staged: format!("{root}staged/"),
            commit: format!("{root}commit"),
            root,
        }
    }

    /// A staged entry's write id and MAC (`None` for a staging's own key, or a key that is not one).
    fn staged_entry(&self, key: &str) -> Option<(String, MacAddr)> {
        let (id, mac) = key.strip_prefix(&self.staged)?.split_once('/')?;
        Some((id.to_string(), mac.parse().ok()?))
    }

    fn entry(&self, mac: &MacAddr) -> String {
        format!("{}{mac}", self.entries)
    }

    fn log_record(&self, revision: u64) -> String {
        format!("{}{revision:020}", self.log)
    }
}

/// The etcd-backed store.
pub struct EtcdFilters {
    mirror: Arc<RwLock<Mirror>>,
    writes: mpsc::Sender<WriteRequest>,
    revision: watch::Receiver<u64>,
    stop: CancellationToken,
    amnesia: Arc<RwLock<Option<AmnesiaReport>>>,
}

impl std::fmt::Debug for EtcdFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFilters").field("revision", &*self.revision.borrow()).finish()
    }
}

impl Drop for EtcdFilters {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Staged entries by write id (see the module's documentation).
type Staged = BTreeMap<String, BTreeMap<MacAddr, Entry>>;

/// The commit record of a staged write.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct CommitRecord {
    id: String,
    revision: u64,
}

/// Reads the whole filter state at one etcd revision: the mirror (with the entries of a committed staged write
/// whose move is not finished), that revision, the meta key with its modification revision (if there is one), and
/// the staged entries of writes not committed yet.
async fn load(
    c: &EtcdCoordinator,
    keys: &Keys,
    log_len: usize,
) -> Result<(Mirror, i64, Option<(Meta, i64)>, Staged), StoreError> {
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
    let mut meta = None;
    let mut staged: Staged = BTreeMap::new();
    let mut committed: Option<CommitRecord> = None;
    for kv in r.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if key == keys.commit {
            committed = Some(
                serde_json::from_slice(kv.value())
                    .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("commit record: {e}")))?,
            );
        } else if key.starts_with(&keys.staged) {
            if let Some((id, mac)) = keys.staged_entry(&key) {
                let e: Entry = serde_json::from_slice(kv.value())
                    .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("staged entry {mac}: {e}")))?;
                staged.entry(id).or_default().insert(mac, e);
            }
        } else if key == keys.meta {
            let m: Meta = serde_json::from_slice(kv.value())
                .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("meta: {e}")))?;
            state.revision = m.revision;
            state.policy = m.policy;
            meta = Some((m, kv.mod_revision()));
        } else if let Some(mac) = key.strip_prefix(&keys.entries) {
            let mac: MacAddr =
                mac.parse().map_err(|e| StoreError::corrupt(Backend::Etcd, format!("entry key: {e}")))?;
            let e: Entry = serde_json::from_slice(kv.value())
                .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("entry {mac}: {e}")))?;
            state.entries.insert(mac, e);
        } else if key.starts_with(&keys.log) {
            let d: RevisionDelta = serde_json::from_slice(kv.value())
                .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("revision record: {e}")))?;
            log.push(d);
        }
    }
    // A committed write whose entries are not all moved yet: its staged entries are the state.
    if let Some(done) = committed.and_then(|c| staged.remove(&c.id)) {
        for (mac, e) in done {
            if e.is_empty() {
                state.entries.remove(&mac);
            } else {
                state.entries.insert(mac, e);
            }
        }
    }
    log.sort_by_key(|d| d.revision);
    let epoch = meta.as_ref().map(|(m, _)| m.epoch.clone()).unwrap_or_default();
    Ok((Mirror::new(state, epoch, log, log_len), at, meta, staged))
}

/// Why a freshly loaded store is not the one a mirror at `floor` followed, if it is not.
fn forgot(floor: &Floor, meta: Option<&Meta>) -> Option<String> {
    if floor.revision == 0 {
        return None;
    }
    match meta {
        None => Some(format!("the filter state is gone from etcd (this replica holds revision {})", floor.revision)),
        Some(m) if !floor.epoch.is_empty() && !m.epoch.is_empty() && m.epoch != floor.epoch => {
            Some(format!("etcd holds another filter state (epoch {} instead of {})", m.epoch, floor.epoch))
        }
        Some(m) if m.revision < floor.revision => {
            Some(format!("the filter state in etcd went back from revision {} to {}", floor.revision, m.revision))
        }
        Some(_) => None,
    }
}

impl EtcdFilters {
    /// Loads the state from etcd and starts following it.
    pub async fn open(coord: EtcdCoordinator, log_len: usize) -> Result<Self, StoreError> {
        let keys = Keys::new(&coord);
        let log_len = log_len.max(1);
        let (mirror, at, meta, staged) = load(&coord, &keys, log_len).await?;
        info!(
            revision = mirror.state.revision,
            entries = mirror.state.entries.len(),
            etcd_revision = at,
            "filter state loaded from etcd"
        );
        let floor = Arc::new(RwLock::new(Floor {
            revision: mirror.state.revision,
            policy: mirror.state.policy,
            epoch: meta.map(|(m, _)| m.epoch).unwrap_or_default(),
        }));
        let (rev_tx, rev_rx) = watch::channel(mirror.state.revision);
        let mirror = Arc::new(RwLock::new(mirror));
        let amnesia = Arc::new(RwLock::new(None));
        let stop = CancellationToken::new();
        let follower = Follower {
            c: coord.clone(),
            keys: Keys::new(&coord),
            mirror: mirror.clone(),
            floor: floor.clone(),
            amnesia: amnesia.clone(),
            rev_tx,
            log_len,
            staged: std::sync::Mutex::new(staged),
        };
        tokio::spawn(follower.run(at, stop.clone()));
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(writer(coord, keys, rx, rev_rx.clone(), floor, log_len, stop.clone()));
        Ok(Self { mirror, writes: tx, revision: rev_rx, stop, amnesia })
    }

    /// The last store amnesia this replica saw (and whether it re-seeded), if any.
    pub fn amnesia(&self) -> Option<AmnesiaReport> {
        self.amnesia.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Mirror> {
        self.mirror.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps the mirror in step with etcd; reloads everything if the watch is lost (e.g. compaction, a restarted or
/// replaced etcd), and re-seeds a store that forgot.
struct Follower {
    c: EtcdCoordinator,
    keys: Keys,
    mirror: Arc<RwLock<Mirror>>,
    floor: Arc<RwLock<Floor>>,
    amnesia: Arc<RwLock<Option<AmnesiaReport>>>,
    rev_tx: watch::Sender<u64>,
    log_len: usize,
    /// Staged entries of writes not committed yet, as the watch (or the last load) brought them.
    staged: std::sync::Mutex<Staged>,
}

impl Follower {
    async fn run(self, mut at: i64, stop: CancellationToken) {
        loop {
            self.watch(&mut at, &stop).await;
            if stop.is_cancelled() {
                return;
            }
            // Lost the watch: reload the whole state, then watch again from there.
            match load(&self.c, &self.keys, self.log_len).await {
                Ok((mut fresh, now, meta, staged)) => {
                    *self.staged.lock().unwrap_or_else(|e| e.into_inner()) = staged;
                    let floor = self.floor.read().unwrap_or_else(|e| e.into_inner()).clone();
                    if let Some(why) = forgot(&floor, meta.as_ref().map(|(m, _)| m)) {
                        self.reseed(&why, meta.as_ref().map(|(_, rev)| *rev), &stop).await;
                        continue; // reload what was written
                    }
                    fresh.recount();
                    let rev = fresh.state.revision;
                    *self.floor.write().unwrap_or_else(|e| e.into_inner()) = Floor {
                        revision: rev,
                        policy: fresh.state.policy,
                        epoch: meta.map(|(m, _)| m.epoch).unwrap_or(floor.epoch),
                    };
                    *self.mirror.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    at = now;
                    self.rev_tx.send_replace(rev);
                }
                Err(e) => {
                    warn!(error = %e, "reloading the filter state failed; retrying");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => return }
                }
            }
        }
    }

    /// Follows the watch until it breaks.
    async fn watch(&self, at: &mut i64, stop: &CancellationToken) {
        let keys = &self.keys;
        let mut client = self.c.watch_client();
        let watch =
            client.watch(keys.root.clone(), Some(WatchOptions::new().with_prefix().with_start_revision(*at + 1))).await;
        let mut w = match watch {
            Ok(w) => w,
            Err(e) => {
                warn!(error = %e, "cannot watch the filter state; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => {} }
                return;
            }
        };
        loop {
            let msg = tokio::select! { m = w.message() => m, _ = stop.cancelled() => return };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => return,
            };
            if resp.canceled() || resp.compact_revision() > 0 {
                warn!(reason = resp.cancel_reason(), "filter watch cancelled; reloading");
                return;
            }
            if let Some(h) = resp.header() {
                *at = (*at).max(h.revision());
            }
            let mut changed = false;
            {
                let mut m = self.mirror.write().unwrap_or_else(|e| e.into_inner());
                let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    *at = (*at).max(kv.mod_revision());
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let put = ev.event_type() == EventType::Put;
                    if key.starts_with(&keys.staged) {
                        if let Some((id, mac)) = keys.staged_entry(&key) {
                            if put {
                                let e = serde_json::from_slice(kv.value()).unwrap_or_default();
                                staged.entry(id).or_default().insert(mac, e);
                            } else if let Some(w) = staged.get_mut(&id) {
                                w.remove(&mac);
                                if w.is_empty() {
                                    staged.remove(&id);
                                }
                            }
                        }
                    } else if key == keys.commit && put {
                        // The instant a staged write happens: all its entries at once (they came before).
                        if let Ok(done) = serde_json::from_slice::<CommitRecord>(kv.value()) {
                            for (mac, e) in staged.remove(&done.id).unwrap_or_default() {
                                m.set_entry(mac, e);
                            }
                        }
                    } else if key == keys.meta && put {
                        if let Ok(meta) = serde_json::from_slice::<Meta>(kv.value()) {
                            m.state.revision = meta.revision;
                            m.state.policy = meta.policy;
                            m.epoch = meta.epoch.clone();
                            let mut f = self.floor.write().unwrap_or_else(|e| e.into_inner());
                            *f = Floor { revision: meta.revision, policy: meta.policy, epoch: meta.epoch };
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
                m.trim_to(self.log_len);
            }
            if changed {
                let rev = self.mirror.read().unwrap_or_else(|e| e.into_inner()).state.revision;
                self.rev_tx.send_replace(rev);
            }
        }
    }

    /// Writes the mirror back into a store that forgot it, at the next revision: every entry first, then (compared
    /// and swapped against the meta key as found) the meta key and an empty revision record, so that agents at the
    /// mirror's revision simply move one revision on. Another replica doing the same at once makes the swap fail
    /// here; the caller reloads and finds the re-seeded state.
    async fn reseed(&self, why: &str, found_mod_revision: Option<i64>, stop: &CancellationToken) {
        let (state, floor) = {
            let m = self.mirror.read().unwrap_or_else(|e| e.into_inner());
            (m.state.clone(), self.floor.read().unwrap_or_else(|e| e.into_inner()).clone())
        };
        error!(
            detail = why,
            revision = state.revision,
            entries = state.entries.len(),
            "store amnesia: etcd lost the filter state; serving this replica's copy, refusing writes, re-seeding etcd"
        );
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        *self.amnesia.write().unwrap_or_else(|e| e.into_inner()) =
            Some(AmnesiaReport { seen_at: now, detail: why.to_string(), reseeded_at_revision: 0 });
        let keys = &self.keys;
        let entries: Vec<(MacAddr, Entry)> = state.entries.iter().map(|(m, e)| (*m, e.clone())).collect();
        for chunk in entries.chunks(MACS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .filter_map(|(mac, e)| Some(TxnOp::put(keys.entry(mac), serde_json::to_vec(e).ok()?, None)))
                .collect();
            let r = self
                .c
                .retry("re-seed entries", |mut cl| {
                    let txn = Txn::new().and_then(ops.clone());
                    async move { cl.txn(txn).await }
                })
                .await;
            if let Err(e) = r {
                warn!(error = %e, "re-seeding failed; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => {} }
                return;
            }
        }
        let revision = state.revision + 1;
        let epoch = if floor.epoch.is_empty() { new_epoch() } else { floor.epoch.clone() };
        let meta = Meta { revision, policy: state.policy, epoch };
        let record = RevisionDelta { revision, delta: Default::default(), policy: None };
        let (Ok(meta_v), Ok(rec_v)) = (serde_json::to_vec(&meta), serde_json::to_vec(&record)) else { return };
        let guard = match found_mod_revision {
            None => Compare::create_revision(keys.meta.clone(), CompareOp::Equal, 0),
            Some(rev) => Compare::mod_revision(keys.meta.clone(), CompareOp::Equal, rev),
        };
        let w = vec![TxnOp::put(keys.meta.clone(), meta_v, None), TxnOp::put(keys.log_record(revision), rec_v, None)];
        let r = self
            .c
            .retry("re-seed the meta key", |mut cl| {
                let txn = Txn::new().when([guard.clone()]).and_then(w.clone());
                async move { cl.txn(txn).await }
            })
            .await;
        match r {
            Ok(r) if r.succeeded() => {
                info!(revision, "store amnesia repaired: etcd re-seeded from this replica's copy");
                if let Some(a) = self.amnesia.write().unwrap_or_else(|e| e.into_inner()).as_mut() {
                    a.reseeded_at_revision = revision;
                }
            }
            Ok(_) => info!("another replica re-seeded etcd first"),
            Err(e) => {
                warn!(error = %e, "re-seeding the meta key failed; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop.cancelled() => {} }
            }
        }
    }
}

/// Takes waiting requests, packs up to [`MACS_PER_TXN`] MACs per transaction, commits with compare-and-swap; a
/// larger request is staged and committed as one revision ([`commit_large`]).
async fn writer(
    c: EtcdCoordinator,
    keys: Keys,
    mut rx: mpsc::Receiver<WriteRequest>,
    mut revision: watch::Receiver<u64>,
    floor: Arc<RwLock<Floor>>,
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
        let fence = first.fence;
        let mut group = vec![(first.reply, first.policy)];
        let policy = first.policy;
        let mut macs: BTreeSet<MacAddr> = first.changes.iter().map(|c| c.mac).collect();
        let f = floor.read().unwrap_or_else(|e| e.into_inner()).clone();
        let result = if macs.len() > MACS_PER_TXN {
            // A large request: staged, then committed as one revision (alone: nothing shares its transaction).
            commit_large(&c, &keys, &first.changes, policy, log_len, &f, fence.as_ref()).await
        } else {
            let mut cur = first.changes;
            // Small requests waiting behind it share its transaction (not across a fence: each fenced write is its
            // own, so that a lost lead refuses only that write).
            while let Ok(next) = rx.try_recv() {
                let distinct: BTreeSet<MacAddr> = next.changes.iter().map(|c| c.mac).collect();
                if macs.union(&distinct).count() > MACS_PER_TXN
                    || next.policy.is_some()
                    || next.fence.is_some()
                    || fence.is_some()
                {
                    carry = Some(next);
                    break;
                }
                macs.extend(distinct);
                cur.extend(next.changes);
                group.push((next.reply, None));
            }
            commit(&c, &keys, &cur, policy, log_len, &f, fence.as_ref()).await
        };
        // Read-your-writes: wait until this replica's mirror has the revision.
        if let Ok(a) = &result {
            let want = a.revision;
            let _ = tokio::time::timeout(Duration::from_secs(5), revision.wait_for(|r| *r >= want)).await;
        }
        for (reply, _) in group {
            let _ = reply.send(match &result {
                Ok(a) => Ok(a.clone()),
                Err(StoreError::Amnesia(d)) => Err(StoreError::Amnesia(d.clone())),
                Err(StoreError::Fenced(d)) => Err(StoreError::Fenced(d.clone())),
                Err(e) => Err(StoreError::Backend {
                    backend: Backend::Etcd,
                    op: "commit to etcd",
                    source: e.to_string().into(),
                }),
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
    floor: &Floor,
    fence: Option<&Fence>,
) -> Result<Applied, StoreError> {
    let macs: Vec<MacAddr> = changes.iter().map(|c| c.mac).collect::<BTreeSet<_>>().into_iter().collect();
    // The leader key as it must be: still there, with the create revision the lead was won at.
    let held = fence.map(|f| Compare::create_revision(f.key.clone(), CompareOp::Equal, f.revision));
    for attempt in 0..20u32 {
        if let Some(f) = fence {
            check_fence(c, f).await?;
        }
        // Read meta, the named entries and the commit record at one etcd revision.
        let mut ops = vec![TxnOp::get(keys.meta.clone(), None)];
        ops.extend(macs.iter().map(|m| TxnOp::get(keys.entry(m), None)));
        ops.push(TxnOp::get(keys.commit.clone(), None));
        let read = c
            .retry("read for a write", |mut cl| {
                let txn = Txn::new().and_then(ops.clone());
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(etcd_err("read for a write"))?;
        let mut meta_mod = 0i64;
        // No meta key yet: the settings this replica holds, never the built-in defaults.
        let mut meta = Meta { revision: 0, policy: floor.policy, epoch: String::new() };
        let mut current: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        // Each named entry's mod revision as read (absent: not there), for a write that makes no revision.
        let mut entry_mods: BTreeMap<MacAddr, i64> = BTreeMap::new();
        let mut pending_commit = None;
        for (i, r) in read.op_responses().into_iter().enumerate() {
            let TxnOpResponse::Get(g) = r else { continue };
            let Some(kv) = g.kvs().first() else { continue };
            if i == macs.len() + 1 {
                pending_commit = Some(kv.value().to_vec());
            } else if i == 0 {
                meta_mod = kv.mod_revision();
                meta = serde_json::from_slice(kv.value())
                    .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("meta: {e}")))?;
            } else {
                entry_mods.insert(macs[i - 1], kv.mod_revision());
                if let Ok(e) = serde_json::from_slice::<Entry>(kv.value()) {
                    current.insert(macs[i - 1], e);
                }
            }
        }
        if let Some(record) = pending_commit {
            // A large write committed, its entries not all moved yet: finish that first, then read again.
            finish_staged(c, keys, &record).await?;
            continue;
        }
        let found = (meta_mod != 0).then(|| meta.clone());
        if let Some(why) = forgot(floor, found.as_ref()) {
            return Err(StoreError::Amnesia(why));
        }
        let (updated, delta) = apply_changes(&|m| current.get(m).cloned(), changes, WriteStamp::now(meta.revision));
        let new_policy = policy.filter(|p| meta.revision == 0 || *p != meta.policy);
        if delta.is_empty() && new_policy.is_none() {
            if updated.is_empty() {
                return Ok(Applied { revision: meta.revision, record: None });
            }
            // Reasons changed but no membership (a second allow reason, say): no revision, but the entries must be
            // stored, compared against the meta key and the entries as read so that no other write slips in between.
            if write_reasons_only(c, keys, &updated, meta_mod, &entry_mods, held.clone()).await? {
                return Ok(Applied { revision: meta.revision, record: None });
            }
            debug!(attempt, "another replica wrote first; retrying on the new state");
            tokio::time::sleep(ironguard_coord::backoff(attempt.min(4), Duration::from_millis(200))).await;
            continue;
        }
        let revision = meta.revision + 1;
        let record = RevisionDelta { revision, delta, policy: new_policy };
        let epoch = if meta.epoch.is_empty() {
            if floor.epoch.is_empty() { new_epoch() } else { floor.epoch.clone() }
        } else {
            meta.epoch.clone()
        };
        let next = Meta { revision, policy: new_policy.unwrap_or(meta.policy), epoch };
        let mut w: Vec<TxnOp> = Vec::with_capacity(updated.len() + 3);
        for (mac, e) in &updated {
            if e.is_empty() {
                w.push(TxnOp::delete(keys.entry(mac), None));
            } else {
                let v = serde_json::to_vec(e).map_err(|e| StoreError::corrupt(Backend::Etcd, e.to_string()))?;
                w.push(TxnOp::put(keys.entry(mac), v, None));
            }
        }
        let meta_v = serde_json::to_vec(&next).map_err(|e| StoreError::corrupt(Backend::Etcd, e.to_string()))?;
        let rec_v = serde_json::to_vec(&record).map_err(|e| StoreError::corrupt(Backend::Etcd, e.to_string()))?;
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
        let no_commit = Compare::create_revision(keys.commit.clone(), CompareOp::Equal, 0);
        let r = c
            .retry("commit", |mut cl| {
                let guards: Vec<Compare> = held.iter().cloned().chain([guard.clone(), no_commit.clone()]).collect();
                let txn = Txn::new().when(guards).and_then(w.clone());
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
    Err(StoreError::Backend {
        backend: Backend::Etcd,
        op: "commit to etcd",
        source: "too much contention (20 attempts)".into(),
    })
}

/// The largest revision record one staged write may make: its commit is one etcd request, which etcd bounds by
/// `--max-request-bytes` (1.5 MiB by default). About 50,000 MACs changing membership at once.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// A write naming more than [`MACS_PER_TXN`] MACs, as one revision: read meta and the named entries at one etcd
/// revision, stage the new entries, then commit meta, the revision record and the commit record in one
/// transaction (compared against meta as read, the entries unchanged since the read, no other commit pending and
/// this staging still whole), then move the entries in place ([`finish_staged`]). Nothing is visible to any reader
/// before the commit, everything after it. A write that loses its race deletes its staging and starts again.
async fn commit_large(
    c: &EtcdCoordinator,
    keys: &Keys,
    changes: &[ReasonChange],
    policy: Option<UnknownMacPolicy>,
    log_len: usize,
    floor: &Floor,
    fence: Option<&Fence>,
) -> Result<Applied, StoreError> {
    let macs: Vec<MacAddr> = changes.iter().map(|c| c.mac).collect::<BTreeSet<_>>().into_iter().collect();
    let held = fence.map(|f| Compare::create_revision(f.key.clone(), CompareOp::Equal, f.revision));
    let enc = |e: serde_json::Error| StoreError::corrupt(Backend::Etcd, e.to_string());
    for attempt in 0..20u32 {
        if let Some(f) = fence {
            check_fence(c, f).await?;
        }
        let first = Txn::new().and_then([TxnOp::get(keys.meta.clone(), None), TxnOp::get(keys.commit.clone(), None)]);
        let read = txn(c, "read for a write", first).await?;
        let at = read.header().map(|h| h.revision()).unwrap_or(0);
        let g: Vec<_> = read
            .op_responses()
            .into_iter()
            .filter_map(|r| if let TxnOpResponse::Get(g) = r { Some(g) } else { None })
            .collect();
        if let Some(kv) = g.get(1).and_then(|g| g.kvs().first()) {
            finish_staged(c, keys, kv.value()).await?;
            continue;
        }
        let (mut meta, mut meta_mod) = (Meta { revision: 0, policy: floor.policy, epoch: String::new() }, 0);
        if let Some(kv) = g.first().and_then(|g| g.kvs().first()) {
            meta_mod = kv.mod_revision();
            meta = serde_json::from_slice(kv.value())
                .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("meta: {e}")))?;
        }
        let found = (meta_mod != 0).then(|| meta.clone());
        if let Some(why) = forgot(floor, found.as_ref()) {
            return Err(StoreError::Amnesia(why));
        }
        // The named entries, at the same revision.
        let mut current: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        for chunk in macs.chunks(MACS_PER_TXN) {
            let ops: Vec<TxnOp> =
                chunk.iter().map(|m| TxnOp::get(keys.entry(m), Some(GetOptions::new().with_revision(at)))).collect();
            let r = txn(c, "read for a write", Txn::new().and_then(ops)).await?;
            for (m, r) in chunk.iter().zip(r.op_responses()) {
                if let TxnOpResponse::Get(g) = r {
                    if let Some(kv) = g.kvs().first() {
                        if let Ok(e) = serde_json::from_slice::<Entry>(kv.value()) {
                            current.insert(*m, e);
                        }
                    }
                }
            }
        }
        let (updated, delta) = apply_changes(&|m| current.get(m).cloned(), changes, WriteStamp::now(meta.revision));
        let new_policy = policy.filter(|p| meta.revision == 0 || *p != meta.policy);
        if updated.is_empty() && new_policy.is_none() {
            return Ok(Applied { revision: meta.revision, record: None });
        }
        // Reasons that move no MAC still go in one revision here (an empty delta): all or nothing, like the rest.
        let revision = meta.revision + 1;
        let record = RevisionDelta { revision, delta, policy: new_policy };
        let rec_v = serde_json::to_vec(&record).map_err(enc)?;
        if rec_v.len() > MAX_RECORD_BYTES {
            return Err(StoreError::Backend {
                backend: Backend::Etcd,
                op: "commit to etcd",
                source: format!(
                    "the change is too large for one etcd revision ({} bytes of revision record, at most {MAX_RECORD_BYTES}); \
                     nothing was written: send it in smaller requests",
                    rec_v.len()
                )
                .into(),
            });
        }
        let epoch = match (meta.epoch.is_empty(), floor.epoch.is_empty()) {
            (false, _) => meta.epoch.clone(),
            (true, false) => floor.epoch.clone(),
            (true, true) => new_epoch(),
        };
        let next = Meta { revision, policy: new_policy.unwrap_or(meta.policy), epoch };
        // Stage: the staging's own key first, then the entries, each chunk only while that key is the one written.
        let id = {
            use rand::Rng as _;
            format!("{:020}-{:016x}", ironguard_proto::time::now_ms(), rand::rng().random::<u64>())
        };
        let own = format!("{}{id}", keys.staged);
        let begun = Txn::new()
            .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(own.clone(), ironguard_proto::time::now_ms().to_string(), None)]);
        let staged_at = txn(c, "stage a write", begun).await?.header().map(|h| h.revision()).unwrap_or(0);
        let whole = Compare::create_revision(own.clone(), CompareOp::Equal, staged_at);
        let entries: Vec<(&MacAddr, &Entry)> = updated.iter().collect();
        for chunk in entries.chunks(MACS_PER_TXN) {
            let mut ops = Vec::with_capacity(chunk.len());
            for (mac, e) in chunk {
                ops.push(TxnOp::put(format!("{own}/{mac}"), serde_json::to_vec(e).map_err(enc)?, None));
            }
            if !txn(c, "stage a write", Txn::new().when([whole.clone()]).and_then(ops)).await?.succeeded() {
                break; // the staging was removed: the commit below fails and the write starts again
            }
        }
        let commit_v = serde_json::to_vec(&CommitRecord { id: id.clone(), revision }).map_err(enc)?;
        let mut w = vec![
            TxnOp::put(keys.meta.clone(), serde_json::to_vec(&next).map_err(enc)?, None),
            TxnOp::put(keys.log_record(revision), rec_v, None),
            TxnOp::put(keys.commit.clone(), commit_v.clone(), None),
        ];
        let keep_from = (revision + 1).saturating_sub(log_len as u64);
        if keep_from > 0 {
            w.push(TxnOp::delete(keys.log.clone(), Some(DeleteOptions::new().with_range(keys.log_record(keep_from)))));
        }
        let mut guards: Vec<Compare> = held.iter().cloned().collect();
        guards.push(match meta_mod {
            0 => Compare::create_revision(keys.meta.clone(), CompareOp::Equal, 0),
            m => Compare::mod_revision(keys.meta.clone(), CompareOp::Equal, m),
        });
        guards.push(Compare::create_revision(keys.commit.clone(), CompareOp::Equal, 0));
        guards.push(whole);
        // No entry changed since the read (a write of reasons only moves no meta key).
        guards.push(Compare::mod_revision(keys.entries.clone(), CompareOp::Less, at + 1).with_prefix());
        let r = txn(c, "commit", Txn::new().when(guards).and_then(w)).await?;
        if r.succeeded() {
            if let Err(e) = finish_staged(c, keys, &commit_v).await {
                // Committed all the same: the next write (of any replica) finishes the move.
                warn!(error = %e, revision, "moving a committed write's entries in place failed; the next write finishes it");
            }
            return Ok(Applied { revision, record: Some(record) });
        }
        let _ = txn(
            c,
            "drop a staging",
            Txn::new().and_then([TxnOp::delete(own, Some(DeleteOptions::new().with_prefix()))]),
        )
        .await;
        debug!(attempt, "another write came first; staging again on the new state");
        tokio::time::sleep(ironguard_coord::backoff(attempt.min(4), Duration::from_millis(200))).await;
    }
    Err(StoreError::Backend {
        backend: Backend::Etcd,
        op: "commit to etcd",
        source: "too much contention (20 attempts)".into(),
    })
}

/// Moves a committed staged write's entries (commit record `record`) in place, then deletes the commit record and
/// the staging, each step only while that commit record is the one found: idempotent, so any writer may finish
/// the move of another that died.
async fn finish_staged(c: &EtcdCoordinator, keys: &Keys, record: &[u8]) -> Result<(), StoreError> {
    let done: CommitRecord = serde_json::from_slice(record)
        .map_err(|e| StoreError::corrupt(Backend::Etcd, format!("commit record: {e}")))?;
    let own = format!("{}{}", keys.staged, done.id);
    let same = Compare::value(keys.commit.clone(), CompareOp::Equal, record.to_vec());
    let mut from = format!("{own}/");
    let end = format!("{own}0"); // '/' + 1
    loop {
        let page = GetOptions::new().with_range(end.clone()).with_limit(MACS_PER_TXN as i64);
        let r = txn(c, "finish a write", Txn::new().and_then([TxnOp::get(from.clone(), Some(page))])).await?;
        let Some(TxnOpResponse::Get(g)) = r.op_responses().into_iter().next() else { break };
        let mut ops = Vec::new();
        for kv in g.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some((_, mac)) = keys.staged_entry(&key) else { continue };
            let empty = serde_json::from_slice::<Entry>(kv.value()).map(|e| e.is_empty()).unwrap_or(false);
            ops.push(if empty {
                TxnOp::delete(keys.entry(&mac), None)
            } else {
                TxnOp::put(keys.entry(&mac), kv.value().to_vec(), None)
            });
        }
        if !ops.is_empty()
            && !txn(c, "finish a write", Txn::new().when([same.clone()]).and_then(ops)).await?.succeeded()
        {
            return Ok(()); // finished by another writer meanwhile
        }
        match g.kvs().last() {
            Some(kv) if g.more() => from = format!("{}\0", String::from_utf8_lossy(kv.key())),
            _ => break,
        }
    }
    let end = Txn::new().when([same]).and_then([
        TxnOp::delete(keys.commit.clone(), None),
        TxnOp::delete(own, Some(DeleteOptions::new().with_prefix())),
    ]);
    txn(c, "finish a write", end).await?;
    Ok(())
}

async fn txn(c: &EtcdCoordinator, op: &'static str, t: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
    c.retry(op, |mut cl| {
        let t = t.clone();
        async move { cl.txn(t).await }
    })
    .await
    .map_err(etcd_err(op))
}

/// `Err(Fenced)` unless the leader key `fence` names still exists with its create revision. Checked before each
/// attempt (a transaction that failed may have failed on the fence), and the commit compares it again.
async fn check_fence(c: &EtcdCoordinator, fence: &Fence) -> Result<(), StoreError> {
    let key = fence.key.clone();
    let r = c
        .retry("read the leader key", |mut cl| {
            let key = key.clone();
            async move { cl.get(key, None).await }
        })
        .await
        .map_err(etcd_err("read the leader key"))?;
    match r.kvs().first().map(|kv| kv.create_revision()) {
        Some(rev) if rev == fence.revision => Ok(()),
        Some(rev) => Err(StoreError::Fenced(format!("the leader key was created again at revision {rev}"))),
        None => Err(StoreError::Fenced("the leader key is gone".into())),
    }
}

/// Stores entries whose reasons changed without a new revision, if the meta key is still at `meta_mod` and each
/// entry at its mod revision in `entry_mods` (0 or absent: it does not exist). False: another write came first.
async fn write_reasons_only(
    c: &EtcdCoordinator,
    keys: &Keys,
    updated: &BTreeMap<MacAddr, Entry>,
    meta_mod: i64,
    entry_mods: &BTreeMap<MacAddr, i64>,
    held: Option<Compare>,
) -> Result<bool, StoreError> {
    let mut w: Vec<TxnOp> = Vec::with_capacity(updated.len());
    for (mac, e) in updated {
        if e.is_empty() {
            w.push(TxnOp::delete(keys.entry(mac), None));
        } else {
            let v = serde_json::to_vec(e).map_err(|e| StoreError::corrupt(Backend::Etcd, e.to_string()))?;
            w.push(TxnOp::put(keys.entry(mac), v, None));
        }
    }
    let unchanged = |key: String, m: i64| match m {
        0 => Compare::create_revision(key, CompareOp::Equal, 0),
        m => Compare::mod_revision(key, CompareOp::Equal, m),
    };
    let mut guards: Vec<Compare> = held.into_iter().collect();
    guards.push(unchanged(keys.meta.clone(), meta_mod));
    guards.push(Compare::create_revision(keys.commit.clone(), CompareOp::Equal, 0));
    guards.extend(updated.keys().map(|mac| unchanged(keys.entry(mac), entry_mods.get(mac).copied().unwrap_or(0))));
    let r = c
        .retry("store reasons", |mut cl| {
            let txn = Txn::new().when(guards.clone()).and_then(w.clone());
            async move { cl.txn(txn).await }
        })
        .await
        .map_err(etcd_err("store reasons"))?;
    Ok(r.succeeded())
}

#[async_trait]
impl FilterStore for EtcdFilters {
    async fn apply(&self, changes: Vec<ReasonChange>, policy: Option<UnknownMacPolicy>) -> Result<Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.writes.send(WriteRequest { changes, policy, fence: None, reply }).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn apply_fenced(
        &self,
        changes: Vec<ReasonChange>,
        policy: Option<UnknownMacPolicy>,
        fence: &Fence,
    ) -> Result<Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        let req = WriteRequest { changes, policy, fence: Some(fence.clone()), reply };
        self.writes.send(req).await.map_err(|_| StoreError::Closed)?;
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

    fn epoch(&self) -> String {
        self.read().epoch.clone()
    }

    fn resume(&self, since: u64, epoch: &str) -> Option<Vec<RevisionDelta>> {
        self.read().resume(since, epoch)
    }

    fn entries(&self, macs: &[MacAddr]) -> (u64, Vec<(MacAddr, Entry)>) {
        self.read().entries(macs)
    }

    fn revision(&self) -> watch::Receiver<u64> {
        self.revision.clone()
    }

    fn amnesia(&self) -> Option<String> {
        let a = EtcdFilters::amnesia(self)?;
        let f = ironguard_proto::time::utc_fields(a.seen_at * 1000);
        let at = format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", f.year, f.month, f.day, f.hour, f.minute, f.second);
        Some(match a.reseeded_at_revision {
            0 => {
                format!("{} (seen {at}); re-seeding etcd from this replica's copy, writes refused meanwhile", a.detail)
            }
            r => format!("{} (seen {at}); etcd re-seeded from this replica's copy at revision {r}", a.detail),
        })
    }
}
