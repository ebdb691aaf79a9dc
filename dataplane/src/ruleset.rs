//! Builds the netlink messages of both tables from the model, one [`Tx`] (one kernel transaction) at a time.
//!
//! ```text
//! table inet ironguard_guard {                     # persistent, installed before dnsmasq starts
//!   chain input { type filter hook input priority 10; policy accept;
//!     [iifname IF] udp dport PORT meta mark & MASK != MARK counter drop }
//! }
//! table inet ironguard {                           # flags owner: dies with the agent's netlink socket
//!   set allow_mac, deny_mac { type ether_addr }  set allow_chaddr, deny_chaddr { typeof @th,288,48 }
//!   set lease { type inet_service; flags timeout; timeout 1s }   # the kernel-enforced leader lease
//!   chain input { type filter hook input priority -10; policy accept;
//!     [iifname IF] udp dport PORT counter jump pxe }
//!   chain pxe { [blocked: counter drop] ; jump whitelist ; jump blacklist ; counter drop }
//!   chain whitelist { [leader: udp dport @lease <match> @allow_* counter meta mark set MARK accept] }
//!   chain blacklist { <match> @deny_* counter drop ;
//!                     [leader, policy allow: udp dport @lease counter meta mark set MARK accept] }
//! }
//! ```
//!
//! With a probe identity (`RulesetConfig::probe`, the agent's own chaddr), `pxe` starts (in Follower and Leader)
//! with `meta mark & MASK == MARK @th,288,48 PROBE @th,1984,24 DISCOVER counter accept` — only the agent's own
//! probe socket can send a packet that carries the mark — and a base chain `offers` on the output hook counts
//! every DHCPOFFER the local server sends (`udp sport 67 @th,1984,24 OFFER counter`). On the reply side, `pxe`
//! starts with `@th,288,48 PROBE @th,1984,24 OFFER counter mark accept` (an offer to the probe, never an ack).
//!
//! What the kernel saw of a boot ([`SeenKind`], request side only, every mode): three dynamic sets keyed by the
//! BOOTP chaddr, each element with a counter and an expiry that every packet refreshes, filled by base chains
//! without a verdict that cannot change what the chains above decide:
//!
//! ```text
//! table inet ironguard {
//!   set seen_requests, seen_passed, seen_answers { typeof @th,288,48; size 4096; flags dynamic,timeout;
//!                                                  counter; timeout 1h }
//!   chain seen { type filter hook input priority -20; policy accept;          # before the agent's chains
//!     [iifname IF] meta nfproto ipv4 udp dport 67|4011 update @seen_requests { @th,288,48 } }
//!   chain passed { type filter hook input priority 0; policy accept;          # after them, before the guard
//!     [iifname IF] meta nfproto ipv4 udp dport 67|4011 meta mark & MASK == MARK update @seen_passed { … } }
//!   chain answers { type filter hook output priority -20; policy accept;      # the local server's replies
//!     meta nfproto ipv4 udp sport 67|4011 update @seen_answers { @th,288,48 } }
//! }
//! ```
//!
//! (On the forward hook: `seen_forward`, which also records replies, and `passed_forward`.)
//!
//! With `egress_interfaces` configured, the same two tables also exist in the `netdev` family for the server's
//! replies ([`Side::Replies`]): a base chain `egress` bound to those devices matching `udp sport PORT` (clearing
//! ironguard's mark bits first), chaddr sets only, `udp sport @lease`. Every transaction below covers every side.
//!
//! The lease: every rule that marks a packet also looks the packet's DHCP port up in `lease`, whose elements (one
//! per configured port) carry a kernel timeout set to the leader's fence deadline. The agent moves that timeout
//! forward after each successful keep-alive ([`lease_refresh`]: flush and re-add in one batch, so there is no
//! hole); a frozen, starved or hung agent stops serving at its deadline without running any code, because the
//! kernel stops matching expired elements.
//!
//! Known rustables traps handled here: a `Set` does not inherit the table's family (it is set explicitly), and an
//! element list longer than fits a 16-bit netlink attribute length is silently truncated, so elements go in
//! chunks of [`ELEMENTS_PER_MESSAGE`], all inside the same batch.

use rustables::expr::{
    Bitwise, Cmp, CmpOp, Counter, HighLevelPayload, Immediate, LLHeaderField, Lookup, Meta, MetaType, Payload,
    Register, TransportHeaderField, UDPHeaderField, VerdictKind,
};
use rustables::{Batch, Chain, ChainPolicy, ChainType, Hook, HookClass, MsgType, ProtocolFamily, Rule, Set, Table};

use crate::model::{Delta, DesiredState, HookKind, Mode, RulesetConfig, UnknownMacPolicy};
use crate::rule::{
    ARPHRD_ETHER, DhcpMessage, ETH_P_IP, IPPROTO_UDP, NFPROTO_IPV4, NFT_PAYLOAD_TRANSPORT_HEADER, PortField, Stmt,
};
pub use crate::rule::{CHADDR_OFFSET_BYTES, FIRST_OPTION_OFFSET_BYTES};
use crate::{MacAddr, NftError};

/// The table owned by the running agent.
pub const OWNED_TABLE: &str = "ironguard";
/// The persistent table that drops unmarked DHCP/PXE traffic when the agent is absent.
pub const GUARD_TABLE: &str = "ironguard_guard";
/// Base-chain priority of the agent's table: before the guard, so its mark is set when the guard looks.
pub const OWNED_PRIORITY: i32 = -10;
/// Base-chain priority of the guard table.
pub const GUARD_PRIORITY: i32 = 10;
/// Elements per set-element message. rustables writes the element list as one attribute with a 16-bit length;
/// past ~3000 MACs that length wraps and the kernel silently receives a truncated list.
pub const ELEMENTS_PER_MESSAGE: usize = 1000;

pub(crate) const NFT_TABLE_F_OWNER: u32 = 0x2;
/// The table outlives its owner's socket (and can be claimed again); Linux 6.9+.
pub(crate) const NFT_TABLE_F_PERSIST: u32 = 0x4;
/// The set of the kernel-enforced lease (see the module documentation).
pub const LEASE_SET: &str = "lease";
/// Default timeout of the lease set's elements. Every element is added with its own timeout; the default only
/// keeps a mistake (an element added without one) from opening the fence for ever.
pub const LEASE_DEFAULT_TIMEOUT_MS: u64 = 1000;
const NFT_SET_TIMEOUT: u32 = 0x10;
/// `flags dynamic`: the packet path may add elements (`NFT_SET_EVAL`).
const NFT_SET_EVAL: u32 = 0x20;
const NFT_TYPE_INET_SERVICE: u32 = 13;
const LEASE_SET_ID: u32 = 16;

/// Capacity of each observation set ([`SeenKind`]): the PXE network is hostile, and a flood of made-up client
/// addresses fills a set, never the host's memory. A full set records no new address; it decides nothing.
pub const SEEN_SIZE: u32 = 4096;
/// How long an observation set keeps an address after the last packet that carried it (each packet refreshes it).
pub const SEEN_TIMEOUT_MS: u64 = 3_600_000;
/// Priority of the base chains that record requests (`seen`): before the agent's chains, so every request that
/// reaches the filter is recorded whatever the filter does with it.
pub const SEEN_PRIORITY: i32 = OWNED_PRIORITY - 10;
/// Priority of the base chains that record requests let through (`passed`): after the agent's chains (a packet
/// they dropped never gets here) and before the guard.
pub const PASSED_PRIORITY: i32 = 0;
/// The base chain on the output hook that records the local server's replies.
pub const ANSWERS_CHAIN: &str = "answers";
/// The DHCP ports whose packets the observation sets record: a BOOTP chaddr is at the same offset in a DHCP and
/// a proxyDHCP (PXE, 4011) message. DHCPv6 (547) has no chaddr.
const SEEN_PORTS: [u16; 2] = [67, 4011];

/// The observation sets of the agent's table (request side only): which client addresses' DHCP reached this
/// host, was let through, and was answered, each with a per-element counter and an expiry the packets refresh.
/// They record, and decide nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeenKind {
    /// Requests that reached the filter (`seen` base chains, before the agent's chains).
    Requests,
    /// Requests the filter let through: they carry ironguard's mark after the agent's chains (`passed`).
    Passed,
    /// Replies the local server sent, keyed by the client's chaddr (`answers`, output hook).
    Answers,
}

impl SeenKind {
    pub const ALL: [SeenKind; 3] = [SeenKind::Requests, SeenKind::Passed, SeenKind::Answers];

    pub fn set_name(self) -> &'static str {
        match self {
            SeenKind::Requests => "seen_requests",
            SeenKind::Passed => "seen_passed",
            SeenKind::Answers => "seen_answers",
        }
    }

    fn id(self) -> u32 {
        LEASE_SET_ID + 1 + self as u32
    }
}

/// Rule comments. They make `nft list ruleset` readable and name each rule's role (in `ironguardctl chains` and
/// `explain`); the read-back judges a rule by its expressions, never by its comment.
pub mod comments {
    pub const DHCP_JUMP: &str = "ironguard:dhcp";
    pub const BLOCKED: &str = "ironguard:blocked";
    pub const TO_WHITELIST: &str = "ironguard:to-whitelist";
    pub const TO_BLACKLIST: &str = "ironguard:to-blacklist";
    pub const NOT_MARKED: &str = "ironguard:not-marked";
    pub const ALLOW_MAC: &str = "ironguard:allow-mac";
    pub const ALLOW_CHADDR: &str = "ironguard:allow-chaddr";
    pub const DENY_MAC: &str = "ironguard:deny-mac";
    pub const DENY_CHADDR: &str = "ironguard:deny-chaddr";
    pub const PASS: &str = "ironguard:pass";
    pub const PROBE: &str = "ironguard:probe";
    pub const PROBE_OFFERS: &str = "ironguard:offers";
    pub const GUARD_DROP: &str = "ironguard-guard:drop-unmarked";
    pub const SEEN: &str = "ironguard:seen";
    pub const PASSED: &str = "ironguard:passed";
    pub const ANSWERED: &str = "ironguard:answered";
}

