//! The site benchmark: Ironic's own inspection of many nodes at once through the HA site in issue 24's production
//! shape — three PXE hosts (dnsmasq, an agent and a real Ironic 39 conductor each; one MariaDB; JSON-RPC), a
//! 3-member etcd 3.5 cluster and two control planes, all in namespaces — round after round, with no fault, with a
//! conductor restarted mid-round and with the leading PXE host killed mid-round. A round is
//! `ironguard_netns_tests::site_round::run_round` (the test `tests/ironic_ha.rs` runs one per fault; that module
//! says how a round runs and where each figure comes from: udhcpc, every dnsmasq's own log, the probe's capture,
//! every host's kernel, the control planes' metrics). One site for the whole run, as in the test (MariaDB and three
//! conductors are the costly part of the set-up); a host killed in a round is revived (dnsmasq, conductor, agent)
//! before the next one.
//!
//! Per scenario, over its rounds: the nodes inspected, finished, and inspected again after Ironic failed them; each
//! node's time from its `inspect` request to its DHCP lease and to `manageable` with its data processed; the
//! failover gap (leader host killed: from the kill to another host's kernel certainly open) or the conductor's
//! restart time; the control planes' requests to Ironic per inspected node and their moves to another Ironic API;
//! the probe node's DISCOVERs (a node Ironic inspects whose ramdisk never reports), those answered by two servers
//! and those unanswered; exchanges offered and nodes acknowledged by two hosts; the DISCOVERs of the nodes Ironic
//! does not inspect and of a stranger, and the offers and leases they got; the time two hosts' kernels were open
//! together. After each round every inspected MAC must be refused again by every live host.
//!
//! The run fails when any round broke one of these (`RoundReport::violations`, and the checks above) or left a node
//! unfinished, after the table, the JSON and the chart are written.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_netns_tests::ha::{DhcpPlan, HaOptions, HaSite};
use ironguard_netns_tests::site_round::{self, RoundReport, SiteFault, SiteNodes};
use ironguard_netns_tests::{DEADLINE, EtcdRelease, kernel_decision, wait_for};
use serde_json::{Value, json};

use crate::stats::{Samples, human, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes Ironic inspects at once in every round.
    #[arg(long, default_value_t = 30)]
    inspected: usize,
    /// Nodes Ironic does not inspect (enroll, manageable, available, active, maintenance in turn), asking for DHCP
    /// all round.
    #[arg(long, default_value_t = 10)]
    others: usize,
    /// Rounds per scenario.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The scenarios, in this order.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Scenario::None, Scenario::ConductorRestart, Scenario::LeaderHostDies])]
    faults: Vec<Scenario>,
    #[arg(long, default_value = "bench-results/site.json")]
    json: PathBuf,
}

/// What happens mid-round (when a third of the nodes have posted their data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// No fault.
    None,
    /// The conductor of a host that does not lead is stopped (SIGTERM) and started again.
    ConductorRestart,
    /// The leading PXE host dies whole (agent, dnsmasq and conductor SIGKILLed); revived after the round.
    LeaderHostDies,
}

impl Scenario {
    fn fault(self) -> SiteFault {
        match self {
            Self::None => SiteFault::None,
            Self::ConductorRestart => SiteFault::ConductorRestarts,
            Self::LeaderHostDies => SiteFault::LeaderHostDies,
        }
    }

    /// Its name on the command line (the JSON's `key`, which the chart colours by).
    fn key(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ConductorRestart => "conductor-restart",
            Self::LeaderHostDies => "leader-host-dies",
        }
    }
}

/// One round as the benchmark keeps it: the report and what it broke (empty: it held).
struct Round {
    report: RoundReport,
    violations: Vec<String>,
}

/// One scenario's rounds; `error` when a round (or reviving a host after it) failed outright.
struct ScenarioRun {
    scenario: Scenario,
    rounds: Vec<Round>,
    error: Option<String>,
}

/// A scenario's rounds aggregated.
struct Summary {
    rounds: usize,
    nodes: usize,
    finished: usize,
    inspected_again: usize,
    boot_to_lease: Samples,
    inspect_to_finished: Samples,
    failover_gap: Samples,
    restart: Samples,
    ironic_requests: f64,
    ironic_failovers: f64,
    probe_discovers: usize,
    probe_doubles: usize,
    probe_unanswered: usize,
    offered_by_two: usize,
    acked_by_two: usize,
    others_discovers: usize,
    others_offers: usize,
    others_leases: usize,
    dual_open: Duration,
    wall: Duration,
    violations: usize,
}

