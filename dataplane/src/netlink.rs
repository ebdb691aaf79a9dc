//! The netlink transport: one socket, batches sent whole, every acknowledgement read, dumps parsed.
//!
//! The socket is `netlink-sys`'s; netlink framing (message headers, acknowledgements and errors, the end of a dump,
//! attributes) is read and written with `netlink-packet-core`. rustables builds the nf_tables messages of a batch;
//! it does not provide a long-lived socket (its `Batch::send` opens a new one per batch, which would make the
//! `owner` flag useless), nor socket buffers large enough for big batches, nor a way to tell which message of a
//! batch the kernel rejected. This module supplies those three things.
//!
//! Kept here rather than taken from a crate: the loop that reads a batch's acknowledgements. Neither netlink-sys
//! nor netlink-packet-core has one (netlink-proto's is asynchronous and matches one reply per request, where a
//! batch has one acknowledgement per message and the first rejection must name its message).
//!
//! The kernel processes an nf_tables batch only if it arrives in one `sendmsg`, so the send buffer is forced to
//! the batch size (`SO_SNDBUFFORCE`, which needs CAP_NET_ADMIN like every nf_tables write). Without that, batches
//! above ~208 KB (the default `wmem_max`) fail with `EMSGSIZE`.

use std::num::NonZeroI32;
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, DoneBuffer, Emitable, ErrorBuffer, NLA_HEADER_SIZE, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED,
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable, NlasIterator,
};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::errno::Errno;
use nix::sys::socket::{self, sockopt};
use nix::sys::time::TimeVal;

use crate::error::NftError;

pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;
pub(crate) const NFT_MSG_GETSET: u16 = 10;
pub(crate) const NFT_MSG_GETSETELEM: u16 = 13;
pub(crate) const NFT_MSG_GETGEN: u16 = 16;

/// `sizeof(struct nlmsghdr)`; netlink-packet-core checks it but does not export it.
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
/// `NLMSGERR_ATTR_MSG`: the extended acknowledgement's text.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// Receive buffer for acknowledgements: with `NETLINK_CAP_ACK` each is ~36 bytes, so this holds the acks of
/// far more messages than any batch we send.
const RCVBUF_BYTES: usize = 8 << 20;
/// How long to wait for the kernel to acknowledge a batch before giving up on the socket.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a read waits for the next datagram of a dump.
const DUMP_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest datagram read at once: a dump's datagrams are at most a few pages.
const DATAGRAM_BYTES: usize = 256 * 1024;

/// The errno of a failed socket call (netlink-sys reports `std::io::Error`).
pub(crate) fn errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn decode(e: netlink_packet_core::DecodeError) -> NftError {
    NftError::Decode(e.to_string())
}

/// A netlink socket to nf_tables, bound to a port the kernel picks; returns it with that port.
pub(crate) fn open_nftables() -> Result<(Socket, u32), NftError> {
    let open = |e: std::io::Error| NftError::Open(errno(&e));
    let mut sock = Socket::new(NETLINK_NETFILTER).map_err(open)?;
    let addr = sock.bind_auto().map_err(open)?;
    Ok((sock, addr.port_number()))
}

/// Asks for a receive buffer of `bytes`: forced (needs CAP_NET_ADMIN) or else what the sysctl allows.
pub(crate) fn size_rcvbuf(sock: &Socket, bytes: usize) {
    if socket::setsockopt(sock, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = socket::setsockopt(sock, sockopt::RcvBuf, &bytes);
    }
}

/// Makes reads of `sock` give up (`EAGAIN`) after `timeout`.
pub(crate) fn set_recv_timeout(sock: &Socket, timeout: Duration) -> Result<(), NftError> {
    let tv = TimeVal::new(timeout.as_secs() as i64, timeout.subsec_micros() as i64);
    socket::setsockopt(sock, sockopt::ReceiveTimeout, &tv).map_err(NftError::Open)
}

/// Reads one datagram into `buf` (its previous content is dropped).
pub(crate) fn recv_datagram(sock: &Socket, buf: &mut Vec<u8>, flags: libc::c_int) -> Result<(), Errno> {
    buf.clear();
    sock.recv(buf, flags).map(drop).map_err(|e| errno(&e))
}

