//! Rule conditions: `{op, field, multiple, invert, …parameters}`, their validation and their evaluation.

use std::fmt;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::net::{self, Network};
use super::params;
use super::path::{JsonPath, PathError};
use super::python::{self, Num};

/// A condition operator (ironic-inspector's `ironic_inspector.rules.conditions` plugins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operator {
    /// `field == value`.
    Eq,
    /// `field < value`.
    Lt,
    /// `field > value`.
    Gt,
    /// `field <= value`.
    Le,
    /// `field >= value`.
    Ge,
    /// `field != value`.
    Ne,
    /// The field is an IP address inside the network `value`.
    InNet,
    /// The regex `value` matches the whole field (Python `re.match` with `$` appended).
    Matches,
    /// The regex `value` matches somewhere in the field (Python `re.search`).
    Contains,
    /// The field is `''`, `null`, `[]`, `{}` or missing.
    IsEmpty,
}

impl Operator {
    /// Every operator, in ironic-inspector's registration order (as its schema errors list them).
    pub const ALL: [Operator; 10] = [
        Operator::Eq,
        Operator::Lt,
        Operator::Gt,
        Operator::Le,
        Operator::Ge,
        Operator::Ne,
        Operator::InNet,
        Operator::Matches,
        Operator::Contains,
        Operator::IsEmpty,
    ];

