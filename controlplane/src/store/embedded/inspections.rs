//! The embedded (redb) inspection store: node records, data and the work queue, in the control plane's database
//! (shared with the filter state and the rules).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use ironguard_inspection::lookup::{self, Attributes};
use ironguard_inspection::records::{Kind, NodeRecord, Request, Taken};
use ironguard_proto::time::now_ms;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::Notify;
use tracing::error;

use crate::store::inspections::{InspectionStore, LookupIndex, Quarantined, QueueEntry, node_named_in, pick};
use crate::store::{Backend, StoreError, embedded as backend};

pub(super) const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("inspection_nodes");
pub(super) const DATA: TableDefinition<&str, &[u8]> = TableDefinition::new("inspection_data");
pub(super) const QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("inspection_queue");
/// The arguments of each queued request (a ramdisk's data can be megabytes), apart from its entry in [`QUEUE`], so
/// that picking the next request reads the small entries only. An entry written before this table existed keeps
/// its arguments inline.
pub(super) const QUEUE_ARGS: TableDefinition<u64, &[u8]> = TableDefinition::new("inspection_queue_args");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("inspection_meta");
/// Queue entries that could not be read, moved aside by a take ([`Quarantined`] as JSON, by request id).
pub(super) const QUARANTINE: TableDefinition<u64, &[u8]> = TableDefinition::new("inspection_quarantine");

/// Inspections in redb.
///
/// Every node record is also held in memory ([`Records`]): this process is the database's only writer, so the copy
/// is exact, and `/v1/continue`'s lookup reads it instead of decoding every record from disk for each callback.
pub struct EmbeddedInspections {
    db: Arc<Database>,
    wake: Arc<Notify>,
    records: Arc<Records>,
    enqueues: Arc<Enqueues>,
}

/// Requests waiting to be enqueued. Callbacks arrive together (a rack of ramdisks posting at once): whoever finds
/// no committer running becomes it and writes every waiting request in one transaction — one commit, one fsync —
/// then the requests that came meanwhile, until none is left. Each caller gets its id once its request is durable.
#[derive(Default)]
struct Enqueues {
    waiting: Mutex<Vec<Waiting>>,
    committing: std::sync::atomic::AtomicBool,
}

struct Waiting {
    node: String,
    kind: Kind,
    args: serde_json::Value,
    done: tokio::sync::oneshot::Sender<Result<u64, StoreError>>,
}

impl Enqueues {
    fn take(&self) -> Vec<Waiting> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Commits batches until none is waiting (run on a blocking thread by the one committer).
    fn commit_all(&self, db: &Database) {
        use std::sync::atomic::Ordering;
        // Should this thread unwind, the next enqueue becomes the committer (its batch's callers get `Closed`).
        struct Unwinding<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(false, Ordering::Release);
                }
            }
        }
        let _unwinding = Unwinding(&self.committing);
        loop {
            let batch = self.take();
            if batch.is_empty() {
                self.committing.store(false, Ordering::Release);
                // A request pushed after the take but before the flag dropped: commit it unless another took over.
                let more = !self.waiting.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
                if more && !self.committing.swap(true, Ordering::AcqRel) {
                    continue;
                }
                return;
            }
            match write_batch(db, &batch) {
                Ok(first) => {
                    for (i, w) in batch.into_iter().enumerate() {
                        let _ = w.done.send(Ok(first + i as u64));
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    for w in batch {
                        let _ = w.done.send(Err(StoreError::Backend {
                            backend: Backend::Embedded,
                            op: "enqueue",
                            source: msg.clone().into(),
                        }));
                    }
                }
            }
        }
    }
}

