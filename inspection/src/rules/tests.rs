//! Tests of the public interface: validation (one per kind of error), the API forms, and `apply`.

use serde_json::{Value, json};

use super::*;

const UUID: &str = "0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d";

fn rule(body: Value) -> Rule {
    validate(&body, 1_000).unwrap()
}

fn error(body: Value) -> String {
    validate(&body, 1_000).unwrap_err().to_string()
}

fn fail_action() -> Value {
    json!([{"action": "fail", "message": "boom!"}])
}

// --- validation ---------------------------------------------------------------------------------------------

#[test]
fn only_actions() {
    let r = rule(json!({"actions": fail_action()}));
    assert_eq!(r.conditions, vec![]);
    assert_eq!(r.created_at, 1_000);
    let full = r.full();
    assert_eq!(full["uuid"].as_str().map(str::len), Some(36));
    assert_eq!(
        full,
        json!({"uuid": r.uuid, "description": null, "scope": null, "conditions": [], "actions": fail_action()})
    );
}

#[test]
fn conditions_are_returned_with_defaults() {
    let conditions = json!([
        {"op": "eq", "field": "memory_mb", "value": 1024},
        {"op": "eq", "field": "local_gb", "value": 60, "multiple": "any"},
        {"op": "eq", "field": "local_gb", "value": 60, "invert": false},
        {"op": "eq", "field": "memory_mb", "value": 1024, "multiple": "all", "invert": true},
        {"op": "matches", "field": "node://driver", "value": "ipmi", "note": "kept"},
    ]);
    let r = rule(json!({"uuid": UUID, "description": "d", "scope": "inner circle", "conditions": conditions,
        "actions": [{"action": "set-attribute", "path": "/properties/cpus", "value": null}]}));
    assert_eq!(
        r.full(),
        json!({
            "uuid": UUID, "description": "d", "scope": "inner circle",
            "conditions": [
                {"op": "eq", "field": "memory_mb", "value": 1024, "multiple": "any", "invert": false},
                {"op": "eq", "field": "local_gb", "value": 60, "multiple": "any", "invert": false},
                {"op": "eq", "field": "local_gb", "value": 60, "multiple": "any", "invert": false},
                {"op": "eq", "field": "memory_mb", "value": 1024, "multiple": "all", "invert": true},
                {"op": "matches", "field": "node://driver", "value": "ipmi", "note": "kept", "multiple": "any", "invert": false},
            ],
            "actions": [{"action": "set-attribute", "path": "/properties/cpus", "value": null}],
        })
    );
    assert_eq!(r.summary(), json!({"uuid": UUID, "description": "d", "scope": "inner circle"}));
}

#[test]
fn stored_form_round_trips() {
    let r = rule(json!({"uuid": UUID, "conditions": [{"op": "in-net", "field": "ip", "value": "10.0.0.0/8"}],
        "actions": [{"action": "extend-attribute", "path": "/extra/x", "value": [1, {"a": "{data[x]}"}], "unique": true}]}));
    let stored = serde_json::to_value(&r).unwrap();
    assert_eq!(stored["created_at"], json!(1_000));
    let back: Rule = serde_json::from_value(stored).unwrap();
    assert_eq!(back, r);
}

#[test]
fn given_uuid_is_kept_and_empty_uuid_is_generated() {
    assert_eq!(rule(json!({"uuid": UUID, "actions": fail_action()})).uuid, UUID);
    assert_eq!(rule(json!({"uuid": "", "actions": fail_action()})).uuid.len(), 36);
    assert_eq!(rule(json!({"uuid": null, "actions": fail_action()})).uuid.len(), 36);
}

#[test]
fn error_body_not_an_object() {
    assert_eq!(error(json!([])), "Invalid rule: the request body must be a JSON object");
}

#[test]
fn error_invalid_uuid() {
    assert_eq!(error(json!({"uuid": "foobar", "actions": fail_action()})), "Invalid UUID value");
    assert_eq!(error(json!({"uuid": 42, "actions": fail_action()})), "Invalid UUID value");
}

