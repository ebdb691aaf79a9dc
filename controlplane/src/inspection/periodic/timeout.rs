//! `inspection-timeout`: inspections running longer than `[inspection] timeout_secs` end in error.

use std::sync::Arc;

use async_trait::async_trait;
use ironguard_inspection::machine::State;
use ironguard_inspection::records::Kind;
use ironguard_proto::time::now_ms;
use tracing::info;

use super::Task;
use crate::inspection::engine::Engine;
use crate::store::Fence;

#[derive(Debug)]
pub(super) struct InspectionTimeout {
    engine: Arc<Engine>,
}

impl InspectionTimeout {
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

#[async_trait]
impl Task for InspectionTimeout {
    async fn run(&self, _fence: &Fence) -> anyhow::Result<()> {
        let e = &self.engine;
        let limit = e.cfg.timeout_secs * 1000;
        let now = now_ms();
        let pending = e.store.pending().await?;
        for rec in e.store.list().await? {
            let active = matches!(
                rec.state,
                State::Starting
                    | State::Waiting
                    | State::Processing
                    | State::Reapplying
                    | State::Aborting
                    | State::Enrolling
            );
            let old = rec.started_at.is_some_and(|t| now.saturating_sub(t) > limit);
            let queued = pending.iter().any(|r| r.node == rec.uuid && r.kind == Kind::Timeout);
            if active && old && !queued {
                info!(node = %rec.uuid, "inspection timed out");
                e.store.enqueue(&rec.uuid, Kind::Timeout, serde_json::Value::Null).await?;
            }
        }
        Ok(())
    }
}
