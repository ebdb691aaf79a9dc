//! Provisioning-link awareness. A dnsmasq on a downed link still listens on udp/67, so the DHCP check alone would
//! keep a leader whose provisioning link is down (or lost its address) leading while nobody gets DHCP. The link
//! state is part of the agent's health: every configured interface must exist, be up and hold an IPv4 address.
//!
//! [`check`] reads that state (interfaces by name, so a recreated bridge is picked up again by itself); [`watch`]
//! subscribes to the kernel's link and address notifications (rtnetlink, through a netlink-sys socket on the tokio
//! runtime, decoded with netlink-packet-route) and wakes the health check the moment something changes, instead of
//! at its next period.

use std::time::Duration;

use netlink_packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::LinkAttribute;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// rtnetlink multicast groups (`RTMGRP_*` in `linux/rtnetlink.h`): links, IPv4 and IPv6 addresses.
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
/// The largest notification datagram read at once (a link message with all its statistics is a few KB).
const DATAGRAM_BYTES: usize = 64 * 1024;

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
/// receiver's business). Runs as a task of the current tokio runtime until the receiver is gone; without a
/// runtime or a socket it warns, and link changes are then seen on the health period only.
pub fn watch(tx: mpsc::Sender<()>) {
    if tokio::runtime::Handle::try_current().is_err() {
        warn!("no tokio runtime to watch link notifications on; link changes are seen on the health period only");
        return;
    }
    let socket = match subscribe() {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to link notifications; link changes are seen on the health period only");
            return;
        }
    };
    tokio::spawn(async move {
        let mut buf = Vec::with_capacity(DATAGRAM_BYTES);
        loop {
            buf.clear();
            let received = tokio::select! {
                r = socket.recv(&mut buf) => r,
                () = tx.closed() => return,
            };
            let wake = match received {
                Ok(()) => changes(&buf),
                // Lost notifications: anything may have changed, so have the state read again.
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOBUFS as i32) => true,
                Err(e) => {
                    warn!(error = %e, "reading link notifications failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    false
                }
            };
            if wake {
                let _ = tx.try_send(());
            }
        }
    });
}

/// A non-blocking rtnetlink socket, registered with the current runtime, in the link and address groups.
fn subscribe() -> std::io::Result<TokioSocket> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
    socket.socket_mut().bind(&SocketAddr::new(0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))?;
    Ok(socket)
}

/// Whether a datagram of rtnetlink notifications reports a change of a link or an address (each is logged at
/// debug level). A message that does not decode counts as a change: reading the state again costs little, and a
/// missed change keeps a leader whose link is down leading until the next period.
fn changes(datagram: &[u8]) -> bool {
    let mut changed = false;
    let mut rest = datagram;
    while !rest.is_empty() {
        let len = match NetlinkBuffer::new_checked(rest) {
            Ok(b) => b.length() as usize,
            Err(e) => {
                debug!(error = %e, "undecodable rtnetlink notification");
                return true;
            }
        };
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len]) {
            Ok(msg) => {
                if let Some(change) = describe(&msg.payload) {
                    debug!(change, "link notification");
                    changed = true;
                }
            }
            Err(e) => {
                debug!(error = %e, "undecodable rtnetlink notification");
                changed = true;
            }
        }
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    changed
}

/// A link or address change in words, e.g. `link br0 (index 4) changed`; `None` for anything else.
fn describe(payload: &NetlinkPayload<RouteNetlinkMessage>) -> Option<String> {
    let NetlinkPayload::InnerMessage(msg) = payload else { return None };
    let link = |verb: &str, m: &netlink_packet_route::link::LinkMessage| {
        let name = m.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.as_str()),
            _ => None,
        });
        format!("link {} (index {}) {verb}", name.unwrap_or("?"), m.header.index)
    };
    Some(match msg {
        RouteNetlinkMessage::NewLink(m) => link("changed", m),
        RouteNetlinkMessage::DelLink(m) => link("removed", m),
        RouteNetlinkMessage::NewAddress(m) => format!("address added on index {}", m.header.index),
        RouteNetlinkMessage::DelAddress(m) => format!("address removed from index {}", m.header.index),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use netlink_packet_core::{NLMSG_DONE, NetlinkHeader};
    use netlink_packet_route::address::AddressMessage;
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::route::RouteMessage;

    fn datagram(messages: Vec<RouteNetlinkMessage>) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            let mut m = NetlinkMessage::from(m);
            m.finalize();
            let at = out.len();
            out.resize(at + m.buffer_len(), 0);
            m.serialize(&mut out[at..]);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out
    }

    #[test]
    fn link_and_address_notifications_wake_the_check_and_others_do_not() {
        let mut up = LinkMessage::default();
        up.header.index = 4;
        up.attributes.push(LinkAttribute::IfName("br0".into()));
        let gone = up.clone();
        assert_eq!(
            describe(&NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(gone.clone()))).as_deref(),
            Some("link br0 (index 4) removed")
        );
        assert!(changes(&datagram(vec![RouteNetlinkMessage::NewLink(up)])));
        let mut addr = AddressMessage::default();
        addr.header.index = 4;
        assert!(changes(&datagram(vec![RouteNetlinkMessage::DelAddress(addr)])));
        // A route change alone (not a group we join, but the filter must not depend on that) wakes nothing, and
        // a change after it in the same datagram is still seen.
        let route = RouteNetlinkMessage::NewRoute(RouteMessage::default());
        assert!(!changes(&datagram(vec![route.clone()])));
        assert!(changes(&datagram(vec![route, RouteNetlinkMessage::DelLink(gone)])));
        let mut done = NetlinkMessage::<RouteNetlinkMessage>::new(
            NetlinkHeader::default(),
            NetlinkPayload::Done(netlink_packet_core::DoneMessage::default()),
        );
        done.finalize();
        let mut bytes = vec![0; done.buffer_len()];
        done.serialize(&mut bytes);
        assert_eq!(done.header.message_type, NLMSG_DONE);
        assert!(!changes(&bytes));
    }

    #[test]
    fn undecodable_notifications_wake_the_check() {
        assert!(changes(&[1, 2, 3]));
        let mut truncated = datagram(vec![RouteNetlinkMessage::NewLink(LinkMessage::default())]);
        truncated.truncate(truncated.len() - 4);
        assert!(changes(&truncated));
    }

    #[test]
    fn a_missing_interface_is_a_problem_and_no_interface_is_none() {
        assert!(check(&[]).is_empty());
        let p = check(&["ig-no-such-if0".to_string()]);
        assert_eq!(p, vec!["provisioning interface ig-no-such-if0 does not exist".to_string()]);
    }
}
