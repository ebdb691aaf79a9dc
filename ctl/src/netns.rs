//! Entering a named network namespace (`ip netns` names, under `/run/netns`).

use std::fs::File;

use anyhow::Context as _;
use nix::sched::{CloneFlags, setns};

/// Moves the calling thread into the named namespace. Call it before any socket is opened and before any
/// other thread is started: sockets keep the namespace they were created in.
pub fn enter(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        anyhow::bail!("{name:?} is not a network namespace name");
    }
    let path = format!("/run/netns/{name}");
    let f = File::open(&path).with_context(|| format!("network namespace {name:?} not found ({path})"))?;
    setns(f, CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("cannot enter network namespace {name:?} (CAP_SYS_ADMIN needed)"))?;
    Ok(())
}
