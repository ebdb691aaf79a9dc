//! The dataplane benchmark.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use ironguard_dataplane::{
    Backend, Dataplane, Delta, DesiredState, KernelDataplane, Mode, RulesetConfig, UnknownMacPolicy,
};
use nix::sys::resource::{UsageWho, getrusage};
use serde_json::json;

use crate::stats::{Samples, human, macs, ms};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Full-load sizes (MACs in the deny set; each also goes into the chaddr set, as in the default match mode).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    sizes: Vec<usize>,
    /// Repetitions of each full load (median reported).
    #[arg(long, default_value_t = 5)]
    load_reps: usize,
    /// Size at which one-MAC deltas and mode switches are measured.
    #[arg(long, default_value_t = 100_000)]
    delta_at: usize,
    /// Repetitions of one-MAC add / delete / mode switch.
    #[arg(long, default_value_t = 200)]
    reps: usize,
    /// MACs added with one iptables process each (ironic-inspector's approach).
    #[arg(long, default_value_t = 2000)]
    iptables_macs: usize,
    /// Full-load sizes for the other backends (dnsmasq hostsdir, ipset); their one-MAC changes are measured at the
    /// largest.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    backend_sizes: Vec<usize>,
    /// Times a leading `ironguard-agent hold` is killed (SIGKILL) to time how soon its table is gone.
    #[arg(long, default_value_t = 20)]
    kill_reps: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/dataplane.json")]
    json: PathBuf,
}

fn state(n: usize) -> DesiredState {
    let mut s = DesiredState::blocked(RulesetConfig::default());
    s.mode = Mode::Leader;
    s.unknown_mac_policy = UnknownMacPolicy::Allow;
    s.deny.extend(macs(n, 0xd));
    s.allow.extend(macs(10, 0xa));
    s
}

const NFT_TABLE: &str = "bench_nft";

fn nft(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("nft").args(args).output().context("running nft")?;
    if !out.status.success() {
        bail!("nft {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn timed_nft(args: &[&str]) -> anyhow::Result<Duration> {
    Ok(timed_nft_cpu(args)?.0)
}

/// CPU time spent in user space and in the kernel.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    user: Duration,
    sys: Duration,
}

fn rusage(who: UsageWho) -> Cpu {
    let tv = |t: nix::sys::time::TimeVal| Duration::from_micros((t.tv_sec() * 1_000_000 + t.tv_usec()) as u64);
    getrusage(who).map(|r| Cpu { user: tv(r.user_time()), sys: tv(r.system_time()) }).unwrap_or_default()
}

fn cpu_since(before: Cpu, who: UsageWho) -> Cpu {
    let after = rusage(who);
    Cpu { user: after.user.saturating_sub(before.user), sys: after.sys.saturating_sub(before.sys) }
}

/// Runs `nft args`, returning its wall time and its CPU time (the kernel's work on its batch runs in its `sendmsg`,
/// so it counts as the process's system time).
fn timed_nft_cpu(args: &[&str]) -> anyhow::Result<(Duration, Cpu)> {
    let before = rusage(UsageWho::RUSAGE_CHILDREN);
    let t = Instant::now();
    nft(args)?;
    Ok((t.elapsed(), cpu_since(before, UsageWho::RUSAGE_CHILDREN)))
}

fn set_sizes_in(table: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = vec![];
    for set in ["allow_mac", "deny_mac", "allow_chaddr", "deny_chaddr"] {
        let o = Command::new("nft").args(["-j", "list", "set", "inet", table, set]).output()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).context("nft -j output")?;
        let n = v["nftables"]
            .as_array()
            .and_then(|a| a.iter().find_map(|x| x["set"]["elem"].as_array().map(|e| e.len())))
            .unwrap_or(0);
        out.push(n);
    }
    Ok(out)
}

