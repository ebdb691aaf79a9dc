//! The boot storm benchmark: N PXE clients power on at once and acquire leases on the firmware's schedule, on the
//! 3-host HA site (dnsmasq and an agent per host, each dnsmasq with its own slice of the range, etcd, two control
//! planes; every client's MAC allowed), with no fault, with the leader's host killed mid-storm (SIGKILL of its agent
//! and its dnsmasq) and with the leader's dnsmasq frozen mid-storm (SIGSTOP); next to the same storm against one
//! dnsmasq alone, with no ironguard. After each storm every bound client renews (the NAKs a hand-over brings).
//!
//! - [`wire`]: DHCPv4 frames, written and read (pure).
//! - [`client`]: one client's exchange as a state machine without I/O: the schedule, `secs`, offers, NAKs.
//! - [`sim`]: the I/O shell: one raw socket for every client, the ledger of offers and ACKs.
//! - this module: the sites, the faults, the table, the JSON and the chart.

pub mod client;
pub mod sim;
pub mod wire;

#[cfg(test)]
mod netns_tests;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ironguard_dataplane::MacAddr;
use ironguard_netns_tests::ha::{DhcpPlan, HaOptions, HaSite, TTL_SECS, signal_agent};
use ironguard_netns_tests::{Dnsmasq, Netns, TempDir, ctl, in_netns, process_state, veth, wait_for};
use nix::sys::signal::Signal;
use serde_json::json;

use self::client::Schedule;
use self::sim::{Outcome, PacketSocket, PhaseReport, StormConfig};
use crate::stats::{Samples, human, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Storm sizes (clients), e.g. `100,500`.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 500])]
    clients: Vec<usize>,
    /// Storms without a fault per size, on the site and on dnsmasq alone, taking turns (each with fresh MACs).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Only these faults (all by default).
    #[arg(long = "fault", value_enum)]
    faults: Vec<StormFault>,
    /// No fault storms: only dnsmasq alone and the site without a fault.
    #[arg(long, conflicts_with = "faults")]
    no_faults: bool,
    /// Hosts on dnsmasq alone's bridge, the first with dnsmasq, the others with no DHCP server (3: the site's
    /// shape; 1: dnsmasq and the clients only).
    #[arg(long, default_value_t = 3)]
    alone_hosts: usize,
    /// The clients power on evenly over this many milliseconds (0: every first DISCOVER in one burst).
    #[arg(long, default_value_t = 1000)]
    spread_ms: u64,
    /// The firmware's DISCOVER timeouts in seconds.
    #[arg(long, default_value_t = Schedule::firmware(), value_parser = Schedule::parse)]
    schedule: Schedule,
    #[arg(long, default_value = "bench-results/storm.json")]
    json: PathBuf,
}

/// A fault injected into the site's leader once half of the clients are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StormFault {
    /// The leader's host dies: SIGKILL of its agent and its dnsmasq, which stay down.
    Sigkill,
    /// The leader's dnsmasq frozen (SIGSTOP) until the storm and the renewal are over; its agent runs on.
    SigstopDnsmasq,
}

impl StormFault {
    const ALL: [StormFault; 2] = [StormFault::Sigkill, StormFault::SigstopDnsmasq];

    fn name(self) -> &'static str {
        match self {
            StormFault::Sigkill => "ironguard, leader host SIGKILLed (agent + dnsmasq)",
            StormFault::SigstopDnsmasq => "ironguard, leader's dnsmasq SIGSTOPped",
        }
    }

    fn key(self) -> &'static str {
        match self {
            StormFault::Sigkill => "sigkill",
            StormFault::SigstopDnsmasq => "sigstop_dnsmasq",
        }
    }
}

/// The provisioning network of every storm: a /20 whose hosts lease 1000 addresses each, in slices that do not
/// overlap (10.80.1.0–10.80.4.231, 10.80.4.232–…), each large enough for every client of the largest storm: after
/// a hand-over one host may have to lease to all of them. 1000 is also dnsmasq's default `--dhcp-lease-max`.
pub const PLAN: DhcpPlan = DhcpPlan { prefix_len: 20, first: Ipv4Addr::new(10, 80, 1, 0), per_host: 1000 };

