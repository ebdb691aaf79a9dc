//! The filter store's contract, run against both backends — the embedded store and a real etcd on loopback: a
//! change of reasons that moves no MAC between sets makes no revision but is stored (a second allow reason must
//! outlive the first, and survive a restart), each reason keeps the time it was added, and each entry the revision
//! that last changed its membership (what `ironguardctl explain` reports). A large `UpdatePxeFilters` call (more
//! MACs than one etcd transaction may hold) is one revision that no reader sees half of. And the inspection
//! store's lookup index, on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ironguard_controlplane::filter::{ReasonChange, Side, api_changes};
use ironguard_controlplane::store::{FilterStore, InspectionStore};
use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::Attributes;
use ironguard_inspection::records::NodeRecord;
use ironguard_netns_tests::etcd::EtcdProcess;
use ironguard_netns_tests::{EtcdRelease, on_both_etcd_releases as on_both};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn inspection(mac: MacAddr, present: bool) -> Vec<ReasonChange> {
    vec![ReasonChange { mac, side: Side::Allow, reason: "inspection:node-1".into(), present }]
}

/// Runs the contract on a store that `open` opens (again, for the restart) on the same durable state.
async fn contract<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn FilterStore>>,
{
    let mac: MacAddr = "52:54:00:44:00:01".parse().unwrap();
    let t0 = now_ms();
    let (api_since, allowed_at, epoch) = {
        let s = open().await;
        let a = s.apply(api_changes(&[mac.to_string()], &[], &[]).unwrap(), None).await.unwrap();
        assert!(a.record.is_some(), "allowing a new MAC is a revision");
        let r1 = a.revision;
        // A second allow reason: no revision, but stored.
        let b = s.apply(inspection(mac, true), None).await.unwrap();
        assert_eq!((b.revision, b.record), (r1, None), "a second reason moves no MAC: no revision");
        let e = wait_entry(s.as_ref(), mac, |e| e.allow.contains("inspection:node-1")).await;
        let since: Vec<(String, u64)> = e.allow.with_since().map(|(r, t)| (r.to_string(), t)).collect();
        assert_eq!(since.len(), 2, "{since:?}");
        for (r, t) in &since {
            assert!(*t >= t0 && *t <= now_ms(), "reason {r} stamped {t}, written after {t0}");
        }
        assert_eq!(e.changed_revision, r1, "the revision that allowed the MAC");
        // Dropping the api reason keeps the MAC allowed by the inspection's reason.
        let c = s.apply(api_changes(&[], &[], &[mac.to_string()]).unwrap(), None).await.unwrap();
        assert_eq!((c.revision, c.record), (r1, None));
        assert!(s.snapshot().allow.contains(&mac), "the inspection's reason still allows the MAC");
        let epoch = s.epoch();
        assert!(!epoch.is_empty(), "a written store has an epoch");
        assert_eq!(s.snapshot().epoch, epoch);
        (since.iter().find(|(r, _)| r == "inspection:node-1").unwrap().1, r1, epoch)
    };
    // After a restart the reason, its time, the revision and the store's epoch are still there.
    let s = open().await;
    assert_eq!(s.epoch(), epoch, "the same store, the same history");
    assert_eq!(s.resume(allowed_at, &epoch).map(|d| d.len()), Some(0));
    assert!(s.resume(allowed_at, "another").is_none(), "no deltas for another epoch's revision");
    let e = wait_entry(s.as_ref(), mac, |e| !e.allow.contains("api")).await;
    assert_eq!(e.allow.with_since().collect::<Vec<_>>(), vec![("inspection:node-1", api_since)]);
    assert_eq!(e.changed_revision, allowed_at);
    assert!(s.snapshot().allow.contains(&mac));
    // Dropping the last reason is a revision, recorded on the entry while it lives and in the log.
    let d = s.apply(inspection(mac, false), None).await.unwrap();
    assert_eq!(d.revision, allowed_at + 1);
    assert_eq!(d.record.unwrap().delta.allow_remove, vec![mac]);
    assert!(!s.snapshot().allow.contains(&mac));
}