/// The four sets of the agent's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetKind {
    AllowMac,
    DenyMac,
    AllowChaddr,
    DenyChaddr,
}

impl SetKind {
    pub const ALL: [SetKind; 4] = [SetKind::AllowMac, SetKind::DenyMac, SetKind::AllowChaddr, SetKind::DenyChaddr];

    pub fn name(self) -> &'static str {
        match self {
            SetKind::AllowMac => "allow_mac",
            SetKind::DenyMac => "deny_mac",
            SetKind::AllowChaddr => "allow_chaddr",
            SetKind::DenyChaddr => "deny_chaddr",
        }
    }

    pub fn is_allow(self) -> bool {
        matches!(self, SetKind::AllowMac | SetKind::AllowChaddr)
    }

    pub fn is_chaddr(self) -> bool {
        matches!(self, SetKind::AllowChaddr | SetKind::DenyChaddr)
    }

    /// The sets that exist for a configuration.
    pub fn for_config(config: &RulesetConfig) -> impl Iterator<Item = SetKind> + '_ {
        Self::ALL
            .into_iter()
            .filter(|k| if k.is_chaddr() { config.match_mode.uses_chaddr() } else { config.match_mode.uses_ether() })
    }

    fn id(self) -> u32 {
        self as u32 + 1
    }
}

/// nft's set userdata: key byte order big-endian (what `type ether_addr` gets).
const UDATA_KEY_BIG_ENDIAN: [u8; 6] = [0x00, 0x04, 0x02, 0x00, 0x00, 0x00];
/// nft's set userdata for `typeof @th,288,48`: byte order, then the typeof expression (a raw payload, base
/// transport, offset 288, length 48). Without it `nft list` prints the set as a bare integer type that does not
/// load back with `nft -f`. Captured from nftables 1.0.6; checked by the round-trip test.
const UDATA_TYPEOF_CHADDR: [u8; 46] = [
    0x00, 0x04, 0x02, 0x00, 0x00, 0x00, // NFTNL_UDATA_SET_KEYBYTEORDER = big endian
    0x03, 0x26, // NFTNL_UDATA_SET_KEY_TYPEOF, nested
    0x00, 0x04, 0x07, 0x00, 0x00, 0x00, //   expression type: payload
    0x01, 0x1e, //   expression data, nested
    0x00, 0x04, 0x00, 0x00, 0x00, 0x00, //     payload description: none (raw)
    0x01, 0x04, 0x00, 0x00, 0x00, 0x00, //     payload type: none (raw)
    0x02, 0x04, 0x03, 0x00, 0x00, 0x00, //     base: transport header
    0x03, 0x04, 0x20, 0x01, 0x00, 0x00, //     offset: 288 bits
    0x04, 0x04, 0x30, 0x00, 0x00, 0x00, //     length: 48 bits
];
const NFT_TYPE_INTEGER: u32 = 4;
const NFT_TYPE_ETHERADDR: u32 = 9;

fn comment_udata(comment: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(comment.len() + 3);
    v.push(0); // NFTNL_UDATA_RULE_COMMENT
    v.push((comment.len() + 1) as u8);
    v.extend_from_slice(comment.as_bytes());
    v.push(0);
    v
}

/// Parses a rule comment out of nft rule userdata.
pub(crate) fn parse_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (ty, len) = (rest[0], rest[1] as usize);
        let val = rest.get(2..2 + len)?;
        if ty == 0 {
            let end = val.iter().position(|&b| b == 0).unwrap_or(val.len());
            return Some(String::from_utf8_lossy(&val[..end]).into_owned());
        }
        rest = &rest[2 + len..];
    }
    None
}

/// One nf_tables transaction under construction, with a description of every message so that a rejection can
/// name the object the kernel refused.
pub(crate) struct Tx {
    /// Messages already numbered (sequence numbers 1..), without the batch begin/end.
    buf: Vec<u8>,
    /// rustables batch being filled; its messages get renumbered when flushed into `buf`.
    pending: Option<Batch>,
    pending_count: usize,
    descriptions: Vec<String>,
    /// Number of set elements added or removed by this transaction.
    pub(crate) elements: usize,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").field("messages", &self.descriptions.len()).finish()
    }
}

/// A finalized transaction: the bytes to send and the description of each sequence number.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) bytes: Vec<u8>,
    pub(crate) descriptions: Vec<String>,
    pub(crate) elements: usize,
}

impl Finished {
    pub(crate) fn last_seq(&self) -> u32 {
        self.descriptions.len() as u32
    }

    /// The description of the message with sequence number `seq` (1-based; 0 is the batch header).
    pub(crate) fn describe(&self, seq: u32) -> String {
        match seq.checked_sub(1).and_then(|i| self.descriptions.get(i as usize)) {
            Some(d) => d.clone(),
            None => format!("the batch (message {seq})"),
        }
    }
}

macro_rules! tx_add {
    ($name:ident, $ty:ty) => {
        pub(crate) fn $name(&mut self, obj: &$ty, op: MsgType, description: impl Into<String>) {
            self.pending.get_or_insert_with(Batch::new).add(obj, op);
            self.pending_count += 1;
            self.descriptions.push(description.into());
        }
    };
}

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_EXPR: u16 = 17;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NLA_F_NESTED: u16 = 0x8000;

/// The 20-byte batch begin/end message.
fn batch_marker(ty: u16, seq: u32) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[0..4].copy_from_slice(&20u32.to_ne_bytes());
    m[4..6].copy_from_slice(&ty.to_ne_bytes());
    m[6..8].copy_from_slice(&1u16.to_ne_bytes()); // NLM_F_REQUEST
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nfgenmsg: family unspec, version 0, resource id = the nf_tables subsystem (big endian)
    m[18..20].copy_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
    m
}

/// The messages of a finalized rustables batch, without its begin and end markers.
fn inner_messages(bytes: &[u8]) -> &[u8] {
    // rustables writes a 20-byte begin and a 20-byte end marker around the messages.
    &bytes[20..bytes.len() - 20]
}

impl Tx {
    pub(crate) fn new() -> Self {
        Self { buf: Vec::new(), pending: None, pending_count: 0, descriptions: Vec::new(), elements: 0 }
    }

    tx_add!(table, Table);
    tx_add!(chain, Chain);
    tx_add!(rule, Rule);
    tx_add!(set, Set);

    /// Creates a table that must not exist yet (`NLM_F_EXCL`): the batch fails with EEXIST if another process
    /// created it since we looked, instead of adding our objects to the other process's table.
    pub(crate) fn table_exclusive(&mut self, obj: &Table, description: impl Into<String>) {
        let mut batch = Batch::new();
        batch.add(obj, MsgType::Add);
        let bytes = batch.finalize();
        let mut msg = inner_messages(&bytes).to_vec();
        let flags = u16::from_ne_bytes([msg[6], msg[7]]) | NLM_F_EXCL;
        msg[6..8].copy_from_slice(&flags.to_ne_bytes());
        self.raw(msg, description);
    }

    /// Appends one message written by hand (sequence number assigned here).
    pub(crate) fn raw(&mut self, msg: Vec<u8>, description: impl Into<String>) {
        self.flush();
        self.descriptions.push(description.into());
        let seq = self.descriptions.len() as u32;
        self.append_renumbered(&msg, seq);
    }

    /// Moves the pending rustables messages into `buf`, numbering them after the ones already there.
    fn flush(&mut self) {
        let Some(batch) = self.pending.take() else {
            return;
        };
        let bytes = batch.finalize();
        let first_seq = (self.descriptions.len() - self.pending_count) as u32 + 1;
        self.append_renumbered(inner_messages(&bytes), first_seq);
        self.pending_count = 0;
    }

    fn append_renumbered(&mut self, msgs: &[u8], first_seq: u32) {
        let start = self.buf.len();
        self.buf.extend_from_slice(msgs);
        let mut off = start;
        let mut seq = first_seq;
        while off + 16 <= self.buf.len() {
            let len =
                u32::from_ne_bytes([self.buf[off], self.buf[off + 1], self.buf[off + 2], self.buf[off + 3]]) as usize;
            self.buf[off + 8..off + 12].copy_from_slice(&seq.to_ne_bytes());
            seq += 1;
            off += crate::netlink::align4(len.max(16));
        }
    }

    /// Adds a rule with `exprs` (encoded expressions rustables cannot build) appended to its own.
    pub(crate) fn rule_with_expressions(
        &mut self,
        rule: &Rule,
        exprs: &[u8],
        description: impl Into<String>,
    ) -> Result<(), NftError> {
        let mut one = Batch::new();
        one.add(rule, MsgType::Add);
        let msg = append_expressions(inner_messages(&one.finalize()), exprs)?;
        self.raw(msg, description);
        Ok(())
    }

    /// Adds a set with a size hint. rustables' `Set` has no `NFTA_SET_DESC`, so the attribute is appended to the
    /// message rustables wrote. With a size the kernel picks its fixed-size hash, which loads about twice as fast
    /// as the resizable one; adding beyond the size fails with ENFILE, so callers rebuild with a larger size first.
    pub(crate) fn set_with_size(&mut self, set: &Set, size: u32, description: impl Into<String>) {
        self.set_with_attrs(set, &set_size_attr(size), description);
    }

    /// Adds a set with `attrs` (encoded attributes rustables' `Set` does not have) appended to its message.
    pub(crate) fn set_with_attrs(&mut self, set: &Set, attrs: &[u8], description: impl Into<String>) {
        self.flush();
        let mut one = Batch::new();
        one.add(set, MsgType::Add);
        let bytes = one.finalize();
        let mut msg = inner_messages(&bytes).to_vec();
        msg.extend_from_slice(attrs);
        let len = msg.len() as u32;
        msg[0..4].copy_from_slice(&len.to_ne_bytes());
        self.descriptions.push(description.into());
        let seq = self.descriptions.len() as u32;
        self.append_renumbered(&msg, seq);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.descriptions.is_empty()
    }

