//! DHCPv4 on the wire as the storm's clients write and read it: whole Ethernet frames (IPv4, UDP, BOOTP with the
//! options a PXE ROM sends), the replies of a server, and the ARP requests a server sends before it unicasts to a
//! renewing client. Pure functions: a frame in, a message out; anything that is not for a client is `None`.

use std::net::Ipv4Addr;

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;
/// op … file: the fixed part of a BOOTP message.
const BOOTP_FIXED: usize = 236;
/// BOOTP messages are padded to at least this size (RFC 951; some servers drop shorter ones).
const BOOTP_MIN: usize = 300;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// The broadcast bit of BOOTP's `flags`: the server must broadcast its reply (the client has no address yet).
const FLAG_BROADCAST: u16 = 0x8000;

const OPT_PAD: u8 = 0;
const OPT_REQUESTED_IP: u8 = 50;
const OPT_MESSAGE_TYPE: u8 = 53;
const OPT_SERVER_ID: u8 = 54;
const OPT_PARAMETER_LIST: u8 = 55;
const OPT_MAX_MESSAGE_SIZE: u8 = 57;
const OPT_VENDOR_CLASS: u8 = 60;
const OPT_CLIENT_ARCH: u8 = 93;
const OPT_CLIENT_NDI: u8 = 94;
const OPT_CLIENT_UUID: u8 = 97;
const OPT_END: u8 = 255;

/// The DHCP message types (option 53) the storm uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Discover,
    Offer,
    Request,
    Ack,
    Nak,
    Release,
}

impl MessageType {
    fn code(self) -> u8 {
        match self {
            MessageType::Discover => 1,
            MessageType::Offer => 2,
            MessageType::Request => 3,
            MessageType::Ack => 5,
            MessageType::Nak => 6,
            MessageType::Release => 7,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            _ => return None,
        })
    }
}

/// A message a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientMessage {
    pub kind: MessageType,
    pub mac: [u8; 6],
    pub xid: u32,
    /// Seconds since the client began this acquisition or renewal.
    pub secs: u16,
    /// The client's address, when it has one (renewing, rebinding, releasing).
    pub ciaddr: Option<Ipv4Addr>,
    /// Option 50: the offered address a selecting client asks for.
    pub requested: Option<Ipv4Addr>,
    /// Option 54: the server a selecting or releasing client talks to.
    pub server_id: Option<Ipv4Addr>,
    /// Sent to this server (its address and MAC) instead of broadcast: renewing and releasing clients.
    pub unicast_to: Option<(Ipv4Addr, [u8; 6])>,
}

impl ClientMessage {
    fn base(kind: MessageType, mac: [u8; 6], xid: u32, secs: u16) -> Self {
        Self { kind, mac, xid, secs, ciaddr: None, requested: None, server_id: None, unicast_to: None }
    }

    /// A DISCOVER, broadcast.
    pub fn discover(mac: [u8; 6], xid: u32, secs: u16) -> Self {
        Self::base(MessageType::Discover, mac, xid, secs)
    }

    /// A selecting client's REQUEST for `ip` offered by `server`, broadcast.
    pub fn select(mac: [u8; 6], xid: u32, secs: u16, server: Ipv4Addr, ip: Ipv4Addr) -> Self {
        Self { requested: Some(ip), server_id: Some(server), ..Self::base(MessageType::Request, mac, xid, secs) }
    }

    /// A renewing client's REQUEST (RFC 2131 4.3.2: `ciaddr`, no server identifier), unicast to the server that
    /// leased it.
    pub fn renew(mac: [u8; 6], xid: u32, secs: u16, ip: Ipv4Addr, server: (Ipv4Addr, [u8; 6])) -> Self {
        Self { ciaddr: Some(ip), unicast_to: Some(server), ..Self::base(MessageType::Request, mac, xid, secs) }
    }

    /// A rebinding client's REQUEST: as renewing, but broadcast to whichever server answers.
    pub fn rebind(mac: [u8; 6], xid: u32, secs: u16, ip: Ipv4Addr) -> Self {
        Self { ciaddr: Some(ip), ..Self::base(MessageType::Request, mac, xid, secs) }
    }

    /// A RELEASE of `ip`, unicast to the server that leased it.
    pub fn release(mac: [u8; 6], xid: u32, ip: Ipv4Addr, server: (Ipv4Addr, [u8; 6])) -> Self {
        Self {
            ciaddr: Some(ip),
            server_id: Some(server.0),
            unicast_to: Some(server),
            ..Self::base(MessageType::Release, mac, xid, 0)
        }
    }

