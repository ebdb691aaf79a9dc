//! The inspection work queue against both backends — the embedded store and a real etcd on loopback (3.4 and
//! 3.5): workers of two replicas taking at once never hold the same request, nor two requests of one node, and
//! every request is delivered; `pending` lists exactly what is left, with its arguments; a corrupt entry is moved
//! to quarantine and the rest of the queue goes on; a queue written by the previous version (no index) is taken.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironguard_controlplane::store::InspectionStore;
use ironguard_inspection::records::Kind;
use ironguard_netns_tests::etcd::EtcdProcess;
use ironguard_netns_tests::{EtcdRelease, on_both_etcd_releases as on_both};

const LEASE: Duration = Duration::from_secs(30);

/// What the workers saw: who holds which node now, and each node's requests in the order they were taken.
#[derive(Default)]
struct Seen {
    holding: BTreeMap<String, u64>,
    order: BTreeMap<String, Vec<u64>>,
    taken: Vec<u64>,
}

/// `replicas` (stores on one shared state) with `workers` each, taking until `total` requests were consumed.
async fn drain(replicas: &[Arc<dyn InspectionStore>], workers: usize, total: usize) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = Vec::new();
    for (r, store) in replicas.iter().enumerate() {
        for w in 0..workers {
            let (store, seen) = (store.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                let me = format!("replica-{r}/worker-{w}");
                let mut idle = 0;
                loop {
                    if seen.lock().unwrap().taken.len() >= total {
                        return;
                    }
                    let Some(t) = store.take(&me, LEASE).await.unwrap() else {
                        idle += 1;
                        assert!(idle < 400, "{me}: nothing to take for 20 s with requests left");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    idle = 0;
                    {
                        let mut s = seen.lock().unwrap();
                        let node = t.request.node.clone();
                        if let Some(other) = s.holding.insert(node.clone(), t.request.id) {
                            panic!("{me} took request {} of {node} while request {other} of it is held", t.request.id);
                        }
                        s.order.entry(node).or_default().push(t.request.id);
                        s.taken.push(t.request.id);
                    }
                    tokio::task::yield_now().await;
                    seen.lock().unwrap().holding.remove(&t.request.node);
                    store.consume(&t).await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::into_inner(seen).unwrap().into_inner().unwrap()
}

/// The contract on `replicas` sharing one state.
async fn contract(replicas: Vec<Arc<dyn InspectionStore>>) {
    let s = replicas[0].clone();
    // 150 requests of 30 nodes, interleaved, each with its own arguments.
    let mut ids: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    for i in 0..150u64 {
        let node = format!("node-{:02}", i % 30);
        let id = s.enqueue(&node, Kind::Process, serde_json::json!({ "i": i })).await.unwrap();
        ids.insert(id, (node, i));
    }
    assert_eq!(ids.len(), 150, "distinct ids");
    // pending: every request, oldest first, with its arguments.
    let pending = replicas[replicas.len() - 1].pending().await.unwrap();
    assert_eq!(pending.iter().map(|r| r.id).collect::<Vec<_>>(), ids.keys().copied().collect::<Vec<_>>());
    for r in &pending {
        let (node, i) = &ids[&r.id];
        assert_eq!((&r.node, &r.args), (node, &serde_json::json!({ "i": i })), "request {}", r.id);
    }
    // A request held is not handed out again; a node's next request waits for it.
    let t = s.take("solo", LEASE).await.unwrap().unwrap();
    assert_eq!(t.request.id, *ids.keys().next().unwrap(), "the oldest first");
    assert_eq!(t.request.args, serde_json::json!({ "i": 0 }));
    let mut others = Vec::new();
    for _ in 0..29 {
        others.push(replicas[replicas.len() - 1].take("other", LEASE).await.unwrap().unwrap());
    }
    let nodes: BTreeSet<&str> = others.iter().map(|o| o.request.node.as_str()).collect();
    assert_eq!(nodes.len(), 29, "one request per node: {nodes:?}");
    assert!(!nodes.contains(t.request.node.as_str()));
    assert!(s.take("more", LEASE).await.unwrap().is_none(), "every node has a request in flight");
    // Released for later: not before then.
    s.release(&others[0], Duration::from_secs(3600)).await.unwrap();
    assert!(s.take("more", LEASE).await.unwrap().is_none(), "the released request waits out its delay");
    s.consume(&t).await.unwrap();
    let next = s.take("solo", LEASE).await.unwrap().expect("the node's next request, once the first is consumed");
    assert_eq!(next.request.node, t.request.node);
    assert_eq!(
        next.request.id,
        ids.iter().find(|(id, (n, _))| **id > t.request.id && *n == t.request.node).unwrap().0.to_owned()
    );
    // Given back at once: available again (to anyone), with one more attempt when taken.
    s.release(&next, Duration::ZERO).await.unwrap();
    for o in &others[1..] {
        s.consume(o).await.unwrap();
    }
    s.release(&others[0], Duration::ZERO).await.unwrap();
    let left = pending.len() - 1 - 28;
    assert_eq!(s.pending().await.unwrap().len(), left);

    // Every replica's workers at once.
    let seen = drain(&replicas, 3, left).await;
    let mut taken = seen.taken.clone();
    taken.sort_unstable();
    let before = taken.len();
    taken.dedup();
    assert_eq!(before, taken.len(), "no request was taken twice");
    assert_eq!(taken.len(), left, "every request was delivered");
    for (node, order) in &seen.order {
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{node}'s requests in order: {order:?}");
    }
    assert!(s.pending().await.unwrap().is_empty());
    for r in &replicas {
        assert!(r.quarantined().await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_queue_hands_each_request_out_once_in_node_order() {
    let dir = std::env::temp_dir().join(format!("ig-queue-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = ironguard_controlplane::store::embedded::open(&dir, 100).unwrap().inspections;
    contract(vec![s]).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn etcd_store(url: &str) -> Arc<dyn InspectionStore> {
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![url.to_string()], ..Default::default() };
    let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    ironguard_controlplane::store::etcd::open(c, 100).await.unwrap().inspections
}

async fn raw_client(url: &str) -> (etcd_client::Client, ironguard_coord::etcd::EtcdCoordinator) {
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![url.to_string()], ..Default::default() };
    let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    (c.client(), c)
}

on_both!(check_etcd_queue_hands_each_request_out_once_in_node_order: etcd_queue_hands_each_request_out_once_in_node_order, etcd_queue_hands_each_request_out_once_in_node_order_on_etcd_3_5);
async fn check_etcd_queue_hands_each_request_out_once_in_node_order(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release("queue-contract", release);
    let replicas = vec![etcd_store(&etcd.url).await, etcd_store(&etcd.url).await];
    contract(replicas).await;
    drop(etcd);
}

on_both!(check_etcd_corrupt_entry_is_quarantined_and_the_queue_goes_on: etcd_corrupt_entry_is_quarantined_and_the_queue_goes_on, etcd_corrupt_entry_is_quarantined_and_the_queue_goes_on_on_etcd_3_5);
/// A queue entry that cannot be read (written by hand, a bit flipped) no longer stops every take: it is moved to
/// `inspect/quarantine/<id>` with its key, error and bytes, its node's next request goes on, and so does the rest.
async fn check_etcd_corrupt_entry_is_quarantined_and_the_queue_goes_on(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release("queue-quarantine", release);
    let s = etcd_store(&etcd.url).await;
    let a1 = s.enqueue("node-a", Kind::Start, serde_json::Value::Null).await.unwrap();
    let b1 = s.enqueue("node-b", Kind::Start, serde_json::Value::Null).await.unwrap();
    let a2 = s.enqueue("node-a", Kind::Process, serde_json::json!({"x": 1})).await.unwrap();
    let (mut cl, c) = raw_client(&etcd.url).await;
    let key = c.full(&format!("inspect/queue/{a1:020}"));
    cl.put(key.clone(), b"{\"request\": garbage".to_vec(), None).await.unwrap();
    // pending leaves it out rather than failing.
    let pending: Vec<u64> = s.pending().await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(pending, [b1, a2]);
    // Takes go on: node-b's request, then node-a's next one (its first is quarantined).
    let mut got = Vec::new();
    while let Some(t) = s.take("w", LEASE).await.unwrap() {
        got.push(t.request.id);
        s.consume(&t).await.unwrap();
    }
    got.sort_unstable();
    assert_eq!(got, [b1, a2], "the rest of the queue proceeds");
    let q = s.quarantined().await.unwrap();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0].key, key);
    assert!(q[0].raw.contains("garbage"), "{q:?}");
    assert!(!q[0].error.is_empty());
    // Named by its id, and by its node (the queue's index knows it even when the entry cannot be read).
    assert_eq!((q[0].id, q[0].node.as_str()), (a1, "node-a"), "{q:?}");
    assert!(cl.get(key, None).await.unwrap().kvs().is_empty(), "moved, not copied");
    let kept = cl.get(c.full(&format!("inspect/quarantine/{a1:020}")), None).await.unwrap();
    assert_eq!(kept.kvs().len(), 1);
    assert!(s.pending().await.unwrap().is_empty());
    // What /metrics exports, counted without reading the records; another replica on the same etcd sees it too.
    let metrics = ironguard_controlplane::metrics::Metrics::new();
    let gauges = ironguard_controlplane::metrics::StoreGauges::new(etcd_store(&etcd.url).await, &metrics);
    gauges.refresh().await;
    assert_eq!(metrics.inspection_quarantined.get(), 1);
    assert!(metrics.encode().contains("\nironguard_controlplane_inspection_quarantined 1\n"), "{}", metrics.encode());
    // Dropped once read: the key is gone, a second drop finds nothing, the count is 0.
    assert!(s.drop_quarantined(a1).await.unwrap());
    assert!(!s.drop_quarantined(a1).await.unwrap());
    assert!(cl.get(c.full(&format!("inspect/quarantine/{a1:020}")), None).await.unwrap().kvs().is_empty());
    assert!(s.quarantined().await.unwrap().is_empty());
    gauges.invalidate().await;
    gauges.refresh().await;
    assert_eq!(metrics.inspection_quarantined.get(), 0);
    drop(etcd);
}

on_both!(check_etcd_queue_of_the_previous_version_is_taken: etcd_queue_of_the_previous_version_is_taken, etcd_queue_of_the_previous_version_is_taken_on_etcd_3_5);
/// A queue written by the previous version (entries, arguments and `seq`, no index; one entry held by a worker
/// whose lease ended, one still held) is indexed once and taken: in node order, the expired one delivered again,
/// the held one not before its lease ends; an older replica's enqueue during a rolling upgrade is taken too.
async fn check_etcd_queue_of_the_previous_version_is_taken(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release("queue-upgrade", release);
    let (mut cl, c) = raw_client(&etcd.url).await;
    let now = ironguard_proto::time::now_ms();
    let entry = |id: u64, node: &str, worker: Option<&str>, lease_until: u64| {
        serde_json::json!({
            "request": {"id": id, "node": node, "kind": "start", "args": null, "enqueued_at": now - 1000 + id},
            "worker": worker, "lease_until": lease_until, "attempts": u32::from(worker.is_some()), "available_at": 0,
        })
    };
    let writer = cl.clone();
    let old = |id: u64, v: serde_json::Value| {
        let mut cl = writer.clone();
        let c = c.clone();
        async move {
            cl.put(c.full(&format!("inspect/queue/{id:020}")), serde_json::to_vec(&v).unwrap(), None).await.unwrap();
            cl.put(c.full(&format!("inspect/queue-args/{id:020}")), format!("{{\"old\":{id}}}"), None).await.unwrap();
        }
    };
    old(1, entry(1, "node-a", Some("gone"), now - 10)).await; // its worker died
    old(2, entry(2, "node-a", None, 0)).await;
    let held_until = now + 8000;
    old(3, entry(3, "node-b", Some("busy"), held_until)).await; // held by a live worker of the older replica
    old(4, entry(4, "node-b", None, 0)).await;
    old(5, entry(5, "node-c", None, 0)).await;
    cl.put(c.full("inspect/seq"), "5", None).await.unwrap();
    let s = etcd_store(&etcd.url).await;
    assert_eq!(s.pending().await.unwrap().len(), 5);
    // Heads go out in the order they became available: node-c's (enqueued) before node-a's first (its worker's
    // lease ended later), which is delivered again.
    let t5 = s.take("w", LEASE).await.unwrap().unwrap();
    assert_eq!(t5.request.id, 5);
    let t1 = s.take("w", LEASE).await.unwrap().unwrap();
    assert_eq!((t1.request.id, t1.attempt), (1, 2), "the expired one is delivered again");
    assert_eq!(t1.request.args, serde_json::json!({"old": 1}));
    // node-a waits for 1, node-b for 3 (held).
    let more = s.take("w", LEASE).await.unwrap();
    // (A machine so slow that the held lease ended meanwhile cannot judge this one.)
    if ironguard_proto::time::now_ms() < held_until {
        assert!(more.is_none(), "{more:?}");
    }
    // An older replica enqueues (no index) during the upgrade: taken all the same.
    old(6, entry(6, "node-d", None, 0)).await;
    cl.put(c.full("inspect/seq"), "6", None).await.unwrap();
    let t6 = s.take("w", LEASE).await.unwrap().expect("the older replica's request");
    assert_eq!(t6.request.id, 6);
    // And a new enqueue follows the older one's id.
    assert_eq!(s.enqueue("node-e", Kind::Start, serde_json::Value::Null).await.unwrap(), 7);
    s.consume(&t1).await.unwrap();
    let t2 = s.take("w", LEASE).await.unwrap().unwrap();
    assert_eq!(t2.request.id, 2, "node-a's next, promoted");
    let t7 = s.take("w", LEASE).await.unwrap().unwrap();
    assert_eq!(t7.request.id, 7);
    // The older replica consumes the request it holds (its entry goes, the index it does not know stays): node-b
    // goes on once a take meets the index key, after the lease the entry had.
    match more {
        None => {
            cl.delete(c.full(&format!("inspect/queue/{:020}", 3)), None).await.unwrap();
            cl.delete(c.full(&format!("inspect/queue-args/{:020}", 3)), None).await.unwrap();
        }
        // A machine so slow that the lease ended: request 3 was delivered again, and is consumed here.
        Some(t3) => {
            assert_eq!((t3.request.id, t3.attempt), (3, 2));
            s.consume(&t3).await.unwrap();
        }
    }
    let pending: Vec<u64> = s.pending().await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(pending, [2, 4, 5, 6, 7]);
    tokio::time::sleep(Duration::from_millis(held_until.saturating_sub(ironguard_proto::time::now_ms()) + 50)).await;
    let t4 = s.take("w", LEASE).await.unwrap().expect("node-b's next request");
    assert_eq!((t4.request.id, t4.attempt), (4, 1));
    assert!(s.take("w", LEASE).await.unwrap().is_none(), "2, 5, 6, 7 and 4 are held");
    for t in [t2, t4, t5, t6, t7] {
        s.consume(&t).await.unwrap();
    }
    assert!(s.pending().await.unwrap().is_empty());
    drop(etcd);
}