    pub(crate) fn finish(mut self) -> Finished {
        self.flush();
        let end_seq = self.descriptions.len() as u32 + 1;
        let mut bytes = Vec::with_capacity(self.buf.len() + 40);
        bytes.extend_from_slice(&batch_marker(NFNL_MSG_BATCH_BEGIN, 0));
        bytes.extend_from_slice(&self.buf);
        bytes.extend_from_slice(&batch_marker(NFNL_MSG_BATCH_END, end_seq));
        Finished { bytes, descriptions: self.descriptions, elements: self.elements }
    }
}

/// `NFTA_SET_DESC { NFTA_SET_DESC_SIZE size }`: the set's capacity.
fn set_size_attr(size: u32) -> Vec<u8> {
    let mut desc = Vec::new();
    nla(&mut desc, NFTA_SET_DESC_SIZE, &size.to_be_bytes());
    let mut out = Vec::new();
    nla(&mut out, NFTA_SET_DESC | NLA_F_NESTED, &desc);
    out
}

/// `NFTA_SET_EXPR { counter }`: every element of the set counts the packets that added or refreshed it (what
/// `nft` sends for a set declared with `counter`).
fn set_counter_attr() -> Vec<u8> {
    let mut expr = Vec::new();
    nla_str(&mut expr, NFTA_EXPR_NAME, "counter");
    nla(&mut expr, NFTA_EXPR_DATA | NLA_F_NESTED, &[]);
    let mut out = Vec::new();
    nla(&mut out, NFTA_SET_EXPR | NLA_F_NESTED, &expr);
    out
}

/// The size given to a set holding `n` elements: room to double, at least [`MIN_SET_CAPACITY`].
pub fn set_capacity(n: usize) -> u32 {
    let want = (n.saturating_mul(2)).max(MIN_SET_CAPACITY as usize);
    want.checked_next_power_of_two().unwrap_or(1 << 31).min(1 << 31) as u32
}

/// Smallest set size: small sites pay ~64 KiB of kernel memory per set, and rebuild only past 2048 MACs.
pub const MIN_SET_CAPACITY: u32 = 4096;

/// Which packets a pair of tables (guard and agent's table) filters.
///
/// * [`Side::Requests`]: `table inet`, base chains on the input/forward hooks, the clients' requests (udp dport
///   PORT), keyed by Ethernet source and BOOTP chaddr.
/// * [`Side::Replies`]: `table netdev`, one base chain on the egress hook of the configured devices, the server's
///   replies (udp sport PORT), keyed by BOOTP chaddr only (the Ethernet source of a reply is the server's). A DHCP
///   server reading AF_PACKET sockets (ISC dhcpd, Kea in raw mode) sees a request before any netfilter hook runs,
///   so its replies are the only thing the kernel can stop.
///
/// Both sides have the same tables, sets, chains, lease and modes, and are changed in the same transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Requests,
    Replies,
}

impl Side {
    pub const ALL: [Side; 2] = [Side::Requests, Side::Replies];

    /// The sides a configuration uses.
    pub fn for_config(config: &RulesetConfig) -> impl Iterator<Item = Side> + '_ {
        Self::ALL.into_iter().filter(|s| match s {
            Side::Requests => config.uses_inet(),
            Side::Replies => config.uses_egress(),
        })
    }

    fn family(self) -> ProtocolFamily {
        match self {
            Side::Requests => ProtocolFamily::Inet,
            Side::Replies => ProtocolFamily::NetDev,
        }
    }

    /// The nfgenmsg family byte.
    pub(crate) fn nfproto(self) -> u8 {
        match self {
            Side::Requests => NFPROTO_INET,
            Side::Replies => NFPROTO_NETDEV,
        }
    }

    /// `inet` or `netdev`, as nft names the family.
    pub fn family_name(self) -> &'static str {
        match self {
            Side::Requests => "inet",
            Side::Replies => "netdev",
        }
    }

    /// The side whose tables are in family `nfproto`, if any.
    pub(crate) fn of_nfproto(nfproto: u8) -> Option<Side> {
        Self::ALL.into_iter().find(|s| s.nfproto() == nfproto)
    }

    /// The UDP port that identifies DHCP traffic on this side: the destination of a request, the source of a reply.
    pub fn port_field(self) -> PortField {
        match self {
            Side::Requests => PortField::Dport,
            Side::Replies => PortField::Sport,
        }
    }

    /// The sets of the agent's table on this side.
    pub fn set_kinds(self, config: &RulesetConfig) -> Vec<SetKind> {
        match self {
            Side::Requests => SetKind::for_config(config).collect(),
            Side::Replies => vec![SetKind::AllowChaddr, SetKind::DenyChaddr],
        }
    }

    /// The base chain names of this side for a configuration.
    pub fn base_chains(self, config: &RulesetConfig) -> Vec<&'static str> {
        match self {
            Side::Requests => config.hooks.iter().map(|h| h.chain_name()).collect(),
            Side::Replies => vec![EGRESS_CHAIN],
        }
    }

    /// Rules each base chain of this side holds (one per port and, on the request side, per interface).
    pub fn rules_per_base_chain(self, config: &RulesetConfig) -> usize {
        match self {
            Side::Requests => config.ports.len() * config.interfaces.len().max(1),
            Side::Replies => config.ports.len(),
        }
    }

    /// Set ids are unique within a transaction, which may build both sides.
    fn set_id_base(self) -> u32 {
        match self {
            Side::Requests => 0,
            Side::Replies => 32,
        }
    }
}

/// The base chain of the reply side (netdev tables).
pub const EGRESS_CHAIN: &str = "egress";
const NFPROTO_NETDEV: u8 = 5;
const NF_NETDEV_EGRESS: u32 = 1;

fn table(side: Side, name: &str) -> Table {
    Table::new(side.family()).with_name(name)
}

fn owned_table(side: Side) -> Table {
    table(side, OWNED_TABLE).with_flags(NFT_TABLE_F_OWNER)
}

/// `add chain netdev TABLE egress { type filter hook egress devices = { DEV, ... } priority P; policy accept; }`.
/// rustables' `Hook` has no device attribute, so the message is written here.
fn egress_chain_message(table: &str, devices: &[String], priority: i32) -> Vec<u8> {
    let mut devs = Vec::new();
    for d in devices {
        nla_str(&mut devs, NFTA_DEVICE_NAME, d);
    }
    let mut hook = Vec::new();
    nla(&mut hook, NFTA_HOOK_HOOKNUM, &NF_NETDEV_EGRESS.to_be_bytes());
    nla(&mut hook, NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
    nla(&mut hook, NFTA_HOOK_DEVS | NLA_F_NESTED, &devs);
    let mut body = nfgen(NFPROTO_NETDEV);
    nla_str(&mut body, NFTA_CHAIN_TABLE, table);
    nla_str(&mut body, NFTA_CHAIN_NAME, EGRESS_CHAIN);
    nla(&mut body, NFTA_CHAIN_HOOK | NLA_F_NESTED, &hook);
    nla(&mut body, NFTA_CHAIN_POLICY, &NF_ACCEPT.to_be_bytes());
    nla_str(&mut body, NFTA_CHAIN_TYPE, "filter");
    nft_message(NFT_MSG_NEWCHAIN, NLM_F_ACK | NLM_F_CREATE, &body)
}

/// A rule as ironguard builds it: what it does ([`Stmt`]s, the typed model the read-back decodes into), the
/// comment naming its role, and how a rejected batch names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltRule {
    pub comment: &'static str,
    pub stmts: Vec<Stmt>,
    /// e.g. `udp dport 67 jump pxe`, for the description of a rejected message.
    pub what: String,
}

/// A chain and its rules, in order, as ironguard builds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltChain {
    pub name: &'static str,
    /// Base chains only: the hook name (`input`, `forward`, `egress`) and priority.
    pub hook: Option<(&'static str, i32)>,
    pub rules: Vec<BuiltRule>,
}

/// Requests: `[iifname IF] meta l4proto udp th dport PORT`. Replies: `… th sport PORT` (the chain is bound to its
/// devices).
fn match_dhcp(side: Side, iface: Option<&str>, port: u16) -> Vec<Stmt> {
    let mut v = Vec::with_capacity(3);
    if let Some(name) = iface {
        v.push(Stmt::IifName(name.to_string()));
    }
    v.extend([Stmt::Udp, Stmt::Port { field: side.port_field(), port }]);
    v
}

/// `udp dport @lease` (replies: `udp sport @lease`): the rule matches only while the lease element of the packet's
/// port has not expired.
fn require_lease(side: Side) -> [Stmt; 2] {
    [Stmt::Udp, Stmt::PortIn { field: side.port_field(), set: LEASE_SET.to_string() }]
}

/// Matches the address a set of this kind is keyed by against that set.
///
/// The chaddr key is read from IPv4 packets only (`meta nfproto ipv4`; in the netdev family, where nfproto is
/// netdev, `meta protocol ip`): `@th,288,48` is BOOTP's chaddr, while in a DHCPv6 message the same six bytes are
/// whatever option sits there — in a SOLICIT with IA_NA first, the MAC of a DUID-LL, which a client chooses
/// freely. DHCPv6 is identified by its Ethernet source alone (architecture.md).
fn match_key(side: Side, kind: SetKind) -> [Stmt; 2] {
    let set = kind.name().to_string();
    match (kind.is_chaddr(), side) {
        (true, Side::Requests) => [Stmt::NfprotoIpv4, Stmt::ChaddrIn { set }],
        (true, Side::Replies) => [Stmt::ProtocolIp, Stmt::ChaddrIn { set }],
        (false, _) => [Stmt::IifTypeEther, Stmt::EtherSaddrIn { set }],
    }
}

