//! Node inspection: the ironic-inspector state machine run by a pool of workers over an at-least-once work queue.
//!
//! - [`machine`]: states, events, the transition table, strict and reentrant events.
//! - [`records`]: node records, queued requests, taken requests.
//! - [`store`]: the [`store::InspectionStore`] interface, embedded (redb) and etcd backends.
//! - [`engine`]: the public operations and the worker pool (lock, transition, task, consume).
//! - [`service`]: the `Inspection` gRPC service.
//! - [`periodic`]: singleton tasks: timeout, Ironic synchronisation, Ironic's own inspections, clean-up.
pub mod engine;
pub mod machine;
pub mod periodic;
pub mod records;
pub mod service;
pub mod store;
