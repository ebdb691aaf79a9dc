//! `ironguardctl` command line. See `ironguardctl --help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ironguardctl::chains::ChainsReport;

#[derive(Debug, Parser)]
#[command(name = "ironguardctl", version, about = "ironguard operator CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Dump the kernel chain state of this host (read over netlink; works when the agent is dead).
    Chains {
        /// Inspect this named network namespace (as listed by `ip netns`).
        #[arg(long)]
        netns: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also list the elements of every set.
        #[arg(long)]
        elements: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ironguardctl: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Chains { netns, json, elements } => {
            if let Some(ns) = &netns {
                ironguardctl::netns::enter(ns)?;
            }
            let observed = ironguard_nft::observe(elements)?;
            let report = ChainsReport::new(netns, observed);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