    /// The whole Ethernet frame: from the client's own MAC, to the server or to everyone.
    pub fn frame(&self) -> Vec<u8> {
        let bootp = self.bootp();
        let (dst_mac, dst_ip) = match self.unicast_to {
            Some((ip, mac)) => (mac, ip),
            None => (BROADCAST_MAC, Ipv4Addr::BROADCAST),
        };
        let src_ip = self.ciaddr.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let mut f = Vec::with_capacity(ETH_LEN + IP_LEN + UDP_LEN + bootp.len());
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(&ipv4_header(src_ip, dst_ip, UDP_LEN + bootp.len()));
        let udp_len = (UDP_LEN + bootp.len()) as u16;
        let mut udp = Vec::with_capacity(udp_len as usize);
        udp.extend_from_slice(&CLIENT_PORT.to_be_bytes());
        udp.extend_from_slice(&SERVER_PORT.to_be_bytes());
        udp.extend_from_slice(&udp_len.to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(&bootp);
        let sum = udp_checksum(src_ip, dst_ip, &udp);
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&udp);
        f
    }

    /// The BOOTP message with its options, padded to [`BOOTP_MIN`].
    fn bootp(&self) -> Vec<u8> {
        let mut b = vec![0u8; BOOTP_FIXED];
        b[0] = 1; // BOOTREQUEST
        b[1] = 1; // Ethernet
        b[2] = 6;
        b[4..8].copy_from_slice(&self.xid.to_be_bytes());
        b[8..10].copy_from_slice(&self.secs.to_be_bytes());
        // Firmware has no address to receive a unicast on: it asks for broadcast replies. A client with an address
        // (renewing, rebinding, releasing) does not (RFC 2131 4.1).
        if self.ciaddr.is_none() {
            b[10..12].copy_from_slice(&FLAG_BROADCAST.to_be_bytes());
        }
        if let Some(ip) = self.ciaddr {
            b[12..16].copy_from_slice(&ip.octets());
        }
        b[28..34].copy_from_slice(&self.mac);
        b.extend_from_slice(&MAGIC_COOKIE);
        b.extend_from_slice(&[OPT_MESSAGE_TYPE, 1, self.kind.code()]);
        if let Some(ip) = self.requested {
            b.extend_from_slice(&[OPT_REQUESTED_IP, 4]);
            b.extend_from_slice(&ip.octets());
        }
        if let Some(ip) = self.server_id {
            b.extend_from_slice(&[OPT_SERVER_ID, 4]);
            b.extend_from_slice(&ip.octets());
        }
        if self.kind != MessageType::Release {
            // What a PXE ROM sends (PXE 2.1, RFC 4578): its largest message, its architecture (x64 UEFI), its
            // network interface (UNDI 3.16), a machine UUID and the PXEClient vendor class.
            b.extend_from_slice(&[OPT_MAX_MESSAGE_SIZE, 2, 0x04, 0xec]);
            b.extend_from_slice(&[OPT_PARAMETER_LIST, 12, 1, 3, 6, 12, 15, 28, 43, 54, 60, 66, 67, 97]);
            b.extend_from_slice(&[OPT_CLIENT_ARCH, 2, 0, 7]);
            b.extend_from_slice(&[OPT_CLIENT_NDI, 3, 1, 3, 16]);
            b.extend_from_slice(&[OPT_CLIENT_UUID, 17, 0]);
            b.extend_from_slice(&uuid_of(self.mac));
            let class = b"PXEClient:Arch:00007:UNDI:003016";
            b.extend_from_slice(&[OPT_VENDOR_CLASS, class.len() as u8]);
            b.extend_from_slice(class);
        }
        b.push(OPT_END);
        if b.len() < BOOTP_MIN {
            b.resize(BOOTP_MIN, OPT_PAD);
        }
        b
    }
}

/// A machine UUID made from its MAC (stable per client, distinct between clients).
fn uuid_of(mac: [u8; 6]) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..4].copy_from_slice(b"stor");
    u[10..].copy_from_slice(&mac);
    u
}

fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, payload: usize) -> [u8; IP_LEN] {
    let mut h = [0u8; IP_LEN];
    h[0] = 0x45;
    h[1] = 0x10; // low delay, as dhclient and most ROMs set it
    h[2..4].copy_from_slice(&((IP_LEN + payload) as u16).to_be_bytes());
    h[8] = 64; // TTL
    h[9] = 17; // UDP
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&[&h]);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

