//! The narrow interface every other crate uses: apply a desired state, a delta or a mode, each as one atomic
//! batch; install and check the fail-closed guard; compare what the backend holds with what was committed.
//! Implemented by [`crate::KernelDataplane`] (nftables over netlink), [`crate::HostsdirDataplane`] (dnsmasq's
//! `dhcp-hostsdir`), [`crate::IpsetDataplane`] (iptables-legacy and ipset), [`crate::backend::Combined`] (several
//! at once) and [`crate::FakeDataplane`] (memory, for unit tests elsewhere).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::NftError;
use crate::model::{Delta, DesiredState, Mode, RulesetConfig, UnknownMacPolicy};

/// The counters of the probe rules (cumulative packets since the table was created).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ProbeCounts {
    /// The agent's own DISCOVERs that reached the local server (request side).
    pub discovers: u64,
    /// DHCPOFFERs the local server sent: to anyone on the output hook, to the probe on the reply side. Both
    /// restart from 0 when the table is built again.
    pub offers: u64,
}

/// What one successful apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ApplyReport {
    /// Kernel transactions committed: 1, or 0 when there was nothing to change.
    pub transactions: u32,
    /// nf_tables messages in the batch.
    pub messages: u32,
    /// Bytes sent.
    pub bytes: usize,
    /// Set elements added or removed.
    pub elements: usize,
    /// Wall time from building the batch to the last acknowledgement.
    #[serde(serialize_with = "micros")]
    pub elapsed: Duration,
    /// Times the lease element was written again because the batch that carried it reached the kernel late
    /// (its timeout counts from then): see [`crate::LEASE_APPLY_SLACK`].
    pub lease_rewrites: u32,
}

impl ApplyReport {
    /// Adds another batch's figures to this one.
    pub fn add(&mut self, o: &ApplyReport) {
        self.transactions += o.transactions;
        self.messages += o.messages;
        self.bytes += o.bytes;
        self.elements += o.elements;
        self.elapsed += o.elapsed;
        self.lease_rewrites += o.lease_rewrites;
    }
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_micros())
}

/// A PXE host's filter. Every mutating call is one atomic kernel transaction: on error nothing changed and the
/// committed state is what it was before.
pub trait Dataplane: Send {
    /// Replaces the whole table with `desired`.
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, NftError>;

    /// Adds and removes MACs. Adding a present MAC or removing an absent one is not an error.
    fn apply_delta(&mut self, delta: &Delta) -> Result<ApplyReport, NftError>;

    /// Switches the mode (and unknown-MAC policy). Costs the same whatever the size of the sets.
    fn set_mode(&mut self, mode: Mode, policy: UnknownMacPolicy) -> Result<ApplyReport, NftError>;

    /// Moves the kernel-enforced lease: the leader's marking rules match until `until` and not after it, whatever
    /// this process does by then (`None`: they match nothing from now on). One transaction. The kernel counts
    /// from when it applies the batch, so `until` must leave room for that (milliseconds at most).
    fn refresh_lease(&mut self, until: Option<Instant>) -> Result<ApplyReport, NftError>;

    /// The end of the lease as last set (`None`: no lease, or it was dropped).
    fn lease_until(&self) -> Option<Instant>;

    /// When [`Dataplane::refresh_lease`] with the same deadline would make the lease last longer: a backend whose
    /// kernel counts leases in coarse units (ipset: whole seconds) ends them before the deadline, and a write at
    /// the right moment brings the end close to it. `None` (every other backend): no such moment.
    fn lease_rewrite_at(&self) -> Option<Instant> {
        None
    }

    /// The state last committed, if any.
    fn committed(&self) -> Option<&DesiredState>;

    /// Installs (or repairs, atomically where the backend can) what keeps DHCP closed while no agent runs, as
    /// `config` says; with `hold`, this process holds it where the backend can (nftables: `owner, persist`).
    fn claim_guard(&mut self, config: &RulesetConfig, hold: bool) -> Result<(), NftError>;

    /// What is wrong with the guard now (empty: in place as configured and, with `hold`, held by this process).
    fn guard_problems(&self, config: &RulesetConfig, hold: bool) -> Vec<String>;

    /// The guard in words, for the log line at start (e.g. "held (owner, persist)").
    fn guard_description(&self, hold: bool) -> String;

    /// Differences between what the backend holds and the committed state; empty means none. Set members are
    /// compared only `with_members` (otherwise sizes).
    fn drift(&self, with_members: bool) -> Result<Vec<String>, NftError>;

    /// The netlink port of the nftables owner socket, when this dataplane has one: its guard can then be watched
    /// through nf_tables change notifications (changes made by this port are the agent's own).
    fn nftables_port(&self) -> Option<u32> {
        None
    }

    /// What the probe rules counted (None: this backend has no probe rules, or no probe identity is configured).
    fn probe_counts(&self) -> Result<Option<ProbeCounts>, NftError> {
        Ok(None)
    }

    /// What the kernel saw of each MAC's DHCP lately (None: this backend does not observe).
    fn dhcp_seen(&self) -> Result<Option<Vec<crate::MacSeen>>, NftError> {
        Ok(None)
    }

    /// Whether the fence is enforced without this process ([`Dataplane::refresh_lease`] sets a deadline the kernel
    /// keeps even if this process is frozen). Where it is not, the agent's own timer is the only fence.
    fn kernel_lease(&self) -> bool {
        false
    }
}
