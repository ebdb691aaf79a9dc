//! `ironguard-agent` — the privileged daemon on each PXE host.
//!
//! - [`config`]: the agent's TOML configuration (`[dataplane]`: interfaces, ports, hooks, match mode, mark).
//! - [`hold`]: `ironguard-agent hold`, which keeps a static filter state (for tests, demos and emergencies).
//! - [`logging`]: `tracing` set-up shared by the subcommands.
//!
//! Guard management (`guard install|remove|status`) is a thin layer over [`ironguard_nft::guard`] in `main.rs`.
#![forbid(unsafe_code)]

pub mod config;
pub mod hold;
pub mod logging;

pub use config::AgentConfig;
