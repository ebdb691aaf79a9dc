//! Node inspection: the ironic-inspector state machine run by a pool of workers over an at-least-once work queue.
//!
//! - [`machine`]: states, events, the transition table, strict and reentrant events.
//! - [`records`]: node records, queued requests, taken requests.
//! - [`store`]: the [`store::InspectionStore`] interface, embedded (redb) and etcd backends.
pub mod machine;
pub mod records;
pub mod store;