impl Summary {
    fn of(rounds: &[Round]) -> Self {
        let reports = || rounds.iter().map(|r| &r.report);
        let nodes = || reports().flat_map(|r| r.nodes.iter());
        let sum = |f: fn(&RoundReport) -> usize| reports().map(f).sum::<usize>();
        Self {
            rounds: rounds.len(),
            nodes: nodes().count(),
            finished: reports().map(RoundReport::finished).sum(),
            inspected_again: nodes().filter(|n| !n.failed_by_ironic.is_empty()).count(),
            boot_to_lease: Samples::new(nodes().filter_map(|n| n.boot_to_lease).collect()),
            inspect_to_finished: Samples::new(nodes().filter_map(|n| n.inspect_to_finished).collect()),
            failover_gap: Samples::new(reports().filter_map(|r| r.failover_gap).collect()),
            restart: Samples::new(reports().filter_map(|r| r.restart_took).collect()),
            ironic_requests: reports().map(|r| r.ironic_requests).sum(),
            ironic_failovers: reports().map(|r| r.ironic_failovers).sum(),
            probe_discovers: sum(|r| r.probe_discovers),
            probe_doubles: sum(|r| r.probe_doubles),
            probe_unanswered: sum(|r| r.probe_unanswered),
            offered_by_two: sum(|r| r.exchanges_offered_by_two.len()),
            acked_by_two: sum(|r| r.acked_by_two.len()),
            others_discovers: sum(|r| r.others_discovers),
            others_offers: sum(|r| r.others_offers),
            others_leases: sum(|r| r.others_leases),
            dual_open: reports().map(|r| r.dual_open).sum(),
            wall: reports().map(|r| r.wall).sum(),
            violations: rounds.iter().map(|r| r.violations.len()).sum(),
        }
    }

    fn per_node(&self) -> f64 {
        self.ironic_requests / (self.nodes.max(1) as f64)
    }

    /// The scenario's `summary` (the chart reads `boot_to_lease_ms` and `inspect_to_finished_ms`).
    fn json(&self) -> Value {
        json!({
            "rounds": self.rounds,
            "nodes": self.nodes,
            "finished": self.finished,
            "inspected_again": self.inspected_again,
            "boot_to_lease_ms": latency_json(&self.boot_to_lease),
            "inspect_to_finished_ms": latency_json(&self.inspect_to_finished),
            "failover_gap_ms": latency_json(&self.failover_gap),
            "restart_ms": latency_json(&self.restart),
            "ironic_requests": self.ironic_requests,
            "ironic_requests_per_node": self.per_node(),
            "ironic_failovers": self.ironic_failovers,
            "probe_discovers": self.probe_discovers,
            "probe_doubles": self.probe_doubles,
            "probe_unanswered": self.probe_unanswered,
            "exchanges_offered_by_two": self.offered_by_two,
            "acked_by_two": self.acked_by_two,
            "others_discovers": self.others_discovers,
            "others_offers": self.others_offers,
            "others_leases": self.others_leases,
            "dual_open_ms": ms(self.dual_open),
            "wall_ms": ms(self.wall),
            "violations": self.violations,
        })
    }
}

/// p50, p99 and max in ms; nulls when there is no sample (e.g. no failover gap in a round without a fault).
fn latency_json(s: &Samples) -> Value {
    if s.sorted().is_empty() {
        return json!({"p50": null, "p99": null, "max": null});
    }
    json!({"p50": ms(s.median()), "p99": ms(s.percentile(99.0)), "max": ms(s.percentile(100.0))})
}

/// "p50 / p99 / max" for the table, or "—".
fn three(s: &Samples) -> String {
    if s.sorted().is_empty() {
        return "—".into();
    }
    format!("{} / {} / {}", human(s.median()), human(s.percentile(99.0)), human(s.percentile(100.0)))
}

/// "p50 / max" for the table, or "—".
fn two(s: &Samples) -> String {
    if s.sorted().is_empty() {
        return "—".into();
    }
    format!("{} / {}", human(s.median()), human(s.percentile(100.0)))
}

/// The provisioning network's plan: 40 addresses per host in the default /24 (the test's), more in a /20 for more
/// nodes (a node that moves host leases again from the other host's slice, so a slice holds every inspected node).
fn plan(inspected: usize) -> DhcpPlan {
    if inspected <= 30 {
        DhcpPlan { per_host: 40, ..Default::default() }
    } else {
        DhcpPlan { prefix_len: 20, first: std::net::Ipv4Addr::new(10, 80, 1, 0), per_host: inspected as u32 + 10 }
    }
}

