//! `ironguardctl` — the operator CLI.
//!
//! - [`chains`]: `ironguardctl chains`, the kernel state of a host (works when the agent is dead: it reads over
//!   netlink) as text or JSON, ending with one verdict line.
//! - [`netns`]: `--netns NAME`, entering a named network namespace before anything else opens a socket.
//! - [`owner`]: from a table's owner netlink port id to the owning process, via `/proc`.
#![forbid(unsafe_code)]

pub mod chains;
pub mod netns;
pub mod owner;