/// `meta mark set meta mark & ~MASK | MARK`
fn set_mark(config: &RulesetConfig) -> Stmt {
    Stmt::SetMark { keep: !config.mask, xor: config.mark }
}

/// `meta mark set meta mark & ~MASK`: a reply leaves with ironguard's mark bits cleared, whatever its sender set
/// (SO_MARK), so only the agent's table can mark it for the guard.
fn clear_mark(config: &RulesetConfig) -> Stmt {
    Stmt::SetMark { keep: !config.mask, xor: 0 }
}

/// The base chains of `side` (one per hook; the egress chain on the reply side), each with one rule per
/// interface and port: the DHCP match followed by `then`.
fn dhcp_chains(
    side: Side,
    config: &RulesetConfig,
    priority: i32,
    comment: &'static str,
    then: &[Stmt],
) -> Vec<BuiltChain> {
    let ifaces: Vec<Option<&str>> = if config.interfaces.is_empty() || side == Side::Replies {
        vec![None]
    } else {
        config.interfaces.iter().map(|s| Some(s.as_str())).collect()
    };
    let mut rules = Vec::new();
    for iface in &ifaces {
        for &port in &config.ports {
            let mut stmts = match_dhcp(side, *iface, port);
            stmts.extend_from_slice(then);
            rules.push(BuiltRule { comment, what: crate::rule::text(&stmts), stmts });
        }
    }
    side.base_chains(config)
        .into_iter()
        .map(|name| BuiltChain { name, hook: Some((name, priority)), rules: rules.clone() })
        .collect()
}

/// The guard's chains of `side`: `[iifname IF] udp dport PORT meta mark & MASK != MARK counter drop`.
pub fn guard_rules(side: Side, config: &RulesetConfig) -> Vec<BuiltChain> {
    let then = [Stmt::MarkNot { mask: config.mask, mark: config.mark }, Stmt::Counter, Stmt::Drop];
    dhcp_chains(side, config, GUARD_PRIORITY, comments::GUARD_DROP, &then)
}

/// The chains of the agent's table of `side` in a mode, in the order they are created (the order the kernel lists
/// them): `whitelist`, `blacklist`, `pxe`, then the base chains.
pub fn owned_rules(side: Side, config: &RulesetConfig, mode: Mode, policy: UnknownMacPolicy) -> Vec<BuiltChain> {
    let mut chains = mode_chains(side, config, mode, policy);
    let mut then = vec![Stmt::Counter];
    if side == Side::Replies {
        // A reply's mark is the sender's to set (SO_MARK): clear ironguard's bits before the agent decides.
        then.push(clear_mark(config));
    }
    then.push(Stmt::Jump("pxe".into()));
    chains.extend(dhcp_chains(side, config, OWNED_PRIORITY, comments::DHCP_JUMP, &then));
    if side == Side::Requests && config.probe.is_some() {
        chains.push(offers_chain());
    }
    if side == Side::Requests {
        chains.extend(seen_chains(config));
    }
    chains
}

/// The name of the chain of hook `h` that records with `kind` (`seen`, `passed` on the input hook; with a suffix
/// on the forward hook).
pub fn seen_chain_name(kind: SeenKind, h: HookKind) -> &'static str {
    match (kind, h) {
        (SeenKind::Requests, HookKind::Input) => "seen",
        (SeenKind::Requests, HookKind::Forward) => "seen_forward",
        (SeenKind::Passed, HookKind::Input) => "passed",
        (SeenKind::Passed, HookKind::Forward) => "passed_forward",
        (SeenKind::Answers, _) => ANSWERS_CHAIN,
    }
}

/// The observation chains of the request side, in every mode: they add to the [`SeenKind`] sets and have no
/// verdict (policy accept), so what they do cannot change what the agent's chains and the guard decide. A set
/// that is full, or an update that fails, ends the rule and nothing else.
///
/// * `seen` (each hook, [`SEEN_PRIORITY`]): `[iifname IF] meta nfproto ipv4 udp dport P update @seen_requests`.
/// * `passed` (each hook, [`PASSED_PRIORITY`]): the same match and `meta mark & MASK == MARK`, into
///   `seen_passed`. The agent's own probe carries the mark too: it is recorded like any client (its chaddr is the
///   agent's probe identity, which readers leave out).
/// * `answers` (output hook; and the forward hook's `seen` chain, for a server in a container):
///   `meta nfproto ipv4 udp sport P update @seen_answers`.
///
/// IPv4 only: a DHCPv6 message has no chaddr (`@th,288,48` there is whatever option sits at that offset).
pub(crate) fn seen_chains(config: &RulesetConfig) -> Vec<BuiltChain> {
    let ports: Vec<u16> = config.ports.iter().copied().filter(|p| SEEN_PORTS.contains(p)).collect();
    let ifaces: Vec<Option<&str>> = if config.interfaces.is_empty() {
        vec![None]
    } else {
        config.interfaces.iter().map(|s| Some(s.as_str())).collect()
    };
    let rule = |comment: &'static str, stmts: Vec<Stmt>| BuiltRule { comment, what: crate::rule::text(&stmts), stmts };
    let update = |kind: SeenKind| Stmt::ChaddrUpdate { set: kind.set_name().to_string() };
    let answers = |port: u16| {
        let stmts =
            vec![Stmt::NfprotoIpv4, Stmt::Udp, Stmt::Port { field: PortField::Sport, port }, update(SeenKind::Answers)];
        rule(comments::ANSWERED, stmts)
    };
    let requests = |then: &[Stmt], comment| {
        let mut rules = Vec::new();
        for iface in &ifaces {
            for &port in &ports {
                let mut stmts = Vec::new();
                stmts.extend(iface.map(|i| Stmt::IifName(i.to_string())));
                stmts.extend([Stmt::NfprotoIpv4, Stmt::Udp, Stmt::Port { field: PortField::Dport, port }]);
                stmts.extend_from_slice(then);
                rules.push(rule(comment, stmts));
            }
        }
        rules
    };
    let mut seen = Vec::new();
    let mut passed = Vec::new();
    for &h in &config.hooks {
        let mut rules = requests(&[update(SeenKind::Requests)], comments::SEEN);
        if h == HookKind::Forward {
            rules.extend(ports.iter().map(|&p| answers(p)));
        }
        let name = seen_chain_name(SeenKind::Requests, h);
        seen.push(BuiltChain { name, hook: Some((h.chain_name(), SEEN_PRIORITY)), rules });
        let mark = Stmt::MarkIs { mask: config.mask, mark: config.mark };
        let name = seen_chain_name(SeenKind::Passed, h);
        let rules = requests(&[mark, update(SeenKind::Passed)], comments::PASSED);
        passed.push(BuiltChain { name, hook: Some((h.chain_name(), PASSED_PRIORITY)), rules });
    }
    let out = BuiltChain {
        name: ANSWERS_CHAIN,
        hook: Some(("output", SEEN_PRIORITY)),
        rules: ports.iter().map(|&p| answers(p)).collect(),
    };
    seen.extend(passed);
    seen.push(out);
    seen
}

/// The rules of `whitelist`, `blacklist` and `pxe` for a mode and policy. These are the only rules a mode switch
/// rewrites, so its cost does not depend on the size of the sets.
fn mode_chains(side: Side, config: &RulesetConfig, mode: Mode, policy: UnknownMacPolicy) -> Vec<BuiltChain> {
    let rule = |comment: &'static str, stmts: Vec<Stmt>| BuiltRule { comment, what: comment.to_string(), stmts };
    let sets = side.set_kinds(config);
    let mut white = Vec::new();
    if mode == Mode::Leader {
        for &k in sets.iter().filter(|k| k.is_allow()) {
            let mut s: Vec<Stmt> = require_lease(side).into();
            s.extend(match_key(side, k));
            s.extend([Stmt::Counter, set_mark(config), Stmt::Accept]);
            white.push(rule(if k.is_chaddr() { comments::ALLOW_CHADDR } else { comments::ALLOW_MAC }, s));
        }
    }
    let mut black = Vec::new();
    for &k in sets.iter().filter(|k| !k.is_allow()) {
        let mut s: Vec<Stmt> = match_key(side, k).into();
        s.extend([Stmt::Counter, Stmt::Drop]);
        black.push(rule(if k.is_chaddr() { comments::DENY_CHADDR } else { comments::DENY_MAC }, s));
    }
    if mode == Mode::Leader && policy == UnknownMacPolicy::Allow {
        let mut s: Vec<Stmt> = require_lease(side).into();
        s.extend([Stmt::Counter, set_mark(config), Stmt::Accept]);
        black.push(rule(comments::PASS, s));
    }
    let mut pxe = Vec::new();
    if mode == Mode::Blocked {
        pxe.push(rule(comments::BLOCKED, vec![Stmt::Counter, Stmt::Drop]));
    } else if let Some(probe) = config.probe {
        pxe.push(rule(comments::PROBE, probe_rule(side, config, probe)));
    }
    pxe.push(rule(comments::TO_WHITELIST, vec![Stmt::Jump("whitelist".into())]));
    pxe.push(rule(comments::TO_BLACKLIST, vec![Stmt::Jump("blacklist".into())]));
    pxe.push(rule(comments::NOT_MARKED, vec![Stmt::Counter, Stmt::Drop]));
    let chain = |name, rules| BuiltChain { name, hook: None, rules };
    vec![chain("whitelist", white), chain("blacklist", black), chain("pxe", pxe)]
}