#[test]
fn error_scope_too_long() {
    assert_eq!(
        error(json!({"scope": "s".repeat(256), "actions": fail_action()})),
        "Invalid scope: the length of the scope should be within 255 characters"
    );
    assert!(validate(&json!({"scope": "é".repeat(255), "actions": fail_action()}), 0).is_ok());
}

#[test]
fn error_scope_or_description_not_a_string() {
    assert!(matches!(validate(&json!({"scope": 1, "actions": fail_action()}), 0), Err(RuleError::InvalidScope)));
    assert!(matches!(
        validate(&json!({"description": [], "actions": fail_action()}), 0),
        Err(RuleError::InvalidDescription)
    ));
}

#[test]
fn error_conditions_not_a_list() {
    assert_eq!(
        error(json!({"conditions": null, "actions": fail_action()})),
        "Validation failed for conditions: None is not of type 'array'"
    );
}

#[test]
fn error_condition_without_op() {
    assert_eq!(
        error(json!({"conditions": [{"field": "memory_mb", "value": 1}], "actions": fail_action()})),
        "Validation failed for conditions: 'op' is a required property"
    );
}

#[test]
fn error_condition_without_field() {
    assert_eq!(
        error(json!({"conditions": [{"op": "eq", "value": 1}], "actions": fail_action()})),
        "Validation failed for conditions: 'field' is a required property"
    );
}

#[test]
fn error_unknown_operator() {
    assert_eq!(
        error(json!({"conditions": [{"op": "foobar", "field": "x", "value": 1}], "actions": fail_action()})),
        "Validation failed for conditions: 'foobar' is not one of ['eq', 'lt', 'gt', 'le', 'ge', 'ne', 'in-net', \
         'matches', 'contains', 'is-empty']"
    );
}

#[test]
fn error_bad_multiple() {
    assert_eq!(
        error(
            json!({"conditions": [{"op": "eq", "field": "x", "value": 1, "multiple": "some"}], "actions": fail_action()})
        ),
        "Validation failed for conditions: 'some' is not one of ['all', 'any', 'first']"
    );
}

#[test]
fn error_bad_invert() {
    assert_eq!(
        error(
            json!({"conditions": [{"op": "eq", "field": "x", "value": 1, "invert": "yes"}], "actions": fail_action()})
        ),
        "Validation failed for conditions: 'yes' is not of type 'boolean'"
    );
}

#[test]
fn error_field_not_a_string() {
    assert_eq!(
        error(json!({"conditions": [{"op": "eq", "field": 5, "value": 1}], "actions": fail_action()})),
        "Validation failed for conditions: 5 is not of type 'string'"
    );
}

#[test]
fn error_schema_errors_come_before_field_errors() {
    // The second condition's schema error wins over the first one's bad path, as in ironic-inspector.
    assert_eq!(
        error(
            json!({"conditions": [{"op": "eq", "field": "!*!", "value": 1}, {"op": "eq"}], "actions": fail_action()})
        ),
        "Validation failed for conditions: 'field' is a required property"
    );
}

#[test]
fn error_unsupported_scheme() {
    assert_eq!(
        error(json!({"conditions": [{"op": "eq", "field": "foo://x", "value": 1}], "actions": fail_action()})),
        "Unsupported scheme for field: foo, valid values are node:// or data://"
    );
}

#[test]
fn error_bad_field_path() {
    let message = error(json!({"conditions": [{"op": "eq", "field": "!*!", "value": 1}], "actions": fail_action()}));
    assert_eq!(message, "Unable to parse field JSON path !*!: Error on line 1, col 0: Unexpected character: ! ");
    assert!(
        error(json!({"conditions": [{"op": "eq", "field": "node://", "value": 1}], "actions": fail_action()}))
            .starts_with("Unable to parse field JSON path node://: ")
    );
}

#[test]
fn error_eq_without_value() {
    assert_eq!(
        error(json!({"conditions": [{"op": "eq", "field": "x"}], "actions": fail_action()})),
        "Invalid parameters for operator eq: missing required parameter(s): value"
    );
}