/// Writes `batch` in one transaction, with consecutive ids; returns the first.
fn write_batch(db: &Database, batch: &[Waiting]) -> Result<u64, StoreError> {
    let w = db.begin_write().map_err(backend("begin a transaction"))?;
    let first;
    {
        let mut meta = w.open_table(META).map_err(backend("open meta"))?;
        first = meta.get("next_request").map_err(backend("read meta"))?.map(|v| v.value()).unwrap_or(1);
        meta.insert("next_request", first + batch.len() as u64).map_err(backend("write meta"))?;
        let mut queue = w.open_table(QUEUE).map_err(backend("open the queue"))?;
        let mut args = w.open_table(QUEUE_ARGS).map_err(backend("open the queue"))?;
        for (i, item) in batch.iter().enumerate() {
            let id = first + i as u64;
            let e = QueueEntry {
                request: Request {
                    id,
                    node: item.node.clone(),
                    kind: item.kind,
                    args: serde_json::Value::Null,
                    enqueued_at: now_ms(),
                },
                worker: None,
                lease_until: 0,
                attempts: 0,
                available_at: 0,
            };
            let v = serde_json::to_vec(&e).map_err(corrupt)?;
            queue.insert(id, v.as_slice()).map_err(backend("enqueue"))?;
            let a = serde_json::to_vec(&item.args).map_err(corrupt)?;
            args.insert(id, a.as_slice()).map_err(backend("enqueue"))?;
        }
    }
    w.commit().map_err(backend("commit"))?;
    Ok(first)
}

/// The node records as committed, with their lookup index. A writer holds `write` from its transaction's start to
/// the update of `map`, so the map changes in commit order; readers only take `map`, briefly.
#[derive(Default)]
struct Records {
    write: Mutex<()>,
    map: RwLock<Indexed>,
}

/// The records by UUID and by lookup key, changed together.
#[derive(Default)]
struct Indexed {
    nodes: BTreeMap<String, NodeRecord>,
    index: LookupIndex,
}

impl Indexed {
    fn insert(&mut self, r: NodeRecord) {
        if let Some(old) = self.nodes.get(&r.uuid) {
            self.index.remove(old);
        }
        self.index.insert(&r);
        self.nodes.insert(r.uuid.clone(), r);
    }

    fn remove(&mut self, node: &str) {
        if let Some(old) = self.nodes.remove(node) {
            self.index.remove(&old);
        }
    }
}

impl Records {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Indexed> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Indexed> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for EmbeddedInspections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedInspections").finish_non_exhaustive()
    }
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::corrupt(Backend::Embedded, e.to_string())
}

impl EmbeddedInspections {
    /// Creates the tables in the control plane's database if they are not there yet.
    pub fn open(db: Arc<Database>) -> Result<Self, StoreError> {
        let w = db.begin_write().map_err(backend("begin a transaction"))?;
        w.open_table(NODES).map_err(backend("open nodes"))?;
        w.open_table(DATA).map_err(backend("open data"))?;
        w.open_table(QUEUE).map_err(backend("open the queue"))?;
        w.open_table(QUEUE_ARGS).map_err(backend("open the queue"))?;
        w.open_table(META).map_err(backend("open meta"))?;
        w.open_table(QUARANTINE).map_err(backend("open the quarantine"))?;
        w.commit().map_err(backend("commit"))?;
        let records = Arc::new(Records::default());
        {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(NODES).map_err(backend("open nodes"))?;
            let mut map = records.write();
            for row in t.iter().map_err(backend("list nodes"))? {
                let (k, v) = row.map_err(backend("list nodes"))?;
                let rec: NodeRecord = serde_json::from_slice(v.value()).map_err(corrupt)?;
                if rec.uuid != k.value() {
                    return Err(StoreError::corrupt(
                        Backend::Embedded,
                        format!("the record under {:?} is node {:?}", k.value(), rec.uuid),
                    ));
                }
                map.insert(rec);
            }
        }
        Ok(Self { db, wake: Arc::new(Notify::new()), records, enqueues: Arc::default() })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(backend("run a store task"))?
    }

    fn wake(&self) {
        self.wake.notify_one();
    }

