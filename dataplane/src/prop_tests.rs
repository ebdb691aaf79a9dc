//! Property tests of the pure netlink decoders: the read-back of both tables (`observe`'s table, chain, rule, set
//! and set-element decoders), the acknowledgement parser of the batch loop, the notification filter of the guard
//! monitor and the rule-comment parser. They read what the kernel (or anything else on the netlink bus) sends, so
//! on any bytes they must return a value or an `NftError::Decode`, never panic; and on the messages ironguard itself
//! writes they must read back exactly the state that was written (no drift).
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use proptest::prelude::*;

use crate::model::{DesiredState, HookKind, MatchMode, Mode, RulesetConfig, UnknownMacPolicy};
use crate::monitor::guard_event;
use crate::netlink::{Attrs, Message, Messages, parse_error};
use crate::observe::{
    ElementTally, Observed, ObservedTable, decode_chain, decode_rule, decode_set, decode_table, element_key,
};
use crate::ruleset::{self, EGRESS_CHAIN, GUARD_TABLE, LEASE_SET, OWNED_TABLE, Side, parse_comment};
use crate::{MacAddr, NftError};

const DEFAULT_CASES: u32 = 2000;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/prop_tests.txt");

/// Runs one property for `IRONGUARD_PROPTEST_CASES` cases (default [`DEFAULT_CASES`]) and prints how many ran.
fn check<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let cases = ironguard_testkit::prop::cases(ironguard_testkit::prop::CASES_VAR, DEFAULT_CASES);
    ironguard_testkit::prop::check(REGRESSIONS, name, cases, strategy, test);
}

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NLMSG_ERROR: u16 = 2;

/// nf_tables operations (low byte of the message type).
mod op {
    pub const NEWTABLE: u16 = 0;
    pub const NEWCHAIN: u16 = 3;
    pub const NEWRULE: u16 = 6;
    pub const NEWSET: u16 = 9;
    pub const NEWSETELEM: u16 = 12;
}

fn nft_op(m: &Message<'_>) -> Option<u16> {
    (m.ty >> 8 == NFNL_SUBSYS_NFTABLES).then_some(m.ty & 0xff)
}

/// Every decoder on every message of `buf`: they may refuse a message, but only with a decode error.
fn decode_everything(buf: &[u8], portid: u32) -> Result<(), TestCaseError> {
    let decode_only = |r: Result<(), NftError>| -> Result<(), TestCaseError> {
        match r {
            Ok(()) | Err(NftError::Decode(_)) => Ok(()),
            Err(e) => Err(TestCaseError::fail(format!("not a decode error: {e}"))),
        }
    };
    for msg in Messages::new(buf) {
        let Ok(msg) = msg else { continue };
        decode_only(decode_table(&msg).map(drop))?;
        decode_only(decode_chain(&msg).map(drop))?;
        decode_only(decode_rule(&msg).map(drop))?;
        decode_only(decode_set(&msg).map(drop))?;
        let mut tally = ElementTally::default();
        decode_only(tally.add(&msg, true))?;
        prop_assert!(tally.members.len() + tally.invalid <= tally.count);
        decode_only(parse_error(&msg).map(drop))?;
        if let Ok(attrs) = msg.nft_attrs() {
            for (_, v) in attrs.flatten() {
                let _ = parse_comment(v);
                let _ = element_key(v);
            }
        }
    }
    decode_only(guard_event(buf, portid).map(drop))
}

/// One netlink message around `payload`.
fn message(ty: u16, flags: u16, portid: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + payload.len());
    m.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&portid.to_ne_bytes());
    m.extend_from_slice(payload);
    m.resize(crate::netlink::align4(m.len()), 0);
    m
}

/// A netlink attribute tree: well-formed lengths, arbitrary types and contents, so the decoders get past the
/// framing and meet wrong types, short values, missing and repeated attributes.
#[derive(Debug, Clone)]
enum Attr {
    Leaf(u16, Vec<u8>),
    Nested(u16, Vec<Attr>),
}