#[test]
fn error_unexpected_condition_parameter() {
    assert_eq!(
        error(json!({"conditions": [{"op": "eq", "field": "x", "value": 1, "foo": "bar"}], "actions": fail_action()})),
        "Invalid parameters for operator eq: unexpected parameter(s): foo"
    );
}

#[test]
fn error_in_net_with_bad_cidr() {
    assert_eq!(
        error(
            json!({"conditions": [{"op": "in-net", "field": "x", "value": "10.0.0.0/33"}], "actions": fail_action()})
        ),
        "Invalid parameters for operator in-net: invalid value: invalid IPNetwork 10.0.0.0/33"
    );
}

#[test]
fn error_bad_regex() {
    assert!(
        error(json!({"conditions": [{"op": "matches", "field": "x", "value": "**"}], "actions": fail_action()}))
            .starts_with("Invalid parameters for operator matches: invalid regular expression: ")
    );
}

#[test]
fn error_no_actions() {
    assert_eq!(error(json!({"actions": []})), "Validation failed for actions: [] is too short");
    assert_eq!(error(json!({})), "Validation failed for actions: [] is too short");
}

#[test]
fn error_action_without_name() {
    assert_eq!(
        error(json!({"actions": [{"message": "boom"}]})),
        "Validation failed for actions: 'action' is a required property"
    );
}

#[test]
fn error_unknown_action() {
    assert_eq!(
        error(json!({"actions": [{"action": "foobar"}]})),
        "Validation failed for actions: 'foobar' is not one of ['example', 'fail', 'set-attribute', \
         'set-capability', 'extend-attribute', 'add-trait', 'remove-trait']"
    );
}

#[test]
fn error_fail_without_message() {
    assert_eq!(
        error(json!({"actions": [{"action": "fail"}]})),
        "Invalid parameters for action fail: missing required parameter(s): message"
    );
}

#[test]
fn error_set_attribute_without_path_or_value() {
    assert_eq!(
        error(json!({"actions": [{"action": "set-attribute", "value": 1}]})),
        "Invalid parameters for action set-attribute: missing required parameter(s): path"
    );
    assert_eq!(
        error(json!({"actions": [{"action": "set-attribute", "path": "/extra/x"}]})),
        "Invalid parameters for action set-attribute: missing required parameter(s): value"
    );
}

#[test]
fn error_unexpected_action_parameter() {
    assert_eq!(
        error(json!({"actions": [{"action": "fail", "message": "boom", "foo": "bar"}]})),
        "Invalid parameters for action fail: unexpected parameter(s): foo"
    );
}

// --- apply --------------------------------------------------------------------------------------------------

fn stored(uuid: &str, created_at: u64, scope: Option<&str>, conditions: Value, actions: Value) -> Rule {
    let mut body = json!({"uuid": uuid, "conditions": conditions, "actions": actions});
    if let Some(scope) = scope {
        body["scope"] = json!(scope);
    }
    validate(&body, created_at).unwrap()
}

fn set_extra(key: &str, value: Value) -> Value {
    json!([{"action": "set-attribute", "path": format!("/extra/{key}"), "value": value}])
}

fn patch(path: &str, value: Value) -> Effect {
    Effect::NodePatch { op: "add".to_owned(), path: path.to_owned(), value }
}

#[test]
fn rules_apply_in_created_at_then_uuid_order() {
    let rules = vec![
        stored("00000000-0000-0000-0000-000000000003", 20, None, json!([]), set_extra("c", json!(3))),
        stored("00000000-0000-0000-0000-000000000002", 10, None, json!([]), set_extra("b", json!(2))),
        stored("00000000-0000-0000-0000-000000000001", 10, None, json!([]), set_extra("a", json!(1))),
    ];
    let out = apply(&rules, &json!({}), &json!({})).unwrap();
    assert_eq!(out, vec![patch("/extra/a", json!(1)), patch("/extra/b", json!(2)), patch("/extra/c", json!(3))]);
}