/// The probe's rule at the head of `pxe`. Requests: the agent's own DISCOVER, recognised by the mark its socket
/// sets (`SO_MARK` needs CAP_NET_ADMIN on this host; no packet from the wire carries a mark) and by its chaddr; it
/// already carries the mark the guard wants, so it is only accepted. Replies: an OFFER to the probe's chaddr, marked
/// for the guard. An ACK to that chaddr is never let out, so a client that borrows the probe's address gets no
/// lease from it.
fn probe_rule(side: Side, config: &RulesetConfig, probe: MacAddr) -> Vec<Stmt> {
    match side {
        Side::Requests => vec![
            Stmt::MarkIs { mask: config.mask, mark: config.mark },
            Stmt::NfprotoIpv4,
            Stmt::Chaddr(probe),
            Stmt::DhcpType(DhcpMessage::Discover),
            Stmt::Counter,
            Stmt::Accept,
        ],
        Side::Replies => vec![
            Stmt::ProtocolIp,
            Stmt::Chaddr(probe),
            Stmt::DhcpType(DhcpMessage::Offer),
            Stmt::Counter,
            set_mark(config),
            Stmt::Accept,
        ],
    }
}

/// The base chain that counts the local server's offers (the request side's table, output hook; only with a probe
/// identity). It decides nothing: its one rule has no verdict.
pub const OFFERS_CHAIN: &str = "offers";
/// The server port whose offers are counted.
const SERVER_PORT: u16 = 67;

fn offers_chain() -> BuiltChain {
    let stmts = vec![
        Stmt::NfprotoIpv4,
        Stmt::Udp,
        Stmt::Port { field: PortField::Sport, port: SERVER_PORT },
        Stmt::DhcpType(DhcpMessage::Offer),
        Stmt::Counter,
    ];
    BuiltChain {
        name: OFFERS_CHAIN,
        hook: Some(("output", OWNED_PRIORITY)),
        rules: vec![BuiltRule { comment: comments::PROBE_OFFERS, what: crate::rule::text(&stmts), stmts }],
    }
}

/// The kernel expressions of one rule, in chain `chain`, and the encoded expressions rustables cannot build that
/// follow them (a `dynset`: see [`dynset_update_expr`]; empty for most rules). Such a statement must be the last.
fn build_rule(chain: &Chain, r: &BuiltRule) -> Result<(Rule, Vec<u8>), NftError> {
    let mut rule = Rule::new(chain)?;
    let mut tail = Vec::new();
    for s in &r.stmts {
        if !tail.is_empty() {
            return Err(NftError::Decode(format!("`{}`: nothing may follow a set update", r.what)));
        }
        rule = match s {
            Stmt::IifName(name) => {
                let mut bytes = [0u8; 16];
                let n = name.len().min(15);
                bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
                rule.with_expr(Meta::new(MetaType::IifName)).with_expr(Cmp::new(CmpOp::Eq, bytes.to_vec()))
            }
            Stmt::Udp => rule.with_expr(Meta::new(MetaType::L4Proto)).with_expr(Cmp::new(CmpOp::Eq, vec![IPPROTO_UDP])),
            Stmt::Port { field, port } => rule
                .with_expr(HighLevelPayload::Transport(TransportHeaderField::Udp(udp_field(*field))).build())
                .with_expr(Cmp::new(CmpOp::Eq, port.to_be_bytes().to_vec())),
            Stmt::PortIn { field, set } => rule
                .with_expr(HighLevelPayload::Transport(TransportHeaderField::Udp(udp_field(*field))).build())
                .with_expr(lookup(set)),
            Stmt::NfprotoIpv4 => {
                rule.with_expr(Meta::new(MetaType::NfProto)).with_expr(Cmp::new(CmpOp::Eq, vec![NFPROTO_IPV4]))
            }
            Stmt::ProtocolIp => rule
                .with_expr(Meta::new(MetaType::Protocol))
                .with_expr(Cmp::new(CmpOp::Eq, ETH_P_IP.to_be_bytes().to_vec())),
            Stmt::IifTypeEther => rule
                .with_expr(Meta::new(MetaType::IifType))
                .with_expr(Cmp::new(CmpOp::Eq, ARPHRD_ETHER.to_ne_bytes().to_vec())),
            Stmt::EtherSaddrIn { set } => {
                rule.with_expr(HighLevelPayload::LinkLayer(LLHeaderField::Saddr).build()).with_expr(lookup(set))
            }
            Stmt::ChaddrIn { set } => rule.with_expr(transport_bytes(CHADDR_OFFSET_BYTES, 6)).with_expr(lookup(set)),
            Stmt::MarkNot { mask, mark } => rule
                .with_expr(Meta::new(MetaType::Mark))
                .with_expr(Bitwise::new(mask.to_ne_bytes().to_vec(), vec![0u8; 4])?)
                .with_expr(Cmp::new(CmpOp::Neq, mark.to_ne_bytes().to_vec())),
            Stmt::SetMark { keep, xor } => rule
                .with_expr(Meta::new(MetaType::Mark))
                .with_expr(Bitwise::new(keep.to_ne_bytes().to_vec(), xor.to_ne_bytes().to_vec())?)
                .with_expr(Meta::default().with_key(MetaType::Mark).with_sreg(Register::Reg1)),
            Stmt::MarkIs { mask, mark } => rule
                .with_expr(Meta::new(MetaType::Mark))
                .with_expr(Bitwise::new(mask.to_ne_bytes().to_vec(), vec![0u8; 4])?)
                .with_expr(Cmp::new(CmpOp::Eq, mark.to_ne_bytes().to_vec())),
            Stmt::Chaddr(mac) => rule
                .with_expr(transport_bytes(CHADDR_OFFSET_BYTES, 6))
                .with_expr(Cmp::new(CmpOp::Eq, mac.octets().to_vec())),
            Stmt::DhcpType(t) => rule
                .with_expr(transport_bytes(FIRST_OPTION_OFFSET_BYTES, 3))
                .with_expr(Cmp::new(CmpOp::Eq, t.option_bytes().to_vec())),
            Stmt::ChaddrUpdate { set } => {
                tail = dynset_update_expr(set, REG1);
                rule.with_expr(transport_bytes(CHADDR_OFFSET_BYTES, 6))
            }
            Stmt::Counter => rule.with_expr(Counter::default()),
            Stmt::Accept => rule.with_expr(Immediate::new_verdict(VerdictKind::Accept)),
            Stmt::Drop => rule.with_expr(Immediate::new_verdict(VerdictKind::Drop)),
            Stmt::Jump(c) => rule.with_expr(Immediate::new_verdict(VerdictKind::Jump { chain: c.clone() })),
            Stmt::Unknown(what) => {
                return Err(NftError::Decode(format!("cannot build an unknown statement ({what})")));
            }
        };
    }
    Ok((rule.with_userdata(comment_udata(r.comment)), tail))
}

/// rustables' `Register::Reg1` as the kernel numbers it (`NFT_REG_1`, a 16-byte register).
const REG1: u32 = 1;

/// One `dynset` expression, as an element of a rule's `NFTA_RULE_EXPRESSIONS`: `update @SET { <key in sreg> }`
/// with the set's own timeout (none given) and no expression of its own (the set's `counter` applies). What
/// `nft` 1.0.6 sends for `update @s { @th,288,48 }`, without the set id: the kernel finds a set of the same
/// transaction by name. rustables 0.9 has no dynset expression, so it is written here.
pub(crate) fn dynset_update_expr(set: &str, sreg: u32) -> Vec<u8> {
    let mut data = Vec::new();
    nla_str(&mut data, crate::rule::NFTA_DYNSET_SET_NAME, set);
    nla(&mut data, crate::rule::NFTA_DYNSET_OP, &crate::rule::NFT_DYNSET_OP_UPDATE.to_be_bytes());
    nla(&mut data, crate::rule::NFTA_DYNSET_SREG_KEY, &sreg.to_be_bytes());
    let mut expr = Vec::new();
    nla_str(&mut expr, NFTA_EXPR_NAME, "dynset");
    nla(&mut expr, NFTA_EXPR_DATA | NLA_F_NESTED, &data);
    let mut elem = Vec::new();
    nla(&mut elem, NFTA_LIST_ELEM | NLA_F_NESTED, &expr);
    elem
}

/// `msg` (one `NFT_MSG_NEWRULE` as rustables wrote it) with `exprs` (encoded list elements) appended to its
/// expressions.
fn append_expressions(msg: &[u8], exprs: &[u8]) -> Result<Vec<u8>, NftError> {
    const HEADERS: usize = 16 + 4; // nlmsghdr, nfgenmsg
    let head = msg.get(..HEADERS).ok_or_else(|| NftError::Decode("a rule message without headers".into()))?;
    let mut out = head.to_vec();
    let mut appended = false;
    let mut rest = &msg[HEADERS..];
    // Attributes are copied with their type bits as they are (nested, byte order).
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let ty = u16::from_ne_bytes([rest[2], rest[3]]);
        let v = rest.get(4..len).ok_or_else(|| NftError::Decode(format!("rule attribute length {len}")))?;
        if ty & !NLA_F_NESTED == NFTA_RULE_EXPRESSIONS {
            let mut all = v.to_vec();
            all.extend_from_slice(exprs);
            nla(&mut out, ty | NLA_F_NESTED, &all);
            appended = true;
        } else {
            nla(&mut out, ty, v);
        }
        rest = rest.get(crate::netlink::align4(len)..).unwrap_or_default();
    }
    if !appended {
        nla(&mut out, NFTA_RULE_EXPRESSIONS | NLA_F_NESTED, exprs);
    }
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&len.to_ne_bytes());
    Ok(out)
}

/// `len` bytes of the transport header from `offset` into register 1.
fn transport_bytes(offset: u32, len: u32) -> Payload {
    Payload::default()
        .with_base(NFT_PAYLOAD_TRANSPORT_HEADER)
        .with_offset(offset)
        .with_len(len)
        .with_dreg(Register::Reg1)
}

fn udp_field(f: PortField) -> UDPHeaderField {
    match f {
        PortField::Dport => UDPHeaderField::Dport,
        PortField::Sport => UDPHeaderField::Sport,
    }
}

