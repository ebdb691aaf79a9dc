//! `ironguardctl` command line. See `ironguardctl --help`.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use ironguard_proto::v1::{ListRequest, StartRequest};
use ironguardctl::agents::AgentsReport;
use ironguardctl::chains::ChainsReport;
use ironguardctl::cli::{
    Cli, Command, DiscoveryCommand, FiltersCommand, InspectCommand, LogFormat, RulesCommand, error_json, error_text,
};
use ironguardctl::controlplane::{ControlPlane, Target};
use ironguardctl::explain::ExplainReport;
use ironguardctl::filters::{self, FilterAction, FilterStateReport, UpdateReport};
use ironguardctl::inspect::wait::{self, WaitBounds};
use ironguardctl::inspect::{self, InspectionReport, ListReport, NodeAction, QuarantineReport};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = cli.log_format;
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            match format {
                LogFormat::Text => eprintln!("ironguardctl: {}", error_text(&e)),
                LogFormat::Json => eprintln!("{}", error_json(&e)),
            }
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // `chains` reads the kernel only: it needs no control plane, and no configuration file.
    let target = match cli.command {
        Command::Chains { .. } => Err(anyhow::anyhow!("unused")),
        _ => Ok(cli.target()?),
    };
    match cli.command {
        Command::Chains { netns, json, elements } => {
            // No thread and no socket exists yet, so entering the namespace covers everything that follows.
            if let Some(ns) = &netns {
                ironguardctl::netns::enter(ns)?;
            }
            let observed = ironguard_dataplane::observe(elements)?;
            let report = ChainsReport::new(netns, observed);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Filters { command } => block_on(filters(target?, command)),
        Command::Agents { json } => block_on(agents(target?, json)),
        Command::Explain { mac, local, netns, timeline, json } => {
            // The kernel first (no runtime, no socket yet); a failure to read it is an error of its own.
            let local = if local { Some(ironguardctl::explain::local(netns, mac)?) } else { None };
            block_on(explain(target?, mac, local, timeline, json))
        }
        Command::Inspect { command } => block_on(inspect(target?, command)),
        Command::Rules { command } => block_on(rules(target?, command)),
        Command::Discovery { command } => block_on(discovery(target?, command)),
    }
}

async fn discovery(target: Target, command: DiscoveryCommand) -> anyhow::Result<ExitCode> {
    let mut controlplane = ControlPlane::connect(&target).await?;
    let (answer, json) = match command {
        DiscoveryCommand::Open { network, duration } => {
            (controlplane.open_discovery(&network, duration.as_secs()).await?, false)
        }
        DiscoveryCommand::Close { network } => (controlplane.close_discovery(&network).await?, false),
        DiscoveryCommand::List { json } => (controlplane.list_discovery().await?, json),
    };
    let report = ironguardctl::discovery::WindowsReport::from(answer);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a gRPC command. Its runtime is built here, after parsing and only for these commands, so that `chains`
/// never starts a thread before entering a namespace.
fn block_on(command: impl Future<Output = anyhow::Result<ExitCode>>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    runtime.block_on(command)
}

async fn filters(target: Target, command: FiltersCommand) -> anyhow::Result<ExitCode> {
    let mut controlplane = ControlPlane::connect(&target).await?;
    let mut remove_reason = None;
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
        FiltersCommand::Remove { list, reason } => {
            remove_reason = reason;
            (FilterAction::Remove, list)
        }
    };
    let mut request = filters::update_request(action, &list.macs);
    request.remove_reason = remove_reason.unwrap_or_default();
    let answer = controlplane.update_filters(request.clone()).await?;
    print!("{}", UpdateReport::new(&request, action, answer).render());
    Ok(ExitCode::SUCCESS)
}