    /// The operator's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Eq => "eq",
            Operator::Lt => "lt",
            Operator::Gt => "gt",
            Operator::Le => "le",
            Operator::Ge => "ge",
            Operator::Ne => "ne",
            Operator::InNet => "in-net",
            Operator::Matches => "matches",
            Operator::Contains => "contains",
            Operator::IsEmpty => "is-empty",
        }
    }

    /// The operator with this API name.
    pub fn from_name(name: &str) -> Option<Operator> {
        Operator::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a condition treats a field path that matches several values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Multiple {
    /// The condition holds if it holds for any value.
    #[default]
    Any,
    /// The condition holds if it holds for every value.
    All,
    /// Only the first value is checked.
    First,
}

impl Multiple {
    /// The API names, in the order ironic-inspector's schema errors list them.
    pub const NAMES: [&'static str; 3] = ["all", "any", "first"];
}

/// One condition of a rule, as ironic-inspector stores and shows it: the operator, the field, `multiple`, `invert`,
/// and the operator's other parameters (`value`, or anything else the user sent) kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    /// The operator.
    pub op: Operator,
    /// `data://<jsonpath>`, `node://<jsonpath>` or a bare JSONPath (data).
    pub field: String,
    /// How several matches are combined.
    #[serde(default)]
    pub multiple: Multiple,
    /// Negates the result for each value.
    #[serde(default)]
    pub invert: bool,
    /// Every other key of the condition (`value` …), as sent.
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

/// The keys of a condition that are not operator parameters.
pub(super) const RESERVED: [&str; 4] = ["op", "field", "multiple", "invert"];

/// Why a condition could not be checked against the data (ironic-inspector fails the introspection on these).
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    /// The field's path does not parse (only for rules that were not validated) or raised while evaluated.
    #[error("{0}")]
    Path(#[from] PathError),
    /// The field's scheme is neither `data` nor `node` (only for rules that were not validated).
    #[error("unsupported scheme {0}")]
    Scheme(String),
    /// A parameter the operator needs is absent (only for rules that were not validated).
    #[error("missing parameter {0}")]
    MissingParameter(&'static str),
    /// The field could not be converted or compared (Python's `ValueError`/`TypeError`).
    #[error("{0}")]
    Compare(String),
    /// The field is not an IP address, or `value` is not a network.
    #[error("{0}")]
    Address(String),
    /// The regular expression does not compile (or is empty, for `matches`).
    #[error("invalid regular expression: {0}")]
    Regex(String),
}

/// Which document a field reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The processed introspection data.
    Data,
    /// The Ironic node.
    Node,
}

/// Splits a field into its scheme and its path: `data` when there is no `://`.
pub(super) fn split_field(field: &str) -> (&str, &str) {
    match field.split_once("://") {
        Some((scheme, path)) => (scheme, path),
        None => ("data", field),
    }
}

/// Parses a field: its source and its path.
pub(super) fn parse_field(field: &str) -> Result<(Source, JsonPath), ConditionError> {
    let (scheme, path) = split_field(field);
    let source = match scheme {
        "data" => Source::Data,
        "node" => Source::Node,
        other => return Err(ConditionError::Scheme(other.to_owned())),
    };
    Ok((source, JsonPath::parse(path)?))
}

/// Checks an operator's parameters as ironic-inspector's plugin does; the error is its message.
pub(super) fn validate_params(op: Operator, params: &Map<String, Value>) -> Result<(), String> {
    match op {
        Operator::Eq | Operator::Lt | Operator::Gt | Operator::Le | Operator::Ge | Operator::Ne => {
            params::check(params, &["value"], &[])
        }
        Operator::IsEmpty => params::check(params, &[], &[]),
        Operator::InNet => {
            params::check(params, &["value"], &[])?;
            let value = params.get("value").unwrap_or(&Value::Null);
            let network = value.as_str().ok_or_else(|| format!("invalid IPNetwork {}", python::str(value)));
            network.and_then(Network::parse).map(drop).map_err(|e| format!("invalid value: {e}"))
        }
        // ironic-inspector only compiles the regex for these (no check of other parameters).
        Operator::Matches | Operator::Contains => match params.get("value") {
            None | Some(Value::Null) => Err("missing required parameter(s): value".to_owned()),
            Some(Value::String(pattern)) => {
                compile(pattern).map(drop).map_err(|e| format!("invalid regular expression: {e}"))
            }
            Some(other) => Err(format!("invalid regular expression: expected a string, got {}", python::repr(other))),
        },
    }
}

impl Condition {
    /// Whether the condition holds for `data` (the processed data) and `node` (the node's view for `node://`).
    /// `Ok(None)` when the field is missing and the operator needs one: the rule does not apply.
    pub(super) fn holds(&self, data: &Value, node: &Value) -> Result<Option<bool>, ConditionError> {
        let (source, path) = parse_field(&self.field)?;
        let document = match source {
            Source::Data => data,
            Source::Node => node,
        };
        let mut values = path.find(document)?;
        if values.is_empty() {
            if self.op != Operator::IsEmpty {
                return Ok(None);
            }
            values.push(Value::Null);
        }
        let test = self.prepare()?;
        let mut result = false;
        for value in &values {
            result = test.check(value)? != self.invert;
            let done = match self.multiple {
                Multiple::First => true,
                Multiple::All => !result,
                Multiple::Any => result,
            };
            if done {
                break;
            }
        }
        Ok(Some(result))
    }

    /// The operator with its parameter parsed once (a network, a compiled regex) for all the field's values.
    /// Python parses them per value, but only once the field was found: so do we, errors included.
    fn prepare(&self) -> Result<Test<'_>, ConditionError> {
        let value = self.params.get("value").ok_or(ConditionError::MissingParameter("value"));
        Ok(match self.op {
            Operator::IsEmpty => Test::IsEmpty,
            Operator::InNet => {
                let network = value?.as_str().ok_or_else(|| ConditionError::Address("value is not a string".into()))?;
                Test::InNet(Network::parse(network).map_err(ConditionError::Address)?)
            }
            Operator::Matches => {
                let pattern = pattern(value?)?;
                // Python: `if regexp[-1] != '$': regexp += '$'`, then `re.match` (anchored at the start).
                let Some(last) = pattern.chars().last() else {
                    return Err(ConditionError::Regex("string index out of range (empty pattern)".to_owned()));
                };
                let anchored = if last == '$' { pattern.to_owned() } else { format!("{pattern}$") };
                Test::Regex(compile(&format!("^(?:{anchored})")).map_err(ConditionError::Regex)?)
            }
            Operator::Contains => Test::Regex(compile(pattern(value?)?).map_err(ConditionError::Regex)?),
            op => Test::Compare(op, value?),
        })
    }
}

/// An operator ready to check values of the field.
enum Test<'c> {
    IsEmpty,
    InNet(Network),
    /// `matches` (already anchored) or `contains`, against Python's `str()` of the value.
    Regex(Regex),
    Compare(Operator, &'c Value),
}

impl Test<'_> {
    fn check(&self, field: &Value) -> Result<bool, ConditionError> {
        match self {
            Test::IsEmpty => Ok(is_empty(field)),
            Test::InNet(network) => Ok(network.contains(net::address(field).map_err(ConditionError::Address)?)),
            Test::Regex(regex) => Ok(regex.is_match(&python::str(field))),
            Test::Compare(op, value) => compare(*op, field, value).map_err(ConditionError::Compare),
        }
    }
}

