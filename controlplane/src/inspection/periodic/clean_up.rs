//! `clean-up`: finished inspections older than `[inspection] clean_up_after_secs` are forgotten.

use std::sync::Arc;

use async_trait::async_trait;
use ironguard_inspection::machine::State;
use ironguard_proto::time::now_ms;
use tracing::info;

use super::Task;
use crate::inspection::engine::Engine;
use crate::store::Fence;

#[derive(Debug)]
pub(super) struct CleanUp {
    engine: Arc<Engine>,
}

impl CleanUp {
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

#[async_trait]
impl Task for CleanUp {
    async fn run(&self, _fence: &Fence) -> anyhow::Result<()> {
        let e = &self.engine;
        let limit = e.cfg.clean_up_after_secs * 1000;
        let now = now_ms();
        for rec in e.store.list().await? {
            let done = matches!(rec.state, State::Finished | State::Error);
            if done && rec.finished_at.is_some_and(|t| now.saturating_sub(t) > limit) {
                e.store.remove(&rec.uuid).await?;
                info!(node = %rec.uuid, "old inspection data removed");
            }
        }
        Ok(())
    }
}
