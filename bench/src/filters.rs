//! The filter-service benchmark: the real control plane and agents (release binaries next to this one), each
//! agent in its own network namespace, joined to the benchmark's private namespace by a management bridge.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use ironguard_dataplane::MacAddr;
use ironguard_proto::v1::UpdatePxeFiltersRequest;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use serde_json::json;
use tonic::transport::Channel;

use crate::stats::{Samples, human, macs, ms, vm_kib};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// MACs loaded (deny) before latencies are measured.
    #[arg(long, default_value_t = 10_000)]
    loaded: usize,
    /// Single-MAC updates timed for latency, per agent count.
    #[arg(long, default_value_t = 1000)]
    updates: usize,
    /// Single-MAC updates in the burst.
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    /// Requests in flight during the burst.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// MACs loaded for the memory measurement.
    #[arg(long, default_value_t = 100_000)]
    rss_macs: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/filters.json")]
    json: PathBuf,
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe.parent().context("exe dir")?.join(name);
    if !p.exists() {
        bail!("{} missing: cargo build --release --workspace --bins", p.display());
    }
    Ok(p)
}

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let st = Command::new(args[0]).args(&args[1..]).status().with_context(|| format!("running {args:?}"))?;
    if !st.success() {
        bail!("{args:?} failed");
    }
    Ok(())
}

/// Everything the benchmark started; removed on drop.
struct Topology {
    namespaces: Vec<String>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A thread inside an agent's namespace that answers "how long until the allow set does (not) hold this MAC?".
struct Observer {
    tx: std_mpsc::Sender<(MacAddr, bool, Instant)>,
    rx: std_mpsc::Receiver<Result<Duration, String>>,
}

fn observer(ns: &str, set: &'static str) -> anyhow::Result<Observer> {
    let path = format!("/run/netns/{ns}");
    let (qtx, qrx) = std_mpsc::channel::<(MacAddr, bool, Instant)>();
    let (atx, arx) = std_mpsc::channel();
    let f = File::open(&path)?;
    thread::spawn(move || {
        if nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
            return;
        }
        while let Ok((mac, present, t0)) = qrx.recv() {
            let deadline = t0 + Duration::from_secs(10);
            let r = loop {
                match ironguard_dataplane::set_members(set) {
                    Ok(m) if m.contains(&mac) == present => break Ok(t0.elapsed()),
                    Ok(_) => {}
                    Err(e) if Instant::now() > deadline => break Err(e.to_string()),
                    Err(_) => {}
                }
                if Instant::now() > deadline {
                    break Err(format!("{mac} present={present} not seen within 10 s"));
                }
                thread::sleep(Duration::from_micros(50));
            };
            if atx.send(r).is_err() {
                return;
            }
        }
    });
    Ok(Observer { tx: qtx, rx: arx })
}

impl Observer {
    fn ask(&self, mac: MacAddr, present: bool, t0: Instant) -> anyhow::Result<()> {
        self.tx.send((mac, present, t0)).map_err(|_| anyhow::anyhow!("observer gone"))
    }

    fn answer(&self) -> anyhow::Result<Duration> {
        self.rx.recv()?.map_err(|e| anyhow::anyhow!(e))
    }
}

/// Waits until every observer sees `mac` in (or out of) its set; returns the slowest.
fn wait_all(obs: &[&Observer], mac: MacAddr, present: bool, t0: Instant) -> anyhow::Result<Duration> {
    for o in obs {
        o.ask(mac, present, t0)?;
    }
    let mut worst = Duration::ZERO;
    for o in obs {
        worst = worst.max(o.answer()?);
    }
    Ok(worst)
}

fn count_in(ns: &str, set: &'static str) -> anyhow::Result<usize> {
    let f = File::open(format!("/run/netns/{ns}"))?;
    thread::spawn(move || -> anyhow::Result<usize> {
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)?;
        Ok(ironguard_dataplane::set_members(set)?.len())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("observer panicked"))?
}

