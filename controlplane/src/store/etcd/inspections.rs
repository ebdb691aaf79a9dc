//! The etcd inspection store, shared by control-plane replicas.
//!
//! ```text
//! <prefix>/inspect/nodes/<uuid>     node record (compare-and-swap on its modification revision)
//! <prefix>/inspect/data/<uuid>      ramdisk data
//! <prefix>/inspect/queue…, seq, quarantine/   the work queue and its index ([`super::queue`])
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
//! The work queue lives in [`super::queue`]: taking a request is a transaction guarded by the entry's modification
//! revision, so two replicas never take the same request at once, and costs the same whatever the queue's length.

use std::time::Duration;

use async_trait::async_trait;
use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::{self, Attributes};
use ironguard_inspection::records::{Kind, NodeRecord, Request, Taken};
use ironguard_proto::time::now_ms;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::queue::EtcdQueue;
use crate::store::inspections::{InspectionStore, Quarantined, lookup_keys};
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
    queue: EtcdQueue,
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
        let queue = EtcdQueue::new(c.clone(), root.clone(), Arc::new(Notify::new()));
        let stop = CancellationToken::new();
        // Wake one local worker per request that became ready (enqueued as its node's first request, released, or
        // promoted when the one before it was consumed), on any replica: not every worker per write to the queue.
        let (client, ready, wake, stop2) = (c.watch_client(), queue.ready_prefix(), queue.wake(), stop.clone());
        tokio::spawn(async move {
            let mut client = client;
            let opts = WatchOptions::new().with_prefix().with_filters([WatchFilterType::NoDelete]);
            loop {
                if let Ok(mut w) = client.watch(ready.clone(), Some(opts.clone())).await {
                    loop {
                        tokio::select! {
                            m = w.message() => match m {
                                Ok(Some(r)) => for _ in r.events() { wake.notify_one() },
                                _ => break,
                            },
                            _ = stop2.cancelled() => return,
                        }
                    }
                }
                // The watch broke: a request may have become ready meanwhile.
                wake.notify_one();
                tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = stop2.cancelled() => return }
            }
        });
        Self { c, root, queue, stop, indexed: tokio::sync::OnceCell::new() }
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
        self.queue.enqueue(node, kind, &args).await
    }

    async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, StoreError> {
        self.queue.take(worker, lease).await
    }

    async fn extend(&self, taken: &Taken, lease: Duration) -> Result<(), StoreError> {
        let worker = taken.worker.clone();
        self.queue
            .update_entry(taken.request.id, move |mut en| {
                if en.worker.as_deref() == Some(worker.as_str()) {
                    en.lease_until = now_ms() + lease.as_millis() as u64;
                }
                en
            })
            .await
    }

    async fn consume(&self, taken: &Taken) -> Result<(), StoreError> {
        self.queue.consume(taken.request.id, &taken.request.node).await
    }

    async fn release(&self, taken: &Taken, delay: Duration) -> Result<(), StoreError> {
        self.queue
            .update_entry(taken.request.id, move |mut en| {
                en.worker = None;
                en.lease_until = 0;
                en.available_at = now_ms() + delay.as_millis() as u64;
                en
            })
            .await
    }

    async fn pending(&self) -> Result<Vec<Request>, StoreError> {
        self.queue.pending().await
    }

    async fn quarantined(&self) -> Result<Vec<Quarantined>, StoreError> {
        self.queue.quarantined().await
    }

    async fn quarantine_count(&self) -> Result<u64, StoreError> {
        self.queue.quarantine_count().await
    }

    async fn drop_quarantined(&self, id: u64) -> Result<bool, StoreError> {
        self.queue.drop_quarantined(id).await
    }

    fn wakeups(&self) -> Arc<Notify> {
        self.queue.wake()
    }
}
