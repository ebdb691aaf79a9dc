//! Root device hints, as ironic-inspector's `common/device_hints.py` over oslo's `specs_matcher`.
//!
//! A hint is `{name: expression}` with names `size` (GiB), `model`, `wwn`, `serial`, `vendor`,
//! `wwn_with_extension`, `wwn_vendor_extension`, `name`, `rotational`, `hctl`, `by_path`. String expressions and
//! device values are lowercased and URL-quoted before comparing; an expression without an operator means `s==`
//! (strings) or `==` (size). Operators: `s==`, `s!=`, `s<`, `s<=`, `s>`, `s>=`, `<in>`, `<or>`, `==`, `!=`, `>=`,
//! `<=`, `>`, `<`, `=` (which, for legacy reasons, means `>=`). `<all-in>` and `<range-in>` are refused.
use serde_json::{Map, Value};

use super::data::show;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HintType {
    Str,
    Int,
    Bool,
}

const VALID_HINTS: [(&str, HintType); 11] = [
    ("size", HintType::Int),
    ("model", HintType::Str),
    ("wwn", HintType::Str),
    ("serial", HintType::Str),
    ("vendor", HintType::Str),
    ("wwn_with_extension", HintType::Str),
    ("wwn_vendor_extension", HintType::Str),
    ("name", HintType::Str),
    ("rotational", HintType::Bool),
    ("hctl", HintType::Str),
    ("by_path", HintType::Str),
];

/// Parsed hints, ready to match devices.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hints(Vec<Hint>);

#[derive(Debug, Clone, PartialEq)]
enum Hint {
    /// A string or size hint with its operator, e.g. `s== s3yjnx0m100001` or `>= 100`.
    Spec { name: String, kind: HintType, spec: String },
    /// `rotational`.
    Bool { name: String, value: bool },
}

/// Why hints could not be used (ironic-inspector: "failed to validate").
pub(crate) type HintError = String;

