//! The hostile-callback benchmark (issue 23): what an attacker on the PXE network costs the control plane. The fake
//! Ironic (process) with one node, the real control plane (embedded store, the ironic-inspector API on loopback
//! with its default bounds) and a real agent (leader), in one network namespace.
//!
//! Two phases, measured side by side in one run, each `--rounds` inspections of the node: start (gRPC, no power),
//! wait for `waiting`, then its ramdisk's callback (`POST /v1/continue`, IPA-shaped data, from its own source
//! address) timed from the send to the whole reply, which must be 200; then wait for `finished`.
//! - quiet: nothing else.
//! - attack: meanwhile `--big-senders` tasks post maximum bodies (16 MiB less a few KiB) without pause, each body
//!   from the next of a pool of source addresses (so the per-source rate limit does not stop them), half a list of
//!   interfaces (many small values), half one long string (few values, much memory); and `--slow-senders`
//!   connections, each from its own address, send their headers and then one byte a second, reconnecting when cut.
//!
//! Reported per phase: the legitimate callback's reply latency (p50, p99, max), the control plane's peak RSS
//! (sampled every 20 ms), and what the attackers got (replies by status; slow connections cut with 408).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_netns_tests::{
    ControlPlane, FakeIronicProc, Netns, TempDir, in_netns, ipa_inventory, start_agent, verdict, wait_for,
};
use ironguard_proto::v1::NodeRequest;
use ironguard_proto::v1::StartRequest;
use ironguard_proto::v1::inspection_client::InspectionClient;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;

use crate::stats::{Samples, human, ms, vm_kib};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Inspections of the node per phase (each one legitimate callback).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Attackers posting maximum bodies without pause.
    #[arg(long, default_value_t = 8)]
    big_senders: usize,
    /// Connections that send their headers, then a byte a second.
    #[arg(long, default_value_t = 32)]
    slow_senders: usize,
    #[arg(long, default_value = "bench-results/hostile.json")]
    json: PathBuf,
}

const INSPECTOR: &str = "127.0.0.1:5050";
/// The control plane's default `continue_max_bytes`, less room for the JSON around the filling.
const BIG: usize = (16 << 20) - (8 << 10);

