//! Discovery windows: `ironguardctl discovery open --network N --for 30m`.
//!
//! Node discovery lets machines nobody enrolled boot and report (the `enroll` hook makes them Ironic nodes). On a
//! PXE network any machine can then do so; a window bounds that to the time an operator chose, on the network they
//! named. While a network's window is open:
//!
//! - unknown MACs get DHCP on that network when `[filter] unknown_mac_policy = "while-inspecting"` (the agents of
//!   the network are told on their filter streams; each closes the window by its own clock when its time is up);
//! - the `enroll` hook accepts data from unknown machines that booted there, at most
//!   `[discovery] enroll_per_minute` a minute per network.
//!
//! Windows live in the coordination store under `discovery/<network>` (etcd: shared by the replicas and kept; the
//! embedded backend: in memory, so a restart closes them). Each replica reads them every
//! [`REFRESH`] and at once after its own changes; an expired window counts as closed wherever it is read.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironguard_coord::Coordinator;
use ironguard_proto::time::now_ms;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

const PREFIX: &str = "discovery/";
/// How often a replica reads the windows (another replica's change reaches its agents within this).
pub const REFRESH: Duration = Duration::from_secs(2);
/// The longest window.
pub const MAX_SECS: u64 = 24 * 3600;

/// One open window, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub until_unix_ms: u64,
    pub opened_by: String,
}

/// A window request that cannot be honoured.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("{0}")]
    Invalid(String),
    #[error("the coordination store failed: {0}")]
    Store(#[from] ironguard_coord::CoordError),
}

/// Why the `enroll` hook does not enroll a machine now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// No window is open on the network.
    Closed(String),
    /// The network's enrollments of this minute are spent.
    Busy(String),
}

/// The windows, read from the coordination store.
pub struct Windows {
    coord: Arc<dyn Coordinator>,
    /// Network → window, as last read (expired ones included until the next read).
    tx: watch::Sender<BTreeMap<String, Window>>,
    /// Whether windows give unknown MACs DHCP under this configuration; if not, why.
    dhcp: Result<(), String>,
    /// Enrollments per network in the current minute.
    enrolled: Mutex<BTreeMap<String, (Instant, u32)>>,
    enroll_per_minute: u32,
}

impl std::fmt::Debug for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Windows").field("open", &*self.tx.borrow()).finish_non_exhaustive()
    }
}

impl Windows {
    /// `dhcp`: whether open windows give unknown MACs DHCP (the unknown-MAC policy says so), or why not.
    pub fn new(coord: Arc<dyn Coordinator>, dhcp: Result<(), String>, enroll_per_minute: u32) -> Arc<Self> {
        let (tx, _) = watch::channel(BTreeMap::new());
        let me = Arc::new(Self { coord, tx, dhcp, enrolled: Mutex::default(), enroll_per_minute });
        let weak = Arc::downgrade(&me);
        tokio::spawn(async move {
            loop {
                let Some(w) = weak.upgrade() else { return };
                if let Err(e) = w.refresh().await {
                    warn!(error = %e, "cannot read the discovery windows; keeping the last ones read");
                }
                drop(w);
                tokio::time::sleep(REFRESH).await;
            }
        });
        me
    }

    /// Reads the windows from the store; expired ones count as closed.
    pub async fn refresh(&self) -> Result<(), WindowError> {
        let now = now_ms();
        let mut open = BTreeMap::new();
        for kv in self.coord.get_prefix(PREFIX).await? {
            let Some(network) = kv.key.strip_prefix(PREFIX) else { continue };
            match serde_json::from_slice::<Window>(&kv.value) {
                Ok(w) if w.until_unix_ms > now => {
                    open.insert(network.to_string(), w);
                }
                // An expired window is closed; its key stays (one per network) until the next open or close:
                // deleting it here could delete a window another replica just opened again.
                Ok(_) => {}
                Err(e) => warn!(network, error = %e, "an unreadable discovery window counts as closed"),
            }
        }
        self.tx.send_if_modified(|cur| {
            let changed = *cur != open;
            *cur = open;
            changed
        });
        Ok(())
    }

    /// Opens (or extends, or shortens) `network`'s window for `secs` from now.
    pub async fn open(&self, network: &str, secs: u64, operator: &str) -> Result<(), WindowError> {
        if network.is_empty() || network.len() > 128 || network.contains(['/', '\0']) {
            return Err(WindowError::Invalid(format!(
                "network {network:?}: a network name ([agent] network of its agents) is 1 to 128 characters, no '/'"
            )));
        }
        if secs == 0 || secs > MAX_SECS {
            return Err(WindowError::Invalid(format!(
                "a discovery window lasts 1 second to {} hours; asked for {secs} s",
                MAX_SECS / 3600
            )));
        }
        let w = Window { until_unix_ms: now_ms() + secs * 1000, opened_by: operator.to_string() };
        let value = serde_json::to_vec(&w).map_err(|e| WindowError::Invalid(e.to_string()))?;
        self.coord.put(&format!("{PREFIX}{network}"), value, None).await?;
        info!(network, secs, operator, "discovery window opened: unknown machines may boot and enroll until it closes");
        self.refresh().await
    }