/// A lookup in a set of the same table, by name (the kernel also finds a set created earlier in the same
/// transaction by name).
fn lookup(set: &str) -> Lookup {
    Lookup::default().with_set(set).with_sreg(Register::Reg1)
}

/// Adds the rules of `chains` (already created) of table `t`, in order.
fn add_rules(tx: &mut Tx, side: Side, t: &Table, chains: &[BuiltChain]) -> Result<(), NftError> {
    let fam = side.family_name();
    let name = t.get_name().map(String::as_str).unwrap_or_default().to_string();
    for c in chains {
        let chain = regular_chain(t, c.name);
        for r in &c.rules {
            let (rule, tail) = build_rule(&chain, r)?;
            let desc = format!("rule \"{}\" in chain {fam} {name} {}", r.what, c.name);
            if tail.is_empty() {
                tx.rule(&rule, MsgType::Add, desc);
            } else {
                tx.rule_with_expressions(&rule, &tail, desc)?;
            }
        }
    }
    Ok(())
}

/// Creates the base chains of `side` in table `t` and adds their rules.
fn add_base_chains(
    tx: &mut Tx,
    side: Side,
    t: &Table,
    config: &RulesetConfig,
    chains: &[BuiltChain],
) -> Result<(), NftError> {
    let fam = side.family_name();
    let name = t.get_name().map(String::as_str).unwrap_or_default().to_string();
    for c in chains {
        let Some((_, priority)) = c.hook else { continue };
        match side {
            Side::Requests => {
                let hook = c.hook.map(|(h, _)| h).unwrap_or_default();
                let class = match hook {
                    "input" => HookClass::In,
                    "forward" => HookClass::Forward,
                    "output" => HookClass::Out,
                    other => return Err(NftError::Decode(format!("base chain {}: no hook {other}", c.name))),
                };
                let chain = Chain::new(t)
                    .with_name(c.name)
                    .with_hook(Hook::new(class, priority))
                    .with_type(ChainType::Filter)
                    .with_policy(ChainPolicy::Accept);
                tx.chain(&chain, MsgType::Add, format!("base chain {fam} {name} {} (hook {hook})", c.name));
            }
            Side::Replies => tx.raw(
                egress_chain_message(&name, &config.egress_interfaces, priority),
                format!(
                    "base chain {fam} {name} {EGRESS_CHAIN} (hook egress, devices {:?}; needs Linux 5.16 or later)",
                    config.egress_interfaces
                ),
            ),
        }
    }
    add_rules(tx, side, t, chains)
}

fn regular_chain(t: &Table, name: &str) -> Chain {
    Chain::new(t).with_name(name)
}

fn set_object(side: Side, kind: SetKind, with_id: bool) -> Set {
    // rustables does not derive the set's family from its table: without this the kernel looks the table up in
    // family "unspec" and answers ENOENT.
    let s = Set { family: side.family(), ..Set::default() };
    let mut s = s.with_table(OWNED_TABLE).with_name(kind.name()).with_key_len(6u32);
    if with_id {
        s.set_id(side.set_id_base() + kind.id());
    }
    if kind.is_chaddr() {
        s.with_key_type(NFT_TYPE_INTEGER).with_userdata(UDATA_TYPEOF_CHADDR.to_vec())
    } else {
        s.with_key_type(NFT_TYPE_ETHERADDR).with_userdata(UDATA_KEY_BIG_ENDIAN.to_vec())
    }
}

/// `set SEEN { typeof @th,288,48; flags dynamic,timeout; timeout 1h; }` (size and counter are appended to the
/// message: see [`Tx::set_with_attrs`]).
fn seen_set_object(kind: SeenKind) -> Set {
    let s = Set { family: Side::Requests.family(), ..Set::default() };
    let mut s = s
        .with_table(OWNED_TABLE)
        .with_name(kind.set_name())
        .with_flags(NFT_SET_TIMEOUT | NFT_SET_EVAL)
        .with_timeout(SEEN_TIMEOUT_MS)
        .with_key_type(NFT_TYPE_INTEGER)
        .with_key_len(6u32)
        .with_userdata(UDATA_TYPEOF_CHADDR.to_vec());
    s.set_id(Side::Requests.set_id_base() + kind.id());
    s
}

fn lease_set_object(side: Side, with_id: bool) -> Set {
    let s = Set { family: side.family(), ..Set::default() };
    let mut s = s
        .with_table(OWNED_TABLE)
        .with_name(LEASE_SET)
        .with_flags(NFT_SET_TIMEOUT)
        .with_timeout(LEASE_DEFAULT_TIMEOUT_MS)
        .with_key_type(NFT_TYPE_INET_SERVICE)
        .with_key_len(2u32)
        .with_userdata(UDATA_KEY_BIG_ENDIAN.to_vec());
    if with_id {
        s.set_id(side.set_id_base() + LEASE_SET_ID);
    }
    s
}

/// Adds (or removes) `macs` to (from) a set, in as many messages as needed, all in this transaction.
///
/// Written by hand rather than with rustables' `SetBuilder`, which allocates several times per element: on a full
/// load of 100k MACs those allocations cost more than the kernel's own work on the elements.
fn set_elements(tx: &mut Tx, side: Side, kind: SetKind, macs: &[MacAddr], op: MsgType) -> Result<(), NftError> {
    let (verb, msg_type, flags) = match op {
        MsgType::Add => ("add", NFT_MSG_NEWSETELEM, NLM_F_ACK | NLM_F_CREATE),
        MsgType::Del => ("delete", NFT_MSG_DELSETELEM, NLM_F_ACK),
    };
    let fam = side.family_name();
    // One element: LIST_ELEM { KEY { DATA_VALUE <6 bytes, padded to 8> } } = 4 + 4 + 4 + 8 bytes.
    const ELEMENT_BYTES: usize = 20;
    for (i, chunk) in macs.chunks(ELEMENTS_PER_MESSAGE).enumerate() {
        let mut elements = Vec::with_capacity(chunk.len() * ELEMENT_BYTES);
        for m in chunk {
            nla_header(&mut elements, ELEMENT_BYTES, NFTA_LIST_ELEM | NLA_F_NESTED);
            nla_header(&mut elements, ELEMENT_BYTES - 4, NFTA_SET_ELEM_KEY | NLA_F_NESTED);
            nla(&mut elements, NFTA_DATA_VALUE, &m.octets());
        }
        let mut body = Vec::with_capacity(elements.len() + 64);
        body.extend_from_slice(&nfgen(side.nfproto()));
        nla_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, OWNED_TABLE);
        nla_str(&mut body, NFTA_SET_ELEM_LIST_SET, kind.name());
        nla(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, &elements);
        let first = i * ELEMENTS_PER_MESSAGE + 1;
        tx.raw(
            nft_message(msg_type, flags, &body),
            format!(
                "{verb} elements {first}..{} ({}..) of set {fam} {OWNED_TABLE} {}",
                first + chunk.len() - 1,
                chunk[0],
                kind.name()
            ),
        );
        tx.elements += chunk.len();
    }
    Ok(())
}

/// Appends the header of an attribute of `len` bytes (header included) whose payload follows.
fn nla_header(buf: &mut Vec<u8>, len: usize, ty: u16) {
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
}

/// Rebuilds the agent's tables (one per side the configuration uses) in one transaction: create (no-op if
/// present), delete, create, then sets, elements, chains and rules. Packets see either the old tables or the new
/// ones, never a mix.
pub(crate) fn full_owned(s: &DesiredState, lease_ms: u64) -> Result<Tx, NftError> {
    s.config.validate()?;
    let mut tx = Tx::new();
    for side in Side::for_config(&s.config) {
        full_owned_side(&mut tx, side, s, lease_ms)?;
    }
    Ok(tx)
}

fn full_owned_side(tx: &mut Tx, side: Side, s: &DesiredState, lease_ms: u64) -> Result<(), NftError> {
    let t = owned_table(side);
    let fam = side.family_name();
    let desc = format!("table {fam} {OWNED_TABLE}");
    tx.table(&t, MsgType::Add, format!("{desc} (create)"));
    tx.table(&t, MsgType::Del, format!("{desc} (delete for rebuild)"));
    tx.table(&t, MsgType::Add, format!("{desc} (rebuild)"));
    for k in side.set_kinds(&s.config) {
        let macs: Vec<MacAddr> =
            if k.is_allow() { s.allow.iter().copied().collect() } else { s.deny.iter().copied().collect() };
        let size = set_capacity(macs.len());
        tx.set_with_size(
            &set_object(side, k, true),
            size,
            format!("set {fam} {OWNED_TABLE} {} (size {size})", k.name()),
        );
        set_elements(tx, side, k, &macs, MsgType::Add)?;
    }
    tx.set(&lease_set_object(side, true), MsgType::Add, format!("set {fam} {OWNED_TABLE} {LEASE_SET}"));
    if lease_ms > 0 {
        lease_add(tx, side, &s.config.ports, lease_ms);
    }
    if side == Side::Requests {
        let mut attrs = set_size_attr(SEEN_SIZE);
        attrs.extend(set_counter_attr());
        for k in SeenKind::ALL {
            let desc =
                format!("set {fam} {OWNED_TABLE} {} (dynamic, timeout, size {SEEN_SIZE}, counter)", k.set_name());
            tx.set_with_attrs(&seen_set_object(k), &attrs, desc);
        }
    }
    let chains = owned_rules(side, &s.config, s.mode, s.unknown_mac_policy);
    for c in chains.iter().filter(|c| c.hook.is_none()) {
        tx.chain(&regular_chain(&t, c.name), MsgType::Add, format!("chain {fam} {OWNED_TABLE} {}", c.name));
    }
    let (base, regular): (Vec<BuiltChain>, Vec<BuiltChain>) = chains.into_iter().partition(|c| c.hook.is_some());
    add_rules(tx, side, &t, &regular)?;
    add_base_chains(tx, side, &t, &s.config, &base)
}