/// One dnsmasq with no ironguard: the address and the slice of the site's first host, on a bridge of its own, and
/// a node namespace for the clients. The bridge can hold more hosts that run no DHCP server, as the site's
/// followers do not: on one machine every broadcast copied to a host costs the same two cores, so a baseline
/// with the site's shape pays what the site pays for its shape and the comparison shows what ironguard adds.
#[derive(Debug)]
pub struct Alone {
    pub dnsmasq: Dnsmasq,
    pub node: Netns,
    _idle: Vec<Netns>,
    pub pxe: Netns,
    _prov: Netns,
    pub dir: TempDir,
}

impl Alone {
    pub const SERVER: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 1);

    /// `hosts` hosts on the bridge (at least one), 10.80.0.1 and on, as on the site; dnsmasq on the first only.
    pub fn new(hosts: usize) -> Self {
        let dir = TempDir::new("storm");
        let prov = Netns::new("prov");
        prov.ip(&["link", "add", "br-prov", "type", "bridge", "forward_delay", "0"]);
        prov.ip(&["link", "set", "br-prov", "up"]);
        let mut all: Vec<Netns> = (0..hosts.max(1))
            .map(|i| {
                let ns = Netns::new(if i == 0 { "pxe" } else { "idle" });
                veth(&ns, "prov0", &prov, &format!("h{i}"));
                prov.ip(&["link", "set", &format!("h{i}"), "master", "br-prov"]);
                let ip = Ipv4Addr::from(u32::from(Self::SERVER) + i as u32);
                ns.ip(&["addr", "add", &format!("{ip}/{}", PLAN.prefix_len), "dev", "prov0"]);
                ns
            })
            .collect();
        let pxe = all.remove(0);
        let node = Netns::new("node");
        veth(&node, "eth0", &prov, "n0");
        prov.ip(&["link", "set", "n0", "master", "br-prov"]);
        let dnsmasq = Self::dnsmasq(&pxe, &dir, "dnsmasq-alone", 0);
        Self { dnsmasq, node, _idle: all, pxe, _prov: prov, dir }
    }

    /// A dnsmasq on the host leasing slice `slice` of [`PLAN`], its files named after `tag`.
    pub fn dnsmasq(pxe: &Netns, dir: &TempDir, tag: &str, slice: usize) -> Dnsmasq {
        Dnsmasq::start_range(pxe, dir, tag, "prov0", &PLAN.dnsmasq_range(slice), &[])
    }
}

/// A raw socket on the `eth0` of `node`.
pub fn socket_in(node: &Netns) -> anyhow::Result<PacketSocket> {
    in_netns(node, || PacketSocket::open("eth0"))
}

/// `n` client MACs, distinct for each `tag`.
fn macs(n: usize, tag: u8) -> Vec<[u8; 6]> {
    crate::stats::macs(n, tag).iter().map(MacAddr::octets).collect()
}

/// Whether the kernel of `ns` lets every one of `macs` reach its dnsmasq now (one read-back, judged per MAC).
fn serves_all(ns: &Netns, macs: &[[u8; 6]]) -> bool {
    let macs: Vec<MacAddr> = macs.iter().filter_map(|m| MacAddr::from_octets(*m).ok()).collect();
    in_netns(ns, move || {
        let Ok(o) = ironguard_dataplane::observe(true) else { return false };
        macs.iter().all(|m| ironguard_dataplane::decide(o.mac_inputs(*m)).served)
    })
}

/// How many of `macs` the lease files `files` still hold.
fn leases_held(files: &[PathBuf], macs: &[[u8; 6]]) -> usize {
    let macs: std::collections::HashSet<String> =
        macs.iter().filter_map(|m| MacAddr::from_octets(*m).ok()).map(|m| m.to_string()).collect();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            // dnsmasq's lease file: EXPIRY MAC IP NAME CLIENT-ID, one lease a line.
            text.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|m| macs.contains(m))).count()
        })
        .sum()
}