    /// Reads and rewrites one queue entry in a write transaction. Lease bookkeeping (take, extend, release) need not
    /// survive a crash — a lost take only makes the request available sooner — so it skips the fsync; consuming
    /// does not.
    async fn update_entry(
        &self,
        id: u64,
        durable: bool,
        f: impl FnOnce(Option<QueueEntry>) -> Result<Option<QueueEntry>, StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        self.blocking(move |db| {
            let mut w = db.begin_write().map_err(backend("begin a transaction"))?;
            if !durable {
                w.set_durability(Durability::None).map_err(backend("set durability"))?;
            }
            {
                let mut q = w.open_table(QUEUE).map_err(backend("open the queue"))?;
                let cur = match q.get(id).map_err(backend("read the queue"))? {
                    Some(v) => Some(serde_json::from_slice::<QueueEntry>(v.value()).map_err(corrupt)?),
                    None => None,
                };
                match f(cur)? {
                    Some(e) => {
                        let v = serde_json::to_vec(&e).map_err(corrupt)?;
                        q.insert(id, v.as_slice()).map_err(backend("write the queue"))?;
                    }
                    None => {
                        q.remove(id).map_err(backend("write the queue"))?;
                        w.open_table(QUEUE_ARGS)
                            .map_err(backend("open the queue"))?
                            .remove(id)
                            .map_err(backend("write the queue"))?;
                    }
                }
            }
            w.commit().map_err(backend("commit"))
        })
        .await
    }
}

#[async_trait]
impl InspectionStore for EmbeddedInspections {
    async fn get(&self, node: &str) -> Result<Option<NodeRecord>, StoreError> {
        Ok(self.records.read().nodes.get(node).cloned())
    }

    async fn list(&self) -> Result<Vec<NodeRecord>, StoreError> {
        Ok(self.records.read().nodes.values().cloned().collect())
    }

    async fn lookup_candidates(&self, attrs: &Attributes) -> Result<Vec<NodeRecord>, StoreError> {
        let bmcs = attrs.normalised_bmcs();
        let m = self.records.read();
        let found = m.index.nodes(attrs, &bmcs).into_iter().filter_map(|u| m.nodes.get(&u));
        Ok(found.filter(|r| lookup::score(attrs, &bmcs, r) > 0).cloned().collect())
    }

    async fn save(&self, rec: &mut NodeRecord) -> Result<(), StoreError> {
        let mut next = rec.clone();
        next.version = rec.version + 1;
        next.updated_at = now_ms();
        let expected = rec.version;
        let saved = next.clone();
        let records = self.records.clone();
        self.blocking(move |db| {
            let _writer = records.write.lock().unwrap_or_else(|e| e.into_inner());
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            {
                let mut t = w.open_table(NODES).map_err(backend("open nodes"))?;
                let found = match t.get(next.uuid.as_str()).map_err(backend("read a node"))? {
                    Some(v) => serde_json::from_slice::<NodeRecord>(v.value()).map_err(corrupt)?.version,
                    None => 0,
                };
                if found != expected {
                    return Err(StoreError::Conflict { node: next.uuid.clone(), expected, found });
                }
                let v = serde_json::to_vec(&next).map_err(corrupt)?;
                t.insert(next.uuid.as_str(), v.as_slice()).map_err(backend("write a node"))?;
            }
            w.commit().map_err(backend("commit"))?;
            records.write().insert(next);
            Ok(())
        })
        .await?;
        *rec = saved;
        Ok(())
    }

    async fn remove(&self, node: &str) -> Result<(), StoreError> {
        let node = node.to_string();
        let records = self.records.clone();
        self.blocking(move |db| {
            let _writer = records.write.lock().unwrap_or_else(|e| e.into_inner());
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            {
                w.open_table(NODES)
                    .map_err(backend("open nodes"))?
                    .remove(node.as_str())
                    .map_err(backend("remove a node"))?;
                w.open_table(DATA)
                    .map_err(backend("open data"))?
                    .remove(node.as_str())
                    .map_err(backend("remove data"))?;
            }
            w.commit().map_err(backend("commit"))?;
            records.write().remove(&node);
            Ok(())
        })
        .await
    }

