//! The HA benchmark: the fault matrix of the tests (`ironguard_netns_tests::faults`), many rounds per fault, on the
//! 3-host HA site (dnsmasq and an agent per host, etcd, two control-plane replicas, all in namespaces), with a
//! kernel watcher sampling every host every ~2 ms and two DHCP probes (an allowed MAC and an unknown one; the
//! policy is deny). Per fault: the serving gap, dual-open time (must be 0), double offers (must be 0), offers to
//! the unknown MAC (must be 0), for a leader frozen, starved or cut from etcd when its kernel stopped serving
//! relative to its lease's end, and for SIGTERM how long the agent took to exit. Then SIGTERM → exit of every agent
//! with etcd down (the state in which agents used to wait for coordination news), and the guard: how fast a plain
//! guard is repaired after tampering. These are the figures the end-to-end tests no longer bound by time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_netns_tests::faults::{Fault, Round, run_round};
use ironguard_netns_tests::ha::{
    Election, HaOptions, HaSite, MARGIN_MS, TTL_SECS, Watcher, certain_runs, dual_open, probe_results, signal_agent,
};
use ironguard_netns_tests::{EtcdRelease, PxeLan, agent_toml, chains_json, ctl, in_netns, mac, start_agent, wait_for};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::stats::{Samples, human, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds per fault.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Rounds of "etcd down, then SIGTERM to every agent" (3 agents each).
    #[arg(long, default_value_t = 5)]
    etcd_down_sigterm_rounds: usize,
    /// Only these faults (names as printed, e.g. `sigterm`, `sigstop 2xTTL`); all by default.
    #[arg(long = "fault")]
    faults: Vec<String>,
    /// Guard tamper rounds per kind (delete table, flush chain, flush ruleset) against a plain guard.
    #[arg(long, default_value_t = 20)]
    tamper_rounds: usize,
    #[arg(long, default_value = "bench-results/ha.json")]
    json: PathBuf,
    /// Run the site on Debian 13's etcd 3.5 (scripts/etcd-release.sh) instead of Debian 12's 3.4.
    #[arg(long)]
    etcd_3_5: bool,
}

const KNOWN: &str = "52:54:00:fb:00:01";
const UNKNOWN: &str = "52:54:00:fb:00:99";

