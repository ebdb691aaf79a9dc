//! The etcd inspection store, shared by control-plane replicas.
//!
//! ```text
//! <prefix>/inspect/nodes/<uuid>     node record (compare-and-swap on its modification revision)
//! <prefix>/inspect/data/<uuid>      ramdisk data
//! <prefix>/inspect/queue/<id:020>   queued request and who holds it
//! <prefix>/inspect/queue-args/<id:020>  its arguments (a ramdisk's data), apart: taking reads the entries only
//! <prefix>/inspect/seq              the last request id
//! <prefix>/inspect/lookup/mac/<mac>/<uuid>      the lookup index: node <uuid> has this MAC (empty value)
//! <prefix>/inspect/lookup/bmc/<hex>/<uuid>      ... this BMC address (normalised, hex-encoded)
//! <prefix>/inspect/lookup/complete             the index covers every record (written once it was built)
//! ```
//!
//! A record and its index keys change in one transaction (a record with more keys than one transaction may hold
//! has its new keys written before it and its old ones deleted after it). Every key a record has is in the index
//! whenever the record is; a key left over (a save that lost its race) only costs `/v1/continue` one skipped read,
//! as the lookup scores the records it reads.
//!
//! Taking a request is a transaction guarded by the entry's modification revision, so two replicas never take the
//! same request at once; a watch on the queue wakes this replica's workers when another replica enqueues.

use std::time::Duration;

use async_trait::async_trait;
use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::{self, Attributes};
use ironguard_inspection::records::{Kind, NodeRecord, Request, Taken};
use ironguard_proto::time::now_ms;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::inspections::{InspectionStore, QueueEntry, lookup_keys, pick};
use crate::store::{Backend, StoreError};

fn e(op: &'static str) -> impl FnOnce(ironguard_coord::CoordError) -> StoreError {
    move |source| StoreError::Backend { backend: Backend::Etcd, op, source: Box::new(source) }
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::corrupt(Backend::Etcd, e.to_string())
}

/// Operations per transaction, under etcd's default `--max-txn-ops` (128).
const TXN_OPS: usize = 100;

/// Inspections in etcd.
pub struct EtcdInspections {
    c: EtcdCoordinator,
    root: String,
    wake: watch::Sender<u64>,
    stop: CancellationToken,
    /// The lookup index was found complete (or built) once by this process.
    indexed: tokio::sync::OnceCell<()>,
}

impl std::fmt::Debug for EtcdInspections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdInspections").field("root", &self.root).finish()
    }
}

impl Drop for EtcdInspections {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EtcdInspections {
    pub fn new(c: EtcdCoordinator) -> Self {
        let root = c.full("inspect/");
        let (wake, _) = watch::channel(0);
        let stop = CancellationToken::new();
        // Wake local workers when any replica writes to the queue.
        let (client, queue, tx, stop2) = (c.client(), format!("{root}queue/"), wake.clone(), stop.clone());
        tokio::spawn(async move {
            let mut client = client;
            loop {
                if let Ok(mut w) = client.watch(queue.clone(), Some(WatchOptions::new().with_prefix())).await {
                    loop {
                        tokio::select! {
                            m = w.message() => match m { Ok(Some(_)) => tx.send_modify(|v| *v += 1), _ => break },
                            _ = stop2.cancelled() => return,
                        }
                    }
                }
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop2.cancelled() => return }
            }
        });
        Self { c, root, wake, stop, indexed: tokio::sync::OnceCell::new() }
    }

    fn mac_prefix(&self, mac: &MacAddr) -> String {
        format!("{}lookup/mac/{mac}/", self.root)
    }

