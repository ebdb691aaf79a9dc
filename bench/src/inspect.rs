//! The inspection benchmark: the fake Ironic (process) holding 10k nodes with one port each, the real control plane
//! (embedded store) and a real agent (as leader; its DHCP health check is off — there is no dnsmasq), all in one
//! network namespace. Every inspection waits for the agent to apply its allow before powering the node on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_netns_tests::{ControlPlane, FakeIronicProc, Netns, TempDir, in_netns, start_agent, verdict, wait_for};
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{ContinueRequest, GetFilterStateRequest, ListRequest, StartRequest};
use serde_json::json;

use crate::stats::{human, ms, vm_kib};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes (one port each) in the fake Ironic.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Inspections started at once.
    #[arg(long, default_value_t = 200)]
    inspections: usize,
    /// Inspection workers (0: the number of CPUs, the default of the control plane).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    #[arg(long, default_value = "bench-results/inspect.json")]
    json: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = TempDir::new("bench-inspect");
    let ns = Netns::new("bench-insp");
    let ironic = FakeIronicProc::start(&ns, &dir, 6385);
    // Populate through the admin API: node i gets port MAC mac_for_index(i).
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "curl", "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d"])
        .arg(json!({"nodes": args.nodes, "ports_per_node": 1, "provision_state": "manageable"}).to_string())
        .arg(format!("{}/_fake/populate", ironic.url))
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("populate answer")?;
    let uuids: Vec<String> =
        v["uuids"].as_array().context("uuids")?.iter().filter_map(|u| u.as_str().map(String::from)).collect();
    anyhow::ensure!(uuids.len() == args.nodes, "populated {} nodes", uuids.len());
    let cfg = dir.join("cp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[filter]\nunknown_mac_policy = \"deny\"\n[ironic]\nurl = \"{}\"\n[inspection]\nworkers = {}\npower_off = true\n\
             [sync]\nironic_inspection = false\n",
            ironic.url, args.workers
        ),
    )?;
    let started = Instant::now();
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
    let n = args.inspections.min(uuids.len());
    let targets: Vec<(String, ())> = uuids.iter().take(n).map(|u| (u.clone(), ())).collect();
    let nodes = args.nodes;
    let results = in_netns(&ns, move || -> anyhow::Result<serde_json::Value> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(async move {
            let ch = ironguard_netns_tests::pki::pki().operator_endpoint("https://127.0.0.1:9100").connect().await?;
            let mut filters = PxeFilterClient::new(ch.clone());
            // Ironic sync of all nodes/ports (measured from the control plane's start).
            loop {
                let st = filters
                    .get_filter_state(GetFilterStateRequest {
                        macs: vec!["00:00:00:00:00:01".into()].into_iter().filter(|_| false).collect(),
                    })
                    .await?
                    .into_inner();
                if st.deny_count as usize >= nodes {
                    break;
                }
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(120),
                    "sync never completed ({} denied)",
                    st.deny_count
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let sync = started.elapsed();
            let count = |state: &'static str| {
                let ch = ch.clone();
                async move {
                    let mut c = InspectionClient::new(ch);
                    let mut total = 0;
                    let mut token = String::new();
                    loop {
                        let r = c
                            .list(ListRequest { page_size: 1000, page_token: token, states: vec![state.into()] })
                            .await?
                            .into_inner();
                        total += r.inspections.len();
                        if r.next_page_token.is_empty() {
                            return anyhow::Ok(total);
                        }
                        token = r.next_page_token;
                    }
                }
            };
            // 200 inspections at once.
            let t0 = Instant::now();
            let mut joins = Vec::new();
            for (u, _) in &targets {
                let mut c = InspectionClient::new(ch.clone());
                let u = u.clone();
                joins.push(tokio::spawn(async move {
                    c.start(StartRequest { node: u, manage_boot: true, ..Default::default() }).await
                }));
            }
            for j in joins {
                j.await??;
            }
            let accepted = t0.elapsed();
            while count("waiting").await? < targets.len() {
                anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "not all waiting");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let all_waiting = t0.elapsed();
            // The MACs each inspection allowed (what the ramdisk will report).
            let mut macs = Vec::new();
            for (u, _) in &targets {
                let st = InspectionClient::new(ch.clone())
                    .get(ironguard_proto::v1::NodeRequest { node: u.clone() })
                    .await?
                    .into_inner();
                macs.push(st.macs.first().cloned().context("an inspected node with no MAC")?);
            }
            // Continue for each.
            let t1 = Instant::now();
            let mut joins = Vec::new();
            for mac in &macs {
                let mut c = InspectionClient::new(ch.clone());
                let data = json!({
                    "inventory": {
                        "interfaces": [{"name": "eth0", "mac_address": mac, "ipv4_address": "192.0.2.10"}],
                        "cpu": {"count": 8, "architecture": "x86_64"},
                        "memory": {"physical_mb": 65536},
                        "disks": [{"name": "/dev/sda", "size": 480_103_981_056u64}],
                    },
                    "root_disk": {"name": "/dev/sda", "size": 480_103_981_056u64},
                    "boot_interface": mac,
                })
                .to_string();
                joins.push(tokio::spawn(async move {
                    c.r#continue(ContinueRequest { node_uuid: String::new(), data_json: data }).await
                }));
            }
            for j in joins {
                j.await??;
            }
            while count("finished").await? < targets.len() {
                anyhow::ensure!(t1.elapsed() < Duration::from_secs(120), "not all finished");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let all_finished = t1.elapsed();
            Ok(json!({
                "sync_ms": ms(sync), "accepted_ms": ms(accepted), "all_waiting_ms": ms(all_waiting),
                "continue_all_finished_ms": ms(all_finished),
                "continue_per_second": targets.len() as f64 / all_finished.as_secs_f64(),
            }))
        })
    })?;
    let rss = vm_kib(cp_pid, "VmRSS:");
    let hwm = vm_kib(cp_pid, "VmHWM:");
    let workers = if args.workers == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    } else {
        args.workers
    };
    let f = |k: &str| results[k].as_f64().unwrap_or(0.0);
    println!(
        "ironguard inspection benchmark — fake Ironic with {} nodes (1 port each), real control plane (embedded store, {workers} workers) and agent, one namespace",
        args.nodes
    );
    println!();
    println!("| measurement | result | goal |");
    println!("|---|---:|---|");
    println!(
        "| {n} inspections started at once → all `waiting` (allow applied by the agent, PXE set, powered on) | {} (Start calls accepted in {}) | < 2 s |",
        human(Duration::from_secs_f64(f("all_waiting_ms") / 1e3)),
        human(Duration::from_secs_f64(f("accepted_ms") / 1e3))
    );
    println!(
        "| `Continue` for those {n} → all `finished` (data stored, allow removed, powered off) | {} ({:.0} per second) | throughput |",
        human(Duration::from_secs_f64(f("continue_all_finished_ms") / 1e3)),
        f("continue_per_second")
    );
    println!(
        "| Ironic sync of {} nodes/ports → deny set complete (from control-plane start) | {} | ≤ 5 s |",
        args.nodes,
        human(Duration::from_secs_f64(f("sync_ms") / 1e3))
    );
    println!(
        "| control-plane RSS with {} nodes known, {n} inspected | {:.1} MiB (peak {:.1} MiB) | < 60 MB |",
        args.nodes,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    let mut out = results;
    out["nodes"] = json!(args.nodes);
    out["inspections"] = json!(n);
    out["workers"] = json!(workers);
    out["controlplane_rss_kib"] = json!(rss);
    out["controlplane_peak_kib"] = json!(hwm);
    crate::write_json(&args.json, &out)?;
    drop(cp);
    Ok(())
}
