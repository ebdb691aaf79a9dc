//! The embedded rule store: one table of the control plane's redb database, uuid → stored rule (JSON).

use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::store::rules::{RuleStore, StoredRule, in_order};
use crate::store::{Backend, StoreError, embedded as backend};

const RULES: TableDefinition<&str, &[u8]> = TableDefinition::new("rules");

/// Rules in redb.
pub struct EmbeddedRules {
    db: Arc<Database>,
}

impl std::fmt::Debug for EmbeddedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedRules").finish_non_exhaustive()
    }
}

impl EmbeddedRules {
    /// Creates the table in the control plane's database if it is not there yet.
    pub fn open(db: Arc<Database>) -> Result<Self, StoreError> {
        let w = db.begin_write().map_err(backend("begin a transaction"))?;
        w.open_table(RULES).map_err(backend("open the rules table"))?;
        w.commit().map_err(backend("commit"))?;
        Ok(Self { db })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(backend("run a store task"))?
    }
}

fn decode(v: &[u8]) -> Result<StoredRule, StoreError> {
    serde_json::from_slice(v).map_err(|e| StoreError::corrupt(Backend::Embedded, format!("rule: {e}")))
}

#[async_trait]
impl RuleStore for EmbeddedRules {
    async fn list(&self) -> Result<Vec<StoredRule>, StoreError> {
        self.blocking(|db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(RULES).map_err(backend("open the rules table"))?;
            let mut out = Vec::new();
            for row in t.iter().map_err(backend("list rules"))? {
                let (_, v) = row.map_err(backend("read a rule"))?;
                out.push(decode(v.value())?);
            }
            Ok(in_order(out))
        })
        .await
    }

    async fn get(&self, uuid: &str) -> Result<Option<StoredRule>, StoreError> {
        let uuid = uuid.to_string();
        self.blocking(move |db| {
            let r = db.begin_read().map_err(backend("begin a read"))?;
            let t = r.open_table(RULES).map_err(backend("open the rules table"))?;
            t.get(uuid.as_str()).map_err(backend("read a rule"))?.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn create(&self, rule: &StoredRule) -> Result<bool, StoreError> {
        let rule = rule.clone();
        self.blocking(move |db| {
            let bytes = serde_json::to_vec(&rule).map_err(|e| StoreError::corrupt(Backend::Embedded, e.to_string()))?;
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            let created = {
                let mut t = w.open_table(RULES).map_err(backend("open the rules table"))?;
                if t.get(rule.uuid.as_str()).map_err(backend("read a rule"))?.is_some() {
                    false
                } else {
                    t.insert(rule.uuid.as_str(), bytes.as_slice()).map_err(backend("store a rule"))?;
                    true
                }
            };
            w.commit().map_err(backend("commit a rule"))?;
            Ok(created)
        })
        .await
    }

    async fn delete(&self, uuid: &str) -> Result<bool, StoreError> {
        let uuid = uuid.to_string();
        self.blocking(move |db| {
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            let existed = {
                let mut t = w.open_table(RULES).map_err(backend("open the rules table"))?;
                t.remove(uuid.as_str()).map_err(backend("delete a rule"))?.is_some()
            };
            w.commit().map_err(backend("commit"))?;
            Ok(existed)
        })
        .await
    }

    async fn delete_all(&self) -> Result<usize, StoreError> {
        self.blocking(|db| {
            let w = db.begin_write().map_err(backend("begin a transaction"))?;
            let n = {
                let t = w.open_table(RULES).map_err(backend("open the rules table"))?;
                t.len().map_err(backend("count the rules"))? as usize
            };
            w.delete_table(RULES).map_err(backend("delete the rules"))?;
            w.open_table(RULES).map_err(backend("open the rules table"))?;
            w.commit().map_err(backend("commit"))?;
            Ok(n)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rules_survive_a_reopen_in_creation_order() {
        let d = std::env::temp_dir().join(format!("ig-rules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let rule = |uuid: &str, at: u64| StoredRule {
            uuid: uuid.into(),
            created_at: at,
            body: serde_json::json!({"uuid": uuid}),
        };
        {
            let s = EmbeddedRules::open(Arc::new(Database::create(d.join("r.redb")).unwrap())).unwrap();
            assert!(s.create(&rule("b", 2)).await.unwrap());
            assert!(s.create(&rule("a", 3)).await.unwrap());
            assert!(s.create(&rule("c", 1)).await.unwrap());
            assert!(!s.create(&rule("c", 9)).await.unwrap(), "a uuid once");
        }
        let s = EmbeddedRules::open(Arc::new(Database::create(d.join("r.redb")).unwrap())).unwrap();
        let order: Vec<String> = s.list().await.unwrap().into_iter().map(|r| r.uuid).collect();
        assert_eq!(order, ["c", "b", "a"]);
        assert!(s.delete("b").await.unwrap());
        assert!(!s.delete("b").await.unwrap());
        assert_eq!(s.get("a").await.unwrap().unwrap().created_at, 3);
        assert!(s.delete_all().await.unwrap() > 0);
        assert!(s.list().await.unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
