//! Property tests of [`MacAddr`] parsing, the first check every MAC from outside goes through (gRPC, CLI, ramdisk
//! data, Ironic ports): on any string it never panics, it accepts exactly the unicast addresses written as six
//! two-digit hexadecimal octets separated all by ':' or all by '-', and what it accepts prints back canonically.
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ironguard_dataplane::MacAddr;
use proptest::prelude::*;

const DEFAULT_CASES: u32 = 4000;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proptest-regressions/prop_mac.txt");

/// Runs one property for `IRONGUARD_PROPTEST_CASES` cases (default [`DEFAULT_CASES`]) and prints how many ran.
fn check<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let cases = ironguard_testkit::prop::cases(ironguard_testkit::prop::CASES_VAR, DEFAULT_CASES);
    ironguard_testkit::prop::check(REGRESSIONS, name, cases, strategy, test);
}

/// The rule, written independently of the parser: six two-character hexadecimal octets, all separated by ':' or
/// all by '-'; not all-zero, not multicast (which covers broadcast).
fn oracle(s: &str) -> Option<[u8; 6]> {
    let sep = match (s.contains(':'), s.contains('-')) {
        (true, false) => ':',
        (false, true) => '-',
        _ => return None,
    };
    let parts: Vec<&str> = s.split(sep).collect();
    if parts.len() != 6 || !parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit())) {
        return None;
    }
    let mut o = [0u8; 6];
    for (octet, part) in o.iter_mut().zip(parts) {
        *octet = u8::from_str_radix(part, 16).ok()?;
    }
    (o != [0; 6] && o[0] & 1 == 0).then_some(o)
}

/// Six octets written with a separator and a per-digit choice of case.
fn written(o: [u8; 6], sep: char, upper: u64) -> String {
    let hex: String = o.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(&sep.to_string());
    hex.chars().enumerate().map(|(i, c)| if upper >> i & 1 == 1 { c.to_ascii_uppercase() } else { c }).collect()
}

/// Strings near the accepted form: a written MAC with a few characters replaced, inserted or removed.
fn near_mac() -> impl Strategy<Value = String> {
    let edit = (
        any::<prop::sample::Index>(),
        prop_oneof![any::<char>(), prop::sample::select(vec![':', '-', '.', ' ', 'g', 'F', '0', '\0', 'é'])],
        0u8..3,
    );
    (any::<[u8; 6]>(), prop::sample::select(vec![':', '-']), any::<u64>(), prop::collection::vec(edit, 0..3)).prop_map(
        |(o, sep, upper, edits)| {
            let mut chars: Vec<char> = written(o, sep, upper).chars().collect();
            for (at, c, kind) in edits {
                match kind {
                    0 if !chars.is_empty() => {
                        let i = at.index(chars.len());
                        chars[i] = c;
                    }
                    1 => chars.insert(at.index(chars.len() + 1), c),
                    _ if !chars.is_empty() => {
                        chars.remove(at.index(chars.len()));
                    }
                    _ => {}
                }
            }
            chars.into_iter().collect()
        },
    )
}

fn any_input() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9a-fA-F:\\-]{0,20}",
        "([0-9a-fA-F]{2}[:\\-]){5}[0-9a-fA-F]{2}",
        near_mac(),
        prop::collection::vec(any::<char>(), 17).prop_map(|c| c.into_iter().collect()),
    ]
}

#[test]
fn parsing_agrees_with_the_rule_and_never_panics() {
    check("mac_parse_matches_rule", any_input(), |s| {
        let parsed = s.parse::<MacAddr>();
        prop_assert_eq!(parsed.as_ref().ok().map(MacAddr::octets), oracle(&s), "input {:?}", s);
        if let Err(e) = parsed {
            // The error quotes (at most 64 characters of) the input.
            prop_assert!(e.input.chars().count() <= 64);
            prop_assert!(s.starts_with(&e.input));
            let quoted = format!("{:?}", e.input);
            prop_assert!(e.to_string().contains(&quoted), "{} does not quote the input", e);
        }
        Ok(())
    });
}

#[test]
fn every_notation_of_an_address_parses_to_it_and_prints_back_canonically() {
    let notation = (any::<[u8; 6]>(), prop::sample::select(vec![':', '-']), any::<u64>());
    check("mac_notations_round_trip", notation, |(o, sep, upper)| {
        let s = written(o, sep, upper);
        let unicast = o != [0; 6] && o[0] & 1 == 0;
        match s.parse::<MacAddr>() {
            Ok(mac) => {
                prop_assert!(unicast, "{} accepted", s);
                prop_assert_eq!(mac.octets(), o);
                prop_assert_eq!(MacAddr::from_octets(o).ok(), Some(mac));
                let canonical = mac.to_string();
                prop_assert_eq!(&canonical, &written(o, ':', 0));
                prop_assert_eq!(canonical.parse::<MacAddr>().ok(), Some(mac));
                let json = serde_json::to_string(&mac).unwrap();
                prop_assert_eq!(serde_json::from_str::<MacAddr>(&json).ok(), Some(mac));
            }
            Err(e) => {
                prop_assert!(!unicast, "{} refused: {}", s, e);
                prop_assert!(MacAddr::from_octets(o).is_err());
            }
        }
        Ok(())
    });
}

#[test]
fn serde_refuses_what_parsing_refuses() {
    check("mac_serde_agrees", any_input(), |s| {
        let json = serde_json::to_string(&s).unwrap();
        prop_assert_eq!(serde_json::from_str::<MacAddr>(&json).ok(), s.parse::<MacAddr>().ok());
        Ok(())
    });
}
