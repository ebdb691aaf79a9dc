//! The fake Ironic's tests, one test binary: its API (`api`), the writes it records (`writes`) and the binary
//! itself (`binary`), each file beside this one a module.
mod api;
mod binary;
mod writes;