/// A maximum body: many small values (`interfaces`) or one long string.
fn big_body(many_values: bool) -> bytes::Bytes {
    let mut s = String::with_capacity(BIG + 256);
    if many_values {
        s.push_str(r#"{"inventory": {"interfaces": ["#);
        let mut i = 0u32;
        while s.len() < BIG {
            if i > 0 {
                s.push(',');
            }
            let b = i.to_be_bytes();
            s.push_str(&format!(
                r#"{{"name": "e{i}", "mac_address": "52:55:{:02x}:{:02x}:{:02x}:{:02x}"}}"#,
                b[0], b[1], b[2], b[3]
            ));
            i += 1;
        }
        s.push_str("]}}");
    } else {
        s.push_str(
            r#"{"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:56:00:00:00:01"}]}, "padding": ""#,
        );
        s.push_str(&"A".repeat(BIG - s.len()));
        s.push_str("\"}");
    }
    bytes::Bytes::from(s)
}

type Counts = Arc<Mutex<BTreeMap<String, u64>>>;

fn count(c: &Counts, key: impl Into<String>) {
    *c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(key.into()).or_insert(0) += 1;
}

/// One attacker posting maximum bodies until `stop`, each from the next source address of its pool.
async fn big_sender(k: usize, body: bytes::Bytes, stop: Arc<AtomicBool>, counts: Counts) {
    let mut j = 0usize;
    while !stop.load(Ordering::Relaxed) {
        j += 1;
        let ip = std::net::IpAddr::from([127, 6, k as u8, (j % 250 + 1) as u8]);
        let Ok(client) = reqwest::Client::builder().local_address(ip).timeout(Duration::from_secs(120)).build() else {
            count(&counts, "client error");
            continue;
        };
        match client.post(format!("http://{INSPECTOR}/v1/continue")).body(body.clone()).send().await {
            Ok(r) => count(&counts, r.status().as_u16().to_string()),
            Err(e) => {
                count(&counts, if e.is_timeout() { "timeout".to_string() } else { "connection error".to_string() })
            }
        }
    }
}

/// One slow connection at a time from its own address until `stop`: headers, then a byte a second.
async fn slow_sender(k: usize, stop: Arc<AtomicBool>, counts: Counts) {
    let ip = std::net::IpAddr::from([127, 7, 0, (k + 1) as u8]);
    while !stop.load(Ordering::Relaxed) {
        let Ok(sock) = tokio::net::TcpSocket::new_v4() else { return };
        if sock.bind((ip, 0).into()).is_err() {
            return;
        }
        let Ok(mut tcp) = sock.connect(INSPECTOR.parse().expect("address")).await else {
            count(&counts, "connect refused");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        count(&counts, "connections");
        let head = format!(
            "POST /v1/continue HTTP/1.1\r\nHost: {INSPECTOR}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
        );
        if tcp.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let mut buf = [0u8; 64];
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::select! {
                r = tcp.read(&mut buf) => {
                    let got: usize = r.unwrap_or_default();
                    let text = String::from_utf8_lossy(&buf[..got]);
                    count(&counts, if text.starts_with("HTTP/1.1 408") { "cut with 408" } else { "cut otherwise" });
                    break;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if tcp.write_all(b" ").await.is_err() {
                        count(&counts, "cut otherwise");
                        break;
                    }
                }
            }
        }
    }
}

async fn wait_state(ch: &Channel, node: &str, want: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let s = InspectionClient::new(ch.clone()).get(NodeRequest { node: node.into() }).await?.into_inner();
        if s.state == want {
            return Ok(());
        }
        anyhow::ensure!(s.state != "error", "the inspection failed: {}", s.error);
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "{node} never reached {want} (it is {})", s.state);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `rounds` inspections of `node`, each with one legitimate callback: their reply latencies.
async fn rounds(ch: &Channel, node: &str, body: &str, rounds: usize, phase: u8) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    for i in 0..rounds {
        InspectionClient::new(ch.clone())
            .start(StartRequest { node: node.into(), manage_boot: false, ..Default::default() })
            .await?;
        wait_state(ch, node, "waiting").await?;
        let ip = std::net::IpAddr::from([127, 5, phase, (i % 250 + 1) as u8]);
        let client = reqwest::Client::builder().local_address(ip).timeout(Duration::from_secs(120)).build()?;
        let t = Instant::now();
        let r = client.post(format!("http://{INSPECTOR}/v1/continue")).body(body.to_string()).send().await?;
        let status = r.status();
        let text = r.text().await?;
        out.push(t.elapsed());
        anyhow::ensure!(status == 200, "the legitimate callback got {status}: {text}");
        wait_state(ch, node, "finished").await?;
    }
    Ok(out)
}

