//! The typed rule model: what one rule of ironguard's tables does, as a list of [`Stmt`]s (`meta l4proto udp`,
//! `th dport 67`, `ether saddr @allow_mac`, `meta mark set …`, `accept`). [`crate::ruleset`] builds every rule
//! from such a list ([`crate::ruleset::guard_rules`], [`crate::ruleset::owned_rules`]) and turns each statement
//! into kernel expressions; the read-back ([`crate::observe`]) decodes the kernel's expressions into the same
//! statements ([`decode_expressions`]), so drift is a comparison of two lists of one type, and a rule edited in
//! place (another verdict, port or mark) differs however it is commented.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::netlink::{self, Attrs, be_u32};
use crate::{MacAddr, NftError};

/// The UDP port field that identifies DHCP traffic: the destination of a request, the source of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortField {
    Dport,
    Sport,
}

impl PortField {
    /// Offset of the field in the transport header.
    fn offset(self) -> u32 {
        match self {
            PortField::Sport => 0,
            PortField::Dport => 2,
        }
    }

    fn of_offset(offset: u32) -> Option<PortField> {
        [PortField::Sport, PortField::Dport].into_iter().find(|f| f.offset() == offset)
    }
}

impl fmt::Display for PortField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortField::Dport => "dport",
            PortField::Sport => "sport",
        })
    }
}

/// One statement of a rule. Each is a fixed sequence of kernel expressions (in brackets below); anything else the
/// kernel holds decodes as [`Stmt::Unknown`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stmt {
    /// `iifname NAME` [meta iifname; cmp eq, 16 bytes].
    IifName(String),
    /// `meta l4proto udp` [meta l4proto; cmp eq 17].
    Udp,
    /// `th dport PORT` [payload transport; cmp eq].
    Port { field: PortField, port: u16 },
    /// `th dport @SET` [payload transport; lookup].
    PortIn { field: PortField, set: String },
    /// `meta nfproto ipv4` [meta nfproto; cmp eq 2] (the inet family).
    NfprotoIpv4,
    /// `meta protocol ip` [meta protocol; cmp eq 0x0800] (the netdev family).
    ProtocolIp,
    /// `meta iiftype ether` [meta iiftype; cmp eq 1].
    IifTypeEther,
    /// `ether saddr @SET` [payload link layer 6..12; lookup].
    EtherSaddrIn { set: String },
    /// `@th,288,48 @SET`: the BOOTP chaddr [payload transport 36..42; lookup].
    ChaddrIn { set: String },
    /// `meta mark & MASK != MARK` [meta mark; bitwise; cmp neq].
    MarkNot { mask: u32, mark: u32 },
    /// `meta mark & MASK == MARK` [meta mark; bitwise; cmp eq]: a packet the agent's own probe socket sent
    /// (`SO_MARK`, which nothing on the wire can set).
    MarkIs { mask: u32, mark: u32 },
    /// `@th,288,48 MAC`: the BOOTP chaddr is one address [payload transport 36..42; cmp eq].
    Chaddr(MacAddr),
    /// `@th,1984,24 0x3501TT`: the DHCP message type, as the first option right after the magic cookie (where every
    /// client and server ironguard meets puts it) [payload transport 248..251; cmp eq].
    DhcpType(DhcpMessage),
    /// `meta mark set meta mark & KEEP ^ XOR` [meta mark; bitwise; meta set mark]: sets the bits of ironguard's
    /// mark (`KEEP` = !mask, `XOR` = mark) or clears them (`XOR` = 0).
    SetMark { keep: u32, xor: u32 },
    /// `update @SET { @th,288,48 }`: adds the BOOTP chaddr to a dynamic set, or refreshes its timeout and counter
    /// [payload transport 36..42; dynset update]. Records, decides nothing: a full set skips the rest of the rule.
    ChaddrUpdate { set: String },
    /// `counter`.
    Counter,
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `jump CHAIN`.
    Jump(String),
    /// Expressions that are none of the above, as the kernel holds them.
    Unknown(String),
}

/// The DHCP message types the probe rules match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DhcpMessage {
    Discover,
    Offer,
}

impl DhcpMessage {
    /// Option 53's value.
    pub fn code(self) -> u8 {
        match self {
            DhcpMessage::Discover => 1,
            DhcpMessage::Offer => 2,
        }
    }