/// A netlink socket to nf_tables. The socket that creates a table with the `owner` flag is the only one that
/// may change it, and the kernel deletes the table when this socket closes.
#[derive(Debug)]
pub(crate) struct NetlinkSocket {
    sock: Socket,
    portid: u32,
    sndbuf: usize,
    /// Where acknowledgements are read, kept between batches.
    buf: Vec<u8>,
}

impl NetlinkSocket {
    pub(crate) fn open() -> Result<Self, NftError> {
        let (sock, portid) = open_nftables()?;
        // Best effort: capped acks keep the receive buffer small, extended acks carry the kernel's reason.
        let _ = sock.set_cap_ack(true);
        let _ = sock.set_ext_ack(true);
        set_recv_timeout(&sock, ACK_TIMEOUT)?;
        size_rcvbuf(&sock, RCVBUF_BYTES);
        let sndbuf = socket::getsockopt(&sock, sockopt::SndBuf).unwrap_or(0);
        Ok(Self { sock, portid, sndbuf, buf: Vec::with_capacity(DATAGRAM_BYTES) })
    }

    /// The netlink port id the kernel assigned; it is what `nft list` shows as a table's owner.
    pub(crate) fn portid(&self) -> u32 {
        self.portid
    }

    fn ensure_sndbuf(&mut self, len: usize) -> Result<(), NftError> {
        // The kernel refuses a message larger than sk_sndbuf - 32; it doubles the value we set.
        let need = len + 64 * 1024;
        if self.sndbuf >= need {
            return Ok(());
        }
        let want = need.next_power_of_two() / 2;
        socket::setsockopt(&self.sock, sockopt::SndBufForce, &want)
            .map_err(|source| NftError::SocketBuffer { bytes: len, source })?;
        self.sndbuf = socket::getsockopt(&self.sock, sockopt::SndBuf).unwrap_or(0);
        if self.sndbuf < need {
            return Err(NftError::SocketBuffer { bytes: len, source: Errno::EMSGSIZE });
        }
        Ok(())
    }

    /// Drops anything left unread (for example acks of a batch that timed out), so that replies are never
    /// attributed to the wrong batch.
    fn drain(&mut self) {
        while recv_datagram(&self.sock, &mut self.buf, libc::MSG_DONTWAIT).is_ok() {
            if self.buf.is_empty() {
                break;
            }
        }
    }

