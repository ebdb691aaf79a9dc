//! The etcd rule store: `<prefix>/rules/<uuid>` → stored rule (JSON), shared by every replica.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use ironguard_coord::etcd::EtcdCoordinator;

use crate::store::rules::{RuleStore, StoredRule, in_order};
use crate::store::{Backend, StoreError, etcd as backend};

/// Rules in etcd.
pub struct EtcdRules {
    c: EtcdCoordinator,
    root: String,
}

impl std::fmt::Debug for EtcdRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRules").field("root", &self.root).finish()
    }
}

impl EtcdRules {
    pub fn new(c: EtcdCoordinator) -> Self {
        let root = c.full("rules/");
        Self { c, root }
    }

    fn key(&self, uuid: &str) -> String {
        format!("{}{uuid}", self.root)
    }
}

fn decode(v: &[u8]) -> Result<StoredRule, StoreError> {
    serde_json::from_slice(v).map_err(|e| StoreError::corrupt(Backend::Etcd, format!("rule: {e}")))
}

#[async_trait]
impl RuleStore for EtcdRules {
    async fn list(&self) -> Result<Vec<StoredRule>, StoreError> {
        let root = self.root.clone();
        let r = self
            .c
            .retry("list rules", |mut cl| {
                let root = root.clone();
                async move { cl.get(root, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(backend("list rules"))?;
        let rules = r.kvs().iter().map(|kv| decode(kv.value())).collect::<Result<Vec<_>, _>>()?;
        Ok(in_order(rules))
    }

    async fn get(&self, uuid: &str) -> Result<Option<StoredRule>, StoreError> {
        let k = self.key(uuid);
        let r = self
            .c
            .retry("read a rule", |mut cl| {
                let k = k.clone();
                async move { cl.get(k, None).await }
            })
            .await
            .map_err(backend("read a rule"))?;
        r.kvs().first().map(|kv| decode(kv.value())).transpose()
    }

    async fn create(&self, rule: &StoredRule) -> Result<bool, StoreError> {
        let k = self.key(&rule.uuid);
        let v = serde_json::to_vec(rule).map_err(|e| StoreError::corrupt(Backend::Etcd, e.to_string()))?;
        let r = self
            .c
            .retry("store a rule", |mut cl| {
                let txn = Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k.clone(), v.clone(), None)]);
                async move { cl.txn(txn).await }
            })
            .await
            .map_err(backend("store a rule"))?;
        Ok(r.succeeded())
    }

    async fn delete(&self, uuid: &str) -> Result<bool, StoreError> {
        let k = self.key(uuid);
        let r = self
            .c
            .retry("delete a rule", |mut cl| {
                let k = k.clone();
                async move { cl.delete(k, None).await }
            })
            .await
            .map_err(backend("delete a rule"))?;
        Ok(r.deleted() > 0)
    }

    async fn delete_all(&self) -> Result<usize, StoreError> {
        let root = self.root.clone();
        let r = self
            .c
            .retry("delete the rules", |mut cl| {
                let root = root.clone();
                async move { cl.delete(root, Some(DeleteOptions::new().with_prefix())).await }
            })
            .await
            .map_err(backend("delete the rules"))?;
        Ok(r.deleted() as usize)
    }
}