    fn of_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(DhcpMessage::Discover),
            2 => Some(DhcpMessage::Offer),
            _ => None,
        }
    }

    /// The three bytes the rule compares: option 53, length 1, the type.
    pub fn option_bytes(self) -> [u8; 3] {
        [53, 1, self.code()]
    }

    fn option_bytes_u32(self) -> u32 {
        let [a, b, c] = self.option_bytes();
        u32::from_be_bytes([0, a, b, c])
    }
}

impl fmt::Display for DhcpMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DhcpMessage::Discover => "DISCOVER",
            DhcpMessage::Offer => "OFFER",
        })
    }
}

impl Stmt {
    /// Whether this statement is a verdict.
    pub fn is_verdict(&self) -> bool {
        matches!(self, Stmt::Accept | Stmt::Drop | Stmt::Jump(_))
    }

    /// Whether this statement only matches packets (no side effect, no verdict).
    pub fn is_match(&self) -> bool {
        !matches!(self, Stmt::SetMark { .. } | Stmt::Counter | Stmt::ChaddrUpdate { .. }) && !self.is_verdict()
    }
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stmt::IifName(n) => write!(f, "iifname {n:?}"),
            Stmt::Udp => f.write_str("meta l4proto udp"),
            Stmt::Port { field, port } => write!(f, "th {field} {port}"),
            Stmt::PortIn { field, set } => write!(f, "th {field} @{set}"),
            Stmt::NfprotoIpv4 => f.write_str("meta nfproto ipv4"),
            Stmt::ProtocolIp => f.write_str("meta protocol ip"),
            Stmt::IifTypeEther => f.write_str("meta iiftype ether"),
            Stmt::EtherSaddrIn { set } => write!(f, "ether saddr @{set}"),
            Stmt::ChaddrIn { set } => write!(f, "@th,288,48 @{set}"),
            Stmt::MarkNot { mask, mark } => write!(f, "meta mark & {mask:#010x} != {mark:#010x}"),
            Stmt::MarkIs { mask, mark } => write!(f, "meta mark & {mask:#010x} == {mark:#010x}"),
            Stmt::Chaddr(mac) => write!(f, "@th,288,48 {mac}"),
            Stmt::DhcpType(t) => write!(f, "@th,1984,24 {:#08x} (DHCP {t})", t.option_bytes_u32()),
            Stmt::SetMark { keep, xor } => write!(f, "meta mark set meta mark & {keep:#010x} ^ {xor:#010x}"),
            Stmt::ChaddrUpdate { set } => write!(f, "update @{set} {{ @th,288,48 }}"),
            Stmt::Counter => f.write_str("counter"),
            Stmt::Accept => f.write_str("accept"),
            Stmt::Drop => f.write_str("drop"),
            Stmt::Jump(c) => write!(f, "jump {c}"),
            Stmt::Unknown(s) => write!(f, "[{s}]"),
        }
    }
}

/// A rule's statements as one line of nft-like text.
pub fn text(stmts: &[Stmt]) -> String {
    stmts.iter().map(Stmt::to_string).collect::<Vec<_>>().join(" ")
}

/// What a rule does with a packet it matches.
pub fn verdict(stmts: &[Stmt]) -> Option<&Stmt> {
    stmts.iter().rev().find(|s| s.is_verdict())
}

/// Whether the rule matches every packet that reaches it (no match statement).
pub fn unconditional(stmts: &[Stmt]) -> bool {
    !stmts.iter().any(Stmt::is_match)
}

/// Whether the rule sets mark bits and accepts: what lets a packet past the guard.
pub fn marks(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| matches!(s, Stmt::SetMark { xor, .. } if *xor != 0)) && verdict(stmts) == Some(&Stmt::Accept)
}

/// Whether the rule matches only addresses in one of the MAC sets.
pub fn keyed(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| matches!(s, Stmt::EtherSaddrIn { .. } | Stmt::ChaddrIn { .. }))
}

/// Whether the rule drops packets that do not carry a mark (the guard's rule): `meta mark & MASK != MARK drop` with
/// a mark of at least one bit, all inside the mask. (`!= 0` would drop the marked packets and pass the others.)
pub fn drops_unmarked(stmts: &[Stmt]) -> bool {
    let checks_mark =
        stmts.iter().any(|s| matches!(s, Stmt::MarkNot { mask, mark } if *mark != 0 && mark & !mask == 0));
    checks_mark && verdict(stmts) == Some(&Stmt::Drop)
}

