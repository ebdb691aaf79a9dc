//! `ironguard-agent` command line. See `ironguard-agent --help`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use ironguard_agent::AgentConfig;
use ironguard_agent::hold::{self, HoldOptions, StaticState};
use ironguard_agent::logging::{self, LogFormat};
use ironguard_nft::{HookKind, MacAddr, MatchMode, Mode, RulesetConfig, UnknownMacPolicy};

#[derive(Debug, Parser)]
#[command(
    name = "ironguard-agent",
    version,
    about = "ironguard PXE-host agent: keeps the DHCP/PXE firewall, fails closed"
)]
struct Cli {
    /// Configuration file (TOML). Default: /etc/ironguard/agent.toml if it exists.
    #[arg(long, global = true, env = "IRONGUARD_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "IRONGUARD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage the persistent guard table that blocks DHCP/PXE while no agent runs.
    Guard {
        #[command(subcommand)]
        action: GuardAction,
    },
    /// Run the agent: follow the control plane's filter state, lead while DHCP is healthy, fail closed.
    Run(RunArgs),
    /// Apply a static filter state and hold it until SIGTERM (SIGHUP re-reads --state).
    Hold(HoldArgs),
    /// Print the effective configuration (file + flags) as TOML and exit.
    PrintConfig(RunArgs),
}

/// Overrides for the daemon's configuration file.
#[derive(Debug, Args, Clone, Default)]
struct RunArgs {
    #[command(flatten)]
    ruleset: RulesetArgs,
    /// Control-plane gRPC endpoint (repeat; [controlplane] endpoints).
    #[arg(long = "controlplane", value_name = "URL", env = "IRONGUARD_CONTROLPLANE", value_delimiter = ',')]
    endpoints: Vec<String>,
    /// CA of the control plane's certificate ([controlplane] ca_file).
    #[arg(long, env = "IRONGUARD_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// The agent's certificate, whose name is its id ([controlplane] cert_file).
    #[arg(long, env = "IRONGUARD_CERT_FILE")]
    cert_file: Option<std::path::PathBuf>,
    /// Its private key ([controlplane] key_file).
    #[arg(long, env = "IRONGUARD_KEY_FILE")]
    key_file: Option<std::path::PathBuf>,
    /// The name in the control plane's certificate ([controlplane] server_name).
    #[arg(long, env = "IRONGUARD_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    /// Allow plaintext http:// endpoints ([controlplane] insecure).
    #[arg(long)]
    insecure: bool,
    /// Agent id ([agent] id; default: host name).
    #[arg(long)]
    agent_id: Option<String>,
    /// PXE network served ([agent] network).
    #[arg(long)]
    network: Option<String>,
    /// Admin endpoint for /metrics, /healthz, /readyz ([admin] listen).
    #[arg(long)]
    admin_listen: Option<std::net::SocketAddr>,
    /// Seconds without a control-plane stream before Blocked ([controlplane] lost_after_secs).
    #[arg(long)]
    lost_after_secs: Option<u64>,
    /// UDP port whose listener means "DHCP healthy"; 0 disables ([dhcp_health] udp_port).
    #[arg(long)]
    dhcp_udp_port: Option<u16>,
    /// Pid file of the DHCP service ([dhcp_health] pid_file).
    #[arg(long)]
    dhcp_pid_file: Option<String>,
    /// systemd unit of the DHCP service ([dhcp_health] systemd_unit).
    #[arg(long)]
    dhcp_unit: Option<String>,
}

impl RunArgs {
    fn apply(&self, mut c: AgentConfig) -> anyhow::Result<AgentConfig> {
        c.dataplane = self.ruleset.apply(c.dataplane)?;
        if !self.endpoints.is_empty() {
            c.controlplane.endpoints = self.endpoints.clone();
        }
        if let Some(v) = &self.ca_file {
            c.controlplane.ca_file = v.clone();
        }
        if let Some(v) = &self.cert_file {
            c.controlplane.cert_file = v.clone();
        }
        if let Some(v) = &self.key_file {
            c.controlplane.key_file = v.clone();
        }
        if let Some(v) = &self.tls_server_name {
            c.controlplane.server_name = v.clone();
        }
        if self.insecure {
            c.controlplane.insecure = true;
        }
        if let Some(v) = &self.agent_id {
            c.agent.id = v.clone();
        }
        if let Some(v) = &self.network {
            c.agent.network = v.clone();
        }
        if let Some(v) = self.admin_listen {
            c.admin.listen = v;
        }
        if let Some(v) = self.lost_after_secs {
            c.controlplane.lost_after_secs = v;
        }
        if let Some(v) = self.dhcp_udp_port {
            c.dhcp_health.udp_port = v;
        }
        if let Some(v) = &self.dhcp_pid_file {
            c.dhcp_health.pid_file = v.clone();
        }
        if let Some(v) = &self.dhcp_unit {
            c.dhcp_health.systemd_unit = v.clone();
        }
        c.finish()
    }
}