    /// Sends a finalized rustables batch whose messages carry sequence numbers `1..=last_seq`, then reads every
    /// acknowledgement. Returns the first rejection, naming the object from `describe(seq)`.
    ///
    /// nf_tables applies a batch all or nothing: any rejection means nothing in it changed.
    pub(crate) fn send_batch(
        &mut self,
        bytes: &[u8],
        last_seq: u32,
        describe: &dyn Fn(u32) -> String,
    ) -> Result<(), NftError> {
        self.drain();
        self.ensure_sndbuf(bytes.len())?;
        let sent = self.sock.send(bytes, 0).map_err(|e| NftError::Send { bytes: bytes.len(), source: errno(&e) })?;
        if sent != bytes.len() {
            return Err(NftError::Send { bytes: bytes.len(), source: Errno::EMSGSIZE });
        }
        let mut pending = vec![true; last_seq as usize + 1];
        pending[0] = false;
        let mut outstanding = last_seq as usize;
        let mut first_error: Option<NftError> = None;
        while outstanding > 0 {
            match recv_datagram(&self.sock, &mut self.buf, 0) {
                Ok(()) => {}
                Err(Errno::EAGAIN) => return Err(first_error.unwrap_or(NftError::AckTimeout(ACK_TIMEOUT))),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(NftError::Recv(e)),
            }
            for msg in Messages::new(&self.buf) {
                let msg = msg?;
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let ack = parse_error(&msg)?;
                let seq = ack.seq as usize;
                if seq < pending.len() && pending[seq] {
                    pending[seq] = false;
                    outstanding -= 1;
                }
                if ack.errno != 0 && first_error.is_none() {
                    first_error = Some(NftError::Rejected {
                        object: describe(ack.seq),
                        errno: Errno::from_raw(ack.errno),
                        reason: ack.reason,
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// One netlink message of a datagram: its header's fields and its payload (after the 16-byte header).
#[derive(Debug)]
pub(crate) struct Message<'a> {
    pub ty: u16,
    pub flags: u16,
    /// `nlmsg_pid`: in a notification, the netlink port of the socket whose request caused it.
    pub portid: u32,
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// The nf_tables operation (low byte of the type) of an nf_tables message.
    #[cfg(test)]
    pub(crate) fn nft_op(&self) -> Option<u16> {
        (self.ty >> 8 == NFNL_SUBSYS_NFTABLES).then_some(self.ty & 0xff)
    }

    /// The attributes of an nf_tables message (after the nfgenmsg header).
    pub(crate) fn nft_attrs(&self) -> Result<Attrs<'_>, NftError> {
        let body = self
            .payload
            .get(NFGENMSG_LEN..)
            .ok_or_else(|| NftError::Decode("nf_tables message shorter than its nfgenmsg header".into()))?;
        Ok(Attrs::new(body))
    }
}

/// Iterates the netlink messages of one datagram. A message whose length does not fit ends the iteration with an
/// error; fewer bytes than a header after the last message end it quietly.
pub(crate) struct Messages<'a> {
    buf: &'a [u8],
}

impl<'a> Messages<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, NftError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let nl = match NetlinkBuffer::new_checked(self.buf) {
            Ok(nl) => nl,
            Err(e) => {
                self.buf = &[];
                return Some(Err(decode(e)));
            }
        };
        let msg = Message { ty: nl.message_type(), flags: nl.flags(), portid: nl.port_number(), payload: nl.payload() };
        let advance = align4(nl.length() as usize).min(self.buf.len());
        self.buf = &self.buf[advance..];
        Some(Ok(msg))
    }
}

/// An `NLMSG_ERROR` message: an acknowledgement (`errno` 0) or a rejection of the request numbered `seq`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ack {
    /// The positive errno, 0 for success.
    pub errno: i32,
    pub seq: u32,
    /// The kernel's extended-ack text, when it gave one.
    pub reason: Option<String>,
}

pub(crate) fn parse_error(msg: &Message<'_>) -> Result<Ack, NftError> {
    let err = ErrorBuffer::new_checked(msg.payload).map_err(decode)?;
    let errno = err.code().map_or(0, NonZeroI32::get).saturating_neg();
    // After the code, the header of the request being answered (its payload too unless the ack is capped), then
    // the extended-ack attributes.
    let echoed = err.payload();
    let orig = echoed.get(..NLMSG_HDRLEN).ok_or_else(|| NftError::Decode("short netlink error message".into()))?;
    // Not `new_checked`: in a capped ack the header's length is the whole request's, which is not echoed.
    let orig = NetlinkBuffer::new(orig);
    let seq = orig.sequence_number();
    let mut reason = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 {
        let echoed_len = if msg.flags & NLM_F_CAPPED != 0 { NLMSG_HDRLEN } else { align4(orig.length() as usize) };
        if let Some(tlvs) = echoed.get(echoed_len..) {
            for (ty, val) in Attrs::new(tlvs).flatten() {
                if ty == NLMSGERR_ATTR_MSG {
                    reason = Some(String::from_utf8_lossy(val).trim_end_matches('\0').to_string());
                }
            }
        }
    }
    Ok(Ack { errno, seq, reason })
}

pub(crate) const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Iterates netlink attributes: (type without the nested/byte-order flags, payload).
#[derive(Clone)]
pub(crate) struct Attrs<'a> {
    nlas: NlasIterator<&'a [u8]>,
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { nlas: NlasIterator::new(buf) }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), NftError>;

    fn next(&mut self) -> Option<Self::Item> {
        let nla = match self.nlas.next()? {
            Ok(nla) => nla,
            Err(e) => return Some(Err(decode(e))),
        };
        let (kind, len) = (nla.kind(), nla.length() as usize);
        // `NlaBuffer::value` borrows the buffer value; the bytes themselves live as long as the datagram.
        let value = nla.into_inner().get(NLA_HEADER_SIZE..len);
        Some(value.map(|v| (kind, v)).ok_or_else(|| NftError::Decode(format!("netlink attribute length {len}"))))
    }
}

/// Reads a big-endian u32 attribute value.
pub(crate) fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// Reads a big-endian u64 attribute value.
pub(crate) fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