impl Attr {
    fn encode(&self, out: &mut Vec<u8>) {
        let (ty, body) = match self {
            Attr::Leaf(ty, v) => (*ty, v.clone()),
            Attr::Nested(ty, children) => {
                let mut b = Vec::new();
                for c in children {
                    c.encode(&mut b);
                }
                (*ty | 0x8000, b)
            }
        };
        // An attribute longer than 16 bits cannot be written; keep the tree small enough.
        let len = (4 + body.len()).min(u16::MAX as usize);
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(&body[..len - 4]);
        out.resize(crate::netlink::align4(out.len()), 0);
    }
}

fn attr_tree() -> impl Strategy<Value = Attr> {
    let value = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..12),
        // strings and NUL-terminated strings, as the table / chain / set names are
        prop::sample::select(vec!["ironguard", "ironguard_guard", "counter", "lookup", "lease", "allow_mac", "pxe"])
            .prop_map(|s| {
                let mut v = s.as_bytes().to_vec();
                v.push(0);
                v
            }),
        any::<u32>().prop_map(|n| n.to_be_bytes().to_vec()),
        any::<u64>().prop_map(|n| n.to_be_bytes().to_vec()),
        any::<[u8; 6]>().prop_map(|o| o.to_vec()),
    ];
    let leaf = (0u16..12, value).prop_map(|(t, v)| Attr::Leaf(t, v));
    leaf.prop_recursive(3, 32, 6, |inner| {
        (0u16..12, prop::collection::vec(inner, 0..6)).prop_map(|(t, c)| Attr::Nested(t, c))
    })
}

/// One message of any nf_tables kind (or an error / done message) whose payload is an attribute tree.
fn structured_message() -> impl Strategy<Value = Vec<u8>> {
    let ty = prop_oneof![
        (0u16..24).prop_map(|op| NFNL_SUBSYS_NFTABLES << 8 | op),
        Just(NLMSG_ERROR),
        Just(3u16),
        any::<u16>(),
    ];
    let flags = prop_oneof![Just(0u16), Just(0x2), Just(0x10), Just(0x100 | 0x200), Just(0x200), any::<u16>()];
    (ty, flags, any::<u32>(), any::<[u8; 4]>(), prop::collection::vec(attr_tree(), 0..6)).prop_map(
        |(ty, flags, portid, nfgen, attrs)| {
            let mut payload = nfgen.to_vec();
            for a in &attrs {
                a.encode(&mut payload);
            }
            message(ty, flags, portid, &payload)
        },
    )
}

fn macs(max: usize) -> impl Strategy<Value = BTreeSet<MacAddr>> {
    let mac = any::<[u8; 6]>().prop_map(|mut o| {
        o[0] &= 0xfe; // unicast
        o[5] |= 1; // not all-zero
        MacAddr::from_octets(o).unwrap()
    });
    prop::collection::btree_set(mac, 0..max)
}

fn desired_state() -> impl Strategy<Value = DesiredState> {
    let config = (
        prop::sample::select(vec![MatchMode::Chaddr, MatchMode::EtherSaddr, MatchMode::Both]),
        prop::sample::select(vec![vec![67u16], vec![67, 4011], vec![4011]]),
        prop::sample::select(vec![
            vec![],
            vec![HookKind::Input],
            vec![HookKind::Forward],
            vec![HookKind::Input, HookKind::Forward],
        ]),
        prop::sample::select(vec![vec![], vec!["eth0".to_string()], vec!["eth0".to_string(), "br-pxe".to_string()]]),
        prop::sample::select(vec![vec![], vec!["eth1".to_string()], vec!["eth2".to_string(), "eth1".to_string()]]),
    )
        .prop_map(|(match_mode, ports, hooks, interfaces, egress_interfaces)| RulesetConfig {
            match_mode,
            ports,
            // no hook and no egress interface is refused; the input hook stands in
            hooks: if hooks.is_empty() && egress_interfaces.is_empty() { vec![HookKind::Input] } else { hooks },
            interfaces,
            egress_interfaces,
            ..RulesetConfig::default()
        });
    (
        config,
        prop::sample::select(vec![Mode::Blocked, Mode::Follower, Mode::Leader]),
        prop::sample::select(vec![UnknownMacPolicy::Allow, UnknownMacPolicy::Deny]),
        macs(40),
        macs(40),
    )
        .prop_map(|(config, mode, unknown_mac_policy, allow, deny)| DesiredState {
            config,
            mode,
            unknown_mac_policy,
            allow,
            deny,
        })
}

