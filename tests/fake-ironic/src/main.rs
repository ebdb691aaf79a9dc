//! `fake-ironic`: serves a fake Ironic until SIGTERM or SIGINT, printing `listening on http://ADDR` once bound.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use fake_ironic::{FakeIronic, FakeIronicConfig};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// A test double of OpenStack Ironic's REST API, with a `/_fake` admin API to inject faults and inspect calls.
#[derive(Debug, Parser)]
#[command(name = "fake-ironic", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:6385")]
    listen: SocketAddr,
    /// Nodes to create at start.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Ports (with unique MACs) per created node.
    #[arg(long, default_value_t = 1)]
    ports_per_node: usize,
    /// Provision state of the created nodes.
    #[arg(long, default_value = "enroll")]
    provision_state: String,
    /// Largest page size of list calls (Ironic's `[api] max_limit`).
    #[arg(long, default_value_t = 1000)]
    max_limit: usize,
    /// Highest microversion accepted.
    #[arg(long, default_value = "1.81")]
    max_version: String,
    /// Require `Authorization: Basic` with USER:PASSWORD.
    #[arg(long, value_name = "USER:PASSWORD")]
    basic_auth: Option<String>,
    /// Require `X-Auth-Token` equal to TOKEN.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .init();
    let args = Args::parse();
    let require_basic_auth = match &args.basic_auth {
        None => None,
        Some(s) => {
            let (user, password) = s.split_once(':').context("--basic-auth takes USER:PASSWORD")?;
            Some((user.to_owned(), password.to_owned()))
        }
    };
    if args.max_limit == 0 {
        anyhow::bail!("--max-limit must be positive");
    }
    let config = FakeIronicConfig {
        max_version: args.max_version.clone(),
        max_limit: args.max_limit,
        require_basic_auth,
        require_token: args.token.clone(),
        ..FakeIronicConfig::default()
    };
    let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let fake =
        FakeIronic::start_with(args.listen, config).await.with_context(|| format!("serving on {}", args.listen))?;
    fake.populate(args.nodes, args.ports_per_node, &args.provision_state);

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", fake.url()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    drop(stdout);

    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        r = tokio::signal::ctrl_c() => {
            r.context("waiting for SIGINT")?;
            tracing::info!("SIGINT: stopping");
        }
    }
    fake.stop().await;
    Ok(())
}
