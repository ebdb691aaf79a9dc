//! `ironguardctl` — the operator CLI.
//!
//! - [`cli`]: the command line, parsed and checked (MACs included) before anything runs.
//! - [`chains`]: `ironguardctl chains`, the kernel state of a host (works when the agent is dead: it reads over
//!   netlink) as text or JSON, ending with one verdict line.
//! - [`netns`]: `--netns NAME`, entering a named network namespace before anything else opens a socket.
//! - [`owner`]: from a table's owner netlink port id to the owning process, via `/proc`.
//! - [`controlplane`]: the gRPC connection to the control plane (`ironguard.v1.PxeFilter` and
//!   `ironguard.v1.Inspection`), with bounded waits and errors that name its URL.
//! - [`filters`]: `ironguardctl filters show|allow|deny|remove`, the requests and the rendering of the answers.
//! - [`agents`]: `ironguardctl agents`, the rendering of `ListAgents`.
//! - [`explain`]: `ironguardctl explain MAC`, the rendering of `ExplainMac` and, with `--local`, the kernel's own
//!   verdict for the MAC.
//! - [`inspect`]: `ironguardctl inspect start|status|list|abort|reapply|data|continue|wait`, the rendering of the
//!   `Inspection` answers and the check of `continue`'s document; [`inspect::wait`] is the polling loop of `wait`.
//! - [`rules`]: `ironguardctl rules import|list|show|delete`, the rules file and the rendering of the answers.
//! - [`table`]: the plain-text tables they print.
//!
//! Requests are built and answers rendered by plain functions ([`filters::update_request`],
//! [`filters::FilterStateReport::render`], [`agents::AgentsReport::render`], [`inspect::ListReport::render`], ...)
//! so they are tested without a server; `main` only connects, calls and prints.
#![forbid(unsafe_code)]

pub mod agents;
pub mod chains;
pub mod cli;
pub mod controlplane;
pub mod discovery;
pub mod explain;
pub mod filters;
pub mod inspect;
pub mod netns;
pub mod owner;
pub mod rules;
pub mod table;
