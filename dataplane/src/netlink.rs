//! The netlink transport: one socket, batches sent whole, every acknowledgement read, dumps parsed.
//!
//! rustables builds the messages; it does not provide a long-lived socket (its `Batch::send` opens a new one per
//! batch, which would make the `owner` flag useless), nor socket buffers large enough for big batches, nor a way to
//! tell which message of a batch the kernel rejected. This module supplies those three things.
//!
//! The kernel processes an nf_tables batch only if it arrives in one `sendmsg`, so the send buffer is forced to
//! the batch size (`SO_SNDBUFFORCE`, which needs CAP_NET_ADMIN like every nf_tables write). Without that, batches
//! above ~208 KB (the default `wmem_max`) fail with `EMSGSIZE`.
#![allow(unsafe_code)] // setsockopt for options nix does not wrap (NETLINK_CAP_ACK, NETLINK_EXT_ACK)

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, sockopt};
use nix::sys::time::TimeVal;

use crate::error::NftError;

pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;
pub(crate) const NFT_MSG_GETSET: u16 = 10;
pub(crate) const NFT_MSG_GETSETELEM: u16 = 13;
pub(crate) const NFT_MSG_GETGEN: u16 = 16;

const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;

/// Receive buffer for acknowledgements: with `NETLINK_CAP_ACK` each is ~36 bytes, so this holds the acks of
/// far more messages than any batch we send.
const RCVBUF_BYTES: usize = 8 << 20;
/// How long to wait for the kernel to acknowledge a batch before giving up on the socket.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// A netlink socket to nf_tables. The socket that creates a table with the `owner` flag is the only one that
/// may change it, and the kernel deletes the table when this socket closes.
#[derive(Debug)]
pub(crate) struct NetlinkSocket {
    fd: OwnedFd,
    portid: u32,
    sndbuf: usize,
}