/// Runs a storm from `node` in a thread; `bound` counts the clients bound so far.
fn spawn_storm(
    node: &Netns,
    macs: Vec<[u8; 6]>,
    cfg: StormConfig,
) -> anyhow::Result<(std::thread::JoinHandle<anyhow::Result<Outcome>>, Arc<AtomicUsize>)> {
    let socket = socket_in(node)?;
    let bound = Arc::new(AtomicUsize::new(0));
    let b = bound.clone();
    Ok((std::thread::spawn(move || sim::run(socket, &macs, &cfg, &b)), bound))
}

fn join(h: std::thread::JoinHandle<anyhow::Result<Outcome>>) -> anyhow::Result<Outcome> {
    h.join().map_err(|_| anyhow::anyhow!("the storm's thread panicked"))?
}

/// A site of three hosts split as [`PLAN`] says, with every MAC in `macs` allowed and served by the leader.
fn site(macs: &[[u8; 6]]) -> anyhow::Result<HaSite> {
    let site = HaSite::with_plan(
        HaOptions { hosts: 3, nodes: 1, policy: "deny", lost_after_secs: 30, ..Default::default() },
        PLAN,
    );
    site.wait_leader(None, Duration::from_secs(60)).context("no first leader")?;
    let texts: Vec<String> = macs.iter().filter_map(|m| MacAddr::from_octets(*m).ok()).map(|m| m.to_string()).collect();
    let mut args = vec!["--controlplane", "https://10.90.0.1:9100", "filters", "allow"];
    args.extend(texts.iter().map(String::as_str));
    let out = ctl(&site.mgmt, &args);
    anyhow::ensure!(out.status.success(), "allowing the clients' MACs failed: {out:?}");
    wait_for(Duration::from_secs(60), || {
        let l = site.leader()?;
        serves_all(&site.hosts[l].ns, macs).then_some(())
    })
    .context("the leader's kernel does not let every client's MAC through")?;
    Ok(site)
}

/// One scenario's storms, summed.
#[derive(Debug, Default)]
struct Scenario {
    name: String,
    key: String,
    outcomes: Vec<Outcome>,
    /// Fault storms: from the fault to the first lease another host gave.
    served_again: Option<Duration>,
    fault: Option<FaultInfo>,
}

#[derive(Debug, Clone)]
struct FaultInfo {
    /// Clients bound when the fault was injected, and when that was after the storm began.
    bound_at_fault: usize,
    at: Duration,
    old_leader: usize,
    /// The host leading once the storm and the renewal were over.
    leader_after: Option<usize>,
}

impl Scenario {
    fn storms(&self) -> impl Iterator<Item = &PhaseReport> {
        self.outcomes.iter().map(|o| &o.storm)
    }

    fn renewals(&self) -> impl Iterator<Item = &PhaseReport> {
        self.outcomes.iter().filter_map(|o| o.renewal.as_ref())
    }

    fn clients(&self) -> usize {
        self.storms().map(|s| s.clients).sum()
    }

    fn leased(&self) -> usize {
        self.storms().map(|s| s.bound).sum()
    }

    fn leased_pct(&self) -> f64 {
        100.0 * self.leased() as f64 / self.clients().max(1) as f64
    }

    fn time_to_lease(&self) -> Samples {
        Samples::new(self.storms().flat_map(|s| s.time_to_lease.iter().copied()).collect())
    }

    fn sum(&self, f: impl Fn(&Outcome) -> usize) -> usize {
        self.outcomes.iter().map(f).sum()
    }

    fn renewal_sum(&self, f: impl Fn(&PhaseReport) -> usize) -> usize {
        self.renewals().map(f).sum()
    }