async fn explain(
    target: Target,
    mac: ironguard_dataplane::MacAddr,
    local: Option<ironguardctl::explain::LocalReport>,
    timeline: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let answer = match ControlPlane::connect(&target).await {
        Ok(mut c) => c.explain_mac(&mac.to_string()).await.map_err(anyhow::Error::from),
        Err(e) => Err(e.into()),
    };
    let (report, code) = match (answer, local) {
        (Ok(a), local) => (ExplainReport::new(a, local), ExitCode::SUCCESS),
        // The kernel's view still helps when the control plane is down; the exit code says it was incomplete.
        (Err(e), Some(local)) => (ExplainReport::local_only(mac, local, error_text(&e)), ExitCode::from(2)),
        (Err(e), None) => return Err(e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
        if timeline {
            print!("{}", report.render_timeline());
        }
    }
    Ok(code)
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

async fn inspect(target: Target, command: InspectCommand) -> anyhow::Result<ExitCode> {
    let connect = || ControlPlane::connect(&target);
    match command {
        InspectCommand::Start { nodes, no_manage_boot, maintenance_ok, wait, timeout, interval } => {
            let mut controlplane = connect().await?;
            let mut started = Vec::new();
            let mut refused = false;
            for node in dedup(nodes) {
                let request = StartRequest { node: node.clone(), manage_boot: !no_manage_boot, maintenance_ok };
                match controlplane.start_inspection(request).await {
                    Ok(answer) => {
                        println!("{}", inspect::started_line(&node, &answer));
                        // Later calls name the node as the control plane does (its UUID).
                        started.push(if answer.node.is_empty() { node } else { answer.node });
                    }
                    Err(e) => {
                        eprintln!("ironguardctl: {node}: {}", error_text(&e.into()));
                        refused = true;
                    }
                }
            }
            let mut code = if refused { 2 } else { 0 };
            if wait && !started.is_empty() {
                let bounds =
                    WaitBounds { timeout: Duration::from_secs(timeout), interval: Duration::from_millis(interval) };
                code = code.max(wait_for(&controlplane, &started, bounds).await);
            }
            Ok(ExitCode::from(code))
        }
        InspectCommand::Status { node, json } => {
            let mut controlplane = connect().await?;
            let report = InspectionReport::from(controlplane.inspection(&node).await?);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::List { states, page_size, page_token, all, json } => {
            let mut controlplane = connect().await?;
            let mut request =
                ListRequest { page_size: page_size.unwrap_or(0), page_token: page_token.unwrap_or_default(), states };
            let mut report = ListReport::default();
            let mut tokens_seen = HashSet::new();
            loop {
                report.add_page(controlplane.list_inspections(request.clone()).await?);
                match &report.next_page_token {
                    Some(token) if all => {
                        // A server that hands out a token twice would keep this loop going forever.
                        anyhow::ensure!(
                            tokens_seen.insert(token.clone()),
                            "the control plane at {} answered List with page token {token:?} twice; stopping",
                            controlplane.url()
                        );
                        request.page_token = token.clone();
                    }
                    _ => break,
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Abort { node } => {
            let mut controlplane = connect().await?;
            let answer = controlplane.abort_inspection(&node).await?;
            println!("{}", inspect::accepted_line(&node, NodeAction::Abort, answer.request_id));
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Reapply { node } => {
            let mut controlplane = connect().await?;
            let answer = controlplane.reapply_inspection(&node).await?;
            println!("{}", inspect::accepted_line(&node, NodeAction::Reapply, answer.request_id));
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Data { node, unprocessed, output } => {
            let mut controlplane = connect().await?;
            let answer = controlplane.inspection_data(&node, unprocessed).await?;
            let text = inspect::pretty_data(&answer.data_json).with_context(|| {
                format!(
                    "the control plane at {} sent introspection data of node {node} that is not JSON",
                    controlplane.url()
                )
            })?;
            match output {
                Some(file) => {
                    std::fs::write(&file, &text).with_context(|| format!("cannot write {}", file.display()))?;
                    println!("{node}: introspection data written to {} ({} bytes)", file.display(), text.len());
                }
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Continue { file, node_uuid } => {
            // Checked before connecting: a document that is not a JSON object never reaches the control plane.
            let document = inspect::read_introspection_data(&file)?;
            let mut controlplane = connect().await?;
            let answer = controlplane.continue_inspection(document, node_uuid).await?;
            println!("{}", inspect::continued_line(&answer));
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Quarantine { drop: Some(id), .. } => {
            let mut controlplane = connect().await?;
            controlplane.drop_quarantined(id).await?;
            println!("{}", inspect::dropped_line(id));
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Quarantine { drop: None, json } => {
            let mut controlplane = connect().await?;
            let report = QuarantineReport::from(controlplane.list_quarantined().await?);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        InspectCommand::Wait { nodes, wait } => {
            let controlplane = connect().await?;
            Ok(ExitCode::from(wait_for(&controlplane, &nodes, wait.bounds()).await))
        }
    }
}

async fn rules(target: Target, command: RulesCommand) -> anyhow::Result<ExitCode> {
    match command {
        RulesCommand::Import { file } => {
            // Checked before connecting: a file that is not JSON never reaches the control plane.
            let documents = ironguardctl::rules::read_rules(&file)?;
            let mut controlplane = ControlPlane::connect(&target).await?;
            for (i, doc) in documents.iter().enumerate() {
                let stored = controlplane.create_rule(doc.to_string()).await.with_context(|| {
                    format!(
                        "rule {} of {} in {} was refused ({i} stored before it)",
                        i + 1,
                        documents.len(),
                        file.display()
                    )
                })?;
                println!("{}", ironguardctl::rules::created_line(&stored.rule_json));
            }
            Ok(ExitCode::SUCCESS)
        }
        RulesCommand::List { json } => {
            let mut controlplane = ControlPlane::connect(&target).await?;
            let rules = controlplane.list_rules().await?;
            let parsed = ironguardctl::rules::parse_all(&rules)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&parsed)?);
            } else {
                print!("{}", ironguardctl::rules::render_table(&parsed));
            }
            Ok(ExitCode::SUCCESS)
        }
        RulesCommand::Show { uuid } => {
            let mut controlplane = ControlPlane::connect(&target).await?;
            let rule = controlplane.get_rule(&uuid).await?;
            let v: serde_json::Value =
                serde_json::from_str(&rule.rule_json).context("the control plane sent a rule that is not JSON")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(ExitCode::SUCCESS)
        }
        RulesCommand::Delete { uuids, all } => {
            let mut controlplane = ControlPlane::connect(&target).await?;
            if all {
                let r = controlplane.delete_all_rules().await?;
                println!("{} rule(s) deleted", r.deleted);
            } else {
                for uuid in dedup(uuids) {
                    controlplane.delete_rule(&uuid).await?;
                    println!("{uuid}: deleted");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Waits for the inspections of `nodes`, printing each one as it finishes and, on standard error, why the wait
/// stopped early. Returns the exit code.
async fn wait_for(controlplane: &ControlPlane, nodes: &[String], bounds: WaitBounds) -> u8 {
    let get = |node: String| {
        let mut controlplane = controlplane.clone();
        async move { controlplane.inspection(&node).await }
    };
    let report = wait::wait_for(nodes, bounds, get, |finished| println!("{}", wait::finished_line(finished))).await;
    for line in report.render_end().lines() {
        eprintln!("ironguardctl: {line}");
    }
    report.exit_code()
}

/// `nodes` in order, each once.
fn dedup(nodes: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    nodes.into_iter().filter(|n| seen.insert(n.clone())).collect()
}