#[test]
fn scope_selects_rules() {
    let rules = vec![
        stored("00000000-0000-0000-0000-000000000001", 1, None, json!([]), set_extra("global", json!(1))),
        stored("00000000-0000-0000-0000-000000000002", 2, Some("scope_1"), json!([]), set_extra("one", json!(1))),
        stored("00000000-0000-0000-0000-000000000003", 3, Some("scope_2"), json!([]), set_extra("two", json!(1))),
        stored("00000000-0000-0000-0000-000000000004", 4, Some(""), json!([]), set_extra("empty", json!(1))),
    ];
    let paths = |node: Value| -> Vec<String> {
        apply(&rules, &json!({}), &node)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e {
                Effect::NodePatch { path, .. } => Some(path),
                _ => None,
            })
            .collect()
    };
    assert_eq!(paths(json!({"properties": {}})), ["/extra/global", "/extra/empty"]);
    assert_eq!(paths(json!({"properties": {"inspection_scope": null}})), ["/extra/global", "/extra/empty"]);
    assert_eq!(
        paths(json!({"properties": {"inspection_scope": "scope_1"}})),
        ["/extra/global", "/extra/one", "/extra/empty"]
    );
    assert_eq!(
        paths(json!({"properties": {"inspection_scope": "scope_2"}})),
        ["/extra/global", "/extra/two", "/extra/empty"]
    );
}

#[test]
fn only_matching_rules_act() {
    let data = json!({"memory_mb": 1024, "local_gb": 42, "inventory": {"cpu": {"count": 4}}});
    let rules = vec![
        stored(
            "00000000-0000-0000-0000-000000000001",
            1,
            None,
            json!([{"op": "eq", "field": "memory_mb", "value": 1024}, {"op": "eq", "field": "local_gb", "value": 42}]),
            set_extra("both", json!(true)),
        ),
        stored(
            "00000000-0000-0000-0000-000000000002",
            2,
            None,
            json!([{"op": "eq", "field": "memory_mb", "value": 1024}, {"op": "eq", "field": "local_gb", "value": 60}]),
            set_extra("second_fails", json!(true)),
        ),
        stored(
            "00000000-0000-0000-0000-000000000003",
            3,
            None,
            json!([{"op": "eq", "field": "missing", "value": 1, "invert": true}]),
            set_extra("missing_field", json!(true)),
        ),
        stored(
            "00000000-0000-0000-0000-000000000004",
            4,
            None,
            json!([{"op": "is-empty", "field": "i.do.not.exist"}, {"op": "ge", "field": "data://inventory.cpu.count", "value": 4}]),
            set_extra("empty_and_cpus", json!(true)),
        ),
    ];
    let out = apply(&rules, &data, &json!({})).unwrap();
    assert_eq!(out, vec![patch("/extra/both", json!(true)), patch("/extra/empty_and_cpus", json!(true))]);
}

#[test]
fn all_conditions_are_checked_before_any_action() {
    // The second rule's condition raises; ironic-inspector fails before running the first rule's actions.
    let rules = vec![
        stored("00000000-0000-0000-0000-000000000001", 1, None, json!([]), set_extra("a", json!(1))),
        stored(
            "00000000-0000-0000-0000-000000000002",
            2,
            None,
            json!([{"op": "gt", "field": "memory_mb", "value": 10}]),
            set_extra("b", json!(1)),
        ),
    ];
    let err = apply(&rules, &json!({"memory_mb": "lots"}), &json!({})).unwrap_err();
    assert!(matches!(err, RuleError::Condition { .. }));
    assert_eq!(
        err.to_string(),
        "Rule \"00000000-0000-0000-0000-000000000002\": condition memory_mb gt could not be checked: \
         invalid literal for int() with base 10: 'lots'"
    );
}

#[test]
fn fail_does_not_stop_later_effects() {
    let rules = vec![
        stored(
            "00000000-0000-0000-0000-000000000001",
            1,
            None,
            json!([]),
            json!([{"action": "set-attribute", "path": "/extra/bar", "value": "foo"}, {"action": "fail", "message": "boom"},
                   {"action": "add-trait", "name": "CUSTOM_X"}]),
        ),
        stored("00000000-0000-0000-0000-000000000002", 2, None, json!([]), set_extra("later", json!(1))),
    ];
    let out = apply(&rules, &json!({}), &json!({})).unwrap();
    assert_eq!(
        out,
        vec![
            patch("/extra/bar", json!("foo")),
            Effect::Fail("boom".to_owned()),
            Effect::AddTrait("CUSTOM_X".to_owned()),
            patch("/extra/later", json!(1)),
        ]
    );
}

