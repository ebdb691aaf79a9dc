//! `ironic-sync`: the deny set becomes every port MAC Ironic knows (reason `ironic`), and nodes deleted from Ironic
//! are removed from ironguard's inspections.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::records::Kind;
use ironguard_ironic::Ironic;
use tracing::{error, info, warn};

use super::mirror::ReasonMirror;
use super::{IRONIC, Task};
use crate::filter::Side;
use crate::inspection::engine::Engine;

#[derive(Debug)]
pub(super) struct IronicSync {
    engine: Arc<Engine>,
    ironic: Arc<Ironic>,
    deny: ReasonMirror,
    /// `[sync] ironic_drop_max_percent`.
    max_drop_percent: u32,
}

impl IronicSync {
    pub(super) fn new(engine: Arc<Engine>, ironic: Arc<Ironic>, max_drop_percent: u32) -> Self {
        Self { engine, ironic, deny: ReasonMirror::new(Side::Deny, IRONIC), max_drop_percent }
    }
}

#[async_trait]
impl Task for IronicSync {
    async fn run(&self) -> anyhow::Result<()> {
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
        let synced = self.deny.sync(&self.engine, known, Some(self.max_drop_percent)).await?;
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
        if super::drop_held(gone.len(), records.len(), self.max_drop_percent) {
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
