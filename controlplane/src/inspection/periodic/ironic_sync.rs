//! `ironic-sync`: the deny set becomes every port MAC Ironic knows (reason `ironic`), and nodes deleted from Ironic
//! are removed from ironguard's inspections.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use ironguard_coord::Coordinator;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::records::Kind;
use ironguard_ironic::Ironic;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::mirror::{ReasonMirror, Synced};
use super::{IRONIC, Task};
use crate::filter::Side;
use crate::inspection::engine::Engine;
use crate::metrics::WhatLabel;
use crate::store::Fence;

#[derive(Debug)]
pub(super) struct IronicSync {
    engine: Arc<Engine>,
    ironic: Arc<Ironic>,
    deny: ReasonMirror,
    /// `[sync] ironic_drop_max_percent`.
    max_drop_percent: u32,
    /// `ironguard_controlplane_ironic_sync_held`.
    held: Family<WhatLabel, Gauge>,
    /// A held drop is on record under [`HELD_KEY`].
    recorded: AtomicBool,
}

/// Where the leader keeps the `ironic` denies it holds back, so that `ironguardctl explain` on any replica can say
/// why a MAC whose port Ironic deleted is still denied.
pub const HELD_KEY: &str = "sync/ironic-held";
/// At most this many MACs are named in the record (the metric and the log count them all).
const HELD_LISTED: usize = 10_000;

/// A held drop of `ironic` denies, as recorded under [`HELD_KEY`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldDrop {
    pub at_unix_ms: u64,
    /// MACs denied before the run.
    pub denied: usize,
    /// Ironic no longer lists this many of them.
    pub held: usize,
    pub max_percent: u32,
    /// The held MACs (at most [`HELD_LISTED`]).
    pub macs: Vec<String>,
}

impl HeldDrop {
    /// The record, if a drop is held now (`None` when none is, or the record cannot be read).
    pub async fn read(coord: &dyn Coordinator) -> Option<Self> {
        let kvs = coord.get_prefix(HELD_KEY).await.ok()?;
        let kv = kvs.into_iter().find(|kv| kv.key.ends_with(HELD_KEY))?;
        serde_json::from_slice(&kv.value).ok()
    }

    /// What `explain` says of `mac` if its deny is held.
    pub fn note(&self, mac: MacAddr) -> Option<String> {
        let m = mac.to_string();
        self.macs.contains(&m).then(|| {
            format!(
                "Ironic no longer lists this port, but its deny is held: {} of the {} denied ports went at once, more \
                 than [sync] ironic_drop_max_percent ({} %). If Ironic is right, remove the denies by hand \
                 (`ironguardctl filters remove MAC... --reason ironic`) or raise the share for one run",
                self.held, self.denied, self.max_percent
            )
        })
    }
}

impl IronicSync {
    pub(super) fn new(
        engine: Arc<Engine>,
        ironic: Arc<Ironic>,
        max_drop_percent: u32,
        held: Family<WhatLabel, Gauge>,
    ) -> Self {
        Self {
            engine,
            ironic,
            deny: ReasonMirror::new(Side::Deny, IRONIC),
            max_drop_percent,
            held,
            recorded: AtomicBool::new(false),
        }
    }

    /// Keeps the held drop on record (and in the metric) while there is one, and removes it after.
    async fn record_held(&self, synced: &Synced) {
        self.held.get_or_create(&WhatLabel { what: "denies" }).set(synced.held as i64);
        let coord = &self.engine.coord;
        if synced.held == 0 {
            if self.recorded.swap(false, Ordering::SeqCst) {
                if let Err(e) = coord.delete(HELD_KEY).await {
                    warn!(error = %e, "cannot remove the record of a held drop; the next run tries again");
                    self.recorded.store(true, Ordering::SeqCst);
                }
            }
            return;
        }
        let record = HeldDrop {
            at_unix_ms: ironguard_proto::time::now_ms(),
            denied: synced.before,
            held: synced.held,
            max_percent: self.max_drop_percent,
            macs: synced.held_macs.iter().take(HELD_LISTED).map(|m| m.to_string()).collect(),
        };
        match serde_json::to_vec(&record) {
            Ok(v) => match coord.put(HELD_KEY, v, None).await {
                Ok(_) => self.recorded.store(true, Ordering::SeqCst),
                Err(e) => warn!(error = %e, "cannot record the held drop for explain"),
            },
            Err(e) => warn!(error = %e, "cannot encode the held drop"),
        }
    }
}

#[async_trait]
impl Task for IronicSync {
    async fn run(&self, fence: &Fence) -> anyhow::Result<()> {
        let ports = self.ironic.list_ports(None).await?;
        let mut known = BTreeSet::new();
        for p in &ports {
            match p.address.parse::<MacAddr>() {
                Ok(m) => {
                    known.insert(m);
                }
                Err(e) => {
                    warn!(port = %p.uuid, address = %p.address, "Ironic port with an address ironguard cannot use: {e}")
                }
            }
        }
        let count = known.len();
        let synced = self.deny.sync(&self.engine, known, Some(self.max_drop_percent), fence).await?;
        self.record_held(&synced).await;
        if synced.held > 0 {
            error!(
                held = synced.held,
                denied = synced.before,
                ironic_ports = count,
                max_percent = self.max_drop_percent,
                "Ironic no longer lists {} of the {} port MACs ironguard denies: more than [sync] \
                 ironic_drop_max_percent at once, so they stay denied (a token scoped to another project, or an \
                 Ironic database restored from an old backup, looks like this). If Ironic is right, remove those \
                 denies with `ironguardctl filters remove MAC... --reason ironic`, or set ironic_drop_max_percent = \
                 100 for one run",
                synced.held,
                synced.before
            );
        }
        if synced.changed > 0 {
            info!(
                changed = synced.changed,
                known = count,
                revision = synced.revision,
                "deny set synchronised with Ironic's ports"
            );
        }
        let nodes: BTreeSet<String> = self.ironic.list_nodes(&[], "uuid").await?.into_iter().map(|n| n.uuid).collect();
        let records = self.engine.store.list().await?;
        let gone: Vec<_> = records.iter().filter(|r| !nodes.contains(&r.uuid)).collect();
        let forget_held = super::drop_held(gone.len(), records.len(), self.max_drop_percent);
        self.held.get_or_create(&WhatLabel { what: "inspections" }).set(if forget_held {
            gone.len() as i64
        } else {
            0
        });
        if forget_held {
            error!(
                gone = gone.len(),
                inspections = records.len(),
                ironic_nodes = nodes.len(),
                "Ironic no longer lists {} of the {} nodes ironguard has inspections of: more than [sync] \
                 ironic_drop_max_percent at once, so none is forgotten. If Ironic is right, set \
                 ironic_drop_max_percent = 100 for one run",
                gone.len(),
                records.len()
            );
            return Ok(());
        }
        for rec in gone {
            info!(node = %rec.uuid, "node deleted from Ironic");
            self.engine.store.enqueue(&rec.uuid, Kind::Delete, serde_json::Value::Null).await?;
        }
        Ok(())
    }
}
