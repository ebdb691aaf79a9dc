//! Finds the process behind a netlink port id: `/proc/net/netlink` maps the port to a socket inode, and
//! `/proc/<pid>/fd` maps the inode to a process. Best effort: without the right to read other processes' fds the
//! answer is `None`, and the port id is still shown.

use serde::Serialize;

/// The process holding the socket that owns the agent's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerProcess {
    pub pid: u32,
    pub command: String,
}

const NETLINK_NETFILTER: u32 = 12;

/// Resolves `portid` in the calling thread's network namespace.
pub fn resolve(portid: u32) -> Option<OwnerProcess> {
    let table = std::fs::read_to_string("/proc/self/net/netlink").ok()?;
    let inode = table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let proto: u32 = f.get(1)?.parse().ok()?;
        let pid: u32 = f.get(2)?.parse().ok()?;
        (proto == NETLINK_NETFILTER && pid == portid).then(|| f.get(9).map(|s| s.to_string()))?
    })?;
    let needle = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == needle) {
                let command = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_string();
                return Some(OwnerProcess { pid, command });
            }
        }
    }
    None
}
