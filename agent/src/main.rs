//! `ironguard-agent` command line. See `ironguard-agent --help`; the parser is [`ironguard_agent::cli`].
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use ironguard_agent::AgentConfig;
use ironguard_agent::cli::{Cli, Command, GuardAction};
use ironguard_agent::hold::{self, HoldOptions, StaticState};
use ironguard_agent::logging;
use ironguard_dataplane::backend::GuardInstalled;
use ironguard_dataplane::guard::Installed;
use ironguard_dataplane::{Backend, RulesetConfig};

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

fn backends(c: &RulesetConfig) -> String {
    c.backends.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(" + ")
}

fn guard_installed_text(c: &RulesetConfig, done: &GuardInstalled) -> String {
    match done {
        GuardInstalled::Nftables(Installed::HeldAsConfigured { portid }) => format!(
            "guard in place: table inet {} is held by the running agent (netlink port {portid}) and is as \
             configured; nothing to do",
            ironguard_dataplane::GUARD_TABLE
        ),
        GuardInstalled::Nftables(Installed::Installed) => {
            let mut t = format!(
                "guard installed: table inet {} drops udp dport {:?} on {} unless mark & 0x{:08x} == 0x{:08x}",
                ironguard_dataplane::GUARD_TABLE,
                c.ports,
                if c.interfaces.is_empty() { "all interfaces".to_string() } else { c.interfaces.join(",") },
                c.mask,
                c.mark
            );
            if c.uses_egress() {
                t.push_str(&format!(
                    "; table netdev {} drops DHCP replies (udp sport {:?}) leaving {} unless marked",
                    ironguard_dataplane::GUARD_TABLE,
                    c.ports,
                    c.egress_interfaces.join(",")
                ));
            }
            if !c.uses_inet() {
                t = t.replacen("guard installed: table inet", "guard installed: no table inet (hooks = []);", 1);
            }
            t
        }
        GuardInstalled::Hostsdir { rewritten } => format!(
            "hostsdir closed: {}/{} ignores unknown MACs and every MAC file says ignore ({rewritten} files written)",
            c.hostsdir.dir.display(),
            ironguard_dataplane::hostsdir::UNKNOWN_HOSTS_FILE
        ),
        GuardInstalled::Ipset => format!(
            "guard installed: {} chain {} drops udp dport {:?} unless mark & 0x{:08x} == 0x{:08x}",
            c.ipset.iptables,
            ironguard_dataplane::ipset::GUARD_CHAIN,
            c.ports,
            c.mask,
            c.mark
        ),
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let file = AgentConfig::load(cli.config.as_deref())?;
    match cli.command {
        Command::Guard { action: GuardAction::Install { ruleset } } => {
            let c = ruleset.apply(file.dataplane)?;
            for done in ironguard_dataplane::backend::guard_install(&c).context("installing the guard")? {
                println!("{}", guard_installed_text(&c, &done));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { action: GuardAction::Remove { ruleset } } => {
            let c = ruleset.apply(file.dataplane)?;
            ironguard_dataplane::backend::guard_remove(&c)
                .context("removing the guard (stop ironguard-agent first: it holds the guard)")?;
            println!("guard removed ({})", backends(&c));
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard { action: GuardAction::Status { ruleset, json } } => {
            let c = ruleset.apply(file.dataplane)?;
            let st = ironguard_dataplane::backend::guard_status(&c).context("reading the guard")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                let held = match (st.persistent, st.held_by) {
                    (true, Some(port)) => format!("owner, persist: held by netlink port {port} (the running agent)"),
                    (true, None) => "owner, persist: orphaned (no agent holds it; it keeps dropping)".to_string(),
                    (false, _) if c.uses(Backend::Nftables) => "plain table".to_string(),
                    (false, _) => backends(&c),
                };
                if st.installed && st.problems.is_empty() {
                    println!("guard: installed as configured ({held})");
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
