//! The embedded backend: one redb database in the control plane's data directory (`ironguard.redb`) holding the
//! filter state ([`filters`]), the inspections and their work queue ([`inspections`]) and the introspection rules
//! ([`rules`]). Used when no etcd is configured: one control plane, with persistent state.

pub mod filters;
pub mod inspections;
pub mod rules;

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::info;

pub use filters::EmbeddedFilters;
pub use inspections::EmbeddedInspections;
pub use rules::EmbeddedRules;

use super::{StoreError, Stores, embedded as backend};

/// The database file inside the data directory.
pub const DB_FILE: &str = "ironguard.redb";
/// Where earlier versions kept the inspections (moved into [`DB_FILE`] on first open).
const OLD_INSPECTIONS_FILE: &str = "inspections.redb";

/// Opens (or creates) the database in `dir` and every store in it, keeping the last `log_len` filter revisions.
pub fn open(dir: &Path, log_len: usize) -> Result<Stores, StoreError> {
    let path = dir.join(DB_FILE);
    let open_err = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| open_err(Box::new(e)))?;
    // The filter mirror serves every read; redb's page cache only needs to hold what a commit touches.
    let db = Arc::new(Database::builder().set_cache_size(8 << 20).create(&path).map_err(|e| open_err(Box::new(e)))?);
    let filters = EmbeddedFilters::open(db.clone(), &path, log_len)?;
    // Before the inspection store opens: it reads every node record into its cache.
    migrate_old_inspections(dir, &db)?;
    let inspections = EmbeddedInspections::open(db.clone())?;
    let rules = EmbeddedRules::open(db)?;
    Ok(Stores { filters: Arc::new(filters), inspections: Arc::new(inspections), rules: Arc::new(rules) })
}

/// Copies the inspections of an earlier version's separate `inspections.redb` into the one database, then renames
/// that file (`.migrated`), so nothing is lost across the upgrade and the copy is done once.
fn migrate_old_inspections(dir: &Path, db: &Database) -> Result<(), StoreError> {
    let old_path = dir.join(OLD_INSPECTIONS_FILE);
    if !old_path.exists() {
        return Ok(());
    }
    let old = Database::open(&old_path).map_err(backend("open the old inspections.redb"))?;
    let r = old.begin_read().map_err(backend("read the old inspections.redb"))?;
    let w = db.begin_write().map_err(backend("begin a transaction"))?;
    let mut copied = 0usize;
    {
        type Blobs = TableDefinition<'static, &'static str, &'static [u8]>;
        let str_tables: [(Blobs, Blobs); 2] =
            [(TableDefinition::new("nodes"), inspections::NODES), (TableDefinition::new("data"), inspections::DATA)];
        for (from, to) in str_tables {
            let Ok(src) = r.open_table(from) else { continue };
            let mut dst = w.open_table(to).map_err(backend("open a table"))?;
            for row in src.iter().map_err(backend("read the old inspections"))? {
                let (k, v) = row.map_err(backend("read the old inspections"))?;
                dst.insert(k.value(), v.value()).map_err(backend("copy the old inspections"))?;
                copied += 1;
            }
        }
        if let Ok(src) = r.open_table(TableDefinition::<u64, &[u8]>::new("queue")) {
            let mut dst = w.open_table(inspections::QUEUE).map_err(backend("open a table"))?;
            for row in src.iter().map_err(backend("read the old queue"))? {
                let (k, v) = row.map_err(backend("read the old queue"))?;
                dst.insert(k.value(), v.value()).map_err(backend("copy the old queue"))?;
                copied += 1;
            }
        }
        if let Ok(src) = r.open_table(TableDefinition::<&str, u64>::new("meta")) {
            let mut dst = w.open_table(inspections::META).map_err(backend("open a table"))?;
            for row in src.iter().map_err(backend("read the old meta"))? {
                let (k, v) = row.map_err(backend("read the old meta"))?;
                dst.insert(k.value(), v.value()).map_err(backend("copy the old meta"))?;
            }
        }
    }
    w.commit().map_err(backend("commit the migrated inspections"))?;
    drop(r);
    drop(old);
    let done = old_path.with_extension("redb.migrated");
    std::fs::rename(&old_path, &done).map_err(backend("rename the old inspections.redb"))?;
    info!(records = copied, from = %old_path.display(), "inspections moved into the control plane's database");
    Ok(())
}

/// The filter store alone, in a database of its own in `dir` (tests).
#[cfg(test)]
pub(crate) fn filters_in(dir: &Path, log_len: usize) -> EmbeddedFilters {
    #[allow(clippy::expect_used)]
    std::fs::create_dir_all(dir).expect("create the test directory");
    #[allow(clippy::expect_used)]
    let db = Arc::new(Database::create(dir.join(DB_FILE)).expect("create the test database"));
    #[allow(clippy::expect_used)]
    EmbeddedFilters::open(db, &dir.join(DB_FILE), log_len).expect("open the test filter store")
}