    fn to_json(&self, alone: Option<&Scenario>) -> serde_json::Value {
        let t = self.time_to_lease();
        let ratio = |p: f64| {
            alone
                .map(|a| a.time_to_lease())
                .filter(|a| a.len() > 0 && t.len() > 0)
                .map(|a| t.percentile(p).as_secs_f64() / a.percentile(p).as_secs_f64().max(1e-9))
        };
        let renewal_ttl = Samples::new(self.renewals().flat_map(|r| r.time_to_lease.iter().copied()).collect());
        json!({
            "name": self.name,
            "key": self.key,
            "storms": self.outcomes.len(),
            "clients": self.clients(),
            "leased": self.leased(),
            "leased_pct": self.leased_pct(),
            "ttl_p50_ms": ms(t.median()),
            "ttl_p99_ms": ms(t.percentile(99.0)),
            "ttl_max_ms": ms(t.percentile(100.0)),
            "p50_vs_alone": ratio(50.0),
            "p99_vs_alone": ratio(99.0),
            "time_to_lease_ms": t.sorted().iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "retried_clients": self.storms().map(|s| s.retried).sum::<usize>(),
            "discovers": self.storms().map(|s| s.discovers).sum::<usize>(),
            "naks": self.storms().map(|s| s.naks).sum::<usize>(),
            "gave_up": self.storms().map(|s| s.gave_up).sum::<usize>(),
            "renewal": {
                "clients": self.renewal_sum(|r| r.clients),
                "kept": self.renewal_sum(|r| r.kept),
                "naks": self.renewal_sum(|r| r.naks),
                "naked_clients": self.renewal_sum(|r| r.naked_clients),
                "new_address": self.renewal_sum(|r| r.bound - r.kept),
                "unanswered": self.renewal_sum(|r| r.unanswered),
                "gave_up": self.renewal_sum(|r| r.gave_up),
                "p50_ms": ms(renewal_ttl.median()),
                "p99_ms": ms(renewal_ttl.percentile(99.0)),
            },
            "duplicate_addresses": self.sum(|o| o.duplicates),
            "double_offers": self.sum(|o| o.double_offers),
            "offered_exchanges": self.sum(|o| o.offered),
            "served_again_ms": self.served_again.map(ms),
            "fault": self.fault.as_ref().map(|f| json!({
                "bound_at_fault": f.bound_at_fault, "at_ms": ms(f.at), "old_leader": f.old_leader,
                "leader_after": f.leader_after,
            })),
        })
    }
}

fn config(args: &Args, release: bool) -> StormConfig {
    StormConfig { schedule: args.schedule.clone(), spread: Duration::from_millis(args.spread_ms), renew: true, release }
}