/// The etcd 3.5 server's version as it reports it (`etcd --version`), e.g. "3.5.16".
fn etcd_version(release: EtcdRelease) -> String {
    std::process::Command::new(release.binary())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("etcd Version:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| release.minor().to_string())
}

/// What every round must also hold beyond `RoundReport::violations`, as the test checks it: the fault took place
/// and was measured, the probe and the others asked (or the safety figures mean nothing), and every inspected MAC
/// is refused again by every live host once the round is over.
fn round_checks(site: &HaSite, nodes: &SiteNodes, report: &RoundReport) -> Vec<String> {
    let mut v = Vec::new();
    match report.fault {
        SiteFault::LeaderHostDies if report.failover_gap.is_none() => {
            v.push("no other host served after the leader host died".to_string());
        }
        SiteFault::ConductorRestarts if report.restart_took.is_none() => {
            v.push("the conductor's restart was not measured".to_string());
        }
        _ => {}
    }
    if report.probe_discovers == 0 {
        v.push("the probe node sent no DISCOVER".to_string());
    }
    if report.others_discovers == 0 {
        v.push("the others and the stranger sent no DISCOVER".to_string());
    }
    for n in &nodes.inspected {
        let refused = wait_for(DEADLINE, || {
            site.hosts.iter().filter(|h| h.agent.is_some()).all(|h| !kernel_decision(&h.ns, n.mac).served).then_some(())
        });
        if refused.is_none() {
            v.push(format!("{} ({}) is still let through after its inspection", n.name, n.mac));
        }
    }
    v
}

/// One round, judged, and the site made whole again for the next (a killed host revived, a leader elected).
fn one_round(site: &mut HaSite, nodes: &SiteNodes, scenario: Scenario) -> Round {
    let report = site_round::run_round(site, nodes, scenario.fault());
    let mut violations = report.violations(&site.plan);
    violations.extend(round_checks(site, nodes, &report));
    if scenario == Scenario::LeaderHostDies && report.revived_after.is_none() {
        if let Some(i) = report.fault_host {
            site.revive_host(i);
        }
    }
    site.wait_leader(None, DEADLINE).expect("a leader after the round");
    Round { report, violations }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".to_string())
}

/// The whole run as JSON: its parameters and, per scenario, every round (`RoundReport::json` with the round's
/// violations) and the summary.
fn run_json(inspected: usize, others: usize, rounds: usize, etcd: &str, ironic: &str, runs: &[ScenarioRun]) -> Value {
    let scenarios: Vec<Value> = runs
        .iter()
        .map(|s| {
            let rounds: Vec<Value> = s
                .rounds
                .iter()
                .map(|r| {
                    let mut v = r.report.json();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("violations".into(), json!(r.violations));
                    }
                    v
                })
                .collect();
            json!({
                "fault": s.scenario.fault().name(),
                "key": s.scenario.key(),
                "rounds": rounds,
                "summary": Summary::of(&s.rounds).json(),
                "error": s.error,
            })
        })
        .collect();
    json!({
        "inspected": inspected,
        "others": others,
        "rounds": rounds,
        "etcd": etcd,
        "ironic": ironic,
        "scenarios": scenarios,
    })
}

