//! `ironguard-agent` command line. See `ironguard-agent --help`; the parser is [`ironguard_agent::cli`].
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use ironguard_agent::AgentConfig;
use ironguard_agent::cli::{Cli, Command, GuardAction};
use ironguard_agent::hold::{self, HoldOptions, StaticState};
use ironguard_agent::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format, "info");
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "ironguard-agent failed");
            eprintln!("ironguard-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let file = AgentConfig::load(cli.config.as_deref())?;
    match cli.command {
        Command::Guard { action: GuardAction::Install { ruleset } } => {
            let c = ruleset.apply(file.dataplane)?;
            let installed = ironguard_nft::guard::install(&c).context("installing the guard table")?;
            if let ironguard_nft::guard::Installed::HeldAsConfigured { portid } = installed {
                println!(
                    "guard in place: table inet {} is held by the running agent (netlink port {portid}) and is as \
                     configured; nothing to do",
                    ironguard_nft::GUARD_TABLE
                );
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "guard installed: table inet {} drops udp dport {:?} on {} unless mark & 0x{:08x} == 0x{:08x}",
                ironguard_nft::GUARD_TABLE,
                c.ports,
                if c.interfaces.is_empty() { "all interfaces".to_string() } else { c.interfaces.join(",") },
                c.mask,
                c.mark
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { action: GuardAction::Remove } => {
            ironguard_nft::guard::remove()
                .context("removing the guard table (stop ironguard-agent first: it holds the guard)")?;
            println!("guard removed: table inet {} is gone", ironguard_nft::GUARD_TABLE);
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { action: GuardAction::Status { ruleset, json } } => {
            let c = ruleset.apply(file.dataplane)?;
            let st = ironguard_nft::guard::status(&c).context("reading the guard table")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                let held = match (st.persistent, st.held_by) {
                    (true, Some(port)) => format!("owner, persist: held by netlink port {port} (the running agent)"),
                    (true, None) => "owner, persist: orphaned (no agent holds it; it keeps dropping)".to_string(),
                    (false, _) => "plain table".to_string(),
                };
                if st.installed && st.problems.is_empty() {
                    println!("guard: installed as configured (table inet {}; {held})", ironguard_nft::GUARD_TABLE);
                } else {
                    println!("guard: {}", if st.installed { "installed, but differs" } else { "NOT INSTALLED" });
                    for p in &st.problems {
                        println!("  - {p}");
                    }
                }
                for n in &st.notes {
                    println!("  note: {n}");
                }
            }
            Ok(if st.installed && st.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Hold(args) => {
            let config = args.ruleset.apply(file.dataplane)?;
            let mut state = match &args.state {
                Some(p) => StaticState::load(p)?,
                None => StaticState::default(),
            };
            if let Some(m) = args.mode {
                state.mode = m.into();
            }
            if let Some(p) = args.unknown_mac_policy {
                state.unknown_mac_policy = p.into();
            }
            state.allow.extend(args.allow);
            state.deny.extend(args.deny);
            let opts = HoldOptions {
                config,
                state,
                state_file: args.state,
                install_guard: !args.no_guard,
                ready_file: args.ready_file,
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(hold::run(opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::PrintConfig(args) => {
            let cfg = args.apply(file)?;
            print!("{}", toml::to_string_pretty(&cfg)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            let cfg = args.apply(file)?;
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(ironguard_agent::daemon::run(cfg, std::future::pending::<()>()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