// Kernel constants (linux/netfilter/nf_tables.h).
pub(crate) const NFT_META_PROTOCOL: u32 = 1;
pub(crate) const NFT_META_MARK: u32 = 3;
pub(crate) const NFT_META_IIFNAME: u32 = 6;
pub(crate) const NFT_META_IIFTYPE: u32 = 8;
pub(crate) const NFT_META_NFPROTO: u32 = 15;
pub(crate) const NFT_META_L4PROTO: u32 = 16;
pub(crate) const NFT_PAYLOAD_LL_HEADER: u32 = 0;
pub(crate) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ARPHRD_ETHER: u16 = 1;
/// BOOTP `chaddr` is 28 bytes into the BOOTP header, after the 8-byte UDP header: `@th,288,48`.
pub const CHADDR_OFFSET_BYTES: u32 = 36;
/// The first DHCP option: after the 8-byte UDP header, the 236-byte BOOTP header and the 4-byte magic cookie.
pub const FIRST_OPTION_OFFSET_BYTES: u32 = 248;
const ETHER_SADDR_OFFSET: u32 = 6;
const IFNAMSIZ: usize = 16;
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
/// `NFT_DYNSET_OP_UPDATE`: add the key, or refresh the timeout of an element that has it.
pub(crate) const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub(crate) const NFTA_DYNSET_SET_NAME: u16 = 1;
pub(crate) const NFTA_DYNSET_SET_ID: u16 = 2;
pub(crate) const NFTA_DYNSET_OP: u16 = 3;
pub(crate) const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub(crate) const NFTA_DYNSET_TIMEOUT: u16 = 6;
const NFTA_DYNSET_PAD: u16 = 8;
pub(crate) const NFTA_DYNSET_FLAGS: u16 = 9;

/// One kernel expression, decoded far enough to recognise ironguard's statements.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Meta {
        key: u32,
        dreg: Option<u32>,
        sreg: Option<u32>,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Payload {
        dreg: Option<u32>,
        base: u32,
        offset: u32,
        len: u32,
        other: bool,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
        op: u32,
    },
    Lookup {
        set: String,
        sreg: u32,
        dreg: Option<u32>,
        flags: u32,
    },
    /// A dynset: `op` (0 add, 1 update, 2 delete), the key's register, and whether it carries anything more than a
    /// key update with the set's own timeout (a data register, its own timeout, expressions of its own, flags).
    Dynset {
        set: String,
        op: u32,
        sreg_key: u32,
        more: bool,
    },
    Counter,
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    Other(String),
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Meta { key, dreg, sreg } => write!(f, "meta key {key} dreg {dreg:?} sreg {sreg:?}"),
            Expr::Cmp { sreg, op, data } => write!(f, "cmp reg {sreg} op {op} data {}", hex(data)),
            Expr::Payload { dreg, base, offset, len, .. } => {
                write!(f, "payload base {base} offset {offset} len {len} dreg {dreg:?}")
            }
            Expr::Bitwise { mask, xor, op, .. } => write!(f, "bitwise op {op} mask {} xor {}", hex(mask), hex(xor)),
            Expr::Lookup { set, flags, dreg, .. } => write!(f, "lookup @{set} flags {flags} dreg {dreg:?}"),
            Expr::Dynset { set, op, more, .. } => {
                write!(f, "dynset op {op} @{set}{}", if *more { " (more)" } else { "" })
            }
            Expr::Counter => f.write_str("counter"),
            Expr::Verdict { code, chain } => write!(f, "verdict {code} {}", chain.as_deref().unwrap_or("")),
            Expr::Other(name) => write!(f, "{name}"),
        }
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// The payload of the `NFTA_DATA_VALUE` inside a nested data attribute.
fn data_value(v: &[u8]) -> Result<Vec<u8>, NftError> {
    for a in Attrs::new(v) {
        let (ty, d) = a?;
        if ty == 1 {
            return Ok(d.to_vec());
        }
    }
    Ok(Vec::new())
}

