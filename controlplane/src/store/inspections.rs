//! Where inspections live: node records, ramdisk data and the work queue, with at-least-once delivery.
//!
//! [`InspectionStore`] has two backends: [`super::embedded::EmbeddedInspections`] (redb, one control plane) and
//! [`super::etcd::EtcdInspections`] (shared by replicas). A worker *takes* a request with a lease; if it does not
//! *consume* it before the lease ends (it died), the request is delivered again. Requests of a node whose older
//! request is in flight are not handed out, so a node's requests run in order.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::lookup::{Attributes, normalise_bmc};
use ironguard_inspection::records::{Kind, NodeRecord, Request, Taken};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

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

/// A queued request that could not be read, moved aside so that the rest of the queue goes on (etcd:
/// `<prefix>/inspect/quarantine/<id:020>`; embedded: the `inspection_quarantine` table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    /// The request's id, which names the record (what [`InspectionStore::drop_quarantined`] takes). Records written
    /// before it was kept get it from their key when listed.
    #[serde(default)]
    pub id: u64,
    /// The node the request was for, when that could be read (empty otherwise).
    #[serde(default)]
    pub node: String,
    /// Where it was found (the etcd key, or `inspection_queue/<id>`).
    pub key: String,
    /// Why it could not be read.
    pub error: String,
    /// Its bytes, as text (invalid UTF-8 replaced).
    pub raw: String,
    /// When it was moved (ms since the Unix epoch).
    pub quarantined_at: u64,
}

/// The node named by a queue entry's bytes, if they are JSON enough to say (`request.node`); empty otherwise.
pub(crate) fn node_named_in(raw: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(raw)
        .ok()
        .and_then(|v| v.pointer("/request/node").and_then(|n| n.as_str()).map(String::from))
        .unwrap_or_default()
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

/// Which nodes hold which lookup keys: a record's MACs and its BMC addresses as the lookup compares them
/// ([`normalise_bmc`](ironguard_inspection::lookup::normalise_bmc)). `/v1/continue`'s lookup then costs the keys the
/// caller names (at most [`MAX_CALLER_MACS`](ironguard_inspection::lookup::MAX_CALLER_MACS) MACs and a few BMC
/// addresses), not the number of records: a storm of callbacks from the PXE network does not read every record once
/// per callback. The embedded store keeps one in memory beside its records; the etcd store keeps the same keys in
/// etcd, written in the transaction that writes the record.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LookupIndex {
    by_mac: HashMap<MacAddr, BTreeSet<String>>,
    by_bmc: HashMap<String, BTreeSet<String>>,
}

/// The lookup keys of one record: its MACs and its normalised BMC addresses (each once).
pub(crate) fn lookup_keys(r: &NodeRecord) -> (BTreeSet<MacAddr>, BTreeSet<String>) {
    let macs = r.macs.iter().copied().collect();
    let bmcs = r.bmc_addresses.iter().filter_map(|b| normalise_bmc(b)).collect();
    (macs, bmcs)
}

impl LookupIndex {
    /// Indexes `r` (call [`LookupIndex::remove`] with the record it replaces first).
    pub(crate) fn insert(&mut self, r: &NodeRecord) {
        let (macs, bmcs) = lookup_keys(r);
        for m in macs {
            self.by_mac.entry(m).or_default().insert(r.uuid.clone());
        }
        for b in bmcs {
            self.by_bmc.entry(b).or_default().insert(r.uuid.clone());
        }
    }

    /// Forgets `r`'s keys.
    pub(crate) fn remove(&mut self, r: &NodeRecord) {
        let (macs, bmcs) = lookup_keys(r);
        for m in macs {
            if let Some(s) = self.by_mac.get_mut(&m) {
                s.remove(&r.uuid);
                if s.is_empty() {
                    self.by_mac.remove(&m);
                }
            }
        }
        for b in bmcs {
            if let Some(s) = self.by_bmc.get_mut(&b) {
                s.remove(&r.uuid);
                if s.is_empty() {
                    self.by_bmc.remove(&b);
                }
            }
        }
    }

    /// The nodes sharing a MAC or a BMC address with `attrs` (`bmcs`: its addresses, normalised), and the node it
    /// names: a superset of the records [`score`](ironguard_inspection::lookup::score) puts above zero.
    pub(crate) fn nodes(&self, attrs: &Attributes, bmcs: &[String]) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for m in &attrs.macs {
            out.extend(self.by_mac.get(m).into_iter().flatten().cloned());
        }
        for b in bmcs {
            out.extend(self.by_bmc.get(b).into_iter().flatten().cloned());
        }
        if let Some(u) = &attrs.node_uuid {
            out.insert(u.clone());
        }
        out
    }
}

/// Node records, ramdisk data and the work queue.
#[async_trait]
pub trait InspectionStore: Send + Sync + 'static {
    async fn get(&self, node: &str) -> Result<Option<NodeRecord>, StoreError>;
    async fn list(&self) -> Result<Vec<NodeRecord>, StoreError>;
    /// The records `/v1/continue`'s lookup scores above zero (sharing a MAC or BMC address with `attrs`, or
    /// named by it), in UUID order: [`lookup::lookup`](ironguard_inspection::lookup::lookup) over them decides as
    /// over every record. Both backends answer from a [`LookupIndex`], at a cost that grows with the keys `attrs`
    /// names, not with the number of records.
    async fn lookup_candidates(&self, attrs: &Attributes) -> Result<Vec<NodeRecord>, StoreError>;
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
    /// Requests not consumed yet, oldest first (a request that cannot be read is left out).
    async fn pending(&self) -> Result<Vec<Request>, StoreError>;
    /// The requests that could not be read and were moved aside by a take, oldest first.
    async fn quarantined(&self) -> Result<Vec<Quarantined>, StoreError>;
    /// How many requests are in quarantine, without reading them (a record can hold a ramdisk's data).
    async fn quarantine_count(&self) -> Result<u64, StoreError>;
    /// Forgets the quarantine record of request `id` (an operator read it); `false` if there was none.
    async fn drop_quarantined(&self, id: u64) -> Result<bool, StoreError>;
    /// Notified once per request that may have become available (enqueue, release, the consume of a node's
    /// request before it; another replica's too): one waiting worker wakes per request, not every worker.
    fn wakeups(&self) -> Arc<Notify>;
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
    fn the_node_of_an_unreadable_entry_is_found_when_legible() {
        assert_eq!(node_named_in(br#"{"request": {"id": 4, "node": "n1", "kind": 7}}"#), "n1");
        assert_eq!(node_named_in(br#"{"request": {"node": 5}}"#), "");
        assert_eq!(node_named_in(b"{\"request\": garbage"), "");
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