/// The messages ironguard sends to build the guard and the agent's table for `s`: the kernel answers dumps with
/// messages of the same layout.
fn written(s: &DesiredState, lease_ms: u64) -> Vec<u8> {
    let mut bytes = ruleset::guard_install(&s.config, 0, Default::default()).unwrap().finish().bytes;
    bytes.extend(ruleset::full_owned(s, lease_ms).unwrap().finish().bytes);
    bytes
}

/// The read-back of `bytes` as `observe` assembles it, with members.
fn read_back(bytes: &[u8]) -> Result<Observed, NftError> {
    let mut tables: Vec<ObservedTable> = Vec::new();
    let mut chains = Vec::new();
    let mut rules = Vec::new();
    let mut sets = Vec::new();
    let mut elements: Vec<(u8, String, String, Vec<u8>)> = Vec::new();
    let fam = |m: &Message<'_>| m.payload.first().copied().unwrap_or(0);
    for msg in Messages::new(bytes) {
        let msg = msg?;
        match nft_op(&msg) {
            Some(op::NEWTABLE) => {
                let t = decode_table(&msg)?;
                if !tables.iter().any(|x| x.name == t.name && x.family == t.family) {
                    tables.push(t);
                }
            }
            Some(op::NEWCHAIN) => chains.push((fam(&msg), decode_chain(&msg)?)),
            Some(op::NEWRULE) => rules.push((fam(&msg), decode_rule(&msg)?)),
            Some(op::NEWSET) => sets.push((fam(&msg), decode_set(&msg)?)),
            Some(op::NEWSETELEM) => {
                let mut table = String::new();
                let mut set = String::new();
                for a in msg.nft_attrs()? {
                    let (ty, v) = a?;
                    match ty {
                        1 => table = crate::netlink::string(v),
                        2 => set = crate::netlink::string(v),
                        _ => {}
                    }
                }
                elements.push((fam(&msg), table, set, message(msg.ty, msg.flags, msg.portid, msg.payload)));
            }
            _ => {}
        }
    }
    for t in &mut tables {
        let f = if t.family == "netdev" { 5 } else { 1 };
        t.chains =
            chains.iter().filter(|(cf, (tn, _))| *cf == f && *tn == t.name).map(|(_, (_, c))| c.clone()).collect();
        for (rf, (tn, cn, r)) in &rules {
            if *rf == f && *tn == t.name {
                if let Some(c) = t.chains.iter_mut().find(|c| c.name == *cn) {
                    c.rules.push(r.clone());
                }
            }
        }
        t.sets = sets.iter().filter(|(sf, (tn, _))| *sf == f && *tn == t.name).map(|(_, (_, s))| s.clone()).collect();
        for s in &mut t.sets {
            let mut tally = ElementTally::default();
            for (ef, tn, sn, raw) in &elements {
                if *ef == f && *tn == t.name && *sn == s.name {
                    for m in Messages::new(raw) {
                        tally.add(&m?, s.name != LEASE_SET)?;
                    }
                }
            }
            s.elements = tally.count;
            s.invalid_members = tally.invalid;
            s.expires_in_ms = tally.expires;
            s.members = Some(tally.members);
        }
    }
    let take = |family: &str, name: &str| tables.iter().find(|t| t.family == family && t.name == name).cloned();
    Ok(Observed {
        guard: take("inet", GUARD_TABLE),
        owned: take("inet", OWNED_TABLE),
        egress_guard: take("netdev", GUARD_TABLE),
        egress_owned: take("netdev", OWNED_TABLE),
    })
}