/// The UDP checksum over the IPv4 pseudo-header and `udp` (header with a zero checksum, then the payload).
fn udp_checksum(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> u16 {
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = 17;
    pseudo[10..12].copy_from_slice(&(udp.len() as u16).to_be_bytes());
    match checksum(&[&pseudo, udp]) {
        // A computed 0 is sent as all ones (0 means "no checksum").
        0 => 0xffff,
        s => s,
    }
}

/// The Internet checksum (RFC 1071) of the concatenated parts (each of even length but the last).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A server's reply to a client, as read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub kind: MessageType,
    pub xid: u32,
    /// The client it is for.
    pub chaddr: [u8; 6],
    /// The address offered or acknowledged (0.0.0.0 in a NAK).
    pub yiaddr: Ipv4Addr,
    /// Option 54, or the IP source when the option is missing.
    pub server: Ipv4Addr,
    /// The Ethernet source: where a renewing client unicasts.
    pub server_mac: [u8; 6],
}

/// An ARP request: who has `target`? Tell `sender_ip` at `sender_mac`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRequest {
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target: Ipv4Addr,
}

/// What a frame seen on the clients' link is to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    Reply(Reply),
    Arp(ArpRequest),
}

/// Reads a frame: a DHCP reply (BOOTREPLY to port 68 with a message type) or an ARP request; `None` for
/// anything else, including every frame the clients send themselves and every malformed one.
pub fn parse(frame: &[u8]) -> Option<Incoming> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    match ethertype {
        ETHERTYPE_IPV4 => parse_reply(frame).map(Incoming::Reply),
        ETHERTYPE_ARP => parse_arp(frame).map(Incoming::Arp),
        _ => None,
    }
}

fn octets<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

fn ip_at(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    octets::<4>(b, at).map(Ipv4Addr::from)
}

fn parse_reply(frame: &[u8]) -> Option<Reply> {
    let server_mac = octets::<6>(frame, 6)?;
    let ip = frame.get(ETH_LEN..)?;
    let (version, ihl) = (ip.first()? >> 4, usize::from(ip.first()? & 0x0f) * 4);
    if version != 4 || ihl < IP_LEN || *ip.get(9)? != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes(octets::<2>(ip, 2)?));
    let ip = ip.get(..total.max(ihl))?;
    let src = ip_at(ip, 12)?;
    let udp = ip.get(ihl..)?;
    if u16::from_be_bytes(octets::<2>(udp, 2)?) != CLIENT_PORT {
        return None;
    }
    let bootp = udp.get(UDP_LEN..)?;
    if *bootp.first()? != 2 || *bootp.get(2)? != 6 || octets::<4>(bootp, BOOTP_FIXED)? != MAGIC_COOKIE {
        return None;
    }
    let xid = u32::from_be_bytes(octets::<4>(bootp, 4)?);
    let yiaddr = ip_at(bootp, 16)?;
    let chaddr = octets::<6>(bootp, 28)?;
    let (mut kind, mut server) = (None, None);
    let mut opts = bootp.get(BOOTP_FIXED + 4..)?;
    while let Some((&code, rest)) = opts.split_first() {
        match code {
            OPT_PAD => {
                opts = rest;
                continue;
            }
            OPT_END => break,
            _ => {}
        }
        let (&len, rest) = rest.split_first()?;
        let value = rest.get(..usize::from(len))?;
        match (code, value) {
            (OPT_MESSAGE_TYPE, [t]) => kind = MessageType::from_code(*t),
            (OPT_SERVER_ID, [a, b, c, d]) => server = Some(Ipv4Addr::new(*a, *b, *c, *d)),
            _ => {}
        }
        opts = rest.get(usize::from(len)..)?;
    }
    let kind = kind?;
    matches!(kind, MessageType::Offer | MessageType::Ack | MessageType::Nak).then_some(Reply {
        kind,
        xid,
        chaddr,
        yiaddr,
        server: server.unwrap_or(src),
        server_mac,
    })
}

fn parse_arp(frame: &[u8]) -> Option<ArpRequest> {
    let a = frame.get(ETH_LEN..)?;
    // Ethernet / IPv4, 6 / 4, request.
    if octets::<8>(a, 0)? != [0, 1, 8, 0, 6, 4, 0, 1] {
        return None;
    }
    Some(ArpRequest { sender_mac: octets::<6>(a, 8)?, sender_ip: ip_at(a, 14)?, target: ip_at(a, 24)? })
}