struct Row {
    name: String,
    ironguard: Duration,
    nft: Option<Duration>,
    note: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .context("entering a private network namespace (run as root)")?;
    let dir = std::env::temp_dir().join(format!("ironguard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows: Vec<Row> = vec![];
    let mut results = serde_json::Map::new();

    // 1. Full loads.
    let mut loads = vec![];
    let mut cpu_rows: Vec<(usize, Duration, Duration, Duration, Duration)> = vec![];
    for &n in &args.sizes {
        let s = state(n);
        let script_path = dir.join(format!("load-{n}.nft"));
        std::fs::write(&script_path, ironguard_dataplane::script::owned_table_script(NFT_TABLE, &s, false))?;
        let script = script_path.to_string_lossy().to_string();
        let (mut ig, mut nf) = (vec![], vec![]);
        let (mut ig_cpu, mut nf_cpu) = (vec![], vec![]);
        let run_nft = |nf: &mut Vec<Duration>, nf_cpu: &mut Vec<Cpu>| -> anyhow::Result<()> {
            let (wall, cpu) = timed_nft_cpu(&["-f", &script])?;
            nf.push(wall);
            nf_cpu.push(cpu);
            Ok(())
        };
        for rep in 0..args.load_reps {
            // Alternate which goes first so neither benefits from a warm cache.
            let first_nft = rep % 2 == 1;
            if first_nft {
                run_nft(&mut nf, &mut nf_cpu)?;
            }
            let mut dp = KernelDataplane::open()?;
            // The whole call: building the batch from the model, sending it, the kernel's acknowledgements (nft -f
            // is timed from its start to its exit: parsing, building, sending). The kernel processes a batch inside
            // the sender's sendmsg, so the thread's system time is the kernel's share.
            let before = rusage(UsageWho::RUSAGE_THREAD);
            let t = Instant::now();
            dp.apply(&s)?;
            ig.push(t.elapsed());
            ig_cpu.push(cpu_since(before, UsageWho::RUSAGE_THREAD));
            if rep == 0 {
                // Same content: both tables hold the same number of elements in every set.
                if !first_nft {
                    run_nft(&mut nf, &mut nf_cpu)?;
                }
                let a = set_sizes_in(ironguard_dataplane::OWNED_TABLE)?;
                let b = set_sizes_in(NFT_TABLE)?;
                if a != b || a[1] != n {
                    bail!("content differs: ironguard {a:?} vs nft -f {b:?}");
                }
            } else if !first_nft {
                run_nft(&mut nf, &mut nf_cpu)?;
            }
            drop(dp); // closing the owner socket deletes the table
            nft(&["delete", "table", "inet", NFT_TABLE])?;
            // The kernel frees a deleted table's elements in a deferred work item; let it finish before the next
            // load, so neither tool is timed while that work competes for the CPU and the allocator.
            std::thread::sleep(settle(n));
        }
        let med = |v: &[Cpu], f: fn(&Cpu) -> Duration| Samples::new(v.iter().map(f).collect()).median();
        let (ig_user, ig_sys) = (med(&ig_cpu, |c| c.user), med(&ig_cpu, |c| c.sys));
        let (nf_user, nf_sys) = (med(&nf_cpu, |c| c.user), med(&nf_cpu, |c| c.sys));
        eprintln!(
            "full load {n} CPU (median): ironguard user {} kernel {}; nft -f user {} kernel {}",
            human(ig_user),
            human(ig_sys),
            human(nf_user),
            human(nf_sys)
        );
        cpu_rows.push((n, ig_user, ig_sys, nf_user, nf_sys));
        let (ig, nf) = (Samples::new(ig), Samples::new(nf));
        eprintln!("full load {n}: ironguard {} nft -f {}", ig.list(), nf.list());
        rows.push(Row {
            name: format!("full load {n} MACs ({} elements)", 2 * (n + 10)),
            ironguard: ig.median(),
            nft: Some(nf.median()),
            note: format!("median of {}", ig.len()),
        });
        let mut j = full_load_json(n, &ig, &nf);
        j["ironguard_user_ms"] = json!(ms(ig_user));
        j["ironguard_kernel_ms"] = json!(ms(ig_sys));
        j["nft_f_user_ms"] = json!(ms(nf_user));
        j["nft_f_kernel_ms"] = json!(ms(nf_sys));
        loads.push(j);
    }
    results.insert("full_load".into(), json!(loads));

    // 2. One-MAC deltas and mode switches at `delta_at`, with the same content loaded via nft -f for comparison.
    let n = args.delta_at;
    let s = state(n);
    let script_path = dir.join("delta-base.nft");
    std::fs::write(&script_path, ironguard_dataplane::script::owned_table_script(NFT_TABLE, &s, false))?;
    nft(&["-f", &script_path.to_string_lossy()])?;
    let mut dp = KernelDataplane::open()?;
    dp.apply(&s)?;
    let probe = macs(args.reps, 0x77);
    let (mut add, mut del, mut nadd, mut ndel) = (vec![], vec![], vec![], vec![]);
    let mut transactions = 0;
    for m in &probe {
        let t = Instant::now();
        transactions += dp.apply_delta(&Delta { allow_add: vec![*m], ..Default::default() })?.transactions;
        add.push(t.elapsed());
        let t = Instant::now();
        transactions += dp.apply_delta(&Delta { allow_remove: vec![*m], ..Default::default() })?.transactions;
        del.push(t.elapsed());
    }
    for m in probe.iter().take(args.reps.min(50)) {
        let e = format!("{{ {m} }}");
        nadd.push(timed_nft(&["add", "element", "inet", NFT_TABLE, "allow_mac", &e])?);
        ndel.push(timed_nft(&["delete", "element", "inet", NFT_TABLE, "allow_mac", &e])?);
    }
    let (add, del, nadd, ndel) = (Samples::new(add), Samples::new(del), Samples::new(nadd), Samples::new(ndel));
    rows.push(Row {
        name: format!("one-MAC add at {n}"),
        ironguard: add.median(),
        nft: Some(nadd.median()),
        note: format!("p99 {} (in-process); nft add element", human(add.percentile(99.0))),
    });
    rows.push(Row {
        name: format!("one-MAC delete at {n}"),
        ironguard: del.median(),
        nft: Some(ndel.median()),
        note: format!("p99 {}; nft delete element", human(del.percentile(99.0))),
    });
    results.insert(
        "one_mac".into(),
        json!({"at": n, "reps": add.len(), "transactions": transactions,
            "add_p50_ms": ms(add.median()), "add_p99_ms": ms(add.percentile(99.0)),
            "delete_p50_ms": ms(del.median()), "delete_p99_ms": ms(del.percentile(99.0)),
            "nft_add_p50_ms": ms(nadd.median()), "nft_delete_p50_ms": ms(ndel.median())}),
    );

    // Lease refreshes at n: the leader's keep-alive moves the kernel lease (flush the lease set and add its element
    // with the new timeout, one batch); nft -f does the same in one transaction.
    let mut lease = vec![];
    for _ in 0..args.reps {
        let t = Instant::now();
        dp.refresh_lease(Some(Instant::now() + Duration::from_secs(3)))?;
        lease.push(t.elapsed());
    }
    let ports: Vec<String> = s.config.ports.iter().map(|p| format!("{p} timeout 3000ms")).collect();
    let lease_path = dir.join("lease.nft");
    std::fs::write(
        &lease_path,
        format!(
            "flush set inet {NFT_TABLE} {set}\nadd element inet {NFT_TABLE} {set} {{ {} }}\n",
            ports.join(", "),
            set = ironguard_dataplane::LEASE_SET
        ),
    )?;
    let nlease = Samples::new(
        (0..args.reps.min(50)).map(|_| timed_nft(&["-f", &lease_path.to_string_lossy()])).collect::<Result<_, _>>()?,
    );
    let lease = Samples::new(lease);
    rows.push(Row {
        name: format!("lease refresh at {n}"),
        ironguard: lease.median(),
        nft: Some(nlease.median()),
        note: format!("p99 {}; flush + add of the lease element, one batch", human(lease.percentile(99.0))),
    });
    results.insert(
        "lease_refresh".into(),
        json!({"at": n, "reps": lease.len(), "p50_ms": ms(lease.median()), "p99_ms": ms(lease.percentile(99.0)),
            "nft_f_p50_ms": ms(nlease.median())}),
    );

    // Mode switch Follower -> Leader at n, and at 1k to show it does not depend on set size.
    drop(dp);
    let mut switches = vec![];
    for size in [n, 1000] {
        switches.push((size, measure_switch(&state(size), args.reps)?));
    }
    // nft -f equivalent of the switch: flush the three chains and write the leader rules.
    let leader_rules: String = {
        let full = ironguard_dataplane::script::owned_table_script(NFT_TABLE, &s, false);
        let mut out = String::new();
        let mut chain = None;
        for line in full.lines() {
            let t = line.trim();
            if let Some(c) = t.strip_prefix("chain ").and_then(|c| c.strip_suffix(" {")) {
                chain = ["whitelist", "blacklist", "pxe"].contains(&c).then(|| c.to_string());
                if let Some(c) = &chain {
                    out.push_str(&format!("flush chain inet {NFT_TABLE} {c}\n"));
                }
            } else if t == "}" {
                chain = None;
            } else if let Some(c) = &chain {
                out.push_str(&format!("add rule inet {NFT_TABLE} {c} {t}\n"));
            }
        }
        out
    };
    let switch_path = dir.join("switch.nft");
    std::fs::write(&switch_path, leader_rules)?;
    let nsw = Samples::new(
        (0..args.reps.min(50)).map(|_| timed_nft(&["-f", &switch_path.to_string_lossy()])).collect::<Result<_, _>>()?,
    );
    for (size, sm) in &switches {
        rows.push(Row {
            name: format!("Follower->Leader at {size}"),
            ironguard: sm.median(),
            nft: (*size == n).then(|| nsw.median()),
            note: format!("p99 {}", human(sm.percentile(99.0))),
        });
    }
    results.insert(
        "mode_switch".into(),
        json!(
            switches
                .iter()
                .map(|(size, sm)| json!({"macs": size, "p50_ms": ms(sm.median()), "p99_ms": ms(sm.percentile(99.0))}))
                .collect::<Vec<_>>()
        ),
    );
    results.insert("mode_switch_nft_f_p50_ms".into(), json!(ms(nsw.median())));
    let _ = nft(&["delete", "table", "inet", NFT_TABLE]);

    // 3. The other backends, on the same states.
    let backend_rows = other_backends(&args, &dir)?;
    results.insert("backends".into(), json!(backend_rows.iter().map(BackendRow::json).collect::<Vec<_>>()));

    // 4. The owner killed: how soon the kernel drops its table (what the end-to-end tests only order).
    let killed = owner_killed(args.kill_reps, &dir)?;
    results.insert(
        "owner_killed".into(),
        json!({"reps": killed.gone.len(), "table_gone_p50_ms": ms(killed.gone.median()),
            "table_gone_p99_ms": ms(killed.gone.percentile(99.0)), "table_gone_max_ms": ms(killed.gone.percentile(100.0)),
            "reaped_p50_ms": ms(killed.reaped.median()), "reaped_max_ms": ms(killed.reaped.percentile(100.0))}),
    );

    // 5. One iptables process per MAC, as ironic-inspector does.
    let ipt_version = Command::new("iptables")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let chain = "ironic-inspector";
    let st = Command::new("iptables").args(["-N", chain]).status().context("running iptables")?;
    if !st.success() {
        bail!("iptables -N failed");
    }
    let ipt_macs = macs(args.iptables_macs, 0x1a);
    let t = Instant::now();
    let mut last_100 = Duration::ZERO;
    for (i, m) in ipt_macs.iter().enumerate() {
        let one = Instant::now();
        let st = Command::new("iptables")
            .args(["-A", chain, "-m", "mac", "--mac-source", &m.to_string(), "-j", "DROP"])
            .status()?;
        if !st.success() {
            bail!("iptables -A failed for {m}");
        }
        if i + 100 >= ipt_macs.len() {
            last_100 += one.elapsed();
        }
    }
    let ipt_total = t.elapsed();
    let per_mac = ipt_total / ipt_macs.len().max(1) as u32;
    let per_mac_last = last_100 / 100.min(ipt_macs.len()).max(1) as u32;
    results.insert(
        "iptables_per_mac".into(),
        iptables_json(ipt_macs.len(), ipt_total, per_mac, per_mac_last, &ipt_version),
    );
    let ig_per_mac =
        loads.iter().find(|l| l["macs"] == json!(1000)).and_then(|l| l["ironguard_ms"].as_f64()).map(|v| v / 1000.0);
    let nft_per_mac =
        loads.iter().find(|l| l["macs"] == json!(1000)).and_then(|l| l["nft_f_ms"].as_f64()).map(|v| v / 1000.0);

    // The table.
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let nft_version = Command::new("nft")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "ironguard dataplane benchmark — kernel {kernel}, {nft_version}, {ipt_version}; private network namespace"
    );
    println!("ratio = ironguard / nft -f on the same content (< 1 is faster); all figures from this run");
    println!();
    println!("| operation | ironguard | nft -f (same content) | ratio | notes |");
    println!("|---|---:|---:|---:|---|");
    for r in &rows {
        let (nft, ratio) = match r.nft {
            Some(n) => (human(n), ratio(r.ironguard, n)),
            None => ("—".into(), "—".into()),
        };
        println!("| {} | {} | {} | {} | {} |", r.name, human(r.ironguard), nft, ratio, r.note);
    }
    if let (Some(ig), Some(nf)) = (ig_per_mac, nft_per_mac) {
        println!(
            "| per-MAC cost, full load of 1000 | {:.2} µs | {:.2} µs | {:.2}× | iptables, one process per MAC (ironic-inspector): {} per MAC over {} MACs ({} total; last 100: {} per MAC) |",
            ig * 1e3,
            nf * 1e3,
            ig / nf,
            human(per_mac),
            ipt_macs.len(),
            human(ipt_total),
            human(per_mac_last)
        );
        println!("iptables per MAC / ironguard per MAC: {:.0}×", ms(per_mac) / ig);
    }
    println!();
    println!(
        "Where the full-load time goes (CPU time, medians; the kernel processes a batch inside the sender's sendmsg):"
    );
    println!();
    println!(
        "| MACs | ironguard user | ironguard kernel | nft -f user | nft -f kernel | floor: ironguard kernel / nft -f wall |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (n, iu, is, nu, ns) in &cpu_rows {
        let wall =
            loads.iter().find(|l| l["macs"] == json!(n)).and_then(|l| l["nft_f_ms"].as_f64()).unwrap_or(f64::NAN);
        println!(
            "| {n} | {} | {} | {} | {} | {:.2}× |",
            human(*iu),
            human(*is),
            human(*nu),
            human(*ns),
            ms(*is) / wall
        );
    }
    println!();
    println!(
        "The owner killed (SIGKILL of a leading `ironguard-agent hold`, 1000 MACs denied), read from the kernel every ~0.2 ms:"
    );
    println!();
    println!("| from SIGKILL to | reps | p50 | p99 | max | goal |");
    println!("|---|---:|---:|---:|---:|---|");
    for (what, s) in [("its table gone (CLOSED)", &killed.gone), ("the process reaped", &killed.reaped)] {
        println!(
            "| {what} | {} | {} | {} | {} | < 1 s |",
            s.len(),
            human(s.median()),
            human(s.percentile(99.0)),
            human(s.percentile(100.0))
        );
    }
    println!();
    println!("Other backends, same states (the nftables figures above are from this run):");
    println!();
    println!("| backend | full load | one-MAC add | one-MAC delete | notes |");
    println!("|---|---:|---:|---:|---|");
    for b in &backend_rows {
        println!("{}", b.markdown());
    }
    results.insert("kernel".into(), json!(kernel));
    results.insert("nft_version".into(), json!(nft_version));
    let results = serde_json::Value::Object(results);
    crate::write_json(&args.json, &results)?;
    crate::write_chart(&args.json, crate::plot::Kind::Dataplane, &results);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One entry of `full_load`: the medians of ironguard's and `nft -f`'s loads of `n` MACs (the chart reads `macs`,
/// `ironguard_ms`, `nft_f_ms` and `reps`).
pub(crate) fn full_load_json(n: usize, ironguard: &Samples, nft_f: &Samples) -> serde_json::Value {
    json!({"macs": n, "elements": 2 * (n + 10), "ironguard_ms": ms(ironguard.median()), "nft_f_ms": ms(nft_f.median()),
        "ratio": ms(ironguard.median()) / ms(nft_f.median()), "reps": ironguard.len(),
        "ironguard_min_ms": ms(ironguard.percentile(0.0)), "ironguard_max_ms": ms(ironguard.percentile(100.0)),
        "nft_f_min_ms": ms(nft_f.percentile(0.0)), "nft_f_max_ms": ms(nft_f.percentile(100.0))})
}

/// `iptables_per_mac`: `macs` MACs added with one iptables process each, in `total` (the chart reads `macs`,
/// `total_ms`, `per_mac_ms`, `per_mac_last_100_ms` and `version`).
pub(crate) fn iptables_json(
    macs: usize,
    total: Duration,
    per_mac: Duration,
    per_mac_last_100: Duration,
    version: &str,
) -> serde_json::Value {
    json!({"macs": macs, "total_ms": ms(total), "per_mac_ms": ms(per_mac),
        "per_mac_last_100_ms": ms(per_mac_last_100), "version": version})
}

/// SIGKILL → table gone, and SIGKILL → reaped, over `reps` runs.
struct OwnerKilled {
    gone: Samples,
    reaped: Samples,
}

/// Starts a leading `ironguard-agent hold` (in this process's namespace) `reps` times, kills it, and times how soon
/// a kernel read finds its table gone, and how soon the process is reaped.
fn owner_killed(reps: usize, dir: &std::path::Path) -> anyhow::Result<OwnerKilled> {
    let agent = ironguard_netns_tests::bin("ironguard-agent");
    let deny: Vec<String> = macs(1000, 0x4b).iter().map(|m| format!("--deny={m}")).collect();
    let (mut gone, mut reaped) = (vec![], vec![]);
    for rep in 0..reps {
        let ready = dir.join(format!("hold-ready-{rep}"));
        let mut child = Command::new(&agent)
            .args(["hold", "--no-guard", "--interface", "bench0", "--mode", "leader", "--unknown-mac-policy", "deny"])
            .args(&deny)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting ironguard-agent hold")?;
        let start = Instant::now();
        while !ready.exists() {
            if start.elapsed() > Duration::from_secs(60) || child.try_wait()?.is_some() {
                let _ = child.kill();
                bail!("ironguard-agent hold did not become ready");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let owned = || ironguard_dataplane::observe(false).map(|o| o.owned.is_some());
        anyhow::ensure!(owned()?, "the holder's table is not there");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let t = Instant::now();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)?;
        let (mut table_gone, mut exited) = (None, None);
        while table_gone.is_none() || exited.is_none() {
            if table_gone.is_none() {
                match owned() {
                    Ok(false) => table_gone = Some(t.elapsed()),
                    Ok(true) | Err(ironguard_dataplane::NftError::Unstable(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if exited.is_none() && child.try_wait()?.is_some() {
                exited = Some(t.elapsed());
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "the killed holder or its table stayed");
            std::thread::sleep(Duration::from_micros(200));
        }
        gone.extend(table_gone);
        reaped.extend(exited);
        let _ = std::fs::remove_file(&ready);
    }
    Ok(OwnerKilled { gone: Samples::new(gone), reaped: Samples::new(reaped) })
}

/// Loads `s`, then times `reps` Follower -> Leader switches.
fn measure_switch(s: &DesiredState, reps: usize) -> anyhow::Result<Samples> {
    let mut dp = KernelDataplane::open()?;
    dp.apply(s)?;
    let mut samples = vec![];
    for _ in 0..reps {
        dp.set_mode(Mode::Follower, UnknownMacPolicy::Allow)?;
        let t = Instant::now();
        dp.set_mode(Mode::Leader, UnknownMacPolicy::Allow)?;
        samples.push(t.elapsed());
    }
    Ok(Samples::new(samples))
}

/// How long to wait after deleting a table of `n` MACs before the next timed load.
fn settle(n: usize) -> Duration {
    Duration::from_millis(50 + (n / 500) as u64)
}

fn ratio(a: Duration, b: Duration) -> String {
    let r = a.as_secs_f64() / b.as_secs_f64();
    if r < 0.01 { format!("{r:.4}×") } else { format!("{r:.2}×") }
}

/// One backend's figures: full loads by size, one-MAC changes at the largest size (or why it could not run).
struct BackendRow {
    backend: Backend,
    loads: Vec<(usize, Duration)>,
    add: Option<Samples>,
    delete: Option<Samples>,
    at: usize,
    note: String,
}

impl BackendRow {
    fn markdown(&self) -> String {
        let loads = if self.loads.is_empty() {
            "—".to_string()
        } else {
            self.loads.iter().map(|(n, d)| format!("{n}: {}", human(*d))).collect::<Vec<_>>().join("; ")
        };
        let med = |s: &Option<Samples>| {
            s.as_ref().map_or("—".to_string(), |s| format!("{} (at {})", human(s.median()), self.at))
        };
        format!("| {} | {loads} | {} | {} | {} |", self.backend, med(&self.add), med(&self.delete), self.note)
    }

    fn json(&self) -> serde_json::Value {
        json!({"backend": self.backend.to_string(),
            "full_load": self.loads.iter().map(|(n, d)| json!({"macs": n, "ms": ms(*d)})).collect::<Vec<_>>(),
            "one_mac_at": self.at,
            "add_p50_ms": self.add.as_ref().map(|s| ms(s.median())),
            "delete_p50_ms": self.delete.as_ref().map(|s| ms(s.median())),
            "note": self.note})
    }
}

/// Full loads and one-MAC changes of the dnsmasq hostsdir and ipset backends, on the states the nftables rows use.
fn other_backends(args: &Args, dir: &std::path::Path) -> anyhow::Result<Vec<BackendRow>> {
    let mut rows = vec![];
    for backend in [Backend::DnsmasqHostsdir, Backend::Ipset] {
        let mut row = BackendRow { backend, loads: vec![], add: None, delete: None, at: 0, note: String::new() };
        let config = |run: usize| RulesetConfig {
            backends: vec![backend],
            hostsdir: ironguard_dataplane::HostsdirConfig { dir: dir.join(format!("hostsdir-{run}")) },
            ..RulesetConfig::default()
        };
        match backend_figures(args, &mut row, &config) {
            Ok(()) => {
                if backend == Backend::DnsmasqHostsdir {
                    row.note = "one file per MAC written (dot file + rename); dnsmasq's inotify re-read not included; \
                                unknown MACs denied"
                        .into();
                } else {
                    row.note = "ipset restore + swap, iptables-legacy-restore; unknown MACs denied".into();
                }
            }
            Err(e) => row.note = format!("not measured here: {e:#}"),
        }
        eprintln!("{}", row.markdown());
        rows.push(row);
    }
    Ok(rows)
}

fn backend_figures(args: &Args, row: &mut BackendRow, config: &dyn Fn(usize) -> RulesetConfig) -> anyhow::Result<()> {
    let mut dp = None;
    for (run, &n) in args.backend_sizes.iter().enumerate() {
        let mut s = state(n);
        s.config = config(run);
        // Unknown MACs denied, so that allowing a MAC and removing it again each change what the backend holds
        // (with policy allow, a removed MAC stays served as unknown: nothing to write for the hostsdir).
        s.unknown_mac_policy = UnknownMacPolicy::Deny;
        let mut d = ironguard_dataplane::backend::open(&s.config)?;
        let t = Instant::now();
        d.apply(&s)?;
        row.loads.push((n, t.elapsed()));
        row.at = n;
        dp = Some(d);
    }
    let Some(mut dp) = dp else { return Ok(()) };
    let (mut add, mut del) = (vec![], vec![]);
    for m in macs(args.reps.min(100), 0x78) {
        let t = Instant::now();
        dp.apply_delta(&Delta { allow_add: vec![m], ..Default::default() })?;
        add.push(t.elapsed());
        let t = Instant::now();
        dp.apply_delta(&Delta { allow_remove: vec![m], ..Default::default() })?;
        del.push(t.elapsed());
    }
    row.add = Some(Samples::new(add));
    row.delete = Some(Samples::new(del));
    Ok(())
}
