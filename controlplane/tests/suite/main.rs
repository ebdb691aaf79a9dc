//! The control plane's integration tests, in one test binary: the gRPC service and its authentication
//! (`grpc.rs`, `grpc_auth.rs`), inspections end to end over the fake Ironic (`inspection.rs`), the inspector API's
//! authentication and bounds (`inspector_auth.rs`), and the properties of the REST, gRPC and filter inputs
//! (`prop_api.rs`, `prop_filter.rs`). One binary instead of six: each compiled and linked the same generic code of
//! tokio, hyper, tonic and serde again (the build's largest units after the control plane itself).

mod site_support;

mod grpc;
mod grpc_auth;
mod inspection;
mod inspector_auth;
mod prop_api;
mod prop_filter;
