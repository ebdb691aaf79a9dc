//! The guard table: installed before the DHCP service starts, dropping DHCP/PXE traffic that does not carry the
//! ironguard mark. It is what keeps DHCP closed while no agent runs.
//!
//! Where the kernel has `NFT_TABLE_F_PERSIST` (Linux 6.9+), the guard is a table with `flags owner, persist`:
//! `guard install` creates it and exits, leaving it orphaned but in place; the running agent claims it
//! ([`crate::KernelDataplane::claim_guard`]), after which no other process can change or delete it (EPERM) and
//! `nft flush ruleset` (what Debian's nftables.service runs) skips it; when the agent dies it is orphaned again
//! and keeps dropping, and the restarted agent claims it again. On older kernels it is a plain table, repaired by
//! the agent when a change notification or a read-back shows it was touched.

use std::sync::OnceLock;

use nix::errno::Errno;
use serde::Serialize;

use crate::NftError;
use crate::model::RulesetConfig;
use crate::netlink::{DumpSocket, NetlinkSocket};
use crate::observe::{self, ObservedTable};
use crate::ruleset::{self, GUARD_TABLE, NFT_TABLE_F_OWNER, NFT_TABLE_F_PERSIST};

/// Whether the guard is installed, and as what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardStatus {
    pub installed: bool,
    /// The guard's base chains and rule counts, as found in the kernel.
    pub table: Option<ObservedTable>,
    /// `owner, persist`: survives its holder and refuses every other process while held.
    pub persistent: bool,
    /// The netlink port of the process holding it (the running agent), if any.
    pub held_by: Option<u32>,
    /// Differences from the configuration (empty when installed as configured).
    pub problems: Vec<String>,
    /// Advice that is not a fault (e.g. a plain guard on a kernel that could hold it).
    pub notes: Vec<String>,
}

/// Whether this kernel keeps an owned table after its owner's socket closes (`NFT_TABLE_F_PERSIST`). Probed once
/// per process with a throw-away table created and deleted in one batch.
pub fn persist_supported() -> Result<bool, NftError> {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    if let Some(s) = SUPPORTED.get() {
        return Ok(*s);
    }
    let name = format!("ironguard_probe_{}", std::process::id());
    let f = ruleset::persist_probe(&name).finish();
    let mut sock = NetlinkSocket::open()?;
    let supported = match sock.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq)) {
        Ok(()) => true,
        Err(NftError::Rejected { errno: Errno::EOPNOTSUPP | Errno::EINVAL, .. }) => false,
        Err(e) => return Err(e),
    };
    Ok(*SUPPORTED.get_or_init(|| supported))
}

/// The flags a guard gets on this kernel.
pub fn guard_flags() -> Result<u32, NftError> {
    Ok(if persist_supported()? { NFT_TABLE_F_OWNER | NFT_TABLE_F_PERSIST } else { 0 })
}

/// The guard table now in the kernel (flags and holder only).
fn current() -> Result<Option<ObservedTable>, NftError> {
    let sock = DumpSocket::open()?;
    for _ in 0..5 {
        if let Some(tables) = observe::read_tables(&sock)? {
            return Ok(tables.into_iter().find(|t| t.name == GUARD_TABLE));
        }
    }
    Err(NftError::Unstable(5))
}

/// Installs (or replaces, atomically) the guard through `sock` with `flags`. A guard held by another live
/// process is refused with [`NftError::OwnedByOther`]; the holder must be stopped first.
pub(crate) fn install_with(sock: &mut NetlinkSocket, config: &RulesetConfig, flags: u32) -> Result<(), NftError> {
    let existing = current()?;
    if let Some(portid) = existing.as_ref().and_then(|t| t.owner_portid).filter(|p| *p != sock.portid()) {
        return Err(NftError::OwnedByOther { table: GUARD_TABLE.to_string(), portid });
    }
    let f = ruleset::guard_install(config, flags, existing.map(|t| t.flags))?.finish();
    sock.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq))
}

/// What [`install`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The guard was installed (or replaced, atomically).
    Installed,
    /// A running agent holds the guard (owner, persist) and it is exactly as configured: nothing to do (the agent
    /// repairs it itself). `systemctl reload ironguard-guard` and a restart of nftables.service land here.
    HeldAsConfigured { portid: u32 },
}

/// Installs the guard, replacing any previous one atomically (idempotent). DHCP is never open in between. On a
/// kernel with `persist`, the guard stays in place, orphaned, when this process exits, until an agent claims it.
/// A guard held by a running agent cannot be replaced from here: if it is as `config` says, that is success
/// ([`Installed::HeldAsConfigured`]); if not, [`NftError::HeldDiffers`] says what differs and to restart the agent.
pub fn install(config: &RulesetConfig) -> Result<Installed, NftError> {
    let flags = guard_flags()?;
    match install_with(&mut NetlinkSocket::open()?, config, flags) {
        Ok(()) => Ok(Installed::Installed),
        Err(NftError::OwnedByOther { table, portid }) => {
            let guard = observe::observe(false)?.guard;
            match guard.filter(|t| t.owner_portid == Some(portid)) {
                Some(t) => match t.guard_problems(config) {
                    problems if problems.is_empty() => Ok(Installed::HeldAsConfigured { portid }),
                    problems => Err(NftError::HeldDiffers { portid, problems: problems.join("; ") }),
                },
                // The holder went away between the two reads, or something else changed: say so as it was.
                None => Err(NftError::OwnedByOther { table, portid }),
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes the guard (idempotent). Only for decommissioning a PXE host; refused while an agent holds it.
pub fn remove() -> Result<(), NftError> {
    let existing = current()?;
    if let Some(portid) = existing.as_ref().and_then(|t| t.owner_portid) {
        return Err(NftError::OwnedByOther { table: GUARD_TABLE.to_string(), portid });
    }
    let f = ruleset::guard_remove(existing.map(|t| t.flags)).finish();
    if f.last_seq() == 0 {
        return Ok(());
    }
    NetlinkSocket::open()?.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq))
}

/// Reads the guard back and compares it with `config`.
pub fn status(config: &RulesetConfig) -> Result<GuardStatus, NftError> {
    let observed = observe::observe(false)?;
    let Some(t) = observed.guard else {
        return Ok(GuardStatus {
            installed: false,
            table: None,
            persistent: false,
            held_by: None,
            problems: vec![format!("table inet {GUARD_TABLE} is missing")],
            notes: vec![],
        });
    };
    let problems = t.guard_problems(config);
    let persistent = t.flags & NFT_TABLE_F_PERSIST != 0;
    let mut notes = vec![];
    if !persistent && persist_supported()? {
        notes.push(
            "the guard is a plain table: `nft flush ruleset` removes it while no agent repairs it; \
             `ironguard-agent guard install` makes it persistent on this kernel"
                .into(),
        );
    }
    Ok(GuardStatus { installed: true, persistent, held_by: t.owner_portid, table: Some(t), problems, notes })
}