    async fn put_data(&self, node: &str, data: &serde_json::Value) -> Result<(), StoreError> {
        let node = node.to_string();
        let v = serde_json::to_vec(data).map_err(corrupt)?;
        self.blocking(move |db| {
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            w.open_table(DATA)
                .map_err(backend("open data"))?
                .insert(node.as_str(), v.as_slice())
                .map_err(backend("write data"))?;
            w.commit().map_err(backend("commit"))
        })
        .await
    }

    async fn get_data(&self, node: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let node = node.to_string();
        self.blocking(move |db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(DATA).map_err(backend("open data"))?;
            match t.get(node.as_str()).map_err(backend("read data"))? {
                Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(corrupt)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn enqueue(&self, node: &str, kind: Kind, args: serde_json::Value) -> Result<u64, StoreError> {
        use std::sync::atomic::Ordering;
        let (done, result) = tokio::sync::oneshot::channel();
        self.enqueues.waiting.lock().unwrap_or_else(|e| e.into_inner()).push(Waiting {
            node: node.to_string(),
            kind,
            args,
            done,
        });
        if !self.enqueues.committing.swap(true, Ordering::AcqRel) {
            let (db, enqueues) = (self.db.clone(), self.enqueues.clone());
            tokio::task::spawn_blocking(move || enqueues.commit_all(&db));
        }
        let id = result.await.map_err(|_| StoreError::Closed)??;
        self.wake();
        Ok(id)
    }

    async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, StoreError> {
        let worker = worker.to_string();
        self.blocking(move |db| {
            let mut w = db.begin_write().map_err(backend("begin a transaction"))?;
            w.set_durability(Durability::None).map_err(backend("set durability"))?;
            let mut quarantined = 0;
            let taken;
            {
                let mut q = w.open_table(QUEUE).map_err(backend("open the queue"))?;
                let mut entries = Vec::new();
                let mut bad: Vec<(u64, Vec<u8>, String)> = Vec::new();
                for row in q.iter().map_err(backend("read the queue"))? {
                    let (k, v) = row.map_err(backend("read the queue"))?;
                    match serde_json::from_slice::<QueueEntry>(v.value()) {
                        Ok(e) => entries.push(e),
                        Err(e) => bad.push((k.value(), v.value().to_vec(), e.to_string())),
                    }
                }
                // An entry that cannot be read goes to quarantine, in this transaction; the queue goes on.
                if !bad.is_empty() {
                    let mut quarantine = w.open_table(QUARANTINE).map_err(backend("open the quarantine"))?;
                    for (id, raw, why) in &bad {
                        let rec = Quarantined {
                            id: *id,
                            node: node_named_in(raw),
                            key: format!("inspection_queue/{id}"),
                            error: why.clone(),
                            raw: String::from_utf8_lossy(raw).into_owned(),
                            quarantined_at: now_ms(),
                        };
                        let v = serde_json::to_vec(&rec).map_err(corrupt)?;
                        quarantine.insert(*id, v.as_slice()).map_err(backend("quarantine a request"))?;
                        q.remove(*id).map_err(backend("quarantine a request"))?;
                        error!(
                            entry = %rec.key,
                            node = %rec.node,
                            error = %why,
                            "a queued request cannot be read: moved to quarantine (the inspection_quarantine table), \
                             the rest of the queue goes on. `ironguardctl inspect quarantine` lists it; start the \
                             node's inspection again if it still needs one, then `ironguardctl inspect quarantine \
                             --drop {id}`"
                        );
                    }
                    quarantined = bad.len();
                }
                let now = now_ms();
                let Some(i) = pick(&entries, now) else {
                    drop(q);
                    if quarantined > 0 {
                        w.set_durability(Durability::Immediate).map_err(backend("set durability"))?;
                        w.commit().map_err(backend("commit"))?;
                    }
                    return Ok(None);
                };
                let mut e = entries.swap_remove(i);
                e.worker = Some(worker.clone());
                e.lease_until = now + lease.as_millis() as u64;
                e.attempts += 1;
                let v = serde_json::to_vec(&e).map_err(corrupt)?;
                q.insert(e.request.id, v.as_slice()).map_err(backend("take a request"))?;
                let mut request = e.request;
                if let Some(a) = w
                    .open_table(QUEUE_ARGS)
                    .map_err(backend("open the queue"))?
                    .get(request.id)
                    .map_err(backend("read the queue"))?
                {
                    request.args = serde_json::from_slice(a.value()).map_err(corrupt)?;
                }
                taken = Taken { request, attempt: e.attempts, worker, lease_until: e.lease_until };
            }
            if quarantined > 0 {
                w.set_durability(Durability::Immediate).map_err(backend("set durability"))?;
            }
            w.commit().map_err(backend("commit"))?;
            Ok(Some(taken))
        })
        .await
    }

    async fn extend(&self, taken: &Taken, lease: Duration) -> Result<(), StoreError> {
        let worker = taken.worker.clone();
        self.update_entry(taken.request.id, false, move |e| {
            Ok(e.map(|mut e| {
                if e.worker.as_deref() == Some(worker.as_str()) {
                    e.lease_until = now_ms() + lease.as_millis() as u64;
                }
                e
            }))
        })
        .await
    }

    async fn consume(&self, taken: &Taken) -> Result<(), StoreError> {
        self.update_entry(taken.request.id, true, |_| Ok(None)).await?;
        self.wake();
        Ok(())
    }

    async fn release(&self, taken: &Taken, delay: Duration) -> Result<(), StoreError> {
        self.update_entry(taken.request.id, false, move |e| {
            Ok(e.map(|mut e| {
                e.worker = None;
                e.lease_until = 0;
                e.available_at = now_ms() + delay.as_millis() as u64;
                e
            }))
        })
        .await?;
        self.wake();
        Ok(())
    }

    async fn pending(&self) -> Result<Vec<Request>, StoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let q = r.open_table(QUEUE).map_err(backend("open the queue"))?;
            let args = r.open_table(QUEUE_ARGS).map_err(backend("open the queue"))?;
            let mut out = Vec::new();
            for row in q.iter().map_err(backend("read the queue"))? {
                let (k, v) = row.map_err(backend("read the queue"))?;
                let Ok(entry) = serde_json::from_slice::<QueueEntry>(v.value()) else {
                    tracing::warn!(id = k.value(), "a queued request cannot be read; left out of the pending list");
                    continue;
                };
                let mut request = entry.request;
                if let Some(a) = args.get(request.id).map_err(backend("read the queue"))? {
                    request.args = serde_json::from_slice(a.value()).map_err(corrupt)?;
                }
                out.push(request);
            }
            Ok(out)
        })
        .await
    }

