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
use crate::ruleset::{self, GUARD_TABLE, GuardFlags, NFT_TABLE_F_OWNER, NFT_TABLE_F_PERSIST, Side};

/// Whether the guard is installed, and as what.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct GuardStatus {
    /// Every guard table the configuration needs is in the kernel.
    pub installed: bool,
    /// The guard's base chains and rule counts, as found in the kernel (`table inet ironguard_guard`).
    pub table: Option<ObservedTable>,
    /// The reply side's guard (`table netdev ironguard_guard`, egress hook), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_table: Option<ObservedTable>,
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

/// The guard tables now in the kernel (flags and holder only), one per side at most.
fn current() -> Result<Vec<ObservedTable>, NftError> {
    let sock = DumpSocket::open()?;
    let mut tries = observe::Tries::new();
    while tries.another() {
        if let Some(tables) = observe::read_tables(&sock)? {
            return Ok(tables.into_iter().filter(|t| t.name == GUARD_TABLE).collect());
        }
    }
    Err(NftError::Unstable(tries.made))
}

/// The flags of each side's guard among `tables`.
fn flags_of(tables: &[ObservedTable]) -> GuardFlags {
    let mut f = GuardFlags::default();
    for side in Side::ALL {
        f.set(side, tables.iter().find(|t| t.family == side.family_name()).map(|t| t.flags));
    }
    f
}

/// The holder of a guard among `tables` other than `own` (a live process whose socket owns it), if any.
fn held_by_other(tables: &[ObservedTable], own: Option<u32>) -> Option<(String, u32)> {
    tables.iter().find_map(|t| {
        let p = t.owner_portid.filter(|p| Some(*p) != own)?;
        Some((format!("{} {GUARD_TABLE}", t.family), p))
    })
}

/// Installs (or replaces, atomically) the guards through `sock` with `flags`. A guard held by another live
/// process is refused with [`NftError::OwnedByOther`]; the holder must be stopped first.
///
/// Several installers can run at the same moment (the guard unit's ExecStart=, the agent's ExecStartPre= and
/// ExecStopPost=, the agent's own claim), so what was read can be stale by the time the batch arrives: another
/// installer took the table (EPERM: it holds it until it exits), created it (EEXIST: ours is exclusive) or deleted
/// it (ENOENT). The kernel then refused the whole batch and nothing changed; it is built again from a fresh read.
pub(crate) fn install_with(sock: &mut NetlinkSocket, config: &RulesetConfig, flags: u32) -> Result<(), NftError> {
    let mut tries = observe::Tries::new();
    loop {
        let existing = current()?;
        if let Some((table, portid)) = held_by_other(&existing, Some(sock.portid())) {
            return Err(NftError::OwnedByOther { table, portid });
        }
        let f = ruleset::guard_install(config, flags, flags_of(&existing))?.finish();
        match sock.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq)) {
            Err(NftError::Rejected { errno: Errno::EPERM | Errno::EEXIST | Errno::ENOENT, .. }) if tries.another() => {}
            done => return done,
        }
    }
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
    let mut sock = NetlinkSocket::open()?;
    let mut tries = observe::Tries::new();
    loop {
        let last = !tries.another();
        match install_with(&mut sock, config, flags) {
            Ok(()) => return Ok(Installed::Installed),
            Err(NftError::OwnedByOther { table, portid }) => {
                let observed = observe::observe(false)?;
                let held = [&observed.guard, &observed.egress_guard]
                    .into_iter()
                    .flatten()
                    .any(|t| t.owner_portid == Some(portid));
                if !held {
                    if !last {
                        // The holder (another installer) exited between the two reads: it is orphaned now.
                        continue;
                    }
                    return Err(NftError::OwnedByOther { table, portid });
                }
                return match observed.guard_problems(config) {
                    problems if problems.is_empty() => Ok(Installed::HeldAsConfigured { portid }),
                    problems => Err(NftError::HeldDiffers { portid, problems: problems.join("; ") }),
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// Removes the guard (idempotent). Only for decommissioning a PXE host; refused while an agent holds it.
pub fn remove() -> Result<(), NftError> {
    let existing = current()?;
    if let Some((table, portid)) = held_by_other(&existing, None) {
        return Err(NftError::OwnedByOther { table, portid });
    }
    let f = ruleset::guard_remove(flags_of(&existing)).finish();
    if f.last_seq() == 0 {
        return Ok(());
    }
    NetlinkSocket::open()?.send_batch(&f.bytes, f.last_seq(), &|seq| f.describe(seq))
}

/// Reads the guards back and compares them with `config`.
pub fn status(config: &RulesetConfig) -> Result<GuardStatus, NftError> {
    let observed = observe::observe(false)?;
    let problems = observed.guard_problems(config);
    let present: Vec<&ObservedTable> = [&observed.guard, &observed.egress_guard].into_iter().flatten().collect();
    let installed = Side::for_config(config).all(|side| observed.side(side).0.is_some());
    let persistent = !present.is_empty() && present.iter().all(|t| t.flags & NFT_TABLE_F_PERSIST != 0);
    let held_by = present.iter().find_map(|t| t.owner_portid);
    let mut notes = vec![];
    if !present.is_empty() && !persistent && persist_supported()? {
        notes.push(
            "the guard is a plain table: `nft flush ruleset` removes it while no agent repairs it; \
             `ironguard-agent guard install` makes it persistent on this kernel"
                .into(),
        );
    }
    Ok(GuardStatus {
        installed,
        table: observed.guard,
        egress_table: observed.egress_guard,
        persistent,
        held_by,
        problems,
        notes,
    })
}