#[test]
fn an_error_after_a_fail_keeps_the_fail() {
    let rules = vec![stored(
        "00000000-0000-0000-0000-000000000001",
        1,
        None,
        json!([]),
        json!([{"action": "fail", "message": "boom"}, {"action": "set-attribute", "path": "/extra/x", "value": "{data[nope]}"}]),
    )];
    assert_eq!(apply(&rules, &json!({}), &json!({})).unwrap(), vec![Effect::Fail("boom".to_owned())]);
}

#[test]
fn values_are_formatted_with_the_data() {
    let data = json!({"inventory": {"bmc_address": "192.0.2.10"}, "outer": {"inner": "baz"}, "val": {"n": 17}});
    let rules = vec![stored(
        "00000000-0000-0000-0000-000000000001",
        1,
        None,
        json!([]),
        json!([
            {"action": "set-attribute", "path": "/driver_info/ipmi_address", "value": "{data[inventory][bmc_address]}"},
            {"action": "set-attribute", "path": "/driver_info/foo", "value": {"{data[outer][inner]}": "{data[val][n]}"}},
            {"action": "set-attribute", "path": "/driver_info/list", "value": ["basic", ["{data[outer][inner]}"], 2.5, true]},
            {"action": "set-attribute", "path": "/driver_info/plain", "value": 1},
        ]),
    )];
    assert_eq!(
        apply(&rules, &data, &json!({})).unwrap(),
        vec![
            patch("/driver_info/ipmi_address", json!("192.0.2.10")),
            patch("/driver_info/foo", json!({"baz": "17"})),
            patch("/driver_info/list", json!(["basic", ["baz"], 2.5, true])),
            patch("/driver_info/plain", json!(1)),
        ]
    );
}

#[test]
fn a_missing_format_key_is_an_error_naming_the_rule() {
    let mut body = json!({"uuid": UUID, "description": "bmc from data", "actions": [
        {"action": "set-attribute", "path": "/driver_info/ipmi_address", "value": ["ok", ["{data[inventory][bmc_address]}"]]}]});
    let rules = vec![validate(&body, 1).unwrap()];
    let err = apply(&rules, &json!({"memory_mb": 1}), &json!({})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Rule \"bmc from data\": action set-attribute: invalid formatting of value {data[inventory][bmc_address]}: \
         invalid formatting variable key 'inventory'"
    );
    body["description"] = Value::Null;
    let rules = vec![validate(&body, 1).unwrap()];
    let err = apply(&rules, &json!({}), &json!({})).unwrap_err();
    assert!(err.to_string().starts_with(&format!("Rule \"{UUID}\": ")), "{err}");
}

#[test]
fn conditions_see_the_node_as_given_and_actions_see_their_own_patches() {
    let node = json!({"uuid": "n1", "extra": {"tags": ["x"]}, "properties": {"capabilities": "boot_mode:uefi"}});
    let rules = vec![
        stored(
            "00000000-0000-0000-0000-000000000001",
            1,
            None,
            json!([{"op": "eq", "field": "node://extra.tags[0]", "value": "x"}]),
            json!([{"action": "set-attribute", "path": "/extra/tags", "value": ["y"]},
                   {"action": "extend-attribute", "path": "/extra/tags", "value": "z"},
                   {"action": "set-capability", "name": "cpu_vt", "value": "true"}]),
        ),
        stored(
            "00000000-0000-0000-0000-000000000002",
            2,
            None,
            json!([{"op": "eq", "field": "node://extra.tags[0]", "value": "x"}]),
            json!([{"action": "remove-trait", "name": "CUSTOM_OLD"}]),
        ),
    ];
    assert_eq!(
        apply(&rules, &json!({}), &node).unwrap(),
        vec![
            patch("/extra/tags", json!(["y"])),
            Effect::NodePatch { op: "replace".to_owned(), path: "/extra/tags".to_owned(), value: json!(["y", "z"]) },
            Effect::Capability { name: "cpu_vt".to_owned(), value: Some("true".to_owned()) },
            Effect::RemoveTrait("CUSTOM_OLD".to_owned()),
        ]
    );
}

