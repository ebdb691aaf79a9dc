//! `stale-allows`: an inspection's allow (`inspection:<node>`) belongs to it only while it runs. The workers drop it
//! when the inspection ends; this task removes any that outlived its inspection anyway (a failed removal, a
//! record deleted meanwhile), so that a node is never left able to boot by an inspection that is over.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use ironguard_inspection::machine::State;
use tracing::warn;

use super::Task;
use crate::filter::{ReasonChange, Side};
use crate::inspection::engine::Engine;
use crate::store::Fence;

/// The allow reasons of ironguard's own inspections start with this.
const PREFIX: &str = "inspection:";

#[derive(Debug)]
pub(super) struct StaleAllows {
    engine: Arc<Engine>,
}

impl StaleAllows {
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

#[async_trait]
impl Task for StaleAllows {
    async fn run(&self, fence: &Fence) -> anyhow::Result<()> {
        let e = &self.engine;
        let (_, entries) = e.filters.entries(&[]);
        let mut by_node: BTreeMap<String, Vec<ironguard_dataplane::MacAddr>> = BTreeMap::new();
        for (mac, entry) in entries {
            for reason in entry.allow.iter() {
                if let Some(node) = reason.strip_prefix(PREFIX) {
                    by_node.entry(node.to_string()).or_default().push(mac);
                }
            }
        }
        let mut changes = Vec::new();
        for (node, macs) in by_node {
            let running = e
                .store
                .get(&node)
                .await?
                .is_some_and(|r| matches!(r.state, State::Starting | State::Waiting | State::Processing));
            if !running {
                warn!(node = %node, macs = macs.len(), "an inspection's allow outlived it; removing it");
                let reason = format!("{PREFIX}{node}");
                changes.extend(macs.into_iter().map(|mac| ReasonChange {
                    mac,
                    side: Side::Allow,
                    reason: reason.clone(),
                    present: false,
                }));
            }
        }
        if !changes.is_empty() {
            e.filters.apply_fenced(changes, None, fence).await?;
        }
        Ok(())
    }
}
