//! Agent configuration: a TOML file (default `/etc/ironguard/agent.toml`, optional) overridden by flags.

use std::path::{Path, PathBuf};

use ironguard_nft::RulesetConfig;
use serde::{Deserialize, Serialize};

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ironguard/agent.toml";

/// The agent's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Where and how DHCP/PXE traffic is filtered. Shared by the guard and the agent's own table.
    pub dataplane: RulesetConfig,
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
}