impl Hints {
    /// `parse_root_device_hints`: validates names and values and adds the default operators.
    pub(crate) fn parse(hints: &Value) -> Result<Self, HintError> {
        let hints = hints.as_object().ok_or_else(|| format!("root device hints {hints} are not an object"))?;
        if hints.is_empty() {
            return Err("no root device hints given".to_owned());
        }
        let invalid: Vec<&str> =
            hints.keys().map(String::as_str).filter(|k| !VALID_HINTS.iter().any(|(n, _)| n == k)).collect();
        if !invalid.is_empty() {
            let valid: Vec<&str> = VALID_HINTS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "The hints \"{}\" are invalid. Valid hints are: \"{}\"",
                invalid.join(", "),
                valid.join(", ")
            ));
        }
        let mut parsed = Vec::new();
        for (name, expression) in hints {
            let kind = VALID_HINTS.iter().find(|(n, _)| n == name).map_or(HintType::Str, |(_, t)| *t);
            let hint = match kind {
                HintType::Str => {
                    let Value::String(expression) = expression else {
                        return Err(format!(
                            "Root device hint \"{name}\" is not a string value. Hint expression: {}",
                            show(expression)
                        ));
                    };
                    let normalized = normalize(expression, name)?;
                    Hint::Spec { name: name.clone(), kind, spec: with_default_operator(&normalized, "s==")? }
                }
                HintType::Int => {
                    let text = py_str(expression);
                    for value in operator_and_values(&text, name)?.1 {
                        match value.parse::<i64>() {
                            Ok(n) if n > 0 => {}
                            Ok(_) => {
                                return Err(format!(
                                    "Root device hint \"{name}\" should be a positive integer. Current value: {text}"
                                ));
                            }
                            Err(_) => {
                                return Err(format!(
                                    "Root device hint \"{name}\" is not an integer value. Current value: {text}"
                                ));
                            }
                        }
                    }
                    Hint::Spec { name: name.clone(), kind, spec: with_default_operator(&text, "==")? }
                }
                HintType::Bool => match bool_from_string(expression) {
                    Some(value) => Hint::Bool { name: name.clone(), value },
                    None => {
                        return Err(format!(
                            "Root device hint \"{name}\" is not a Boolean value. Current value: {}",
                            show(expression)
                        ));
                    }
                },
            };
            parsed.push(hint);
        }
        Ok(Self(parsed))
    }

    /// `find_devices_by_hints`: does this device satisfy every hint? `Ok(false)` also for a device whose
    /// attribute is empty (string hints) or not a boolean (`rotational`), which ironic-inspector skips.
    pub(crate) fn matches(&self, device: &Map<String, Value>) -> Result<bool, HintError> {
        for hint in &self.0 {
            let ok = match hint {
                Hint::Bool { name, value } => match device.get(name).and_then(bool_from_string) {
                    Some(device_value) => device_value == *value,
                    None => return Ok(false),
                },
                Hint::Spec { name, kind: HintType::Int, spec } => {
                    let size = device.get(name).and_then(Value::as_f64).ok_or_else(|| {
                        format!(
                            "unsupported operand type for /: {} and 'int'",
                            show(device.get(name).unwrap_or(&Value::Null))
                        )
                    })?;
                    spec_match(&Operand::Num(size / GIB), spec)?
                }
                Hint::Spec { name, spec, .. } => {
                    let raw = py_str(device.get(name).unwrap_or(&Value::Null));
                    match normalize(&raw, name) {
                        Ok(value) => spec_match(&Operand::Str(value), spec)?,
                        Err(_) if raw.trim().is_empty() => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `match_root_device_hints`: the first device satisfying every hint.
    pub(crate) fn first_match<'a>(&self, devices: &'a [Value]) -> Result<Option<&'a Value>, HintError> {
        for device in devices {
            if let Some(fields) = device.as_object() {
                if self.matches(fields)? {
                    return Ok(Some(device));
                }
            }
        }
        Ok(None)
    }
}

/// Python's `str()` of a JSON value as the hint code sees it (`None`, `True`, ...).
fn py_str(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        other => show(other),
    }
}

/// oslo `strutils.bool_from_string(strict=True)`.
fn bool_from_string(value: &Value) -> Option<bool> {
    if let Value::Bool(b) = value {
        return Some(*b);
    }
    match py_str(value).trim().to_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Some(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Some(false),
        _ => None,
    }
}

/// `_extract_hint_operator_and_values`: the operator (empty if none) and the values it separates.
fn operator_and_values(expression: &str, name: &str) -> Result<(String, Vec<String>), HintError> {
    let expression = expression.trim().to_lowercase();
    if expression.is_empty() {
        return Err(format!("Root device hint \"{name}\" expression is empty"));
    }
    let tokens =
        grammar(&expression).map_err(|()| format!("Root device hint \"{name}\" cannot be parsed: {expression:?}"))?;
    if tokens.len() <= 1 {
        return Ok((String::new(), vec![expression]));
    }
    let op = tokens[0].clone();
    let values = expression.split(op.as_str()).filter(|v| !v.is_empty()).map(|v| v.trim().to_owned()).collect();
    Ok((op, values))
}

/// `_normalize_hint_expression`: lowercase, values URL-quoted, e.g. `<or> foo bar <or> baz` →
/// `<or> foo%20bar <or> baz`.
fn normalize(expression: &str, name: &str) -> Result<String, HintError> {
    let (op, values) = operator_and_values(expression, name)?;
    let joined = values.iter().map(|v| format!(" {} ", quote(v))).collect::<Vec<_>>().join(&op);
    Ok(format!("{op}{joined}").trim().to_owned())
}

/// `_append_operator_to_hints`: an expression without an operator gets `default_op`.
fn with_default_operator(expression: &str, default_op: &str) -> Result<String, HintError> {
    match grammar(expression) {
        Ok(tokens) if tokens.len() > 1 => Ok(expression.to_owned()),
        Ok(_) => Ok(format!("{default_op} {expression}")),
        Err(()) => Err(format!("root device hint {expression:?} cannot be parsed")),
    }
}

/// Python's `urllib.parse.quote` (safe `/`).
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"_.-~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const UNARY_OPS: [&str; 14] = ["==", "=", "!=", "<in>", ">=", "<=", ">", "<", "s==", "s!=", "s<=", "s<", "s>=", "s>"];
const NARY_OPS: [&str; 3] = ["<all-in>", "<or>", "<range-in>"];

/// oslo `specs_matcher.make_grammar().parseString()`: the tokens of the first alternative that parses a prefix
/// (`<or> a <or> b` → `[<or>, a, b]`, `>= 10` → `[>=, 10]`, `abc` → `[abc]`).
fn grammar(text: &str) -> Result<Vec<String>, ()> {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r');
    let skip = |s: &str, pos: usize| pos + s[pos..].len() - s[pos..].trim_start_matches(is_space).len();
    let literal = |pos: usize, lit: &str| {
        let pos = skip(text, pos);
        text[pos..].starts_with(lit).then_some(pos + lit.len())
    };
    let atom = |pos: usize| -> Option<(String, usize)> {
        let pos = skip(text, pos);
        let rest = &text[pos..];
        if UNARY_OPS.iter().chain(NARY_OPS.iter()).any(|op| rest.starts_with(op)) {
            return None;
        }
        let len = rest.find(char::is_whitespace).unwrap_or(rest.len());
        (len > 0).then(|| (rest[..len].to_owned(), pos + len))
    };
    // disjunction: ("<or>" atom)+
    let mut tokens = vec!["<or>".to_owned()];
    let mut pos = 0;
    while let Some((value, next)) = literal(pos, "<or>").and_then(atom) {
        tokens.push(value);
        pos = next;
    }
    if tokens.len() > 1 {
        return Ok(tokens);
    }
    // nary: "<all-in>" atom+
    if let Some(mut pos) = literal(0, "<all-in>") {
        let mut tokens = vec!["<all-in>".to_owned()];
        while let Some((value, next)) = atom(pos) {
            tokens.push(value);
            pos = next;
        }
        if tokens.len() > 1 {
            return Ok(tokens);
        }
    }
    // range: "<range-in>" atom atom atom atom
    if let Some(mut pos) = literal(0, "<range-in>") {
        let mut tokens = vec!["<range-in>".to_owned()];
        while tokens.len() < 5 {
            let Some((value, next)) = atom(pos) else { break };
            tokens.push(value);
            pos = next;
        }
        if tokens.len() == 5 {
            return Ok(tokens);
        }
    }
    // unary: the first operator literal that matches, then one atom (no backtracking to other operators)
    if let Some((op, pos)) = UNARY_OPS.iter().find_map(|op| literal(0, op).map(|pos| (*op, pos))) {
        if let Some((value, _)) = atom(pos) {
            return Ok(vec![op.to_owned(), value]);
        }
    }
    atom(0).map(|(value, _)| vec![value]).ok_or(())
}

/// A device attribute as the matcher sees it: a normalized string, or the size in GiB.
#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Str(String),
    Num(f64),
}

