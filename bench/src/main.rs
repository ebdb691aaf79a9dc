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
#![forbid(unsafe_code)]

mod callbacks;
mod dataplane;
mod filters;
mod ha;
mod inspect;
mod stats;

use std::path::PathBuf;

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
    /// Inspection engine: 200 inspections at once, Continue throughput, Ironic sync of 10k nodes, memory.
    Inspect(inspect::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Callbacks(args) => callbacks::run(args),
        Command::Dataplane(args) => dataplane::run(args),
        Command::Filters(args) => filters::run(args),
        Command::Ha(args) => ha::run(args),
        Command::Inspect(args) => inspect::run(args),
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
