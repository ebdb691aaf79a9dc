//! The embedded filter state: tables of the control plane's redb database, written by one thread that commits every
//! waiting request in one durable transaction (group commit), so a burst of single-MAC updates costs one fsync
//! per batch, not per request. A request is acknowledged only after its transaction is committed: after
//! `kill -9` and restart the state and revision are at least what was last acknowledged.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use async_trait::async_trait;
use ironguard_dataplane::{MacAddr, UnknownMacPolicy};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, info_span};

use crate::filter::{Entry, FilterState, ReasonChange, RevisionDelta, WriteStamp, apply_changes};
use crate::store::mirror::Mirror;
use crate::store::{Applied, Backend, FilterStore, Snapshot, StoreError};

const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("revisions");
const REVISION: &str = "revision";
const POLICY: &str = "unknown_mac_policy";
/// The store's epoch ([`FilterStore::epoch`]): random, written when the database is created (or first opened by
/// a version that knows epochs), so a wiped data directory starts another epoch.
const EPOCH: &str = "epoch";
/// Requests committed together at most.
const MAX_GROUP: usize = 1024;

fn policy_code(p: UnknownMacPolicy) -> u64 {
    match p {
        UnknownMacPolicy::Allow => 1,
        UnknownMacPolicy::Deny => 2,
    }
}

fn policy_from(code: u64) -> UnknownMacPolicy {
    if code == 2 { UnknownMacPolicy::Deny } else { UnknownMacPolicy::Allow }
}

use crate::store::embedded as emb;

struct WriteRequest {
    changes: Vec<ReasonChange>,
    policy: Option<UnknownMacPolicy>,
    reply: oneshot::Sender<Result<Applied, StoreError>>,
}

/// The redb-backed store.
pub struct EmbeddedFilters {
    mirror: Arc<RwLock<Mirror>>,
    /// `None` once dropping: closing it stops the writer thread, which closes the database.
    writes: Option<mpsc::Sender<WriteRequest>>,
    writer: Option<std::thread::JoinHandle<()>>,
    revision: watch::Receiver<u64>,
}

impl Drop for EmbeddedFilters {
    fn drop(&mut self) {
        self.writes.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for EmbeddedFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedFilters").field("revision", &*self.revision.borrow()).finish()
    }
}

