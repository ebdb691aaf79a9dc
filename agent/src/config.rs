//! Agent configuration: a TOML file (default `/etc/ironguard/agent.toml`, optional) overridden by flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ironguard_coord::EtcdConfig;
use ironguard_dataplane::RulesetConfig;
use serde::{Deserialize, Serialize};

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ironguard/agent.toml";

/// The longest a configured wait for another process (the control plane, systemctl) may be: a minute.
pub const MAX_WAIT_MS: u64 = 60_000;

/// The agent's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Who this agent is.
    pub agent: AgentSection,
    /// Where the control plane is and how long the agent trusts its last state without it.
    pub controlplane: ControlPlaneSection,
    /// How the agent decides that its local DHCP service is healthy.
    pub dhcp_health: DhcpHealthSection,
    /// Leadership confirmed by answers: the agent's own DISCOVERs to its local DHCP server.
    pub dhcp_probe: DhcpProbeSection,
    /// Periodic read-back and repair.
    pub reconcile: ReconcileSection,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub admin: AdminSection,
    /// etcd, for high availability: agents of one network elect one leader. Empty endpoints: single host.
    pub etcd: EtcdConfig,
    /// The leader election and its lease fence.
    pub election: ElectionSection,
    /// Where and how DHCP/PXE traffic is filtered. Shared by the guard and the agent's own table.
    pub dataplane: RulesetConfig,
    /// How the agent keeps the guard.
    pub guard: GuardSection,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardSection {
    /// Hold the guard (`flags owner, persist`) where the kernel has `NFT_TABLE_F_PERSIST` (Linux 6.9+): no other
    /// process can change or delete it while the agent runs, `nft flush ruleset` skips it, and it outlives the
    /// agent. With `false` (or on older kernels) the guard is a plain table that the agent repairs the moment a
    /// change notification shows it was touched.
    pub claim: bool,
}