fn fault_cell(scenario: Scenario, s: &Summary) -> String {
    match scenario {
        Scenario::None => "—".into(),
        Scenario::ConductorRestart => format!("restart {}", two(&s.restart)),
        Scenario::LeaderHostDies => format!("failover gap {}", two(&s.failover_gap)),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.inspected > 0 && args.rounds > 0, "--inspected and --rounds must be at least 1");
    anyhow::ensure!(args.inspected <= 250 && args.others <= 250, "at most 250 inspected nodes and 250 others");
    anyhow::ensure!(!args.faults.is_empty(), "no scenario (--faults)");
    let release = EtcdRelease::Debian13;
    let etcd = format!("{} (3 members)", etcd_version(release));
    let ironic = format!("{} (3 conductors, MariaDB, json-rpc)", ironguard_netns_tests::ironic::IRONIC_VERSION);

    let t = Instant::now();
    let mut site = HaSite::with_plan(
        HaOptions {
            hosts: 3,
            nodes: SiteNodes::namespaces(args.inspected, args.others),
            policy: "deny",
            etcd: release,
            etcd_members: 3,
            ironic_conductors: true,
            ..Default::default()
        },
        plan(args.inspected),
    );
    site.wait_leader(None, DEADLINE).context("no leader on the new site")?;
    let nodes = site_round::enroll_nodes(&site, args.inspected, args.others);
    eprintln!(
        "site up and {} + {} nodes enrolled in {} (Ironic: {:?})",
        args.inspected,
        args.others,
        human(t.elapsed()),
        site.ironic.as_ref().map(|i| i.timings.clone())
    );

    let mut runs: Vec<ScenarioRun> = Vec::new();
    'scenarios: for &scenario in &args.faults {
        let mut run = ScenarioRun { scenario, rounds: Vec::new(), error: None };
        for r in 0..args.rounds {
            let fault = scenario.fault();
            let round = std::panic::catch_unwind(AssertUnwindSafe(|| one_round(&mut site, &nodes, scenario)));
            let round = match round {
                Ok(round) => round,
                Err(p) => {
                    let e = format!("{} round {}: {}", fault.name(), r + 1, panic_text(p.as_ref()));
                    eprintln!("{e}; stopping the run");
                    run.error = Some(e);
                    runs.push(run);
                    break 'scenarios;
                }
            };
            let rep = &round.report;
            eprintln!(
                "{} round {}/{}: {} of {} finished in {} ({} inspected again), host {:?}, failover {}, restart {}, \
                 Ironic requests {:.0} (fail-overs {:.0}), probe {} DISCOVERs ({} double, {} unanswered), {} violations",
                fault.name(),
                r + 1,
                args.rounds,
                rep.finished(),
                rep.nodes.len(),
                human(rep.wall),
                rep.nodes.iter().filter(|n| !n.failed_by_ironic.is_empty()).count(),
                rep.fault_host,
                rep.failover_gap.map_or("—".to_string(), human),
                rep.restart_took.map_or("—".to_string(), human),
                rep.ironic_requests,
                rep.ironic_failovers,
                rep.probe_discovers,
                rep.probe_doubles,
                rep.probe_unanswered,
                round.violations.len()
            );
            run.rounds.push(round);
        }
        runs.push(run);
    }

    println!(
        "ironguard site benchmark — real Ironic {ironic} on 3 PXE hosts (dnsmasq + agent + conductor each), etcd \
         {etcd}, 2 control planes; per round {} nodes inspected at once, {} others in other states asking for DHCP, \
         a probe node and a stranger; {} round{} per scenario on one site",
        args.inspected,
        args.others,
        args.rounds,
        if args.rounds == 1 { "" } else { "s" }
    );
    println!(
        "boot → lease and inspect → finished: from the node's `inspect` request (lease by udhcpc; finished: \
         `manageable` with its data processed); failover gap: from the kill to another host's kernel certainly open"
    );
    println!();
    println!(
        "| scenario | rounds | nodes inspected / finished / inspected again | boot → lease p50 / p99 / max | \
         inspect → finished p50 / p99 / max | failover gap or conductor restart p50 / max | \
         Ironic requests per node (fail-overs to another API) | probe DISCOVERs / answered by two / unanswered | \
         exchanges offered by two hosts / nodes acked by two | others' and stranger's DISCOVERs / offers / leases | \
         dual-open |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in &runs {
        let s = Summary::of(&run.rounds);
        println!(
            "| {} | {} | {} / {} / {} | {} | {} | {} | {:.1} ({:.0}) | {} / {} / {} | {} / {} | {} / {} / {} | {:.1} ms |",
            run.scenario.fault().name(),
            s.rounds,
            s.nodes,
            s.finished,
            s.inspected_again,
            three(&s.boot_to_lease),
            three(&s.inspect_to_finished),
            fault_cell(run.scenario, &s),
            s.per_node(),
            s.ironic_failovers,
            s.probe_discovers,
            s.probe_doubles,
            s.probe_unanswered,
            s.offered_by_two,
            s.acked_by_two,
            s.others_discovers,
            s.others_offers,
            s.others_leases,
            ms(s.dual_open)
        );
    }
    println!();
    println!(
        "goal: 0 double offers, 0 exchanges offered by two hosts, 0 offers to nodes Ironic does not inspect or to the \
         stranger, 0 dual-open, every node finished"
    );

    let out = run_json(args.inspected, args.others, args.rounds, &etcd, &ironic, &runs);
    crate::write_json(&args.json, &out)?;
    crate::write_chart(&args.json, crate::plot::Kind::Site, &out);

    let mut bad = Vec::new();
    let mut unfinished = 0;
    for run in &runs {
        bad.extend(run.error.iter().cloned());
        for (r, round) in run.rounds.iter().enumerate() {
            let name = run.scenario.fault().name();
            bad.extend(round.violations.iter().map(|v| format!("{name} round {}: {v}", r + 1)));
            unfinished += round.report.nodes.len() - round.report.finished();
        }
    }
    for b in &bad {
        eprintln!("violation: {b}");
    }
    anyhow::ensure!(
        bad.is_empty() && unfinished == 0,
        "{} violations, {unfinished} nodes unfinished (see above and the JSON)",
        bad.len()
    );
    Ok(())
}

