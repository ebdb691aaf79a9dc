//! `ironguard-agent` — the privileged daemon on each PXE host.
//!
//! - [`cli`]: the command line (`guard`, `run`, `hold`, `print-config`) and the flags that override the
//!   configuration; `main.rs` runs what it parses, `ironguard-gen-docs` makes the man page from it.
//! - [`config`]: the agent's TOML configuration (`[agent]`, `[controlplane]`, `[dhcp_health]`, `[reconcile]`,
//!   `[admin]`, `[dataplane]`).
//! - [`core`]: the agent's decisions as a state machine without I/O (`Core::step(event) -> effects`): follows
//!   the control plane's filter state, decides the mode, fails closed; unit-tested on `FakeDataplane`.
//! - [`daemon`]: `ironguard-agent run`, the async shell around the core: the input tasks and the main loop.
//! - [`stream`]: the WatchFilters stream (reconnect, resume) and status reports.
//! - [`coordination`]: the session in etcd (or the local backend), party membership and the election.
//! - [`dhcp_health`]: is the local DHCP service healthy?
//! - [`dhcp_probe`]: does the local DHCP server answer? (the agent's own DISCOVERs through the real filter path)
//! - [`seen`]: what the kernel saw of recent boots (per MAC: requests, let through, answered), for reports.
//! - [`metrics`]: Prometheus metrics and the admin endpoint (`/metrics`, `/healthz`, `/readyz`).
//! - [`notify`]: systemd's readiness and watchdog notifications, sent without ever waiting.
//! - [`hold`]: `ironguard-agent hold`, which keeps a static filter state (for tests, demos and emergencies).
//! - [`logging`]: `tracing` set-up shared by the subcommands.
//!
//! Guard management (`guard install|remove|status`) is a thin layer over [`ironguard_dataplane::guard`] in `main.rs`.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod coordination;
pub mod core;
pub mod daemon;
pub mod dhcp_health;
pub mod dhcp_probe;
pub mod hold;
pub mod link;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod seen;
pub mod stream;

pub use config::AgentConfig;
