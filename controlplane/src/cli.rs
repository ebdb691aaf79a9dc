//! The command line of `ironguard-controlplane`: flags that override the configuration file and the environment
//! ([`Cli::effective`]). It lives in the library so that `ironguard-gen-docs` can generate the man page and the
//! shell completions from the same definition (`clap::CommandFactory`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

use crate::ControlPlaneConfig;

#[derive(Debug, Parser)]
#[command(name = "ironguard-controlplane", version, about = "ironguard control plane: filter state and gRPC API")]
pub struct Cli {
    /// Configuration file (TOML). Default: /etc/ironguard/controlplane.toml if it exists.
    #[arg(long, env = "IRONGUARD_CP_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (server.grpc_listen).
    #[arg(long, env = "IRONGUARD_CP_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// gRPC server certificate, PEM (grpc.tls_cert_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_TLS_CERT")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// Its private key, PEM (grpc.tls_key_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_TLS_KEY")]
    pub grpc_tls_key: Option<PathBuf>,
    /// CA of the agents' and operators' client certificates, PEM (grpc.client_ca_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_CLIENT_CA")]
    pub grpc_client_ca: Option<PathBuf>,
    /// A certificate name that is an operator (repeat, or comma-separated; grpc.operator_names).
    #[arg(long = "grpc-operator", env = "IRONGUARD_CP_GRPC_OPERATORS", value_delimiter = ',')]
    pub grpc_operators: Vec<String>,
    /// File holding the operators' bearer token (grpc.operator_token_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_OPERATOR_TOKEN_FILE")]
    pub grpc_operator_token_file: Option<PathBuf>,
    /// Serve gRPC in plaintext, without identities (grpc.insecure). Logged as a warning at every start.
    #[arg(long, env = "IRONGUARD_CP_GRPC_INSECURE")]
    pub grpc_insecure: bool,
    /// Admin HTTP listen address for /metrics, /healthz, /readyz (server.admin_listen).
    #[arg(long, env = "IRONGUARD_CP_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Directory of the embedded store (store.data_dir).
    #[arg(long, env = "IRONGUARD_CP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Unknown-MAC policy published to agents: allow or deny (filter.unknown_mac_policy).
    #[arg(long, env = "IRONGUARD_CP_UNKNOWN_MAC_POLICY", value_parser = ["allow", "deny", "while-inspecting"])]
    pub unknown_mac_policy: Option<String>,
    /// etcd endpoint (repeat, or comma-separated; etcd.endpoints). Without it, the embedded store is used.
    #[arg(long = "etcd", env = "IRONGUARD_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Serve the ironic-inspector v1 REST API on this address (server.inspector_listen), e.g. 0.0.0.0:5050.
    #[arg(long, env = "IRONGUARD_CP_INSPECTOR_LISTEN")]
    pub inspector_listen: Option<SocketAddr>,
    /// Serve the inspector API without authentication on a network address (inspector_api.insecure). Logged as a
    /// warning at every start.
    #[arg(long, env = "IRONGUARD_CP_INSPECTOR_INSECURE")]
    pub inspector_insecure: bool,
    /// Ironic API endpoint (ironic.url), e.g. http://127.0.0.1:6385.
    #[arg(long, env = "IRONGUARD_IRONIC_URL")]
    pub ironic_url: Option<String>,
    /// This replica's name in the control-plane election (server.replica_id).
    #[arg(long, env = "IRONGUARD_CP_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Log format: text or json (log.format).
    #[arg(long, env = "IRONGUARD_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl Cli {
    /// The effective configuration: the file (`--config`, or the default path if it exists), then the
    /// environment and the flags, validated.
    pub fn effective(&self) -> anyhow::Result<ControlPlaneConfig> {
        let mut c = ControlPlaneConfig::load(self.config.as_deref())?;
        if let Some(a) = self.grpc_listen {
            c.server.grpc_listen = Some(a);
        }
        if let Some(p) = &self.grpc_tls_cert {
            c.grpc.tls_cert_file = p.clone();
        }
        if let Some(p) = &self.grpc_tls_key {
            c.grpc.tls_key_file = p.clone();
        }
        if let Some(p) = &self.grpc_client_ca {
            c.grpc.client_ca_file = p.clone();
        }
        if !self.grpc_operators.is_empty() {
            c.grpc.operator_names = self.grpc_operators.clone();
        }
        if let Some(p) = &self.grpc_operator_token_file {
            c.grpc.operator_token_file = p.clone();
        }
        if self.grpc_insecure {
            c.grpc.insecure = true;
        }
        if let Some(a) = self.admin_listen {
            c.server.admin_listen = a;
        }
        if let Some(d) = &self.data_dir {
            c.store.data_dir = d.clone();
        }
        if let Some(p) = &self.unknown_mac_policy {
            c.filter.unknown_mac_policy = serde_json::from_value(serde_json::Value::String(p.clone()))?;
        }
        if !self.etcd.is_empty() {
            c.etcd.endpoints = self.etcd.clone();
        }
        if let Some(a) = self.inspector_listen {
            c.server.inspector_listen = Some(a);
        }
        if self.inspector_insecure {
            c.inspector_api.insecure = true;
        }
        if let Some(u) = &self.ironic_url {
            c.ironic.url = u.clone();
        }
        if let Some(r) = &self.replica_id {
            c.server.replica_id = r.clone();
        }
        if let Some(f) = &self.log_format {
            c.log.format = f.clone();
        }
        c.validate()?;
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