#[test]
fn no_rules_no_effects() {
    assert_eq!(apply(&[], &json!({}), &json!({})).unwrap(), vec![]);
}

// --- robustness -----------------------------------------------------------------------------------------------

/// Random strings over the characters the parsers care about, from a fixed seed.
fn garbage(rng: &mut impl rand::Rng, alphabet: &[&str], max_len: usize) -> String {
    let len = rng.random_range(0..=max_len);
    (0..len).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect()
}

#[test]
fn random_paths_templates_and_bodies_never_panic() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let data = json!({
        "a": {"b": [1, "x", {"c": null}], "d": "text", "e": 1.5, "f": true},
        "inventory": {"interfaces": [{"mac": "aa"}, {"mac": "bb"}], "cpu": {"count": 4}},
        "n": -3, "s": "", "l": [], "o": {}
    });
    let path_alphabet = [
        "a",
        "b",
        "c",
        "inventory",
        "interfaces",
        "mac",
        ".",
        "..",
        "[",
        "]",
        "*",
        "0",
        "-1",
        "5",
        ":",
        ",",
        "$",
        "(",
        ")",
        "|",
        "&",
        " where ",
        "`this`",
        "`parent`",
        "'",
        "\"",
        "\\",
        "@",
        "_",
        " ",
        "\n",
        "!",
    ];
    for _ in 0..5_000 {
        let path = garbage(&mut rng, &path_alphabet, 12);
        if let Ok(parsed) = path::JsonPath::parse(&path) {
            let _ = parsed.find(&data);
        }
    }
    let template_alphabet = [
        "{",
        "}",
        "data",
        "[",
        "]",
        "a",
        "b",
        "0",
        "1",
        "!",
        "r",
        "s",
        "a",
        ":",
        ">",
        "<",
        "^",
        "=",
        "+",
        "-",
        " ",
        "z",
        "#",
        "0",
        "9",
        ",",
        "_",
        ".",
        "e",
        "f",
        "g",
        "%",
        "x",
        "c",
        "n",
        "d",
        "inventory",
        "interfaces",
        "mac",
    ];
    for _ in 0..5_000 {
        let template = garbage(&mut rng, &template_alphabet, 14);
        let _ = format::format_str(&template, &data);
    }
    for spec in ["", ">10000", ".10000f", "010000,", "c", "#b", "_x", "z.0%", "=^10.3g", "xx"] {
        for value in [json!(1), json!(-0.0), json!(1e308), json!(f64::MIN_POSITIVE), json!(u64::MAX), json!(i64::MIN)] {
            let _ = format::format_str(&format!("{{data[v]:{spec}}}"), &json!({ "v": value }));
        }
    }
    let values = [
        json!(null),
        json!(true),
        json!(0),
        json!(-7),
        json!(2.5),
        json!(""),
        json!("x"),
        json!([]),
        json!({}),
        json!("10.0.0.0/8"),
        json!("^a(b"),
        json!([1, 2]),
        json!({"k": "v"}),
    ];
    let ops = ["eq", "ne", "lt", "gt", "le", "ge", "in-net", "matches", "contains", "is-empty"];
    let fields = ["a.b[*]", "a.d", "a.e", "a.f", "n", "s", "l", "o", "a..c", "inventory.interfaces[*].mac", "$"];
    for op in ops {
        for value in &values {
            for field in fields {
                let body = json!({"conditions": [{"op": op, "field": field, "value": value}],
                    "actions": [{"action": "extend-attribute", "path": "/extra/x", "value": value}]});
                if let Ok(rule) = validate(&body, 0) {
                    let _ = apply(&[rule], &data, &json!({"extra": {"x": value}}));
                }
            }
        }
    }
}
