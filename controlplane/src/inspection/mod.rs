//! Node inspection: the ironic-inspector state machine run by a pool of workers over an at-least-once work queue.
//!
//! - [`machine`]: states, events, the transition table, strict and reentrant events.
//! - [`records`]: node records, queued requests, taken requests.
//! - [`engine`]: the public operations and the worker pool (lock, transition, task, consume).
//! - [`service`]: the `Inspection` gRPC service.
//! - [`periodic`]: singleton tasks: timeout, Ironic synchronisation, Ironic's own inspections, clean-up.
//!
//! The inspections' records, data and work queue live in [`crate::store`], with the filter state and the rules.
pub mod engine;
pub mod machine;
pub mod periodic;
pub mod records;
pub mod service;
