//! Node inspection as a service: the engine that runs the pure domain of [`ironguard_inspection`] (state machine,
//! lookup, processing hooks, rules) with a pool of workers over an at-least-once work queue.
//!
//! - [`callbacks`]: the last callbacks by MAC, accepted or refused, for `explain --timeline`.
//! - [`engine`]: the public operations and the worker pool (lock, transition, task, consume).
//! - [`service`]: the `Inspection` gRPC service.
//! - [`periodic`]: singleton tasks: timeout, Ironic synchronisation, Ironic's own inspections, clean-up.
//! - [`process`]: the processing task that runs the hooks and the rules and writes the result to Ironic.
//!
//! The inspections' records, data and work queue live in [`crate::store`], with the filter state and the rules.
pub mod callbacks;
pub mod engine;
pub mod periodic;
pub mod process;
pub mod service;
