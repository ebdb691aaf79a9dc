//! ironguardctl's integration tests, one test binary: against a control plane (`controlplane`) and `inspect`
//! (`inspect`), each file beside this one a module.
mod controlplane;
mod inspect;