    fn bmc_prefix(&self, bmc: &str) -> String {
        // hex: a host name may hold any character, '/' too
        let hex: String = bmc.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}lookup/bmc/{hex}/", self.root)
    }

    /// The index keys of `r`.
    fn index_keys(&self, r: &NodeRecord) -> BTreeSet<String> {
        let (macs, bmcs) = lookup_keys(r);
        let macs = macs.iter().map(|m| format!("{}{}", self.mac_prefix(m), r.uuid));
        macs.chain(bmcs.iter().map(|b| format!("{}{}", self.bmc_prefix(b), r.uuid))).collect()
    }

    /// Runs `ops` in transactions of at most [`TXN_OPS`], unconditionally.
    async fn run_ops(&self, op: &'static str, ops: Vec<TxnOp>) -> Result<(), StoreError> {
        for chunk in ops.chunks(TXN_OPS) {
            let chunk = chunk.to_vec();
            self.c
                .retry(op, |mut cl| {
                    let txn = Txn::new().and_then(chunk.clone());
                    async move { cl.txn(txn).await }
                })
                .await
                .map_err(e(op))?;
        }
        Ok(())
    }

    /// Gets `keys` (with `options`) in transactions of at most [`TXN_OPS`]: one answer per key, in order.
    async fn get_many(
        &self,
        op: &'static str,
        keys: &[String],
        options: Option<GetOptions>,
    ) -> Result<Vec<etcd_client::GetResponse>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(TXN_OPS) {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), options.clone())).collect();
            let r = self
                .c
                .retry(op, |mut cl| {
                    let txn = Txn::new().and_then(ops.clone());
                    async move { cl.txn(txn).await }
                })
                .await
                .map_err(e(op))?;
            for resp in r.op_responses() {
                if let TxnOpResponse::Get(g) = resp {
                    out.push(g);
                }
            }
        }
        if out.len() != keys.len() {
            return Err(StoreError::corrupt(
                Backend::Etcd,
                format!("{op}: {} answers to {} reads", out.len(), keys.len()),
            ));
        }
        Ok(out)
    }

    /// Builds the lookup index from the records once, if no replica did (records written by a version before the
    /// index): idempotent, so replicas starting together may both do it.
    async fn ensure_index(&self) -> Result<(), StoreError> {
        self.indexed
            .get_or_try_init(|| async {
                let marker = format!("{}lookup/complete", self.root);
                if self.get_raw(marker.clone()).await?.is_some() {
                    return Ok::<(), StoreError>(());
                }
                let records = self.list().await?;
                let puts: Vec<TxnOp> = records
                    .iter()
                    .flat_map(|r| self.index_keys(r))
                    .map(|k| TxnOp::put(k, Vec::<u8>::new(), None))
                    .collect();
                let keys = puts.len();
                self.run_ops("build the lookup index", puts).await?;
                self.run_ops("build the lookup index", vec![TxnOp::put(marker, b"1".to_vec(), None)]).await?;
                tracing::info!(records = records.len(), keys, "etcd inspection store: lookup index built");
                Ok(())
            })
            .await
            .map(|_| ())
    }

    fn node_key(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.root)
    }

    fn data_key(&self, node: &str) -> String {
        format!("{}data/{node}", self.root)
    }

    fn queue_key(&self, id: u64) -> String {
        format!("{}queue/{id:020}", self.root)
    }

    fn args_key(&self, id: u64) -> String {
        format!("{}queue-args/{id:020}", self.root)
    }

    /// The request with its arguments (kept under their own key; inline in entries written before that).
    async fn with_args(&self, mut request: Request) -> Result<Request, StoreError> {
        if let Some((raw, _)) = self.get_raw(self.args_key(request.id)).await? {
            request.args = serde_json::from_slice(&raw).map_err(corrupt)?;
        }
        Ok(request)
    }

    async fn get_raw(&self, key: String) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
        let r = self
            .c
            .retry("get", |mut cl| {
                let k = key.clone();
                async move { cl.get(k, None).await }
            })
            .await
            .map_err(e("read"))?;
        Ok(r.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// Queue entries with their modification revisions, in id order.
    async fn queue(&self) -> Result<Vec<(QueueEntry, i64)>, StoreError> {
        let prefix = format!("{}queue/", self.root);
        let r = self
            .c
            .retry("read the queue", |mut cl| {
                let p = prefix.clone();
                async move { cl.get(p, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(e("read the queue"))?;
        r.kvs()
            .iter()
            .map(|kv| Ok((serde_json::from_slice::<QueueEntry>(kv.value()).map_err(corrupt)?, kv.mod_revision())))
            .collect()
    }

    /// Rewrites one entry if it did not change since `rev` (false: it did, or it is gone).
    async fn cas_entry(&self, entry: Option<&QueueEntry>, id: u64, rev: i64) -> Result<bool, StoreError> {
        let key = self.queue_key(id);
        let ops = match entry {
            Some(en) => vec![TxnOp::put(key.clone(), serde_json::to_vec(en).map_err(corrupt)?, None)],
            None => vec![TxnOp::delete(key.clone(), None), TxnOp::delete(self.args_key(id), None)],
        };
        let r = self
            .c
            .retry("update the queue", |mut cl| {
                let txn =
                    Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)]).and_then(ops.clone());
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(e("update the queue"))?;
        Ok(r.succeeded())
    }

    async fn update_entry(
        &self,
        id: u64,
        f: impl Fn(QueueEntry) -> Option<QueueEntry> + Send + Sync,
    ) -> Result<(), StoreError> {
        for _ in 0..20 {
            let Some((raw, rev)) = self.get_raw(self.queue_key(id)).await? else { return Ok(()) };
            let cur: QueueEntry = serde_json::from_slice(&raw).map_err(corrupt)?;
            if self.cas_entry(f(cur).as_ref(), id, rev).await? {
                return Ok(());
            }
        }
        Err(StoreError::Backend {
            backend: Backend::Etcd,
            op: "update the queue",
            source: "too much contention".into(),
        })
    }
}

#[async_trait]
impl InspectionStore for EtcdInspections {
    async fn get(&self, node: &str) -> Result<Option<NodeRecord>, StoreError> {
        match self.get_raw(self.node_key(node)).await? {
            Some((v, _)) => Ok(Some(serde_json::from_slice(&v).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    async fn list(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let prefix = format!("{}nodes/", self.root);
        let r = self
            .c
            .retry("list nodes", |mut cl| {
                let p = prefix.clone();
                async move { cl.get(p, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(e("list nodes"))?;
        r.kvs().iter().map(|kv| serde_json::from_slice(kv.value()).map_err(corrupt)).collect()
    }

    async fn save(&self, rec: &mut NodeRecord) -> Result<(), StoreError> {
        let key = self.node_key(&rec.uuid);
        let mut next = rec.clone();
        next.version = rec.version + 1;
        next.updated_at = now_ms();
        let v = serde_json::to_vec(&next).map_err(corrupt)?;
        // The stored version must be the one we read.
        let (old, rev) = match self.get_raw(key.clone()).await? {
            Some((raw, rev)) => (Some(serde_json::from_slice::<NodeRecord>(&raw).map_err(corrupt)?), rev),
            None => (None, 0),
        };
        let found = old.as_ref().map_or(0, |o| o.version);
        if found != rec.version {
            return Err(StoreError::Conflict { node: rec.uuid.clone(), expected: rec.version, found });
        }
        let guard = if rev == 0 {
            Compare::create_revision(key.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
        };
        // The index keys change with the record: in its transaction, or around it when they do not fit in one.
        let (old_keys, new_keys) = (old.map(|o| self.index_keys(&o)).unwrap_or_default(), self.index_keys(&next));
        let adds: Vec<TxnOp> =
            new_keys.difference(&old_keys).map(|k| TxnOp::put(k.clone(), Vec::<u8>::new(), None)).collect();
        let dels: Vec<TxnOp> = old_keys.difference(&new_keys).map(|k| TxnOp::delete(k.clone(), None)).collect();
        let mut ops = vec![TxnOp::put(key.clone(), v.clone(), None)];
        let (before, after) = if 1 + adds.len() + dels.len() <= TXN_OPS {
            ops.extend(adds);
            ops.extend(dels);
            (vec![], vec![])
        } else {
            (adds, dels)
        };
        self.run_ops("index a node", before).await?;
        let r = self
            .c
            .retry("save a node", |mut cl| {
                let txn = Txn::new().when([guard.clone()]).and_then(ops.clone());
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(e("save a node"))?;
        if !r.succeeded() {
            return Err(StoreError::Conflict { node: rec.uuid.clone(), expected: rec.version, found: rec.version + 1 });
        }
        self.run_ops("index a node", after).await?;
        *rec = next;
        Ok(())
    }

    async fn remove(&self, node: &str) -> Result<(), StoreError> {
        let key = self.node_key(node);
        for _ in 0..20 {
            // The record, its data and its index keys go together, unless the record changed meanwhile.
            let (keys, guard) = match self.get_raw(key.clone()).await? {
                Some((raw, rev)) => (
                    self.index_keys(&serde_json::from_slice::<NodeRecord>(&raw).map_err(corrupt)?),
                    Compare::mod_revision(key.clone(), CompareOp::Equal, rev),
                ),
                None => (BTreeSet::new(), Compare::create_revision(key.clone(), CompareOp::Equal, 0)),
            };
            let mut ops = vec![TxnOp::delete(key.clone(), None), TxnOp::delete(self.data_key(node), None)];
            let fits = ops.len() + keys.len() <= TXN_OPS;
            let index_ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::delete(k.clone(), None)).collect();
            if fits {
                ops.extend(index_ops.iter().cloned());
            }
            let r = self
                .c
                .retry("remove a node", |mut cl| {
                    let txn = Txn::new().when([guard.clone()]).and_then(ops.clone());
                    async move { cl.txn(txn).await }
                })
                .await
                .map_err(e("remove a node"))?;
            if r.succeeded() {
                if !fits {
                    self.run_ops("remove a node", index_ops).await?;
                }
                return Ok(());
            }
        }
        Err(StoreError::Backend { backend: Backend::Etcd, op: "remove a node", source: "too much contention".into() })
    }

    async fn lookup_candidates(&self, attrs: &Attributes) -> Result<Vec<NodeRecord>, StoreError> {
        self.ensure_index().await?;
        let bmcs = attrs.normalised_bmcs();
        let prefixes: Vec<String> =
            attrs.macs.iter().map(|m| self.mac_prefix(m)).chain(bmcs.iter().map(|b| self.bmc_prefix(b))).collect();
        let mut nodes: BTreeSet<String> = attrs.node_uuid.iter().cloned().collect();
        let found =
            self.get_many("look a node up", &prefixes, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        for (prefix, g) in prefixes.iter().zip(found) {
            for kv in g.kvs() {
                if let Some(uuid) = kv.key().strip_prefix(prefix.as_bytes()) {
                    nodes.insert(String::from_utf8_lossy(uuid).into_owned());
                }
            }
        }
        let keys: Vec<String> = nodes.iter().map(|n| self.node_key(n)).collect();
        let mut out = Vec::new();
        for g in self.get_many("read the candidates", &keys, None).await? {
            for kv in g.kvs() {
                let r: NodeRecord = serde_json::from_slice(kv.value()).map_err(corrupt)?;
                if lookup::score(attrs, &bmcs, &r) > 0 {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    async fn put_data(&self, node: &str, data: &serde_json::Value) -> Result<(), StoreError> {
        let (k, v) = (self.data_key(node), serde_json::to_vec(data).map_err(corrupt)?);
        self.c
            .retry("store data", |mut cl| {
                let (k, v) = (k.clone(), v.clone());
                async move { cl.put(k, v, None).await }
            })
            .await
            .map_err(e("store data"))?;
        Ok(())
    }

    async fn get_data(&self, node: &str) -> Result<Option<serde_json::Value>, StoreError> {
        match self.get_raw(self.data_key(node)).await? {
            Some((v, _)) => Ok(Some(serde_json::from_slice(&v).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    async fn enqueue(&self, node: &str, kind: Kind, args: serde_json::Value) -> Result<u64, StoreError> {
        let seq = format!("{}seq", self.root);
        for _ in 0..50 {
            let (last, rev) = match self.get_raw(seq.clone()).await? {
                Some((v, rev)) => (String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0), rev),
                None => (0, 0),
            };
            let id = last + 1;
            let entry = QueueEntry {
                request: Request {
                    id,
                    node: node.to_string(),
                    kind,
                    args: serde_json::Value::Null,
                    enqueued_at: now_ms(),
                },
                worker: None,
                lease_until: 0,
                attempts: 0,
                available_at: 0,
            };
            let guard = if rev == 0 {
                Compare::create_revision(seq.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(seq.clone(), CompareOp::Equal, rev)
            };
            let ops = vec![
                TxnOp::put(seq.clone(), id.to_string(), None),
                TxnOp::put(self.queue_key(id), serde_json::to_vec(&entry).map_err(corrupt)?, None),
                TxnOp::put(self.args_key(id), serde_json::to_vec(&args).map_err(corrupt)?, None),
            ];
            let r = self
                .c
                .retry("enqueue", |mut cl| {
                    let txn = Txn::new().when([guard.clone()]).and_then(ops.clone());
                    async move { cl.txn(txn).await }
                })
                .await
                .map_err(e("enqueue"))?;
            if r.succeeded() {
                self.wake.send_modify(|v| *v += 1);
                return Ok(id);
            }
        }
        Err(StoreError::Backend { backend: Backend::Etcd, op: "enqueue", source: "too much contention".into() })
    }

    async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, StoreError> {
        for _ in 0..10 {
            let q = self.queue().await?;
            let now = now_ms();
            let entries: Vec<QueueEntry> = q.iter().map(|(e, _)| e.clone()).collect();
            let Some(i) = pick(&entries, now) else { return Ok(None) };
            let (mut en, rev) = q[i].clone();
            en.worker = Some(worker.to_string());
            en.lease_until = now + lease.as_millis() as u64;
            en.attempts += 1;
            if self.cas_entry(Some(&en), en.request.id, rev).await? {
                return Ok(Some(Taken {
                    request: self.with_args(en.request).await?,
                    attempt: en.attempts,
                    worker: worker.to_string(),
                    lease_until: en.lease_until,
                }));
            }
        }
        Ok(None)
    }

    async fn extend(&self, taken: &Taken, lease: Duration) -> Result<(), StoreError> {
        let worker = taken.worker.clone();
        self.update_entry(taken.request.id, move |mut en| {
            if en.worker.as_deref() == Some(worker.as_str()) {
                en.lease_until = now_ms() + lease.as_millis() as u64;
            }
            Some(en)
        })
        .await
    }

    async fn consume(&self, taken: &Taken) -> Result<(), StoreError> {
        self.update_entry(taken.request.id, |_| None).await
    }

    async fn release(&self, taken: &Taken, delay: Duration) -> Result<(), StoreError> {
        self.update_entry(taken.request.id, move |mut en| {
            en.worker = None;
            en.lease_until = 0;
            en.available_at = now_ms() + delay.as_millis() as u64;
            Some(en)
        })
        .await
    }

    async fn pending(&self) -> Result<Vec<Request>, StoreError> {
        let mut out = Vec::new();
        for (e, _) in self.queue().await? {
            out.push(self.with_args(e.request).await?);
        }
        Ok(out)
    }

    fn wakeups(&self) -> watch::Receiver<u64> {
        self.wake.subscribe()
    }
}