/// Decodes one `NFTA_LIST_ELEM` of a rule's `NFTA_RULE_EXPRESSIONS`: the expression's name and data. Counter
/// values are returned apart (`(packets, bytes)`), since they are not part of what the rule does.
fn decode_expression(ev: &[u8]) -> Result<(Expr, Option<Counts>), NftError> {
    let mut name = String::new();
    let mut data: &[u8] = &[];
    for ea in Attrs::new(ev) {
        let (ety, eval) = ea?;
        match ety {
            1 => name = netlink::string(eval),
            2 => data = eval,
            _ => {}
        }
    }
    let u32_of = |v: &[u8]| be_u32(v).unwrap_or(u32::MAX);
    let mut counts = None;
    let expr = match name.as_str() {
        "meta" => {
            let (mut key, mut dreg, mut sreg) = (u32::MAX, None, None);
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => dreg = Some(u32_of(v)),
                    2 => key = u32_of(v),
                    3 => sreg = Some(u32_of(v)),
                    _ => {}
                }
            }
            Expr::Meta { key, dreg, sreg }
        }
        "cmp" => {
            let (mut sreg, mut op, mut d) = (u32::MAX, u32::MAX, Vec::new());
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => sreg = u32_of(v),
                    2 => op = u32_of(v),
                    3 => d = data_value(v)?,
                    _ => {}
                }
            }
            Expr::Cmp { sreg, op, data: d }
        }
        "payload" => {
            let (mut dreg, mut base, mut offset, mut len, mut other) = (None, u32::MAX, u32::MAX, u32::MAX, false);
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => dreg = Some(u32_of(v)),
                    2 => base = u32_of(v),
                    3 => offset = u32_of(v),
                    4 => len = u32_of(v),
                    // a payload write (sreg, checksum) is not a match
                    5..=8 => other = true,
                    _ => {}
                }
            }
            Expr::Payload { dreg, base, offset, len, other }
        }
        "bitwise" => {
            let (mut sreg, mut dreg, mut len, mut op) = (u32::MAX, u32::MAX, u32::MAX, 0);
            let (mut mask, mut xor) = (Vec::new(), Vec::new());
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => sreg = u32_of(v),
                    2 => dreg = u32_of(v),
                    3 => len = u32_of(v),
                    4 => mask = data_value(v)?,
                    5 => xor = data_value(v)?,
                    6 => op = u32_of(v),
                    // a shift or boolean operand: not a mask/xor
                    7 => op = u32::MAX,
                    _ => {}
                }
            }
            Expr::Bitwise { sreg, dreg, len, mask, xor, op }
        }
        "lookup" => {
            let (mut set, mut sreg, mut dreg, mut flags) = (String::new(), u32::MAX, None, 0);
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => set = netlink::string(v),
                    2 => sreg = u32_of(v),
                    3 => dreg = Some(u32_of(v)),
                    5 => flags = u32_of(v),
                    _ => {}
                }
            }
            Expr::Lookup { set, sreg, dreg, flags }
        }
        "dynset" => {
            let (mut set, mut op, mut sreg_key, mut more) = (String::new(), u32::MAX, u32::MAX, false);
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    NFTA_DYNSET_SET_NAME => set = netlink::string(v),
                    NFTA_DYNSET_OP => op = u32_of(v),
                    NFTA_DYNSET_SREG_KEY => sreg_key = u32_of(v),
                    // the kernel lists the timeout always: 0 is the set's own
                    NFTA_DYNSET_TIMEOUT => more |= netlink::be_u64(v) != Some(0),
                    NFTA_DYNSET_FLAGS => more |= be_u32(v) != Some(0),
                    NFTA_DYNSET_SET_ID | NFTA_DYNSET_PAD => {}
                    _ => more = true,
                }
            }
            Expr::Dynset { set, op, sreg_key, more }
        }
        "counter" => {
            let (mut bytes, mut packets) = (0, 0);
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => bytes = netlink::be_u64(v).unwrap_or(0),
                    2 => packets = netlink::be_u64(v).unwrap_or(0),
                    _ => {}
                }
            }
            counts = Some((packets, bytes));
            Expr::Counter
        }
        "immediate" => {
            let mut verdict = None;
            let mut dreg = u32::MAX;
            for a in Attrs::new(data) {
                let (ty, v) = a?;
                match ty {
                    1 => dreg = u32_of(v),
                    2 => {
                        for d in Attrs::new(v) {
                            let (dty, dv) = d?;
                            if dty != 2 {
                                continue; // NFTA_DATA_VERDICT only
                            }
                            let (mut code, mut chain) = (None, None);
                            for va in Attrs::new(dv) {
                                let (vty, vv) = va?;
                                match vty {
                                    1 => code = be_u32(vv).map(|c| c as i32),
                                    2 => chain = Some(netlink::string(vv)),
                                    _ => {}
                                }
                            }
                            verdict = code.map(|code| Expr::Verdict { code, chain });
                        }
                    }
                    _ => {}
                }
            }
            // NFT_REG_VERDICT is register 0
            match verdict {
                Some(v) if dreg == 0 => v,
                _ => Expr::Other("immediate (not a verdict)".into()),
            }
        }
        other => Expr::Other(other.to_string()),
    };
    Ok((expr, counts))
}

