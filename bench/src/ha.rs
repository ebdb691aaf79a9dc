//! The HA benchmark: the test harness's HA site (3 PXE hosts with dnsmasq and agents, etcd and two control-plane
//! replicas, all in namespaces), a kernel watcher sampling every host every ~2 ms, and many failovers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_netns_tests::ha::{HaSite, TTL_SECS, Watcher, dual_open, signal_agent};
use ironguard_netns_tests::{verdict, wait_for};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::stats::{Samples, human, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Failovers per kind (SIGTERM, SIGKILL, partition).
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// etcd outages measured.
    #[arg(long, default_value_t = 5)]
    etcd_rounds: usize,
    #[arg(long, default_value = "bench-results/ha.json")]
    json: PathBuf,
}

/// One failover: which host leads, the kill, and when the successor opened (from the watcher's samples).
struct Failover {
    old: usize,
    new: usize,
    at: Instant,
}

/// Gap = the new leader's first open sample after the failover began, minus the old leader's last open sample
/// before that.
fn gaps(samples: &[Vec<(Instant, Instant, bool)>], failovers: &[Failover]) -> Vec<Duration> {
    failovers
        .iter()
        .filter_map(|f| {
            let new_open = samples[f.new].iter().filter(|s| s.2 && s.0 >= f.at).map(|s| s.0).min()?;
            let since = f.at.checked_sub(Duration::from_secs(5)).unwrap_or(f.at);
            let old_last =
                samples[f.old].iter().filter(|s| s.2 && s.0 >= since && s.0 <= new_open).map(|s| s.1).max()?;
            Some(new_open.saturating_duration_since(old_last))
        })
        .collect()
}

fn run_kind(site: &mut HaSite, kind: &str, rounds: usize) -> anyhow::Result<(Samples, usize, usize)> {
    let watcher = Watcher::start_raw(&site.hosts);
    let mut failovers = Vec::new();
    for round in 0..rounds {
        let (old, _) = site
            .wait_leader(None, Duration::from_secs(20))
            .with_context(|| format!("{kind} round {round}: no leader"))?;
        let at = Instant::now();
        match kind {
            "sigterm" => {
                signal_agent(&mut site.hosts[old], Signal::SIGTERM);
            }
            "sigkill" => {
                signal_agent(&mut site.hosts[old], Signal::SIGKILL);
            }
            _ => site.partition(old, true),
        }
        let (new, _) = site
            .wait_leader(Some(old), Duration::from_secs(15))
            .with_context(|| format!("{kind} round {round}: no successor"))?;
        failovers.push(Failover { old, new, at });
        match kind {
            "partition" => {
                site.partition(old, false);
                wait_for(Duration::from_secs(15), || (verdict(&site.hosts[old].ns) == "FOLLOWER").then_some(()))
                    .with_context(|| format!("round {round}: pxe-{old} did not rejoin"))?;
            }
            _ => {
                site.start_agent(old);
                wait_for(Duration::from_secs(15), || (verdict(&site.hosts[old].ns) == "FOLLOWER").then_some(()))
                    .with_context(|| format!("round {round}: restarted pxe-{old} did not follow"))?;
            }
        }
        if round % 10 == 9 {
            eprintln!("{kind}: {} rounds", round + 1);
        }
    }
    let samples = watcher.finish_raw();
    let n: usize = samples.iter().map(|s| s.len()).sum();
    let runs = ironguard_netns_tests::ha::certain_runs(&samples);
    let dual = dual_open(&runs).len();
    Ok((Samples::new(gaps(&samples, &failovers)), dual, n))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut site = HaSite::new(3, 1);
    site.wait_leader(None, Duration::from_secs(20)).context("no first leader")?;
    let mut rows = vec![];
    let mut out = serde_json::Map::new();
    let mut total_dual = 0;
    for (kind, goal) in [
        ("sigterm", "< 1 s".to_string()),
        ("sigkill", format!("≤ TTL + 1 s = {} s", TTL_SECS + 1)),
        ("partition", format!("≤ TTL + 1 s = {} s", TTL_SECS + 1)),
    ] {
        let (g, dual, samples) = run_kind(&mut site, kind, args.rounds)?;
        total_dual += dual;
        eprintln!("{kind}: p50 {} max {} dual-open {dual}", human(g.median()), human(g.percentile(100.0)));
        rows.push(format!(
            "| {kind} | {} | {} | {} | {} | {dual} | {samples} | {goal} |",
            g.len(),
            human(g.median()),
            human(g.percentile(99.0)),
            human(g.percentile(100.0))
        ));
        out.insert(
            kind.into(),
            json!({"rounds": g.len(), "gap_p50_ms": ms(g.median()), "gap_p99_ms": ms(g.percentile(99.0)),
                "gap_max_ms": ms(g.percentile(100.0)), "dual_open_instants": dual, "kernel_samples": samples}),
        );
    }
    // etcd outages: everyone closes; how long until a leader once etcd is back.
    let mut back = vec![];
    let mut closed = vec![];
    for _ in 0..args.etcd_rounds {
        site.wait_leader(None, Duration::from_secs(30)).context("no leader before the etcd outage")?;
        let t = Instant::now();
        site.etcd.stop();
        let c =
            wait_for(Duration::from_secs(10), || site.verdicts().iter().all(|v| v == "BLOCKED").then(|| t.elapsed()))
                .context("not every host blocked without etcd")?;
        closed.push(c);
        let t = Instant::now();
        site.etcd.restart();
        let (_, d) = site.wait_leader(None, Duration::from_secs(60)).context("no leader after etcd came back")?;
        back.push(d.max(t.elapsed().min(d)));
    }
    let (closed, back) = (Samples::new(closed), Samples::new(back));
    out.insert(
        "etcd_outage".into(),
        json!({"rounds": back.len(), "all_blocked_p50_ms": ms(closed.median()), "all_blocked_max_ms": ms(closed.percentile(100.0)),
            "leader_again_p50_ms": ms(back.median()), "leader_again_max_ms": ms(back.percentile(100.0))}),
    );
    println!(
        "ironguard HA benchmark — 3 PXE hosts (dnsmasq + agent each), etcd, 2 control-plane replicas; TTL {TTL_SECS} s, margin 1 s"
    );
    println!(
        "gap = new leader's first open kernel sample − old leader's last open sample (watcher samples every host every ~2 ms)"
    );
    println!();
    println!("| failover | rounds | gap p50 | gap p99 | gap max | dual-open instants | kernel samples | goal |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        println!("{r}");
    }
    println!();
    println!(
        "etcd outage ({} rounds): every host BLOCKED after p50 {} (max {}; goal ≤ TTL); a leader again p50 {} (max {}) after etcd is back",
        back.len(),
        human(closed.median()),
        human(closed.percentile(100.0)),
        human(back.median()),
        human(back.percentile(100.0))
    );
    println!("dual-open instants in total: {total_dual} (requirement: 0)");
    crate::write_json(&args.json, &serde_json::Value::Object(out))?;
    anyhow::ensure!(total_dual == 0, "two hosts were open at the same instant");
    Ok(())
}
