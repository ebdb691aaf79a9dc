//! `ironguard-dataplane` — the only ironguard crate that enforces the filter: every dataplane backend behind one trait
//! (formerly `ironguard-nft`, from when nftables was the only one).
//!
//! - [`mac`]: [`MacAddr`], the strict MAC address type every API takes.
//! - [`model`]: the desired state ([`RulesetConfig`], [`Mode`], [`DesiredState`], [`Delta`]).
//! - [`dataplane`]: the [`Dataplane`] trait — apply a state, a delta or a mode as one atomic batch; the guard;
//!   drift against what was committed.
//! - [`backend`]: [`backend::open`] builds the configured backends (`[dataplane] backends`), alone or combined,
//!   and the standalone guard commands.
//! - `kernel`: [`KernelDataplane`], the agent's table (`flags owner`) over one long-lived netlink socket.
//! - [`hostsdir`]: [`HostsdirDataplane`], dnsmasq's `--dhcp-hostsdir` in Ironic's `ironic-pxe-filter` format.
//! - [`ipset`]: [`IpsetDataplane`], iptables-legacy and `hash:mac` ipsets for hosts without nftables.
//! - [`guard`]: install / remove / status of the guard table (`owner, persist` where the kernel has it).
//! - [`monitor`]: nf_tables change notifications, so a tampered guard is repaired at once.
//! - [`neighbour`]: the interface (MAC) that holds an address on a link of this host, from the neighbour table.
//! - [`observe`]: read-back of both tables, the verdict line and drift detection; what the kernel saw of each
//!   MAC's DHCP ([`dhcp_seen`]).
//! - `fake`: [`FakeDataplane`], the in-memory implementation for unit tests elsewhere.
//! - [`script`]: the same ruleset as `nft -f` text (for benchmarks and for people).
//! - `ruleset` builds netlink messages with rustables; `netlink` sends them through a netlink-sys socket and parses
//!   replies and dumps with netlink-packet-core.
//!
//! The invariant these serve: a host whose agent is stopped, crashed or failing serves DHCP to nobody. The guard
//! drops DHCP/PXE traffic without the ironguard mark; only the agent's table sets the mark, and the kernel deletes
//! that table when the agent's socket closes.

pub mod backend;
mod dataplane;
mod error;
mod fake;
pub mod guard;
pub mod hostsdir;
pub mod ipset;
mod kernel;
pub mod mac;
pub mod model;
pub mod monitor;
pub mod neighbour;
mod netlink;
pub mod observe;
#[cfg(test)]
mod prop_tests;
pub mod rule;
pub mod ruleset;
pub mod script;

pub use dataplane::{ApplyReport, Dataplane, ProbeCounts};
pub use error::NftError;
pub use fake::{FakeDataplane, FakeState};
pub use hostsdir::HostsdirDataplane;
pub use ipset::IpsetDataplane;
pub use kernel::{KernelDataplane, LEASE_APPLY_SLACK, LEASE_REWRITES};
pub use mac::{MacAddr, MacError};
pub use model::{
    Backend, ConfigError, Delta, DesiredState, HookKind, HostsdirConfig, IpsetConfig, MatchMode, Mode, RulesetConfig,
    UnknownMacPolicy,
};
pub use observe::{
    MacDecision, MacInputs, MacSeen, Observed, ObservedChain, ObservedRule, ObservedSet, ObservedTable, Seen,
    ServingReader, Verdict, decide, dhcp_seen, leader_rules_present, observe, set_members,
};
pub use ruleset::{GUARD_TABLE, LEASE_SET, OWNED_TABLE};
