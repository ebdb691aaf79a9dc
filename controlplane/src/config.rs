//! Control-plane configuration: defaults < TOML file < environment < flags. `--print-config` shows the result.

use std::net::SocketAddr;
use std::path::PathBuf;

use ironguard_coord::EtcdConfig;
use ironguard_inspection::processing::ProcessingConfig;
use ironguard_ironic::IronicConfig;

use crate::http_access::InspectorApiConfig;
use crate::inspection::engine::{DiscoveryConfig, InspectionConfig};
use crate::inspection::periodic::{PolicySetting, SyncConfig};
use crate::tls::GrpcConfig;
use serde::{Deserialize, Serialize};

/// Where the control plane looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ironguard/controlplane.toml";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    pub server: ServerConfig,
    /// The gRPC API's TLS and who may call what.
    pub grpc: GrpcConfig,
    pub store: StoreConfig,
    pub filter: FilterConfig,
    pub agents: AgentsConfig,
    pub log: LogConfig,
    /// etcd: shared state for replicated control planes. Empty endpoints: the embedded store.
    pub etcd: EtcdConfig,
    /// Ironic's REST API.
    pub ironic: IronicConfig,
    /// Inspections run by ironguard.
    pub inspection: InspectionConfig,
    /// Synchronisation with Ironic and the other singleton periodic tasks.
    pub sync: SyncConfig,
    /// What processing the ramdisk's data does (ironic-inspector's `[processing]` hooks and options).
    pub processing: ProcessingConfig,
    /// Data from a machine no inspection knows (ironic-inspector's `node_not_found_hook`).
    pub discovery: DiscoveryConfig,
    /// The ironic-inspector v1 REST API's authentication, TLS and `/v1/continue` limits.
    pub inspector_api: InspectorApiConfig,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// gRPC (agents, ironguardctl). Default: 0.0.0.0:9100 with TLS, 127.0.0.1:9100 without.
    pub grpc_listen: Option<SocketAddr>,
    /// Admin HTTP: /metrics, /healthz, /readyz.
    pub admin_listen: SocketAddr,
    /// Seconds between heartbeats on an idle WatchFilters stream.
    pub heartbeat_secs: u64,
    /// This replica's name in the control-plane election (default: host name and gRPC port).
    pub replica_id: String,
    /// The ironic-inspector v1 REST API (for ironic-python-agent and `openstack baremetal introspection`), e.g.
    /// "0.0.0.0:5050". Off when unset.
    pub inspector_listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Directory of the embedded store (used when no etcd endpoints are configured).
    pub data_dir: PathBuf,
    /// Revisions kept for agents to catch up with deltas; older agents get a snapshot.
    pub change_log_length: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// What the leader agent does with MACs in neither set: allow, deny, or while-inspecting (allowed only while
    /// some node is inspected, or with `[sync] auto_discovery`).
    pub unknown_mac_policy: PolicySetting,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    /// An agent that has not reported for this long is shown as stale.
    pub stale_after_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// "text" or "json".
    pub format: String,
    /// A tracing filter, e.g. "info" or "ironguard_controlplane=debug,info". RUST_LOG overrides it.
    pub level: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            grpc_listen: None,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9101)),
            heartbeat_secs: 2,
            replica_id: String::new(),
            inspector_listen: None,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { data_dir: PathBuf::from("/var/lib/ironguard/controlplane"), change_log_length: 10_000 }
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self { unknown_mac_policy: PolicySetting::Deny }
    }
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self { stale_after_secs: 15 }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: "text".into(), level: "info".into() }
    }
}

impl ControlPlaneConfig {
    /// Where gRPC listens: `[server] grpc_listen`, else every address with TLS and loopback without.
    pub fn grpc_listen(&self) -> SocketAddr {
        self.server.grpc_listen.unwrap_or_else(|| {
            let ip = if self.grpc.tls() { [0, 0, 0, 0] } else { [127, 0, 0, 1] };
            SocketAddr::from((ip, 9100))
        })
    }

    /// Reads `path`, or the default path if it exists, or the defaults.
    pub fn load(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{} is not a valid control-plane configuration: {e}", path.display())),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.server.heartbeat_secs == 0 {
            anyhow::bail!("server.heartbeat_secs must be at least 1");
        }
        if self.store.change_log_length == 0 {
            anyhow::bail!("store.change_log_length must be at least 1");
        }
        self.etcd.validate().map_err(|e| anyhow::anyhow!("[etcd]: {e}"))?;
        self.grpc.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        self.ironic.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        if self.inspection.request_lease_ms < 1000 {
            anyhow::bail!("[inspection] request_lease_ms must be at least 1000");
        }
        self.processing.validate().map_err(|e| anyhow::anyhow!("[processing]: {e}"))?;
        self.discovery.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        // Its files are read only where the inspector API is served.
        if let Some(addr) = self.server.inspector_listen {
            self.inspector_api.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
            self.inspector_api.validate_exposure(addr).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            anyhow::bail!("log.format must be \"text\" or \"json\", not {:?}", self.log.format);
        }
        Ok(())
    }
}
