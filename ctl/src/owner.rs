//! Finds the process behind a netlink port id: `/proc/net/netlink` maps the port to a socket inode, and
//! `/proc/<pid>/fd` maps the inode to a process. Best effort: without the right to read other processes' fds the
//! answer is `None`, and the port id is still shown.
//!
//! One `ironguardctl chains` asks for the guard's holder and the agent table's owner, for each side it renders; on a
//! busy host (hundreds of processes, some with hundreds of descriptors) each walk of every `/proc/<pid>/fd` cost more
//! than the rest of the command. So one walk ([`Owners`]) answers every port id of a report, and it looks first at
//! the processes in the caller's network namespace (one `readlink` each), where the agent and the guard's holder
//! run; the other processes are walked only for a socket not found among those.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

/// The process holding the socket that owns the agent's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerProcess {
    pub pid: u32,
    pub command: String,
}

const NETLINK_NETFILTER: u32 = 12;

/// The holders of the netfilter netlink sockets of the caller's network namespace, found by one walk of `/proc` at
/// the first [`Owners::resolve`] and kept: a snapshot for one command's report, not a live view.
#[derive(Debug, Default)]
pub struct Owners {
    found: std::sync::OnceLock<HashMap<u32, OwnerProcess>>,
}

impl Owners {
    pub fn new() -> Self {
        Self::default()
    }

    /// The process holding netlink port `portid` (in the calling thread's network namespace at the first call).
    pub fn resolve(&self, portid: u32) -> Option<OwnerProcess> {
        self.found.get_or_init(|| walk().unwrap_or_default()).get(&portid).cloned()
    }
}

/// Resolves `portid` in the calling thread's network namespace (one walk of `/proc`; [`Owners`] keeps what a walk
/// found, for several port ids).
pub fn resolve(portid: u32) -> Option<OwnerProcess> {
    Owners::new().resolve(portid)
}

/// Every netfilter netlink socket of this namespace, and the process that holds each one.
fn walk() -> Option<HashMap<u32, OwnerProcess>> {
    let netns = std::fs::read_link("/proc/thread-self/ns/net").ok()?.to_string_lossy().into_owned();
    let mut owners = HashMap::new();
    let table = std::fs::read_to_string("/proc/self/net/netlink").ok()?;
    // "socket:[inode]" → port id
    let mut wanted: HashMap<String, u32> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let proto: u32 = f.get(1)?.parse().ok()?;
            let portid: u32 = f.get(2)?.parse().ok()?;
            (proto == NETLINK_NETFILTER && portid != 0).then(|| Some((format!("socket:[{}]", f.get(9)?), portid)))?
        })
        .collect();
    if wanted.is_empty() {
        return Some(owners);
    }
    let entries = std::fs::read_dir("/proc").ok()?;
    let pids: Vec<(u32, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().parse::<u32>().ok()?, e.path())))
        .collect();
    let same_netns = |dir: &Path| std::fs::read_link(dir.join("ns/net")).is_ok_and(|l| l.to_string_lossy() == netns);
    let (near, far): (Vec<_>, Vec<_>) = pids.into_iter().partition(|(_, dir)| same_netns(dir));
    for (pid, dir) in near.into_iter().chain(far) {
        if wanted.is_empty() {
            break;
        }
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            if let Some(portid) = wanted.remove(link.to_string_lossy().as_ref()) {
                let command = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
                owners.insert(portid, OwnerProcess { pid, command });
            }
        }
    }
    Some(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netfilter netlink socket of this process is found, with this process as its holder; asked again, the same
    /// resolver answers from its walk; a port id no socket has is nobody's.
    #[test]
    fn a_socket_of_this_process_is_found_as_held_by_it() {
        use nix::sys::socket::{
            AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, getsockname, socket,
        };
        use std::os::fd::AsRawFd;
        let sock =
            socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkNetFilter)
                .expect("a netfilter netlink socket");
        // Port id 0: the kernel picks one.
        bind(sock.as_raw_fd(), &NetlinkAddr::new(0, 0)).expect("bind");
        let got: NetlinkAddr = getsockname(sock.as_raw_fd()).expect("getsockname");
        assert_ne!(got.pid(), 0, "the kernel gave the socket a port id");
        let me = std::process::id();
        let owners = Owners::new();
        let first = owners.resolve(got.pid()).expect("the socket's holder");
        assert_eq!(first.pid, me);
        assert_eq!(owners.resolve(got.pid()), Some(first.clone()));
        assert_eq!(resolve(got.pid()), Some(first));
        assert_eq!(owners.resolve(u32::MAX), None);
        drop(sock);
    }
}
