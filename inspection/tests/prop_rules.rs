//! Property tests of introspection rules (`POST /v1/rules` validation and `apply` at the end of processing) on
//! hostile input: arbitrary JSON bodies, rule bodies built from the grammar (JSONPath fields, regexes, CIDRs,
//! Python format strings) then damaged, applied to arbitrary data and nodes. Never a panic: an invalid body is
//! an `Err`, a rule that cannot be applied is an `Err`; what validates once validates again to the same rule.
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ironguard_inspection::outcome::fold_effects;
use ironguard_inspection::processing::Plan;
use ironguard_inspection::rules::{ActionKind, Effect, Operator, Rule, apply, validate};
use ironguard_testkit::hostile::{json, json_object, json_with, mutate, mutation, ramdisk_data, text};
use ironguard_testkit::prop::check;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const DEFAULT_CASES: u32 = 2000;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proptest-regressions/prop_rules.txt");
const NOW: u64 = 1_700_000_000_000;

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_CASES", DEFAULT_CASES)
}

/// Applying costs more per case (a few rules validated, regexes compiled): half as many.
fn apply_cases() -> u32 {
    cases().div_ceil(2)
}

/// A name step of a JSONPath.
fn name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "inventory", "interfaces", "cpu", "count", "disks", "size", "memory_mb", "local_gb", "mac_address",
            "name", "properties", "driver_info", "ipmi_address", "all_interfaces", "*", "`this`", "`parent`",
            "'odd.name'", "\"odd name\"", "a,b", "@x",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_][a-z0-9_-]{0,6}",
    ]
    .boxed()
}

/// JSONPath in `jsonpath_rw`'s dialect: well-formed, or (with `junk`) with stray characters and brackets.
fn path(junk: bool) -> BoxedStrategy<String> {
    let mut steps = vec![
        (4, name().prop_map(|n| format!(".{n}")).boxed()),
        (2, Just("[*]".to_owned()).boxed()),
        (2, (-3i64..5).prop_map(|i| format!("[{i}]")).boxed()),
        (1, prop::sample::select(vec!["[1:]", "[:2]", "[0:1]"]).prop_map(str::to_owned).boxed()),
        (1, name().prop_map(|n| format!("..{n}")).boxed()),
        (1, name().prop_map(|n| format!("['{n}']")).boxed()),
        (1, name().prop_map(|n| format!(" | {n}")).boxed()),
        (1, name().prop_map(|n| format!(" where {n}")).boxed()),
    ];
    if junk {
        steps.push((2, name().prop_map(|n| format!(" & {n}")).boxed()));
        steps.push((
            2,
            prop::sample::select(vec!["(", ")", "[", "]", "'", "..", "$", "`x`"]).prop_map(str::to_owned).boxed(),
        ));
        steps.push((2, any::<char>().prop_map(|c| c.to_string()).boxed()));
    }
    let step = proptest::strategy::Union::new_weighted(steps);
    (prop_oneof![4 => name(), 1 => Just("$".to_owned())], prop::collection::vec(step, 0..5))
        .prop_map(|(first, rest)| format!("{first}{}", rest.concat()))
        .boxed()
}

fn field(junk: bool) -> BoxedStrategy<String> {
    let schemes =
        if junk { vec!["", "data://", "node://", "ftp://", "data:/"] } else { vec!["", "data://", "node://"] };
    let well = (prop::sample::select(schemes), path(junk)).prop_map(|(scheme, p)| format!("{scheme}{p}"));
    if junk { prop_oneof![4 => well, 1 => text()].boxed() } else { well.boxed() }
}

/// Python `str.format` templates over `data`, with the odd ones.
fn template() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        "[a-z ]{0,6}",
        prop::sample::select(vec![
            "{data[inventory][cpu][count]}",
            "{data[memory_mb]}",
            "{data[interfaces][eth0][mac]}",
            "{data[inventory][disks][0][name]}",
            "{data[missing]}",
            "{data[memory_mb]:>10}",
            "{data[local_gb]!r}",
            "{data[cpus]:d}",
            "{data.memory_mb}",
            "{0}",
            "{}",
            "{{literal}}",
            "{",
            "}",
            "{data[",
            "{data[a]:{x}}",
            "{data[inventory]!x}",
            "{data[inventory][cpu]:.3}",
            "{data[macs][-1]}",
            "{data[macs][99999999999999999999]}",
        ])
        .prop_map(str::to_owned),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|v| v.concat()).boxed()
}

fn value() -> BoxedStrategy<Value> {
    prop_oneof![2 => template().prop_map(Value::String), 1 => json_with(2, 8)].boxed()
}

/// A regex for `matches` / `contains`: ordinary, malformed, and (rarely: it costs a compile that hits the size
/// limit) one that is too big.
fn regex() -> BoxedStrategy<Value> {
    prop_oneof![
        30 => prop::sample::select(vec!["^eth.*", "(a|b)+$", "\\d{3}", "(?P<x>.)", ".*.*.*.*=$", "x86_64", "^$"])
            .prop_map(|s| json!(s)),
        5 => prop::sample::select(vec!["[", "(?", "\\", "a**", "(?<", "\\p{Nope}"]).prop_map(|s| json!(s)),
        1 => Just(json!("a{1000}{1000}")),
        2 => json_with(1, 3),
    ]
    .boxed()
}