impl Default for GuardSection {
    fn default() -> Self {
        Self { claim: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// Unique id of this agent; default: the host name.
    pub id: String,
    /// The PXE network this agent serves (agents of one network elect one leader).
    pub network: String,
    /// Where the agent keeps what must survive a restart (its lease id, what it saw of etcd): a file
    /// `agent-<id>.json` here. Default: systemd's `$RUNTIME_DIRECTORY`, else `/run/ironguard`.
    pub state_dir: String,
}

impl AgentSection {
    /// The state file, creating its directory if needed (`None` if that fails: the agent runs without it).
    pub fn state_file(&self) -> Option<PathBuf> {
        let dir = if !self.state_dir.is_empty() {
            PathBuf::from(&self.state_dir)
        } else if let Some(d) = std::env::var_os("RUNTIME_DIRECTORY").filter(|d| !d.is_empty()) {
            // systemd may list several directories separated by colons; the first is ours.
            PathBuf::from(d.to_string_lossy().split(':').next().unwrap_or_default())
        } else {
            PathBuf::from("/run/ironguard")
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the state directory; a restart will not revoke the previous lease");
            return None;
        }
        let id: String =
            self.id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        Some(dir.join(format!("agent-{id}.json")))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneSection {
    /// gRPC endpoints of the control plane, tried in turn.
    pub endpoints: Vec<String>,
    /// How long one connection attempt may take, in milliseconds: TCP, TLS and HTTP/2 together. A replica that
    /// accepts and never completes the handshake is given up after this long, and the next endpoint is tried.
    pub connect_timeout_ms: u64,
    /// How long a call may wait for the control plane's answer, in milliseconds: the response that opens a
    /// `WatchFilters` stream (then `silence_timeout_secs` applies between events) and each `ReportStatus`. A replica
    /// that accepts the call and never answers is given up after this long, and the next endpoint is tried.
    pub request_timeout_ms: u64,
    /// Without a working stream for this long, the agent drops to Blocked.
    pub lost_after_secs: u64,
    /// A stream silent (no event, no heartbeat) for this long is considered dead and reconnected.
    pub silence_timeout_secs: u64,
    /// How often the agent reports its status even when nothing changes, in milliseconds.
    pub report_interval_ms: u64,
    /// Longest pause between reconnection attempts, in milliseconds.
    pub max_backoff_ms: u64,
    /// PEM CA that signed the control plane's certificate (`https://` endpoints).
    pub ca_file: std::path::PathBuf,
    /// PEM client certificate: the agent's identity; its name (DNS SAN, else CN) must be `[agent] id`.
    pub cert_file: std::path::PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: std::path::PathBuf,
    /// The name the control plane's certificate carries, when the endpoints use another host (e.g. an IP).
    pub server_name: String,
    /// Allow `http://` endpoints: plaintext, no identity. Only for a control plane with `[grpc] insecure = true`.
    pub insecure: bool,
}

impl ControlPlaneSection {
    /// TLS files and server name, as the gRPC client takes them (re-read at every connection).
    pub fn client_auth(&self) -> ironguard_proto::client::ClientAuth {
        ironguard_proto::client::ClientAuth {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            server_name: self.server_name.clone(),
            token_file: Default::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DhcpHealthSection {
    /// Healthy only if some process listens on this UDP port in the agent's namespace (0 disables the check).
    pub udp_port: u16,
    /// Healthy only if this systemd unit is active (empty disables the check).
    pub systemd_unit: String,
    /// Healthy only if the process in this pid file runs (empty disables the check).
    pub pid_file: String,
    /// How often to check, in milliseconds.
    pub interval_ms: u64,
    /// How long `systemctl is-active` may take, in milliseconds. A `systemctl` (or a systemd) that does not answer
    /// by then is killed and the service counts as unhealthy, with that reason: a health that stays at its last
    /// value while the check hangs could keep a leader leading for a DHCP server that no longer runs.
    pub systemd_timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcileSection {
    /// Mean seconds between full read-backs (±20 % jitter); drift is repaired with a full apply.
    pub interval_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ElectionSection {
    /// Lease TTL in seconds: a leader that stops renewing is replaced after this long. The default, 5 s, lets a
    /// leader ride out an etcd leader election (1–2 s with etcd's default election timeout): it closes only when
    /// no keep-alive was answered for TTL − margin − TTL/6 = 2.7 s.
    pub ttl_secs: u64,
    /// The leader closes DHCP when no keep-alive has succeeded for (TTL - margin): before its lease can expire,
    /// hence before a successor can be elected. Milliseconds; must be > 0 and leave room for a keep-alive. The
    /// default, 1500, exceeds etcd's default election timeout (1 s), which bounds how long a deposed etcd leader
    /// cut off from the others may still act on leases before it steps down.
    pub margin_ms: u64,
    /// Exit (after closing) when the lease fence trips, as the seed design's "stop the service" did. By default
    /// the agent stays, retries etcd with back-off and campaigns again when it is back.
    pub exit_on_partition: bool,
}

impl Default for ElectionSection {
    fn default() -> Self {
        Self { ttl_secs: 5, margin_ms: 1500, exit_on_partition: false }
    }
}

impl ElectionSection {
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }

    pub fn margin(&self) -> Duration {
        Duration::from_millis(self.margin_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    pub listen: SocketAddr,
}

impl Default for AgentSection {
    fn default() -> Self {
        Self { id: String::new(), network: "default".into(), state_dir: String::new() }
    }
}

impl Default for ControlPlaneSection {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:9100".into()],
            connect_timeout_ms: 2000,
            request_timeout_ms: 2000,
            lost_after_secs: 30,
            silence_timeout_secs: 10,
            report_interval_ms: 2000,
            max_backoff_ms: 5000,
            ca_file: Default::default(),
            cert_file: Default::default(),
            key_file: Default::default(),
            server_name: String::new(),
            insecure: false,
        }
    }
}

/// Whether the agent probes its local DHCP server (docs/operations.md, "Leadership confirmed by answers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeMode {
    /// Probe wherever this host can (the nftables backend and an interface to send on); otherwise say at start
    /// why not and lead on the other checks alone.
    #[default]
    Auto,
    /// Probe, and refuse to start where this host cannot.
    On,
    /// Never probe (leadership then rests on the socket, unit and pid checks of `[dhcp_health]`).
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DhcpProbeSection {
    pub mode: ProbeMode,
    /// The interface the probe is sent on; default: the first of `[dataplane] interfaces`, else of
    /// `egress_interfaces`.
    pub interface: String,
    /// The probe's chaddr; default `02:49:47:` and three bytes of a hash of the agent's id.
    pub mac: String,
    /// How often a probe is sent, in milliseconds.
    pub interval_ms: u64,
    /// A server that sent no DHCPOFFER for this long, while at least two probes asked, is not answering.
    pub silence_ms: u64,
}

impl Default for DhcpProbeSection {
    fn default() -> Self {
        Self { mode: ProbeMode::Auto, interface: String::new(), mac: String::new(), interval_ms: 500, silence_ms: 1500 }
    }
}

impl Default for DhcpHealthSection {
    fn default() -> Self {
        Self {
            udp_port: 67,
            systemd_unit: String::new(),
            pid_file: String::new(),
            interval_ms: 1000,
            systemd_timeout_ms: 2000,
        }
    }
}

impl Default for ReconcileSection {
    fn default() -> Self {
        Self { interval_secs: 60 }
    }
}

impl Default for AdminSection {
    fn default() -> Self {
        Self { listen: SocketAddr::from(([127, 0, 0, 1], 9181)) }
    }
}

impl ControlPlaneSection {
    pub fn lost_after(&self) -> Duration {
        Duration::from_secs(self.lost_after_secs)
    }
}

impl AgentConfig {
    /// Loads `path`, or the default path if it exists, or the built-in defaults.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        let cfg: Self = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a valid agent configuration: {e}", path.display()))?;
        Ok(cfg)
    }

    /// Fills defaults that depend on the host and rejects settings that cannot work.
    pub fn finish(mut self) -> anyhow::Result<Self> {
        if self.agent.id.is_empty() {
            self.agent.id =
                nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "agent".into());
        }
        self.dataplane.validate().map_err(|e| anyhow::anyhow!("[dataplane]: {e}"))?;
        if self.controlplane.endpoints.is_empty() {
            anyhow::bail!("[controlplane] endpoints is empty: the agent needs at least one control-plane endpoint");
        }
        let cp = &self.controlplane;
        for e in &cp.endpoints {
            if e.starts_with("https://") {
                let missing: Vec<&str> =
                    [("ca_file", &cp.ca_file), ("cert_file", &cp.cert_file), ("key_file", &cp.key_file)]
                        .iter()
                        .filter(|(_, p)| p.as_os_str().is_empty())
                        .map(|(n, _)| *n)
                        .collect();
                if !missing.is_empty() {
                    anyhow::bail!(
                        "[controlplane] endpoint {e:?} is TLS: set {} (the control plane's CA, and the agent's \
                         certificate and key, whose name is its id)",
                        missing.join(", ")
                    );
                }
            } else if e.starts_with("http://") {
                if !cp.insecure {
                    anyhow::bail!(
                        "[controlplane] endpoint {e:?} is plaintext: use https:// with ca_file, cert_file and key_file, \
                         or set insecure = true (only for a control plane with [grpc] insecure = true)"
                    );
                }
            } else {
                anyhow::bail!(
                    "[controlplane] endpoint {e:?} must start with https:// (or http:// with insecure = true)"
                );
            }
        }
        if self.controlplane.lost_after_secs == 0 {
            anyhow::bail!("[controlplane] lost_after_secs must be at least 1");
        }
        if self.dhcp_health.interval_ms == 0 || self.controlplane.report_interval_ms == 0 {
            anyhow::bail!("intervals must be positive");
        }
        let probe = &self.dhcp_probe;
        if probe.interval_ms == 0 || probe.silence_ms < 2 * probe.interval_ms {
            anyhow::bail!(
                "[dhcp_probe] interval_ms must be positive and silence_ms at least twice it (two probes must go \
                 unanswered before the server counts as silent)"
            );
        }
        crate::dhcp_probe::plan(&self).map_err(|e| anyhow::anyhow!(e))?;
        // Every wait on another process has an end: a zero bound would give up at once, an hour-long one is a hang.
        for (what, ms) in [
            ("[controlplane] connect_timeout_ms", cp.connect_timeout_ms),
            ("[controlplane] request_timeout_ms", cp.request_timeout_ms),
            ("[dhcp_health] systemd_timeout_ms", self.dhcp_health.systemd_timeout_ms),
        ] {
            if !(1..=MAX_WAIT_MS).contains(&ms) {
                anyhow::bail!("{what} must be between 1 and {MAX_WAIT_MS} (milliseconds), not {ms}");
            }
        }
        if self.reconcile.interval_secs == 0 {
            anyhow::bail!("[reconcile] interval_secs must be at least 1");
        }
        self.etcd.validate().map_err(|e| anyhow::anyhow!("[etcd]: {e}"))?;
        let (ttl_ms, margin) = (self.election.ttl_secs * 1000, self.election.margin_ms);
        if self.election.ttl_secs < 2 {
            anyhow::bail!("[election] ttl_secs must be at least 2 (etcd rounds shorter leases up)");
        }
        if margin == 0 {
            anyhow::bail!(
                "[election] margin_ms must be > 0: with no margin a partitioned leader could still be open when its lease expires and a successor opens"
            );
        }
        // Keep-alives go every TTL/3; the fence (TTL - margin after the last success) must leave room for one.
        if margin >= ttl_ms - ttl_ms / 3 {
            anyhow::bail!(
                "[election] margin_ms {margin} must be less than 2/3 of the TTL ({} ms): the fence would trip between two keep-alives",
                ttl_ms - ttl_ms / 3
            );
        }
        if self.agent.network.is_empty() || self.agent.network.contains('/') {
            anyhow::bail!("[agent] network must be a non-empty name without '/'");
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        // The default endpoint is plaintext: refused unless asked for.
        let e = AgentConfig::default().finish().unwrap_err().to_string();
        assert!(e.contains("plaintext") && e.contains("insecure = true"), "{e}");
        let mut tls = AgentConfig::default();
        tls.controlplane.endpoints = vec!["https://cp.example:9100".into()];
        tls.controlplane.ca_file = "/etc/ironguard/ca.pem".into();
        let e = tls.clone().finish().unwrap_err().to_string();
        assert!(e.contains("cert_file, key_file"), "{e}");
        tls.controlplane.cert_file = "/etc/ironguard/agent.pem".into();
        tls.controlplane.key_file = "/etc/ironguard/agent.key".into();
        assert!(!tls.finish().unwrap().agent.id.is_empty());
        let default = || {
            let mut c = AgentConfig::default();
            c.controlplane.insecure = true;
            c
        };
        let c = default().finish().unwrap();
        assert!(!c.agent.id.is_empty());
        let mut bad = default();
        bad.controlplane.endpoints = vec!["127.0.0.1:9100".into()];
        assert!(bad.finish().unwrap_err().to_string().contains("https://"));
        let err = toml::from_str::<AgentConfig>("[controlplane]\nendpoint = []\n").unwrap_err().to_string();
        assert!(err.contains("endpoint"), "{err}");
        let mut bad = default();
        bad.election.margin_ms = 0;
        assert!(bad.finish().unwrap_err().to_string().contains("margin_ms must be > 0"));
        let mut bad = default();
        bad.election.margin_ms = 3500;
        assert!(bad.finish().unwrap_err().to_string().contains("less than 2/3"));
        let mut ok = default();
        ok.election.margin_ms = 3333;
        ok.finish().unwrap();
        // Every wait has an end, and a sane one.
        for set in [
            |c: &mut AgentConfig, v| c.controlplane.connect_timeout_ms = v,
            |c: &mut AgentConfig, v| c.controlplane.request_timeout_ms = v,
            |c: &mut AgentConfig, v| c.dhcp_health.systemd_timeout_ms = v,
        ] {
            for bad_ms in [0, MAX_WAIT_MS + 1] {
                let mut bad = default();
                set(&mut bad, bad_ms);
                let e = bad.finish().unwrap_err().to_string();
                assert!(e.contains("must be between 1 and 60000"), "{e}");
            }
            let mut ok = default();
            set(&mut ok, MAX_WAIT_MS);
            ok.finish().unwrap();
        }
    }
}
