//! Where the filter state lives. One interface, two backends: [`embedded`] (redb on local disk, used when no
//! etcd is configured) and etcd (for replicated control planes).
//!
//! Every backend keeps a mirror of the current state and a bounded log of recent revisions in memory, so watchers
//! get deltas without touching the disk; the durable copy is written before a change is acknowledged.

pub mod embedded;
pub mod etcd;
mod mirror;

use std::collections::BTreeSet;

use async_trait::async_trait;
use ironguard_nft::{MacAddr, UnknownMacPolicy};
use tokio::sync::watch;

use crate::filter::{Entry, ReasonChange, RevisionDelta};

/// A store operation failed; the state is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the embedded store at {path}")]
    Open {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the embedded store failed to {op}")]
    Embedded {
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The store forgot its state (replaced or restored etcd); writes wait until it is re-seeded.
    #[error("store amnesia: {0}; writes are refused until the state is re-seeded from a replica's copy")]
    Amnesia(String),
    #[error("the store is shutting down")]
    Closed,
}

/// The outcome of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The revision after the write (unchanged if nothing changed).
    pub revision: u64,
    /// The revision record, if the write created one.
    pub record: Option<RevisionDelta>,
}

/// Everything, at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: u64,
    pub allow: BTreeSet<MacAddr>,
    pub deny: BTreeSet<MacAddr>,
    pub policy: UnknownMacPolicy,
}

/// Sizes at one revision (cheap: no copy of the sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub revision: u64,
    pub allow: usize,
    pub deny: usize,
    pub policy: UnknownMacPolicy,
}

/// The filter state store.
#[async_trait]
pub trait FilterStore: Send + Sync + 'static {
    /// Applies `changes` (and the policy, if given) atomically and durably. A write that changes neither the
    /// effective sets nor the policy does not create a revision.
    async fn apply(&self, changes: Vec<ReasonChange>, policy: Option<UnknownMacPolicy>) -> Result<Applied, StoreError>;

    /// The effective sets and policy at the current revision.
    fn snapshot(&self) -> Snapshot;

    /// Revision, set sizes and policy.
    fn counts(&self) -> Counts;

    /// The revisions after `since`, oldest first: empty if `since` is current; `None` if the log no longer
    /// reaches back that far, or `since` is ahead of the store (then the caller needs a snapshot).
    fn deltas_since(&self, since: u64) -> Option<Vec<RevisionDelta>>;

    /// The reasons recorded for these MACs (all MACs if empty), with the current revision.
    fn entries(&self, macs: &[MacAddr]) -> (u64, Vec<(MacAddr, Entry)>);

    /// The current revision, updated on every new revision.
    fn revision(&self) -> watch::Receiver<u64>;

    /// The last store amnesia seen (a replaced or restored etcd) and how it was handled, in words.
    fn amnesia(&self) -> Option<String> {
        None
    }
}