#[test]
fn what_ironguard_writes_reads_back_without_drift() {
    check("nft_read_back_of_written_state", (desired_state(), 0u64..5000), |(s, lease_ms)| {
        let bytes = written(&s, lease_ms);
        let observed = read_back(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(observed.drift(&s), Vec::<String>::new());
        prop_assert_eq!(observed.present_sides(), Side::for_config(&s.config).collect::<Vec<_>>());
        for side in Side::for_config(&s.config) {
            let (guard, owned) = observed.side(side);
            let owned = owned.unwrap();
            prop_assert_eq!(owned.mode(), s.mode);
            prop_assert_eq!(
                owned.has_pass_rule(),
                s.mode == Mode::Leader && s.unknown_mac_policy == UnknownMacPolicy::Allow
            );
            for set in &owned.sets {
                prop_assert_eq!(set.invalid_members, 0, "set {}", set.name);
            }
            // (The kernel adds each element's expiration to its dump; what ironguard writes is only the timeout.)
            let lease = owned.set(LEASE_SET).unwrap();
            if lease_ms > 0 {
                prop_assert_eq!(lease.elements, s.config.ports.len());
            } else {
                prop_assert_eq!(lease.elements, 0);
            }
            prop_assert!(guard.unwrap().guard_drops());
            if side == Side::Replies {
                let mut want = s.config.egress_interfaces.clone();
                want.sort();
                prop_assert_eq!(&owned.chain(EGRESS_CHAIN).unwrap().devices, &want);
                prop_assert_eq!(owned.chain(EGRESS_CHAIN).unwrap().hook.as_deref(), Some(EGRESS_CHAIN));
            }
        }
        Ok(())
    });
}

/// Byte-level damage: flips, overwrites (lengths included), truncation, insertion, deletion.
#[derive(Debug, Clone)]
enum Damage {
    Set(prop::sample::Index, u8),
    Xor(prop::sample::Index, u8),
    Length(prop::sample::Index, u16),
    Truncate(prop::sample::Index),
    Insert(prop::sample::Index, Vec<u8>),
    Delete(prop::sample::Index, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    let i = any::<prop::sample::Index>;
    prop_oneof![
        (i(), any::<u8>()).prop_map(|(a, b)| Damage::Set(a, b)),
        (i(), 1u8..=255).prop_map(|(a, b)| Damage::Xor(a, b)),
        (i(), prop_oneof![0u16..8, any::<u16>()]).prop_map(|(a, b)| Damage::Length(a, b)),
        i().prop_map(Damage::Truncate),
        (i(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(a, b)| Damage::Insert(a, b)),
        (i(), 1usize..32).prop_map(|(a, n)| Damage::Delete(a, n)),
    ]
}

fn apply_damage(bytes: &mut Vec<u8>, d: &Damage) {
    if bytes.is_empty() {
        return;
    }
    match d {
        Damage::Set(at, b) => {
            let i = at.index(bytes.len());
            bytes[i] = *b;
        }
        Damage::Xor(at, b) => {
            let i = at.index(bytes.len());
            bytes[i] ^= *b;
        }
        Damage::Length(at, len) => {
            // Attribute and message lengths sit at 4-byte boundaries: aim there.
            let i = at.index(bytes.len()) & !3;
            if i + 2 <= bytes.len() {
                bytes[i..i + 2].copy_from_slice(&len.to_ne_bytes());
            }
        }
        Damage::Truncate(at) => bytes.truncate(at.index(bytes.len())),
        Damage::Insert(at, v) => {
            let i = at.index(bytes.len() + 1);
            bytes.splice(i..i, v.iter().copied());
        }
        Damage::Delete(at, n) => {
            let i = at.index(bytes.len());
            let end = (i + n).min(bytes.len());
            bytes.drain(i..end);
        }
    }
}

#[test]
fn damaged_kernel_messages_are_refused_not_panicked_on() {
    let strategy = (desired_state(), 0u64..5000, prop::collection::vec(damage(), 1..8), any::<u32>());
    check("nft_decoders_on_damaged_messages", strategy, |(s, lease_ms, damage, portid)| {
        let mut bytes = written(&s, lease_ms);
        for d in &damage {
            apply_damage(&mut bytes, d);
        }
        decode_everything(&bytes, portid)?;
        // The whole read-back either reads something or says why not.
        match read_back(&bytes) {
            Ok(_) | Err(NftError::Decode(_)) => Ok(()),
            Err(e) => Err(TestCaseError::fail(format!("not a decode error: {e}"))),
        }
    });
}

#[test]
fn arbitrary_bytes_are_refused_not_panicked_on() {
    check(
        "nft_decoders_on_arbitrary_bytes",
        (prop::collection::vec(any::<u8>(), 0..512), any::<u32>()),
        |(bytes, portid)| decode_everything(&bytes, portid),
    );
}

#[test]
fn well_framed_messages_with_arbitrary_attributes_are_decoded_or_refused() {
    let strategy = (prop::collection::vec(structured_message(), 1..6), any::<u32>());
    check("nft_decoders_on_arbitrary_attributes", strategy, |(messages, portid)| {
        let datagram: Vec<u8> = messages.concat();
        decode_everything(&datagram, portid)?;
        // Framing is intact, so the message iterator sees every message.
        prop_assert_eq!(Messages::new(&datagram).filter(Result::is_ok).count(), messages.len());
        Ok(())
    });
}

#[test]
fn acknowledgements_of_any_shape_are_parsed_or_refused() {
    let strategy = (any::<i32>(), any::<u32>(), any::<u16>(), prop::collection::vec(any::<u8>(), 0..64), any::<bool>());
    check("nft_ack_parser", strategy, |(errno, seq, flags, tail, with_tlv)| {
        // nlmsgerr: -errno, then the original header (with its sequence number), then maybe TLVs.
        let mut payload = (-(errno as i64) as i32).to_ne_bytes().to_vec();
        let mut orig = message(0, 0, 0, &[]);
        orig[8..12].copy_from_slice(&seq.to_ne_bytes());
        payload.extend_from_slice(&orig[..16]);
        if with_tlv {
            let mut text = tail.clone();
            text.push(0);
            Attr::Leaf(1, text).encode(&mut payload);
        } else {
            payload.extend_from_slice(&tail);
        }
        let bytes = message(NLMSG_ERROR, flags, 0, &payload);
        let msg = Messages::new(&bytes).next().unwrap().unwrap();
        let got_seq = parse_error(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?.seq;
        prop_assert_eq!(got_seq, seq);
        // Cut anywhere, it is refused or parsed, never a panic.
        for cut in 0..bytes.len() {
            decode_everything(&bytes[..cut], 0)?;
        }
        Ok(())
    });
}

#[test]
fn rule_comments_parse_from_any_userdata() {
    let comment = "[ -~]{0,200}";
    check("nft_comment_parser", (prop::collection::vec(any::<u8>(), 0..300), comment), |(udata, text)| {
        let _ = parse_comment(&udata);
        // What nft writes (type 0, length, NUL-terminated text) reads back.
        let mut written = vec![0u8, (text.len() + 1) as u8];
        written.extend_from_slice(text.as_bytes());
        written.push(0);
        prop_assert_eq!(parse_comment(&written), Some(text));
        Ok(())
    });
}

#[test]
fn attribute_iteration_always_ends() {
    check("nft_attrs_terminate", prop::collection::vec(any::<u8>(), 0..256), |bytes| {
        // Each step consumes at least 4 bytes or ends the iteration.
        prop_assert!(Attrs::new(&bytes).count() <= bytes.len() / 4 + 1);
        prop_assert!(Messages::new(&bytes).count() <= bytes.len() / 16 + 1);
        Ok(())
    });
}