/// The storms without a fault: dnsmasq alone and the site, taking turns, `reps` of each.
fn unfaulted(args: &Args, n: usize) -> anyhow::Result<(Scenario, Scenario)> {
    let tags: Vec<u8> = (0..args.reps).map(|r| 0x50 + r as u8).collect();
    let all: Vec<[u8; 6]> = tags.iter().flat_map(|t| macs(n, *t)).collect();
    let alone = Alone::new(args.alone_hosts);
    let site = site(&all)?;
    let mut a = Scenario { name: "dnsmasq alone (no ironguard)".into(), key: "alone".into(), ..Default::default() };
    let mut s = Scenario { name: "ironguard, no fault".into(), key: "ironguard".into(), ..Default::default() };
    for (r, tag) in tags.iter().enumerate() {
        let order: [bool; 2] = if r % 2 == 0 { [true, false] } else { [false, true] };
        for on_alone in order {
            let node = if on_alone { &alone.node } else { &site.nodes[0] };
            let (h, _) = spawn_storm(node, macs(n, *tag), config(args, true))?;
            let o = join(h).with_context(|| format!("storm of {n}, rep {r}"))?;
            eprintln!(
                "{n} clients, rep {}: {}: {} of {} leased, p50 {}",
                r + 1,
                if on_alone { "dnsmasq alone" } else { "ironguard" },
                o.storm.bound,
                o.storm.clients,
                human(Samples::new(o.storm.time_to_lease.clone()).median())
            );
            if on_alone && o.storm.bound < o.storm.clients {
                let log = alone.dnsmasq.proc.log_text();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                eprintln!(
                    "dnsmasq alone left clients without a lease; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            if on_alone { &mut a } else { &mut s }.outcomes.push(o);
            // The next storm must find the pool as this one did: every address given back.
            let files: Vec<PathBuf> = if on_alone {
                vec![alone.dir.join("dnsmasq-alone.leases")]
            } else {
                (0..site.hosts.len()).map(|i| site.dir.join(&format!("dnsmasq-pxe{i}.leases"))).collect()
            };
            // And the server's neighbour table: the renewal's ACKs are unicast to each client's address, and Linux
            // keeps one table for every namespace of the machine (gc_thresh3 1024 by default): storms of 500 after
            // one another would fill it ("neighbor table overflow") and the ACKs of later renewals would be lost.
            let servers: Vec<&Netns> =
                if on_alone { vec![&alone.pxe] } else { site.hosts.iter().map(|h| &h.ns).collect() };
            for ns in servers {
                ns.ip(&["neigh", "flush", "all"]);
            }
            let clients = macs(n, *tag);
            if wait_for(Duration::from_secs(10), || (leases_held(&files, &clients) == 0).then_some(())).is_none() {
                eprintln!(
                    "warning: {} leases of this storm were not released: the next storm finds fewer free addresses",
                    leases_held(&files, &clients)
                );
            }
        }
    }
    Ok((a, s))
}

/// One storm on a fresh site with `fault` injected into its leader once half of the clients are bound.
fn faulted(args: &Args, n: usize, fault: StormFault) -> anyhow::Result<Scenario> {
    let clients = macs(n, 0x60);
    let mut site = site(&clients)?;
    let (old, _) = site.wait_leader(None, Duration::from_secs(30)).context("no leader")?;
    let old_ip = site.hosts[old].ip;
    let (h, bound) = spawn_storm(&site.nodes[0], clients, config(args, false))?;
    let _ = wait_for(args.schedule.total() * 2, || {
        (bound.load(Ordering::Relaxed) >= n / 2 || h.is_finished()).then_some(())
    });
    let bound_at_fault = bound.load(Ordering::Relaxed);
    let injected = Instant::now();
    let host = &mut site.hosts[old];
    let dnsmasq_pid = host.server.pid();
    match fault {
        StormFault::Sigkill => {
            host.server.signal(Signal::SIGKILL);
            signal_agent(host, Signal::SIGKILL).context("the agent did not exit on SIGKILL")?;
            host.server.wait_exit(Duration::from_secs(30)).context("dnsmasq did not exit on SIGKILL")?;
        }
        StormFault::SigstopDnsmasq => {
            host.server.signal(Signal::SIGSTOP);
            wait_for(Duration::from_secs(10), || (process_state(dnsmasq_pid) == Some('T')).then_some(()))
                .context("dnsmasq did not stop")?;
        }
    }
    eprintln!("{n} clients, {}: injected into pxe-{old} with {bound_at_fault} bound", fault.key());
    let outcome = join(h).with_context(|| format!("storm of {n} with {}", fault.key()))?;
    let leader_after = site.leader();
    let outcome_began = outcome.storm.began;
    if fault == StormFault::SigstopDnsmasq {
        site.hosts[old].server.signal(Signal::SIGCONT);
    }
    let served_again = outcome
        .storm
        .acks
        .iter()
        .chain(outcome.renewal.iter().flat_map(|r| r.acks.iter()))
        .filter(|(t, server)| *t > injected && *server != old_ip)
        .map(|(t, _)| *t - injected)
        .min();
    eprintln!(
        "{n} clients, {}: {} of {} leased; served again after {}; pxe-{old} led, now {:?}",
        fault.key(),
        outcome.storm.bound,
        outcome.storm.clients,
        served_again.map_or("never".into(), human),
        leader_after
    );
    Ok(Scenario {
        name: fault.name().into(),
        key: fault.key().into(),
        outcomes: vec![outcome],
        served_again,
        fault: Some(FaultInfo {
            bound_at_fault,
            at: outcome_began.map_or(Duration::ZERO, |b| injected.saturating_duration_since(b)),
            old_leader: old,
            leader_after,
        }),
    })
}

fn pct(v: f64) -> String {
    if (99.95..100.0).contains(&v) { format!("{v:.2} %") } else { format!("{v:.1} %") }
}

fn print_table(sizes: &[(usize, Vec<Scenario>)]) {
    println!(
        "| clients | scenario | storms | leased | time to lease p50 | p99 | max | p50 / p99 vs dnsmasq alone | clients that DISCOVERed again | NAKs (storm) | renewal: kept / NAKed → new address / unanswered | duplicate addresses | double offers | served again after the fault |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, scenarios) in sizes {
        let alone = scenarios.iter().find(|s| s.key == "alone");
        for s in scenarios {
            let t = s.time_to_lease();
            let vs = match alone.map(Scenario::time_to_lease) {
                Some(a) if s.key == "ironguard" && a.len() > 0 && t.len() > 0 => format!(
                    "{:.2} / {:.2}",
                    t.median().as_secs_f64() / a.median().as_secs_f64().max(1e-9),
                    t.percentile(99.0).as_secs_f64() / a.percentile(99.0).as_secs_f64().max(1e-9)
                ),
                _ => "—".into(),
            };
            let renewal = format!(
                "{} / {} → {} / {}",
                s.renewal_sum(|r| r.kept),
                s.renewal_sum(|r| r.naked_clients),
                s.renewal_sum(|r| r.bound - r.kept),
                s.renewal_sum(|r| r.unanswered)
            );
            let served = match (&s.fault, s.served_again) {
                (None, _) => "—".into(),
                (Some(_), Some(d)) => human(d),
                (Some(f), None) if f.leader_after == Some(f.old_leader) => {
                    "never (the faulted host still leads)".into()
                }
                (Some(_), None) => "never".into(),
            };
            println!(
                "| {n} | {} | {} | {} of {} ({}) | {} | {} | {} | {vs} | {} | {} | {renewal} | {} | {} | {served} |",
                s.name,
                s.outcomes.len(),
                s.leased(),
                s.clients(),
                pct(s.leased_pct()),
                human(t.median()),
                human(t.percentile(99.0)),
                human(t.percentile(100.0)),
                s.storms().map(|r| r.retried).sum::<usize>(),
                s.storms().map(|r| r.naks).sum::<usize>(),
                s.sum(|o| o.duplicates),
                s.sum(|o| o.double_offers),
            );
        }
    }
}

/// The goals, judged: one line each.
fn print_goals(sizes: &[(usize, Vec<Scenario>)]) {
    println!();
    for (n, scenarios) in sizes {
        let alone = scenarios.iter().find(|s| s.key == "alone");
        for s in scenarios {
            let ok = |b: bool| if b { "met" } else { "NOT met" };
            let leased = s.leased_pct();
            let mut line = format!(
                "{n} clients, {}: leased {} ≥ 99.9 % {}; 0 duplicate addresses {}; 0 double offers {}",
                s.name,
                pct(leased),
                ok(leased >= 99.9),
                ok(s.sum(|o| o.duplicates) == 0),
                ok(s.sum(|o| o.double_offers) == 0)
            );
            if s.key == "ironguard" {
                if let Some(a) = alone {
                    let r =
                        s.time_to_lease().median().as_secs_f64() / a.time_to_lease().median().as_secs_f64().max(1e-9);
                    line += &format!(
                        "; time to lease p50 within 5 % of dnsmasq alone {} ({:+.1} %)",
                        ok(r <= 1.05),
                        (r - 1.0) * 100.0
                    );
                }
            }
            println!("{line}");
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clients.iter().all(|n| (1..=PLAN.per_host as usize).contains(n)),
        "--clients: 1 to {} each",
        PLAN.per_host
    );
    anyhow::ensure!(args.reps >= 1 && args.reps <= 16, "--reps: 1 to 16");
    anyhow::ensure!((1..=8).contains(&args.alone_hosts), "--alone-hosts: 1 to 8");
    let faults: Vec<StormFault> = if args.no_faults {
        vec![]
    } else if args.faults.is_empty() {
        StormFault::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    // Every dnsmasq fsyncs its lease file on each ACK, and etcd its log on each write: on a disk shared with other
    // work the storm would time that disk as much as the DHCP path.
    let files = std::env::temp_dir();
    let on_tmpfs = nix::sys::statfs::statfs(&files).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    if !on_tmpfs {
        eprintln!(
            "warning: {} is not a tmpfs: dnsmasq fsyncs its lease file on every ACK, so this run times the disk as much as the DHCP path (TMPDIR=/dev/shm keeps the storms' files in memory)",
            files.display()
        );
    }
    let mut sizes = Vec::new();
    for &n in &args.clients {
        eprintln!("== {n} clients: dnsmasq alone and the site, {} storms each", args.reps);
        let (alone, site) = unfaulted(&args, n)?;
        let mut scenarios = vec![alone, site];
        for &f in &faults {
            eprintln!("== {n} clients: {}", f.name());
            scenarios.push(faulted(&args, n, f)?);
        }
        sizes.push((n, scenarios));
    }

    let sched = args.schedule.secs().iter().map(|s| format!("{s}")).collect::<Vec<_>>().join(", ");
    println!(
        "ironguard boot storm — N PXE clients on one raw socket (each its own MAC and xid, broadcast flag), DISCOVER timeouts {sched} s with secs rising, powering on over {} ms",
        args.spread_ms
    );
    println!(
        "site: 3 PXE hosts (dnsmasq + agent each, slices of {} addresses of a /{}), etcd, 2 control planes, every client's MAC allowed; TTL {TTL_SECS} s",
        PLAN.per_host, PLAN.prefix_len
    );
    println!(
        "dnsmasq alone: the first host's address and slice, no ironguard, on a bridge with {} host(s) (the others run no DHCP server)",
        args.alone_hosts
    );
    println!(
        "lease files and etcd's data in {} ({})",
        files.display(),
        if on_tmpfs { "tmpfs" } else { "on disk: every ACK waits for dnsmasq's fsync" }
    );
    println!(
        "time to lease: first DISCOVER → ACK, over the clients leased; renewal: every bound client REQUESTs its address from its server after the storm, rebinding (broadcast) when unanswered"
    );
    println!();
    print_table(&sizes);
    print_goals(&sizes);

    let out = json!({
        "schedule_s": args.schedule.secs(),
        "spread_ms": args.spread_ms,
        "reps": args.reps,
        "files_on_tmpfs": on_tmpfs,
        "alone_hosts": args.alone_hosts,
        "plan": {"prefix_len": PLAN.prefix_len, "first": PLAN.first.to_string(), "per_host": PLAN.per_host},
        "sizes": sizes.iter().map(|(n, sc)| {
            let alone = sc.iter().find(|s| s.key == "alone");
            json!({"clients": n, "scenarios": sc.iter().map(|s| s.to_json(alone)).collect::<Vec<_>>()})
        }).collect::<Vec<_>>(),
    });
    crate::write_json(&args.json, &out)?;
    crate::write_chart(&args.json, crate::plot::Kind::Storm, &out);
    let unsafe_seen: usize =
        sizes.iter().flat_map(|(_, sc)| sc.iter()).map(|s| s.sum(|o| o.duplicates + o.double_offers)).sum();
    anyhow::ensure!(unsafe_seen == 0, "duplicate addresses or double offers were seen");
    Ok(())
}
