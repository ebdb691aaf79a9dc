//! The etcd work queue: what each operation reads and writes does not grow with the queue's length.
//!
//! ```text
//! <prefix>/inspect/queue/<id:020>                   a request and who holds it (QueueEntry), as before
//! <prefix>/inspect/queue-args/<id:020>              its arguments
//! <prefix>/inspect/seq                              the last request id
//! <prefix>/inspect/queue-index/seq                  the last id the index below covers
//! <prefix>/inspect/queue-index/node/<n>/<id:020>    a node's requests in order (<n>: the node, hex); value: enqueued_at
//! <prefix>/inspect/queue-index/head/<n>             the id of the node's first request
//! <prefix>/inspect/queue-index/ready/<t:020>/<id:020>   a head available from time t (ms); value: <n>
//! <prefix>/inspect/queue-index/leased/<t:020>/<id:020>  a head in flight until t; value: <n>
//! <prefix>/inspect/quarantine/<id:020>              an entry that cannot be read, moved aside (JSON: Quarantined)
//! ```
//!
//! Only a node's first request (its *head*) is in `ready/` or `leased/`, so a node's requests run in order. Taking
//! reads the first few keys of `ready/` up to now and of `leased/` up to now (expired leases), then their entries,
//! then compares-and-swaps one: three requests whatever the queue holds. Consuming a head promotes the node's next
//! request (`node/<n>/`, read with a limit of 2). Every write that changes who the head is compares the head key's
//! modification revision (and rewrites it), so a head is never lost between two replicas. An entry's index key
//! follows from the entry itself ([`index_key`]): extend and release move it without reading the index.
//!
//! Entries written by an older version (no index) are indexed once, in id order, by the first operation that sees
//! `seq` ahead of `queue-index/seq` — at an upgrade, and after every enqueue of an older replica during a rolling
//! one. An index key whose entry is gone (consumed by an older replica) is dropped when a take meets it. An entry
//! that cannot be decoded is moved to `quarantine/` (logged as an error with its key) and the rest of the queue
//! goes on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_inspection::records::{Kind, Request, Taken};
use ironguard_proto::time::now_ms;
use tokio::sync::Notify;
use tracing::{debug, error, info, warn};

use crate::store::inspections::{Quarantined, QueueEntry, node_named_in};
use crate::store::{Backend, StoreError};

fn e(op: &'static str) -> impl FnOnce(ironguard_coord::CoordError) -> StoreError {
    move |source| StoreError::Backend { backend: Backend::Etcd, op, source: Box::new(source) }
}

fn encode(e: serde_json::Error) -> StoreError {
    StoreError::corrupt(Backend::Etcd, e.to_string())
}

/// Candidates read per take from each of `ready/` and `leased/`: enough that replicas racing for the first one
/// find another without reading again.
const CANDIDATES: i64 = 8;
/// Rounds of reading candidates before a take gives up for now (the worker waits for the next wake-up).
const TAKE_ROUNDS: u32 = 10;
/// Entries indexed per transaction when indexing an older version's entries (3 operations and 1 compare each at
/// most: well under etcd's default `--max-txn-ops` of 128).
const INDEX_CHUNK: usize = 30;
/// Keys per page when `pending` reads the queue, and arguments per page (a ramdisk's data can be large).
const PENDING_PAGE: i64 = 500;
const ARGS_PAGE: i64 = 32;

