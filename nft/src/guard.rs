//! The guard table: persistent (no owner), installed before the DHCP service starts, dropping DHCP/PXE traffic
//! that does not carry the ironguard mark. It is what keeps DHCP closed while no agent runs.

use serde::Serialize;

use crate::NftError;
use crate::model::RulesetConfig;
use crate::netlink::NetlinkSocket;
use crate::observe::{self, ObservedTable};
use crate::ruleset::{self, GUARD_TABLE};

/// Whether the guard is installed, and as what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardStatus {
    pub installed: bool,
    /// The guard's base chains and rule counts, as found in the kernel.
    pub table: Option<ObservedTable>,
    /// Differences from the configuration (empty when installed as configured).
    pub problems: Vec<String>,
}

fn commit(tx: ruleset::Tx) -> Result<(), NftError> {
    let f = tx.finish();
    let mut sock = NetlinkSocket::open()?;
    sock.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq))
}

/// Installs the guard, replacing any previous one atomically (idempotent). DHCP is never open in between.
pub fn install(config: &RulesetConfig) -> Result<(), NftError> {
    commit(ruleset::guard_install(config)?)
}

/// Removes the guard (idempotent). Only for decommissioning a PXE host.
pub fn remove() -> Result<(), NftError> {
    commit(ruleset::guard_remove())
}

/// Reads the guard back and compares it with `config`.
pub fn status(config: &RulesetConfig) -> Result<GuardStatus, NftError> {
    let observed = observe::observe(false)?;
    let mut problems = Vec::new();
    let Some(t) = observed.guard else {
        return Ok(GuardStatus {
            installed: false,
            table: None,
            problems: vec![format!("table inet {GUARD_TABLE} is missing")],
        });
    };
    let want_rules = config.ports.len() * config.interfaces.len().max(1);
    for h in &config.hooks {
        match t.chain(h.chain_name()) {
            None => problems.push(format!("base chain {} is missing", h.chain_name())),
            Some(c) => {
                let drops =
                    c.rules.iter().filter(|r| r.comment.as_deref() == Some(ruleset::comments::GUARD_DROP)).count();
                if drops != want_rules {
                    problems.push(format!("base chain {} has {drops} drop rules, {want_rules} configured", c.name));
                }
            }
        }
    }
    Ok(GuardStatus { installed: true, table: Some(t), problems })
}