fn pattern(value: &Value) -> Result<&str, ConditionError> {
    value.as_str().ok_or_else(|| ConditionError::Regex(format!("expected a string, got {}", python::repr(value))))
}

/// Compiles a regular expression; the error is the last line of the `regex` crate's message.
fn compile(pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern).map_err(|e| {
        let text = e.to_string();
        text.lines()
            .rev()
            .find_map(|line| line.trim().strip_prefix("error: "))
            .map_or_else(|| text.clone(), str::to_owned)
    })
}

/// Python's `field in ('', None, [], {})`.
fn is_empty(field: &Value) -> bool {
    match field {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// `op(coerce(field, value), value)`: the field is converted with `float()` when `value` is a float and with
/// `int()` when it is an int (or a bool, which is an int in Python); otherwise compared as it is.
fn compare(op: Operator, field: &Value, value: &Value) -> Result<bool, String> {
    let symbol = match op {
        Operator::Lt => "<",
        Operator::Gt => ">",
        Operator::Le => "<=",
        Operator::Ge => ">=",
        _ => "==",
    };
    let expected = Num::of(value);
    let order = match expected {
        Some(Num::Float(reference)) => Num::Float(python::to_float(field)?).compare(Num::Float(reference)),
        Some(reference @ Num::Int(_)) => Num::Int(python::to_int(field)?).compare(reference),
        None => {
            return match op {
                Operator::Eq => Ok(python::equal(field, value)),
                Operator::Ne => Ok(!python::equal(field, value)),
                _ => Ok(ordered(op, python::order(field, value, symbol)?)),
            };
        }
    };
    Ok(match op {
        Operator::Eq => order == Some(std::cmp::Ordering::Equal),
        Operator::Ne => order != Some(std::cmp::Ordering::Equal),
        _ => ordered(op, order),
    })
}

fn ordered(op: Operator, order: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    matches!(
        (op, order),
        (Operator::Lt, Some(Less))
            | (Operator::Le, Some(Less | Equal))
            | (Operator::Gt, Some(Greater))
            | (Operator::Ge, Some(Greater | Equal))
    )
}

/// What `node://` paths see: the node as Ironic's API returns it, plus the names openstacksdk's `Node.to_dict()`
/// gives the renamed fields (ironic-inspector reads that), so both `node://uuid` and `node://id` work.
pub(super) fn node_view(node: &Value) -> Value {
    const SDK_NAMES: [(&str, &str); 11] = [
        ("uuid", "id"),
        ("instance_uuid", "instance_id"),
        ("chassis_uuid", "chassis_id"),
        ("allocation_uuid", "allocation_id"),
        ("maintenance", "is_maintenance"),
        ("console_enabled", "is_console_enabled"),
        ("automated_clean", "is_automated_clean_enabled"),
        ("protected", "is_protected"),
        ("retired", "is_retired"),
        ("secure_boot", "is_secure_boot"),
        ("portgroups", "port_groups"),
    ];
    let mut view = node.clone();
    if let Value::Object(map) = &mut view {
        for (api, sdk) in SDK_NAMES {
            if let Some(value) = map.get(api).cloned() {
                map.entry(sdk).or_insert(value);
            }
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn condition(body: Value) -> Condition {
        serde_json::from_value(body).unwrap()
    }

    fn check(op: &str, field: Value, value: Value) -> bool {
        let c = condition(json!({"op": op, "field": "x", "value": value}));
        c.holds(&json!({ "x": field }), &json!({})).unwrap().unwrap()
    }

    /// ironic-inspector's TEST_SET: (field, value) pairs; eq is true for the first three.
    fn test_set() -> Vec<(Value, Value)> {
        vec![
            (json!(42), json!(42)),
            (json!("42"), json!(42)),
            (json!("4.2"), json!(4.2)),
            (json!(42), json!(41)),
            (json!("42"), json!(41)),
            (json!("4.2"), json!(4.0)),
            (json!(41), json!(42)),
            (json!("41"), json!(42)),
            (json!("4.0"), json!(4.2)),
        ]
    }

    fn run(op: &str) -> Vec<bool> {
        test_set().into_iter().map(|(field, value)| check(op, field, value)).collect()
    }

    fn expect(pattern: &[(bool, usize)]) -> Vec<bool> {
        pattern.iter().flat_map(|(b, n)| std::iter::repeat_n(*b, *n)).collect()
    }

    #[test]
    fn eq() {
        assert_eq!(run("eq"), expect(&[(true, 3), (false, 6)]));
        assert!(check("eq", json!("foo"), json!("foo")));
        assert!(!check("eq", json!("foo"), json!("bar")));
        assert!(!check("eq", json!(42), json!("42")));
        assert!(check("eq", json!(1), json!(true)));
        assert!(check("eq", json!(["a", 1]), json!(["a", 1.0])));
    }

    #[test]
    fn ne() {
        assert_eq!(run("ne"), expect(&[(false, 3), (true, 6)]));
        assert!(!check("ne", json!("foo"), json!("foo")));
        assert!(check("ne", json!("foo"), json!("bar")));
    }

    #[test]
    fn gt() {
        assert_eq!(run("gt"), expect(&[(false, 3), (true, 3), (false, 3)]));
    }

    #[test]
    fn ge() {
        assert_eq!(run("ge"), expect(&[(true, 6), (false, 3)]));
    }

    #[test]
    fn le() {
        assert_eq!(run("le"), expect(&[(true, 3), (false, 3), (true, 3)]));
    }

    #[test]
    fn lt() {
        assert_eq!(run("lt"), expect(&[(false, 6), (true, 3)]));
        assert!(check("lt", json!("abc"), json!("abd")));
        assert!(check("lt", json!(4.5), json!(5)), "int() truncates 4.5 to 4");
        assert!(!check("lt", json!(5.5), json!(5)), "int() truncates 5.5 to 5");
    }

    #[test]
    fn comparisons_that_raise_in_python_are_errors() {
        let c = condition(json!({"op": "eq", "field": "x", "value": 42}));
        let err = c.holds(&json!({"x": "forty-two"}), &json!({})).unwrap_err();
        assert_eq!(err.to_string(), "invalid literal for int() with base 10: 'forty-two'");
        let c = condition(json!({"op": "gt", "field": "x", "value": "a"}));
        assert!(c.holds(&json!({"x": 1}), &json!({})).is_err());
        let c = condition(json!({"op": "eq", "field": "x", "value": 1.5}));
        assert!(c.holds(&json!({"x": null}), &json!({})).is_err());
    }

    #[test]
    fn matches() {
        for (pattern, field, expected) in [
            (".*", json!("foo"), true),
            ("fo{1,2}", json!("foo"), true),
            ("o{1,2}", json!("foo"), false),
            ("[1-9]*", json!(42), true),
            ("^(foo|bar)$", json!("foo"), true),
            ("fo", json!("foo"), false),
            ("a|b", json!("bxx"), false),
            ("a|b", json!("axx"), true),
            ("[0-9]+", json!(1000), true),
        ] {
            assert_eq!(check("matches", field.clone(), json!(pattern)), expected, "{pattern} vs {field}");
        }
        let c = condition(json!({"op": "matches", "field": "x", "value": ""}));
        assert!(c.holds(&json!({"x": "a"}), &json!({})).is_err());
    }

    #[test]
    fn contains() {
        for (pattern, field, expected) in [
            (".*", json!("foo"), true),
            ("fo{1,2}", json!("foo"), true),
            ("o{1,2}", json!("foo"), true),
            ("[1-9]*", json!(42), true),
            ("bar", json!("foo"), false),
            ("True", json!(true), true),
            ("'a'", json!(["a"]), true),
        ] {
            assert_eq!(check("contains", field.clone(), json!(pattern)), expected, "{pattern} vs {field}");
        }
    }

    #[test]
    fn in_net() {
        assert!(check("in-net", json!("192.0.2.4"), json!("192.0.2.1/24")));
        assert!(!check("in-net", json!("192.1.2.4"), json!("192.0.2.1/24")));
        assert!(check("in-net", json!("2001:db8::7"), json!("2001:db8::/64")));
        assert!(!check("in-net", json!("192.0.2.4"), json!("2001:db8::/64")));
        let c = condition(json!({"op": "in-net", "field": "x", "value": "192.0.2.0/24"}));
        assert!(matches!(c.holds(&json!({"x": "nope"}), &json!({})), Err(ConditionError::Address(_))));
    }

    #[test]
    fn is_empty_matches_empties_and_missing_fields() {
        let empty = condition(json!({"op": "is-empty", "field": "x"}));
        for (field, expected) in [
            (json!(null), true),
            (json!(""), true),
            (json!([]), true),
            (json!({}), true),
            (json!(0), false),
            (json!(false), false),
            (json!("16"), false),
            (json!(["16"]), false),
            (json!({"test": "16"}), false),
        ] {
            assert_eq!(empty.holds(&json!({ "x": field }), &json!({})).unwrap(), Some(expected), "{field}");
        }
        assert_eq!(empty.holds(&json!({}), &json!({})).unwrap(), Some(true));
        let inverted = condition(json!({"op": "is-empty", "field": "x", "invert": true}));
        assert_eq!(inverted.holds(&json!({}), &json!({})).unwrap(), Some(false));
    }

    #[test]
    fn missing_field_means_the_rule_does_not_apply() {
        let c = condition(json!({"op": "eq", "field": "local_gb", "value": 60}));
        assert_eq!(c.holds(&json!({"memory_mb": 1024}), &json!({})).unwrap(), None);
        let inverted = condition(json!({"op": "eq", "field": "local_gb", "value": 60, "invert": true}));
        assert_eq!(inverted.holds(&json!({}), &json!({})).unwrap(), None);
    }

    #[test]
    fn invert() {
        let c = condition(json!({"op": "eq", "field": "memory_mb", "value": 42, "invert": true}));
        assert_eq!(c.holds(&json!({"memory_mb": 1024}), &json!({})).unwrap(), Some(true));
        assert_eq!(c.holds(&json!({"memory_mb": 42}), &json!({})).unwrap(), Some(false));
    }

    /// ironic-inspector's TestCheckConditionsMultiple.
    #[test]
    fn multiple() {
        let cases = [
            (vec!["1.1.1.1", "1.2.3.4", "1.3.2.2"], [true, true, false, false]),
            (vec!["1.2.3.4"], [true, true, true, true]),
            (vec!["1.1.1.1", "1.3.2.2"], [false, false, false, false]),
            (vec!["1.2.3.4", "1.3.2.2"], [true, true, false, true]),
        ];
        for (ips, expected) in cases {
            let data = json!({"interfaces": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()});
            let results: Vec<bool> = [None, Some("any"), Some("all"), Some("first")]
                .into_iter()
                .map(|multiple| {
                    let mut body = json!({"op": "eq", "field": "interfaces[*].ip", "value": "1.2.3.4"});
                    if let Some(m) = multiple {
                        body["multiple"] = json!(m);
                    }
                    condition(body).holds(&data, &json!({})).unwrap().unwrap()
                })
                .collect();
            assert_eq!(results, expected, "{ips:?}");
        }
    }

    #[test]
    fn multiple_all_with_invert() {
        let c = condition(json!({
            "op": "contains", "field": "inventory.interfaces[*].ipv4_address",
            "value": "127\\.0\\.0\\.1", "invert": true, "multiple": "all",
        }));
        let data = |ips: Value| json!({"inventory": {"interfaces": ips}});
        let one = |ip: &str| json!({ "ipv4_address": ip });
        assert_eq!(c.holds(&data(json!([one("10.0.0.1"), one("10.0.0.2")])), &json!({})).unwrap(), Some(true));
        assert_eq!(c.holds(&data(json!([one("10.0.0.1"), one("127.0.0.1")])), &json!({})).unwrap(), Some(false));
    }

    #[test]
    fn node_scheme_reads_the_node_with_sdk_names() {
        let node = node_view(&json!({"uuid": "u1", "maintenance": true, "driver_info": {"ipmi_address": "10.0.0.9"}}));
        let by = |field: &str, value: Value| {
            condition(json!({"op": "eq", "field": field, "value": value})).holds(&json!({}), &node).unwrap()
        };
        assert_eq!(by("node://driver_info.ipmi_address", json!("10.0.0.9")), Some(true));
        assert_eq!(by("node://uuid", json!("u1")), Some(true));
        assert_eq!(by("node://id", json!("u1")), Some(true));
        assert_eq!(by("node://is_maintenance", json!(true)), Some(true));
        assert_eq!(by("node://driver", json!("fake")), None);
        assert_eq!(by("data://driver_info.ipmi_address", json!("10.0.0.9")), None);
    }

    #[test]
    fn params_validation() {
        let p = |v: Value| v.as_object().cloned().unwrap();
        assert!(validate_params(Operator::Eq, &p(json!({"value": 42}))).is_ok());
        assert_eq!(validate_params(Operator::Eq, &p(json!({}))), Err("missing required parameter(s): value".into()));
        assert_eq!(
            validate_params(Operator::Eq, &p(json!({"value": null}))),
            Err("missing required parameter(s): value".into())
        );
        assert_eq!(
            validate_params(Operator::Eq, &p(json!({"value": 1, "foo": "bar"}))),
            Err("unexpected parameter(s): foo".into())
        );
        assert_eq!(
            validate_params(Operator::IsEmpty, &p(json!({"value": 1}))),
            Err("unexpected parameter(s): value".into())
        );
        assert_eq!(
            validate_params(Operator::InNet, &p(json!({"value": "foo"}))),
            Err("invalid value: invalid IPNetwork foo".into())
        );
        assert!(validate_params(Operator::InNet, &p(json!({"value": "192.0.2.1/24"}))).is_ok());
        assert!(validate_params(Operator::Matches, &p(json!({"value": "[a-z]?(foo|b.r).+"}))).is_ok());
        assert!(
            validate_params(Operator::Matches, &p(json!({"value": "**"})))
                .is_err_and(|e| e.starts_with("invalid regular expression: "))
        );
        assert!(validate_params(Operator::Contains, &p(json!({"value": "(a"}))).is_err());
        assert!(validate_params(Operator::Contains, &p(json!({"value": "a", "extra": 1}))).is_ok());
    }
}
