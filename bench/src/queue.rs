//! `queue`: the etcd work queue at production scale — a 3-member etcd cluster (three members on their own
//! loopback addresses in a private namespace), queues of 10, 100 and 1,000 inspections, and the cost of enqueue,
//! take and pending at each length: the control plane's queue (an index read a few keys at a time) side by side
//! with the previous algorithm (every take reads and decodes the whole queue; pending reads each request's
//! arguments with a request of its own), re-implemented here on the same keys, in one run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use ironguard_coord::etcd::EtcdCoordinator;
use ironguard_inspection::records::Kind;
use ironguard_netns_tests::etcd::EtcdProcess;
use ironguard_netns_tests::{EtcdRelease, Netns, in_netns};
use serde_json::json;

use crate::stats::{Samples, human, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Queue lengths to measure at.
    #[arg(long, value_delimiter = ',', default_values_t = vec![10usize, 100, 1000])]
    lengths: Vec<usize>,
    /// Takes (and pendings) measured at each length.
    #[arg(long, default_value_t = 30)]
    samples: usize,
    /// Run the cluster on Debian 13's etcd 3.5 (scripts/etcd-release.sh) instead of Debian 12's 3.4.
    #[arg(long)]
    etcd_3_5: bool,
    #[arg(long, default_value = "bench-results/queue.json")]
    json: PathBuf,
}

/// One operation's samples at one length, for the new and the previous algorithm.
struct Row {
    length: usize,
    op: &'static str,
    new: Samples,
    old: Samples,
    /// Bytes of queue entries one previous-algorithm take read (the whole queue); the new one reads at most 16
    /// index keys and 8 entries.
    old_bytes: Option<usize>,
}

/// The previous algorithm's take: the whole queue prefix, decoded, the oldest available request whose node has
/// nothing older in flight, taken by compare-and-swap on its modification revision; its arguments read after.
/// Returns what it read (bytes) and how to give the request back (its key, original bytes).
async fn old_take(cl: &mut etcd_client::Client, root: &str) -> anyhow::Result<(usize, Option<(String, Vec<u8>)>)> {
    let r = cl.get(format!("{root}queue/"), Some(GetOptions::new().with_prefix())).await?;
    let bytes: usize = r.kvs().iter().map(|kv| kv.key().len() + kv.value().len()).sum();
    let now = ironguard_proto::time::now_ms();
    let mut busy = std::collections::BTreeSet::new();
    let mut entries = Vec::new();
    for kv in r.kvs() {
        let v: serde_json::Value = serde_json::from_slice(kv.value())?;
        let node = v["request"]["node"].as_str().unwrap_or_default().to_string();
        let held = v["worker"].is_string() && v["lease_until"].as_u64().unwrap_or(0) > now;
        if held {
            busy.insert(node.clone());
        }
        entries.push((kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision(), node, held, v));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (key, raw, rev, node, held, mut v) in entries {
        let first = seen.insert(node.clone());
        if held || !first || busy.contains(&node) {
            continue;
        }
        v["worker"] = json!("bench");
        v["lease_until"] = json!(now + 60_000);
        let key_s = String::from_utf8_lossy(&key).into_owned();
        let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)]).and_then([TxnOp::put(
            key.clone(),
            serde_json::to_vec(&v)?,
            None,
        )]);
        if cl.txn(txn).await?.succeeded() {
            let id = key_s.rsplit('/').next().unwrap_or_default().to_string();
            cl.get(format!("{root}queue-args/{id}"), None).await?;
            return Ok((bytes, Some((key_s, raw))));
        }
    }
    Ok((bytes, None))
}

/// The previous algorithm's enqueue: the sequence read, then one transaction (sequence, entry, arguments).
async fn old_enqueue(cl: &mut etcd_client::Client, root: &str, node: &str) -> anyhow::Result<()> {
    let seq = format!("{root}seq");
    loop {
        let r = cl.get(seq.clone(), None).await?;
        let (last, rev) = r
            .kvs()
            .first()
            .map(|kv| (String::from_utf8_lossy(kv.value()).parse::<u64>().unwrap_or(0), kv.mod_revision()))
            .unwrap_or((0, 0));
        let id = last + 1;
        let entry = json!({"request": {"id": id, "node": node, "kind": "start", "args": null,
            "enqueued_at": ironguard_proto::time::now_ms()}, "worker": null, "lease_until": 0, "attempts": 0,
            "available_at": 0});
        let guard = if rev == 0 {
            Compare::create_revision(seq.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(seq.clone(), CompareOp::Equal, rev)
        };
        let txn = Txn::new().when([guard]).and_then([
            TxnOp::put(seq.clone(), id.to_string(), None),
            TxnOp::put(format!("{root}queue/{id:020}"), serde_json::to_vec(&entry)?, None),
            TxnOp::put(format!("{root}queue-args/{id:020}"), b"{\"manage_boot\":true}".to_vec(), None),
        ]);
        if cl.txn(txn).await?.succeeded() {
            return Ok(());
        }
    }
}

/// The previous algorithm's pending: the queue, then each request's arguments, one read each.
async fn old_pending(cl: &mut etcd_client::Client, root: &str) -> anyhow::Result<usize> {
    let r = cl.get(format!("{root}queue/"), Some(GetOptions::new().with_prefix())).await?;
    for kv in r.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let id = key.rsplit('/').next().unwrap_or_default().to_string();
        cl.get(format!("{root}queue-args/{id}"), None).await?;
    }
    Ok(r.kvs().len())
}

async fn timed<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<(Duration, T)> {
    let t = Instant::now();
    let v = f.await?;
    Ok((t.elapsed(), v))
}