/// Intervals during which at least one host was certainly open.
fn site_open(runs: &[Vec<(Instant, Instant)>]) -> Vec<(Instant, Instant)> {
    let mut all: Vec<(Instant, Instant)> = runs.iter().flatten().copied().collect();
    all.sort();
    let mut out: Vec<(Instant, Instant)> = Vec::new();
    for (a, b) in all {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The longest time nobody served between the injection and the end of the round (0 if service never stopped).
fn serving_gap(open: &[(Instant, Instant)], round: &Round, end: Instant) -> Duration {
    let mut gap = Duration::ZERO;
    let mut prev_end: Option<Instant> = open.iter().filter(|(a, _)| *a <= round.injected).map(|(_, b)| *b).max();
    for &(a, b) in open.iter().filter(|(a, _)| *a > round.injected && *a <= end) {
        if let Some(p) = prev_end {
            gap = gap.max(a.saturating_duration_since(p));
        }
        prev_end = Some(prev_end.map_or(b, |p| p.max(b)));
    }
    gap
}

/// For a leader whose DHCP server answers nobody, its open table serves nobody: the gap is from the fault until
/// another host's table is certainly open.
fn answering_gap(runs: &[Vec<(Instant, Instant)>], round: &Round) -> Duration {
    runs.iter()
        .enumerate()
        .filter(|(i, _)| *i != round.leader)
        .flat_map(|(_, r)| r.iter())
        .filter(|(a, _)| *a > round.injected)
        .map(|(a, _)| a.duration_since(round.injected))
        .min()
        .unwrap_or_else(|| round.serving_at.duration_since(round.injected))
}

/// When the frozen leader's kernel stopped serving, relative to its lease's end (negative: before).
fn fence_to_stop(samples: &[Vec<(Instant, Instant, bool)>], round: &Round) -> Option<f64> {
    let deadline = round.lease_deadline?;
    let first_closed = samples[round.leader].iter().find(|s| s.0 >= round.injected && !s.2)?;
    let stop = first_closed.1;
    Some(if stop >= deadline { ms(stop - deadline) } else { -ms(deadline - stop) })
}

pub(crate) struct FaultResult {
    fault: Fault,
    gaps: Samples,
    /// The same gaps in round order (the JSON's `gaps_ms`).
    gaps_in_order: Vec<Duration>,
    dual_ms: f64,
    doubles: usize,
    unknown_offers: usize,
    discovers: usize,
    fence_to_stop: Vec<f64>,
    /// SIGTERM → exit of each round that sent one.
    stopped_in: Vec<Duration>,
    /// For the quorum loss: from both members serving again to a host serving.
    after_etcd_back: Vec<Duration>,
    /// Rounds after which another host led.
    handovers: usize,
}

/// The agents' TTL and margin for `fault`: the cluster faults run with the agent's defaults (riding out an etcd
/// election depends on them), the others with the tests' shorter TTL (what their rows were measured with).
fn election(fault: Fault) -> Election {
    if fault.needs_cluster() { Election::DEFAULTS } else { Election::TESTS }
}

/// One fault's rounds on a fresh site: etcd of `release`, a three-member cluster for [`Fault::CLUSTER`]'s faults.
fn run_fault(fault: Fault, rounds: usize, release: EtcdRelease) -> anyhow::Result<FaultResult> {
    let mut site = HaSite::with_options(HaOptions {
        hosts: 3,
        nodes: 2,
        policy: "deny",
        lost_after_secs: 3,
        etcd: release,
        etcd_members: if fault.needs_cluster() { 3 } else { 1 },
        election: election(fault),
        ..Default::default()
    });
    site.wait_leader(None, Duration::from_secs(30)).context("no first leader")?;
    let out = ctl(&site.mgmt, &["--controlplane", "https://10.90.0.1:9100", "filters", "allow", KNOWN]);
    anyhow::ensure!(out.status.success(), "allowing the probe's MAC failed: {out:?}");
    wait_for(Duration::from_secs(10), || site.dhcp(0, mac(KNOWN))).context("the allowed MAC is not served")?;
    let watcher = Watcher::start_raw(&site.hosts);
    let known = site.spawn_probe(0, mac(KNOWN), 36000.0, 0.25, 0);
    let unknown = site.spawn_probe(1, mac(UNKNOWN), 36000.0, 0.5, 0);
    let mut done = Vec::new();
    let mut failed = None;
    for r in 0..rounds {
        match run_round(&mut site, fault) {
            Ok(round) => done.push((round, Instant::now())),
            Err(e) => {
                failed = Some(anyhow::anyhow!("{} round {r}: {e}", fault.name()));
                break;
            }
        }
        if r % 5 == 4 {
            eprintln!("{}: {} rounds", fault.name(), r + 1);
        }
    }
    for p in [&known, &unknown] {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.id() as i32), Signal::SIGTERM);
    }
    let (known, unknown) = (probe_results(known), probe_results(unknown));
    if let Some(e) = failed {
        return Err(e);
    }
    let samples = watcher.finish_raw();
    let runs = certain_runs(&samples);
    let open = site_open(&runs);
    let gaps: Vec<Duration> = done
        .iter()
        .map(|(r, end)| match fault {
            Fault::DhcpFrozen | Fault::DhcpNoRange => answering_gap(&runs, r),
            _ => serving_gap(&open, r, *end),
        })
        .collect();
    let dual_ms = dual_open(&runs).iter().map(|(_, _, d)| ms(*d)).sum::<f64>() + 0.0;
    Ok(FaultResult {
        fault,
        gaps: Samples::new(gaps.clone()),
        gaps_in_order: gaps,
        dual_ms,
        doubles: known.iter().filter(|(_, s)| s.len() > 1).count(),
        unknown_offers: unknown.iter().filter(|(_, s)| !s.is_empty()).count(),
        discovers: known.len(),
        fence_to_stop: done.iter().filter_map(|(r, _)| fence_to_stop(&samples, r)).collect(),
        stopped_in: done.iter().filter_map(|(r, _)| r.stopped_in).collect(),
        after_etcd_back: done
            .iter()
            .filter_map(|(r, _)| r.etcd_back_at.map(|b| r.serving_at.saturating_duration_since(b)))
            .collect(),
        handovers: done.iter().filter(|(r, _)| r.serving != r.leader).count(),
    })
}

