//! `ironguard-controlplane` command line. See `--help`.
#![forbid(unsafe_code)]

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ironguard_controlplane::ControlPlaneConfig;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(name = "ironguard-controlplane", version, about = "ironguard control plane: filter state and gRPC API")]
struct Cli {
    /// Configuration file (TOML). Default: /etc/ironguard/controlplane.toml if it exists.
    #[arg(long, env = "IRONGUARD_CP_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC listen address (server.grpc_listen).
    #[arg(long, env = "IRONGUARD_CP_GRPC_LISTEN")]
    grpc_listen: Option<SocketAddr>,
    /// gRPC server certificate, PEM (grpc.tls_cert_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_TLS_CERT")]
    grpc_tls_cert: Option<PathBuf>,
    /// Its private key, PEM (grpc.tls_key_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_TLS_KEY")]
    grpc_tls_key: Option<PathBuf>,
    /// CA of the agents' and operators' client certificates, PEM (grpc.client_ca_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_CLIENT_CA")]
    grpc_client_ca: Option<PathBuf>,
    /// A certificate name that is an operator (repeat, or comma-separated; grpc.operator_names).
    #[arg(long = "grpc-operator", env = "IRONGUARD_CP_GRPC_OPERATORS", value_delimiter = ',')]
    grpc_operators: Vec<String>,
    /// File holding the operators' bearer token (grpc.operator_token_file).
    #[arg(long, env = "IRONGUARD_CP_GRPC_OPERATOR_TOKEN_FILE")]
    grpc_operator_token_file: Option<PathBuf>,
    /// Serve gRPC in plaintext, without identities (grpc.insecure). Logged as a warning at every start.
    #[arg(long, env = "IRONGUARD_CP_GRPC_INSECURE")]
    grpc_insecure: bool,
    /// Admin HTTP listen address for /metrics, /healthz, /readyz (server.admin_listen).
    #[arg(long, env = "IRONGUARD_CP_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// Directory of the embedded store (store.data_dir).
    #[arg(long, env = "IRONGUARD_CP_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Unknown-MAC policy published to agents: allow or deny (filter.unknown_mac_policy).
    #[arg(long, env = "IRONGUARD_CP_UNKNOWN_MAC_POLICY", value_parser = ["allow", "deny", "while-inspecting"])]
    unknown_mac_policy: Option<String>,
    /// etcd endpoint (repeat, or comma-separated; etcd.endpoints). Without it, the embedded store is used.
    #[arg(long = "etcd", env = "IRONGUARD_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd: Vec<String>,
    /// Serve the ironic-inspector v1 REST API on this address (server.inspector_listen), e.g. 0.0.0.0:5050.
    #[arg(long, env = "IRONGUARD_CP_INSPECTOR_LISTEN")]
    inspector_listen: Option<SocketAddr>,
    /// Ironic API endpoint (ironic.url), e.g. http://127.0.0.1:6385.
    #[arg(long, env = "IRONGUARD_IRONIC_URL")]
    ironic_url: Option<String>,
    /// This replica's name in the control-plane election (server.replica_id).
    #[arg(long, env = "IRONGUARD_CP_REPLICA_ID")]
    replica_id: Option<String>,
    /// Log format: text or json (log.format).
    #[arg(long, env = "IRONGUARD_LOG_FORMAT")]
    log_format: Option<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
}

fn effective(cli: &Cli) -> anyhow::Result<ControlPlaneConfig> {
    let mut c = ControlPlaneConfig::load(cli.config.as_deref())?;
    if let Some(a) = cli.grpc_listen {
        c.server.grpc_listen = Some(a);
    }
    if let Some(p) = &cli.grpc_tls_cert {
        c.grpc.tls_cert_file = p.clone();
    }
    if let Some(p) = &cli.grpc_tls_key {
        c.grpc.tls_key_file = p.clone();
    }
    if let Some(p) = &cli.grpc_client_ca {
        c.grpc.client_ca_file = p.clone();
    }
    if !cli.grpc_operators.is_empty() {
        c.grpc.operator_names = cli.grpc_operators.clone();
    }
    if let Some(p) = &cli.grpc_operator_token_file {
        c.grpc.operator_token_file = p.clone();
    }
    if cli.grpc_insecure {
        c.grpc.insecure = true;
    }
    if let Some(a) = cli.admin_listen {
        c.server.admin_listen = a;
    }
    if let Some(d) = &cli.data_dir {
        c.store.data_dir = d.clone();
    }
    if let Some(p) = &cli.unknown_mac_policy {
        c.filter.unknown_mac_policy = serde_json::from_value(serde_json::Value::String(p.clone()))?;
    }
    if !cli.etcd.is_empty() {
        c.etcd.endpoints = cli.etcd.clone();
    }
    if let Some(a) = cli.inspector_listen {
        c.server.inspector_listen = Some(a);
    }
    if let Some(u) = &cli.ironic_url {
        c.ironic.url = u.clone();
    }
    if let Some(r) = &cli.replica_id {
        c.server.replica_id = r.clone();
    }
    if let Some(f) = &cli.log_format {
        c.log.format = f.clone();
    }
    c.validate()?;
    Ok(c)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match effective(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ironguard-controlplane: {e:#}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        match toml::to_string_pretty(&config) {
            Ok(s) => {
                print!("{s}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("ironguard-controlplane: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if config.log.format == "json" {
        b.json().flatten_event(true).try_init()
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ironguard-controlplane: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(async {
        let server = ironguard_controlplane::serve(&config).await?;
        server.run(shutdown_signal()).await
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "control plane failed");
            eprintln!("ironguard-controlplane: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // Without signal handlers, run until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