/// Flushes and rebuilds the mode-dependent rules.
pub(crate) fn switch_mode(config: &RulesetConfig, mode: Mode, policy: UnknownMacPolicy) -> Result<Tx, NftError> {
    let mut tx = Tx::new();
    for side in Side::for_config(config) {
        let t = table(side, OWNED_TABLE);
        for name in ["pxe", "whitelist", "blacklist"] {
            // A rule deletion naming only table and chain flushes the chain.
            tx.rule(
                &Rule::new(&regular_chain(&t, name))?,
                MsgType::Del,
                format!("flush chain {} {OWNED_TABLE} {name}", side.family_name()),
            );
        }
        add_rules(&mut tx, side, &t, &mode_chains(side, config, mode, policy))?;
    }
    Ok(tx)
}

/// The element changes of an effective delta (only MACs that really change).
pub(crate) fn delta(config: &RulesetConfig, effective: &Delta) -> Result<Tx, NftError> {
    let mut tx = Tx::new();
    for side in Side::for_config(config) {
        for k in side.set_kinds(config) {
            let (add, remove) = if k.is_allow() {
                (&effective.allow_add, &effective.allow_remove)
            } else {
                (&effective.deny_add, &effective.deny_remove)
            };
            set_elements(&mut tx, side, k, remove, MsgType::Del)?;
            set_elements(&mut tx, side, k, add, MsgType::Add)?;
        }
    }
    Ok(tx)
}

/// Moves the lease: flushes the lease set of each side and, when `lease_ms` > 0, adds one element per port that
/// the kernel expires `lease_ms` after it applies the batch. One transaction: a packet sees the old elements or the
/// new ones.
pub(crate) fn lease_refresh(config: &RulesetConfig, lease_ms: u64) -> Tx {
    let mut tx = Tx::new();
    for side in Side::for_config(config) {
        let mut body = nfgen(side.nfproto());
        nla_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, OWNED_TABLE);
        nla_str(&mut body, NFTA_SET_ELEM_LIST_SET, LEASE_SET);
        // DELSETELEM without an element list flushes the set.
        tx.raw(
            nft_message(NFT_MSG_DELSETELEM, NLM_F_ACK, &body),
            format!("flush set {} {OWNED_TABLE} {LEASE_SET}", side.family_name()),
        );
        if lease_ms > 0 {
            lease_add(&mut tx, side, &config.ports, lease_ms);
        }
    }
    tx
}

/// `add element inet ironguard lease { PORT timeout LEASE_MSms, ... }`. rustables cannot give an element its own
/// timeout, so the message is written here.
fn lease_add(tx: &mut Tx, side: Side, ports: &[u16], lease_ms: u64) {
    let mut elements = Vec::new();
    for port in ports {
        let mut key = Vec::new();
        nla(&mut key, NFTA_DATA_VALUE, &port.to_be_bytes());
        let mut elem = Vec::new();
        nla(&mut elem, NFTA_SET_ELEM_KEY | NLA_F_NESTED, &key);
        nla(&mut elem, NFTA_SET_ELEM_TIMEOUT, &lease_ms.to_be_bytes());
        nla(&mut elements, NFTA_LIST_ELEM | NLA_F_NESTED, &elem);
    }
    let mut body = nfgen(side.nfproto());
    nla_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, OWNED_TABLE);
    nla_str(&mut body, NFTA_SET_ELEM_LIST_SET, LEASE_SET);
    nla(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, &elements);
    tx.raw(
        nft_message(NFT_MSG_NEWSETELEM, NLM_F_ACK | NLM_F_CREATE, &body),
        format!(
            "add lease elements {ports:?} timeout {lease_ms}ms to set {} {OWNED_TABLE} {LEASE_SET}",
            side.family_name()
        ),
    );
    tx.elements += ports.len();
}

const NFPROTO_INET: u8 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_EXCL: u16 = 0x200;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_HOOK_DEVS: u16 = 4;
const NFTA_DEVICE_NAME: u16 = 1;
const NF_ACCEPT: u32 = 1;

/// The 4-byte nfgenmsg header: family, version 0, resource id 0.
fn nfgen(family: u8) -> Vec<u8> {
    vec![family, 0, 0, 0]
}

/// Appends one netlink attribute, padded to 4 bytes.
fn nla(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(crate::netlink::align4(buf.len()), 0);
}

fn nla_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    nla(buf, ty, &v);
}

/// One nf_tables message (sequence number filled in by [`Tx`]).
fn nft_message(op: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = 16 + body.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&(NFNL_SUBSYS_NFTABLES << 8 | op).to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// The table flags of the guards now in the kernel, per side (`None`: that side has no guard).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GuardFlags {
    pub(crate) requests: Option<u32>,
    pub(crate) replies: Option<u32>,
}

impl GuardFlags {
    pub(crate) fn get(&self, side: Side) -> Option<u32> {
        match side {
            Side::Requests => self.requests,
            Side::Replies => self.replies,
        }
    }

    pub(crate) fn set(&mut self, side: Side, flags: Option<u32>) {
        match side {
            Side::Requests => self.requests = flags,
            Side::Replies => self.replies = flags,
        }
    }
}

/// Installs or replaces the guard tables in one transaction, with table `flags` (`owner|persist` where the kernel
/// has `persist`; none otherwise): one per side the configuration uses; a guard of a side it does not use is
/// deleted. `existing`: the flags of the guards now in the kernel. An existing guard is deleted and rebuilt in the
/// same batch (a `create` first would have to repeat its flags, which the kernel refuses to change), so DHCP is
/// never open in between.
pub(crate) fn guard_install(config: &RulesetConfig, flags: u32, existing: GuardFlags) -> Result<Tx, NftError> {
    config.validate()?;
    let mut tx = Tx::new();
    for side in Side::ALL {
        let fam = side.family_name();
        if let Some(old) = existing.get(side) {
            tx.table(
                &table(side, GUARD_TABLE).with_flags(old),
                MsgType::Del,
                format!("table {fam} {GUARD_TABLE} (delete for rebuild)"),
            );
        }
        if !Side::for_config(config).any(|s| s == side) {
            continue;
        }
        let t = table(side, GUARD_TABLE).with_flags(flags);
        // Exclusive: if another installer created the guard after `existing` was read, this batch fails as a
        // whole (EEXIST) and is retried from a fresh read, rather than appending a second set of rules to it.
        tx.table_exclusive(&t, format!("table {fam} {GUARD_TABLE} (flags {flags:#x})"));
        add_base_chains(&mut tx, side, &t, config, &guard_rules(side, config))?;
    }
    Ok(tx)
}

/// A table created with `owner|persist` and deleted in the same batch: accepted only by kernels that have
/// `NFT_TABLE_F_PERSIST` (Linux 6.9 and later).
pub(crate) fn persist_probe(name: &str) -> Tx {
    let mut tx = Tx::new();
    let t = table(Side::Requests, name).with_flags(NFT_TABLE_F_OWNER | NFT_TABLE_F_PERSIST);
    tx.table(&t, MsgType::Add, format!("table inet {name} (persist probe)"));
    tx.table(&t, MsgType::Del, format!("table inet {name} (persist probe, delete)"));
    tx
}

/// Removes the guard tables whose current flags are `existing` (nothing to do when there is none).
pub(crate) fn guard_remove(existing: GuardFlags) -> Tx {
    let mut tx = Tx::new();
    for side in Side::ALL {
        if let Some(flags) = existing.get(side) {
            tx.table(
                &table(side, GUARD_TABLE).with_flags(flags),
                MsgType::Del,
                format!("table {} {GUARD_TABLE} (delete)", side.family_name()),
            );
        }
    }
    tx
}

/// The chain (that does not exist) of the invalid object the test hook injects. Only a build with the `test-hooks`
/// feature holds this string.
pub const FAULT_INJECTION_CHAIN: &str = "ironguard-fault-injection";