impl NetlinkSocket {
    pub(crate) fn open() -> Result<Self, NftError> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(NftError::Open)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(NftError::Open)?;
        let addr: NetlinkAddr = socket::getsockname(fd.as_raw_fd()).map_err(NftError::Open)?;
        // Best effort: capped acks keep the receive buffer small, extended acks carry the kernel's reason.
        set_int_opt(&fd, NETLINK_CAP_ACK, 1);
        set_int_opt(&fd, NETLINK_EXT_ACK, 1);
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(ACK_TIMEOUT.as_secs() as i64, 0))
            .map_err(NftError::Open)?;
        let mut s = Self { fd, portid: addr.pid(), sndbuf: 0 };
        // Forced buffers need CAP_NET_ADMIN; fall back to what the sysctl allows (small batches still work).
        if socket::setsockopt(&s.fd, sockopt::RcvBufForce, &RCVBUF_BYTES).is_err() {
            let _ = socket::setsockopt(&s.fd, sockopt::RcvBuf, &RCVBUF_BYTES);
        }
        s.sndbuf = socket::getsockopt(&s.fd, sockopt::SndBuf).unwrap_or(0);
        Ok(s)
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
        socket::setsockopt(&self.fd, sockopt::SndBufForce, &want)
            .map_err(|source| NftError::SocketBuffer { bytes: len, source })?;
        self.sndbuf = socket::getsockopt(&self.fd, sockopt::SndBuf).unwrap_or(0);
        if self.sndbuf < need {
            return Err(NftError::SocketBuffer { bytes: len, source: Errno::EMSGSIZE });
        }
        Ok(())
    }

    /// Drops anything left unread (for example acks of a batch that timed out), so that replies are never
    /// attributed to the wrong batch.
    fn drain(&self) {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            if n == 0 {
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
        let sent = socket::send(self.fd.as_raw_fd(), bytes, MsgFlags::empty())
            .map_err(|source| NftError::Send { bytes: bytes.len(), source })?;
        if sent != bytes.len() {
            return Err(NftError::Send { bytes: bytes.len(), source: Errno::EMSGSIZE });
        }
        let mut pending = vec![true; last_seq as usize + 1];
        pending[0] = false;
        let mut outstanding = last_seq as usize;
        let mut first_error: Option<NftError> = None;
        let mut buf = vec![0u8; 256 * 1024];
        while outstanding > 0 {
            let n = match socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => {
                    return Err(first_error.unwrap_or(NftError::AckTimeout(ACK_TIMEOUT)));
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(NftError::Recv(e)),
            };
            for msg in Messages::new(&buf[..n]) {
                let msg = msg?;
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let (errno, seq, reason) = parse_error(&msg)?;
                let seq = seq as usize;
                if seq < pending.len() && pending[seq] {
                    pending[seq] = false;
                    outstanding -= 1;
                }
                if errno != 0 && first_error.is_none() {
                    first_error = Some(NftError::Rejected {
                        object: describe(seq as u32),
                        errno: Errno::from_raw(errno),
                        reason,
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

fn set_int_opt(fd: &OwnedFd, opt: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: `fd` is a valid open socket for the duration of the call; the option value is a plain c_int whose
    // address and size are passed correctly.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            SOL_NETLINK,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// One parsed netlink message header and its payload (after the 16-byte header).
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

/// Iterates the netlink messages of one datagram.
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
        let len = u32::from_ne_bytes(self.buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > self.buf.len() {
            self.buf = &[];
            return Some(Err(NftError::Decode(format!("netlink message length {len} out of bounds"))));
        }
        let msg = Message {
            ty: u16::from_ne_bytes([self.buf[4], self.buf[5]]),
            flags: u16::from_ne_bytes([self.buf[6], self.buf[7]]),
            portid: u32::from_ne_bytes([self.buf[12], self.buf[13], self.buf[14], self.buf[15]]),
            payload: &self.buf[NLMSG_HDRLEN..len],
        };
        let advance = align4(len).min(self.buf.len());
        self.buf = &self.buf[advance..];
        Some(Ok(msg))
    }
}

pub(crate) fn parse_error(msg: &Message<'_>) -> Result<(i32, u32, Option<String>), NftError> {
    let p = msg.payload;
    if p.len() < 4 + NLMSG_HDRLEN {
        return Err(NftError::Decode("short netlink error message".into()));
    }
    let errno = -i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
    let orig = &p[4..4 + NLMSG_HDRLEN];
    let seq = u32::from_ne_bytes([orig[8], orig[9], orig[10], orig[11]]);
    let mut reason = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 {
        // With NETLINK_CAP_ACK the original payload is not echoed, so the TLVs follow the header directly.
        let orig_len = u32::from_ne_bytes([orig[0], orig[1], orig[2], orig[3]]) as usize;
        let capped = msg.flags & 0x100 != 0;
        let tlv_start = 4 + if capped { NLMSG_HDRLEN } else { align4(orig_len) };
        if let Some(tlvs) = p.get(tlv_start..) {
            for (ty, val) in Attrs::new(tlvs).flatten() {
                if ty == NLMSGERR_ATTR_MSG {
                    reason = Some(String::from_utf8_lossy(val).trim_end_matches('\0').to_string());
                }
            }
        }
    }
    Ok((errno, seq, reason))
}

pub(crate) const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Iterates netlink attributes: (type without the nested/byte-order flags, payload).
#[derive(Clone)]
pub(crate) struct Attrs<'a> {
    buf: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), NftError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.buf[0], self.buf[1]]) as usize;
        let ty = u16::from_ne_bytes([self.buf[2], self.buf[3]]) & 0x3fff;
        if len < 4 || len > self.buf.len() {
            self.buf = &[];
            return Some(Err(NftError::Decode(format!("netlink attribute length {len} out of bounds"))));
        }
        let val = &self.buf[4..len];
        let advance = align4(len).min(self.buf.len());
        self.buf = &self.buf[advance..];
        Some(Ok((ty, val)))
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

/// Builds a dump (or get) request for nf_tables objects in `family`, with string attributes as filter.
fn request(op: u16, family: u8, dump: bool, attrs: &[(u16, &str)]) -> Vec<u8> {
    let mut body = vec![family, 0, 0, 0];
    for (ty, s) in attrs {
        let len = 4 + s.len() + 1;
        body.extend_from_slice(&(len as u16).to_ne_bytes());
        body.extend_from_slice(&ty.to_ne_bytes());
        body.extend_from_slice(s.as_bytes());
        body.push(0);
        body.resize(align4(body.len()), 0);
    }
    let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
    let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
    msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&(NFNL_SUBSYS_NFTABLES << 8 | op).to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// Outcome of a dump: complete, or interrupted by a concurrent ruleset change (retry it).
pub(crate) enum Dumped {
    Complete,
    Interrupted,
}

/// A socket for reads. Reads never need the owner socket; any process with CAP_NET_ADMIN may dump.
#[derive(Debug)]
pub(crate) struct DumpSocket {
    fd: OwnedFd,
}

impl DumpSocket {
    pub(crate) fn open() -> Result<Self, NftError> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(NftError::Open)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(NftError::Open)?;
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(10, 0)).map_err(NftError::Open)?;
        if socket::setsockopt(&fd, sockopt::RcvBufForce, &RCVBUF_BYTES).is_err() {
            let _ = socket::setsockopt(&fd, sockopt::RcvBuf, &RCVBUF_BYTES);
        }
        Ok(Self { fd })
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
        socket::send(self.fd.as_raw_fd(), req, MsgFlags::empty())
            .map_err(|source| NftError::Send { bytes: req.len(), source })?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut interrupted = false;
        loop {
            let n = match socket::recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Err(NftError::AckTimeout(Duration::from_secs(10))),
                Err(e) => return Err(NftError::Recv(e)),
            };
            for msg in Messages::new(&buf[..n]) {
                let msg = msg?;
                if msg.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                match msg.ty {
                    NLMSG_DONE => {
                        return Ok(if interrupted { Dumped::Interrupted } else { Dumped::Complete });
                    }
                    NLMSG_ERROR => {
                        let (errno, _, reason) = parse_error(&msg)?;
                        if errno != 0 {
                            return Err(NftError::Query { errno: Errno::from_raw(errno), reason });
                        }
                        if !dump {
                            return Ok(Dumped::Complete);
                        }
                    }
                    _ => {
                        each(&msg)?;
                        if !dump && msg.flags & NLM_F_MULTI == 0 {
                            // A plain get: the reply, then an ack we read above.
                            continue;
                        }
                    }
                }
            }
        }
    }
}