/// The key of a node in the index: hex, as a node name may hold any character.
fn hex(node: &str) -> String {
    node.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(h: &[u8]) -> Option<String> {
    if h.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        h.chunks(2).map(|c| std::str::from_utf8(c).ok().and_then(|s| u8::from_str_radix(s, 16).ok())).collect();
    String::from_utf8(bytes?).ok()
}

/// Where an entry that heads its node's requests sits in the index: in flight until its lease ends, otherwise ready
/// from when it was enqueued or left for later, whichever is later (so heads go out in enqueue order).
pub(crate) fn index_key(root: &str, e: &QueueEntry) -> String {
    match e.worker {
        Some(_) => format!("{root}queue-index/leased/{:020}/{:020}", e.lease_until, e.request.id),
        None => {
            format!("{root}queue-index/ready/{:020}/{:020}", e.request.enqueued_at.max(e.available_at), e.request.id)
        }
    }
}

/// The id at the end of an index key (`…/<id:020>`).
fn id_of(key: &[u8]) -> Option<u64> {
    let tail = key.rsplit(|b| *b == b'/').next()?;
    std::str::from_utf8(tail).ok()?.parse().ok()
}

/// Compare: `key` still at `rev` (0: absent).
fn unchanged(key: &str, rev: i64) -> Compare {
    match rev {
        0 => Compare::create_revision(key.to_string(), CompareOp::Equal, 0),
        r => Compare::mod_revision(key.to_string(), CompareOp::Equal, r),
    }
}

fn gets(r: TxnResponse) -> Vec<etcd_client::GetResponse> {
    r.op_responses()
        .into_iter()
        .filter_map(|o| match o {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .collect()
}

/// A key's value and modification revision, if present.
fn first(g: Option<&etcd_client::GetResponse>) -> Option<(Vec<u8>, i64)> {
    g.and_then(|g| g.kvs().first()).map(|kv| (kv.value().to_vec(), kv.mod_revision()))
}

fn number(v: &[u8]) -> u64 {
    std::str::from_utf8(v).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The queue's keys under `<prefix>/inspect/`.
#[derive(Debug, Clone)]
pub(crate) struct EtcdQueue {
    c: EtcdCoordinator,
    root: String,
    /// Woken once per request that became ready (an index key written under `ready/`), by the watch.
    wake: Arc<Notify>,
}

/// A head found in the index: its index key, id and node (hex).
#[derive(Debug, Clone)]
struct Candidate {
    key: String,
    id: u64,
    node: String,
}

impl EtcdQueue {
    pub(crate) fn new(c: EtcdCoordinator, root: String, wake: Arc<Notify>) -> Self {
        Self { c, root, wake }
    }

    /// The prefix whose puts mean "a request became ready" (what the workers' watch follows).
    pub(crate) fn ready_prefix(&self) -> String {
        format!("{}queue-index/ready/", self.root)
    }

    pub(crate) fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    fn seq_key(&self) -> String {
        format!("{}seq", self.root)
    }

    fn indexed_key(&self) -> String {
        format!("{}queue-index/seq", self.root)
    }

    pub(crate) fn queue_key(&self, id: u64) -> String {
        format!("{}queue/{id:020}", self.root)
    }

    pub(crate) fn args_key(&self, id: u64) -> String {
        format!("{}queue-args/{id:020}", self.root)
    }

    fn head_key(&self, node_hex: &str) -> String {
        format!("{}queue-index/head/{node_hex}", self.root)
    }

    fn node_dir(&self, node_hex: &str) -> String {
        format!("{}queue-index/node/{node_hex}/", self.root)
    }

    fn quarantine_key(&self, id: u64) -> String {
        format!("{}quarantine/{id:020}", self.root)
    }

    fn index_key(&self, e: &QueueEntry) -> String {
        index_key(&self.root, e)
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.c
            .retry(op, |mut cl| {
                let t = txn.clone();
                async move { cl.txn(t).await }
            })
            .await
            .map_err(e(op))
    }

    /// Appends a request: one read (the sequence, the index's sequence, the node's head) and one transaction.
    pub(crate) async fn enqueue(&self, node: &str, kind: Kind, args: &serde_json::Value) -> Result<u64, StoreError> {
        let (seq, indexed, n) = (self.seq_key(), self.indexed_key(), hex(node));
        let head = self.head_key(&n);
        let args = serde_json::to_vec(args).map_err(encode)?;
        for attempt in 0..50u32 {
            let read = Txn::new().and_then([
                TxnOp::get(seq.clone(), None),
                TxnOp::get(indexed.clone(), None),
                TxnOp::get(head.clone(), None),
            ]);
            let g = gets(self.txn("enqueue", read).await?);
            let (last, seq_rev) = first(g.first()).map(|(v, r)| (number(&v), r)).unwrap_or((0, 0));
            let (done, indexed_rev) = first(g.get(1)).map(|(v, r)| (number(&v), r)).unwrap_or((0, 0));
            let (head_id, head_rev) = first(g.get(2)).map(|(v, r)| (Some(number(&v)), r)).unwrap_or((None, 0));
            if done < last {
                self.catch_up().await?;
                continue;
            }
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
            let mut ops = vec![
                TxnOp::put(seq.clone(), id.to_string(), None),
                TxnOp::put(indexed.clone(), id.to_string(), None),
                TxnOp::put(self.queue_key(id), serde_json::to_vec(&entry).map_err(encode)?, None),
                TxnOp::put(self.args_key(id), args.clone(), None),
                TxnOp::put(format!("{}{id:020}", self.node_dir(&n)), entry.request.enqueued_at.to_string(), None),
            ];
            match head_id {
                // Rewritten all the same: a consume of the head that read the node's requests before this one was
                // added must fail its compare and look again.
                Some(h) => ops.push(TxnOp::put(head.clone(), h.to_string(), None)),
                None => {
                    ops.push(TxnOp::put(head.clone(), id.to_string(), None));
                    ops.push(TxnOp::put(self.index_key(&entry), n.clone(), None));
                }
            }
            let guards = [unchanged(&seq, seq_rev), unchanged(&indexed, indexed_rev), unchanged(&head, head_rev)];
            if self.txn("enqueue", Txn::new().when(guards).and_then(ops)).await?.succeeded() {
                return Ok(id);
            }
            tokio::time::sleep(ironguard_coord::backoff(attempt.min(3), Duration::from_millis(100)) / 4).await;
        }
        Err(StoreError::Backend { backend: Backend::Etcd, op: "enqueue", source: "too much contention".into() })
    }

    /// The first few heads available now (ready, or in flight with an expired lease), oldest first; and whether
    /// requests of an older version wait to be indexed.
    async fn candidates(&self, now: u64) -> Result<(Vec<Candidate>, bool), StoreError> {
        let ready = self.ready_prefix();
        let leased = format!("{}queue-index/leased/", self.root);
        let upto = |p: &str| GetOptions::new().with_range(format!("{p}{:020}", now + 1)).with_limit(CANDIDATES);
        let read = Txn::new().and_then([
            TxnOp::get(ready.clone(), Some(upto(&ready))),
            TxnOp::get(leased.clone(), Some(upto(&leased))),
            TxnOp::get(self.seq_key(), None),
            TxnOp::get(self.indexed_key(), None),
        ]);
        let g = gets(self.txn("read the queue", read).await?);
        let behind = first(g.get(2)).map(|(v, _)| number(&v)).unwrap_or(0)
            > first(g.get(3)).map(|(v, _)| number(&v)).unwrap_or(0);
        let mut out: Vec<(Vec<u8>, Candidate)> = Vec::new();
        for (i, prefix) in [(0, &ready), (1, &leased)] {
            for kv in g.get(i).map(|g| g.kvs()).unwrap_or_default() {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                // sorted by time, then id, whichever list it comes from
                let order = kv.key().get(prefix.len()..).unwrap_or_default().to_vec();
                match (id_of(kv.key()), unhex(kv.value())) {
                    (Some(id), Some(_)) => {
                        out.push((order, Candidate { key, id, node: String::from_utf8_lossy(kv.value()).into_owned() }))
                    }
                    _ => self.drop_bad_index_key(&key, kv.value()).await?,
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((out.into_iter().map(|(_, c)| c).take(CANDIDATES as usize).collect(), behind))
    }

    /// An index key that names no request (written by hand?): logged and deleted; the entries are untouched.
    async fn drop_bad_index_key(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        error!(key, value = %String::from_utf8_lossy(value), "the queue's index holds a key it cannot read; deleting it");
        self.txn("repair the queue index", Txn::new().and_then([TxnOp::delete(key.to_string(), None)])).await?;
        Ok(())
    }

    /// Hands out the oldest available head for `lease`.
    pub(crate) async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, StoreError> {
        for round in 0..TAKE_ROUNDS {
            if round > 0 {
                tokio::time::sleep(ironguard_coord::backoff(round.min(4), Duration::from_millis(500)) / 4).await;
            }
            let now = now_ms();
            let (cands, behind) = self.candidates(now).await?;
            if behind {
                self.catch_up().await?;
                continue;
            }
            if cands.is_empty() {
                return Ok(None);
            }
            let keys: Vec<TxnOp> = cands.iter().map(|c| TxnOp::get(self.queue_key(c.id), None)).collect();
            let found = gets(self.txn("read the queue", Txn::new().and_then(keys)).await?);
            let mut repaired = false;
            for (c, g) in cands.iter().zip(found.iter()) {
                let Some((raw, rev)) = first(Some(g)) else {
                    // Consumed by a replica of an older version, which left the index alone.
                    self.retire(c.id, &c.node, Some(&c.key), None).await?;
                    repaired = true;
                    continue;
                };
                let en: QueueEntry = match serde_json::from_slice(&raw) {
                    Ok(en) => en,
                    Err(err) => {
                        self.quarantine(c.id, &c.node, &c.key, &raw, &err.to_string()).await?;
                        repaired = true;
                        continue;
                    }
                };
                let now = now_ms();
                if en.in_flight(now) || en.available_at > now || self.index_key(&en) != c.key {
                    // Held (or extended, or left for later) by a replica of an older version: the index key moves
                    // to where the entry says it belongs.
                    self.move_index_key(&c.key, &en, rev, &c.node).await?;
                    repaired = true;
                    continue;
                }
                let mut next = en.clone();
                next.worker = Some(worker.to_string());
                next.lease_until = now + lease.as_millis() as u64;
                next.attempts += 1;
                let txn = Txn::new()
                    .when([
                        Compare::mod_revision(self.queue_key(c.id), CompareOp::Equal, rev),
                        Compare::version(c.key.clone(), CompareOp::Greater, 0),
                    ])
                    .and_then([
                        TxnOp::put(self.queue_key(c.id), serde_json::to_vec(&next).map_err(encode)?, None),
                        TxnOp::delete(c.key.clone(), None),
                        TxnOp::put(self.index_key(&next), hex(&next.request.node), None),
                        TxnOp::get(self.args_key(c.id), None),
                    ]);
                let r = self.txn("take a request", txn).await?;
                if !r.succeeded() {
                    continue; // another worker took it: the next candidate
                }
                let mut request = next.request.clone();
                if let Some((a, _)) = first(gets(r).first()) {
                    match serde_json::from_slice(&a) {
                        Ok(v) => request.args = v,
                        Err(err) => {
                            // Taken: the entry holds the lease. Quarantine it and go on with the queue.
                            let why = format!("its arguments: {err}");
                            self.quarantine(c.id, &c.node, &self.index_key(&next), &a, &why).await?;
                            repaired = true;
                            continue;
                        }
                    }
                }
                return Ok(Some(Taken {
                    request,
                    attempt: next.attempts,
                    worker: worker.to_string(),
                    lease_until: next.lease_until,
                }));
            }
            if repaired {
                continue;
            }
            debug!(round, "every candidate was taken by another worker; reading again");
        }
        Ok(None)
    }

    /// Moves an index key to where the entry (at `rev`) says it belongs.
    async fn move_index_key(&self, from: &str, en: &QueueEntry, rev: i64, node_hex: &str) -> Result<(), StoreError> {
        let to = self.index_key(en);
        if to == from {
            return Ok(());
        }
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.queue_key(en.request.id), CompareOp::Equal, rev),
                Compare::version(from.to_string(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::delete(from.to_string(), None), TxnOp::put(to, node_hex.to_string(), None)]);
        self.txn("repair the queue index", txn).await?;
        Ok(())
    }

    /// Rewrites a taken entry with `f` (extend, release), moving its index key with it.
    pub(crate) async fn update_entry(
        &self,
        id: u64,
        f: impl Fn(QueueEntry) -> QueueEntry + Send + Sync,
    ) -> Result<(), StoreError> {
        for attempt in 0..20u32 {
            let g =
                gets(self.txn("update the queue", Txn::new().and_then([TxnOp::get(self.queue_key(id), None)])).await?);
            let Some((raw, rev)) = first(g.first()) else { return Ok(()) };
            let cur: QueueEntry = serde_json::from_slice(&raw)
                .map_err(|err| StoreError::corrupt(Backend::Etcd, format!("{}: {err}", self.queue_key(id))))?;
            let next = f(cur.clone());
            let (old_key, new_key) = (self.index_key(&cur), self.index_key(&next));
            let mut ops = vec![TxnOp::put(self.queue_key(id), serde_json::to_vec(&next).map_err(encode)?, None)];
            let mut guards = vec![Compare::mod_revision(self.queue_key(id), CompareOp::Equal, rev)];
            if old_key != new_key {
                // Only a head has an index key; a taken request is one.
                guards.push(Compare::version(old_key.clone(), CompareOp::Greater, 0));
                ops.push(TxnOp::delete(old_key, None));
                ops.push(TxnOp::put(new_key, hex(&next.request.node), None));
            }
            if self.txn("update the queue", Txn::new().when(guards.clone()).and_then(ops.clone())).await?.succeeded() {
                return Ok(());
            }
            // The index key was not where the entry says (an older version's take): rewrite the entry alone.
            if guards.len() > 1 {
                let txn = Txn::new().when([guards[0].clone()]).and_then(ops[..1].to_vec());
                if self.txn("update the queue", txn).await?.succeeded() {
                    return Ok(());
                }
            }
            tokio::time::sleep(ironguard_coord::backoff(attempt.min(3), Duration::from_millis(100)) / 4).await;
        }
        Err(StoreError::Backend {
            backend: Backend::Etcd,
            op: "update the queue",
            source: "too much contention".into(),
        })
    }

    /// The request is done: its entry, arguments and index keys go, and the node's next request (if any) becomes
    /// its head, ready from when it was enqueued.
    pub(crate) async fn consume(&self, id: u64, node: &str) -> Result<(), StoreError> {
        self.retire(id, &hex(node), None, None).await
    }

    /// Removes request `id` of node `node_hex` from the queue with its index key (where its entry says, or
    /// `index_key` for an entry that is gone or cannot be read) and promotes the node's next request; with
    /// `quarantine`, writes that record in the same transaction.
    async fn retire(
        &self,
        id: u64,
        node_hex: &str,
        index_key: Option<&str>,
        quarantine: Option<(String, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let (qk, head, dir) = (self.queue_key(id), self.head_key(node_hex), self.node_dir(node_hex));
        let my_node_key = format!("{dir}{id:020}");
        for attempt in 0..20u32 {
            let read = Txn::new().and_then([
                TxnOp::get(qk.clone(), None),
                TxnOp::get(head.clone(), None),
                TxnOp::get(dir.clone(), Some(GetOptions::new().with_prefix().with_limit(2))),
            ]);
            let g = gets(self.txn("consume a request", read).await?);
            let entry = first(g.first());
            let (head_id, head_rev) = first(g.get(1)).map(|(v, r)| (Some(number(&v)), r)).unwrap_or((None, 0));
            let next = g
                .get(2)
                .map(|g| g.kvs())
                .unwrap_or_default()
                .iter()
                .filter_map(|kv| Some((id_of(kv.key())?, number(kv.value()), kv.mod_revision())))
                .find(|(i, _, _)| *i != id);
            let mut guards = vec![unchanged(&qk, entry.as_ref().map_or(0, |(_, r)| *r)), unchanged(&head, head_rev)];
            let mut ops = vec![
                TxnOp::delete(qk.clone(), None),
                TxnOp::delete(self.args_key(id), None),
                TxnOp::delete(my_node_key.clone(), None),
            ];
            if let Some((raw, _)) = &entry {
                if let Ok(en) = serde_json::from_slice::<QueueEntry>(raw) {
                    ops.push(TxnOp::delete(self.index_key(&en), None));
                }
            }
            if let Some(k) = index_key {
                ops.push(TxnOp::delete(k.to_string(), None));
            }
            if let Some((key, value)) = &quarantine {
                ops.push(TxnOp::put(key.clone(), value.clone(), None));
            }
            if head_id == Some(id) {
                match next {
                    Some((next_id, enqueued_at, next_rev)) => {
                        guards.push(Compare::mod_revision(format!("{dir}{next_id:020}"), CompareOp::Equal, next_rev));
                        ops.push(TxnOp::put(head.clone(), next_id.to_string(), None));
                        let ready = format!("{}{enqueued_at:020}/{next_id:020}", self.ready_prefix());
                        ops.push(TxnOp::put(ready, node_hex.to_string(), None));
                    }
                    None => ops.push(TxnOp::delete(head.clone(), None)),
                }
            }
            if self.txn("consume a request", Txn::new().when(guards).and_then(ops)).await?.succeeded() {
                return Ok(());
            }
            tokio::time::sleep(ironguard_coord::backoff(attempt.min(3), Duration::from_millis(100)) / 4).await;
        }
        Err(StoreError::Backend {
            backend: Backend::Etcd,
            op: "consume a request",
            source: "too much contention".into(),
        })
    }

    /// Moves request `id` (of node `node_hex`), which cannot be read, to `quarantine/`: the node's next request
    /// goes on, and an operator is told what was moved and why.
    async fn quarantine(
        &self,
        id: u64,
        node_hex: &str,
        index_key: &str,
        raw: &[u8],
        why: &str,
    ) -> Result<(), StoreError> {
        let key = self.quarantine_key(id);
        let rec = Quarantined {
            id,
            node: unhex(node_hex.as_bytes()).unwrap_or_else(|| node_named_in(raw)),
            key: self.queue_key(id),
            error: why.to_string(),
            raw: String::from_utf8_lossy(raw).into_owned(),
            quarantined_at: now_ms(),
        };
        let rec_v = serde_json::to_vec(&rec).map_err(encode)?;
        self.retire(id, node_hex, Some(index_key), Some((key.clone(), rec_v))).await?;
        error!(
            entry = %rec.key,
            quarantine = %key,
            node = rec.node,
            error = why,
            "a queued request cannot be read: moved to quarantine, the rest of the queue goes on. Read it with \
             `ironguardctl inspect quarantine`, start the node's inspection again if it still needs one, then \
             `ironguardctl inspect quarantine --drop {id}`"
        );
        Ok(())
    }

    /// Indexes the entries written since `queue-index/seq` (by an older version, which keeps no index), in id
    /// order: each gets its node key, and becomes its node's head if the node has none.
    pub(crate) async fn catch_up(&self) -> Result<(), StoreError> {
        loop {
            let read = Txn::new().and_then([TxnOp::get(self.seq_key(), None), TxnOp::get(self.indexed_key(), None)]);
            let g = gets(self.txn("index the queue", read).await?);
            let last = first(g.first()).map(|(v, _)| number(&v)).unwrap_or(0);
            let (done, indexed_rev) = first(g.get(1)).map(|(v, r)| (number(&v), r)).unwrap_or((0, 0));
            if done >= last {
                return Ok(());
            }
            // The next chunk of entries after `done`.
            let from = self.queue_key(done + 1);
            let opts = GetOptions::new().with_range(self.queue_key(last + 1)).with_limit(INDEX_CHUNK as i64);
            let g = gets(self.txn("index the queue", Txn::new().and_then([TxnOp::get(from, Some(opts))])).await?);
            let kvs: Vec<(u64, Vec<u8>)> = g
                .first()
                .map(|g| g.kvs())
                .unwrap_or_default()
                .iter()
                .filter_map(|kv| Some((id_of(kv.key())?, kv.value().to_vec())))
                .collect();
            let upto = if kvs.len() < INDEX_CHUNK { last } else { kvs.last().map_or(last, |(id, _)| *id) };
            let mut entries: Vec<QueueEntry> = Vec::new();
            let mut bad: Vec<(u64, Vec<u8>, String)> = Vec::new();
            for (id, raw) in kvs {
                match serde_json::from_slice::<QueueEntry>(&raw) {
                    Ok(en) if en.request.id == id => entries.push(en),
                    Ok(en) => bad.push((id, raw, format!("the entry says it is request {}", en.request.id))),
                    Err(err) => bad.push((id, raw, err.to_string())),
                }
            }
            // The heads of the nodes named, as they are now.
            let nodes: BTreeSet<String> = entries.iter().map(|e| hex(&e.request.node)).collect();
            let heads_read: Vec<TxnOp> = nodes.iter().map(|n| TxnOp::get(self.head_key(n), None)).collect();
            let hg = gets(self.txn("index the queue", Txn::new().and_then(heads_read)).await?);
            let mut heads: BTreeMap<String, (Option<u64>, i64)> = BTreeMap::new();
            for (n, g) in nodes.iter().zip(hg.iter()) {
                heads.insert(n.clone(), first(Some(g)).map(|(v, r)| (Some(number(&v)), r)).unwrap_or((None, 0)));
            }
            let mut guards = vec![unchanged(&self.indexed_key(), indexed_rev)];
            let mut ops = vec![TxnOp::put(self.indexed_key(), upto.to_string(), None)];
            let mut new_heads: BTreeMap<String, u64> = BTreeMap::new();
            for en in &entries {
                let n = hex(&en.request.node);
                let id = en.request.id;
                ops.push(TxnOp::put(
                    format!("{}{id:020}", self.node_dir(&n)),
                    en.request.enqueued_at.to_string(),
                    None,
                ));
                let has_head = heads.get(&n).is_some_and(|(h, _)| h.is_some()) || new_heads.contains_key(&n);
                if !has_head {
                    new_heads.insert(n.clone(), id);
                    ops.push(TxnOp::put(self.index_key(en), n.clone(), None));
                }
            }
            for (n, (h, rev)) in &heads {
                guards.push(unchanged(&self.head_key(n), *rev));
                let value = new_heads.get(n).copied().or(*h).unwrap_or_default();
                ops.push(TxnOp::put(self.head_key(n), value.to_string(), None));
            }
            for (id, raw, why) in &bad {
                let rec = Quarantined {
                    id: *id,
                    node: node_named_in(raw),
                    key: self.queue_key(*id),
                    error: why.clone(),
                    raw: String::from_utf8_lossy(raw).into_owned(),
                    quarantined_at: now_ms(),
                };
                ops.push(TxnOp::put(self.quarantine_key(*id), serde_json::to_vec(&rec).map_err(encode)?, None));
                ops.push(TxnOp::delete(self.queue_key(*id), None));
                ops.push(TxnOp::delete(self.args_key(*id), None));
            }
            if self.txn("index the queue", Txn::new().when(guards).and_then(ops)).await?.succeeded() {
                for (id, _, why) in &bad {
                    error!(
                        entry = %self.queue_key(*id),
                        quarantine = %self.quarantine_key(*id),
                        error = %why,
                        "a queued request cannot be read: moved to quarantine, the rest of the queue goes on. Read \
                         it with `ironguardctl inspect quarantine`, start the node's inspection again if it still \
                         needs one, then `ironguardctl inspect quarantine --drop {id}`"
                    );
                }
                if !entries.is_empty() {
                    info!(entries = entries.len(), upto, "queue entries of an older version indexed");
                }
            }
        }
    }

    /// Every request not consumed yet, oldest first, with its arguments: pages of [`PENDING_PAGE`] entries and
    /// [`ARGS_PAGE`] arguments, all read at the revision of the first page. An entry that cannot be read is left
    /// out (and logged); the next take quarantines it.
    pub(crate) async fn pending(&self) -> Result<Vec<Request>, StoreError> {
        let entries = self.pages(&format!("{}queue/", self.root), PENDING_PAGE, None).await?;
        let at = entries.0;
        let mut out = Vec::with_capacity(entries.1.len());
        for (key, raw) in entries.1 {
            match serde_json::from_slice::<QueueEntry>(&raw) {
                Ok(en) => out.push(en.request),
                Err(err) => warn!(key, error = %err, "a queued request cannot be read; left out of the pending list"),
            }
        }
        let (_, args) = self.pages(&format!("{}queue-args/", self.root), ARGS_PAGE, Some(at)).await?;
        let mut by_id: BTreeMap<u64, Vec<u8>> =
            args.into_iter().filter_map(|(k, v)| Some((id_of(k.as_bytes())?, v))).collect();
        for r in &mut out {
            if let Some(a) = by_id.remove(&r.id) {
                match serde_json::from_slice(&a) {
                    Ok(v) => r.args = v,
                    Err(err) => warn!(id = r.id, error = %err, "a queued request's arguments cannot be read"),
                }
            }
        }
        Ok(out)
    }

    /// Every key and value under `prefix`, `page` at a time, at revision `at` (0 or `None`: the current one); also
    /// returns the revision read.
    async fn pages(
        &self,
        prefix: &str,
        page: i64,
        at: Option<i64>,
    ) -> Result<(i64, Vec<(String, Vec<u8>)>), StoreError> {
        let end = {
            let mut e = prefix.as_bytes().to_vec();
            if let Some(last) = e.last_mut() {
                *last += 1;
            }
            e
        };
        let mut from = prefix.as_bytes().to_vec();
        let mut rev = at.unwrap_or(0);
        let mut out = Vec::new();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(page)
                .with_sort(SortTarget::Key, SortOrder::Ascend);
            if rev > 0 {
                opts = opts.with_revision(rev);
            }
            let r = self
                .c
                .retry("read the queue", |mut cl| {
                    let (f, o) = (from.clone(), opts.clone());
                    async move { cl.get(f, Some(o)).await }
                })
                .await
                .map_err(e("read the queue"))?;
            if rev == 0 {
                rev = r.header().map(|h| h.revision()).unwrap_or(0);
            }
            let kvs = r.kvs();
            for kv in kvs {
                out.push((String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec()));
            }
            match kvs.last() {
                Some(kv) if r.more() => {
                    from = kv.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((rev, out)),
            }
        }
    }

    /// What is in quarantine: every record, oldest first, its id taken from its key.
    pub(crate) async fn quarantined(&self) -> Result<Vec<Quarantined>, StoreError> {
        let (_, kvs) = self.pages(&format!("{}quarantine/", self.root), PENDING_PAGE, None).await?;
        Ok(kvs
            .into_iter()
            .map(|(key, raw)| {
                let mut rec = serde_json::from_slice(&raw).unwrap_or_else(|err| Quarantined {
                    id: 0,
                    node: String::new(),
                    key: key.clone(),
                    error: format!("the quarantine record itself cannot be read: {err}"),
                    raw: String::from_utf8_lossy(&raw).into_owned(),
                    quarantined_at: 0,
                });
                rec.id = id_of(key.as_bytes()).unwrap_or(rec.id);
                rec
            })
            .collect())
    }

    /// How many records are in quarantine: a count-only read, whatever they hold.
    pub(crate) async fn quarantine_count(&self) -> Result<u64, StoreError> {
        let prefix = format!("{}quarantine/", self.root);
        let r = self
            .c
            .retry("count the quarantine", |mut cl| {
                let p = prefix.clone();
                async move { cl.get(p, Some(GetOptions::new().with_prefix().with_count_only())).await }
            })
            .await
            .map_err(e("count the quarantine"))?;
        Ok(u64::try_from(r.count()).unwrap_or(0))
    }

    /// Deletes the quarantine record of request `id`; `false` if there was none.
    pub(crate) async fn drop_quarantined(&self, id: u64) -> Result<bool, StoreError> {
        let key = self.quarantine_key(id);
        let r = self
            .c
            .retry("drop a quarantined request", |mut cl| {
                let k = key.clone();
                async move { cl.delete(k, None).await }
            })
            .await
            .map_err(e("drop a quarantined request"))?;
        Ok(r.deleted() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_round_trip_through_hex() {
        for n in ["0d1f2e3c-aaaa-4bbb-8ccc-000000000001", "a/b c", "ü"] {
            assert_eq!(unhex(hex(n).as_bytes()).as_deref(), Some(n));
        }
        assert_eq!(unhex(b"zz"), None);
        assert_eq!(unhex(b"abc"), None);
    }

    #[test]
    fn an_entry_says_where_its_index_key_is() {
        let mut e = QueueEntry {
            request: Request {
                id: 7,
                node: "n".into(),
                kind: Kind::Start,
                args: serde_json::Value::Null,
                enqueued_at: 50,
            },
            worker: None,
            lease_until: 0,
            attempts: 0,
            available_at: 0,
        };
        assert_eq!(index_key("/p/inspect/", &e), format!("/p/inspect/queue-index/ready/{:020}/{:020}", 50, 7));
        e.available_at = 90;
        assert_eq!(index_key("/p/inspect/", &e), format!("/p/inspect/queue-index/ready/{:020}/{:020}", 90, 7));
        e.worker = Some("w".into());
        e.lease_until = 1000;
        assert_eq!(index_key("/p/inspect/", &e), format!("/p/inspect/queue-index/leased/{:020}/{:020}", 1000, 7));
        assert_eq!(id_of(index_key("/p/inspect/", &e).as_bytes()), Some(7));
    }
}