    /// Closes `network`'s window (closing a closed one is no error).
    pub async fn close(&self, network: &str, operator: &str) -> Result<(), WindowError> {
        self.coord.delete(&format!("{PREFIX}{network}")).await?;
        info!(network, operator, "discovery window closed");
        self.refresh().await
    }

    /// The open windows.
    pub fn list(&self) -> BTreeMap<String, Window> {
        let now = now_ms();
        self.tx.borrow().iter().filter(|(_, w)| w.until_unix_ms > now).map(|(n, w)| (n.clone(), w.clone())).collect()
    }

    /// How long `network`'s window stays open from now, for its agents: zero when it is closed, or when windows
    /// give no DHCP under this configuration.
    pub fn open_for(&self, network: &str) -> Duration {
        if self.dhcp.is_err() {
            return Duration::ZERO;
        }
        let now = now_ms();
        self.tx
            .borrow()
            .get(network)
            .map(|w| Duration::from_millis(w.until_unix_ms.saturating_sub(now)))
            .unwrap_or_default()
    }

    /// Why windows give unknown MACs no DHCP under this configuration, if they do not.
    pub fn dhcp_note(&self) -> Option<&str> {
        self.dhcp.as_ref().err().map(String::as_str)
    }

    /// Changes whenever the windows read change.
    pub fn changes(&self) -> watch::Receiver<BTreeMap<String, Window>> {
        self.tx.subscribe()
    }

    /// Whether the `enroll` hook may enroll one more machine booted on `network`: its window is open and the
    /// network's budget for this minute is not spent. Counts the enrollment when it may.
    pub fn admit_enrollment(&self, network: &str) -> Result<(), Admission> {
        if !self.list().contains_key(network) {
            return Err(Admission::Closed(format!(
                "no discovery window is open on network {network:?}: unknown machines are not enrolled (an operator \
                 opens one with `ironguardctl discovery open --network {network} --for 30m`)"
            )));
        }
        let mut enrolled = self.enrolled.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let slot = enrolled.entry(network.to_string()).or_insert((now, 0));
        if now.duration_since(slot.0) >= Duration::from_secs(60) {
            *slot = (now, 0);
        }
        if slot.1 >= self.enroll_per_minute {
            return Err(Admission::Busy(format!(
                "network {network:?} enrolled {} machines this minute ([discovery] enroll_per_minute); retry",
                slot.1
            )));
        }
        slot.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(dhcp: Result<(), String>, per_minute: u32) -> Arc<Windows> {
        Windows::new(Arc::new(ironguard_coord::local::LocalCoordinator::new()), dhcp, per_minute)
    }

    #[tokio::test]
    async fn a_window_opens_one_network_for_its_time_and_bounds_enrollments() {
        let w = windows(Ok(()), 2);
        let changes = w.changes();
        assert_eq!(w.open_for("prov"), Duration::ZERO);
        assert!(matches!(w.admit_enrollment("prov"), Err(Admission::Closed(m)) if m.contains("discovery open")));
        w.open("prov", 60, "alice").await.unwrap_or_else(|e| panic!("{e}"));
        assert!(changes.has_changed().unwrap_or(false), "the agents' streams are told");
        let open = w.open_for("prov");
        assert!(open > Duration::from_secs(58) && open <= Duration::from_secs(60), "{open:?}");
        assert_eq!(w.open_for("lab"), Duration::ZERO, "another network stays closed");
        assert_eq!(w.list().get("prov").map(|x| x.opened_by.as_str()), Some("alice"));
        // two enrollments a minute on this network, then 503-and-retry
        assert_eq!(w.admit_enrollment("prov"), Ok(()));
        assert_eq!(w.admit_enrollment("prov"), Ok(()));
        assert!(matches!(w.admit_enrollment("prov"), Err(Admission::Busy(_))));
        assert!(matches!(w.admit_enrollment("lab"), Err(Admission::Closed(_))));
        w.close("prov", "alice").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.open_for("prov"), Duration::ZERO);
        assert!(w.list().is_empty());
    }

    #[tokio::test]
    async fn bad_windows_are_refused_and_change_nothing() {
        let w = windows(Ok(()), 60);
        for (net, secs) in [("", 60), ("a/b", 60), ("prov", 0), ("prov", MAX_SECS + 1)] {
            assert!(matches!(w.open(net, secs, "bob").await, Err(WindowError::Invalid(_))), "{net:?} {secs}");
        }
        assert!(w.list().is_empty());
    }

    /// Under `unknown_mac_policy = "deny"` a window gives no DHCP (and says why) but still admits enrollments.
    #[tokio::test]
    async fn without_a_policy_that_opens_a_window_gives_no_dhcp() {
        let w = windows(Err("deny".into()), 60);
        w.open("prov", 60, "carol").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.open_for("prov"), Duration::ZERO);
        assert_eq!(w.dhcp_note(), Some("deny"));
        assert_eq!(w.admit_enrollment("prov"), Ok(()));
    }
}