impl EmbeddedFilters {
    /// Loads the filter state from the control plane's database at `path`, keeping the last `log_len` revisions
    /// for catch-up, and starts the writer thread.
    pub fn open(db: Arc<Database>, path: &Path, log_len: usize) -> Result<Self, StoreError> {
        let open_err = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let started = Instant::now();
        {
            let w = db.begin_write().map_err(emb("begin a transaction"))?;
            w.open_table(ENTRIES).map_err(emb("open the entries table"))?;
            let mut meta = w.open_table(META).map_err(emb("open the meta table"))?;
            if meta.get(EPOCH).map_err(emb("read the epoch"))?.is_none() {
                use rand::Rng as _;
                let epoch = rand::rng().random_range(1..=u64::MAX);
                meta.insert(EPOCH, epoch).map_err(emb("write the epoch"))?;
            }
            drop(meta);
            w.open_table(LOG).map_err(emb("open the revision log"))?;
            w.commit().map_err(emb("commit"))?;
        }
        let mut state = FilterState::default();
        let mut log = Vec::new();
        let epoch;
        {
            let r = db.begin_read().map_err(emb("begin a read"))?;
            let entries = r.open_table(ENTRIES).map_err(emb("open the entries table"))?;
            for row in entries.iter().map_err(emb("read entries"))? {
                let (k, v) = row.map_err(emb("read an entry"))?;
                let mac: MacAddr = k
                    .value()
                    .parse()
                    .map_err(|e| StoreError::corrupt(Backend::Embedded, format!("entry key {:?}: {e}", k.value())))?;
                let entry: Entry = serde_json::from_slice(v.value())
                    .map_err(|e| StoreError::corrupt(Backend::Embedded, format!("entry for {mac}: {e}")))?;
                state.entries.insert(mac, entry);
            }
            let meta = r.open_table(META).map_err(emb("open the meta table"))?;
            state.revision = meta.get(REVISION).map_err(emb("read the revision"))?.map(|v| v.value()).unwrap_or(0);
            state.policy =
                meta.get(POLICY).map_err(emb("read the policy"))?.map(|v| policy_from(v.value())).unwrap_or_default();
            epoch = format!("{:016x}", meta.get(EPOCH).map_err(emb("read the epoch"))?.map(|v| v.value()).unwrap_or(0));
            let table = r.open_table(LOG).map_err(emb("open the revision log"))?;
            for row in table.iter().map_err(emb("read the revision log"))? {
                let (_, v) = row.map_err(emb("read a revision"))?;
                let d: RevisionDelta = serde_json::from_slice(v.value())
                    .map_err(|e| StoreError::corrupt(Backend::Embedded, format!("revision record: {e}")))?;
                log.push(d);
            }
        }
        info!(
            path = %path.display(),
            revision = state.revision,
            epoch,
            entries = state.entries.len(),
            logged_revisions = log.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded store opened"
        );
        let (rev_tx, rev_rx) = watch::channel(state.revision);
        let mirror = Mirror::new(state, epoch, log, log_len.max(1));
        let mirror = Arc::new(RwLock::new(mirror));
        let (tx, rx) = mpsc::channel(4096);
        let m = mirror.clone();
        let writer = std::thread::Builder::new()
            .name("ironguard-store".into())
            .spawn(move || writer(db, m, rx, rev_tx, log_len.max(1)))
            .map_err(|e| open_err(Box::new(e)))?;
        Ok(Self { mirror, writes: Some(tx), writer: Some(writer), revision: rev_rx })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Mirror> {
        self.mirror.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The single writer: takes every waiting request, computes each one's revision in order, commits them all in one
/// transaction, then publishes to the mirror and answers.
fn writer(
    db: Arc<Database>,
    mirror: Arc<RwLock<Mirror>>,
    mut rx: mpsc::Receiver<WriteRequest>,
    rev_tx: watch::Sender<u64>,
    log_len: usize,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        let span = info_span!("store_commit", requests = group.len());
        let _g = span.enter();
        let (revision0, policy0) = {
            let m = mirror.read().unwrap_or_else(|e| e.into_inner());
            (m.state.revision, m.state.policy)
        };
        // Overlay of entries changed by earlier requests of this group.
        let mut overlay: BTreeMap<MacAddr, Entry> = BTreeMap::new();
        let mut revision = revision0;
        let mut policy = policy0;
        let mut results = Vec::with_capacity(group.len());
        let mut records = Vec::new();
        {
            let m = mirror.read().unwrap_or_else(|e| e.into_inner());
            for req in &group {
                let get = |mac: &MacAddr| overlay.get(mac).cloned().or_else(|| m.state.entries.get(mac).cloned());
                let (updated, delta) = apply_changes(&get, &req.changes, WriteStamp::now(revision));
                overlay.extend(updated);
                // A fresh store (revision 0) records its first policy, so revisions start at 1.
                let new_policy = req.policy.filter(|p| revision == 0 || *p != policy);
                if delta.is_empty() && new_policy.is_none() {
                    results.push(Applied { revision, record: None });
                    continue;
                }
                revision += 1;
                if let Some(p) = new_policy {
                    policy = p;
                }
                let record = RevisionDelta { revision, delta, policy: new_policy };
                records.push(record.clone());
                results.push(Applied { revision, record: Some(record) });
            }
        }
        let committed = commit(&db, &overlay, &records, revision, policy, log_len);
        match committed {
            Ok(()) => {
                mirror.write().unwrap_or_else(|e| e.into_inner()).commit(overlay, records, revision, policy, log_len);
                if revision != revision0 {
                    rev_tx.send_replace(revision);
                }
                debug!(revision, "committed");
                for (req, res) in group.into_iter().zip(results) {
                    let _ = req.reply.send(Ok(res));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::error!(error = %msg, "store commit failed; the requests of this group are rejected");
                for req in group {
                    let _ = req.reply.send(Err(StoreError::Backend {
                        backend: Backend::Embedded,
                        op: "commit",
                        source: msg.clone().into(),
                    }));
                }
            }
        }
    }
}

fn commit(
    db: &Database,
    overlay: &BTreeMap<MacAddr, Entry>,
    records: &[RevisionDelta],
    revision: u64,
    policy: UnknownMacPolicy,
    log_len: usize,
) -> Result<(), StoreError> {
    // A change of reasons alone (a second allow reason, say) makes no revision but must survive a restart.
    if records.is_empty() && overlay.is_empty() {
        return Ok(());
    }
    let w = db.begin_write().map_err(emb("begin a transaction"))?;
    {
        let mut entries = w.open_table(ENTRIES).map_err(emb("open the entries table"))?;
        for (mac, e) in overlay {
            let key = mac.to_string();
            if e.is_empty() {
                entries.remove(key.as_str()).map_err(emb("delete an entry"))?;
            } else {
                let v = serde_json::to_vec(e).map_err(|e| StoreError::corrupt(Backend::Embedded, e.to_string()))?;
                entries.insert(key.as_str(), v.as_slice()).map_err(emb("write an entry"))?;
            }
        }
        let mut meta = w.open_table(META).map_err(emb("open the meta table"))?;
        meta.insert(REVISION, revision).map_err(emb("write the revision"))?;
        meta.insert(POLICY, policy_code(policy)).map_err(emb("write the policy"))?;
        let mut log = w.open_table(LOG).map_err(emb("open the revision log"))?;
        for r in records {
            let v = serde_json::to_vec(r).map_err(|e| StoreError::corrupt(Backend::Embedded, e.to_string()))?;
            log.insert(r.revision, v.as_slice()).map_err(emb("append to the revision log"))?;
        }
        let keep_from = revision.saturating_sub(log_len as u64 - 1);
        log.retain_in(..keep_from, |_, _| false).map_err(emb("trim the revision log"))?;
    }
    w.commit().map_err(emb("commit"))
}

#[async_trait]
impl FilterStore for EmbeddedFilters {
    async fn apply(&self, changes: Vec<ReasonChange>, policy: Option<UnknownMacPolicy>) -> Result<Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        let writes = self.writes.as_ref().ok_or(StoreError::Closed)?;
        writes.send(WriteRequest { changes, policy, reply }).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    fn snapshot(&self) -> Snapshot {
        self.read().snapshot()
    }

    fn counts(&self) -> crate::store::Counts {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::{Side, api_changes};

    fn tmp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ig-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    fn mac(n: u16) -> MacAddr {
        MacAddr::from_octets([0x52, 0x54, 0, 0, (n >> 8) as u8, n as u8]).unwrap()
    }

    /// The epoch is kept with the state, and a wiped data directory is another epoch even at the same revision:
    /// an agent of the old one is never resumed with deltas of the new one.
    #[tokio::test]
    async fn the_epoch_survives_reopening_and_a_wiped_store_is_another() {
        let dir = tmp("epoch");
        async fn write(s: &EmbeddedFilters, n: u16) -> u64 {
            s.apply(api_changes(&[mac(n).to_string()], &[], &[]).unwrap(), None).await.unwrap().revision
        }
        let first = {
            let s = crate::store::embedded::filters_in(&dir, 100);
            assert_eq!(write(&s, 1).await, 1);
            let e = s.epoch();
            assert_eq!(e.len(), 16, "{e:?}");
            assert_eq!(s.snapshot().epoch, e);
            assert_eq!(s.resume(0, &e).map(|d| d.len()), Some(1));
            assert!(s.resume(0, "").is_none(), "an agent that names no epoch gets a snapshot");
            assert!(s.resume(0, "0123456789abcdef").is_none(), "nor one of another epoch");
            e
        };
        let s = crate::store::embedded::filters_in(&dir, 100);
        assert_eq!(s.epoch(), first, "reopened: the same history");
        assert_eq!(s.resume(1, &first), Some(vec![]));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
        let s = crate::store::embedded::filters_in(&dir, 100);
        assert_eq!(write(&s, 2).await, 1, "a wiped store counts from 1 again");
        assert_ne!(s.epoch(), first);
        assert!(s.resume(1, &first).is_none(), "revision 1 of the old epoch is not revision 1 of this one");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn state_and_revisions_survive_reopening() {
        let dir = tmp("reopen");
        {
            let s = crate::store::embedded::filters_in(&dir, 100);
            let a =
                s.apply(api_changes(&[mac(1).to_string()], &[mac(2).to_string()], &[]).unwrap(), None).await.unwrap();
            assert_eq!(a.revision, 1);
            let a = s.apply(vec![], Some(UnknownMacPolicy::Allow)).await.unwrap();
            assert_eq!(a.revision, 2);
            let a = s.apply(vec![], Some(UnknownMacPolicy::Allow)).await.unwrap();
            assert_eq!((a.revision, a.record), (2, None), "the same policy again is no revision");
            // no-op: no new revision
            let a = s.apply(api_changes(&[mac(1).to_string()], &[], &[]).unwrap(), None).await.unwrap();
            assert_eq!((a.revision, a.record), (2, None));
        }
        let s = crate::store::embedded::filters_in(&dir, 100);
        let snap = s.snapshot();
        assert_eq!(snap.revision, 2);
        assert_eq!(snap.policy, UnknownMacPolicy::Allow);
        assert!(snap.allow.contains(&mac(1)) && snap.deny.contains(&mac(2)));
        let d = s.deltas_since(0).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].delta.allow_add, vec![mac(1)]);
        assert_eq!(d[1].policy, Some(UnknownMacPolicy::Allow));
        assert_eq!(s.deltas_since(2).unwrap(), vec![]);
        assert!(s.deltas_since(3).is_none(), "an agent ahead of the store needs a snapshot");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_log_is_bounded_and_old_agents_get_none() {
        let dir = tmp("bounded");
        let s = crate::store::embedded::filters_in(&dir, 10);
        for i in 0..25 {
            s.apply(api_changes(&[mac(i).to_string()], &[], &[]).unwrap(), None).await.unwrap();
        }
        assert!(s.deltas_since(10).is_none());
        assert_eq!(s.deltas_since(15).unwrap().len(), 10);
        drop(s);
        let s = crate::store::embedded::filters_in(&dir, 10);
        assert_eq!(s.deltas_since(15).unwrap().len(), 10, "the trimmed log is what was persisted");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn concurrent_writers_each_get_their_own_revision() {
        let dir = tmp("group");
        let s = Arc::new(crate::store::embedded::filters_in(&dir, 10_000));
        let mut tasks = vec![];
        for i in 0..500u16 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.apply(
                    vec![ReasonChange { mac: mac(i), side: Side::Allow, reason: "api".into(), present: true }],
                    None,
                )
                .await
                .unwrap()
                .revision
            }));
        }
        let mut revs = vec![];
        for t in tasks {
            revs.push(t.await.unwrap());
        }
        revs.sort();
        revs.dedup();
        assert_eq!(revs.len(), 500, "every request has its own revision");
        assert_eq!(*revs.last().unwrap(), 500);
        assert_eq!(s.snapshot().allow.len(), 500);
        assert_eq!(s.counts().allow, 500);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