/// Reads a NUL-terminated string attribute value.
pub(crate) fn string(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// The body of a get or dump request for nf_tables objects: the nfgenmsg header, then string attributes that
/// filter (table and set names).
#[derive(Debug)]
struct NftRequest {
    op: u16,
    family: u8,
    filter: Vec<DefaultNla>,
}

impl NetlinkSerializable for NftRequest {
    fn message_type(&self) -> u16 {
        NFNL_SUBSYS_NFTABLES << 8 | self.op
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN + self.filter.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // nfgenmsg: family, version 0 (NFNETLINK_V0), resource id 0.
        buffer[..NFGENMSG_LEN].copy_from_slice(&[self.family, 0, 0, 0]);
        self.filter.as_slice().emit(&mut buffer[NFGENMSG_LEN..]);
    }
}

/// Builds a dump (or get) request for nf_tables objects in `family`, with string attributes as filter.
fn request(op: u16, family: u8, dump: bool, filter: &[(u16, &str)]) -> Vec<u8> {
    let filter = filter
        .iter()
        .map(|(ty, s)| {
            let mut v = s.as_bytes().to_vec();
            v.push(0);
            DefaultNla::new(*ty, v)
        })
        .collect();
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
    header.sequence_number = 1;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(NftRequest { op, family, filter }));
    msg.finalize();
    let mut bytes = vec![0; msg.buffer_len()];
    msg.serialize(&mut bytes);
    bytes
}

/// Outcome of a dump: complete, or interrupted by a concurrent ruleset change (retry it).
pub(crate) enum Dumped {
    Complete,
    Interrupted,
}

/// A socket for reads. Reads never need the owner socket; any process with CAP_NET_ADMIN may dump.
#[derive(Debug)]
pub(crate) struct DumpSocket {
    sock: Socket,
}

impl DumpSocket {
    pub(crate) fn open() -> Result<Self, NftError> {
        let (sock, _) = open_nftables()?;
        set_recv_timeout(&sock, DUMP_TIMEOUT)?;
        size_rcvbuf(&sock, RCVBUF_BYTES);
        Ok(Self { sock })
    }

