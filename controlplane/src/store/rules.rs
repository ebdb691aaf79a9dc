//! Where ironic-inspector's introspection rules live. The store keeps each rule as the JSON the rules module
//! validated (it does not interpret them), with its uuid and creation time, and lists them in creation order —
//! the order in which rules apply.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// One stored rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRule {
    pub uuid: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
    /// The rule as `inspection::rules` serialises it.
    pub body: serde_json::Value,
}

/// Introspection rules, by uuid.
#[async_trait]
pub trait RuleStore: Send + Sync + 'static {
    /// Every rule, oldest first (ties by uuid).
    async fn list(&self) -> Result<Vec<StoredRule>, StoreError>;
    async fn get(&self, uuid: &str) -> Result<Option<StoredRule>, StoreError>;
    /// Adds a rule; `Ok(false)` if a rule with its uuid exists already (nothing changed).
    async fn create(&self, rule: &StoredRule) -> Result<bool, StoreError>;
    /// Deletes one rule; `Ok(false)` if there was none.
    async fn delete(&self, uuid: &str) -> Result<bool, StoreError>;
    /// Deletes every rule.
    async fn delete_all(&self) -> Result<usize, StoreError>;
}

/// Sorts rules into the order they apply in.
pub(crate) fn in_order(mut rules: Vec<StoredRule>) -> Vec<StoredRule> {
    rules.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.uuid.cmp(&b.uuid)));
    rules
}
