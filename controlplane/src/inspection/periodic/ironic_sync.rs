//! `ironic-sync`: the deny set becomes every port MAC Ironic knows (reason `ironic`), and nodes deleted from Ironic
//! are removed from ironguard's inspections.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::records::Kind;
use ironguard_ironic::Ironic;
use tracing::{info, warn};

use super::mirror::ReasonMirror;
use super::{IRONIC, Task};
use crate::filter::Side;
use crate::inspection::engine::Engine;

#[derive(Debug)]
pub(super) struct IronicSync {
    engine: Arc<Engine>,
    ironic: Arc<Ironic>,
    deny: ReasonMirror,
}

impl IronicSync {
    pub(super) fn new(engine: Arc<Engine>, ironic: Arc<Ironic>) -> Self {
        Self { engine, ironic, deny: ReasonMirror::new(Side::Deny, IRONIC) }
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
        let synced = self.deny.sync(&self.engine, known).await?;
        if synced.changed > 0 {
            info!(
                changed = synced.changed,
                known = count,
                revision = synced.revision,
                "deny set synchronised with Ironic's ports"
            );
        }
        let nodes: BTreeSet<String> = self.ironic.list_nodes(&[], "uuid").await?.into_iter().map(|n| n.uuid).collect();
        for rec in self.engine.store.list().await? {
            if !nodes.contains(&rec.uuid) {
                info!(node = %rec.uuid, "node deleted from Ironic");
                self.engine.store.enqueue(&rec.uuid, Kind::Delete, serde_json::Value::Null).await?;
            }
        }
        Ok(())
    }
}