fn condition(junk: bool) -> BoxedStrategy<Value> {
    let op = prop::sample::select(Operator::ALL.iter().map(|o| o.as_str()).collect::<Vec<_>>());
    let cidr = prop::sample::select(vec!["10.0.0.0/8", "192.0.2.0/24", "2001:db8::/32", "::/0", "300.0.0.0/8", "x"])
        .prop_map(|s| json!(s));
    (
        op,
        field(junk),
        value(),
        cidr,
        regex(),
        prop::option::of(prop::sample::select(vec![
            json!("any"),
            json!("all"),
            json!("first"),
            json!("some"),
            json!(1),
        ])),
        prop::option::of(prop_oneof![4 => any::<bool>().prop_map(Value::Bool), 1 => json_with(1, 4)]),
        any::<bool>(),
    )
        .prop_map(move |(op, field, value, cidr, regex, multiple, invert, extra)| {
            let mut c = json!({"op": op, "field": field});
            match op {
                "is-empty" => {}
                "in-net" => c["value"] = cidr,
                "matches" | "contains" => c["value"] = regex,
                _ => c["value"] = value,
            }
            if junk && extra {
                c["unexpected"] = json!(1);
            }
            if let Some(m) = multiple.filter(|m| junk || m.as_str().is_some_and(|s| s != "some")) {
                c["multiple"] = m;
            }
            if let Some(i) = invert.filter(|i| junk || i.is_boolean()) {
                c["invert"] = i;
            }
            c
        })
        .boxed()
}

fn action(junk: bool) -> BoxedStrategy<Value> {
    let node_path = prop_oneof![
        4 => prop::sample::select(vec![
            "/properties/cpus", "/extra/foo", "/driver", "/driver_info/ipmi_address", "properties/x", "/", "",
            "/traits", "/extra/list/-", "/extra/a~1b", "/extra/list/0", "/properties/capabilities",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ];
    let kind = prop::sample::select(ActionKind::ALL.iter().map(|a| a.as_str()).collect::<Vec<_>>());
    (kind, node_path, value(), template(), prop::option::of(json_with(1, 4)), any::<u8>())
        .prop_map(move |(kind, path, value, name, extra, bits)| {
            let mut a = match kind {
                "fail" => json!({"action": kind, "message": value}),
                "set-attribute" => json!({"action": kind, "path": path, "value": value}),
                "set-capability" => json!({"action": kind, "name": name, "value": value}),
                "extend-attribute" => json!({"action": kind, "path": path, "value": value, "unique": bits & 1 == 1}),
                "add-trait" | "remove-trait" => json!({"action": kind, "name": name}),
                _ => json!({"action": kind}),
            };
            if kind == "set-attribute" && bits & 4 != 0 {
                a["reset_interfaces"] = json!(bits & 8 != 0);
            }
            if let Some(x) = extra.filter(|_| junk) {
                // An optional parameter of the wrong type, or an unexpected one.
                let key = if bits & 2 == 0 { "reset_interfaces" } else { "unexpected" };
                a[key] = x;
            }
            a
        })
        .boxed()
}

/// A rule body from the grammar: mostly valid, or (with `junk`) with invalid pieces anywhere.
fn rule_body_with(junk: bool) -> BoxedStrategy<Value> {
    let uuid = if junk {
        prop_oneof![
            Just(json!("0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d")),
            Just(json!("0F4C1A547D0A4A4E9D4C0A4F8A1C2B3D")),
            Just(json!("{0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d}")),
            Just(json!("urn:uuid:0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d")),
            text().prop_map(Value::String),
            json_with(1, 3),
        ]
        .boxed()
    } else {
        prop_oneof![Just(json!("0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d")), Just(json!(""))].boxed()
    };
    let scope = if junk {
        prop_oneof![text().prop_map(Value::String), Just(json!("rack-1")), json_with(1, 3)].boxed()
    } else {
        prop_oneof![Just(json!("rack-1")), Just(json!("")), "[a-z]{0,8}".prop_map(Value::String)].boxed()
    };
    let actions = if junk { 0..4 } else { 1..4 };
    (
        prop::option::of(uuid),
        prop::option::of(text()),
        prop::option::of(scope),
        prop::collection::vec(condition(junk), 0..4),
        prop::collection::vec(action(junk), actions),
    )
        .prop_map(|(uuid, description, scope, conditions, actions)| {
            let mut r = json!({"conditions": conditions, "actions": actions});
            if let Some(u) = uuid {
                r["uuid"] = u;
            }
            if let Some(d) = description {
                r["description"] = json!(d);
            }
            if let Some(s) = scope {
                r["scope"] = s;
            }
            r
        })
        .boxed()
}

fn rule_body() -> BoxedStrategy<Value> {
    rule_body_with(false)
}

/// A grammar body, sometimes with invalid pieces, sometimes damaged, or anything.
fn hostile_rule_body() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => rule_body(),
        3 => rule_body_with(true),
        2 => (rule_body(), prop::collection::vec(mutation(), 1..4)).prop_map(|(mut b, ms)| {
            for m in &ms {
                mutate(&mut b, m);
            }
            b
        }),
        1 => json_object(),
        1 => json(),
    ]
    .boxed()
}

