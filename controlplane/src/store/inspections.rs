//! Where inspections live: node records, ramdisk data and the work queue, with at-least-once delivery.
//!
//! [`InspectionStore`] has two backends: [`super::embedded::EmbeddedInspections`] (redb, one control plane) and
//! [`super::etcd::EtcdInspections`] (shared by replicas). A worker *takes* a request with a lease; if it does not
//! *consume* it before the lease ends (it died), the request is delivered again. Requests of a node whose older
//! request is in flight are not handed out, so a node's requests run in order.

use std::time::Duration;

use async_trait::async_trait;
use ironguard_inspection::records::{Kind, NodeRecord, Request, Taken};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::StoreError;

/// A queue entry as stored: the request and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueueEntry {
    pub request: Request,
    #[serde(default)]
    pub worker: Option<String>,
    #[serde(default)]
    pub lease_until: u64,
    #[serde(default)]
    pub attempts: u32,
    /// Not before this time (a request left for later).
    #[serde(default)]
    pub available_at: u64,
}

impl QueueEntry {
    pub(crate) fn in_flight(&self, now: u64) -> bool {
        self.worker.is_some() && self.lease_until > now
    }

    pub(crate) fn available(&self, now: u64) -> bool {
        !self.in_flight(now) && self.available_at <= now
    }
}

/// Picks the request to hand out: the oldest available one whose node has no older request in flight.
pub(crate) fn pick(entries: &[QueueEntry], now: u64) -> Option<usize> {
    let busy: std::collections::BTreeSet<&str> =
        entries.iter().filter(|e| e.in_flight(now)).map(|e| e.request.node.as_str()).collect();
    let mut seen: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    // entries are in id order; a node's first not-yet-consumed request goes first
    for (i, e) in entries.iter().enumerate() {
        let node = e.request.node.as_str();
        let first_of_node = seen.insert(node);
        if e.available(now) && first_of_node && !busy.contains(node) {
            return Some(i);
        }
    }
    None
}

/// Node records, ramdisk data and the work queue.
#[async_trait]
pub trait InspectionStore: Send + Sync + 'static {
    async fn get(&self, node: &str) -> Result<Option<NodeRecord>, StoreError>;
    async fn list(&self) -> Result<Vec<NodeRecord>, StoreError>;
    /// The records `/v1/continue`'s lookup scores above zero (sharing a MAC or BMC address with `attrs`, or
    /// named by it): [`lookup::lookup`](ironguard_inspection::lookup::lookup) over them decides as over every record.
    async fn lookup_candidates(
        &self,
        attrs: &ironguard_inspection::lookup::Attributes,
    ) -> Result<Vec<NodeRecord>, StoreError> {
        let bmcs = attrs.normalised_bmcs();
        let mut all = self.list().await?;
        all.retain(|r| ironguard_inspection::lookup::score(attrs, &bmcs, r) > 0);
        Ok(all)
    }
    /// Saves `rec` if the stored version is still `rec.version` (0: absent), then increments `rec.version`.
    async fn save(&self, rec: &mut NodeRecord) -> Result<(), StoreError>;
    /// Removes a node's record and data.
    async fn remove(&self, node: &str) -> Result<(), StoreError>;
    async fn put_data(&self, node: &str, data: &serde_json::Value) -> Result<(), StoreError>;
    async fn get_data(&self, node: &str) -> Result<Option<serde_json::Value>, StoreError>;
    async fn enqueue(&self, node: &str, kind: Kind, args: serde_json::Value) -> Result<u64, StoreError>;
    /// Hands out a request for `lease`, or `None` if nothing is available now.
    async fn take(&self, worker: &str, lease: Duration) -> Result<Option<Taken>, StoreError>;
    /// Keeps a taken request for another `lease` (while a long task runs).
    async fn extend(&self, taken: &Taken, lease: Duration) -> Result<(), StoreError>;
    /// The request is done.
    async fn consume(&self, taken: &Taken) -> Result<(), StoreError>;
    /// Gives a request back, available again after `delay` (the node was locked).
    async fn release(&self, taken: &Taken, delay: Duration) -> Result<(), StoreError>;
    /// Requests not consumed yet, oldest first.
    async fn pending(&self) -> Result<Vec<Request>, StoreError>;
    /// Changes whenever a request may have become available (enqueue, release, another replica's write).
    fn wakeups(&self) -> watch::Receiver<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironguard_inspection::records::{Kind, Request};

    fn entry(id: u64, node: &str, worker: Option<&str>, lease_until: u64) -> QueueEntry {
        QueueEntry {
            request: Request {
                id,
                node: node.into(),
                kind: Kind::Start,
                args: serde_json::Value::Null,
                enqueued_at: 0,
            },
            worker: worker.map(String::from),
            lease_until,
            attempts: 0,
            available_at: 0,
        }
    }

    #[test]
    fn per_node_order_and_redelivery() {
        let now = 1000;
        // node a's first request is in flight: its second waits; node b goes.
        let q = vec![entry(1, "a", Some("w1"), 2000), entry(2, "a", None, 0), entry(3, "b", None, 0)];
        assert_eq!(pick(&q, now), Some(2));
        // the lease of a's first request expired: it is delivered again, before a's second.
        let q = vec![entry(1, "a", Some("w1"), 900), entry(2, "a", None, 0)];
        assert_eq!(pick(&q, now), Some(0));
        // nothing available
        let q = vec![entry(1, "a", Some("w1"), 2000)];
        assert_eq!(pick(&q, now), None);
    }
}