/// The peak of the control plane's RSS while `stop` is not set, sampled every 20 ms.
fn sample_rss(pid: u32, peak: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            peak.fetch_max(vm_kib(pid, "VmRSS:"), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // reqwest is built without a default TLS provider (the workspace's is ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = TempDir::new("bench-hostile");
    let ns = Netns::new("bench-host");
    let ironic = FakeIronicProc::start(&ns, &dir, 6385);
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "curl", "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d"])
        .arg(json!({"nodes": 1, "ports_per_node": 1, "provision_state": "manageable"}).to_string())
        .arg(format!("{}/_fake/populate", ironic.url))
        .output()?;
    let v: Value = serde_json::from_slice(&out.stdout).context("populate answer")?;
    let node = v["uuids"][0].as_str().context("the node's UUID")?.to_string();
    // No evidence is asked of the callbacks (`callback_evidence = "none"`): every attacker's body then costs the
    // whole path (lookup included), the worst case for the bounds measured here.
    let cfg = dir.join("cp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ninspector_listen = \"{INSPECTOR}\"\n[filter]\nunknown_mac_policy = \"deny\"\n[ironic]\nurl = \"{}\"\n\
             [inspection]\npower_off = false\ncallback_evidence = \"none\"\n[sync]\nironic_inspection = false\n",
            ironic.url
        ),
    )?;
    let cp = ControlPlane::start(&ns, &dir, 9100, 9101, &["--config", cfg.to_str().context("path")?]);
    let cp_pid = cp.proc.pid() as u32;
    let agent_cfg = format!(
        "[agent]\nid = \"bench\"\nnetwork = \"bench\"\n[controlplane]\n{}endpoints = [\"{}\"]\n\
         [dhcp_health]\nudp_port = 0\n[admin]\nlisten = \"127.0.0.1:9181\"\n",
        ironguard_netns_tests::pki::pki().agent_toml("bench"),
        cp.url()
    );
    let _agent = start_agent(&ns, &dir, &agent_cfg, None);
    wait_for(Duration::from_secs(20), || (verdict(&ns) == "LEADER").then_some(())).context("agent never led")?;
    let ironic_url = ironic.url.clone();
    let a = (args.rounds, args.big_senders, args.slow_senders);
    let results = in_netns(&ns, move || -> anyhow::Result<Value> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(async move {
            let (n_rounds, n_big, n_slow) = a;
            let ch = ironguard_netns_tests::pki::pki().operator_endpoint("https://127.0.0.1:9100").connect().await?;
            let ports: Value = reqwest::Client::new()
                .get(format!("{ironic_url}/v1/ports?node_uuid={node}&fields=address"))
                .header("X-OpenStack-Ironic-API-Version", "1.81")
                .send()
                .await?
                .json()
                .await?;
            let mac = ports["ports"][0]["address"].as_str().context("the node's port")?.parse()?;
            let body = ipa_inventory(&[mac], "0.0.0.0").to_string();

            let stop = Arc::new(AtomicBool::new(false));
            let quiet_peak = Arc::new(AtomicU64::new(0));
            let sampler = sample_rss(cp_pid, quiet_peak.clone(), stop.clone());
            let quiet = rounds(&ch, &node, &body, n_rounds, 1).await?;
            stop.store(true, Ordering::Relaxed);
            sampler.await?;

            let stop = Arc::new(AtomicBool::new(false));
            let attack_peak = Arc::new(AtomicU64::new(0));
            let sampler = sample_rss(cp_pid, attack_peak.clone(), stop.clone());
            let (big_counts, slow_counts): (Counts, Counts) = Default::default();
            let bodies = [big_body(true), big_body(false)];
            let mut attackers = Vec::new();
            for k in 0..n_big {
                attackers.push(tokio::spawn(big_sender(k, bodies[k % 2].clone(), stop.clone(), big_counts.clone())));
            }
            for k in 0..n_slow {
                attackers.push(tokio::spawn(slow_sender(k, stop.clone(), slow_counts.clone())));
            }
            // The attack under way before the first legitimate callback.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let attack = rounds(&ch, &node, &body, n_rounds, 2).await;
            stop.store(true, Ordering::Relaxed);
            for t in attackers {
                let _ = tokio::time::timeout(Duration::from_secs(150), t).await;
            }
            sampler.await?;
            let attack = attack?;
            let lock = |c: &Counts| c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            Ok(json!({
                "quiet": phase_json(&quiet, quiet_peak.load(Ordering::Relaxed)),
                "attack": phase_json(&attack, attack_peak.load(Ordering::Relaxed)),
                "big_senders": n_big, "slow_senders": n_slow, "big_body_bytes": BIG,
                "big_replies": lock(&big_counts), "slow_outcomes": lock(&slow_counts),
            }))
        })
    })?;
    drop(cp);
    report(&args, &results)?;
    Ok(())
}

fn phase_json(lat: &[Duration], peak_kib: u64) -> Value {
    let s = Samples::new(lat.to_vec());
    json!({
        "callbacks": s.len(), "p50_ms": ms(s.median()), "p99_ms": ms(s.percentile(99.0)),
        "max_ms": ms(s.percentile(100.0)), "peak_rss_kib": peak_kib,
        "latencies_ms": s.sorted().iter().map(|d| ms(*d)).collect::<Vec<_>>(),
    })
}