/// The entry for `mac` once `ready` holds (the etcd backend's mirror follows its watch).
async fn wait_entry(
    s: &dyn FilterStore,
    mac: MacAddr,
    ready: impl Fn(&ironguard_controlplane::filter::Entry) -> bool,
) -> ironguard_controlplane::filter::Entry {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, entries) = s.entries(&[mac]);
        if let Some((_, e)) = entries.into_iter().next() {
            if ready(&e) {
                return e;
            }
        }
        assert!(std::time::Instant::now() < deadline, "the entry for {mac} never reached the expected state");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_keeps_every_reason_with_its_time() {
    let dir = std::env::temp_dir().join(format!("ig-store-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.clone();
    contract(move || {
        let d = d.clone();
        async move { ironguard_controlplane::store::embedded::open(&d, 100).unwrap().filters }
    })
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
}

on_both!(check_etcd_store_keeps_every_reason_with_its_time: etcd_store_keeps_every_reason_with_its_time, etcd_store_keeps_every_reason_with_its_time_on_etcd_3_5);
async fn check_etcd_store_keeps_every_reason_with_its_time(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release("store-contract", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    contract(move || {
        let cfg = cfg.clone();
        async move {
            let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
            ironguard_controlplane::store::etcd::open(c, 100).await.unwrap().filters
        }
    })
    .await;
    drop(etcd);
}

on_both!(check_a_singleton_write_after_the_lead_moved_is_refused_and_writes_nothing: a_singleton_write_after_the_lead_moved_is_refused_and_writes_nothing, a_singleton_write_after_the_lead_moved_is_refused_and_writes_nothing_on_etcd_3_5);
/// A singleton task's write carries the control-plane lead it runs under (O18). While that lead holds, the write
/// commits; once another replica has won the election (the first replica paused past its lease: its session is
/// gone), the first one's write is refused, says why, and writes nothing. Real etcd: the check is etcd's own
/// compare in the commit's transaction.
async fn check_a_singleton_write_after_the_lead_moved_is_refused_and_writes_nothing(release: EtcdRelease) {
    use ironguard_controlplane::store::{Fence, StoreError};
    use ironguard_coord::Coordinator as _;
    use tokio_util::sync::CancellationToken;
    let etcd = EtcdProcess::start_loopback_release("store-fence", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    let coord = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    let store = ironguard_controlplane::store::etcd::open(coord.clone(), 100).await.unwrap().filters;
    let (m1, m2): (MacAddr, MacAddr) = ("52:54:00:44:01:01".parse().unwrap(), "52:54:00:44:01:02".parse().unwrap());
    let ttl = std::time::Duration::from_secs(5);

    let a = coord.session(ttl).await.unwrap();
    let lead_a = coord.campaign("controlplane", "replica-a", &a, CancellationToken::new()).await.unwrap();
    let fence_a = Fence::from(&lead_a);
    let written = store.apply_fenced(inspection(m1, true), None, &fence_a).await.unwrap();
    assert!(written.record.is_some(), "the leader's write commits");

    // Replica a stops (its lease ends: revoked here, as etcd does when it expires); replica b takes the lead.
    coord.revoke(&a).await.unwrap();
    let b = coord.session(ttl).await.unwrap();
    let lead_b = coord.campaign("controlplane", "replica-b", &b, CancellationToken::new()).await.unwrap();
    assert_ne!(lead_b.revision, lead_a.revision);
    let before = store.snapshot();
    let refused = store.apply_fenced(inspection(m2, true), None, &fence_a).await.unwrap_err();
    assert!(matches!(refused, StoreError::Fenced(_)), "{refused}");
    assert!(refused.to_string().contains("no longer leads the control plane"), "{refused}");
    // A write that moves no MAC (a second reason) is fenced the same way.
    let second = vec![ReasonChange { mac: m1, side: Side::Allow, reason: "inspection:node-2".into(), present: true }];
    assert!(matches!(store.apply_fenced(second, None, &fence_a).await, Err(StoreError::Fenced(_))));
    // Nothing was written: read back from etcd by a store opened afresh, not from this replica's mirror.
    let fresh = ironguard_controlplane::store::etcd::open(coord.clone(), 100).await.unwrap().filters;
    assert_eq!(fresh.snapshot().revision, before.revision);
    assert!(!fresh.snapshot().allow.contains(&m2));
    let (_, e) = fresh.entries(&[m1]);
    assert!(!e[0].1.allow.contains("inspection:node-2"), "{e:?}");

    // The new leader's write commits.
    let written = store.apply_fenced(inspection(m2, true), None, &Fence::from(&lead_b)).await.unwrap();
    assert_eq!(written.revision, before.revision + 1);
    let _ = coord.revoke(&b).await;
    drop(etcd);
}

/// The inspection store's lookup index against both backends (`/v1/continue` looks nodes up through it): a record
/// is found by each of its MACs and BMC addresses and by its UUID, by its new keys only once they change, by none
/// once removed, and after a restart; a record with more MACs than one etcd transaction may hold is indexed as well.
async fn lookup_contract<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn InspectionStore>>,
{
    let mac = |i: u32| -> MacAddr { format!("52:54:00:45:{:02x}:{:02x}", i / 256, i % 256).parse().unwrap() };
    let by_macs = |macs: Vec<MacAddr>| Attributes { macs, ..Default::default() };
    let by_bmc = |b: &str| Attributes { bmc_addresses: vec![b.into()], ..Default::default() };
    async fn uuids(s: &dyn InspectionStore, a: &Attributes) -> Vec<String> {
        let mut v: Vec<String> = s.lookup_candidates(a).await.unwrap().into_iter().map(|r| r.uuid).collect();
        v.sort();
        v
    }
    {
        let s = open().await;
        let mut a = NodeRecord::new("node-a", now_ms());
        a.macs = vec![mac(1)];
        a.bmc_addresses = vec!["redfish+https://10.0.0.1:8000/redfish/v1/Systems/1".into()];
        s.save(&mut a).await.unwrap();
        let mut b = NodeRecord::new("node-b", now_ms());
        b.macs = vec![mac(2), mac(3)];
        s.save(&mut b).await.unwrap();
        assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(1)])).await, ["node-a"]);
        assert_eq!(uuids(s.as_ref(), &by_bmc("10.0.0.1")).await, ["node-a"], "the BMC address, normalised");
        assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(1), mac(3)])).await, ["node-a", "node-b"]);
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(9)])).await.is_empty());
        let named = Attributes { node_uuid: Some("node-b".into()), ..Default::default() };
        assert_eq!(uuids(s.as_ref(), &named).await, ["node-b"]);
        // new keys replace the old ones
        b.macs = vec![mac(4)];
        s.save(&mut b).await.unwrap();
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(2), mac(3)])).await.is_empty(), "the old MACs are gone");
        assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(4)])).await, ["node-b"]);
        // a save that lost its race changes nothing the lookup sees
        let mut stale = b.clone();
        stale.version -= 1;
        stale.macs = vec![mac(2)];
        assert!(s.save(&mut stale).await.is_err());
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(2)])).await.is_empty());
        // a record with more keys than one transaction holds (etcd: 128 operations by default)
        let mut big = NodeRecord::new("node-big", now_ms());
        big.macs = (100..400).map(mac).collect();
        s.save(&mut big).await.unwrap();
        assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(399)])).await, ["node-big"]);
        big.macs = (400..700).map(mac).collect();
        s.save(&mut big).await.unwrap();
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(100), mac(399)])).await.is_empty());
        assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(699)])).await, ["node-big"]);
        s.remove("node-big").await.unwrap();
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(400), mac(699)])).await.is_empty());
        s.remove("node-a").await.unwrap();
        assert!(uuids(s.as_ref(), &by_macs(vec![mac(1)])).await.is_empty());
        assert!(uuids(s.as_ref(), &by_bmc("10.0.0.1")).await.is_empty());
    }
    let s = open().await;
    assert_eq!(uuids(s.as_ref(), &by_macs(vec![mac(1), mac(4)])).await, ["node-b"], "after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_lookup_index_follows_every_record() {
    let dir = std::env::temp_dir().join(format!("ig-lookup-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.clone();
    lookup_contract(move || {
        let d = d.clone();
        async move { ironguard_controlplane::store::embedded::open(&d, 100).unwrap().inspections }
    })
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
}

on_both!(check_etcd_lookup_index_follows_every_record_and_is_built_for_older_records: etcd_lookup_index_follows_every_record_and_is_built_for_older_records, etcd_lookup_index_follows_every_record_and_is_built_for_older_records_on_etcd_3_5);
/// As above on a real etcd; and records written before the index existed (by an older version) are indexed by the
/// first lookup of a store opened on them.
async fn check_etcd_lookup_index_follows_every_record_and_is_built_for_older_records(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release("lookup-contract", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    let open = move || {
        let cfg = cfg.clone();
        async move {
            let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
            ironguard_controlplane::store::etcd::open(c, 100).await.unwrap().inspections
        }
    };
    lookup_contract(open.clone()).await;

    // An older version's records: saved, then their index keys and the marker deleted, as if never written.
    let s = open().await;
    let m: MacAddr = "52:54:00:45:ff:01".parse().unwrap();
    let mut old = NodeRecord::new("node-old", now_ms());
    old.macs = vec![m];
    old.bmc_addresses = vec!["10.0.0.77".into()];
    s.save(&mut old).await.unwrap();
    let c = ironguard_coord::etcd::EtcdCoordinator::connect(&ironguard_coord::EtcdConfig {
        endpoints: vec![etcd.url.clone()],
        ..Default::default()
    })
    .await
    .unwrap();
    let lookup_prefix = c.full("inspect/lookup/");
    let mut client = c.client();
    let gone =
        client.delete(lookup_prefix.clone(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    assert!(gone.deleted() >= 3, "node-b's MAC, node-old's MAC and BMC, the marker: {}", gone.deleted());
    let fresh = open().await;
    let found: Vec<String> = fresh
        .lookup_candidates(&Attributes { macs: vec![m], ..Default::default() })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uuid)
        .collect();
    assert_eq!(found, ["node-old"], "the index was built from the records");
    let keys =
        client.get(lookup_prefix, Some(etcd_client::GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    let keys: Vec<String> = keys.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect();
    assert!(keys.iter().any(|k| k.ends_with("lookup/complete")), "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with("/node-b")), "every record, not only the one looked up: {keys:?}");
    drop(etcd);
}

/// A large call (1,000 MACs: ten times what one etcd transaction of the default `--max-txn-ops` 128 holds) is one
/// revision, seen whole or not at all by every reader: `readers` poll their snapshots while it is written (the
/// writer's own store, and on etcd another replica following by its watch, as agents are served) and never see
/// part of it; the revision log holds it as one delta; a store opened afterwards holds all of it. Then the same
/// for removing them all.
async fn large_call_contract(writer: Arc<dyn FilterStore>, readers: Vec<Arc<dyn FilterStore>>) {
    let macs: Vec<String> =
        (0..1000u32).map(|i| format!("52:54:01:{:02x}:{:02x}:{:02x}", i >> 16, (i >> 8) & 0xff, i & 0xff)).collect();
    let parsed: Vec<MacAddr> = macs.iter().map(|m| m.parse().unwrap()).collect();
    for (step, changes) in
        [("allow", api_changes(&macs, &[], &[]).unwrap()), ("remove", api_changes(&[], &[], &macs).unwrap())]
    {
        let before = writer.snapshot().revision;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut watchers = Vec::new();
        for r in &readers {
            let (r, stop, parsed) = (r.clone(), stop.clone(), parsed.clone());
            watchers.push(tokio::spawn(async move {
                let mut seen = std::collections::BTreeSet::new();
                loop {
                    let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                    let snap = r.snapshot();
                    let n = parsed.iter().filter(|m| snap.allow.contains(m)).count();
                    seen.insert((snap.revision, n));
                    if done {
                        return seen;
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
        let applied = writer.apply(changes, None).await.unwrap();
        assert_eq!(applied.revision, before + 1, "{step}: one revision");
        let record = applied.record.expect("a revision record");
        let (added, removed) = (record.delta.allow_add.len(), record.delta.allow_remove.len());
        assert_eq!(if step == "allow" { (added, removed) } else { (removed, added) }, (1000, 0), "{step}: one delta");
        // Every reader reaches the revision, then stops.
        for r in &readers {
            for _ in 0..500 {
                if r.snapshot().revision >= applied.revision {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let whole = if step == "allow" { 1000 } else { 0 };
        let none = 1000 - whole;
        for (i, w) in watchers.into_iter().enumerate() {
            let seen = w.await.unwrap();
            for (rev, n) in &seen {
                assert!(*n == whole || *n == none, "{step}: reader {i} saw {n} of the 1000 MACs at revision {rev}");
                assert_eq!(*n == whole, *rev >= applied.revision, "{step}: reader {i} saw {n} at revision {rev}");
            }
            assert!(seen.iter().any(|(rev, _)| *rev >= applied.revision), "{step}: reader {i} reached it");
        }
        let deltas = readers[readers.len() - 1].deltas_since(before).expect("in the log");
        assert_eq!(deltas.len(), 1, "{step}: one delta for agents");
        assert_eq!(deltas[0].delta.len(), 1000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_store_makes_a_large_call_one_revision() {
    let dir = std::env::temp_dir().join(format!("ig-store-large-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = ironguard_controlplane::store::embedded::open(&dir, 100).unwrap().filters;
    large_call_contract(s.clone(), vec![s]).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

on_both!(check_etcd_store_makes_a_large_call_one_revision: etcd_store_makes_a_large_call_one_revision, etcd_store_makes_a_large_call_one_revision_on_etcd_3_5);
/// On etcd with its default limits (`--max-txn-ops` 128); a replica opened after the call holds all of it.
async fn check_etcd_store_makes_a_large_call_one_revision(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release_default_limits("store-large", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    let open = || async {
        let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
        ironguard_controlplane::store::etcd::open(c, 100).await.unwrap().filters
    };
    let (writer, replica) = (open().await, open().await);
    large_call_contract(writer.clone(), vec![writer.clone(), replica]).await;
    let fresh = open().await;
    assert_eq!(fresh.snapshot(), writer.snapshot(), "a store opened afterwards holds the same state");
    // No staging or commit record is left behind.
    let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    let mut client = c.client();
    let left = client
        .get(c.full("filter/staged/"), Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert!(left.kvs().is_empty(), "staging removed");
    assert!(client.get(c.full("filter/commit"), None).await.unwrap().kvs().is_empty(), "commit record removed");
    drop(etcd);
}

on_both!(check_etcd_store_finishes_a_large_call_its_writer_did_not: etcd_store_finishes_a_large_call_its_writer_did_not, etcd_store_finishes_a_large_call_its_writer_did_not_on_etcd_3_5);
/// A writer that dies after committing a large call, before moving its entries in place (here: its commit record
/// and staged entries written by hand, as it leaves them): a store opened then holds the whole call, and the next
/// write finishes the move first, so nothing of it is lost.
async fn check_etcd_store_finishes_a_large_call_its_writer_did_not(release: EtcdRelease) {
    let etcd = EtcdProcess::start_loopback_release_default_limits("store-finish", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    let c = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    let s = ironguard_controlplane::store::etcd::open(c.clone(), 100).await.unwrap().filters;
    let first: MacAddr = "52:54:00:46:00:01".parse().unwrap();
    let a = s.apply(api_changes(&[first.to_string()], &[], &[]).unwrap(), None).await.unwrap();
    // What the dead writer left: 300 staged entries, meta at the next revision, its record and the commit record.
    let (_, e) = s.entries(&[first]);
    let entry = serde_json::to_vec(&e[0].1).unwrap();
    let mut client = c.client();
    let id = "00000000000000000001-00000000000000aa";
    let macs: Vec<MacAddr> =
        (0..300u32).map(|i| format!("52:54:00:47:{:02x}:{:02x}", i >> 8, i & 0xff).parse().unwrap()).collect();
    client.put(c.full(&format!("filter/staged/{id}")), "1", None).await.unwrap();
    for m in &macs {
        client.put(c.full(&format!("filter/staged/{id}/{m}")), entry.clone(), None).await.unwrap();
    }
    let meta = client.get(c.full("filter/meta"), None).await.unwrap();
    let mut meta: serde_json::Value = serde_json::from_slice(meta.kvs()[0].value()).unwrap();
    let revision = a.revision + 1;
    meta["revision"] = revision.into();
    let record = serde_json::json!({"revision": revision, "delta": {"allow_add": macs, "allow_remove": [], "deny_add": [], "deny_remove": []}});
    let txn = etcd_client::Txn::new().and_then([
        etcd_client::TxnOp::put(c.full("filter/meta"), serde_json::to_vec(&meta).unwrap(), None),
        etcd_client::TxnOp::put(
            c.full(&format!("filter/log/{revision:020}")),
            serde_json::to_vec(&record).unwrap(),
            None,
        ),
        etcd_client::TxnOp::put(
            c.full("filter/commit"),
            serde_json::to_vec(&serde_json::json!({"id": id, "revision": revision})).unwrap(),
            None,
        ),
    ]);
    client.txn(txn).await.unwrap();
    // The running replica saw it whole through its watch; one opened now too.
    for _ in 0..500 {
        if s.snapshot().revision >= revision {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let fresh = ironguard_controlplane::store::etcd::open(c.clone(), 100).await.unwrap().filters;
    for st in [&s, &fresh] {
        let snap = st.snapshot();
        assert_eq!(snap.revision, revision);
        assert!(macs.iter().all(|m| snap.allow.contains(m)), "the whole call");
    }
    // The next write finishes the move, then writes.
    let last: MacAddr = "52:54:00:46:00:02".parse().unwrap();
    let b = fresh.apply(api_changes(&[last.to_string()], &[], &[]).unwrap(), None).await.unwrap();
    assert_eq!(b.revision, revision + 1);
    assert!(client.get(c.full("filter/commit"), None).await.unwrap().kvs().is_empty(), "move finished");
    let entries = client
        .get(c.full("filter/entries/"), Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert_eq!(entries.kvs().len(), 302, "every staged entry moved in place, and the two written");
    let again = ironguard_controlplane::store::etcd::open(c, 100).await.unwrap().filters;
    assert_eq!(again.snapshot().allow.len(), 302);
    drop(etcd);
}

on_both!(check_etcd_store_follows_the_writes_after_a_restore_it_re_seeded: etcd_store_follows_the_writes_after_a_restore_it_re_seeded, etcd_store_follows_the_writes_after_a_restore_it_re_seeded_on_etcd_3_5);
/// etcd restored from a snapshot taken before a MAC was denied: the replica sees its filter state go back, re-seeds
/// etcd from its own copy (the MAC stays denied) — and then follows what is written after, although the restored
/// store's revisions start again far below the last one the replica's watch had seen (here 40 other writes went
/// between the snapshot and the deny: etcd's revision 42 before, 5 after). Written while looking for O34's cause:
/// a replica that went back to watching from its old revision would miss every write below it.
async fn check_etcd_store_follows_the_writes_after_a_restore_it_re_seeded(release: EtcdRelease) {
    use ironguard_coord::Coordinator as _;
    let mut etcd = EtcdProcess::start_loopback_release("store-restore", release);
    let cfg = ironguard_coord::EtcdConfig { endpoints: vec![etcd.url.clone()], ..Default::default() };
    let coord = ironguard_coord::etcd::EtcdCoordinator::connect(&cfg).await.unwrap();
    let store = ironguard_controlplane::store::etcd::open(coord.clone(), 100).await.unwrap().filters;
    let (m1, m2): (MacAddr, MacAddr) = ("52:54:00:44:02:01".parse().unwrap(), "52:54:00:44:02:02".parse().unwrap());
    store.apply(api_changes(&[m1.to_string()], &[], &[]).unwrap(), None).await.unwrap();
    wait_entry(store.as_ref(), m1, |e| e.allow.contains("api")).await;

    let snapshot = std::env::temp_dir().join(format!("ig-store-restore-{}-{}.db", std::process::id(), now_ms()));
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.url, "snapshot", "save"])
        .arg(&snapshot)
        .output()
        .unwrap();
    assert!(out.status.success(), "etcdctl snapshot save: {}", String::from_utf8_lossy(&out.stderr));
    for i in 0..40 {
        coord.put(&format!("other/{i}"), b"x".to_vec(), None).await.unwrap();
    }
    let denied = store.apply(api_changes(&[], &[m1.to_string()], &[]).unwrap(), None).await.unwrap();
    wait_entry(store.as_ref(), m1, |e| e.deny.contains("api") && !e.allow.contains("api")).await;
    assert!(store.snapshot().deny.contains(&m1));

    etcd.stop();
    etcd.restore_from(&snapshot, None).unwrap();
    etcd.launch();
    etcd.wait_up(std::time::Duration::from_secs(60));
    let _ = std::fs::remove_file(&snapshot);

    // The replica notices and re-seeds etcd from its copy.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !store.amnesia().is_some_and(|a| a.contains("re-seeded")) {
        assert!(std::time::Instant::now() < deadline, "no re-seed after the restore: {:?}", store.amnesia());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(store.snapshot().deny.contains(&m1), "the deny outlives the restore");
    assert!(!store.snapshot().allow.contains(&m1), "nothing loosened by the restore");

    // A write after it reaches the replica's copy.
    let allowed = store.apply(api_changes(&[m2.to_string()], &[], &[]).unwrap(), None).await.unwrap();
    assert!(allowed.revision > denied.revision, "{allowed:?} after {denied:?}");
    wait_entry(store.as_ref(), m2, |e| e.allow.contains("api")).await;
    let s = store.snapshot();
    assert!(s.allow.contains(&m2) && s.deny.contains(&m1), "the copy after the restore: {s:?}");
    assert!(*store.revision().borrow() >= allowed.revision);
}