impl FaultResult {
    /// Kernel stop − lease end of each round that has one, sorted.
    fn fence_to_stop_sorted(&self) -> Vec<f64> {
        let mut f2s = self.fence_to_stop.clone();
        f2s.sort_by(f64::total_cmp);
        f2s
    }

    /// The fault's entry of the JSON (the chart reads `rounds`, `gap_p50_ms`, `gap_p99_ms`, `gap_max_ms` and
    /// `gaps_ms`: every round's gap, in round order).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let g = &self.gaps;
        json!({"rounds": g.len(), "gap_p50_ms": ms(g.median()), "gap_p99_ms": ms(g.percentile(99.0)),
            "gap_max_ms": ms(g.percentile(100.0)), "dual_open_ms": self.dual_ms, "double_offers": self.doubles,
            "unknown_offers": self.unknown_offers, "discovers": self.discovers,
            "kernel_stop_minus_lease_end_ms": self.fence_to_stop_sorted(),
            "handovers": self.handovers,
            "serving_after_etcd_back_ms": self.after_etcd_back.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "ttl_secs": election(self.fault).ttl_secs, "margin_ms": election(self.fault).margin_ms,
            "sigterm_to_exit_ms": Samples::new(self.stopped_in.clone()).sorted().iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "gaps_ms": self.gaps_in_order.iter().map(|d| ms(*d)).collect::<Vec<_>>()})
    }

    /// A result as `run_fault` makes one, with these gaps (round order) and nothing else seen.
    #[cfg(test)]
    pub(crate) fn sample(fault: Fault, gaps: Vec<Duration>) -> Self {
        Self {
            fault,
            gaps: Samples::new(gaps.clone()),
            gaps_in_order: gaps,
            dual_ms: 0.0,
            doubles: 0,
            unknown_offers: 0,
            discovers: 40,
            fence_to_stop: vec![],
            stopped_in: vec![],
            after_etcd_back: vec![],
            handovers: 0,
        }
    }
}

fn goal(f: Fault) -> String {
    match f {
        Fault::Sigterm => "gap p99 < 50 ms; exit < 1 s".into(),
        Fault::Sigkill => "gap ≤ TTL + 2 s".into(),
        Fault::SigkillRestart => "serving again p99 < 1 s".into(),
        Fault::Sigstop | Fault::CpuStarve | Fault::CutEtcd | Fault::Partition | Fault::EtcdStop => {
            "kernel stops ≤ 10 ms after the lease's end".into()
        }
        Fault::DhcpFrozen | Fault::DhcpNoRange => "serving again ≤ 3 s after the fault; 0 dual-open".into(),
        Fault::EtcdStall => "no gap, no hand-over".into(),
        Fault::EtcdLeaderMemberKill
        | Fault::EtcdFollowerMemberKill
        | Fault::EtcdLeaderMemberCut
        | Fault::EtcdLeaderPeersCut
        | Fault::EtcdRollingRestart => "no gap (etcd keeps its quorum)".into(),
        Fault::EtcdQuorumLoss => "all closed; a leader ≤ TTL + 1 s after the quorum returns".into(),
        Fault::EtcdRestore | Fault::EtcdRestoreBumped => "nothing loosened; 0 dual-open".into(),
        _ => "0 dual-open, 0 double offers".into(),
    }
}