    /// Dumps objects of one kind, calling `each` for every nf_tables message received.
    pub(crate) fn dump(
        &self,
        op: u16,
        family: u8,
        filter: &[(u16, &str)],
        each: &mut dyn FnMut(&Message<'_>) -> Result<(), NftError>,
    ) -> Result<Dumped, NftError> {
        self.exchange(&request(op, family, true, filter), true, each)
    }

    /// The ruleset generation id: it changes with every committed transaction.
    pub(crate) fn generation(&self) -> Result<u32, NftError> {
        let mut gen_id = None;
        self.exchange(&request(NFT_MSG_GETGEN, 0, false, &[]), false, &mut |m| {
            for attr in m.nft_attrs()? {
                let (ty, v) = attr?;
                if ty == 1 {
                    gen_id = be_u32(v);
                }
            }
            Ok(())
        })?;
        gen_id.ok_or_else(|| NftError::Decode("no generation id in NFT_MSG_NEWGEN".into()))
    }

    fn exchange(
        &self,
        req: &[u8],
        dump: bool,
        each: &mut dyn FnMut(&Message<'_>) -> Result<(), NftError>,
    ) -> Result<Dumped, NftError> {
        self.sock.send(req, 0).map_err(|e| NftError::Send { bytes: req.len(), source: errno(&e) })?;
        let mut buf = Vec::with_capacity(DATAGRAM_BYTES);
        let mut interrupted = false;
        loop {
            match recv_datagram(&self.sock, &mut buf, 0) {
                Ok(()) => {}
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Err(NftError::AckTimeout(DUMP_TIMEOUT)),
                Err(e) => return Err(NftError::Recv(e)),
            }
            for msg in Messages::new(&buf) {
                let msg = msg?;
                if msg.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                match msg.ty {
                    NLMSG_DONE => {
                        // A dump that failed part-way says so in its end (the kernel allows an empty one).
                        let code = DoneBuffer::new_checked(msg.payload).map_or(0, |d| d.code());
                        if code < 0 {
                            return Err(NftError::Query {
                                errno: Errno::from_raw(code.saturating_neg()),
                                reason: None,
                            });
                        }
                        return Ok(if interrupted { Dumped::Interrupted } else { Dumped::Complete });
                    }
                    NLMSG_ERROR => {
                        let ack = parse_error(&msg)?;
                        if ack.errno != 0 {
                            return Err(NftError::Query { errno: Errno::from_raw(ack.errno), reason: ack.reason });
                        }
                        if !dump {
                            return Ok(Dumped::Complete);
                        }
                    }
                    // A dump's objects; or a plain get's one reply, followed by its acknowledgement.
                    _ => each(&msg)?,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_request_is_framed_as_the_kernel_expects() {
        let req = request(NFT_MSG_GETSETELEM, 1, true, &[(1, "ironguard"), (2, "allow_mac")]);
        // nlmsghdr, nfgenmsg, "ironguard\0" (4 + 10, padded to 16), "allow_mac\0" (4 + 10, padded to 16).
        assert_eq!(req.len(), 16 + 4 + 16 + 16);
        let msg = Messages::new(&req).next().unwrap().unwrap();
        assert_eq!(msg.ty, NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETSETELEM);
        assert_eq!(msg.flags, NLM_F_REQUEST | NLM_F_DUMP);
        assert_eq!(&msg.payload[..4], &[1, 0, 0, 0]);
        let attrs: Vec<(u16, String)> =
            msg.nft_attrs().unwrap().map(|a| a.unwrap()).map(|(t, v)| (t, string(v))).collect();
        assert_eq!(attrs, vec![(1, "ironguard".to_string()), (2, "allow_mac".to_string())]);
        // A get asks for an acknowledgement instead.
        let get = request(NFT_MSG_GETGEN, 0, false, &[]);
        assert_eq!(get.len(), 20);
        assert_eq!(Messages::new(&get).next().unwrap().unwrap().flags, NLM_F_REQUEST | NLM_F_ACK);
    }

    /// An `NLMSG_ERROR` as the kernel writes it with `NETLINK_CAP_ACK` and `NETLINK_EXT_ACK`.
    fn capped_nack(errno: i32, seq: u32, text: &str) -> Vec<u8> {
        let mut payload = (-errno).to_ne_bytes().to_vec();
        // The request's header: its length names its whole size (not echoed), then type, flags, seq, port.
        payload.extend_from_slice(&4096u32.to_ne_bytes());
        payload.extend_from_slice(&[0; 4]);
        payload.extend_from_slice(&seq.to_ne_bytes());
        payload.extend_from_slice(&[0; 4]);
        let mut text = text.as_bytes().to_vec();
        text.push(0);
        emit_to_vec(&DefaultNla::new(NLMSGERR_ATTR_MSG, text), &mut payload);
        let mut header = NetlinkHeader::default();
        header.message_type = NLMSG_ERROR;
        header.flags = NLM_F_CAPPED | NLM_F_ACK_TLVS;
        header.length = (NLMSG_HDRLEN + payload.len()) as u32;
        let mut bytes = vec![0; NLMSG_HDRLEN];
        header.emit(&mut bytes);
        bytes.extend_from_slice(&payload);
        bytes
    }

    fn emit_to_vec(e: &impl Emitable, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + e.buffer_len(), 0);
        e.emit(&mut out[at..]);
    }

    #[test]
    fn a_capped_rejection_names_its_request_and_the_kernels_reason() {
        let bytes = capped_nack(libc::ENOENT, 7, "Set not found");
        let msg = Messages::new(&bytes).next().unwrap().unwrap();
        let ack = parse_error(&msg).unwrap();
        assert_eq!(ack, Ack { errno: libc::ENOENT, seq: 7, reason: Some("Set not found".into()) });
        // Two in one datagram are both read.
        let two = [bytes.clone(), capped_nack(0, 8, "")].concat();
        let seqs: Vec<u32> = Messages::new(&two).map(|m| parse_error(&m.unwrap()).unwrap().seq).collect();
        assert_eq!(seqs, vec![7, 8]);
    }

    #[test]
    fn a_message_longer_than_its_datagram_is_refused() {
        let mut bytes = capped_nack(0, 1, "");
        bytes.truncate(bytes.len() - 4);
        assert!(matches!(Messages::new(&bytes).next(), Some(Err(NftError::Decode(_)))));
    }
}
