//! `ironguardctl` command line. See `ironguardctl --help`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use ironguardctl::agents::AgentsReport;
use ironguardctl::chains::ChainsReport;
use ironguardctl::cli::{Cli, Command, FiltersCommand};
use ironguardctl::controlplane::{ControlPlane, Target};
use ironguardctl::filters::{self, FilterAction, FilterStateReport, UpdateReport};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ironguardctl: {}", ironguardctl::cli::error_text(&e));
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Chains { netns, json, elements } => {
            // No thread and no socket exists yet, so entering the namespace covers everything that follows.
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
        Command::Filters { command } => block_on(filters(Target::new(cli.controlplane), command)),
        Command::Agents { json } => block_on(agents(Target::new(cli.controlplane), json)),
    }
}

/// Runs a gRPC command. Its runtime is built here, after parsing and only for these commands, so that `chains`
/// never starts a thread before entering a namespace.
fn block_on(command: impl Future<Output = anyhow::Result<ExitCode>>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    runtime.block_on(command)
}

async fn filters(target: Target, command: FiltersCommand) -> anyhow::Result<ExitCode> {
    let mut controlplane = ControlPlane::connect(&target).await?;
    let (action, list) = match command {
        FiltersCommand::Show { macs, json } => {
            let state = controlplane.filter_state(filters::state_request(&macs)).await?;
            let report = FilterStateReport::new(state, &macs);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            return Ok(ExitCode::SUCCESS);
        }
        FiltersCommand::Allow(list) => (FilterAction::Allow, list),
        FiltersCommand::Deny(list) => (FilterAction::Deny, list),
        FiltersCommand::Remove(list) => (FilterAction::Remove, list),
    };
    let request = filters::update_request(action, &list.macs);
    let answer = controlplane.update_filters(request.clone()).await?;
    print!("{}", UpdateReport::new(&request, action, answer).render());
    Ok(ExitCode::SUCCESS)
}

async fn agents(target: Target, json: bool) -> anyhow::Result<ExitCode> {
    let mut controlplane = ControlPlane::connect(&target).await?;
    let report = AgentsReport::from(controlplane.list_agents().await?);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}