/// A validated rule's API form validates again to the same rule.
fn revalidates(rule: &Rule) -> Result<(), TestCaseError> {
    let again = validate(&rule.full(), NOW).map_err(|e| TestCaseError::fail(format!("{}: {e}", rule.full())))?;
    prop_assert_eq!(&again, rule);
    // And it survives the store (serde) unchanged.
    let stored: Rule = serde_json::from_value(serde_json::to_value(rule).unwrap()).unwrap();
    prop_assert_eq!(&stored, rule);
    Ok(())
}

#[test]
fn validation_of_any_body_refuses_or_returns_a_stable_rule() {
    let (valid, invalid) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0));
    check(REGRESSIONS, "rules_validate_hostile_bodies", cases(), hostile_rule_body(), |body| {
        match validate(&body, NOW) {
            Ok(rule) => {
                valid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(!rule.actions.is_empty(), "a rule without actions validated: {body}");
                prop_assert_eq!(rule.created_at, NOW);
                revalidates(&rule)?;
            }
            Err(e) => {
                invalid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(!e.to_string().is_empty());
            }
        }
        Ok(())
    });
    eprintln!("  ({} valid, {} refused)", valid.into_inner(), invalid.into_inner());
}

/// A node as the rules see it (Ironic's JSON).
fn node() -> BoxedStrategy<Value> {
    let real = json!({
        "uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "driver": "ipmi",
        "driver_info": {"ipmi_address": "10.0.0.9"},
        "properties": {"cpus": "4", "capabilities": "boot_mode:bios", "inspection_scope": "rack-1"},
        "extra": {"list": [1, 2], "foo": "bar"},
        "maintenance": false,
        "traits": [],
    });
    prop_oneof![
        3 => prop::collection::vec(mutation(), 0..4).prop_map(move |ms| {
            let mut n = real.clone();
            for m in &ms {
                mutate(&mut n, m);
            }
            n
        }),
        1 => json(),
    ]
    .boxed()
}

#[test]
fn applying_rules_to_any_data_and_node_gives_effects_or_an_error() {
    let rules = prop::collection::vec(rule_body(), 1..4)
        .prop_map(|bodies| bodies.iter().filter_map(|b| validate(b, NOW).ok()).collect::<Vec<Rule>>());
    let (effects_seen, errors) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0));
    check(REGRESSIONS, "rules_apply_hostile", apply_cases(), (rules, ramdisk_data(), node()), |(rules, data, node)| {
        match apply(&rules, &data, &node) {
            Ok(effects) => {
                effects_seen.fetch_add(effects.len(), std::sync::atomic::Ordering::Relaxed);
                for e in &effects {
                    if let Effect::NodePatch { path, op, .. } = e {
                        // (An empty path is passed on as given; Ironic refuses it, failing the processing.)
                        prop_assert!(path.is_empty() || path.starts_with('/'), "{path:?}");
                        prop_assert!(op == "add" || op == "replace", "{op:?}");
                    }
                }
                // The engine folds them into the plan it writes to Ironic.
                let mut plan = Plan::new();
                let _ = fold_effects(effects, &mut plan);
                let view = Default::default();
                for op in plan.node_patch(&view) {
                    serde_json::to_string(&op).unwrap();
                }
            }
            Err(e) => {
                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(!e.to_string().is_empty());
            }
        }
        Ok(())
    });
    eprintln!("  ({} effects produced, {} applications failed)", effects_seen.into_inner(), errors.into_inner());
}

#[test]
fn stored_rules_of_any_shape_are_read_or_skipped() {
    // What the store hands back is parsed with serde (a rule that no longer parses is skipped).
    let stored = prop_oneof![
        json_object(),
        (rule_body(), prop::collection::vec(mutation(), 0..3)).prop_map(|(b, ms)| {
            let mut v = match validate(&b, NOW) {
                Ok(r) => serde_json::to_value(r).unwrap(),
                Err(_) => b,
            };
            for m in &ms {
                mutate(&mut v, m);
            }
            v
        }),
    ];
    check(REGRESSIONS, "rules_stored_parse", cases(), stored, |v| {
        if let Ok(rule) = serde_json::from_value::<Rule>(v) {
            let _ = apply(std::slice::from_ref(&rule), &json!({}), &json!({}));
            let _ = rule.summary();
            let _ = Map::from_iter([("x".to_owned(), rule.full())]);
        }
        Ok(())
    });
}
