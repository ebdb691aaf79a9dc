//! The command line of `ironguard-agent`, parsed by clap: the subcommands (`guard`, `run`, `hold`,
//! `print-config`) and the flags that override the configuration file ([`RunArgs::apply`],
//! [`RulesetArgs::apply`]). It lives in the library so that `ironguard-gen-docs` can generate the man page and the
//! shell completions from the same definition (`clap::CommandFactory`).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use ironguard_dataplane::{Backend, HookKind, MacAddr, MatchMode, Mode, RulesetConfig, UnknownMacPolicy};

use crate::AgentConfig;
use crate::logging::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "ironguard-agent",
    version,
    about = "ironguard PXE-host agent: keeps the DHCP/PXE firewall, fails closed"
)]
pub struct Cli {
    /// Configuration file (TOML). Default: /etc/ironguard/agent.toml if it exists.
    #[arg(long, global = true, env = "IRONGUARD_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "IRONGUARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
pub struct RunArgs {
    #[command(flatten)]
    pub ruleset: RulesetArgs,
    /// Control-plane gRPC endpoint (repeat; [controlplane] endpoints).
    #[arg(long = "controlplane", value_name = "URL", env = "IRONGUARD_CONTROLPLANE", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// CA of the control plane's certificate ([controlplane] ca_file).
    #[arg(long, env = "IRONGUARD_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The agent's certificate, whose name is its id ([controlplane] cert_file).
    #[arg(long, env = "IRONGUARD_CERT_FILE")]
    pub cert_file: Option<std::path::PathBuf>,
    /// Its private key ([controlplane] key_file).
    #[arg(long, env = "IRONGUARD_KEY_FILE")]
    pub key_file: Option<std::path::PathBuf>,
    /// The name in the control plane's certificate ([controlplane] server_name).
    #[arg(long, env = "IRONGUARD_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Allow plaintext http:// endpoints ([controlplane] insecure).
    #[arg(long)]
    pub insecure: bool,
    /// Agent id ([agent] id; default: host name).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// PXE network served ([agent] network).
    #[arg(long)]
    pub network: Option<String>,
    /// Admin endpoint for /metrics, /healthz, /readyz ([admin] listen).
    #[arg(long)]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// Seconds without a control-plane stream before Blocked ([controlplane] lost_after_secs).
    #[arg(long)]
    pub lost_after_secs: Option<u64>,
    /// UDP port whose listener means "DHCP healthy"; 0 disables ([dhcp_health] udp_port).
    #[arg(long)]
    pub dhcp_udp_port: Option<u16>,
    /// Pid file of the DHCP service ([dhcp_health] pid_file).
    #[arg(long)]
    pub dhcp_pid_file: Option<String>,
    /// systemd unit of the DHCP service ([dhcp_health] systemd_unit).
    #[arg(long)]
    pub dhcp_unit: Option<String>,
}

impl RunArgs {
    pub fn apply(&self, mut c: AgentConfig) -> anyhow::Result<AgentConfig> {
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
pub enum GuardAction {
    /// Install or replace the guard (idempotent, atomic).
    Install {
        #[command(flatten)]
        ruleset: RulesetArgs,
    },
    /// Remove the guard (idempotent). DHCP is then unfiltered while no agent runs.
    Remove {
        #[command(flatten)]
        ruleset: RulesetArgs,
    },
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
pub struct RulesetArgs {
    /// Interface to filter (repeat; default: all interfaces).
    #[arg(long = "interface", value_name = "IFNAME")]
    pub interfaces: Vec<String>,
    /// UDP destination port of the DHCP/PXE service (repeat; default 67).
    #[arg(long = "port", value_name = "PORT")]
    pub ports: Vec<u16>,
    /// Netfilter hook for the clients' requests (repeat; default input; `none` for a DHCP server on raw sockets,
    /// filtered with --egress-interface only).
    #[arg(long = "hook", value_enum)]
    pub hooks: Vec<HookArg>,
    /// Interface whose DHCP replies are filtered at the egress hook, for a DHCP server on AF_PACKET sockets (ISC
    /// dhcpd, Kea in raw mode; Linux 5.16 or later) (repeat; default none).
    #[arg(long = "egress-interface", value_name = "IFNAME")]
    pub egress_interfaces: Vec<String>,
    /// What enforces the filter (repeat to combine: nftables with dnsmasq-hostsdir; default nftables).
    #[arg(long = "backend", value_enum)]
    pub backends: Vec<BackendArg>,
    /// The dnsmasq --dhcp-hostsdir directory the dnsmasq-hostsdir backend writes.
    #[arg(long, value_name = "DIR")]
    pub hostsdir: Option<PathBuf>,
    /// The iptables command of the ipset backend (default iptables-legacy).
    #[arg(long, value_name = "COMMAND")]
    pub iptables: Option<String>,
    /// Which address is matched: chaddr, ether-saddr or both.
    #[arg(long, value_enum)]
    pub match_mode: Option<MatchArg>,
    /// Packet mark set on traffic the agent lets through (hex like 0x100000 or decimal).
    #[arg(long, value_parser = parse_u32)]
    pub mark: Option<u32>,
    /// Bits of the packet mark owned by ironguard.
    #[arg(long, value_parser = parse_u32)]
    pub mask: Option<u32>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum HookArg {
    Input,
    Forward,
    /// No input or forward hook.
    None,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackendArg {
    Nftables,
    DnsmasqHostsdir,
    Ipset,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MatchArg {
    Chaddr,
    EtherSaddr,
    Both,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    Blocked,
    Follower,
    Leader,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PolicyArg {
    Allow,
    Deny,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Blocked => Mode::Blocked,
            ModeArg::Follower => Mode::Follower,
            ModeArg::Leader => Mode::Leader,
        }
    }
}

impl From<PolicyArg> for UnknownMacPolicy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Allow => UnknownMacPolicy::Allow,
            PolicyArg::Deny => UnknownMacPolicy::Deny,
        }
    }
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub ruleset: RulesetArgs,
    /// State file (TOML or .json) with mode, unknown_mac_policy, allow and deny; re-read on SIGHUP.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Mode (overrides the state file).
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// What the leader does with unknown MACs (overrides the state file; default: deny).
    #[arg(long, value_enum)]
    pub unknown_mac_policy: Option<PolicyArg>,
    /// MAC to allow (repeat).
    #[arg(long = "allow", value_name = "MAC")]
    pub allow: Vec<MacAddr>,
    /// MAC to deny (repeat).
    #[arg(long = "deny", value_name = "MAC")]
    pub deny: Vec<MacAddr>,
    /// Do not install the guard table first.
    #[arg(long)]
    pub no_guard: bool,
    /// Write this process's pid here once the table is in place.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a 32-bit number: {e}"))
}

impl RulesetArgs {
    pub fn apply(&self, mut c: RulesetConfig) -> anyhow::Result<RulesetConfig> {
        if !self.interfaces.is_empty() {
            c.interfaces = self.interfaces.clone();
        }
        if !self.ports.is_empty() {
            c.ports = self.ports.clone();
        }
        if !self.hooks.is_empty() {
            if self.hooks.len() > 1 && self.hooks.iter().any(|h| matches!(h, HookArg::None)) {
                anyhow::bail!("--hook none cannot be combined with another --hook");
            }
            c.hooks = self
                .hooks
                .iter()
                .filter_map(|h| match h {
                    HookArg::Input => Some(HookKind::Input),
                    HookArg::Forward => Some(HookKind::Forward),
                    HookArg::None => None,
                })
                .collect();
        }
        if !self.egress_interfaces.is_empty() {
            c.egress_interfaces = self.egress_interfaces.clone();
        }
        if !self.backends.is_empty() {
            c.backends = self
                .backends
                .iter()
                .map(|b| match b {
                    BackendArg::Nftables => Backend::Nftables,
                    BackendArg::DnsmasqHostsdir => Backend::DnsmasqHostsdir,
                    BackendArg::Ipset => Backend::Ipset,
                })
                .collect();
        }
        if let Some(d) = &self.hostsdir {
            c.hostsdir.dir = d.clone();
        }
        if let Some(i) = &self.iptables {
            c.ipset.iptables = i.clone();
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
