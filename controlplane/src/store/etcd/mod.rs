//! The etcd backend, shared by control-plane replicas: the filter state ([`filters`], under `<prefix>/filter/`),
//! the inspections and their work queue ([`inspections`], under `<prefix>/inspect/`) and the introspection rules
//! ([`rules`], under `<prefix>/rules/`), all through one etcd connection.

pub mod filters;
pub mod inspections;
mod queue;
pub mod rules;

use std::sync::Arc;

use ironguard_coord::etcd::EtcdCoordinator;

pub use filters::EtcdFilters;
pub use inspections::EtcdInspections;
pub use rules::EtcdRules;

use super::{StoreError, Stores};

/// Opens every store on the connection `coord`, keeping the last `log_len` filter revisions in memory.
pub async fn open(coord: EtcdCoordinator, log_len: usize) -> Result<Stores, StoreError> {
    let filters = EtcdFilters::open(coord.clone(), log_len).await?;
    let inspections = EtcdInspections::new(coord.clone());
    let rules = EtcdRules::new(coord);
    Ok(Stores { filters: Arc::new(filters), inspections: Arc::new(inspections), rules: Arc::new(rules) })
}