#[derive(Debug, Subcommand)]
enum GuardAction {
    /// Install or replace the guard (idempotent, atomic).
    Install {
        #[command(flatten)]
        ruleset: RulesetArgs,
    },
    /// Remove the guard (idempotent). DHCP is then unfiltered while no agent runs.
    Remove,
    /// Show whether the guard is installed as configured. Exit status 1 if it is missing or differs.
    Status {
        #[command(flatten)]
        ruleset: RulesetArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Overrides for the `[dataplane]` section of the configuration file.
#[derive(Debug, Args, Clone, Default)]
struct RulesetArgs {
    /// Interface to filter (repeat; default: all interfaces).
    #[arg(long = "interface", value_name = "IFNAME")]
    interfaces: Vec<String>,
    /// UDP destination port of the DHCP/PXE service (repeat; default 67).
    #[arg(long = "port", value_name = "PORT")]
    ports: Vec<u16>,
    /// Netfilter hook (repeat; default input).
    #[arg(long = "hook", value_enum)]
    hooks: Vec<HookArg>,
    /// Which address is matched: chaddr, ether-saddr or both.
    #[arg(long, value_enum)]
    match_mode: Option<MatchArg>,
    /// Packet mark set on traffic the agent lets through (hex like 0x100000 or decimal).
    #[arg(long, value_parser = parse_u32)]
    mark: Option<u32>,
    /// Bits of the packet mark owned by ironguard.
    #[arg(long, value_parser = parse_u32)]
    mask: Option<u32>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum HookArg {
    Input,
    Forward,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum MatchArg {
    Chaddr,
    EtherSaddr,
    Both,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Blocked,
    Follower,
    Leader,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    Allow,
    Deny,
}

#[derive(Debug, Args)]
struct HoldArgs {
    #[command(flatten)]
    ruleset: RulesetArgs,
    /// State file (TOML or .json) with mode, unknown_mac_policy, allow and deny; re-read on SIGHUP.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Mode (overrides the state file).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// What the leader does with unknown MACs (overrides the state file).
    #[arg(long, value_enum)]
    unknown_mac_policy: Option<PolicyArg>,
    /// MAC to allow (repeat).
    #[arg(long = "allow", value_name = "MAC")]
    allow: Vec<MacAddr>,
    /// MAC to deny (repeat).
    #[arg(long = "deny", value_name = "MAC")]
    deny: Vec<MacAddr>,
    /// Do not install the guard table first.
    #[arg(long)]
    no_guard: bool,
    /// Write this process's pid here once the table is in place.
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a 32-bit number: {e}"))
}

impl RulesetArgs {
    fn apply(&self, mut c: RulesetConfig) -> anyhow::Result<RulesetConfig> {
        if !self.interfaces.is_empty() {
            c.interfaces = self.interfaces.clone();
        }
        if !self.ports.is_empty() {
            c.ports = self.ports.clone();
        }
        if !self.hooks.is_empty() {
            c.hooks = self
                .hooks
                .iter()
                .map(|h| match h {
                    HookArg::Input => HookKind::Input,
                    HookArg::Forward => HookKind::Forward,
                })
                .collect();
        }
        if let Some(m) = self.match_mode {
            c.match_mode = match m {
                MatchArg::Chaddr => MatchMode::Chaddr,
                MatchArg::EtherSaddr => MatchMode::EtherSaddr,
                MatchArg::Both => MatchMode::Both,
            };
        }
        if let Some(m) = self.mark {
            c.mark = m;
        }
        if let Some(m) = self.mask {
            c.mask = m;
        }
        c.validate().context("invalid dataplane configuration")?;
        Ok(c)
    }
}

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
            ironguard_nft::guard::install(&c).context("installing the guard table")?;
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
                state.mode = match m {
                    ModeArg::Blocked => Mode::Blocked,
                    ModeArg::Follower => Mode::Follower,
                    ModeArg::Leader => Mode::Leader,
                };
            }
            if let Some(p) = args.unknown_mac_policy {
                state.unknown_mac_policy = match p {
                    PolicyArg::Allow => UnknownMacPolicy::Allow,
                    PolicyArg::Deny => UnknownMacPolicy::Deny,
                };
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
