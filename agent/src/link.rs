//! Provisioning-link awareness. A dnsmasq on a downed link still listens on udp/67, so the DHCP check alone would
//! keep a leader whose provisioning link is down (or lost its address) leading while nobody gets DHCP. The link
//! state is part of the agent's health: every configured interface must exist, be up and hold an IPv4 address.
//!
//! [`check`] reads that state (interfaces by name, so a recreated bridge is picked up again by itself); [`watch`]
//! subscribes to the kernel's link and address notifications (rtnetlink) and wakes the health check the moment
//! something changes, instead of at its next period.

use std::os::fd::AsRawFd as _;
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, sockopt};
use nix::sys::time::TimeVal;
use tokio::sync::mpsc;
use tracing::warn;

/// rtnetlink multicast groups: links, IPv4 and IPv6 addresses.
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// What is wrong with the provisioning links, in words (empty: all fine, or none configured).
pub fn check(interfaces: &[String]) -> Vec<String> {
    let addrs: Vec<(String, bool, bool)> = match nix::ifaddrs::getifaddrs() {
        Ok(it) => it
            .map(|a| {
                let v4 = a.address.as_ref().is_some_and(|s| s.as_sockaddr_in().is_some());
                let up = a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
                (a.interface_name, up, v4)
            })
            .collect(),
        Err(e) => return vec![format!("cannot list the interfaces: {e}")],
    };
    let mut problems = Vec::new();
    for name in interfaces {
        let mine: Vec<&(String, bool, bool)> = addrs.iter().filter(|(n, _, _)| n == name).collect();
        if mine.is_empty() {
            problems.push(format!("provisioning interface {name} does not exist"));
            continue;
        }
        let operstate = std::fs::read_to_string(format!("/sys/class/net/{name}/operstate")).unwrap_or_default();
        let operstate = operstate.trim();
        let admin_up = mine.iter().any(|(_, up, _)| *up);
        if !admin_up || !(operstate == "up" || operstate == "unknown") {
            problems.push(format!("provisioning interface {name} is down (operstate {operstate})"));
        } else if !mine.iter().any(|(_, _, v4)| *v4) {
            problems.push(format!("provisioning interface {name} has no IPv4 address"));
        }
    }
    problems
}

/// Sends `()` on `tx` whenever a link or an address of this network namespace changes (coalescing is the
/// receiver's business). Runs on a thread of its own until the receiver is gone.
pub fn watch(tx: mpsc::Sender<()>) {
    let spawned = std::thread::Builder::new().name("link-watch".into()).spawn(move || {
        let fd = match socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        ) {
            Ok(fd) => fd,
            Err(e) => {
                warn!(error = %e, "cannot open an rtnetlink socket; link changes are seen on the health period only");
                return;
            }
        };
        let groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
        if let Err(e) = socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups)) {
            warn!(error = %e, "cannot subscribe to link notifications; link changes are seen on the health period only");
            return;
        }
        let _ = socket::setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(1, 0));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                // A change (or lost changes: ENOBUFS): have the state read again.
                Ok(_) | Err(nix::errno::Errno::ENOBUFS) => {
                    if tx.try_send(()).is_err() && tx.is_closed() {
                        return;
                    }
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "reading link notifications failed");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the link watch thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_is_a_problem_and_no_interface_is_none() {
        assert!(check(&[]).is_empty());
        let p = check(&["ig-no-such-if0".to_string()]);
        assert_eq!(p, vec!["provisioning interface ig-no-such-if0 does not exist".to_string()]);
    }
}