fn wait_count(ns: &str, set: &'static str, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        // The agent's table may not exist yet (ENOENT): keep waiting.
        if count_in(ns, set).is_ok_and(|c| c >= n) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            bail!("{ns}: {set} did not reach {n} elements within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn agent_metric(ns: &str, name: &str) -> f64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sf", "--max-time", "2", "http://127.0.0.1:9181/metrics"])
        .output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.starts_with('#')).find_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                k.starts_with(name).then(|| v.parse().ok())?
            })
        })
        .unwrap_or(0.0)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("private network namespace (run as root)")?;
    let cp_bin = sibling("ironguard-controlplane")?;
    let agent_bin = sibling("ironguard-agent")?;
    let dir = std::env::temp_dir().join(format!("ironguard-bench-filters-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut topo = Topology { namespaces: vec![], children: vec![], dir: dir.clone() };
    sh(&["ip", "link", "set", "lo", "up"])?;
    sh(&["ip", "link", "add", "br-mgmt", "type", "bridge"])?;
    sh(&["ip", "addr", "add", "10.98.0.1/24", "dev", "br-mgmt"])?;
    sh(&["ip", "link", "set", "br-mgmt", "up"])?;
    let cp_log = File::create(dir.join("cp.log"))?;
    let cp = Command::new(&cp_bin)
        .args(["--grpc-listen", "10.98.0.1:9100", "--admin-listen", "127.0.0.1:9101", "--data-dir"])
        .arg(dir.join("cp"))
        .args(ironguard_netns_tests::pki::pki().controlplane_args())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(cp_log)
        .spawn()?;
    let cp_pid = cp.id();
    topo.children.push(cp);

    let start_agent = |topo: &mut Topology, i: usize| -> anyhow::Result<(String, u32)> {
        let ns = format!("ig-bench-{}-a{i}", std::process::id());
        sh(&["ip", "netns", "add", &ns])?;
        topo.namespaces.push(ns.clone());
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        sh(&["ip", "link", "add", &format!("vm{i}"), "type", "veth", "peer", "name", "mgmt0", "netns", &ns])?;
        sh(&["ip", "link", "set", &format!("vm{i}"), "master", "br-mgmt", "up"])?;
        sh(&["ip", "-n", &ns, "addr", "add", &format!("10.98.0.{}/24", 10 + i), "dev", "mgmt0"])?;
        sh(&["ip", "-n", &ns, "link", "set", "mgmt0", "up"])?;
        let cfg = dir.join(format!("agent{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[agent]\nid = \"bench-a{i}\"\nnetwork = \"bench\"\n[controlplane]\n{}endpoints = [\"https://10.98.0.1:9100\"]\n\
                 [dhcp_health]\nudp_port = 0\n[admin]\nlisten = \"127.0.0.1:9181\"\n",
                ironguard_netns_tests::pki::pki().agent_toml(&format!("bench-a{i}"))
            ),
        )?;
        let log = File::create(dir.join(format!("agent{i}.log")))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(&agent_bin)
            .arg("--config")
            .arg(&cfg)
            .arg("run")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let pid = child.id();
        topo.children.push(child);
        Ok((ns, pid))
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let client: PxeFilterClient<Channel> = rt.block_on(async {
        for _ in 0..100 {
            let ep = ironguard_netns_tests::pki::pki().operator_endpoint("https://10.98.0.1:9100");
            if let Ok(ch) = ep.connect().await {
                let c = PxeFilterClient::new(ch);
                return Ok(c.max_decoding_message_size(256 << 20).max_encoding_message_size(256 << 20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("control plane did not start (log: {})", dir.join("cp.log").display())
    })?;
    let update = |allow: Vec<MacAddr>, deny: Vec<MacAddr>, remove: Vec<MacAddr>| {
        let mut c = client.clone();
        let req = UpdatePxeFiltersRequest {
            allow: allow.iter().map(|m| m.to_string()).collect(),
            deny: deny.iter().map(|m| m.to_string()).collect(),
            remove: remove.iter().map(|m| m.to_string()).collect(),
            remove_reason: String::new(),
        };
        async move { c.update_pxe_filters(req).await.map(|r| r.into_inner().revision) }
    };

    // Load, then one agent.
    let loaded = macs(args.loaded, 0xd0);
    rt.block_on(update(vec![], loaded.clone(), vec![]))?;
    let (ns1, agent1_pid) = start_agent(&mut topo, 1)?;
    wait_count(&ns1, "deny_mac", args.loaded, Duration::from_secs(30))?;
    let o1 = observer(&ns1, "allow_mac")?;
    let probe = macs(args.updates, 0x11);
    let measure = |obs: &[&Observer]| -> anyhow::Result<Samples> {
        let mut lat = Vec::with_capacity(probe.len());
        for m in &probe {
            let t0 = Instant::now();
            rt.block_on(update(vec![*m], vec![], vec![]))?;
            lat.push(wait_all(obs, *m, true, t0)?);
            let t1 = Instant::now();
            rt.block_on(update(vec![], vec![], vec![*m]))?;
            wait_all(obs, *m, false, t1)?;
        }
        Ok(Samples::new(lat))
    };
    let one = measure(&[&o1])?;
    eprintln!("1 agent: p50 {} p99 {}", human(one.median()), human(one.percentile(99.0)));

    // Three agents.
    let (ns2, _) = start_agent(&mut topo, 2)?;
    let (ns3, _) = start_agent(&mut topo, 3)?;
    wait_count(&ns2, "deny_mac", args.loaded, Duration::from_secs(30))?;
    wait_count(&ns3, "deny_mac", args.loaded, Duration::from_secs(30))?;
    let o2 = observer(&ns2, "allow_mac")?;
    let o3 = observer(&ns3, "allow_mac")?;
    let three = measure(&[&o1, &o2, &o3])?;
    eprintln!("3 agents: p50 {} p99 {}", human(three.median()), human(three.percentile(99.0)));

    // Burst of single-MAC updates.
    let tx_before: Vec<f64> =
        [&ns1, &ns2, &ns3].iter().map(|ns| agent_metric(ns, "ironguard_agent_kernel_transactions")).collect();
    let burst = macs(args.burst, 0xb0);
    let t0 = Instant::now();
    rt.block_on(async {
        use futures::StreamExt as _;
        let results: Vec<_> = futures::stream::iter(burst.iter().copied())
            .map(|m| update(vec![m], vec![], vec![]))
            .buffer_unordered(args.concurrency)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<_>, _>>()
    })?;
    let acked = t0.elapsed();
    for ns in [&ns1, &ns2, &ns3] {
        wait_count(ns, "allow_mac", args.burst, Duration::from_secs(60))?;
    }
    let applied_all = t0.elapsed();
    thread::sleep(Duration::from_millis(300));
    let tx_after: Vec<f64> =
        [&ns1, &ns2, &ns3].iter().map(|ns| agent_metric(ns, "ironguard_agent_kernel_transactions")).collect();
    let burst_tx: Vec<u64> = tx_after.iter().zip(&tx_before).map(|(a, b)| (a - b) as u64).collect();
    let in_set: Vec<usize> = [&ns1, &ns2, &ns3].iter().map(|ns| count_in(ns, "allow_mac")).collect::<Result<_, _>>()?;
    eprintln!("burst: acked {} applied everywhere {} transactions {burst_tx:?}", human(acked), human(applied_all));

    // Memory with many MACs.
    let extra = args.rss_macs.saturating_sub(args.loaded);
    let more = macs(extra, 0xe0);
    for chunk in more.chunks(50_000) {
        rt.block_on(update(vec![], chunk.to_vec(), vec![]))?;
    }
    wait_count(&ns1, "deny_mac", args.loaded + extra, Duration::from_secs(60))?;
    thread::sleep(Duration::from_millis(500));
    let agent_rss = vm_kib(agent1_pid, "VmRSS:");
    let agent_hwm = vm_kib(agent1_pid, "VmHWM:");
    let cp_rss = vm_kib(cp_pid, "VmRSS:");
    let cp_hwm = vm_kib(cp_pid, "VmHWM:");
    let loaded_total = count_in(&ns1, "deny_mac")?;
    let _: BTreeSet<MacAddr> = BTreeSet::new();

    println!(
        "ironguard filter-service benchmark — real control plane and agents (release), each agent in its own network namespace"
    );
    println!();
    println!("| measurement | result | goal |");
    println!("|---|---:|---|");
    println!(
        "| UpdatePxeFilters → MAC in the kernel set, 1 agent, {} MACs loaded ({} updates) | p50 {} / p99 {} | p99 < 20 ms |",
        args.loaded,
        one.len(),
        human(one.median()),
        human(one.percentile(99.0))
    );
    println!(
        "| UpdatePxeFilters → MAC in the kernel sets of all 3 agents ({} updates) | p50 {} / p99 {} | p99 < 20 ms |",
        three.len(),
        human(three.median()),
        human(three.percentile(99.0))
    );
    println!(
        "| burst: {} single-MAC updates, {} in flight | all acked in {}; in all 3 kernels after {}; kernel transactions per agent {:?}; elements {:?} | all applied |",
        args.burst,
        args.concurrency,
        human(acked),
        human(applied_all),
        burst_tx,
        in_set
    );
    println!(
        "| agent RSS with {} MACs in the deny set (+{} allowed) | {:.1} MiB (peak {:.1} MiB) | < 20 MB |",
        loaded_total,
        args.burst,
        agent_rss as f64 / 1024.0,
        agent_hwm as f64 / 1024.0
    );
    println!(
        "| control plane RSS with {} MACs | {:.1} MiB (peak {:.1} MiB) | < 60 MB |",
        args.loaded + extra + args.burst,
        cp_rss as f64 / 1024.0,
        cp_hwm as f64 / 1024.0
    );
    let results = json!({
        "loaded": args.loaded,
        "latency_1_agent": latency_json(&one),
        "latency_3_agents": latency_json(&three),
        "burst": {"updates": args.burst, "concurrency": args.concurrency, "acked_ms": ms(acked),
            "applied_everywhere_ms": ms(applied_all), "kernel_transactions_per_agent": burst_tx, "allow_elements": in_set},
        "rss": {"macs": loaded_total, "agent_kib": agent_rss, "agent_peak_kib": agent_hwm, "controlplane_kib": cp_rss,
            "controlplane_peak_kib": cp_hwm},
    });
    crate::write_json(&args.json, &results)?;
    crate::write_chart(&args.json, crate::plot::Kind::Filters, &results);
    drop(topo);
    Ok(())
}

/// `latency_1_agent` / `latency_3_agents`: UpdatePxeFilters → kernel latencies (the chart reads them all).
pub(crate) fn latency_json(s: &Samples) -> serde_json::Value {
    json!({"updates": s.len(), "p50_ms": ms(s.median()), "p99_ms": ms(s.percentile(99.0))})
}
