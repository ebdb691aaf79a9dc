//! `ironguard-agent hold`: applies a static filter state and holds the agent's table until SIGTERM/SIGINT.
//!
//! SIGHUP re-reads the state file and applies the difference in one batch. Any failure while holding drops the
//! table to `Blocked`; if even that fails the process exits, and the kernel deletes the table with its socket.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use ironguard_dataplane::{Dataplane, Delta, DesiredState, MacAddr, Mode, RulesetConfig, UnknownMacPolicy};
use serde::Deserialize;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

/// The dynamic part of a static filter state, as written in a `--state` file (TOML or JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticState {
    pub mode: Mode,
    pub unknown_mac_policy: UnknownMacPolicy,
    pub allow: BTreeSet<MacAddr>,
    pub deny: BTreeSet<MacAddr>,
}

impl StaticState {
    /// Reads a state file; `.json` files are JSON, anything else TOML.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read state file {}", path.display()))?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(anyhow::Error::from)
        } else {
            toml::from_str(&text).map_err(anyhow::Error::from)
        };
        parsed.with_context(|| format!("state file {} is invalid", path.display()))
    }

    fn desired(&self, config: &RulesetConfig) -> DesiredState {
        DesiredState {
            config: config.clone(),
            mode: self.mode,
            unknown_mac_policy: self.unknown_mac_policy,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
        }
    }
}

/// What `hold` should do.
#[derive(Debug, Clone)]
pub struct HoldOptions {
    pub config: RulesetConfig,
    pub state: StaticState,
    pub state_file: Option<PathBuf>,
    pub install_guard: bool,
    pub ready_file: Option<PathBuf>,
}

/// Runs until SIGTERM/SIGINT. Returns an error only if the table could not be created or kept safe.
pub async fn run(opts: HoldOptions) -> anyhow::Result<()> {
    opts.config.validate().context("invalid [dataplane] configuration")?;
    if opts.install_guard {
        ironguard_dataplane::backend::guard_install(&opts.config).context("installing the guard")?;
    }
    let mut dp = ironguard_dataplane::backend::open(&opts.config).context("opening the dataplane")?;
    let desired = opts.state.desired(&opts.config);
    let report = dp.apply(&desired).context("applying the initial state")?;
    refresh_watchdog(&mut dp)?;
    info!(
        mode = %desired.mode,
        allow = desired.allow.len(),
        deny = desired.deny.len(),
        elapsed_ms = report.elapsed.as_millis() as u64,
        owner_portid = dp.nftables_port(),
        "holding the agent's table"
    );
    if let Some(path) = &opts.ready_file {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing ready file {}", path.display()))?;
    }
    println!("ready: mode={} allow={} deny={}", desired.mode, desired.allow.len(), desired.deny.len());

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    // The kernel lease as a watchdog: refreshed on every tick for LOCAL_LEASE, so a frozen or hung `hold` stops
    // serving within that time even though its table lives on.
    let mut tick = crate::daemon::main_tick(std::time::Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => refresh_watchdog(&mut dp)?,
            _ = hup.recv() => {
                if let Err(e) = reload(&mut dp, &opts) {
                    error!(error = format!("{e:#}"), "reload failed; failing closed");
                    dp.set_mode(Mode::Blocked, UnknownMacPolicy::Deny)
                        .context("could not drop to Blocked after a failed reload")?;
                }
            }
        }
    }
    info!("signal received: dropping to Blocked");
    if let Err(e) = dp.set_mode(Mode::Blocked, UnknownMacPolicy::Deny) {
        // Exiting closes the owner socket; the kernel deletes the table and the guard blocks DHCP.
        warn!(error = %e, "could not switch to Blocked; exiting so the kernel removes the table");
    }
    Ok(())
}

/// A leader's kernel lease, as a watchdog: valid for [`crate::daemon::LOCAL_LEASE`] from now.
fn refresh_watchdog(dp: &mut Box<dyn Dataplane>) -> anyhow::Result<()> {
    if dp.committed().is_some_and(|c| c.mode == Mode::Leader) {
        let until = std::time::Instant::now() + crate::daemon::LOCAL_LEASE;
        dp.refresh_lease(Some(until)).context("refreshing the kernel lease")?;
    }
    Ok(())
}

fn reload(dp: &mut Box<dyn Dataplane>, opts: &HoldOptions) -> anyhow::Result<()> {
    let Some(path) = &opts.state_file else {
        info!("SIGHUP without --state file: nothing to reload");
        return Ok(());
    };
    let next = StaticState::load(path)?;
    let current = dp.committed().context("nothing committed")?;
    let delta = Delta {
        allow_add: next.allow.difference(&current.allow).copied().collect(),
        allow_remove: current.allow.difference(&next.allow).copied().collect(),
        deny_add: next.deny.difference(&current.deny).copied().collect(),
        deny_remove: current.deny.difference(&next.deny).copied().collect(),
    };
    let r1 = dp.apply_delta(&delta)?;
    if next.mode == Mode::Leader {
        let until = std::time::Instant::now() + crate::daemon::LOCAL_LEASE;
        dp.refresh_lease(Some(until))?;
    }
    let r2 = dp.set_mode(next.mode, next.unknown_mac_policy)?;
    info!(
        mode = %next.mode,
        changed = delta.len(),
        transactions = r1.transactions + r2.transactions,
        "reloaded state file"
    );
    println!("reloaded: mode={} allow={} deny={}", next.mode, next.allow.len(), next.deny.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_rejects_bad_macs_with_the_input_quoted() {
        let dir = std::env::temp_dir().join(format!("ig-hold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.toml");
        std::fs::write(&p, "mode = \"leader\"\nallow = [\"52:54:00:00:00:zz\"]\n").unwrap();
        let err = format!("{:#}", StaticState::load(&p).unwrap_err());
        assert!(err.contains("52:54:00:00:00:zz"), "{err}");
        std::fs::write(&p, "mode = \"leader\"\nallow = [\"52:54:00:00:00:01\"]\n").unwrap();
        let s = StaticState::load(&p).unwrap();
        assert_eq!(s.mode, Mode::Leader);
        assert_eq!(s.allow.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