/// SIGTERM → exit of every agent while etcd is down and every session has expired (what the end-to-end test
/// `sigterm_is_served_at_once_while_etcd_is_down` no longer bounds): a fresh site per round.
fn sigterm_with_etcd_down(rounds: usize) -> anyhow::Result<Samples> {
    let mut took = Vec::new();
    for r in 0..rounds {
        let mut site = HaSite::new(3, 1);
        site.wait_leader(None, Duration::from_secs(30)).context("no first leader")?;
        site.etcd.stop();
        wait_for(Duration::from_secs(30), || site.verdicts().iter().all(|v| v == "BLOCKED").then_some(()))
            .with_context(|| format!("round {r}: not all blocked with etcd down: {:?}", site.verdicts()))?;
        // Well into the expired state, as in the test: sessions gone, reconnection attempts under way.
        std::thread::sleep(Duration::from_secs(2));
        for h in &mut site.hosts {
            let t = Instant::now();
            let st = signal_agent(h, Signal::SIGTERM).with_context(|| format!("round {r}: {} did not exit", h.id))?;
            anyhow::ensure!(st.success(), "round {r}: {} exited with {st}", h.id);
            took.push(t.elapsed());
        }
    }
    Ok(Samples::new(took))
}

/// A plain guard (`[guard] claim = false`) tampered with while the agent runs: time from the `nft` command's
/// return until the guard is back, read from the kernel every ~1 ms.
fn tamper_repairs(rounds: usize) -> anyhow::Result<Vec<(&'static str, Samples)>> {
    let lan = PxeLan::new(1);
    let cp =
        ironguard_netns_tests::ControlPlane::start(&lan.pxe, &lan.dir, 9100, 9101, &["--unknown-mac-policy", "deny"]);
    let toml = agent_toml("bench-tamper", &cp.url(), "br0", "127.0.0.1:9181", 30) + "\n[guard]\nclaim = false\n";
    let _agent = start_agent(&lan.pxe, &lan.dir, &toml, None);
    wait_for(Duration::from_secs(10), || (chains_json(&lan.pxe)["verdict"] == "LEADER").then_some(()))
        .context("the agent did not lead")?;
    let cfg = ironguard_dataplane::RulesetConfig { interfaces: vec!["br0".into()], ..Default::default() };
    let mut out = Vec::new();
    for (kind, args) in [
        ("nft delete table inet ironguard_guard", &["delete", "table", "inet", "ironguard_guard"][..]),
        ("nft flush chain inet ironguard_guard input", &["flush", "chain", "inet", "ironguard_guard", "input"][..]),
        ("nft flush ruleset", &["flush", "ruleset"][..]),
    ] {
        let mut took = Vec::new();
        for _ in 0..rounds {
            let o = lan.pxe.nft(args);
            anyhow::ensure!(o.status.success(), "{kind}: {o:?}");
            let t = Instant::now();
            let c = cfg.clone();
            let repaired = in_netns(&lan.pxe, move || {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(5) {
                    if ironguard_dataplane::guard::status(&c).is_ok_and(|s| s.installed && s.problems.is_empty()) {
                        return true;
                    }
                    std::thread::sleep(Duration::from_micros(500));
                }
                false
            });
            anyhow::ensure!(repaired, "{kind}: the guard was not repaired within 5 s");
            took.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(50));
        }
        out.push((kind, Samples::new(took)));
    }
    Ok(out)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let release = if args.etcd_3_5 { EtcdRelease::Debian13 } else { EtcdRelease::Debian12 };
    let faults: Vec<Fault> = Fault::ALL
        .into_iter()
        .chain(Fault::CLUSTER)
        .chain(Fault::RESTORES.into_iter().filter(|f| args.etcd_3_5 || *f == Fault::EtcdRestore))
        .filter(|f| args.faults.is_empty() || args.faults.iter().any(|n| n == f.name()))
        .collect();
    let mut results = Vec::new();
    for f in faults {
        eprintln!("== {} ({} rounds)", f.name(), args.rounds);
        results.push(run_fault(f, args.rounds, release)?);
    }
    eprintln!("== SIGTERM with etcd down ({} rounds)", args.etcd_down_sigterm_rounds);
    let etcd_down_exit = sigterm_with_etcd_down(args.etcd_down_sigterm_rounds)?;
    let tamper = tamper_repairs(args.tamper_rounds)?;

    println!(
        "ironguard HA fault benchmark — 3 PXE hosts (dnsmasq + agent each), etcd, 2 control-plane replicas; TTL {TTL_SECS} s, margin {MARGIN_MS} ms (the etcd cluster faults: the agent's defaults, TTL {} s, margin {} ms)",
        Election::DEFAULTS.ttl_secs,
        Election::DEFAULTS.margin_ms
    );
    println!(
        "gap = longest time nobody served during the round (kernel watcher, every host every ~2 ms); dual-open = time two hosts were open at once"
    );
    println!();
    println!(
        "| fault | rounds | hand-overs | gap p50 | gap p99 | gap max | dual-open | double offers | offers to unknown MAC | kernel stop − lease end (p50 / p99 / max) | SIGTERM → exit (p50 / max) | goal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut out = serde_json::Map::new();
    let mut violations = 0.0;
    for r in &results {
        let f2s = r.fence_to_stop_sorted();
        let pick = |p: f64| f2s.get(((f2s.len() as f64 - 1.0) * p).round() as usize).copied();
        let f2s_text = match (pick(0.5), pick(0.99), f2s.last()) {
            (Some(a), Some(b), Some(c)) => format!("{a:+.1} / {b:+.1} / {c:+.1} ms"),
            _ => "—".into(),
        };
        let stop = Samples::new(r.stopped_in.clone());
        let stop_text = if stop.sorted().is_empty() {
            "—".into()
        } else {
            format!("{} / {}", human(stop.median()), human(stop.percentile(100.0)))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} ms | {} | {} | {f2s_text} | {stop_text} | {} |",
            r.fault.name(),
            r.gaps.len(),
            r.handovers,
            human(r.gaps.median()),
            human(r.gaps.percentile(99.0)),
            human(r.gaps.percentile(100.0)),
            r.dual_ms,
            r.doubles,
            r.unknown_offers,
            goal(r.fault)
        );
        violations += r.dual_ms + (r.doubles + r.unknown_offers) as f64;
        out.insert(r.fault.name().into(), r.to_json());
    }
    for r in results.iter().filter(|r| !r.after_etcd_back.is_empty()) {
        let s = Samples::new(r.after_etcd_back.clone());
        println!(
            "{}: a host served {} (p50) / {} (max) after both members served again (goal ≤ TTL + 1 s = {} s)",
            r.fault.name(),
            human(s.median()),
            human(s.percentile(100.0)),
            election(r.fault).ttl_secs + 1
        );
    }
    println!();
    println!("| SIGTERM → exit, etcd down (3 agents per round) | agents | p50 | p99 | max | goal |");
    println!("|---|---:|---:|---:|---:|---|");
    let e = &etcd_down_exit;
    println!(
        "| every session expired | {} | {} | {} | {} | < 2 s (systemd's TimeoutStopSec is 5 s) |",
        e.len(),
        human(e.median()),
        human(e.percentile(99.0)),
        human(e.percentile(100.0))
    );
    out.insert(
        "sigterm_exit_etcd_down".into(),
        json!({"agents": e.len(), "p50_ms": ms(e.median()), "p99_ms": ms(e.percentile(99.0)), "max_ms": ms(e.percentile(100.0))}),
    );
    println!();
    println!("| guard tampering (plain guard, agent running) | rounds | repaired p50 | p99 | max | goal |");
    println!("|---|---:|---:|---:|---:|---|");
    let mut t = serde_json::Map::new();
    for (kind, s) in &tamper {
        println!(
            "| {kind} | {} | {} | {} | {} | p99 < 50 ms |",
            s.len(),
            human(s.median()),
            human(s.percentile(99.0)),
            human(s.percentile(100.0))
        );
        t.insert((*kind).into(), json!({"rounds": s.len(), "p50_ms": ms(s.median()), "p99_ms": ms(s.percentile(99.0)), "max_ms": ms(s.percentile(100.0))}));
    }
    println!("(a held guard — owner, persist — refuses these changes outright: EPERM, nothing to repair)");
    out.insert("guard_tamper_repair".into(), serde_json::Value::Object(t));
    let out = serde_json::Value::Object(out);
    crate::write_json(&args.json, &out)?;
    crate::write_chart(&args.json, crate::plot::Kind::Ha, &out);
    anyhow::ensure!(violations == 0.0, "dual-open time, double offers or offers to the unknown MAC were seen");
    Ok(())
}
