//! `ironguard-coord` — the coordination layer both binaries use, with two backends behind [`Coordinator`]:
//!
//! - [`etcd`]: an etcd cluster ([`EtcdConfig`]: endpoints, TLS, user/password, timeouts, retries).
//! - [`local`]: in-process, for a single host without etcd: sessions never expire, the only candidate wins.
//!
//! What it provides:
//! - [`Session`]: a lease kept alive every TTL/3, exposing when it will expire *at the latest* on this host's
//!   monotonic clock ([`Expiry`]) — the basis of the agents' lease fence.
//! - Elections (`campaign` / `leader` / `resign`), built on keys attached to the session's lease: the candidate
//!   with the oldest key leads; a key disappears when its lease expires, so a successor is elected only after the
//!   previous leader's lease is gone.
//! - Membership (keys attached to a session, listed by prefix), a distributed lock, and a key-value store with
//!   revisions and prefix watch.
#![forbid(unsafe_code)]

pub mod amnesia;
pub mod config;
pub mod etcd;
mod lanes;
pub mod local;
pub mod secret;
mod session;
pub mod versions;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

pub use amnesia::{Amnesia, StoreMemory};
pub use config::EtcdConfig;
pub use secret::Secret;
pub use session::{Expiry, Session};

/// A coordination operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("invalid etcd configuration: {0}")]
    Config(String),
    #[error("cannot read {path}")]
    ReadFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd {op} failed: {source}")]
    Etcd {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    #[error("etcd {op}: {detail}")]
    Protocol { op: &'static str, detail: String },
    #[error("the lease expired")]
    LeaseExpired,
    #[error("cancelled")]
    Cancelled,
}

/// Proof of having won an election, needed to confirm it and to resign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub election: String,
    /// The backend's key for this candidacy.
    pub key: String,
    /// The key's create revision: the fencing token.
    pub revision: i64,
    /// The lease the key is attached to (0 on the local backend).
    pub lease: i64,
    /// Who holds it (the campaign's value).
    pub holder: String,
}

/// An election's hand-over record (etcd: the key `election/<name>.fence`): written by the holder when it confirms
/// its leadership and when it has closed. A successor reads it before it may open: a closed record of its
/// predecessor lets it open at once; an open one makes it wait until `fence_ms` after it first learned of the
/// record's last write, the latest instant the predecessor's fence can still be open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandOver {
    /// The holder's create revision (its fencing token) and lease.
    pub rev: i64,
    pub lease: i64,
    pub holder: String,
    /// Whether the holder may still be open.
    pub open: bool,
    /// How long after this record's write the holder's fence can stay open, in milliseconds.
    pub fence_ms: u64,
}

/// Added to a predecessor's fence before a successor opens: a late kernel write (at most
/// `ironguard_dataplane::LEASE_APPLY_SLACK`) and the difference in rate between two hosts' monotonic clocks.
pub const HANDOVER_SLACK: Duration = Duration::from_millis(100);

/// A key-value pair with the revision at which it was created and last modified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// A change seen by a prefix watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    Put(KeyValue),
    Delete { key: String, mod_revision: i64 },
}

/// A held distributed lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockGuard {
    pub name: String,
    pub key: String,
}