/// oslo `specs_matcher.match(value, spec)`. Errors where Python raises (`float()` of a non-number, ordering a
/// number against a string, `<all-in>`/`<range-in>`).
fn spec_match(value: &Operand, spec: &str) -> Result<bool, HintError> {
    let tokens = grammar(spec).unwrap_or_else(|()| vec![spec.to_owned()]);
    let [op, args @ ..] = tokens.as_slice() else {
        return Ok(false);
    };
    if args.is_empty() {
        return Ok(matches!(value, Operand::Str(s) if s == op));
    }
    let first = args[0].as_str();
    let float =
        |text: &str| text.trim().parse::<f64>().map_err(|_| format!("could not convert string to float: '{text}'"));
    let numbers = || -> Result<(f64, f64), HintError> {
        let x = match value {
            Operand::Num(x) => *x,
            Operand::Str(s) => float(s)?,
        };
        Ok((x, float(first)?))
    };
    let strings = || match value {
        Operand::Str(s) => Ok(s.as_str()),
        Operand::Num(_) => Err(format!("operator {op} cannot compare a size with '{first}'")),
    };
    Ok(match op.as_str() {
        "=" | ">=" => numbers().map(|(x, y)| x >= y)?,
        "==" => numbers().map(|(x, y)| x == y)?,
        "!=" => numbers().map(|(x, y)| x != y)?,
        "<=" => numbers().map(|(x, y)| x <= y)?,
        "<" => numbers().map(|(x, y)| x < y)?,
        ">" => numbers().map(|(x, y)| x > y)?,
        "s==" => matches!(value, Operand::Str(s) if s == first),
        "s!=" => !matches!(value, Operand::Str(s) if s == first),
        "s<" => strings()? < first,
        "s<=" => strings()? <= first,
        "s>" => strings()? > first,
        "s>=" => strings()? >= first,
        "<in>" => strings()?.contains(first),
        "<or>" => args.iter().any(|a| matches!(value, Operand::Str(s) if s == a)),
        other => return Err(format!("root device hint operator {other} is not supported")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disk(name: &str, size: u64, serial: &str, model: &str, rotational: bool) -> Value {
        json!({"name": name, "size": size, "serial": serial, "model": model, "rotational": rotational,
               "vendor": "ATA", "wwn": null, "hctl": "0:0:0:0", "by_path": null})
    }

    fn disks() -> Vec<Value> {
        vec![
            disk("/dev/sda", 21_474_836_480, "S3YJNX0M100001", "SAMSUNG MZ7LH240", false),
            disk("/dev/sdb", 1_000_204_886_016, "WD-WCC4N0000002", "WDC WD10EZEX-08W", true),
        ]
    }

    fn pick(hints: Value) -> Result<Option<String>, HintError> {
        let disks = disks();
        let hints = Hints::parse(&hints)?;
        Ok(hints.first_match(&disks)?.and_then(|d| d["name"].as_str()).map(str::to_owned))
    }

    #[test]
    fn grammar_follows_specs_matcher() {
        let t = |s: &str| grammar(s).expect(s);
        assert_eq!(t("abc"), ["abc"]);
        assert_eq!(t(">= 10"), [">=", "10"]);
        assert_eq!(t("==10"), ["==", "10"]);
        assert_eq!(t("s== foo bar"), ["s==", "foo"]);
        assert_eq!(t("<or> a <or> b"), ["<or>", "a", "b"]);
        assert_eq!(t("<in> gcc"), ["<in>", "gcc"]);
        assert_eq!(t("<range-in> [ 10 20 ]"), ["<range-in>", "[", "10", "20", "]"]);
        assert_eq!(t("sda"), ["sda"]);
        assert!(grammar("=").is_err());
        assert!(grammar("").is_err());
    }

    #[test]
    fn normalize_quotes_values() {
        assert_eq!(normalize("SAMSUNG MZ7LH240", "model").expect("model"), "samsung%20mz7lh240");
        assert_eq!(normalize("<or> Foo Bar <or> baz", "model").expect("or"), "<or> foo%20bar <or> baz");
        assert_eq!(normalize("/dev/sda", "name").expect("name"), "/dev/sda");
        assert_eq!(normalize("0:0:0:0", "hctl").expect("hctl"), "0%3A0%3A0%3A0");
        assert!(normalize("  ", "model").is_err());
    }

    #[test]
    fn matches_by_serial_model_and_name() {
        assert_eq!(pick(json!({"serial": "WD-WCC4N0000002"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"serial": "s== wd-wcc4n0000002"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"model": "<in> samsung"})), Ok(Some("/dev/sda".into())));
        assert_eq!(pick(json!({"model": "<or> foo <or> WDC WD10EZEX-08W"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"name": "s!= /dev/sda"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"hctl": "0:0:0:0", "rotational": "yes"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"serial": "nope"})), Ok(None));
        assert_eq!(pick(json!({"wwn": "0x5000"})), Ok(None), "a null attribute is 'none'");
    }

    #[test]
    fn matches_by_size_in_gib() {
        assert_eq!(pick(json!({"size": 20})), Ok(Some("/dev/sda".into())));
        assert_eq!(pick(json!({"size": "20"})), Ok(Some("/dev/sda".into())));
        assert_eq!(pick(json!({"size": ">= 100"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"size": "< 100"})), Ok(Some("/dev/sda".into())));
        assert_eq!(pick(json!({"size": "= 21"})), Ok(Some("/dev/sdb".into())), "'=' means >=");
        assert_eq!(pick(json!({"size": "!= 20"})), Ok(Some("/dev/sdb".into())));
        assert_eq!(pick(json!({"size": 40})), Ok(None));
        assert_eq!(pick(json!({"size": "<or> 20 <or> 40"})), Ok(None), "Python compares a float to strings");
    }

    #[test]
    fn invalid_hints_fail_to_validate() {
        assert!(pick(json!({"colour": "red"})).expect_err("name").contains("are invalid"));
        assert!(pick(json!({"size": 0})).expect_err("zero").contains("positive integer"));
        assert!(pick(json!({"size": "big"})).expect_err("nan").contains("not an integer"));
        assert!(pick(json!({"size": 20.5})).is_err());
        assert!(pick(json!({"serial": 12345})).expect_err("type").contains("not a string value"));
        assert!(pick(json!({"rotational": "maybe"})).expect_err("bool").contains("not a Boolean"));
        assert!(pick(json!({"model": ""})).expect_err("empty").contains("is empty"));
        assert!(pick(json!({"model": "<all-in> a b"})).is_err());
        assert!(pick(json!("serial")).is_err());
        assert!(pick(json!({})).is_err());
        assert!(pick(json!({"serial": ">= 10"})).expect_err("float").contains("could not convert"));
    }

    #[test]
    fn devices_with_empty_or_odd_attributes() {
        let devices =
            vec![json!({"name": "/dev/sdx", "model": "", "size": 10}), json!({"name": "/dev/sdy", "size": "big"})];
        let by_model = Hints::parse(&json!({"model": "x"})).expect("hints");
        assert_eq!(by_model.first_match(&devices), Ok(None));
        let by_size = Hints::parse(&json!({"size": 10})).expect("hints");
        assert!(by_size.first_match(&devices[1..]).is_err(), "a size that is not a number fails like Python");
        let rotational = Hints::parse(&json!({"rotational": false})).expect("hints");
        assert_eq!(rotational.first_match(&devices), Ok(None), "no rotational attribute: skipped");
    }
}