fn report(args: &Args, r: &Value) -> anyhow::Result<()> {
    let f = |p: &str, k: &str| r[p][k].as_f64().unwrap_or(0.0);
    let d = |x: f64| human(Duration::from_secs_f64(x / 1e3));
    let mib = |p: &str| f(p, "peak_rss_kib") / 1024.0;
    println!(
        "ironguard hostile-callback benchmark — fake Ironic (1 node), real control plane (embedded store, default \
         [inspector_api] bounds) and agent, one namespace; {} inspections per phase",
        args.rounds
    );
    println!();
    println!("| phase | legitimate reply p50 | p99 | max | control-plane peak RSS | goal |");
    println!("|---|---:|---:|---:|---:|---|");
    println!(
        "| quiet | {} | {} | {} | {:.1} MiB | |",
        d(f("quiet", "p50_ms")),
        d(f("quiet", "p99_ms")),
        d(f("quiet", "max_ms")),
        mib("quiet")
    );
    println!(
        "| attack: {} senders of {:.1} MiB bodies, {} slow connections | {} | {} | {} | {:.1} MiB | p99 < 1 s, RSS < 200 MiB |",
        args.big_senders,
        BIG as f64 / (1 << 20) as f64,
        args.slow_senders,
        d(f("attack", "p50_ms")),
        d(f("attack", "p99_ms")),
        d(f("attack", "max_ms")),
        mib("attack")
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}×", a / b) } else { "—".into() };
    println!(
        "| attack / quiet | {} | {} | {} | {} | |",
        ratio(f("attack", "p50_ms"), f("quiet", "p50_ms")),
        ratio(f("attack", "p99_ms"), f("quiet", "p99_ms")),
        ratio(f("attack", "max_ms"), f("quiet", "max_ms")),
        ratio(mib("attack"), mib("quiet"))
    );
    println!();
    println!("attackers' replies (maximum bodies): {}", r["big_replies"]);
    println!("slow connections: {}", r["slow_outcomes"]);
    crate::write_json(&args.json, r)?;
    crate::write_svg(&crate::svg_path(&args.json), &svg(r))?;
    Ok(())
}

/// Two bar pairs, quiet beside attack: the legitimate callback's p99 (against the 1 s goal) and the peak RSS
/// (against the 200 MiB goal).
fn svg(r: &Value) -> String {
    let f = |p: &str, k: &str| r[p][k].as_f64().unwrap_or(0.0);
    let panels = [
        ("legitimate callback p99 (ms)", f("quiet", "p99_ms"), f("attack", "p99_ms"), 1000.0),
        (
            "control-plane peak RSS (MiB)",
            f("quiet", "peak_rss_kib") / 1024.0,
            f("attack", "peak_rss_kib") / 1024.0,
            200.0,
        ),
    ];
    let mut s = String::from(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"300\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"640\" height=\"300\" fill=\"white\"/>\n",
    );
    for (i, (title, quiet, attack, goal)) in panels.iter().enumerate() {
        let x0 = 40.0 + 310.0 * i as f64;
        let top = quiet.max(*attack).max(*goal) * 1.15;
        let y = |v: f64| 250.0 - 200.0 * v / top;
        s.push_str(&format!("<text x=\"{}\" y=\"30\">{title}</text>\n", x0));
        for (j, (label, v, colour)) in [("quiet", quiet, "#4a7ab5"), ("attack", attack, "#c0504d")].iter().enumerate() {
            let x = x0 + 30.0 + 110.0 * j as f64;
            s.push_str(&format!(
                "<rect x=\"{x}\" y=\"{:.1}\" width=\"70\" height=\"{:.1}\" fill=\"{colour}\"/>\n\
                 <text x=\"{x}\" y=\"268\">{label}</text><text x=\"{x}\" y=\"{:.1}\">{:.1}</text>\n",
                y(**v),
                250.0 - y(**v),
                y(**v) - 4.0,
                v
            ));
        }
        s.push_str(&format!(
            "<line x1=\"{x0}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\" stroke-dasharray=\"4\"/>\n\
             <text x=\"{}\" y=\"{:.1}\">goal {goal}</text>\n",
            x0 + 260.0,
            y(*goal),
            y(*goal),
            x0 + 200.0,
            y(*goal) - 4.0
        ));
    }
    s.push_str("</svg>\n");
    s
}