/// Leases, elections, membership, locks and a key-value store. Keys are relative to the backend's prefix.
#[async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// "etcd" or "local".
    fn backend(&self) -> &'static str;

    /// Grants a lease of `ttl` and keeps it alive in the background until the session is dropped or revoked.
    async fn session(&self, ttl: Duration) -> Result<Session, CoordError>;

    /// Ends a session now: its keys (candidacy, membership, locks) disappear at once.
    async fn revoke(&self, session: &Session) -> Result<(), CoordError>;

    /// Revokes a lease by id (one left by a previous run of this process). A lease already gone is not an error.
    async fn revoke_lease(&self, lease: i64) -> Result<(), CoordError>;

    /// Campaigns in `election` with `value`; resolves when this candidate leads. If `cancel` fires first, the
    /// candidacy is withdrawn before returning [`CoordError::Cancelled`].
    async fn campaign(
        &self,
        election: &str,
        value: &str,
        session: &Session,
        cancel: CancellationToken,
    ) -> Result<Leadership, CoordError>;

    /// Gives up leadership (deletes the candidacy) after the holder has closed: its hand-over record says so in
    /// the same transaction, so the successor need not wait out the holder's fence. Idempotent.
    async fn resign(&self, leadership: &Leadership) -> Result<(), CoordError>;

    /// The fencing token check: proves that this candidacy still holds the election (its key is there with the
    /// create revision it won with) and publishes, in the election's hand-over record, that the holder may keep
    /// its fence open up to `fence` after this write. `Ok(false)`: the key is gone (revoked, expired, deleted):
    /// the holder must close at once and must not move its fence. A holder moves its kernel lease forward only
    /// after this returned `Ok(true)`, and never further than `fence` after it sent the request.
    async fn confirm(&self, _leadership: &Leadership, _fence: Duration) -> Result<bool, CoordError> {
        Ok(true)
    }

    /// Resolves when this candidacy's key is gone (deleted by hand, its lease revoked or expired), so the holder
    /// closes at once instead of at its next keep-alive. Never resolves for a candidacy still in the store.
    async fn lost(&self, _leadership: &Leadership) -> Result<(), CoordError> {
        std::future::pending().await
    }

    /// Records in the hand-over record that this holder has closed (after it has), if the record is still its
    /// own: a successor then opens at once instead of waiting out this holder's fence.
    async fn closed(&self, _leadership: &Leadership) -> Result<(), CoordError> {
        Ok(())
    }

    /// At start, for the lease a previous run of this process left behind (it died with it, so its fence is
    /// closed): records the hand-over of `election` as closed if that lease held it, then revokes the lease.
    async fn close_previous(&self, election: &str, lease: i64) -> Result<(), CoordError> {
        let _ = election;
        self.revoke_lease(lease).await
    }

    /// The value of the current leader of `election`, if any.
    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError>;

    /// Writes a key, attached to the session's lease if given (it disappears with the lease).
    async fn put(&self, key: &str, value: Vec<u8>, session: Option<&Session>) -> Result<i64, CoordError>;

    /// Every key under `prefix`, in key order.
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, CoordError>;

    /// Deletes one key. Deleting an absent key is not an error.
    async fn delete(&self, key: &str) -> Result<(), CoordError>;

    /// Changes under `prefix` after `after_revision`.
    async fn watch_prefix(
        &self,
        prefix: &str,
        after_revision: i64,
    ) -> Result<BoxStream<'static, Result<Vec<KvEvent>, CoordError>>, CoordError>;

    /// Takes the lock `name`, held as long as the session lives or until [`Coordinator::unlock`].
    /// Waits while another holder has it; `cancel` gives up.
    async fn lock(&self, name: &str, session: &Session, cancel: CancellationToken) -> Result<LockGuard, CoordError>;

    /// Releases a lock. Idempotent.
    async fn unlock(&self, guard: &LockGuard) -> Result<(), CoordError>;

    /// Looks at the store (its cluster id, its epoch key — written into a store that has none — and its revision)
    /// and compares with what this process remembers: `Some` when the store forgot (see [`amnesia`]).
    async fn check_store(&self) -> Result<Option<Amnesia>, CoordError>;

    /// Whether this candidacy's key is still in the store (it vanishes with an amnesic store).
    async fn still_leading(&self, leadership: &Leadership) -> Result<bool, CoordError>;

    /// What this process remembers of the store, and a way to restore it after a restart.
    fn store_memory(&self) -> StoreMemory;
    fn restore_store_memory(&self, memory: StoreMemory);
}

/// Jittered exponential back-off: 100 ms doubling up to `max`, ±25 %.
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    use rand::Rng as _;
    let base = Duration::from_millis(100).saturating_mul(1u32 << attempt.min(10)).min(max);
    base.mul_f64(rand::rng().random_range(0.75..1.25))
}
