//! `ironguard-controlplane` command line. See `--help`; the parser is [`ironguard_controlplane::cli`].
#![forbid(unsafe_code)]

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;
use ironguard_controlplane::cli::Cli;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.effective() {
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