async fn measure(urls: Vec<String>, lengths: Vec<usize>, samples: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &len in &lengths {
        // A fresh prefix per length and algorithm: nothing of one measurement is in another's way.
        let cfg =
            |prefix: String| ironguard_coord::EtcdConfig { endpoints: urls.clone(), prefix, ..Default::default() };
        let c = EtcdCoordinator::connect(&cfg(format!("/bench-new-{len}"))).await?;
        let store = ironguard_controlplane::store::etcd::open(c, 100).await?.inspections;
        let old_c = EtcdCoordinator::connect(&cfg(format!("/bench-old-{len}"))).await?;
        let old_root = old_c.full("inspect/");
        let mut cl = old_c.client();
        // Enqueue: the queue grows to `len`, one node per request (every request is its node's first: all ready).
        let (mut new_enq, mut old_enq) = (Vec::new(), Vec::new());
        for i in 0..len {
            let node = format!("node-{i:05}");
            let (d, _) =
                timed(async { Ok(store.enqueue(&node, Kind::Start, json!({"manage_boot": true})).await?) }).await?;
            new_enq.push(d);
            let (d, _) = timed(old_enqueue(&mut cl, &old_root, &node)).await?;
            old_enq.push(d);
        }
        rows.push(Row {
            length: len,
            op: "enqueue",
            new: Samples::new(new_enq),
            old: Samples::new(old_enq),
            old_bytes: None,
        });
        // Take at length `len`: each taken request is given back at once (not measured), so the length stays.
        let (mut new_take, mut old_take_s, mut bytes) = (Vec::new(), Vec::new(), 0);
        for _ in 0..samples {
            let (d, t) = timed(async { Ok(store.take("bench", Duration::from_secs(60)).await?) }).await?;
            let t = t.context("the new queue had nothing to take")?;
            new_take.push(d);
            store.release(&t, Duration::ZERO).await?;
            let (d, (b, back)) = timed(old_take(&mut cl, &old_root)).await?;
            let (key, raw) = back.context("the previous algorithm had nothing to take")?;
            old_take_s.push(d);
            bytes = b;
            cl.put(key, raw, None).await?;
        }
        rows.push(Row {
            length: len,
            op: "take",
            new: Samples::new(new_take),
            old: Samples::new(old_take_s),
            old_bytes: Some(bytes),
        });
        let (mut new_p, mut old_p) = (Vec::new(), Vec::new());
        for _ in 0..samples.min(10) {
            let (d, p) = timed(async { Ok(store.pending().await?) }).await?;
            anyhow::ensure!(p.len() == len, "pending listed {} of {len}", p.len());
            new_p.push(d);
            let (d, n) = timed(old_pending(&mut cl, &old_root)).await?;
            anyhow::ensure!(n == len, "the previous pending listed {n} of {len}");
            old_p.push(d);
        }
        rows.push(Row {
            length: len,
            op: "pending",
            new: Samples::new(new_p),
            old: Samples::new(old_p),
            old_bytes: None,
        });
        eprintln!("  length {len}: measured");
    }
    Ok(rows)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let release = if args.etcd_3_5 { EtcdRelease::Debian13 } else { EtcdRelease::Debian12 };
    let ns = Netns::new("bench-queue");
    let hosts = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];
    let cluster: Vec<String> = hosts.iter().enumerate().map(|(i, h)| format!("m{i}=http://{h}:2380")).collect();
    let token = format!("bench-queue-{}", std::process::id());
    let members: Vec<EtcdProcess> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| EtcdProcess::launch_member(ns.name(), h, &format!("m{i}"), &cluster.join(","), &token, release))
        .collect();
    for m in &members {
        m.wait_up(Duration::from_secs(30));
    }
    let urls: Vec<String> = members.iter().map(|m| m.url.clone()).collect();
    eprintln!("== work queue on a 3-member etcd {} cluster: {urls:?}", release.minor());
    let (lengths, samples) = (args.lengths.clone(), args.samples);
    let rows = in_netns(&ns, move || -> anyhow::Result<Vec<Row>> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(measure(urls, lengths, samples))
    })?;
    println!();
    println!(
        "ironguard work queue on a 3-member etcd {} cluster (loopback, one host): median per operation",
        release.minor()
    );
    println!();
    println!(
        "| queue length | operation | ironguard (index) p50 | p99 | previous algorithm p50 | p99 | previous / ironguard | previous take reads |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut out = Vec::new();
    for r in &rows {
        let ratio = ms(r.old.median()) / ms(r.new.median()).max(1e-6);
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1}× | {} |",
            r.length,
            r.op,
            human(r.new.median()),
            human(r.new.percentile(99.0)),
            human(r.old.median()),
            human(r.old.percentile(99.0)),
            ratio,
            r.old_bytes.map(|b| format!("{} KiB", b / 1024)).unwrap_or_default(),
        );
        out.push(json!({
            "length": r.length, "op": r.op, "samples": r.new.len(),
            "new_p50_ms": ms(r.new.median()), "new_p99_ms": ms(r.new.percentile(99.0)),
            "old_p50_ms": ms(r.old.median()), "old_p99_ms": ms(r.old.percentile(99.0)),
            "old_over_new": ratio, "old_take_bytes_read": r.old_bytes,
        }));
    }
    let value = json!({
        "etcd": release.minor(), "members": 3, "rows": out,
        "note": "the previous algorithm re-implemented in the benchmark on the same key layout; each taken request \
                 is given back at once (not measured) so the queue keeps its length",
    });
    crate::write_json(&args.json, &value)?;
    crate::write_chart(&args.json, crate::plot::Kind::Queue, &value);
    drop(members);
    Ok(())
}