/// A counter's packets and bytes.
pub(crate) type Counts = (u64, u64);

/// Decodes a rule's `NFTA_RULE_EXPRESSIONS` into statements, and the counter's packets and bytes if it has one.
/// Never panics: what it does not recognise is kept as [`Stmt::Unknown`].
pub(crate) fn decode_expressions(v: &[u8]) -> Result<(Vec<Stmt>, Option<Counts>), NftError> {
    let mut exprs = Vec::new();
    let mut counts = None;
    for e in Attrs::new(v) {
        let (_, ev) = e?;
        let (expr, c) = decode_expression(ev)?;
        counts = counts.or(c);
        exprs.push(expr);
    }
    Ok((statements(&exprs), counts))
}

/// Groups decoded expressions into statements.
fn statements(exprs: &[Expr]) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut rest = exprs;
    while let Some(first) = rest.first() {
        let (stmt, used) = statement(rest).unwrap_or_else(|| (Stmt::Unknown(first.to_string()), 1));
        out.push(stmt);
        rest = &rest[used..];
    }
    out
}

/// The statement at the start of `exprs`, and how many expressions it uses.
fn statement(exprs: &[Expr]) -> Option<(Stmt, usize)> {
    use Expr::*;
    match exprs {
        [
            Meta { key: NFT_META_MARK, dreg: Some(r), sreg: None },
            Bitwise { sreg, dreg, len: 4, mask, xor, op: 0 },
            Cmp { sreg: c, op: 1, data },
            ..,
        ] if sreg == r && dreg == c && xor.iter().all(|b| *b == 0) => {
            Some((Stmt::MarkNot { mask: ne_u32(mask)?, mark: ne_u32(data)? }, 3))
        }
        [
            Meta { key: NFT_META_MARK, dreg: Some(r), sreg: None },
            Bitwise { sreg, dreg, len: 4, mask, xor, op: 0 },
            Cmp { sreg: c, op: 0, data },
            ..,
        ] if sreg == r && dreg == c && xor.iter().all(|b| *b == 0) => {
            Some((Stmt::MarkIs { mask: ne_u32(mask)?, mark: ne_u32(data)? }, 3))
        }
        [
            Meta { key: NFT_META_MARK, dreg: Some(r), sreg: None },
            Bitwise { sreg, dreg, len: 4, mask, xor, op: 0 },
            Meta { key: NFT_META_MARK, dreg: None, sreg: Some(s) },
            ..,
        ] if sreg == r && dreg == s => Some((Stmt::SetMark { keep: ne_u32(mask)?, xor: ne_u32(xor)? }, 3)),
        [Meta { key, dreg: Some(r), sreg: None }, Cmp { sreg, op: 0, data }, ..] if sreg == r => {
            let stmt = match *key {
                NFT_META_IIFNAME if data.len() == IFNAMSIZ && data.contains(&0) => {
                    let name = netlink::string(data);
                    // exactly the name, NUL-padded: not a prefix match
                    (!name.is_empty() && data[name.len()..].iter().all(|b| *b == 0)).then_some(Stmt::IifName(name))?
                }
                NFT_META_L4PROTO if data[..] == [IPPROTO_UDP] => Stmt::Udp,
                NFT_META_NFPROTO if data[..] == [NFPROTO_IPV4] => Stmt::NfprotoIpv4,
                NFT_META_PROTOCOL if data[..] == ETH_P_IP.to_be_bytes() => Stmt::ProtocolIp,
                NFT_META_IIFTYPE if data[..] == ARPHRD_ETHER.to_ne_bytes() => Stmt::IifTypeEther,
                _ => return None,
            };
            Some((stmt, 2))
        }
        [
            Payload { dreg: Some(r), base: NFT_PAYLOAD_TRANSPORT_HEADER, offset, len: 2, other: false },
            Cmp { sreg, op: 0, data },
            ..,
        ] if sreg == r && data.len() == 2 => {
            let field = PortField::of_offset(*offset)?;
            Some((Stmt::Port { field, port: u16::from_be_bytes([data[0], data[1]]) }, 2))
        }
        [
            Payload {
                dreg: Some(r),
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: CHADDR_OFFSET_BYTES,
                len: 6,
                other: false,
            },
            Cmp { sreg, op: 0, data },
            ..,
        ] if sreg == r => Some((Stmt::Chaddr(MacAddr::from_octets(data[..].try_into().ok()?).ok()?), 2)),
        [
            Payload {
                dreg: Some(r),
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: FIRST_OPTION_OFFSET_BYTES,
                len: 3,
                other: false,
            },
            Cmp { sreg, op: 0, data },
            ..,
        ] if sreg == r && data.len() == 3 && data[..2] == [53, 1] => {
            Some((Stmt::DhcpType(DhcpMessage::of_code(data[2])?), 2))
        }
        [
            Payload { dreg: Some(r), base, offset, len, other: false },
            Lookup { set, sreg, dreg: None, flags: 0 },
            ..,
        ] if sreg == r => {
            let set = set.clone();
            let stmt = match (*base, *offset, *len) {
                (NFT_PAYLOAD_TRANSPORT_HEADER, o, 2) => Stmt::PortIn { field: PortField::of_offset(o)?, set },
                (NFT_PAYLOAD_TRANSPORT_HEADER, CHADDR_OFFSET_BYTES, 6) => Stmt::ChaddrIn { set },
                (NFT_PAYLOAD_LL_HEADER, ETHER_SADDR_OFFSET, 6) => Stmt::EtherSaddrIn { set },
                _ => return None,
            };
            Some((stmt, 2))
        }
        [
            Payload {
                dreg: Some(r),
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: CHADDR_OFFSET_BYTES,
                len: 6,
                other: false,
            },
            Dynset { set, op: NFT_DYNSET_OP_UPDATE, sreg_key, more: false },
            ..,
        ] if sreg_key == r => Some((Stmt::ChaddrUpdate { set: set.clone() }, 2)),
        [Counter, ..] => Some((Stmt::Counter, 1)),
        [Verdict { code, chain }, ..] => {
            let stmt = match (*code, chain) {
                (NF_ACCEPT, None) => Stmt::Accept,
                (NF_DROP, None) => Stmt::Drop,
                (NFT_JUMP, Some(c)) => Stmt::Jump(c.clone()),
                _ => return None,
            };
            Some((stmt, 1))
        }
        _ => None,
    }
}

