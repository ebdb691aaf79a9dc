//! Errors of the dataplane. Each variant names one failure site; the cause is kept as `#[source]`.

use std::time::Duration;

use nix::errno::Errno;

use crate::model::ConfigError;

/// A dataplane operation failed. For batch operations this always means nothing changed in the kernel.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("invalid ruleset configuration")]
    Config(#[from] ConfigError),
    #[error("could not open a netlink socket to nf_tables (is CAP_NET_ADMIN held?)")]
    Open(#[source] Errno),
    #[error("could not size the netlink send buffer for a {bytes}-byte batch (SO_SNDBUFFORCE needs CAP_NET_ADMIN)")]
    SocketBuffer {
        bytes: usize,
        #[source]
        source: Errno,
    },
    #[error("sending a {bytes}-byte netlink message failed")]
    Send {
        bytes: usize,
        #[source]
        source: Errno,
    },
    #[error("reading netlink replies failed")]
    Recv(#[source] Errno),
    #[error("the kernel did not answer within {0:?}")]
    AckTimeout(Duration),
    #[error("the kernel rejected {object}: {errno}{}; the whole batch was rolled back, nothing changed",
        reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Rejected {
        /// The object of the batch the kernel refused, e.g. `add elements 2001..3000 to set inet ironguard deny_mac`.
        object: String,
        errno: Errno,
        /// The kernel's extended-ack message, when it gave one.
        reason: Option<String>,
    },
    #[error("a netlink query failed: {errno}{}", reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Query { errno: Errno, reason: Option<String> },
    #[error(
        "table inet {table} is owned by another process (netlink port {portid}); is another ironguard-agent running in this network namespace?"
    )]
    OwnedByOther { table: String, portid: u32 },
    #[error(
        "the running ironguard-agent (netlink port {portid}) holds the guard table, which differs from this configuration ({problems}); restart ironguard-agent to install the guard from the configuration"
    )]
    HeldDiffers { portid: u32, problems: String },
    #[error("malformed netlink data: {0}")]
    Decode(String),
    #[error("building a netlink object failed")]
    Build(#[from] rustables::error::BuilderError),
    #[error("the agent's table does not exist yet: apply a full state first")]
    NotInitialised,
    #[error("the ruleset kept changing while it was being read ({0} attempts)")]
    Unstable(u32),
    #[error("{what} failed")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    #[error("{0}")]
    Unsupported(String),
}