/// The reply to `req` from the client that holds its target address: `mac`.
pub fn arp_reply(req: &ArpRequest, mac: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_LEN + 28);
    f.extend_from_slice(&req.sender_mac);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&req.target.octets());
    f.extend_from_slice(&req.sender_mac);
    f.extend_from_slice(&req.sender_ip.octets());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x50, 0, 0, 7, 1];
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 1);
    const SERVER_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];

    /// A server's reply frame as dnsmasq sends one (broadcast, option 54 first, padded).
    fn reply_frame(kind: u8, xid: u32, chaddr: [u8; 6], yiaddr: Ipv4Addr, server_id: Option<Ipv4Addr>) -> Vec<u8> {
        let mut b = vec![0u8; BOOTP_FIXED];
        b[0] = 2;
        b[1] = 1;
        b[2] = 6;
        b[4..8].copy_from_slice(&xid.to_be_bytes());
        b[16..20].copy_from_slice(&yiaddr.octets());
        b[28..34].copy_from_slice(&chaddr);
        b.extend_from_slice(&MAGIC_COOKIE);
        if let Some(s) = server_id {
            b.extend_from_slice(&[OPT_SERVER_ID, 4]);
            b.extend_from_slice(&s.octets());
        }
        b.extend_from_slice(&[OPT_PAD, OPT_PAD, OPT_MESSAGE_TYPE, 1, kind, 51, 4, 0, 0, 14, 16, OPT_END]);
        b.resize(BOOTP_MIN, 0);
        let mut f = Vec::new();
        f.extend_from_slice(&BROADCAST_MAC);
        f.extend_from_slice(&SERVER_MAC);
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(&ipv4_header(SERVER, Ipv4Addr::BROADCAST, UDP_LEN + b.len()));
        f.extend_from_slice(&SERVER_PORT.to_be_bytes());
        f.extend_from_slice(&CLIENT_PORT.to_be_bytes());
        f.extend_from_slice(&((UDP_LEN + b.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&b);
        f
    }

    #[test]
    fn a_discover_is_a_broadcast_pxe_request_from_the_clients_own_mac() {
        let f = ClientMessage::discover(MAC, 0xdead_beef, 4).frame();
        assert_eq!(&f[0..6], &BROADCAST_MAC);
        assert_eq!(&f[6..12], &MAC, "Ethernet source is the client's MAC (the guard matches it)");
        let ip = &f[ETH_LEN..];
        assert_eq!(checksum(&[&ip[..IP_LEN]]), 0, "IPv4 header checksum");
        assert_eq!(&ip[12..16], &[0, 0, 0, 0]);
        assert_eq!(&ip[16..20], &[255; 4]);
        let udp = &ip[IP_LEN..];
        assert_eq!(usize::from(u16::from_be_bytes([udp[4], udp[5]])), udp.len());
        let mut pseudo = [0u8; 12];
        pseudo[4..8].copy_from_slice(&[255; 4]);
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&(udp.len() as u16).to_be_bytes());
        assert_eq!(checksum(&[&pseudo, udp]), 0, "UDP checksum");
        let b = &udp[UDP_LEN..];
        assert!(b.len() >= BOOTP_MIN);
        assert_eq!(u32::from_be_bytes([b[4], b[5], b[6], b[7]]), 0xdead_beef);
        assert_eq!(u16::from_be_bytes([b[8], b[9]]), 4, "secs");
        assert_eq!(u16::from_be_bytes([b[10], b[11]]), FLAG_BROADCAST);
        assert_eq!(&b[28..34], &MAC, "chaddr (the guard's chaddr match reads it)");
        let opts = &b[BOOTP_FIXED + 4..];
        assert_eq!(&opts[..3], &[OPT_MESSAGE_TYPE, 1, 1]);
        let text = String::from_utf8_lossy(opts);
        assert!(text.contains("PXEClient:Arch:00007"), "vendor class");
        // None of the clients' own frames reads as a reply.
        assert_eq!(parse(&f), None);
    }

    #[test]
    fn a_selecting_request_names_the_server_and_the_address() {
        let ip = Ipv4Addr::new(10, 80, 1, 9);
        let f = ClientMessage::select(MAC, 7, 0, SERVER, ip).frame();
        let b = &f[ETH_LEN + IP_LEN + UDP_LEN..];
        let opts = &b[BOOTP_FIXED + 4..];
        assert_eq!(&opts[..13], &[OPT_MESSAGE_TYPE, 1, 3, OPT_REQUESTED_IP, 4, 10, 80, 1, 9, OPT_SERVER_ID, 4, 10, 80]);
        assert_eq!(&b[12..16], &[0; 4], "no ciaddr while selecting");
        assert_eq!(parse(&f), None);
    }

    #[test]
    fn renewing_and_releasing_are_unicast_from_the_clients_address() {
        let ip = Ipv4Addr::new(10, 80, 1, 9);
        for m in [
            ClientMessage::renew(MAC, 7, 3, ip, (SERVER, SERVER_MAC)),
            ClientMessage::release(MAC, 8, ip, (SERVER, SERVER_MAC)),
        ] {
            let f = m.frame();
            assert_eq!(&f[0..6], &SERVER_MAC);
            assert_eq!(&f[ETH_LEN + 12..ETH_LEN + 16], &ip.octets(), "IP source");
            assert_eq!(&f[ETH_LEN + 16..ETH_LEN + 20], &SERVER.octets(), "IP destination");
            let b = &f[ETH_LEN + IP_LEN + UDP_LEN..];
            assert_eq!(&b[12..16], &ip.octets(), "ciaddr");
            assert_eq!(&b[10..12], &[0, 0], "no broadcast flag with an address");
        }
        let f = ClientMessage::rebind(MAC, 9, 12, ip).frame();
        assert_eq!(&f[0..6], &BROADCAST_MAC);
        assert_eq!(&f[ETH_LEN + 16..ETH_LEN + 20], &[255; 4]);
    }

    #[test]
    fn replies_are_read_with_their_server() {
        let ip = Ipv4Addr::new(10, 80, 1, 9);
        let f = reply_frame(2, 42, MAC, ip, Some(SERVER));
        let want = Reply {
            kind: MessageType::Offer,
            xid: 42,
            chaddr: MAC,
            yiaddr: ip,
            server: SERVER,
            server_mac: SERVER_MAC,
        };
        assert_eq!(parse(&f), Some(Incoming::Reply(want)));
        // No option 54: the IP source names the server.
        let Some(Incoming::Reply(r)) = parse(&reply_frame(5, 42, MAC, ip, None)) else { panic!("an ACK") };
        assert_eq!((r.kind, r.server), (MessageType::Ack, SERVER));
        let Some(Incoming::Reply(r)) = parse(&reply_frame(6, 42, MAC, Ipv4Addr::UNSPECIFIED, Some(SERVER))) else {
            panic!("a NAK")
        };
        assert_eq!(r.kind, MessageType::Nak);
    }

    #[test]
    fn malformed_frames_are_nothing_and_never_panic() {
        let good = reply_frame(2, 42, MAC, Ipv4Addr::new(10, 80, 1, 9), Some(SERVER));
        // Every truncation, and every single byte flipped: no panic; truncated inside the options, nothing.
        for len in 0..good.len() {
            let _ = parse(&good[..len]);
        }
        for at in 0..good.len() {
            let mut f = good.clone();
            f[at] ^= 0xff;
            let _ = parse(&f);
        }
        assert_eq!(parse(&good[..ETH_LEN + IP_LEN + UDP_LEN + BOOTP_FIXED + 2]), None);
        // An option running past the end.
        let mut f = good.clone();
        let opts = ETH_LEN + IP_LEN + UDP_LEN + BOOTP_FIXED + 4;
        f.truncate(opts);
        f.extend_from_slice(&[OPT_MESSAGE_TYPE, 9, 2]);
        assert_eq!(parse(&f), None);
        // A request (op 1) or another message type is no reply.
        assert_eq!(parse(&reply_frame(1, 42, MAC, Ipv4Addr::UNSPECIFIED, Some(SERVER))), None);
    }

    #[test]
    fn arp_requests_are_answered_for_the_client_that_holds_the_address() {
        let ip = Ipv4Addr::new(10, 80, 1, 9);
        let req = ArpRequest { sender_mac: SERVER_MAC, sender_ip: SERVER, target: ip };
        let mut f = Vec::new();
        f.extend_from_slice(&BROADCAST_MAC);
        f.extend_from_slice(&SERVER_MAC);
        f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&SERVER_MAC);
        f.extend_from_slice(&SERVER.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&ip.octets());
        assert_eq!(parse(&f), Some(Incoming::Arp(req)));
        let r = arp_reply(&req, MAC);
        assert_eq!(&r[0..6], &SERVER_MAC);
        assert_eq!(&r[6..12], &MAC);
        assert_eq!(&r[ETH_LEN + 6..ETH_LEN + 8], &[0, 2], "a reply");
        assert_eq!(&r[ETH_LEN + 14..ETH_LEN + 18], &ip.octets(), "the client's address");
        // A reply is not a request.
        assert_eq!(parse(&r), None);
    }
}