/// Test hook: appends an object the kernel must reject (a rule in a chain that does not exist).
#[cfg(feature = "test-hooks")]
pub(crate) fn add_invalid_object(tx: &mut Tx) -> Result<(), NftError> {
    let t = table(Side::Requests, OWNED_TABLE);
    let chain = regular_chain(&t, FAULT_INJECTION_CHAIN);
    tx.rule(
        &Rule::new(&chain)?.with_expr(Immediate::new_verdict(VerdictKind::Drop)),
        MsgType::Add,
        format!("rule in chain inet {OWNED_TABLE} {FAULT_INJECTION_CHAIN} (injected fault)"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{Attrs, Message, Messages};

    fn macs(n: usize) -> Vec<MacAddr> {
        (0..n).map(|i| MacAddr::from_octets([0x02, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8, 1]).unwrap()).collect()
    }

    /// Counts, per message type, the set elements actually encoded in a finished batch.
    fn encoded_elements(bytes: &[u8]) -> (usize, Vec<u8>) {
        let mut total = 0;
        let mut families = Vec::new();
        for msg in Messages::new(bytes) {
            let msg = msg.unwrap();
            if msg.nft_op() == Some(12) || msg.nft_op() == Some(14) {
                families.push(msg.payload[0]);
                for attr in msg.nft_attrs().unwrap() {
                    let (ty, v) = attr.unwrap();
                    if ty == 3 {
                        total += Attrs::new(v).count();
                    }
                }
            }
            if msg.nft_op() == Some(9) {
                families.push(msg.payload[0]);
            }
        }
        (total, families)
    }

    #[test]
    fn large_element_lists_are_split_and_nothing_is_truncated() {
        let mut s = DesiredState::default();
        s.deny.extend(macs(100_000));
        s.allow.extend(macs(2_500));
        let tx = full_owned(&s, 0).unwrap().finish();
        let (encoded, families) = encoded_elements(&tx.bytes);
        // both match modes by default: every MAC twice
        assert_eq!(encoded, 2 * (100_000 + 2_500));
        assert_eq!(tx.elements, encoded);
        // every set and element message carries family inet (NFPROTO_INET = 1)
        assert!(!families.is_empty() && families.iter().all(|&f| f == 1), "{families:?}");
    }

    #[test]
    fn one_chunk_is_well_below_the_attribute_limit() {
        let mut tx = Tx::new();
        set_elements(&mut tx, Side::Requests, SetKind::DenyMac, &macs(ELEMENTS_PER_MESSAGE), MsgType::Add).unwrap();
        let f = tx.finish();
        let msg = Messages::new(&f.bytes).nth(1).unwrap().unwrap();
        assert!(msg.payload.len() < 60_000, "{}", msg.payload.len());
    }

    #[test]
    fn rejected_message_is_described() {
        let mut s = DesiredState::default();
        s.deny.extend(macs(2_001));
        let f = full_owned(&s, 0).unwrap().finish();
        let descs: Vec<String> = (1..=f.last_seq()).map(|i| f.describe(i)).collect();
        assert!(descs.iter().any(|d| d.contains("elements 2001..2001") && d.contains("deny_mac")), "{descs:#?}");
        assert_eq!(f.describe(0), "the batch (message 0)");
    }

    #[test]
    fn the_lease_is_flushed_and_readded_in_one_batch() {
        let c = RulesetConfig { ports: vec![67, 4011], ..Default::default() };
        let f = lease_refresh(&c, 1900).finish();
        let msgs: Vec<_> = Messages::new(&f.bytes).map(Result::unwrap).collect();
        // begin, flush (DELSETELEM without elements), add (NEWSETELEM), end
        let ops: Vec<Option<u16>> = msgs.iter().map(|m| m.nft_op()).collect();
        assert_eq!(ops[1..3], [Some(NFT_MSG_DELSETELEM), Some(NFT_MSG_NEWSETELEM)]);
        let attrs = |m: &Message<'_>| m.nft_attrs().unwrap().map(Result::unwrap).map(|(t, _)| t).collect::<Vec<_>>();
        assert_eq!(attrs(&msgs[1]), [NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET], "a flush names no element");
        let (_, elements) = msgs[2].nft_attrs().unwrap().map(Result::unwrap).find(|(t, _)| *t == 3).unwrap();
        let mut seen = vec![];
        for e in Attrs::new(elements) {
            let (_, ev) = e.unwrap();
            let mut port = None;
            let mut timeout = None;
            for (t, v) in Attrs::new(ev).map(Result::unwrap) {
                match t {
                    NFTA_SET_ELEM_KEY => {
                        let (_, d) = Attrs::new(v).next().unwrap().unwrap();
                        port = Some(u16::from_be_bytes([d[0], d[1]]));
                    }
                    NFTA_SET_ELEM_TIMEOUT => timeout = crate::netlink::be_u64(v),
                    _ => {}
                }
            }
            seen.push((port.unwrap(), timeout.unwrap()));
        }
        assert_eq!(seen, [(67, 1900), (4011, 1900)], "one element per port, each with its own timeout");
        assert_eq!(f.describe(1), "flush set inet ironguard lease");
        // Dropping the lease is only the flush.
        assert_eq!(lease_refresh(&c, 0).finish().last_seq(), 1);
    }

    #[test]
    fn mode_switch_does_not_touch_sets() {
        let c = RulesetConfig::default();
        let f = switch_mode(&c, Mode::Leader, UnknownMacPolicy::Allow).unwrap().finish();
        assert_eq!(f.elements, 0);
        assert!(f.descriptions.iter().all(|d| !d.contains("element") && !d.contains("set ")), "{:#?}", f.descriptions);
    }

    #[test]
    fn the_dynset_update_is_what_nft_sends() {
        // `update @seen_requests { @th,288,48 }` as nftables 1.0.6 sends it (`nft --debug=mnl`), without the set id.
        let mut want: Vec<u8> = vec![];
        want.extend([56, 0, 1, 0x80]); // NFTA_LIST_ELEM, nested
        want.extend([11, 0, 1, 0]); //   NFTA_EXPR_NAME
        want.extend(b"dynset\0\0");
        want.extend([40, 0, 2, 0x80]); //   NFTA_EXPR_DATA, nested
        want.extend([18, 0, 1, 0]); //     NFTA_DYNSET_SET_NAME
        want.extend(b"seen_requests\0\0\0");
        want.extend([8, 0, 3, 0, 0, 0, 0, 1]); //     NFTA_DYNSET_OP = NFT_DYNSET_OP_UPDATE (big endian)
        want.extend([8, 0, 4, 0, 0, 0, 0, 1]); //     NFTA_DYNSET_SREG_KEY = NFT_REG_1
        assert_eq!(dynset_update_expr("seen_requests", REG1), want);
        // and the read-back decodes it, after the chaddr load, into the statement it was built from
        let mut data = vec![];
        for (ty, v) in [(1u16, REG1), (2, NFT_PAYLOAD_TRANSPORT_HEADER), (3, CHADDR_OFFSET_BYTES), (4, 6)] {
            nla(&mut data, ty, &v.to_be_bytes());
        }
        let mut payload = vec![];
        nla_str(&mut payload, NFTA_EXPR_NAME, "payload");
        nla(&mut payload, NFTA_EXPR_DATA | NLA_F_NESTED, &data);
        let mut exprs = vec![];
        nla(&mut exprs, NFTA_LIST_ELEM | NLA_F_NESTED, &payload);
        exprs.extend(dynset_update_expr("seen_requests", REG1));
        let (stmts, counts) = crate::rule::decode_expressions(&exprs).unwrap();
        assert_eq!(stmts, [Stmt::ChaddrUpdate { set: "seen_requests".into() }]);
        assert_eq!(counts, None);
    }

    #[test]
    fn an_update_rule_carries_the_dynset_after_rustables_expressions() {
        let c = RulesetConfig { interfaces: vec!["br0".into()], ports: vec![67, 547, 4011], ..Default::default() };
        let chains = seen_chains(&c);
        let names: Vec<&str> = chains.iter().map(|c| c.name).collect();
        assert_eq!(names, ["seen", "passed", ANSWERS_CHAIN]);
        // 547 (DHCPv6, no chaddr) is never recorded
        assert!(chains.iter().all(|c| c.rules.len() == 2), "{chains:#?}");
        assert!(chains.iter().flat_map(|c| &c.rules).all(|r| !r.stmts.iter().any(Stmt::is_verdict)));
        let passed = &chains[1].rules[0];
        assert_eq!(
            crate::rule::text(&passed.stmts),
            "iifname \"br0\" meta nfproto ipv4 meta l4proto udp th dport 67 meta mark & 0x00100000 == 0x00100000 \
             update @seen_passed { @th,288,48 }"
        );
        let f = full_owned(&DesiredState::blocked(c), 0).unwrap().finish();
        let msgs: Vec<_> = Messages::new(&f.bytes).map(Result::unwrap).collect();
        let mut found = 0;
        for (i, m) in msgs.iter().enumerate() {
            if m.nft_op() != Some(6) || !f.describe(i as u32).contains("seen_passed") {
                continue;
            }
            found += 1;
            let (_, exprs) = m.nft_attrs().unwrap().map(Result::unwrap).find(|(t, _)| *t == 4).unwrap();
            let (stmts, _) = crate::rule::decode_expressions(exprs).unwrap();
            assert_eq!(stmts, passed.stmts, "the rule as sent decodes to what was built");
            // the comment is still there after the splice
            let (_, udata) = m.nft_attrs().unwrap().map(Result::unwrap).find(|(t, _)| *t == 7).unwrap();
            assert_eq!(parse_comment(udata).as_deref(), Some(comments::PASSED));
            break;
        }
        assert_eq!(found, 1);
        // nothing may follow an update (it would be silently dropped otherwise)
        let bad = BuiltRule {
            comment: comments::SEEN,
            what: "bad".into(),
            stmts: vec![Stmt::ChaddrUpdate { set: "seen_requests".into() }, Stmt::Accept],
        };
        let t = owned_table(Side::Requests);
        assert!(build_rule(&regular_chain(&t, "seen"), &bad).is_err());
    }

    #[test]
    fn the_observation_sets_are_sized_counted_and_expire() {
        let f = full_owned(&DesiredState::default(), 0).unwrap().finish();
        let msgs: Vec<_> = Messages::new(&f.bytes).map(Result::unwrap).collect();
        let mut names = vec![];
        for m in msgs.iter().filter(|m| m.nft_op() == Some(9)) {
            let attrs: Vec<(u16, Vec<u8>)> =
                m.nft_attrs().unwrap().map(Result::unwrap).map(|(t, v)| (t, v.to_vec())).collect();
            let get = |t: u16| attrs.iter().find(|(ty, _)| *ty == t).map(|(_, v)| v.clone());
            let name = crate::netlink::string(&get(2).unwrap());
            if !name.starts_with("seen_") {
                continue;
            }
            names.push(name);
            assert_eq!(crate::netlink::be_u32(&get(3).unwrap()), Some(NFT_SET_TIMEOUT | NFT_SET_EVAL));
            assert_eq!(crate::netlink::be_u64(&get(11).unwrap()), Some(SEEN_TIMEOUT_MS));
            assert_eq!(get(9).unwrap(), [8, 0, 1, 0, 0, 0, 0x10, 0], "size 4096");
            let expr = get(NFTA_SET_EXPR).unwrap();
            let (_, n) = Attrs::new(&expr).next().unwrap().unwrap();
            assert_eq!(crate::netlink::string(n), "counter");
        }
        assert_eq!(names, ["seen_requests", "seen_passed", "seen_answers"]);
    }

    #[test]
    fn comments_round_trip() {
        assert_eq!(parse_comment(&comment_udata(comments::PASS)).as_deref(), Some(comments::PASS));
        assert_eq!(parse_comment(&[0x05, 0x01]), None);
    }
}