/// A JSON as `run` writes it, from made-up rounds (no site): 10 nodes inspected, 2 rounds of `none` and one of
/// `leader-host-dies`; boot → lease 100, 150, … ms and inspect → finished 2000, 2300, … ms (+ 1 s in the second
/// round and with the fault).
#[cfg(test)]
pub(crate) fn sample_json() -> Value {
    use site_round::NodeOutcome;

    let report = |fault: SiteFault, extra_ms: u64| RoundReport {
        fault,
        nodes: (0..10u64)
            .map(|k| NodeOutcome {
                name: format!("inspected-{k}"),
                mac: crate::stats::macs(10, 0x5e)[k as usize],
                lease: None,
                boot_to_lease: Some(Duration::from_millis(100 + 50 * k)),
                inspect_to_finished: Some(Duration::from_millis(2000 + 300 * k + extra_ms)),
                dhcp_runs: 1,
                posts: 1,
                failed_by_ironic: Vec::new(),
                error: None,
            })
            .collect(),
        fault_host: (fault == SiteFault::LeaderHostDies).then_some(1),
        failover_gap: (fault == SiteFault::LeaderHostDies).then_some(Duration::from_millis(2500)),
        restart_took: None,
        revived_after: None,
        probe_discovers: 300,
        probe_doubles: 0,
        probe_unanswered: 2,
        exchanges_offered_by_two: Vec::new(),
        acked_by_two: Vec::new(),
        acked_nodes: 0,
        others_discovers: 80,
        others_offers: 0,
        others_leases: 0,
        dual_open: Duration::ZERO,
        ironic_requests: 120.0,
        ironic_failovers: 0.0,
        ironic_failovers_ever: 0.0,
        wall: Duration::from_secs(20),
    };
    let round = |fault, extra_ms| Round { report: report(fault, extra_ms), violations: Vec::new() };
    let runs = [
        ScenarioRun {
            scenario: Scenario::None,
            rounds: vec![round(SiteFault::None, 0), round(SiteFault::None, 1000)],
            error: None,
        },
        ScenarioRun {
            scenario: Scenario::LeaderHostDies,
            rounds: vec![round(SiteFault::LeaderHostDies, 1000)],
            error: None,
        },
    ];
    run_json(10, 5, 2, "3.5.16 (3 members)", "39.0.0 (3 conductors, MariaDB, json-rpc)", &runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_aggregates_the_rounds() {
        let v = sample_json();
        let none = &v["scenarios"][0];
        assert_eq!(none["key"], "none");
        assert_eq!(none["fault"], "no fault");
        assert_eq!(none["rounds"].as_array().map(Vec::len), Some(2));
        let s = &none["summary"];
        assert_eq!(s["nodes"], 20);
        assert_eq!(s["finished"], 20);
        assert_eq!(s["probe_discovers"], 600);
        assert_eq!(s["ironic_requests_per_node"], 12.0);
        assert_eq!(s["boot_to_lease_ms"]["max"], 550.0);
        assert_eq!(s["inspect_to_finished_ms"]["max"], 5700.0);
        // No failover gap without a fault: nulls, not zeros.
        assert!(s["failover_gap_ms"]["p50"].is_null());
        let dies = &v["scenarios"][1]["summary"];
        assert_eq!(dies["failover_gap_ms"]["max"], 2500.0);
        assert_eq!(v["scenarios"][1]["rounds"][0]["violations"], json!([]));
    }

    #[test]
    fn the_plans_slices_hold_every_inspected_node() {
        for n in [1, 30, 31, 100, 250] {
            let p = plan(n);
            assert!(p.per_host as usize >= n + 10, "{n}: {p:?}");
            // The hosts' own addresses (10.80.0.1-3) are in the network and in no slice.
            let host = std::net::Ipv4Addr::new(10, 80, 0, 3);
            assert_eq!(u32::from(host) & u32::from(p.netmask()), u32::from(p.first) & u32::from(p.netmask()));
            assert!((0..3).all(|i| !p.holds(i, host)));
            let (_, hi) = p.slice(2);
            assert!(u32::from(hi) < (u32::from(p.first) | !u32::from(p.netmask())), "{n}: beyond the broadcast");
        }
        assert_eq!(plan(30), DhcpPlan { per_host: 40, ..Default::default() });
    }
}
