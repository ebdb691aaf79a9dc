//! Change notifications: a netlink socket subscribed to nf_tables' multicast group (`NFNLGRP_NFTABLES`), which the
//! kernel tells about every committed change of every table, with the netlink port of the socket that made it.
//! The agent uses it to repair the guard the moment another process deletes, flushes or alters it (measured on
//! this kernel: the notification arrives well under a millisecond after the change), instead of at its next
//! periodic read-back.

use std::time::Duration;

use netlink_sys::Socket;
use nix::errno::Errno;

use crate::NftError;
use crate::netlink::{self, Messages, NFNL_SUBSYS_NFTABLES, string};
use crate::ruleset::GUARD_TABLE;

/// `NFNLGRP_NFTABLES` in `linux/netfilter/nfnetlink.h`.
const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWGEN: u16 = 16;
/// A burst of notifications (a whole ruleset loaded by `nft -f`) must not overflow the socket before it is read.
const RCVBUF_BYTES: usize = 4 << 20;
/// The largest datagram read at once.
const DATAGRAM_BYTES: usize = 256 * 1024;

/// What a notification (or a lost batch of them) says about the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardEvent {
    /// Another socket changed the guard table: the operation (e.g. `delete rule`) and that socket's port.
    Changed { operation: &'static str, portid: u32 },
    /// The socket's buffer overflowed: notifications were lost, so anything may have changed.
    Overflow,
}

impl std::fmt::Display for GuardEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardEvent::Changed { operation, portid } => {
                write!(f, "{operation} in table inet {GUARD_TABLE} by netlink port {portid}")
            }
            GuardEvent::Overflow => write!(f, "nf_tables notifications were lost (buffer overflow)"),
        }
    }
}

fn operation(op: u16) -> Option<&'static str> {
    Some(match op {
        0 => "new table",
        2 => "delete table",
        3 => "new chain",
        5 => "delete chain",
        6 => "new rule",
        8 => "delete rule",
        9 => "new set",
        11 => "delete set",
        12 => "new set element",
        14 => "delete set element",
        _ => return None,
    })
}

/// A socket receiving every nf_tables change notification of this network namespace.
#[derive(Debug)]
pub struct Monitor {
    sock: Socket,
}

impl Monitor {
    /// Subscribes to `NFNLGRP_NFTABLES` (needs CAP_NET_ADMIN, like every nf_tables socket here).
    pub fn open() -> Result<Self, NftError> {
        let (sock, _) = netlink::open_nftables()?;
        sock.add_membership(NFNLGRP_NFTABLES).map_err(|e| NftError::Open(netlink::errno(&e)))?;
        netlink::size_rcvbuf(&sock, RCVBUF_BYTES);
        Ok(Self { sock })
    }

    /// Waits up to `timeout` for changes of the guard made by any socket other than `own_portid` (the agent's
    /// own repairs). Returns the first such change of the datagrams read, or `None` on timeout.
    pub fn next_guard_event(&self, own_portid: u32, timeout: Duration) -> Result<Option<GuardEvent>, NftError> {
        netlink::set_recv_timeout(&self.sock, timeout)?;
        let mut buf = Vec::with_capacity(DATAGRAM_BYTES);
        loop {
            match netlink::recv_datagram(&self.sock, &mut buf, 0) {
                Ok(()) => {}
                Err(Errno::EAGAIN) => return Ok(None),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => return Ok(Some(GuardEvent::Overflow)),
                Err(e) => return Err(NftError::Recv(e)),
            }
            if let Some(ev) = guard_event(&buf, own_portid)? {
                return Ok(Some(ev));
            }
        }
    }
}

/// The first change of the guard table in one datagram of notifications, ignoring those made by `own_portid`.
pub(crate) fn guard_event(datagram: &[u8], own_portid: u32) -> Result<Option<GuardEvent>, NftError> {
    for msg in Messages::new(datagram) {
        let msg = msg?;
        if msg.ty >> 8 != NFNL_SUBSYS_NFTABLES || msg.ty & 0xff == NFT_MSG_NEWGEN {
            continue;
        }
        let Some(op) = operation(msg.ty & 0xff) else { continue };
        if msg.portid == own_portid {
            continue;
        }
        let mut table = String::new();
        for a in msg.nft_attrs()? {
            let (ty, v) = a?;
            if ty == 1 {
                table = string(v);
            }
        }
        if table == GUARD_TABLE {
            return Ok(Some(GuardEvent::Changed { operation: op, portid: msg.portid }));
        }
    }
    Ok(None)
}
