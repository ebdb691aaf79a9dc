//! Which interface holds an address on a link of this host: the link-layer addresses in this host's neighbour
//! table (ARP for IPv4, NDP for IPv6) for one IP address, read with an rtnetlink dump (no privilege needed).
//!
//! The control plane ties a ramdisk's callback to the node's own interfaces with it (`[inspection]
//! callback_source`, docs/security.md): a TCP connection from an address on the link made this host resolve that
//! address before it answered, so the entry names the interface that holds it.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

use crate::{MacAddr, NftError};

/// At most this many reply datagrams are read for one dump (a neighbour table of some hundred thousand entries):
/// a kernel that never ends its dump cannot hold the caller for ever.
const MAX_DATAGRAMS: usize = 10_000;

/// The MACs of this host's usable neighbour entries for `ip` (reachable, stale, delayed, being probed or
/// permanent; an IPv4-mapped IPv6 address is looked up as IPv4). Empty: `ip` is not on a link of this host
/// (behind a router or a proxy), or it has no resolved entry.
pub fn neighbour_macs(ip: IpAddr) -> Result<Vec<MacAddr>, NftError> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let io = |what: &str| {
        let what = what.to_string();
        move |source: std::io::Error| NftError::Io { what: format!("the neighbour table: {what}"), source }
    };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io("rtnetlink socket"))?;
    socket.bind_auto().map_err(io("bind"))?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io("connect"))?;
    let mut request = NeighbourMessage::default();
    request.header.family = match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    let mut msg = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(request));
    msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.header.sequence_number = 1;
    msg.finalize();
    let mut bytes = vec![0; msg.buffer_len()];
    msg.serialize(&mut bytes);
    socket.send(&bytes, 0).map_err(io("send the dump request"))?;
    let mut found = Vec::new();
    for _ in 0..MAX_DATAGRAMS {
        let (data, _) = socket.recv_from_full().map_err(io("read the dump"))?;
        let mut at = 0;
        while at < data.len() {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[at..])
                .map_err(|e| NftError::Decode(format!("a neighbour message: {e}")))?;
            let len = msg.header.length as usize;
            if len == 0 {
                return Err(NftError::Decode("a neighbour message of length 0".into()));
            }
            at += len.next_multiple_of(4);
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) => {
                    return Err(NftError::Decode(format!("the kernel refused the neighbour dump: {e:?}")));
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                    if let Some(mac) = entry_mac(&n, ip).filter(|m| !found.contains(m)) {
                        found.push(mac);
                    }
                }
                _ => {}
            }
        }
    }
    Err(NftError::Decode(format!("the neighbour dump did not end within {MAX_DATAGRAMS} datagrams")))
}

/// The MAC of a usable neighbour entry for `ip`.
fn entry_mac(n: &NeighbourMessage, ip: IpAddr) -> Option<MacAddr> {
    let usable = matches!(
        n.header.state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
    );
    if !usable {
        return None;
    }
    let dest = n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })?;
    if dest != ip {
        return None;
    }
    n.attributes
        .iter()
        .find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(l) => <[u8; 6]>::try_from(l.as_slice()).ok(),
            _ => None,
        })
        .and_then(|octets| MacAddr::from_octets(octets).ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(state: NeighbourState, dest: IpAddr, lladdr: Option<[u8; 6]>) -> NeighbourMessage {
        let mut n = NeighbourMessage::default();
        n.header.state = state;
        n.attributes.push(NeighbourAttribute::Destination(match dest {
            IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
            IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
        }));
        if let Some(l) = lladdr {
            n.attributes.push(NeighbourAttribute::LinkLayerAddress(l.to_vec()));
        }
        n
    }

    /// Only a usable entry for the address asked about names a MAC: not a failed or incomplete one, not another
    /// address's, not one without a link-layer address or with a multicast one.
    #[test]
    fn only_usable_entries_for_the_address_name_a_mac() {
        let ip: IpAddr = "10.77.0.50".parse().unwrap();
        let mac = [0x52, 0x54, 0, 0x50, 0, 0x0a];
        let want = MacAddr::from_octets(mac).ok();
        for state in [NeighbourState::Reachable, NeighbourState::Stale, NeighbourState::Delay, NeighbourState::Probe] {
            assert_eq!(entry_mac(&entry(state, ip, Some(mac)), ip), want, "{state:?}");
        }
        for state in [NeighbourState::Failed, NeighbourState::Incomplete, NeighbourState::Noarp] {
            assert_eq!(entry_mac(&entry(state, ip, Some(mac)), ip), None, "{state:?}");
        }
        let other: IpAddr = "10.77.0.51".parse().unwrap();
        assert_eq!(entry_mac(&entry(NeighbourState::Reachable, other, Some(mac)), ip), None);
        assert_eq!(entry_mac(&entry(NeighbourState::Reachable, ip, None), ip), None);
        let multicast = [0x01, 0, 0x5e, 0, 0, 1];
        assert_eq!(entry_mac(&entry(NeighbourState::Reachable, ip, Some(multicast)), ip), None);
    }

    /// The real kernel's table answers a dump in this process's namespace: loopback has no neighbour entry.
    #[test]
    fn the_kernel_answers_a_dump_and_loopback_is_no_neighbour() {
        assert_eq!(neighbour_macs("127.0.0.1".parse().unwrap()).unwrap(), vec![]);
        assert_eq!(neighbour_macs("::1".parse().unwrap()).unwrap(), vec![]);
    }
}
