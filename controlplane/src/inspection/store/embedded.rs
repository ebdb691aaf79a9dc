//! The embedded (redb) inspection store: `inspections.redb` in the control plane's data directory.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::watch;

use super::{InspectionStore, InspectionStoreError, QueueEntry, backend, pick};
use crate::inspection::records::{Kind, NodeRecord, Request, Taken, now_ms};

const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const DATA: TableDefinition<&str, &[u8]> = TableDefinition::new("data");
const QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("queue");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The database file inside the data directory.
pub const FILE: &str = "inspections.redb";

/// Inspections in redb.
pub struct EmbeddedInspections {
    db: Arc<Database>,
    wake: watch::Sender<u64>,
}

impl std::fmt::Debug for EmbeddedInspections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedInspections").finish_non_exhaustive()
    }
}

fn corrupt(e: serde_json::Error) -> InspectionStoreError {
    InspectionStoreError::Corrupt(e.to_string())
}

impl EmbeddedInspections {
    pub fn open(dir: &Path) -> Result<Self, InspectionStoreError> {
        std::fs::create_dir_all(dir).map_err(backend("create the data directory"))?;
        let db = Database::builder()
            .set_cache_size(4 << 20)
            .create(dir.join(FILE))
            .map_err(backend("open inspections.redb"))?;
        let w = db.begin_write().map_err(backend("begin a transaction"))?;
        w.open_table(NODES).map_err(backend("open nodes"))?;
        w.open_table(DATA).map_err(backend("open data"))?;
        w.open_table(QUEUE).map_err(backend("open the queue"))?;
        w.open_table(META).map_err(backend("open meta"))?;
        w.commit().map_err(backend("commit"))?;
        Ok(Self { db: Arc::new(db), wake: watch::channel(0).0 })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, InspectionStoreError> + Send + 'static,
    ) -> Result<T, InspectionStoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(backend("run a store task"))?
    }

    fn wake(&self) {
        self.wake.send_modify(|v| *v += 1);
    }

    /// Reads and rewrites one queue entry in a write transaction. Lease bookkeeping (take, extend, release) need not
    /// survive a crash — a lost take only makes the request available sooner — so it skips the fsync; consuming
    /// does not.
    async fn update_entry(
        &self,
        id: u64,
        durable: bool,
        f: impl FnOnce(Option<QueueEntry>) -> Result<Option<QueueEntry>, InspectionStoreError> + Send + 'static,
    ) -> Result<(), InspectionStoreError> {
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
    async fn get(&self, node: &str) -> Result<Option<NodeRecord>, InspectionStoreError> {
        let node = node.to_string();
        self.blocking(move |db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(NODES).map_err(backend("open nodes"))?;
            match t.get(node.as_str()).map_err(backend("read a node"))? {
                Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(corrupt)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn list(&self) -> Result<Vec<NodeRecord>, InspectionStoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(NODES).map_err(backend("open nodes"))?;
            let mut out = Vec::new();
            for row in t.iter().map_err(backend("list nodes"))? {
                let (_, v) = row.map_err(backend("list nodes"))?;
                out.push(serde_json::from_slice(v.value()).map_err(corrupt)?);
            }
            Ok(out)
        })
        .await
    }

    async fn save(&self, rec: &mut NodeRecord) -> Result<(), InspectionStoreError> {
        let mut next = rec.clone();
        next.version = rec.version + 1;
        next.updated_at = now_ms();
        let expected = rec.version;
        let saved = next.clone();
        self.blocking(move |db| {
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            {
                let mut t = w.open_table(NODES).map_err(backend("open nodes"))?;
                let found = match t.get(next.uuid.as_str()).map_err(backend("read a node"))? {
                    Some(v) => serde_json::from_slice::<NodeRecord>(v.value()).map_err(corrupt)?.version,
                    None => 0,
                };
                if found != expected {
                    return Err(InspectionStoreError::Conflict { node: next.uuid.clone(), expected, found });
                }
                let v = serde_json::to_vec(&next).map_err(corrupt)?;
                t.insert(next.uuid.as_str(), v.as_slice()).map_err(backend("write a node"))?;
            }
            w.commit().map_err(backend("commit"))
        })
        .await?;
        *rec = saved;
        Ok(())
    }

    async fn remove(&self, node: &str) -> Result<(), InspectionStoreError> {
        let node = node.to_string();
        self.blocking(move |db| {
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
            w.commit().map_err(backend("commit"))
        })
        .await
    }

    async fn put_data(&self, node: &str, data: &serde_json::Value) -> Result<(), InspectionStoreError> {
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

    async fn get_data(&self, node: &str) -> Result<Option<serde_json::Value>, InspectionStoreError> {
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

    async fn enqueue(&self, node: &str, kind: Kind, args: serde_json::Value) -> Result<u64, InspectionStoreError> {
        let node = node.to_string();
        let id = self
            .blocking(move |db| {
                let w = db.begin_write().map_err(backend("begin a transaction"))?;
                let id;
                {
                    let mut meta = w.open_table(META).map_err(backend("open meta"))?;
                    id = meta.get("next_request").map_err(backend("read meta"))?.map(|v| v.value()).unwrap_or(1);
                    meta.insert("next_request", id + 1).map_err(backend("write meta"))?;
                    let e = QueueEntry {
                        request: Request { id, node, kind, args, enqueued_at: now_ms() },
                        worker: None,
                        lease_until: 0,
                        attempts: 0,
                        available_at: 0,
                    };
                    let v = serde_json::to_vec(&e).map_err(corrupt)?;
                    w.open_table(QUEUE)
                        .map_err(backend("open the queue"))?
                        .insert(id, v.as_slice())
                        .map_err(backend("enqueue"))?;
                }
                w.commit().map_err(backend("commit"))?;
                Ok(id)
            })
            .await?;
        self.wake();
        Ok(id)
    }

    async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, InspectionStoreError> {
        let worker = worker.to_string();
        self.blocking(move |db| {
            let mut w = db.begin_write().map_err(backend("begin a transaction"))?;
            w.set_durability(Durability::None).map_err(backend("set durability"))?;
            let taken;
            {
                let mut q = w.open_table(QUEUE).map_err(backend("open the queue"))?;
                let mut entries = Vec::new();
                for row in q.iter().map_err(backend("read the queue"))? {
                    let (_, v) = row.map_err(backend("read the queue"))?;
                    entries.push(serde_json::from_slice::<QueueEntry>(v.value()).map_err(corrupt)?);
                }
                let now = now_ms();
                let Some(i) = pick(&entries, now) else { return Ok(None) };
                let mut e = entries.swap_remove(i);
                e.worker = Some(worker.clone());
                e.lease_until = now + lease.as_millis() as u64;
                e.attempts += 1;
                let v = serde_json::to_vec(&e).map_err(corrupt)?;
                q.insert(e.request.id, v.as_slice()).map_err(backend("take a request"))?;
                taken = Taken { request: e.request, attempt: e.attempts, worker, lease_until: e.lease_until };
            }
            w.commit().map_err(backend("commit"))?;
            Ok(Some(taken))
        })
        .await
    }

    async fn extend(&self, taken: &Taken, lease: Duration) -> Result<(), InspectionStoreError> {
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

    async fn consume(&self, taken: &Taken) -> Result<(), InspectionStoreError> {
        self.update_entry(taken.request.id, true, |_| Ok(None)).await?;
        self.wake();
        Ok(())
    }

    async fn release(&self, taken: &Taken, delay: Duration) -> Result<(), InspectionStoreError> {
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

    async fn pending(&self) -> Result<Vec<Request>, InspectionStoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let q = r.open_table(QUEUE).map_err(backend("open the queue"))?;
            let mut out = Vec::new();
            for row in q.iter().map_err(backend("read the queue"))? {
                let (_, v) = row.map_err(backend("read the queue"))?;
                out.push(serde_json::from_slice::<QueueEntry>(v.value()).map_err(corrupt)?.request);
            }
            Ok(out)
        })
        .await
    }

    fn wakeups(&self) -> watch::Receiver<u64> {
        self.wake.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ig-insp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[tokio::test]
    async fn at_least_once_across_reopen() {
        let d = dir("alo");
        {
            let s = EmbeddedInspections::open(&d).unwrap();
            let id = s.enqueue("n1", Kind::Start, serde_json::json!({"manage_boot": true})).await.unwrap();
            let t = s.take("w1", Duration::from_millis(200)).await.unwrap().unwrap();
            assert_eq!((t.request.id, t.attempt), (id, 1));
            assert!(s.take("w2", Duration::from_secs(1)).await.unwrap().is_none(), "in flight");
            // the worker "dies": the store is dropped without consuming
        }
        let s = EmbeddedInspections::open(&d).unwrap();
        assert!(s.take("w3", Duration::from_secs(1)).await.unwrap().is_none(), "lease not over yet");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = s.take("w3", Duration::from_secs(1)).await.unwrap().expect("delivered again after the lease");
        assert_eq!(t.attempt, 2);
        s.consume(&t).await.unwrap();
        assert!(s.pending().await.unwrap().is_empty());
        // records: compare-and-swap
        let mut r = NodeRecord::new("n1");
        s.save(&mut r).await.unwrap();
        assert_eq!(r.version, 1);
        let mut stale = r.clone();
        s.save(&mut r).await.unwrap();
        stale.version = 1;
        assert!(matches!(s.save(&mut stale).await, Err(InspectionStoreError::Conflict { .. })));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