/// A 4-byte register value in host byte order (how the kernel keeps the mark).
fn ne_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_print_like_nft() {
        let r = [
            Stmt::IifName("br0".into()),
            Stmt::Udp,
            Stmt::Port { field: PortField::Dport, port: 67 },
            Stmt::MarkNot { mask: 0x10_0000, mark: 0x10_0000 },
            Stmt::Counter,
            Stmt::Drop,
        ];
        assert_eq!(
            text(&r),
            "iifname \"br0\" meta l4proto udp th dport 67 meta mark & 0x00100000 != 0x00100000 counter drop"
        );
        assert!(drops_unmarked(&r) && !marks(&r) && !unconditional(&r) && !keyed(&r));
        assert_eq!(verdict(&r), Some(&Stmt::Drop));
        assert!(unconditional(&[Stmt::Counter, Stmt::Drop]));
    }

    #[test]
    fn expressions_that_are_no_statement_are_kept_as_unknown() {
        // a payload load followed by a comparison other than equality
        let exprs = [
            Expr::Payload { dreg: Some(1), base: 2, offset: 2, len: 2, other: false },
            Expr::Cmp { sreg: 1, op: 4, data: vec![0, 67] },
            Expr::Counter,
            Expr::Verdict { code: -5, chain: None },
        ];
        let s = statements(&exprs);
        assert_eq!(s.len(), 4, "{s:?}");
        assert!(matches!(&s[0], Stmt::Unknown(t) if t.contains("payload base 2 offset 2")), "{s:?}");
        assert!(matches!(&s[1], Stmt::Unknown(t) if t.contains("op 4")), "{s:?}");
        assert_eq!(s[2], Stmt::Counter);
        assert!(matches!(&s[3], Stmt::Unknown(t) if t.contains("verdict -5")), "{s:?}");
        // registers that do not chain are not a statement
        let crossed = [
            Expr::Meta { key: NFT_META_L4PROTO, dreg: Some(1), sreg: None },
            Expr::Cmp { sreg: 2, op: 0, data: vec![17] },
        ];
        assert!(statements(&crossed).iter().all(|s| matches!(s, Stmt::Unknown(_))));
        // an inverted lookup (`!= @set`) is not a set match
        let inverted = [
            Expr::Payload { dreg: Some(1), base: 0, offset: 6, len: 6, other: false },
            Expr::Lookup { set: "allow_mac".into(), sreg: 1, dreg: None, flags: 1 },
        ];
        assert!(statements(&inverted).iter().all(|s| matches!(s, Stmt::Unknown(_))));
    }
}