    async fn quarantined(&self) -> Result<Vec<Quarantined>, StoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(QUARANTINE).map_err(backend("open the quarantine"))?;
            let mut out = Vec::new();
            for row in t.iter().map_err(backend("read the quarantine"))? {
                let (k, v) = row.map_err(backend("read the quarantine"))?;
                let mut rec = serde_json::from_slice(v.value()).unwrap_or_else(|e| Quarantined {
                    id: 0,
                    node: String::new(),
                    key: format!("inspection_quarantine/{}", k.value()),
                    error: format!("the quarantine record itself cannot be read: {e}"),
                    raw: String::from_utf8_lossy(v.value()).into_owned(),
                    quarantined_at: 0,
                });
                rec.id = k.value();
                out.push(rec);
            }
            Ok(out)
        })
        .await
    }

    async fn quarantine_count(&self) -> Result<u64, StoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            r.open_table(QUARANTINE)
                .map_err(backend("open the quarantine"))?
                .len()
                .map_err(backend("count the quarantine"))
        })
        .await
    }

    async fn drop_quarantined(&self, id: u64) -> Result<bool, StoreError> {
        self.blocking(move |db| {
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            let dropped = w
                .open_table(QUARANTINE)
                .map_err(backend("open the quarantine"))?
                .remove(id)
                .map_err(backend("drop a quarantined request"))?
                .is_some();
            w.commit().map_err(backend("commit"))?;
            Ok(dropped)
        })
        .await
    }

    fn wakeups(&self) -> Arc<Notify> {
        self.wake.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironguard_dataplane::MacAddr;

    fn dir(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ig-insp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// Opens the store in `d`. A blocking commit task of a store just dropped may still hold the database for a
    /// moment after its callers got their answers (a restart is a new process; here it is the same one): wait.
    fn open(d: &std::path::Path) -> EmbeddedInspections {
        for _ in 0..200 {
            match Database::create(d.join("t.redb")) {
                Ok(db) => return EmbeddedInspections::open(Arc::new(db)).unwrap(),
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) => panic!("cannot open the test database: {e}"),
            }
        }
        panic!("the test database stayed open for 2 s after its store was dropped")
    }

    /// A request's arguments travel apart from its queue entry and come back whole when it is taken; an entry
    /// written with inline arguments (before the arguments had their own table) is still delivered with them.
    #[tokio::test]
    async fn arguments_are_kept_apart_and_delivered_whole() {
        let d = dir("args");
        let s = open(&d);
        let data = serde_json::json!({"data": {"inventory": {"interfaces": [{"mac_address": "52:54:00:12:34:56"}]}}});
        let id = s.enqueue("n1", Kind::Process, data.clone()).await.unwrap();
        {
            let r = s.db.begin_read().unwrap();
            let q = r.open_table(QUEUE).unwrap();
            let e: QueueEntry = serde_json::from_slice(q.get(id).unwrap().unwrap().value()).unwrap();
            assert!(e.request.args.is_null(), "the entry holds no arguments");
        }
        assert_eq!(s.pending().await.unwrap()[0].args, data);
        let t = s.take("w1", Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!(t.request.args, data);
        s.consume(&t).await.unwrap();
        {
            let r = s.db.begin_read().unwrap();
            assert!(r.open_table(QUEUE_ARGS).unwrap().get(id).unwrap().is_none(), "consumed with its arguments");
        }
        // An old entry, arguments inline.
        let old = QueueEntry {
            request: Request { id: 99, node: "n2".into(), kind: Kind::Start, args: data.clone(), enqueued_at: 1 },
            worker: None,
            lease_until: 0,
            attempts: 0,
            available_at: 0,
        };
        let w = s.db.begin_write().unwrap();
        w.open_table(QUEUE).unwrap().insert(99, serde_json::to_vec(&old).unwrap().as_slice()).unwrap();
        w.commit().unwrap();
        let t = s.take("w1", Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!((t.request.id, &t.request.args), (99, &data));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// An entry that cannot be read is moved to the quarantine table by the next take, which hands out the next
    /// request instead of failing; `pending` leaves it out; `quarantined` lists it.
    #[tokio::test]
    async fn a_corrupt_entry_is_quarantined_and_the_queue_goes_on() {
        let d = dir("quarantine");
        let s = Arc::new(open(&d));
        let metrics = crate::metrics::Metrics::new();
        let gauges = crate::metrics::StoreGauges::new(s.clone(), &metrics);
        let gauge = || metrics.inspection_quarantined.get();
        let a = s.enqueue("n1", Kind::Start, serde_json::Value::Null).await.unwrap();
        let b = s.enqueue("n2", Kind::Start, serde_json::Value::Null).await.unwrap();
        let w = s.db.begin_write().unwrap();
        w.open_table(QUEUE).unwrap().insert(a, b"{not json".as_slice()).unwrap();
        w.commit().unwrap();
        assert_eq!(s.pending().await.unwrap().iter().map(|r| r.id).collect::<Vec<_>>(), [b]);
        let t = s.take("w1", Duration::from_secs(5)).await.unwrap().expect("the rest of the queue goes on");
        assert_eq!(t.request.id, b);
        let q = s.quarantined().await.unwrap();
        assert_eq!(q.len(), 1, "{q:?}");
        assert_eq!((q[0].key.as_str(), q[0].raw.as_str()), (format!("inspection_queue/{a}").as_str(), "{not json"));
        assert_eq!((q[0].id, q[0].node.as_str()), (a, ""), "named by its id; its node cannot be read");
        assert_eq!(s.quarantine_count().await.unwrap(), 1);
        assert_eq!(gauge(), -1, "not read yet");
        gauges.refresh().await;
        assert_eq!(gauge(), 1, "what /metrics exports");
        s.consume(&t).await.unwrap();
        assert!(s.take("w1", Duration::from_secs(5)).await.unwrap().is_none());
        assert!(s.pending().await.unwrap().is_empty());
        // Dropped once read: gone, and a second drop finds nothing.
        assert!(s.drop_quarantined(a).await.unwrap());
        assert!(!s.drop_quarantined(a).await.unwrap());
        assert!(s.quarantined().await.unwrap().is_empty());
        assert_eq!(s.quarantine_count().await.unwrap(), 0);
        gauges.invalidate().await;
        gauges.refresh().await;
        assert_eq!(gauge(), 0);
        drop((gauges, s));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The records in memory are the records on disk: after saves, a conflict and a removal, and after reopening;
    /// the lookup's candidates are exactly the records the lookup scores.
    #[tokio::test]
    async fn records_in_memory_follow_every_commit() {
        let d = dir("cache");
        let (m1, m2): (MacAddr, MacAddr) = ("52:54:00:00:00:01".parse().unwrap(), "52:54:00:00:00:02".parse().unwrap());
        let m3: MacAddr = "52:54:00:00:00:03".parse().unwrap();
        {
            let s = open(&d);
            let mut a = NodeRecord::new("a", now_ms());
            a.macs = vec![m1];
            a.bmc_addresses = vec!["10.0.0.1".into()];
            s.save(&mut a).await.unwrap();
            let mut b = NodeRecord::new("b", now_ms());
            b.macs = vec![m2];
            s.save(&mut b).await.unwrap();
            let mut stale = b.clone();
            s.save(&mut b).await.unwrap();
            assert!(s.save(&mut stale).await.is_err(), "conflict");
            assert_eq!(s.get("b").await.unwrap().unwrap().version, 2, "the failed save left memory alone");
            let mut c = NodeRecord::new("c", now_ms());
            s.save(&mut c).await.unwrap();
            s.remove("c").await.unwrap();
            assert!(s.get("c").await.unwrap().is_none());
            let attrs = |macs: Vec<MacAddr>, bmcs: Vec<&str>| Attributes {
                macs,
                bmc_addresses: bmcs.into_iter().map(String::from).collect(),
                node_uuid: None,
            };
            let uuids = |v: Vec<NodeRecord>| v.into_iter().map(|r| r.uuid).collect::<Vec<_>>();
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![m2], vec![])).await.unwrap()), ["b"]);
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![], vec!["10.0.0.1"])).await.unwrap()), ["a"]);
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![m1, m2], vec![])).await.unwrap()), ["a", "b"]);
            assert!(s.lookup_candidates(&attrs(vec![], vec!["10.9.9.9"])).await.unwrap().is_empty());
            // a record saved with other keys is found by the new ones only; a conflicting save changed nothing
            let mut b2 = s.get("b").await.unwrap().unwrap();
            b2.macs = vec![m3];
            b2.bmc_addresses = vec!["https://[fd00::9]:443/redfish".into()];
            let mut stale = b2.clone();
            stale.version = 0;
            stale.macs = vec![m1];
            assert!(s.save(&mut stale).await.is_err());
            s.save(&mut b2).await.unwrap();
            assert!(s.lookup_candidates(&attrs(vec![m2], vec![])).await.unwrap().is_empty(), "the old MAC is gone");
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![m1], vec![])).await.unwrap()), ["a"]);
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![m3], vec![])).await.unwrap()), ["b"]);
            assert_eq!(uuids(s.lookup_candidates(&attrs(vec![], vec!["fd00::9"])).await.unwrap()), ["b"]);
            // a named node is a candidate whatever it shares; a name of no record is none
            let named = Attributes { node_uuid: Some("a".into()), ..Default::default() };
            assert_eq!(uuids(s.lookup_candidates(&named).await.unwrap()), ["a"]);
            let ghost = Attributes { node_uuid: Some("c".into()), macs: vec![m3], ..Default::default() };
            assert!(s.lookup_candidates(&ghost).await.unwrap().is_empty(), "c was removed; b is not c");
        }
        let s = open(&d);
        let r = s.list().await.unwrap();
        assert_eq!(r.iter().map(|r| (r.uuid.as_str(), r.version)).collect::<Vec<_>>(), [("a", 1), ("b", 3)]);
        // the index is rebuilt from the records on disk
        let uuids = |v: Vec<NodeRecord>| v.into_iter().map(|r| r.uuid).collect::<Vec<_>>();
        let by_mac = |m| Attributes { macs: vec![m], ..Default::default() };
        assert_eq!(uuids(s.lookup_candidates(&by_mac(m3)).await.unwrap()), ["b"]);
        assert_eq!(uuids(s.lookup_candidates(&by_mac(m1)).await.unwrap()), ["a"]);
        assert!(s.lookup_candidates(&by_mac(m2)).await.unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Requests enqueued at the same moment each get their own id, all distinct and consecutive, each durable
    /// (there after reopening) with its own arguments.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_enqueues_share_commits_and_keep_their_own_ids() {
        let d = dir("batch");
        {
            let s = Arc::new(open(&d));
            let mut tasks = Vec::new();
            for i in 0..200u64 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let id = s.enqueue(&format!("n{i}"), Kind::Process, serde_json::json!({"i": i})).await.unwrap();
                    (i, id)
                }));
            }
            let mut ids = Vec::new();
            for t in tasks {
                ids.push(t.await.unwrap());
            }
            let mut sorted: Vec<u64> = ids.iter().map(|(_, id)| *id).collect();
            sorted.sort_unstable();
            assert_eq!(sorted, (1..=200).collect::<Vec<_>>(), "distinct and consecutive");
        }
        let s = open(&d);
        let pending = s.pending().await.unwrap();
        assert_eq!(pending.len(), 200);
        for r in &pending {
            assert_eq!(r.node, format!("n{}", r.args["i"]), "each request keeps its own arguments");
        }
        assert_eq!(s.enqueue("m", Kind::Start, serde_json::Value::Null).await.unwrap(), 201, "ids go on");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn at_least_once_across_reopen() {
        let d = dir("alo");
        let lease = Duration::from_secs(2);
        let (taken, took) = {
            let s = open(&d);
            let id = s.enqueue("n1", Kind::Start, serde_json::json!({"manage_boot": true})).await.unwrap();
            let taken = std::time::Instant::now();
            let t = s.take("w1", lease).await.unwrap().unwrap();
            let took = std::time::Instant::now();
            assert_eq!((t.request.id, t.attempt), (id, 1));
            assert!(s.take("w2", Duration::from_secs(1)).await.unwrap().is_none(), "in flight");
            // the worker "dies": the store is dropped without consuming
            (taken, took)
        };
        let s = open(&d);
        let again = s.take("w3", Duration::from_secs(1)).await.unwrap();
        // The lease began after `taken`: a take that returned before `taken + lease` came within it. (A machine
        // so busy that reopening took the whole lease cannot judge this part; the redelivery below still holds.)
        if std::time::Instant::now() < taken + lease {
            assert!(again.is_none(), "lease not over yet");
        }
        tokio::time::sleep(
            (took + lease + Duration::from_millis(100)).saturating_duration_since(std::time::Instant::now()),
        )
        .await;
        let t = match again {
            Some(t) => t,
            None => s.take("w3", Duration::from_secs(1)).await.unwrap().expect("delivered again after the lease"),
        };
        assert_eq!(t.attempt, 2);
        s.consume(&t).await.unwrap();
        assert!(s.pending().await.unwrap().is_empty());
        // records: compare-and-swap
        let mut r = NodeRecord::new("n1", now_ms());
        s.save(&mut r).await.unwrap();
        assert_eq!(r.version, 1);
        let mut stale = r.clone();
        s.save(&mut r).await.unwrap();
        stale.version = 1;
        assert!(matches!(s.save(&mut stale).await, Err(StoreError::Conflict { .. })));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
