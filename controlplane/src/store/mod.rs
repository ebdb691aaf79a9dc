//! Everything the control plane keeps, behind one abstraction per backend:
//!
//! - [`FilterStore`]: the authoritative filter state (why each MAC is allowed or denied), with revisions.
//! - [`inspections::InspectionStore`]: node inspection records, their ramdisk data and the work queue.
//! - [`rules::RuleStore`]: ironic-inspector's introspection rules.
//!
//! Two backends implement all three: [`embedded`] (one redb database in the data directory, used when no etcd is
//! configured) and [`etcd`] (shared by control-plane replicas). [`Stores`] bundles one backend's three stores;
//! [`StoreError`] names the backend that failed.
//!
//! Every filter backend keeps a mirror of the current state and a bounded log of recent revisions in memory, so
//! watchers get deltas without touching the disk; the durable copy is written before a change is acknowledged.

pub mod embedded;
pub mod etcd;
pub mod inspections;
mod mirror;
pub mod rules;

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use ironguard_dataplane::{MacAddr, UnknownMacPolicy};
use tokio::sync::watch;

use crate::filter::{Entry, ReasonChange, RevisionDelta};
pub use inspections::InspectionStore;
pub use rules::RuleStore;

/// Which backend a store error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Etcd,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Embedded => "embedded (redb)",
            Backend::Etcd => "etcd",
        })
    }
}

/// A store operation failed; the state is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the embedded store at {path}")]
    Open {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the {backend} store failed to {op}")]
    Backend {
        backend: Backend,
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("node {node} was changed by someone else (version {found}, expected {expected})")]
    Conflict { node: String, expected: u64, found: u64 },
    #[error("data in the {backend} store is corrupt: {detail}")]
    Corrupt { backend: Backend, detail: String },
    /// The store forgot its state (replaced or restored etcd); writes wait until it is re-seeded.
    #[error("store amnesia: {0}; writes are refused until the state is re-seeded from a replica's copy")]
    Amnesia(String),
    /// A singleton task's write after its replica lost the control-plane lead: nothing was written.
    #[error("not written: this replica no longer leads the control plane ({0})")]
    Fenced(String),
    #[error("the store is shutting down")]
    Closed,
}

impl StoreError {
    pub(crate) fn corrupt(backend: Backend, detail: impl Into<String>) -> Self {
        StoreError::Corrupt { backend, detail: detail.into() }
    }
}

/// `map_err` helper: a failure of the embedded backend while doing `op`.
pub(crate) fn embedded<E: std::error::Error + Send + Sync + 'static>(op: &'static str) -> impl FnOnce(E) -> StoreError {
    move |e| StoreError::Backend { backend: Backend::Embedded, op, source: Box::new(e) }
}

/// `map_err` helper: a failure of the etcd backend while doing `op`.
pub(crate) fn etcd<E: std::error::Error + Send + Sync + 'static>(op: &'static str) -> impl FnOnce(E) -> StoreError {
    move |e| StoreError::Backend { backend: Backend::Etcd, op, source: Box::new(e) }
}

/// One backend's stores.
#[derive(Clone)]
pub struct Stores {
    pub filters: Arc<dyn FilterStore>,
    pub inspections: Arc<dyn InspectionStore>,
    pub rules: Arc<dyn RuleStore>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
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
    /// The store's epoch at this revision ([`FilterStore::epoch`]).
    pub epoch: String,
}

/// Sizes at one revision (cheap: no copy of the sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub revision: u64,
    pub allow: usize,
    pub deny: usize,
    pub policy: UnknownMacPolicy,
}

/// The leadership a singleton task's write depends on: the candidacy key in the coordination store and its create
/// revision (the fencing token). A write that carries it commits only while that key exists with that revision, so
/// a replica paused past the end of its lead (a stopped VM, a long GC pause, a partition) cannot land a stale write
/// after another replica took over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub revision: i64,
}

impl From<&ironguard_coord::Leadership> for Fence {
    fn from(l: &ironguard_coord::Leadership) -> Self {
        Fence { key: l.key.clone(), revision: l.revision }
    }
}

/// The filter state store.
#[async_trait]
pub trait FilterStore: Send + Sync + 'static {
    /// Applies `changes` (and the policy, if given) atomically and durably. A write that changes neither the
    /// effective sets nor the policy does not create a revision.
    async fn apply(&self, changes: Vec<ReasonChange>, policy: Option<UnknownMacPolicy>) -> Result<Applied, StoreError>;

    /// [`FilterStore::apply`] for a singleton task: committed only while `fence` holds, else
    /// [`StoreError::Fenced`] and nothing is written. The embedded store has one writing process, whose own
    /// election is in memory: there, this is `apply`.
    async fn apply_fenced(
        &self,
        changes: Vec<ReasonChange>,
        policy: Option<UnknownMacPolicy>,
        fence: &Fence,
    ) -> Result<Applied, StoreError> {
        let _ = fence;
        self.apply(changes, policy).await
    }

    /// The effective sets and policy at the current revision.
    fn snapshot(&self) -> Snapshot;

    /// Revision, set sizes and policy.
    fn counts(&self) -> Counts;

    /// The revisions after `since`, oldest first: empty if `since` is current; `None` if the log no longer
    /// reaches back that far, or `since` is ahead of the store (then the caller needs a snapshot).
    fn deltas_since(&self, since: u64) -> Option<Vec<RevisionDelta>>;

    /// The store's identity: random, created with the authoritative state and new whenever it is created again (an
    /// embedded store wiped, an etcd prefix emptied and written afresh). Revision numbers count within one epoch.
    /// Empty only for an etcd store that was never written.
    fn epoch(&self) -> String;

    /// The deltas after `since` for an agent whose state is of `epoch`, as [`FilterStore::deltas_since`]; `None`
    /// (a snapshot) as well when `epoch` is not this store's: deltas never cross epochs.
    fn resume(&self, since: u64, epoch: &str) -> Option<Vec<RevisionDelta>>;

    /// The reasons recorded for these MACs (all MACs if empty), with the current revision.
    fn entries(&self, macs: &[MacAddr]) -> (u64, Vec<(MacAddr, Entry)>);

    /// The current revision, updated on every new revision.
    fn revision(&self) -> watch::Receiver<u64>;

    /// The last store amnesia seen (a replaced or restored etcd) and how it was handled, in words.
    fn amnesia(&self) -> Option<String> {
        None
    }
}
