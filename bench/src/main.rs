//! `ironguard-bench` — benchmarks that print a table and write JSON, every figure measured side by side in one
//! run. Run as root: each benchmark moves itself into a private network namespace first, so the host's firewall
//! is never touched.
//!
//! - `dataplane`: full loads (ironguard vs `nft -f` on the same content vs one `iptables` process per MAC, as
//!   ironic-inspector does), one-MAC add/delete at 100k, and mode switches.
//! - `filters`: end-to-end latency from `UpdatePxeFilters` to the MAC in the kernel sets of 1 and 3 agents,
//!   a burst of single-MAC updates, and memory of the agent and control plane (real binaries, namespaces).
//! - `inspect`: inspections with the fake Ironic (200 at once, Continue throughput, Ironic sync of 10k nodes,
//!   control-plane memory) — real control plane and agent processes in a namespace.
//! - `callbacks`: ramdisk callbacks (`/v1/continue`) against the real Ironic 39 — reply latency, callback →
//!   `finished`, and the Ironic requests each inspection's processing makes (Ironic's log and ironguard's count).
//! - `ha`: failover gaps for SIGTERM, SIGKILL and partition over many rounds, dual-open instants (must be 0),
//!   and recovery after etcd comes back (three PXE hosts, real etcd, namespaces).
//! - `queue`: the etcd work queue on a 3-member cluster — enqueue, take and pending at 10, 100 and 1,000 queued
//!   inspections, against the previous algorithm (whole queue read per take) in the same run.
//! - `storm`: a boot storm of N simulated PXE clients on the 3-host site, with no fault, the leader's host killed
//!   and its dnsmasq frozen mid-storm, next to the same storm against one dnsmasq alone: leased share, time to
//!   lease, NAKs, duplicate addresses, double offers.
//! - `site`: Ironic's own inspection of many nodes at once through the 3-host site with three real Ironic
//!   conductors (MariaDB, JSON-RPC) and a 3-member etcd 3.5, round after round, with no fault, a conductor
//!   restarted and the leader's host killed mid-round: boot → lease, inspect → finished, failover gap, Ironic
//!   requests per node, double offers, offers to nodes Ironic does not inspect, dual-open time.
//!
//! Each benchmark that has a chart (`dataplane`, `filters`, `callbacks`, `ha`, `storm`, `site`) also writes it as
//! SVG next to its JSON (`dataplane.json` → `dataplane.svg`); `plot KIND --json IN --svg OUT` draws it again from a
//! saved JSON (no root needed).
#![forbid(unsafe_code)]

mod callbacks;
mod dataplane;
mod filters;
mod ha;
mod hostile;
mod inspect;
mod plot;
mod queue;
mod site;
mod stats;
mod storm;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "ironguard-bench", about = "ironguard benchmarks (run as root; uses a private network namespace)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Dataplane: full load, one-MAC deltas and mode switches vs nft -f and iptables-per-MAC.
    Dataplane(dataplane::Args),
    /// Filter service: UpdatePxeFilters -> kernel latency with 1 and 3 agents, bursts, memory.
    Filters(filters::Args),
    /// Ramdisk callbacks against the real Ironic: reply latency, callback -> finished, Ironic requests per node.
    Callbacks(callbacks::Args),
    /// High availability: failover gaps and dual-open instants over many rounds.
    Ha(ha::Args),
    /// Hostile callbacks: a legitimate callback's latency and the control plane's memory, quiet and under attack.
    Hostile(hostile::Args),
    /// Inspection engine: 200 inspections at once, Continue throughput, Ironic sync of 10k nodes, memory.
    Inspect(inspect::Args),
    /// etcd work queue: enqueue, take and pending at 10, 100 and 1,000 queued inspections on a 3-member cluster.
    Queue(queue::Args),
    /// Boot storm: N PXE clients at once on the 3-host site (no fault, leader killed, dnsmasq frozen) vs dnsmasq alone.
    Storm(storm::Args),
    /// Ironic's inspections through the 3-conductor HA site, with faults: time to lease and to finished, safety.
    Site(site::Args),
    /// Draws a benchmark's chart (SVG) again from its saved JSON (no root needed).
    Plot(PlotArgs),
}

#[derive(Debug, clap::Args)]
struct PlotArgs {
    /// The benchmark that wrote the JSON.
    kind: plot::Kind,
    /// The JSON the benchmark wrote.
    #[arg(long)]
    json: PathBuf,
    /// Where to write the SVG (default: the JSON's path with the extension `.svg`).
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Callbacks(args) => callbacks::run(args),
        Command::Dataplane(args) => dataplane::run(args),
        Command::Filters(args) => filters::run(args),
        Command::Ha(args) => ha::run(args),
        Command::Hostile(args) => hostile::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Storm(args) => storm::run(args),
        Command::Queue(args) => queue::run(args),
        Command::Site(args) => site::run(args),
        Command::Plot(args) => {
            let text =
                std::fs::read_to_string(&args.json).with_context(|| format!("reading {}", args.json.display()))?;
            let value: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", args.json.display()))?;
            let svg = plot::svg(args.kind, &value).with_context(|| format!("drawing {}", args.json.display()))?;
            write_svg(&args.svg.unwrap_or_else(|| svg_path(&args.json)), &svg)
        }
    }
}

/// Writes `value` as pretty JSON to `path`, creating parent directories.
pub(crate) fn write_json(path: &PathBuf, value: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Where the chart of the JSON at `json` goes: the same path with the extension `.svg`.
pub(crate) fn svg_path(json: &Path) -> PathBuf {
    if json.extension().is_some_and(|e| e == "svg") {
        // Never overwrite the JSON itself.
        let mut p = json.as_os_str().to_owned();
        p.push(".svg");
        return PathBuf::from(p);
    }
    json.with_extension("svg")
}

/// Writes an SVG document to `path`, creating parent directories.
pub(crate) fn write_svg(path: &Path, svg: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Draws the chart of `kind` from `value` (the JSON just written to `json`) next to it, as `json` with `.svg`.
/// A chart that cannot be drawn is reported, not fatal: the JSON, written first, holds the results.
pub(crate) fn write_chart(json: &Path, kind: plot::Kind, value: &serde_json::Value) {
    let path = svg_path(json);
    if let Err(e) = plot::svg(kind, value).and_then(|svg| write_svg(&path, &svg)) {
        eprintln!("chart {} not written: {e:#}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_goes_next_to_the_json() {
        assert_eq!(svg_path(Path::new("bench-results/dataplane.json")), PathBuf::from("bench-results/dataplane.svg"));
        assert_eq!(svg_path(Path::new("out/ha")), PathBuf::from("out/ha.svg"));
        // Never the JSON itself.
        assert_eq!(svg_path(Path::new("x.svg")), PathBuf::from("x.svg.svg"));
    }
}
